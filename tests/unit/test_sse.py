"""Tests for addon.framing.sse: the WHATWG event-stream parser.

Three layers:

* test vectors (the shared reference set, when present, and our own fixture file), each
  fed whole, in the source's own chunks, split in two at every position and one byte at
  a time - the expected events must hold for any chunking;
* property tests: any chunking gives what feeding the body whole gives, and both agree
  with a deliberately naive reference parser written straight from the spec (below);
* named tests for the limits, the findings and the API other modules rely on.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import sys
from contextlib import contextmanager
from pathlib import Path
from unittest.mock import patch

import pytest
from fixtures.sse_fragments import FRAGMENTS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import addon.framing.sse_parser as sse_module  # the parser in use: compiled or pure
from addon.framing import DEFAULT_MAX_EVENT_BYTES
from addon.framing.sse import SSEEvent, SSEParser

REPO = Path(__file__).resolve().parents[2]
SHARED_REFERENCE = REPO.parent / "shared" / "reference"
SHARED_VECTORS = SHARED_REFERENCE / "sse-vectors.json"
STREAMS = SHARED_REFERENCE / "streams"
OWN_VECTORS = REPO / "tests" / "fixtures" / "sse_vectors_own.json"

MiB = 1024 * 1024


# --------------------------------------------------------------------------- helpers


def parse(chunks, **kwargs):
    """Feed ``chunks`` then end(); return the parser and all events."""
    parser = SSEParser(**kwargs)
    events = []
    for chunk in chunks:
        events += parser.feed(chunk)
    events += parser.end()
    return parser, events


def as_dicts(events):
    return [{"event": e.event, "data": e.data, "id": e.id} for e in events]


def outcome(chunks, **kwargs):
    """Everything observable after parsing, for comparing chunkings."""
    parser, events = parse(chunks, **kwargs)
    return (
        events,
        parser.last_event_id,
        parser.retry,
        parser.findings,
        parser.events_dispatched,
        parser.pending_event,
    )


def split_at(data: bytes, cuts) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


def bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


def reference_parse(body: bytes):
    """The WHATWG algorithm, written for obviousness rather than speed.

    Whole body at once, a character loop for line ends, no fast paths: the incremental
    parser must agree with this on every input and every chunking.
    """
    text = body.decode("utf-8", errors="replace")
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = []
    start = i = 0
    while i < len(text):
        c = text[i]
        if c == "\r":
            lines.append(text[start:i])
            i += 2 if text[i + 1 : i + 2] == "\n" else 1
            start = i
        elif c == "\n":
            lines.append(text[start:i])
            i += 1
            start = i
        else:
            i += 1
    # text[start:] has no line end: discarded (end of stream is not a line end)
    data, event_type, id_buffer, last_event_id, retry = "", "", "", "", None
    events = []
    for line in lines:
        if line == "":
            last_event_id = id_buffer
            if data == "":
                event_type = ""
                continue
            if data.endswith("\n"):
                data = data[:-1]
            events.append(SSEEvent(event_type or "message", data, last_event_id, retry))
            data, event_type = "", ""
            continue
        if line.startswith(":"):
            continue
        if ":" in line:
            name, value = line.split(":", 1)
            if value.startswith(" "):
                value = value[1:]
        else:
            name, value = line, ""
        if name == "event":
            event_type = value
        elif name == "data":
            data += value + "\n"
        elif name == "id":
            if "\0" not in value:
                id_buffer = value
        elif name == "retry":
            if value and all(ch in "0123456789" for ch in value):
                retry = int(value)
    return events, last_event_id, retry


# --------------------------------------------------------------------------- vectors


def _load_vectors(path: Path):
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def vector_bytes(vector) -> bytes:
    if "input_hex" in vector:
        return bytes.fromhex(vector["input_hex"])
    return vector["input"].encode("utf-8")


def vector_chunkings(vector, kind):
    """The chunkings of one kind for a vector (None: the kind does not apply)."""
    data = vector_bytes(vector)
    if kind == "whole":
        return [[data]]
    if kind == "source_chunks":
        if "chunks_hex" in vector:
            return [[bytes.fromhex(c) for c in vector["chunks_hex"]]]
        if "chunks" in vector:
            return [[c.encode("utf-8") for c in vector["chunks"]]]
        return None
    if kind == "every_two_way_split":
        if len(data) > 400:
            return None
        return [[data[:i], data[i:]] for i in range(len(data) + 1)]
    if kind == "byte_at_a_time":
        return [bytewise(data)]
    raise AssertionError(kind)


CHUNKING_KINDS = ["whole", "source_chunks", "every_two_way_split", "byte_at_a_time"]


def _vector_cases(path: Path, what: str):
    """(vector, chunking kind) pairs, leaving out kinds that do not apply to a vector."""
    vectors = _load_vectors(path)
    if vectors is None:
        return [pytest.param(None, None, marks=pytest.mark.skip(reason=f"{what} not found at {path}"))]
    return [
        pytest.param(v, kind, id=f"{v['name']}-{kind}")
        for v in vectors
        for kind in CHUNKING_KINDS
        if vector_chunkings(v, kind) is not None
    ]


@pytest.fixture(params=["bulk-path-default", "bulk-path-forced"])
def bulk_path(request, monkeypatch):
    """Run a test as is, and again with the parser's bulk path tried on every chunk.

    The bulk path (SSEParser._fast_blocks) normally starts at a few hundred characters of
    complete lines, which short vectors never reach; forcing it makes every vector check
    that path's shape verification as well.
    """
    if request.param == "bulk-path-forced":
        monkeypatch.setattr(sse_module, "_FAST_MIN_CHARS", 1)
    return request.param


@contextmanager
def bulk_path_forced():
    with patch.object(sse_module, "_FAST_MIN_CHARS", 1):
        yield


def check_vector(vector, kind):
    for chunks in vector_chunkings(vector, kind):
        parser, events = parse(chunks)
        where = f"{vector['name']} fed as {chunks!r}"
        assert as_dicts(events) == vector["expected"], where
        if "retry" in vector:
            assert parser.retry == vector["retry"], where
        if "final_last_event_id" in vector:
            assert parser.last_event_id == vector["final_last_event_id"], where
        assert parser.events_dispatched == len(events), where


@pytest.mark.parametrize(("vector", "kind"), _vector_cases(SHARED_VECTORS, "shared SSE vectors"))
def test_shared_vector_gives_expected_events_for_any_chunking(vector, kind, bulk_path):
    check_vector(vector, kind)


@pytest.mark.parametrize(("vector", "kind"), _vector_cases(OWN_VECTORS, "own SSE vectors"))
def test_own_vector_gives_expected_events_for_any_chunking(vector, kind, bulk_path):
    check_vector(vector, kind)


def test_own_vector_file_covers_the_rules():
    vectors = json.loads(OWN_VECTORS.read_text(encoding="utf-8"))
    assert len(vectors) >= 25
    assert len({v["name"] for v in vectors}) == len(vectors)
    for v in vectors:
        assert set(v) <= {
            "name",
            "source",
            "input",
            "input_hex",
            "chunks",
            "chunks_hex",
            "expected",
            "retry",
            "final_last_event_id",
            "notes",
        }
        if "chunks" in v:
            assert "".join(v["chunks"]) == v["input"]
        if "chunks_hex" in v:
            assert "".join(v["chunks_hex"]) == v["input_hex"]


@pytest.mark.parametrize("vector", [pytest.param(v, id=v["name"]) for v in _load_vectors(OWN_VECTORS)])
def test_own_vector_agrees_with_reference_parser(vector):
    events, last_event_id, retry = reference_parse(vector_bytes(vector))
    assert as_dicts(events) == vector["expected"]
    if "retry" in vector:
        assert retry == vector["retry"]
    if "final_last_event_id" in vector:
        assert last_event_id == vector["final_last_event_id"]


# --------------------------------------------------------------------------- recorded streams


def _stream_files():
    if not STREAMS.is_dir():
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"no recorded streams at {STREAMS}"))]
    return [pytest.param(p, id=p.name) for p in sorted(STREAMS.glob("*.sse"))]


@pytest.mark.parametrize("path", _stream_files())
def test_recorded_stream_parses_identically_in_any_chunking(path):
    body = path.read_bytes()
    ref_events, ref_last_id, ref_retry = reference_parse(body)
    expected_json = STREAMS / "expected.json"
    if expected_json.exists():
        expected = json.loads(expected_json.read_text(encoding="utf-8")).get(path.name, {})
        if "sse_events" in expected:
            assert len(ref_events) == expected["sse_events"]
    whole = outcome([body])
    assert whole[0] == ref_events
    assert (whole[1], whole[2]) == (ref_last_id, ref_retry)
    for size in (1, 7, 100, 4096, 16384):
        chunks = [body[i : i + size] for i in range(0, len(body), size)]
        assert outcome(chunks) == whole, f"chunk size {size}"
    per_event = [piece + b"\n\n" for piece in body.split(b"\n\n")]
    per_event[-1] = per_event[-1][:-2]
    assert outcome(per_event) == whole, "one block per chunk"


def _llm_stream(n_events: int, shape: str, newline: str = "\n") -> bytes:
    out = []
    for i in range(n_events):
        payload = json.dumps(
            {
                "v": "1.0",
                "seq": i,
                "type": "content.delta",
                "delta": {"text": f" tok{i} ’é😀" if i % 7 == 0 else f" t{i}"},
            },
            ensure_ascii=False,
            separators=(",", ":"),
        )
        lines = {
            "data": [f"data: {payload}"],
            "event-data": ["event: content.delta", f"data: {payload}"],
            "id-event-data": [f"id: {i}", "event: content.delta", f"data: {payload}"],
        }[shape]
        out.append(newline.join(lines) + newline * 2)
    return "".join(out).encode("utf-8")


@pytest.mark.parametrize("newline", ["\n", "\r\n"], ids=["lf", "crlf"])
@pytest.mark.parametrize("shape", ["data", "event-data", "id-event-data"])
def test_large_uniform_stream_gives_same_events_in_any_chunk_size(shape, newline):
    body = _llm_stream(3000, shape, newline)
    expected = reference_parse(body)
    assert len(expected[0]) == 3000
    for size in (16384, 4096, 1000, 97, 13):
        chunks = [body[i : i + size] for i in range(0, len(body), size)]
        events, last_event_id, retry, findings, n, _pending = outcome(chunks)
        assert (events, last_event_id, retry) == expected, f"chunk size {size}"
        assert findings == [] and n == 3000
    per_event = [block + newline.encode() * 2 for block in body.split(newline.encode() * 2)[:-1]]
    assert outcome(per_event)[0] == expected[0]


def test_one_block_per_chunk_of_any_size_matches_reference_parser():
    """The single-block path (any size, with id / event lines) against the reference, also for
    the blocks it must leave to the generic path, fed one block per chunk and in slices."""
    big = "x" * 5000
    blocks = [
        f"data: {big}\n\n",
        f"event: a\ndata: {big}\n\n",
        f"id: 7\nevent: b\ndata: {big}\n\n",
        f"id: 8\ndata: {big}\n\n",
        "data:no-space\n\n",
        f"event: \ndata: {big}\n\n",
        "id: 9\n\n",
        "event: only\n\n",
        "id: a\0b\ndata: nul id\n\n",
        f": comment\ndata: {big}\n\n",
        "retry: 5\ndata: r\n\n",
        f"data: {big}\ndata: second\n\n",
        "event:tight\ndata: t\n\n",
        f"data: {big}\r\n\r\n",
        "id:x\ndata: y\n\n",
    ]
    body = "".join(blocks).encode()
    expected = reference_parse(body)
    assert outcome([b.encode() for b in blocks])[:3] == expected
    for size in (16384, 4096, 1460, 97):
        assert outcome([body[i : i + size] for i in range(0, len(body), size)])[:3] == expected, size


def test_data_line_ending_in_a_later_chunk_matches_reference_parser():
    """A block whose last data line ends in a later chunk than it began (how a large event
    arrives at 16 KiB reads), its field lines before it in earlier chunks or not: the
    parser finishes it without the generic path (SSEParser._last_data_line and
    _pending_data_line) - the same events, ids, findings and state as the whole body, also
    at size limits just around the event's data, the line held in one piece or many."""
    big = "x" * 1200
    blocks = [
        f"event: a\ndata: {big}\n\n",
        f"id: 5\nevent: b\ndata:{big}\n\n",
        f"event: c\ndata: first\ndata: {big}\n\n",
        f"data: first\ndata:  {big}\n\n",
        "event: d\ndata:\n\n",
        f"event: e\ndata: {big}\ndata: after\n\n",
        f"event: f\ndata: {big}\n: comment\n\n",
        f"retry: 9\ndata: {big}\n\n",
        f"data: {big}\n\n",
        f"data:{big}\n\n",
        f"data:{big}\nevent: late\n\n",
        f"id: 6\ndata: {big}\n\n",
    ]
    for block in blocks:
        body = (block + "data: next\n\n").encode()
        data_at = body.rfind(b"data:", 0, len(block))
        cuts = {*range(max(1, data_at - 3), data_at + 8), *range(len(block) - 8, len(block) + 1)}
        reference = reference_parse(body)
        for limit in (DEFAULT_MAX_EVENT_BYTES, len(big) - 1, len(big), len(big) + 1, len(big) + 7):
            whole = outcome([body], max_event_bytes=limit)
            if limit == DEFAULT_MAX_EVENT_BYTES:
                assert whole[:3] == reference, block
            for cut in sorted(cuts):
                for chunks in (
                    split_at(body, [cut]),
                    split_at(body, [4, cut]),
                    split_at(body, [*range(0, cut, 97), cut]),
                ):
                    assert outcome(chunks, max_event_bytes=limit) == whole, (block, limit, cut)
                    with bulk_path_forced(), patch.object(sse_module, "_BIG_LINE_CHARS", 1):
                        assert outcome(chunks, max_event_bytes=limit) == whole, (block, limit, cut)
                    with patch.object(sse_module, "_BIG_LINE_CHARS", 1):  # every held line finished on its own
                        assert outcome(chunks, max_event_bytes=limit) == whole, (block, limit, cut)


