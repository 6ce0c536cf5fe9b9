"""The ``llm-audit`` command: querying and looking after the audit database the proxy writes.

It reads the same database as the proxy: ``--db URL``, else ``$LLM_AUDIT_DB``, else the
default SQLite file (:func:`storage.database.default_url`). Each subcommand is one
``_cmd_*`` function taking the parsed arguments and returning the exit status; adding
one (``verify``, ...) means a ``_cmd_*`` function and its parser in :func:`build_parser`.
The query commands (``list``, ``show``, ``stats``, ``export``) ask :mod:`storage.query`
and print with :mod:`storage.report`.

Errors are one line on stderr and exit status 2, never a traceback.

argparse rather than click or typer: the standard library covers nested subcommands,
help with examples and our one-line errors, and the proxy's environment (mitmproxy's
pinned dependencies) gains no package for it.
"""

from __future__ import annotations

import argparse
import getpass
import os
import socket
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

import orjson

from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError

from addon.hosts import EXTRA_HOSTS_ENV, HOSTS_EXAMPLES, HostsError, hosts_output
from storage import integrity_cli, migrations
from storage.checkpoint import CheckpointError
from storage.database import (
    DatabaseError,
    default_url,
    first_line,
    open_engine,
    open_reader,
    upgrade_schema,
)
from storage.query import (
    FIELDS,
    GROUP_KEYS,
    STATS_FIELDS,
    Filters,
    QueryError,
    count_exchanges,
    get_exchange,
    iter_exchanges,
    list_exchanges,
    prepare,
    stats,
)
from storage.report import (
    MACHINE_FORMATS,
    Progress,
    Style,
    exchange_text,
    exchanges_table,
    json_document,
    stats_table,
    terminal_width,
    write_records,
)
from storage.retention import (
    MIN_RETENTION,
    RetentionError,
    check_cutoff,
    parse_cutoff,
    purge,
)
from storage.roles import RoleError
from storage.spool import default_state_dir
from storage.status import StatusError, pid_alive, read_status, status_path, verdict

PROG = "llm-audit"
EXIT_ERROR = 2
HINT = "pass a working SQLAlchemy URL with --db URL or LLM_AUDIT_DB (e.g. sqlite:///path/audit.db)"

MAIN_EXAMPLES = f"""\
The database: --db URL, else $LLM_AUDIT_DB, else {default_url()}

examples:
  {PROG} list --since 7d --user alice
  {PROG} show 3f2a9c41d0be
  {PROG} stats --by client --since 7d
  {PROG} export --since 2026-03-01 --until 2026-04-01 > march.jsonl
  {PROG} db upgrade
  {PROG} --db postgresql+psycopg://audit@db.example/audit db current
  {PROG} purge --older-than 365d --dry-run
  {PROG} status
  {PROG} <command> --help
"""

FILTERS_HELP = """\
Filters combine; a filter given twice matches either value. --since and --until take an
age (12h, 7d, 2w: that long before now) or an ISO 8601 date (2026-03-01: midnight UTC)
or date and time with its UTC offset (2026-03-01T09:00:00+01:00); --until is exclusive.
--contains looks in the request body (as JSON text) and in the output, in any case."""

FIELDS_HELP = """\
json, jsonl and csv carry every column of the exchange_view view (see the README), with
the same names and values on SQLite and PostgreSQL: times in ISO 8601 UTC, the request
body as JSON."""

LIST_EXAMPLES = f"""\
Newest first, one page of --limit exchanges; the id column shows the first 12
characters of each id, enough for '{PROG} show'.

{FILTERS_HELP}

{FIELDS_HELP}

examples:
  {PROG} list                                     # the 50 newest exchanges
  {PROG} list --since 7d --user alice
  {PROG} list --since 2026-03-01 --until 2026-04-01 --model gpt-4o --format csv > march.csv
  {PROG} list --status failed --status upstream_aborted --limit 20
  {PROG} list --finding missing_stream_end --since 30d
  {PROG} list --blocked --format jsonl
  {PROG} search --contains "project nightjar"
  {PROG} list --limit 50 --offset 50              # the next page
"""

SHOW_EXAMPLES = f"""\
ID is an exchange id, or any start of one that no other id shares (as '{PROG} list'
shows them). The text shows the request (system instructions, messages, tools), the
output (text, reasoning, refusal per choice), tool calls with their arguments, usage,
timings, findings, filter verdicts and the outcome; --format json is the whole record:
every column of the exchanges table and the derived columns of exchange_view.

examples:
  {PROG} show 3f2a9c41d0be
  {PROG} show 3f2a9c41d0be --format json | jq .request_body.messages
"""

