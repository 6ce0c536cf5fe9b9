"""The ``llm-audit`` command: looking after the audit database the proxy writes.

It reads the same database as the proxy: ``--db URL``, else ``$LLM_AUDIT_DB``, else the
default SQLite file (:func:`storage.database.default_url`). Each subcommand is one
``_cmd_*`` function taking the parsed arguments and returning the exit status; adding
one (``list``, ``show``, ``stats``, ``export``, ``verify``, ...) means a ``_cmd_*``
function and its parser in :func:`build_parser`.

Errors are one line on stderr and exit status 2, never a traceback.

argparse rather than click or typer: the standard library covers nested subcommands,
help with examples and our one-line errors, and the proxy's environment (mitmproxy's
pinned dependencies) gains no package for it.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn

from sqlalchemy.exc import SQLAlchemyError

from storage import migrations
from storage.database import (
    DatabaseError,
    default_url,
    first_line,
    open_engine,
    upgrade_schema,
)
from storage.retention import (
    MIN_RETENTION,
    RetentionError,
    check_cutoff,
    parse_cutoff,
    purge,
)

PROG = "llm-audit"
EXIT_ERROR = 2
HINT = "pass a working SQLAlchemy URL with --db URL or LLM_AUDIT_DB (e.g. sqlite:///path/audit.db)"

MAIN_EXAMPLES = f"""\
The database: --db URL, else $LLM_AUDIT_DB, else {default_url()}

examples:
  {PROG} db upgrade
  {PROG} --db postgresql+psycopg://audit@db.example/audit db current
  {PROG} purge --older-than 365d --dry-run
  {PROG} <command> --help
"""

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

PURGE_EXAMPLES = f"""\
AGE is Nh, Nd or Nw (hours, days, weeks); DATE is an ISO 8601 date (midnight UTC) or
a date and time with its UTC offset. Exchanges that ended before the cut-off are
deleted (those a crash interrupted count from their start); exchanges still in
progress never are. Rows go in batches, so the proxy keeps writing meanwhile. Every
purge is recorded in the purge_log table (who, when, cut-off, count).

A cut-off less than {MIN_RETENTION.days} days ago is refused without --force: the EU AI Act
(Article 26(6)) asks deployers to keep logs for at least six months.

examples:
  {PROG} purge --older-than 365d --dry-run     # how many would go
  {PROG} purge --older-than 365d
  {PROG} purge --older-than 2025-01-01
  {PROG} purge --older-than 2025-01-01T00:00:00+01:00
  {PROG} purge --older-than 30d --force        # below six months: only when you must
"""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (argparse prints the usage first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The parser; each leaf sets ``run`` to its ``_cmd_*`` function."""
    # --db is accepted before or after the subcommand; SUPPRESS keeps a later parser
    # from overwriting an earlier value with its default.
    common = _Parser(add_help=False)
    common.add_argument(
        "--db", metavar="URL", default=argparse.SUPPRESS,
        help="SQLAlchemy URL of the audit database (default: $LLM_AUDIT_DB, else the proxy's SQLite file)",
    )
    leaf: dict[str, Any] = {"parents": [common], "formatter_class": argparse.RawDescriptionHelpFormatter}

    parser = _Parser(
        prog=PROG, description="Look after the audit database of the llm-audit proxy.", epilog=MAIN_EXAMPLES, **leaf
    )
    commands = parser.add_subparsers(title="commands", metavar="<command>", required=True)

    db = commands.add_parser("db", help="the database schema", description="The database schema.",
                             epilog=DB_EXAMPLES, **leaf)
    db_commands = db.add_subparsers(title="db commands", metavar="<db command>", required=True)
    _add(db_commands, "upgrade", _cmd_db_upgrade, "bring the schema up to this llm-audit's version",
         DB_UPGRADE_EXAMPLES, leaf)
    _add(db_commands, "current", _cmd_db_current, "show the schema revision", DB_CURRENT_EXAMPLES, leaf)

    p = _add(commands, "purge", _cmd_purge, "delete exchanges that ended before a cut-off", PURGE_EXAMPLES, leaf)
    p.add_argument("--older-than", required=True, metavar="AGE|DATE",
                   help="the cut-off: an age (365d, 27w, 12h) or a date (2025-01-31)")
    p.add_argument("--dry-run", action="store_true", help="count what would be deleted; delete and record nothing")
    p.add_argument("--force", action="store_true",
                   help=f"allow a cut-off less than {MIN_RETENTION.days} days (six months) ago")
    p.add_argument("--batch-size", type=_positive_int, default=1000, metavar="N",
                   help="rows deleted per transaction (default: 1000); smaller batches hold the lock for less time")
    return parser