def test_a_data_line_held_past_the_big_line_size_is_finished_on_its_own():
    """At the real threshold: a held data line of _BIG_LINE_CHARS or more takes the shortcut
    (the test above forces it for shorter lines), with the same result as the whole body."""
    big = "y" * (sse_module._BIG_LINE_CHARS + 100)
    for block in (f"data: {big}\n\n", f"event: t\ndata: {big}\n\n"):
        body = (block + "data: next\n\n").encode()
        whole = outcome([body])
        for size in (97, 1460, 4096):
            assert outcome([body[i : i + size] for i in range(0, len(body), size)]) == whole, (block, size)


def test_accepts_bytearray_and_memoryview_chunks():
    parser = SSEParser()
    events = parser.feed(bytearray(b"data: \xe2")) + parser.feed(memoryview(b"\x82\xac\n\n"))
    assert events == [SSEEvent("message", "€", "", None)]


# --------------------------------------------------------------------------- properties

sse_bodies = st.lists(st.sampled_from(FRAGMENTS), max_size=60).map(b"".join)
cut_lists = st.lists(st.integers(min_value=0, max_value=10_000), max_size=12)

# Field values for structured bodies: anything but CR and LF.
values = st.text(
    alphabet=st.sampled_from(list('ab {}":,\t\x00\u2028\u0085\ufeff\ufffd\xe9\U0001f600') + [" "]),
    max_size=12,
)


