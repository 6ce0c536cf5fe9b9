"""Tests of the mock LLM upstream: pure stream building, then the real process."""

from __future__ import annotations

import base64
import gzip
import re
import socket
import ssl
import subprocess
import sys
import time
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import httpx
import orjson
import pytest

from mockllm.scenario import Scenario, ScenarioError
from mockllm.server import Exchange, Exchanges
from mockllm.streams import (
    CREATED,
    TOOL_ARGUMENTS,
    error_body,
    llm_stream_events,
    plan_body,
    raw_chunks,
)

REPO = Path(__file__).resolve().parents[2]
REQUEST: dict[str, Any] = {
    "version": "1.0",
    "stream": True,
    "model": "example-model",
    "messages": [{"role": "user", "content": "What is the weather in Vienna?"}],
    "metadata": {"request_id": "req-42"},
}

# --- helpers -----------------------------------------------------------------


def parse_sse(body: bytes) -> list[tuple[str | None, dict[str, Any]]]:
    """Minimal SSE parser: (event type, JSON data) per dispatched event."""
    events: list[tuple[str | None, dict[str, Any]]] = []
    for block in re.split(rb"\r?\n\r?\n", body.replace(b"\r\n", b"\n")):
        event_type, data = None, None
        for line in block.split(b"\n"):
            if line.startswith(b"event: "):
                event_type = line[7:].decode()
            elif line.startswith(b"data: "):
                data = orjson.loads(line[6:])
        if data is not None:
            events.append((event_type, data))
    return events


def assert_valid_llm_stream(items: list[bytes]) -> list[dict[str, Any]]:
    """Check the draft's envelope rules; return the parsed envelopes."""
    body = b"".join(items)
    events = parse_sse(body)
    assert len(events) == len(items), "one SSE event per item"
    envelopes = [data for _, data in events]
    assert all(event_type == data["type"] for event_type, data in events)
    assert all(data["v"] == "1.0" for data in envelopes)
    assert [data["seq"] for data in envelopes] == list(range(len(envelopes)))
    assert envelopes[0]["type"] == "stream.start"
    assert envelopes[0]["created"] == CREATED
    assert envelopes[-1]["type"] == "stream.end"
    return envelopes


def answer_text(envelopes: list[dict[str, Any]]) -> str:
    return "".join(e["delta"]["text"] for e in envelopes if e["type"] == "content.delta")


def expected(query: str, request: dict[str, Any] = REQUEST) -> list[bytes]:
    return llm_stream_events(request, Scenario.parse(query))


# --- pure: scenario ------------------------------------------------------------


def test_scenario_defaults_and_parsing() -> None:
    assert Scenario.parse() == Scenario()
    scenario = Scenario.parse("events=2&delay=0.5&gzip&unknown=1&text=a%20b", "events=7&crlf=true")
    assert scenario.events == 7  # header wins over query
    assert scenario.delay == 0.5
    assert scenario.gzip and scenario.crlf  # bare key means on
    assert scenario.text == "a b"
    assert Scenario.parse("raw=" + base64.urlsafe_b64encode(b"\xff\x00").decode().rstrip("=")).raw == b"\xff\x00"


@pytest.mark.parametrize("query", ["events=x", "events=-1", "delay=nan", "gzip=maybe", "status=99", "raw=%%%"])
def test_scenario_rejects_bad_values(query: str) -> None:
    with pytest.raises(ScenarioError):
        Scenario.parse(query)


# --- pure: streams -------------------------------------------------------------


def test_default_stream() -> None:
    items = expected("")
    envelopes = assert_valid_llm_stream(items)
    assert [e["type"] for e in envelopes] == (
        ["stream.start"] + ["content.delta"] * 5 + ["content.stop", "usage", "stream.end"]
    )
    assert envelopes[0]["model"] == "example-model"
    assert envelopes[0]["request_id"] == envelopes[-1]["request_id"] == "req-42"
    assert answer_text(envelopes) == "tök0 tök1 tök2 tök3 tök4"
    assert "ö".encode() in items[1]  # raw UTF-8 on the wire, not \u escapes
    assert envelopes[-3]["stop_reason"] == "end_turn"
    assert envelopes[-2]["input_tokens"] == 6 and envelopes[-2]["output_tokens"] == 5
    assert items[0] == (
        b'event: stream.start\ndata: {"v":"1.0","seq":0,"type":"stream.start",'
        b'"request_id":"req-42","model":"example-model","created":1749292800}\n\n'
    )


