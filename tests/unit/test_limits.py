"""Limits per exchange, sans-IO: the record cap, the raw body's SHA-256, compressed
bodies read in slices with the same result for any split, bombs stopped by the decode
budget, and, with a gate that holds output, the filter failure policy deciding."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from typing import Any

import pytest
from test_block_responses import CASES
from test_output_gate import BLOCK_RULES, gated

from addon.auditor import StreamAuditor, summary_into_record
from addon.dialects import Dialect, RequestView
from addon.dialects.connect_rpc import DIALECT as CONNECT
from addon.events import Finish, TextDelta, TextSnapshot, ToolCallDelta
from addon.filters.engine import FilterSet
from addon.findings import CODES
from addon.framing import select
from addon.framing.envelope import envelope
from addon.output_gate import OutputGate
from addon.record import (
    FINDINGS_PER_CODE,
    MAX_CHOICES,
    MAX_FINDING_DETAIL,
    MAX_FINISH_REASON,
    MAX_TOOL_CALLS,
    MAX_TOOL_KEY,
    OUTCOME_COMPLETE,
    OUTCOME_UPSTREAM_ABORTED,
    ExchangeRecord,
)
from mockllm.scenario import Scenario
from mockllm.streams import Encoder, plan_body

CASE = CASES["openai-chat"]
CAP = 64 * 1024


def body(scenario: str, *, json: bool = False) -> bytes:
    parsed = Scenario.parse(scenario)
    request = CASE.request | {"stream": not json, "stream_options": {"include_usage": True}}
    if json:
        import orjson

        from mockllm.streams import openai_chat_completion

        items = [orjson.dumps(openai_chat_completion(request, parsed))]
    else:
        items = CASE.stream(request, parsed)
    return b"".join(plan_body(items, parsed, event_stream=not json).writes)


def audit(
    data: bytes,
    encoding: str | None = None,
    cuts: list[int] | None = None,
    *,
    json: bool = False,
    cap: int = CAP,
    outcome: str = OUTCOME_COMPLETE,
) -> tuple[ExchangeRecord, StreamAuditor]:
    request = CASE.request | {"stream": not json, "stream_options": {"include_usage": True}}
    record = ExchangeRecord(dialect=CASE.name, streamed=not json, http_status=200)
    summary = CASE.dialect.summarize(request, CASE.view)
    summary_into_record(record, summary)
    auditor = StreamAuditor(
        record, CASE.dialect.normalizer(summary), encoding, 1 << 20, event_stream=not json, max_record_bytes=cap
    )
    bounds = [0, *(cuts or []), len(data)]
    for a, b in zip(bounds, bounds[1:]):
        if b > a:
            assert auditor.feed(data[a:b]) == data[a:b]
    while auditor.drain():
        pass
    auditor.end(cut_by_upstream=outcome == OUTCOME_UPSTREAM_ABORTED)
    record.finish(outcome)
    return record, auditor


def detail(record: ExchangeRecord, code: str) -> str:
    (found,) = [f["detail"] for f in record.findings if f["code"] == code]
    return found


def test_a_stream_beyond_the_cap_keeps_what_fits_and_its_metadata() -> None:
    data = body("events=40&size=4096")  # 160 KiB of text, the cap 64 KiB
    record, _ = audit(data)
    assert record.status == "completed" and record.usage["output_tokens"] is not None
    assert record.choices[0].finish_reason == "stop"
    assert len(record.output_text.encode()) == CAP and record.content_bytes == 40 * 4096
    text = detail(record, "content_truncated")
    assert f"kept {CAP} of {40 * 4096} content bytes" in text
    assert f"{len(data)} bytes from the upstream, sha256 {hashlib.sha256(data).hexdigest()}" in text


def test_the_cap_cuts_on_a_character_boundary_and_counts_utf8_bytes() -> None:
    record = ExchangeRecord(content_limit=5)
    record.apply(TextDelta("aö"))  # 3 bytes
    record.apply(TextDelta("öö"))  # 4 bytes: one ö fits
    record.apply(TextDelta("x"))
    assert record.output_text == "aöö" and record.content_kept == 5 and record.content_bytes == 8


def test_tool_names_ids_and_arguments_count_against_the_cap() -> None:
    record, _ = audit(body("events=2&tool=get_weather&tools=3"), cap=1024 + 20)
    assert not record.content_truncated
    calls = list(record.tool_calls.values())
    tools = sum(len(c.id) + len(c.name) + len("".join(c.arguments).encode()) for c in calls)
    assert record.content_bytes == len(record.output_text.encode()) + tools
    # the text came first; then the first call's id and name, and 10 bytes of its arguments
    size = 2000 + len(calls[0].id) + len("get_weather") + 10
    small, _ = audit(body("events=2&size=1000&tool=get_weather&tools=3"), cap=size)
    assert small.content_truncated and small.content_kept == size
    first, *rest = small.tool_calls.values()
    assert (
        len(first.id) == len(calls[0].id) and first.name == "get_weather" and "".join(first.arguments) == '{"city":"V'
    )
    assert all(c.id is None and c.name is None and not c.arguments for c in rest)  # the cap was full


def limit_findings(record: ExchangeRecord) -> list[str]:
    return [f["detail"] for f in record.to_row()["findings"] if f["code"] == "record_limit"]


def test_choices_past_the_limit_are_counted_not_kept() -> None:
    record = ExchangeRecord()
    n = 3 * MAX_CHOICES
    for i in range(n):  # each event names a new choice, as a hostile upstream may
        record.apply(Finish("stop", choice=i))
        record.apply(TextDelta("x", choice=i))
        record.apply(TextSnapshot("y", choice=i, kind="reasoning"))
    assert len(record.choices) == MAX_CHOICES and sorted(record.choices) == list(range(MAX_CHOICES))
    row = record.to_row()
    assert len(row["output"]["choices"]) == MAX_CHOICES and len(row["finish_reasons"]) == MAX_CHOICES
    assert limit_findings(record) == [
        f"events of choices past the first {MAX_CHOICES} not kept: {3 * (n - MAX_CHOICES)}"
    ]
    assert record.content_kept == record.content_bytes == 2 * MAX_CHOICES  # what was left out is not content kept
    assert str(MAX_CHOICES) in CODES["record_limit"] and str(MAX_TOOL_CALLS) in CODES["record_limit"]


def test_answer_text_of_choice_zero_after_the_limit_is_left_out_too() -> None:
    record = ExchangeRecord()
    for i in range(1, MAX_CHOICES + 1):
        record.apply(Finish("stop", choice=i))
    record.add_text("late")  # the auditor's fast path for choice 0
    assert 0 not in record.choices and len(record.choices) == MAX_CHOICES and record.output_text == ""
    assert limit_findings(record) == [f"events of choices past the first {MAX_CHOICES} not kept: 1"]


def test_tool_calls_past_the_limit_are_counted_not_kept() -> None:
    record = ExchangeRecord()
    for i in range(MAX_TOOL_CALLS + 10):
        record.apply(ToolCallDelta(f"k{i}", "{}", id=f"id{i}", name="f"))
        record.apply(ToolCallDelta(f"k{i}", complete=True))
    assert len(record.tool_calls) == MAX_TOOL_CALLS
    row = record.to_row()
    assert len(row["tool_calls"]) == len(row["output"]["tool_calls"]) == MAX_TOOL_CALLS
    assert limit_findings(record) == [f"fragments of tool calls past the first {MAX_TOOL_CALLS} not kept: 20"]


def test_a_tool_calls_key_name_and_id_are_bounded() -> None:
    record = ExchangeRecord(content_limit=1000)
    long = "n" * 5000
    record.apply(ToolCallDelta("k" * 5000, "{}", id=long, name=long))
    record.apply(ToolCallDelta("k" * 5000 + "more", '"x"', name="other"))  # the same call: its key is cut alike
    (call,) = record.tool_calls.values()
    assert len(call.key) == MAX_TOOL_KEY and call.id == "n" * 1000 and call.name is None
    assert record.content_kept == 1000 and record.content_truncated


def test_a_long_stop_reason_is_cut_and_counted() -> None:
    record = ExchangeRecord()
    record.apply(Finish("s" * 100_000))
    record.apply(Finish("stop"))
    record.apply(Finish("t" * 100_000))
    assert record.choices[0].finish_reason == "t" * MAX_FINISH_REASON
    assert limit_findings(record) == [f"stop reasons cut to {MAX_FINISH_REASON} characters: 2"]


def test_a_findings_detail_is_bounded() -> None:
    record = ExchangeRecord()
    for _ in range(2 * FINDINGS_PER_CODE):
        record.add_finding("protobuf_unmapped", "x" * (10 * MAX_FINDING_DETAIL))
    findings = record.to_row()["findings"]
    assert len(findings) == FINDINGS_PER_CODE + 1
    assert all(len(f["detail"]) <= MAX_FINDING_DETAIL for f in findings)
    assert findings[-1]["detail"] == f"{FINDINGS_PER_CODE} more not listed"


# -- reader findings: taken into the record as they come, none held by the reader ---------------

BROKEN = 5000  # broken frames of each stream below, each a reader finding


def connect_auditor(gate: bool, data: bytes, code: str) -> tuple[StreamAuditor, bytes, str]:
    """A Connect stream of ``data``, each envelope of it a reader finding ``code``."""
    view = RequestView("POST", "/acme.ai.v1.ChatService/Generate", "", {"content-type": "application/connect+proto"})
    return reader_auditor(CONNECT, None, view, "application/connect+proto", gate), data, code


def compressed_envelopes(gate: bool) -> tuple[StreamAuditor, bytes, str]:
    """6-byte envelopes flagged compressed with no message encoding (a holding gate stops
    reading at the first: its text cannot be checked, so it is not tested with one)."""
    return connect_auditor(gate, envelope(1, b"x") * BROKEN, "envelope_decompress_failed")


def large_envelopes(gate: bool) -> tuple[StreamAuditor, bytes, str]:
    """Envelopes over the event limit (1024 bytes), each skipped."""
    return connect_auditor(gate, envelope(0, b"x" * 1100) * BROKEN, "envelope_too_large")


def sse_auditor(gate: bool) -> tuple[StreamAuditor, bytes, str]:
    """An OpenAI chat stream of lines over the event limit (1024 bytes)."""
    data = (b"data: " + b"x" * 1100 + b"\n\n") * BROKEN
    return reader_auditor(CASE.dialect, CASE.request, CASE.view, "text/event-stream", gate), data, "sse_line_too_long"


def reader_auditor(dialect: Dialect, request: Any, view: RequestView, content_type: str, gate: bool) -> StreamAuditor:
    """An auditor of a ``content_type`` response to ``request``, with an event limit of
    1024 bytes and, if ``gate``, output filters holding its text back."""
    record = ExchangeRecord(dialect=dialect.name, streamed=True, http_status=200)
    summary = dialect.summarize(request, view)
    summary_into_record(record, summary)
    normalizer = dialect.normalizer(summary)
    framing = select(content_type, 200, normalizer.framing)
    holding = None
    if gate:
        filters = FilterSet(BLOCK_RULES, failure="open")
        guard, forwarded = filters.output_guard(), dialect.normalizer(summary)
        holding = OutputGate(guard, forwarded, holds=True, split_raw=True, failure="open")
    return StreamAuditor(record, normalizer, None, 1024, framing=framing, gate=holding, headers=view.headers)


@pytest.mark.parametrize(
    "make,gate",
    [
        (compressed_envelopes, False),
        (large_envelopes, False),
        (large_envelopes, True),
        (sse_auditor, False),
        (sse_auditor, True),
    ],
)
def test_reader_findings_are_taken_into_the_record_not_kept_by_the_reader(
    make: Callable[[bool], tuple[StreamAuditor, bytes, str]], gate: bool
) -> None:
    auditor, data, code = make(gate)
    record = auditor.record
    for at in range(0, len(data), 6000):
        auditor.feed(data[at : at + 6000])
        assert len(auditor.reader.findings) == 0  # (it held every finding of the exchange's life)
    auditor.end()
    assert len(auditor.reader.findings) == 0
    found = [f["detail"] for f in record.to_row()["findings"] if f["code"] == code]
    assert len(found) == FINDINGS_PER_CODE + 1  # the record's cap, and all of them counted
    assert found[-1] == f"{BROKEN - FINDINGS_PER_CODE} more not listed"


def test_a_json_body_beyond_the_cap_passes_unread() -> None:
    data = body("events=4&size=40000&encoding=gzip", json=True)
    record, _ = audit(data, "gzip", json=True)
    assert record.status == "completed" and "body_too_large" in [f["code"] for f in record.findings]
    assert hashlib.sha256(data).hexdigest() in detail(record, "content_truncated")


def test_a_json_body_is_decoded_as_it_passes() -> None:
    data = body("events=4&encoding=br", json=True)
    record, _ = audit(data, "br", [len(data) // 3, len(data) // 2], json=True)
    assert record.status == "completed" and record.output_text == "tök0 tök1 tök2 tök3"
    assert not record.findings


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "zstd"])
def test_any_split_of_a_compressed_stream_gives_the_same_record(coding: str) -> None:
    data = body(f"events=300&size=300&encoding={coding}")
    whole, _ = audit(data, coding, cap=1 << 20)
    rnd = random.Random(coding)
    for _ in range(5):
        cuts = sorted(rnd.sample(range(1, len(data)), 30))
        record, _ = audit(data, coding, cuts, cap=1 << 20)
        assert record.to_row() | {"id": None, "ended_at": None, "first_chunk_at": None} == whole.to_row() | {
            "id": None,
            "ended_at": None,
            "first_chunk_at": None,
        }
    assert whole.status == "completed" and len(whole.output_text.encode()) == 300 * 300


@pytest.mark.parametrize("coding", ["gzip", "br", "zstd"])
def test_a_bomb_stops_inspection_at_the_budget(coding: str) -> None:
    data = body(f"events=3&encoding={coding}&bomb=64")
    record, auditor = audit(data, coding, [len(data) // 2])
    assert record.status == "completed" and auditor.halted
    text = detail(record, "inspection_stopped")
    assert "compression ratio over 100:1" in text and hashlib.sha256(data).hexdigest() in text
    assert auditor.decoder.decoded < 17 * 1024 * 1024  # the 16 MiB floor and a slice or so


def test_a_cut_bomb_is_upstream_aborted() -> None:
    data = body("events=3&encoding=zstd&bomb=64&truncate_after=3")
    record, _ = audit(data, "zstd", outcome=OUTCOME_UPSTREAM_ABORTED)
    assert record.status == "upstream_aborted" and detail(record, "inspection_stopped")


def test_a_feed_leaves_a_backlog_for_later_and_drain_works_it_off() -> None:
    encoder = Encoder("gzip")
    lines = b"".join(b'data: {"choices":[{"index":0,"delta":{"content":"x%d"}}]}\n\n' % i for i in range(200_000))
    data = encoder.write(lines) + encoder.end()
    record = ExchangeRecord(dialect=CASE.name, streamed=True, http_status=200)
    summary = CASE.dialect.summarize(CASE.request, CASE.view)
    auditor = StreamAuditor(record, CASE.dialect.normalizer(summary), "gzip", 1 << 20)
    auditor.feed(data)
    assert auditor.pending  # some 12 MB of events: more than one call's few milliseconds
    while auditor.drain():
        pass
    auditor.end()
    assert record.event_count == 200_000


@pytest.mark.parametrize("failure,status", [("closed", "blocked"), ("open", None)])
def test_with_a_holding_gate_a_bomb_follows_the_failure_policy(failure: str, status: str | None) -> None:
    data = body("events=3&encoding=gzip&bomb=64")
    sent, row, auditor = gated(CASE, data, [len(data) // 2], FilterSet(BLOCK_RULES, failure=failure), encoding="gzip")
    assert auditor.halted
    verdicts = [v["rule_id"] for v in row["verdicts"]]
    assert "filter_error" in verdicts
    if status == "blocked":
        assert row["status"] == "blocked" and b"".join(sent) != data
    else:
        assert row["status"] == "completed" and b"".join(sent) == data
