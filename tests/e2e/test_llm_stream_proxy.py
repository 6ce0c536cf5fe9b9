"""llm-stream traffic end to end: httpx → mitmdump -s addon/llm_audit.py → mock upstream.

Each test sends real requests through a real proxy process and checks two things: the
client got exactly the upstream's bytes, as they were sent, and the audit row (read
with plain SQL, as a user would) says what happened. Every test runs once with an SQLite
file and once with a PostgreSQL database (the ``proxy`` and ``backend`` fixtures).
"""

from __future__ import annotations

import base64
import gzip
import signal
import subprocess
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import orjson
import pytest
from conftest import BIN, ROOT, Proxy, Upstream, new_database, start_proxy, wait_for
from sqlalchemy.engine import make_url

from exchange.transcript import output_choices

pytestmark = pytest.mark.e2e

# h1: HTTP/1.1 to a plain upstream; h1s: HTTP/1.1 over TLS; h2: HTTP/2 over TLS end to end
TRANSPORTS = ["h1", "h1s", "h2"]
UPSTREAM = {"h1": "h1", "h1s": "h2", "h2": "h2"}


def envelope(request_id: str, **extra) -> dict:
    return {
        "version": "1.0",
        "stream": True,
        "model": "mock-model",
        "messages": [{"role": "user", "content": "Hello"}],
        "metadata": {"request_id": request_id, "user_id": "alice", "session_id": "s-1"},
    } | extra


@pytest.fixture(params=TRANSPORTS)
def transport(request) -> str:
    return request.param


class Exchange:
    """One request through the proxy, with what the client saw."""

    def __init__(
        self,
        proxy: Proxy,
        upstream: Upstream,
        transport: str,
        scenario: str = "",
        *,
        body: bytes | None = None,
        headers: dict | None = None,
        path: str = "/v1/llm/stream",
        read_events: int | None = None,
    ):
        self.id = uuid.uuid4().hex
        self.chunk_times: list[float] = []
        self.chunks: list[bytes] = []
        self.error: Exception | None = None
        self.http_version = None
        hdrs = {"content-type": "application/llm-request+json", "x-mock-id": self.id, "x-mock": scenario}
        hdrs |= headers or {}
        content = body if body is not None else orjson.dumps(envelope(self.id))
        with proxy.client(http2=transport == "h2") as client:
            try:
                with client.stream("POST", upstream.url + path, content=content, headers=hdrs) as resp:
                    self.status = resp.status_code
                    self.http_version = resp.http_version
                    self.headers = resp.headers
                    for chunk in resp.iter_raw():
                        self.chunks.append(chunk)
                        self.chunk_times.append(time.time())
                        if read_events is not None and self.body.count(b"\n\n") >= read_events:
                            break  # the client walks away mid-stream
            except httpx.HTTPError as e:
                self.error = e

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)


def findings(row: dict) -> list[str]:
    return [f["code"] for f in row["findings"]]


def test_client_gets_upstream_bytes_unchanged_and_row_is_complete(proxy, upstreams, transport):
    up = upstreams[UPSTREAM[transport]]
    ex = Exchange(proxy, up, transport, "events=12")
    sent = up.sent(ex.id)
    assert ex.error is None and ex.status == 200
    assert ex.http_version == ("HTTP/2" if transport == "h2" else "HTTP/1.1")
    assert ex.body == sent["body"]

    row = proxy.row(ex.id)
    text = "".join(
        orjson.loads(line[6:])["delta"]["text"]
        for line in sent["body"].decode().split("\n")
        if line.startswith("data: ") and '"content.delta"' in line
    )
    assert row["status"] == "completed"
    assert row["dialect"] == "llm-stream"
    assert row["output_text"] == text and not text.isascii()
    assert (row["request_model"], row["response_model"]) == ("mock-model", "mock-model")
    assert (row["user_id"], row["session_id"]) == ("alice", "s-1")
    assert row["input_tokens"] is not None and row["output_tokens"] is not None
    assert row["finish_reasons"] == ["end_turn"]
    assert findings(row) == []
    assert row["streamed"] is True and row["http_status"] == 200
    assert row["bytes_to_client"] == len(sent["body"])
    assert row["event_count"] == sent["body"].count(b"\n\n")
    assert row["url_path"] == "/v1/llm/stream"
    assert row["server_address"] == "127.0.0.1" and row["client_address"] == "127.0.0.1"
    assert row["started_at"] <= row["first_chunk_at"] <= row["ended_at"]
    assert row["started_at"].tzinfo is UTC and abs(datetime.now(UTC) - row["started_at"]) < timedelta(minutes=1)


