"""``llm-audit purge``: the real console script against real SQLite files and PostgreSQL.

Rows are written with SQLAlchemy as the proxy's writer would; the command runs as a
subprocess, as a user would run it; what is left is read back with SQLAlchemy.
"""

from __future__ import annotations

import getpass
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, insert, select

from storage.checkpoint import default_key_path, load_or_create_key
from storage.database import open_engine
from storage.schema import exchanges, purge_log

BIN = Path(sys.executable).parent
CUTOFF = datetime(2024, 1, 1, tzinfo=UTC)
US = timedelta(microseconds=1)


@pytest.fixture(autouse=True)
def signing_key() -> Path:
    """The key a purge signs its statement with, where the proxy makes it (a purge never
    makes one: a key mistyped would sign a statement verify distrusts)."""
    load_or_create_key(default_key_path())
    return default_key_path()


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path) -> str:
    """A fresh audit database of each backend, schema in place."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'audit.db'}"
    else:
        url = request.getfixturevalue("postgres").create_database()
    open_engine(url).dispose()
    return url


@pytest.fixture
def engine(url) -> Iterator[Engine]:
    engine = open_engine(url)
    yield engine
    engine.dispose()


def llm_audit(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "LLM_AUDIT_DB"} | (env or {})
    return subprocess.run(
        [str(BIN / "llm-audit"), *args], check=False, capture_output=True, text=True, timeout=timeout, env=environ
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode == 2, proc
    assert proc.stdout == "", proc
    assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for fragment in fragments:
        assert fragment in proc.stderr, proc.stderr


def row(id: str, ended_at: datetime | None, *, status: str = "completed", started_at: datetime | None = None) -> dict:
    started = started_at or (ended_at - timedelta(seconds=3) if ended_at else datetime(2023, 1, 1, tzinfo=UTC))
    return {
        "id": id,
        "status": status,
        "dialect": "llm-stream",
        "streamed": True,
        "started_at": started,
        "ended_at": ended_at,
        "output_text": f"answer {id}",
    }


def add(engine: Engine, rows: list[dict]) -> None:
    with engine.begin() as conn:
        conn.execute(insert(exchanges), rows)


def ids(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(select(exchanges.c.id)).scalars())


def log_rows(engine: Engine) -> list:
    with engine.connect() as conn:
        return conn.execute(select(purge_log).order_by(purge_log.c.id)).all()


def utc(value: datetime) -> datetime:
    """SQLite gives back naive UTC times, PostgreSQL aware ones."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


@pytest.fixture
def boundary_rows(engine) -> None:
    add(
        engine,
        [
            row("at-cutoff", CUTOFF),  # not before the cut-off: stays
            row("just-before", CUTOFF - US),  # goes
            row("long-ago", datetime(2022, 5, 1, tzinfo=UTC)),  # goes
            row("last-month", datetime.now(UTC) - timedelta(days=30)),  # stays unless forced
            row("recent", datetime.now(UTC) - timedelta(minutes=5)),  # stays
            row("open", None, status="in_progress"),  # not ended, started 2023: stays
            row("crashed", None, status="interrupted"),  # started 2023, never ended: goes
        ],
    )


def test_purge_deletes_what_ended_before_the_cutoff_and_logs_it(url, engine, boundary_rows):
    proc = llm_audit("--db", url, "purge", "--older-than", "2024-01-01")
    assert (proc.returncode, proc.stderr) == (0, ""), proc
    assert proc.stdout.startswith("deleted 3 exchanges that ended before 2024-01-01T00:00:00+00:00 from ")
    assert ids(engine) == {"at-cutoff", "last-month", "recent", "open"}

    [log] = log_rows(engine)
    assert proc.stdout.rstrip().endswith(f"(purge_log id {log.id})")
    assert log.actor == getpass.getuser()
    assert utc(log.cutoff) == CUTOFF
    assert log.older_than == "2024-01-01"
    assert log.deleted_count == 3
    assert utc(log.purged_at) <= utc(log.finished_at) <= datetime.now(UTC)


