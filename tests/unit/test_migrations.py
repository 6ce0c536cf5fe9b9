"""Schema migrations (storage/migrations) on real SQLite files and a real PostgreSQL server.

The chain is run from an empty database and from the first released schema (0001); a
database made by ``metadata.create_all`` before migrations existed is adopted; a newer
one is refused; concurrent upgrades are serialised. After every upgrade the database
must equal ``storage.schema.metadata`` exactly, as Alembic's autogenerate sees it.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import (
    Column,
    Engine,
    Index,
    MetaData,
    Table,
    create_engine,
    insert,
    inspect,
    select,
    text,
)

from storage import migrations
from storage.database import DatabaseError, open_engine
from storage.schema import exchange_view, exchanges, metadata, purge_log
from storage.verify import verify

BIN = Path(sys.executable).parent
ADDED_SINCE_0001 = {
    "bytes_from_upstream",
    "delivered_text",  # by 0002
    "chain_id",
    "chain_seq",
    "prev_hash",
    "record_hash",
    "content_hashes",
    "erased_at",  # by 0004
    "open_mac",  # by 0006
    "client_status",  # by 0007
    "connection_id",
    "turn",  # by 0008
    "usage_details",  # by 0009
    "cost_usd",
    "cost_prices",  # by 0010
    "output_text_utf8",  # by 0012
}
INDEXED_IN_0001 = ("started_at", "ended_at", "user_id", "request_model", "status")  # one column each


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request, tmp_path) -> str:
    """The URL of a fresh, empty database of each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'audit.db'}"
    return request.getfixturevalue("postgres").create_database()


def schema_differences(engine: Engine) -> list:
    with engine.connect() as conn:
        return compare_metadata(MigrationContext.configure(conn), metadata)


def exchanges_before_migrations() -> Table:
    """The ``exchanges`` table, with its indexes, as ``metadata.create_all`` made it before migrations."""
    old = Table("exchanges", MetaData(), *(c._copy() for c in exchanges.columns if c.name not in ADDED_SINCE_0001))
    for column in INDEXED_IN_0001:
        Index(f"ix_exchanges_{column}", old.c[column])
    return old


def bare_engine(url: str) -> Engine:
    """An engine that leaves the schema alone, to build old states by hand; it writes JSON
    as every version's writer did (orjson's text: ``verify`` holds SQLite's stored JSON
    to it)."""
    return create_engine(url, json_serializer=lambda value: orjson.dumps(value).decode())


def exchange(id: str, **values) -> dict:
    return {
        "id": id,
        "status": "completed",
        "dialect": "llm-stream",
        "streamed": True,
        "started_at": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        "ended_at": datetime(2026, 1, 2, 3, 4, 6, tzinfo=UTC),
        "request_body": {"messages": [{"role": "user", "content": "hi"}]},
        "findings": [],
    } | values


def test_empty_database_is_upgraded_to_head_and_equals_the_schema(empty_url):
    engine = open_engine(empty_url)
    try:
        assert migrations.current(engine) == migrations.head()
        assert schema_differences(engine) == []
        assert {"exchanges", "purge_log", "alembic_version"} <= set(inspect(engine).get_table_names())
        open_engine(empty_url).dispose()  # a second start finds nothing to do
        assert migrations.current(engine) == migrations.head()
        assert schema_differences(engine) == []
    finally:
        engine.dispose()


def test_database_at_the_first_released_schema_keeps_its_rows(empty_url):
    # The upgrade runs every later revision over a database holding rows: the rows keep
    # their values and the columns added since are NULL.
    engine = bare_engine(empty_url)
    with engine.begin() as conn:
        command.upgrade(migrations.config(conn), "0001")
        conn.execute(insert(exchanges), [exchange("a"), exchange("b", ended_at=None, status="in_progress")])
    engine.dispose()

    engine = open_engine(empty_url)
    try:
        assert migrations.current(engine) == migrations.head()
        assert schema_differences(engine) == []
        with engine.connect() as conn:
            rows = {r.id: r for r in conn.execute(select(exchanges))}
        assert set(rows) == {"a", "b"}
        assert rows["a"].request_body == {"messages": [{"role": "user", "content": "hi"}]}
        assert rows["a"].ended_at.replace(tzinfo=UTC) == datetime(2026, 1, 2, 3, 4, 6, tzinfo=UTC)
        assert rows["a"].delivered_text is None and rows["a"].bytes_from_upstream is None
        # 0004 sealed the final record into its writer's chain; the open one waits for its end
        assert (rows["a"].chain_id, rows["a"].chain_seq, rows["b"].chain_id) == ("unknown", 1, None)  # no instance
        assert verify(engine).ok
        assert rows["b"].status == "in_progress"
    finally:
        engine.dispose()