@pytest.mark.parametrize(
    ("query", "text"),
    [
        ("text=Hello%2C%20w%C3%B6rld%20%C2%B0&events=4", "Hello, wörld °"),
        ("events=0", ""),
        ("events=3&crlf=1&comment=1&model=other&usage=0", "tök0 tök1 tök2"),
    ],
)
def test_stream_variants_are_valid(query: str, text: str) -> None:
    items = expected(query, {})  # an empty request (e.g. invalid JSON) must work too
    envelopes = assert_valid_llm_stream(items)
    assert answer_text(envelopes) == text
    assert "request_id" not in envelopes[0]


def test_crlf_comment_framing() -> None:
    items = expected("events=1&crlf=1&comment=1&model=other&usage=0")
    assert items[0].startswith(b": keep-alive\r\n\r\nevent: stream.start\r\ndata: ")
    assert items[0].endswith(b"}\r\n\r\n") and b"\n\n" not in items[0].replace(b"\r\n", b"")
    assert b'"model":"other"' in items[0]
    assert b"usage" not in b"".join(items)


def test_size_gives_exact_utf8_bytes() -> None:
    envelopes = assert_valid_llm_stream(expected("events=3&size=1001"))
    texts = [e["delta"]["text"] for e in envelopes if e["type"] == "content.delta"]
    assert [len(t.encode()) for t in texts] == [1001] * 3
    assert "ö" in texts[0]


def test_tool_call() -> None:
    envelopes = assert_valid_llm_stream(expected("events=0&tool=get_weather"))
    assert [e["type"] for e in envelopes] == ["stream.start", "tool.call", "content.stop", "usage", "stream.end"]
    assert envelopes[1]["name"] == "get_weather" and envelopes[1]["arguments"] == TOOL_ARGUMENTS
    assert envelopes[2]["stop_reason"] == "tool_use"


def test_error_after_deltas() -> None:
    envelopes = assert_valid_llm_stream(expected("error=overloaded&error_after=2"))
    assert [e["type"] for e in envelopes] == ["stream.start", "content.delta", "content.delta", "error", "stream.end"]
    assert envelopes[3]["code"] == "overloaded"


def test_conformance_breakers() -> None:
    no_end = parse_sse(b"".join(expected("no_end=1")))
    assert no_end[-1][0] == "usage"
    gap = [data["seq"] for _, data in parse_sse(b"".join(expected("events=3&seq_gap=2")))]
    assert gap == [0, 1, 3, 4, 5, 6, 7]


def test_plan_truncates_and_gzips_incrementally() -> None:
    items = expected("events=3")
    assert plan_body(items, Scenario()).writes == items
    truncated = plan_body(items, Scenario(truncate_after=2))
    assert truncated.writes == items[:2] and not truncated.complete

    plan = plan_body(items, Scenario(gzip=True))
    assert len(plan.writes) == len(items) and plan.complete
    decoder = zlib.decompressobj(wbits=31)
    for write, item in zip(plan.writes, items):
        assert decoder.decompress(write) == item  # each write decodes on arrival
    assert decoder.eof
    assert gzip.decompress(b"".join(plan.writes)) == b"".join(items)

    cut = plan_body(items, Scenario(gzip=True, truncate_after=2))
    with pytest.raises(EOFError):  # no gzip trailer
        gzip.decompress(b"".join(cut.writes))


def test_raw_chunks_and_error_body() -> None:
    assert raw_chunks(Scenario(raw=b"abcdefg", chunk=3)) == [b"abc", b"def", b"g"]
    assert raw_chunks(Scenario(raw=b"abc")) == [b"abc"]
    assert orjson.loads(error_body(Scenario(status=429))) == {
        "error": {"code": "rate_limited", "message": "mock error: rate_limited"}
    }


def test_exchange_log_is_bounded() -> None:
    log = Exchanges(limit=3)
    for i in range(5):
        log.add(str(i), Exchange(request={"i": i}))
    assert log.get("0") is None and log.get("1") is None
    assert log.get("4") is not None


# --- process -------------------------------------------------------------------


