"""``llm-audit erase --user ID``: a data subject's content replaced, the chain kept whole.

The content columns (:data:`storage.chain.CONTENT_COLUMNS`: the request body, output
text, output, tool calls, delivered text) of every final exchange of the user become
the erasure marker ``"[erased]"`` (those that were NULL stay NULL; a huge answer's UTF-8
bytes, ``output_text_utf8``, are dropped and its ``output_text`` becomes the marker) and
``erased_at`` is set. Their content hashes stay:
they are what the hash chain holds, so ``llm-audit verify`` still checks every record
and reports erased ones as erased, not tampered. Everything else stays (the user id,
times, model, token counts), so the audit trail shows that exchanges happened and were
erased. Each erasure is recorded in ``erasure_log`` and, given a
:class:`~storage.statements.Signer`, signed (the numbers and hashes of the records erased)
before it commits: ``verify --checkpoints`` accepts an erased record only against such a
statement, so an insider cannot pass a rewrite off as an erasure.

Exchanges still in progress are left alone (they are not final yet; the result counts
them): run the erasure again once they have ended. A record that does not match its hash is left
alone too, and named (:class:`Erasure`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, and_, case, func, insert, literal, select, update
from sqlalchemy.exc import SQLAlchemyError

from storage.chain import CONTENT_COLUMNS, ERASED, STORED_FORMS
from storage.database import DatabaseError, first_line
from storage.schema import IN_PROGRESS, erasure_log, exchanges
from storage.statements import Signer
from storage.verify import prefix_doubt, signed_heads

_IDS_PER_UPDATE = 500  # (SQLite binds at most 32,766 parameters a statement)


@dataclass(frozen=True, slots=True)
class Erasure:
    """What an erasure did, and what it left."""

    count: int  # the exchanges whose content was erased
    # chains whose records of the user were left as they are, each with its first problem:
    # they do not check (:func:`~storage.verify.prefix_doubt`), so nothing is signed there
    refused: dict[str, str] = field(default_factory=dict)
    still_open: int = 0  # the user's exchanges still in progress: erased by a later run


def erase_user(
    engine: Engine, user_id: str, *, actor: str, now: datetime | None = None, signer: Signer | None = None
) -> Erasure:
    """Erase the content of ``user_id``'s final exchanges.

    The user's records must check first (:func:`_doubts`): they are chosen by their user
    id, which whoever can write the database can change (another user's records given
    this id for the erasure and given back after it lost their content under a real
    statement); in a chain where they do not, they are left as they are, and named.
    Exactly the records chosen and signed are erased: one the proxy seals meanwhile
    waits for the next erasure (erased unsigned, ``verify`` would call it tampering)."""
    now = now or datetime.now(UTC)
    c = exchanges.c
    which = (c.user_id == user_id, c.status != IN_PROGRESS, c.erased_at.is_(None))
    heads = signed_heads(signer)
    try:
        with engine.connect() as reading:
            rows = reading.execute(select(c.id, c.chain_id, c.chain_seq, c.record_hash).where(*which))
            chosen = [(r.id, r.chain_id, r.chain_seq, r.record_hash) for r in rows]
            refused = _doubts(reading, chosen, heads)
        chosen = [choice for choice in chosen if choice[1] not in refused]
        with engine.begin() as conn:
            signed = [(chain_id, seq, digest) for _, chain_id, seq, digest in chosen if chain_id is not None]
            if signer is not None and signed:
                signer.erasure(user_id, signed, now)
            ids = [rid for rid, *_ in chosen]
            erased = (
                {name: _erased(name) for name in CONTENT_COLUMNS} | dict.fromkeys(STORED_FORMS) | {"erased_at": now}
            )
            count = sum(
                conn.execute(
                    update(exchanges).where(c.id.in_(ids[i : i + _IDS_PER_UPDATE]), *which).values(erased)
                ).rowcount
                for i in range(0, len(ids), _IDS_PER_UPDATE)
            )
            conn.execute(insert(erasure_log).values(erased_at=now, actor=actor, user_id=user_id, erased_count=count))
            still_open = conn.execute(
                select(func.count()).select_from(exchanges).where(c.user_id == user_id, c.status == IN_PROGRESS)
            ).scalar_one()
    except SQLAlchemyError as e:
        raise DatabaseError(f"cannot erase: {first_line(e)}") from None
    _checkpoint_wal(engine)
    return Erasure(count, refused, still_open)


def _checkpoint_wal(engine: Engine) -> None:
    """On SQLite, copy the write-ahead log into the file and empty it: until then the
    erased content's old pages stay in the main file (a copy of it taken meanwhile holds
    them). Best effort: a reader holding the log open only delays it."""
    if engine.dialect.name != "sqlite":
        return
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    except SQLAlchemyError:
        pass  # (the next checkpoint SQLite makes by itself does the same)


def _doubts(
    conn: Connection, chosen: list[tuple[Any, Any, Any, Any]], heads: dict[str, dict[int, str]]
) -> dict[str, str]:
    """The chains in which the user's records do not check, each with its first problem:
    from the user's first record there up to the first checkpoint head at or past the
    last one (:func:`~storage.verify.prefix_doubt`: each record's hash and links, and the
    head; a user id changed and the records re-sealed after it is caught there)."""
    spans: dict[str, tuple[int, int]] = {}
    for _, chain_id, seq, _ in chosen:
        if chain_id is not None and type(seq) is int:
            low, high = spans.get(chain_id, (seq, seq))
            spans[chain_id] = (min(low, seq), max(high, seq))
    doubts = {}
    for chain_id, (low, high) in spans.items():
        doubt = prefix_doubt(conn, chain_id, low, None, high, heads.get(chain_id, {}))
        if doubt is not None:
            doubts[chain_id] = doubt
    return doubts


def _erased(name: str):
    """The marker in place of a column's content; a column that held nothing, in any of its
    stored forms (:data:`storage.chain.STORED_FORMS`), stays NULL."""
    column = exchanges.c[name]
    forms = [exchanges.c[form] for form, of in STORED_FORMS.items() if of == name]
    empty = and_(column.is_(None), *(form.is_(None) for form in forms))
    return case((empty, None), else_=literal(ERASED, column.type))