def test_paced_stream_reaches_the_client_before_the_upstream_finishes(proxy, upstreams, transport):
    up = upstreams[UPSTREAM[transport]]
    ex = Exchange(proxy, up, transport, "events=4&delay=0.3")
    sent = up.sent(ex.id)
    assert ex.body == sent["body"]
    assert ex.chunk_times[0] < sent["last_write"] - 0.5, "the first event was held back"


def test_upstream_cut_mid_stream_is_upstream_aborted_with_partial_text(proxy, upstreams, transport):
    up = upstreams[UPSTREAM[transport]]
    ex = Exchange(proxy, up, transport, "events=8&truncate_after=4")
    row = proxy.row(ex.id)
    assert ex.error is not None, "the client should see the broken stream"
    assert row["status"] == "upstream_aborted"
    assert row["output_text"] and "missing_stream_end" in findings(row)
    assert ex.body == up.sent(ex.id)["body"]


def test_client_walking_away_is_client_aborted_with_partial_text(proxy, upstreams, transport):
    up = upstreams[UPSTREAM[transport]]
    ex = Exchange(proxy, up, transport, "events=30&delay=0.1", read_events=3)
    row = proxy.row(ex.id)
    assert row["status"] == "client_aborted"
    assert row["output_text"]
    assert "missing_stream_end" not in findings(row)


def test_error_event_is_failed_with_code_and_message(proxy, upstreams, transport):
    ex = Exchange(proxy, upstreams[UPSTREAM[transport]], transport, "events=5&error=overloaded&error_after=2")
    row = proxy.row(ex.id)
    assert row["status"] == "failed"
    assert row["error_code"] == "overloaded" and row["error_message"]


def test_gzip_stream_passes_compressed_and_is_audited(proxy, upstreams, transport):
    up = upstreams[UPSTREAM[transport]]
    ex = Exchange(proxy, up, transport, "events=6&gzip=1", headers={"accept-encoding": "gzip"})
    sent = up.sent(ex.id)
    assert ex.headers["content-encoding"] == "gzip"
    assert ex.body == sent["body"]
    plain = gzip.decompress(sent["body"])
    row = proxy.row(ex.id)
    assert row["status"] == "completed" and row["output_text"]
    assert row["output_text"] == "".join(
        orjson.loads(line[6:])["delta"]["text"] for line in plain.decode().split("\n") if '"content.delta"' in line
    )
    assert row["bytes_to_client"] == len(sent["body"])
    assert row["event_count"] == plain.count(b"\n\n")


def test_http_error_response_is_failed(proxy, upstreams):
    ex = Exchange(proxy, upstreams["h1"], "h1", "status=429")
    row = proxy.row(ex.id)
    assert ex.status == 429
    assert (row["status"], row["http_status"], row["streamed"]) == ("failed", 429, False)
    assert row["error_code"] and row["error_message"]


def raw(body: bytes, chunk: int = 7) -> str:
    return f"raw={base64.urlsafe_b64encode(body).decode()}&chunk={chunk}"


START = b'event: stream.start\ndata: {"v":"1.0","seq":0,"type":"stream.start","model":"m","created":1}\n\n'
END = b'event: stream.end\ndata: {"v":"1.0","seq":%d,"type":"stream.end"}\n\n'


@pytest.mark.parametrize(
    "body, code",
    [
        (
            START + b'event: content.delta\ndata: {"v":"1.0","seq":1,"type":"content.delta"\n\n' + END % 2,
            "invalid_json",
        ),
        (
            START
            + b'event: content.delta\ndata: {"v":"1.0","seq":1,"type":"content.delta","index":0,"role":"assistant","delta":{"text":"\xff\xfe"}}\n\n'
            + b'event: content.stop\ndata: {"v":"1.0","seq":2,"type":"content.stop","index":0,"stop_reason":"end_turn"}\n\n'
            + END % 3,
            "sse_invalid_utf8",
        ),
        (START + END % 5, "seq_gap"),
    ],
    ids=["invalid-json", "invalid-utf8", "seq-gap"],
)
def test_bad_input_passes_unchanged_and_is_a_finding(proxy, upstreams, body, code):
    up = upstreams["h1"]
    ex = Exchange(proxy, up, "h1", raw(body, chunk=65536 if len(body) > 100000 else 7))
    assert ex.body == body
    row = proxy.row(ex.id)
    assert code in findings(row)
    # the proxy keeps serving other flows
    assert proxy.row(Exchange(proxy, up, "h1", "events=2").id)["status"] == "completed"


