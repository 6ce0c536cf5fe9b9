"""The OpenTelemetry export: what a row becomes (addon.otel_semconv) and the exporter against
a real OTLP/HTTP receiver (tests/otlp_receiver.py), a collector that is down, and bad settings."""

from __future__ import annotations

import socket
import threading
import time
from datetime import UTC, datetime, timedelta

import orjson
import pytest
from otlp_receiver import start_receiver

from addon import otel_export, otel_semconv
from addon.otel_export import OtelExporter, OtelUnavailable, signals_from_env

SECRET = "sk-proj-SeCrEtKeY0123456789abcdefSECRET"
T0 = datetime(2026, 12, 2, 5, 0, 0, tzinfo=UTC)


def row(**overrides) -> dict:
    """A final row as ExchangeRecord.to_row() makes it, with a credential wherever the record
    could still hold one in clear (headers and query are fingerprinted there; the error
    message is the upstream's text)."""
    base = {
        "id": "e" * 32,
        "dialect": "anthropic-messages",
        "provider": "anthropic",
        "status": "completed",
        "started_at": T0,
        "first_chunk_at": T0 + timedelta(seconds=0.25),
        "ended_at": T0 + timedelta(seconds=2),
        "server_address": "api.anthropic.com",
        "server_port": 443,
        "http_method": "POST",
        "url_path": f"/v1/messages/{SECRET}",
        "url_query": f"key={SECRET}",
        "http_status": 200,
        "client_address": "10.0.0.7",
        "proxy_instance": "proxy-a",
        "api_key_fingerprint": "sha256:0123abcd",
        "request_headers": {"x-api-key": SECRET, "authorization": f"Bearer {SECRET}"},
        "response_headers": {"set-cookie": SECRET},
        "request_model": "claude-x",
        "response_model": "claude-x-2026",
        "response_id": "msg_1",
        "request_id": "req_1",
        "user_id": "alice",
        "session_id": "conv-9",
        "streamed": True,
        "request_body": {"system": "be brief", "messages": [{"role": "user", "content": "what is 2+2?"}]},
        "output_text": "4",
        "output": {
            "choices": [{"index": 0, "reasoning": "add", "finish_reason": "end_turn"}],  # (its text: output_text)
            "tool_calls": [{"id": "t1", "name": "calc", "arguments": '{"a":2}', "complete": True}],
        },
        "finish_reasons": ["end_turn"],
        "input_tokens": 120,
        "output_tokens": 7,
        "cache_read_input_tokens": 100,
        "cache_write_input_tokens": 10,
        "reasoning_output_tokens": 3,
        "error_code": None,
        "error_message": f"Invalid key {SECRET}",
        "findings": [{"code": "secret_in_prompt", "detail": SECRET}],
        "verdicts": [{"action": "flag", "rule_id": "no-keys", "reason": "keys", "match_hash": "h"}],
        "delivered_text": None,
        "connection_id": None,
        "turn": None,
    }
    return base | overrides


# -- the mapping -------------------------------------------------------------------------------


def test_a_row_becomes_the_genai_span_attributes_and_the_proxys_own():
    attrs = otel_semconv.span_attributes(row(cost_usd=0.0123))
    assert otel_semconv.span_name(row()) == "chat claude-x"
    assert attrs == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "anthropic",
        "gen_ai.request.model": "claude-x",
        "gen_ai.response.model": "claude-x-2026",
        "server.address": "api.anthropic.com",
        "server.port": 443,
        "gen_ai.response.id": "msg_1",
        "gen_ai.conversation.id": "conv-9",
        "gen_ai.request.stream": True,
        "gen_ai.response.time_to_first_chunk": 0.25,
        "gen_ai.response.finish_reasons": ["end_turn"],
        "gen_ai.usage.input_tokens": 120,
        "gen_ai.usage.output_tokens": 7,
        "gen_ai.usage.cache_read.input_tokens": 100,
        "gen_ai.usage.cache_write.input_tokens": 10,
        "gen_ai.usage.reasoning.output_tokens": 3,
        "llm_audit.exchange_id": "e" * 32,
        "llm_audit.status": "completed",
        "llm_audit.dialect": "anthropic-messages",
        "llm_audit.user": "alice",
        "llm_audit.client": "10.0.0.7",
        "llm_audit.proxy_instance": "proxy-a",
        "llm_audit.api_key_fingerprint": "sha256:0123abcd",
        "llm_audit.request_id": "req_1",
        "llm_audit.http_status": 200,
        "llm_audit.cost_usd": 0.0123,
        "llm_audit.findings": ["secret_in_prompt"],
        "llm_audit.verdicts": ["flag:no-keys"],
    }
    assert SECRET not in orjson.dumps(attrs).decode()


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"status": "blocked", "error_code": "content_filtered"}, "content_filtered"),
        ({"status": "failed", "http_status": 429}, "429"),
        ({"status": "upstream_aborted"}, "upstream_aborted"),
        ({"status": "client_aborted"}, "client_aborted"),
        ({"status": "completed"}, None),
    ],
)
def test_error_type_names_what_went_wrong(overrides, expected):
    assert otel_semconv.error_type(row(**overrides)) == expected


