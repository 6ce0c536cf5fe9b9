"""The OpenAI Responses dialect, sans-IO: detection, extraction and the Responses traps.

Streams go through the same pipeline the proxy uses (StreamAuditor: decoder, SSE
parser, normalizer, record); the record must not depend on how the bytes were split.
Own fixtures are built inline in the shape of the recorded streams; the shared
recordings are checked against expected.json when ../shared is present.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import orjson
import pytest
from pipeline import audit_bytes, comparable_row

from addon.auditor import StreamAuditor, summary_into_record
from addon.dialects import RequestView
from addon.dialects.openai_responses import DIALECT, OpenAIResponsesNormalizer
from addon.dialects.registry import detect_request, detect_response
from addon.framing.sse import SSEEvent
from addon.record import OUTCOME_COMPLETE, OUTCOME_UPSTREAM_ABORTED, ExchangeRecord

SHARED_STREAMS = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "streams"

REQUEST = {
    "model": "gpt-4o",
    "input": [{"role": "user", "content": [{"type": "input_text", "text": "Weather in Vienna?"}]}],
    "stream": True,
    "user": "user-12345",
    "tools": [
        {"type": "function", "name": "get_weather", "parameters": {"type": "object"}},
        {"type": "function", "name": "get_time", "parameters": {"type": "object"}},
        {"type": "web_search"},
    ],
}
MODEL = "gpt-4o-2024-08-06"


# -- fixtures -------------------------------------------------------------------------------


def response(status: str = "in_progress", output: list | None = None, usage: dict | None = None, **extra) -> dict:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1782321662,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "model": MODEL,
        "output": output or [],
        "usage": usage,
    } | extra


def usage(inp: int, out: int, cached: int | None = 0, reasoning: int | None = 0) -> dict:
    u = {"input_tokens": inp, "output_tokens": out, "total_tokens": inp + out}
    if cached is not None:
        u["input_tokens_details"] = {"cached_tokens": cached}
    if reasoning is not None:
        u["output_tokens_details"] = {"reasoning_tokens": reasoning}
    return u


def stream(*events: tuple[str, dict], start: int = 0) -> bytes:
    """Events framed as OpenAI sends them: ``event:`` = ``type``, sequence from ``start``."""
    out = []
    for seq, (type_, fields) in enumerate(events, start):
        body = {"type": type_} | fields | {"sequence_number": seq}
        out.append(f"event: {type_}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n")
    return "".join(out).encode()


def e(type_: str, **fields) -> tuple[str, dict]:
    return type_, fields


def message(item_id: str = "msg_1", text: str | None = None, status: str = "completed", refusal: str | None = None):
    content = []
    if text is not None:
        content.append({"type": "output_text", "annotations": [], "logprobs": [], "text": text})
    if refusal is not None:
        content.append({"type": "refusal", "refusal": refusal})
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}


def call(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict:
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "arguments": arguments,
        "call_id": call_id,
        "name": name,
    }


def text_events(text_parts: list[str], item_id: str = "msg_1", index: int = 0) -> list[tuple[str, dict]]:
    full = "".join(text_parts)
    part = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
    return [
        e("response.output_item.added", output_index=index, item=message(item_id, status="in_progress")),
        e("response.content_part.added", item_id=item_id, output_index=index, content_index=0, part=part),
        *[
            e("response.output_text.delta", item_id=item_id, output_index=index, content_index=0, delta=d, logprobs=[])
            for d in text_parts
        ],
        e("response.output_text.done", item_id=item_id, output_index=index, content_index=0, text=full, logprobs=[]),
        e(
            "response.content_part.done",
            item_id=item_id,
            output_index=index,
            content_index=0,
            part=part | {"text": full},
        ),
        e("response.output_item.done", output_index=index, item=message(item_id, full)),
    ]


def call_events(item_id: str, call_id: str, name: str, fragments: list[str], index: int = 0) -> list[tuple[str, dict]]:
    full = "".join(fragments)
    return [
        e("response.output_item.added", output_index=index, item=call(item_id, call_id, name, "", "in_progress")),
        *[
            e("response.function_call_arguments.delta", item_id=item_id, output_index=index, delta=d, obfuscation="x")
            for d in fragments
        ],
        e("response.function_call_arguments.done", item_id=item_id, output_index=index, arguments=full),
        e("response.output_item.done", output_index=index, item=call(item_id, call_id, name, full)),
    ]


TEXT_PARTS = ["Das Wetter", " in Wien: 24°C, ", "sonnig ☀️."]
TEXT = "".join(TEXT_PARTS)
CREATED = [e("response.created", response=response()), e("response.in_progress", response=response())]
TEXT_STREAM = stream(
    *CREATED,
    *text_events(TEXT_PARTS),
    e("response.completed", response=response("completed", [message("msg_1", TEXT)], usage(42, 9, cached=5))),
)

ARGS = ['{"ci', 'ty": "Vie', 'nna"}']
CALL_STREAM = stream(
    *CREATED,
    *call_events("fc_1", "call_1", "get_weather", ARGS),
    e(
        "response.completed",
        response=response("completed", [call("fc_1", "call_1", "get_weather", "".join(ARGS))], usage(58, 17)),
    ),
)

SUMMARY = ["**Checking the weather**\n\n", "I should call get_weather."]
REASONING_ITEM = {"id": "rs_1", "type": "reasoning", "encrypted_content": "gAAAA", "summary": []}
REASONING_DONE = REASONING_ITEM | {
    "summary": [{"type": "summary_text", "text": "".join(SUMMARY)}],
    "content": [{"type": "reasoning_text", "text": "raw thought"}],
}
REASONING_STREAM = stream(
    *CREATED,
    e("response.output_item.added", output_index=0, item=REASONING_ITEM),
    e(
        "response.reasoning_summary_part.added",
        item_id="rs_1",
        output_index=0,
        summary_index=0,
        part={"type": "summary_text", "text": ""},
    ),
    *[
        e("response.reasoning_summary_text.delta", item_id="rs_1", output_index=0, summary_index=0, delta=d)
        for d in SUMMARY
    ],
    e("response.reasoning_summary_text.done", item_id="rs_1", output_index=0, summary_index=0, text="".join(SUMMARY)),
    e(
        "response.reasoning_summary_part.done",
        item_id="rs_1",
        output_index=0,
        summary_index=0,
        part={"type": "summary_text", "text": "".join(SUMMARY)},
    ),
    e("response.reasoning_text.delta", item_id="rs_1", output_index=0, content_index=0, delta="raw "),
    e("response.reasoning_text.delta", item_id="rs_1", output_index=0, content_index=0, delta="thought"),
    e("response.reasoning_text.done", item_id="rs_1", output_index=0, content_index=0, text="raw thought"),
    e("response.output_item.done", output_index=0, item=REASONING_DONE),
    *call_events("fc_1", "call_1", "get_weather", ARGS, index=1),
    *text_events(["Let me check."], item_id="msg_2", index=2),
    e(
        "response.completed",
        response=response(
            "completed",
            [REASONING_DONE, call("fc_1", "call_1", "get_weather", "".join(ARGS)), message("msg_2", "Let me check.")],
            usage(63, 121, cached=32, reasoning=64),
        ),
    ),
)


# -- the pipeline ----------------------------------------------------------------------------


def view(
    method: str = "POST", path: str = "/v1/responses", query: str = "", headers: dict | None = None
) -> RequestView:
    return RequestView(method, path, query, {k.lower(): v for k, v in (headers or {}).items()})


def _record(request: dict | None, request_view: RequestView) -> tuple[ExchangeRecord, object]:
    record = ExchangeRecord(dialect=DIALECT.name, provider=DIALECT.provider_for("api.openai.com"))
    summary = DIALECT.summarize(request, request_view)
    summary_into_record(record, summary)
    return record, DIALECT.normalizer(summary)


def audit(
    body: bytes,
    chunks: list[int] | None = None,
    *,
    request: dict | None = REQUEST,
    encoding=None,
    outcome: str = OUTCOME_COMPLETE,
    request_view: RequestView | None = None,
) -> dict:
    """Run an event stream split at ``chunks`` offsets through the auditor; return the row."""
    return audit_bytes(
        DIALECT,
        body,
        chunks,
        request=request,
        request_view=request_view or view(),
        encoding=encoding,
        outcome=outcome,
        provider=DIALECT.provider_for("api.openai.com"),
    )


def audit_body(body: bytes | dict, status: int = 200, *, request: dict | None = REQUEST) -> dict:
    """A non-stream body (JSON answer or HTTP error) read whole at the end."""
    if isinstance(body, dict):
        body = orjson.dumps(body)
    record, normalizer = _record(request, view())
    record.http_status = status
    auditor = StreamAuditor(record, normalizer, None, 8 * 1024 * 1024, event_stream=False)
    auditor.feed(body)
    auditor.end()
    record.finish(OUTCOME_COMPLETE)
    return comparable_row(record)


def codes(row: dict) -> list[str]:
    return [f["code"] for f in row["findings"]]


# -- detection -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    ["/v1/responses", "/openai/responses", "/openai/v1/responses", "/api/v1/responses", "/responses"],
)
def test_post_to_a_responses_path_with_input_or_model_is_detected(path):
    assert detect_request(view("POST", path, "api-version=2025-04-01-preview"), lambda: REQUEST) is DIALECT
    assert detect_request(view("POST", path), lambda: {"input": "hi"}) is DIALECT
    assert detect_request(view("POST", path), lambda: {"model": "gpt-5", "previous_response_id": "resp_0"}) is DIALECT


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/responses", {"answers": [1, 2]}),  # a survey API's responses, not a model's
        ("/v1/responses", ["input"]),
        ("/v1/responses", None),  # not JSON (a form post)
        ("/v1/chat/completions", REQUEST),
        ("/v1/responses/compact", REQUEST),
        ("/v1/responses/input_tokens", REQUEST),
    ],
)
def test_other_posts_are_not_openai_responses(path, body):
    assert detect_request(view("POST", path), lambda: body) is not DIALECT


def test_lmsp_paths_are_excluded_whatever_the_registration_order():
    assert not DIALECT.matches(view("POST", "/lmsp/v1/responses"))
    assert not DIALECT.matches(view("POST", "/gw/lmsp/v1/responses"))
    assert not DIALECT.matches(view("GET", "/lmsp/v1/responses/resp_1"))


@pytest.mark.parametrize(
    "path", ["/v1/responses/resp_68d9303e", "/openai/v1/responses/resp_1", "/openai/responses/resp_x"]
)
def test_get_of_a_stored_response_is_detected(path):
    assert detect_request(view("GET", path), lambda: None) is DIALECT
    assert detect_request(view("GET", path, "stream=true&starting_after=3"), lambda: None) is DIALECT


@pytest.mark.parametrize(
    "method, path",
    [
        ("GET", "/v1/responses/resp_1/input_items"),
        ("GET", "/api/forms/12/responses/34"),  # not a response id
        ("GET", "/v1/responses"),
        ("DELETE", "/v1/responses/resp_1"),
        ("PUT", "/v1/responses"),
    ],
)
def test_other_requests_are_not_openai_responses(method, path):
    assert detect_request(view(method, path), lambda: None) is not DIALECT


def test_a_get_match_does_not_leak_into_the_next_posts_body_check():
    assert detect_request(view("GET", "/v1/responses/resp_1"), lambda: None) is DIALECT
    assert detect_request(view("POST", "/v1/responses"), lambda: None) is not DIALECT


def test_unclaimed_stream_is_claimed_by_a_response_created_first_event():
    created = TEXT_STREAM.split(b"\n\n")[0].split(b"data: ", 1)[1].decode()
    assert detect_response(SSEEvent("response.created", created, "", None)) is DIALECT
    assert detect_response(SSEEvent("message", created, "", None)) is DIALECT
    lmsp_created = '{"response_id":"resp_1","status":"in_progress"}'
    assert not DIALECT.sniff(SSEEvent("response.created", lmsp_created, "1", None))
    assert not DIALECT.sniff(SSEEvent("message", '{"choices":[]}', "", None))


def test_provider_is_the_known_host_else_openai():
    assert DIALECT.provider_for("api.openai.com") == "openai"
    assert DIALECT.provider_for("my-resource.openai.azure.com") == "azure.ai.openai"
    assert DIALECT.provider_for("openrouter.ai") == "openrouter"
    assert DIALECT.provider_for("localhost") == "openai"


# -- the request -----------------------------------------------------------------------------


def test_request_gives_model_stream_user_and_declared_function_tools():
    summary = DIALECT.summarize(REQUEST, view())
    assert (summary.model, summary.stream, summary.user_id) == ("gpt-4o", True, "user-12345")
    assert summary.declared_tools == frozenset({"get_weather", "get_time"})  # web_search has no name
    assert summary.session_id is None and summary.request_id is None


def test_safety_identifier_is_the_user_when_user_is_absent_and_conversation_the_session():
    body = {"model": "gpt-5", "input": "hi", "safety_identifier": "hashed-user", "conversation": {"id": "conv_1"}}
    summary = DIALECT.summarize(body, view())
    assert (summary.user_id, summary.session_id, summary.stream) == ("hashed-user", "conv_1", None)
    assert summary.declared_tools == frozenset()
    assert DIALECT.summarize({"input": "hi", "conversation": "conv_2"}, view()).session_id == "conv_2"


def test_retrieve_request_streams_only_when_asked_in_the_query():
    assert DIALECT.summarize(None, view("GET", "/v1/responses/resp_1", "stream=true")).stream is True
    assert DIALECT.summarize(None, view("GET", "/v1/responses/resp_1", "")).stream is None
    assert DIALECT.summarize(None, view("GET", "/v1/responses/resp_1", "stream=false")).stream is False


# -- extraction ------------------------------------------------------------------------------


def test_text_stream_gives_text_model_id_usage_and_status_reason_once():
    row = audit(TEXT_STREAM)
    assert row["status"] == "completed"
    assert row["output_text"] == TEXT  # the done events repeat it: not appended again
    assert (row["response_model"], row["response_id"], row["request_model"]) == (MODEL, "resp_1", "gpt-4o")
    assert (row["input_tokens"], row["output_tokens"]) == (42, 9)
    assert (row["cache_read_input_tokens"], row["reasoning_output_tokens"], row["cache_write_input_tokens"]) == (
        5,
        0,
        None,
    )
    assert row["finish_reasons"] == ["completed"]
    assert row["user_id"] == "user-12345"
    assert row["event_count"] == 11 and row["findings"] == [] and row["tool_calls"] == []


def test_tool_call_is_stored_with_its_call_id_name_and_exact_arguments():
    row = audit(CALL_STREAM)
    assert row["tool_calls"] == [{"id": "call_1", "name": "get_weather", "arguments": '{"city": "Vienna"}'}]
    assert row["output"]["tool_calls"][0]["complete"] is True
    assert row["output_text"] == "" and row["findings"] == []


def test_parallel_tool_calls_with_interleaved_argument_deltas_are_kept_apart():
    def delta(item_id, index, d):
        return e("response.function_call_arguments.delta", item_id=item_id, output_index=index, delta=d)

    body = stream(
        *CREATED,
        e("response.output_item.added", output_index=0, item=call("fc_a", "call_a", "get_weather", "", "in_progress")),
        e("response.output_item.added", output_index=1, item=call("fc_b", "call_b", "get_time", "", "in_progress")),
        delta("fc_a", 0, '{"city":'),
        delta("fc_b", 1, '{"tz":'),
        delta("fc_a", 0, '"Wien"}'),
        delta("fc_b", 1, '"CET"}'),
        e("response.function_call_arguments.done", item_id="fc_b", output_index=1, arguments='{"tz":"CET"}'),
        e("response.function_call_arguments.done", item_id="fc_a", output_index=0, arguments='{"city":"Wien"}'),
        e("response.output_item.done", output_index=0, item=call("fc_a", "call_a", "get_weather", '{"city":"Wien"}')),
        e("response.output_item.done", output_index=1, item=call("fc_b", "call_b", "get_time", '{"tz":"CET"}')),
        e("response.completed", response=response("completed", usage=usage(1, 2))),
    )
    row = audit(body)
    assert row["tool_calls"] == [
        {"id": "call_a", "name": "get_weather", "arguments": '{"city":"Wien"}'},
        {"id": "call_b", "name": "get_time", "arguments": '{"tz":"CET"}'},
    ]
    assert row["findings"] == []


def test_reasoning_summary_and_reasoning_text_are_kept_apart_from_the_answer():
    row = audit(REASONING_STREAM)
    choice = row["output"]["choices"][0]
    assert choice["reasoning"] == "".join(SUMMARY) + "raw thought"
    assert row["output_text"] == "Let me check."
    assert row["tool_calls"] == [{"id": "call_1", "name": "get_weather", "arguments": '{"city": "Vienna"}'}]
    assert (row["reasoning_output_tokens"], row["cache_read_input_tokens"]) == (64, 32)
    assert row["findings"] == []


def test_refusal_is_kept_as_refusal_not_answer_text():
    refusal = "I'm sorry, I can't help with that."
    part = {"type": "refusal", "refusal": ""}
    body = stream(
        *CREATED,
        e("response.output_item.added", output_index=0, item=message(status="in_progress")),
        e("response.content_part.added", item_id="msg_1", output_index=0, content_index=0, part=part),
        e("response.refusal.delta", item_id="msg_1", output_index=0, content_index=0, delta="I'm sorry, "),
        e("response.refusal.delta", item_id="msg_1", output_index=0, content_index=0, delta="I can't help with that."),
        e("response.refusal.done", item_id="msg_1", output_index=0, content_index=0, refusal=refusal),
        e(
            "response.content_part.done",
            item_id="msg_1",
            output_index=0,
            content_index=0,
            part=part | {"refusal": refusal},
        ),
        e("response.output_item.done", output_index=0, item=message(refusal=refusal)),
        e("response.completed", response=response("completed", [message(refusal=refusal)], usage(10, 8))),
    )
    row = audit(body)
    assert row["output_text"] == ""
    assert row["output"]["choices"][0]["refusal"] == refusal


def test_custom_tool_call_input_is_recorded_as_a_tool_call():
    item = {"id": "ctc_1", "type": "custom_tool_call", "call_id": "call_c", "name": "run_sql", "input": ""}
    body = stream(
        *CREATED,
        e("response.output_item.added", output_index=0, item=item),
        e("response.custom_tool_call_input.delta", item_id="ctc_1", output_index=0, delta="SELECT "),
        e("response.custom_tool_call_input.delta", item_id="ctc_1", output_index=0, delta="1"),
        e("response.custom_tool_call_input.done", item_id="ctc_1", output_index=0, input="SELECT 1"),
        e("response.output_item.done", output_index=0, item=item | {"input": "SELECT 1", "status": "completed"}),
        e("response.completed", response=response("completed")),
    )
    row = audit(body, request=REQUEST | {"tools": [{"type": "custom", "name": "run_sql"}]})
    assert row["tool_calls"] == [{"id": "call_c", "name": "run_sql", "arguments": "SELECT 1"}]
    assert row["findings"] == []


def test_a_call_to_a_tool_the_request_did_not_declare_is_reported_once():
    row = audit(CALL_STREAM, request=REQUEST | {"tools": [{"type": "function", "name": "get_time"}]})
    assert [(f["code"], f["detail"]) for f in row["findings"]] == [("undeclared_tool", "get_weather")]
    assert codes(audit(CALL_STREAM, request={"model": "gpt-4o", "input": "hi"})) == ["undeclared_tool"]
    # a retrieved response: what was declared is unknown, nothing is checked
    assert (
        codes(audit(CALL_STREAM, request=None, request_view=view("GET", "/v1/responses/resp_1", "stream=true"))) == []
    )


def test_usage_not_reported_is_null_never_zero():
    body = stream(
        *CREATED,
        *text_events(["hi"]),
        e("response.completed", response=response("completed", [message("msg_1", "hi")])),
    )
    row = audit(body)
    assert row["output_text"] == "hi"
    assert (row["input_tokens"], row["output_tokens"], row["reasoning_output_tokens"]) == (None, None, None)
    assert row["usage_source"] == "none"


def test_usage_without_details_leaves_cache_and_reasoning_null():
    body = stream(
        *CREATED,
        e("response.completed", response=response("completed", usage=usage(3, 4, cached=None, reasoning=None))),
    )
    row = audit(body)
    assert (row["input_tokens"], row["output_tokens"]) == (3, 4)
    assert (row["cache_read_input_tokens"], row["reasoning_output_tokens"]) == (None, None)


def test_cache_write_tokens_are_read_when_reported():
    u = usage(100, 5, cached=40) | {"input_tokens_details": {"cached_tokens": 40, "cache_write_tokens": 60}}
    row = audit(stream(*CREATED, e("response.completed", response=response("completed", usage=u))))
    assert (row["cache_read_input_tokens"], row["cache_write_input_tokens"]) == (40, 60)


# -- the *.done events: verify, fill in, never append twice -------------------------------------


def test_done_events_fill_in_text_when_no_delta_came():
    body = stream(
        *CREATED,
        e("response.output_item.added", output_index=0, item=message(status="in_progress")),
        e("response.output_text.done", item_id="msg_1", output_index=0, content_index=0, text="Hello!"),
        e("response.output_item.done", output_index=0, item=message("msg_1", "Hello!")),
        e("response.completed", response=response("completed", [message("msg_1", "Hello!")])),
    )
    assert audit(body)["output_text"] == "Hello!"


def test_done_events_fill_in_the_tail_the_deltas_missed():
    body = stream(
        *CREATED,
        e("response.output_item.added", output_index=0, item=message(status="in_progress")),
        e("response.output_text.delta", item_id="msg_1", output_index=0, content_index=0, delta="Hel"),
        e("response.output_item.done", output_index=0, item=message("msg_1", "Hello!")),
        e("response.completed", response=response("completed", [message("msg_1", "Hello!")])),
    )
    assert audit(body)["output_text"] == "Hello!"


def test_done_events_that_disagree_with_the_deltas_leave_the_streamed_text():
    body = stream(
        *CREATED,
        e("response.output_text.delta", item_id="msg_1", output_index=0, content_index=0, delta="streamed"),
        e("response.output_text.done", item_id="msg_1", output_index=0, content_index=0, text="other"),
        e("response.completed", response=response("completed", [message("msg_1", "other")])),
    )
    assert audit(body)["output_text"] == "streamed"


def test_final_response_output_fills_in_items_the_stream_never_showed():
    final = response(
        "completed", [message("msg_1", "Whole."), call("fc_1", "call_1", "get_weather", '{"city":"Wien"}')]
    )
    row = audit(stream(*CREATED, e("response.completed", response=final)))
    assert row["output_text"] == "Whole."
    assert row["tool_calls"] == [{"id": "call_1", "name": "get_weather", "arguments": '{"city":"Wien"}'}]
    assert row["findings"] == []


def test_arguments_done_fills_in_missing_argument_deltas_without_doubling():
    body = stream(
        *CREATED,
        e("response.output_item.added", output_index=0, item=call("fc_1", "call_1", "get_weather", "", "in_progress")),
        e("response.function_call_arguments.delta", item_id="fc_1", output_index=0, delta='{"city"'),
        e("response.function_call_arguments.done", item_id="fc_1", output_index=0, arguments='{"city":"Wien"}'),
        e("response.output_item.done", output_index=0, item=call("fc_1", "call_1", "get_weather", '{"city":"Wien"}')),
        e(
            "response.completed",
            response=response("completed", [call("fc_1", "call_1", "get_weather", '{"city":"Wien"}')]),
        ),
    )
    assert audit(body)["tool_calls"] == [{"id": "call_1", "name": "get_weather", "arguments": '{"city":"Wien"}'}]


def test_resumed_retrieve_stream_does_not_repeat_items_an_earlier_exchange_recorded():
    # GET /v1/responses/resp_1?stream=true&starting_after=4: the message's first delta and
    # the whole reasoning item went to the earlier exchange.
    final = response("completed", [REASONING_DONE, message("msg_1", "Hello there")], usage(5, 6))
    body = stream(
        e("response.output_text.delta", item_id="msg_1", output_index=1, content_index=0, delta=" there"),
        e("response.output_text.done", item_id="msg_1", output_index=1, content_index=0, text="Hello there"),
        e("response.output_item.done", output_index=1, item=message("msg_1", "Hello there")),
        e("response.completed", response=final),
        start=5,
    )
    row = audit(body, request=None, request_view=view("GET", "/v1/responses/resp_1", "stream=true&starting_after=4"))
    assert row["output_text"] == " there"
    assert "reasoning" not in row["output"]["choices"][0]
    assert (row["status"], row["input_tokens"], row["findings"]) == ("completed", 5, [])


# -- errors ----------------------------------------------------------------------------------


def test_error_event_with_top_level_code_and_message_fails_the_exchange():
    body = stream(
        *CREATED,
        e("response.output_text.delta", item_id="msg_1", output_index=0, content_index=0, delta="partial"),
        e("error", code="server_error", message="The server had an error.", param=None),
    )
    row = audit(body)
    assert (row["status"], row["error_code"], row["error_message"]) == (
        "failed",
        "server_error",
        "The server had an error.",
    )
    assert row["output_text"] == "partial"
    assert "missing_stream_end" not in codes(row)  # the error says why it stopped


def test_error_event_with_nested_error_object_then_response_failed():
    err = {
        "type": "insufficient_quota",
        "code": "insufficient_quota",
        "message": "You exceeded your current quota.",
        "param": None,
    }
    body = stream(
        *CREATED,
        e("error", error=err),
        e(
            "response.failed",
            response=response(
                "failed", error={"code": "insufficient_quota", "message": "You exceeded your current quota."}
            ),
        ),
    )
    row = audit(body)
    assert (row["status"], row["error_code"], row["error_message"]) == (
        "failed",
        "insufficient_quota",
        "You exceeded your current quota.",
    )
    assert row["finish_reasons"] == ["failed"] and row["findings"] == []


def test_nested_error_without_code_uses_its_type():
    body = stream(*CREATED, e("error", error={"type": "server_error", "message": "boom"}))
    row = audit(body)
    assert (row["error_code"], row["error_message"]) == ("server_error", "boom")


def test_response_failed_gives_the_error_of_the_response():
    body = stream(
        *CREATED,
        e(
            "response.failed",
            response=response("failed", error={"code": "rate_limit_exceeded", "message": "Slow down."}),
        ),
    )
    row = audit(body)
    assert (row["status"], row["error_code"], row["error_message"]) == ("failed", "rate_limit_exceeded", "Slow down.")


def test_response_failed_without_an_error_object_still_fails():
    row = audit(stream(*CREATED, e("response.failed", response=response("failed"))))
    assert row["status"] == "failed" and row["error_message"]


@pytest.mark.parametrize(
    "status, body, code, message",
    [
        (
            400,
            {
                "error": {
                    "message": "Unknown model.",
                    "type": "invalid_request_error",
                    "param": "model",
                    "code": "model_not_found",
                }
            },
            "model_not_found",
            "Unknown model.",
        ),
        (
            429,
            {"error": {"message": "Quota.", "type": "insufficient_quota", "param": None, "code": None}},
            "insufficient_quota",
            "Quota.",
        ),
        (500, b"upstream exploded", None, "upstream exploded"),
    ],
)
def test_http_error_bodies_fail_the_exchange_with_code_and_message(status, body, code, message):
    row = audit_body(body, status)
    assert (row["status"], row["error_code"], row["error_message"]) == ("failed", code, message)


# -- endings and truncation ------------------------------------------------------------------------


def test_stream_cut_mid_way_keeps_partial_text_and_reports_missing_stream_end():
    cut = TEXT_STREAM.index(b"event: response.output_text.done")
    row = audit(TEXT_STREAM[: cut + 20], outcome=OUTCOME_UPSTREAM_ABORTED)
    assert row["status"] == "upstream_aborted"
    assert row["output_text"] == TEXT
    assert "missing_stream_end" in codes(row)


def test_clean_end_without_a_final_event_is_upstream_aborted():
    cut = TEXT_STREAM.index(b"event: response.completed")
    row = audit(TEXT_STREAM[:cut])
    assert row["status"] == "upstream_aborted" and codes(row) == ["missing_stream_end"]


def test_tool_call_cut_by_the_token_limit_is_kept_incomplete_with_the_finding():
    body = stream(
        *CREATED,
        e("response.output_item.added", output_index=0, item=call("fc_1", "call_1", "get_weather", "", "in_progress")),
        e("response.function_call_arguments.delta", item_id="fc_1", output_index=0, delta='{"city":"Vi'),
        e(
            "response.incomplete",
            response=response(
                "incomplete",
                [call("fc_1", "call_1", "get_weather", '{"city":"Vi', "incomplete")],
                usage(20, 16),
                incomplete_details={"reason": "max_output_tokens"},
            ),
        ),
    )
    row = audit(body)
    assert row["finish_reasons"] == ["max_output_tokens"]
    assert row["tool_calls"] == [{"id": "call_1", "name": "get_weather", "arguments": '{"city":"Vi'}]
    assert row["output"]["tool_calls"][0]["complete"] is False
    assert "tool_call_truncated" in codes(row)
    assert row["status"] == "completed" and (row["input_tokens"], row["output_tokens"]) == (20, 16)


def test_events_after_the_final_event_are_reported():
    body = TEXT_STREAM + stream(
        e("response.output_text.delta", item_id="msg_1", content_index=0, delta="late"), start=20
    )
    assert "event_after_stream_end" in codes(audit(body))


def test_unknown_events_comments_and_a_done_sentinel_are_ignored():
    body = (
        b": keep-alive\n\n"
        + stream(*CREATED, e("response.web_search_call.searching", item_id="ws_1", output_index=0))
        + stream(e("response.output_text.annotation.added", item_id="msg_1", annotation={}), start=3)
        + TEXT_STREAM.split(b"\n\n", 2)[2]
        + b"data: [DONE]\n\n"
    )
    row = audit(body)
    assert row["output_text"] == TEXT and row["findings"] == [] and row["status"] == "completed"


def test_data_that_is_not_a_json_object_is_a_finding():
    row = audit(
        stream(*CREATED) + b"event: response.output_text.delta\ndata: {broken\n\n" + TEXT_STREAM.split(b"\n\n", 2)[2]
    )
    assert codes(row) == ["invalid_json"] and row["output_text"] == TEXT


def test_odd_field_types_never_raise():
    body = stream(
        e("response.created", response="not an object"),
        e("response.output_item.added", item=None),
        e("response.output_item.added", output_index="x", item={"type": "function_call", "id": 5}),
        e("response.output_text.delta", item_id=7, content_index="0", delta=["x"]),
        e("response.output_item.done", item={"type": "message", "content": "text"}),
        e("response.completed", response={"status": 1, "usage": {"input_tokens": "3"}, "output": {}}),
    )
    row = audit(body)
    assert row["status"] == "completed" and row["input_tokens"] is None and "audit_internal_error" not in codes(row)


# -- splits --------------------------------------------------------------------------------------


def test_record_is_the_same_for_every_two_way_split_and_byte_at_a_time():
    whole = audit(CALL_STREAM)
    for cut in range(1, len(CALL_STREAM)):
        assert audit(CALL_STREAM, [cut]) == whole, cut
    assert audit(CALL_STREAM, list(range(1, len(CALL_STREAM)))) == whole


def test_record_is_the_same_for_random_splits_crlf_framing_and_gzip():
    crlf = REASONING_STREAM.replace(b"\n", b"\r\n")
    whole = audit(REASONING_STREAM)
    assert audit(crlf) == whole | {"bytes_to_client": len(crlf), "bytes_from_upstream": len(crlf)}
    rng = random.Random(11)
    for _ in range(100):
        cuts = sorted(rng.sample(range(1, len(crlf)), rng.randint(1, 20)))
        assert audit(crlf, cuts) == whole | {"bytes_to_client": len(crlf), "bytes_from_upstream": len(crlf)}
    packed = gzip.compress(REASONING_STREAM)
    assert audit(packed, list(range(1, len(packed), 5)), encoding="gzip") == whole | {
        "bytes_to_client": len(packed),
        "bytes_from_upstream": len(packed),
    }


# -- non-streamed responses ------------------------------------------------------------------------


def test_non_streamed_response_object_gives_every_output_item():
    obj = response(
        "completed",
        [REASONING_DONE, call("fc_1", "call_1", "get_weather", '{"city":"Wien"}'), message("msg_1", "Sunny.")],
        usage(30, 70, cached=10, reasoning=50),
    )
    row = audit_body(obj)
    assert row["status"] == "completed"
    assert row["output_text"] == "Sunny."
    assert row["output"]["choices"][0]["reasoning"] == "".join(SUMMARY) + "raw thought"
    assert row["tool_calls"] == [{"id": "call_1", "name": "get_weather", "arguments": '{"city":"Wien"}'}]
    assert (
        row["input_tokens"],
        row["output_tokens"],
        row["cache_read_input_tokens"],
        row["reasoning_output_tokens"],
    ) == (30, 70, 10, 50)
    assert (row["response_model"], row["response_id"], row["finish_reasons"]) == (MODEL, "resp_1", ["completed"])
    assert row["findings"] == []


def test_non_streamed_refusal_and_incomplete_call():
    obj = response(
        "incomplete",
        [message(refusal="No."), call("fc_1", "call_1", "get_weather", '{"ci', "incomplete")],
        incomplete_details={"reason": "max_output_tokens"},
    )
    row = audit_body(obj)
    assert row["output"]["choices"][0]["refusal"] == "No." and row["output_text"] == ""
    assert row["finish_reasons"] == ["max_output_tokens"]
    assert "tool_call_truncated" in codes(row)


def test_non_streamed_failed_response_and_background_queued_response():
    row = audit_body(response("failed", error={"code": "server_error", "message": "Oops."}))
    assert (row["status"], row["error_code"], row["error_message"]) == ("failed", "server_error", "Oops.")
    queued = audit_body(response("queued"))
    assert queued["status"] == "completed" and queued["finish_reasons"] == [] and queued["response_id"] == "resp_1"


def test_non_streamed_body_that_is_not_json_is_a_finding():
    row = audit_body(b"<html>", 200)
    assert codes(row) == ["response_invalid_json"] and row["status"] == "upstream_aborted"


# -- the shared reference recordings, when present --------------------------------------------------


def _shared_expected() -> tuple[dict, dict]:
    """The expected extraction of each Responses recording, and its request when recorded."""
    if not SHARED_STREAMS.exists():
        return {}, {}
    expected = orjson.loads((SHARED_STREAMS / "expected.json").read_bytes())
    sources = orjson.loads((SHARED_STREAMS / "sources.json").read_bytes())
    requests = {s["file"]: orjson.loads(s["request"]["body"]) for s in sources if (s.get("request") or {}).get("body")}
    return {name: exp for name, exp in expected.items() if exp.get("dialect") == "openai-responses"}, requests


SHARED, SHARED_REQUESTS = _shared_expected()


@pytest.mark.skipif(not SHARED_STREAMS.exists(), reason="../shared/reference/streams not present")
def test_all_seven_shared_openai_responses_recordings_are_checked():
    assert len(SHARED) == 7


@pytest.mark.skipif(not SHARED_STREAMS.exists(), reason="../shared/reference/streams not present")
@pytest.mark.parametrize("name", sorted(SHARED))
def test_shared_openai_responses_recordings_match_their_expected_extraction(name):
    expected = SHARED[name]
    body = (SHARED_STREAMS / name).read_bytes()
    request = SHARED_REQUESTS.get(name)  # None: not recorded, declared tools unknown
    whole = audit(body, request=request)
    assert audit(body, list(range(1, len(body))), request=request) == whole
    row = whole
    assert row["output_text"] == expected["text"]
    assert row["output"]["choices"][0].get("reasoning", "") == expected["reasoning_summary"]
    assert row["tool_calls"] == [
        {"id": t["call_id"], "name": t["name"], "arguments": t["arguments"]} for t in expected["tool_calls"]
    ]
    assert all(t["complete"] for t in row["output"]["tool_calls"])
    assert (row["response_model"], row["response_id"]) == (expected["model"], expected["response_id"])
    assert row["status"] == expected["status"]
    assert row["finish_reasons"] == [expected["status"]]
    usage_ = expected["usage"] or {}
    assert (row["input_tokens"], row["output_tokens"]) == (usage_.get("input_tokens"), usage_.get("output_tokens"))
    assert (row["cache_read_input_tokens"], row["reasoning_output_tokens"]) == (
        usage_.get("cached_tokens"),
        usage_.get("reasoning_tokens"),
    )
    error = expected["error"] or {}
    assert (row["error_code"], row["error_message"]) == (error.get("code"), error.get("message"))
    assert row["event_count"] == expected["sse_events"]
    assert row["findings"] == []


def test_the_output_so_far_is_rebuilt_from_what_the_gates_normalizer_read():
    """The output a termination carries: finished items as done, open ones incomplete with
    their deltas, items of other types whole, an item without output_index by its id."""
    n = OpenAIResponsesNormalizer()
    n.keeps_delivered = True
    message = {"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
    call = {
        "id": "fc_1",
        "type": "function_call",
        "call_id": "call_1",
        "name": "f",
        "arguments": "",
        "status": "in_progress",
    }
    search = {"id": "ws_1", "type": "web_search_call", "status": "completed", "action": {"query": "q"}}
    events = [
        ("response.output_item.added", {"output_index": 0, "item": message}),
        ("response.output_text.delta", {"item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": "Hi "}),
        ("response.output_text.delta", {"item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": "you"}),
        (
            "response.output_item.done",
            {
                "output_index": 0,
                "item": message
                | {"status": "completed", "content": [{"type": "output_text", "text": "Hi you", "annotations": []}]},
            },
        ),
        ("response.output_item.done", {"item": search}),  # no output_index: the next place
        ("response.output_item.added", {"output_index": 2, "item": call}),
        ("response.function_call_arguments.delta", {"item_id": "fc_1", "output_index": 2, "delta": '{"a'}),
    ]
    for kind, data in events:
        n.on_event(SSEEvent(event=kind, data=orjson.dumps({"type": kind, **data}).decode()))
    assert n.output_so_far() == [
        message | {"status": "completed", "content": [{"type": "output_text", "text": "Hi you", "annotations": []}]},
        search,
        call | {"status": "incomplete", "arguments": '{"a'},
    ]
    assert "content" not in n.items[0], "the text is kept once, in the deltas"


def test_an_upstream_naming_a_new_item_part_or_call_per_event_grows_no_table_past_its_bound():
    """A response has a few dozen items and parts. An upstream naming a new one per event
    is remembered up to MAX_KEYS per table; past that nothing new is kept, the finding
    record_limit says so once, and the text is still recorded (a final text past the
    bound as it comes, not compared with the deltas); an item's ended parts are forgotten."""
    from addon.dialects.responses import MAX_KEYS

    n = OpenAIResponsesNormalizer()
    n.keeps_delivered = True
    record = ExchangeRecord(dialect=DIALECT.name)

    def feed(kind: str, **data: object) -> None:
        for event in n.on_event(SSEEvent(event=kind, data=orjson.dumps({"type": kind, **data}).decode())):
            record.apply(event)

    count = MAX_KEYS + 100
    for i in range(count):
        item = {"id": f"ct_{i}", "type": "custom_tool_call", "call_id": f"c{i}", "name": "f", "input": "x"}
        feed("response.output_item.added", output_index=i, item=item)
        feed("response.output_text.delta", item_id="msg", content_index=i, delta=f"w{i} ")
        feed("response.output_text.done", item_id="msg", content_index=i, text=f"w{i} ")
        feed("response.function_call_arguments.delta", item_id=f"fc_{i}", delta="{")
    tables = (n.parts, n.arguments, n.opened, n.item_at, n.items, n.item_places, n.free_form, n.part_types)
    assert [len(t) <= MAX_KEYS for t in tables] == [True] * len(tables) and len(n.parts) == MAX_KEYS
    assert n.blocks._groups == {}
    row = record.to_row()
    limits = [f["detail"] for f in row["findings"] if f["code"] == "record_limit"]
    assert sum("output items, parts or calls" in d for d in limits) == 1
    assert set(row["output_text"].split()) == {f"w{i}" for i in range(count)}


