"""The record says what happened, and the proxy never runs unaudited without saying so.

Real mitmdump processes against upstreams that misbehave at the protocol level
(``tests/rawupstream.py``: an HTTP/2 server that resets with CANCEL, HTTP/1.1 servers
that send exactly the bytes a test needs), on SQLite and PostgreSQL; ``kill -9`` under
load counted against what the clients saw complete.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import orjson
import pytest
from conftest import BIN, ROOT, new_database, start_proxy, wait_for
from rawupstream import h1_server, h2_reset_server

pytestmark = pytest.mark.e2e

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
SSE = [("content-type", "text/event-stream")]


def chunk_event(text: str) -> bytes:
    data = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
    }
    return b"data: " + orjson.dumps(data) + b"\n\n"


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)


def post_chat(proxy, url: str, request_id: str, stream: bool = True, **kwargs) -> httpx.Response:
    with proxy.client(**kwargs) as client:
        return client.post(
            f"{url}/v1/chat/completions", json=CHAT | {"stream": stream}, headers={"x-mock-id": request_id}
        )


# -- the proxy never runs unaudited -----------------------------------------------------------------


def test_an_option_given_twice_stops_the_proxy_with_one_line(tmp_path):
    cmd = [
        str(BIN / "mitmdump"),
        "--listen-host",
        "127.0.0.1",
        "--listen-port",
        "0",
        "--set",
        f"confdir={tmp_path / 'mitm'}",
        "-s",
        str(ROOT / "addon" / "llm_audit.py"),
        "--set",
        f"llm_audit_db=sqlite:///{tmp_path / 'audit.db'}",
        "--set",
        "llm_audit_instance=a",
        "--set",
        "llm_audit_instance=b",
    ]
    run = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=60,
        env={"XDG_DATA_HOME": str(tmp_path / "d"), "XDG_STATE_HOME": str(tmp_path / "s"), "PATH": str(BIN)},
    )
    assert run.returncode == 1, run
    lines = [line for line in (run.stdout + run.stderr).splitlines() if "llm-audit:" in line]
    assert len(lines) == 1 and "llm_audit_instance is set more than once ('a', 'b'); set it once" in lines[0], run


def test_a_proxy_that_is_not_recording_says_so_and_stops(tmp_path):
    proxy = start_proxy(tmp_path, "-s", str(ROOT / "tests" / "e2e" / "addons" / "close_audit_writer.py"))
    assert proxy.process.proc.wait(30) == 0
    assert "llm-audit: not recording: no audit database is open" in proxy.process.output
    assert "The proxy stops so that no traffic passes unaudited." in proxy.process.output


# -- the record says what happened ------------------------------------------------------------------


def test_an_upstream_http2_cancel_is_upstream_aborted(request, tmp_path, backend):
    with h2_reset_server(tmp_path, SSE, chunk_event("partial")) as (url, ca):
        proxy = start_proxy(tmp_path, upstream_ca=ca, **new_database(request, backend, tmp_path))
        try:
            rid = uuid.uuid4().hex
            with contextlib.suppress(httpx.HTTPError):  # the client sees the reset too
                post_chat(proxy, url, rid, http2=True)  # mitmproxy speaks HTTP/2 upstream for an HTTP/2 client
            row = proxy.mock_row(rid)
            assert (row["status"], row["output_text"]) == ("upstream_aborted", "partial"), row
        finally:
            proxy.process.stop()


def test_a_response_mitmproxy_refuses_is_recorded_with_the_reason(request, tmp_path, backend):
    body = b'{"choices": []}'

    def respond(conn: socket.socket, _request: bytes) -> None:
        conn.sendall(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"transfer-encoding: chunked\r\n\r\n" % len(body) + chunked(body) + b"0\r\n\r\n"
        )

    with h1_server(respond) as url:
        proxy = start_proxy(tmp_path, **new_database(request, backend, tmp_path))
        try:
            rid = uuid.uuid4().hex
            resp = post_chat(proxy, url, rid, stream=False)
            assert resp.status_code == 502  # mitmproxy's own answer
            row = proxy.mock_row(rid)
            assert (row["status"], row["http_status"], row["error_code"]) == ("failed", 200, "response_refused")
            assert "refusing to prevent request smuggling" in row["error_message"]
            assert [f["code"] for f in row["findings"]] == ["response_refused"]
        finally:
            proxy.process.stop()


def test_a_json_answer_with_invalid_utf8_keeps_its_text_and_status(request, tmp_path, backend):
    body = orjson.dumps(
        {
            "id": "c",
            "model": "m",
            "choices": [
                {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "caf\u00e9"}}
            ],
        }
    )
    body = body.replace("é".encode(), b"\xe9")

    def respond(conn: socket.socket, _request: bytes) -> None:
        conn.sendall(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
        )

    with h1_server(respond) as url:
        proxy = start_proxy(tmp_path, **new_database(request, backend, tmp_path))
        try:
            rid = uuid.uuid4().hex
            assert post_chat(proxy, url, rid, stream=False).content == body  # passed on unchanged
            row = proxy.mock_row(rid)
            assert (row["status"], row["output_text"]) == ("completed", "caf\ufffd")
            assert [f["code"] for f in row["findings"]] == ["response_invalid_utf8"]
        finally:
            proxy.process.stop()


def test_a_client_that_closes_right_after_done_is_completed(request, tmp_path, backend):
    """The openai SDK closes as soon as it reads ``[DONE]``, before the body's end arrives."""

    def respond(conn: socket.socket, _request: bytes) -> None:
        conn.sendall(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            + chunked(chunk_event("all"), b"data: [DONE]\n\n")
        )
        time.sleep(1.0)  # the end of the body comes late: the client is gone by then
        conn.sendall(b"0\r\n\r\n")

    with h1_server(respond) as url:
        proxy = start_proxy(tmp_path, **new_database(request, backend, tmp_path))
        try:
            ids = []
            for _ in range(4):  # it used to depend on a race
                rid = uuid.uuid4().hex
                ids.append(rid)
                with (
                    proxy.client() as client,
                    client.stream(
                        "POST", f"{url}/v1/chat/completions", json=CHAT | {"stream": True}, headers={"x-mock-id": rid}
                    ) as resp,
                ):
                    for line in resp.iter_lines():
                        if line == "data: [DONE]":
                            break
            for rid in ids:
                row = proxy.mock_row(rid)
                assert (row["status"], row["output_text"]) == ("completed", "all"), row
        finally:
            proxy.process.stop()