def test_exchange_view_has_the_same_columns_on_both_backends(empty_url):
    engine = open_engine(empty_url)
    try:
        assert inspect(engine).get_view_names() == ["exchange_view"]
        assert [c["name"] for c in inspect(engine).get_columns("exchange_view")] == [
            c.name for c in exchange_view.columns
        ]
    finally:
        engine.dispose()


def test_downgrade_to_0002_drops_the_view_and_restores_the_indexes(empty_url):
    open_engine(empty_url).dispose()
    engine = bare_engine(empty_url)
    try:
        with engine.begin() as conn:
            command.downgrade(migrations.config(conn), "0002")
        assert inspect(engine).get_view_names() == []
        assert {i["name"] for i in inspect(engine).get_indexes("exchanges")} == {
            f"ix_exchanges_{column}" for column in INDEXED_IN_0001
        }
    finally:
        engine.dispose()
    engine = open_engine(empty_url)  # and up again
    assert schema_differences(engine) == [] and inspect(engine).get_view_names() == ["exchange_view"]
    engine.dispose()


def test_the_view_made_again_keeps_its_owner_and_grants_on_postgresql(postgres):
    """Migrations that make exchange_view again (0007 to 0010 on the way up, 0004 to 0010
    on the way down) give back its owner and every grant on it: an analyst's SELECT, one
    given with grant option, PUBLIC's, a grant on some of its columns; the owner's own
    privileges are the owner's anyway."""
    url = postgres.create_database()
    analyst, lead, clerk, owner = (f"r_{uuid.uuid4().hex[:10]}" for _ in range(4))
    engine = bare_engine(url)
    try:
        with engine.begin() as conn:
            command.upgrade(migrations.config(conn), "0006")
            conn.execute(text(f"CREATE ROLE {analyst}; CREATE ROLE {lead}; CREATE ROLE {clerk}; CREATE ROLE {owner}"))
            conn.execute(text(f"GRANT SELECT ON exchange_view TO {analyst}"))
            conn.execute(text(f"GRANT SELECT, REFERENCES ON exchange_view TO {lead} WITH GRANT OPTION"))
            conn.execute(text("GRANT SELECT ON exchange_view TO PUBLIC"))
            conn.execute(text(f"GRANT SELECT (id, status) ON exchange_view TO {clerk}"))
            conn.execute(text(f"ALTER VIEW exchange_view OWNER TO {owner}"))
        expected = grants_on_the_view(engine)
        assert len(expected[1]) == 4 and len(expected[2]) == 2 and expected[0] == owner
        for target in ("head", "0005"):  # up through the view's rebuilds, then down through them
            with engine.begin() as conn:
                (command.upgrade if target == "head" else command.downgrade)(migrations.config(conn), target)
            assert grants_on_the_view(engine) == expected, target
    finally:
        with engine.begin() as conn:
            conn.execute(text("DROP VIEW IF EXISTS exchange_view"))
            for role in (analyst, lead, clerk, owner):
                conn.execute(text(f"DROP ROLE IF EXISTS {role}"))
        engine.dispose()


def grants_on_the_view(engine: Engine) -> tuple[str, set[tuple], set[tuple]]:
    """The view's owner, the grants on it and those on its columns (not the owner's)."""
    with engine.connect() as conn:
        owner = conn.execute(text("SELECT pg_get_userbyid(relowner) FROM pg_class WHERE relname = 'exchange_view'"))
        owner_name = owner.scalar_one()
        where = "table_name = 'exchange_view' AND grantee <> :owner"
        on_view = conn.execute(
            text(
                f"SELECT grantee, privilege_type, is_grantable FROM information_schema.table_privileges WHERE {where}"
            ),
            {"owner": owner_name},
        )
        on_columns = conn.execute(
            text(
                "SELECT grantee, column_name, privilege_type FROM information_schema.column_privileges "
                f"WHERE {where} AND grantee NOT IN (SELECT grantee FROM information_schema.table_privileges "
                f"WHERE {where})"
            ),
            {"owner": owner_name},
        )
        return owner_name, set(on_view), set(on_columns)


def test_database_created_before_migrations_is_adopted_and_stamped(empty_url):
    # What open_engine's metadata.create_all made before migrations existed: exchanges
    # with its indexes, no purge_log, no alembic_version.
    engine = bare_engine(empty_url)
    old = exchanges_before_migrations()
    old.create(engine)
    with engine.begin() as conn:
        conn.execute(insert(old), [exchange("old")])
    engine.dispose()

    engine = open_engine(empty_url)
    try:
        assert migrations.current(engine) == migrations.head()
        assert schema_differences(engine) == []
        with engine.connect() as conn:
            assert [r.id for r in conn.execute(select(exchanges.c.id))] == ["old"]
            assert conn.execute(select(purge_log)).all() == []
    finally:
        engine.dispose()


