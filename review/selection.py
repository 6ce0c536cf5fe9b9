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
sorts it (:func:`cursor`), so a start time llm-audit did not write (on SQLite,
anything) moves the pages on as it sorts, and hides no record after it.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

import orjson
from sqlalchemy import (
    ColumnElement,
    Connection,
    DateTime,
    LargeBinary,
    Text,
    and_,
    cast,
    func,
    literal,
    or_,
    select,
    type_coerce,
)
from sqlalchemy.dialects import sqlite as sqlite_dialect
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
STORED_PREFIX = "stored:"  # a page link of a key that is not a time and text as the writer writes them
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
    # page link of STORED_PREFIX: each its storage class and value)
    after: tuple[Any, Any] | None = None
    stored_after: bool = False

    def page_query(self, after: str | None = None) -> str:
        """The query string of a page of these filters: the first, or the one after ``after``."""
        more = {"limit": str(self.limit)} if self.limit != PAGE_SIZE else {}
        return self.query(**more, **({"after": after} if after else {}))

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
    SQLite stored it: ``ISO-TIME~ID``, or :data:`STORED_PREFIX` and :func:`cursor`'s
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


# A key value SQLite stored, in the page link: its storage class and the value in JSON,
# text and BLOBs as their bytes in hex (the listed rows have no NULL key: the id is NOT
# NULL, and a row without a start time is not listed).
_ENCODE: dict[str, Callable[[Any, bytes], Any]] = {
    "text": lambda _, data: data.hex(), "blob": lambda _, data: data.hex(),
    "integer": lambda value, _: value, "real": lambda value, _: repr(value),
}  # fmt: skip
_DECODE: dict[str, Callable[[Any], Any]] = {
    "text": bytes.fromhex, "blob": bytes.fromhex, "integer": lambda v: _int64(int(v)), "real": float,
}  # fmt: skip


def _key_columns(sqlite: bool) -> list[ColumnElement[Any]]:
    """The key columns for the page link, as stored: on SQLite each one's storage class,
    its bytes (text read through the connection gets U+FFFD for bytes that are not UTF-8,
    and the link would hold another key: the next page began with the same rows again)
    and its value (a number's); on PostgreSQL its value."""
    out: list[ColumnElement[Any]] = []
    for name, column in (("started", view.started_at), ("id", view.id)):
        out.append(type_coerce(column, NullType()).label(f"key_{name}"))
        if sqlite:
            out.append(func.typeof(column).label(f"key_{name}_class"))
            out.append(cast(column, LargeBinary).label(f"key_{name}_bytes"))
    return out


def cursor(row: dict[str, Any]) -> str:
    """The ``after`` value that continues after ``row`` (its :func:`_key_columns`): a
    time and an id as the writer stores them as ``ISO-TIME~ID``, any other key as
    :data:`STORED_PREFIX` and its stored form, so that the next page starts where it sorts."""
    if "key_started_class" not in row:  # PostgreSQL: a timestamptz and text
        return f"{row['key_started'].astimezone(UTC).isoformat()}~{row['key_id']}"
    pair = [
        [row[f"key_{name}_class"], _ENCODE[row[f"key_{name}_class"]](row[f"key_{name}"], row[f"key_{name}_bytes"])]
        for name in ("started", "id")
    ]
    return _as_written(pair) or STORED_PREFIX + base64.urlsafe_b64encode(orjson.dumps(pair)).decode()


def _as_written(pair: list[list[Any]]) -> str | None:
    """``ISO-TIME~ID`` for a key the writer wrote (its time's text exactly what binding
    the time gives back), else None."""
    (started_class, started), (id_class, id) = pair
    if started_class != "text" or id_class != "text":
        return None
    try:
        time, text = bytes.fromhex(started).decode(), bytes.fromhex(id).decode()
        parsed = datetime.fromisoformat(time)
    except ValueError:  # (not UTF-8, or no time: month 13, second 60)
        return None
    if parsed.tzinfo is not None or _written_time(parsed) != time:
        return None
    return f"{parsed.replace(tzinfo=UTC).isoformat()}~{text}"


def _written_time(value: datetime) -> str:
    """The text the writer stores for a time on SQLite (SQLAlchemy's ``DATETIME``)."""
    dialect = sqlite_dialect.dialect()
    encode = DateTime().dialect_impl(dialect).bind_processor(dialect)
    assert encode is not None
    return str(encode(value))


def _stored_after(text: str) -> tuple[tuple[str, Any], tuple[str, Any]]:
    try:
        pair = orjson.loads(base64.urlsafe_b64decode(text.encode()))
        started, id = ((kind, _DECODE[kind](value)) for kind, value in pair)
    except (ValueError, TypeError, KeyError, OverflowError, binascii.Error, orjson.JSONDecodeError):
        raise _damaged() from None
    return started, id


def _int64(value: int) -> int:
    if not -(2**63) <= value < 2**63:
        raise OverflowError(value)  # (SQLite's integers: the driver cannot bind more)
    return value


def _after_condition(conn: Connection, selection: Selection) -> ColumnElement[bool]:
    """(started_at, id) < the page link's key, written so that the index on started_at
    bounds the scan (an OR of the two cases alone makes SQLite read every row from the
    newest on). A stored key is compared as stored: text as its bytes (``CAST(? AS TEXT)``),
    other classes as they are."""
    assert selection.after is not None
    started, id = selection.after
    if not selection.stored_after:
        return and_(view.started_at <= started, or_(view.started_at < started, view.id < id))
    if conn.dialect.name != "sqlite":  # (PostgreSQL types what it stores: no such link comes from it)
        raise _damaged()
    at, key = (type_coerce(column, NullType()) for column in (view.started_at, view.id))
    started, id = (_bound(*value) for value in selection.after)
    return and_(at <= started, or_(at < started, key < id))


def _bound(kind: str, value: Any) -> ColumnElement[Any]:
    param = literal(value, NullType())
    return cast(param, Text) if kind == "text" else param


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
    query = select(*stored.select(LISTED), *snippets, *_key_columns(stored.sqlite))
    query = query.where(view.id.in_(ids.scalar_subquery())).order_by(*newest)
    rows = list(records(conn.execute(query), stored, unreadable))
    if len(rows) <= selection.limit:
        return rows, None
    return rows[: selection.limit], cursor(rows[selection.limit - 1])
