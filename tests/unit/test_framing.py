"""The framing layer: the registry, the JSON-array and whole-body readers, the writers."""

from __future__ import annotations

import json

import orjson
import pytest

from addon.auditor import StreamAuditor, summary_into_record
from addon.dialects import RequestView
from addon.dialects.gemini import DIALECT as GEMINI
from addon.filters.engine import FilterSet
from addon.filters.rules import parse_rules
from addon.framing import FRAMINGS, Message, select
from addon.framing.json_array import JSON_ARRAY_WRITER, JSONArrayReader
from addon.framing.sse import SSEEvent, SSEReader, SSEWriter
from addon.framing.whole import WholeReader
from addon.output_gate import OutputGate
from addon.record import OUTCOME_COMPLETE, ExchangeRecord

LIMIT = 1 << 20


def read_split(
    body: bytes, cuts: list[int], limit: int = LIMIT
) -> tuple[list[tuple[str | None, int]], JSONArrayReader]:
    """Feed ``body`` cut at ``cuts``; the frames' data (None: a boundary alone) with their ends."""
    reader = JSONArrayReader(limit)
    bounds = [0, *cuts, len(body)]
    out = [
        (None if f is None else f.data, end)
        for a, b in zip(bounds, bounds[1:])
        for f, end in reader.feed_bounded(body[a:b])
    ]
    reader.end()
    return out, reader


SMALL = [
    b'[{"a": 1}, {"b": [1, 2, {"c": "]}"}]}]',
    b'\xef\xbb\xbf [ {"s": "a\\"b\\\\"} ,\r\n{"t": "\xe2\x82\xac"}\n]\n',
    b'[1, "x,]", true, null, -2.5e3, []]',
    b"[]",
]


@pytest.mark.parametrize("body", SMALL)
def test_json_array_elements_and_ends_are_the_same_at_every_split(body: bytes) -> None:
    whole, reader = read_split(body, [])
    assert reader.findings == [] and not reader.pending_event
    elements = [orjson.loads(data) for data, _ in whole if data is not None]
    assert elements == orjson.loads(body.removeprefix(b"\xef\xbb\xbf"))
    for data, end in whole:
        if data is not None:
            assert body[:end].endswith(data.encode())  # the end is just past the element
    closed = body.rindex(b"]") + 1
    assert (None, closed) in whole  # the closing bracket is a boundary too,
    assert whole[-1] == (None, len(body))  # and the whitespace after it (padding)
    array = [part for part in whole if part[1] <= closed]
    for cuts in [*([i] for i in range(1, len(body))), list(range(1, len(body)))]:
        split = read_split(body, cuts)[0]
        assert [part for part in split if part[1] <= closed] == array, cuts
        assert split[-1] == (None, len(body)) and all(frame is None for frame, end in split if end > closed)


def test_json_array_cut_off_reports_whole_elements_only_and_ends_inside() -> None:
    body = b'[{"a": "one"},\n{"a": "tw'
    out, reader = read_split(body, [])
    assert out == [('{"a": "one"}', 13)]
    assert reader.pending_event and reader.held == len(body) - 13


def test_json_array_element_over_the_limit_is_skipped_while_it_arrives() -> None:
    big = b'{"t": "' + b"x" * 5000 + b'"}'
    body = b"[" + big + b',{"a": 1}]'
    reader = JSONArrayReader(1000)
    out = []
    for i in range(0, len(body), 7):
        out += reader.feed_bounded(body[i : i + 7])
        assert sum(map(len, reader._pieces)) <= 1000  # never more than the limit kept
    assert [(None if f is None else f.data) for f, _ in out] == [None, '{"a": 1}', None]
    assert [code for code, _ in reader.findings] == ["sse_event_too_long"]


def test_json_array_deep_nesting_is_one_element_and_never_raises() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    out, reader = read_split(b"[" + deep + b"]", [])
    assert out[0] == (deep.decode(), len(deep) + 1) and reader.findings == []


@pytest.mark.parametrize(
    "body, reason",
    [
        (b'{"a": 1}', "the response body is not a JSON array"),
        (b"[1] x", "data after the end of the JSON array"),
    ],
)
def test_json_array_bad_input_is_a_finding_and_the_rest_unreadable(body: bytes, reason: str) -> None:
    _, reader = read_split(body, [])
    assert reader.findings == [("response_invalid_json", reason)] and reader.unreadable == reason
    assert reader.feed(b"[1]") == []


def test_json_array_invalid_utf8_is_read_with_replacement_and_a_finding() -> None:
    out, reader = read_split(b'["a\xffb"]', [])
    assert out[0][0] == '"a\ufffdb"' and [c for c, _ in reader.findings] == ["response_invalid_utf8"]


def test_json_array_writer_continues_or_opens_the_array() -> None:
    final = [Message('{"x":1}')]
    assert JSON_ARRAY_WRITER.encode(final, True) == b',{"x":1}]'
    assert JSON_ARRAY_WRITER.encode(final, False) == b'[{"x":1}]'
    assert JSON_ARRAY_WRITER.encode([], True) == b""