@st.composite
def uniform_runs(draw):
    """Bodies made mostly of uniform blocks (the parser's bulk path), with odd ones mixed in."""
    shapes = [("data",), ("event", "data"), ("id", "event", "data"), ("id", "data")]
    shape = draw(st.sampled_from(shapes))
    blocks = []
    for _ in range(draw(st.integers(min_value=0, max_value=40))):
        kind = draw(st.integers(min_value=0, max_value=9))
        if kind < 7:  # a block of the run's shape
            lines = [f"{name}: {draw(values)}" for name in shape]
        else:  # anything else: other spellings, comments, multi-line data, retry ...
            lines = draw(
                st.lists(
                    st.one_of(
                        st.builds(
                            lambda n, sep, v: f"{n}{sep}{v}",
                            st.sampled_from(["data", "event", "id", "retry", "x", ""]),
                            st.sampled_from([":", ": ", ":  ", ""]),
                            values,
                        ),
                        st.sampled_from([": ping", "retry: 3000", "data", "id", "event: "]),
                    ),
                    max_size=4,
                )
            )
        blocks.append("\n".join(lines) + "\n\n")
    body = "".join(blocks)
    if draw(st.booleans()):
        body = body.replace("\n", draw(st.sampled_from(["\r\n", "\r"])))
    return (body + draw(st.sampled_from(["", "data: tail", "event: x\n"]))).encode("utf-8")


