"""The Bedrock dialect (and Anthropic on Vertex): detection, ConverseStream and Converse,
InvokeModel(WithResponseStream) with Anthropic inside (read by the Anthropic normalizer)
and other models, exceptions, termination and blocked answers, credentials; bodies split
at every offset give the same record; the real recorded bodies when ../shared exists."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import orjson
import pytest
from botocore.eventstream import EventStreamBuffer
from hypothesis import given, settings
from hypothesis import strategies as st
from pipeline import comparable_row

from addon.auditor import StreamAuditor, summary_into_record
from addon.dialects import RequestView
from addon.dialects.bedrock import DIALECT as BEDROCK
from addon.dialects.bedrock import BedrockNormalizer, operation
from addon.dialects.messages import AnthropicNormalizer
from addon.dialects.registry import detect_request
from addon.framing import select
from addon.framing.eventstream import MEDIA_TYPE, EventStreamReader, encode_message
from addon.record import OUTCOME_COMPLETE, ExchangeRecord
from addon.redact import api_key_fingerprint, redact_headers
from exchange.request import declared_tools, extract_messages

SAMPLES = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "protocol-samples" / "bedrock"
NOVA = "us.amazon.nova-micro-v1%3A0"
CLAUDE = "us.anthropic.claude-sonnet-4-20250514-v1%3A0"


def event(kind: str, payload: dict[str, Any], pad: str = "abcdefghij") -> bytes:
    return encode_message(
        [(":event-type", kind), (":content-type", "application/json"), (":message-type", "event")],
        orjson.dumps(payload | {"p": pad}),
    )


def exception(kind: str, message: str) -> bytes:
    return encode_message(
        [(":exception-type", kind), (":content-type", "application/json"), (":message-type", "exception")],
        orjson.dumps({"message": message}),
    )


def chunk(native: dict[str, Any]) -> bytes:
    return event("chunk", {"bytes": base64.b64encode(orjson.dumps(native)).decode()})


def audit(
    body: bytes,
    op: str = "converse-stream",
    request: Any = None,
    splits: list[int] | None = None,
    *,
    model: str = NOVA,
    status: int = 200,
    content_type: str = MEDIA_TYPE,
) -> dict:
    """The row of one exchange whose response body is ``body``, split at ``splits``."""
    view = RequestView("POST", f"/model/{model}/{op}", "", {})
    summary = BEDROCK.summarize(request, view)
    record = ExchangeRecord(dialect=BEDROCK.name, streamed=bool(summary.stream), http_status=status)
    summary_into_record(record, summary)
    normalizer = BEDROCK.normalizer(summary)
    framing = select(content_type, status, normalizer.framing)
    auditor = StreamAuditor(record, normalizer, None, 1 << 20, framing=framing)
    bounds = [0, *(splits or []), len(body)]
    for a, b in zip(bounds, bounds[1:]):
        if b > a:
            auditor.feed(body[a:b])
    auditor.end()
    record.finish(OUTCOME_COMPLETE)
    return comparable_row(record)


def every_split_is_the_same(body: bytes, **kwargs: Any) -> dict:
    row = audit(body, **kwargs)
    for i in range(1, len(body)):
        assert audit(body, splits=[i], **kwargs) == row, i
    return row


# -- detection -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (f"/model/{NOVA}/converse-stream", ("converse-stream", "us.amazon.nova-micro-v1:0")),
        (f"/model/{CLAUDE}/converse", ("converse", "us.anthropic.claude-sonnet-4-20250514-v1:0")),
        (
            "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.meta.llama3/invoke",
            ("invoke", "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.meta.llama3"),
        ),
        ("/gateway/bedrock/model/m/invoke-with-response-stream", ("invoke-with-response-stream", "m")),
        ("/model/m/count-tokens", ("", "")),
        ("/models/m/converse", ("", "")),
    ],
)
def test_the_operation_and_model_come_from_the_path(path, expected):
    assert operation(path) == expected


def test_bedrock_and_vertex_requests_are_detected_by_path():
    def detect(path: str, method: str = "POST") -> str | None:
        dialect = detect_request(RequestView(method, path, "", {}), lambda: {"messages": []})
        return None if dialect is None else f"{dialect.name}/{dialect.provider}"

    assert detect(f"/model/{NOVA}/converse-stream") == "bedrock/aws.bedrock"
    assert detect(f"/model/{NOVA}/converse-stream", "GET") is None
    vertex = "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4@20250514"
    assert detect(f"{vertex}:streamRawPredict") == "anthropic-messages/gcp.vertex_ai"
    assert detect(f"{vertex}%3ArawPredict") == "anthropic-messages/gcp.vertex_ai"
    assert detect(vertex.replace("claude-sonnet-4@20250514", "count-tokens") + ":rawPredict") is None
    gemini = "/v1/projects/p/locations/l/publishers/google/models/gemini-2.5-flash"
    assert detect(f"{gemini}:streamGenerateContent") == "gemini/gcp.gemini"
    assert detect(f"{gemini}:streamRawPredict") is None


def test_vertex_summary_takes_the_model_and_stream_from_the_path():
    path = "/v1/projects/p/locations/l/publishers/anthropic/models/claude-haiku-4-5@20251001:streamRawPredict"
    view = RequestView("POST", path, "", {})
    dialect = detect_request(view, lambda: {"anthropic_version": "vertex-2023-10-16", "messages": []})
    assert dialect is not None
    summary = dialect.summarize({"anthropic_version": "vertex-2023-10-16", "messages": [], "stream": True}, view)
    assert (summary.model, summary.stream) == ("claude-haiku-4-5@20251001", True)
    assert isinstance(dialect.normalizer(summary), AnthropicNormalizer)


def test_the_request_reader_reads_converse_bodies():
    body = {
        "system": [{"text": "Be brief."}],
        "messages": [
            {"role": "user", "content": [{"text": "Weather?"}]},
            {
                "role": "assistant",
                "content": [{"toolUse": {"toolUseId": "t1", "name": "w", "input": {"city": "Graz"}}}],
            },
            {"role": "user", "content": [{"toolResult": {"toolUseId": "t1", "content": [{"json": {"temp": 3}}]}}]},
        ],
        "toolConfig": {"tools": [{"toolSpec": {"name": "w", "description": "weather", "inputSchema": {"json": {}}}}]},
    }
    assert [(m.role, m.text) for m in extract_messages(body)] == [
        ("system", "Be brief."),
        ("user", "Weather?"),
        ("assistant", '{"city":"Graz"}'),
        ("user", '{"temp":3}'),
    ]
    assert [(t.name, t.description) for t in declared_tools(body)] == [("w", "weather")]
    view = RequestView("POST", f"/model/{NOVA}/converse", "", {})
    summary = BEDROCK.summarize(body, view)
    assert (summary.model, summary.stream, summary.declared_tools) == ("us.amazon.nova-micro-v1:0", False, {"w"})


# -- ConverseStream --------------------------------------------------------------------------------

CONVERSE_STREAM = b"".join(
    [
        event("messageStart", {"role": "assistant"}),
        event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"reasoningContent": {"text": "Hmm, "}}}),
        event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"reasoningContent": {"text": "easy."}}}),
        event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"reasoningContent": {"signature": "c2ln"}}}),
        event("contentBlockStop", {"contentBlockIndex": 0}),
        event(
            "contentBlockDelta", {"contentBlockIndex": 1, "delta": {"reasoningContent": {"redactedContent": "AAE="}}}
        ),
        event("contentBlockStop", {"contentBlockIndex": 1}),
        event("contentBlockDelta", {"contentBlockIndex": 2, "delta": {"text": "Größe: "}}, pad="p" * 40),
        event("contentBlockDelta", {"contentBlockIndex": 2, "delta": {"text": "42"}}),
        event("contentBlockStop", {"contentBlockIndex": 2}),
        event(
            "contentBlockStart",
            {"contentBlockIndex": 3, "start": {"toolUse": {"toolUseId": "tooluse_1", "name": "get_weather"}}},
        ),
        event("contentBlockDelta", {"contentBlockIndex": 3, "delta": {"toolUse": {"input": '{"city":'}}}),
        event("contentBlockDelta", {"contentBlockIndex": 3, "delta": {"toolUse": {"input": '"Graz"}'}}}),
        event("contentBlockStop", {"contentBlockIndex": 3}),
        event("messageStop", {"stopReason": "tool_use"}),
        event(
            "metadata",
            {
                "usage": {
                    "inputTokens": 10,
                    "outputTokens": 7,
                    "totalTokens": 47,
                    "cacheReadInputTokens": 20,
                    "cacheReadInputTokenCount": 20,
                    "cacheWriteInputTokenCount": 10,
                },
                "metrics": {"latencyMs": 5},
            },
        ),
    ]
)


def test_converse_stream_text_reasoning_tool_use_stop_and_usage_at_every_split():
    row = every_split_is_the_same(CONVERSE_STREAM, request={"messages": []})
    assert (row["status"], row["dialect"], row["request_model"]) == (
        "completed",
        "bedrock",
        "us.amazon.nova-micro-v1:0",
    )
    assert row["output_text"] == "Größe: 42"  # the padding p is no content
    assert row["output"]["choices"][0]["reasoning"] == "Hmm, easy."  # not the signature, not redacted content
    assert [(c["id"], c["name"], c["arguments"]) for c in row["tool_calls"]] == [
        ("tooluse_1", "get_weather", '{"city":"Graz"}')
    ]
    assert row["finish_reasons"] == ["tool_use"]
    assert (row["input_tokens"], row["output_tokens"]) == (40, 7)  # input includes cache reads and writes
    assert (row["cache_read_input_tokens"], row["cache_write_input_tokens"]) == (20, 10)
    assert row["findings"] == []


def test_an_event_only_lenient_json_readers_take_is_read_with_a_finding():
    """botocore reads event payloads with json.loads, which takes NaN: the text is read
    (and checked by the filters), and the record says the JSON was lenient."""
    text = encode_message(
        [(":event-type", "contentBlockDelta"), (":content-type", "application/json"), (":message-type", "event")],
        b'{"contentBlockIndex": 0, "delta": {"text": "Par"}, "x": NaN}',
    )
    row = audit(event("messageStart", {"role": "assistant"}) + text)
    assert row["output_text"] == "Par" and "lenient_json" in [f["code"] for f in row["findings"]]


def test_an_upstream_naming_a_new_tool_block_per_event_grows_no_table_past_its_bound():
    """ConverseStream opens one block at a time: toolUse blocks past MAX_TOOL_CALLS open at
    once are not remembered (their fragments are still read), with record_limit once."""
    from addon.framing import Message
    from addon.record import MAX_TOOL_CALLS

    normalizer, record = BedrockNormalizer("converse-stream", None, False), ExchangeRecord(dialect="bedrock")
    for i in range(MAX_TOOL_CALLS + 100):
        start = {"contentBlockIndex": i, "start": {"toolUse": {"toolUseId": f"t{i}", "name": "f"}}}
        delta = {"contentBlockIndex": 10**6 + i, "delta": {"toolUse": {"input": "{"}}}  # a block never started
        for kind, obj in (("contentBlockStart", start), ("contentBlockDelta", delta)):
            for e in normalizer.on_event(Message(orjson.dumps(obj).decode(), kind)):
                record.apply(e)
    assert len(normalizer.tool_blocks) == MAX_TOOL_CALLS
    limits = [f["detail"] for f in record.to_row()["findings"] if f["code"] == "record_limit"]
    assert sum("toolUse blocks open at once" in d for d in limits) == 1


def test_an_exception_message_fails_the_exchange_with_its_type():
    start = event("messageStart", {"role": "assistant"})
    text = event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Par"}})
    body = start + text + exception("throttlingException", "Too many tokens, please wait.")
    row = every_split_is_the_same(body)
    assert (row["status"], row["error_code"], row["error_message"]) == (
        "failed",
        "throttlingException",
        "Too many tokens, please wait.",
    )
    assert row["output_text"] == "Par" and row["findings"] == []


def test_a_stream_without_metadata_lacks_its_end():
    row = audit(event("messageStart", {}) + event("messageStop", {"stopReason": "end_turn"}))
    assert row["status"] == "upstream_aborted"
    assert [f["code"] for f in row["findings"]] == ["missing_stream_end"]


def test_converse_answer():
    answer = {
        "output": {
            "message": {
                "role": "assistant",
                "content": [
                    {"reasoningContent": {"reasoningText": {"text": "think", "signature": "sig"}}},
                    {"text": "Hello"},
                    {"toolUse": {"toolUseId": "t9", "name": "w", "input": {"a": 1}}},
                ],
            }
        },
        "stopReason": "tool_use",
        "usage": {"inputTokens": 3, "outputTokens": 4, "totalTokens": 7},
        "metrics": {"latencyMs": 1},
    }
    row = audit(orjson.dumps(answer), "converse", content_type="application/json")
    assert (row["status"], row["output_text"], row["finish_reasons"]) == ("completed", "Hello", ["tool_use"])
    assert row["output"]["choices"][0]["reasoning"] == "think"
    assert [(c["id"], c["name"], c["arguments"]) for c in row["tool_calls"]] == [("t9", "w", '{"a":1}')]
    assert (row["input_tokens"], row["output_tokens"]) == (3, 4)


def test_an_http_error_reads_the_aws_error_body():
    body = orjson.dumps({"message": "The provided model identifier is invalid.", "__type": "x#ValidationException"})
    row = audit(body, "converse-stream", status=400, content_type="application/json")
    assert (row["status"], row["error_code"], row["error_message"]) == (
        "failed",
        "ValidationException",
        "The provided model identifier is invalid.",
    )


# -- InvokeModelWithResponseStream / InvokeModel -----------------------------------------------------

ANTHROPIC_REQUEST = {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 50, "messages": []}
ANTHROPIC_EVENTS = [
    {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4",
            "content": [],
            "usage": {"input_tokens": 5, "output_tokens": 1},
        },
    },
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Bonjour"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}},
    {
        "type": "message_stop",
        "amazon-bedrock-invocationMetrics": {"inputTokenCount": 5, "outputTokenCount": 2, "invocationLatency": 9},
    },
]


def test_anthropic_inside_invoke_stream_is_read_by_the_anthropic_normalizer():
    body = b"".join(chunk(e) for e in ANTHROPIC_EVENTS)
    row = every_split_is_the_same(body, op="invoke-with-response-stream", request=ANTHROPIC_REQUEST, model=CLAUDE)
    assert (row["status"], row["output_text"], row["finish_reasons"]) == ("completed", "Bonjour", ["end_turn"])
    assert (row["response_model"], row["response_id"]) == ("claude-sonnet-4", "msg_1")
    assert (row["input_tokens"], row["output_tokens"]) == (5, 2)
    assert row["findings"] == []
    summary = BEDROCK.summarize(ANTHROPIC_REQUEST, RequestView("POST", f"/model/{CLAUDE}/invoke", "", {}))
    normalizer = BEDROCK.normalizer(summary)
    assert isinstance(normalizer, BedrockNormalizer) and isinstance(normalizer.inner, AnthropicNormalizer)


def test_anthropic_events_are_recognised_without_the_request():
    row = audit(b"".join(chunk(e) for e in ANTHROPIC_EVENTS), "invoke-with-response-stream")
    assert (row["status"], row["output_text"]) == ("completed", "Bonjour")


def test_llama_stream_text_and_usage_from_the_invocation_metrics():
    chunks = [
        {"generation": "Hi", "prompt_token_count": 4, "generation_token_count": 1, "stop_reason": None},
        {"generation": " there", "prompt_token_count": None, "generation_token_count": 2, "stop_reason": None},
        {
            "generation": "",
            "stop_reason": "stop",
            "amazon-bedrock-invocationMetrics": {"inputTokenCount": 4, "outputTokenCount": 2},
        },
    ]
    row = every_split_is_the_same(b"".join(chunk(c) for c in chunks), op="invoke-with-response-stream")
    assert (row["status"], row["output_text"], row["finish_reasons"]) == ("completed", "Hi there", ["stop"])
    assert (row["input_tokens"], row["output_tokens"]) == (4, 2)


def test_nova_native_stream_is_read_as_converse_events():
    chunks = [
        {"messageStart": {"role": "assistant"}},
        {"contentBlockDelta": {"delta": {"text": "Salut"}, "contentBlockIndex": 0}},
        {"contentBlockStop": {"contentBlockIndex": 0}},
        {"messageStop": {"stopReason": "end_turn"}},
        {
            "metadata": {"usage": {"inputTokens": 3, "outputTokens": 1}},
            "amazon-bedrock-invocationMetrics": {"inputTokenCount": 99, "outputTokenCount": 99},
        },
    ]
    row = audit(b"".join(chunk(c) for c in chunks), "invoke-with-response-stream")
    assert (row["status"], row["output_text"], row["input_tokens"], row["output_tokens"]) == (
        "completed",
        "Salut",
        3,
        1,
    )


def raw_chunk(native: bytes) -> bytes:
    """A chunk whose base64 holds ``native`` as it is (JSON orjson would not write)."""
    return event("chunk", {"bytes": base64.b64encode(native).decode()})


@pytest.mark.parametrize(
    "native",
    [
        b'{"contentBlockDelta": {"delta": {"text": "Salut"}, "contentBlockIndex": 0}, "x": NaN}',  # Nova: Converse events
        b'{"generation": "Salut", "stop_reason": null, "x": 1e400}',  # Llama
        b'{"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Salut"}, "x": NaN}',
    ],
)
def test_a_chunk_only_lenient_json_readers_take_is_read_with_one_finding(native: bytes):
    """botocore's and the SDKs' json.loads take NaN and 1e400: the chunk's text is read
    (and checked by the filters), with one lenient_json finding (an Anthropic chunk's is
    the Anthropic normalizer's)."""
    strict = native.replace(b"NaN", b"0").replace(b"1e400", b"0")
    stop = {"messageStop": {"stopReason": "end_turn"}, "amazon-bedrock-invocationMetrics": {"inputTokenCount": 1}}
    row = audit(raw_chunk(native) + chunk(stop), "invoke-with-response-stream")
    assert row["output_text"] == "Salut"
    assert [f["code"] for f in row["findings"]].count("lenient_json") == 1
    row = audit(raw_chunk(strict) + chunk(stop), "invoke-with-response-stream")
    assert "lenient_json" not in [f["code"] for f in row["findings"]]


def test_an_exception_only_lenient_json_readers_take_is_read_with_a_finding():
    lenient = encode_message(
        [
            (":exception-type", "throttlingException"),
            (":content-type", "application/json"),
            (":message-type", "exception"),
        ],
        b'{"message": "Too many tokens", "retry": NaN}',
    )
    row = audit(event("messageStart", {"role": "assistant"}) + lenient)
    assert (row["error_code"], row["error_message"]) == ("throttlingException", "Too many tokens")
    assert "lenient_json" in [f["code"] for f in row["findings"]]


def test_an_unknown_model_payload_is_a_finding():
    row = audit(
        chunk({"whatever": 1}) + chunk({"amazon-bedrock-invocationMetrics": {"inputTokenCount": 1}}),
        "invoke-with-response-stream",
    )
    assert [f["code"] for f in row["findings"]] == ["bedrock_unknown_payload"]
    assert (row["status"], row["input_tokens"]) == ("completed", 1)


def test_an_unknown_payloads_strings_go_to_the_output_filters_and_base64_is_read_as_botocore_reads_it():
    """An application may show any string of a payload no reader knows: the filters see
    them all (ShownText), the record does not take them for the answer. A stray character
    in the base64 does not hide a chunk (botocore skips it too)."""
    normalizer = BEDROCK.normalizer(
        BEDROCK.summarize(None, RequestView("POST", "/model/x/invoke-with-response-stream", "", {}))
    )
    first = normalizer._chunk({"bytes": base64.b64encode(orjson.dumps({"say": ["secret plan"], "p": "pad"})).decode()})
    second = normalizer._chunk({"bytes": base64.b64encode(orjson.dumps({"more": {"deep": "text"}})).decode()})
    assert [(type(e).__name__, getattr(e, "text", "")) for e in first] == [
        ("ShownText", "secret plan"),
        ("Finding", ""),
    ]
    assert [(type(e).__name__, getattr(e, "text", "")) for e in second] == [("ShownText", "text")]
    encoded = base64.b64encode(
        orjson.dumps({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}})
    ).decode()
    stray = encoded[:4] + "\n!" + encoded[4:]
    assert [
        getattr(e, "text", None)
        for e in BedrockNormalizer("invoke-with-response-stream", None, True)._chunk({"bytes": stray})
    ][:1] == ["hi"]


