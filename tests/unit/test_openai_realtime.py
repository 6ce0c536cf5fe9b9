"""OpenAI Realtime over WebSocket: detection, GA and beta server events, turns, the client
side, and what the proxy sends when a filter cuts or blocks."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from addon.dialects import RequestView
from addon.dialects.openai_realtime import _RESPONSE_EVENTS, DIALECT, RealtimeNormalizer
from addon.dialects.registry import detect_websocket
from addon.events import Finding, ShownText, StreamError, TurnEnd
from tests.ws_turns import SAMPLES, client, events, hostile_messages, parsed, text, turns

SAMPLE_DIR = SAMPLES / "openai-realtime"


def view(path: str = "/v1/realtime", query: str = "model=gpt-realtime", **headers: str) -> RequestView:
    return RequestView("GET", path, query, {k.replace("_", "-"): v for k, v in headers.items()})


def session(model: str = "gpt-realtime", beta: bool = False, tools: list | None = None) -> dict:
    body: dict = {"id": "sess_1", "object": "realtime.session", "model": model, "tools": tools or []}
    body |= {"modalities": ["text"]} if beta else {"type": "realtime", "output_modalities": ["audio"]}
    return {"type": "session.created", "event_id": "event_0", "session": body}


def response(
    n: int,
    beta: bool = False,
    *,
    text_parts: tuple[str, ...] = ("Hel", "lo"),
    status: str = "completed",
    details: dict | None = None,
    usage: dict | None = None,
) -> list[dict]:
    """One text response: created, item, part, deltas, done events, response.done."""
    rid, iid = f"resp_{n}", f"item_{n}"
    delta = "response.text.delta" if beta else "response.output_text.delta"
    done = "response.text.done" if beta else "response.output_text.done"
    part_type = "text" if beta else "output_text"
    whole = "".join(text_parts)
    where = {"response_id": rid, "item_id": iid, "output_index": 0, "content_index": 0}
    item = {"id": iid, "type": "message", "role": "assistant", "status": "in_progress", "content": []}
    final_item = item | {"status": "completed", "content": [{"type": part_type, "text": whole}]}
    return [
        {"type": "response.created", "response": {"id": rid, "object": "realtime.response", "status": "in_progress",
                                                  "output": []}},
        {"type": "response.output_item.added", "response_id": rid, "output_index": 0, "item": item},
        {"type": "response.content_part.added", **where, "part": {"type": "text", "text": ""}},
        *({"type": delta, **where, "delta": t} for t in text_parts),
        {"type": done, **where, "text": whole},
        {"type": "response.output_item.done", "response_id": rid, "output_index": 0, "item": final_item},
        {"type": "response.done", "response": {"id": rid, "object": "realtime.response", "status": status,
                                               "status_details": details, "output": [final_item], "usage": usage}},
    ]  # fmt: skip


# -- detection -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_view",
    [
        view(),
        view("/v1/realtime/"),
        view("/openai/realtime", "api-version=2024-10-01-preview&deployment=gpt-4o-realtime-preview"),
        view("/openai/v1/realtime", "model=gpt-realtime"),
        view("/proxy/rt", "", openai_beta="realtime=v1"),
        view("/ws", "", sec_websocket_protocol="realtime, openai-insecure-api-key.x, openai-beta.realtime-v1"),
    ],
)
def test_realtime_upgrades_are_claimed(request_view: RequestView) -> None:
    assert DIALECT.websocket(request_view, None) == "ws_json"
    assert detect_websocket(request_view, None) == (DIALECT, "ws_json")


@pytest.mark.parametrize("path", ["/v1/realtime/calls", "/v1/realtime/client_secrets", "/v1/responses", "/realtime"])
def test_http_endpoints_beside_it_are_not(path: str) -> None:
    assert DIALECT.websocket(view(path), None) is None
    assert not DIALECT.matches(RequestView("POST", path, "", {}))


def test_model_and_beta_come_from_the_upgrade() -> None:
    assert DIALECT.summarize(None, view()).model == "gpt-realtime"
    azure = DIALECT.summarize(None, view("/openai/realtime", "api-version=x&deployment=my-rt"))
    assert azure.model == "my-rt"
    beta = DIALECT.summarize(None, view(openai_beta="realtime=v1"))
    assert beta.beta and DIALECT.normalizer(beta).beta  # type: ignore[attr-defined]
    assert DIALECT.provider_for("api.openai.com") == "openai"
    assert DIALECT.provider_for("myres.openai.azure.com") == "azure.ai.openai"


# -- server events ---------------------------------------------------------------------------


@pytest.mark.parametrize("beta", [False, True])
def test_two_responses_are_two_turns(beta: bool) -> None:
    usage = {"total_tokens": 30, "input_tokens": 20, "output_tokens": 10,
             "input_token_details": {"text_tokens": 12, "audio_tokens": 8, "cached_tokens": 4},
             "output_token_details": {"text_tokens": 3, "audio_tokens": 7}}  # fmt: skip
    norm = RealtimeNormalizer()
    messages = [session(beta=beta), *response(1, beta, usage=usage), *response(2, beta, text_parts=("Bye",))]
    records = turns(norm, messages)
    assert [text(r) for r in records] == ["Hello", "Bye"]
    assert [r.response_id for r in records] == ["resp_1", "resp_2"]
    assert all(r.response_model == "gpt-realtime" and r.terminal_seen for r in records)
    assert [r.choices[0].finish_reason for r in records] == ["stop", "stop"]
    assert records[0].usage == {
        "input_tokens": 20, "output_tokens": 10, "cache_read_input_tokens": 4, "input_text_tokens": 12,
        "input_audio_tokens": 8, "output_text_tokens": 3, "output_audio_tokens": 7,
    }  # fmt: skip
    assert norm.beta is beta
    assert not records[0].findings and not norm.responses  # done responses are forgotten


def test_turn_end_comes_after_the_turns_metadata() -> None:
    out = events(RealtimeNormalizer(), response(1, usage={"input_tokens": 1, "output_tokens": 2}))
    assert isinstance(out[-1], TurnEnd)
    assert sum(isinstance(e, TurnEnd) for e in out) == 1


def test_audio_transcript_is_the_answer_text_and_audio_is_not_kept() -> None:
    where = {"response_id": "resp_1", "item_id": "item_1", "output_index": 0, "content_index": 0}
    messages = [
        {"type": "response.created", "response": {"id": "resp_1", "status": "in_progress", "output": []}},
        {"type": "response.output_audio.delta", **where, "delta": "AAAA" * 100},
        {"type": "response.output_audio_transcript.delta", **where, "delta": "Hi ", "obfuscation": "xyz"},
        {"type": "response.audio_transcript.delta", **where, "delta": "there"},
        {"type": "response.output_audio_transcript.done", **where, "transcript": "Hi there"},
        {"type": "response.done", "response": {"id": "resp_1", "status": "completed", "output": []}},
    ]
    (record,) = turns(RealtimeNormalizer(), messages)
    assert text(record) == "Hi there"
    assert "AAAA" not in repr(record)


def test_a_final_text_that_differs_is_shown_text() -> None:
    msgs = response(1)
    msgs[5]["text"] = "Goodbye"  # the .done event disagrees with the deltas
    out = events(RealtimeNormalizer(), msgs)
    assert ShownText("Goodbye", 0, "final_text") in out
    assert any(isinstance(e, Finding) and e.code == "final_text_mismatch" for e in out)


def test_function_call_from_item_and_done() -> None:
    where = {"response_id": "resp_1", "item_id": "fc_1", "output_index": 0, "call_id": "call_1"}
    messages = [
        session(tools=[{"type": "function", "name": "get_weather", "parameters": {}}]),
        {"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}},
        {"type": "response.output_item.added", "response_id": "resp_1", "output_index": 0,
         "item": {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": ""}},
        {"type": "response.function_call_arguments.delta", **where, "delta": '{"city":'},
        {"type": "response.function_call_arguments.delta", **where, "delta": '"Paris"}'},
        {"type": "response.function_call_arguments.done", **where, "name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"type": "response.done", "response": {"id": "resp_1", "status": "completed", "output": []}},
    ]  # fmt: skip
    (record,) = turns(RealtimeNormalizer(), messages)
    (call,) = record.tool_calls.values()
    assert call.as_dict() == {"id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'}
    assert call.complete and not record.findings


def test_undeclared_tool_is_a_finding() -> None:
    messages = [
        session(tools=[]),
        {"type": "response.created", "response": {"id": "resp_1"}},
        {"type": "response.function_call_arguments.done", "response_id": "resp_1", "item_id": "fc_1",
         "call_id": "c", "name": "rm_rf", "arguments": "{}"},
    ]  # fmt: skip
    assert Finding("undeclared_tool", "rm_rf") in events(RealtimeNormalizer(), messages)


@pytest.mark.parametrize(
    ("status", "details", "reason"),
    [
        ("completed", None, "stop"),
        ("incomplete", {"type": "incomplete", "reason": "max_output_tokens"}, "length"),
        ("incomplete", {"type": "incomplete", "reason": "content_filter"}, "content_filter"),
        ("incomplete", {"type": "incomplete", "reason": "something_new"}, "something_new"),
        ("cancelled", {"type": "cancelled", "reason": "turn_detected"}, "cancelled"),
        ("failed", {"type": "failed", "error": {"type": "server_error", "code": "boom"}}, "error"),
    ],
)
def test_stop_reasons(status: str, details: dict | None, reason: str) -> None:
    (record,) = turns(RealtimeNormalizer(), response(1, status=status, details=details))
    assert record.choices[0].finish_reason == reason
    assert record.error_code == ("boom" if status == "failed" else None)


def test_errors_about_client_events_or_between_responses_are_findings() -> None:
    norm = RealtimeNormalizer()
    between = {"type": "error", "error": {"type": "invalid_request_error", "code": "bad", "message": "no"}}
    out = events(norm, [between])
    assert out == [Finding("realtime_error", "invalid_request_error / bad / no"), ShownText("no", 0, "error")]
    about_client = {"type": "error", "error": {"type": "invalid_request_error", "message": "x", "event_id": "evt_9"}}
    midway = {"type": "error", "error": {"type": "server_error", "code": "overloaded", "message": "try later"}}
    out = events(norm, [response(1)[0], about_client, midway])
    assert Finding("realtime_error", "invalid_request_error / x / evt_9") in out
    assert StreamError("overloaded", "try later") in out


# -- the shared samples ------------------------------------------------------------------------


@pytest.mark.skipif(not SAMPLE_DIR.exists(), reason="../shared protocol samples not present")
def test_shared_ga_frames() -> None:
    lines = (SAMPLE_DIR / "unresolved-repo_ga-gpt-realtime-ws-frames.jsonl").read_text().splitlines()
    records = turns(RealtimeNormalizer("gpt-realtime"), lines)
    done = next(r for r in records if r.terminal_seen)
    assert done.response_id == "resp_CsZyL5IuqSgPEut0cI82K" and done.response_model == "gpt-realtime"
    # (the file's lines come from three responses of one log, never done but this one: each
    # is in progress on a choice of its own, and the one done is the one with a stop reason)
    (answer,) = [c for c in done.choices.values() if c.finish_reason is not None]
    assert answer.text.whole() == ("Claro, dime qué es lo que tienes en mente. ¿Te gustaría conversar sobre algo en "
                                   "particular? Estoy aquí para ayudarte.")  # fmt: skip
    assert text(done) == "The"  # the first response's delta, on choice 0
    assert done.usage["input_tokens"] == 132 and done.usage["output_tokens"] == 188
    assert done.usage["cache_read_input_tokens"] == 64
    assert (done.usage["output_text_tokens"], done.usage["output_audio_tokens"]) == (41, 147)
    assert answer.finish_reason == "stop"


@pytest.mark.skipif(not SAMPLE_DIR.exists(), reason="../shared protocol samples not present")
def test_shared_beta_response_done() -> None:
    line = (SAMPLE_DIR / "unresolved-repo_beta-gpt-4o-realtime-preview-response-done.json").read_text()
    (record,) = turns(RealtimeNormalizer(), [line])
    assert text(record).startswith("Hello, I am Serge.")
    assert record.usage["input_tokens"] == 984 and record.usage["cache_read_input_tokens"] == 960
    assert record.usage["output_audio_tokens"] == 244


# -- the client side -----------------------------------------------------------------------------


def test_client_events_read_as_the_shared_request_shape() -> None:
    norm = RealtimeNormalizer()
    update = {"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief.",
                                                    "model": "gpt-realtime", "tools": [{"name": "t"}]}}  # fmt: skip
    assert norm.on_client(client(update)) == (
        {"messages": [{"role": "system", "content": "Be brief."}], "model": "gpt-realtime", "tools": [{"name": "t"}]},
        [],
    )
    item = {"type": "conversation.item.create", "event_id": "e1", "item": {"type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "Hello"}, {"type": "input_audio", "audio": "QUJD"}]}}  # fmt: skip
    assert norm.on_client(client(item)) == ({"messages": [{"role": "user", "content": "Hello"}]}, [])
    output = {"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": "c1",
                                                           "output": '{"t": 21}'}}  # fmt: skip
    assert norm.on_client(client(output))[0] == {
        "messages": [{"role": "tool", "content": '{"t": 21}', "tool_call_id": "c1"}]
    }
    create = {"type": "response.create", "response": {"instructions": "Answer in French.",
              "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}]}}  # fmt: skip
    assert norm.on_client(client(create))[0]["messages"] == [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Hi"},
    ]
    assert norm.on_client(client({"type": "input_audio_buffer.append", "audio": "QUJD" * 50})) == ({}, [])


@pytest.mark.parametrize(
    "data", ["not json", "[1, 2]", '"s"', "", "{", '{"type": 5}', '{"type": "session.update", "session": []}']
)
def test_client_hostile_input_never_raises(data: str) -> None:
    doc, findings = RealtimeNormalizer().on_client(client(data))
    assert isinstance(doc, dict)
    if not data.startswith("{") or data == "{":
        assert findings and findings[0].code == "request_invalid_json"


def test_client_lenient_json_is_read_with_a_finding() -> None:
    doc, findings = RealtimeNormalizer().on_client(
        client('{"type":"conversation.item.create","x":NaN,"item":{"content":[{"type":"input_text","text":"hi"}]}}')
    )
    assert doc == {"messages": [{"role": "user", "content": "hi"}]}
    assert [f.code for f in findings] == ["request_lenient_json"]


# -- what the proxy sends ------------------------------------------------------------------------


@pytest.mark.parametrize("beta", [False, True])
def test_ending_is_error_then_incomplete_response_done(beta: bool) -> None:
    norm = RealtimeNormalizer(beta=beta)
    norm.keeps_delivered = True
    assert norm.ending("r1", "why") == []  # nothing in progress
    events(norm, [session(beta=beta), *response(1, beta)[:4]])  # cut after the first delta
    frames = parsed(norm.ending("r1", "why"))
    error, text_done, part_done, item_done, done = frames
    assert [f["type"] for f in frames[1:4]] == [
        "response.text.done" if beta else "response.output_text.done",  # the session's names
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert text_done["text"] == "Hel" and text_done["item_id"] == "item_1" and text_done["response_id"] == "resp_1"
    assert part_done["part"] == {"type": "text", "text": "Hel"} and item_done["item"]["status"] == "incomplete"
    assert len({f["event_id"] for f in frames}) == 5
    assert error["type"] == "error" and error["event_id"].startswith("event_llmaudit_")
    assert error["error"]["type"] == "invalid_request_error" and "r1" in error["error"]["message"]
    assert done["type"] == "response.done" and done["event_id"] != error["event_id"]
    resp = done["response"]
    assert resp["id"] == "resp_1" and resp["status"] == "incomplete"
    assert resp["status_details"] == {"type": "incomplete", "reason": "content_filter"}
    (item,) = resp["output"]
    assert item["status"] == "incomplete"
    assert item["content"] == [{"type": "text" if beta else "output_text", "text": "Hel"}]
    # reading the ending back gives the filtered outcome, agrees with the deltas, ends the turn
    (record,) = turns(norm, [json.dumps(f) for f in frames])
    assert record.choices[0].finish_reason == "content_filter" and not record.findings
    assert not norm.responses


@pytest.mark.parametrize("beta", [False, True])
def test_ending_closes_an_open_transcript_in_the_sessions_names(beta: bool) -> None:
    norm = RealtimeNormalizer(beta=beta)
    norm.keeps_delivered = True
    where = {"response_id": "resp_1", "item_id": "item_1", "output_index": 0, "content_index": 0}
    events(norm, [
        {"type": "response.created", "response": {"id": "resp_1", "modalities": ["audio"]}},
        {"type": "response.output_item.added", "response_id": "resp_1", "output_index": 0,
         "item": {"id": "item_1", "type": "message", "role": "assistant", "content": []}},
        {"type": "response.content_part.added", **where, "part": {"type": "audio", "transcript": ""}},
        {"type": "response.audio_transcript.delta" if beta else "response.output_audio_transcript.delta", **where,
         "delta": "Spoken"},
    ])  # fmt: skip
    _, transcript, part, item, done = parsed(norm.ending("r", "x"))
    assert transcript["type"] == ("response.audio_transcript.done" if beta else "response.output_audio_transcript.done")
    assert transcript["transcript"] == "Spoken"
    assert part["part"] == {"type": "audio", "transcript": "Spoken"}
    final_part = {"type": "audio" if beta else "output_audio", "transcript": "Spoken"}
    assert done["response"]["output"][0]["content"] == [final_part] == item["item"]["content"]
    assert done["response"]["modalities"] == ["audio"]


def test_ending_leaves_out_a_call_whose_arguments_were_cut() -> None:
    norm = RealtimeNormalizer()
    norm.keeps_delivered = True
    events(norm, [
        {"type": "response.created", "response": {"id": "resp_1"}},
        {"type": "response.output_item.added", "response_id": "resp_1", "output_index": 0,
         "item": {"id": "fc_1", "type": "function_call", "call_id": "c", "name": "f", "arguments": ""}},
        {"type": "response.function_call_arguments.delta", "response_id": "resp_1", "item_id": "fc_1", "delta": "{"},
    ])  # fmt: skip
    _, done = parsed(norm.ending("r", "x"))
    assert done["response"]["output"] == []


def test_refusal_names_the_blocked_client_event() -> None:
    norm = RealtimeNormalizer()
    (error,) = parsed(norm.refusal(client({"type": "conversation.item.create", "event_id": "evt_7"}), "r", "x"))
    assert error["type"] == "error" and error["error"]["event_id"] == "evt_7"
    (error,) = parsed(norm.refusal(client("not json"), "r", "x"))
    assert error["error"]["event_id"] is None
    assert norm.close_after_block("x") is None


def test_upstream_cancel_unless_the_client_cancelled() -> None:
    norm = RealtimeNormalizer()
    assert norm.upstream_cancel() == []
    events(norm, [{"type": "response.created", "response": {"id": "resp_1"}}])
    (cancel,) = parsed(norm.upstream_cancel())
    assert cancel["type"] == "response.cancel" and cancel["response_id"] == "resp_1"
    norm.on_client(client({"type": "response.cancel", "response_id": "resp_1"}))
    assert norm.upstream_cancel() == []


# -- hostile server input ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        "not json", "[]", '{"no": "type"}', '{"type": 7}', '{"type": "response.done"}',
        '{"type": "response.done", "response": []}', '{"type": "response.done", "response": {"status": 5}}',
        '{"type": "response.done", "response": {"status": "completed", "usage": {"input_tokens": "9"}}}',
        '{"type": "response.done", "response": {"status": "completed", "usage": {"input_tokens": 1e400}}}',
        '{"type": "response.done", "response": {"usage": {"input_tokens": 123456789012345678901234567890}}}',
        '{"type": "response.output_text.delta", "delta": 5}', '{"type": "response.output_text.delta"}',
        '{"type": "response.output_item.added", "item": "x"}', '{"type": "response.content_part.done", "part": 1}',
        '{"type": "response.output_item.done", "item": {"type": "message", "content": [1, {"type": "audio"}]}}',
        '{"type": "session.created", "session": "x"}', '{"type": "error", "error": "text"}', '{"type": "error"}',
        '{"type": "response.function_call_arguments.done", "arguments": {"a": 1}}',
    ],
)  # fmt: skip
def test_hostile_server_events_never_raise(data: str) -> None:
    norm = RealtimeNormalizer()
    out = events(norm, [data, *response(1)])
    assert isinstance(out[-1], TurnEnd)
    if not data.startswith("{"):
        assert any(isinstance(e, Finding) and e.code == "invalid_json" for e in out)


def test_responses_never_done_are_bounded() -> None:
    norm = RealtimeNormalizer()
    events(norm, [{"type": "response.created", "response": {"id": f"resp_{i}"}} for i in range(100)])
    assert len(norm.responses) <= 8
    assert norm.on_end() == [Finding("missing_stream_end", "the connection closed during a response")]


REALTIME_EVENTS = sorted(
    {"response.created", "response.done", "session.created", "session.updated", "error", "session.update",
     "conversation.item.create", "response.create", "response.cancel", "response.output_audio.delta",
     *_RESPONSE_EVENTS}
)  # fmt: skip
REALTIME_KEYS = (
    "type", "response", "item", "part", "delta", "text", "transcript", "arguments", "response_id", "item_id",
    "output_index", "content_index", "session", "error", "usage", "status", "status_details", "output", "content",
    "id", "call_id", "name", "model", "tools", "instructions", "input_tokens", "input_token_details", "event_id",
    "role", "input", "reason",
)  # fmt: skip


@given(st.lists(hostile_messages("type", REALTIME_EVENTS, REALTIME_KEYS), max_size=8))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_event_shapes_never_raise(messages: list[dict]) -> None:
    norm = RealtimeNormalizer()
    norm.keeps_delivered = True
    events(norm, messages)
    for message in messages:
        norm.on_client(client(json.dumps(message)))
    parsed(norm.ending("r", "x"))
    parsed(norm.upstream_cancel())
    for message in messages:  # (what the upstream still sends of the responses cut)
        assert isinstance(norm.for_proxy(client(json.dumps(message))), bool)
    events(norm, messages)
    norm.on_end()
