"""``cost recompute``: the cost of past exchanges computed again after a price update.

The price data is the installed genai-prices release (update it with pip), and a price
file given with ``--prices`` (the proxy's ``llm_audit_prices`` file: the same format). A
price file that cannot be used, like any other failure, is one line (:mod:`cli.common`).
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path

from cli.common import PROG, Commands, engine, positive_int
from storage.cost import GENAI_PRICES, load_prices
from storage.recompute import recompute
from storage.retention import RetentionError, parse_cutoff

COST_EXAMPLES = f"""\
examples:
  {PROG} cost recompute --since 30d
"""

RECOMPUTE_EXAMPLES = f"""\
Prices every final exchange again from its provider, model and recorded usage, with the
installed price data ({GENAI_PRICES}) and the price file given, and updates cost_usd and
cost_prices where they changed. Neither is in the hash chain: llm-audit verify passes as
before. On PostgreSQL with llm-audit db roles, run it as the owner or the purge role.

examples:
  pip install -U genai-prices && {PROG} cost recompute
  {PROG} cost recompute --since 2026-03-01 --prices /etc/llm-audit/prices.toml
  {PROG} cost recompute --since 7d --dry-run
"""


def add_commands(commands: Commands) -> None:
    """Register ``cost`` and its subcommands."""
    cost = commands.group("cost", "what exchanges cost", COST_EXAMPLES, "cost commands")
    p = cost.add("recompute", _cmd_recompute, "compute the cost of past exchanges again", RECOMPUTE_EXAMPLES)
    p.add_argument("--since", type=_moment, metavar="AGE|DATE", help="exchanges started at or after (7d, 2026-03-01)")
    p.add_argument("--until", type=_moment, metavar="AGE|DATE", help="exchanges started before")
    p.add_argument("--prices", type=Path, metavar="FILE", help="a price file (TOML, as llm_audit_prices takes)")
    p.add_argument(
        "--batch-size", type=positive_int, default=1000, metavar="N", help="rows per transaction (default: 1000)"
    )
    p.add_argument("--dry-run", action="store_true", help="count what would change; change nothing")


def _moment(value: str) -> datetime:
    try:
        return parse_cutoff(value, datetime.now(UTC))
    except RetentionError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _cmd_recompute(args: argparse.Namespace) -> int:
    prices = load_prices(args.prices) if args.prices is not None else None
    with engine(args, existing=True) as db:
        done = recompute(
            db, prices, since=args.since, until=args.until, batch_size=args.batch_size, dry_run=args.dry_run
        )
    source = GENAI_PRICES + (f" and {prices.path} ({prices.label})" if prices is not None else "")
    verb = "would change" if args.dry_run else "changed"
    print(
        f"{verb} the cost of {done.changed} of {done.examined} exchanges "
        f"({done.priced} priced, {done.examined - done.priced} unknown) with {source}"
        + (" (dry run: nothing changed)" if args.dry_run else "")
    )
    return 0
