"""The llm-stream dialect, sans-IO: detection, extraction and conformance findings.

Streams are fed through the same pipeline the proxy uses (StreamAuditor: decoder, SSE
parser, normalizer, record) in several chunkings; the record must not depend on how the
bytes were split.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import orjson
import pytest
from pipeline import audit_bytes

from addon.dialects import RequestView
from addon.dialects.llm_stream import DIALECT
from addon.dialects.registry import detect_request, detect_response
from addon.framing.sse import SSEEvent
from addon.record import OUTCOME_COMPLETE, OUTCOME_UPSTREAM_ABORTED
from exchange.transcript import output_choices

SHARED_STREAMS = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "streams"

REQUEST = {
    "version": "1.0",
    "stream": True,
    "model": "example-model",
    "messages": [{"role": "user", "content": "What is the weather in Vienna?"}],
    "tools": [{"name": "get_weather", "description": "Weather.", "parameters": {"type": "object"}}],
    "metadata": {"request_id": "req-1", "user_id": "user-12345", "session_id": "sess-67890"},
}


def ev(seq: int | None, type_: str, *, event: str | None = None, **fields) -> bytes:
    """One llm-stream event, framed as the draft prescribes."""
    body = {"v": "1.0", "seq": seq, "type": type_} | fields
    if seq is None:
        del body["seq"]
    return f"event: {event or type_}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n".encode()


def delta(seq: int, text: str, index: int = 0) -> bytes:
    return ev(seq, "content.delta", index=index, role="assistant", delta={"text": text})


COMPLETE = b"".join(
    [
        ev(0, "stream.start", request_id="req-1", model="example-model-2026", created=1749292800),
        delta(1, "Das Wetter"),
        delta(2, " in Wien: 24°C, "),
        delta(3, "sonnig ☀️."),
        ev(4, "content.stop", index=0, stop_reason="end_turn"),
        ev(5, "usage", input_tokens=42, output_tokens=9),
        ev(6, "stream.end", request_id="req-1"),
    ]
)


def audit(
    body: bytes,
    chunks: list[int] | None = None,
    *,
    request: dict | None = REQUEST,
    encoding=None,
    outcome: str = OUTCOME_COMPLETE,
) -> dict:
    """Run ``body`` through the auditor split at ``chunks`` offsets; return the row."""
    return audit_bytes(
        DIALECT,
        body,
        chunks,
        request=request,
        request_view=view({"content-type": "application/llm-request+json"}),
        encoding=encoding,
        outcome=outcome,
    )


def codes(row: dict) -> list[str]:
    return [f["code"] for f in row["findings"]]


# -- detection --------------------------------------------------------------------------


def view(headers: dict[str, str], path: str = "/v1/generate") -> RequestView:
    return RequestView("POST", path, "", {k.lower(): v for k, v in headers.items()})


@pytest.mark.parametrize(
    "headers",
    [
        {"Content-Type": "application/llm-request+json"},
        {"Content-Type": "Application/LLM-Request+JSON; version=1.0"},
        {"Content-Type": "application/json", "Accept": 'text/event-stream; profile="llm-stream-1.0"'},
        {"Accept": "application/json, text/event-stream;profile=llm-stream-1.0;q=0.9"},
    ],
)
def test_llm_stream_request_is_detected_by_media_type_or_accept_profile(headers):
    assert detect_request(view(headers), lambda: REQUEST) is DIALECT


@pytest.mark.parametrize(
    "headers",
    [
        {"Content-Type": "application/json"},
        {"Content-Type": "application/json", "Accept": "text/event-stream"},
        {"Accept": 'text/event-stream; profile="other-1.0"'},
        {"Accept": 'text/html; profile="llm-stream-1.0"'},
    ],
)
def test_other_requests_are_not_llm_stream(headers):
    assert detect_request(view(headers), lambda: pytest.fail("body parsed for a non-match")) is None


def test_unclaimed_stream_is_claimed_by_a_stream_start_first_event():
    start = SSEEvent("stream.start", '{"v":"1.0","seq":0,"type":"stream.start","model":"m","created":1}', "", None)
    assert detect_response(start) is DIALECT
    assert detect_response(SSEEvent("message", '{"v":"1.0","type":"stream.start"}', "", None)) is DIALECT
    assert detect_response(SSEEvent("stream.start", '{"v":"2.0","type":"stream.start"}', "", None)) is None
    assert detect_response(SSEEvent("message", '{"choices":[]}', "", None)) is None
    assert detect_response(SSEEvent("message", "not json", "", None)) is None


# -- extraction ---------------------------------------------------------------------------


def test_complete_stream_extracts_text_model_usage_stop_reason_and_metadata():
    row = audit(COMPLETE)
    assert row["status"] == "completed"
    assert row["output_text"] == "Das Wetter in Wien: 24°C, sonnig ☀️."
    assert row["request_model"] == "example-model"
    assert row["response_model"] == "example-model-2026"
    assert (row["request_id"], row["user_id"], row["session_id"]) == ("req-1", "user-12345", "sess-67890")
    assert (row["input_tokens"], row["output_tokens"]) == (42, 9)
    assert row["finish_reasons"] == ["end_turn"]
    assert row["event_count"] == 7
    assert row["findings"] == []
    assert row["bytes_to_client"] == len(COMPLETE)


def test_record_is_the_same_for_every_two_way_split_and_byte_at_a_time():
    whole = audit(COMPLETE)
    for cut in range(1, len(COMPLETE)):
        assert audit(COMPLETE, [cut]) == whole, cut
    assert audit(COMPLETE, list(range(1, len(COMPLETE)))) == whole


def test_record_is_the_same_for_random_splits_and_crlf_framing():
    crlf = COMPLETE.replace(b"\n", b"\r\n")
    whole = audit(crlf)
    assert whole["output_text"] == audit(COMPLETE)["output_text"]
    rng = random.Random(7)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(crlf)), rng.randint(1, 12)))
        assert audit(crlf, cuts) == whole


def test_several_content_blocks_keep_their_own_text_and_output_text_is_block_zero():
    body = b"".join(
        [
            ev(0, "stream.start", model="m", created=1),
            delta(1, "first "),
            delta(2, "second", index=1),
            delta(3, "block", index=0),
            ev(4, "content.stop", index=0, stop_reason="end_turn"),
            ev(5, "content.stop", index=1, stop_reason="max_tokens"),
            ev(6, "stream.end"),
        ]
    )
    row = audit(body)
    assert row["output_text"] == "first block"
    assert [c["text"] for c in output_choices(row)] == ["first block", "second"]
    assert row["finish_reasons"] == ["end_turn", "max_tokens"]


def test_tool_call_is_recorded_with_id_name_and_arguments():
    args = '{"city":"Vienna"}'
    body = b"".join(
        [
            ev(0, "stream.start", model="m", created=1),
            ev(1, "tool.call", index=0, id="call_1", name="get_weather", arguments=args),
            ev(2, "content.stop", index=0, stop_reason="tool_use"),
            ev(3, "stream.end"),
        ]
    )
    row = audit(body)
    assert row["tool_calls"] == [{"id": "call_1", "name": "get_weather", "arguments": args}]
    assert row["finish_reasons"] == ["tool_use"]
    assert row["findings"] == []


def test_error_event_fails_the_exchange_with_code_and_message():
    body = b"".join(
        [
            ev(0, "stream.start", model="m", created=1),
            delta(1, "partial"),
            ev(2, "error", code="overloaded", message="Try again later."),
            ev(3, "stream.end"),
        ]
    )
    row = audit(body)
    assert (row["status"], row["error_code"], row["error_message"]) == ("failed", "overloaded", "Try again later.")
    assert row["output_text"] == "partial"


def test_usage_absent_is_null_never_zero():
    body = (
        ev(0, "stream.start", model="m", created=1)
        + delta(1, "x")
        + ev(2, "content.stop", index=0, stop_reason="end_turn")
        + ev(3, "stream.end")
    )
    row = audit(body)
    assert row["input_tokens"] is None and row["output_tokens"] is None and row["usage_source"] == "none"


def test_gzip_encoded_stream_is_read_through_the_decoder():
    packed = gzip.compress(COMPLETE)
    row = audit(packed, list(range(1, len(packed), 7)), encoding="gzip")
    assert row["output_text"] == audit(COMPLETE)["output_text"]
    assert row["bytes_to_client"] == len(packed)


def test_unknown_content_encoding_is_a_finding_and_the_stream_is_not_inspected():
    row = audit(b"\x00\x01garbage", encoding="compress")
    assert "decode_failed" in codes(row)


# -- endings ------------------------------------------------------------------------------


def test_stream_cut_by_upstream_keeps_partial_text_and_reports_missing_stream_end():
    cut = COMPLETE.index(b"event: content.stop")
    row = audit(COMPLETE[: cut + 10], outcome=OUTCOME_UPSTREAM_ABORTED)
    assert row["status"] == "upstream_aborted"
    assert row["output_text"] == "Das Wetter in Wien: 24°C, sonnig ☀️."
    assert "missing_stream_end" in codes(row)
    assert "missing_content_stop" in codes(row)


def test_clean_end_of_body_without_stream_end_is_upstream_aborted():
    cut = COMPLETE.index(b"event: stream.end")
    row = audit(COMPLETE[:cut])
    assert row["status"] == "upstream_aborted"
    assert codes(row) == ["missing_stream_end"]


def test_body_ending_inside_an_event_is_reported():
    row = audit(COMPLETE + b"event: usage\ndata: {")
    assert "sse_incomplete_event" in codes(row)


# -- conformance findings -------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, expected",
    [
        (delta(0, "x") + ev(1, "stream.end"), "first_event_not_stream_start"),
        (ev(3, "stream.start", model="m", created=1) + ev(4, "stream.end"), "stream_start_seq_not_zero"),
        (ev(0, "stream.start", model="m", created=1) + delta(1, "a") + delta(5, "b"), "seq_gap"),
        (ev(0, "stream.start", model="m", created=1) + delta(1, "a") + delta(1, "b"), "seq_repeat"),
        (ev(0, "stream.start", model="m", created=1) + delta(2, "a") + delta(1, "b"), "seq_decrease"),
        (ev(0, "stream.start", model="m", created=1) + delta(2**53, "a"), "seq_exhausted"),
        (
            ev(0, "stream.start", model="m", created=1)
            + ev(1, "usage", event="usage.report", input_tokens=1, output_tokens=1),
            "type_mismatch",
        ),
        (ev(0, "stream.start", model="m", created=1).replace(b'"v": "1.0"', b'"v": "1.1"'), "version_mismatch"),
        (ev(0, "stream.start", model="m", created=1) + b"event: content.delta\ndata: {not json\n\n", "invalid_json"),
        (ev(0, "stream.start", model="m", created=1) + b"event: content.delta\ndata: [1, 2]\n\n", "invalid_json"),
        (
            ev(0, "stream.start", model="m", created=1) + ev(1, "stream.end") + delta(2, "late"),
            "event_after_stream_end",
        ),
        (ev(0, "stream.start", model="m", created=1) + delta(1, "a") + ev(2, "stream.end"), "missing_content_stop"),
        (
            ev(0, "stream.start", model="m", created=1)
            + ev(1, "tool.call", index=0, id="c", name="rm_rf", arguments="{}"),
            "undeclared_tool",
        ),
        (ev(None, "stream.start", model="m", created=1), "seq_invalid"),
        (ev(0, "stream.start", model="m"), "missing_field"),
        (ev(0, "stream.start", model="m", created=1) + ev(1, "content.thinking", text="x"), "unknown_event_type"),
    ],
)
def test_conformance_problem_is_reported(body, expected):
    row = audit(body)
    assert expected in codes(row)


def test_findings_never_change_the_bytes_counted_as_forwarded():
    body = ev(0, "stream.start", model="m", created=1) + b"event: content.delta\ndata: {bad\n\n"
    assert audit(body)["bytes_to_client"] == len(body)


def test_request_envelope_missing_required_fields_is_reported():
    row = audit(COMPLETE, request={"model": "m", "messages": "hi"})
    assert ("request_missing_field", "version") in [(f["code"], f["detail"]) for f in row["findings"]]
    assert "request_invalid_field" in codes(row)


def test_findings_of_one_code_are_capped_and_counted():
    body = ev(0, "stream.start", model="m", created=1) + b"".join(b"event: x\ndata: {bad\n\n" for _ in range(500))
    row = audit(body)
    invalid = [f for f in row["findings"] if f["code"] == "invalid_json"]
    assert len(invalid) == 21 and invalid[-1]["detail"] == "480 more not listed"


# -- the shared reference recordings, when present -----------------------------------------------


@pytest.mark.skipif(not SHARED_STREAMS.exists(), reason="../shared/reference/streams not present")
@pytest.mark.parametrize(
    "name", ["llmstream-draft-complete-example.sse", "llmstream-draft-tool-call-example-as-printed.sse"]
)
def test_shared_llm_stream_recordings_match_their_expected_extraction(name):
    expected = orjson.loads((SHARED_STREAMS / "expected.json").read_bytes())[name]
    body = (SHARED_STREAMS / name).read_bytes()
    for chunks in (None, list(range(1, len(body)))):
        row = audit(body, chunks, request=REQUEST)
        assert row["output_text"] == expected["text"]
        assert row["response_model"] == expected["model"]
        assert row["event_count"] == expected["sse_events"]
        assert [{k: t[k] for k in ("id", "name", "arguments")} for t in expected["tool_calls"]] == row["tool_calls"]
        assert expected["stop_reason"] in row["finish_reasons"]
        usage = expected["usage"] or {}
        assert (row["input_tokens"], row["output_tokens"]) == (usage.get("input_tokens"), usage.get("output_tokens"))
        assert ("missing_stream_end" in codes(row)) is (not expected["stream_end"])
        if expected["conformance_problems"]:
            assert {"version_mismatch", "seq_invalid", "first_event_not_stream_start"} <= set(codes(row))
        else:
            assert codes(row) == []
