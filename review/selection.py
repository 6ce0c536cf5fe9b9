"""The list's selection from a query string: the filters of ``llm-audit list`` and a
keyset page.

The same query string selects the list, the overview and the exports, so "export what I
am looking at" exports exactly that. The values are read as the command reads its
options (:func:`cli.query._moment`'s ages and dates through
:func:`storage.retention.parse_cutoff`); a value that cannot be read is a one-line
error on the page, never a traceback.

Pages are keyset pages (newest first, after the last row of the page before: its
``started_at`` and ``id``) rather than offsets, so page 1000 costs what page 1 does on
the indexes ``started_at``, ``(user_id, started_at)``, ``(request_model, started_at)``
and ``(status, started_at)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from sqlalchemy import Connection, and_, func, or_, select

from storage.query import Filters, records, view
from storage.retention import RetentionError, parse_cutoff
from storage.stored import StoredValues, Unreadable

PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
# query parameter: Filters field, for the filters that take several values
MULTI = {
    "user": "users", "model": "models", "provider": "providers", "dialect": "dialects",
    "status": "statuses", "finding": "findings", "session": "sessions", "client": "clients",
}  # fmt: skip
SINGLE = ("since", "until", "contains", "blocked")
MAX_VALUE = 1000  # characters of one filter value
# What the list shows of each exchange; of the texts that may be long, only their start.
LISTED = tuple(
    view[name]
    for name in (
        "id", "started_at", "user_id", "request_model", "status", "blocked",
        "input_tokens", "output_tokens", "cost_usd", "error_code",
    )
)  # fmt: skip
SNIPPETS = ("client_text", "error_message")
SNIPPET_READ = 1000  # characters read of each: the list shows 160 of them, whitespace collapsed
STATUSES = ("completed", "failed", "blocked", "client_aborted", "upstream_aborted", "interrupted", "in_progress")


class SelectionError(ValueError):
    """A filter value that cannot be read; the message names it."""


@dataclass(frozen=True)
class Selection:
    """The filters as given (to fill the form and the links) and as :class:`Filters`."""

    given: dict[str, list[str]] = field(default_factory=dict)
    filters: Filters = Filters()
    limit: int = PAGE_SIZE
    after: tuple[datetime, str] | None = None  # the last row of the page before

    def query(self, **more: str) -> str:
        """The query string of these filters (and ``more``), for links."""
        pairs = [(name, value) for name, values in self.given.items() for value in values]
        return urlencode(pairs + list(more.items()))

    def first(self, name: str) -> str:
        return (self.given.get(name) or [""])[0]


def parse(params: Sequence[tuple[str, str]], now: datetime | None = None) -> Selection:
    """The selection of a query string's pairs; unknown parameters are ignored."""
    now = now or datetime.now(UTC)
    given: dict[str, list[str]] = {}
    for name, value in params:
        value = value.strip()
        if (name in MULTI or name in SINGLE) and value:
            if len(value) > MAX_VALUE:
                raise SelectionError(f"the {name} filter is longer than {MAX_VALUE} characters")
            given.setdefault(name, []).append(value)
    values: dict[str, Any] = {MULTI[name]: tuple(given.get(name, ())) for name in MULTI}
    for name in ("since", "until"):
        if name in given:
            try:
                values[name] = parse_cutoff(given[name][0], now)
            except RetentionError as e:
                raise SelectionError(f"{name}: {e}") from None
    values["contains"] = given["contains"][0] if "contains" in given else None
    values["blocked"] = "blocked" in given
    extra = dict(params)
    return Selection(given, Filters(**values), _limit(extra.get("limit")), _after(extra.get("after")))


def _limit(value: str | None) -> int:
    if not value:
        return PAGE_SIZE
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= MAX_PAGE_SIZE:  # "²" is a digit to isdigit
        raise SelectionError(f"limit must be a whole number from 1 to {MAX_PAGE_SIZE}")
    return int(value)


def _after(value: str | None) -> tuple[datetime, str] | None:
    """The page cursor ``ISO-TIME~ID`` of the last row of the page before."""
    if not value:
        return None
    time, _, id = value.partition("~")
    try:
        started = datetime.fromisoformat(time)
        if not id or started.tzinfo is None:
            raise ValueError(time)
        return started.astimezone(UTC), id
    except (ValueError, OverflowError):  # OverflowError: an offset that moves it past year 9999 or before 1
        raise SelectionError("the page link is damaged: start again from the first page") from None


def cursor(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """The ``after`` value that continues after the last of ``rows`` whose start time can
    be read (the rows after it come again on the next page); None when none can be."""
    last = next((row for row in reversed(rows) if row["started_at"] is not None and row["id"] is not None), None)
    return None if last is None else f"{last['started_at'].isoformat()}~{last['id']}"


def page(conn: Connection, selection: Selection, unreadable: Unreadable) -> tuple[list[dict[str, Any]], bool]:
    """One page of the selection, newest first, and whether there are more after it.

    As :func:`storage.query.list_exchanges` does, the page's ids are chosen first (on
    the indexes) and only those rows are read; a record without a start time (none the
    proxy writes) is not listed. A value llm-audit did not write is None, and its record
    named in ``unreadable`` (:func:`storage.query.records`). Only what the list shows is read (:data:`LISTED`, and
    the start of the answer and the error message): a record may hold tens of megabytes
    (a hostile client's), and a page of 500 whole ones would not fit in memory.
    """
    conditions = selection.filters.conditions()
    if selection.after is not None:
        started, id = selection.after
        # (started_at, id) < (started, id), written so that the index on started_at bounds the scan
        # (an OR of the two cases alone makes SQLite read every row from the newest on)
        conditions.append(and_(view.started_at <= started, or_(view.started_at < started, view.id < id)))
    newest = (view.started_at.desc(), view.id.desc())
    ids = select(view.id).where(view.started_at.is_not(None), *conditions).order_by(*newest).limit(selection.limit + 1)
    stored = StoredValues(conn.dialect, LISTED)
    query = select(*stored.select(LISTED), *(func.substr(view[name], 1, SNIPPET_READ).label(name) for name in SNIPPETS))
    query = query.where(view.id.in_(ids.scalar_subquery())).order_by(*newest)
    rows = list(records(conn.execute(query), stored, unreadable))
    return rows[: selection.limit], len(rows) > selection.limit
