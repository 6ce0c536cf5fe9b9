"""Tamper evidence on real SQLite files and a real PostgreSQL server.

Records are written the way the proxy writes them (``AuditWriter``: sealed into the
instance's chain, batched, spooled); then the database is tampered with by plain SQL, as
an administrator could, and ``verify`` (the function, and the ``llm-audit verify``
command for the exit status and output) must name the first problem: modified,
deleted, inserted, reordered, and, only with signed checkpoints, a chain rewritten
consistently from the middle or a tail removed. Purge and erase keep it green; a wrong
public key or a forged checkpoint is refused.

The ``test_attack_N`` tests are the insider's attacks of issue 15, each asserting the
line ``verify`` prints: a forged erasure (1), an open row planted for the proxy to adopt
(2), a forged purge (3), a chain no checkpoint names (4), records after the last
checkpoint (5), a checkpoint folder without checkpoints (6), two writers on one chain
(7), a checkpoint at a restart whose spool cannot be replayed (8).
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

import orjson
import pytest
from conftest import wait_for
from sqlalchemy import delete, func, insert, select, update
from test_writer import engine_for

from addon.record import OUTCOME_COMPLETE, ExchangeRecord
from storage import retention as retention_module
from storage.chain import CONTENT_COLUMNS, GENESIS, Chain, Head, canonical, record_hash
from storage.checkpoint import (
    Checkpointer,
    CheckpointError,
    load_or_create_key,
    public_key_path,
    read_checkpoints,
    write_checkpoint,
)
from storage.database import open_engine
from storage.erase import erase_user
from storage.lease import LeaseHeld
from storage.prepare import prepare
from storage.retention import DailyPurge, purge
from storage.schema import chains, erasure_log, exchanges, purge_log, quarantine
from storage.spool import Spool
from storage.statements import Signer, read_statements
from storage.verify import verify
from storage.writer import AuditWriter

BIN = Path(sys.executable).parent
INSTANCE = "proxy-a"


def _storable(row: dict) -> dict:
    """A row as the writer would store it on either backend (rows inserted by hand here)."""
    return prepare(row, postgres=True).row


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'audit.db'}"
    return request.getfixturevalue("postgres").create_database()


@pytest.fixture
def engine(url):
    engine = open_engine(url)
    yield engine
    engine.dispose()


def record(i: int, user: str = "alice", ended: datetime | None = None) -> dict:
    r = ExchangeRecord(
        dialect="openai-chat",
        proxy_instance=INSTANCE,
        started_at=time.time(),
        user_id=user,
        request_model="gpt-4o",
        request_body={"messages": [{"role": "user", "content": f"q{i}"}]},
    )
    r.choices[0] = r._choice(0)
    r.choices[0].text.append(f"answer {i} \x00 ü")
    r.terminal_seen = True
    r.finish(OUTCOME_COMPLETE)
    row = r.to_row()
    if ended is not None:
        row["started_at"] = row["ended_at"] = ended
    return row


def write(engine, rows: list[dict], tmp_path: Path, instance: str = INSTANCE) -> None:
    writer = AuditWriter(engine, Spool(tmp_path / f"spool-{instance}.jsonl"), instance)
    for row in rows:
        writer.submit(row)
    writer.close()


def seeded(engine, tmp_path, n: int = 8) -> list[dict]:
    write(engine, [record(i) for i in range(n)], tmp_path)
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(select(exchanges).order_by(exchanges.c.chain_seq)).mappings()]


def seeded_file(tmp_path: Path, n: int) -> tuple[str, list[dict], sqlite3.Connection]:
    """An SQLite file holding ``n`` sealed records: its URL, the rows, and a connection of
    its own to edit it by hand, as whoever can write the file would."""
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    engine = open_engine(url)
    rows = seeded(engine, tmp_path, n)
    engine.dispose()
    return url, rows, sqlite3.connect(tmp_path / "audit.db")


def first_problem(engine, checkpoints=()) -> tuple[str, int | None] | None:
    report = verify(engine, checkpoints)
    problems = [p for c in report.chains for p in c.problems] + report.unchained
    return (problems[0].kind, problems[0].seq) if problems else None


def sql(engine, statement) -> None:
    with engine.begin() as conn:
        conn.execute(statement)


def llm_audit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "llm-audit"), *args], capture_output=True, text=True, timeout=120)


def test_records_are_sealed_in_order_and_a_clean_log_verifies(engine, url, tmp_path):
    rows = seeded(engine, tmp_path)
    assert [r["chain_seq"] for r in rows] == list(range(1, 9))
    assert rows[0]["prev_hash"] == GENESIS and all(b["prev_hash"] == a["record_hash"] for a, b in zip(rows, rows[1:]))
    assert {r["chain_id"] for r in rows} == {INSTANCE}
    report = verify(engine)
    assert report.ok and [(c.chain_id, c.records, c.last.seq) for c in report.chains] == [(INSTANCE, 8, 8)]
    out = llm_audit("--db", url, "verify")
    assert (out.returncode, out.stdout) == (0, f"chain {INSTANCE}: OK, records 1..8\n")
    doc = orjson.loads(llm_audit("--db", url, "verify", "--format", "json").stdout)
    assert doc["ok"] and doc["chains"][0]["head_hash"] == rows[-1]["record_hash"]


def test_a_restarted_writer_continues_its_chain_and_another_instance_has_its_own(engine, tmp_path):
    seeded(engine, tmp_path, 3)
    write(engine, [record(10), record(11)], tmp_path)
    write(engine, [record(20) | {"proxy_instance": "proxy-b"}], tmp_path, instance="proxy-b")
    report = verify(engine)
    assert report.ok and [(c.chain_id, c.last.seq) for c in report.chains] == [(INSTANCE, 5), ("proxy-b", 1)]


def test_an_edited_field_is_named(engine, tmp_path):
    rows = seeded(engine, tmp_path)
    sql(engine, update(exchanges).where(exchanges.c.id == rows[3]["id"]).values(request_model="cheap-model"))
    assert first_problem(engine) == ("modified", 4)
    out = llm_audit("--db", str(engine.url.render_as_string(hide_password=False)), "verify")
    assert out.returncode == 1 and "TAMPERED" in out.stdout and rows[3]["id"] in out.stdout


def test_edited_content_is_named(engine, tmp_path):
    rows = seeded(engine, tmp_path)
    sql(engine, update(exchanges).where(exchanges.c.id == rows[2]["id"]).values(output_text="something else"))
    report = verify(engine)
    problem = report.chains[0].problems[0]
    assert (problem.kind, problem.seq, problem.detail) == (
        "modified",
        3,
        "its content (output_text) does not match its hash",
    )


def test_a_deleted_record_is_named(engine, tmp_path):
    rows = seeded(engine, tmp_path)
    sql(engine, delete(exchanges).where(exchanges.c.id == rows[4]["id"]))
    assert first_problem(engine) == ("deleted", 5)


def test_a_forged_record_is_named_inserted(engine, tmp_path):
    rows = seeded(engine, tmp_path)
    forged = record(99) | {"id": "f" * 32}
    sql(engine, insert(exchanges).values(_storable(forged)))  # an INSERT by hand: in no chain
    assert first_problem(engine) == ("inserted", None)
    sql(engine, delete(exchanges).where(exchanges.c.id == forged["id"]))

    # one made to fit: it links to record 4 and takes number 5; the real 5 now links past it
    sealed = Chain(INSTANCE, Head(4, rows[3]["record_hash"])).seal(_storable(forged))
    sql(engine, update(exchanges).where(exchanges.c.chain_seq >= 5).values(chain_seq=exchanges.c.chain_seq + 1))
    sql(engine, insert(exchanges).values(sealed))
    assert first_problem(engine) == ("inserted", 5)


def test_two_swapped_records_are_named_reordered(engine, tmp_path):
    rows = seeded(engine, tmp_path)
    a, b = rows[2], rows[3]
    sql(engine, update(exchanges).where(exchanges.c.id == a["id"]).values(chain_seq=-1))
    sql(engine, update(exchanges).where(exchanges.c.id == b["id"]).values(chain_seq=3))
    sql(engine, update(exchanges).where(exchanges.c.id == a["id"]).values(chain_seq=4))
    assert first_problem(engine) == ("reordered", 3)


def rewrite_from(engine, rows: list[dict], start: int) -> None:
    """Change record ``start`` and re-seal it and everything after: a consistent chain."""
    head = Head(start - 1, rows[start - 2]["record_hash"])
    chain = Chain(INSTANCE, head)
    for row in rows[start - 1 :]:
        changed = {
            k: v
            for k, v in row.items()
            if k not in ("chain_id", "chain_seq", "prev_hash", "record_hash", "content_hashes", "erased_at")
        }
        if row["chain_seq"] == start:
            changed["output_text"] = "a nicer answer"
        sealed = chain.seal(changed)
        sql(
            engine,
            update(exchanges)
            .where(exchanges.c.id == row["id"])
            .values(
                output_text=sealed["output_text"],
                prev_hash=sealed["prev_hash"],
                record_hash=sealed["record_hash"],
                content_hashes=sealed["content_hashes"],
            ),
        )
    sql(engine, update(chains).where(chains.c.chain_id == INSTANCE).values(head_hash=chain.head.hash))


def checkpoint_now(engine, tmp_path) -> Path:
    key = load_or_create_key(tmp_path / "key.pem")
    with engine.connect() as conn:
        head = conn.execute(select(chains.c.head_seq, chains.c.head_hash)).one()
    write_checkpoint(tmp_path / "checkpoints", key, {INSTANCE: Head(head.head_seq, head.head_hash)})
    return tmp_path / "checkpoints"


def test_a_chain_rewritten_from_the_middle_is_caught_only_with_a_checkpoint(engine, tmp_path):
    rows = seeded(engine, tmp_path)
    directory = checkpoint_now(engine, tmp_path)
    rewrite_from(engine, rows, 5)
    assert first_problem(engine) is None  # consistent: the chain alone cannot tell
    checkpoints = read_checkpoints(directory, load_or_create_key(tmp_path / "key.pem").public_key())
    assert first_problem(engine, checkpoints) == ("rewritten", 8)


def test_a_tail_removed_after_a_checkpoint_is_caught_only_with_it(engine, tmp_path, url):
    rows = seeded(engine, tmp_path)
    directory = checkpoint_now(engine, tmp_path)
    sql(engine, delete(exchanges).where(exchanges.c.chain_seq >= 7))
    sql(engine, update(chains).values(head_seq=6, head_hash=rows[5]["record_hash"]))  # covering the tracks
    assert first_problem(engine) is None
    out = llm_audit(
        "--db",
        url,
        "verify",
        "--checkpoints",
        str(directory),
        "--public-key",
        str(public_key_path(tmp_path / "key.pem")),
    )
    assert out.returncode == 1 and "truncated" in out.stdout and "the records after 6 were removed" in out.stdout


def test_a_forged_checkpoint_and_a_wrong_key_are_refused(engine, tmp_path, url):
    seeded(engine, tmp_path, 2)
    directory = checkpoint_now(engine, tmp_path)
    load_or_create_key(tmp_path / "other.pem")  # another key, and its .pub
    out = llm_audit(
        "--db",
        url,
        "verify",
        "--checkpoints",
        str(directory),
        "--public-key",
        str(public_key_path(tmp_path / "other.pem")),
    )
    assert out.returncode == 2 and "which is not a trusted key" in out.stderr and len(out.stderr.splitlines()) == 1
    both = llm_audit(
        "--db",
        url,
        "verify",
        "--checkpoints",
        str(directory),
        "--public-key",
        str(public_key_path(tmp_path / "other.pem")),
        "--public-key",
        str(public_key_path(tmp_path / "key.pem")),
    )
    assert both.returncode == 0, both  # a rotated key: either one is trusted
    [path] = directory.glob("checkpoint-*.json")
    doc = orjson.loads(path.read_bytes())
    doc["chains"][INSTANCE]["seq"] = 1
    path.write_bytes(orjson.dumps(doc))
    with pytest.raises(CheckpointError, match="signature does not match"):
        read_checkpoints(directory, load_or_create_key(tmp_path / "key.pem").public_key())


def test_purge_and_erase_keep_the_chain_verifiable(engine, tmp_path):
    old = datetime.now(UTC) - timedelta(days=400)
    write(engine, [record(i, ended=old + timedelta(minutes=i)) for i in range(4)] + [record(9, user="bob")], tmp_path)
    directory = checkpoint_now(engine, tmp_path)
    result = purge(engine, datetime.now(UTC) - timedelta(days=200), dry_run=False, actor="test", older_than="200d")
    assert result.count == 4
    with engine.connect() as conn:
        start = conn.execute(select(chains.c.start_seq, chains.c.start_prev_hash)).one()
        starts = conn.execute(select(purge_log.c.chain_starts)).scalar()
    assert start.start_seq == 5 and start.start_prev_hash != GENESIS
    assert starts == {INSTANCE: {"seq": 5, "prev_hash": start.start_prev_hash}}  # the purge is logged
    assert erase_user(engine, "bob", actor="test").count == 1
    with engine.connect() as conn:  # and so is the erasure
        assert [
            tuple(r)
            for r in conn.execute(select(erasure_log.c.actor, erasure_log.c.user_id, erasure_log.c.erased_count))
        ] == [("test", "bob", 1)]
    with engine.connect() as conn:
        erased = conn.execute(select(exchanges)).mappings().one()
    assert (erased["output_text"], erased["request_body"], erased["erased_at"] is not None) == (
        "[erased]",
        "[erased]",
        True,
    )
    checkpoints = read_checkpoints(directory, load_or_create_key(tmp_path / "key.pem").public_key())
    report = verify(engine, checkpoints)
    assert report.ok and (report.chains[0].records, report.chains[0].erased, report.chains[0].start) == (1, 1, 5)
    assert report.chains[0].verdict() == f"chain {INSTANCE}: OK, records 5..5, 1 erased, 1 checkpoints matched"


def test_records_spooled_during_an_outage_keep_their_place_in_the_chain(tmp_path):
    db = tmp_path / "audit.db"
    engine = engine_for(db)  # fails fast while the database is locked
    spool = Spool(tmp_path / "spool.jsonl")
    writer = AuditWriter(engine, spool, INSTANCE)
    writer.submit(record(0))
    deadline = time.monotonic() + 10
    while writer.written < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    blocker = sqlite3.connect(db, timeout=0)
    blocker.execute("BEGIN EXCLUSIVE")
    for i in range(1, 5):
        writer.submit(record(i))
    while spool.records < 4:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    blocker.rollback()
    blocker.close()
    writer.close()
    engine = engine_for(db)
    write(engine, [record(5)], tmp_path / "again")  # a new run: replays nothing, continues at 6
    report = verify(engine)
    assert report.ok and report.chains[0].last.seq == 6


def test_interrupted_records_are_sealed_when_marked(engine, tmp_path):
    open_row = record(0) | {"status": "in_progress", "ended_at": None}
    open_row["started_at"] = datetime.now(UTC) - timedelta(minutes=5)
    write(engine, [open_row], tmp_path)  # the proxy opened it, then died
    write(engine, [record(1)], tmp_path)
    with engine.connect() as conn:
        statuses = dict(conn.execute(select(exchanges.c.status, exchanges.c.chain_seq)).all())
    assert statuses == {"interrupted": 1, "completed": 2}
    assert verify(engine).ok


def test_the_canonical_form_is_stable():
    """Records sealed today must verify forever: pin the serialization of one record."""
    row = {
        "id": "x",
        "status": "completed",
        "dialect": "llm-stream",
        "streamed": True,
        "event_count": 3,
        "started_at": datetime(2026, 1, 2, 3, 4, 5, 600000, tzinfo=UTC),
        "findings": [{"code": "c", "detail": ""}],
    }
    assert record_hash(row, {"output_text": "ab"}, "p", GENESIS) == record_hash(
        row | {"provider": None}, {"output_text": "ab"}, "p", GENESIS
    )
    assert canonical(row, {"output_text": "ab"}, "p", GENESIS) == (
        b'{"chain":"p","content":{"output_text":"ab"},"fields":{"dialect":"llm-stream","event_count":3,'
        b'"findings":[{"code":"c","detail":""}],"id":"x","started_at":"2026-01-02T03:04:05.600000Z",'
        b'"status":"completed","streamed":true},"prev":"' + GENESIS.encode() + b'"}'
    )
    assert (
        record_hash(row, {"output_text": "ab"}, "p", GENESIS)
        == "a76a9dc401a1b771e3adc6ec6f924fa3c2726380dc1a235abc0a0b5746ae7383"
    )


@pytest.mark.parametrize(
    "column, text",
    [
        ("output", "{not json"),
        ("started_at", "yesterday"),
        ("input_tokens", "many"),
        ("findings", "[1,"),
        ("verdicts", '{"a":'),
        ("tool_calls", "nope"),
        ("request_headers", "{"),
        ("request_body", "[1,"),
        ("usage_details", "{"),
        ("user_id", b"alice"),
        ("output_text", b'"x\xff'),
        ("input_tokens", b"\x00"),
        ("http_status", "x"),
        ("cost_usd", "x"),
        ("streamed", "no"),
        ("id", b"\x00"),
        ("request_body", '{"messages":[{"role":"user","content":"\\u0071' + '0"}]}'),  # (q0, escaped)
    ],
)
def test_values_sqlite_cannot_check_are_named_as_tampering_and_hide_no_other_record(tmp_path, column, text):
    """SQLite keeps anything in any column: an insider's garbage is a modified record, and
    one such value stopped list, export (and stats, in verdicts) for every record. Now
    each command reads the rest: the value is empty, and a warning names the record."""
    url, rows, con = seeded_file(tmp_path, 4)
    con.execute(f"UPDATE exchanges SET {column} = ? WHERE id = ?", (text, rows[1]["id"]))
    con.commit()
    con.close()
    out = llm_audit("--db", url, "verify")
    named = "(id: a BLOB, no text)" if column == "id" else rows[1]["id"]
    assert out.returncode == 1 and "TAMPERED" in out.stdout and named in out.stdout, out
    assert "Traceback" not in out.stderr
    for command in (["list"], ["export"], ["export", "--format", "csv"], ["stats"], ["list", "--contains", "answer"]):
        run = llm_audit("--db", url, *command)
        assert run.returncode == 0 and "Traceback" not in run.stderr, (command, run)
        others = [r["id"] for i, r in enumerate(rows) if i != 1]
        assert command == ["stats"] or all(i[:12] in run.stdout for i in others), (command, run)
        assert len(run.stderr.splitlines()) <= 1, run.stderr
    if column == "id":
        return  # (no id to show it by)
    run = llm_audit("--db", url, "show", rows[1]["id"])
    assert run.returncode == 0 and rows[1]["id"] in run.stdout, run
    if not str(text).startswith('{"messages"'):  # (an escaped JSON text reads as the same value: no warning)
        warning = f"llm-audit: warning: a record holds values llm-audit did not write, shown as empty (first: {rows[1]['id']}: {column}"
        assert run.stderr.startswith(warning) and len(run.stderr.splitlines()) == 1, run.stderr


@pytest.mark.parametrize(
    "column, first, path",
    [
        ("request_body", '{"messages":[{"role":"user","content":"forged"}],', "$.messages[0].content"),
        (
            "output",
            '{"choices":[{"index":0,"finish_reason":"forged","finish_reason":null}],',
            "$.choices[0].finish_reason",
        ),
    ],
)
def test_a_json_object_holding_a_key_twice_is_named_modified(tmp_path, column, first, path):
    """SQLite's JSON functions read the first of two equal keys, every Python parser the
    last: a forger who puts forged content first shows it to SQL while the record's hash,
    taken over what verify reads, still checks out (the CLI review's M3)."""
    url, rows, con = seeded_file(tmp_path, 3)
    where = (rows[1]["id"],)
    (stored,) = con.execute(f"SELECT {column} FROM exchanges WHERE id = ?", where).fetchone()
    con.execute(f"UPDATE exchanges SET {column} = ? WHERE id = ?", (first + stored[1:], *where))
    con.commit()
    (shown,) = con.execute(f"SELECT json_extract({column}, ?) FROM exchanges WHERE id = ?", (path, *where)).fetchone()
    con.close()
    assert shown == "forged"
    out = llm_audit("--db", url, "verify")
    assert out.returncode == 1 and "TAMPERED" in out.stdout and rows[1]["id"] in out.stdout, out
    assert "twice (SQL reads the first)" in out.stdout, out


def test_a_body_that_is_a_bare_number_is_sealed_as_stored(engine, tmp_path, url):
    """SQLite's JSON columns take a number's text as a number: a client's body 1.0 was
    stored as the integer 1, and verify then called the record tampered with (the
    review's finding 5). It is stored as its JSON text, on both backends."""
    write(engine, [record(0) | {"request_body": 1.0}, record(1) | {"request_body": 5}, record(2)], tmp_path)
    report = verify(engine)
    assert report.ok and [c.records for c in report.chains] == [3], [
        p.line() for c in report.chains for p in c.problems
    ]
    with engine.connect() as conn:
        bodies = conn.execute(
            select(exchanges.c.request_body, exchanges.c.findings).order_by(exchanges.c.chain_seq)
        ).all()
    assert [b.request_body for b in bodies[:2]] == ["1.0", "5"]
    assert {
        "code": "stored_reduced",
        "detail": "request_body: a bare number: stored as its JSON text, a JSON string",
    } in bodies[0].findings


def test_a_bare_number_body_sealed_before_stop_50_still_verifies(tmp_path, monkeypatch):
    """Written as the writer wrote it until stop 50 (the number itself), SQLite stored
    1.0 as the integer 1 and 2**63 as a real: SQL reads the same number either way, so
    verify takes the form the hash names (the second review's finding 5)."""
    from storage import prepare as prepare_module

    check, content = prepare_module._SPECS["request_body"]

    def as_before(name, value, notes, postgres, max_bytes):
        if type(value) in (int, float):
            return value, orjson.dumps(value)
        return check(name, value, notes, postgres, max_bytes)

    monkeypatch.setitem(prepare_module._SPECS, "request_body", (as_before, content))
    engine = open_engine(f"sqlite:///{tmp_path / 'audit.db'}")
    try:
        write(engine, [record(0) | {"request_body": b} for b in (1.0, 5, 2**63, 2.5)], tmp_path)
        with engine.connect() as conn:
            kinds = (
                conn.exec_driver_sql("SELECT typeof(request_body) FROM exchanges ORDER BY chain_seq").scalars().all()
            )
        assert kinds == ["integer", "integer", "real", "real"]
        report = verify(engine)
        assert report.ok, [p.line() for c in report.chains for p in c.problems]
    finally:
        engine.dispose()


@pytest.mark.parametrize("form", ["offset", "T"])
def test_a_time_written_otherwise_for_the_same_instant_is_named_modified(tmp_path, form):
    """SQL compares times as their text: one written as the same instant in another form
    (with an offset, or ``T`` between date and time) checks out against the hash, but
    sorts elsewhere for ``list --since`` and ``purge``; five hours earlier here."""
    url, rows, con = seeded_file(tmp_path, 3)
    where = (rows[1]["id"],)
    (stored,) = con.execute("SELECT started_at FROM exchanges WHERE id = ?", where).fetchone()
    at = datetime.fromisoformat(stored)
    forged = (at - timedelta(hours=5)).isoformat(" ") + "-05:00" if form == "offset" else stored.replace(" ", "T")
    con.execute("UPDATE exchanges SET started_at = ? WHERE id = ?", (forged, *where))
    con.commit()
    con.close()
    out = llm_audit("--db", url, "verify")
    assert out.returncode == 1 and "TAMPERED" in out.stdout and rows[1]["id"] in out.stdout, out
    assert "no time as the writer writes it" in out.stdout, out


@pytest.mark.parametrize("state", ["missing", "empty"])
def test_verify_of_a_missing_or_empty_database_is_an_error_and_creates_nothing(tmp_path, state):
    path = tmp_path / "audit.db"
    if state == "empty":
        path.touch()
    out = llm_audit("--db", f"sqlite:///{path}", "verify")
    assert (out.returncode, out.stdout) == (2, "") and out.stderr.startswith("llm-audit: there is no audit database")
    assert path.exists() == (state == "empty") and (not path.exists() or path.stat().st_size == 0)


def test_a_checkpoint_into_an_impossible_folder_is_one_line(engine, tmp_path, url):
    seeded(engine, tmp_path, 2)
    out = llm_audit("--db", url, "checkpoint", "--key", str(tmp_path / "key.pem"), "--dir", "/proc/no/such/dir")
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr
    assert "cannot write a checkpoint in /proc/no/such/dir" in out.stderr


def signed_verify(url: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    """``llm-audit verify`` against the checkpoints of :func:`checkpoint_now`."""
    return llm_audit(
        "--db",
        url,
        "verify",
        "--checkpoints",
        str(tmp_path / "checkpoints"),
        "--public-key",
        str(public_key_path(tmp_path / "key.pem")),
        *extra,
    )


@pytest.mark.parametrize("state", ["missing", "empty"])
def test_attack_6_a_checkpoint_folder_without_checkpoints_is_an_error(engine, tmp_path, url, state):
    seeded(engine, tmp_path, 2)
    load_or_create_key(tmp_path / "key.pem")
    if state == "empty":
        (tmp_path / "checkpoints").mkdir()
    out = signed_verify(url, tmp_path)
    assert (out.returncode, out.stdout) == (2, ""), out
    assert len(out.stderr.splitlines()) == 1
    assert ("no checkpoints in" if state == "empty" else "no checkpoint directory") in out.stderr


def test_attack_4_a_chain_no_checkpoint_names_is_reported(engine, tmp_path, url):
    seeded(engine, tmp_path, 3)
    checkpoint_now(engine, tmp_path)
    write(
        engine,
        [record(20) | {"proxy_instance": "proxy-b"}, record(21) | {"proxy_instance": "proxy-b"}],
        tmp_path,
        instance="proxy-b",
    )  # consistent, as an insider with the canonical form builds it
    assert llm_audit("--db", url, "verify").returncode == 0  # the chains alone cannot tell
    out = signed_verify(url, tmp_path)
    assert out.returncode == 3, out
    assert "chain proxy-b: NOT SIGNED, records 1..2: no checkpoint names it" in out.stdout
    assert (
        "  proxy-b: no checkpoint signed by a trusted key names this chain: records 1..2 are not covered" in out.stdout
    )
    assert f"chain {INSTANCE}: OK, records 1..3, 1 checkpoints matched" in out.stdout


def test_llm_audit_checkpoint_signs_a_chain_no_checkpoint_names_only_when_told(engine, tmp_path, url):
    """A chain an insider adds (consistent, as the canonical form builds it) is NOT SIGNED
    until something signs it: ``checkpoint`` into a folder that already holds checkpoints
    would launder it, so it leaves it out, names it (exit 3) and waits for ``--new-chain``;
    the chains it knows are signed all the same."""
    seeded(engine, tmp_path, 3)
    sign = ["--db", url, "checkpoint", "--key", str(tmp_path / "key.pem"), "--dir", str(tmp_path / "checkpoints")]
    first = llm_audit(*sign)  # a folder of its own: the chains it finds are its start
    assert first.returncode == 0 and f"1 chains signed: {INSTANCE} at 3, records 1..3 new" in first.stdout, first
    write(engine, [record(20) | {"proxy_instance": "proxy-b"}], tmp_path, instance="proxy-b")
    write(engine, [record(21)], tmp_path)
    out = llm_audit(*sign)
    assert out.returncode == 3 and len(out.stderr.splitlines()) == 1, out
    assert out.stderr.startswith("llm-audit: warning: left out: no checkpoint in"), out
    assert "names chain 'proxy-b' (records 1..1)" in out.stderr and "--new-chain proxy-b" in out.stderr, out
    assert f"1 chains signed: {INSTANCE} at 4, record 4 new" in out.stdout, out
    assert signed_verify(url, tmp_path).returncode == 3
    assert llm_audit(*sign, "--new-chain", "proxy-b").returncode == 0
    assert signed_verify(url, tmp_path).returncode == 0
    elsewhere = tmp_path / "elsewhere"  # a folder whose checkpoints name none of them: nothing to sign
    write_checkpoint(elsewhere, load_or_create_key(tmp_path / "key.pem"), {})
    alone = llm_audit(*sign[:-1], str(elsewhere))
    assert alone.returncode == 2 and alone.stderr.startswith("llm-audit: refusing to sign: no checkpoint in"), alone
    assert len(list(elsewhere.glob("checkpoint-*.json"))) == 1


def test_a_checkpoint_signs_the_heads_its_check_read(engine, tmp_path, url, monkeypatch, capsys):
    """What is written while the check runs (minutes, on a large database) waits for the
    next checkpoint: a second reading of the heads signed a chain nobody had checked, and
    past the --new-chain guard (the review's race, two processes)."""
    from cli import integrity
    from cli.main import main

    seeded(engine, tmp_path, 3)
    sign = ["--db", url, "checkpoint", "--key", str(tmp_path / "key.pem"), "--dir", str(tmp_path / "checkpoints")]
    assert main(sign) == 0
    checked = integrity.verify

    def written_meanwhile(*args, **kwargs):
        report = checked(*args, **kwargs)
        write(engine, [record(30)], tmp_path)
        write(engine, [record(31) | {"proxy_instance": "proxy-z"}], tmp_path, instance="proxy-z")
        return report

    monkeypatch.setattr(integrity, "verify", written_meanwhile)
    assert main(sign) == 0
    newest = max((tmp_path / "checkpoints").glob("checkpoint-*.json"))
    assert list(orjson.loads(newest.read_bytes())["chains"]) == [INSTANCE]
    assert orjson.loads(newest.read_bytes())["chains"][INSTANCE]["seq"] == 3


def test_a_chain_whose_checkpointed_records_were_purged_is_still_named(engine, tmp_path, url):
    """A signed purge that takes every record a checkpoint covered leaves the chain named
    by that checkpoint: not "NOT SIGNED", and ``checkpoint`` goes on signing it."""
    old = datetime.now(UTC) - timedelta(days=400)
    write(engine, [record(i, ended=old + timedelta(minutes=i)) for i in range(3)], tmp_path)
    checkpoint_now(engine, tmp_path)
    write(engine, [record(9)], tmp_path)
    assert llm_audit("--db", url, "purge", "--older-than", "200d", *signed(tmp_path)).returncode == 0
    out = signed_verify(url, tmp_path)
    assert out.returncode == 3 and f"{INSTANCE}: not yet covered by a checkpoint: record 4" in out.stdout, out
    done = llm_audit("--db", url, "checkpoint", *signed(tmp_path))
    assert done.returncode == 0 and f"{INSTANCE} at 4, record 4 new" in done.stdout, done
    assert signed_verify(url, tmp_path).returncode == 0


def test_attack_5_records_after_the_last_checkpoint_are_reported_not_yet_covered(engine, tmp_path, url):
    seeded(engine, tmp_path, 3)
    checkpoint_now(engine, tmp_path)
    write(engine, [record(10), record(11)], tmp_path)  # appended after the checkpoint
    out = signed_verify(url, tmp_path)
    assert out.returncode == 3, out
    assert out.stdout.splitlines() == [
        f"chain {INSTANCE}: OK, records 1..5, 1 checkpoints matched",
        f"  {INSTANCE}: not yet covered by a checkpoint: records 4..5",
    ]
    doc = orjson.loads(signed_verify(url, tmp_path, "--format", "json").stdout)
    assert (doc["ok"], doc["covered"], doc["chains"][0]["uncovered"]) == (True, False, {"first": 4, "last": 5})
    checkpoint_now(engine, tmp_path)  # the next checkpoint covers them
    assert signed_verify(url, tmp_path).returncode == 0


def test_attack_8_a_restart_with_a_spool_not_yet_replayed_signs_only_what_the_database_holds(tmp_path):
    """The shutdown checkpoint of a run that could not replay its spool names the last
    record in the database, not the spool's: verify must not see a truncation."""
    db = tmp_path / "audit.db"
    open_engine(f"sqlite:///{db}").dispose()  # the schema, as the proxy creates it
    write(engine_for(db), [record(0), record(1)], tmp_path)
    blocker = sqlite3.connect(db, timeout=0)
    blocker.execute("BEGIN EXCLUSIVE")  # the database refuses writes from here on (readers still read)
    write(engine_for(db), [record(i) for i in range(2, 5)], tmp_path)  # spooled: 3..5
    assert Spool(tmp_path / f"spool-{INSTANCE}.jsonl").records == 3
    key = load_or_create_key(tmp_path / "key.pem")
    checkpointer = Checkpointer(tmp_path / "checkpoints", key, INSTANCE, every=1, seconds=0)
    writer = AuditWriter(
        engine_for(db), Spool(tmp_path / f"spool-{INSTANCE}.jsonl"), INSTANCE, checkpointer=checkpointer
    )
    writer.close(timeout=5)  # the spool still cannot be replayed
    blocker.rollback()
    blocker.close()
    [checkpoint] = read_checkpoints(tmp_path / "checkpoints", key.public_key())
    assert checkpoint.heads[INSTANCE].seq == 2
    out = signed_verify(f"sqlite:///{db}", tmp_path)
    assert (out.returncode, out.stdout) == (0, f"chain {INSTANCE}: OK, records 1..2, 1 checkpoints matched\n"), out


def signed(tmp_path: Path) -> list[str]:
    """The options that make ``erase`` and ``purge`` sign beside :func:`checkpoint_now`'s checkpoints."""
    return ["--key", str(tmp_path / "key.pem"), "--dir", str(tmp_path / "checkpoints")]


def test_a_signed_erasure_verifies_and_show_marks_it(engine, tmp_path, url):
    write(engine, [record(0), record(1, user="bob"), record(2)], tmp_path)
    with engine.connect() as conn:
        rows = [dict(r) for r in conn.execute(select(exchanges).order_by(exchanges.c.chain_seq)).mappings()]
    checkpoint_now(engine, tmp_path)
    out = llm_audit("--db", url, "erase", "--user", "bob", *signed(tmp_path))
    assert out.returncode == 0 and "signed in" in out.stdout, out
    assert list((tmp_path / "checkpoints").glob("erasure-*.json"))
    ok = signed_verify(url, tmp_path)
    assert (ok.returncode, ok.stdout) == (
        0,
        f"chain {INSTANCE}: OK, records 1..3, 1 erased, 1 checkpoints matched\n",
    ), ok
    show = llm_audit("--db", url, "show", rows[1]["id"])
    assert show.returncode == 0 and "ERASED at " in show.stdout, show


@pytest.mark.parametrize("forgery", ["rewritten content", "marker without a statement"])
def test_attack_1_an_erasure_without_a_signed_statement_is_named(engine, tmp_path, url, forgery):
    rows = seeded(engine, tmp_path, 3)
    checkpoint_now(engine, tmp_path)
    if forgery == "marker without a statement":  # every content column, as llm-audit erase leaves it
        content = {name: "[erased]" for name in CONTENT_COLUMNS if rows[1][name] is not None}
    else:
        content = {"request_body": "a forged prompt", "output_text": "a forged answer"}
    sql(engine, update(exchanges).where(exchanges.c.id == rows[1]["id"]).values(erased_at=datetime.now(UTC), **content))
    out = signed_verify(url, tmp_path)
    assert out.returncode == 1, out
    detail = (
        "no signed erasure statement names it"
        if forgery == "marker without a statement"
        else "its content (request_body, output_text, output, tool_calls) is not the erasure marker"
    )
    assert f"{INSTANCE}: modified: record 2 (id {rows[1]['id']}): it is marked erased, but {detail}" in out.stdout
    if forgery == "rewritten content":  # caught without checkpoints too, and show says it is erased
        assert llm_audit("--db", url, "verify").returncode == 1
        assert "ERASED at " in llm_audit("--db", url, "show", rows[1]["id"]).stdout


def old_records(engine, tmp_path, n: int = 3) -> list[dict]:
    old = datetime.now(UTC) - timedelta(days=400)
    write(engine, [record(i, ended=old + timedelta(minutes=i)) for i in range(n)] + [record(9)], tmp_path)
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(select(exchanges).order_by(exchanges.c.chain_seq)).mappings()]


def test_a_signed_purge_verifies(engine, tmp_path, url):
    old_records(engine, tmp_path)
    checkpoint_now(engine, tmp_path)
    out = llm_audit("--db", url, "purge", "--older-than", "200d", *signed(tmp_path))
    assert out.returncode == 0 and out.stdout.startswith("deleted 3 "), out
    ok = signed_verify(url, tmp_path)
    assert (ok.returncode, ok.stdout) == (0, f"chain {INSTANCE}: OK, records 4..4, 1 checkpoints matched\n"), ok


def test_attack_3_a_forged_purge_is_named(engine, tmp_path, url):
    rows = seeded(engine, tmp_path, 4)  # minutes old
    checkpoint_now(engine, tmp_path)
    sql(engine, delete(exchanges).where(exchanges.c.chain_seq <= 2))
    sql(engine, update(chains).values(start_seq=3, start_prev_hash=rows[1]["record_hash"]))
    assert llm_audit("--db", url, "verify").returncode == 0  # the chain alone cannot tell
    out = signed_verify(url, tmp_path)
    assert out.returncode == 1, out
    assert (
        f"  {INSTANCE}: purged: at 3: the chain starts at record 3, but no signed purge statement moved its "
        "start there: records 1..2 were removed"
    ) in out.stdout


def test_attack_3_a_signed_purge_inside_the_retention_floor_is_named(engine, tmp_path, url):
    old_records(engine, tmp_path)
    checkpoint_now(engine, tmp_path)
    out = llm_audit("--db", url, "purge", "--older-than", "1h", "--force", *signed(tmp_path))
    assert out.returncode == 0, out
    out = signed_verify(url, tmp_path)
    assert out.returncode == 1 and "inside the 183-day retention floor" in out.stdout, out


def test_attack_2_an_open_row_the_proxy_did_not_open_is_never_sealed_or_signed(engine, tmp_path, url, caplog):
    seeded(engine, tmp_path, 2)
    forged = record(5) | {
        "status": "in_progress",
        "ended_at": None,
        "started_at": datetime.now(UTC) - timedelta(minutes=5),
    }
    sql(engine, insert(exchanges).values(_storable(forged)))  # an insider's row under the proxy's instance
    stolen = record(6) | {
        "status": "in_progress",
        "ended_at": None,
        "started_at": datetime.now(UTC) - timedelta(minutes=5),
        "open_mac": "0" * 64,
    }
    sql(engine, insert(exchanges).values(_storable(stolen)))
    key = load_or_create_key(tmp_path / "key.pem")
    writer = AuditWriter(
        engine,
        Spool(tmp_path / f"spool-{INSTANCE}.jsonl"),
        INSTANCE,
        checkpointer=Checkpointer(tmp_path / "checkpoints", key, INSTANCE, every=1, seconds=0),
    )
    writer.submit(record(3))
    writer.close()
    with engine.connect() as conn:
        statuses = dict(conn.execute(select(exchanges.c.id, exchanges.c.status)).all())
    assert (statuses[forged["id"]], statuses[stolen["id"]]) == ("in_progress", "in_progress")
    assert (
        f"2 exchanges in progress under this instance (first: {forged['id']}) were not opened by this proxy"
        in caplog.text
        or f"(first: {stolen['id']})" in caplog.text
    )
    out = signed_verify(url, tmp_path)
    assert out.returncode == 0, out
    assert out.stdout.startswith(f"chain {INSTANCE}: OK, records 1..3, 1 checkpoints matched\nrecords still open: 2 (")


def test_attack_7_a_second_writer_under_a_name_in_use_is_refused_and_a_stale_lease_is_taken_over(engine, tmp_path):
    first = AuditWriter(engine, Spool(tmp_path / "a.jsonl"), INSTANCE)
    try:
        with pytest.raises(
            LeaseHeld,
            match=r"another proxy \(.+\) records into this database as instance "
            r"'proxy-a' .*give this proxy its own name with --set llm_audit_instance=NAME",
        ):
            AuditWriter(engine, Spool(tmp_path / "b.jsonl"), INSTANCE)
    finally:
        first.close()
    sql(
        engine,
        update(chains).values(
            lease_holder="elsewhere pid 1 since 2026-01-01T00:00:00Z #abc",
            lease_until=datetime.now(UTC) - timedelta(seconds=1),
        ),
    )  # lapsed
    write(engine, [record(0)], tmp_path)  # taken over
    with engine.connect() as conn:
        assert conn.execute(select(chains.c.lease_holder)).scalar() is None  # and released at close
    assert verify(engine).ok


def test_attack_7_a_chain_forked_anyway_is_reported_as_a_fork_where_it_forked(engine, tmp_path, url):
    seeded(engine, tmp_path, 3)
    a = AuditWriter(engine, Spool(tmp_path / "a.jsonl"), INSTANCE)
    sql(engine, update(chains).values(lease_holder=None))  # an insider clears the lease
    b = AuditWriter(engine, Spool(tmp_path / "b.jsonl"), INSTANCE)
    a.submit(record(10))
    a.close()
    b.submit(record(11))
    b.close()
    out = llm_audit("--db", url, "verify")
    assert out.returncode == 1, out
    assert f"{INSTANCE}: forked: record 4 (id " in out.stdout
    assert (
        "links to the same record as the first: two writers sealed into this chain from record 4 on (two "
        "proxies with one llm_audit_instance?)"
    ) in out.stdout


def test_attack_5_records_appended_while_the_proxy_was_stopped_are_not_signed_in_at_its_restart(engine, tmp_path, url):
    key = load_or_create_key(tmp_path / "key.pem")

    def run(rows: list[dict]) -> None:
        writer = AuditWriter(
            engine,
            Spool(tmp_path / f"spool-{INSTANCE}.jsonl"),
            INSTANCE,
            checkpointer=Checkpointer(tmp_path / "checkpoints", key, INSTANCE, every=1, seconds=0),
        )
        for row in rows:
            writer.submit(row)
        writer.close()

    run([record(0), record(1)])
    with engine.connect() as conn:
        rows = [dict(r) for r in conn.execute(select(exchanges).order_by(exchanges.c.chain_seq)).mappings()]
    forged = Chain(INSTANCE, Head(rows[-1]["chain_seq"], rows[-1]["record_hash"])).seal(record(7))
    sql(engine, insert(exchanges).values(_storable(forged)))  # consistent, by the canonical form
    sql(engine, update(chains).values(head_seq=3, head_hash=forged["record_hash"]))
    run([record(2)])  # the proxy restarts and goes on after it
    out = signed_verify(url, tmp_path)
    assert out.returncode == 1, out
    assert (
        f"  {INSTANCE}: unvouched: at 3: record 3 was in the database when the proxy restarted, but it had not "
        "written them"
    ) in out.stdout


def test_llm_audit_checkpoint_refuses_to_sign_over_tampering(engine, tmp_path, url):
    rows = seeded(engine, tmp_path, 4)
    sign = ["--db", url, "checkpoint", "--key", str(tmp_path / "key.pem"), "--dir", str(tmp_path / "checkpoints")]
    assert llm_audit(*sign).returncode == 0
    sql(engine, delete(exchanges).where(exchanges.c.chain_seq <= 2))  # a forged purge
    sql(engine, update(chains).values(start_seq=3, start_prev_hash=rows[1]["record_hash"]))
    out = llm_audit(*sign)
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out
    assert f"refusing to sign: chain {INSTANCE} does not verify against the checkpoints in" in out.stderr
    assert len(list((tmp_path / "checkpoints").glob("checkpoint-*.json"))) == 1


def test_attack_8_on_postgresql_a_restart_that_cannot_replay_signs_only_what_the_database_holds(postgres, tmp_path):
    """As on SQLite above, the database refusing writes (read-only) while reads go on."""
    url = postgres.create_database()
    name = url.rsplit("/", 1)[1]
    engine = open_engine(url)
    write(engine, [record(0), record(1)], tmp_path)
    engine.dispose()
    sql_on = open_engine(postgres.url_for("postgres"))
    with sql_on.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
    try:
        write(open_engine(url), [record(i) for i in range(2, 5)], tmp_path)  # spooled: 3..5
        assert Spool(tmp_path / f"spool-{INSTANCE}.jsonl").records == 3
        key = load_or_create_key(tmp_path / "key.pem")
        writer = AuditWriter(
            open_engine(url),
            Spool(tmp_path / f"spool-{INSTANCE}.jsonl"),
            INSTANCE,
            checkpointer=Checkpointer(tmp_path / "checkpoints", key, INSTANCE, every=1, seconds=0),
        )
        writer.close(timeout=5)
    finally:
        with sql_on.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql(f'ALTER DATABASE "{name}" SET default_transaction_read_only = off')
        sql_on.dispose()
    [checkpoint] = read_checkpoints(tmp_path / "checkpoints", key.public_key())
    assert checkpoint.heads[INSTANCE].seq == 2
    out = signed_verify(url, tmp_path)
    assert (out.returncode, out.stdout) == (0, f"chain {INSTANCE}: OK, records 1..2, 1 checkpoints matched\n"), out


def _purges_finished(engine) -> bool:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).where(purge_log.c.finished_at.is_not(None))).scalar_one() > 0