def test_an_unknown_payload_past_what_is_read_of_it_is_strings_unread():
    """Text of an unknown payload past its first 64 KiB went to the client unread by any
    filter, silently: now the finding strings_unread (which the gate's failure policy
    decides on) comes before the text that was read."""
    normalizer = BEDROCK.normalizer(
        BEDROCK.summarize(None, RequestView("POST", "/model/x/invoke-with-response-stream", "", {}))
    )
    payload = {"say": "x" * (64 * 1024) + " the Nightjar plan"}
    events = normalizer._chunk({"bytes": base64.b64encode(orjson.dumps(payload)).decode()})
    assert [(type(e).__name__, getattr(e, "code", "")) for e in events][:2] == [
        ("Finding", "strings_unread"),
        ("ShownText", ""),
    ]
    assert "Nightjar" not in events[1].text


@pytest.mark.parametrize(
    ("request_body", "answer", "text", "finish"),
    [
        (
            ANTHROPIC_REQUEST,
            {
                "id": "msg_2",
                "type": "message",
                "role": "assistant",
                "model": "claude",
                "content": [{"type": "text", "text": "Yes"}],
                "stop_reason": "end_turn",
                "usage": {"input_tokens": 1, "output_tokens": 1},
            },
            "Yes",
            "end_turn",
        ),
        ({"prompt": "hi"}, {"generation": "Hello", "stop_reason": "stop", "prompt_token_count": 2}, "Hello", "stop"),
        ({"inputText": "hi"}, {"results": [{"outputText": "Hey", "completionReason": "FINISH"}]}, "Hey", "FINISH"),
        ({"prompt": "hi"}, {"outputs": [{"text": "Ciao", "stop_reason": "stop"}]}, "Ciao", "stop"),
        ({}, {"choices": [{"index": 0, "message": {"content": "Hej"}, "finish_reason": "stop"}]}, "Hej", "stop"),
    ],
)
def test_invoke_model_answers(request_body, answer, text, finish):
    row = audit(orjson.dumps(answer), "invoke", request_body, content_type="application/json")
    assert (row["status"], row["output_text"], row["finish_reasons"], row["findings"]) == (
        "completed",
        text,
        [finish],
        [],
    )