def start_mock(tmp_path: Path, tls: bool) -> tuple[str, Path | None, subprocess.Popen[bytes]]:
    """Start ``python -m mockllm`` on a free port; return (url, ca path or None, process)."""
    ready = tmp_path / "ready"
    cmd = [sys.executable, "-m", "mockllm", "--port", "0", "--ready-file", str(ready)]
    ca = None
    if tls:
        cmd += ["--tls", "--cert-dir", str(tmp_path / "certs")]
        ca = tmp_path / "certs" / "ca.pem"
    with (tmp_path / "stdout").open("wb") as out, (tmp_path / "stderr").open("wb") as err:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=err)
    deadline = time.monotonic() + 10
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"mock-llm did not start: {(tmp_path / 'stderr').read_text()}")
        time.sleep(0.02)
    return ready.read_text(), ca, proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    assert proc.wait(timeout=10) == 0, "SIGTERM must stop the mock cleanly"


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path | None]]:
    url, ca, proc = start_mock(tmp_path_factory.mktemp("plain"), tls=False)
    yield url, ca
    _stop(proc)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path | None]]:
    url, ca, proc = start_mock(tmp_path_factory.mktemp("tls"), tls=True)
    yield url, ca
    _stop(proc)


def client(ca: Path | None, http2: bool = True) -> httpx.Client:
    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(ca)) if ca else True
    return httpx.Client(http2=http2, verify=verify, timeout=10)


def sent(url: str, ca: Path | None, mock_id: str) -> dict[str, Any]:
    with client(ca) as c:
        record: dict[str, Any] = c.get(f"{url}/_mock/sent/{mock_id}").raise_for_status().json()
    return record


def test_announces_one_line(tmp_path: Path) -> None:
    url, ca, proc = start_mock(tmp_path, tls=True)
    try:
        assert re.fullmatch(r"https://127\.0\.0\.1:\d+", url)
        assert (tmp_path / "stdout").read_text() == f"mock-llm listening on {url} (ca: {ca})\n"
        with client(ca) as c:
            assert c.get(url + "/_mock/health").text == "ok"
    finally:
        _stop(proc)


@pytest.mark.parametrize(
    ("server", "http2", "version"),
    [("plain", True, "HTTP/1.1"), ("tls", True, "HTTP/2"), ("tls", False, "HTTP/1.1")],
)
def test_normal_stream(server: str, http2: bool, version: str, request: pytest.FixtureRequest) -> None:
    url, ca = request.getfixturevalue(server)
    mock_id = uuid.uuid4().hex
    with client(ca, http2) as c:
        response = c.post(f"{url}/v1/llm/stream?events=4", json=REQUEST, headers={"x-mock-id": mock_id})
        received = c.get(f"{url}/_mock/requests/{mock_id}").json()
    assert response.status_code == 200 and response.http_version == version
    assert response.headers["content-type"] == "text/event-stream"
    assert response.headers["x-mock-id"] == mock_id
    assert response.content == b"".join(expected("events=4"))
    record = sent(url, ca, mock_id)
    assert base64.b64decode(record["body_b64"]) == response.content
    assert record["completed"] and not record["aborted"]
    assert [n for _, n in record["chunks"]] == [len(item) for item in expected("events=4")]
    assert received["method"] == "POST" and received["query"] == "events=4"
    assert orjson.loads(base64.b64decode(received["body_b64"])) == REQUEST
    assert ["x-mock-id", mock_id] in received["headers"]


def test_routing_by_content_type_and_invalid_json(plain: tuple[str, Path | None]) -> None:
    url, ca = plain
    with client(ca) as c:
        response = c.post(
            f"{url}/any/path", content=b"{not json", headers={"content-type": "application/llm-request+json; x=y"}
        )
        assert response.content == b"".join(expected("", {}))
        assert c.post(f"{url}/other", json=REQUEST).status_code == 404
        bad = c.post(f"{url}/v1/llm/stream?events=lots", json=REQUEST)
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "mock_bad_scenario"


def test_pacing(tls: tuple[str, Path | None]) -> None:
    url, ca = tls
    mock_id = uuid.uuid4().hex
    with client(ca) as c, c.stream(
        "POST", f"{url}/v1/llm/stream", json=REQUEST, headers={"x-mock-id": mock_id, "x-mock": "events=3&delay=0.2"}
    ) as response:
        chunks = response.iter_raw()
        head = b""
        while b"\n\n" not in head:
            head += next(chunks)
        first_event_at = time.time()
        body = head + b"".join(chunks)
    assert body == b"".join(expected("events=3&delay=0.2"))
    record = sent(url, ca, mock_id)
    assert first_event_at < record["last_write"]
    assert record["last_write"] - record["first_write"] >= 6 * 0.2 * 0.9  # 7 events, 6 pauses