def test_sse_writer_writes_what_a_parser_reads_back() -> None:
    frames = [Message('{"a":1}', "delta", "7"), Message("[DONE]")]
    crlf = SSEWriter(b"\r\n").encode(frames, True)
    assert crlf == b'id: 7\r\nevent: delta\r\ndata: {"a":1}\r\n\r\ndata: [DONE]\r\n\r\n'
    assert SSEReader().feed(crlf) == [SSEEvent("delta", '{"a":1}', "7"), SSEEvent("message", "[DONE]", "7")]


def test_whole_reader_gives_one_frame_or_nothing_over_its_limit() -> None:
    reader = WholeReader(10)
    reader.feed(b"12345")
    reader.feed(b"678")
    assert [f.raw for f in reader.end()] == [b"12345678"]
    small = WholeReader(4)
    small.feed(b"12345")
    assert small.end() == [] and small.unreadable and [c for c, _ in small.findings] == ["body_too_large"]


def test_registry_selects_by_media_type_then_what_the_dialect_expects() -> None:
    assert set(FRAMINGS) >= {"sse", "json-array", "whole"}
    assert select("text/event-stream; charset=utf-8", 200, "json-array").name == "sse"
    assert select("application/json; charset=UTF-8", 200, "json-array").name == "json-array"
    assert select("application/json", 400, "json-array").name == "whole"  # an error body
    assert select("application/json", 200, "sse").name == "whole"  # a JSON answer
    assert select("application/json", 200, None).name == "whole"


# -- Gemini's JSON array through the output gate --------------------------------------------------

BLOCK = FilterSet(
    parse_rules("""
[[rule]]
id = "no-code-name"
kind = "keywords"
keywords = ["Nightjar"]
scope = "response"
action = "block"
reason = "internal code name"
"""),
    failure="closed",
)
STREAM_VIEW = RequestView("POST", "/v1beta/models/gemini-2.5-flash:streamGenerateContent", "", {})


def gemini_array(texts: list[str]) -> bytes:
    """A streamed JSON array as Google writes it: indented elements, ``,\\r\\n`` between."""
    elements = [
        {
            "candidates": [{"content": {"role": "model", "parts": [{"text": t}]}, "index": 0}],
            "modelVersion": "gemini-2.5-flash",
            "responseId": "r-1",
        }
        for t in texts
    ]
    elements[-1]["candidates"][0]["finishReason"] = "STOP"
    return ("[" + ",\r\n".join(json.dumps(e, indent=2) for e in elements) + "]").encode()


def gated_gemini(body: bytes, cuts: list[int]) -> tuple[bytes, dict]:
    """What the client gets of ``body`` fed at ``cuts`` through a blocking gate, and the row."""
    record = ExchangeRecord(dialect="gemini", streamed=True, http_status=200)
    summary = GEMINI.summarize({"contents": []}, STREAM_VIEW)
    summary_into_record(record, summary)
    gate = OutputGate(BLOCK.output_guard(), GEMINI.normalizer(summary), holds=True, split_raw=True, failure="closed")
    framing = select("application/json; charset=UTF-8", 200, GEMINI.normalizer(summary).framing)
    auditor = StreamAuditor(record, GEMINI.normalizer(summary), None, LIMIT, gate=gate, framing=framing)
    bounds = [0, *cuts, len(body)]
    sent = [auditor.feed(body[a:b]) for a, b in zip(bounds, bounds[1:]) if b > a and not auditor.stopped]
    sent.append(auditor.finish())
    auditor.end()
    record.finish(OUTCOME_COMPLETE)
    return b"".join(sent), record.to_row()


def texts_of(elements: list[dict]) -> list[str]:
    return [p.get("text", "") for e in elements for c in e["candidates"] for p in c.get("content", {}).get("parts", [])]


@pytest.mark.parametrize("dirty_at", [0, 2])
def test_a_gemini_json_array_is_cut_at_the_element_with_the_word_and_closed_with_safety(dirty_at: int) -> None:
    texts = ["Hello, ", "the plan ", "is called ", "and more ", "until the end."]
    texts[dirty_at] += "Nightjar "
    body = gemini_array(texts)
    for cuts in [[], list(range(7, len(body), 7)), list(range(1, len(body)))]:
        received, row = gated_gemini(body, cuts)
        elements = orjson.loads(received)  # a valid array: ",{final}]" continuing it, or "[{final}]"
        shown = "".join(texts_of(elements[:-1]))  # (the guard's window may hold an element back)
        assert "".join(texts[:dirty_at]).startswith(shown) and shown.startswith("Hello, " if dirty_at else "")
        assert elements[-1]["candidates"] == [
            {
                "finishReason": "SAFETY",
                "index": 0,
                "finishMessage": "Blocked by content filter rule 'no-code-name': internal code name",
            }
        ]
        assert (row["status"], row["finish_reasons"], row["delivered_text"] or "") == ("blocked", ["SAFETY"], shown)


def test_a_clean_gemini_json_array_passes_byte_for_byte_through_the_gate() -> None:
    body = gemini_array(["Hello, ", "all ", "is fine."]) + b"\r\n"
    for cuts in [[], list(range(1, len(body)))]:
        received, row = gated_gemini(body, cuts)
        assert received == body and row["status"] == "completed"
