"""The ``llm-audit`` commands of tamper evidence: ``checkpoint``, ``verify``, ``erase``, ``db roles``.

Registered by :func:`storage.cli.build_parser` through :func:`add_commands`; errors are
raised as :class:`~storage.database.DatabaseError` / :class:`CheckpointError` /
:class:`RoleError` and printed by ``main`` as one line with exit status 2. ``verify``
exits 1 when a chain does not check out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from storage.chain import Head
from storage.checkpoint import (
    CheckpointError,
    default_checkpoint_dir,
    default_key_path,
    load_or_create_key,
    load_public_key,
    public_key_path,
    read_checkpoints,
    write_checkpoint,
)
from storage.database import DatabaseError, first_line, open_engine, open_reader
from storage.erase import erase_user
from storage.roles import DEFAULT_PROXY_ROLE, DEFAULT_PURGE_ROLE, roles_sql
from storage.schema import exchanges
from storage.statements import Signer, read_statements
from storage.verify import verify

EXIT_TAMPERED = 1
EXIT_UNCOVERED = 3  # no tampering found, but records that no checkpoint covers

CHECKPOINT_EXAMPLES = f"""\
Signs the head of every hash chain in the database with the Ed25519 key (created on
first use, its public half next to it as .pub) and writes a checkpoint file. It signs
what the database holds, so it first verifies the chains against the checkpoints and
statements already in --dir and refuses to sign over tampering they reveal. Ship the
files and the public key somewhere the database's administrators cannot rewrite.

examples:
  llm-audit checkpoint
  llm-audit checkpoint --dir /srv/audit-checkpoints --key /etc/llm-audit/signing-key.pem
  (defaults: --key {default_key_path()}, --dir {default_checkpoint_dir()})
