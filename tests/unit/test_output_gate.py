"""The output gate: a stream's bytes held back until the filters pass their text.

For every dialect, streams made by the mock upstream's own generators are fed through
the auditor with a gate, split in many ways (every single cut for llm-stream, byte at a
time and random cuts for all):

- a clean stream reaches the client byte for byte;
- a stream with a blocked word (cut across several events) never shows any character
  of it to the client, whatever the chunking; the client gets the upstream's bytes up to
  an event boundary followed by the dialect's termination, which our own pipeline reads
  back as a well-formed filtered stream;
- flag-only rules change nothing on the wire, not even the chunking.
"""

from __future__ import annotations

import copy
import gzip
import itertools
import random
import re
import zlib
from typing import Any

import orjson
import pytest
from test_block_responses import CASES, Case, Reader, codes, sse_events

from addon import auditor as auditor_module
from addon.auditor import StreamAuditor, summary_into_record
from addon.dialects.ollama import OllamaNormalizer
from addon.dialects.openai_chat import OpenAIChatNormalizer
from addon.events import StreamEnd, TextDelta, TurnEnd
from addon.filters.api import BaseFilter, OutputPiece, Verdict
from addon.filters.engine import FILTER_ERROR, FilterSet
from addon.filters.rules import parse_rules
from addon.framing import select
from addon.framing.sse import SSEParser, SSEReader
from addon.output_gate import BODY_PIECE, OutputGate
from addon.record import OUTCOME_COMPLETE, ExchangeRecord
from addon.turns import Turns
from mockllm.scenario import Scenario

WORD = "Nightjar"
BLOCK_RULES = parse_rules(f"""
[[rule]]
id = "no-code-name"
kind = "keywords"
keywords = ["{WORD}"]
scope = "response"
action = "block"
reason = "internal code name"

[[rule]]
id = "no-vienna-calls"
kind = "keywords"
keywords = ["Vienna"]
scope = "response"
action = "block"
""")
FLAG_RULES = parse_rules(f"""
[[rule]]
id = "code-name-seen"
kind = "keywords"
keywords = ["{WORD}"]
scope = "response"
action = "flag"
""")
CLEAN = Scenario.parse("events=12&text=The+weather+is+fine+today+in+the+north")
DIRTY = Scenario.parse(f"events=12&text=Ask+about+the+{WORD}+plan+and+more+text+after+it")
TOOL = Scenario.parse("events=4&tool=get_weather")  # arguments {"city":"Vienna"}


def body_of(case: Case, scenario: Scenario) -> bytes:
    return b"".join(case.stream(case.request, scenario))


def gated(
    case: Case,
    body: bytes,
    cuts: list[int],
    filters: FilterSet,
    *,
    encoding: str | None = None,
    max_event_bytes: int = 1 << 20,
) -> tuple[list[bytes], dict[str, Any], StreamAuditor]:
    """Feed ``body`` cut at ``cuts`` through an auditor with a gate: (what the client got
    per call, the record's row, the auditor)."""
    record = ExchangeRecord(dialect=case.name, streamed=True, http_status=200)
    summary = case.dialect.summarize(case.request, case.view)
    summary_into_record(record, summary)
    gate = OutputGate(
        filters.output_guard(),
        case.dialect.normalizer(summary),
        holds=filters.may_block_output,
        split_raw=encoding is None,
        failure=filters.failure,
    )
    auditor = StreamAuditor(record, case.dialect.normalizer(summary), encoding, max_event_bytes, gate=gate)
    bounds = [0, *cuts, len(body)]
    sent = [auditor.feed(body[a:b]) for a, b in zip(bounds, bounds[1:]) if b > a and not auditor.stopped]
    sent.append(auditor.finish())
    auditor.end()
    record.finish(OUTCOME_COMPLETE)
    return sent, record.to_row(), auditor


def client_text(case: Case, received: bytes) -> str:
    """The answer text a client reading ``received`` sees (our pipeline as the client)."""
    return Reader(case).feed(received).row()["output_text"] or ""


def every_cut(body: bytes) -> list[list[int]]:
    return [[i] for i in range(1, len(body))]


def some_cuts(body: bytes, seed: int, n: int = 25) -> list[list[int]]:
    rnd = random.Random(seed)
    return [sorted(rnd.sample(range(1, len(body)), rnd.randint(1, 40))) for _ in range(n)]


def byte_at_a_time(body: bytes) -> list[int]:
    return list(range(1, len(body)))


BLOCKING = FilterSet(BLOCK_RULES, failure="closed")


@pytest.mark.parametrize("name", CASES)
def test_a_clean_stream_reaches_the_client_byte_for_byte(name: str) -> None:
    case = CASES[name]
    body = body_of(case, CLEAN)
    splits = [[], byte_at_a_time(body), *some_cuts(body, 1)]
    if name == "llm-stream":
        splits += every_cut(body)
    for cuts in splits:
        sent, row, _ = gated(case, body, cuts, BLOCKING)
        assert b"".join(sent) == body
        assert (row["status"], row["verdicts"], row["delivered_text"]) == ("completed", [], None)
        assert row["bytes_to_client"] == row["bytes_from_upstream"] == len(body)


@pytest.mark.parametrize("name", CASES)
def test_a_blocked_word_cut_across_events_never_reaches_the_client(name: str) -> None:
    case = CASES[name]
    body = body_of(case, DIRTY)
    full = Reader(case).feed(body).row()["output_text"]
    assert WORD in full and not any(WORD in e.data for e in sse_events(body) if "delta" in e.data)
    splits = [[], byte_at_a_time(body), *some_cuts(body, 2)]
    if name == "llm-stream":
        splits += every_cut(body)
    for cuts in splits:
        sent, row, auditor = gated(case, body, cuts, BLOCKING)
        received = b"".join(sent)
        termination = auditor.gate.termination()  # (a response id the proxy makes up is new each time)
        assert body.startswith(received[: len(received) - len(termination)])
        shown = client_text(case, received)
        assert full.startswith(shown) and len(shown) <= full.index(WORD), f"leaked {shown!r} with cuts {cuts}"
        assert (row["status"], row["error_code"]) == ("blocked", "content_filtered")
        assert [(v["action"], v["rule_id"], v["position"]) for v in row["verdicts"]] == [
            ("block", "no-code-name", full.index(WORD))
        ]
        assert row["delivered_text"] == shown and row["output_text"].startswith(shown)
        assert row["bytes_to_client"] == len(received) and codes(row) == []


def lenient(body: bytes, value: bytes) -> bytes:
    """Each event's JSON object with one more member only lenient readers take (the SDKs' do)."""
    return re.sub(rb"\}(\r?\n\r?\n)", lambda m: b',"zz":' + value + b"}" + m.group(1), body)


