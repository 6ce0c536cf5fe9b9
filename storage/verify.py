"""``llm-audit verify``: recompute every hash chain and compare it with signed checkpoints.

Each chain is read in order (``chain_seq``), streamed, so memory stays flat however long
it is. Each record is checked by itself (its content against its content hashes unless
erased, its fields against its hash), then against its neighbour (its ``prev_hash`` must
be the previous record's hash). What breaks is named:

- ``modified``: a record no longer matches its hash (a field or its content was
  edited), or it was edited and re-hashed (the next record links to a hash no record
  has);
- ``deleted``: numbers are missing in the chain;
- ``inserted``: a record that links past others (those are inserted), two records with
  one number, or a final record in no chain (or at no place in one);
- ``forked``: two records with one number that link to the same record: two writers
  sealed into one chain (two proxies with one instance name, despite the lease of
  :mod:`storage.lease`);
- ``reordered``: a record links to a record that comes after it (records swapped);
- with checkpoints, ``rewritten``: the record at a checkpointed number does not have the
  signed hash (the chain was rebuilt consistently from some point on), and
  ``truncated``: the chain ends before a checkpointed number (its tail was removed).

Records a proxy's checkpoints name as found in the database, not written by it, at its
restart are ``unvouched``.

With checkpoints, records no checkpoint covers are reported, not passed: a chain no
checkpoint names ("no checkpoint signed by a trusted key names this chain") and the
records after a chain's last checkpoint ("not yet covered by a checkpoint: records
N..M").

Purges move a chain's start (recorded in ``chains``): a chain is checked from there.
With the signed statements beside the checkpoints (:mod:`storage.statements`), a start
that no signed purge set, or one a purge inside the retention floor set, is ``purged``
(tampering), and an erased record (whose content must be the erasure marker in any case)
that no signed erasure names is ``modified``.

A gap that records in the ``quarantine`` table fill exactly (their numbers, and their
``prev_hash`` / ``record_hash`` linking with the neighbours) is no tampering: the writer
kept those records in a quarantine file (:mod:`storage.quarantine`), and the report names
them ("record N of chain X is quarantined in FILE: reason") instead.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import ColumnElement, Connection, Engine, String, and_, func, or_, select, type_coerce

from storage.chain import (
    CONTENT_COLUMNS,
    ERASED,
    GENESIS,
    Head,
    check_record,
    content_hash,
    fold_answer_bytes,
    utc_text,
)
from storage.checkpoint import Checkpoint, in_ranges, merged_ranges, read_checkpoints
from storage.quarantine import kept_line
from storage.schema import IN_PROGRESS, chains, exchanges, quarantine
from storage.spool import row_of_line
from storage.statements import MIN_RETENTION, SignedStart, Signer, Statements
from storage.stored import StoredValues

UNREADABLE_KEY = "_unreadable"  # on a row read by verify: the columns whose stored text cannot be decoded

MAX_PROBLEMS = 20  # per chain: the first ones are what matters
MAX_GAP = 10_000  # the longest gap looked up in the quarantine


@dataclass(frozen=True, slots=True)
class Problem:
    kind: str  # modified | deleted | inserted | forked | reordered | rewritten | truncated | purged | unvouched | unerased
    chain_id: str | None
    seq: int | None
    record_id: str | None
    detail: str

    def line(self) -> str:
        where = f"record {self.seq} (id {self.record_id})" if self.record_id else f"at {self.seq}"
        return f"{self.kind}: {where}: {self.detail}" if self.seq is not None else f"{self.kind}: {self.detail}"


@dataclass(slots=True)
class ChainReport:
    chain_id: str
    start: int = 1
    records: int = 0
    erased: int = 0
    last: Head = field(default_factory=Head)
    problems: list[Problem] = field(default_factory=list)
    checkpoints: int = 0  # checkpoints that named this chain and were compared
    signed: bool = False  # checkpoints were given: records they do not cover are reported
    named: bool = False  # a trusted checkpoint names this chain (compared or not: its records may be purged since)
    covered: int = 0  # the last record a matching checkpoint signed
    quarantined: list[dict[str, Any]] = field(default_factory=list)  # quarantine rows that fill gaps
    # why each quarantined record that could not be checked against its file was not (by number)
    unchecked: dict[int, str] = field(default_factory=dict)
    left_by_purge: int = 0  # records before the start an unfinished purge had not yet deleted

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def uncovered(self) -> tuple[int, int] | None:
        """The records no checkpoint covers (first, last), when checkpoints were given."""
        if not self.signed or not self.records or self.last.seq <= self.covered:
            return None
        return max(self.start, self.covered + 1), self.last.seq

    def coverage_line(self) -> str | None:
        """What checkpoints leave uncovered, in words (None: nothing, or no checkpoints given)."""
        span = self.uncovered
        if span is None:
            return None
        records = f"record {span[0]}" if span[0] == span[1] else f"records {span[0]}..{span[1]}"
        if not self.named:
            return f"{self.chain_id}: no checkpoint signed by a trusted key names this chain: {records} are not covered"
        return f"{self.chain_id}: not yet covered by a checkpoint: {records}"

    def add(self, kind: str, seq: int | None, record_id: str | None, detail: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(Problem(kind, self.chain_id, seq, record_id, detail))

    def verdict(self) -> str:
        span = f"records {self.start}..{self.last.seq}" if self.records else "no records"
        extra = f", {self.erased} erased" if self.erased else ""
        extra += f", {len(self.quarantined)} quarantined" if self.quarantined else ""
        extra += f" ({len(self.unchecked)} NOT CHECKED against its file)" if self.unchecked else ""
        extra += f", {self.left_by_purge} before it left by an unfinished purge" if self.left_by_purge else ""
        signed = f", {self.checkpoints} checkpoints matched" if self.checkpoints and self.ok else ""
        if self.ok and self.signed and not self.named and self.records:
            return f"chain {self.chain_id}: NOT SIGNED, {span}{extra}: no checkpoint names it"
        if self.ok:
            return f"chain {self.chain_id}: OK, {span}{extra}{signed}"
        return f"chain {self.chain_id}: TAMPERED, first problem: {self.problems[0].line()}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "chain_id": self.chain_id,
            "ok": self.ok,
            "start_seq": self.start,
            "records": self.records,
            "erased": self.erased,
            "head_seq": self.last.seq,
            "head_hash": self.last.hash,
            "checkpoints_matched": self.checkpoints if self.ok else None,
            "uncovered": dict(zip(("first", "last"), self.uncovered)) if self.uncovered else None,
            "problems": [_problem_dict(p) for p in self.problems],
            "quarantined": [
                {
                    "seq": q["chain_seq"],
                    "id": q["record_id"],
                    "file": q["file"],
                    "reason": q["reason"],
                    "unchecked": self.unchecked.get(q["chain_seq"]),
                }
                for q in self.quarantined
            ],
        }

    def quarantine_lines(self) -> list[str]:
        """One line per quarantined record of the chain, and whether its file vouched for it."""
        return [
            f"record {q['chain_seq']} of chain {self.chain_id} is quarantined in {q['file']}: {q['reason']}"
            + (
                f" (NOT CHECKED: {self.unchecked[q['chain_seq']]})"
                if q["chain_seq"] in self.unchecked
                else " (its file does not match it)"
                if any(p.seq == q["chain_seq"] for p in self.problems)
                else " (checked against the file)"
            )
            for q in self.quarantined
        ]


def _problem_dict(p: Problem) -> dict[str, Any]:
    return {"kind": p.kind, "seq": p.seq, "id": p.record_id, "detail": p.detail}


@dataclass(slots=True)
class Report:
    chains: list[ChainReport]
    unchained: list[Problem]
    open_records: int = 0  # records still open (write-ahead, not sealed: nothing vouches for them yet)
    oldest_open: datetime | None = None

    def open_line(self) -> str | None:
        """The open records, in words (None: there are none). They are exchanges under way
        (or a stopped proxy's, until it starts again): what they hold is not checked."""
        if not self.open_records:
            return None
        since = f"; the oldest began at {self.oldest_open:%Y-%m-%d %H:%M} UTC" if self.oldest_open else ""
        return f"records still open: {self.open_records} (under way, not sealed: not checked{since})"

    @property
    def ok(self) -> bool:
        return not self.unchained and all(c.ok for c in self.chains)

    @property
    def covered(self) -> bool:
        """Every record is covered by a checkpoint (true when none were given), and every
        quarantined record was checked against its quarantine file."""
        return all(c.uncovered is None and not c.unchecked for c in self.chains)


def verify(
    engine: Engine,
    checkpoints: Sequence[Checkpoint] = (),
    statements: Statements | None = None,
    quarantine_dir: Path | None = None,
    only: Collection[str] | None = None,
) -> Report:
    """Check every chain in the database (and every chain a checkpoint names). With
    checkpoints, records none covers are reported (:attr:`ChainReport.uncovered`): an
    insider can add a consistent chain, or records after the last checkpoint, and only
    the signature tells them from the proxy's. With ``statements`` (the signed erasures
    and purges beside the checkpoints), an erased record and a moved chain start must
    each have one. A quarantined record is checked against its quarantine file (found
    where the writer kept it, or by its name in ``quarantine_dir``): :func:`_check_quarantined`.
    ``only``: check these chains alone (a purge or an erasure checks what it signs for)."""
    with engine.connect() as conn:
        c = chains.c  # (not the lease's columns: a time there that cannot be read stopped verify)
        known = {r.chain_id: r for r in conn.execute(select(c.chain_id, *CHAIN_PLACES))}
        # a row a proxy made for its lease before it wrote anything is no chain yet
        ids = {k for k, r in known.items() if chain_place(r) is None or r.head_seq or r.start_seq > 1}
        ids |= {cp_chain for cp in checkpoints for cp_chain in cp.heads}
        ids |= {
            r[0]
            for r in conn.execute(
                select(exchanges.c.chain_id).where(exchanges.c.chain_id.is_not(None)).group_by(exchanges.c.chain_id)
            )
        }
        if only is not None:
            ids &= set(only)
        held = _quarantined_records(conn)
        now = datetime.now(UTC)
        reports = []
        for chain_id in sorted(ids, key=str):  # (a BLOB written as a chain id is no string)
            row = known.get(chain_id)
            place = chain_place(row) if row is not None else (1, GENESIS, 0, GENESIS)
            start, start_prev, head, head_hash = place or (1, GENESIS, 0, GENESIS)
            kept = held.get(chain_id, {})
            report = _verify_chain(conn, chain_id, start, start_prev, checkpoints, kept, statements)
            _before_start(conn, report, start_prev, statements, kept)
            if place is None:
                report.add("modified", None, None, "the chains table's row of this chain cannot be read")
            if statements is not None:
                _check_start(report, start_prev, statements.starts.get(chain_id, []), now)
            if head > report.last.seq and report.ok:
                gap = _fill(kept, report.last.seq + 1, head, report.last.hash, head_hash)
                if gap is None:
                    report.add(
                        "deleted",
                        report.last.seq + 1,
                        None,
                        f"records {report.last.seq + 1}..{head} are "
                        f"missing (the chains table says the chain reached {head})",
                    )
                else:
                    report.quarantined += gap
            _check_quarantined(report, quarantine_dir)
            reports.append(report)
        count, oldest = conn.execute(
            select(func.count(), func.min(type_coerce(exchanges.c.started_at, String))).where(
                exchanges.c.status == IN_PROGRESS
            )
        ).one()
        return Report(reports, _unchained(conn), count, _time_or_none(oldest))


def signed_heads(signer: Signer | None) -> dict[str, dict[int, str]]:
    """Every chain head the checkpoints in the signer's folder signed: {chain: {seq: hash}}
    (none without a signer, or a folder with no checkpoint yet)."""
    folder = signer.directory if signer is not None else None
    if signer is None or folder is None or not folder.is_dir() or not any(folder.glob("checkpoint-*.json")):
        return {}
    heads: dict[str, dict[int, str]] = {}
    for checkpoint in read_checkpoints(folder, signer.key.public_key()):
        for chain_id, head in checkpoint.heads.items():
            heads.setdefault(chain_id, {})[head.seq] = head.hash
    return heads


def prefix_doubt(
    conn: Connection, chain_id: str, start: int, start_prev: str | None, last: int, heads: dict[int, str]
) -> str | None:
    """Why the records ``start..last`` of a chain must not be purged (or erased), or None.
    ``start_prev``: what record ``start`` must link to (None: its link is not checked,
    the records before it are gone).

    A purge deletes what the database calls old, and whoever can write it could have
    made young records look so: the tampering would go with them, under a real signed
    statement. So each record to be deleted must match its hash and link to the one
    before it (a gap only where the quarantine holds the records missing), and so must
    the records after them up to the first head a checkpoint in the purge's folder
    signed at or past ``last``, which must be that head (a prefix rewritten consistently,
    hashes and all, rewrites every record after it). Problems elsewhere in the chain
    (records past that checkpoint, a start moved under another key) are ``verify``'s to
    report; they do not keep these records from their retention."""
    c = exchanges.c
    kept = _quarantined_records(conn).get(chain_id, {})
    expected, prev = start, start_prev
    through = min((seq for seq in heads if seq >= last), default=last)
    where = and_(c.chain_id == chain_id, c.chain_seq >= start, c.chain_seq <= through)
    for row in stored_records(conn, where, c.chain_seq, c.id):
        seq = row["chain_seq"]
        if (problem := record_problem(row)) is not None:
            return f"record {seq} (id {row['id']}): {problem}"
        if seq != expected and (
            seq < expected or prev is None or _fill(kept, expected, seq - 1, prev, row["prev_hash"]) is None
        ):
            return f"record {seq} (id {row['id']}): records {expected}..{seq - 1} are missing, or it is there twice"
        if seq == expected and prev is not None and row["prev_hash"] != prev:
            return f"record {seq} (id {row['id']}) does not link to the record before it"
        if seq in heads and heads[seq] != row["record_hash"]:
            return f"record {seq} (id {row['id']}) is not the record a checkpoint signed at its number"
        expected, prev = seq + 1, row["record_hash"]
    if expected <= through and (prev is None or _fill(kept, expected, through, prev, heads.get(through)) is None):
        return f"records {expected}..{through} are missing (a checkpoint signed the chain up to {through})"
    return None


#: How far ahead of ``verify``'s own clock a signed statement may be dated (clocks differ).
CLOCK_TOLERANCE = timedelta(hours=1)

CHAIN_PLACES = (chains.c.start_seq, chains.c.start_prev_hash, chains.c.head_seq, chains.c.head_hash)


def chain_place(row: Any) -> tuple[int, str, int, str] | None:
    """A ``chains`` row's start and head, or None when they are not what the writer writes."""
    start, start_prev, head, head_hash = row.start_seq, row.start_prev_hash, row.head_seq, row.head_hash
    if type(start) is int and type(head) is int and isinstance(start_prev, str) and isinstance(head_hash, str):
        return start, start_prev, head, head_hash
    return None


def _time_or_none(value: Any) -> datetime | None:
    """A stored time read as text (whatever a database writer put there), or None."""
    if isinstance(value, datetime) or value is None:
        return value
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        return None


def _unchained(conn: Connection) -> list[Problem]:
    """Final records in no chain, or at no place in one (no number, or one below 1, which
    no chain's walk reads): every final record is sealed in its place, so these were put
    there by hand; ``list`` and ``show`` would show them."""
    c = exchanges.c
    outside = or_(c.chain_id.is_(None), c.chain_seq.is_(None), c.chain_seq < 1)
    rows = conn.execute(select(c.id).where(outside, c.status != IN_PROGRESS).limit(MAX_PROBLEMS)).all()
    return [Problem("inserted", None, None, r.id, f"final record {r.id} is in no chain") for r in rows]


def _quarantined_records(conn: Connection) -> dict[str, dict[int, dict[str, Any]]]:
    """The quarantine table's records with a known place: {chain: {seq: row}}."""
    q = quarantine.c
    found: dict[str, dict[int, dict[str, Any]]] = {}
    wanted = (q.file, q.sha256, q.reason, q.chain_id, q.chain_seq, q.prev_hash, q.record_hash, q.record_id)
    for row in conn.execute(  # (not its time: one that cannot be read stopped verify)
        select(*wanted).where(q.chain_id.is_not(None), q.chain_seq.is_not(None)).order_by(q.id)
    ).mappings():
        found.setdefault(row["chain_id"], {})[row["chain_seq"]] = dict(row)
    return found


def _fill(kept: dict[int, dict[str, Any]], first: int, last: int, prev: str, after: str | None) -> list | None:
    """The quarantined records ``first..last`` when they fill the gap exactly: each one there,
    linking to ``prev`` and to each other, the last being what ``after`` links to (the last
    one's own hash may be lost with the end of its torn line); else None."""
    if not kept or last - first >= MAX_GAP:
        return None
    records = [kept.get(seq) for seq in range(first, last + 1)]
    link: str | None = prev
    for record in records:
        if record is None or record["prev_hash"] != link:
            return None
        # a line torn before its record_hash: what the next record links to stands for it
        link = record["record_hash"] or (after if record is records[-1] else None)
        if link is None:
            return None
    return records if after is None or link == after else None


def _checked(row: dict[str, Any]) -> str | None:
    """:func:`~storage.chain.check_record`, whose hashing a stored value of a type the
    writer never writes (a database writer's doing) must not stop: it is named instead."""
    try:
        return check_record(row)
    except (KeyError, TypeError, ValueError) as e:
        return f"its stored values cannot be hashed ({type(e).__name__}: {str(e)[:120]})"


def _check_quarantined(report: ChainReport, directory: Path | None) -> None:
    """Each record the ``quarantine`` table says fills a gap, against the line its file
    keeps. The table is as writable as the records: a row copied from a record's
    neighbours' hashes would hide the record's deletion. A file that holds the entry but
    a different line, or a line of another record, is ``modified``; one that cannot be
    read here, does not hold the entry, or holds a line that cannot be read back whole
    (torn by a crash, or a row reduced past its hash) leaves the record unchecked (the
    report is not covered: exit 3), never passed."""
    for q in report.quarantined:
        seq = q["chain_seq"]
        try:  # (the path is the table's: any text a database writer put there)
            path = Path(str(q["file"])) if directory is None else directory / Path(str(q["file"])).name
            line = kept_line(path, str(q["sha256"]))
        except (OSError, ValueError) as e:  # (ValueError: a NUL in the path)
            why = getattr(e, "strerror", None) or e
            report.unchecked[seq] = (
                f"{q['file']} cannot be read here ({why}); run verify where it is, or name its folder with --quarantine DIR"
            )
            continue
        if line is None:
            report.unchecked[seq] = f"{path} holds no such entry"
        elif hashlib.sha256(line).hexdigest() != q["sha256"]:
            report.add("modified", seq, q["record_id"], f"its line in the quarantine file {path} was changed")
        elif (contradiction := _quarantined_row_problem(line, q)) is not None:
            modified, why = contradiction
            if modified:
                report.add("modified", seq, q["record_id"], why)
            else:
                report.unchecked[seq] = why


def _quarantined_row_problem(line: bytes, q: dict[str, Any]) -> tuple[bool, str] | None:
    """Why a quarantined line does not vouch for its record, and whether that is tampering
    (it contradicts the quarantine row) rather than a line that cannot be checked; None
    when it vouches."""
    try:
        row = row_of_line(line)
    except (ValueError, TypeError):
        return False, "its line cannot be read back as a record (torn or reduced): its content cannot be checked"
    placed = {k: row.get(k) for k in ("chain_id", "chain_seq", "prev_hash", "record_hash")}
    if placed != {k: q[k] for k in placed}:
        return True, "the quarantine table places a record its file's line is not"
    problem = _checked(row)
    return (
        None if problem is None else (False, f"its line does not hash to its record ({problem}): it cannot be checked")
    )


def _rows(conn: Connection, chain_id: str, start: int) -> Iterator[dict[str, Any]]:
    """The chain's records from its start (a purge in progress may have left older ones)."""
    c = exchanges.c
    return stored_records(conn, and_(c.chain_id == chain_id, c.chain_seq >= start), c.chain_seq, c.id)


def stored_records(
    conn: Connection, where: ColumnElement[bool], *order: ColumnElement[Any]
) -> Iterator[dict[str, Any]]:
    """Whole records of ``exchanges`` as ``verify`` reads them, for :func:`record_problem`.

    Read as :class:`~storage.stored.StoredValues` reads them, strictly: on SQLite, a
    value that cannot be read, or that SQL reads otherwise than the hash does, is
    tampering with that record (``UNREADABLE_KEY`` names it), not a failure of
    ``verify``. A huge answer is read from its bytes (:func:`storage.chain.fold_answer_bytes`).
    """
    stored = StoredValues(conn.dialect, exchanges.columns)
    result = conn.execution_options(stream_results=True, yield_per=1000).execute(
        select(*stored.select(exchanges.columns)).where(where).order_by(*order)
    )
    for row in result.mappings():
        record = dict(row)
        problems = [problem] if (problem := fold_answer_bytes(record, stored.sqlite)) is not None else []
        problems += stored.decode(record, strict=True)
        if stored.sqlite and type(record.get("request_body")) in (int, float):
            record["request_body"] = _as_sealed(record["request_body"], record.get("content_hashes"))
        if problems:
            record[UNREADABLE_KEY] = problems
        yield record


def record_problem(row: dict[str, Any], statements: Statements | None = None) -> str | None:
    """What is wrong with a sealed record of :func:`stored_records` by itself, against
    its own hashes (the chain's links are checked apart), or None."""
    if UNREADABLE_KEY in row:
        return f"stored values cannot be read as the writer wrote them ({', '.join(row[UNREADABLE_KEY])})"
    problem = _checked(row)
    if problem is None and row["erased_at"] is not None:
        problem = _erasure_problem(row, statements)
    return problem


def _unerased(row: dict[str, Any], statements: Statements | None) -> str | None:
    """The user a signed erasure statement erased ``row`` as, when the record is not
    erased (its content back: a backup from before the erasure restored); else None."""
    if statements is None or row["erased_at"] is not None:
        return None
    signed = statements.erased.get(row["chain_id"], {}).get(row["chain_seq"])
    return signed[1] if signed is not None and signed[0] == row["record_hash"] else None


def _as_sealed(number: float, hashes: Any) -> float:
    """A request body SQLite's column affinity turned into a number, as it was sealed: a
    client's body ``1.0`` was stored as the integer 1 (and ``2**63`` as a real) until
    stop 50, and SQL reads the same number either way, so the form the record's hash
    names is taken: such a record is no tampering."""
    sealed = hashes.get("request_body") if isinstance(hashes, dict) else None
    forms = [number, float(number)] if type(number) is int else [number]
    if type(number) is float and number.is_integer():
        forms.append(int(number))
    return next((form for form in forms if content_hash(form) == sealed), number)


def _verify_chain(
    conn: Connection,
    chain_id: str,
    start: int,
    start_prev: str,
    checkpoints: Sequence[Checkpoint],
    kept: dict[int, dict[str, Any]],
    statements: Statements | None,
) -> ChainReport:
    report = ChainReport(chain_id, start=start, last=Head(start - 1, start_prev), signed=bool(checkpoints))
    signed = [(cp, cp.heads[chain_id]) for cp in checkpoints if chain_id in cp.heads]
    report.named = bool(signed)
    wanted = {head.seq for _, head in signed}
    seen: dict[int, str] = {}  # record hashes at checkpointed numbers
    expected, prev, parent = start, start_prev, None  # parent: what the last record links to
    for row in _rows(conn, chain_id, start):
        seq, rid = row["chain_seq"], row["id"]
        if type(seq) is not int:  # (SQLite keeps any value in any column)
            report.add("modified", None, rid, f"its number in the chain, {str(seq)[:40]!r}, is no number")
            continue
        if problem := record_problem(row, statements):
            report.add("modified", seq, rid, problem)
        elif (erased_as := _unerased(row, statements)) is not None:
            report.add(
                "unerased",
                seq,
                rid,
                f"a signed erasure statement erased it (user {erased_as!r}), but its content is here: a backup from "
                "before the erasure restored? run llm-audit erase for that user again",
            )
        if seq < expected:
            if seq == expected - 1 and row["prev_hash"] == parent:
                report.add(
                    "forked",
                    seq,
                    rid,
                    f"a second record numbered {seq} links to the same record as the "
                    f"first: two writers sealed into this chain from record {seq} on (two proxies with one "
                    "llm_audit_instance?)",
                )
            else:
                report.add("inserted", seq, rid, f"a second record numbered {seq}")
            continue
        if seq > expected:
            gap = _fill(kept, expected, seq - 1, prev, row["prev_hash"])
            if gap is None:
                missing = f"{expected}" if seq == expected + 1 else f"{expected}..{seq - 1}"
                report.add("deleted", expected, None, f"records {missing} are missing from the chain")
            else:
                report.quarantined += gap
        elif row["prev_hash"] != prev:
            _broken_link(conn, report, chain_id, row)
        if seq in wanted:
            seen.setdefault(seq, row["record_hash"])
        report.records += 1
        report.erased += row["erased_at"] is not None
        report.last = Head(seq, row["record_hash"])
        expected, prev, parent = seq + 1, row["record_hash"], row["prev_hash"]
    _compare_checkpoints(report, signed, seen)
    _unvouched(report, checkpoints)
    _signed_quarantines(report, checkpoints)
    return report


def _before_start(
    conn: Connection,
    report: ChainReport,
    start_prev: str,
    statements: Statements | None,
    kept: dict[int, dict[str, Any]],
) -> None:
    """The records numbered before the chain's start, which ``list`` and ``show`` still
    show. A purge moves the start first and deletes in batches, so one that did not
    finish leaves records it had not reached: they link back from the start, each to the
    one before (no other text has their hashes; one the writer quarantined links back
    from the ``quarantine`` table, ``kept``), and are checked as records. Any other
    is no record of this chain (one planted where a check from the start never looked,
    by whoever can insert a row: on PostgreSQL, the proxy's own role): **inserted**."""
    if report.start <= 1:
        return
    c = exchanges.c
    expected, link = report.start - 1, start_prev
    where = and_(c.chain_id == report.chain_id, c.chain_seq < report.start)
    for row in stored_records(conn, where, c.chain_seq.desc(), c.id):
        seq, rid = row["chain_seq"], row["id"]
        while type(seq) is int and seq < expected and kept.get(expected, {}).get("record_hash") == link:
            report.quarantined.append(kept[expected])  # (checked against its file, as a gap's are)
            expected, link = expected - 1, kept[expected]["prev_hash"]
        if seq == expected and row["record_hash"] == link:
            if problem := record_problem(row, statements):
                report.add("modified", seq, rid, problem)
            report.left_by_purge += 1
            expected, link = seq - 1, row["prev_hash"]
        else:
            report.add(
                "inserted",
                seq,
                rid,
                f"it is numbered before the chain's start, record {report.start}, and does not link back to it "
                "(the records before the start were purged)",
            )


def _signed_quarantines(report: ChainReport, checkpoints: Sequence[Checkpoint]) -> None:
    """Each record the ``quarantine`` table says fills a gap, against what the proxies'
    checkpoints say they set aside (``runs``, :class:`~storage.checkpoint.Checkpointer`).

    A proxy sets a record of its run aside (quarantined, or held while the quarantine
    file could not be written) before it commits any later one, so a checkpoint of a
    head at or past a record it sealed names the record if it was not written: one it
    does not name, the table's row is a cover for a deletion (whoever
    can write the records can write that table). A record no checkpoint speaks of (sealed
    before them, or by a run that signed none since) is left to its file
    (:func:`_check_quarantined`), as is one they name (its hashes must still link its
    neighbours, :func:`_fill`)."""
    chain = report.chain_id
    runs = [(cp, cp.runs[chain], cp.heads[chain]) for cp in checkpoints if chain in cp.runs and chain in cp.heads]
    if not runs:
        return
    named = merged_ranges(span for _, run, _ in runs for span in run.set_aside)
    kept = []
    for q in report.quarantined:
        seq = q["chain_seq"]
        cover = next(((cp, run, head) for cp, run, head in runs if run.since <= seq <= head.seq), None)
        if in_ranges(named, seq) or cover is None:
            kept.append(q)
            continue
        cp, run, head = cover
        report.add(
            "deleted",
            seq,
            q["record_id"],
            f"the quarantine table says it was quarantined, but checkpoint {cp.path.name}, signed by the proxy "
            f"that sealed records {run.since}..{head.seq}, names no such quarantine",
        )
    report.quarantined = kept


def _unvouched(report: ChainReport, checkpoints: Sequence[Checkpoint]) -> None:
    """Records a proxy found at the end of its chain at start without having written them
    (its checkpoints name them): never taken as covered."""
    spans: dict[tuple[int, int], Checkpoint] = {}
    for cp in checkpoints:
        if report.chain_id in cp.unvouched:
            spans.setdefault(cp.unvouched[report.chain_id], cp)
    for (first, last), cp in sorted(spans.items()):
        if last < report.start:
            continue  # purged since
        records = f"record {first} was" if first == last else f"records {first}..{last} were"
        report.add(
            "unvouched",
            first,
            None,
            f"{records} in the database when the proxy restarted, but it had "
            f"not written them (checkpoint {cp.path.name} says so): forged while it was stopped, or "
            "committed just before a crash",
        )


def _erasure_problem(row: dict[str, Any], statements: Statements | None) -> str | None:
    """What is wrong with an erased record: content other than the erasure marker, or
    (with signed statements) no statement that erased this record, by number and hash,
    as the record of the user it names (a user id changed for the erasure and put back
    after it made another user's content go under a real statement)."""
    changed = [
        name
        for name in CONTENT_COLUMNS
        if row.get(name) not in (ERASED, None)
        or (row.get(name) is None and row["content_hashes"].get(name) != content_hash(None))
    ]
    if changed:
        return f"it is marked erased, but its content ({', '.join(changed)}) is not the erasure marker"
    if statements is None:
        return None
    signed = statements.erased.get(row["chain_id"], {}).get(row["chain_seq"])
    if signed is None or signed[0] != row["record_hash"]:
        return "it is marked erased, but no signed erasure statement names it"
    if signed[1] != row["user_id"]:
        return f"a signed erasure statement erased it as user {signed[1]!r}'s, but it is {row['user_id']!r}'s"
    return None


def _check_start(report: ChainReport, start_prev: str, signed: list[SignedStart], now: datetime) -> None:
    """A chain that begins after record 1 lost its first records: only a signed purge may
    have moved its start there. Every signed purge of the chain is judged, not only the
    one that set today's start (a later purge would hide a forced one): one whose cut-off
    lies inside the retention floor of its own time (a ``--force`` purge), or that is
    dated after this check's own time (its cut-off came from a clock running ahead, and
    may be as far ahead: young records purged as old), is reported."""
    if report.start > 1 and not any((s.seq, s.prev_hash) == (report.start, start_prev) for s in signed):
        report.add(
            "purged",
            report.start,
            None,
            f"the chain starts at record {report.start}, but no signed purge "
            f"statement moved its start there: records {1 if report.start == 2 else f'1..{report.start - 1}'} "
            "were removed",
        )
    ahead = utc_text(now + CLOCK_TOLERANCE)
    for s in signed:
        if _inside_floor(s):
            report.add(
                "purged",
                s.seq,
                None,
                f"purge statement {s.file} ({s.created_at}) removed "
                f"records that ended after {s.cutoff}, inside the {MIN_RETENTION.days}-day retention floor",
            )
        elif s.created_at > ahead:
            report.add(
                "purged",
                s.seq,
                None,
                f"purge statement {s.file} is dated {s.created_at}, after this check's own time: the clock that "
                f"chose its cut-off {s.cutoff} ran ahead, and records younger than the floor may be gone",
            )


def _inside_floor(start: SignedStart) -> bool:
    """Whether a purge's cut-off lies within the retention floor of its own time (compared
    by subtraction: a cut-off near year 9999 plus the floor is no date)."""
    try:
        return datetime.fromisoformat(start.cutoff) > datetime.fromisoformat(start.created_at) - MIN_RETENTION
    except (OverflowError, ValueError):  # (signed within the floor of year 1, or no time: judged inside)
        return True


def _broken_link(conn: Connection, report: ChainReport, chain_id: str, row: dict[str, Any]) -> None:
    """A record that does not link to the one before it: find what it links to."""
    seq, rid = row["chain_seq"], row["id"]
    c = exchanges.c
    target = conn.execute(
        select(func.min(c.chain_seq)).where(c.chain_id == chain_id, c.record_hash == row["prev_hash"])
    ).scalar()
    if target is None:
        report.add(
            "modified",
            seq - 1,
            None,
            f"record {seq} links to a hash no record has: record {seq - 1} was changed and re-hashed",
        )
    elif target > seq:
        report.add("reordered", seq, rid, f"it links to record {target}, which comes after it")
    else:
        inserted = f"{target + 1}" if target + 1 == seq - 1 else f"{target + 1}..{seq - 1}"
        report.add(
            "inserted", target + 1, None, f"record {seq} links to record {target}: records {inserted} were inserted"
        )


def _compare_checkpoints(report: ChainReport, signed: list[tuple[Checkpoint, Head]], seen: dict[int, str]) -> None:
    for checkpoint, head in signed:
        if head.seq < report.start:
            continue  # purged since
        if head.seq > report.last.seq:
            report.add(
                "truncated",
                report.last.seq + 1,
                None,
                f"the chain ends at record {report.last.seq}, but checkpoint {checkpoint.path.name} "
                f"({checkpoint.created_at}) signed record {head.seq}: the records after "
                f"{report.last.seq} were removed",
            )
            return
        if seen.get(head.seq) != head.hash:
            report.add(
                "rewritten",
                head.seq,
                None,
                f"record {head.seq} differs from checkpoint {checkpoint.path.name} "
                f"({checkpoint.created_at}): the chain was rewritten at or before record {head.seq}",
            )
            return
        report.checkpoints += 1
        report.covered = max(report.covered, head.seq)
