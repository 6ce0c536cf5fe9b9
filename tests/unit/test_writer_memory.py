"""A huge answer costs little memory while its row is built and written, and the rows are unchanged.

The paths that save memory (text joined once and shared, content hashed piece by piece,
a huge row bound lazily on SQLite) must give the very bytes the plain paths give: the
content hashes of the chain (``llm-audit verify``) and the stored values. Each test runs
the saving path against the plain one on the same input; the thresholds are lowered so
that small values take the saving paths too. Memory itself is measured by
``scripts/bench --only memory``, never asserted here.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import sqlite3
import time
import tracemalloc

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from addon.events import Finish, StreamEnd, TextDelta, ToolCallDelta
from addon.record import OUTCOME_COMPLETE, ExchangeRecord, Status, TextParts
from exchange.transcript import output_tool_calls
from storage import chain, writer
from storage.chain import CONTENT_COLUMNS, canonical_pieces, check_record, content_hash, split_big_strings
from storage.database import open_engine
from storage.prepare import prepare
from storage.schema import ANSWER_BYTES, exchanges
from storage.spool import Spool
from storage.verify import verify

SORTED = orjson.OPT_SORT_KEYS


@pytest.fixture
def small_pieces(monkeypatch):
    """Strings of 4 characters or more are hashed apart, 3 characters at a time."""
    monkeypatch.setattr(chain, "BIG_STRING", 4)
    monkeypatch.setattr(chain, "_SLICE", 3)


def whole(value) -> bytes:
    return b"".join(bytes(p) for p in canonical_pieces(value))


TRICKY = "é漢😀\n\r\t\b\f\"\\/\x00\x01\x1f\x7f\u2028\u2029<>&' \\u0000 \\\\u0000 end"
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_pieces_join_to_the_canonical_json(value):
    old = chain.BIG_STRING, chain._SLICE
    chain.BIG_STRING, chain._SLICE = 2, 3
    try:
        assert whole(value) == orjson.dumps(value, option=SORTED)
        assert content_hash(value) == hashlib.sha256(orjson.dumps(value, option=SORTED)).hexdigest()
    finally:
        chain.BIG_STRING, chain._SLICE = old


def test_pieces_of_escapes_and_any_character(small_pieces):
    for value in (
        TRICKY * 3,
        {"b": TRICKY, "a": [TRICKY, "ab", {"z": TRICKY * 2}], "c": (TRICKY, 1)},
        [TRICKY[i:] for i in range(0, len(TRICKY), 2)],
    ):
        assert split_big_strings(value) is not None
        assert whole(value) == orjson.dumps(value, option=SORTED)
    value = {"k": [TRICKY]}
    split_big_strings(value)
    assert value == {"k": [TRICKY]}  # the value itself is never changed


def test_what_orjson_refuses_is_refused_alike(small_pieces):
    for bad in ("abc\ud800def", {"a": ["xyzw\udc00"]}, {1: "long text"}, {"n": 2**70, "t": "long text"}):
        with pytest.raises(TypeError):
            orjson.dumps(bad, option=SORTED)
        with pytest.raises(TypeError):
            content_hash(bad)


def test_values_without_big_strings_or_too_many_nodes_are_serialized_whole(small_pieces):
    assert split_big_strings({"a": "abc", "b": [1, 2]}) is None
    assert split_big_strings([TRICKY] + list(range(300))) is None
    assert (
        content_hash([TRICKY] + list(range(300)))
        == hashlib.sha256(orjson.dumps([TRICKY] + list(range(300)))).hexdigest()
    )


def huge_record(text: str, *, tools: bool = True, instance: str = "test") -> ExchangeRecord:
    r = ExchangeRecord(
        dialect="openai-chat",
        proxy_instance=instance,
        started_at=time.time(),
        request_body={"messages": [{"role": "user", "content": text[:100]}], "model": "m"},
        content_limit=1 << 30,
    )
    for i in range(0, len(text), 997):
        r.apply(TextDelta(text[i : i + 997]))
    r.apply(TextDelta("thinking " + text[:50], kind="reasoning"))
    r.apply(TextDelta("no", choice=1))
    if tools:
        r.apply(ToolCallDelta(key="0", choice=0, id="call_1", name="lookup", arguments='{"q": "' + text[:40]))
        r.apply(ToolCallDelta(key="0", choice=0, arguments='"}', complete=True))
    r.apply(Finish("stop"))
    r.apply(StreamEnd())
    r.finish(OUTCOME_COMPLETE)
    return r


ROWS = [
    ("ascii", "a" * 30_000 + "\n"),
    ("non-ascii", TRICKY * 800),
    ("nul", "x\x00y" * 5000),
    ("escaped nul", "\\u0000 " * 4000),
    ("surrogates", "ok \ud83d text " * 3000),
]


@pytest.mark.parametrize("postgres", [False, True])
@pytest.mark.parametrize(("label", "text"), ROWS, ids=[label for label, _ in ROWS])
def test_prepared_rows_and_hashes_are_those_of_the_whole_serialization(monkeypatch, postgres, label, text):
    row = huge_record(text).to_row()
    for max_bytes in (1 << 30, 20_000):  # as stored, and cut to fit
        monkeypatch.setattr(chain, "BIG_STRING", 1 << 40)  # the plain path: every value serialized whole
        plain = prepare(row, postgres=postgres, max_bytes=max_bytes)
        monkeypatch.setattr(chain, "BIG_STRING", 64)
        streamed = prepare(row, postgres=postgres, max_bytes=max_bytes)
        assert orjson.dumps(streamed.row, default=str) == orjson.dumps(plain.row, default=str)
        assert streamed.hashes == plain.hashes
        for name in CONTENT_COLUMNS:
            assert (
                streamed.hashes[name] == hashlib.sha256(orjson.dumps(streamed.row.get(name), option=SORTED)).hexdigest()
            )


def test_the_text_is_joined_once_and_shared():
    parts = TextParts()
    for i in range(1000):
        parts.append(f"{i},")
    text = parts.whole()
    assert text == "".join(f"{i}," for i in range(1000)) and list(parts) == [text]
    assert parts.whole() is text
    parts.append("more")
    assert parts.whole() == text + "more"
    assert TextParts().whole() == ""
    r = huge_record("answer " * 200)
    row = r.to_row()
    assert row["output_text"] is r.choices[0].text.whole()
    assert "text" not in row["output"]["choices"][0], "the answer is stored once, as output_text"
    assert row["output"]["tool_calls"] == [{"id": "call_1", "name": "lookup", "complete": True}], "arguments once"
    assert output_tool_calls(row) == [row["tool_calls"][0] | {"complete": True}]
    assert r.to_row() == row  # building the row again gives the same row


def _raw_rows(path) -> list[tuple]:
    con = sqlite3.connect(path)
    try:
        return con.execute("SELECT * FROM exchanges ORDER BY chain_seq").fetchall()
    finally:
        con.close()


def _write(engine, tmp_path, rows, name: str) -> None:
    w = writer.AuditWriter(engine, Spool(tmp_path / f"spool-{name}.jsonl"), "test", max_value_bytes=1 << 30)
    for row in rows:
        w.submit(row)
    w.close()


def _rows() -> list[dict]:
    """Open records, then final ones: small, huge (over the lazy threshold), non-ASCII, with tool calls."""
    records = [huge_record(text, tools=i % 2 == 0) for i, (_, text) in enumerate(ROWS)]
    records.append(huge_record("b" * (writer._LAZY_AT + 10)))
    records.append(huge_record(TRICKY * (writer._LAZY_AT // len(TRICKY) + 1)))
    records.append(huge_record("small"))
    opened = []
    for r in records:
        r.status, ended = Status.IN_PROGRESS, r.ended_at
        opened.append(r.to_row())
        r.finish(OUTCOME_COMPLETE, ended)
    return opened + [r.to_row() for r in records]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet=st.sampled_from("ab é漢😀\x00"), max_size=9), max_size=40), st.integers(1, 30))
def test_a_long_text_grown_in_place_is_the_join(pieces, grow_at):
    """The in-place growth gives the very text the join gives, whatever the characters'
    widths (a part wider than the text so far makes CPython copy it once, wider)."""
    small = {"__slots__": (), "COMPACT_AT": 3, "GROW_AT": grow_at, "TRIM_EVERY": 5}
    parts = type("SmallParts", (TextParts,), small)()
    for piece in pieces:
        parts.append(piece)
    text = parts.whole()
    assert text == "".join(pieces) and list(parts) == ([text] if pieces else [])
    parts.append("more")
    assert parts.whole() == "".join(pieces) + "more"


class _Refused(str):
    """A part whose appending fails, as growing a string fails without memory."""

    def __radd__(self, other):
        raise MemoryError


@pytest.mark.parametrize("where", ["appending", "handing memory back"])
def test_a_growth_interrupted_leaves_the_parts_in_order(monkeypatch, where):
    """An exception while the text grows puts the parts back, the text grown so far first:
    a later call gives the whole text, never the parts reversed or a text without its start."""
    small = {"__slots__": (), "COMPACT_AT": 1, "GROW_AT": 1, "TRIM_EVERY": 4}
    parts = type("SmallParts", (TextParts,), small)()
    for piece in ("AA", "BB", "CC", "DD", "EE"):
        parts.append(piece)
    if where == "appending":
        parts._chunks[2] = _Refused("CC")
    else:
        calls = []
        monkeypatch.setattr(
            "addon.record.release_freed_memory", lambda: calls.append(1) or (len(calls) == 1 and throw())
        )
    with pytest.raises(MemoryError):
        parts.whole()
    assert "".join(parts) == "AABBCCDDEE"
    if where == "appending":
        parts._chunks[:] = [str(p) for p in parts._chunks]
    assert parts.whole() == "AABBCCDDEE"


def throw():
    raise MemoryError


@pytest.mark.parametrize("piece", [64, 16 * 1024])
def test_a_long_text_is_joined_without_holding_its_parts_beside_it(piece):
    """Counted by tracemalloc (every Python allocation, its peak): joining 32 Mi
    characters of parts holds the parts and the whole at once; growing the text in
    place holds little more than the text. The control shows what the join would cost."""
    size = 32 * 1024 * 1024
    unit = ("tok1 " * (piece // 5 + 1))[:piece]

    def filled() -> TextParts:
        parts = TextParts()
        for _ in range(size // piece):
            parts.append(unit[:-1] + "x")  # a new string each time, as a stream's deltas are
        return parts

    def peak_above(start: int, join) -> float:
        tracemalloc.reset_peak()
        text = join()
        assert len(text) == size
        return (tracemalloc.get_traced_memory()[1] - start) / size

    tracemalloc.start()
    try:
        parts = filled()
        joined = peak_above(tracemalloc.get_traced_memory()[0], lambda: "".join(parts))
        del parts
        parts = filled()
        grown = peak_above(tracemalloc.get_traced_memory()[0], parts.whole)
    finally:
        tracemalloc.stop()
    assert joined > 0.95, "the control: a join holds the whole beside its parts"
    assert grown < 0.15, "the text and the part being appended (4 MiB at 16 KiB pieces: an eighth)"


def test_rows_bound_lazily_on_sqlite_are_stored_exactly_as_through_sqlalchemy(monkeypatch, tmp_path):
    rows = _rows()
    written = {}
    for name, lazy_at in (("plain", 1 << 40), ("lazy", 0), ("default", writer._LAZY_AT)):
        monkeypatch.setattr(writer, "_LAZY_AT", lazy_at)
        path = tmp_path / f"{name}.db"
        engine = open_engine(f"sqlite:///{path}")
        _write(engine, tmp_path, rows, name)
        written[name] = _raw_rows(path)
        try:
            assert verify(engine).ok
        finally:
            engine.dispose()
    assert len(written["plain"]) == len(rows) // 2
    assert written["lazy"] == written["plain"] and written["default"] == written["plain"]


def test_sqlite_lets_go_of_a_huge_row_once_it_is_committed(tmp_path):
    """SQLite's own copies of a huge row's texts are freed when the row is committed, not
    kept bound to sqlite3's cached statement until the next row runs it (one 200 MiB
    answer left the proxy about 260 MiB larger until then). Counted by SQLite's own
    allocator, in the library this Python's sqlite3 uses: a count, not a timing or RSS."""
    memory_used = ctypes.CDLL(ctypes.util.find_library("sqlite3")).sqlite3_memory_used
    memory_used.restype = ctypes.c_int64
    engine = open_engine(f"sqlite:///{tmp_path / 'audit.db'}")
    w = writer.AuditWriter(engine, Spool(tmp_path / "spool.jsonl"), "test", max_value_bytes=1 << 30)
    try:

        def written(row: dict) -> None:
            w.submit(row)
            deadline = time.monotonic() + 60
            while w.pending and time.monotonic() < deadline:
                time.sleep(0.01)
            assert not w.pending

        written(huge_record("small").to_row())
        before = memory_used()
        assert before > 0, "sqlite3_memory_used is not the library sqlite3 uses"
        written(huge_record("b" * (8 * writer._LAZY_AT)).to_row())
        assert memory_used() - before < writer._LAZY_AT
    finally:
        w.close()
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'audit.db'}"
    return request.getfixturevalue("postgres").create_database()