def test_the_proxys_daily_purge_is_signed_and_verifies(engine, tmp_path, url, monkeypatch):
    old_records(engine, tmp_path)
    checkpoint_now(engine, tmp_path)
    monkeypatch.setattr(DailyPurge, "FIRST_RUN_DELAY", 0.01)
    daily = DailyPurge(
        engine,
        200,
        actor="proxy test",
        signer=Signer(tmp_path / "checkpoints", load_or_create_key(tmp_path / "key.pem")),
    )
    try:
        wait_for(lambda: list((tmp_path / "checkpoints").glob("purge-*.json")), what="a signed purge statement")
        wait_for(lambda: _purges_finished(engine), what="the purge finished")
    finally:
        daily.close()
    ok = signed_verify(url, tmp_path)
    assert (ok.returncode, ok.stdout) == (0, f"chain {INSTANCE}: OK, records 4..4, 1 checkpoints matched\n"), ok


# -- purges and erasures sign nothing over records verify does not accept (review 52a) --------


def young_and_old(engine, tmp_path) -> list[dict]:
    """Records 1..3 400 days old, 4..8 minutes old, checkpointed."""
    old = datetime.now(UTC) - timedelta(days=400)
    rows = [record(i, ended=old + timedelta(minutes=i)) for i in range(3)] + [record(i) for i in range(3, 8)]
    write(engine, rows, tmp_path)
    checkpoint_now(engine, tmp_path)
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(select(exchanges).order_by(exchanges.c.chain_seq)).mappings()]


