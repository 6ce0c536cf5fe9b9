"""The overview's numbers: per day, per user and per model (from :func:`storage.query.stats`,
the totals ``llm-audit stats`` prints), blocked exchanges by rule, findings by code, and
the cost where the database records one.

Rules and findings are counted from the view's ``verdict_rules`` and ``finding_codes``
(each exchange's distinct ids, comma-separated), grouped in the database and split here:
an exchange counts once per rule or code it has.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Numeric, cast, column, func, select, table

from storage.query import Filters, stats, view

COST_COLUMN = "cost_usd"  # exchanges.cost_usd, where the schema has it


@dataclass(frozen=True)
class Overview:
    totals: dict[str, Any]
    by_day: list[dict[str, Any]]
    by_user: list[dict[str, Any]]
    by_model: list[dict[str, Any]]
    blocked_rules: list[tuple[str, int]]
    finding_codes: list[tuple[str, int]]
    cost_by_day: dict[str, float] | None  # None: the database records no cost


def overview(conn: Connection, filters: Filters, *, with_cost: bool) -> Overview:
    totals = stats(conn, filters, [])
    return Overview(
        totals=totals[0] if totals else {},
        by_day=stats(conn, filters, ["day"]),
        by_user=stats(conn, filters, ["user"]),
        by_model=stats(conn, filters, ["model"]),
        blocked_rules=_split_counts(conn, filters, view.verdict_rules, view.blocked),
        finding_codes=_split_counts(conn, filters, view.finding_codes, None),
        cost_by_day=_cost_by_day(conn, filters) if with_cost else None,
    )


def _split_counts(conn: Connection, filters: Filters, listed: Any, where: Any) -> list[tuple[str, int]]:
    conditions = [*filters.conditions(), listed.is_not(None)]
    if where is not None:
        conditions.append(where)
    counts: Counter[str] = Counter()
    for items, n in conn.execute(select(listed, func.count()).where(*conditions).group_by(listed)):
        for item in str(items).split(","):
            if item:
                counts[item] += n
    return counts.most_common()


def _cost_by_day(conn: Connection, filters: Filters) -> dict[str, float]:
    """USD per day, summed from ``exchanges.cost_usd`` (a column of a newer schema, named
    here rather than imported so that this works on either)."""
    costs = table("exchanges", column("id"), column(COST_COLUMN))
    total = func.sum(cast(costs.c[COST_COLUMN], Numeric))
    query = (
        select(view.day, total)
        .select_from(view.join(costs, costs.c.id == view.id))
        .where(*filters.conditions())
        .group_by(view.day)
        .order_by(view.day)
    )
    return {day: float(value or 0) for day, value in conn.execute(query)}


def costs(conn: Connection, ids: list[str]) -> dict[str, float]:
    """The recorded cost (USD) of each of ``ids`` that has one."""
    if not ids:
        return {}
    costs = table("exchanges", column("id"), column(COST_COLUMN))
    query = select(costs.c.id, costs.c[COST_COLUMN]).where(costs.c.id.in_(ids), costs.c[COST_COLUMN].is_not(None))
    return {id: float(value) for id, value in conn.execute(query)}