KEYS = [
    "contentBlockIndex", "delta", "text", "toolUse", "input", "start", "reasoningContent", "stopReason",
    "usage", "inputTokens", "outputTokens", "message", "output", "content", "type", "generation",
    "outputs", "choices", "amazon-bedrock-invocationMetrics", "bytes", "index",
]  # fmt: skip
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=4),
    max_leaves=12,
)
EVENT_NAMES = st.sampled_from([*("messageStart contentBlockStart contentBlockDelta contentBlockStop".split()), "chunk"])


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["converse-stream", "invoke-with-response-stream", "converse", "invoke"]),
    st.lists(st.tuples(EVENT_NAMES, JSON), max_size=6),
    JSON,
)
def test_hostile_payloads_never_raise(op, events, whole):
    view = RequestView("POST", f"/model/m/{op}", "", {})
    normalizer = BEDROCK.normalizer(BEDROCK.summarize(whole, view))
    for name, payload in events:
        data = orjson.dumps({"bytes": base64.b64encode(orjson.dumps(payload)).decode()} if name == "chunk" else payload)
        for frame in EventStreamReader(1 << 20).feed(encode_message([(":event-type", name)], data)):
            normalizer.on_event(frame)
    normalizer.on_end()
    normalizer.ending("r", "x")
    normalizer.on_body(orjson.dumps(whole), 200)
    normalizer.filtered_body("r", "x")


