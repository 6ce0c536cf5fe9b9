"""The background writer and the spool, against real SQLite files.

A database that cannot take writes is made real, not mocked: another connection holds
SQLite's exclusive lock, so the writer's transactions fail with "database is locked"
until it lets go.
"""

from __future__ import annotations

import sqlite3
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
from sqlalchemy import create_engine, event, select

from addon.record import OUTCOME_COMPLETE, ExchangeRecord
from storage.schema import exchanges, metadata
from storage.spool import Spool, SpoolLocked
from storage.verify import verify
from storage.writer import AuditWriter


def engine_for(path: Path):
    """An engine with a short lock timeout, so a locked database fails fast."""
    engine = create_engine(
        f"sqlite:///{path}",
        connect_args={"timeout": 0.2},
        json_serializer=lambda v: orjson.dumps(v).decode(),
        json_deserializer=orjson.loads,
    )
    event.listen(engine, "connect", lambda c, _: c.execute("PRAGMA journal_mode=WAL"))
    metadata.create_all(engine)
    return engine


def record(status_final: bool = True, instance: str = "test", **fields) -> ExchangeRecord:
    r = ExchangeRecord(dialect="llm-stream", proxy_instance=instance, started_at=time.time(), **fields)
    if status_final:
        r.terminal_seen = True
        r.finish(OUTCOME_COMPLETE)
    return r


def rows(path: Path) -> dict[str, str]:
    con = sqlite3.connect(path)
    try:
        return dict(con.execute("SELECT id, status FROM exchanges"))
    finally:
        con.close()


