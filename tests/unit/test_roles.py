"""Least privilege on a real PostgreSQL server (``llm-audit db roles``).

The SQL is applied with the command, log-in roles are made members of the two group
roles, and each side is tried for real: the proxy role writes and completes records
through the ``AuditWriter`` but can neither change a final record nor delete one; the
purge role purges and erases; the chains still verify.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import delete, select, update
from sqlalchemy.exc import SQLAlchemyError

from addon.record import OUTCOME_COMPLETE, ExchangeRecord
from storage.database import DatabaseError, open_engine
from storage.erase import erase_user
from storage.retention import purge
from storage.schema import exchanges
from storage.spool import Spool
from storage.verify import verify
from storage.writer import AuditWriter

BIN = Path(sys.executable).parent


@pytest.fixture
def database(postgres) -> str:
    url = postgres.create_database()
    open_engine(url).dispose()  # the owner creates the schema
    return url


def as_user(url: str, user: str) -> str:
    return url.replace("://postgres@", f"://{user}@")


def login_role(postgres, database_url: str, group: str) -> str:
    name = f"u_{uuid.uuid4().hex[:10]}"
    with postgres.connect(database_url.rsplit("/", 1)[1]) as conn:
        conn.execute(f"CREATE ROLE {name} LOGIN IN ROLE {group}")
        conn.commit()
    return name


def finished(i: int, ended: datetime | None = None) -> ExchangeRecord:
    r = ExchangeRecord(
        dialect="llm-stream",
        proxy_instance="px",
        started_at=time.time(),
        user_id="alice",
        request_body={"messages": [{"role": "user", "content": f"q{i}"}]},
    )
    r.terminal_seen = True
    r.finish(OUTCOME_COMPLETE, ended_at=ended.timestamp() if ended else None)
    if ended:
        r.started_at = ended.timestamp()
    return r


def test_the_proxy_role_writes_but_cannot_change_or_delete_and_the_purge_role_can(postgres, database, tmp_path):
    applied = subprocess.run(
        [str(BIN / "llm-audit"), "--db", database, "db", "roles", "--apply"], capture_output=True, text=True, timeout=60
    )
    assert applied.returncode == 0, applied.stderr
    proxy_url = as_user(database, login_role(postgres, database, "llm_audit_proxy"))
    purge_url = as_user(database, login_role(postgres, database, "llm_audit_purge"))

    engine = open_engine(proxy_url)
    writer = AuditWriter(engine, Spool(tmp_path / "spool.jsonl"), "px")
    old = datetime.now(UTC) - timedelta(days=400)
    for i in range(3):  # the chain's first records, old enough to purge
        writer.submit(finished(i, ended=old).to_row())
    r = ExchangeRecord(dialect="llm-stream", proxy_instance="px", started_at=time.time(), user_id="bob")
    writer.submit(r.to_row())  # the write-ahead open record
    r.terminal_seen = True
    r.finish(OUTCOME_COMPLETE)
    writer.submit(r.to_row())  # completes it in place
    writer.close()
    assert writer.spool.records == 0

    engine = open_engine(proxy_url)
    with engine.connect() as conn:
        assert conn.execute(select(exchanges.c.status).where(exchanges.c.id == r.id)).scalar() == "completed"
    with pytest.raises(SQLAlchemyError, match="final audit records cannot be changed"):
        with engine.begin() as conn:
            conn.execute(update(exchanges).where(exchanges.c.id == r.id).values(output_text="rewritten"))
    with pytest.raises(SQLAlchemyError, match="permission denied"):
        with engine.begin() as conn:
            conn.execute(delete(exchanges))
    with pytest.raises(DatabaseError):
        purge(engine, datetime.now(UTC) - timedelta(days=200), dry_run=False, actor="proxy", older_than="200d")
    engine.dispose()

    engine = open_engine(purge_url)
    assert (
        purge(engine, datetime.now(UTC) - timedelta(days=200), dry_run=False, actor="purger", older_than="200d").count
        == 3
    )
    assert erase_user(engine, "bob", actor="purger").count == 1  # a final record: the trigger lets this role change it
    report = verify(engine)
    assert report.ok and report.chains[0].start == 4 and report.chains[0].erased == 1
    engine.dispose()


def test_roles_are_refused_on_sqlite_and_bad_names_in_one_line(tmp_path):
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    for args, fragment in (
        (["db", "roles", "--apply"], "PostgreSQL feature"),
        (["db", "roles", "--proxy-role", "Robert'); DROP"], "role name"),
    ):
        out = subprocess.run([str(BIN / "llm-audit"), "--db", url, *args], capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and fragment in out.stderr and len(out.stderr.splitlines()) == 1, out
