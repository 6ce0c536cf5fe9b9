"""The overview's numbers: per day, per user and per model (the totals ``llm-audit stats``
prints), blocked exchanges by rule, findings by code, and
the cost (``cost_usd``: what the writer priced; NULL where the price is unknown, left out).

Rules and findings are counted from the view's ``verdict_rules`` and ``finding_codes``
(each exchange's distinct ids, comma-separated), grouped in the database and split here:
an exchange counts once per rule or code it has.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, func, or_, select

from storage.query import Filters, token_sum, view

TOTALS = ("exchanges", "input_tokens", "output_tokens", "blocks", "errors")


@dataclass(frozen=True)
class Overview:
    totals: dict[str, int]
    by_day: list[dict[str, Any]]  # {day, exchanges, input_tokens, ...}, by day
    by_user: list[dict[str, Any]]  # {user, ...}, most exchanges first
    by_model: list[dict[str, Any]]  # {model, ...}, most exchanges first
    blocked_rules: list[tuple[str, int]]
    finding_codes: list[tuple[str, int]]
    cost_by_day: dict[str, float]  # days without a known price are left out


def overview(conn: Connection, filters: Filters) -> Overview:
    """The overview of the exchanges ``filters`` select.

    The totals are those of ``llm-audit stats`` (a WebSocket connection's own record is
    not counted: its answers are), read in one pass grouped by day, user and model
    together and summed here per key: four passes of :func:`storage.query.stats` (which
    also ranks every time to first chunk) took 8 s for a month of a million-row database,
    this one takes half a second.
    """
    keys = (view.day, view.user_id, view.request_model)
    answers = or_(view.turn.is_not(None), view.connection_id.is_(None))
    query = (
        select(
            *keys,
            func.count(),
            _sum(view.input_tokens),
            _sum(view.output_tokens),
            func.count().filter(view.blocked),
            func.count().filter(view.status == "failed"),
        )
        .where(*filters.conditions(), answers)
        .group_by(*keys)
    )
    totals: dict[str, int] = dict.fromkeys(TOTALS, 0)
    per: dict[str, dict[Any, dict[str, int]]] = {"day": {}, "user": {}, "model": {}}
    for day, user, model, *numbers in conn.execute(query):
        for name, key in (("day", day), ("user", user), ("model", model)):
            into = per[name].setdefault(key, dict.fromkeys(TOTALS, 0))
            for field, n in zip(TOTALS, numbers):
                into[field] += int(n or 0)
        for field, n in zip(TOTALS, numbers):
            totals[field] += int(n or 0)

    def rows(name: str) -> list[dict[str, Any]]:
        found = [{name: key, **values} for key, values in per[name].items()]
        if name == "day":
            return sorted(found, key=lambda r: r["day"] or "")
        return sorted(found, key=lambda r: (-r["exchanges"], str(r[name])))

    return Overview(
        totals=totals,
        by_day=rows("day"),
        by_user=rows("user"),
        by_model=rows("model"),
        blocked_rules=_split_counts(conn, filters, view.verdict_rules, view.blocked),
        finding_codes=_split_counts(conn, filters, view.finding_codes, None),
        cost_by_day=_cost_by_day(conn, filters),
    )


def _sum(column: Any) -> Any:
    return token_sum(column)


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
    """US dollars per day, of the exchanges whose price is known (``cost_usd`` NULL: unknown)."""
    query = (
        select(view.day, func.sum(view.cost_usd))
        .where(*filters.conditions(), view.cost_usd.is_not(None))
        .group_by(view.day)
        .order_by(view.day)
    )
    return {day: float(value or 0) for day, value in conn.execute(query)}