def test_database_created_before_migrations_with_other_columns_is_refused_and_left_alone(tmp_path):
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    engine = bare_engine(url)
    old = Table(
        "exchanges",
        MetaData(),
        *(
            Column(c.name, c.type)
            for c in exchanges.columns
            if c.name not in {"task_id", "replayed_events", *ADDED_SINCE_0001}
        ),
    )
    old.create(engine)
    engine.dispose()

    with pytest.raises(DatabaseError) as e:
        open_engine(url)
    message = str(e.value)
    assert "\n" not in message
    assert "development version of llm-audit" in message and "missing replayed_events, missing task_id" in message
    # the upgrade is one transaction: nothing of it stays behind
    assert set(inspect(bare_engine(url)).get_table_names()) == {"exchanges"}


def test_database_of_a_newer_llm_audit_is_refused(empty_url):
    open_engine(empty_url).dispose()
    engine = bare_engine(empty_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999_from_the_future'"))
    engine.dispose()

    with pytest.raises(DatabaseError) as e:
        open_engine(empty_url)
    message = str(e.value)
    assert "\n" not in message
    assert "'9999_from_the_future'" in message
    assert "created by a newer llm-audit; upgrade llm-audit" in message


def test_concurrent_upgrades_all_succeed(empty_url):
    """Proxies starting together against one empty database: one creates, the others wait and find it done."""
    n = 6
    barrier = threading.Barrier(n)
    results: list[str] = []
    errors: list[BaseException] = []

    def start() -> None:
        barrier.wait()
        try:
            engine = open_engine(empty_url)
            results.append(migrations.current(engine))
            engine.dispose()
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=start) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert results == [migrations.head()] * n
    engine = bare_engine(empty_url)
    assert schema_differences(engine) == []
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM alembic_version")).scalar_one() == 1
    engine.dispose()


def test_postgresql_lock_serialises_upgrades(postgres):
    """While one upgrade holds the advisory lock, another waits instead of racing it."""
    url = postgres.create_database()
    holder = open_engine(url, migrate=False)
    waiter_done = threading.Event()
    with holder.connect() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": migrations.PG_LOCK_KEY})
        waiter = threading.Thread(target=lambda: (open_engine(url).dispose(), waiter_done.set()))
        waiter.start()
        assert not waiter_done.wait(1.0), "the upgrade did not wait for the lock"
        conn.rollback()  # releases the lock
    waiter.join(30)
    assert waiter_done.is_set()
    assert migrations.current(holder) == migrations.head()
    holder.dispose()


# -- the command ------------------------------------------------------------------------------


def llm_audit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "llm-audit"), *args], check=False, capture_output=True, text=True, timeout=60)


def test_db_upgrade_and_current_report_the_revisions(empty_url):
    head = migrations.head()
    current = llm_audit("--db", empty_url, "db", "current")
    assert (current.returncode, current.stderr) == (0, "")
    assert current.stdout.startswith("none (no schema yet")

    first = llm_audit("--db", empty_url, "db", "upgrade")
    assert (first.returncode, first.stderr) == (0, "")
    assert f"schema upgraded from no revision to {head}" in first.stdout

    again = llm_audit("db", "upgrade", "--db", empty_url)  # --db after the subcommand works too
    assert (again.returncode, again.stderr) == (0, "")
    assert f"schema already at revision {head}" in again.stdout

    assert llm_audit("--db", empty_url, "db", "current").stdout == f"{head} (head)\n"


def test_db_upgrade_refuses_a_newer_database_with_one_line(tmp_path):
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    open_engine(url).dispose()
    engine = bare_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()

    current = llm_audit("--db", url, "db", "current")
    assert current.returncode == 0 and "9999 (unknown: created by a newer llm-audit" in current.stdout
    upgrade = llm_audit("--db", url, "db", "upgrade")
    assert upgrade.returncode == 2 and upgrade.stdout == ""
    assert len(upgrade.stderr.splitlines()) == 1 and "Traceback" not in upgrade.stderr
    assert "created by a newer llm-audit; upgrade llm-audit" in upgrade.stderr


def test_pre_migration_database_without_alembic_version_reads_as_unversioned(tmp_path):
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    engine = bare_engine(url)
    exchanges_before_migrations().create(engine)
    engine.dispose()
    assert llm_audit("--db", url, "db", "current").stdout.startswith("none")
    upgrade = llm_audit("--db", url, "db", "upgrade")
    assert upgrade.returncode == 0, upgrade.stderr
    assert f"schema upgraded from no revision to {migrations.head()}" in upgrade.stdout
