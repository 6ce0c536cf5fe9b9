"""No record stops the writer, none is dropped: poison values, refused rows, unreadable
spool lines, a failing or dead writer thread, on SQLite files and a real PostgreSQL server.

Failures are injected by replacing one writer method in the test (``monkeypatch``); the
database refusals themselves are real (PostgreSQL's ``varchar(255)``, ``integer``, U+0000).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest
from sqlalchemy import select, text

from addon.record import OUTCOME_COMPLETE, ExchangeRecord
from storage import checkpoint as checkpoint_module
from storage import status as status_module
from storage import writer as writer_module
from storage.chain import Chain, Head
from storage.checkpoint import Checkpointer, Run, in_ranges, load_or_create_key, read_checkpoints
from storage.database import open_engine
from storage.prepare import MAX_DEPTH, Prepared, prepare
from storage.quarantine import Quarantine
from storage.schema import exchanges, quarantine
from storage.spool import Spool
from storage.status import process_start
from storage.verify import verify
from storage.writer import AuditWriter

BIN = Path(sys.executable).parent
INSTANCE = "poison"


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'audit.db'}"
    return request.getfixturevalue("postgres").create_database()


def final_row(**fields) -> dict:
    r = ExchangeRecord(dialect="llm-stream", proxy_instance=INSTANCE, started_at=time.time())
    r.terminal_seen = True
    r.finish(OUTCOME_COMPLETE)
    return r.to_row() | fields


def nested(depth: int) -> list:
    value: list | str = "bottom"
    for _ in range(depth):
        value = [value]
    return value


def start(url: str, tmp_path: Path, **kwargs) -> AuditWriter:
    return AuditWriter(open_engine(url), Spool(tmp_path / "spool.jsonl"), INSTANCE, **kwargs)


def stored(url: str) -> dict[str, dict]:
    engine = open_engine(url)
    try:
        with engine.connect() as conn:
            return {r["id"]: dict(r) for r in conn.execute(select(exchanges)).mappings()}
    finally:
        engine.dispose()


def codes(row: dict) -> list[str]:
    findings = row["findings"]
    findings = orjson.loads(findings) if isinstance(findings, str) else findings
    return [f["detail"] for f in findings or [] if f["code"] == "stored_reduced"]


def wait_until(predicate, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


POISONS = {
    "depth 254": {"request_body": nested(254)},
    "depth 1000": {"request_body": nested(1000)},
    "depth 5000": {"request_body": {"messages": nested(5000)}},
    "lone surrogates": {
        "url_path": "/v1/\udcff",
        "request_headers": {"x-name": "a\ud800b"},
        "output_text": "half \udc80 pair",
    },
    "integers beyond 64 bits": {"output": {"choices": [], "n": 2**70}, "input_tokens": 2**64, "event_count": 2**40},
    "non-string keys": {"request_body": {1: "one", (2, 3): "pair", None: "none"}},
    "NUL": {"output_text": "a\x00b", "request_body": {"messages": ["c\x00d"]}},
    "too long for varchar(255)": {"request_model": "m" * 300, "user_id": "u" * 1000},
    "not a column": {"no_such_column": 1},
}


@pytest.mark.parametrize("poison", list(POISONS))
def test_every_poison_value_is_stored_reduced_with_a_finding_and_the_chain_verifies(url, tmp_path, poison):
    rows = [final_row(), final_row(**POISONS[poison]), final_row()]
    writer = start(url, tmp_path)
    for row in rows:
        writer.submit(row)
    writer.close()
    db = stored(url)
    assert set(db) == {r["id"] for r in rows}, "every record is written"
    notes = codes(db[rows[1]["id"]])
    postgres = url.startswith("postgresql")
    if poison == "depth 254" or (poison == "NUL" and not postgres):
        assert notes == []  # storable as it is
    else:
        assert notes, db[rows[1]["id"]]["findings"]
    assert (
        writer.summary() == "llm-audit: 3 audit records written, 0 wait in the spool, 0 quarantined, 0 held in memory"
    )
    assert verify(open_engine(url)).ok


def test_deep_json_is_kept_whole_as_its_json_text():
    for depth in (255, 1000, 5000):
        body = {"messages": nested(depth)}
        p = prepare(final_row(request_body=body), postgres=False)
        assert isinstance(p.row["request_body"], str)
        assert p.row["request_body"] == '{"messages":' + "[" * depth + '"bottom"' + "]" * depth + "}"
        assert f"nested {depth + 1} levels deep, more than the {MAX_DEPTH}" in codes(p.row)[0]


def test_a_value_over_the_size_kept_is_cut_with_its_full_length_and_hash():
    text_value = "é" * 3000  # 6000 bytes
    p = prepare(final_row(output_text=text_value, request_body={"big": "x" * 5000}), postgres=False, max_bytes=1000)
    assert p.row["output_text"] == "é" * 500
    assert isinstance(p.row["request_body"], str) and len(p.row["request_body"]) == 1000
    import hashlib

    notes = codes(p.row)
    assert any(
        n.startswith("output_text: 6000 bytes, over the 1000 stored")
        and hashlib.sha256(text_value.encode()).hexdigest() in n
        for n in notes
    ), notes
    assert any(n.startswith("request_body: ") for n in notes)


def test_the_content_hashes_of_preparation_are_the_chains_own():
    row = final_row(request_body={"b": 1, "a": [1, 2]}, output_text="answer")
    p = prepare(row, postgres=True)
    assert Chain("c", Head()).seal(dict(p.row)) == Chain("c", Head()).seal(p.row, p.hashes)
    assert list(Chain("c", Head()).seal(p.row, p.hashes))[:5] == [
        "chain_id",
        "chain_seq",
        "prev_hash",
        "record_hash",
        "id",
    ]


def test_a_row_the_database_refuses_is_written_as_a_minimal_row_and_the_batch_goes_on(
    url, tmp_path, monkeypatch, caplog
):
    # the preparation is bypassed, so the database itself refuses the row (PostgreSQL: a
    # varchar(255) overflow; both: a text column given an object the driver cannot bind)
    poison = final_row(request_model="m" * 300, url_path={"not": "text"})
    unprepared(monkeypatch, poison)
    rows = [final_row(), poison, final_row()]
    writer = start(url, tmp_path)
    for row in rows:
        writer.submit(row)
    writer.close()
    db = stored(url)
    assert set(db) == {r["id"] for r in rows}
    assert db[poison["id"]]["url_path"] is None and "the database refused the record" in codes(db[poison["id"]])[0]
    assert "a minimal row of it is written" in caplog.text
    assert verify(open_engine(url)).ok


def test_a_row_refused_even_minimal_is_quarantined_and_verify_names_it(url, tmp_path, monkeypatch):
    monkeypatch.setattr(writer_module, "prepare", lambda row, **_: Prepared(dict(row), _hashes(row)))
    monkeypatch.setattr(writer_module, "minimal_row", lambda row, reason: dict(row))
    poison = final_row(request_model="m" * 300, url_path={"not": "text"})
    rows = [final_row(), poison, final_row()]
    writer = start(url, tmp_path)
    for row in rows:
        writer.submit(row)
    writer.close()
    assert set(stored(url)) == {rows[0]["id"], rows[2]["id"]}
    assert writer.quarantined == 1 and "1 quarantined" in writer.summary()
    engine = open_engine(url)
    with engine.connect() as conn:
        entries = conn.execute(select(quarantine)).mappings().all()
    assert [(e["chain_id"], e["chain_seq"], e["record_id"]) for e in entries] == [(INSTANCE, 2, poison["id"])]
    report = verify(engine)
    assert (
        report.ok
        and report.covered
        and report.chains[0].quarantine_lines()
        == [
            f"record 2 of chain {INSTANCE} is quarantined in {tmp_path / 'quarantine-poison.jsonl'}: "
            f"{entries[0]['reason']} (checked against the file)"
        ]
    )
    raw = (tmp_path / "quarantine-poison.jsonl").read_bytes().splitlines()
    assert orjson.loads(raw[1])["id"] == poison["id"], "the whole row is kept in the quarantine file"
    _a_forged_quarantine_is_never_passed(engine, tmp_path / "quarantine-poison.jsonl", rows[2]["id"])


def delete_behind_a_quarantine_row(engine, victim: str) -> None:
    """Delete a record and write a quarantine row in its place (its place and hashes), as
    whoever can write the database could."""
    with engine.begin() as conn:
        row = conn.execute(select(exchanges).where(exchanges.c.id == victim)).mappings().one()
        forged = {k: row[k] for k in ("chain_id", "chain_seq", "prev_hash", "record_hash")}
        conn.execute(exchanges.delete().where(exchanges.c.id == victim))
        conn.execute(
            quarantine.insert().values(
                quarantined_at=datetime.now(UTC), reason="refused", file="/nowhere/q.jsonl", size=1,
                sha256="0" * 64, record_id=victim, **forged,
            )
        )  # fmt: skip


def _a_forged_quarantine_is_never_passed(engine, kept: Path, victim: str) -> None:
    """The quarantine table is as writable as the records: a row copied from a record
    (its place and hashes) hid the record's deletion, and verify passed it (exit 0). Its
    file now vouches for it, or the report is not covered (exit 3), or tampered (exit 1)."""
    delete_behind_a_quarantine_row(engine, victim)
    report = verify(engine)
    assert report.ok and not report.covered and report.open_records == 0
    assert report.chains[0].unchecked == {3: "/nowhere/q.jsonl cannot be read here (No such file or directory); "
                                          "run verify where it is, or name its folder with --quarantine DIR"}  # fmt: skip
    with engine.begin() as conn:  # a device or a pipe would never end (a review ran out of memory on /dev/zero)
        conn.execute(quarantine.update().where(quarantine.c.chain_seq == 3).values(file="/dev/zero"))
    assert "not a regular file" in verify(engine).chains[0].unchecked[3]
    copy = kept.with_name("copy.jsonl")  # the entry of another record, in a copy of the real file
    copy.write_bytes(kept.read_bytes())
    with engine.begin() as conn:
        first = conn.execute(select(quarantine).order_by(quarantine.c.id)).mappings().first()
        conn.execute(
            quarantine.update().where(quarantine.c.chain_seq == 3).values(file=str(copy), sha256=first["sha256"])
        )
    report = verify(engine)
    assert [p.kind for p in report.chains[0].problems] == ["modified"]
    assert "the quarantine table places a record its file's line is not" in report.chains[0].problems[0].detail
    assert [p.kind for p in verify(engine, quarantine_dir=Path("/elsewhere")).chains[0].problems] == []
    if engine.dialect.name == "sqlite":  # values of other types where verify reads (PostgreSQL's types refuse them)
        with engine.begin() as conn:
            conn.execute(text("UPDATE quarantine SET quarantined_at = 'garbage' WHERE chain_seq = 3"))
            conn.execute(text("UPDATE quarantine SET file = 'a' || char(0) || 'b' WHERE chain_seq = 3"))
            conn.execute(text("UPDATE chains SET lease_until = 'not a time', head_seq = 'abc'"))
        report = verify(engine)  # (named, never a stop: exit 2 without naming a record)
        assert "the chains table's row of this chain cannot be read" in [p.detail for p in report.chains[0].problems]


def test_the_proxys_checkpoints_name_what_it_quarantined_and_a_forged_quarantine_is_a_deletion(
    url, tmp_path, monkeypatch
):
    """With database access alone, a record deleted and a quarantine row written in its
    place (copied from its neighbours' hashes) was "NOT CHECKED" (exit 3) wherever the
    quarantine file could not be read. The proxy's checkpoints now sign what it
    quarantined since it started, so such a row is a deletion (exit 1)."""
    monkeypatch.setattr(writer_module, "prepare", lambda row, **_: Prepared(dict(row), _hashes(row)))
    monkeypatch.setattr(writer_module, "minimal_row", lambda row, reason: dict(row))
    rows = [final_row(), final_row(request_model="m" * 300, url_path={"not": "text"}), *(final_row() for _ in range(4))]
    key = load_or_create_key(tmp_path / "key.pem")
    writer = start(
        url, tmp_path, checkpointer=Checkpointer(tmp_path / "checkpoints", key, INSTANCE, every=100, seconds=0)
    )
    for row in rows:
        writer.submit(row)
    writer.close()
    engine = open_engine(url)
    with engine.connect() as conn:
        [entry] = conn.execute(select(quarantine)).mappings().all()
    checkpoints = read_checkpoints(tmp_path / "checkpoints", key.public_key())
    assert [cp.heads[INSTANCE].seq for cp in checkpoints] == [6]  # (every 100 records: the one at shutdown)
    assert checkpoints[-1].runs[INSTANCE] == Run(1, ((2, 2),)) and entry["chain_seq"] == 2
    report = verify(engine, checkpoints, quarantine_dir=Path("/elsewhere"))  # (its file unread: still covered)
    assert report.ok and report.chains[0].quarantined and report.chains[0].unchecked.keys() == {2}
    victim = rows[4]["id"]  # (record 5: no checkpoint signs its own hash)
    delete_behind_a_quarantine_row(engine, victim)
    assert verify(engine).ok, "without checkpoints, the table alone is all there is"
    [problem] = verify(engine, checkpoints).chains[0].problems
    assert (problem.kind, problem.seq) == ("deleted", 5)
    assert "names no such quarantine" in problem.detail and checkpoints[-1].path.name in problem.detail


def test_a_record_held_while_the_quarantine_file_fails_is_named_by_every_checkpoint_past_it(url, tmp_path, monkeypatch):
    """The quarantine file refused record 2 once (disk full): it was held in memory while
    records 3 and 4 were committed and signed without naming it, so a crash before the
    next checkpoint made verify call it deleted. Every checkpoint past it names it now."""
    monkeypatch.setattr(writer_module, "prepare", lambda row, **_: Prepared(dict(row), _hashes(row)))
    monkeypatch.setattr(writer_module, "minimal_row", lambda row, reason: dict(row))
    real_add, calls = Quarantine.add, []

    def add_once_refused(self, raw, reason):
        calls.append(raw)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_add(self, raw, reason)

    monkeypatch.setattr(Quarantine, "add", add_once_refused)
    key = load_or_create_key(tmp_path / "key.pem")
    writer = start(
        url, tmp_path, checkpointer=Checkpointer(tmp_path / "checkpoints", key, INSTANCE, every=1, seconds=0)
    )
    for row in [final_row(), final_row(request_model="m" * 300, url_path={"not": "text"}), final_row(), final_row()]:
        writer.submit(row)
    writer.close()
    checkpoints = read_checkpoints(tmp_path / "checkpoints", key.public_key())
    past = [cp.runs[INSTANCE].set_aside for cp in checkpoints if cp.heads[INSTANCE].seq >= 2]
    assert len(calls) == 2 and past and all(in_ranges(named, 2) for named in past), [cp.runs for cp in checkpoints]
    assert verify(open_engine(url), checkpoints).ok


def test_a_runs_records_set_aside_are_signed_as_ranges_and_bounded(tmp_path, monkeypatch):
    """A database that refuses every row (a trigger an insider adds) sets aside every
    record: one range, not a number a record in every checkpoint. Past the bound (every
    other row refused), the run's checkpoints stop saying what they set aside, and
    verify accuses none of the later records (it checks them against their file)."""
    monkeypatch.setattr(checkpoint_module, "MAX_SET_ASIDE_RANGES", 3)
    key = load_or_create_key(tmp_path / "key.pem")
    signer = Checkpointer(tmp_path / "checkpoints", key, INSTANCE, every=1, seconds=0)
    signer.since = 1
    for seq in range(1, 101):
        signer.set_aside(seq)
    signer.committed(Head(101, "h" * 64))
    for seq in (103, 105):
        signer.set_aside(seq)
    signer.committed(Head(106, "h" * 64))
    signer.set_aside(107 + 1)  # (a fourth range: past the bound)
    signer.committed(Head(109, "h" * 64))
    runs = [cp.runs.get(INSTANCE) for cp in read_checkpoints(tmp_path / "checkpoints", key.public_key())]
    assert runs == [Run(1, ((1, 100),)), Run(1, ((1, 100), (103, 103), (105, 105))), None]


def unprepared(monkeypatch, poison: dict) -> None:
    """The writer's preparation leaves ``poison`` (and a copy of it with all its columns) as it is."""
    real = writer_module.prepare

    def prepare_but_poison(row, **kwargs):
        if row.get("id") == poison["id"] and "url_path" in row:
            return Prepared(dict(row), _hashes(row))
        return real(row, **kwargs)

    monkeypatch.setattr(writer_module, "prepare", prepare_but_poison)


def _hashes(row: dict) -> dict:
    from storage.chain import CONTENT_COLUMNS, content_hash

    return {name: content_hash(row.get(name)) for name in CONTENT_COLUMNS}


def test_unreadable_spool_lines_are_quarantined_and_replay_goes_on(url, tmp_path, caplog):
    chain = Chain(INSTANCE, Head())
    sealed = [chain.seal(prepare(final_row(), postgres=True).row) for _ in range(4)]
    lines = [orjson.dumps(r) for r in sealed]
    torn = lines[1][: len(lines[1]) // 2]  # a crash cut it: the chain columns come first and survive
    (tmp_path / "spool.jsonl").write_bytes(b"\n".join([lines[0], torn, b"\x00garbage{", lines[2], lines[3]]) + b"\n")
    writer = start(url, tmp_path)
    wait_until(lambda: writer._recovered)
    writer.close()
    assert set(stored(url)) == {sealed[i]["id"] for i in (0, 2, 3)}
    assert writer.quarantined == 2
    assert "0 wait in the spool, 2 quarantined" in writer.summary()
    assert f"record 2 of chain {INSTANCE} is quarantined" in caplog.text
    engine = open_engine(url)
    with engine.connect() as conn:
        entries = conn.execute(select(quarantine).order_by(quarantine.c.id)).mappings().all()
    assert [(e["chain_seq"], e["record_id"]) for e in entries] == [(2, sealed[1]["id"]), (None, None)]
    assert entries[0]["sha256"] != entries[1]["sha256"] and entries[0]["size"] == len(torn)
    report = verify(engine)
    assert report.ok and [q["chain_seq"] for q in report.chains[0].quarantined] == [2]
    check = subprocess.run([str(BIN / "llm-audit"), "--db", url, "verify"], capture_output=True, text=True, timeout=60)
    assert check.returncode == 3 and f"record 2 of chain {INSTANCE} is quarantined in" in check.stdout, check
    assert "NOT CHECKED: its line cannot be read back as a record (torn or reduced)" in check.stdout  # (torn: exit 3)
    with open(tmp_path / "quarantine-poison.jsonl", "r+b") as f:  # the torn line edited in the file
        data = f.read().replace(torn, torn[:-1] + b"X")
        f.seek(0)
        f.write(data)
    assert [p.kind for p in verify(engine).chains[0].problems] == ["modified"]
    # a second start finds the quarantine file's entries already in the table
    start(url, tmp_path).close()
    with engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM quarantine")).scalar() == 2


def test_a_failing_step_is_retried_and_a_row_failing_three_times_is_quarantined(tmp_path, monkeypatch, caplog):
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    poison = final_row()
    real = AuditWriter._prepare
    failures = {"once": 0}

    def flaky(self, row):
        if row["id"] == poison["id"]:
            raise RuntimeError("injected: always fails")
        if failures["once"] == 0:
            failures["once"] += 1
            raise RuntimeError("injected: fails once")
        return real(self, row)

    monkeypatch.setattr(AuditWriter, "_prepare", flaky)
    writer = start(url, tmp_path)
    others = [final_row() for _ in range(5)]
    for row in others[:2] + [poison] + others[2:]:
        writer.submit(row)
    writer.close()
    assert set(stored(url)) == {r["id"] for r in others}
    assert writer.quarantined == 1 and "injected: fails once" in caplog.text
    assert verify(open_engine(url)).ok


class Death(BaseException):
    """What no ``except Exception`` catches: the writer thread ends."""


def test_a_dead_writer_thread_is_restarted_by_the_next_submit_without_losing_rows(url, tmp_path, monkeypatch, caplog):
    real = AuditWriter._store
    calls = {"n": 0}

    def dying(self, batch):
        calls["n"] += 1
        if calls["n"] == 2:
            raise Death("injected")
        real(self, batch)

    monkeypatch.setattr(AuditWriter, "_store", dying)
    writer = start(url, tmp_path)
    rows = [final_row() for _ in range(9)]
    writer.submit(rows[0])
    wait_until(lambda: writer.written == 1)
    writer.submit(rows[1])  # the thread dies on this one
    wait_until(lambda: not writer._thread.is_alive())
    assert "the writer thread stopped: Death: injected" in caplog.text
    for row in rows[2:]:
        writer.submit(row)
    assert "the writer thread died (Death: injected); starting a new one" in caplog.text
    writer.close()
    assert set(stored(url)) == {r["id"] for r in rows}
    assert (
        writer.summary() == "llm-audit: 9 audit records written, 0 wait in the spool, 0 quarantined, 0 held in memory"
    )
    assert verify(open_engine(url)).ok


def status(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "llm-audit"), "status", *args], capture_output=True, text=True, timeout=60)


