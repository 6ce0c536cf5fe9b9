"""Tamper evidence and retention: ``checkpoint``, ``verify``, ``erase`` and ``purge``.

``verify`` exits 1 when a chain does not check out, 3 when no tampering is found but
records are not covered by a checkpoint; the others fail as one line with status 2
(:func:`cli.common.run`). ``erase`` and ``purge`` sign a statement of what they did
with the checkpoints' key, so that ``verify --checkpoints`` can tell them from tampering.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path

import orjson
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import Engine, Text, literal, select
from sqlalchemy.exc import SQLAlchemyError

from cli.common import PROG, Commands, actor, engine, positive_int, warn
from cli.terminal import one_line
from storage.checkpoint import (
    CheckpointError,
    default_checkpoint_dir,
    default_key_path,
    load_key,
    load_public_key,
    public_key_path,
    read_checkpoints,
    write_checkpoint,
)
from storage.database import DatabaseError, first_line, shown_url
from storage.erase import erase_user
from storage.query import unicode_lower
from storage.retention import MIN_RETENTION, RetentionError, check_cutoff, parse_cutoff, purge
from storage.schema import exchanges
from storage.statements import Signer, read_statements
from storage.verify import ChainReport, Report, verify

EXIT_TAMPERED = 1
EXIT_UNCOVERED = 3  # no tampering found, but records that no checkpoint covers

CHECKPOINT_EXAMPLES = f"""\
Signs the head of every hash chain in the database with the Ed25519 key and writes a
checkpoint file (a key is made, its public half next to it as .pub, only for a folder of
its own). It signs what the database holds, so it first verifies the chains against the
checkpoints and statements already in --dir and refuses to sign over tampering they
reveal. A chain none of them names is left out (whoever can write the database can add
one; exit status 3): name each new chain of yours with --new-chain. Ship the files and
the public key somewhere the database's administrators cannot rewrite.

examples:
  llm-audit checkpoint
  llm-audit checkpoint --dir /srv/audit-checkpoints --key /etc/llm-audit/signing-key.pem
  llm-audit checkpoint --new-chain proxy-b     # a proxy started since the last checkpoint
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


def add_commands(commands: Commands) -> None:
    """Register ``checkpoint``, ``verify``, ``erase`` and ``purge``."""
    p = commands.add("checkpoint", _cmd_checkpoint, "sign the heads of the hash chains", CHECKPOINT_EXAMPLES)
    p.add_argument("--key", type=Path, default=default_key_path(), metavar="FILE", help="the Ed25519 signing key")
    p.add_argument(
        "--dir", type=Path, default=default_checkpoint_dir(), metavar="DIR", help="where checkpoint files go"
    )
    p.add_argument(
        "--new-chain",
        action="append",
        default=[],
        metavar="NAME",
        help="sign this chain though no checkpoint in --dir names it yet (a new proxy of yours); repeatable",
    )

    p = commands.add("verify", _cmd_verify, "check the hash chains for tampering", VERIFY_EXAMPLES)
    p.add_argument("--checkpoints", type=Path, metavar="DIR", help="also compare with the signed checkpoints here")
    p.add_argument(
        "--public-key",
        type=Path,
        metavar="FILE",
        action="append",
        help="a key the checkpoints may be signed with; repeat for several (default: "
        f"{public_key_path(default_key_path())})",
    )
    p.add_argument(
        "--quarantine",
        type=Path,
        metavar="DIR",
        help="look for the proxies' quarantine files here, by name (default: where each proxy kept it)",
    )
    p.add_argument("--format", choices=("text", "json"), default="text")
    # (what it could not read itself is what it cannot name: verify is no answer to that)
    p.set_defaults(unreadable_hint="look at the quarantine and chains tables by hand")

    p = commands.add("erase", _cmd_erase, "erase a user's content, keeping the chains verifiable", ERASE_EXAMPLES)
    p.add_argument("--user", required=True, metavar="ID", help="the user_id whose content is erased")
    _add_signer_options(p, "erasure")

    p = commands.add("purge", _cmd_purge, "delete exchanges that ended before a cut-off", PURGE_EXAMPLES)
    p.add_argument(
        "--older-than",
        required=True,
        metavar="AGE|DATE",
        help="the cut-off: an age (365d, 27w, 12h) or a date (2025-01-31)",
    )
    p.add_argument("--dry-run", action="store_true", help="count what would be deleted; delete and record nothing")
    p.add_argument(
        "--force", action="store_true", help=f"allow a cut-off less than {MIN_RETENTION.days} days (six months) ago"
    )
    p.add_argument(
        "--batch-size",
        type=positive_int,
        default=1000,
        metavar="N",
        help="rows deleted per transaction (default: 1000); smaller batches hold the lock for less time",
    )
    _add_signer_options(p, "purge")
    p.set_defaults(interrupted_note=" (a purge's purge_log row counts what it deleted)")


