"""The audit database, opened so that this application cannot change it.

The application shows every prompt and answer; it must never be the thing that alters
the evidence. SQLite is opened with ``mode=ro`` (the file cannot be written through the
connection whatever the code does) and without the proxy's ``journal_mode=WAL`` pragma
(a write); PostgreSQL connections start every transaction read-only
(``default_transaction_read_only``), so even a mistaken INSERT fails on the server.

The schema is not upgraded here (that is a write): a database whose schema is behind
this version's is refused with the command that upgrades it.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import quote

import orjson
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from storage import migrations
from storage.database import CONNECT_TIMEOUT, DatabaseError, first_line, parse_url, shown_url, sqlite_reading

HINT = "pass a working SQLAlchemy URL with --db URL or LLM_AUDIT_DB (e.g. sqlite:///path/audit.db)"
BUSY_TIMEOUT_MS = 10_000  # wait for the proxy's writer rather than fail a page


def open_read_only(url: str) -> Engine:
    """An engine that can only read ``url``'s audit database, or a one-line :class:`DatabaseError`."""
    parsed = parse_url(url, HINT)
    backend = parsed.get_backend_name()
    try:
        if backend == "sqlite":
            engine = _sqlite(parsed.database or "")
        elif backend == "postgresql":
            engine = create_engine(
                parsed,
                json_deserializer=orjson.loads,
                pool_pre_ping=True,
                connect_args={
                    "connect_timeout": CONNECT_TIMEOUT,
                    # read-only transactions; no JIT (see storage.query.prepare)
                    "options": "-c default_transaction_read_only=on -c jit=off",
                },
            )
        else:
            raise DatabaseError(f"unsupported database backend {backend!r}: use SQLite or PostgreSQL")
    except (ArgumentError, ImportError) as e:
        raise DatabaseError(f"cannot use {shown_url(parsed)!r}: {first_line(e)}; {HINT}") from None
    _check_schema(engine)
    return engine


def _sqlite(database: str) -> Engine:
    if database in ("", ":memory:"):
        raise DatabaseError(f"an in-memory SQLite database holds no audit; {HINT}")
    path = Path(database).expanduser().resolve()
    if not path.is_file() or path.stat().st_size == 0:
        raise DatabaseError(f"there is no audit database at {path}; {HINT}")
    uri = f"file:{quote(str(path))}?mode=ro"

    def connect() -> sqlite3.Connection:
        return sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False)

    engine = create_engine("sqlite://", creator=connect, json_deserializer=orjson.loads)
    event.listen(engine, "connect", _sqlite_reader)
    return engine


def _sqlite_reader(dbapi_conn, _record) -> None:
    sqlite_reading(dbapi_conn)
    dbapi_conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    dbapi_conn.execute("PRAGMA query_only=ON")  # a second lock on writes, beside mode=ro


def _check_schema(engine: Engine) -> None:
    name = shown_url(engine.url)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        revision = migrations.current(engine)
    except SQLAlchemyError as e:
        engine.dispose()
        raise DatabaseError(f"cannot open the audit database {name!r}: {first_line(e)}; {HINT}") from None
    if revision is None:
        engine.dispose()
        raise DatabaseError(f"{name!r} holds no audit database (no schema); {HINT}")
    if revision != migrations.head():
        engine.dispose()
        raise DatabaseError(
            f"the schema of {name!r} is at {revision}, not this version's {migrations.head()}: "
            "run 'llm-audit db upgrade' first (serve only reads)"
        )
