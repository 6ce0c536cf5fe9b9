"""``hosts``: the ``--allow-hosts`` expression for the inference API hosts
(:mod:`addon.hosts`), so that mitmproxy decrypts only inference traffic."""

from __future__ import annotations

import argparse
import os

from addon.hosts import EXTRA_HOSTS_ENV, HOSTS_EXAMPLES, HostsError, hosts_output
from cli.common import Commands, fail


def add_commands(commands: Commands) -> None:
    """Register ``hosts``; it needs no database, so it takes no ``--db``."""
    p = commands.add(
        "hosts", _cmd_hosts, "print an --allow-hosts expression for the inference API hosts", HOSTS_EXAMPLES, parents=[]
    )
    p.add_argument(
        "--extra",
        metavar="FILE",
        default=os.environ.get(EXTRA_HOSTS_ENV) or None,
        help=f"a file of more hosts, one per line (default: ${EXTRA_HOSTS_ENV})",
    )
    p.add_argument("--list", action="store_true", help="print the host patterns, one a line, instead")


def _cmd_hosts(args: argparse.Namespace) -> int:
    try:
        print(hosts_output(args.extra, args.list))
    except HostsError as e:
        return fail(str(e))
    return 0
