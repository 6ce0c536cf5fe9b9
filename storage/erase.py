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

Exchanges still in progress are left alone (they are not final yet); run the erasure
again once they have ended.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import Engine, and_, case, insert, literal, select, update
from sqlalchemy.exc import SQLAlchemyError

from storage.chain import CONTENT_COLUMNS, ERASED, STORED_FORMS
from storage.database import DatabaseError, first_line
from storage.schema import IN_PROGRESS, erasure_log, exchanges
from storage.statements import Signer


def erase_user(
    engine: Engine, user_id: str, *, actor: str, now: datetime | None = None, signer: Signer | None = None
) -> int:
    """Erase the content of ``user_id``'s final exchanges; how many were erased."""
    now = now or datetime.now(UTC)
    c = exchanges.c
    which = (c.user_id == user_id, c.status != IN_PROGRESS, c.erased_at.is_(None))
    try:
        with engine.begin() as conn:
            if signer is not None:
                records = conn.execute(
                    select(c.chain_id, c.chain_seq, c.record_hash)
                    .where(*which, c.chain_id.is_not(None))
                    .with_for_update()
                ).all()
                if records:
                    signer.erasure(user_id, [tuple(r) for r in records], now)
            count = conn.execute(
                update(exchanges)
                .where(*which)
                .values(
                    {name: _erased(name) for name in CONTENT_COLUMNS} | dict.fromkeys(STORED_FORMS) | {"erased_at": now}
                )
            ).rowcount
            conn.execute(insert(erasure_log).values(erased_at=now, actor=actor, user_id=user_id, erased_count=count))
    except SQLAlchemyError as e:
        raise DatabaseError(f"cannot erase: {first_line(e)}") from None
    return count


def _erased(name: str):
    """The marker in place of a column's content; a column that held nothing, in any of its
    stored forms (:data:`storage.chain.STORED_FORMS`), stays NULL."""
    column = exchanges.c[name]
    forms = [exchanges.c[form] for form, of in STORED_FORMS.items() if of == name]
    empty = and_(column.is_(None), *(form.is_(None) for form in forms))
    return case((empty, None), else_=literal(ERASED, column.type))
