"""``llm-audit``: the parser of every command group, and the console script's entry point.

It reads the same database as the proxy: ``--db URL``, else ``$LLM_AUDIT_DB``, else the
default SQLite file (:func:`storage.database.default_url`). Adding a command means a
``_cmd_*`` function and its parser in the ``add_commands`` of its group's module.

argparse rather than click or typer: the standard library covers nested subcommands,
help with examples and our one-line errors, and the proxy's environment (mitmproxy's
pinned dependencies) gains no package for it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from cli import cost, db, hosts, integrity, query, serve, status
from cli.common import PROG, Commands, OneLineParser, db_option, run
from storage.database import default_url, shown_url

MAIN_EXAMPLES = f"""\
The database: --db URL, else $LLM_AUDIT_DB, else {shown_url(default_url())}

examples:
  {PROG} list --since 7d --user alice
  {PROG} show 3f2a9c41d0be
  {PROG} stats --by client --since 7d
  {PROG} stats --by user,day --since 30d              # tokens and cost per user and day
  {PROG} cost recompute --since 30d                    # after a price update
  {PROG} export --since 2026-03-01 --until 2026-04-01 > march.jsonl
  {PROG} db upgrade
  {PROG} --db postgresql+psycopg://audit@db.example/audit db current
  {PROG} purge --older-than 365d --dry-run
  {PROG} status
  {PROG} serve --password-file ~/.config/llm-audit/serve-password
  {PROG} <command> --help
"""

# In the order ``--help`` lists them.
GROUPS = (query, cost, db, integrity, status, hosts, serve)


def build_parser() -> argparse.ArgumentParser:
    """The parser; each leaf sets ``run`` to its ``_cmd_*`` function."""
    parents = [db_option()]
    parser = OneLineParser(
        prog=PROG,
        description="Query and look after the audit database of the llm-audit proxy.",
        epilog=MAIN_EXAMPLES,
        parents=parents,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = Commands(parser.add_subparsers(title="commands", metavar="<command>", required=True), parents)
    for group in GROUPS:
        group.add_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; the exit status is 0, or 2 after a one-line error."""
    return run(build_parser().parse_args(argv))