# -- termination and blocked answers -----------------------------------------------------------------


def read_back(data: bytes) -> list[tuple[str, str, dict]]:
    """Messages as botocore's own parser reads them (it checks both CRCs)."""
    buffer = EventStreamBuffer()
    buffer.add_data(data)
    return [(m.headers[":message-type"], m.headers.get(":exception-type"), orjson.loads(m.payload)) for m in buffer]


def test_a_cut_stream_ends_with_a_validation_exception_naming_the_rule():
    normalizer = BEDROCK.normalizer(
        BEDROCK.summarize({}, RequestView("POST", f"/model/{NOVA}/converse-stream", "", {}))
    )
    reader = EventStreamReader(1 << 20)
    for frame in reader.feed(CONVERSE_STREAM[:300]):
        normalizer.on_event(frame)
    [(kind, exception_type, payload)] = read_back(normalizer.termination("no-secrets", "a key"))
    assert (kind, exception_type) == ("exception", "validationException")
    assert payload == {"message": "Blocked by content filter rule 'no-secrets': a key"}
    finished = BEDROCK.normalizer(BEDROCK.summarize({}, RequestView("POST", f"/model/{NOVA}/converse-stream", "", {})))
    for frame in EventStreamReader(1 << 20).feed(CONVERSE_STREAM):
        finished.on_event(frame)
    assert finished.termination("r", "x") == b""  # over: nothing to add