def test_cutoff_with_a_time_and_offset(url, engine, boundary_rows):
    # 2024-01-01T01:00:00+01:00 is the same instant as the date above
    proc = llm_audit("--db", url, "purge", "--older-than", "2024-01-01T01:00:00+01:00")
    assert proc.returncode == 0, proc
    assert ids(engine) == {"at-cutoff", "last-month", "recent", "open"}


def test_dry_run_deletes_nothing_and_records_nothing(url, engine, boundary_rows):
    proc = llm_audit("--db", url, "purge", "--older-than", "2024-01-01", "--dry-run")
    assert (proc.returncode, proc.stderr) == (0, ""), proc
    assert proc.stdout.startswith("would delete 3 exchanges that ended before 2024-01-01T00:00:00+00:00")
    assert "dry run: nothing deleted, nothing recorded" in proc.stdout
    assert len(ids(engine)) == 7
    assert log_rows(engine) == []


def test_less_than_six_months_is_refused_without_force(url, engine, boundary_rows):
    for older_than in ("30d", "182d", "26w", "1h", (datetime.now(UTC) - timedelta(days=100)).date().isoformat()):
        proc = llm_audit("--db", url, "purge", "--older-than", older_than)
        assert_one_line_error(proc, "younger than 183 days", "six months", "--force")
        dry = llm_audit("--db", url, "purge", "--older-than", older_than, "--dry-run")
        assert_one_line_error(dry, "--force")
    assert len(ids(engine)) == 7
    assert log_rows(engine) == []

    # exactly six months (183 days) is allowed
    assert llm_audit("--db", url, "purge", "--older-than", "183d").returncode == 0
    assert ids(engine) == {"last-month", "recent", "open"}


def test_force_purges_younger_exchanges_but_never_open_ones(url, engine, boundary_rows):
    proc = llm_audit("--db", url, "purge", "--older-than", "1h", "--force")
    assert proc.returncode == 0, proc
    assert proc.stdout.startswith("deleted 5 exchanges")
    assert ids(engine) == {"recent", "open"}
    [log] = log_rows(engine)
    assert (log.older_than, log.deleted_count) == ("1h", 5)


def test_more_rows_than_the_batch_size(url, engine):
    old = datetime(2023, 6, 1, tzinfo=UTC)
    add(engine, [row(f"old-{i}", old + timedelta(seconds=i)) for i in range(2345)])
    add(engine, [row("new", datetime.now(UTC))])
    proc = llm_audit("--db", url, "purge", "--older-than", "365d", "--batch-size", "100")
    assert proc.returncode == 0, proc
    assert proc.stdout.startswith("deleted 2345 exchanges")
    assert ids(engine) == {"new"}
    [log] = log_rows(engine)
    assert log.deleted_count == 2345 and log.finished_at is not None


def test_concurrent_writes_during_a_purge_are_kept(url, engine):
    """A writer inserting one row per transaction, as the proxy does, while the purge runs."""
    old = datetime(2023, 6, 1, tzinfo=UTC)
    add(engine, [row(f"old-{i}", old + timedelta(seconds=i)) for i in range(6000)])
    stop = threading.Event()
    written: list[tuple[str, datetime, float]] = []  # id, when, how long the insert took
    errors: list[BaseException] = []

    def writer() -> None:
        n = 0
        while not stop.is_set():
            started = time.monotonic()
            try:
                add(engine, [row(f"live-{n}", datetime.now(UTC))])
            except BaseException as e:  # noqa: BLE001 - reported by the assertion below
                errors.append(e)
                return
            written.append((f"live-{n}", datetime.now(UTC), time.monotonic() - started))
            n += 1
            time.sleep(0.002)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        proc = llm_audit("--db", url, "purge", "--older-than", "365d", "--batch-size", "50")
    finally:
        stop.set()
        thread.join(30)
    assert proc.returncode == 0, proc
    assert errors == []
    assert proc.stdout.startswith("deleted 6000 exchanges")
    assert ids(engine) == {id for id, _, _ in written}
    [log] = log_rows(engine)
    during = [id for id, at, _ in written if utc(log.purged_at) < at < utc(log.finished_at)]
    assert len(during) >= 5, (len(during), len(written))  # the two really ran at the same time
    assert max(took for _, _, took in written) < 2.0  # the writer was never locked out for long