STATS_EXAMPLES = f"""\
KEY is model (the model asked for), provider, user, client (the client's address), day
(UTC) or status; give --by several times, or comma-separated, to group by several keys;
without --by, one row of totals. Rows come by day, then most tokens first.

Tokens are summed as the upstreams reported them; 'with usage' counts the exchanges that
reported any. errors: exchanges with status failed; blocks: exchanges a content filter
blocked; ttfc: time to first chunk in ms, nearest-rank percentiles 50 and 95.

{FILTERS_HELP}

examples:
  {PROG} stats --by client --since 7d                 # which workstation used the most tokens
  {PROG} stats --by user,day --since 2026-03-01 --until 2026-04-01
  {PROG} stats --by model --by status --format csv
"""

EXPORT_EXAMPLES = f"""\
Oldest first, streamed: rows are read and written a thousand at a time, never the whole
database. When stderr is a terminal a progress bar is drawn on it; nothing else is
written beside the rows.

{FILTERS_HELP}

{FIELDS_HELP}

examples:
  {PROG} export --since 2026-03-01 --until 2026-04-01 > march.jsonl
  {PROG} export --user alice --format csv > alice.csv
  {PROG} export --since 1d | gzip > today.jsonl.gz
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

STATUS_EXAMPLES = f"""\
Reads the status file the proxy's writer keeps beside its spool (status-INSTANCE.json,
updated about once a second while something changes); needs no database access.
Exit status: 0 records flow; 1 records are stuck (the writer thread is not running, or
records wait in the spool or in memory because the database does not take them); 3 the
proxy is not running (it stopped, or its process is gone); 2 no status file could be read.

examples:
  {PROG} status                                   # this host's proxy, default spool folder
  {PROG} status --instance proxy-a --spool-dir /var/lib/llm-audit
  {PROG} status /var/lib/llm-audit/status-proxy-a.json --format json
  (defaults: --spool-dir {default_state_dir()}, --instance {socket.gethostname()})
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
        prog=PROG, description="Query and look after the audit database of the llm-audit proxy.",
        epilog=MAIN_EXAMPLES, **leaf,
    )
    commands = parser.add_subparsers(title="commands", metavar="<command>", required=True)
    queries = {**leaf, "parents": [common, _filter_options()]}

    p = _add(commands, "list", _cmd_list, "list exchanges, newest first", LIST_EXAMPLES, queries, aliases=["search"])
    p.add_argument("--limit", type=_positive_int, default=50, metavar="N", help="exchanges per page (default: 50)")
    p.add_argument("--offset", type=_count, default=0, metavar="N", help="skip the N newest matches (the next page)")
    p.add_argument("--format", choices=("table", *MACHINE_FORMATS), default="table",
                   help="table (default) for a person; json, jsonl or csv for scripts")

    p = _add(commands, "show", _cmd_show, "show one exchange in full", SHOW_EXAMPLES, leaf)
    p.add_argument("id", metavar="ID", help="the exchange id, or a unique start of it")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="text (default) for a person; json: the whole record")

    p = _add(commands, "stats", _cmd_stats, "count exchanges and sum tokens, per group", STATS_EXAMPLES, queries)
    p.add_argument("--by", type=_group_keys, action="extend", default=[], metavar="KEY",
                   help=f"group by {', '.join(GROUP_KEYS)} (repeat or comma-separate for several)")
    p.add_argument("--format", choices=("table", *MACHINE_FORMATS), default="table",
                   help="table (default) for a person; json, jsonl or csv for scripts")

    p = _add(commands, "export", _cmd_export, "write exchanges for other tools, streamed", EXPORT_EXAMPLES, queries)
    p.add_argument("--format", choices=("jsonl", "csv"), default="jsonl", help="jsonl (default) or csv")

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
    integrity_cli.add_signer_options(p, "purge")

    p = _add(commands, "status", _cmd_status, "tell whether the proxy's records flow", STATUS_EXAMPLES, leaf)
    p.add_argument("path", nargs="?", type=Path, metavar="FILE", help="the status file (default: from the options below)")
    p.add_argument("--spool-dir", type=Path, default=default_state_dir(), metavar="DIR",
                   help="the folder of the proxy's spool (llm_audit_spool), where its status file is")
    p.add_argument("--instance", default=socket.gethostname(), metavar="NAME",
                   help="the proxy's llm_audit_instance (default: this host's name)")
    p.add_argument("--format", choices=("text", "json"), default="text")

    p = _add(commands, "hosts", _cmd_hosts, "print an --allow-hosts expression for the inference API hosts",
             HOSTS_EXAMPLES, {**leaf, "parents": []})
    p.add_argument("--extra", metavar="FILE", default=os.environ.get(EXTRA_HOSTS_ENV) or None,
                   help=f"a file of more hosts, one per line (default: ${EXTRA_HOSTS_ENV})")
    p.add_argument("--list", action="store_true", help="print the host patterns, one a line, instead")

    integrity_cli.add_commands(commands, db_commands, _add, leaf)
    return parser


