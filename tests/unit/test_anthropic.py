"""The Anthropic Messages dialect, sans-IO: detection, request summary, stream and JSON extraction.

Bodies are fed through the proxy's pipeline (StreamAuditor: decoder, SSE parser,
normalizer, record) in several chunkings; the record must not depend on the split.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import orjson
import pytest
from pipeline import audit_bytes

from addon.dialects import RequestView
from addon.dialects.anthropic import DIALECT
from addon.dialects.registry import detect_request, detect_response
from addon.framing.sse import SSEEvent
from addon.record import OUTCOME_COMPLETE, OUTCOME_UPSTREAM_ABORTED
from exchange.transcript import output_choices, output_tool_calls

SHARED_STREAMS = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "streams"

REQUEST = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 1024,
    "stream": True,
    "messages": [{"role": "user", "content": "What is the weather in Vienna?"}],
    "tools": [
        {"name": "get_weather", "description": "Weather.", "input_schema": {"type": "object"}},
        {"type": "web_search_20250305", "name": "web_search"},
    ],
    "metadata": {"user_id": "user-12345"},
}
HEADERS = {"anthropic-version": "2023-06-01", "content-type": "application/json", "x-api-key": "sk-ant-x"}


def ev(type_: str, *, event: str | None = None, pad: str = "", **fields) -> bytes:
    """One Messages stream event (``event:`` repeats the JSON type, as Anthropic sends it)."""
    data = json.dumps({"type": type_} | fields, ensure_ascii=False, separators=(",", ":"))
    if pad:
        data = data[:-1] + pad + "}"
    return f"event: {event or type_}\ndata: {data}\n\n".encode()


def start(model="claude-sonnet-4-5-20250929", id_="msg_01", usage=None) -> bytes:
    usage = {"input_tokens": 12, "output_tokens": 1} if usage is None else usage
    message = {
        "id": id_,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    return ev("message_start", message=message)


def block_start(index: int, block: dict) -> bytes:
    return ev("content_block_start", index=index, content_block=block)


def text(index: int, t: str) -> bytes:
    return ev("content_block_delta", index=index, delta={"type": "text_delta", "text": t})


def thinking(index: int, t: str) -> bytes:
    return ev("content_block_delta", index=index, delta={"type": "thinking_delta", "thinking": t})


def json_part(index: int, fragment: str) -> bytes:
    return ev("content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": fragment})


def stop(index: int) -> bytes:
    return ev("content_block_stop", index=index)


def message_delta(reason: str | None = "end_turn", usage: dict | None = None, **delta) -> bytes:
    return ev(
        "message_delta",
        delta={"stop_reason": reason, "stop_sequence": None} | delta,
        usage={"output_tokens": 9} if usage is None else usage,
    )


PING = b'event: ping\ndata: {"type": "ping"}\n\n'
MESSAGE_STOP = b'event: message_stop\ndata: {"type":"message_stop"       }\n\n'

TEXT_STREAM = b"".join(
    [
        start(),
        block_start(0, {"type": "text", "text": ""}),
        PING,
        text(0, "Das Wetter"),
        text(0, " in Wien: 24°C, "),
        text(0, "sonnig ☀️."),
        stop(0),
        message_delta("end_turn", {"output_tokens": 14}),
        MESSAGE_STOP,
    ]
)

TOOL_STREAM = b"".join(
    [
        start(usage={"input_tokens": 400, "output_tokens": 4}),
        block_start(0, {"type": "text", "text": ""}),
        text(0, "Let me check both."),
        stop(0),
        block_start(1, {"type": "tool_use", "id": "toolu_A", "name": "get_weather", "input": {}}),
        json_part(1, ""),
        json_part(1, '{"city'),
        json_part(1, '": "Vien'),
        json_part(1, 'na"}'),
        stop(1),
        block_start(2, {"type": "tool_use", "id": "toolu_B", "name": "get_weather", "input": {}}),
        json_part(2, ""),
        PING,
        json_part(2, '{"city": "Graz"}'),
        stop(2),
        message_delta("tool_use", {"output_tokens": 88}),
        MESSAGE_STOP,
    ]
)


def audit(
    body: bytes,
    chunks: list[int] | None = None,
    *,
    request: dict | None = REQUEST,
    encoding=None,
    outcome: str = OUTCOME_COMPLETE,
    event_stream: bool = True,
    status: int = 200,
) -> dict:
    """Run ``body`` through the auditor split at ``chunks`` offsets; return the row."""
    return audit_bytes(
        DIALECT,
        body,
        chunks,
        request=request,
        request_view=view(HEADERS),
        encoding=encoding,
        outcome=outcome,
        event_stream=event_stream,
        status=status,
    )


def answer(body: dict | bytes, status: int = 200) -> dict:
    """A non-streamed response body (JSON answer or HTTP error)."""
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return audit(raw, event_stream=False, status=status, request=REQUEST | {"stream": False})


def codes(row: dict) -> list[str]:
    return [f["code"] for f in row["findings"]]


def calls(row: dict) -> list[dict]:
    return output_tool_calls(row)


# -- detection --------------------------------------------------------------------------


def view(headers: dict[str, str], path: str = "/v1/messages", method: str = "POST") -> RequestView:
    return RequestView(method, path, "", {k.lower(): v for k, v in headers.items()})


@pytest.mark.parametrize(
    "path, headers",
    [
        ("/v1/messages", HEADERS),
        ("/v1/messages", {"content-type": "application/json"}),  # no header: the body shape decides
        ("/v1/messages/", {}),
        ("/anthropic/v1/messages", {"authorization": "Bearer x"}),  # gateway prefix
        ("/api/v1/messages", {}),  # OpenRouter-style base path
        ("/messages", {"anthropic-version": "2023-06-01"}),
    ],
)
def test_messages_request_is_detected_by_method_path_and_body_shape(path, headers):
    assert detect_request(view(headers, path), lambda: REQUEST) is DIALECT


@pytest.mark.parametrize(
    "method, path",
    [
        ("POST", "/v1/messages/count_tokens"),
        ("POST", "/v1/messages/batches"),
        ("GET", "/v1/messages"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/responses"),
        ("POST", "/v1/my_messages"),
    ],
)
def test_other_paths_and_methods_are_not_claimed_without_parsing_the_body(method, path):
    assert not DIALECT.matches(view(HEADERS, path, method))
    assert detect_request(view(HEADERS, path, method), lambda: REQUEST) is not DIALECT


@pytest.mark.parametrize(
    "body",
    [
        {"role": "user", "content": "hi"},  # OpenAI Assistants: POST /v1/threads/{id}/messages
        {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},  # OpenAI chat body, no max_tokens
        {"model": "claude", "messages": "hi", "max_tokens": 5},
        {"messages": [], "max_tokens": 5},
        [1, 2],
        None,
    ],
)
def test_bodies_without_the_messages_shape_are_not_claimed(body):
    assert detect_request(view({"content-type": "application/json"}, "/v1/threads/t1/messages"), lambda: body) is None


def test_anthropic_version_header_accepts_any_body_when_the_view_is_passed():
    assert DIALECT.accepts_body({"model": "claude", "messages": []}, view(HEADERS))
    assert DIALECT.accepts_body(None, view(HEADERS))
    assert not DIALECT.accepts_body({"model": "claude", "messages": []}, view({}))


def test_unclaimed_stream_is_claimed_by_a_message_start_first_event():
    first = SSEEvent("message_start", start().split(b"data: ", 1)[1].strip().decode(), "", None)
    assert detect_response(first) is DIALECT
    assert detect_response(SSEEvent("message_start", '{"type":"message_start"}', "", None)) is None
    assert detect_response(SSEEvent("content_block_start", '{"type":"content_block_start"}', "", None)) is None
    assert detect_response(SSEEvent("message", '{"choices":[]}', "", None)) is None


def test_dialect_name_and_provider():
    assert DIALECT.name == "anthropic-messages"
    assert DIALECT.provider_for("api.anthropic.com") == "anthropic"
    assert DIALECT.provider_for("localhost") == "anthropic"
    assert DIALECT.provider_for("openrouter.ai") == "openrouter"


def test_request_summary_reads_model_stream_user_id_and_declared_tools():
    summary = DIALECT.summarize(REQUEST, view(HEADERS))
    assert summary.model == "claude-sonnet-4-5"
    assert summary.stream is True
    assert summary.user_id == "user-12345"
    assert summary.session_id is None and summary.request_id is None
    assert summary.declared_tools == frozenset({"get_weather", "web_search"})
    assert summary.findings == []


def test_request_summary_tolerates_wrong_types_and_missing_fields():
    odd = {"model": 3, "stream": "yes", "metadata": ["x"], "tools": [{"name": 1}, "t", {"name": "ok"}]}
    summary = DIALECT.summarize(odd, view(HEADERS))
    assert (summary.model, summary.stream, summary.user_id) == (None, None, None)
    assert summary.declared_tools == frozenset({"ok"})
    assert DIALECT.summarize(None, view(HEADERS)).model is None
    assert DIALECT.summarize({"model": "m", "messages": []}, view(HEADERS)).declared_tools == frozenset()


# -- streamed text, usage, splits ------------------------------------------------------------


def test_text_stream_extracts_text_model_id_usage_and_stop_reason_and_ignores_ping():
    row = audit(TEXT_STREAM)
    assert row["status"] == "completed"
    assert row["output_text"] == "Das Wetter in Wien: 24°C, sonnig ☀️."
    assert (row["request_model"], row["response_model"]) == ("claude-sonnet-4-5", "claude-sonnet-4-5-20250929")
    assert row["response_id"] == "msg_01"
    assert row["user_id"] == "user-12345"
    assert row["finish_reasons"] == ["end_turn"]
    assert (row["input_tokens"], row["output_tokens"]) == (12, 14)
    assert row["cache_read_input_tokens"] is None and row["cache_write_input_tokens"] is None
    assert row["event_count"] == 9
    assert row["findings"] == []


def test_record_is_the_same_for_every_two_way_split_and_byte_at_a_time():
    whole = audit(TEXT_STREAM)
    for cut in range(1, len(TEXT_STREAM)):
        assert audit(TEXT_STREAM, [cut]) == whole, cut
    assert audit(TEXT_STREAM, list(range(1, len(TEXT_STREAM)))) == whole


def test_record_is_the_same_for_random_splits_and_crlf_framing():
    for body in (TOOL_STREAM, TOOL_STREAM.replace(b"\n", b"\r\n")):
        whole = audit(body)
        assert whole["tool_calls"] == audit(TOOL_STREAM)["tool_calls"]
        rng = random.Random(11)
        for _ in range(150):
            cuts = sorted(rng.sample(range(1, len(body)), rng.randint(1, 15)))
            assert audit(body, cuts) == whole


def test_input_tokens_include_cache_reads_and_writes_and_last_message_delta_output_wins():
    body = b"".join(
        [
            start(
                usage={
                    "input_tokens": 10,
                    "cache_read_input_tokens": 2000,
                    "cache_creation_input_tokens": 300,
                    "output_tokens": 1,
                }
            ),
            block_start(0, {"type": "text", "text": ""}),
            text(0, "hi"),
            message_delta(None, {"output_tokens": 5}),
            stop(0),
            message_delta("end_turn", {"output_tokens": 27}),
            MESSAGE_STOP,
        ]
    )
    row = audit(body)
    assert row["input_tokens"] == 10 + 2000 + 300
    assert (row["cache_read_input_tokens"], row["cache_write_input_tokens"]) == (2000, 300)
    assert row["output_tokens"] == 27
    assert row["usage_source"] == "provider"


def test_message_delta_repeating_input_and_cache_counts_is_merged_with_message_start():
    body = b"".join(
        [
            start(
                usage={
                    "input_tokens": 16,
                    "cache_read_input_tokens": 0,
                    "cache_creation_input_tokens": 0,
                    "output_tokens": 5,
                }
            ),
            block_start(0, {"type": "text", "text": ""}),
            text(0, "x"),
            stop(0),
            # cumulative counts: cache_read updated, creation not repeated (kept from message_start)
            message_delta(
                "end_turn",
                {
                    "input_tokens": 16,
                    "cache_read_input_tokens": 100,
                    "output_tokens": 38,
                    "output_tokens_details": {"thinking_tokens": 20},
                },
            ),
            MESSAGE_STOP,
        ]
    )
    row = audit(body)
    assert (row["input_tokens"], row["output_tokens"]) == (116, 38)
    assert (row["cache_read_input_tokens"], row["cache_write_input_tokens"]) == (100, 0)
    assert row["reasoning_output_tokens"] == 20


def test_message_start_output_tokens_are_preliminary_and_never_recorded_as_final():
    body = (
        start(usage={"input_tokens": 7, "output_tokens": 3})
        + block_start(0, {"type": "text", "text": ""})
        + text(0, "a")
    )
    row = audit(body, outcome=OUTCOME_UPSTREAM_ABORTED)
    assert (row["input_tokens"], row["output_tokens"]) == (7, None)
    assert row["usage_source"] == "provider"  # the input count is real


def test_usage_absent_is_null_never_zero():
    body = start(usage={}) + block_start(0, {"type": "text", "text": ""}) + text(0, "a") + stop(0)
    body += ev("message_delta", delta={"stop_reason": "end_turn"}) + MESSAGE_STOP
    row = audit(body)
    assert row["status"] == "completed"
    assert row["input_tokens"] is None and row["output_tokens"] is None and row["usage_source"] == "none"
    assert row["reasoning_output_tokens"] is None


# -- reasoning, tool calls --------------------------------------------------------------------


def test_thinking_is_kept_as_reasoning_and_signature_and_redacted_thinking_are_ignored():
    body = b"".join(
        [
            start(),
            block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
            thinking(0, "The user wants "),
            thinking(0, "the weather."),
            ev("content_block_delta", index=0, delta={"type": "signature_delta", "signature": "EqQBCkYIARgCKkD=="}),
            stop(0),
            block_start(1, {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT"}),
            stop(1),
            block_start(2, {"type": "text", "text": ""}),
            text(2, "Sunny."),
            stop(2),
            message_delta("end_turn"),
            MESSAGE_STOP,
        ]
    )
    row = audit(body)
    assert row["output_text"] == "Sunny."
    assert output_choices(row) == [
        {"index": 0, "text": "Sunny.", "reasoning": "The user wants the weather.", "finish_reason": "end_turn"}
    ]
    assert row["findings"] == []


def test_parallel_tool_calls_are_reassembled_from_split_fragments_keyed_by_block():
    row = audit(TOOL_STREAM)
    assert row["output_text"] == "Let me check both."
    assert row["tool_calls"] == [
        {"id": "toolu_A", "name": "get_weather", "arguments": '{"city": "Vienna"}'},
        {"id": "toolu_B", "name": "get_weather", "arguments": '{"city": "Graz"}'},
    ]
    assert all(c["complete"] for c in calls(row))
    assert row["finish_reasons"] == ["tool_use"]
    assert (row["input_tokens"], row["output_tokens"]) == (400, 88)
    assert row["findings"] == []


def test_text_blocks_after_a_tool_block_are_joined_into_output_text():
    body = b"".join(
        [
            start(),
            block_start(0, {"type": "text", "text": ""}),
            text(0, "Before. "),
            stop(0),
            block_start(1, {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}),
            json_part(1, '{"city":"Linz"}'),
            stop(1),
            block_start(2, {"type": "text", "text": ""}),
            text(2, "After."),
            stop(2),
            message_delta("end_turn"),
            MESSAGE_STOP,
        ]
    )
    row = audit(body)
    assert row["output_text"] == "Before. After."
    assert row["tool_calls"] == [{"id": "toolu_1", "name": "get_weather", "arguments": '{"city":"Linz"}'}]


def test_tool_without_streamed_input_takes_the_input_of_content_block_start():
    body = b"".join(
        [
            start(),
            block_start(0, {"type": "tool_use", "id": "toolu_1", "name": "now", "input": {}}),
            json_part(0, ""),
            stop(0),
            message_delta("tool_use"),
            MESSAGE_STOP,
        ]
    )
    row = audit(body)
    assert calls(row) == [{"id": "toolu_1", "name": "now", "arguments": "{}", "complete": True}]


def test_tool_call_cut_by_max_tokens_keeps_its_arguments_and_is_reported_truncated():
    body = b"".join(
        [
            start(),
            block_start(0, {"type": "text", "text": ""}),
            text(0, "Writing the file."),
            stop(0),
            block_start(1, {"type": "tool_use", "id": "toolu_1", "name": "make_file", "input": {}}),
            json_part(1, ""),
            json_part(1, '{"filename": "taxes.txt", "lines": ["# TAX'),
            message_delta("max_tokens", {"output_tokens": 124}),
            MESSAGE_STOP,
        ]
    )
    row = audit(body)
    assert row["status"] == "completed"
    assert calls(row) == [
        {
            "id": "toolu_1",
            "name": "make_file",
            "arguments": '{"filename": "taxes.txt", "lines": ["# TAX',
            "complete": False,
        }
    ]
    assert row["finish_reasons"] == ["max_tokens"]
    assert codes(row) == ["tool_call_truncated"]


def test_server_tool_use_is_recorded_as_a_tool_call_and_its_result_block_ignored():
    body = b"".join(
        [
            start(),
            block_start(0, {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}),
            json_part(0, '{"query": "weather vienna"}'),
            stop(0),
            block_start(1, {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}),
            stop(1),
            block_start(2, {"type": "text", "text": ""}),
            text(2, "It is sunny."),
            ev(
                "content_block_delta",
                index=2,
                delta={"type": "citations_delta", "citation": {"type": "web_search_result_location"}},
            ),
            stop(2),
            message_delta("end_turn"),
            MESSAGE_STOP,
        ]
    )
    row = audit(body)
    assert row["tool_calls"] == [{"id": "srvtoolu_1", "name": "web_search", "arguments": '{"query": "weather vienna"}'}]
    assert row["output_text"] == "It is sunny."
    assert row["findings"] == []


# -- refusal, errors, endings --------------------------------------------------------------------


def test_refusal_stop_reason_and_its_explanation_are_recorded():
    body = b"".join(
        [
            start(),
            block_start(0, {"type": "text", "text": ""}),
            text(0, "I can"),
            stop(0),
            message_delta(
                "refusal",
                stop_details={"type": "refusal", "category": "cyber", "explanation": "Request could enable malware."},
            ),
            MESSAGE_STOP,
        ]
    )
    row = audit(body)
    assert row["finish_reasons"] == ["refusal"]
    assert output_choices(row)[0]["refusal"] == "Request could enable malware."
    assert row["output_text"] == "I can"


def test_error_event_after_http_200_fails_the_exchange_and_keeps_partial_output():
    body = b"".join(
        [
            start(usage={"input_tokens": 16, "output_tokens": 5}),
            block_start(0, {"type": "text", "text": ""}),
            PING,
            text(0, "Olá! ("),
            b'event: error\ndata: {"type":"error","error":{"details":null,"type":"overloaded_error","message":"Overloaded"} }\n\n',
        ]
    )
    row = audit(body, outcome=OUTCOME_UPSTREAM_ABORTED)
    assert (row["status"], row["error_code"], row["error_message"]) == ("failed", "overloaded_error", "Overloaded")
    assert row["output_text"] == "Olá! ("
    assert row["finish_reasons"] == []
    assert "missing_stream_end" in codes(row)


@pytest.mark.parametrize(
    "data, expected",
    [
        ({"type": "error", "error": "boom"}, (None, "boom")),
        ({"type": "error"}, ("error", None)),
        ({"type": "error", "error": {"code": 500}}, ("error", None)),
        ({"type": "error", "error": {"type": "api_error"}}, ("api_error", None)),
    ],
)
def test_error_events_of_odd_shape_still_fail_the_exchange(data, expected):
    body = start() + f"event: error\ndata: {json.dumps(data)}\n\n".encode()
    row = audit(body)
    assert row["status"] == "failed"
    assert (row["error_code"], row["error_message"]) == expected


def test_stream_cut_mid_tool_call_keeps_partial_output_and_reports_both_problems():
    cut = TOOL_STREAM.index(b'{\\"city\\": \\"Graz')
    row = audit(TOOL_STREAM[:cut], outcome=OUTCOME_UPSTREAM_ABORTED)
    assert row["status"] == "upstream_aborted"
    assert row["output_text"] == "Let me check both."
    assert [c["complete"] for c in calls(row)] == [True, False]
    assert calls(row)[1]["arguments"] == ""
    assert set(codes(row)) == {"missing_stream_end", "tool_call_truncated"}


def limits(row: dict) -> list[str]:
    """The record_limit findings' details."""
    return [f["detail"] for f in row["findings"] if f["code"] == "record_limit"]