@settings(max_examples=300, deadline=None)
@given(body=sse_bodies, cuts=cut_lists)
def test_random_chunking_gives_same_result_as_whole_body(body, cuts):
    whole = outcome([body])
    assert outcome(split_at(body, cuts)) == whole
    with bulk_path_forced():
        assert outcome(split_at(body, cuts)) == whole
        assert outcome([body]) == whole


@settings(max_examples=300, deadline=None)
@given(body=sse_bodies, cuts=cut_lists)
def test_random_bodies_match_reference_parser(body, cuts):
    events, last_event_id, retry, *_ = outcome(split_at(body, cuts))
    assert (events, last_event_id, retry) == reference_parse(body)


@settings(max_examples=300, deadline=None)
@given(
    body=sse_bodies,
    ends=st.lists(st.sampled_from(["\n", "\r\n", "\r", "\r\r\n", "\n\r"]), min_size=1, max_size=8),
    cuts=cut_lists,
)
def test_line_ends_mixed_within_a_chunk_match_reference_parser(body, ends, cuts):
    """Each line end drawn apart (CRLF beside lone CRs, CR CR LF): a chunk whose CRs all
    start a CRLF is folded by deleting them, any other the long way; both must agree."""
    pieces = body.split(b"\n")
    mixed = b"".join(p + ends[i % len(ends)].encode() for i, p in enumerate(pieces[:-1])) + pieces[-1]
    expected = reference_parse(mixed)
    for chunks in ([mixed], split_at(mixed, cuts)):
        events, last_event_id, retry, *_ = outcome(chunks)
        assert (events, last_event_id, retry) == expected


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=uniform_runs(), cuts=cut_lists)
def test_uniform_event_runs_match_reference_parser_in_any_chunking(body, cuts):
    expected = reference_parse(body)
    whole = outcome([body])
    assert whole[:3] == expected
    assert outcome(split_at(body, cuts)) == whole
    with bulk_path_forced():
        assert outcome([body]) == whole
        assert outcome(split_at(body, cuts)) == whole


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.one_of(sse_bodies, uniform_runs()), cuts=cut_lists, limit=st.integers(min_value=1, max_value=40))
def test_size_limits_give_same_result_for_any_chunking(body, cuts, limit):
    def result(chunks):
        # The order of findings of different kinds follows the order in which the bytes
        # revealed them (an invalid byte may arrive before or after a line grew too long).
        events, last_id, retry, findings, n, pending = outcome(chunks, max_event_bytes=limit)
        return events, last_id, retry, sorted(findings), n, pending

    whole = result([body])
    assert result(split_at(body, cuts)) == whole
    assert result(bytewise(body)) == whole
    with bulk_path_forced():
        assert result(split_at(body, cuts)) == whole


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=300), cuts=cut_lists)
def test_arbitrary_bytes_never_raise(body, cuts):
    _parser, _events = parse(split_at(body, cuts))