def test_blocked_requests_get_an_exception_stream_or_a_400():
    view = RequestView("POST", f"/model/{NOVA}/converse-stream", "", {})
    summary = BEDROCK.summarize({}, view)
    streamed = BEDROCK.blocked_response(summary, view, "rule", "why", streaming=True)
    assert (streamed.status, dict(streamed.headers)["content-type"]) == (200, MEDIA_TYPE)
    assert read_back(streamed.body) == [
        ("exception", "validationException", {"message": "Blocked by content filter rule 'rule': why"})
    ]
    whole = BEDROCK.blocked_response(summary, view, "rule", "why", streaming=False)
    assert (whole.status, dict(whole.headers)["x-amzn-errortype"]) == (400, "ValidationException")
    assert orjson.loads(whole.body) == {"message": "Blocked by content filter rule 'rule': why"}


def test_a_held_converse_answer_is_replaced_by_a_filtered_one():
    answer = {
        "output": {"message": {"content": [{"text": "secret"}]}},
        "stopReason": "end_turn",
        "usage": {"inputTokens": 1},
    }
    normalizer = BEDROCK.normalizer(BEDROCK.summarize({}, RequestView("POST", f"/model/{NOVA}/converse", "", {})))
    normalizer.on_body(orjson.dumps(answer), 200)
    filtered = normalizer.filtered_body("r", "x")
    assert filtered is not None and filtered.status == 200
    assert orjson.loads(filtered.body) == {
        "output": {"message": {"role": "assistant", "content": []}},
        "stopReason": "content_filtered",
        "usage": {"inputTokens": 1},
    }