def test_an_upstream_naming_a_new_block_per_event_grows_no_table_past_its_bound():
    """Anthropic opens one block at a time. An upstream opening a new index per event (a
    tool block, a fragment of a block never started, a text block) is remembered up to
    MAX_BLOCKS open blocks; past them nothing new is kept, the finding record_limit says
    so once, and the text and fragments are still read."""
    from addon.dialects import MAX_OPEN_BLOCKS
    from addon.dialects.messages import MAX_BLOCKS, AnthropicNormalizer
    from addon.record import ExchangeRecord

    normalizer, record = AnthropicNormalizer(), ExchangeRecord(dialect=DIALECT.name)

    def feed(**obj: object) -> None:
        for event in normalizer.on_event(SSEEvent(str(obj["type"]), json.dumps(obj), "", None)):
            record.apply(event)

    n = MAX_BLOCKS + 100
    tool = {"type": "tool_use", "name": "f", "input": {}}
    for i in range(n):
        feed(type="content_block_start", index=i, content_block=tool | {"id": f"t{i}"})
        feed(type="content_block_delta", index=n + i, delta={"type": "input_json_delta", "partial_json": ""})
        feed(type="content_block_start", index=2 * n + i, content_block={"type": "text", "text": f"w{i} "})
        feed(type="content_block_delta", index=3 * n + i, delta={"type": "text_delta", "text": f"x{i} "})
    assert len(normalizer.tool_blocks) + len(normalizer.text_blocks) == MAX_BLOCKS
    assert len(normalizer.json_seen) <= MAX_BLOCKS and len(normalizer.blocks._kinds) == MAX_OPEN_BLOCKS
    row = record.to_row()
    assert sum("content blocks open at once" in d for d in limits(row)) == 1
    assert sum("not tracked for interleaving" in d for d in limits(row)) == 1
    assert [row["output_text"].count(c) for c in "wx"] == [n, n]  # all the text, none dropped
    assert "text_interleaved" in codes(row)


