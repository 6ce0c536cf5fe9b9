"""Schema migrations with Alembic, driven from code: no ``alembic.ini`` at run time.

The proxy and ``llm-audit`` call :func:`upgrade` through
:func:`storage.database.open_engine`, so a database created by an older llm-audit is
brought up to date at start. Revisions live in ``versions/`` and are numbered
``0001``, ``0002``, ...; ``0001`` is the first released schema.

Several proxies may start at once against one database, so the upgrade holds a lock
for its whole transaction: ``pg_advisory_xact_lock`` on PostgreSQL (released by the
commit or rollback, so it cannot leak into the connection pool), ``BEGIN IMMEDIATE`` on
SQLite (the database's write lock, taken before the schema is even read). Whoever gets
the lock second sees the schema already at head and does nothing.

To add a migration after changing ``storage/schema.py``: start from a database at the
current head and let Alembic write the difference (``script.py.mako`` is the template),
then read and fix what it wrote (a PostgreSQL URL also finds changed column comments,
which SQLite does not keep)::

    .venv/bin/python -c '
    from alembic import command; from storage.database import open_engine; from storage.migrations import config
    with open_engine("sqlite:////tmp/head.db").begin() as conn:
        command.revision(config(conn), "what changed", autogenerate=True, rev_id="0002")'

``tests/unit/test_migrations.py`` checks that the head equals ``storage/schema.py``.

Autogenerate knows tables and indexes, not views: a migration that changes ``exchanges``
beyond adding columns drops the view ``exchange_view`` first and creates it again at its
end (see ``0003``, which also holds the view's SQL for each backend).
"""

from __future__ import annotations

import logging
from functools import cache
from pathlib import Path

# Alembic logs every step at INFO, some on import ("setup plugin ...", "Context impl
# ..."): noise in the proxy's log, which reports an upgrade in one line of its own
# (storage.database). Hence before the imports.
logging.getLogger("alembic").setLevel(logging.WARNING)

from alembic import command  # noqa: E402
from alembic.config import Config  # noqa: E402
from alembic.runtime.migration import MigrationContext  # noqa: E402
from alembic.script import ScriptDirectory  # noqa: E402
from sqlalchemy import Connection, Engine, text  # noqa: E402

HERE = Path(__file__).resolve().parent

# Any fixed 64-bit number, the same in every llm-audit: the key of the advisory lock.
# (The bytes of "llm-audi".)
PG_LOCK_KEY = 0x6C6C6D2D61756469


class SchemaError(Exception):
    """The database's schema cannot be brought to this version's; a one-line message."""


def config(connection: Connection | None = None) -> Config:
    """The Alembic configuration, built in code; ``env.py`` migrates ``connection``."""
    cfg = Config()
    cfg.set_main_option("script_location", str(HERE).replace("%", "%%"))
    cfg.attributes["connection"] = connection
    return cfg


@cache
def _scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(config())


def head() -> str:
    """The newest revision this version of llm-audit knows."""
    revision = _scripts().get_current_head()
    assert revision is not None, "storage/migrations/versions holds no revision"
    return revision


def known(revision: str) -> bool:
    """Whether ``revision`` is one of this version's (False: a newer llm-audit wrote it)."""
    return any(script.revision == revision for script in _scripts().walk_revisions())


def current(connectable: Engine | Connection) -> str | None:
    """The database's revision; None when it has no ``alembic_version`` (empty, or pre-migration)."""
    if isinstance(connectable, Engine):
        with connectable.connect() as conn:
            return current(conn)
    return MigrationContext.configure(connectable).get_current_revision()


def upgrade(engine: Engine) -> tuple[str | None, str]:
    """Bring the database to :func:`head` under a lock; returns (revision before, after).

    Raises :class:`SchemaError` when the database is at a revision this version does
    not know (it was created by a newer llm-audit), and SQLAlchemy's errors when the
    database fails. A database made by ``metadata.create_all`` before migrations
    existed has tables but no revision: migration ``0001`` adopts its ``exchanges``
    table (after checking its columns) instead of creating it.
    """
    with engine.connect() as conn:
        _lock(conn)
        before = current(conn)
        if before is not None and not known(before):
            raise SchemaError(
                f"its schema is at revision {before!r}, which this llm-audit does not know (newest: {head()!r}): "
                "it was created by a newer llm-audit; upgrade llm-audit"
            )
        if before != head():
            command.upgrade(config(conn), "head")
        conn.commit()
    return before, head()


def _lock(conn: Connection) -> None:
    """Begin the upgrade's transaction holding the lock that serialises upgrades."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PG_LOCK_KEY})
    elif conn.dialect.name == "sqlite":
        # sqlite3's legacy transaction control would not begin a transaction before a
        # SELECT or CREATE; an explicit BEGIN IMMEDIATE takes the write lock at once (waiting
        # up to busy_timeout), and everything up to the commit is one transaction.
        conn.exec_driver_sql("BEGIN IMMEDIATE")
