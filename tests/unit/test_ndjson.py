"""The NDJSON framing (addon.framing.ndjson): lines and their boundaries, whatever the split;
CRLF, blank lines, a last line without LF, oversize lines (bounded), invalid bytes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from addon.framing import FRAMINGS, select
from addon.framing.ndjson import NDJSON_WRITER, NDJSONReader, reader
from addon.framing.sse import SSEEvent

BODY = b'{"a":1}\n\n{"b":"\xc3\xa4"}\r\n  \n{"c":[1,2]}\n'
LINES = ['{"a":1}', '{"b":"ä"}', '{"c":[1,2]}']
# a boundary just past every LF: three lines and two blank ones
BOUNDS = [(LINES[0], 8), (None, 9), (LINES[1], 21), (None, 24), (LINES[2], 36)]


def bounded(body: bytes, cuts: list[int], limit: int = 1 << 20) -> tuple[list[tuple[str | None, int]], NDJSONReader]:
    r = NDJSONReader(limit)
    out: list[tuple[str | None, int]] = []
    edges = [0, *cuts, len(body)]
    for a, b in zip(edges, edges[1:]):
        out += [(None if f is None else f.data, end) for f, end in r.feed_bounded(body[a:b])]
    out += [(f.data, len(body)) for f in r.end()]
    return out, r


def test_lines_and_boundaries_just_past_each_lf_crlf_tolerated_blank_lines_carry_no_frame():
    out, r = bounded(BODY, [])
    assert out == BOUNDS
    assert r.findings == [] and not r.pending_event and r.held == 0 and r.frames_read == 3


def test_every_split_and_byte_at_a_time_give_the_same_lines_and_boundaries():
    for cut in range(1, len(BODY)):
        assert bounded(BODY, [cut])[0] == BOUNDS, cut
    assert bounded(BODY, list(range(1, len(BODY))))[0] == BOUNDS


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, len(BODY) - 1), max_size=12).map(sorted))
def test_random_splits_give_the_same_lines(cuts: list[int]):
    assert bounded(BODY, cuts)[0] == BOUNDS


def test_feed_is_feed_bounded_without_the_boundaries():
    r = NDJSONReader(1 << 20)
    assert [f.data for f in r.feed(BODY[:10]) + r.feed(BODY[10:]) + r.end()] == LINES


def test_a_last_line_without_lf_is_a_frame_and_the_body_ended_inside_one():
    out, r = bounded(b'{"a":1}\n{"done":true}', [12])
    assert out == [('{"a":1}', 8), ('{"done":true}', 21)]
    assert r.pending_event and r.findings == []
    out, r = bounded(b'{"a":1}\n  ', [])  # trailing whitespace: not a line
    assert out == [('{"a":1}', 8)] and not r.pending_event


def test_held_counts_the_unterminated_line():
    r = NDJSONReader(1 << 20)
    r.feed_bounded(b'{"a":1}\n{"b"')
    assert r.held == 4 and r.pending_event
    r.feed_bounded(b":2}\n")
    assert r.held == 0 and not r.pending_event


def test_an_oversize_line_is_skipped_as_it_arrives_with_a_finding_memory_bounded():
    big = b'{"x":"' + b"y" * 100 + b'"}'
    body = b'{"a":1}\n' + big + b'\n{"b":2}\n'
    for cuts in ([], [20], list(range(1, len(body), 7))):
        out, r = bounded(body, cuts, limit=50)
        assert out == [('{"a":1}', 8), (None, 8 + len(big) + 1), ('{"b":2}', len(body))], cuts
        assert [code for code, _ in r.findings] == ["ndjson_line_too_long"]
    r = NDJSONReader(50)
    r.feed_bounded(b'{"x":"')
    for _ in range(100):  # a line that never ends keeps nothing past the limit
        r.feed_bounded(b"y" * 1000)
        assert len(r._line) <= 50
    assert r.held > 100_000 and r.pending_event  # its bytes still count, for a gate's policy
    assert r.end() == [] and r.pending_event and len(r.findings) == 1


def test_invalid_utf8_is_read_with_replacement_and_one_finding_never_raising():
    out, r = bounded(b'{"a":"\xff"}\n{"b":"\xfe"}\n', [])
    assert [line for line, _ in out] == ['{"a":"\ufffd"}', '{"b":"\ufffd"}']
    assert r.findings == [("response_invalid_utf8", "invalid UTF-8 at byte 6 of the body; read with U+FFFD")]
    _, r = bounded(b'{"a":1}\n\n{"b":"\xff"}', [12])  # the last line, without LF
    assert r.findings == [("response_invalid_utf8", "invalid UTF-8 at byte 15 of the body; read with U+FFFD")]
    out, r = bounded(b"not json\n\x00\x01\n", [3])  # not JSON: a line all the same (the dialect judges it)
    assert [line for line, _ in out] == ["not json", "\x00\x01"] and r.findings == []


def test_writer_output_reads_back_as_the_same_lines():
    frames = [SSEEvent(data=line) for line in LINES]
    encoded = NDJSON_WRITER.encode(frames, True)
    assert encoded == "".join(line + "\n" for line in LINES).encode()
    assert [f.data for f in NDJSONReader(1 << 20).feed(encoded)] == LINES
    assert NDJSON_WRITER.encode([], False) == b""


def test_selected_by_its_media_type_and_by_a_dialect_that_expects_it():
    assert select("application/x-ndjson; charset=utf-8", 200, None).name == "ndjson"
    assert select("application/json", 200, "ndjson").name == "ndjson"  # some servers label it otherwise
    assert select("application/json", 400, "ndjson").name == "whole"  # an error body is whole
    assert select("application/json", 200, "sse").name == "whole"  # unchanged for the others
    assert FRAMINGS["ndjson"].reader(10, 0, {}).max_event_bytes == 10
    assert isinstance(reader(10, 0, {}), NDJSONReader)