# --------------------------------------------------------------------------- line ends, BOM, decoding


def test_cr_at_chunk_end_then_lf_is_one_line_end():
    _p, events = parse([b"data: a\r", b"\ndata: b\r", b"\n", b"\r", b"\n"])
    assert as_dicts(events) == [{"event": "message", "data": "a\nb", "id": ""}]


def test_cr_at_end_of_chunk_ends_the_line_immediately():
    parser = SSEParser()
    assert parser.feed(b"data: a\n\r") == [SSEEvent("message", "a", "", None)]


def test_lf_is_swallowed_only_when_it_directly_follows_the_cr():
    # an empty chunk between the CR and its LF changes nothing
    _p, events = parse([b"data: a\r", b"", b"\n", b"\n"])
    assert [e.data for e in events] == ["a"]
    # CR, then CR: the second CR is a blank line (dispatch), its LF is swallowed
    _p, events = parse([b"data: a\r", b"\r", b"\ndata: b\n\n"])
    assert [e.data for e in events] == ["a", "b"]
    # after any other character the next LF is an ordinary line end
    _p, events = parse([b"data: a\r", b"data: b", b"\n", b"\n"])
    assert [e.data for e in events] == ["a\nb"]


def test_split_bom_is_stripped_once():
    _p, events = parse([b"\xef", b"\xbb", b"\xbf", b"\xef\xbb\xbfdata: x\n\n", b"data: y\n\n"])
    assert [e.data for e in events] == ["y"]  # the second BOM makes '\ufeffdata' unknown