def test_a_purge_leaves_a_chain_whole_when_young_records_were_made_to_look_old(engine, tmp_path, url):
    """An insider back-dates records minutes old: the next signed purge deleted them with
    the tampering and verify passed (the review's f1). The chain must verify first."""
    rows = young_and_old(engine, tmp_path)
    sql(engine, update(exchanges).where(exchanges.c.chain_seq.between(4, 7)).values(ended_at=datetime(2020, 1, 1)))
    out = llm_audit("--db", url, "purge", "--older-than", "365d", *signed(tmp_path))
    assert out.returncode == 1, out
    assert out.stdout.startswith("deleted 0 "), out
    assert f"chain '{INSTANCE}': record 4 (id {rows[3]['id']}): its fields do not match" in out.stderr
    assert "nothing in the chain was purged" in out.stderr and not list((tmp_path / "checkpoints").glob("purge-*.json"))
    with engine.connect() as conn:
        assert conn.execute(select(exchanges.c.chain_seq).order_by(exchanges.c.chain_seq)).scalars().all() == [
            *range(1, 9)
        ]
    assert signed_verify(url, tmp_path).returncode == 1  # the tampering is still there to see


def test_a_chain_rewritten_consistently_is_left_whole_by_a_purge_that_has_the_checkpoints(engine, tmp_path, url):
    """Hashes recomputed after the back-dating: the chain alone is consistent, the
    checkpoint in the purge's folder is not; the purge checks against it."""
    rows = young_and_old(engine, tmp_path)
    back = datetime(2020, 1, 1, tzinfo=UTC)
    for row in rows[3:7]:
        row["ended_at"] = back
    sql(engine, update(exchanges).where(exchanges.c.chain_seq.between(4, 7)).values(ended_at=back))
    rewrite_from(engine, rows, 4)
    assert llm_audit("--db", url, "verify").returncode == 0  # consistent by itself
    out = llm_audit("--db", url, "purge", "--older-than", "365d", *signed(tmp_path))
    assert out.returncode == 1 and "is not the record a checkpoint signed at its number" in out.stderr, out


