"""A huge answer on SQLite is stored as UTF-8 bytes in the last column, and read as its text.

From a million characters on (``storage.writer._BYTES_AT``) the writer puts the answer in
``output_text_utf8`` (a zero-filled BLOB written a slice at a time) and leaves
``output_text`` NULL; ``exchange_view``, ``llm-audit show`` and ``verify`` read the text
back, the hash chain covers it as text, erasure drops the bytes, and a row that is
already final is never given another answer's bytes. A long answer over the writer's
per-value limit is cut a slice at a time, to exactly what the whole-value check keeps.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from alembic import command
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import text
from test_writer_memory import TRICKY, _write, huge_record

from addon.record import OUTCOME_COMPLETE, Status
from review.chain import place
from storage import chain, migrations, writer
from storage import prepare as prepare_module
from storage.database import open_engine
from storage.erase import erase_user
from storage.query import get_exchange
from storage.schema import ANSWER_BYTES
from storage.spool import Spool
from storage.stored import Unreadable
from storage.verify import verify

ASCII = "a" * (writer._BYTES_AT + 5)
NON_ASCII = TRICKY * (writer._BYTES_AT // len(TRICKY) + 1)
COPY = writer._copy_answers
BIN = Path(sys.executable).parent


def _db(tmp_path, *texts: str, user: str | None = None):
    path = tmp_path / "audit.db"
    engine = open_engine(f"sqlite:///{path}")
    records = [huge_record(text) for text in texts]
    for r in records:
        r.user_id = user
    _write(engine, tmp_path, [r.to_row() for r in records], "bytes")
    return engine, path, [r.id for r in records]


def _raw(path, sql: str, *args):
    con = sqlite3.connect(path)
    try:
        return con.execute(sql, args).fetchall()
    finally:
        con.close()


def test_a_huge_answer_is_stored_as_bytes_and_read_back_as_its_text(tmp_path):
    short = "x" * (writer._BYTES_AT - 1)
    engine, path, ids = _db(tmp_path, ASCII, NON_ASCII, short)
    try:
        stored = {
            rid: (text_null, data)
            for rid, text_null, data in _raw(path, f"SELECT id, output_text IS NULL, {ANSWER_BYTES} FROM exchanges")
        }
        assert stored[ids[0]] == (1, ASCII.encode()) and stored[ids[1]] == (1, NON_ASCII.encode())
        assert stored[ids[2]] == (0, None), "below the threshold: text, as before"
        for rid, text in zip(ids, (ASCII, NON_ASCII, short), strict=True):
            view = _raw(
                path, "SELECT output_text, client_text, typeof(output_text) FROM exchange_view WHERE id = ?", rid
            )
            assert view == [(text, text, "text")]
            with engine.connect() as conn:
                shown = get_exchange(conn, rid, unreadable=Unreadable())
            assert shown["output_text"] == text and ANSWER_BYTES not in shown
        assert verify(engine).ok
    finally:
        engine.dispose()


def test_the_bytes_column_is_the_last_of_exchanges(tmp_path):
    """SQLite writes a zero-filled BLOB without making it only in a row's last column: a
    column added after it would make every huge answer cost its size in memory again."""
    open_engine(f"sqlite:///{tmp_path / 'audit.db'}").dispose()
    columns = _raw(tmp_path / "audit.db", "PRAGMA table_info(exchanges)")
    assert columns[-1][1] == ANSWER_BYTES


def test_sqlite_never_holds_a_huge_answer_while_writing_it(tmp_path):
    """Counted by SQLite's own allocator (its high-water mark), in the library this
    Python's sqlite3 uses: a count, not a timing or RSS. Bound as text, the answer cost
    SQLite twice its size (the bound copy, then the row built around it)."""
    lib = ctypes.CDLL(ctypes.util.find_library("sqlite3"))
    lib.sqlite3_memory_highwater.restype = lib.sqlite3_memory_used.restype = ctypes.c_int64
    text = NON_ASCII * 8
    engine = open_engine(f"sqlite:///{tmp_path / 'audit.db'}")
    w = writer.AuditWriter(engine, Spool(tmp_path / "spool.jsonl"), "test", max_value_bytes=1 << 30)
    try:
        row = huge_record(text).to_row()
        lib.sqlite3_memory_highwater(1)
        before = lib.sqlite3_memory_used()
        w.submit(row)
        deadline = time.monotonic() + 60
        while w.pending and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not w.pending
        assert lib.sqlite3_memory_highwater(0) - before < len(text.encode()) // 4
    finally:
        w.close()
        engine.dispose()
    # The control: the counter is this sqlite3's (bound as text, the same answer costs SQLite
    # at least its size), not a library linked in some other way that never moves.
    con = sqlite3.connect(":memory:")
    lib.sqlite3_memory_highwater(1)
    before = lib.sqlite3_memory_used()
    con.execute("SELECT length(?)", (text,)).fetchone()
    assert lib.sqlite3_memory_highwater(0) - before >= len(text.encode())
    con.close()
    assert _raw(tmp_path / "audit.db", f"SELECT length({ANSWER_BYTES}) FROM exchanges") == [(len(text.encode()),)]


def test_verify_finds_bytes_changed_bytes_beside_a_text_and_bytes_that_are_not_utf8(tmp_path):
    engine, path, ids = _db(tmp_path, NON_ASCII, "small")
    con = sqlite3.connect(path)
    try:
        for change, args in (
            (
                f"UPDATE exchanges SET {ANSWER_BYTES} = CAST(replace(CAST({ANSWER_BYTES} AS TEXT), 'é', 'e') AS BLOB) WHERE id = ?",
                (ids[0],),
            ),
            (f"UPDATE exchanges SET {ANSWER_BYTES} = ? WHERE id = ?", (b"planted", ids[1])),
            (f"UPDATE exchanges SET {ANSWER_BYTES} = ? WHERE id = ?", (b"\xff" + NON_ASCII.encode()[1:], ids[0])),
        ):
            saved = con.execute(f"SELECT id, {ANSWER_BYTES} FROM exchanges").fetchall()
            con.execute(change, args)
            con.commit()
            report = verify(engine)
            assert not report.ok, change
            assert any(p.kind == "modified" for c in report.chains for p in c.problems), change
            con.executemany(f"UPDATE exchanges SET {ANSWER_BYTES} = ? WHERE id = ?", [(d, i) for i, d in saved])
            con.commit()
            assert verify(engine).ok
    finally:
        con.close()
        engine.dispose()


def test_verify_and_the_review_page_report_values_sqlite_let_in_and_the_view_ignores_them(tmp_path):
    """SQLite lets any type into any column: a number, a text or a real where the bytes go
    (``bytes(0)`` would even pass for an empty answer) is tampering, and the view does not
    read it. The review page judges the stored values as verify does."""
    engine, path, ids = _db(tmp_path, "", "small")
    con = sqlite3.connect(path)
    try:
        for rid, text_value, planted in (
            (ids[0], None, 0),
            (ids[0], None, "text"),
            (ids[0], None, 1.5),
            (ids[1], "small", b"small"),  # bytes beside the text: the view shows the text, the hash matches it
        ):
            con.execute(
                f"UPDATE exchanges SET output_text = ?, {ANSWER_BYTES} = ? WHERE id = ?", (text_value, planted, rid)
            )
            con.commit()
            report = verify(engine)
            assert [p.kind for c in report.chains for p in c.problems] == ["modified"], planted
            assert "stored values cannot be read" in report.chains[0].problems[0].detail
            view = _raw(path, "SELECT output_text FROM exchange_view WHERE id = ?", rid)
            assert view == [(text_value,)], "the view reads nothing but a BLOB, and the text first"
            with engine.connect() as conn:
                page = place(conn, get_exchange(conn, rid, unreadable=Unreadable()))
            assert not page.verifies and any("stored values cannot be read" in p for p in page.problems)
            original = "" if rid == ids[0] else "small"
            con.execute(f"UPDATE exchanges SET output_text = ?, {ANSWER_BYTES} = NULL WHERE id = ?", (original, rid))
            con.commit()
            assert verify(engine).ok
    finally:
        con.close()
        engine.dispose()


def test_an_open_row_keeps_its_answer_as_text(tmp_path):
    """Only a final, sealed record's answer goes in as bytes: an open row is sealed as it
    is stored when a restart adopts it (storage/adoption.py)."""
    r = huge_record(ASCII)
    r.status = Status.IN_PROGRESS
    engine = open_engine(f"sqlite:///{tmp_path / 'audit.db'}")
    try:
        _write(engine, tmp_path, [r.to_row()], "open")
        assert _raw(tmp_path / "audit.db", f"SELECT output_text IS NULL, {ANSWER_BYTES} FROM exchanges") == [(0, None)]
    finally:
        engine.dispose()


def test_bytes_on_postgresql_are_tampering_and_its_view_never_reads_them(postgres, tmp_path):
    engine = open_engine(postgres.create_database())
    try:
        rows = [huge_record(ASCII).to_row(), huge_record("small").to_row()]
        _write(engine, tmp_path, rows, "pg")
        with engine.begin() as conn:
            stored = conn.execute(text(f"SELECT {ANSWER_BYTES} FROM exchanges")).scalars().all()
            assert stored == [None, None], "the writer never puts bytes there"
            conn.execute(text(f"UPDATE exchanges SET {ANSWER_BYTES} = '\\x00ff' WHERE id = :id"), {"id": rows[1]["id"]})
        report = verify(engine)
        assert [p.kind for c in report.chains for p in c.problems] == ["modified"]
        with engine.connect() as conn:  # invalid UTF-8 there breaks no query
            assert conn.execute(text("SELECT output_text FROM exchange_view ORDER BY output_text")).scalars().all() == [
                ASCII,
                "small",
            ]
    finally:
        engine.dispose()


NO_NUL = TRICKY.replace("\x00", "")  # U+0000: never on PostgreSQL
PG_TEXTS = (ASCII, NO_NUL * (writer._BYTES_AT // len(NO_NUL) + 1))


def _opened_then_final(*texts: str) -> list[dict]:
    """Each record's write-ahead open row, then its final row (so the final one is an upsert
    over an open row, as the proxy writes it), and one final row with no open row before it."""
    records = [huge_record(t) for t in texts]
    opened = []
    for r in records[:-1]:
        r.status, ended = Status.IN_PROGRESS, r.ended_at
        opened.append(r.to_row())
        r.finish(OUTCOME_COMPLETE, ended)
    return opened + [r.to_row() for r in records]


def _stored_answers(engine) -> dict[str, tuple]:
    with engine.connect() as conn:
        rows = conn.execute(text(f"SELECT id, output_text, {ANSWER_BYTES}, status FROM exchanges")).all()
    return {rid: (answer, data, status) for rid, answer, data, status in rows}


@pytest.mark.parametrize("role", ["owner", "proxy role"])
def test_a_huge_answer_on_postgresql_is_staged_and_stored_as_its_text(postgres, tmp_path, monkeypatch, role):
    """PostgreSQL keeps the answer in output_text: the writer copies it into a temporary
    table a slice at a time (COPY, binary) and the row's upsert takes it from there. Tabs,
    line ends, backslashes and every width of character come back exactly; verify agrees.
    The proxy role (``db roles``), whose trigger refuses any change to a final record,
    writes it too: the row goes in whole, in one upsert."""
    copies = []
    monkeypatch.setattr(writer, "_copy_answers", lambda pg, answers: copies.append(list(answers)) or COPY(pg, answers))
    url = postgres.create_database()
    if role == "proxy role":
        open_engine(url).dispose()
        applied = subprocess.run(
            [str(BIN / "llm-audit"), "--db", url, "db", "roles", "--apply"], capture_output=True, text=True, timeout=60
        )
        assert applied.returncode == 0, applied.stderr
        user = f"u_{uuid.uuid4().hex[:10]}"
        with postgres.connect(url.rsplit("/", 1)[1]) as conn:
            conn.execute(f"CREATE ROLE {user} LOGIN IN ROLE llm_audit_proxy")
            conn.commit()
        url = url.replace("://postgres@", f"://{user}@")
    engine = open_engine(url)
    try:
        rows = _opened_then_final(*PG_TEXTS, PG_TEXTS[1])
        if role == "owner":  # a table of the staging table's name ahead of it on the search path is never read
            with engine.begin() as conn:
                database = url.rsplit("/", 1)[1]
                conn.execute(text(f'ALTER DATABASE "{database}" SET search_path = "$user", public, pg_temp'))
                conn.execute(text("CREATE TABLE public.llm_audit_answers (id text, answer text)"))
                conn.execute(
                    text("INSERT INTO public.llm_audit_answers VALUES (:id, 'planted')"), {"id": rows[-1]["id"]}
                )
            engine.dispose()  # new sessions, with that search path
        _write(engine, tmp_path, rows, "pg-staged")
        stored = _stored_answers(engine)
        finals = [row for row in rows if row["status"] != "in_progress"]
        assert {row["id"]: stored[row["id"]] for row in finals} == {
            row["id"]: (row["output_text"], None, "completed") for row in finals
        }
        assert sorted(sum(copies, [])) == sorted(row["id"] for row in finals), "every huge answer went through COPY"
        assert verify(engine).ok
        with engine.connect() as conn:  # the staging table is the session's, emptied by the commit
            assert conn.execute(text("SELECT to_regclass('pg_temp.llm_audit_answers')")).scalar() is None
    finally:
        engine.dispose()


def test_a_role_that_may_not_make_temporary_tables_binds_the_answer_as_before(postgres, tmp_path, monkeypatch):
    url = postgres.create_database()
    database = url.rsplit("/", 1)[1]
    role = f"u_{uuid.uuid4().hex[:10]}"
    open_engine(url).dispose()
    with postgres.connect(database) as conn:
        conn.execute(f"REVOKE TEMPORARY ON DATABASE {database} FROM PUBLIC")
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"GRANT SELECT, INSERT, UPDATE ON exchanges, chains TO {role}")
        conn.execute(f"GRANT SELECT ON alembic_version, exchange_view TO {role}")
        conn.commit()
    engine = open_engine(url.replace("://postgres@", f"://{role}@"))
    monkeypatch.setattr(writer, "_copy_answers", lambda *_: pytest.fail("staged without the privilege"))
    try:
        rows = _opened_then_final(PG_TEXTS[1], "small")
        _write(engine, tmp_path, rows, "pg-no-temp")
        stored = _stored_answers(engine)
        assert all(stored[row["id"]][0] == row["output_text"] for row in rows[-2:])
    finally:
        engine.dispose()
    assert verify(open_engine(url)).ok


def test_a_client_encoding_other_than_utf8_binds_the_answer(postgres, tmp_path, monkeypatch):
    """Binary COPY reads text in the session's client encoding: with LATIN1 the UTF-8
    slices would be stored as other characters (and verify would call it tampering), so
    such a session binds the answer as before."""
    url = postgres.create_database()
    database = url.rsplit("/", 1)[1]
    open_engine(url).dispose()
    with postgres.connect(database) as conn:
        conn.execute(f"ALTER DATABASE \"{database}\" SET client_encoding = 'LATIN1'")
        conn.commit()
    monkeypatch.setattr(writer, "_copy_answers", lambda *_: pytest.fail("staged in LATIN1"))
    engine = open_engine(url)
    try:
        rows = _opened_then_final("é" * (writer._BYTES_AT + 5), "é small")
        _write(engine, tmp_path, rows, "pg-latin1")
        stored = _stored_answers(engine)
        assert [stored[row["id"]][0] for row in rows[-2:]] == [row["output_text"] for row in rows[-2:]]
        assert verify(engine).ok
    finally:
        engine.dispose()


def test_a_staging_failure_writes_the_batch_again_bound_and_stops_staging(postgres, tmp_path, monkeypatch, caplog):
    """Whatever makes staging fail later (TEMPORARY revoked while the proxy runs, a
    database without binary COPY, another driver): the batch is written again with its
    answers bound, whole, never reduced to a minimal row; later batches bind at once."""
    calls = []

    def failing(pg, answers):
        calls.append(list(answers))
        raise RuntimeError("permission denied to create temporary tables")

    monkeypatch.setattr(writer, "_copy_answers", failing)
    engine = open_engine(postgres.create_database())
    try:
        rows = _opened_then_final(*PG_TEXTS, "small")
        _write(engine, tmp_path, rows, "pg-stage-fails")
        stored = _stored_answers(engine)
        finals = [row for row in rows if row["status"] != "in_progress"]
        assert {row["id"]: stored[row["id"]] for row in finals} == {
            row["id"]: (row["output_text"], None, "completed") for row in finals
        }
        assert len(calls) == 1, "tried once, then off"
        assert "one by one" not in caplog.text, "the batch itself is written again, not row by row"
        assert verify(engine).ok
        with engine.connect() as conn:
            assert "refused" not in str(conn.execute(text("SELECT findings FROM exchanges")).all()), "no minimal row"
    finally:
        engine.dispose()


def test_erasure_drops_the_bytes_and_leaves_the_marker(tmp_path):
    engine, path, ids = _db(tmp_path, NON_ASCII, user="alice")
    try:
        assert erase_user(engine, "alice", actor="test").count == 1
        assert _raw(path, f"SELECT output_text, {ANSWER_BYTES} FROM exchanges") == [(chain.ERASED, None)]
        assert _raw(path, "SELECT output_text FROM exchange_view") == [(chain.ERASED,)]
        report = verify(engine)
        assert report.ok and sum(c.erased for c in report.chains) == 1
    finally:
        engine.dispose()


def test_a_final_row_is_never_given_another_answer(tmp_path):
    """The upsert leaves a row that is already final as it is; so do its bytes: a second
    final record under the same id (a replay, or a forgery through the spool) gets nothing.
    (It was sealed into the chain all the same, so verify reports it missing: as before.)"""
    engine, path, ids = _db(tmp_path, NON_ASCII)
    try:
        other = huge_record(ASCII)
        other.id = ids[0]
        _write(engine, tmp_path, [other.to_row()], "again")
        assert _raw(path, f"SELECT output_text, {ANSWER_BYTES} FROM exchanges") == [(None, NON_ASCII.encode())]
        assert [(p.kind, p.seq) for c in verify(engine).chains for p in c.problems] == [("deleted", 2)]
    finally:
        engine.dispose()


def test_downgrading_puts_the_answer_back_in_output_text(tmp_path):
    engine, path, ids = _db(tmp_path, NON_ASCII)
    try:
        with engine.begin() as conn:
            command.downgrade(migrations.config(conn), "0011")
        assert _raw(path, "SELECT output_text FROM exchanges") == [(NON_ASCII,)]
        assert ANSWER_BYTES not in [c[1] for c in _raw(path, "PRAGMA table_info(exchanges)")]
    finally:
        engine.dispose()
    engine = open_engine(f"sqlite:///{path}")  # and up again: the text stays where it is
    try:
        assert verify(engine).ok
    finally:
        engine.dispose()


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet='ab"\\\né漢😀\x00\x1f', max_size=40), st.integers(1, 90), st.booleans())
def test_a_long_text_over_the_limit_is_cut_as_the_whole_value_check_cuts_it(value, max_bytes, postgres):
    saved = chain.BIG_STRING, chain._SLICE
    chain.BIG_STRING, chain._SLICE = 4, 3  # every text of 4 characters on is cut a slice at a time
    try:
        sliced = prepare_module._Notes()
        cut = prepare_module._cut_streamed("output_text", value, sliced, postgres, max_bytes)
        whole = prepare_module._Notes()
        stored, encoded = prepare_module._check_text("output_text", value, whole, postgres, max_bytes)
    finally:
        chain.BIG_STRING, chain._SLICE = saved
    if cut is None:
        assert len(value) < 4 or len(encoded) <= max_bytes or (postgres and "\x00" in value)
        return
    assert cut == (stored, hashlib.sha256(encoded).hexdigest())
    assert sliced.items == whole.items


def test_a_json_columns_string_is_left_to_the_json_check():
    """``output`` and ``tool_calls`` hold JSON: a long string there is cut as JSON text
    (its own note and hash), never by the slice-at-a-time cut of a text column."""
    value = "x" * (chain.BIG_STRING + 10)
    for name in ("output", "tool_calls"):
        assert prepare_module._cut_streamed(name, value, prepare_module._Notes(), False, 1024) is None
    assert prepare_module._cut_streamed("output_text", value, prepare_module._Notes(), False, 1024) is not None