def test_a_tool_block_s_state_ends_with_it():
    """What a tool block keeps (its start's input, whether fragments came) goes at its
    stop: a stream of many blocks one after another keeps none of it."""
    from addon.dialects.messages import AnthropicNormalizer

    normalizer = AnthropicNormalizer()
    for i in range(50):
        for obj in (
            {"type": "content_block_start", "index": i, "content_block": {"type": "tool_use", "input": {}}},
            {"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta", "partial_json": "{}"}},
            {"type": "content_block_stop", "index": i},
        ):
            normalizer.on_event(SSEEvent(obj["type"], json.dumps(obj), "", None))
    assert (normalizer.tool_blocks, normalizer.json_seen, normalizer.text_blocks) == ({}, set(), {})


def test_clean_end_of_body_without_message_stop_is_upstream_aborted():
    row = audit(TEXT_STREAM[: TEXT_STREAM.index(b"event: message_stop")])
    assert row["status"] == "upstream_aborted"
    assert row["finish_reasons"] == ["end_turn"]
    assert codes(row) == ["missing_stream_end"]


def test_events_after_message_stop_are_reported():
    row = audit(TEXT_STREAM + text(0, "late"))
    assert "event_after_stream_end" in codes(row)


def test_unknown_event_types_delta_types_and_block_types_are_ignored_silently():
    body = b"".join(
        [
            start(),
            ev("message_annotation", note="new"),
            block_start(0, {"type": "container_upload", "file_id": "f"}),
            ev("content_block_delta", index=0, delta={"type": "future_delta", "x": 1}),
            stop(0),
            block_start(1, {"type": "text", "text": ""}),
            text(1, "ok"),
            stop(1),
            message_delta("end_turn"),
            MESSAGE_STOP,
        ]
    )
    row = audit(body)
    assert row["output_text"] == "ok"
    assert row["findings"] == []
    assert row["status"] == "completed"