def test_end_of_body_is_not_a_line_end():
    _p, events = parse([b"data: a\n\ndata: b\n"])
    assert [e.data for e in events] == ["a"]


def test_multibyte_character_split_across_chunks_is_kept_whole():
    body = "data: ünï€😀\n\n".encode()
    _p, events = parse(bytewise(body))
    assert events[0].data == "ünï€😀"


def test_characters_splitlines_would_break_on_stay_in_data():
    weird = "\u2028\u2029\x85\x0b\x0c\x1c\x1d\x1e"
    _p, events = parse([f"data: a{weird}b\n\n".encode()])
    assert events[0].data == f"a{weird}b"


def test_invalid_utf8_is_replaced_and_reported_once_with_offset():
    body = b"data: a\xffb\n\ndata: \xc3(\n\n"
    for chunks in ([body], bytewise(body), [body[:7], body[7:]]):
        parser, events = parse(chunks)
        assert [e.data for e in events] == ["a\ufffdb", "\ufffd("]
        assert parser.findings == [("sse_invalid_utf8", "invalid UTF-8 at about byte 7 of the body; read as U+FFFD")]


def test_invalid_continuation_after_chunk_boundary_reports_start_of_sequence():
    parser, events = parse([b"data: \xe2\x82", b"A\n\n"])
    assert events[0].data == "\ufffdA"
    assert parser.findings == [("sse_invalid_utf8", "invalid UTF-8 at about byte 6 of the body; read as U+FFFD")]


def test_real_replacement_character_is_not_reported():
    body = "data: \ufffd\ufffd\n\n".encode()
    for chunks in ([body], bytewise(body)):
        parser, events = parse(chunks)
        assert events[0].data == "\ufffd\ufffd"
        assert parser.findings == []


def test_character_cut_by_end_of_body_is_reported():
    parser, events = parse([b"data: a\n\ndata: \xe2\x82"])
    assert [e.data for e in events] == ["a"]
    assert parser.findings == [("sse_invalid_utf8", "invalid UTF-8 at about byte 15 of the body; read as U+FFFD")]
    assert parser.pending_event


# --------------------------------------------------------------------------- fields and dispatch


def test_event_carries_the_retry_in_effect_after_its_block():
    _p, events = parse([b"data: a\n\nretry: 100\ndata: b\n\ndata: c\n\nretry: x\ndata: d\n\nretry: 200\ndata: e\n\n"])
    assert [e.retry for e in events] == [None, 100, 100, 100, 200]


def test_id_persists_and_id_only_block_updates_last_event_id():
    parser, events = parse([b"id: 1\ndata: a\n\ndata: b\n\nid: 2\n\n"])
    assert [e.id for e in events] == ["1", "1"]
    assert parser.last_event_id == "2"


def test_id_with_nul_is_ignored():
    parser, events = parse([b"id: 1\n\nid: 2\x003\ndata: a\n\n"])
    assert events[0].id == "1"
    assert parser.last_event_id == "1"


def test_data_less_block_dispatches_nothing_but_resets_event_type():
    _p, events = parse([b"event: ping\n\ndata: a\n\n"])
    assert events == [SSEEvent("message", "a", "", None)]


def test_retry_accepts_only_ascii_digits():
    for value, expected in [
        (b"2000", 2000),
        (b"02000", 2000),
        (b"-1", None),
        (b" 10", None),
        (b"", None),
        (b"1.5", None),
        (b"\xd9\xa1", None),
        (b"10 ", None),
    ]:
        parser, _ = parse([b"retry: " + value + b"\n\n"])
        assert parser.retry == expected, value


def test_retry_with_more_digits_than_int_conversion_allows_is_ignored():
    parser, _ = parse([b"retry: 5\n\nretry: " + b"9" * 10_000 + b"\n\n"])
    assert parser.retry == 5


def test_field_names_are_case_sensitive():
    _p, events = parse([b"DATA: a\nData: b\nEVENT: x\ndata: c\n\n"])
    assert events == [SSEEvent("message", "c", "", None)]