def test_kill_9_under_load_loses_no_exchange_a_client_saw_complete(request, tmp_path, upstreams, backend):
    """20 concurrent streams; the proxy is killed; every exchange whose client had its
    whole answer well before the kill (0.5 s: the bound measured by ``scripts/bench`` is
    far smaller, this only keeps a loaded CI machine from flaking) is in the database."""
    db = new_database(request, backend, tmp_path)
    options = ("--set", "llm_audit_instance=killed", "--set", f"llm_audit_spool={tmp_path / 'spool.jsonl'}")
    (tmp_path / "run1").mkdir()
    proxy = start_proxy(tmp_path / "run1", *options, **db)
    done: dict[str, float] = {}  # request id -> when its client had the whole answer
    stop = threading.Event()

    def client_loop() -> None:
        with proxy.client() as client:
            while not stop.is_set():
                rid = uuid.uuid4().hex
                try:
                    resp = client.post(
                        f"{upstreams['h1'].url}/v1/llm/stream",
                        content=orjson.dumps(
                            {
                                "version": "1.0",
                                "stream": True,
                                "model": "mock-model",
                                "messages": [{"role": "user", "content": "hi"}],
                            }
                        ),
                        headers={
                            "content-type": "application/llm-request+json",
                            "x-mock": "events=5&delay=0.01",
                            "x-mock-id": rid,
                        },
                    )
                except httpx.HTTPError:
                    return
                if b"stream.end" in resp.content:
                    done[rid] = time.time()

    with ThreadPoolExecutor(max_workers=20) as pool:
        for _ in range(20):
            pool.submit(client_loop)
        # (what counts is how many finished 0.5 s before the kill, not in all: the faster
        # the machine, the more of any fixed number are younger than that)
        wait_for(
            lambda: sum(at < time.time() - 0.5 for at in list(done.values())) >= 100,
            timeout=60,
            what="100 exchanges complete under load for 0.5 s",
        )
        killed_at = time.time()
        proxy.process.stop(signal.SIGKILL)
        stop.set()
    (tmp_path / "run2").mkdir()
    restarted = start_proxy(tmp_path / "run2", *options, **db)
    try:
        settled = [rid for rid, at in done.items() if at < killed_at - 0.5]
        assert len(settled) >= 100

        def recorded() -> set[str]:
            rows = restarted.sql(
                f"SELECT {restarted.header_sql('x-mock-id')} AS mock_id FROM exchanges WHERE status = 'completed'"
            )
            return {r["mock_id"] for r in rows}

        wait_for(
            lambda: set(settled) <= recorded(),
            timeout=30,
            what=f"every settled exchange completed ({len(set(settled) - recorded())} missing)",
        )
        check = subprocess.run(
            [str(BIN / "llm-audit"), "--db", db["db_url"], "verify"], capture_output=True, text=True, timeout=120
        )
        assert check.returncode == 0, check
    finally:
        restarted.process.stop()


