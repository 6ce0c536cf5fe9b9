"""Opening the audit database: the default location, engines, and clear errors.

The proxy and the ``llm-audit`` command share :func:`default_url` and
:func:`open_engine`, so both read the same database unless told otherwise, and both
bring its schema up to date (``storage/migrations``) before using it.
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import orjson
from sqlalchemy import Engine, Table, create_engine, event, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from storage import migrations
from storage.files import private_file, warn_if_readable

log = logging.getLogger(__name__)

ENV_VAR = "LLM_AUDIT_DB"
PROXY_HINT = "set a working SQLAlchemy URL with --set llm_audit_db=URL (e.g. sqlite:///path/audit.db)"
CONNECT_TIMEOUT = 5  # seconds to reach a PostgreSQL server before giving up


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


#: Query parameters of a database URL that hold a secret (libpq takes ``password=`` and
#: ``sslpassword=`` there as well as in the user part).
_SECRET_PARAM = re.compile(r"pass|pwd|secret|token|key", re.IGNORECASE)
#: The same, in a URL that does not parse.
_SECRET_QUERY = re.compile(r"((?:pass|pwd|secret|token|key)[^=&]*=)[^&]*", re.IGNORECASE)
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")


def shown_url(url: URL | str) -> str:
    """A database URL as it may be printed, logged or written to a file: every password
    hidden, in the user part and in the query. SQLAlchemy's own rendering hides only the
    first; ``?password=`` was printed by every error, ``db upgrade``, ``purge``, ``serve``
    and the status file. A URL given as text is shown as written (parsed, a password
    holding "@" or "?" lends its tail to the host)."""
    if isinstance(url, URL):
        query = {k: "***" if _SECRET_PARAM.search(k) else v for k, v in url.query.items()}
        return url.set(query=query).render_as_string(hide_password=True).replace("=%2A%2A%2A", "=***")
    return _hide_user_part(_SECRET_QUERY.sub(r"\1***", url))


def _hide_user_part(text: str) -> str:
    """``text`` with what lies between the user part's first ":" and its last "@" hidden,
    with or without a scheme: a password holding "@", "?", "/" or spaces is hidden whole. A
    path after the scheme (``sqlite:///…``) has no user part."""
    scheme = _SCHEME.match(text)
    start = scheme.end() if scheme else 0
    rest = text[start:]
    if rest.startswith("/"):
        return text
    at = rest.split("/", 1)[0].rfind("@")  # (the last "@" before the path, else one after it: a password holding "/")
    at = rest.rfind("@") if at < 0 else at
    colon = rest.find(":", 0, at) if at >= 0 else -1
    if colon < 0:
        return text
    return text[:start] + rest[: colon + 1] + "***" + rest[at:]


def parse_url(url: str, hint: str) -> URL:
    """``url`` parsed, or a one-line :class:`DatabaseError` that names no part of a password.

    A password holding "@", "?" or "#" unencoded makes the URL ambiguous: it parses with
    its tail taken for the host (which the driver then names in its error), so it is
    refused with the fix; the port parser's own error quotes the text after the colon.
    """
    scheme = _SCHEME.match(url)
    authority = url[scheme.end() if scheme else 0 :].split("/", 1)[0]
    if authority.count("@") > 1 or ("@" in authority and ("?" in authority or "#" in authority)):
        raise DatabaseError(
            f"{shown_url(url)!r}: a password holding @, ? or # must be written %40, %3F or %23 in a URL; {hint}"
        )
    try:
        return make_url(url)
    except (ArgumentError, ValueError) as e:  # (ValueError: a port that is no number)
        why = "its port is no number" if isinstance(e, ValueError) else "it does not parse"
        raise DatabaseError(f"{shown_url(url)!r} is not a database URL ({why}); {hint}") from None


def open_engine(url: str, *, migrate: bool = True, create: bool = True, hint: str = PROXY_HINT) -> Engine:
    """An engine for ``url``, its schema upgraded to this version's, or a :class:`DatabaseError`.

    Connecting here, once, turns a wrong URL or an unreachable server into one clear
    message at start-up instead of lost records later. ``migrate=False`` leaves the
    schema alone (``llm-audit db current``, and ``db upgrade``, which reports what it
    did through :func:`upgrade_schema`). ``hint`` ends the messages that a different
    URL would fix: it names the option of whoever asked (proxy or command).
    ``create=False`` (the read-only commands) refuses an SQLite file that does not exist
    or is empty instead of creating one.
    """
    parsed = parse_url(url, hint)
    connect_args: dict[str, object] = {}
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        path = Path(parsed.database).expanduser()
        parsed = parsed.set(database=str(path))
        if create:
            _create_private(path, hint)
        elif not path.is_file() or path.stat().st_size == 0:
            raise DatabaseError(f"there is no audit database at {path}; {hint}")
    if parsed.get_backend_name() == "postgresql" and "connect_timeout" not in parsed.query:
        # libpq waits for an unreachable host for as long as TCP does (minutes)
        connect_args["connect_timeout"] = CONNECT_TIMEOUT
    try:
        engine = create_engine(
            parsed,
            json_serializer=_json_dumps,
            json_deserializer=orjson.loads,
            pool_pre_ping=True,
            connect_args=connect_args,
        )
    except (ArgumentError, ImportError, SQLAlchemyError) as e:
        raise DatabaseError(f"cannot use {shown_url(parsed)!r}: {first_line(e)}; {hint}") from None
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except SQLAlchemyError as e:
        engine.dispose()
        fix = _fix(parsed, e) or hint
        raise DatabaseError(f"cannot open the audit database {shown_url(parsed)!r}: {first_line(e)}; {fix}") from None
    if migrate:
        try:
            before, after = upgrade_schema(engine)
        except DatabaseError:
            engine.dispose()
            raise
        if before != after:
            log.info(f"llm-audit: audit database schema upgraded from {before or 'no revision'} to {after}")
    return engine


def _create_private(path: Path, hint: str) -> None:
    """Create the SQLite file owner-only (SQLite gives its WAL and SHM the same mode)."""
    try:
        if not private_file(path):
            warn_if_readable(path, f"restrict it with: chmod 600 {path}")
    except OSError as e:
        raise DatabaseError(f"cannot create the audit database {path} ({e.strerror}); {hint}") from None


def open_reader(url: str, *, hint: str = PROXY_HINT) -> Engine:
    """An engine for reading ``url``: upgraded as by :func:`open_engine` when its schema is
    behind, else left alone.

    The upgrade takes a lock even when there is nothing to do (SQLite's write lock). A
    reader of an up-to-date database skips it, so ``llm-audit list`` never queues behind
    the proxy's writer, and a PostgreSQL role that may only read can use the commands.
    """
    engine = open_engine(url, migrate=False, create=False, hint=hint)
    try:
        revision = migrations.current(engine)
        if revision is None:
            raise DatabaseError(f"{shown_url(engine.url)!r} holds no audit database (no schema); {hint}")
        behind = revision != migrations.head()
        if behind:
            upgrade_schema(engine)
    except SQLAlchemyError as e:
        engine.dispose()
        raise DatabaseError(f"cannot read the schema revision of {shown_url(engine.url)!r}: {first_line(e)}") from None
    except DatabaseError:
        engine.dispose()
        raise
    return engine


def upgrade_schema(engine: Engine) -> tuple[str | None, str]:
    """Upgrade the schema to this version's head; (revision before, after), or a :class:`DatabaseError`."""
    name = shown_url(engine.url)
    try:
        return migrations.upgrade(engine)
    except migrations.SchemaError as e:
        raise DatabaseError(f"the audit database {name!r} cannot be used: {e}") from None
    except SQLAlchemyError as e:
        raise DatabaseError(f"cannot upgrade the schema of the audit database {name!r}: {first_line(e)}") from None


def _fix(url: URL, error: SQLAlchemyError) -> str | None:
    """What fixes an SQLite file that exists but cannot be opened, when another URL would
    not: its permissions, or a damaged file (None: another URL might)."""
    if url.get_backend_name() != "sqlite" or not url.database or not Path(url.database).exists():
        return None
    path = Path(url.database)
    if not os.access(path, os.R_OK | os.W_OK) or not os.access(path.parent, os.W_OK):
        info = path.stat()
        return (
            f"{path} (mode {info.st_mode & 0o777:o}, owner uid {info.st_uid}) or its folder is not yours to use: "
            "run as the proxy's user, or fix the permissions"
        )
    if "not a database" in str(error) or "malformed" in str(error):
        return f"{path} is damaged or is no SQLite database: restore it from a backup, or try sqlite3 {path} .recover"
    return None


def _lenient_text(value: bytes) -> str:
    """An SQLite TEXT value as text, what is not UTF-8 in it as U+FFFD."""
    return value.decode("utf-8", "replace")


#: SQLite's own ``lower`` folds ASCII letters only: what ``--contains`` folds with there
#: when the text looks for others (``storage.query.unicode_lower``).
UNICODE_LOWER = "llm_audit_lower"


def _unicode_lower(value: str | bytes | int | float | None) -> str | bytes | int | float | None:
    return value.lower() if isinstance(value, str) else value


def sqlite_reading(dbapi_conn: sqlite3.Connection) -> None:
    """What every SQLite connection that reads records needs, the proxy's, the CLI's and
    the review server's: text that is not UTF-8 read with U+FFFD (SQLite keeps whatever
    bytes a writer puts in a TEXT column: one such value made every query fail), and
    :data:`UNICODE_LOWER`."""
    dbapi_conn.text_factory = _lenient_text
    dbapi_conn.create_function(UNICODE_LOWER, 1, _unicode_lower, deterministic=True)


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    """WAL lets readers (the CLI, plain SQL) work while the proxy writes; freed pages are zeroed.

    The busy timeout comes first so that later statements wait for other connections.
    Switching to WAL is not covered by it (SQLite answers "database is locked" at once
    while another connection holds a lock, e.g. two proxies opening a new file together),
    so it is retried briefly, and skipped when the file is already in WAL mode.
    """
    sqlite_reading(dbapi_conn)  # (a value that is not UTF-8: shown, and, no longer its hash, named by verify)
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout=10000")
    for attempt in range(100):
        try:
            if cur.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                cur.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError:
            if attempt == 99:
                raise
            time.sleep(0.05)
    cur.execute("PRAGMA synchronous=NORMAL")
    # Pages an erasure or a purge frees are overwritten with zeros, not left in the file's
    # free list with the prompts on them (the default of many SQLite builds is off).
    cur.execute("PRAGMA secure_delete=ON")
    cur.close()


def first_line(error: BaseException) -> str:
    """The first line of a database error's message: enough for a one-line report."""
    detail = getattr(error, "orig", None) or error
    return str(detail).strip().splitlines()[0] if str(detail).strip() else type(detail).__name__


def insert_for(engine: Engine) -> Callable[[Table], sqlite.Insert | postgresql.Insert]:
    """The backend's own INSERT, which has ``ON CONFLICT`` (SQLite and PostgreSQL spell it
    alike; SQLAlchemy's generic INSERT has none); one line naming the fix for another backend."""
    if engine.dialect.name == "sqlite":
        return sqlite.insert
    if engine.dialect.name == "postgresql":
        return postgresql.insert
    raise DatabaseError(f"unsupported database backend {engine.dialect.name!r}: use SQLite or PostgreSQL")