def _add(commands: argparse._SubParsersAction, name: str, run: Callable[[argparse.Namespace], int], summary: str,
         epilog: str, leaf: dict[str, Any], aliases: Sequence[str] = ()) -> argparse.ArgumentParser:
    """A subcommand's parser, with its help, description and examples, that runs ``run``."""
    parser = commands.add_parser(name, help=summary, description=summary[0].upper() + summary[1:] + ".",
                                 epilog=epilog, aliases=aliases, **leaf)
    parser.set_defaults(run=run)
    return parser


def _filter_options() -> argparse.ArgumentParser:
    """The filters of list, stats and export (see :class:`storage.query.Filters`)."""
    parser = _Parser(add_help=False)
    group = parser.add_argument_group("filters")
    group.add_argument("--since", type=_moment, metavar="AGE|DATE", help="started at or after (7d, 12h, 2026-03-01)")
    group.add_argument("--until", type=_moment, metavar="AGE|DATE", help="started before")
    for option, dest, metavar, what in (
        ("--model", "models", "MODEL", "the model asked for (request_model)"),
        ("--provider", "providers", "PROVIDER", "the provider (openai, anthropic, ...)"),
        ("--dialect", "dialects", "DIALECT", "the protocol (llm-stream, openai-chat, ...)"),
        ("--user", "users", "USER", "the end user (user_id)"),
        ("--session", "sessions", "SESSION", "the session or conversation (session_id)"),
        ("--client", "clients", "ADDRESS", "the client's IP address (client_address)"),
        ("--status", "statuses", "STATUS", "completed, failed, blocked, client_aborted, upstream_aborted, ..."),
        ("--finding", "findings", "CODE", "has a finding with this code (e.g. missing_stream_end)"),
    ):  # fmt: skip
        group.add_argument(option, dest=dest, action="append", default=[], metavar=metavar, help=what)
    group.add_argument("--blocked", action="store_true", help="blocked by a content filter")
    group.add_argument("--contains", metavar="TEXT", help="TEXT in the request or the output, in any case")
    return parser


def _moment(value: str) -> datetime:
    """An age before now or a date (``--since``, ``--until``), as ``purge --older-than`` takes them."""
    try:
        return parse_cutoff(value, datetime.now(UTC))
    except RetentionError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _group_keys(value: str) -> list[str]:
    keys = [key.strip() for key in value.split(",") if key.strip()]
    unknown = [key for key in keys if key not in GROUP_KEYS]
    if unknown or not keys:
        raise argparse.ArgumentTypeError(f"cannot group by {value!r}; choose from {', '.join(GROUP_KEYS)}")
    return keys


MAX_COUNT = 2**63 - 1  # the largest LIMIT and OFFSET a database takes


def _count(value: str) -> int:
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of 0 or more")
    return _bounded(value, int(value))


def _bounded(value: str, n: int) -> int:
    if n > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"{value!r} is too large (at most {MAX_COUNT})")
    return n


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive whole number")
    return _bounded(value, n)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; the exit status is 0, or 2 after a one-line error."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (DatabaseError, RetentionError, QueryError, CheckpointError, RoleError, StatusError) as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:
        # whoever read the output stopped (``| head``): end quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE
    except KeyboardInterrupt:
        note = " (a purge's purge_log row counts what it deleted)" if args.run is _cmd_purge else ""
        print(f"{PROG}: interrupted{note}", file=sys.stderr)
        return 130
    except OSError as e:  # a file or folder named on the command line
        print(f"{PROG}: {e.strerror or e}{f': {e.filename}' if e.filename else ''}", file=sys.stderr)
        return EXIT_ERROR
    except (ValueError, TypeError, LookupError, OverflowError) as e:
        # Values the schema does not allow (SQLite keeps any text in any column): the
        # database was written by something else. One line, never a traceback.
        print(f"{PROG}: a stored value cannot be read ({type(e).__name__}: {_one_line(e)}); the database holds "
              f"data llm-audit did not write: run '{PROG} verify'", file=sys.stderr)
        return EXIT_ERROR