def _add_signer_options(p: argparse.ArgumentParser, what: str) -> None:
    """``--key`` and ``--dir`` of a command that signs a statement of what it did."""
    p.add_argument(
        "--key",
        type=Path,
        default=default_key_path(),
        metavar="FILE",
        help=f"the Ed25519 key that signs the {what} statement (default: {default_key_path()})",
    )
    p.add_argument(
        "--dir",
        type=Path,
        default=default_checkpoint_dir(),
        metavar="DIR",
        help=f"where the signed {what} statement goes, beside the checkpoints (default: {default_checkpoint_dir()})",
    )


def _signer(args: argparse.Namespace) -> Signer:
    return Signer.load(args.dir, args.key)


def _heads_to_sign(
    db: Engine, args: argparse.Namespace, key: Ed25519PrivateKey
) -> tuple[list[ChainReport], list[ChainReport]]:
    """The chains a checkpoint signs, as ``verify`` checked them, and the ones it leaves out.

    A checkpoint signs what the database holds: never over tampering that ``verify``
    finds, against the checkpoints and statements already in ``--dir`` when it holds
    some, and by the chains alone when it holds none (a new folder signed over a record
    a plain ``verify`` already named). It signs the heads that very check read, not a
    second reading: what was written in between waits for the next checkpoint. In a
    folder that holds checkpoints, a chain none of them names is left out unless named
    with ``--new-chain``: whoever can write the database can add a consistent chain.
    """
    public = key.public_key()
    signed = bool(list(args.dir.glob("checkpoint-*.json"))) if args.dir.is_dir() else False
    report = verify(db, read_checkpoints(args.dir, public), read_statements(args.dir, public)) if signed else verify(db)
    bad = next((chain for chain in report.chains if not chain.ok), None)
    if bad is not None or report.unchained:
        where = f"against the checkpoints in {args.dir} " if signed else ""
        problem = bad.problems[0].line() if bad is not None else report.unchained[0].line()
        chain = f"chain {bad.chain_id}" if bad is not None else "a record in no chain"
        raise CheckpointError(
            f"refusing to sign: {chain} does not verify {where}({problem}); see {PROG} verify"
            + (f" --checkpoints {args.dir}" if signed else "")
        )
    chains = [c for c in report.chains if c.records]
    left_out = [c for c in chains if signed and not c.named and c.chain_id not in args.new_chain]
    return [c for c in chains if c not in left_out], left_out


def _left_out_line(left_out: list[ChainReport], directory: Path) -> str:
    names = ", ".join(f"{c.chain_id!r} (records {c.start}..{c.last.seq})" for c in left_out[:3])
    more = f" and {len(left_out) - 3} more" if len(left_out) > 3 else ""
    return (
        f"no checkpoint in {directory} names chain {names}{more}, and whoever can write the database can add a "
        "chain; if it is a proxy of yours (its llm_audit_instance), sign it with "
        + " ".join(f"--new-chain {shlex.quote(c.chain_id)}" for c in left_out[:3])
    )


def _gained(chain: ChainReport) -> str:
    """The records a checkpoint signs that no earlier one covered, in words ("" for none)."""
    first = max(chain.covered + 1, chain.start)
    if first > chain.last.seq:
        return ""
    return f", record {first} new" if first == chain.last.seq else f", records {first}..{chain.last.seq} new"


def _cmd_checkpoint(args: argparse.Namespace) -> int:
    made = not args.key.exists()
    key = load_key(args.key, args.dir, new_folder_new_key=True)
    with engine(args, existing=True) as db:
        try:
            chains, left_out = _heads_to_sign(db, args, key)
        except SQLAlchemyError as e:
            raise DatabaseError(f"cannot read the chains: {first_line(e)}") from None
    if left_out and not chains:
        raise CheckpointError(f"refusing to sign: {_left_out_line(left_out, args.dir)}")
    try:
        path = write_checkpoint(args.dir, key, {c.chain_id: c.last for c in chains})
    except OSError as e:
        raise CheckpointError(
            f"cannot write a checkpoint in {args.dir} ({e.strerror}); name a writable folder with --dir DIR"
        ) from None
    if made:
        print(f"made a new signing key {args.key} (and {public_key_path(args.key)}), for a new folder")
    # (what each chain gained since its last checkpoint: a chain whose proxy is gone can still be grown)
    signed = "; ".join(f"{c.chain_id} at {c.last.seq}{_gained(c)}" for c in sorted(chains, key=lambda c: c.chain_id))
    print(one_line(f"{path}: {len(chains)} chains signed: {signed}"))  # (chain ids are the database's)
    if left_out:
        warn(f"left out: {_left_out_line(left_out, args.dir)}")
        return EXIT_UNCOVERED
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    checkpoints, statements = [], None
    if args.public_key and args.checkpoints is None:
        raise CheckpointError("--public-key names the key of checkpoints: give them with --checkpoints DIR")
    if args.checkpoints is not None:
        keys = [load_public_key(path) for path in args.public_key or [public_key_path(default_key_path())]]
        checkpoints = read_checkpoints(args.checkpoints, keys)
        statements = read_statements(args.checkpoints, keys)
    with engine(args, existing=True) as db:
        try:
            report = verify(db, checkpoints, statements, args.quarantine)
        except SQLAlchemyError as e:
            raise DatabaseError(f"cannot read the chains: {first_line(e)}") from None
    if args.format == "json":
        _print_json(report, len(checkpoints))
    else:
        _print_verdicts(report)
    if not report.ok:
        return EXIT_TAMPERED
    return 0 if report.covered else EXIT_UNCOVERED