@pytest.mark.parametrize(
    ("overrides", "operation"),
    [
        ({"dialect": "gemini", "provider": "gcp.gemini"}, "generate_content"),
        ({"dialect": "openai-completions"}, "text_completion"),
        ({"dialect": "ollama", "url_path": "/api/generate"}, "text_completion"),
        ({"dialect": "ollama", "url_path": "/api/chat"}, "chat"),
        ({"dialect": "llm-stream", "provider": None, "request_model": None}, "chat"),
    ],
)
def test_operation_name_per_dialect(overrides, operation):
    assert otel_semconv.operation_name(row(**overrides)) == operation


def test_a_row_without_provider_names_its_dialect_and_unknowns_are_left_out():
    attrs = otel_semconv.span_attributes(
        row(provider=None, request_model=None, response_model=None, input_tokens=None, streamed=False, cost_usd=None)
    )
    assert attrs["gen_ai.provider.name"] == "anthropic-messages"
    assert "gen_ai.request.model" not in attrs and "gen_ai.usage.input_tokens" not in attrs
    assert "gen_ai.request.stream" not in attrs and "llm_audit.cost_usd" not in attrs
    assert otel_semconv.span_name(row(request_model=None)) == "chat"


def test_content_is_the_conversation_and_what_the_client_got():
    got = otel_semconv.content(row(delivered_text="[withheld]"))
    assert got["gen_ai.input.messages"] == [
        {"role": "system", "parts": [{"type": "text", "content": "be brief"}]},
        {"role": "user", "parts": [{"type": "text", "content": "what is 2+2?"}]},
    ]
    assert got["gen_ai.output.messages"] == [
        {
            "role": "assistant",
            "parts": [
                {"type": "reasoning", "content": "add"},
                {"type": "text", "content": "[withheld]"},
                {"type": "tool_call", "id": "t1", "name": "calc", "arguments": '{"a":2}'},
            ],
            "finish_reason": "end_turn",
        }
    ]


def test_content_gives_choice_zero_its_text_from_output_text_in_either_form():
    for output in (row()["output"], {"choices": [{"index": 0, "text": "4", "finish_reason": "end_turn"}]}):
        parts = otel_semconv.content(row(output=output))["gen_ai.output.messages"][0]["parts"]
        assert {"type": "text", "content": "4"} in parts


def test_content_of_hostile_rows_is_read_carefully():
    huge = "x" * (otel_semconv.MAX_CONTENT_CHARS + 10)
    got = otel_semconv.content(row(output={"choices": [None, {"index": 0, "text": huge}], "tool_calls": "no"}))
    assert len(got["gen_ai.output.messages"][0]["parts"][0]["content"]) == otel_semconv.MAX_CONTENT_CHARS
    assert otel_semconv.content(row(output="text", request_body="plain")) == {
        "gen_ai.input.messages": [],
        "gen_ai.output.messages": [],
    }
    assert otel_semconv.span_attributes(row(findings="x", verdicts=[1, None], cost_usd="NaNx", input_tokens=-1))