def wait_until(predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture
def db(tmp_path) -> Path:
    return tmp_path / "audit.db"


def writer_for(db: Path, tmp_path: Path, instance: str = "test") -> AuditWriter:
    return AuditWriter(engine_for(db), Spool(tmp_path / "spool.jsonl"), instance)


def test_open_record_is_completed_by_the_final_record(db, tmp_path):
    writer = writer_for(db, tmp_path)
    r = record(status_final=False)
    writer.submit(r.to_row())
    wait_until(lambda: rows(db).get(r.id) == "in_progress")
    r.terminal_seen = True
    r.finish(OUTCOME_COMPLETE)
    writer.submit(r.to_row())
    writer.close()
    assert rows(db) == {r.id: "completed"}


def test_a_late_open_record_never_undoes_a_final_one(db, tmp_path):
    writer = writer_for(db, tmp_path)
    r = record(status_final=False)
    open_row = r.to_row()
    r.terminal_seen = True
    r.finish(OUTCOME_COMPLETE)
    writer.submit(r.to_row())
    wait_until(lambda: rows(db).get(r.id) == "completed")
    writer.submit(open_row)
    writer.close()
    assert rows(db) == {r.id: "completed"}


def test_a_second_final_record_of_one_exchange_is_not_sealed(db, tmp_path, caplog):
    """A bug that submits an exchange's final record twice must not read as tampering:
    the upsert would leave the first row, and a second seal would be a chain link
    without a row (``verify``: a deleted record). The first stands; the error is logged."""
    writer = writer_for(db, tmp_path)
    r = record(bytes_to_client=1)
    writer.submit(r.to_row())
    r.bytes_to_client = 2
    writer.submit(r.to_row())
    later = record()
    writer.submit(later.to_row())
    writer.close()
    assert rows(db) == {r.id: "completed", later.id: "completed"}
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT bytes_to_client FROM exchanges WHERE id = ?", (r.id,)).fetchone() == (1,)
    assert verify(engine_for(db)).ok
    assert f"record {r.id} was submitted final twice" in caplog.text


def test_records_are_spooled_while_the_database_is_locked_and_replayed_in_order(db, tmp_path, caplog):
    writer = writer_for(db, tmp_path)
    blocker = sqlite3.connect(db, timeout=0)
    blocker.execute("BEGIN EXCLUSIVE")
    first = record(status_final=False)
    writer.submit(first.to_row())
    later = [record() for _ in range(20)]
    for r in later:
        writer.submit(r.to_row())
    first.terminal_seen = True
    first.finish(OUTCOME_COMPLETE)
    writer.submit(first.to_row())  # final after open, both behind the lock
    wait_until(lambda: writer.spool.records >= 22)
    assert "spooling to" in caplog.text
    blocker.rollback()
    blocker.close()
    wait_until(lambda: not writer.spool, timeout=15)
    writer.close()
    assert rows(db) == {first.id: "completed"} | {r.id: "completed" for r in later}
    assert (tmp_path / "spool.jsonl").stat().st_size == 0


def test_spool_left_by_an_earlier_run_is_replayed_at_start(db, tmp_path):
    spool = Spool(tmp_path / "spool.jsonl")
    spooled = [record() for _ in range(3)]
    spool.append([r.to_row() for r in spooled])
    spool.close()
    writer = writer_for(db, tmp_path)
    wait_until(lambda: len(rows(db)) == 3)
    writer.close()
    assert set(rows(db)) == {r.id for r in spooled}


def test_rows_left_open_by_a_killed_run_are_marked_interrupted(db, tmp_path):
    engine = engine_for(db)
    before = datetime.now(UTC) - timedelta(minutes=1)
    killed = writer_for(db, tmp_path)  # opens its write-ahead row, then dies with it open
    killed.submit(record(status_final=False).to_row() | {"id": "mine", "started_at": before, "output_text": "partial"})
    killed.close()
    with engine.begin() as conn:
        conn.execute(
            exchanges.insert().values(
                id="other",
                status="in_progress",
                dialect="llm-stream",
                streamed=True,
                proxy_instance="elsewhere",
                started_at=before,
                output_text="partial",
            )
        )
    writer = writer_for(db, tmp_path)
    wait_until(lambda: rows(db)["mine"] == "interrupted")
    writer.close()
    assert rows(db) == {"mine": "interrupted", "other": "in_progress"}
    with engine.connect() as conn:
        assert conn.execute(select(exchanges.c.output_text).where(exchanges.c.id == "mine")).scalar() == "partial"


def test_final_records_in_the_spool_win_over_interrupted_marking(db, tmp_path):
    r = record(status_final=False)
    killed = writer_for(db, tmp_path)
    killed.submit(r.to_row() | {"started_at": datetime.now(UTC) - timedelta(minutes=1)})
    killed.close()
    r.terminal_seen = True
    r.finish(OUTCOME_COMPLETE)
    spool = Spool(tmp_path / "spool.jsonl")
    spool.append([r.to_row()])
    spool.close()
    writer = writer_for(db, tmp_path)
    wait_until(lambda: rows(db)[r.id] != "in_progress")
    writer.close()
    assert rows(db) == {r.id: "completed"}


def test_a_spool_file_is_used_by_one_proxy_only(tmp_path):
    spool = Spool(tmp_path / "spool.jsonl")
    with pytest.raises(SpoolLocked):
        Spool(tmp_path / "spool.jsonl")
    spool.close()
    Spool(tmp_path / "spool.jsonl").close()


def test_only_open_rows_wait_for_company(db, tmp_path):
    """An open row waits up to the grouping window for others to share its transaction; a
    final record never waits: it is written at once, with whatever is queued."""
    writer = AuditWriter(engine_for(db), Spool(tmp_path / "spool.jsonl"), "test", group_seconds=3600)
    try:
        first, second = record(status_final=False), record(status_final=False)
        writer.submit(first.to_row())
        time.sleep(0.3)
        assert first.id not in rows(db)  # an hour's window: still waiting for company
        writer.submit(second.to_row())
        second.terminal_seen = True
        second.finish(OUTCOME_COMPLETE)
        writer.submit(second.to_row())  # the final record closes the window at once
        wait_until(lambda: rows(db) == {first.id: "in_progress", second.id: "completed"})
    finally:
        writer.close()


def test_the_audit_store_refuses_a_second_final_record_before_its_listeners_count_it(tmp_path, caplog, monkeypatch):
    """The budgets and the OpenTelemetry export are handed each row before the writer's
    thread sees it: a second final record must be refused before them too, or the
    exchange is counted (and exported) twice while the database keeps it once."""
    from mitmproxy.test import taddons

    from addon.mitm.store import AuditStore

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    db = tmp_path / "audit.db"
    store = AuditStore()
    counted, exported = [], []
    store.listeners.append(lambda row: counted.append(row["status"]))
    store.export = lambda row: exported.append(row["id"])
    with taddons.context(store, loadcore=False) as tctx:
        tctx.configure(store, llm_audit_db=f"sqlite:///{db}")
        r = record(status_final=False)
        store.submit(r)
        r.terminal_seen = True
        r.finish(OUTCOME_COMPLETE)
        store.submit(r)
        store.submit(r)
        store.done()
    assert counted == ["in_progress", "completed"]
    assert exported == [r.id]
    assert rows(db) == {r.id: "completed"}
    assert verify(engine_for(db)).ok
    assert caplog.text.count(f"record {r.id} was submitted final twice") == 1
