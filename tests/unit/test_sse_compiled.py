"""The compiled SSE parser gives exactly what the pure-Python one gives.

``setup.py`` compiles ``addon/framing/sse_parser.py`` with mypyc where a C compiler
exists; the pure module is the fallback everywhere else, and the compiled copy must not
differ from it in any observable way. Here both are fed the same bodies in the same
chunks (every two-way split, byte by byte, random splits) and everything they report is
compared: events, findings, last event id, retry, counters, whether the body ended
inside an event, and the reader's boundaries. The pure module is loaded from the
``.py`` file under another name, so it runs even while the compiled copy is installed.
Without a compiled copy (no compiler at install) the comparison is skipped; test_sse.py
then checks the pure module on its own, as always.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from fixtures.sse_fragments import FRAGMENTS as SSE_FRAGMENTS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import addon.framing.sse as sse
import addon.framing.sse_parser as installed

REPO = Path(__file__).resolve().parents[2]
SHARED_VECTORS = REPO.parent / "shared" / "reference" / "sse-vectors.json"
OWN_VECTORS = REPO / "tests" / "fixtures" / "sse_vectors_own.json"


def _load_pure():
    source = Path(installed.__file__).with_name("sse_parser.py")
    spec = importlib.util.spec_from_file_location("_sse_parser_pure_for_tests", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


PURE = _load_pure()
pytestmark = pytest.mark.skipif(not sse.COMPILED, reason="the compiled SSE parser is not built here (no compiler?)")


def test_the_installed_parser_is_the_compiled_one_and_the_pure_one_is_python():
    assert installed.__file__.endswith(".so")
    assert PURE.__file__.endswith(".py")
    assert sse.SSEParser is installed.SSEParser and PURE.SSEParser is not installed.SSEParser


def run(module, chunks, limit=None, bounded=False):
    """Everything observable after feeding ``chunks`` to one module's parser (or reader)."""
    kwargs = {} if limit is None else {"max_event_bytes": limit}
    if bounded:
        parser = module.SSEReader(**kwargs)
        out = [parser.feed_bounded(c) for c in chunks]
        held = parser.held
    else:
        parser = module.SSEParser(**kwargs)
        out = [parser.feed(c) for c in chunks]
        held = parser.buffered_chars
    pending = parser.pending_event
    parser.end()
    return (
        out,
        held,
        pending,
        parser.pending_event,
        parser.last_event_id,
        parser.retry,
        parser.findings,
        parser.events_dispatched,
    )


def same(chunks, limit=None):
    for bounded in (False, True):
        assert run(installed, chunks, limit, bounded) == run(PURE, chunks, limit, bounded), (chunks, limit, bounded)


def split_at(data: bytes, cuts) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


def _vectors():
    out = []
    for path in (SHARED_VECTORS, OWN_VECTORS):
        if path.exists():
            for v in json.loads(path.read_text(encoding="utf-8")):
                data = bytes.fromhex(v["input_hex"]) if "input_hex" in v else v["input"].encode("utf-8")
                out.append(pytest.param(data, id=f"{path.stem}-{v['name']}"))
    return out


@pytest.mark.parametrize("body", _vectors())
def test_vectors_give_the_same_at_every_split_and_byte_by_byte(body):
    same([body])
    same([body[i : i + 1] for i in range(len(body))])
    for i in range(len(body) + 1):
        same([body[:i], body[i:]])


# Streams like the dialects' (ASCII, non-ASCII-heavy, CRLF, one event per chunk, huge
# events), split the ways a network splits them.
DELTA = 'event: content.delta\ndata: {"type":"content.delta","delta":{"text":"%s"}}\n\n'
STREAMS = {
    "ascii": "".join(DELTA % f" tok{i}" for i in range(400)).encode(),
    "japanese-emoji": "".join(DELTA % f"日本語のテキスト🎉{i}" for i in range(400)).encode(),
    "openai-crlf": "".join(f'data: {{"i":{i},"t":"é"}}\r\n\r\n' for i in range(400)).encode() + b"data: [DONE]\r\n\r\n",
    "ids-comments-retry": b"".join(
        b": ping\n" * (i % 3 == 0) + b"retry: %d\n" % i * (i % 7 == 0) + b"id: %d\nevent: e\ndata: x%d\n\n" % (i, i)
        for i in range(300)
    ),
    "huge": b"event: big\ndata: " + "ö".encode() * 300_000 + b"\n\ndata: after\n\n",
}


# Byte by byte only for the smaller streams (the huge one is 600 KB: its big chunks cover it).
CASES = [(name, size) for name in STREAMS for size in (1, 7, 100, 1460, 16384, None) if size != 1 or name != "huge"]


@pytest.mark.parametrize(("name", "size"), CASES)
def test_streams_give_the_same_in_fixed_size_chunks(name, size):
    body = STREAMS[name]
    chunks = [body] if size is None else [body[i : i + size] for i in range(0, len(body), size)]
    same(chunks)
    same(chunks, limit=1000)  # the limits: the huge event is dropped, with its finding


def test_one_event_per_chunk_gives_the_same():
    for body in STREAMS.values():
        chunks = [c + b"\n\n" for c in body.split(b"\n\n")[:-1]]
        same(chunks)


# The parser tests' fragments, and a line of Japanese with emoji (four-byte characters).
FRAGMENTS = [*SSE_FRAGMENTS, "data: 日本語🎉\n\n".encode()]
bodies = st.lists(st.sampled_from(FRAGMENTS), max_size=80).map(b"".join)
cuts = st.lists(st.integers(min_value=0, max_value=10_000), max_size=12)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies, cut=cuts, limit=st.one_of(st.none(), st.integers(min_value=1, max_value=40)))
def test_random_bodies_and_splits_give_the_same(body, cut, limit):
    same(split_at(body, cut), limit)


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=300), cut=cuts)
def test_arbitrary_bytes_give_the_same(body, cut):
    same(split_at(body, cut))
