"""The output gate releases bytes exactly at the boundaries the framing reader reports.

The gate never looks at the bytes: what the client has at any moment ends at a frame end
the reader reported (an SSE event's blank line, the line ends between events, a JSON-array
element, the closing bracket and the whitespace after it), however the upstream cut its
chunks: a frame split across chunks, CRLF line ends split between their CR and LF, the
streamed JSON array. Bytes after the last boundary (a cut-off frame) are never released.
"""

from __future__ import annotations

import json
import random

import pytest
from test_block_responses import CASES
from test_output_gate import BLOCK_RULES, CLEAN, body_of, byte_at_a_time, gated

from addon.auditor import StreamAuditor, summary_into_record
from addon.dialects import RequestView
from addon.dialects.gemini import DIALECT as GEMINI
from addon.filters.engine import FilterSet
from addon.framing import select
from addon.framing.json_array import JSONArrayReader
from addon.framing.sse import SSEParser, SSEReader
from addon.output_gate import OutputGate
from addon.record import OUTCOME_COMPLETE, ExchangeRecord

FILTERS = FilterSet(BLOCK_RULES, [], failure="closed")
CHAT = CASES["openai-chat"]


def chat_gate() -> OutputGate:
    summary = CHAT.dialect.summarize(CHAT.request, CHAT.view)
    return OutputGate(
        FILTERS.output_guard(), CHAT.dialect.normalizer(summary), holds=True, split_raw=True, failure="closed"
    )


def test_the_gate_alone_releases_up_to_the_last_boundary_it_was_given_and_no_further() -> None:
    gate = chat_gate()
    assert gate.feed(b"abc", 3, []) == b""  # no boundary yet: everything held
    assert gate.feed(b"de", 2, [(None, (), 4, None)]) == b"abcd"  # cut inside the second chunk
    assert gate.feed(None, 0, [(None, (), 5, None)]) == b"e"
    assert gate.feed(b"fg", 2, []) == b""
    assert gate.finish() == b""  # after the last boundary: never released


def reported(reader: SSEReader | JSONArrayReader, body: bytes, cuts: list[int]) -> set[int]:
    """The boundaries ``reader`` reports for ``body`` fed at ``cuts`` (and 0)."""
    bounds = [0, *cuts, len(body)]
    return {0, *(end for a, b in zip(bounds, bounds[1:]) for _, end in reader.feed_bounded(body[a:b]))}


def cumulative(sent: list[bytes]) -> list[int]:
    out, total = [], 0
    for part in sent:
        total += len(part)
        out.append(total)
    return out


CRLF_BODY = body_of(CHAT, CLEAN).replace(b"\n\n", b"\r\n\r\n")


@pytest.mark.parametrize("body", [body_of(CHAT, CLEAN), CRLF_BODY], ids=["lf", "crlf"])
def test_what_the_client_has_always_ends_at_an_sse_boundary_whatever_the_chunking(body: bytes) -> None:
    assert max(reported(SSEReader(), body, [])) == len(body)
    for cuts in [
        [],
        byte_at_a_time(body),
        list(range(5, len(body), 7)),  # frames split across chunks
        [i for i in range(len(body)) if body[i - 1 : i] == b"\r"],  # every CRLF split between CR and LF
    ]:
        sent, row, _ = gated(CHAT, body, cuts, FILTERS)
        assert set(cumulative(sent)) <= reported(SSEReader(), body, cuts), cuts
        assert b"".join(sent) == body and row["status"] == "completed"


def test_a_frame_cut_off_at_the_end_of_the_body_is_never_released() -> None:
    body = CRLF_BODY + b'data: {"choices": [{"delta": {"content": "unche'
    sent, _, _ = gated(CHAT, body, [len(CRLF_BODY) + 5], FILTERS)
    assert b"".join(sent) == CRLF_BODY


PIECES = [
    b"data: a", b"data:b", b"\n", b"\r", b"\r\n", b"event: x", b"id: 7", b": c", b"retry: 5",
    b"\xef\xbb\xbf", b"\xe2\x82\xac", b"\xff", b"\xe2\x82", b"data: " + b"y" * 30, b"id: \x00", b"x",
]  # fmt: skip


def test_the_bounded_reader_reads_what_the_parser_reads_in_the_same_pass_that_finds_the_boundaries() -> None:
    """Random bodies of tricky pieces (BOMs, CR/LF/CRLF, invalid and cut UTF-8, lines over
    the limit, comments, ids with U+0000), randomly cut: the same events, findings and end
    state as the parser, every boundary strictly after the last and between blocks."""
    rng = random.Random(5)
    for _ in range(3000):
        body = b"".join(rng.choice(PIECES) for _ in range(rng.randint(0, 25)))
        limit = rng.choice([8, 20, 1000])
        parser = SSEParser(limit)
        expected = parser.feed(body) + parser.end()
        cuts = sorted(rng.sample(range(1, len(body)), min(len(body) - 1, rng.randint(0, 6)))) if len(body) > 1 else []
        reader = SSEReader(limit)
        bounds = [0, *cuts, len(body)]
        bounded = [part for a, b in zip(bounds, bounds[1:]) for part in reader.feed_bounded(body[a:b])]
        ends = [end for _, end in bounded]
        events = [frame for frame, _ in bounded if frame is not None] + reader.end()
        assert events == expected, (body, cuts)
        assert sorted(reader.findings) == sorted(parser.findings) and reader.pending_event == parser.pending_event
        assert ends == sorted(set(ends)) and all(at_block_start(body[:end], limit) for end in ends), (body, cuts)