@pytest.mark.parametrize("value", [b"NaN", b"1e400", b'"\\ud800"'])
@pytest.mark.parametrize("name", CASES)
def test_events_only_lenient_readers_take_are_read_and_checked_as_the_sdks_read_them(name: str, value: bytes) -> None:
    """orjson refuses them, the openai and anthropic SDKs' ``json.loads`` does not (nor
    JavaScript's ``JSON.parse`` a lone surrogate): skipped as unreadable, their text went
    to the client past every filter."""
    case = CASES[name]
    body = lenient(body_of(case, DIRTY), value)
    assert WORD in client_text(case, body)
    for cuts in [[], byte_at_a_time(body)]:
        sent, row, _ = gated(case, body, cuts, BLOCKING)
        assert WORD not in client_text(case, b"".join(sent))
        assert (row["status"], row["error_code"]) == ("blocked", "content_filtered")
        assert "lenient_json" in codes(row)


@pytest.mark.parametrize("name", CASES)
def test_what_the_client_gets_is_a_well_formed_filtered_stream(name: str) -> None:
    case = CASES[name]
    sent, _, _ = gated(case, body_of(case, DIRTY), [], BLOCKING)
    client = Reader(case).feed(b"".join(sent)).row()
    assert codes(client) == []
    assert client["status"] in {"failed", "completed"}
    assert client["error_code"] is not None or set(client["finish_reasons"]) & {"content_filter", "SAFETY", "refusal"}


def test_llm_stream_seq_continues_from_the_last_event_the_client_got() -> None:
    sent, _, _ = gated(
        CASES["llm-stream"],
        body_of(CASES["llm-stream"], DIRTY),
        byte_at_a_time(body_of(CASES["llm-stream"], DIRTY)),
        BLOCKING,
    )
    data = [orjson.loads(e.data) for e in sse_events(b"".join(sent))]
    assert [d["seq"] for d in data] == list(range(len(data)))
    assert [d["type"] for d in data[-3:]] == ["content.stop", "error", "stream.end"]
    assert (data[-3]["stop_reason"], data[-2]["code"]) == ("content_filter", "content_filtered")


@pytest.mark.parametrize("escaped", [False, True])
@pytest.mark.parametrize("name", ["llm-stream", "openai-chat", "openai-responses", "anthropic-messages", "lmsp"])
def test_a_blocked_tool_call_argument_is_cut_before_the_client_sees_it(name: str, escaped: bool) -> None:
    """``escaped``: the arguments spell the word with a JSON escape (``\\u0056ienna``),
    which the tool reads as the word: checked as the tool reads them."""
    case = CASES[name]
    body = body_of(case, TOOL)
    if escaped:  # (the only capital V is the word's; its backslash escaped in the event's JSON string)
        body = body.replace(b"V", b"\\\\u0056")
    for cuts in [[], byte_at_a_time(body)]:
        sent, row, _ = gated(case, body, cuts, BLOCKING)
        received = b"".join(sent)
        assert b"Vienna" not in received and b"Vien" not in received
        assert [v["rule_id"] for v in row["verdicts"]] == ["no-vienna-calls"]
        assert row["verdicts"][0]["location"].startswith("output.tool_calls[")
        assert codes(row) == []  # the cut call is the proxy's doing, not a truncation by upstream


def _sse(*objs: dict[str, Any], named: bool = False, crlf: bool = False) -> list[bytes]:
    """One SSE event per object (``event:`` its type when ``named``)."""
    end = "\r\n\r\n" if crlf else "\n\n"
    head = (lambda o: f"event: {o['type']}\n") if named else (lambda o: "")
    return [f"{head(o)}data: {orjson.dumps(o).decode()}{end}".encode() for o in objs]


def _chat(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _anthropic(*middle: dict[str, Any]) -> list[bytes]:
    start = {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "m",
            "content": [],
            "usage": {"input_tokens": 1, "output_tokens": 1},
        },
    }
    return _sse(start, *middle, named=True)


def _block(index: int, text: str, kind: str = "text") -> list[dict[str, Any]]:
    return [
        {"type": "content_block_start", "index": index, "content_block": {"type": kind, kind: ""}},
        {"type": "content_block_delta", "index": index, "delta": {"type": f"{kind}_delta", kind: text}},
        {"type": "content_block_stop", "index": index},
    ]


def _gemini(text: str) -> dict[str, Any]:
    return {
        "candidates": [{"content": {"role": "model", "parts": [{"text": text}]}, "finishReason": "STOP", "index": 0}]
    }


# A word cut across an end the gate might take for the end of its text, which the
# clients join across: each SDK concatenates a choice's deltas after a finish_reason,
# Anthropic's get_final_text joins the text blocks and the SDK reads on after message_stop,
# Gemini's chunks are each shown and joined.
ACROSS_ENDS = {
    "openai-chat, a finish_reason between": (
        "openai-chat",
        _sse(
            _chat({"role": "assistant", "content": "the Nigh"}),
            _chat({}, "stop"),
            _chat({"content": "tjar plan"}),
            _chat({}, "stop"),
        )
        + [b"data: [DONE]\n\n"],
    ),
    "anthropic, two text blocks": (
        "anthropic-messages",
        _anthropic(*_block(0, "the Nigh"), *_block(1, "tjar plan"), {"type": "message_stop"}),
    ),
    "anthropic, after message_stop": (
        "anthropic-messages",
        _anthropic(*_block(0, "the Nigh")[:2], {"type": "message_stop"}, _block(0, "tjar plan")[1]),
    ),
    "anthropic, a tool call between": (
        "anthropic-messages",
        _anthropic(
            *_block(0, "the Nigh"),
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {"type": "tool_use", "id": "t", "name": "f", "input": {}},
            },
            {"type": "content_block_stop", "index": 1},
            *_block(2, "tjar plan"),
            {"type": "message_stop"},
        ),
    ),
    "gemini, a finishReason between": ("gemini", _sse(_gemini("the Nigh"), _gemini("tjar plan"), crlf=True)),
}


@pytest.mark.parametrize("label", ACROSS_ENDS)
def test_a_word_cut_across_the_end_of_a_block_a_choice_or_the_stream_is_still_one_word(label: str) -> None:
    name, events = ACROSS_ENDS[label]
    case, body = CASES[name], b"".join(events)
    assert WORD in client_text(case, body)  # (our reader joins them, as the SDKs do)
    for cuts in [[], list(itertools.accumulate(map(len, events[:-1]))), byte_at_a_time(body)]:
        sent, row, _ = gated(case, body, cuts, BLOCKING)
        assert WORD not in client_text(case, b"".join(sent)) and row["status"] == "blocked"