@pytest.mark.parametrize(
    "data",
    [
        {"type": "message_start", "message": "x"},
        {"type": "message_start", "message": {"usage": [1], "model": 3, "id": None}},
        {"type": "content_block_start", "index": "zero", "content_block": None},
        {"type": "content_block_start", "index": [0], "content_block": {"type": "tool_use", "id": 1, "name": {}}},
        {"type": "content_block_delta", "index": {}, "delta": {"type": "input_json_delta", "partial_json": 5}},
        {"type": "content_block_delta", "index": 0, "delta": []},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": None}},
        {"type": "content_block_stop", "index": [1]},
        {"type": "message_delta", "delta": "x", "usage": {"output_tokens": "9", "input_tokens": True}},
        {"type": 7},
    ],
)
def test_wrong_types_in_events_never_raise(data):
    body = start() + f"event: x\ndata: {json.dumps(data)}\n\n".encode() + MESSAGE_STOP
    row = audit(body)
    assert "audit_internal_error" not in codes(row)
    assert row["status"] == "completed"
    assert row["output_tokens"] is None  # message_start's count is preliminary; no message_delta gave one


def test_data_that_is_not_a_json_object_is_a_finding():
    row = audit(start() + b"event: content_block_delta\ndata: {broken\n\nevent: ping\ndata: [1]\n\n" + MESSAGE_STOP)
    assert codes(row) == ["invalid_json", "invalid_json"]
    assert row["status"] == "completed"


