"""The turn records of a long-lived stream and the tap reading its request body
(addon/turns.py), on plain bytes: every chunk passes unchanged, each client message
lands in the current turn's record, a turn's record is written when it ends, and the
next turn carries the stream's request side but none of the answer."""

from __future__ import annotations

from typing import Any

import pytest

from addon.dialects import RequestView
from addon.dialects.ollama import Ollama
from addon.events import Finding, TextDelta, TurnEnd
from addon.filters.api import Verdict
from addon.framing.envelope import connect_reader
from addon.framing.ndjson import reader as ndjson_reader
from addon.record import ExchangeRecord, Status
from addon.turns import RequestTap, Turns

VIEW = RequestView("POST", "/agent.v1.AgentService/Run", "", {})


class LineDialect(Ollama):
    """A dialect reading each streamed request line as one user message (for the tap)."""

    def parse_request_message(self, payload: bytes, request: RequestView) -> tuple[dict[str, Any], list[Finding]]:
        text = payload.decode()
        findings = [Finding("protobuf_unmapped", text)] if text.startswith("?") else []
        if text.startswith("!"):  # a message the dialect could not read whole
            findings = [Finding("protobuf_invalid", "truncated")]
        return {"model": "m-1", "messages": [{"role": "user", "content": text}]}, findings


def new_turns() -> tuple[Turns, list[dict[str, Any]]]:
    written: list[dict[str, Any]] = []
    first = ExchangeRecord(dialect="cursor", http_method="POST", url_path=VIEW.path, api_key_fingerprint="fp")
    return Turns(first, "conn-1", lambda record: written.append(record.to_row())), written


def test_request_tap_passes_every_chunk_and_reads_each_message_into_the_current_turn() -> None:
    turns, written = new_turns()
    tap = RequestTap(ndjson_reader(1 << 20, 1 << 20, {}), LineDialect(), VIEW, turns, 1 << 20)
    body = b"hello\n?odd\nsecond"
    out = [tap(body[i : i + 3]) for i in range(0, len(body), 3)] + [tap(b"")]
    assert b"".join(out) == body
    record = turns.record
    assert [m["content"] for m in record.request_body["messages"]] == ["hello", "?odd", "second"]
    assert record.request_model == "m-1"
    assert [f["code"] for f in record.findings] == ["protobuf_unmapped"]
    assert len(written) == 1 and written[0]["status"] == Status.IN_PROGRESS  # opened once, ahead


def test_a_turn_is_written_when_it_ends_and_the_next_carries_only_the_request_side() -> None:
    turns, written = new_turns()
    turns.open()
    first = turns.record
    first.request_model = "m-1"
    first.apply(TextDelta("first answer"))
    first.apply(TurnEnd())
    second = turns.end_turn(first)
    assert written[-1]["status"] == Status.COMPLETED and written[-1]["output_text"] == "first answer"
    assert (written[-1]["connection_id"], written[-1]["turn"]) == ("conn-1", 0)
    assert second is turns.record and second.id != first.id
    assert (second.connection_id, second.turn, second.request_model) == ("conn-1", 1, "m-1")
    assert second.api_key_fingerprint == "fp" and second.output_text == "" and second.request_body is None
    assert not turns.pending  # nothing of turn 1 arrived: no record yet
    turns.open()
    assert turns.pending and written[-1]["turn"] == 1 and written[-1]["status"] == Status.IN_PROGRESS


def test_only_an_open_turn_can_be_idle() -> None:
    turns, _ = new_turns()
    assert turns.idle_for(turns.last_activity + 100) == 0.0
    turns.open()
    # last_activity is a monotonic clock reading: adding and subtracting 100 rounds.
    assert turns.idle_for(turns.last_activity + 100) == pytest.approx(100)


def checked_tap(fail_open: bool = True, limit: int = 1 << 20) -> tuple[RequestTap, list[Verdict]]:
    turns, _ = new_turns()
    blocks: list[Verdict] = []

    def check(record: ExchangeRecord, doc: dict[str, Any]) -> Verdict | None:
        text = doc["messages"][0]["content"]
        return Verdict("block", "no-secrets", "a secret", location="request") if "SECRET" in text else None

    tap = RequestTap(ndjson_reader(limit, 1 << 20, {}), LineDialect(), VIEW, turns, 1 << 20, check, blocks.append)
    tap.fail_open = fail_open
    return tap, blocks