def test_an_erasure_refuses_records_whose_user_was_changed_and_verify_names_a_swap_after_it(
    engine, tmp_path, url, monkeypatch
):
    """alice's records given bob's id for bob's erasure, and given back after it: her
    content went under a real statement and verify passed (the review's f15)."""
    write(engine, [record(0, user="bob"), record(1), record(2)], tmp_path)
    checkpoint_now(engine, tmp_path)
    sql(engine, update(exchanges).where(exchanges.c.chain_seq == 2).values(user_id="bob"))
    out = llm_audit("--db", url, "erase", "--user", "bob", *signed(tmp_path))
    assert out.returncode == 1 and "its fields do not match its hash" in out.stderr, out
    assert out.stdout.startswith("erased the content of 0 exchanges of user 'bob'"), out  # (their chain is in doubt)
    with engine.connect() as conn:
        erased = conn.execute(select(exchanges.c.chain_seq).where(exchanges.c.erased_at.is_not(None))).scalars().all()
        assert erased == []
    # An erasure signed over the swap all the same (by a version before this check), the
    # id given back after it: the record verifies by itself; the statement says whose it erased.
    monkeypatch.setattr("storage.erase._doubts", lambda *args: {})
    signer = Signer(tmp_path / "checkpoints", load_or_create_key(tmp_path / "key.pem"))
    assert erase_user(engine, "bob", actor="test", signer=signer).count == 2
    sql(engine, update(exchanges).where(exchanges.c.chain_seq == 2).values(user_id="alice"))
    out = signed_verify(url, tmp_path)
    assert out.returncode == 1, out
    assert "a signed erasure statement erased it as user 'bob''s, but it is 'alice''s" in out.stdout, out


