"""``list`` (alias ``search``), ``show``, ``stats`` and ``export``: questions to
:mod:`storage.query`, answered for a person (:mod:`cli.tables`, :mod:`cli.show`) or for
scripts (:mod:`cli.formats`)."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime

from addon.record import Status
from cli.common import PROG, Commands, OneLineParser, positive_int, reading, warn, whole_number
from cli.formats import MACHINE_FORMATS, Progress, json_document, write_records
from cli.show import exchange_text
from cli.tables import exchanges_table, stats_table
from cli.terminal import Style, terminal_width
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
    stats,
)
from storage.retention import RetentionError, parse_cutoff
from storage.stored import Unreadable

#: The statuses a record may have (addon.record.Status).
STATUSES = tuple(status.value for status in Status)

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
cost $: the sum of the known costs in US dollars (docs/cost.md); priced: the exchanges
whose cost is known (the others have no price: an unknown model or provider, no usage).

{FILTERS_HELP}

examples:
  {PROG} stats --by client --since 7d                 # which workstation used the most tokens
  {PROG} stats --by user,day --since 2026-03-01 --until 2026-04-01
  {PROG} stats --by model --by status --format csv
  {PROG} stats --by user,day --since 30d              # what each user spent, day by day
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


def add_commands(commands: Commands) -> None:
    """Register ``list``/``search``, ``show``, ``stats`` and ``export``."""
    queries = [*commands.parents, _filter_options()]
    formats = ("table", *MACHINE_FORMATS)
    p = commands.add(
        "list", _cmd_list, "list exchanges, newest first", LIST_EXAMPLES, parents=queries, aliases=["search"]
    )
    p.add_argument("--limit", type=positive_int, default=50, metavar="N", help="exchanges per page (default: 50)")
    p.add_argument(
        "--offset", type=whole_number, default=0, metavar="N", help="skip the N newest matches (the next page)"
    )
    p.add_argument(
        "--format",
        choices=formats,
        default="table",
        help="table (default) for a person; json, jsonl or csv for scripts",
    )

    p = commands.add("show", _cmd_show, "show one exchange in full", SHOW_EXAMPLES)
    p.add_argument("id", metavar="ID", help="the exchange id, or a unique start of it")
    p.add_argument(
        "--format", choices=("text", "json"), default="text", help="text (default) for a person; json: the whole record"
    )

    p = commands.add(
        "stats", _cmd_stats, "count exchanges, sum tokens and cost, per group", STATS_EXAMPLES, parents=queries
    )
    p.add_argument(
        "--by",
        type=_group_keys,
        action="extend",
        default=[],
        metavar="KEY",
        help=f"group by {', '.join(GROUP_KEYS)} (repeat or comma-separate for several)",
    )
    p.add_argument(
        "--format",
        choices=formats,
        default="table",
        help="table (default) for a person; json, jsonl or csv for scripts",
    )

    p = commands.add(
        "export", _cmd_export, "write exchanges for other tools, streamed", EXPORT_EXAMPLES, parents=queries
    )
    p.add_argument("--format", choices=("jsonl", "csv"), default="jsonl", help="jsonl (default) or csv")


def _filter_options() -> argparse.ArgumentParser:
    """The filters of list, stats and export (see :class:`storage.query.Filters`)."""
    parser = OneLineParser(add_help=False)
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


def _filters(args: argparse.Namespace) -> Filters:
    """The filters asked for; a mistake that would match nothing is one line naming it
    (a status misspelled, a --since not before --until), not an empty answer."""
    if unknown := [s for s in args.statuses if s not in STATUSES]:
        raise QueryError(f"no exchange has the status {unknown[0]!r}; the statuses are {', '.join(STATUSES)}")
    if args.since is not None and args.until is not None and args.since >= args.until:
        raise QueryError(
            f"--since ({args.since:%Y-%m-%d %H:%M}) is not before --until ({args.until:%Y-%m-%d %H:%M}): "
            "nothing can match; swap them"
        )
    return Filters(
        since=args.since,
        until=args.until,
        models=args.models,
        providers=args.providers,
        dialects=args.dialects,
        users=args.users,
        sessions=args.sessions,
        clients=args.clients,
        statuses=args.statuses,
        findings=args.findings,
        blocked=args.blocked,
        contains=args.contains,
    )


def _cmd_list(args: argparse.Namespace) -> int:
    unreadable = Unreadable()
    with reading(args) as conn:
        rows = list_exchanges(conn, _filters(args), limit=args.limit, offset=args.offset, unreadable=unreadable)
    if args.format != "table":
        write_records(rows, args.format, FIELDS, sys.stdout)
    elif not rows:
        print("no exchanges match" + (" on this page" if args.offset else ""))
    else:
        style = Style.for_stream(sys.stdout)
        print(exchanges_table(rows, terminal_width(), style))
        if len(rows) == args.limit:
            print(style.dim(f"(more with --offset {args.offset + args.limit})"))
    _say_unreadable(unreadable)
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    unreadable = Unreadable()
    with reading(args) as conn:
        record = get_exchange(conn, args.id, unreadable=unreadable)
    if args.format == "json":
        sys.stdout.write(json_document(record))
    else:
        print(exchange_text(record, terminal_width(), Style.for_stream(sys.stdout)))
    _say_unreadable(unreadable)
    return 0


def _say_unreadable(unreadable: Unreadable) -> None:
    """One line on stderr naming the records shown without a value they hold: values
    llm-audit did not write (SQLite keeps anything anyone puts in a column)."""
    if unreadable:
        count = f"{unreadable.count} records hold" if unreadable.count > 1 else "a record holds"
        warn(
            f"{count} values llm-audit did not write, shown as empty (first: {unreadable.named[0]}); run '{PROG} verify'"
        )


def _cmd_stats(args: argparse.Namespace) -> int:
    by = list(dict.fromkeys(args.by))
    with reading(args) as conn:
        rows = stats(conn, _filters(args), by)
    if args.format == "table":
        print(stats_table(rows, by, terminal_width(), Style.for_stream(sys.stdout)))
    else:
        write_records(rows, args.format, [*by, *STATS_FIELDS], sys.stdout)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    filters = _filters(args)
    unreadable = Unreadable()
    with reading(args) as conn:
        rows = iter_exchanges(conn, filters, unreadable=unreadable)
        if sys.stderr.isatty():
            rows = Progress(count_exchanges(conn, filters), sys.stderr).track(rows)
        write_records(rows, args.format, FIELDS, sys.stdout)
    _say_unreadable(unreadable)
    return 0
