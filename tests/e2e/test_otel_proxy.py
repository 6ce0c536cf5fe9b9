"""OpenTelemetry export, end to end: a real mitmdump exporting to a real OTLP/HTTP receiver.

The receiver (tests/otlp_receiver.py) decodes what arrives with opentelemetry-proto's
classes. Checked: a span per recorded exchange with the GenAI and llm_audit attributes
matching the database row, the metrics, no credential in anything the receiver got, the
prompt and answer only with the content switch on; and with the collector down (nothing
listens on its port), every record in the database and every stream complete while the
export fails.
"""

from __future__ import annotations

import os
import socket
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
import pytest
from conftest import Proxy, Upstream, mitmdump_at_start, new_database, start_proxy, wait_for
from otlp_receiver import Receiver, start_receiver

pytestmark = pytest.mark.e2e

SECRET = "sk-proj-OtElSeCrEt" + "Q" * 40
QUERY_SECRET = "AIzaOtElQuErYsEcReT" + "z" * 20
PROMPT = "What does the river Mur carry?"
RULES = """
[[rule]]
id = "no-graz"
kind = "keywords"
keywords = ["Graz"]
scope = "request"
action = "block"
reason = "no questions about Graz"
"""
PRICES = """
[[price]]
provider = "*"
model = "gpt-otel"
input = 1000000
output = 2000000
"""  # a dollar per input token, two per output token: the cost is easy to check
FAST = {"OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_BLRP_SCHEDULE_DELAY": "100", "OTEL_METRIC_EXPORT_INTERVAL": "300"}


def chat(proxy: Proxy, up: Upstream, text: str = PROMPT, scenario: str = "events=5") -> tuple[str, bytes]:
    """A streamed Chat Completions exchange carrying credentials in headers and the query:
    (mock id, the body the client received)."""
    mock_id = uuid.uuid4().hex
    body = {
        "model": "gpt-otel",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": text}],
    }
    headers = {"authorization": f"Bearer {SECRET}", "x-api-key": SECRET, "x-mock-id": mock_id, "x-mock": scenario}
    with proxy.client() as client:
        resp = client.post(
            f"{up.url}/v1/chat/completions?key={QUERY_SECRET}", content=orjson.dumps(body), headers=headers
        )
    return mock_id, resp.content