def test_giant_event_passes_unchanged_and_the_rest_of_the_stream_is_audited(proxy, upstreams, transport):
    up = upstreams[UPSTREAM[transport]]
    large = Exchange(proxy, up, transport, f"events=3&size={3 * 1024 * 1024}")
    big = Exchange(proxy, up, transport, f"events=1&size={12 * 1024 * 1024}")  # > 8 Mi characters
    assert big.body == up.sent(big.id)["body"] and len(big.body) > 12 * 1024 * 1024
    row = proxy.row(big.id)
    assert "sse_line_too_long" in findings(row)
    assert row["status"] == "completed", "stream.end after the giant event must still be seen"
    large_row = proxy.row(large.id)
    assert large_row["findings"] == [] and len(large_row["output_text"].encode()) == 3 * 3 * 1024 * 1024


def test_nul_characters_pass_unchanged_and_are_recorded(proxy, upstreams):
    """U+0000 in the prompt and the answer: SQLite keeps it, PostgreSQL (which cannot) gets
    U+FFFD, and a stored_reduced finding per column says so."""
    up = upstreams["h1"]
    delta = b'{"v":"1.0","seq":1,"type":"content.delta","index":0,"role":"assistant","delta":{"text":"a\\u0000b"}}'
    stop = b'{"v":"1.0","seq":2,"type":"content.stop","index":0,"stop_reason":"end_turn"}'
    body = (
        START + b"event: content.delta\ndata: " + delta + b"\n\nevent: content.stop\ndata: " + stop + b"\n\n" + END % 3
    )
    request_id = uuid.uuid4().hex
    request = envelope(request_id, messages=[{"role": "user", "content": "x\x00y"}])
    ex = Exchange(proxy, up, "h1", raw(body), body=orjson.dumps(request))
    assert ex.body == body and up.received(ex.id)["body"] == orjson.dumps(request)
    row = proxy.row(request_id)
    nul = "\x00" if proxy.backend == "sqlite" else "\ufffd"
    reduced = (
        []
        if proxy.backend == "sqlite"
        else [
            {
                "code": "stored_reduced",
                "detail": f"{column}: 1 U+0000 characters stored as U+FFFD (PostgreSQL cannot hold U+0000)",
            }
            for column in ("request_body", "output_text")  # (choice 0's text is not repeated in output)
        ]
    )
    assert row["status"] == "completed" and row["findings"] == reduced
    assert row["output_text"] == f"a{nul}b"
    assert output_choices(row)[0]["text"] == f"a{nul}b"
    assert row["request_body"]["messages"] == [{"role": "user", "content": f"x{nul}y"}]


def test_request_body_that_is_not_json_is_forwarded_unchanged_and_recorded(proxy, upstreams):
    up = upstreams["h1"]
    body = b"{this is not json \xff"
    mock_id = uuid.uuid4().hex
    ex = Exchange(proxy, up, "h1", "events=2", body=body, headers={"x-mock-id": mock_id})
    assert up.received(mock_id)["body"] == body
    row = proxy.mock_row(mock_id)
    assert "request_invalid_json" in findings(row)
    assert row["request_body"] == body.decode("utf-8", "replace")
    assert ex.status == 200


def test_credentials_never_reach_the_database(proxy, upstreams):
    secret = "sk-test-" + uuid.uuid4().hex
    ex = Exchange(
        proxy,
        upstreams["h1"],
        "h1",
        "events=2",
        headers={"authorization": f"Bearer {secret}", "x-api-key": secret + "-2"},
    )
    row = proxy.row(ex.id)
    assert row["api_key_fingerprint"].startswith("sha256:")
    headers = row["request_headers"]
    assert secret not in headers["authorization"] and headers["authorization"].startswith("[redacted sha256:")
    assert secret not in headers["x-api-key"] and headers["x-api-key"].startswith("[redacted sha256:")
    if proxy.backend == "sqlite":
        files = list(proxy.db_path.parent.glob("audit.db*"))
    else:  # every column of every table, as text; then the server's own files
        tables = [
            r["table_name"]
            for r in proxy.sql("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")
        ]
        assert "exchanges" in tables
        for table in tables:
            hits = proxy.sql(f'SELECT count(*) AS n FROM "{table}" AS t WHERE CAST(t AS text) LIKE ?', (f"%{secret}%",))
            assert hits == [{"n": 0}], table
        assert proxy.sql("SELECT count(*) AS n FROM exchanges AS t WHERE CAST(t AS text) LIKE ?", (f"%{ex.id}%",)) == [
            {"n": 1}
        ], "the row-to-text search must find what is there"
        files = proxy.pg.disk_files(make_url(proxy.db_url).database)
    contents = {path: path.read_bytes() for path in files}
    assert any(ex.id.encode() in data for data in contents.values()), "the files must hold the row"
    for path, data in contents.items():
        assert secret.encode() not in data, path


def test_stream_is_detected_by_its_first_event_when_the_request_says_nothing(proxy, upstreams):
    up = upstreams["h1"]
    ex = Exchange(proxy, up, "h1", "events=3", headers={"content-type": "application/json"})
    row = proxy.row(ex.id)
    assert row["dialect"] == "llm-stream" and row["status"] == "completed" and row["output_text"]