def _add(commands: argparse._SubParsersAction, name: str, run: Callable[[argparse.Namespace], int], summary: str,
         epilog: str, leaf: dict[str, Any]) -> argparse.ArgumentParser:
    """A subcommand's parser, with its help, description and examples, that runs ``run``."""
    parser = commands.add_parser(name, help=summary, description=summary[0].upper() + summary[1:] + ".",
                                 epilog=epilog, **leaf)
    parser.set_defaults(run=run)
    return parser


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive whole number")
    return n


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; the exit status is 0, or 2 after a one-line error."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (DatabaseError, RetentionError) as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted (a purge's purge_log row counts what it deleted)", file=sys.stderr)
        return 130


def _url(args: argparse.Namespace) -> str:
    return getattr(args, "db", None) or default_url()


# -- db ---------------------------------------------------------------------------------------


def _cmd_db_upgrade(args: argparse.Namespace) -> int:
    engine = open_engine(_url(args), migrate=False, hint=HINT)
    try:
        before, after = upgrade_schema(engine)
    finally:
        engine.dispose()
    name = engine.url.render_as_string()
    if before == after:
        print(f"{name}: schema already at revision {after} (the newest this llm-audit knows)")
    else:
        print(f"{name}: schema upgraded from {f'revision {before}' if before else 'no revision'} to {after}")
    return 0


def _cmd_db_current(args: argparse.Namespace) -> int:
    engine = open_engine(_url(args), migrate=False, hint=HINT)
    try:
        revision = migrations.current(engine)
    except SQLAlchemyError as e:
        raise DatabaseError(f"cannot read the schema revision: {first_line(e)}") from None
    finally:
        engine.dispose()
    head = migrations.head()
    if revision is None:
        print(f"none (no schema yet; '{PROG} db upgrade' creates revision {head})")
    elif revision == head:
        print(f"{revision} (head)")
    elif migrations.known(revision):
        print(f"{revision} (behind {head}: run '{PROG} db upgrade')")
    else:
        print(f"{revision} (unknown: created by a newer llm-audit; upgrade llm-audit)")
    return 0


# -- purge ------------------------------------------------------------------------------------


def _cmd_purge(args: argparse.Namespace) -> int:
    now = datetime.now(UTC)
    try:
        cutoff = parse_cutoff(args.older_than, now)
    except RetentionError as e:
        raise RetentionError(f"--older-than {e}") from None
    try:
        check_cutoff(cutoff, now, force=args.force)
    except RetentionError as e:
        raise RetentionError(f"{e}; give an older cut-off, or --force to purge anyway") from None
    engine = open_engine(_url(args), hint=HINT)
    try:
        result = purge(engine, cutoff, dry_run=args.dry_run, actor=_actor(), older_than=args.older_than,
                       batch_size=args.batch_size)
    finally:
        engine.dispose()
    what = f"exchanges that ended before {result.cutoff.isoformat()} from {engine.url.render_as_string()}"
    if result.dry_run:
        print(f"would delete {result.count} {what} (dry run: nothing deleted, nothing recorded)")
    else:
        print(f"deleted {result.count} {what} (purge_log id {result.log_id})")
    return 0


def _actor() -> str:
    """Who runs the purge, for purge_log: the OS user name."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (e.g. in a container)
        return f"uid {os.getuid()}"
