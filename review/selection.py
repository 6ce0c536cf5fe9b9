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
and ``(status, started_at)``. The page link carries that row's key as the database
sorts it (:func:`_stored_key`), so a start time llm-audit did not write (on SQLite,
anything) moves the pages on as it sorts, and hides no record after it.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

import orjson
from sqlalchemy import ColumnElement, Connection, and_, func, literal, or_, select, type_coerce
from sqlalchemy.types import NullType

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
# The key columns as stored, for the page link (SQLAlchemy decodes nothing of them).
KEY = (type_coerce(view.started_at, NullType()).label("key_started"), type_coerce(view.id, NullType()).label("key_id"))
STORED_PREFIX = "stored:"  # a page link of a key that is not a time and text as the writer writes them
_WRITTEN_TIME = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{6}\Z")  # (SQLAlchemy's, on SQLite)
STATUSES = ("completed", "failed", "blocked", "client_aborted", "upstream_aborted", "interrupted", "in_progress")


class SelectionError(ValueError):
    """A filter value that cannot be read; the message names it."""


@dataclass(frozen=True)
class Selection:
    """The filters as given (to fill the form and the links) and as :class:`Filters`."""

    given: dict[str, list[str]] = field(default_factory=dict)
    filters: Filters = Filters()
    limit: int = PAGE_SIZE
    # the last row of the page before: (aware time, id), or as SQLite stored them (a
    # page link of STORED_PREFIX)
    after: tuple[Any, Any] | None = None
    stored_after: bool = False

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
    after, stored = _after(extra.get("after"))
    return Selection(given, Filters(**values), _limit(extra.get("limit")), after, stored)


def _limit(value: str | None) -> int:
    if not value:
        return PAGE_SIZE
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= MAX_PAGE_SIZE:  # "²" is a digit to isdigit
        raise SelectionError(f"limit must be a whole number from 1 to {MAX_PAGE_SIZE}")
    return int(value)


def _after(value: str | None) -> tuple[tuple[Any, Any] | None, bool]:
    """The page link's key of the last row of the page before, and whether it is as
    SQLite stored it: ``ISO-TIME~ID``, or :data:`STORED_PREFIX` and :func:`_stored_key`'s
    form."""
    if not value:
        return None, False
    if value.startswith(STORED_PREFIX):
        return _stored_after(value.removeprefix(STORED_PREFIX)), True
    time, _, id = value.partition("~")
    try:
        started = datetime.fromisoformat(time)
        if not id or started.tzinfo is None:
            raise ValueError(time)
        return (started.astimezone(UTC), id), False
    except (ValueError, OverflowError):  # OverflowError: an offset that moves it past year 9999 or before 1
        raise _damaged() from None


def _damaged() -> SelectionError:
    return SelectionError("the page link is damaged: start again from the first page")


# A value SQLite stored, in the page link: its storage class and the value in JSON (the
# listed rows have no NULL key: the id is NOT NULL, and a row without a start time is not listed).
_ENCODE: dict[type, tuple[str, Callable[[Any], Any]]] = {
    str: ("text", str), int: ("integer", int), float: ("real", repr), bytes: ("blob", bytes.hex),
}  # fmt: skip
_DECODE: dict[str, Callable[[Any], Any]] = {"text": str, "integer": int, "real": float, "blob": bytes.fromhex}


def _stored_key(started: Any, id: Any) -> str:
    """The page link of a key as SQLite stored it, of any storage class: a start time or
    an id llm-audit did not write sorts where its class and value put it, and the next
    page must start there, not where a time read from it would sort."""
    pair = [[_ENCODE[type(v)][0], _ENCODE[type(v)][1](v)] for v in (started, id)]
    return STORED_PREFIX + base64.urlsafe_b64encode(orjson.dumps(pair)).decode()


def _stored_after(text: str) -> tuple[Any, Any]:
    try:
        pair = orjson.loads(base64.urlsafe_b64decode(text.encode()))
        started, id = (_DECODE[kind](value) for kind, value in pair)
    except (ValueError, TypeError, KeyError, binascii.Error, orjson.JSONDecodeError):
        raise _damaged() from None
    return started, id


def cursor(key_started: Any, key_id: Any) -> str:
    """The ``after`` value that continues after the row of this key (as the database
    gave it: on PostgreSQL a time and text, on SQLite as stored)."""
    if isinstance(key_started, datetime) and isinstance(key_id, str):  # PostgreSQL's timestamptz
        return f"{key_started.astimezone(UTC).isoformat()}~{key_id}"
    if isinstance(key_started, str) and _WRITTEN_TIME.match(key_started) and isinstance(key_id, str):
        return f"{datetime.fromisoformat(key_started).replace(tzinfo=UTC).isoformat()}~{key_id}"
    return _stored_key(key_started, key_id)


def _after_condition(conn: Connection, selection: Selection) -> ColumnElement[bool]:
    """(started_at, id) < the page link's key, written so that the index on started_at
    bounds the scan (an OR of the two cases alone makes SQLite read every row from the
    newest on)."""
    assert selection.after is not None
    started, id = selection.after
    if not selection.stored_after:
        return and_(view.started_at <= started, or_(view.started_at < started, view.id < id))
    if conn.dialect.name != "sqlite":  # (PostgreSQL types what it stores: no such link comes from it)
        raise _damaged()
    at, key = (type_coerce(column, NullType()) for column in (view.started_at, view.id))
    started, id = literal(started, NullType()), literal(id, NullType())
    return and_(at <= started, or_(at < started, key < id))


def page(conn: Connection, selection: Selection, unreadable: Unreadable) -> tuple[list[dict[str, Any]], str | None]:
    """One page of the selection, newest first, and the page link of the next (None
    when this is the last).

    As :func:`storage.query.list_exchanges` does, the page's ids are chosen first (on
    the indexes) and only those rows are read; a record without a start time (none the
    proxy writes) is not listed. A value llm-audit did not write is None, and its record
    named in ``unreadable`` (:func:`storage.query.records`). Only what the list shows is read (:data:`LISTED`, and
    the start of the answer and the error message): a record may hold tens of megabytes
    (a hostile client's), and a page of 500 whole ones would not fit in memory.
    """
    conditions = selection.filters.conditions()
    if selection.after is not None:
        conditions.append(_after_condition(conn, selection))
    newest = (view.started_at.desc(), view.id.desc())
    ids = select(view.id).where(view.started_at.is_not(None), *conditions).order_by(*newest).limit(selection.limit + 1)
    stored = StoredValues(conn.dialect, LISTED)
    snippets = (func.substr(view[name], 1, SNIPPET_READ).label(name) for name in SNIPPETS)
    query = select(*stored.select(LISTED), *snippets, *KEY)
    query = query.where(view.id.in_(ids.scalar_subquery())).order_by(*newest)
    rows = list(records(conn.execute(query), stored, unreadable))
    if len(rows) <= selection.limit:
        return rows, None
    last = rows[selection.limit - 1]
    return rows[: selection.limit], cursor(last["key_started"], last["key_id"])