# --------------------------------------------------------------------------- findings


def test_complete_stream_has_no_findings():
    parser, events = parse([b": hi\n\nevent: e\ndata: 1\n\n"])
    assert len(events) == 1
    assert parser.findings == []


def test_pending_event_tells_whether_the_body_ended_inside_an_event():
    # The parser reports no finding for it: the auditor decides (a connection cut by the
    # upstream is reported differently), so it only exposes the fact.
    for tail in (b"data: partial", b"data: partial\n", b"event: x\n", b"id: 3\n", b"x"):
        parser, events = parse([b"data: a\n\n" + tail])
        assert [e.data for e in events] == ["a"]
        assert parser.pending_event, tail
        assert parser.findings == [], tail


def test_body_ending_after_blank_line_or_comment_is_not_inside_an_event():
    for tail in (b"", b"\n", b": keep-alive\n", b": keep-alive", b"\r"):
        parser, _ = parse([b"data: a\n\n" + tail])
        assert not parser.pending_event, tail
        assert parser.findings == [], tail


def test_pending_event_while_streaming_and_after_a_new_body_starts():
    parser = SSEParser()
    assert not parser.pending_event
    parser.feed(b"event: e\nda")
    assert parser.pending_event
    parser.feed(b"ta: 1\n\n")
    assert not parser.pending_event
    parser.feed(b"data: cut")
    parser.end()
    assert parser.pending_event  # stays readable after end()
    parser.feed(b": next body\n")
    assert not parser.pending_event


# --------------------------------------------------------------------------- limits


def test_oversize_line_drops_its_event_and_parsing_resumes():
    limit = 1000
    body = b"data: a\ndata: " + b"x" * 5000 + b"\ndata: b\nid: 5\n\nevent: next\ndata: ok\n\n"
    for chunks in ([body], [body[i : i + 64] for i in range(0, len(body), 64)], bytewise(body)):
        parser, events = parse(chunks, max_event_bytes=limit)
        assert events == [SSEEvent("next", "ok", "", None)]
        assert parser.findings == [("sse_line_too_long", f"line longer than {limit} characters; skipped")]
        assert parser.events_dispatched == 1


def test_oversize_comment_line_drops_only_that_line():
    body = b"data: a\n: " + b"z" * 5000 + b"\ndata: b\n\n"
    for chunks in ([body], [body[i : i + 100] for i in range(0, len(body), 100)]):
        parser, events = parse(chunks, max_event_bytes=1000)
        assert [e.data for e in events] == ["a\nb"]
        assert [code for code, _ in parser.findings] == ["sse_line_too_long"]


def test_oversize_line_ending_in_cr_split_from_its_lf():
    # While skipping an oversize line, a CR at a chunk end still pairs with the next LF:
    # read as two line ends, the LF would end the dropped event early and let "b" out.
    chunks = [b"data: " + b"x" * 3000, b"xxx\r", b"\n", b"data: b\n", b"\n", b"data: ok\n\n"]
    for whole_line in (False, True):
        if whole_line:  # the same with the oversize line complete within one chunk
            chunks = [chunks[0] + chunks[1], *chunks[2:]]
        parser, events = parse(chunks, max_event_bytes=1000)
        assert [e.data for e in events] == ["ok"]
        assert [code for code, _ in parser.findings] == ["sse_line_too_long"]


def test_oversize_event_is_dropped_and_next_event_is_intact():
    limit = 1000
    block = b"id: 4\n" + b"data: " + b"y" * 90 + b"\n"
    body = block + (b"data: " + b"y" * 90 + b"\n") * 20 + b"id: 9\nevent: big\n\nevent: next\ndata: ok\n\n"
    for chunks in ([body], [body[i : i + 50] for i in range(0, len(body), 50)]):
        parser, events = parse(chunks, max_event_bytes=limit)
        # lines after the overflow (id: 9) are skipped with the event; the id before it counts
        assert events == [SSEEvent("next", "ok", "4", None)]
        assert parser.findings == [("sse_event_too_long", f"event data longer than {limit} characters; event skipped")]


def test_event_under_the_limit_is_delivered():
    data = "d" * 900
    parser, events = parse([f"data: {data}\n\n".encode()], max_event_bytes=1000)
    assert events[0].data == data
    assert parser.findings == []