def otel_proxy(tmp: Path, db: dict, endpoint: str, *options: str, env: dict[str, str] | None = None) -> Proxy:
    (tmp / "rules.toml").write_text(RULES)
    (tmp / "prices.toml").write_text(PRICES)
    env = FAST | {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SERVICE_NAME": "audit-e2e"} | (env or {})
    args = ("--set", "llm_audit_otel=on", "--set", f"llm_rules={tmp / 'rules.toml'}", *options)
    args += ("--set", f"llm_audit_prices={tmp / 'prices.toml'}")
    return start_proxy(tmp, *args, env=env, **db)


@pytest.fixture
def receiver():
    r = start_receiver()
    yield r
    r.stop()


def assert_no_secret(receiver: Receiver) -> None:
    everything = receiver.everything()
    assert everything, "the receiver got nothing"
    assert SECRET.encode() not in everything and QUERY_SECRET.encode() not in everything
    assert b"OtElSeCrEt" not in everything and b"OtElQuErY" not in everything


@pytest.mark.parametrize("content", [False, True], ids=["no-content", "content"])
def test_each_exchange_becomes_a_span_with_metrics_and_content_only_when_asked(
    request, tmp_path, upstreams, receiver, content
):
    up = upstreams["h1"]
    options = ("--set", "llm_audit_otel_content=true") if content else ()
    proxy = otel_proxy(tmp_path, new_database(request, "sqlite", tmp_path), receiver.endpoint, *options)
    try:
        proxy.process.wait_line(r"llm-audit: exporting spans and metrics")
        done, _ = chat(proxy, up)
        blocked, _ = chat(proxy, up, text="Tell me about Graz")
        rows = {m: proxy.mock_row(m) for m in (done, blocked)}
        by_id = {r["id"]: r for r in rows.values()}
        wait_for(lambda: set(by_id) <= {s["attributes"].get("llm_audit.exchange_id") for s in receiver.spans()})
        wait_for(lambda: {"llm_audit.blocked", "gen_ai.client.token.usage"} <= set(receiver.metrics()))
    finally:
        proxy.process.stop()
    assert receiver.errors == []
    spans = {s["attributes"]["llm_audit.exchange_id"]: s for s in receiver.spans()}
    completed, refused = rows[done], rows[blocked]
    span = spans[completed["id"]]
    a = span["attributes"]
    assert span["name"] == "chat gpt-otel" and span["kind"] == 3  # CLIENT
    assert span["resource"]["service.name"] == "audit-e2e"
    assert abs(span["start"] - completed["started_at"].timestamp() * 1e9) < 1e6  # the record's times, not the export's
    assert abs(span["end"] - completed["ended_at"].timestamp() * 1e9) < 1e6
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.provider.name"] == (completed["provider"] or "openai-chat")
    assert a["gen_ai.request.model"] == "gpt-otel" == completed["request_model"]
    assert a["gen_ai.response.model"] == completed["response_model"]
    assert a["gen_ai.usage.input_tokens"] == completed["input_tokens"] > 0
    assert a["gen_ai.usage.output_tokens"] == completed["output_tokens"] > 0
    assert a["gen_ai.response.finish_reasons"] == completed["finish_reasons"]
    assert a["gen_ai.request.stream"] is True and a["gen_ai.response.time_to_first_chunk"] >= 0
    assert a["llm_audit.status"] == "completed" and a["llm_audit.client"] == "127.0.0.1"
    assert a["llm_audit.api_key_fingerprint"] == completed["api_key_fingerprint"]
    assert a["server.address"] == completed["server_address"] and "error.type" not in a
    cost = completed["input_tokens"] + 2 * completed["output_tokens"]
    assert a["llm_audit.cost_usd"] == pytest.approx(float(completed["cost_usd"])) == pytest.approx(cost)

    no = spans[refused["id"]]["attributes"]
    assert (no["llm_audit.status"], no["error.type"]) == ("blocked", "content_filtered")
    assert no["llm_audit.verdicts"] == ["block:no-graz"] and spans[refused["id"]]["status"] == 2  # ERROR

    metrics = receiver.metrics()
    assert sum(int(p["as_int"]) for p in receiver.latest("llm_audit.blocked")) == 1
    statuses = {p["attributes"]["llm_audit.status"]: int(p["as_int"]) for p in receiver.latest("llm_audit.exchanges")}
    assert statuses == {"completed": 1, "blocked": 1}
    assert {p["attributes"]["gen_ai.token.type"] for p in metrics["gen_ai.client.token.usage"]} == {"input", "output"}
    assert sum(p["as_double"] for p in receiver.latest("llm_audit.cost")) == pytest.approx(cost)
    assert "gen_ai.client.operation.duration" in metrics and "gen_ai.client.operation.time_to_first_chunk" in metrics

    assert_no_secret(receiver)
    everything = receiver.everything()
    if content:
        logs = {r["attributes"]["llm_audit.exchange_id"]: r for r in receiver.logs()}
        log = logs[completed["id"]]
        assert log["trace_id"] == span["trace_id"] and log["span_id"] == span["span_id"]
        assert log["attributes"]["gen_ai.input.messages"] == [
            {"role": "user", "parts": [{"type": "text", "content": PROMPT}]}
        ]
        answer = log["attributes"]["gen_ai.output.messages"][0]["parts"][0]["content"]
        assert answer == completed["output_text"] and answer
        withheld = logs[refused["id"]]["attributes"]  # (the upstream never saw it: nor does the collector)
        assert withheld["gen_ai.input.messages"] == [] and withheld["llm_audit.content_withheld"] is True
        assert b"Tell me about Graz" not in everything
    else:
        assert receiver.logs() == []
        assert PROMPT.encode() not in everything and completed["output_text"].encode() not in everything
    proxy.process.wait_line(r"llm-audit: OpenTelemetry: \d+ spans exported")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_collector_that_is_down_loses_no_record_and_delays_no_stream(request, tmp_path, upstreams, backend):
    up = upstreams["h1"]
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    db = new_database(request, backend, tmp_path)
    proxy = otel_proxy(
        tmp_path, db, endpoint, "--set", "llm_audit_otel_content=true", env={"OTEL_EXPORTER_OTLP_TIMEOUT": "1"}
    )
    try:
        first = [chat(proxy, up) for _ in range(3)]
        proxy.process.wait_line(
            r"OpenTelemetry export to http://127\.0\.0\.1:\d+: \d+ spans or log records not delivered"
        )
        # the export is failing now: streams go on as ever, every event reaches its client
        with ThreadPoolExecutor(max_workers=8) as pool:
            later = list(pool.map(lambda _: chat(proxy, up, scenario="events=20&delay=0.01"), range(16)))
        for mock_id, got in [*first, *later]:
            assert got == up.sent(mock_id)["body"] and got.rstrip().endswith(b"data: [DONE]")
        for mock_id, _ in [*first, *later]:
            assert proxy.mock_row(mock_id)["status"] == "completed"
    finally:
        code = proxy.process.stop()
    assert code == 0, proxy.process.output[-2000:]
    assert len(proxy.rows()) == 19
    assert "Traceback" not in proxy.process.output
    sdk_lines = [line for line in proxy.process.lines if "Transient error" in line and "llm-audit:" not in line]
    assert sdk_lines == []  # the SDK's own lines stay out of the proxy's log (ours quote them)
    proxy.process.wait_line(r"OpenTelemetry: 0 spans exported .*not delivered")


def test_a_protocol_the_export_cannot_speak_stops_the_proxy_at_start_with_the_fix(tmp_path):
    proc = mitmdump_at_start(
        tmp_path,
        "llm_audit_otel=on",
        env=os.environ | {"XDG_STATE_HOME": str(tmp_path / "state"), "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out
    lines = [line for line in out.splitlines() if "OTEL_EXPORTER_OTLP_PROTOCOL=grpc is not supported" in line]
    assert len(lines) == 1 and "set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf" in lines[0], out
