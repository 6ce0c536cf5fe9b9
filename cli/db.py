"""``db upgrade``, ``db current`` and ``db roles``: the schema and, on PostgreSQL, the
least-privilege roles."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sqlalchemy import Engine, inspect
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from cli.common import PROG, Commands, engine, url
from cli.terminal import one_line
from storage import migrations
from storage.database import DatabaseError, first_line, shown_url, upgrade_schema
from storage.roles import DEFAULT_PROXY_ROLE, DEFAULT_PURGE_ROLE, roles_sql
from storage.schema import metadata

DB_EXAMPLES = f"""\
examples:
  {PROG} db upgrade
  {PROG} db current
"""

DB_UPGRADE_EXAMPLES = f"""\
The proxy upgrades the schema at start too; this does it ahead of time and says what it did.

examples:
  {PROG} db upgrade
  LLM_AUDIT_DB=postgresql+psycopg://audit@db.example/audit {PROG} db upgrade
"""

DB_CURRENT_EXAMPLES = f"""\
examples:
  {PROG} db current
  {PROG} --db sqlite:///audit.db db current
"""

ROLES_EXAMPLES = f"""\
PostgreSQL only. Prints the SQL that creates a role for the proxies (insert and
complete their own records; never change a final one, never delete) and one for
purging and erasing; --apply runs it (connect as the tables' owner). Then make log-in
roles members, e.g. CREATE ROLE proxy1 LOGIN PASSWORD '...' IN ROLE {DEFAULT_PROXY_ROLE};

examples:
  {PROG} --db postgresql+psycopg://owner@db/audit db roles
  {PROG} --db postgresql+psycopg://owner@db/audit db roles --apply
"""


def add_commands(commands: Commands) -> None:
    """Register ``db`` and its subcommands."""
    db = commands.group("db", "the database schema", DB_EXAMPLES, "db commands")
    p = db.add("upgrade", _cmd_upgrade, "bring the schema up to this llm-audit's version", DB_UPGRADE_EXAMPLES)
    p.add_argument("--force", action="store_true", help="add the audit tables to a database that holds others")
    db.add("current", _cmd_current, "show the schema revision", DB_CURRENT_EXAMPLES)
    p = db.add("roles", _cmd_roles, "least-privilege roles on PostgreSQL", ROLES_EXAMPLES)
    p.add_argument("--proxy-role", default=DEFAULT_PROXY_ROLE, metavar="NAME")
    p.add_argument("--purge-role", default=DEFAULT_PURGE_ROLE, metavar="NAME")
    p.add_argument("--apply", action="store_true", help="run the SQL on --db instead of printing it")


def _cmd_upgrade(args: argparse.Namespace) -> int:
    with engine(args, migrate=False) as db:
        _refuse_foreign(db, args.force)
        before, after = upgrade_schema(db)
    name = shown_url(db.url)
    if before == after:
        print(f"{name}: schema already at revision {after} (the newest this llm-audit knows)")
    else:
        print(f"{name}: schema upgraded from {f'revision {before}' if before else 'no revision'} to {after}")
    return 0


def _refuse_foreign(db: Engine, force: bool) -> None:
    """A database that holds tables but no schema revision is not an audit database: the
    audit tables would be added among another application's (a mistyped path)."""
    try:
        tables = inspect(db).get_table_names() if migrations.current(db) is None else []
    except SQLAlchemyError as e:
        raise DatabaseError(f"cannot read the schema revision: {first_line(e)}") from None
    # (an audit database from before the migrations holds ours without a revision: upgraded)
    if tables and not set(tables) & set(metadata.tables) and not force:
        raise DatabaseError(
            f"{shown_url(db.url)} holds tables that are not llm-audit's ({', '.join(sorted(tables)[:5])}); "
            "point --db at the audit database, or give --force to add the audit tables to it"
        )


def _cmd_current(args: argparse.Namespace) -> int:
    given = make_url(url(args))
    if given.get_backend_name() == "sqlite" and given.database not in (None, "", ":memory:"):
        path = Path(given.database).expanduser()
        if not path.is_file() or path.stat().st_size == 0:  # (none yet: said, and none made for a look)
            print(_revision_line(None, migrations.head()))
            return 0
    with engine(args, migrate=False, create=False) as db:
        try:
            revision = migrations.current(db)
        except SQLAlchemyError as e:
            raise DatabaseError(f"cannot read the schema revision: {first_line(e)}") from None
    print(one_line(_revision_line(revision, migrations.head())))  # (the revision is the database's)
    return 0


def _revision_line(revision: str | None, head: str) -> str:
    """What ``db current`` says of ``revision``: none yet, the head, behind it, or newer."""
    if revision is None:
        return f"none (no schema yet; '{PROG} db upgrade' creates revision {head})"
    if revision == head:
        return f"{revision} (head)"
    if migrations.known(revision):
        return f"{revision} (behind {head}: run '{PROG} db upgrade')"
    return f"{revision} (unknown: created by a newer llm-audit; upgrade llm-audit)"


def _cmd_roles(args: argparse.Namespace) -> int:
    sql = roles_sql(args.proxy_role, args.purge_role)
    if not args.apply:
        sys.stdout.write(sql)
        return 0
    if make_url(url(args)).get_backend_name() != "postgresql":  # (before opening: nothing made for a mistake)
        raise DatabaseError("roles are a PostgreSQL feature; SQLite has no users (protect the file instead)")
    with engine(args) as db:
        try:
            with db.begin() as conn:
                conn.exec_driver_sql(sql)
        except SQLAlchemyError as e:
            raise DatabaseError(f"cannot create the roles: {first_line(e)}") from None
    print(f"roles {args.proxy_role} and {args.purge_role} ready; make log-in roles members of them")
    return 0
