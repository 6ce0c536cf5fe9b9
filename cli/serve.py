"""``serve``: the read-only review web application (:mod:`review`) on a local port.

The web libraries are imported when ``serve`` runs, not when ``llm-audit`` starts: the
other commands do not pay for them.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys

from cli.common import PROG, Commands, url
from storage.database import DatabaseError, shown_url

DEFAULT_LISTEN = "127.0.0.1:8765"

SERVE_EXAMPLES = f"""\
Serves pages of the audit database to a browser: the exchanges list with the filters of
'{PROG} list', each exchange in full, an overview with charts, CSV and JSONL exports of a
selection, and a printable page per exchange. The database is opened read-only.

A login is required. The password is the first line of --password-file (readable by its
owner only: chmod 600) or $LLM_AUDIT_SERVE_PASSWORD; there is no default. It listens on
loopback unless told otherwise; to reach it from elsewhere, put a TLS reverse proxy in
front (see docs/review-ui.md). Each request is logged to stderr (client, who, page, status).

examples:
  LLM_AUDIT_SERVE_PASSWORD="$(cat ~/.config/llm-audit/serve-password)" {PROG} serve
  {PROG} serve --password-file ~/.config/llm-audit/serve-password --listen 127.0.0.1:9000
  {PROG} --db postgresql+psycopg://reader@db.example/audit serve --password-file pw.txt
"""


def add_commands(commands: Commands) -> None:
    """Register ``serve``."""
    p = commands.add("serve", _cmd_serve, "serve the read-only review pages in a browser", SERVE_EXAMPLES)
    p.add_argument(
        "--listen",
        type=_address,
        default=_address(DEFAULT_LISTEN),
        metavar="HOST:PORT",
        help=f"where to listen (default: {DEFAULT_LISTEN}, loopback only)",
    )
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name to answer besides 127.0.0.1 and localhost on loopback (a reverse proxy's)",
    )
    p.add_argument(
        "--password-file",
        metavar="FILE",
        help="the login password: the file's first line (mode 600); else $LLM_AUDIT_SERVE_PASSWORD",
    )


def _address(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536 or not host:
        raise argparse.ArgumentTypeError(f"{value!r} is not HOST:PORT (e.g. {DEFAULT_LISTEN})")
    return host.strip("[]"), int(port)


def _cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from review.app import build_app, is_loopback
    from review.auth import ACCESS_LOG, PasswordError, Sessions, read_password
    from review.database import open_read_only

    try:
        password = read_password(args.password_file)
    except PasswordError as e:
        raise DatabaseError(str(e)) from None  # one line, as every command's errors
    host, port = args.listen
    engine = open_read_only(url(args))
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    logging.getLogger(ACCESS_LOG).setLevel(logging.INFO)
    hosts = [host, *args.allow_host]  # its own address, say 127.0.0.2, is a name it is asked for
    app = build_app(engine, Sessions(password), loopback=is_loopback(host), hosts=hosts)
    shown = f"[{host}]" if ":" in host else host
    try:  # (bound here, first: uvicorn's own failure is two lines and exit 3)
        listening = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    except OSError as e:
        engine.dispose()
        raise DatabaseError(
            f"cannot listen on {shown}:{port}: {e.strerror or e}; choose another address with --listen HOST:PORT"
        ) from None
    print(f"{PROG} serve: reading {shown_url(url(args))} at http://{shown}:{port}/", file=sys.stderr)
    try:
        config = uvicorn.Config(app, log_level="warning", access_log=False, server_header=False)
        uvicorn.Server(config).run(sockets=[listening])
    finally:
        listening.close()
        engine.dispose()
    return 0