def test_an_erasure_erases_only_what_it_signed_and_counts_what_is_still_open(engine, tmp_path, url, monkeypatch):
    """A record the proxy seals while the statement is written waits for the next
    erasure (erased unsigned it read as tampering: the review's f8); open ones are said."""
    write(engine, [record(0, user="bob"), record(1, user="bob")], tmp_path)
    checkpoint_now(engine, tmp_path)
    signer = Signer(tmp_path / "checkpoints", load_or_create_key(tmp_path / "key.pem"))
    sign = Signer.erasure

    def sealed_meanwhile(self, user_id, records, now):
        path = sign(self, user_id, records, now)
        other = open_engine(url)  # (the proxy's writer, on its own connection)
        write(other, [record(2, user="bob")], tmp_path)
        other.dispose()
        return path

    monkeypatch.setattr(Signer, "erasure", sealed_meanwhile)
    done = erase_user(engine, "bob", actor="test", signer=signer)
    assert (done.count, done.refused) == (2, {})
    out = signed_verify(url, tmp_path)  # (record 3 is after the last checkpoint: not yet covered)
    assert out.returncode == 3 and "records 1..3, 2 erased" in out.stdout, out


def test_a_purge_never_moves_a_chain_start_back(engine, tmp_path, url):
    """Two purges that overlap: the one with the older cut-off committing last moved the
    start back over records the other deleted (verify: deleted; the review's f4)."""
    rows = old_records(engine, tmp_path, 4)
    purge(engine, datetime.now(UTC) - timedelta(days=200), dry_run=False, actor="t", older_than="200d")
    with engine.begin() as conn:
        from storage.retention import _Cut, _move_start

        _move_start(conn, _Cut(INSTANCE, 2, rows[1]["record_hash"]))  # the older purge's start, late
        assert conn.execute(select(chains.c.start_seq)).scalar_one() == 5
    assert llm_audit("--db", url, "verify").returncode == 0