def test_the_status_file_and_llm_audit_status(tmp_path):
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    writer = start(url, tmp_path)
    path = tmp_path / f"status-{INSTANCE}.json"
    writer.submit(final_row())
    wait_until(lambda: path.exists() and orjson.loads(path.read_bytes())["written"] == 1)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    doc = orjson.loads(path.read_bytes())
    assert doc["pid"] == os.getpid() and doc["writer_alive"] and doc["instance"] == INSTANCE and doc["last_write"]
    assert doc["pid_started"] == process_start(os.getpid())  # (this process, not a later one given its pid)
    flowing = status("--spool-dir", str(tmp_path), "--instance", INSTANCE)
    assert flowing.returncode == 0 and "records flow; 1 written, 0 in the spool" in flowing.stdout, flowing
    writer.close()
    stopped = status(str(path))
    assert stopped.returncode == 3 and "not running (stopped at" in stopped.stdout, stopped

    gone = tmp_path / "gone.json"
    gone.write_bytes(orjson.dumps(doc | {"pid": 2**22 + 12345}))
    assert status(str(gone)).returncode == 3
    dead = tmp_path / "dead.json"
    dead.write_bytes(orjson.dumps(doc | {"writer_alive": False, "last_error": "Death: injected"}))
    result = status(str(dead))
    assert result.returncode == 1 and "the writer thread is not running (last error: Death: injected)" in result.stdout
    spooling = tmp_path / "spooling.json"
    spooling.write_bytes(orjson.dumps(doc | {"spooled": 12}))
    assert status(str(spooling)).returncode == 1
    missing = status("--spool-dir", str(tmp_path), "--instance", "nobody")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "Traceback" not in missing.stderr
    assert missing.stderr.startswith("llm-audit: no status file")


def test_the_shutdown_counts_are_true_while_the_database_is_locked(tmp_path):
    import sqlite3

    url = f"sqlite:///{tmp_path / 'audit.db'}"
    writer = start(url, tmp_path)
    wait_until(lambda: writer._recovered)
    blocker = sqlite3.connect(tmp_path / "audit.db", timeout=0)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        for _ in range(4):
            writer.submit(final_row())
        wait_until(lambda: writer.spool.records == 4, timeout=60)
        writer.close(timeout=60)
    finally:
        blocker.rollback()
        blocker.close()
    assert (
        writer.summary() == "llm-audit: 0 audit records written, 4 wait in the spool, 0 quarantined, 0 held in memory"
    )
    assert writer.quarantined == 0, "a locked database is not a poison row"


def test_heartbeat_is_logged_while_records_come(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(status_module, "HEARTBEAT", 0.0)
    caplog.set_level(logging.INFO)
    writer = start(f"sqlite:///{tmp_path / 'audit.db'}", tmp_path)
    writer.submit(final_row())
    wait_until(lambda: "llm-audit: recording: 1 records written" in caplog.text)
    writer.close()
