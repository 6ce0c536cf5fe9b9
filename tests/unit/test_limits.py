"""Limits per exchange, sans-IO: the record cap, the raw body's SHA-256, compressed
bodies read in slices with the same result for any split, bombs stopped by the decode
budget, and, with a gate that holds output, the filter failure policy deciding."""

from __future__ import annotations

import hashlib
import random

import pytest
from test_block_responses import CASES
from test_output_gate import BLOCK_RULES, gated

from addon.auditor import StreamAuditor, summary_into_record
from addon.filters.engine import FilterSet
from addon.record import OUTCOME_COMPLETE, OUTCOME_UPSTREAM_ABORTED, ExchangeRecord
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
    from addon.events import TextDelta

    record.apply(TextDelta("aö"))  # 3 bytes
    record.apply(TextDelta("öö"))  # 4 bytes: one ö fits
    record.apply(TextDelta("x"))
    assert record.output_text == "aöö" and record.content_kept == 5 and record.content_bytes == 8


def test_tool_arguments_count_against_the_cap() -> None:
    record, _ = audit(body("events=2&tool=get_weather&tools=3"), cap=1024 + 20)
    assert not record.content_truncated
    small, _ = audit(body("events=2&size=1000&tool=get_weather&tools=3"), cap=2010)
    assert small.content_truncated and small.content_kept == 2010
    assert len(small.output_text.encode()) == 2000  # the text came first; 10 bytes were left for the arguments
    assert "".join("".join(c.arguments) for c in small.tool_calls.values()) == '{"city":"V'


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