@pytest.mark.parametrize("after", ["tool call", "answer after the reasoning"])
def test_what_a_stream_holds_goes_when_another_streams_text_comes(after: str) -> None:
    """What could still become a match at the end of a block is not held while another
    stream is written (held, it kept every later event, a whole tool call or the whole
    answer, until the end of the body); the stream is still read as one text (a word
    cut across the other stream's text is blocked: ACROSS_ENDS)."""
    case = CASES["anthropic-messages"]
    if after == "tool call":
        first = _block(0, "see the Nigh")
        then = [
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {"type": "tool_use", "id": "t", "name": "f", "input": {}},
            },
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": '{"a": 1}'},
            },
            {"type": "content_block_stop", "index": 1},
        ]
    else:
        first, then = _block(0, "I think of the Nigh", "thinking"), _block(1, "The answer is here.")
    events = _anthropic(*first, *then, {"type": "message_stop"})
    body = b"".join(events)
    sent, row, _ = gated(case, body, list(itertools.accumulate(map(len, events[:-1]))), BLOCKING)
    assert b"".join(sent) == body and row["status"] == "completed"
    assert b"".join(sent[:-2]) == b"".join(
        events[:-1]
    )  # (each event as it came: sent[-2] is message_stop's, sent[-1] the end's)


def test_a_keyword_that_ends_a_stream_s_text_is_blocked_when_another_stream_comes() -> None:
    """A keyword at the very end of a text waits for the next character to show it is a
    whole word; when another stream's text comes instead (a tool call, a suggestion), the
    break is checked as an end before what was held goes (released unchecked, the word
    reached Copilot's ChatHub client: e2e test_a_chathub_answer_cut_ends_as_a_filtered_turn)."""
    tool = {
        "type": "content_block_start",
        "index": 1,
        "content_block": {"type": "tool_use", "id": "t", "name": "f", "input": {}},
    }
    events = _anthropic(
        *_block(0, f"the code is {WORD}"), tool, {"type": "content_block_stop", "index": 1}, {"type": "message_stop"}
    )
    body = b"".join(events)
    for cuts in [[], list(itertools.accumulate(map(len, events[:-1]))), byte_at_a_time(body)]:
        sent, row, _ = gated(CASES["anthropic-messages"], body, cuts, BLOCKING)
        assert WORD not in client_text(CASES["anthropic-messages"], b"".join(sent)) and row["status"] == "blocked"


def _responses_delta(n: int, item: str, text: str) -> dict[str, Any]:
    return {
        "type": "response.output_text.delta",
        "sequence_number": n,
        "item_id": item,
        "output_index": int(item == "b"),
        "content_index": 0,
        "delta": text,
    }


def _responses_item(n: int, item: str, done: bool = False) -> dict[str, Any]:
    kind = "response.output_item.done" if done else "response.output_item.added"
    return {
        "type": kind,
        "sequence_number": n,
        "output_index": int(item == "b"),
        "item": {"id": item, "type": "message", "role": "assistant", "content": []},
    }


# Text of one kind for two blocks open at once: each client puts each block together on
# its own (the word is whole in block 0), the filters read it in arrival order.
INTERLEAVED = {
    "anthropic blocks": (
        "anthropic-messages",
        _anthropic(
            _block(0, "")[0],
            _block(1, "")[0],
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "the Nigh"}},
            {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "x"}},
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "tjar plan"}},
            _block(0, "")[2],
            _block(1, "")[2],
            {"type": "message_stop"},
        ),
    ),
    "responses items": (
        "openai-responses",
        _sse(
            {
                "type": "response.created",
                "sequence_number": 0,
                "response": {"id": "r", "object": "response", "status": "in_progress", "model": "m", "output": []},
            },
            _responses_item(1, "a"),
            _responses_item(2, "b"),
            _responses_delta(3, "a", "the Nigh"),
            _responses_delta(4, "b", "x"),
            _responses_delta(5, "a", "tjar plan"),
            named=True,
        ),
    ),
    "chat reasoning fields": (
        "openai-chat",
        _sse(
            _chat({"role": "assistant", "reasoning_content": "the Nigh", "reasoning": "a"}),
            _chat({"reasoning_content": "tjar plan", "reasoning": "b"}),
            _chat({"content": "ok"}, "stop"),
        )
        + [b"data: [DONE]\n\n"],
    ),
}


@pytest.mark.parametrize("failure", ["closed", "open"])
@pytest.mark.parametrize("label", INTERLEAVED)
def test_text_of_two_open_blocks_interleaved_follows_the_failure_policy(label: str, failure: str) -> None:
    name, events = INTERLEAVED[label]
    case, body = CASES[name], b"".join(events)
    for cuts in [[], list(itertools.accumulate(map(len, events[:-1])))]:
        sent, row, _ = gated(case, body, cuts, FilterSet(BLOCK_RULES, failure=failure))
        received = b"".join(sent)
        assert (row["status"] == "blocked") == (failure == "closed") and "text_interleaved" in codes(row)
        assert (b"tjar plan" in received) == (failure == "open")
        assert [(v["action"], v["rule_id"]) for v in row["verdicts"]][:1] == [
            ("block" if failure == "closed" else "flag", "filter_error")
        ]


def test_blocks_one_after_another_are_not_interleaved() -> None:
    """Sequential blocks (and items whose parts end only with the item) are the normal case."""
    events = _sse(
        _responses_item(1, "a"),
        _responses_delta(2, "a", "one "),
        _responses_item(3, "a", done=True),
        _responses_item(4, "b"),
        _responses_delta(5, "b", "two"),
        _responses_item(6, "b", done=True),
        named=True,
    )
    _, row, _ = gated(CASES["openai-responses"], b"".join(events), [], BLOCKING)
    assert "text_interleaved" not in codes(row) and row["verdicts"] == []
    _, row, _ = gated(
        CASES["anthropic-messages"], b"".join(_anthropic(*_block(0, "one "), *_block(1, "two"))), [], BLOCKING
    )
    assert "text_interleaved" not in codes(row) and row["verdicts"] == []


@pytest.mark.parametrize("rules", [BLOCK_RULES, FLAG_RULES])
def test_more_text_streams_than_the_guard_checks_follow_the_failure_policy(rules) -> None:
    """Each choice (and tool call) is a stream with its own scanner, and the upstream names
    them: past MAX_STREAMS the policy decides (closed: blocked), or a gate that only flags
    says once that the rest went unchecked; memory stays bounded either way."""
    from addon.filters.engine import MAX_STREAMS

    events = _sse(
        *(
            _chat({"content": "x"}) | {"choices": [{"index": i, "delta": {"content": "x"}}]}
            for i in range(MAX_STREAMS + 50)
        )
    )
    sent, row, auditor = gated(CASES["openai-chat"], b"".join(events), [], FilterSet(rules, failure="closed"))
    assert (row["status"] == "blocked") == (rules is BLOCK_RULES) and "record_limit" in codes(row)
    assert [v["rule_id"] for v in row["verdicts"]] == ["filter_error"]
    assert len(auditor.gate.guard._streams) == MAX_STREAMS


