"""``llm-audit cost recompute``: the cost of past exchanges computed again, after a price update.

Every final exchange in the range is priced from its stored provider, model and usage
(:func:`storage.cost.cost_of`, with the price file given, if any) and its ``cost_usd`` and
``cost_prices`` are updated where they differ. Nothing else of a row changes, and neither
column is in the hash chain (:data:`storage.chain.DERIVED_COLUMNS`): ``llm-audit verify``
passes as before.

The rows are read and updated in batches of ``batch_size``, in id order (keyset paging),
one transaction per batch, so the database is never locked for long and an interrupted
run leaves every finished batch done. On PostgreSQL with the roles of
:mod:`storage.roles`, final records can be changed only by the owner or the purge role
(the proxy role's trigger refuses them): run it as one of those.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, bindparam, select, update
from sqlalchemy.exc import SQLAlchemyError

from storage.cost import COLUMNS, Prices, cost_of
from storage.database import DatabaseError, first_line
from storage.schema import IN_PROGRESS, exchanges

_READ = ("id", *COLUMNS, "cost_usd", "cost_prices")  # what cost_of reads of a row, and what it gave
_SAME = 5e-13  # half the column's last decimal place: a stored cost that round-tripped is the same


@dataclass(frozen=True, slots=True)
class Recomputed:
    """What a recompute did: rows looked at, rows changed, and how many now have a price."""

    examined: int
    changed: int
    priced: int


def recompute(
    engine: Engine,
    prices: Prices | None = None,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    batch_size: int = 1000,
    dry_run: bool = False,
) -> Recomputed:
    """Price every final exchange started in [since, until) again; see the module."""
    c = exchanges.c
    where = [c.status != IN_PROGRESS]
    if since is not None:
        where.append(c.started_at >= since)
    if until is not None:
        where.append(c.started_at < until)
    change = (
        update(exchanges)
        .where(c.id == bindparam("row_id"))
        .values(cost_usd=bindparam("new_usd"), cost_prices=bindparam("new_prices"))
    )
    examined = changed = priced = 0
    last: str | None = None
    try:
        while True:
            with engine.begin() as conn:
                query = select(*(c[name] for name in _READ)).where(*where).order_by(c.id).limit(batch_size)
                if last is not None:
                    query = query.where(c.id > last)
                rows = [dict(r._mapping) for r in conn.execute(query)]
                if not rows:
                    break
                updates = []
                for row in rows:
                    usd, source = cost_of(row, prices)
                    priced += usd is not None
                    if not _same(row["cost_usd"], usd) or row["cost_prices"] != source:
                        updates.append({"row_id": row["id"], "new_usd": usd, "new_prices": source})
                if updates and not dry_run:
                    conn.execute(change, updates)
                examined += len(rows)
                changed += len(updates)
                last = rows[-1]["id"]
    except SQLAlchemyError as e:
        raise DatabaseError(
            f"cannot recompute costs: {first_line(e)}; run it as the database owner or a member of the purge role"
            if "proxy role" in str(e)
            else f"cannot recompute costs: {first_line(e)}"
        ) from None
    return Recomputed(examined, changed, priced)


def _same(stored: float | None, new: float | None) -> bool:
    if stored is None or new is None:
        return stored is new
    return abs(float(stored) - new) < _SAME