def keyword_guarded(request, tmp_path, backend):
    """A proxy with one blocking keyword rule (``Nightjar``), the closed policy by default."""
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\nid = "code"\nkind = "keywords"\nkeywords = ["Nightjar"]\naction = "block"\n')
    return start_proxy(tmp_path, "--set", f"llm_rules={rules}", **new_database(request, backend, tmp_path))


@pytest.mark.parametrize(
    ("name", "body"),
    [
        (
            "utf-16",
            orjson.dumps(
                {
                    "id": "c",
                    "model": "m",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Nightjar"}}],
                }
            )
            .decode()
            .encode("utf-16"),
        ),
        ("not json", b"<p>the code name is Nightjar</p>"),
    ],
)
def test_a_whole_answer_the_filters_cannot_read_as_json_is_not_let_through_unchecked(
    request, tmp_path, backend, name, body
):
    """The openai SDK reads a UTF-16 answer (httpx's ``json.loads`` of the bytes): it is
    read so and blocked by its text; a 2xx answer that is not JSON is decided by the
    failure policy (``closed``, the default: blocked). Before, both reached the client."""

    def respond(conn: socket.socket, _request: bytes) -> None:
        conn.sendall(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
        )

    with h1_server(respond) as url:
        proxy = keyword_guarded(request, tmp_path, backend)
        try:
            rid = uuid.uuid4().hex
            answer = post_chat(proxy, url, rid, stream=False)
            assert "Nightjar" not in answer.content.decode("utf-8", "replace"), name
            assert "Nightjar".encode("utf-16-le") not in answer.content, name
            row = proxy.mock_row(rid)
            rule = row["verdicts"][0]["rule_id"] if row["verdicts"] else None
            assert (row["status"], rule) == ("blocked", "code" if name == "utf-16" else "filter_error"), name
        finally:
            proxy.process.stop()


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 307 Temporary Redirect\r\nlocation: /v1/chat/completions\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 0\r\n\r\n",
    ],
    ids=["307", "204", "empty 200"],
)
def test_a_response_that_is_no_answer_passes_under_the_closed_policy(request, tmp_path, backend, head):
    """A redirect (gin and Starlette send a 307 for a trailing slash), a 204 or an empty
    body holds no text to check: the closed policy replaced them with a 400 (review 52c)."""

    def respond(conn: socket.socket, _request: bytes) -> None:
        conn.sendall(head)

    with h1_server(respond) as url:
        proxy = keyword_guarded(request, tmp_path, backend)
        try:
            rid = uuid.uuid4().hex
            answer = post_chat(proxy, url, rid, stream=False, follow_redirects=False)
            assert answer.status_code == int(head.split()[1]), answer.content
            assert proxy.mock_row(rid)["status"] != "blocked"
        finally:
            proxy.process.stop()