def _gunzip_members(data: bytes) -> bytes:
    """What a client decodes of a body of gzip members, as far as it came."""
    out = b""
    while data:
        d = zlib.decompressobj(zlib.MAX_WBITS | 16)
        out += d.decompress(data)
        if not d.eof:
            break
        data = d.unused_data
    return out


@pytest.mark.parametrize("failure", ["closed", "open"])
@pytest.mark.parametrize("members", [60, 2000])
@pytest.mark.parametrize("cut", [None, 512])
def test_a_blocked_word_after_many_empty_gzip_members_is_still_blocked(
    cut: int | None, members: int, failure: str
) -> None:
    """A read of the decoder is bounded, so one over empty members returns nothing with
    work left: a gate that holds must read on until the chunk is decoded (it stopped at
    the first empty read, and the word went out unchecked). Past MAX_EMPTY_MEMBERS the
    body is not read further and the policy decides; the chunk whose decoding stopped
    must not count as checked (it went out whole under ``closed``)."""
    case = CASES["llm-stream"]
    body = gzip.compress(b"", mtime=0) * members + gzip.compress(body_of(case, DIRTY), mtime=0)
    cuts = [] if cut is None else list(range(cut, len(body), cut))
    sent, row, _ = gated(case, body, cuts, FilterSet(BLOCK_RULES, failure=failure), encoding="gzip")
    received = b"".join(sent)
    rules = [v["rule_id"] for v in row["verdicts"]]
    if members == 60:  # (within the limit: read, and the word found)
        assert row["status"] == "blocked" and rules == ["no-code-name"]
    elif failure == "closed":
        assert row["status"] == "blocked" and rules == ["filter_error"] and "decode_failed" in codes(row)
    else:  # (open: it goes unchecked, and the record says so)
        assert received == body and rules == ["filter_error"] and "decode_failed" in codes(row)
        return
    assert len(received) < len(body) and WORD not in client_text(case, _gunzip_members(received))


@pytest.mark.parametrize("name", CASES)
def test_flag_only_rules_change_nothing_on_the_wire(name: str) -> None:
    case = CASES[name]
    body = body_of(case, DIRTY)
    flag_only = FilterSet(FLAG_RULES, failure="closed")
    assert not flag_only.may_block_output
    for cuts in [byte_at_a_time(body), *some_cuts(body, 3, 5)]:
        sent, row, _ = gated(case, body, cuts, flag_only)
        bounds = [0, *cuts, len(body)]
        assert sent[:-1] == [body[a:b] for a, b in zip(bounds, bounds[1:])] and sent[-1] == b""
        assert [(v["action"], v["rule_id"]) for v in row["verdicts"]] == [("flag", "code-name-seen")]
        assert row["status"] == "completed" and row["delivered_text"] is None


