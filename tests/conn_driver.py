"""A WebSocket connection's pipeline (``addon/connection_auditor.py``) built for the unit
tests as the proxy builds it: a real dialect's normalizer in its framing, one record per
turn, and the content filters checking client messages and the answer. One builder for
every test file that drives a connection without mitmproxy."""

from __future__ import annotations

from typing import Any, Literal

from addon.connection_auditor import ConnectionAuditor
from addon.dialects import Dialect, RequestView
from addon.filters.engine import FilterSet
from addon.filters.rules import parse_rules
from addon.framing import FRAMINGS
from addon.mitm.content_filters import check_message
from addon.record import ExchangeRecord
from addon.turns import Turns

#: One blocking keyword, for prompts and answers alike.
RULES = """
[[rule]]
id = "no-code-name"
kind = "keywords"
keywords = ["Nightjar"]
scope = "both"
action = "block"
reason = "internal code name"
"""
CONNECTION_ID = "conn-1"


def connection(
    dialect: Dialect,
    framing: str,
    view: RequestView | None = None,
    rules: str | None = RULES,
    failure: Literal["open", "closed"] = "closed",
) -> tuple[ConnectionAuditor, list[dict[str, Any]]]:
    """The connection auditor of one connection to ``view`` (GET /), and the rows its
    turns write, in order. ``rules`` None: no filters."""
    view = view or RequestView("GET", "/", "", {})
    summary = dialect.summarize(None, view)
    written: list[dict[str, Any]] = []
    turns = Turns(ExchangeRecord(dialect=dialect.name), CONNECTION_ID, lambda r: written.append(r.to_row()))
    filters = FilterSet(parse_rules(rules), failure=failure) if rules else None
    auditor = ConnectionAuditor(
        FRAMINGS[framing],
        dialect.normalizer(summary),
        lambda: dialect.normalizer(summary),
        turns,
        ExchangeRecord(dialect=dialect.name, connection_id=CONNECTION_ID),
        max_event_bytes=1 << 20,
        max_record_bytes=1 << 20,
        filters=lambda: filters,
        check=lambda fs, record, doc: check_message(fs, dialect, summary, record, doc),
    )
    return auditor, written
