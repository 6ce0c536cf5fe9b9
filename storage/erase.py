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

from sqlalchemy import Engine, and_, case, func, insert, literal, select, update
from sqlalchemy.exc import SQLAlchemyError

from storage.chain import CONTENT_COLUMNS, ERASED, STORED_FORMS
from storage.database import DatabaseError, first_line
from storage.schema import IN_PROGRESS, erasure_log, exchanges
from storage.statements import Signer
from storage.verify import record_doubt, signed_heads, stored_records

_IDS_PER_UPDATE = 500  # (SQLite binds at most 32,766 parameters a statement)


@dataclass(frozen=True, slots=True)
class Erasure:
    """What an erasure did, and what it left."""

    count: int  # the exchanges whose content was erased
    # records of the user left as they are, by chain, the first one's problem: they do not
    # match their hash, or a checkpoint (:func:`~storage.verify.record_doubt`): nothing signed
    refused: dict[str, str] = field(default_factory=dict)
    still_open: int = 0  # the user's exchanges still in progress: erased by a later run


def erase_user(
    engine: Engine, user_id: str, *, actor: str, now: datetime | None = None, signer: Signer | None = None
) -> Erasure:
    """Erase the content of ``user_id``'s final exchanges.

    Each record must check first (:func:`~storage.verify.record_doubt`): the records are
    chosen by their user id, which whoever can write the database can change (another
    user's records given this id for the erasure and given back after it lost their
    content under a real statement); one that does not is left as it is, and named.
    Exactly the records chosen and signed are erased: one the proxy seals meanwhile
    waits for the next erasure (erased unsigned, ``verify`` would call it tampering)."""
    now = now or datetime.now(UTC)
    c = exchanges.c
    which = (c.user_id == user_id, c.status != IN_PROGRESS, c.erased_at.is_(None))
    heads = signed_heads(signer)
    refused: dict[str, str] = {}
    try:
        chosen = []
        with engine.connect() as reading:  # (streamed: its options would stay on a connection that writes)
            for row in stored_records(reading, and_(*which), c.chain_id, c.chain_seq):
                chain_id = row["chain_id"]
                doubt = record_doubt(row, heads.get(chain_id, {})) if chain_id is not None else None
                if doubt is None:
                    chosen.append((row["id"], chain_id, row["chain_seq"], row["record_hash"]))
                elif chain_id not in refused:
                    refused[chain_id] = f"record {row['chain_seq']} (id {row['id']}): {doubt}"
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


def _erased(name: str):
    """The marker in place of a column's content; a column that held nothing, in any of its
    stored forms (:data:`storage.chain.STORED_FORMS`), stays NULL."""
    column = exchanges.c[name]
    forms = [exchanges.c[form] for form, of in STORED_FORMS.items() if of == name]
    empty = and_(column.is_(None), *(form.is_(None) for form in forms))
    return case((empty, None), else_=literal(ERASED, column.type))
