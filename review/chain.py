"""One exchange's place in its hash chain, and whether it verifies there.

What ``llm-audit verify`` checks for a whole chain (:mod:`storage.verify`), checked for
one record: the record against its own hashes (:func:`storage.chain.check_record`: its
content, unless erased, and its fields), and its two links: its ``prev_hash`` is the
hash of the record numbered before it (or the chain's recorded start after a purge),
and the record after it links to its hash. Signed checkpoints, which show that a chain
was not rebuilt wholesale, are ``llm-audit verify``'s: the page says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select

from storage.chain import GENESIS, check_record, fold_answer_bytes, is_sealed
from storage.schema import ANSWER_BYTES, IN_PROGRESS, chains, exchanges


@dataclass(frozen=True)
class Place:
    """Where a record is in its chain and what checking it found (``problems`` empty: it verifies)."""

    sealed: bool
    chain_id: str | None = None
    seq: int | None = None
    prev_hash: str | None = None
    record_hash: str | None = None
    problems: tuple[str, ...] = ()
    note: str = ""

    @property
    def verifies(self) -> bool:
        return self.sealed and not self.problems


def _stored_answer(conn: Connection, record: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """``record`` with its answer as ``verify`` reads it (a huge one from its UTF-8 bytes on
    SQLite, not the view's reading), and what is wrong with the stored form: the page and
    ``verify`` judge the same values."""
    c = exchanges.c
    stored = conn.execute(select(c.output_text, c[ANSWER_BYTES]).where(c.id == record.get("id"))).mappings().first()
    if stored is None:
        return record, None
    answer = dict(stored)
    problem = fold_answer_bytes(answer, conn.dialect.name == "sqlite")
    return record | {"output_text": answer["output_text"]}, problem


def place(conn: Connection, record: dict[str, Any]) -> Place:
    """The chain position of ``record`` (a whole row of ``exchanges``) and what checking it found."""
    if not is_sealed(record):
        note = (
            "still in progress: a record joins its chain when it ends"
            if record.get("status") == IN_PROGRESS
            else "in no hash chain: nothing vouches for this final record (llm-audit verify reports it as inserted)"
        )
        return Place(sealed=False, note=note, problems=() if record.get("status") == IN_PROGRESS else (note,))
    chain_id, seq = record.get("chain_id"), record.get("chain_seq")
    problems: list[str] = []
    record, problem = _stored_answer(conn, record)
    if problem is not None:
        problems.append(f"its stored answer cannot be read: {problem}")
    try:
        if (problem := check_record(record)) is not None:
            problems.append(f"this record does not match its hash: {problem}")
    except (KeyError, TypeError, ValueError) as e:  # values of a shape the writer never stores
        problems.append(f"this record's stored values cannot be hashed ({type(e).__name__})")
    if not isinstance(seq, int) or not chain_id:
        problems.append("its chain id or number is missing")
        return Place(True, chain_id, seq, record.get("prev_hash"), record.get("record_hash"), tuple(problems))
    c = exchanges.c
    start = conn.execute(
        select(chains.c.start_seq, chains.c.start_prev_hash).where(chains.c.chain_id == chain_id)
    ).first()
    start_seq, start_prev = (start.start_seq, start.start_prev_hash) if start else (1, GENESIS)
    if seq <= start_seq:
        if record.get("prev_hash") != start_prev:
            problems.append("it does not link to where its chain starts")
    else:
        before = (
            conn.execute(select(c.record_hash).where(c.chain_id == chain_id, c.chain_seq == seq - 1).limit(2))
            .scalars()
            .all()
        )
        if not before:
            problems.append(f"record {seq - 1} of the chain is missing (purged, quarantined or deleted)")
        elif record.get("prev_hash") not in before:
            problems.append(f"it does not link to record {seq - 1}: a record was changed, inserted or removed")
    after = (
        conn.execute(select(c.prev_hash).where(c.chain_id == chain_id, c.chain_seq == seq + 1).limit(2)).scalars().all()
    )
    if after and record.get("record_hash") not in after:
        problems.append(f"record {seq + 1} does not link to it: this record was changed and re-hashed")
    note = "" if after else "the newest record of its chain so far"
    return Place(True, chain_id, seq, record.get("prev_hash"), record.get("record_hash"), tuple(problems), note)
