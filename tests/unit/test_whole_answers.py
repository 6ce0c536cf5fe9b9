"""A whole answer (a JSON body) read ahead, as the proxy reads a costly one off the event loop.

The proxy reads a whole body past 64 KiB (or compressed) in its reader thread
(:meth:`~addon.auditor.StreamAuditor.read_whole`) and settles it on the loop
(:meth:`~addon.auditor.StreamAuditor.end`). These tests prove that changes nothing: for
every dialect with a JSON answer, clean or carrying a blocked word cut across its text,
with no filters, with blocking rules, with rules that only flag, and held whole or passed
as it came, the record and the gate's decision are the same as when the body is read at
its end. User filters are asked only in ``end`` (on the loop), never in the reader.
"""

from __future__ import annotations

import gzip
from typing import Any

import orjson
import pytest
from test_block_responses import CASES, Case
from test_output_gate import BLOCK_RULES, FLAG_RULES, WORD

from addon.auditor import StreamAuditor, summary_into_record
from addon.filters.api import BaseFilter, OutputPiece, Verdict
from addon.filters.engine import FilterSet
from addon.framing import select
from addon.mitm.flow_state import OutputCheck
from addon.mitm.tap import output_gate
from addon.record import OUTCOME_COMPLETE, ExchangeRecord
from mockllm.scenario import Scenario
from mockllm.streams import (
    anthropic_message,
    gemini_response,
    openai_chat_completion,
    openai_completion,
    openai_response,
)

WHOLE = {
    "openai-chat": openai_chat_completion,
    "openai-completions": openai_completion,
    "openai-responses": openai_response,
    "anthropic-messages": anthropic_message,
    "gemini": gemini_response,
}
CLEAN = "events=12&blocks=3&text=The+weather+is+fine+today+in+the+north"
DIRTY = f"events=12&blocks=3&text=Ask+about+the+{WORD}+plan+and+more+text+after+it"  # the word cut across pieces
FILTERS = {
    "none": None,
    "blocking": FilterSet(BLOCK_RULES, failure="closed"),
    "flagging": FilterSet(FLAG_RULES, failure="closed"),
}


def answer(case: Case, scenario: str) -> bytes:
    request = case.request | {"stream": False}
    return orjson.dumps(WHOLE[case.name](request, Scenario.parse(scenario)))


def auditor_for(
    case: Case, filters: FilterSet | None, encoding: str | None = None, cap: int = 1 << 20
) -> StreamAuditor:
    """The proxy's auditor for a whole answer, with the proxy's gate (``tap.output_gate``:
    a whole body's holds nothing itself; mitmproxy holds it when filters may block)."""
    record = ExchangeRecord(dialect=case.name, streamed=False, http_status=200)
    summary = case.dialect.summarize(case.request | {"stream": False}, case.view)
    summary_into_record(record, summary)
    normalizer = case.dialect.normalizer(summary)
    framing = select("application/json", 200, normalizer.framing)
    check = OutputCheck(filters, case.dialect, summary, case.view) if filters is not None else None
    gate = output_gate(check, framing.streamed, encoding)
    return StreamAuditor(record, normalizer, encoding, 1 << 20, gate=gate, framing=framing, max_record_bytes=cap)


def is_held(auditor: StreamAuditor) -> bool:
    """Whether the proxy holds the body whole (``HeldWhole``): filters that may block."""
    return auditor.gate is not None and auditor.gate.guard.may_block


def settled(auditor: StreamAuditor, body: bytes, ahead: bool) -> dict[str, Any]:
    """Feed the body as the proxy does (held: whole at the end; else as it came), read it
    ahead or at its end, and settle: what the record and the gate say."""
    held = is_held(auditor)
    if not held:
        auditor.feed(body)
    if ahead:
        auditor.read_whole(body if held else None)
    elif held:
        auditor.feed(body)
    auditor.end()
    assert auditor.record is not None
    auditor.record.finish(OUTCOME_COMPLETE)
    row = auditor.record.to_row()
    for key in ("id", "started_at", "ended_at", "first_chunk_at"):
        row.pop(key)
    blocked = auditor.gate.blocked if auditor.gate is not None else None
    return {"row": row, "stopped": auditor.stopped, "blocked": blocked and (blocked.rule_id, blocked.location)}


@pytest.mark.parametrize("filters", FILTERS)
@pytest.mark.parametrize("scenario", [CLEAN, DIRTY], ids=["clean", "dirty"])
@pytest.mark.parametrize("name", WHOLE)
def test_a_whole_answer_read_ahead_is_recorded_and_checked_as_one_read_at_its_end(name, scenario, filters) -> None:
    case = CASES[name]
    body = answer(case, scenario)
    at_end = settled(auditor_for(case, FILTERS[filters]), body, ahead=False)
    assert settled(auditor_for(case, FILTERS[filters]), body, ahead=True) == at_end
    if filters == "blocking":
        assert (at_end["blocked"] is not None) == (scenario == DIRTY) == at_end["stopped"]
        if scenario == DIRTY:
            assert at_end["row"]["status"] == "blocked"
    elif filters == "flagging" and scenario == DIRTY:
        assert [v["rule_id"] for v in at_end["row"]["verdicts"]], "the word is flagged"


