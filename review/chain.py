"""One exchange's place in its hash chain, and whether it verifies there.

What ``llm-audit verify`` checks for a whole chain (:mod:`storage.verify`), checked for
one record: the record, read as ``verify`` reads it, against its own hashes
(:func:`storage.verify.record_problem`: its content, unless erased, and its fields), and its two links: its ``prev_hash`` is the
hash of the record numbered before it (or the chain's recorded start after a purge),
and the record after it links to its hash. Signed checkpoints, which show that a chain
was not rebuilt wholesale, are ``llm-audit verify``'s: the page says so.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Connection, select

from storage.chain import GENESIS, is_sealed
from storage.schema import IN_PROGRESS, chains, exchanges
from storage.verify import CHAIN_PLACES, chain_place, record_problem, stored_records


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


def place(conn: Connection, record: dict[str, Any]) -> Place:
    """The chain position of ``record`` (a whole row of ``exchanges``) and what checking it found."""
    if not is_sealed(record):
        note = (
            "still in progress: a record joins its chain when it ends"
            if record.get("status") == IN_PROGRESS
            else "in no hash chain: nothing vouches for this final record (llm-audit verify reports it as inserted)"
        )
        return Place(sealed=False, note=note, problems=() if record.get("status") == IN_PROGRESS else (note,))
    # Checked as verify checks it: read again strictly, as stored (the page's reading shows
    # a value SQL reads otherwise, such as a JSON key held twice, as the hash reads it).
    record = next(stored_records(conn, exchanges.c.id == record.get("id")), record)
    chain_id, seq = record.get("chain_id"), record.get("chain_seq")
    problems: list[str] = []
    if (problem := record_problem(record)) is not None:
        problems.append(f"this record does not match its hash: {problem}")
    here = Place(True, chain_id, seq, record.get("prev_hash"), record.get("record_hash"))
    if not isinstance(seq, int) or not chain_id or not 1 <= seq < 2**63 - 1:
        problems.append("it has no place in a chain: its chain id or number is missing or out of range")
        return replace(here, problems=tuple(problems))
    c = exchanges.c
    row = conn.execute(select(*CHAIN_PLACES).where(chains.c.chain_id == chain_id)).first()
    start = (1, GENESIS) if row is None else chain_place(row)
    if start is None:  # (values of other types: verify names them too)
        problems.append("the chains table's row of its chain cannot be read")
        return replace(here, problems=tuple(problems))
    start_seq, start_prev = start[:2]
    if seq < start_seq:
        problems.append(f"it is numbered before its chain's start, record {start_seq} (purged, or put there by hand)")
    elif seq == start_seq:
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
    return replace(here, problems=tuple(problems), note=note)