@pytest.mark.parametrize("server", ["plain", "tls"])
def test_truncation_is_a_transport_error(server: str, request: pytest.FixtureRequest) -> None:
    url, ca = request.getfixturevalue(server)
    mock_id = uuid.uuid4().hex
    received = bytearray()
    started = time.monotonic()
    with client(ca) as c, pytest.raises(httpx.RemoteProtocolError):
        with c.stream(
            "POST", f"{url}/v1/llm/stream?truncate_after=2&delay=0.05", json=REQUEST, headers={"x-mock-id": mock_id}
        ) as response:
            for chunk in response.iter_raw():
                received += chunk
    assert time.monotonic() - started < 3  # an abort, not an idle timeout
    assert bytes(received) == b"".join(expected("")[:2])
    record = sent(url, ca, mock_id)
    assert record["aborted"] and not record["completed"]
    assert base64.b64decode(record["body_b64"]) == bytes(received)


def test_truncation_wire_http1(plain: tuple[str, Path | None]) -> None:
    url, _ = plain
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"POST /v1/llm/stream?truncate_after=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        wire = b""
        while data := sock.recv(65536):
            wire += data
    first = expected("", {})[0]
    assert b"transfer-encoding: chunked" in wire.lower()
    assert wire.endswith(b"\r\n\r\n%x\r\n%s\r\n" % (len(first), first))  # closed without 0\r\n\r\n


def test_truncation_wire_http2_is_rst_stream(tls: tuple[str, Path | None]) -> None:
    url, ca = tls
    host, port = url.removeprefix("https://").rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(ca))
    context.set_alpn_protocols(["h2"])
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    path = "/v1/llm/stream?truncate_after=2"
    headers = [(":method", "POST"), (":path", path), (":scheme", "https"), (":authority", host)]
    conn.send_headers(1, headers, end_stream=True)
    data, reset = b"", None
    raw_sock = socket.create_connection((host, int(port)), timeout=5)
    with context.wrap_socket(raw_sock, server_hostname=host) as sock:
        assert sock.selected_alpn_protocol() == "h2"
        sock.sendall(conn.data_to_send())
        while reset is None:
            for event in conn.receive_data(sock.recv(65536)):
                if isinstance(event, h2.events.DataReceived):
                    data += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamReset):
                    reset = event
                assert not isinstance(event, h2.events.StreamEnded)
            sock.sendall(conn.data_to_send())
    assert reset.error_code == h2.errors.ErrorCodes.INTERNAL_ERROR
    assert data == b"".join(expected("", {})[:2])


@pytest.mark.parametrize("server", ["plain", "tls"])
def test_gzip(server: str, request: pytest.FixtureRequest) -> None:
    url, ca = request.getfixturevalue(server)
    mock_id = uuid.uuid4().hex
    with client(ca) as c:
        response = c.post(f"{url}/v1/llm/stream?gzip=1", json=REQUEST, headers={"x-mock-id": mock_id})
    assert response.headers["content-encoding"] == "gzip"
    assert response.content == b"".join(expected(""))  # httpx decoded it
    wire = base64.b64decode(sent(url, ca, mock_id)["body_b64"])
    assert wire == b"".join(plan_body(expected(""), Scenario(gzip=True)).writes)


def test_status_gives_json(tls: tuple[str, Path | None]) -> None:
    url, ca = tls
    with client(ca) as c:
        response = c.post(f"{url}/v1/llm/stream?status=429", json=REQUEST)
    assert response.status_code == 429
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"error": {"code": "rate_limited", "message": "mock error: rate_limited"}}


def test_raw_chunks_over_the_wire(plain: tuple[str, Path | None]) -> None:
    url, ca = plain
    raw = b"data: {\"broken\": \xc3\n\ndata: [DONE]\n\n"
    query = f"raw={base64.urlsafe_b64encode(raw).decode()}&chunk=5"
    mock_id = uuid.uuid4().hex
    with client(ca) as c:
        response = c.post(f"{url}/v1/llm/stream?{query}", json=REQUEST, headers={"x-mock-id": mock_id})
    assert response.content == raw
    assert [n for _, n in sent(url, ca, mock_id)["chunks"]] == [5] * 6 + [len(raw) - 30]


@pytest.mark.parametrize("server", ["plain", "tls"])
def test_client_disconnect_stops_writes(server: str, request: pytest.FixtureRequest) -> None:
    url, ca = request.getfixturevalue(server)
    mock_id = uuid.uuid4().hex
    with client(ca) as c:
        with c.stream(
            "POST", f"{url}/v1/llm/stream?events=30&delay=0.05", json=REQUEST, headers={"x-mock-id": mock_id}
        ) as response:
            next(response.iter_raw())  # leaving the block early closes (h1) or resets (h2) it
    deadline = time.monotonic() + 5
    while not (record := sent(url, ca, mock_id))["disconnected"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert record["disconnected"] and not record["completed"]
    assert len(record["chunks"]) < 10