def test_a_compressed_answer_is_decoded_in_the_reading_ahead() -> None:
    case = CASES["anthropic-messages"]
    body = answer(case, DIRTY)
    auditor = auditor_for(case, None, encoding="gzip")
    auditor.feed(gzip.compress(body))
    auditor.read_whole()
    assert auditor.record is not None and WORD in (auditor.record.output_text or "")
    auditor.end()
    assert not auditor.pending


@pytest.mark.parametrize("word_at", range(1, len(WORD)))
def test_a_word_cut_across_text_blocks_of_a_whole_answer_is_blocked(word_at: int) -> None:
    """The gate checks a whole answer's consecutive text as one piece: the word is seen
    however the blocks cut it."""
    case = CASES["anthropic-messages"]
    message = orjson.loads(answer(case, CLEAN))
    pieces = ["about the ", WORD[:word_at], WORD[word_at:], " plan"]
    message["content"] = [{"type": "text", "text": piece} for piece in pieces]
    outcome = settled(auditor_for(case, FILTERS["blocking"]), orjson.dumps(message), ahead=True)
    assert outcome["stopped"] and outcome["row"]["status"] == "blocked"


class Asked(BaseFilter):
    """A user filter that counts its calls."""

    name = "asked"

    def __init__(self) -> None:
        self.calls = 0

    def check_output(self, piece: OutputPiece) -> Verdict | None:
        self.calls += 1
        return None


@pytest.mark.parametrize("rules", [BLOCK_RULES, FLAG_RULES], ids=["blocking", "flagging"])
def test_user_filters_are_asked_when_the_answer_settles_not_in_the_reading_ahead(rules) -> None:
    """User filters run only on the event loop: the reading ahead, in the reader thread,
    leaves the check to ``end`` when there is one to ask."""
    case = CASES["anthropic-messages"]
    asked = Asked()
    filters = FilterSet(rules, [asked], failure="closed")
    body = answer(case, CLEAN)
    auditor = auditor_for(case, filters)
    held = is_held(auditor)
    if not held:
        auditor.feed(body)
    auditor.read_whole(body if held else None)
    assert asked.calls == 0 and auditor.record is not None and auditor.record.output_text
    auditor.end()
    assert asked.calls > 0


@pytest.mark.parametrize("failure", ["closed", "open"])
@pytest.mark.parametrize("ahead", [False, True], ids=["at_end", "ahead"])
def test_a_held_answer_over_the_record_cap_is_the_failure_policy_s(failure, ahead) -> None:
    """Over the record cap a whole answer is not read, so not checked: it went to the
    client unchecked, a word past the cap and all. Now the failure policy decides:
    ``closed`` blocks it (verdict ``filter_error``), ``open`` lets it go with the verdict."""
    case = CASES["anthropic-messages"]
    message = orjson.loads(answer(case, CLEAN))
    message["content"][0]["text"] = "x" * 5000 + f" the {WORD} plan"
    filters = FilterSet(BLOCK_RULES, failure=failure)
    outcome = settled(auditor_for(case, filters, cap=4096), orjson.dumps(message), ahead=ahead)
    row = outcome["row"]
    assert [v["rule_id"] for v in row["verdicts"]] == ["filter_error"]
    assert "body_too_large" in [f["code"] for f in row["findings"]]
    if failure == "closed":
        assert outcome["stopped"] and row["status"] == "blocked"
    else:
        assert not outcome["stopped"] and row["status"] == "completed"


class Pieces(BaseFilter):
    """A user filter that keeps the pieces it is handed."""

    name = "pieces"

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.finals = 0

    def check_output(self, piece: OutputPiece) -> Verdict | None:
        self.texts.append(piece.text)
        self.finals += piece.final
        return None


def test_a_user_filter_is_handed_a_long_answer_in_pieces_of_bounded_size() -> None:
    """A whole answer's text is checked a run at a time, not a block at a time; a run is
    at most about BODY_PIECE characters, since a user filter's time budget is per call."""
    from addon.output_gate import BODY_PIECE

    case = CASES["anthropic-messages"]
    message = orjson.loads(answer(case, CLEAN))
    message["content"] = [{"type": "text", "text": "ab "}] * 60_000
    pieces = Pieces()
    filters = FilterSet(BLOCK_RULES, [pieces], failure="closed")
    outcome = settled(auditor_for(case, filters, cap=32 << 20), orjson.dumps(message), ahead=True)
    assert outcome["row"]["status"] == "completed", outcome["row"]["verdicts"]
    assert "".join(pieces.texts) == "ab " * 60_000
    assert 2 < len(pieces.texts) < 60_000 and max(map(len, pieces.texts)) <= BODY_PIECE + 3
    assert pieces.finals == 1  # (the end of the text, once: it was twice)