def test_a_part_past_max_keys_has_its_text_once_and_its_done_text_checked_on_its_own(monkeypatch):
    """A part the normalizer does not remember (past MAX_KEYS parts) gets its deltas as
    text, and its ``.done`` text only as ShownText (checked by the filters on its own),
    not as text again: the record's text is not doubled, and the filters do not read the
    part's text joined to itself ("jar Night" + "jar Night" holds "Nightjar")."""
    from addon.dialects import responses
    from addon.events import ShownText, TextDelta
    from addon.filters.engine import FilterSet
    from addon.filters.rules import parse_rules
    from addon.output_gate import OutputGate

    monkeypatch.setattr(responses, "MAX_KEYS", 2)
    rules = '[[rule]]\nid = "k"\nkind = "keywords"\nkeywords = ["Nightjar"]\nscope = "response"\naction = "block"\n'
    filters = FilterSet(parse_rules(rules), failure="closed")
    gate = OutputGate(filters.output_guard(), OpenAIResponsesNormalizer(), holds=True, split_raw=True, failure="closed")
    n = OpenAIResponsesNormalizer()
    record = ExchangeRecord(dialect=DIALECT.name)
    events = []
    for i, text in enumerate(["p0 ", "p1 ", "jar Night"]):
        for kind, field in (("response.output_text.delta", "delta"), ("response.output_text.done", "text")):
            data = orjson.dumps({"type": kind, "item_id": "msg", "output_index": 0, "content_index": i, field: text})
            frame = SSEEvent(event=kind, data=data.decode())
            got = n.on_event(frame)
            gate.feed(b"", 0, [(frame, got, 0, None)])
            events += got
    for event in events:
        record.apply(event)
    assert [ev.text for ev in events if type(ev) is TextDelta] == ["p0 ", "p1 ", "jar Night"]
    assert [(ev.text, ev.kind) for ev in events if type(ev) is ShownText] == [("jar Night", "final_text")]
    assert record.to_row()["output_text"] == "p0 p1 jar Night"
    assert gate.blocked is None