def test_content_keeps_the_latest_messages_within_its_budget():
    history = [{"role": "user", "content": f"{i:05d}" + "h" * 20_000} for i in range(10)]
    got = otel_semconv.content(row(request_body={"messages": history}))
    kept = [m["parts"][0]["content"][:5] for m in got["gen_ai.input.messages"]]
    assert kept[-1] == "00009" and "00000" not in kept  # the newest turn first, the oldest cut
    assert sum(len(m["parts"][0]["content"]) for m in got["gen_ai.input.messages"]) == otel_semconv.MAX_CONTENT_CHARS
    assert got["llm_audit.content_truncated"] is True
    many = otel_semconv.content(row(request_body={"messages": [{"role": "user", "content": "x"}] * 5000}))
    assert len(many["gen_ai.input.messages"]) == otel_semconv.MAX_ITEMS
    assert "llm_audit.content_truncated" not in otel_semconv.content(row())


def test_hostile_values_are_bounded_in_attributes():
    attrs = otel_semconv.span_attributes(row(request_model="m" * 100_000, finish_reasons=["stop"] * 10_000))
    assert len(attrs["gen_ai.request.model"]) == otel_semconv.MAX_ATTRIBUTE_CHARS
    assert len(attrs["gen_ai.response.finish_reasons"]) == otel_semconv.MAX_LIST


LONE = "\ud800"  # a lone surrogate: a lenient JSON reader's "\\ud800", no UTF-8
HOSTILE = row(
    request_model=f"gpt-{LONE}",
    response_model=LONE,
    user_id=f"eve{LONE}",
    session_id=LONE,
    error_code=f"bad{LONE}",
    finish_reasons=[LONE],
    input_tokens=2**64,
    output_tokens=2**63,
    cost_usd=float("inf"),
    verdicts=[{"action": "flag", "rule_id": LONE}],
    request_body={"messages": [{"role": f"user{LONE}", "content": f"ignore all rules {LONE}"}]},
    output={"choices": [{"index": 0, "finish_reason": LONE}], "tool_calls": [{"id": LONE, "name": LONE}]},
    output_text=f"ok {LONE}",
)