def test_huge_rows_verify_on_both_backends(url, tmp_path):
    engine = open_engine(url)
    try:
        rows = _rows()
        _write(engine, tmp_path, rows, "both")
        with engine.connect() as conn:
            stored = [dict(r) for r in conn.execute(select(exchanges).order_by(exchanges.c.chain_seq)).mappings()]
        as_bytes = 0
        for r in stored:  # on SQLite a huge answer is stored as its UTF-8 bytes (test_answer_bytes.py)
            if (data := r.pop(ANSWER_BYTES)) is not None:
                assert r["output_text"] is None
                r["output_text"], as_bytes = data.decode(), as_bytes + 1
        assert as_bytes == (2 if url.startswith("sqlite") else 0)
        assert [r["id"] for r in stored] == [r["id"] for r in rows[len(rows) // 2 :]]
        assert all(check_record(r) is None for r in stored)
        big = next(r for r in stored if len(r["output_text"]) > writer._LAZY_AT)
        source = next(r for r in rows if r["id"] == big["id"] and r["status"] != "in_progress")
        assert "text" not in big["output"]["choices"][0] and big["output_text"] == source["output_text"]
        assert verify(engine).ok
    finally:
        engine.dispose()


def test_rows_with_a_long_answer_or_a_big_body_are_looked_through(monkeypatch):
    from storage import prepare as prepare_module

    monkeypatch.setattr(chain, "BIG_STRING", 64)
    r = huge_record("short")
    r.choices[0].reasoning.append("thought " * 100)  # a long reasoning beside a short answer
    row = r.to_row()
    assert not prepare_module._may_hold_big_strings(row)
    assert prepare_module._may_hold_big_strings(row | {"bytes_from_upstream": 64 * 1024})
    assert prepare_module._may_hold_big_strings(huge_record("a" * 64).to_row())
    for candidate in (row, row | {"bytes_from_upstream": 64 * 1024}):
        p = prepare(candidate, postgres=False)
        assert p.hashes["output"] == hashlib.sha256(orjson.dumps(p.row["output"], option=SORTED)).hexdigest()


def test_a_huge_tool_call_is_bound_lazily_too():
    assert writer._large({"tool_calls": [{"arguments": "x" * writer._LAZY_AT}]})
    assert not writer._large({"output_text": "a", "tool_calls": [{"arguments": 5}, "x", {"arguments": None}]})
    assert not writer._large({"tool_calls": "no"})