def test_other_traffic_is_not_recorded(proxy, upstreams):
    up = upstreams["h1"]
    marker = uuid.uuid4().hex
    with proxy.client() as c:
        assert c.get(f"{up.url}/_mock/health", headers={"x-marker": marker}).status_code == 200
        c.post(f"{up.url}/v1/other", json={"metadata": {"request_id": marker}})
    Exchange(proxy, up, "h1", "events=1")  # a recorded exchange after them, as a barrier
    time.sleep(0.5)
    assert proxy.rows("request_id = ? OR CAST(request_headers AS text) LIKE ?", (marker, f"%{marker}%")) == []


def test_shutdown_writes_finished_exchanges_and_open_streams_as_aborted(request, tmp_path, upstreams, backend):
    up = upstreams["h1"]
    proxy = start_proxy(tmp_path, **new_database(request, backend, tmp_path))
    done = Exchange(proxy, up, "h1", "events=2")
    live_id = "live-" + done.id
    live = threading.Thread(
        target=Exchange,
        args=(proxy, up, "h1", "events=100&delay=0.1"),
        kwargs={"headers": {"x-mock-id": live_id}},
        daemon=True,
    )
    live.start()
    wait_for(lambda: up.sent(live_id).get("chunks", [])[2:], what="the live stream to be under way")
    assert proxy.process.stop(signal.SIGTERM) == 0, proxy.process.output
    rows = {r["status"] for r in proxy.rows()}
    assert proxy.rows("request_id = ?", (done.id,))[0]["status"] == "completed"
    assert "client_aborted" in rows, proxy.process.output
    aborted = proxy.rows("status = 'client_aborted'")[0]
    assert "proxy_shutdown" in findings(aborted) and aborted["output_text"]
    assert "audit records written" in proxy.process.output


@pytest.mark.parametrize(
    "option, message",
    [
        ("llm_audit_db=nosuchdb://x", "llm_audit_db"),
        ("llm_audit_db=sqlite:////proc/no/such/dir/audit.db", "llm_audit_db=URL"),
        ("llm_audit_db=postgresql+psycopg://nobody@127.0.0.1:1/audit", "cannot open the audit database"),
        ("llm_audit_max_event_bytes=10", "llm_audit_max_event_bytes must be at least"),
    ],
)
def test_bad_options_stop_the_proxy_with_one_clear_line(tmp_path, option, message):
    proc = subprocess.run(
        [
            str(BIN / "mitmdump"),
            "--listen-port",
            "0",
            "--set",
            f"confdir={tmp_path}",
            "-s",
            str(ROOT / "addon" / "llm_audit.py"),
            "--set",
            option,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert [line for line in out.splitlines() if message in line and "llm-audit:" in line], out
    assert "Traceback" not in out, out


def test_missing_postgresql_database_stops_the_proxy_with_one_clear_line(tmp_path, postgres):
    """A reachable server without the database named in the URL."""
    url = postgres.url_for("no_such_database")
    proc = subprocess.run(
        [
            str(BIN / "mitmdump"),
            "--listen-port",
            "0",
            "--set",
            f"confdir={tmp_path}",
            "-s",
            str(ROOT / "addon" / "llm_audit.py"),
            "--set",
            f"llm_audit_db={url}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    lines = [line for line in out.splitlines() if "cannot open the audit database" in line and "llm-audit:" in line]
    assert lines and "no_such_database" in lines[0] and "llm_audit_db=URL" in lines[0], out
    assert "Traceback" not in out, out


def test_readme_proxy_command_records_to_the_default_database(request, tmp_path, upstreams, backend):
    """``scripts/proxy`` as the README shows it: the default SQLite file, or ``$LLM_AUDIT_DB``."""
    xdg = {"XDG_DATA_HOME": str(tmp_path / "xdg")}
    if backend == "sqlite":
        default_db = tmp_path / "xdg" / "llm-audit" / "audit.db"
        proxy = start_proxy(
            tmp_path, launcher=[str(ROOT / "scripts" / "proxy")], db_path=default_db, env=xdg | {"LLM_AUDIT_DB": ""}
        )
    else:
        db = new_database(request, backend, tmp_path)
        proxy = start_proxy(
            tmp_path,
            launcher=[str(ROOT / "scripts" / "proxy")],
            set_db=False,
            **db,
            env=xdg | {"LLM_AUDIT_DB": db["db_url"]},
        )
    try:
        assert "127.0.0.1" in proxy.process.wait_line(r"proxy listening at (\S+)").group(1)
        ex = Exchange(proxy, upstreams["h1"], "h1", "events=3")
        assert proxy.row(ex.id)["status"] == "completed"
    finally:
        assert proxy.process.stop() == 0