# -- non-streamed responses and HTTP errors -------------------------------------------------------


MESSAGE = {
    "id": "msg_02",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5-20250929",
    "content": [
        {"type": "thinking", "thinking": "Need the weather.", "signature": "sig"},
        {"type": "text", "text": "Let me look.", "citations": None},
        {"type": "tool_use", "id": "toolu_9", "name": "get_weather", "input": {"city": "Wien", "units": ["C", "°"]}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 50,
        "cache_read_input_tokens": 1000,
        "cache_creation_input_tokens": 0,
        "output_tokens": 70,
    },
}


def test_non_streamed_message_extracts_text_thinking_tool_call_usage_and_model():
    row = answer(MESSAGE)
    assert row["status"] == "completed"
    assert row["streamed"] is False
    assert row["output_text"] == "Let me look."
    assert output_choices(row)[0]["reasoning"] == "Need the weather."
    assert calls(row) == [
        {"id": "toolu_9", "name": "get_weather", "arguments": '{"city":"Wien","units":["C","°"]}', "complete": True}
    ]
    assert (row["response_model"], row["response_id"]) == ("claude-sonnet-4-5-20250929", "msg_02")
    assert row["finish_reasons"] == ["tool_use"]
    assert (row["input_tokens"], row["output_tokens"], row["cache_read_input_tokens"]) == (1050, 70, 1000)
    assert row["cache_write_input_tokens"] == 0
    assert row["findings"] == []


def test_non_streamed_tool_call_cut_by_max_tokens_is_reported_truncated():
    cut = MESSAGE | {"stop_reason": "max_tokens"}
    row = answer(cut)
    assert calls(row)[0]["complete"] is False
    assert codes(row) == ["tool_call_truncated"]
    # a tool call that is not the last block was whole even when the answer ran out later
    row = answer(cut | {"content": [*MESSAGE["content"], {"type": "text", "text": " more"}]})
    assert calls(row)[0]["complete"] is True and codes(row) == []


def test_non_streamed_refusal_is_recorded():
    row = answer(
        {
            "type": "message",
            "model": "m",
            "content": [],
            "stop_reason": "refusal",
            "stop_details": {"type": "refusal", "category": "bio", "explanation": None},
            "usage": {"input_tokens": 3, "output_tokens": 0},
        }
    )
    assert row["finish_reasons"] == ["refusal"]
    assert output_choices(row)[0]["refusal"] == "bio"
    assert (row["input_tokens"], row["output_tokens"]) == (3, 0)


def test_non_streamed_body_that_is_not_json_is_a_finding():
    row = answer(b"<html>oops</html>")
    assert codes(row) == ["response_invalid_json"]
    assert row["status"] == "upstream_aborted"


@pytest.mark.parametrize(
    "status, body, expected",
    [
        (
            529,
            b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_011"}',
            ("overloaded_error", "Overloaded"),
        ),
        (
            400,
            b'{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: Field required"}}',
            ("invalid_request_error", "max_tokens: Field required"),
        ),
        (
            429,
            b'{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}',
            ("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"),
        ),
        (
            200,
            b'{"type":"error","error":{"type":"api_error","message":"Internal server error"}}',
            ("api_error", "Internal server error"),
        ),
    ],
)
def test_http_error_bodies_fail_the_exchange_with_type_and_message(status, body, expected):
    row = answer(body, status)
    assert row["status"] == "failed"
    assert (row["error_code"], row["error_message"]) == expected


def test_error_status_with_an_html_body_is_failed_with_the_text():
    row = answer(b"<html>502 Bad Gateway</html>", 502)
    assert row["status"] == "failed"
    assert row["error_message"] == "<html>502 Bad Gateway</html>"


# -- the shared reference recordings, when present -----------------------------------------------


def _shared_names() -> list[str]:
    if not SHARED_STREAMS.exists():
        return []
    expected = orjson.loads((SHARED_STREAMS / "expected.json").read_bytes())
    return sorted(name for name, e in expected.items() if e.get("dialect") == "anthropic")


@pytest.mark.skipif(not SHARED_STREAMS.exists(), reason="../shared/reference/streams not present")
def test_all_shared_anthropic_recordings_are_covered():
    assert len(_shared_names()) == 8


@pytest.mark.skipif(not SHARED_STREAMS.exists(), reason="../shared/reference/streams not present")
@pytest.mark.parametrize("name", _shared_names() or ["none"])
def test_shared_anthropic_recordings_match_their_expected_extraction(name):
    expected = orjson.loads((SHARED_STREAMS / "expected.json").read_bytes())[name]
    body = (SHARED_STREAMS / name).read_bytes()
    rng = random.Random(name)
    whole = audit(body)
    for chunks in (list(range(1, len(body))), sorted(rng.sample(range(1, len(body)), 20))):
        assert audit(body, chunks) == whole
    row = whole
    assert row["output_text"] == expected["text"]
    assert output_choices(row)[0].get("reasoning", "") == expected["thinking"]
    assert row["response_model"] == expected["model"]
    assert row["response_id"] == expected["message_id"]
    assert row["event_count"] == expected["sse_events"]
    assert row["tool_calls"] == [{k: t[k] for k in ("id", "name", "arguments")} for t in expected["tool_calls"]]
    truncated = [t.get("arguments_invalid_json", False) for t in expected["tool_calls"]]
    assert [not c["complete"] for c in calls(row)] == truncated
    assert row["finish_reasons"] == ([expected["stop_reason"]] if expected["stop_reason"] else [])
    usage = expected["usage"]
    cached = (usage.get("cache_read_input_tokens") or 0) + (usage.get("cache_creation_input_tokens") or 0)
    assert row["input_tokens"] == usage["input_tokens"] + cached
    # only message_delta's output count is final; message_start's is preliminary
    assert row["output_tokens"] == usage.get("output_tokens")
    assert row["cache_read_input_tokens"] == usage.get("cache_read_input_tokens")
    assert row["cache_write_input_tokens"] == usage.get("cache_creation_input_tokens")
    error = expected["error"]
    assert (row["error_code"], row["error_message"]) == ((error["type"], error["message"]) if error else (None, None))
    assert ("missing_stream_end" in codes(row)) is (not expected["message_stop"])
    assert ("tool_call_truncated" in codes(row)) is any(truncated)
    if error:
        assert row["status"] == "failed"
    elif expected["message_stop"]:
        assert row["status"] == "completed"
    assert set(codes(row)) <= {"missing_stream_end", "tool_call_truncated"}