@pytest.mark.parametrize("step", [1, 2, 5, 100])
def test_with_filters_each_message_is_held_until_checked_and_a_blocked_one_never_goes(step: int) -> None:
    tap, blocks = checked_tap()
    body = b"first\nsecond\nthe SECRET is\nafter\n"
    out = b"".join(
        b"".join(r) if isinstance(r, list) else r for r in (tap(body[i : i + step]) for i in range(0, len(body), step))
    )
    assert out == b"first\nsecond\n"
    assert [v.rule_id for v in blocks] == ["no-secrets"] and tap.blocked
    assert tap(b"more\n") == [] and tap(b"") == []


def test_with_filters_a_clean_body_passes_whole_by_its_end() -> None:
    tap, blocks = checked_tap()
    assert tap(b"one\ntw") == b"one\n"
    assert tap(b"o") == []
    assert tap(b"") == b"two"  # the body ended: what is left goes (the reader reads it as a message)
    assert blocks == []


@pytest.mark.parametrize("fail_open", [True, False])
def test_a_message_too_large_to_check_follows_the_failure_policy(fail_open: bool) -> None:
    tap, blocks = checked_tap(fail_open, limit=1024)
    out = tap(b"x" * 2000)
    if fail_open:
        assert out == b"x" * 2000 and blocks == [] and tap(b"SECRET\n") == b"SECRET\n"
    else:
        assert out == [] and [v.rule_id for v in blocks] == ["filter_error"]


def test_once_the_stream_is_recorded_a_late_client_message_opens_no_record() -> None:
    turns, written = new_turns()
    turns.open()
    turns.end_turn(turns.record)
    turns.close()
    tap = RequestTap(ndjson_reader(1 << 20, 1 << 20, {}), LineDialect(), VIEW, turns, 1 << 20)
    assert tap(b"late\n") == b"late\n"
    assert [row["status"] for row in written] == [Status.IN_PROGRESS, Status.UPSTREAM_ABORTED]


@pytest.mark.parametrize("fail_open", [True, False])
def test_a_message_the_dialect_cannot_read_whole_follows_the_failure_policy(fail_open: bool) -> None:
    tap, blocks = checked_tap(fail_open)
    out = tap(b"fine\n!cut short\nlater\n")
    if fail_open:  # it passes unchecked, and the messages after it are checked again
        assert out == b"fine\n!cut short\nlater\n" and blocks == []
        assert tap(b"a SECRET\n") == [] and [v.rule_id for v in blocks] == ["no-secrets"]
    else:
        assert out == b"fine\n" and [v.rule_id for v in blocks] == ["filter_error"]


def test_an_empty_message_is_a_keep_alive_not_read_by_the_dialect() -> None:
    turns, written = new_turns()
    tap = RequestTap(connect_reader(1 << 20, 1 << 20, {}), LineDialect(), VIEW, turns, 1 << 20)
    keep_alives = b"\x00\x00\x00\x00\x00" * 3
    assert tap(keep_alives) == keep_alives
    assert turns.record.request_body is None and written == []


def test_end_markers_of_turns_that_never_began_write_nothing() -> None:
    turns, written = new_turns()
    turns.open()
    turns.end_turn(turns.record)
    for _ in range(1000):  # an upstream flooding bare turn_ended markers
        turns.record.apply(TurnEnd())
        turns.end_turn(turns.record)
    assert len(written) == 2 and turns.record.turn == 1 and not turns.record.terminal_seen


class BrokenDialect(LineDialect):
    def parse_request_message(self, payload: bytes, request: RequestView) -> tuple[dict[str, Any], list[Finding]]:
        raise ValueError("our bug")


@pytest.mark.parametrize("fail_open", [True, False])
def test_an_audit_failure_on_a_streamed_request_is_a_finding_and_follows_the_policy(fail_open: bool) -> None:
    turns, _ = new_turns()
    blocks: list[Verdict] = []
    tap = RequestTap(
        ndjson_reader(1 << 20, 1 << 20, {}),
        BrokenDialect(),
        VIEW,
        turns,
        1 << 20,
        lambda record, doc: None,
        blocks.append,
        fail_open,
    )
    out = tap(b"hello\n")
    assert [f["code"] for f in turns.record.findings] == ["audit_internal_error"]
    assert (out, [v.rule_id for v in blocks]) == ((b"hello\n", []) if fail_open else ([], ["filter_error"]))