def _one_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:200]


def _url(args: argparse.Namespace) -> str:
    return getattr(args, "db", None) or default_url()


@contextmanager
def _reading(args: argparse.Namespace) -> Iterator[Connection]:
    """A connection to the database for the query commands; failures become one-line errors."""
    engine = open_reader(_url(args), hint=HINT)
    try:
        with engine.connect() as conn:
            prepare(conn)
            yield conn
    except SQLAlchemyError as e:
        raise DatabaseError(f"cannot read the audit database {engine.url.render_as_string()!r}: {first_line(e)}") from None
    finally:
        engine.dispose()


def _filters(args: argparse.Namespace) -> Filters:
    return Filters(
        since=args.since, until=args.until, models=args.models, providers=args.providers, dialects=args.dialects,
        users=args.users, sessions=args.sessions, clients=args.clients, statuses=args.statuses,
        findings=args.findings, blocked=args.blocked, contains=args.contains,
    )


# -- list, show, stats, export ----------------------------------------------------------------


def _cmd_list(args: argparse.Namespace) -> int:
    with _reading(args) as conn:
        rows = list_exchanges(conn, _filters(args), limit=args.limit, offset=args.offset)
    if args.format != "table":
        write_records(rows, args.format, FIELDS, sys.stdout)
        return 0
    if not rows:
        print("no exchanges match" + (" on this page" if args.offset else ""))
        return 0
    style = Style.for_stream(sys.stdout)
    print(exchanges_table(rows, terminal_width(), style))
    if len(rows) == args.limit:
        print(style.dim(f"(more with --offset {args.offset + args.limit})"))
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    with _reading(args) as conn:
        record = get_exchange(conn, args.id)
    if args.format == "json":
        sys.stdout.write(json_document(record))
    else:
        print(exchange_text(record, terminal_width(), Style.for_stream(sys.stdout)))
    return 0


def _cmd_stats(args: argparse.Namespace) -> int:
    by = list(dict.fromkeys(args.by))
    with _reading(args) as conn:
        rows = stats(conn, _filters(args), by)
    if args.format == "table":
        print(stats_table(rows, by, terminal_width(), Style.for_stream(sys.stdout)))
    else:
        write_records(rows, args.format, [*by, *STATS_FIELDS], sys.stdout)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    filters = _filters(args)
    with _reading(args) as conn:
        rows = iter_exchanges(conn, filters)
        if sys.stderr.isatty():
            rows = Progress(count_exchanges(conn, filters), sys.stderr).track(rows)
        write_records(rows, args.format, FIELDS, sys.stdout)
    return 0


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
        signer = None if args.dry_run else integrity_cli.signer(args)
        result = purge(engine, cutoff, dry_run=args.dry_run, actor=_actor(), older_than=args.older_than,
                       batch_size=args.batch_size, signer=signer)
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


# -- status -----------------------------------------------------------------------------------


def _cmd_status(args: argparse.Namespace) -> int:
    path = args.path or status_path(args.spool_dir.expanduser(), args.instance)
    try:
        doc = read_status(path)
    except FileNotFoundError:
        raise StatusError(f"no status file {path}: no proxy with this instance and spool folder has run "
                          "(give --instance and --spool-dir, or the file)") from None
    except (OSError, ValueError) as e:
        raise StatusError(f"cannot read the status file {path}: {e}") from None
    code, line = verdict(doc, pid_alive(int(doc["pid"])) if isinstance(doc["pid"], int) else False)
    if args.format == "json":
        sys.stdout.write(orjson.dumps({"exit": code, "verdict": line, "status": doc}, option=orjson.OPT_INDENT_2)
                         .decode() + "\n")
    else:
        print(line)
    return code


# -- hosts ------------------------------------------------------------------------------------


def _cmd_hosts(args: argparse.Namespace) -> int:
    try:
        print(hosts_output(args.extra, args.list))
    except HostsError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_ERROR
    return 0