def test_50mb_line_does_not_grow_memory():
    parser = SSEParser(max_event_bytes=MiB)
    chunk = b"x" * (64 * 1024)
    assert parser.feed(b"data: ") == []
    peak = 0
    for _ in range(50 * 16):  # 50 MiB
        assert parser.feed(chunk) == []
        peak = max(peak, parser.buffered_chars)
    assert peak < 2 * MiB
    events = parser.feed(b"\n\ndata: after\n\n") + parser.end()
    assert [e.data for e in events] == ["after"]
    assert [code for code, _ in parser.findings] == ["sse_line_too_long"]


def test_50mb_event_of_many_lines_does_not_grow_memory():
    parser = SSEParser(max_event_bytes=MiB)
    line = b"data: " + b"v" * 1017 + b"\n"  # 1 KiB lines
    chunk = line * 64  # 64 KiB
    peak = 0
    for _ in range(50 * 16):
        assert parser.feed(chunk) == []
        peak = max(peak, parser.buffered_chars)
    assert peak < 2 * MiB
    events = parser.feed(b"\ndata: after\n\n") + parser.end()
    assert [e.data for e in events] == ["after"]
    assert [code for code, _ in parser.findings] == ["sse_event_too_long"]


def test_long_line_arriving_byte_by_byte_is_not_kept_as_many_pieces():
    parser = SSEParser()
    n = 100_000
    parser.feed(b"data: ")
    for _ in range(n):
        parser.feed(b"q")
    # pieces are merged as they come, so joining the line later is linear, not quadratic
    assert len(parser._pending) < n // 100
    assert parser.buffered_chars == n + len("data: ")
    events = parser.feed(b"\n\n")
    assert events[0].data == "q" * n


# --------------------------------------------------------------------------- API


def test_sse_event_is_a_frozen_slotted_dataclass():
    ev = SSEEvent("e", "d", "1", 5)
    assert dataclasses.is_dataclass(ev)
    assert not hasattr(ev, "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        ev.data = "x"
    assert ev == SSEEvent(event="e", data="d", id="1", retry=5)
    assert SSEEvent() == SSEEvent("message", "", "", None)
    assert hash(ev) == hash(SSEEvent("e", "d", "1", 5))


def test_parsed_events_equal_constructed_ones():
    _p, events = parse([b"id: 3\nretry: 10\nevent: e\ndata: d\n\n" * 40])
    assert set(events) == {SSEEvent("e", "d", "3", 10)}
    assert repr(events[0]) == "SSEEvent(event='e', data='d', id='3', retry=10)"


def test_parser_defaults_and_counters():
    parser = SSEParser()
    assert parser.max_event_bytes == DEFAULT_MAX_EVENT_BYTES == 8 * MiB
    assert (parser.last_event_id, parser.retry, parser.findings, parser.events_dispatched) == ("", None, [], 0)
    assert parser.feed(b"") == []
    assert parser.buffered_chars == 0
    events = parser.feed(b"data: a\n\ndata: b\n\n")
    assert parser.events_dispatched == 2 == len(events)
    assert parser.end() == []


def test_feed_after_end_starts_a_new_body_keeping_id_and_retry():
    parser = SSEParser()
    parser.feed(b"retry: 7\nid: 5\ndata: a\n\ndata: cut")
    parser.end()
    events = parser.feed(b"\xef\xbb\xbfdata: b\n\n")  # a new body may start with a BOM again
    assert events == [SSEEvent("message", "b", "5", 7)]


def test_id_of_unterminated_block_does_not_leak_into_next_body():
    parser = SSEParser()
    parser.feed(b"id: 1\ndata: a\n\nid: 2\n")
    parser.end()
    assert parser.feed(b"\ndata: b\n\n") == [SSEEvent("message", "b", "1", None)]
    assert parser.last_event_id == "1"


@pytest.mark.parametrize("name", ["sse.py", "sse_parser.py", "sse_event.py"])
def test_module_uses_only_the_standard_library(name):
    import addon.framing

    tree = ast.parse((Path(addon.framing.__file__).parent / name).read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            imported.add("addon.framing" if module.startswith("addon.framing") else module.split(".")[0])
    assert imported <= set(sys.stdlib_module_names) | {"__future__", "addon.framing"}, imported