# -- credentials -------------------------------------------------------------------------------------


def test_sigv4_credentials_are_stored_only_as_fingerprints():
    signature = "fe5f80f77d5fa3beca038a248ff027d0445342fe2855ddc963176630326f1024"
    authorization = (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20260101/us-east-1/bedrock/aws4_request, "
        f"SignedHeaders=host;x-amz-date;x-amz-security-token, Signature={signature}"
    )
    token = "IQoJb3JpZ2luX2VjEJr//////////wEaCXVzLWVhc3QtMSJHMEUCIQ" + "A" * 200
    headers = [("Authorization", authorization), ("X-Amz-Security-Token", token), ("X-Amz-Date", "20260101T000000Z")]
    stored = redact_headers(headers)
    text = orjson.dumps(stored).decode()
    assert signature not in text and token not in text and "AKIAIOSFODNN7EXAMPLE" not in text
    assert stored["authorization"].startswith("[redacted sha256:")
    assert stored["x-amz-security-token"].startswith("[redacted sha256:")
    assert stored["x-amz-date"] == "20260101T000000Z"
    # the key, not the per-request signature, identifies the credential
    other = authorization.replace(signature, "0" * 64)
    assert api_key_fingerprint({"authorization": authorization}, "") == api_key_fingerprint(
        {"authorization": other}, ""
    )