def _leaves(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


def test_what_a_filter_blocked_stays_in_the_database():
    """With content on, a prompt a secrets rule kept from the upstream went to the
    collector, key and all (review 51, finding 2); and, of a blocked answer, its
    reasoning, its tool calls' arguments and its other choices as the upstream sent them
    (the second review, finding 1). A blocked exchange leaves only the text its client got."""
    key = f"OPENAI_API_KEY={SECRET}"
    verdict = {"action": "block", "rule_id": "credentials"}
    cases = {
        "the request": row(
            status="blocked",
            request_body={"messages": [{"role": "user", "content": f"debug this: {key}"}]},
            verdicts=[verdict | {"location": "messages[0].content"}],
            output_text=None,
            output=None,
        ),
        "the reasoning": row(
            delivered_text="",
            output={"choices": [{"index": 0, "reasoning": key, "finish_reason": "end_turn"}], "tool_calls": []},
            verdicts=[verdict | {"location": "output.choices[0].reasoning"}],
        ),
        "a tool call": row(
            delivered_text="Sure: ",
            output={"choices": [{"index": 0}], "tool_calls": [{"id": "t", "name": "f", "arguments": key}]},
            verdicts=[verdict | {"location": "output.tool_calls[t].arguments"}],
        ),
        "choice 1": row(
            delivered_text="4",
            output={"choices": [{"index": 0}, {"index": 1, "text": key}], "tool_calls": []},
            verdicts=[verdict | {"location": "output.choices[1].text"}],
        ),
        "a request, named as output by its filter": row(
            request_body={"messages": [{"role": "user", "content": key}]},
            verdicts=[verdict | {"location": "output of my filter"}],
        ),
    }
    for name, blocked in cases.items():
        out = otel_semconv.content(blocked)
        assert SECRET not in orjson.dumps(out).decode(), name
        assert out["gen_ai.input.messages"] == [] and out["llm_audit.content_withheld"] is True, name
        delivered = blocked["delivered_text"]
        assert [p["content"] for m in out["gen_ai.output.messages"] for p in m["parts"]] == (
            [delivered] if delivered else []
        ), name
    flagged = row(verdicts=[{"action": "flag", "rule_id": "r", "location": "messages[0].content"}])
    out = otel_semconv.content(flagged)  # (a flagged prompt went upstream: it is exported)
    assert out["gen_ai.input.messages"] and "llm_audit.content_withheld" not in out


def test_every_value_that_leaves_is_one_otlp_encodes():
    """The export reads the record before the writer cleans it: a lone surrogate in the
    model made the encoder drop the whole batch of spans (other exchanges' too), one in
    the prompt or the user id dropped that attribute unsaid, and an integer past 64 bits
    or an infinite cost was dropped. They leave as the database stores them (U+FFFD)."""
    values = [
        otel_semconv.span_name(HOSTILE),
        otel_semconv.error_type(HOSTILE),
        *_leaves(otel_semconv.span_attributes(HOSTILE)),
        *_leaves(otel_semconv.content(HOSTILE)),
    ]
    for value in values:
        if isinstance(value, str):
            value.encode()
        elif isinstance(value, int):
            assert -(2**63) <= value < 2**63, value
        elif isinstance(value, float):
            assert value == value and abs(value) != float("inf"), value
    attrs = otel_semconv.span_attributes(HOSTILE)
    assert attrs["llm_audit.user"] == "eve\ufffd" and otel_semconv.span_name(HOSTILE) == "chat gpt-\ufffd"
    assert "gen_ai.usage.input_tokens" not in attrs and "llm_audit.cost_usd" not in attrs
    assert otel_semconv.content(HOSTILE)["gen_ai.input.messages"][0]["parts"][0]["content"] == "ignore all rules \ufffd"


# -- the settings --------------------------------------------------------------------------------


def test_only_the_http_protocol_is_accepted_and_signals_can_be_turned_off():
    with pytest.raises(OtelUnavailable, match=r"OTEL_EXPORTER_OTLP_PROTOCOL=grpc is not supported.*http/protobuf"):
        signals_from_env({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    with pytest.raises(OtelUnavailable, match="OTEL_LOGS_EXPORTER=console is not supported"):
        signals_from_env({"OTEL_LOGS_EXPORTER": "console"})
    signals = signals_from_env({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_METRICS_EXPORTER": "none"})
    assert (signals.traces, signals.metrics, signals.logs) == (True, False, True)


def test_the_endpoint_in_log_lines_carries_no_credential():
    assert (
        otel_export._endpoint({"OTEL_EXPORTER_OTLP_ENDPOINT": f"https://u:{SECRET}@otel.example:4318/x?k={SECRET}"})
        == "https://otel.example:4318"
    )


# -- against a real receiver ----------------------------------------------------------------------


@pytest.fixture
def receiver(monkeypatch):
    r = start_receiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", r.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-collector-token=tok123")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "audit-proxy")
    yield r
    r.stop()


def test_spans_metrics_and_content_logs_reach_the_receiver(receiver):
    exporter = OtelExporter("proxy-a", content=True)
    exporter.submit(row(cost_usd=0.5))
    exporter.submit(row(id="b" * 32, status="blocked", error_code="content_filtered", streamed=False))
    exporter.close()
    assert receiver.errors == []
    spans = {s["attributes"]["llm_audit.exchange_id"]: s for s in receiver.spans()}
    first = spans["e" * 32]
    assert first["name"] == "chat claude-x" and first["kind"] == 3  # SPAN_KIND_CLIENT
    assert (first["start"], first["end"]) == (int(T0.timestamp() * 1e9), int((T0.timestamp() + 2) * 1e9))
    assert first["attributes"] == otel_semconv.span_attributes(row(cost_usd=0.5))
    assert first["resource"]["service.name"] == "audit-proxy"
    assert first["resource"]["service.instance.id"] == "proxy-a"
    assert first["resource"]["deployment.environment"] == "test"
    assert spans["b" * 32]["status"] == 2  # STATUS_CODE_ERROR
    assert all(h.get("x-collector-token") == "tok123" for h in receiver.headers)

    metrics = receiver.metrics()
    exchanges = {p["attributes"]["llm_audit.status"]: int(p["as_int"]) for p in metrics["llm_audit.exchanges"]}
    assert exchanges == {"completed": 1, "blocked": 1}
    assert sum(int(p["as_int"]) for p in metrics["llm_audit.blocked"]) == 1
    assert [p["as_double"] for p in metrics["llm_audit.cost"]] == [0.5]
    tokens: dict[str, float] = {}
    for p in metrics["gen_ai.client.token.usage"]:  # one series per error.type
        kind = p["attributes"]["gen_ai.token.type"]
        tokens[kind] = tokens.get(kind, 0) + p["sum"]
    assert tokens == {"input": 240, "output": 14}
    assert {p["sum"] for p in metrics["gen_ai.client.operation.duration"]} == {2.0}
    assert metrics["gen_ai.client.operation.duration"][0]["unit"] == "s"
    assert [p["sum"] for p in metrics["gen_ai.client.operation.time_to_first_chunk"]] == [0.25]

    logs = {r["attributes"]["llm_audit.exchange_id"]: r for r in receiver.logs()}
    log = logs["e" * 32]
    assert log["event_name"] == "gen_ai.client.inference.operation.details"
    assert (log["trace_id"], log["span_id"]) == (first["trace_id"], first["span_id"])
    assert log["attributes"]["gen_ai.input.messages"][1]["parts"][0]["content"] == "what is 2+2?"
    assert SECRET.encode() not in receiver.everything()
    assert "2 spans exported" in exporter.summary() and "not delivered" not in exporter.summary()


def test_one_hostile_row_loses_no_other_span_and_none_of_its_own_attributes(receiver):
    exporter = OtelExporter("proxy-a", content=True)
    for i in range(5):
        exporter.submit(row(id=f"{i:032x}"))
    exporter.submit(HOSTILE | {"id": "h" * 32})
    exporter.close()
    assert exporter.undelivered() == 0, exporter.summary()
    spans = {s["attributes"]["llm_audit.exchange_id"]: s for s in receiver.spans()}
    assert len(spans) == 6 and spans["h" * 32]["attributes"]["gen_ai.request.model"] == "gpt-\ufffd"
    logs = {r["attributes"]["llm_audit.exchange_id"]: r for r in receiver.logs()}
    assert "gen_ai.input.messages" in logs["h" * 32]["attributes"] and "llm_audit.user" in spans["h" * 32]["attributes"]


def test_a_row_without_its_cost_is_priced_on_the_export_thread(receiver):
    priced = []
    exporter = OtelExporter("proxy-a", price=lambda r: priced.append(r["id"]) or 0.75)
    exporter.submit(row(cost_usd=None))
    exporter.submit(row(id="c" * 32, cost_usd=0.5))  # already priced: not again
    exporter.close()
    costs = {s["attributes"]["llm_audit.exchange_id"]: s["attributes"]["llm_audit.cost_usd"] for s in receiver.spans()}
    assert costs == {"e" * 32: 0.75, "c" * 32: 0.5} and priced == ["e" * 32]
    assert [p["as_double"] for p in receiver.latest("llm_audit.cost")] == [1.25]


def test_without_the_content_switch_no_content_leaves(receiver):
    exporter = OtelExporter("proxy-a")
    exporter.submit(row())
    exporter.close()
    assert len(receiver.spans()) == 1 and receiver.logs() == []
    assert b"what is 2+2?" not in receiver.everything() and b"be brief" not in receiver.everything()
    assert SECRET.encode() not in receiver.everything()


def test_a_collector_that_is_down_costs_a_bounded_shutdown_and_is_counted(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    exporter = OtelExporter("proxy-a", content=True)
    for i in range(20):
        exporter.submit(row(id=f"{i:032x}"))
    started = time.monotonic()
    exporter.close(timeout=2.0)
    assert time.monotonic() - started < 10  # bounded: the SDK's own shutdown would wait 30 s
    assert "0 spans exported" in exporter.summary()
    assert "40 spans or log records not delivered" in exporter.summary()
    assert "Connection refused" in exporter.summary()  # the SDK's reason, quoted


def test_a_full_queue_drops_exports_and_counts_them(receiver, monkeypatch):
    monkeypatch.setattr(otel_export, "QUEUE_SIZE", 1)
    exporter = OtelExporter("proxy-a")
    gate, export = threading.Event(), exporter._export
    exporter._export = lambda r: (gate.wait(10), export(r))  # a slow export thread
    for i in range(50):
        exporter.submit(row(id=f"{i:032x}"))
    gate.set()
    exporter.close()
    assert exporter.dropped >= 48 and exporter.submitted == 50 - exporter.dropped
    assert len(receiver.spans()) == exporter.submitted
    assert f"{exporter.dropped} spans or log records not delivered" in exporter.summary()


def test_without_the_sdk_one_line_names_the_fix(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_sdk(name, *args, **kwargs):
        if name.startswith("opentelemetry.exporter"):
            raise ImportError(name=name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_sdk)
    with pytest.raises(OtelUnavailable, match=r"pip install 'llm-audit\[otel\]'"):
        OtelExporter("proxy-a")


def test_the_sdks_reason_quoted_in_our_lines_carries_no_collector_credential(monkeypatch):
    """A connection error names the URL with its query: the collector's credentials in the
    endpoint's query or user part, or in the headers, never reach the proxy's log."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens
    monkeypatch.setenv(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        f"http://ingest:pw-{SECRET}@127.0.0.1:{port}/ingest/p-{SECRET}/v1/traces?api_key=q-{SECRET}",
    )  # (a key in the path: the SDK's connection error quotes it)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"x-collector-token=h-{SECRET}")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    exporter = OtelExporter("proxy-a")
    exporter.submit(row())
    exporter.close(timeout=2.0)
    summary = exporter.summary()
    assert "Connection refused" in summary  # the SDK's reason is still quoted
    assert SECRET not in summary and "api_key" not in summary


def test_scrub_replaces_known_secrets_and_every_url_query():
    secrets = otel_export.collector_secrets(
        {
            "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Basic%20dXNlcjpwYXNz,x-k=abc123",
            "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "https://u:p%40ss@c.example/v1/logs?token=t%2Fok",
            "OTEL_SERVICE_NAME": "not-a-secret",
        }
    )
    message = "Basic dXNlcjpwYXNz abc123 p@ss https://x:y@h/v1/logs?token=t/ok t%2Fok (url: /a?b=c) what? done"
    scrubbed = otel_export.scrub(message, sorted(secrets, key=len, reverse=True))
    for secret in ("dXNlcjpwYXNz", "abc123", "p@ss", "t/ok", "t%2Fok", "x:y", "b=c"):
        assert secret not in scrubbed
    assert scrubbed.endswith("what? done")


def test_made_up_model_names_and_hosts_make_a_bounded_number_of_metric_series(receiver, monkeypatch):
    """Each new model name or host was a time series of every instrument, kept for the
    life of the export: past MAX_DIMENSION_VALUES they are _OTHER (spans keep the name)."""
    monkeypatch.setattr(otel_export, "MAX_DIMENSION_VALUES", 5)
    exporter = OtelExporter("proxy-a")
    for i in range(40):
        exporter.submit(row(id=f"{i:032x}", request_model=f"made-up-{i}", response_model=None, server_address=f"h{i}"))
    exporter.close()
    series = receiver.metrics()["llm_audit.exchanges"]
    models = {p["attributes"]["gen_ai.request.model"] for p in series}
    assert len(models) == 6 and "_OTHER" in models
    assert len({p["attributes"]["server.address"] for p in series}) == 6
    assert sum(int(p["as_int"]) for p in series) == 40
    assert {s["attributes"]["gen_ai.request.model"] for s in receiver.spans()} == {f"made-up-{i}" for i in range(40)}


def test_made_up_combinations_of_dimensions_make_a_bounded_number_of_metric_series(receiver, monkeypatch, caplog):
    """Each dimension was bounded but not their combinations: 50 made-up models times 45
    ports filled the SDK's 2,000 series of an instrument, after which real traffic went
    to its anonymous overflow series unsaid."""
    monkeypatch.setattr(otel_export, "MAX_DIMENSION_SETS", 12)
    exporter = OtelExporter("proxy-a")
    for i in range(30):
        exporter.submit(row(id=f"{i:032x}", request_model=f"m{i % 6}", server_port=1000 + i // 6))
    exporter.close()
    series = receiver.metrics()["llm_audit.exchanges"]
    assert len(series) == 13 and sum(int(p["as_int"]) for p in series) == 30
    other = [p for p in series if p["attributes"]["gen_ai.request.model"] == "_OTHER"]
    assert other and other[0]["attributes"]["server.port"] == "_OTHER" and int(other[0]["as_int"]) == 18
    assert [r.getMessage() for r in caplog.records if "combinations" in r.getMessage()] == [
        "llm-audit: OpenTelemetry metrics: 12 combinations of model, host, port and error type seen; "
        "further ones are counted under _OTHER (the spans keep them)"
    ]
