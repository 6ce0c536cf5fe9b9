"""``status``: whether the proxy's records flow, from the status file its writer keeps
(no database access)."""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path

import orjson

from cli.common import PROG, Commands
from cli.terminal import one_line
from storage.spool import default_state_dir
from storage.status import StatusError, pid_alive, read_status, status_path, verdict

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


def add_commands(commands: Commands) -> None:
    """Register ``status``."""
    p = commands.add("status", _cmd_status, "tell whether the proxy's records flow", STATUS_EXAMPLES)
    p.add_argument(
        "path", nargs="?", type=Path, metavar="FILE", help="the status file (default: from the options below)"
    )
    p.add_argument(
        "--spool-dir",
        type=Path,
        default=default_state_dir(),
        metavar="DIR",
        help="the folder of the proxy's spool (llm_audit_spool), where its status file is",
    )
    p.add_argument(
        "--instance",
        default=socket.gethostname(),
        metavar="NAME",
        help="the proxy's llm_audit_instance (default: this host's name)",
    )
    p.add_argument("--format", choices=("text", "json"), default="text")


def _cmd_status(args: argparse.Namespace) -> int:
    path = args.path or status_path(args.spool_dir.expanduser(), args.instance)
    try:
        doc = read_status(path)
    except FileNotFoundError:
        raise StatusError(
            f"no status file {path}: no proxy with this instance and spool folder has run "
            "(give --instance and --spool-dir, or the file)"
        ) from None
    except (OSError, ValueError) as e:
        raise StatusError(f"cannot read the status file {path}: {e}") from None
    started = doc.get("pid_started") if isinstance(doc.get("pid_started"), str) else None
    code, line = verdict(doc, pid_alive(doc["pid"], started) if isinstance(doc["pid"], int) else False)
    if args.format == "json":
        sys.stdout.write(
            orjson.dumps({"exit": code, "verdict": line, "status": doc}, option=orjson.OPT_INDENT_2).decode() + "\n"
        )
    else:
        print(one_line(line))  # (the instance's name and the last error come from the file)
    return code