def test_a_chain_whose_numbers_cannot_be_read_is_left_whole_and_the_others_purged(tmp_path):
    """One planted row (text as a chain number) made every purge raise, and ended the
    proxy's retention thread (the review's f5)."""
    url, rows, conn = seeded_file(tmp_path, 2)
    engine = open_engine(url)
    old = datetime.now(UTC) - timedelta(days=400)
    write(engine, [record(i, ended=old) for i in range(2)], tmp_path, instance="other")
    conn.execute("UPDATE exchanges SET chain_seq = 'x' WHERE chain_seq = 2 AND chain_id = ?", (INSTANCE,))
    conn.commit()
    result = purge(engine, datetime.now(UTC) - timedelta(days=200), dry_run=False, actor="t", older_than="200d")
    assert result.count == 2  # (the other chain's: both old)
    assert list(result.refused) == [INSTANCE] and "not integers" in result.refused[INSTANCE]
    engine.dispose()


def test_the_proxys_retention_survives_any_failure(engine, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(DailyPurge, "FIRST_RUN_DELAY", 0.01)
    monkeypatch.setattr(DailyPurge, "INTERVAL", 0.05)
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        raise OSError("the statement's disk is full")

    monkeypatch.setattr("storage.retention.purge", failing)
    daily = DailyPurge(engine, 200, actor="t", signer=Signer(tmp_path / "cp", load_or_create_key(tmp_path / "k.pem")))
    try:
        wait_for(lambda: len(calls) >= 3, what="three runs")
        assert daily._thread.is_alive()
    finally:
        daily.close()
    assert "automatic retention failed (OSError: the statement's disk is full)" in caplog.text


def test_every_signed_purge_is_judged_a_forced_one_forever_and_one_dated_ahead(engine, tmp_path, url, monkeypatch):
    """A forced purge was forgotten once a routine one moved the start on (the review's
    f14); one signed by a clock a year ahead passed (f6); a cut-off near year 9999 made
    verify fail with no verdict (f7)."""
    from storage import statements as statements_module

    old_records(engine, tmp_path, 3)
    checkpoint_now(engine, tmp_path)
    signer = Signer(tmp_path / "checkpoints", load_or_create_key(tmp_path / "key.pem"))
    starts = {INSTANCE: {"seq": 2, "prev_hash": "0" * 64}}
    now = datetime.now(UTC)
    signer.purge(now - timedelta(days=1), starts, now)  # forced: inside the floor
    signer.purge(datetime(9999, 12, 31, tzinfo=UTC), starts, now)  # forced, at the end of time
    signer.purge(now - timedelta(days=200), starts, now + timedelta(days=365))  # a clock a year ahead
    assert statements_module.MIN_RETENTION.days == 183
    report = verify(engine, [], read_statements(tmp_path / "checkpoints", signer.key.public_key()))
    details = [p.detail for c in report.chains for p in c.problems]
    assert sum("inside the 183-day retention floor" in d for d in details) == 2, details
    assert sum("after this check's own time" in d for d in details) == 1, details
    later = purge(engine, now - timedelta(days=200), dry_run=False, actor="t", older_than="200d", signer=signer)
    assert later.refused == {} and later.count == 3  # (they cast no doubt on the records now: purges go on)


def test_records_before_a_chains_start_are_checked_leftovers_of_a_purge_and_planted_ones(engine, tmp_path, url):
    """A check from the start never read the records before it: a final record planted
    there (on PostgreSQL the proxy's own role can insert one) passed verify --checkpoints
    and list showed it (the review's f3). An unfinished purge's leftovers link back."""
    rows = seeded(engine, tmp_path, 6)
    sql(engine, update(chains).values(start_seq=4, start_prev_hash=rows[2]["record_hash"]))  # (a purge cut here)
    report = verify(engine)
    assert report.chains[0].ok and report.chains[0].verdict() == (
        f"chain {INSTANCE}: OK, records 4..6, 3 before it left by an unfinished purge"
    )
    sql(engine, update(exchanges).where(exchanges.c.chain_seq == 2).values(output_text="a nicer answer"))
    assert first_problem(engine) == ("modified", 2)
    sql(engine, update(exchanges).where(exchanges.c.chain_seq == 2).values(output_text=rows[1]["output_text"]))
    forged = _storable(rows[0] | {"id": "f" * 32, "chain_seq": 1, "user_id": "framed"})
    sql(engine, delete(exchanges).where(exchanges.c.chain_seq == 1))
    sql(engine, insert(exchanges).values(**forged))  # (its own hash, linking to nothing before)
    sql(engine, update(exchanges).where(exchanges.c.id == "f" * 32).values(record_hash="0" * 64))
    problems = [p for c in verify(engine).chains for p in c.problems]
    assert [(p.kind, p.seq, p.record_id) for p in problems] == [("inserted", 1, "f" * 32)], problems


def test_an_erased_prompt_leaves_no_trace_in_the_sqlite_file(tmp_path):
    """Freed pages are zeroed (secure_delete, off in many SQLite builds) and the log is
    copied in at once: the erased content's old pages stayed in the file (review 52a f2)."""
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    engine = open_engine(url)
    rows = [record(i, user="bob") for i in range(3)]
    for row in rows:
        row["request_body"] = {"messages": [{"role": "user", "content": "a secret prompt of bob " + "x" * 5000}]}
    write(engine, rows, tmp_path)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA secure_delete").scalar() == 1
    assert erase_user(engine, "bob", actor="t").count == 3
    for path in tmp_path.glob("audit.db*"):
        assert b"a secret prompt of bob" not in path.read_bytes(), path
    engine.dispose()


def test_a_stopped_daily_purge_stops_between_batches_without_holding_its_caller(engine, tmp_path, monkeypatch):
    """close() runs on the proxy's event loop: it joined the thread for up to 30 s while
    a purge waited for SQLite's lock (review 52a f10). It stops the purge after its batch."""
    old_records(engine, tmp_path, 5)
    monkeypatch.setattr(DailyPurge, "FIRST_RUN_DELAY", 0.01)
    batches = []
    real = retention_module._delete_batch

    def slow_batch(*args, **kwargs):
        batches.append(1)
        time.sleep(0.5)
        return real(*args, **{**kwargs})

    monkeypatch.setattr(retention_module, "_delete_batch", slow_batch)
    monkeypatch.setattr(retention_module, "purge", partial(retention_module.purge, batch_size=1))
    daily = DailyPurge(engine, 200, actor="t", signer=Signer(tmp_path / "cp", load_or_create_key(tmp_path / "k.pem")))
    wait_for(lambda: batches, what="the first batch")
    started = time.monotonic()
    daily.close()
    assert time.monotonic() - started < 0.1
    daily._thread.join(timeout=10)
    assert not daily._thread.is_alive() and len(batches) < 5
    report = verify(engine)  # (the start moved, the rest left for the next purge)
    assert report.chains[0].ok and "left by an unfinished purge" in report.chains[0].verdict()


def test_old_records_kept_behind_a_young_one_are_said(engine, tmp_path, caplog):
    """A chain loses only a prefix: one record dated ahead (a clock's jump) held back every
    old record after it, with no word (review 52a f13)."""
    old = datetime.now(UTC) - timedelta(days=400)
    rows = [record(0, ended=old), record(1, ended=datetime(2099, 1, 1, tzinfo=UTC))]
    rows += [record(i, ended=old + timedelta(minutes=i)) for i in range(2, 5)]
    write(engine, rows, tmp_path)
    with caplog.at_level("WARNING", logger="storage.retention"):
        result = purge(engine, datetime.now(UTC) - timedelta(days=200), dry_run=False, actor="t", older_than="200d")
    assert result.count == 1
    assert f"chain '{INSTANCE}': 3 exchanges that ended before the cut-off are kept behind record 2" in caplog.text


def test_an_unfinished_purges_leftovers_are_deleted_by_the_next_and_a_quarantined_one_links_back(engine, tmp_path):
    """Leftovers before the start stayed unless a later purge cut further, and one the
    writer had quarantined made verify call the rest inserted (review 52c F8, F5)."""
    old = datetime.now(UTC) - timedelta(days=400)
    write(engine, [record(i, ended=old + timedelta(minutes=i)) for i in range(4)] + [record(4), record(5)], tmp_path)
    with engine.connect() as conn:
        rows = [dict(r) for r in conn.execute(select(exchanges).order_by(exchanges.c.chain_seq)).mappings()]
    sql(engine, update(chains).values(start_seq=5, start_prev_hash=rows[3]["record_hash"]))  # (a purge cut at 4)
    # record 3 was quarantined by the writer: its line is in a file, its row here
    sql(engine, delete(exchanges).where(exchanges.c.chain_seq == 3))
    sql(
        engine,
        insert(quarantine).values(
            quarantined_at=datetime.now(UTC),
            reason="test",
            file="q.jsonl",
            size=1,
            sha256="0" * 64,
            chain_id=INSTANCE,
            chain_seq=3,
            prev_hash=rows[1]["record_hash"],
            record_hash=rows[2]["record_hash"],
            record_id=rows[2]["id"],
        ),
    )
    report = verify(engine).chains[0]
    assert report.ok and "3 before it left by an unfinished purge" in report.verdict(), report.problems
    result = purge(engine, datetime.now(UTC) - timedelta(days=200), dry_run=False, actor="t", older_than="200d")
    assert (result.count, result.refused) == (3, {})  # (only the leftovers are old)
    assert verify(engine).chains[0].verdict() == f"chain {INSTANCE}: OK, records 5..6"


def test_an_erasure_undone_by_a_restored_backup_is_named(engine, tmp_path, url):
    """A backup from before the erasure brought the content back, and verify --checkpoints
    passed: the signed statements name the records erased (review 52a f16)."""
    write(engine, [record(0, user="bob"), record(1)], tmp_path)
    with engine.connect() as conn:
        before = [dict(r) for r in conn.execute(select(exchanges).order_by(exchanges.c.chain_seq)).mappings()]
    checkpoint_now(engine, tmp_path)
    assert llm_audit("--db", url, "erase", "--user", "bob", *signed(tmp_path)).returncode == 0
    restored = {k: before[0][k] for k in (*CONTENT_COLUMNS, "erased_at")}
    sql(engine, update(exchanges).where(exchanges.c.chain_seq == 1).values(**restored))
    assert llm_audit("--db", url, "verify").returncode == 0  # (the chain alone cannot tell)
    out = signed_verify(url, tmp_path)
    assert out.returncode == 1 and "unerased: record 1" in out.stdout and "user 'bob'" in out.stdout, out


def test_an_erasure_refuses_a_record_whose_user_was_changed_and_resealed(engine, tmp_path, url):
    """alice's record given bob's id and the chain re-sealed from it: each record matched
    its hash, and only a checkpoint past it could tell (review 52d F3)."""
    rows = seeded(engine, tmp_path, 4)
    checkpoint_now(engine, tmp_path)
    rows[1]["user_id"] = "bob"
    sql(engine, update(exchanges).where(exchanges.c.chain_seq == 2).values(user_id="bob"))
    rewrite_from(engine, rows, 2)
    assert llm_audit("--db", url, "verify").returncode == 0  # (consistent by itself)
    out = llm_audit("--db", url, "erase", "--user", "bob", *signed(tmp_path))
    assert out.returncode == 1 and "is not the record a checkpoint signed at its number" in out.stderr, out


def test_a_purge_checks_the_records_before_a_chains_start_too(engine, tmp_path):
    """An old record edited and the start moved past it by hand: the next purge deleted
    it unchecked and signed a start past the edit (review 52d F1). Records before the
    start are checked with the rest, and only old ones are deleted."""
    old = datetime.now(UTC) - timedelta(days=400)
    write(engine, [record(i, ended=old + timedelta(minutes=i)) for i in range(5)] + [record(5)], tmp_path)
    with engine.connect() as conn:
        rows = [dict(r) for r in conn.execute(select(exchanges).order_by(exchanges.c.chain_seq)).mappings()]
    sql(engine, update(exchanges).where(exchanges.c.chain_seq == 2).values(output_text="a nicer answer"))
    sql(engine, update(chains).values(start_seq=3, start_prev_hash=rows[1]["record_hash"]))
    result = purge(engine, datetime.now(UTC) - timedelta(days=200), dry_run=False, actor="t", older_than="200d")
    assert result.count == 0 and "record 2" in result.refused[INSTANCE], result
