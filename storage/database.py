"""Opening the audit database: the default location, engines, and clear errors.

The proxy and (later) the ``llm-audit`` command share :func:`default_url`, so both read
the same database unless told otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from storage.schema import metadata

ENV_VAR = "LLM_AUDIT_DB"


class DatabaseError(Exception):
    """A database problem a user can fix; the message is one line that names the fix."""


def default_url() -> str:
    """``$LLM_AUDIT_DB``, else an SQLite file in the XDG data directory.

    The default file is ``$XDG_DATA_HOME/llm-audit/audit.db``, i.e.
    ``~/.local/share/llm-audit/audit.db`` on most systems.
    """
    if os.environ.get(ENV_VAR):
        return os.environ[ENV_VAR]
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return f"sqlite:///{Path(data_home) / 'llm-audit' / 'audit.db'}"


def _json_dumps(value: object) -> str:
    return orjson.dumps(value).decode()


def open_engine(url: str) -> Engine:
    """An engine for ``url`` with the schema in place, or a :class:`DatabaseError`.

    Connecting here, once, turns a wrong URL or an unreachable server into one clear
    message at start-up instead of lost records later.
    """
    hint = "set a working SQLAlchemy URL with --set llm_audit_db=URL (e.g. sqlite:///path/audit.db)"
    try:
        parsed = make_url(url)
    except ArgumentError as e:
        raise DatabaseError(f"llm_audit_db {url!r} is not a database URL ({e}); {hint}") from None
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        path = Path(parsed.database).expanduser()
        parsed = parsed.set(database=str(path))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise DatabaseError(f"cannot create {path.parent} for the audit database ({e.strerror}); {hint}") from None
    try:
        engine = create_engine(parsed, json_serializer=_json_dumps, json_deserializer=orjson.loads, pool_pre_ping=True)
    except (ArgumentError, ImportError, SQLAlchemyError) as e:
        raise DatabaseError(f"cannot use {parsed.render_as_string()!r}: {_first_line(e)}; {hint}") from None
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    try:
        with engine.begin() as conn:
            conn.execute(text("SELECT 1"))
            metadata.create_all(conn)
    except SQLAlchemyError as e:
        engine.dispose()
        raise DatabaseError(
            f"cannot open the audit database {parsed.render_as_string()!r}: {_first_line(e)}; {hint}"
        ) from None
    return engine


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    """WAL lets readers (the CLI, plain SQL) work while the proxy writes."""
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.close()


def _first_line(error: BaseException) -> str:
    detail = getattr(error, "orig", None) or error
    return str(detail).strip().splitlines()[0] if str(detail).strip() else type(detail).__name__