def test_database_from_the_environment_and_db_wins(tmp_path):
    env_db, flag_db = tmp_path / "env.db", tmp_path / "flag.db"
    for path in (env_db, flag_db):
        engine = open_engine(f"sqlite:///{path}")
        add(engine, [row("old", datetime(2022, 1, 1, tzinfo=UTC))])
        engine.dispose()
    env = {"LLM_AUDIT_DB": f"sqlite:///{env_db}"}
    assert llm_audit("purge", "--older-than", "365d", env=env).stdout.startswith("deleted 1 ")
    flag = llm_audit("purge", "--older-than", "365d", "--db", f"sqlite:///{flag_db}", env=env)
    assert flag.stdout.startswith("deleted 1 ")
    assert llm_audit("purge", "--older-than", "365d", env=env).stdout.startswith("deleted 0 ")


def test_default_database_is_the_proxys(tmp_path):
    env = {"XDG_DATA_HOME": str(tmp_path)}
    missing = llm_audit("purge", "--older-than", "365d", env=env)  # no proxy has recorded yet
    assert missing.returncode == 2 and "there is no audit database at" in missing.stderr
    (tmp_path / "llm-audit").mkdir()
    open_engine(f"sqlite:///{tmp_path}/llm-audit/audit.db").dispose()  # as the proxy makes it
    no_key = llm_audit("purge", "--older-than", "365d", env=env)
    assert_one_line_error(no_key, f"there is no signing key at {tmp_path}/llm-audit/signing-key.pem", "--key FILE")
    load_or_create_key(tmp_path / "llm-audit" / "signing-key.pem")  # as the proxy makes it
    proc = llm_audit("purge", "--older-than", "365d", env=env)
    assert proc.returncode == 0, proc
    assert f"from sqlite:///{tmp_path}/llm-audit/audit.db " in proc.stdout


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["purge", "--older-than", "2025-13-45"], ["--older-than '2025-13-45' is not a valid date"]),
        (["purge", "--older-than", "6m"], ["months and years vary in length"]),
        (["purge", "--older-than", "2025-01-31T12:00"], ["needs a UTC offset"]),
        (["purge", "--older-than", "last year"], ["use an age (Nh, Nd, Nw"]),
        (["purge", "--older-than", "365d", "--batch-size", "0"], ["'0' is not a positive whole number"]),
        (["purge"], ["--older-than"]),
        (["frobnicate"], ["invalid choice"]),
        (["--db", "nosuchdb://x", "purge", "--older-than", "365d"], ["cannot use 'nosuchdb://x'", "--db URL"]),
        (
            ["--db", "postgresql+psycopg://nobody@127.0.0.1:1/audit", "purge", "--older-than", "365d"],
            ["cannot open the audit database", "--db URL or LLM_AUDIT_DB"],
        ),
    ],
)
def test_errors_are_one_line_with_status_2(args, fragments, tmp_path):
    proc = llm_audit(*args, env={"XDG_DATA_HOME": str(tmp_path)})
    assert_one_line_error(proc, *fragments)


def test_an_unresponsive_server_fails_fast():
    """A PostgreSQL address that accepts connections but never answers: the connect timeout ends it."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        started = time.monotonic()
        proc = llm_audit(
            "--db", f"postgresql+psycopg://nobody@127.0.0.1:{port}/audit", "purge", "--older-than", "365d", timeout=60
        )
    assert time.monotonic() - started < 20
    assert_one_line_error(proc, "cannot open the audit database")


@pytest.mark.parametrize("args", [[], ["db"], ["db", "upgrade"], ["db", "current"], ["purge"]])
def test_help_shows_examples(args):
    proc = llm_audit(*args, "--help")
    assert (proc.returncode, proc.stderr) == (0, "")
    assert "examples:\n  llm-audit " in proc.stdout