def test_a_call_past_max_keys_has_its_arguments_once_and_its_done_arguments_checked_on_their_own(monkeypatch):
    """A call the normalizer does not remember (past MAX_KEYS calls) gets its deltas as
    arguments, and its ``.done`` arguments only as ShownText (escapes decoded, checked by
    the filters on their own), not appended again: the record's arguments are not
    doubled (``{"a":1}{"a":1}``), the filters do not read a custom tool's input joined to
    itself ("jar Night" + "jar Night" holds "Nightjar"), and a keyword only the final
    arguments hold (behind a JSON escape) is still blocked."""
    from addon.dialects import responses
    from addon.events import ShownText, ToolCallDelta
    from addon.filters.engine import FilterSet
    from addon.filters.rules import parse_rules
    from addon.output_gate import OutputGate

    monkeypatch.setattr(responses, "MAX_KEYS", 2)
    rules = '[[rule]]\nid = "k"\nkind = "keywords"\nkeywords = ["Nightjar"]\nscope = "response"\naction = "block"\n'

    def run(calls):
        filters = FilterSet(parse_rules(rules), failure="closed")
        gate = OutputGate(
            filters.output_guard(), OpenAIResponsesNormalizer(), holds=True, split_raw=True, failure="closed"
        )
        n, events = OpenAIResponsesNormalizer(), []
        for item_id, kind, delta, done in calls:
            frames = [(f"response.{kind}.delta", "delta", delta)] if delta else []
            frames.append((f"response.{kind}.done", "input" if kind.startswith("custom") else "arguments", done))
            for name, field, value in frames:
                data = orjson.dumps({"type": name, "item_id": item_id, "output_index": 0, field: value})
                frame = SSEEvent(event=name, data=data.decode())
                got = n.on_event(frame)
                gate.feed(b"", 0, [(frame, got, 0, None)])
                events += got
        record = ExchangeRecord(dialect=DIALECT.name)
        for event in events:
            record.apply(event)
        return events, record.to_row(), gate

    args = '{"a":1}'
    calls = [("fc0", "function_call_arguments", args, args), ("fc1", "function_call_arguments", args, args)]
    events, row, gate = run([*calls, ("fc2", "function_call_arguments", args, args)])
    assert [c["arguments"] for c in row["tool_calls"]] == [args, args, args]
    assert [ev.arguments for ev in events if type(ev) is ToolCallDelta and ev.key == "fc2"] == [args, ""]
    assert [(ev.text, ev.kind) for ev in events if type(ev) is ShownText] == [(args, "final_text")]
    assert gate.blocked is None

    events, row, gate = run([*calls, ("ct", "custom_tool_call_input", "jar Night", "jar Night")])
    assert row["tool_calls"][2]["arguments"] == "jar Night"
    assert gate.blocked is None

    hidden = '{"q":"Night\\u006aar"}'  # (no delta: only the final arguments hold it)
    events, row, gate = run([*calls, ("fc2", "function_call_arguments", "", hidden)])
    assert [(ev.text, ev.kind) for ev in events if type(ev) is ShownText] == [('{"q":"Nightjar"}', "final_text")]
    assert gate.blocked is not None and gate.blocked.rule_id == "k"