EVENTS = [
    b"data: a\n\n", b"data:b\n\n", b"event: x\ndata: c\n\n", b"id: 7\ndata: d\n\n", b"id: 8\nevent: y\ndata: e\n\n",
    b"event: \ndata: f\n\n", b"data: " + b"y" * 30 + b"\n\n", b"data: \xe2\x82\xac\n\n", b"data: \xff\n\n",
    b"data: \r\n\n", b"id: \x00\ndata: g\n\n", b"id: 9\n\n", b"event: z\n\n", b": c\n\n", b"retry: 5\ndata: h\n\n",
    b"data: i\ndata: j\n\n", b"\n\n", b"data: k\r\n\r\n", b"\xef\xbb\xbfdata: l\n\n", b"datax: m\n\n", b"data: n",
]  # fmt: skip


def test_one_event_per_chunk_reads_as_the_parser_reads_it() -> None:
    """The reader's shortcut for a chunk that is one whole event at a block start, against
    the parser: common and uncommon blocks (CR, invalid UTF-8, U+0000 ids, id- or
    event-only blocks, over the limit), one or two per chunk, in any order."""
    rng = random.Random(11)
    for _ in range(3000):
        chunks = [
            b"".join(rng.choice(EVENTS) for _ in range(rng.choice([1, 1, 1, 2]))) for _ in range(rng.randint(1, 8))
        ]
        limit = rng.choice([8, 20, 1000])
        parser = SSEParser(limit)
        expected = parser.feed(b"".join(chunks)) + parser.end()
        reader = SSEReader(limit)
        bounded = [part for chunk in chunks for part in reader.feed_bounded(chunk)]
        events = [frame for frame, _ in bounded if frame is not None] + reader.end()
        assert events == expected, chunks
        assert sorted(reader.findings) == sorted(parser.findings) and reader.pending_event == parser.pending_event, (
            chunks
        )
        assert reader.last_event_id == parser.last_event_id and reader.events_dispatched == parser.events_dispatched
        body, ends = b"".join(chunks), [end for _, end in bounded]
        assert ends == sorted(set(ends)) and all(at_block_start(body[:end], limit) for end in ends), chunks


def at_block_start(prefix: bytes, limit: int) -> bool:
    parser = SSEParser(limit)
    parser.feed(prefix)
    return not parser.pending_event


def gemini_array(texts: list[str], tail: bytes = b"\n") -> bytes:
    elements = [{"candidates": [{"content": {"role": "model", "parts": [{"text": t}]}, "index": 0}]} for t in texts]
    elements[-1]["candidates"][0]["finishReason"] = "STOP"
    return ("[" + ",\r\n".join(json.dumps(e, indent=2) for e in elements) + "]").encode() + tail


def gated_array(body: bytes, cuts: list[int]) -> list[bytes]:
    view = RequestView("POST", "/v1beta/models/gemini-2.5-flash:streamGenerateContent", "", {})
    summary = GEMINI.summarize({"contents": []}, view)
    record = ExchangeRecord(dialect="gemini", streamed=True, http_status=200)
    summary_into_record(record, summary)
    gate = OutputGate(FILTERS.output_guard(), GEMINI.normalizer(summary), holds=True, split_raw=True, failure="closed")
    framing = select("application/json", 200, GEMINI.normalizer(summary).framing)
    auditor = StreamAuditor(record, GEMINI.normalizer(summary), None, 1 << 20, gate=gate, framing=framing)
    bounds = [0, *cuts, len(body)]
    sent = [auditor.feed(body[a:b]) for a, b in zip(bounds, bounds[1:]) if b > a]
    sent.append(auditor.finish())
    auditor.end()
    record.finish(OUTCOME_COMPLETE)
    return sent


def test_a_json_array_is_released_at_its_element_ends_the_bracket_and_the_padding_after_it() -> None:
    body = gemini_array(["Hello, ", "the weather ", "is fine."], tail=b"\r\n")
    boundaries = reported(JSONArrayReader(1 << 20), body, [])
    assert body.rindex(b"]") + 1 in boundaries and len(body) in boundaries
    for cuts in [[], byte_at_a_time(body), list(range(3, len(body), 11))]:
        sent = gated_array(body, cuts)
        assert set(cumulative(sent)) <= reported(JSONArrayReader(1 << 20), body, cuts), cuts
        assert b"".join(sent) == body


def test_a_json_array_cut_inside_an_element_keeps_that_element_back() -> None:
    whole = gemini_array(["Hello, ", "the weather "], tail=b"")
    cut_at = whole.index(b"the weather")
    sent = gated_array(whole[:cut_at], [10])
    released = b"".join(sent)
    assert released == whole[: whole.index(b",\r\n")]  # the first element, not the separator or the rest


def test_a_line_longer_than_the_limit_is_skipped_as_it_arrives_not_held():
    """A hostile upstream's endless line (blocking filters read every stream bounded)
    must not be kept: the reader holds at most the limit, records the line, and the
    events after it keep their boundaries."""
    from addon.framing.sse import SSEReader

    reader = SSEReader(1024)
    reader.feed_bounded(b"data: " + b"x" * 1000)
    most = 0
    for _ in range(200):
        assert reader.feed_bounded(b"x" * 4096) == []
        most = max(most, len(reader._line))
    assert most <= 1024
    assert [code for code, _ in reader.findings] == ["sse_line_too_long"]
    body_so_far = 6 + 1000 + 200 * 4096
    framed = reader.feed_bounded(b"\r\n\r\ndata: ok\n\n")
    assert framed[-1][0].data == "ok" and framed[-1][1] == body_so_far + 4 + 10
    assert all(frame is None or frame.data == "ok" for frame, _ in framed)