def _print_json(report: Report, checkpoints: int) -> None:
    doc = {
        "ok": report.ok,
        "covered": report.covered,
        "checkpoints": checkpoints,
        "chains": [c.as_dict() for c in report.chains],
        "unchained": [{"id": p.record_id, "detail": p.detail} for p in report.unchained],
        "open_records": report.open_records,
    }
    sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")


def _print_verdicts(report: Report) -> None:
    """One verdict line per chain, then what each chain's records say, then the problems.
    Every line is made visible (:func:`~cli.terminal.one_line`): record and chain ids and
    the details come from the database, whose writer could otherwise print a verdict of
    its own over the real one."""
    lines = [chain.verdict() for chain in report.chains]
    if report.unchained:
        lines.append(f"records in no chain: {len(report.unchained)}{'+' if len(report.unchained) >= 20 else ''}")
    for chain in report.chains:
        lines += [f"  {line}" for line in chain.quarantine_lines()]
        lines += [f"  {chain.chain_id}: {problem.line()}" for problem in chain.problems]
        if chain.ok and (coverage := chain.coverage_line()):
            lines.append(f"  {coverage}")
    lines += [f"  {problem.line()}" for problem in report.unchained]
    if open_line := report.open_line():
        lines.append(open_line)
    if not report.chains and not report.unchained:
        lines.append("no chains: no final records yet")
    for line in lines:
        print(("  " if line.startswith("  ") else "") + one_line(line))


def _cmd_erase(args: argparse.Namespace) -> int:
    if not args.user.strip():
        raise CheckpointError("--user is empty; give the user id whose content is erased")
    with engine(args, existing=True) as db:  # (no database is the first thing to hear of)
        done = erase_user(db, args.user, actor=actor(), signer=_signer(args))
        alike = [] if done.count or done.refused or done.still_open else _ids_alike(db, args.user)
    signed = f", signed in {args.dir}" if done.count else ""
    print(
        one_line(f"erased the content of {done.count} exchanges of user {args.user!r} (logged in erasure_log{signed})")
    )
    if alike:  # (user ids are matched exactly: ANA is not ana)
        print(f"no exchange has the user id {args.user!r}; ids that differ only in case: {', '.join(map(repr, alike))}")
    if done.still_open:
        print(f"{done.still_open} exchanges of the user are still in progress: run this again once they have ended")
    return _refused(done.refused, "the user's records in it were left as they are (those in other chains were erased)")


def _refused(refused: dict[str, str], left: str) -> int:
    """Name what a purge or an erasure left because it does not check; the exit status."""
    for chain_id, problem in refused.items():
        warn(one_line(f"chain {chain_id!r}: {problem}: {left}; see {PROG} verify"))
    return EXIT_TAMPERED if refused else 0


def _ids_alike(db: Engine, user_id: str) -> list[str]:
    """User ids equal to ``user_id`` but for case (a few)."""
    column = exchanges.c.user_id
    with db.connect() as conn:
        folded = unicode_lower(column) == unicode_lower(literal(user_id, Text()))
        found = conn.execute(select(column).where(folded, column != user_id).distinct().limit(5))
        return [one_line(r[0]) for r in found]


def _cmd_purge(args: argparse.Namespace) -> int:
    cutoff = _cutoff(args)
    with engine(args, existing=True) as db:
        signer = None if args.dry_run else _signer(args)
        result = purge(
            db,
            cutoff,
            dry_run=args.dry_run,
            actor=actor(),
            older_than=args.older_than,
            batch_size=args.batch_size,
            signer=signer,
        )
    what = f"exchanges that ended before {result.cutoff.isoformat()} from {shown_url(db.url)}"
    if result.dry_run:
        print(f"would delete {result.count} {what} (dry run: nothing deleted, nothing recorded)")
    else:
        print(f"deleted {result.count} {what} (purge_log id {result.log_id})")
    return _refused(result.refused, "nothing in the chain was purged")


def _cutoff(args: argparse.Namespace) -> datetime:
    """``--older-than`` as a moment, refused when too recent without ``--force``."""
    now = datetime.now(UTC)
    try:
        cutoff = parse_cutoff(args.older_than, now)
    except RetentionError as e:
        raise RetentionError(f"--older-than {e}") from None
    try:
        check_cutoff(cutoff, now, force=args.force)
    except RetentionError as e:
        raise RetentionError(f"{e}; give an older cut-off, or --force to purge anyway") from None
    return cutoff