# -- the real recorded bodies (../shared) -----------------------------------------------------------

RECORDED = [
    (
        "pydantic-ai_test_bedrock_model_stream",
        {
            "text_start": "The capital of France is Paris. Paris is not only the capital city but also ",
            "usage": (13, 82),
        },
    ),
    (
        "pydantic-ai_test_bedrock_model_thinking_part_stream",
        {"text": "Hello! It's nice to meet you. How can I help you today?", "usage": (36, 73)},
    ),
    ("pydantic-ai_test_bedrock_model_code_execution_tool_stream", {"usage": (1002, 59), "finish": "tool_use"}),
]


@pytest.mark.skipif(not SAMPLES.exists(), reason="../shared protocol samples not present")
@pytest.mark.parametrize(("name", "expected"), RECORDED, ids=[n for n, _ in RECORDED])
def test_the_recorded_bedrock_bodies(name, expected):
    body = (SAMPLES / f"{name}.eventstream.bin").read_bytes()
    first = orjson.loads((SAMPLES / f"{name}.decoded.jsonl").read_text().splitlines()[0])
    path = first["_request_uri"].partition(".amazonaws.com")[2]
    request = orjson.loads(first["_request_body"])
    view = RequestView("POST", path, "", {})
    assert detect_request(view, lambda: request) is BEDROCK
    row = audit(body, request=request, model=path.split("/")[2])
    for split in range(0, len(body), 97):
        assert audit(body, request=request, model=path.split("/")[2], splits=[split, split + 50]) == row
    assert (row["status"], row["findings"]) == ("completed", [])
    assert (row["input_tokens"], row["output_tokens"]) == expected["usage"]
    assert row["finish_reasons"] == [expected.get("finish", "end_turn")]
    assert '"p"' not in row["output_text"] and "abcdefghijklmnop" not in row["output_text"]
    if "text" in expected:
        assert row["output_text"] == expected["text"]
        reasoning = row["output"]["choices"][0]["reasoning"]
        assert reasoning.startswith("The user has greeted me") and "Eu0CCkgIBxAB" not in reasoning
    if "text_start" in expected:
        assert row["output_text"].startswith(expected["text_start"])
    if name.endswith("code_execution_tool_stream"):
        calls = [(c["name"], orjson.loads(c["arguments"])) for c in row["tool_calls"]]
        assert calls == [("nova_code_interpreter", {"snippet": "1234 * 5678"}), ("final_result", {"result": 7006652.0})]
        assert "7006652" not in row["output_text"]  # the server tool's result is no answer text