FLAG_EVERY_KIND = FilterSet(
    parse_rules(f"""
[[rule]]
id = "word"
kind = "keywords"
keywords = ["{WORD}"]
action = "flag"

[[rule]]
id = "phrase"
kind = "regex"
pattern = "plan and (mail|more)"
action = "flag"

[[rule]]
id = "secret"
kind = "secrets"
action = "flag"

[[rule]]
id = "personal"
kind = "pii"
action = "flag"
"""),
    failure="closed",
)
# (an address at the very end is decided only when the stream's text ends: by its
# terminal event, or without one by the body's end)
FLAGGED = "events=16&text=Ask+about+the+{w}+plan+and+more:+the+key+AKIAIOSFODNN7EXAMPLE,+write+to+ada%40example.com"


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("end", ["", "&no_end=1", "&reasoning=1"])
def test_flag_only_rules_find_the_same_read_in_runs_as_event_by_event(
    name: str, end: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gate that only flags is handed what was read a run at a time, the run's text as
    one piece per stream: the row (verdicts and their positions included) is the one read
    event by event (byte at a time, each chunk read as it comes), and the wire unchanged."""
    case = CASES[name]
    body = body_of(case, Scenario.parse(FLAGGED.format(w=WORD) + end))

    def row_of(run_bytes: int, cuts: list[int]) -> dict[str, Any]:
        monkeypatch.setattr(auditor_module, "READ_RUN", run_bytes)
        sent, row, _ = gated(case, body, cuts, FLAG_EVERY_KIND)
        assert b"".join(sent) == body
        row["verdicts"].sort(key=lambda v: (v["location"], v["position"], v["rule_id"]))  # (rule by rule in a run)
        return {k: v for k, v in row.items() if k not in ("id", "started_at", "ended_at", "first_chunk_at")}

    reference = row_of(0, byte_at_a_time(body))
    assert {v["rule_id"] for v in reference["verdicts"]} >= {"word", "phrase", "secret", "personal"}
    for cuts in ([], *some_cuts(body, 5, 6)):
        for run_bytes in (0, 97, 32 * 1024):
            assert row_of(run_bytes, cuts) == reference, (cuts, run_bytes)


class _TurnsOfOllama(OllamaNormalizer):
    """Ollama's answer lines with its end as a turn's end: a stand-in for a long-lived
    stream of turns (Cursor's chat) in a framing that is easy to write by hand."""

    def on_json(self, event, obj):
        return [TurnEnd() if type(e) is StreamEnd else e for e in super().on_json(event, obj)]

    def read(self, event):
        return self.on_event(event)


def _turn_line(content: str, done: bool) -> bytes:
    return orjson.dumps({"model": "m", "message": {"role": "assistant", "content": content}, "done": done}) + b"\n"


def _auditor_of_turns(
    action: str | None, encoding: str | None, reopen: bool = False
) -> tuple[StreamAuditor, Turns, list[dict[str, Any]]]:
    """An auditor of a stream of turns (:class:`_TurnsOfOllama`) with a gate of one
    keyword rule (``action`` None: no gate); the rows its turns write. ``reopen``: each
    next turn opens at once, as when the client's next prompt came."""
    filters = FilterSet(
        parse_rules(
            f'[[rule]]\nid = "code"\nkind = "keywords"\nkeywords = ["{WORD}"]\naction = "{action or "flag"}"\n'
        ),
        failure="closed",
    )
    written: list[dict[str, Any]] = []
    first = ExchangeRecord(dialect="ollama", http_method="POST", url_path="/x", streamed=True, http_status=200)
    turns = Turns(first, "conn-1", lambda r: written.append(r.to_row()))
    turns.open()

    def end_turn(record: ExchangeRecord) -> ExchangeRecord:
        record = turns.end_turn(record)
        if reopen:
            turns.open()
        return record

    gate = OutputGate(
        filters.output_guard(),
        _TurnsOfOllama(),
        holds=filters.may_block_output,
        split_raw=encoding is None,
        failure="closed",
    )
    auditor = StreamAuditor(
        first,
        _TurnsOfOllama(),
        encoding,
        1 << 20,
        gate=gate if action is not None else None,
        on_turn_end=end_turn,
        framing=select("application/x-ndjson", 200, "ndjson"),
    )
    return auditor, turns, written


def test_each_turn_s_streams_start_afresh_and_none_is_kept_past_its_turn() -> None:
    """On a stream of turns one gate lasts for the whole body: a turn's end flushed its
    streams but kept them, so a long agent session counted every tool call of every
    turn against MAX_STREAMS and was blocked (filter_error) past 4096 of them."""
    auditor, turns, written = _auditor_of_turns("block", None)
    for n in range(5):
        piece = _turn_line(f"turn {n} says hello", False) + _turn_line("", True)
        sent = auditor.feed(piece)
        assert sent == piece and not auditor.gate.guard._streams and not auditor.gate._escapes
    final = [r for r in written if r["status"] != "in_progress"]
    assert [r["status"] for r in final] == ["completed"] * 5 and all(not r["verdicts"] for r in final)


def _through_tap(auditor: StreamAuditor, turns: Turns, chunk: bytes) -> bytes:
    """One call of the proxy's stream callable (addon/mitm/tap.py) on a stream of turns."""
    turns.hold()
    try:
        out = auditor.feed(chunk) if chunk else auditor.finish()
        if chunk:
            turns.answered()
    finally:
        turns.write_held()
    return out


def _final_rows(auditor: StreamAuditor, turns: Turns, written: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The body ended: the final rows of the stream's turns, the last one written as the
    proxy writes it when the body ends."""
    auditor.end()
    if turns.pending:
        turns.record.finish(OUTCOME_COMPLETE)
        written.append(turns.record.to_row())
    return [w for w in written if w["status"] != "in_progress"]


def _gunzip(data: bytes) -> bytes:
    """What a client decodes of a gzip body, as far as it came."""
    return zlib.decompressobj(zlib.MAX_WBITS | 16).decompress(data)


@pytest.mark.parametrize("action", ["flag", "block"])
def test_a_turns_verdicts_and_block_go_into_its_own_record(action: str) -> None:
    """A chunk carrying a turn's last text and its end: the gate checks the text before
    the turn's record is written, so the verdict (and a block, with one ending for the
    client) is that turn's, not the next one's."""
    auditor, turns, written = _auditor_of_turns(action, None)
    out = auditor.feed(_turn_line(f"the {WORD}.", False) + _turn_line("", True))
    [row] = [w for w in written if w["status"] != "in_progress"]
    assert (row["turn"], row["status"]) == (0, "blocked" if action == "block" else "completed")
    assert [(v["rule_id"], v["action"]) for v in row["verdicts"]] == [("code", action)]
    assert turns.record.verdicts == []  # (the next turn's record)
    if action == "block":
        assert WORD.encode() not in out and out.count(b"content_filter") == 1


@pytest.mark.parametrize("level", [1, 9])
def test_a_compressed_chunk_is_not_released_at_a_turns_end_before_all_it_decodes_to_is_checked(
    level: int,
) -> None:
    """A gzip chunk decoding to one turn that ends exactly where the first decoded slice
    ends, then the next turn with a blocked word: checking the first turn's end early
    must not release the chunk (it goes whole, and the rest of it decodes to the word)."""
    auditor, _, written = _auditor_of_turns("block", "gzip", reopen=True)
    end = _turn_line("", True)
    turn0 = _turn_line("x" * (auditor_module.SLICE - len(end) - len(_turn_line("", False))), False) + end
    assert len(turn0) == auditor_module.SLICE
    out = auditor.feed(gzip.compress(turn0 + _turn_line(f"the plan is {WORD}.", False) + end, compresslevel=level))
    assert out == b"" or WORD.encode() not in _gunzip(out)
    assert auditor.stopped
    assert [(w["turn"], w["status"]) for w in written if w["status"] != "in_progress"] == [
        (0, "completed"),
        (1, "blocked"),
    ]


def test_a_turn_the_proxy_ends_as_idle_is_checked_to_its_end_by_flag_rules() -> None:
    """A turn whose end marker never comes, its keyword the very last word (only the end
    of the text decides it): the proxy's idle end checks the turn as its marker would, so
    the verdict is the turn's own, and nothing is held back."""
    auditor, turns, written = _auditor_of_turns("flag", None)
    out = auditor.feed(_turn_line(f"the plan is {WORD}", False))
    auditor.end_idle_turn("nothing arrived for 1 s")
    [row] = [w for w in written if w["status"] != "in_progress"]
    assert (row["turn"], row["status"]) == (0, "completed")
    assert [(v["rule_id"], v["action"]) for v in row["verdicts"]] == [("code", "flag")]
    assert [f["code"] for f in row["findings"]] == ["turn_idle_timeout"]
    assert turns.record.verdicts == [] and turns.record.turn == 1
    out += auditor.feed(_turn_line("later", False))
    assert out == _turn_line(f"the plan is {WORD}", False) + _turn_line("later", False)


def test_an_idle_end_reads_a_compressed_backlog_a_slice_at_a_time(monkeypatch) -> None:
    """A turn whose compressed bytes still wait to be read is not over: each idle check
    reads one slice of them (never the whole backlog at once on the event loop), and
    the turn ends once all of it is read, with all of its text."""
    monkeypatch.setattr(auditor_module, "CALL_SECONDS", 0.0)  # (one slice per call)
    auditor, turns, written = _auditor_of_turns(None, "gzip")
    text = "".join(f"word{i} " for i in range(10_000))
    _through_tap(auditor, turns, gzip.compress(_turn_line(text, False)))
    checks = 0
    while not [w for w in written if w["status"] != "in_progress"]:
        assert auditor.pending or checks == 0
        auditor.end_idle_turn("nothing arrived for 1 s")
        checks += 1
    [row] = [w for w in written if w["status"] != "in_progress"]
    assert row["output_text"] == text and [f["code"] for f in row["findings"]] == ["turn_idle_timeout"]
    slices = -(-len(_turn_line(text, False)) // auditor_module.SLICE)
    assert checks == slices - 1  # (the chunk's own call read the first)


@pytest.mark.parametrize("encoding", [None, "gzip"])
def test_a_word_cut_across_an_idle_end_is_still_blocked(encoding: str | None) -> None:
    """The idle end is a guess (the answer may go on after a long pause): a gate that may
    block keeps holding the turn's last text across it, so a word cut by the pause is
    seen whole and never reaches the client."""
    auditor, turns, written = _auditor_of_turns("block", encoding)
    pack = gzip.compress if encoding else (lambda b: b)
    out = auditor.feed(pack(_turn_line("the plan is Night", False)))
    auditor.end_idle_turn("nothing arrived for 1 s")
    turns.open()  # (the client's next message)
    out += auditor.feed(pack(_turn_line("jar and more", False)))
    assert auditor.stopped
    sent = _gunzip(out) if encoding else out
    assert b"jar" not in sent
    assert [(w["turn"], w["status"], len(w["verdicts"])) for w in written if w["status"] != "in_progress"] == [
        (0, "completed", 0)
    ]
    assert turns.record.status == "blocked" and turns.record.verdicts[0]["rule_id"] == "code"


@pytest.mark.parametrize("encoding", [None, "gzip"])
@pytest.mark.parametrize("action", [None, "flag", "block"])
@pytest.mark.parametrize("cut", ["whole", "per line", "idle"])
def test_each_turns_record_counts_the_bytes_and_the_text_its_client_got(
    action: str | None, cut: str, encoding: str | None
) -> None:
    """Three turns (a clean one, one whose word a block rule withholds, a clean one),
    each answer arriving with its end or before it: each turn's record counts the bytes
    sent for it, not the next turn's (a compressed chunk goes whole: to the turn it came
    in), and its delivered text is its own (none when it is the output); after a block
    nothing more is read into a turn."""
    auditor, turns, written = _auditor_of_turns(action, encoding)
    end = b"" if cut == "idle" else _turn_line("", True)
    lines = [
        _turn_line("one", False) + end,
        _turn_line(f"two {WORD}.", False) + end,
        _turn_line("three", False) + end,
    ]
    packer = zlib.compressobj(wbits=zlib.MAX_WBITS | 16)
    pack = (lambda b: packer.compress(b) + packer.flush(zlib.Z_SYNC_FLUSH)) if encoding else (lambda b: b)
    chunks = [[pack(p) for p in ([line] if cut != "per line" else line.splitlines(keepends=True))] for line in lines]
    sent = b""
    for turn in chunks:
        for piece in turn:
            sent += _through_tap(auditor, turns, piece)
            if auditor.stopped:
                break  # (the proxy ends the stream after this chunk)
        if auditor.stopped:
            break
        if cut == "idle":
            auditor.end_idle_turn("nothing arrived for 1 s")
    if encoding and not auditor.stopped:
        sent += _through_tap(auditor, turns, packer.flush())  # (the gzip trailer: after the last turn, in none)
    sent += _through_tap(auditor, turns, b"")
    rows = _final_rows(auditor, turns, written)
    text = _gunzip(sent) if encoding else sent
    if action == "block":  # (the event carrying the word is withheld; nothing after it is read into a turn)
        assert [(r["turn"], r["status"], r["delivered_text"]) for r in rows] == [
            (0, "completed", None),
            (1, "blocked", ""),
        ]
        assert rows[0]["bytes_to_client"] == sum(map(len, chunks[0]))
        assert sum(r["bytes_to_client"] for r in rows) == len(sent) and WORD.encode() not in text
        return
    assert [(r["turn"], r["output_text"], r["delivered_text"]) for r in rows] == [
        (0, "one", None),
        (1, f"two {WORD}.", None),
        (2, "three", None),
    ]
    assert [r["bytes_to_client"] for r in rows] == [sum(map(len, turn)) for turn in chunks]
    assert text == b"".join(lines)


def _random_turns(rnd: random.Random, blocked: bool) -> list[tuple[bytes, bool]]:
    """A stream of one to four turns of one to three lines each, every turn ended by its
    marker or left to an idle end; (a line, whether an idle end may follow it)."""
    items: list[tuple[bytes, bool]] = []
    for t in range(rnd.randint(1, 4)):
        for _ in range(rnd.randint(1, 3)):
            word = WORD if blocked and rnd.random() < 0.15 else f"w{rnd.randint(0, 99)}"
            items.append((_turn_line(f"t{t} {word} ", False), True))
        if rnd.random() < 0.5:
            items[-1] = (items[-1][0], False)  # (its marker comes next: no idle end before it)
            items.append((_turn_line("", True), True))
    return items


@pytest.mark.parametrize("encoding", [None, "gzip"])
@pytest.mark.parametrize("action", [None, "flag", "block"])
def test_random_streams_of_turns_keep_every_invariant(action: str | None, encoding: str | None) -> None:
    """Random streams of turns, cut anywhere, turns ended by their markers or by idle
    ends, through the tap as the proxy calls it: nothing a block rule stops reaches the
    client, no record is written final twice or with an internal error, and the turns'
    records count exactly the bytes the client got (one blocked record if any); without
    a block the client gets the body unchanged and no record has a delivered text."""
    for seed in range(100):
        rnd = random.Random(seed)
        auditor, turns, written = _auditor_of_turns(action, encoding, reopen=rnd.random() < 0.5)
        items = _random_turns(rnd, action == "block")
        body = b"".join(line for line, _ in items)
        idles, at = set(), 0
        for line, idle_may_follow in items:
            at += len(line)
            if idle_may_follow and rnd.random() < 0.3:
                idles.add(at)
        cuts = sorted({rnd.randint(1, len(body)) for _ in range(rnd.randint(1, 12))} | idles | {len(body)})
        packer = zlib.compressobj(wbits=zlib.MAX_WBITS | 16)
        sent, start = b"", 0
        for cut in cuts:  # (a chunk may hold a turn's answer and its end, or parts of two turns)
            piece, start = body[start:cut], cut
            last = cut == len(body)
            chunk = (
                piece
                if not encoding
                else packer.compress(piece) + packer.flush(zlib.Z_FINISH if last else zlib.Z_SYNC_FLUSH)
            )
            sent += _through_tap(auditor, turns, chunk)
            if auditor.stopped:
                break
            if cut in idles and turns.idle_for(float("inf")) > 0:
                auditor.end_idle_turn("nothing arrived for 60 s")
        sent += _through_tap(auditor, turns, b"")
        rows = _final_rows(auditor, turns, written)
        text = _gunzip(sent) if encoding else sent
        where = f"seed {seed}"
        assert len({r["id"] for r in rows}) == len(rows), where
        assert not any(f["code"] == "audit_internal_error" for r in rows for f in r["findings"]), where
        assert sum(r["bytes_to_client"] for r in rows) == len(sent), where
        if action == "block":
            assert WORD.encode() not in text, where
        if auditor.stopped:  # (one blocked record; no answer is read into a turn after it)
            statuses = [r["status"] for r in rows]
            assert statuses.count("blocked") == 1, where
            assert not any(r["output_text"] for r in rows[statuses.index("blocked") + 1 :]), where
        else:
            assert text == body, where
            assert all(r["delivered_text"] is None for r in rows), where


def test_the_text_of_a_compressed_chunk_withheld_for_a_later_block_is_not_delivered() -> None:
    """A compressed chunk goes whole or not at all: one carrying clean text and then a
    blocked word is withheld, so its clean text is not in ``delivered_text`` (it was
    counted as delivered once checked, before the chunk's fate was known)."""
    filters = FilterSet(
        parse_rules(f'[[rule]]\nid = "code"\nkind = "keywords"\nkeywords = ["{WORD}"]\naction = "block"\n'),
        failure="closed",
    )
    record = ExchangeRecord(dialect="ollama", http_method="POST", url_path="/api/chat", streamed=True, http_status=200)
    gate = OutputGate(filters.output_guard(), OllamaNormalizer(), holds=True, split_raw=False, failure="closed")
    auditor = StreamAuditor(
        record, OllamaNormalizer(), "gzip", 1 << 20, gate=gate, framing=select("application/x-ndjson", 200, "ndjson")
    )
    packer = zlib.compressobj(wbits=zlib.MAX_WBITS | 16)
    sent = b""
    for lines in (
        [_turn_line("first part. ", False)],
        [_turn_line("clean text. ", False), _turn_line(f"{WORD}.", False)],
    ):
        sent += auditor.feed(packer.compress(b"".join(lines)) + packer.flush(zlib.Z_SYNC_FLUSH))
    auditor.end()
    assert auditor.stopped and record.status == "blocked"
    assert _gunzip(sent) == _turn_line("first part. ", False)
    assert record.delivered_text == "first part. "


def test_one_text_block_of_a_whole_body_is_one_search_so_a_long_match_is_found_whole() -> None:
    """A whole body's text block is checked in one search, however long: cut every 64 KiB,
    an unbounded regex's match crossing the cut passed (the guard holds back a bounded
    window across a cut), where the body is at hand whole."""
    rule = '[[rule]]\nid = "r"\nkind = "regex"\npattern = "BEGIN SECRET[\\\\s\\\\S]*?END SECRET"\naction = "block"\n'
    text = "x" * (BODY_PIECE - 300) + "BEGIN SECRET " + "s" * 1000 + " END SECRET tail"
    gate = OutputGate(
        FilterSet(parse_rules(rule), failure="closed").output_guard(),
        OllamaNormalizer(),
        holds=True,
        split_raw=False,
        failure="closed",
    )
    gate.on_body([TextDelta(text), StreamEnd()])
    assert gate.blocked is not None and gate.blocked.rule_id == "r"


def test_release_first_rules_send_each_event_as_soon_as_it_is_whole() -> None:
    case = CASES["llm-stream"]
    fs = FilterSet(
        parse_rules(f'[[rule]]\nid = "x"\nkind = "keywords"\nkeywords = ["{WORD}"]\nwindow = 0\naction = "block"'),
        failure="closed",
    )
    events = case.stream(case.request, DIRTY)
    sent, row, _ = gated(case, b"".join(events), [sum(map(len, events[: i + 1])) for i in range(len(events))], fs)
    assert sent[0] == events[0] and sent[1] == events[1]  # nothing waits for the window
    assert row["status"] == "blocked"


def test_a_compressed_stream_is_released_in_whole_chunks_and_cut_without_a_termination() -> None:
    case = CASES["llm-stream"]
    events = case.stream(case.request, DIRTY)
    compressor = zlib.compressobj(wbits=31)
    chunks = [compressor.compress(e) + compressor.flush(zlib.Z_SYNC_FLUSH) for e in events]
    body = b"".join(chunks)
    cuts = [sum(map(len, chunks[: i + 1])) for i in range(len(chunks) - 1)]
    sent, row, _ = gated(case, body, cuts, BLOCKING, encoding="gzip")
    received = b"".join(sent)
    assert body.startswith(received) and len(received) < len(body)
    shown = client_text(case, zlib.decompressobj(wbits=31).decompress(received))
    assert len(shown) <= client_text(case, b"".join(events)).index(WORD)
    assert row["status"] == "blocked" and codes(row) == ["termination_not_sent"]

    clean = gzip.compress(body_of(case, CLEAN))
    sent, row, _ = gated(case, clean, byte_at_a_time(clean)[::7], BLOCKING, encoding="gzip")
    assert b"".join(sent) == clean and row["status"] == "completed"


@pytest.mark.parametrize("failure, status, passed", [("closed", "blocked", False), ("open", "completed", True)])
def test_an_event_too_large_to_check_follows_the_failure_policy(failure: str, status: str, passed: bool) -> None:
    case = CASES["llm-stream"]
    body = body_of(case, Scenario.parse("events=3&size=3000"))
    sent, row, _ = gated(
        case, body, byte_at_a_time(body)[::100], FilterSet(BLOCK_RULES, failure=failure), max_event_bytes=2048
    )
    assert (b"".join(sent) == body) is passed
    assert row["status"] == status
    assert [(v["rule_id"], v["action"]) for v in row["verdicts"]] == [
        (FILTER_ERROR, "block" if failure == "closed" else "flag")
    ]


class BlockAfter(BaseFilter):
    """A user filter that blocks once the text so far is long enough (window 0)."""

    name = "block-after"

    def check_output(self, piece: OutputPiece) -> Verdict | None:
        return Verdict("block", "too-long", "") if piece.end > 20 else None


def test_a_user_filter_blocks_mid_stream_and_the_client_gets_what_was_checked_before() -> None:
    case = CASES["openai-chat"]
    body = body_of(case, CLEAN)
    sent, row, auditor = gated(case, body, [], FilterSet((), [BlockAfter()], failure="closed"))
    shown = client_text(case, b"".join(sent))
    assert 0 < len(shown) <= 20 and row["delivered_text"] == shown
    assert [v["rule_id"] for v in row["verdicts"]] == ["too-long"] and row["status"] == "blocked"


# -- the SSE reader's boundaries ------------------------------------------------------------------

FRAMED = [
    b"data: a\n\ndata: b\n\n",
    b"event: x\r\ndata: a\r\n\r\ndata: b\r\n\r\n",
    b"data: a\r\rdata: b\r\r: comment\n\ndata: c\n\r\ndata: d\r\n\n",
    b"\n\n\ndata: a\n\n\n\ndata: b\n\n",
    b"\xef\xbb\xbfdata: a\n\ndata: \xe2\x82\xac\n\ndata: tail",
]


def at_block_start(prefix: bytes) -> bool:
    """Whether an event stream cut after ``prefix`` is between blocks (nothing of an event read)."""
    parser = SSEParser()
    parser.feed(prefix)
    return not parser.pending_event


@pytest.mark.parametrize("body", FRAMED)
def test_sse_reader_reports_each_event_at_the_blank_line_ending_it_at_any_chunking(body: bytes) -> None:
    whole = SSEParser()
    expected = whole.feed(body) + whole.end()
    for cuts in [[], byte_at_a_time(body), *([i] for i in range(1, len(body)))]:
        reader = SSEReader()
        bounds = [0, *cuts, len(body)]
        bounded = [p for a, b in zip(bounds, bounds[1:]) for p in reader.feed_bounded(body[a:b])]
        ends = [end for _, end in bounded]
        assert ends == sorted(set(ends)) and all(
            body[:end].endswith((b"\n", b"\r")) and at_block_start(body[:end]) for end in ends
        )
        assert (ends[-1] if ends else 0) + reader.held == len(body)
        events = [frame for frame, _ in bounded if frame is not None] + list(reader.unbound())
        assert events == expected


_VOLATILE = ("id", "started_at", "ended_at", "first_chunk_at")


@pytest.mark.parametrize("name", CASES)
def test_the_gate_reading_the_auditors_parse_gives_what_parsing_again_gives(name: str, monkeypatch) -> None:
    """The gate's normalizer reads a frame the auditor read as text alone from the
    auditor's JSON object (``Normalizer.read_parsed``) instead of parsing its bytes again.
    Differential: the same streams, cut the same ways, clean, blocked and with a tool
    call, give the same bytes to the client, the same row and the same state of the
    gate's normalizer (what a termination continues from) when it parses again."""
    from addon.dialects import JsonEventNormalizer

    case = CASES[name]
    reused = [0]
    given = JsonEventNormalizer.read_parsed

    def counting(self, event, parsed):  # type: ignore[no-untyped-def]
        reused[0] += 1
        return given(self, event, parsed)

    def parse_again(self, event, parsed):  # type: ignore[no-untyped-def]
        return self.read(event)

    for scenario in (CLEAN, DIRTY, TOOL):
        body = body_of(case, scenario)
        for cuts in [[], byte_at_a_time(body), *some_cuts(body, seed=len(body), n=6)]:
            runs = []
            for read_parsed in (counting, parse_again):
                monkeypatch.setattr(JsonEventNormalizer, "read_parsed", read_parsed)
                sent, row, auditor = gated(case, body, cuts, BLOCKING)
                gate = auditor.gate
                assert gate is not None
                kept = {k: v for k, v in row.items() if k not in _VOLATILE}
                runs.append((sent, kept, vars(gate.forwarded), gate.delivered_text, gate.termination()))
            assert runs[0] == runs[1], (scenario, cuts)
    normalizer = case.dialect.normalizer(case.dialect.summarize(case.request, case.view))
    if isinstance(normalizer, JsonEventNormalizer) and normalizer._fast and normalizer._reads_objects:
        assert reused[0] > 0  # (the others have no text fast path, or read every frame their own way)


@pytest.mark.parametrize("name", CASES)
def test_a_normalizer_reading_a_frame_as_text_leaves_its_object_as_it_was(name: str) -> None:
    """What makes handing the auditor's parsed object to the gate's normalizer safe: a
    normalizer that reads a frame as text alone neither changes the object nor keeps a
    part of it that could change (only the text, an immutable string)."""
    case = CASES[name]
    summary = case.dialect.summarize(case.request, case.view)
    read_as_text = []
    for scenario in (CLEAN, DIRTY, TOOL):
        normalizer = case.dialect.normalizer(summary)
        for event in SSEParser().feed(body_of(case, scenario)):
            try:
                obj = orjson.loads(event.data)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(obj, dict):
                continue
            before = copy.deepcopy(obj)
            if isinstance(normalizer.read_parsed(event, obj), str):
                read_as_text.append((obj, before))
        normalizer.on_end()
    # (checked once every frame has been read: nothing the normalizer kept changed later)
    assert all(obj == before for obj, before in read_as_text)
    assert read_as_text or not getattr(normalizer, "_fast", False)


def _whole_gate(failure: str, normalizer: Any) -> OutputGate:
    filters = FilterSet(BLOCK_RULES, failure=failure)
    return OutputGate(filters.output_guard(), normalizer, holds=False, split_raw=True, failure=failure, whole=True)


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "utf-16-be", "utf-32"])
def test_a_whole_answer_the_python_sdks_read_in_another_encoding_is_read_so_and_checked(encoding: str) -> None:
    """httpx's ``Response.json`` (the openai and anthropic SDKs) reads a body with a byte
    order mark, and UTF-16 and UTF-32: the answer's text reached the client past the
    filters, the record said ``upstream_aborted`` (the review's sdk_utf16_answer.py)."""
    answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": f"The code is {WORD}."}}]}
    body = orjson.dumps(answer).decode().encode(encoding)
    gate = _whole_gate("closed", OpenAIChatNormalizer())
    events = OpenAIChatNormalizer().on_body(body, 200)
    assert any(type(e) is TextDelta and WORD in e.text for e in events)
    gate.on_body(events)
    assert gate.blocked is not None and gate.blocked.rule_id != FILTER_ERROR


@pytest.mark.parametrize(("failure", "action"), [("closed", "block"), ("open", "flag")])
def test_a_whole_answer_that_is_not_its_json_is_decided_by_the_failure_policy(failure: str, action: str) -> None:
    """A 2xx body its dialect cannot read is text the filters never saw: ``closed``
    blocks it, ``open`` flags it; before, it went to the client unchecked either way."""
    gate = _whole_gate(failure, OpenAIChatNormalizer())
    gate.on_body(OpenAIChatNormalizer().on_body(f"<p>{WORD}</p>".encode(), 200))
    assert [(v.action, v.rule_id) for v in gate.verdicts] == [(action, FILTER_ERROR)]
    assert (gate.blocked is not None) == (failure == "closed")


def test_an_error_body_that_is_not_json_is_read_as_its_message_not_refused() -> None:
    """A gateway's HTML error page is an error whose message the filters read (its start):
    not a reason to replace the upstream's error with the proxy's."""
    gate = _whole_gate("closed", OpenAIChatNormalizer())
    gate.on_body(OpenAIChatNormalizer().on_body(b"<html><body>502 Bad Gateway</body></html>", 502))
    assert gate.blocked is None and gate.verdicts == []