"""

VERIFY_EXAMPLES = """\
Recomputes every hash chain; with --checkpoints also compares them with the signed
checkpoints. Prints one verdict line per chain, then the records the proxy quarantined
(where they fill a gap of their chain exactly: "record N of chain X is quarantined in
FILE: reason"), then the problems found. With --checkpoints, only chains that a checkpoint
signed by a trusted key (--public-key, repeatable) names are accepted, and records no
checkpoint covers are named ("not yet covered by a checkpoint: records N..M"); a folder
without checkpoints is an error. Exit status: 0 all chains check out (quarantined
records included) and, with --checkpoints, every record is covered; 1 tampering found;
2 the check could not run; 3 no tampering found, but some records are not covered by a
checkpoint (a chain no checkpoint names, or records after its last checkpoint).

examples:
  llm-audit verify
  llm-audit verify --checkpoints ~/.local/share/llm-audit/checkpoints
  llm-audit verify --checkpoints /srv/audit-checkpoints --public-key signing-key.pub --format json
"""

ERASE_EXAMPLES = """\
Replaces the content (request body, output, tool calls) of every final exchange of the
user with an erasure marker, keeping the content hashes: the hash chains still verify,
and verify counts the records as erased. The erasure is logged in erasure_log and
signed (erasure-<time>.json in --dir, with --key): verify --checkpoints accepts an
erased record only against such a statement.

examples:
  llm-audit erase --user alice@example.com
"""

ROLES_EXAMPLES = f"""\
PostgreSQL only. Prints the SQL that creates a role for the proxies (insert and
complete their own records; never change a final one, never delete) and one for
purging and erasing; --apply runs it (connect as the tables' owner). Then make log-in
roles members, e.g. CREATE ROLE proxy1 LOGIN PASSWORD '...' IN ROLE {DEFAULT_PROXY_ROLE};

examples:
  llm-audit --db postgresql+psycopg://owner@db/audit db roles
  llm-audit --db postgresql+psycopg://owner@db/audit db roles --apply
"""


def add_commands(commands: argparse._SubParsersAction, db_commands: argparse._SubParsersAction,
                 add: Any, leaf: dict[str, Any]) -> None:
    """Register the commands with the ``add`` helper of :mod:`storage.cli`."""
    p = add(commands, "checkpoint", _cmd_checkpoint, "sign the heads of the hash chains", CHECKPOINT_EXAMPLES, leaf)
    p.add_argument("--key", type=Path, default=default_key_path(), metavar="FILE", help="the Ed25519 signing key")
    p.add_argument("--dir", type=Path, default=default_checkpoint_dir(), metavar="DIR",
                   help="where checkpoint files go")

    p = add(commands, "verify", _cmd_verify, "check the hash chains for tampering", VERIFY_EXAMPLES, leaf)
    p.add_argument("--checkpoints", type=Path, metavar="DIR", help="also compare with the signed checkpoints here")
    p.add_argument("--public-key", type=Path, metavar="FILE", action="append",
                   help="a key the checkpoints may be signed with; repeat for several (default: "
                        f"{public_key_path(default_key_path())})")
    p.add_argument("--format", choices=("text", "json"), default="text")

    p = add(commands, "erase", _cmd_erase, "erase a user's content, keeping the chains verifiable",
            ERASE_EXAMPLES, leaf)
    p.add_argument("--user", required=True, metavar="ID", help="the user_id whose content is erased")
    add_signer_options(p, "erasure")

    p = add(db_commands, "roles", _cmd_db_roles, "least-privilege roles on PostgreSQL", ROLES_EXAMPLES, leaf)
    p.add_argument("--proxy-role", default=DEFAULT_PROXY_ROLE, metavar="NAME")
    p.add_argument("--purge-role", default=DEFAULT_PURGE_ROLE, metavar="NAME")
    p.add_argument("--apply", action="store_true", help="run the SQL on --db instead of printing it")


def add_signer_options(p: argparse.ArgumentParser, what: str) -> None:
    """``--key`` and ``--dir`` of a command that signs a statement of what it did."""
    p.add_argument("--key", type=Path, default=default_key_path(), metavar="FILE",
                   help=f"the Ed25519 key that signs the {what} statement (default: {default_key_path()})")
    p.add_argument("--dir", type=Path, default=default_checkpoint_dir(), metavar="DIR",
                   help=f"where the signed {what} statement goes, beside the checkpoints "
                        f"(default: {default_checkpoint_dir()})")


def signer(args: argparse.Namespace) -> Signer:
    return Signer.load(args.dir, args.key)


def _engine(args: argparse.Namespace, *, reading: bool = False):
    """The engine for ``--db``; ``reading``: the command only reads, so a missing or empty
    database is an error, never a new file."""
    from storage.cli import HINT, _url  # the shared --db handling

    return open_reader(_url(args), hint=HINT) if reading else open_engine(_url(args), hint=HINT)


def _refuse_tampered(engine, args: argparse.Namespace, key) -> None:
    """A checkpoint signs what the database holds: never over tampering that the
    checkpoints and statements already in ``--dir`` reveal (a new folder has none)."""
    if not list(args.dir.glob("checkpoint-*.json")):
        return
    public = key.public_key()
    report = verify(engine, read_checkpoints(args.dir, public), read_statements(args.dir, public))
    bad = next((chain for chain in report.chains if not chain.ok), None)
    if bad is not None:
        raise CheckpointError(f"refusing to sign: chain {bad.chain_id} does not verify against the checkpoints in "
                              f"{args.dir} ({bad.problems[0].line()}); see llm-audit verify --checkpoints {args.dir}")


def _cmd_checkpoint(args: argparse.Namespace) -> int:
    key = load_or_create_key(args.key)
    engine = _engine(args, reading=True)
    c = exchanges.c
    try:
        _refuse_tampered(engine, args, key)
        with engine.connect() as conn:
            last = select(c.chain_id, func.max(c.chain_seq).label("seq")).where(c.chain_id.is_not(None)) \
                .group_by(c.chain_id).subquery()
            rows = conn.execute(select(c.chain_id, c.chain_seq, c.record_hash).join(
                last, (c.chain_id == last.c.chain_id) & (c.chain_seq == last.c.seq))).all()
    except SQLAlchemyError as e:
        raise DatabaseError(f"cannot read the chains: {first_line(e)}") from None
    finally:
        engine.dispose()
    heads = {r.chain_id: Head(r.chain_seq, r.record_hash) for r in rows}
    try:
        path = write_checkpoint(args.dir, key, heads)
    except OSError as e:
        raise CheckpointError(f"cannot write a checkpoint in {args.dir} ({e.strerror}); name a writable folder "
                              "with --dir DIR") from None
    print(f"{path}: {len(heads)} chains signed ({', '.join(f'{k} at {h.seq}' for k, h in sorted(heads.items()))})")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    checkpoints, statements = [], None
    if args.checkpoints is not None:
        keys = [load_public_key(path) for path in args.public_key or [public_key_path(default_key_path())]]
        checkpoints = read_checkpoints(args.checkpoints, keys)
        statements = read_statements(args.checkpoints, keys)
    engine = _engine(args, reading=True)
    try:
        report = verify(engine, checkpoints, statements)
    except SQLAlchemyError as e:
        raise DatabaseError(f"cannot read the chains: {first_line(e)}") from None
    finally:
        engine.dispose()
    if args.format == "json":
        doc = {"ok": report.ok, "covered": report.covered, "checkpoints": len(checkpoints), "chains": [c.as_dict() for c in report.chains],
               "unchained": [{"id": p.record_id, "detail": p.detail} for p in report.unchained]}
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        for chain in report.chains:
            print(chain.verdict())
        if report.unchained:
            print(f"records in no chain: {len(report.unchained)}{'+' if len(report.unchained) >= 20 else ''}")
        for chain in report.chains:
            for line in chain.quarantine_lines():
                print(f"  {line}")
            for problem in chain.problems:
                print(f"  {chain.chain_id}: {problem.line()}")
            if chain.ok and (line := chain.coverage_line()):
                print(f"  {line}")
        for problem in report.unchained:
            print(f"  {problem.line()}")
        if not report.chains and not report.unchained:
            print("no chains: no final records yet")
    if not report.ok:
        return EXIT_TAMPERED
    return 0 if report.covered else EXIT_UNCOVERED


def _cmd_erase(args: argparse.Namespace) -> int:
    from storage.cli import _actor

    sign = signer(args)
    engine = _engine(args)
    try:
        count = erase_user(engine, args.user, actor=_actor(), signer=sign)
    finally:
        engine.dispose()
    signed = f", signed in {args.dir}" if count else ""
    print(f"erased the content of {count} exchanges of user {args.user!r} (logged in erasure_log{signed})")
    return 0


def _cmd_db_roles(args: argparse.Namespace) -> int:
    sql = roles_sql(args.proxy_role, args.purge_role)
    if not args.apply:
        sys.stdout.write(sql)
        return 0
    engine = _engine(args)
    try:
        if engine.dialect.name != "postgresql":
            raise DatabaseError("roles are a PostgreSQL feature; SQLite has no users (protect the file instead)")
        with engine.begin() as conn:
            conn.exec_driver_sql(sql)
    except SQLAlchemyError as e:
        raise DatabaseError(f"cannot create the roles: {first_line(e)}") from None
    finally:
        engine.dispose()
    print(f"roles {args.proxy_role} and {args.purge_role} ready; make log-in roles members of them")
    return 0
