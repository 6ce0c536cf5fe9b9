"""What the exchanges in the audit database used, for budgets (:mod:`addon.filters.budgets`).

One query, whatever the number of budgets: the final rows that started in a time range,
summed per (user, key fingerprint, requested model, provider); each budget then sums
the combinations in its scope. The range makes it an index range scan on
``ix_exchanges_started_at``, and the caller keeps the range short (one day at most per
refresh: :mod:`addon.mitm.budgets`). Rows still ``in_progress`` have used nothing yet.

The rows one proxy instance recorded since a given time (its budget book's epoch) can be
left out: that proxy counts them itself as it records them, so they are neither missed
while its writer still holds them nor counted twice once written.
"""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from sqlalchemy import Engine, and_, case, func, literal, or_, select

from storage.query import token_sum
from storage.schema import IN_PROGRESS, exchanges


class Spend(NamedTuple):
    """What the final exchanges of one combination used."""

    user_id: str | None
    api_key_fingerprint: str | None
    request_model: str | None
    provider: str | None
    input_tokens: int
    output_tokens: int
    cost_usd: float
    exchanges: int
    unpriced: int  # exchanges whose cost_usd is NULL (unknown price)
    no_usage: int  # exchanges with neither input_tokens nor output_tokens


def read_spend(engine: Engine, start: datetime, end: datetime, instance: str | None, epoch: datetime) -> list[Spend]:
    """The final exchanges that started in ``[start, end)``, summed per (user, key
    fingerprint, requested model, provider), leaving out ``instance``'s rows that started
    at or after ``epoch`` (its book counts those itself)."""
    c = exchanges.c
    cost = c.cost_usd
    mine = and_(c.proxy_instance == instance, c.started_at >= epoch) if instance is not None else literal(False)
    groups = (c.user_id, c.api_key_fingerprint, c.request_model, c.provider)
    query = (
        select(
            *groups,
            token_sum(c.input_tokens),
            token_sum(c.output_tokens),
            func.coalesce(func.sum(cost), 0),
            func.count(),
            func.sum(case((cost.is_(None), 1), else_=0)),
            func.sum(case((and_(c.input_tokens.is_(None), c.output_tokens.is_(None)), 1), else_=0)),
        )
        .where(
            c.started_at >= start,
            c.started_at < end,
            c.status != IN_PROGRESS,
            # (proxy_instance may be NULL: NOT over a NULL comparison would drop the row)
            or_(c.proxy_instance.is_(None), ~mine),
        )
        .group_by(*groups)
    )
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    return [
        Spend(user, key, model, provider, int(inp), int(out), float(usd), int(n), int(unpriced), int(no_usage))
        for user, key, model, provider, inp, out, usd, n, unpriced, no_usage in rows
    ]
