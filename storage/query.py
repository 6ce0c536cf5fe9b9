"""Reading the audit database for ``llm-audit list``, ``show``, ``stats`` and ``export``.

Everything here reads ``exchange_view`` (:data:`storage.schema.exchange_view`), the flat
row per exchange that migration 0003 creates with the same columns on SQLite and
PostgreSQL: the commands answer alike on both backends, and their field names are the
view's column names (:data:`FIELDS`), so scripts and the SQL surface share one
vocabulary. Nothing here prints; the ``llm-audit`` command (:mod:`cli`) presents the rows.

Both backends merge a plain view like this one into the query, so filters on its plain
columns (time range, user, model, status) use the indexes of ``exchanges``; the derived
columns are computed only for the rows a query returns or groups.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from sqlalchemy import (
    Connection,
    Float,
    Row,
    Text,
    and_,
    case,
    cast,
    func,
    literal,
    or_,
    select,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.functions import GenericFunction

from storage.database import UNICODE_LOWER
from storage.schema import ANSWER_BYTES, exchange_view, exchanges
from storage.stored import StoredValues, Unreadable

view = exchange_view.c
FIELDS = tuple(c.name for c in exchange_view.columns)
DERIVED_FIELDS = tuple(name for name in FIELDS if name not in exchanges.c)
# What get_exchange reads of exchanges, and of the view: the answer as the view gives it
# (from output_text_utf8 when a huge one was stored as bytes), once, and never the bytes.
_STORED = tuple(c for c in exchanges.columns if c.name not in (ANSWER_BYTES, "output_text"))
_FROM_VIEW = ("output_text", *DERIVED_FIELDS)
_RECORD = tuple(str(name) for name in (*(c.name for c in exchanges.columns if c.name != ANSWER_BYTES), *DERIVED_FIELDS))

# What ``stats --by`` groups on: the key's name (also its field name) and its column.
GROUP_KEYS: dict[str, ColumnElement[Any]] = {
    "model": view.request_model,
    "provider": view.provider,
    "user": view.user_id,
    "client": view.client_address,
    "day": view.day,
    "status": view.status,
}
TOKEN_FIELDS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "reasoning_output_tokens")
PERCENTILES = (50, 95)  # of the time to first chunk, in stats
STATS_FIELDS = (
    "exchanges", "with_usage", *TOKEN_FIELDS, "cost_usd", "priced", "errors", "blocks",
    *(f"time_to_first_chunk_p{p}_ms" for p in PERCENTILES),
)  # fmt: skip


_HEX = re.compile(r"[0-9a-fA-F]+").fullmatch


class QueryError(ValueError):
    """A question the database cannot answer as asked (an unknown id, ...); one line."""


@dataclass(frozen=True)
class Filters:
    """Which exchanges a command looks at. Different filters combine (AND); the values of
    one filter are alternatives (OR); empty means no restriction."""

    since: datetime | None = None  # started at or after
    until: datetime | None = None  # started before
    models: Sequence[str] = ()  # request_model
    providers: Sequence[str] = ()
    dialects: Sequence[str] = ()
    users: Sequence[str] = ()  # user_id
    sessions: Sequence[str] = ()  # session_id
    clients: Sequence[str] = ()  # client_address
    statuses: Sequence[str] = ()
    findings: Sequence[str] = ()  # finding codes
    blocked: bool = False
    contains: str | None = None  # in the request body or the output, any case

    def conditions(self) -> list[ColumnElement[bool]]:
        """The WHERE conditions on ``exchange_view`` (all must hold)."""
        out: list[ColumnElement[bool]] = []
        if self.since is not None:
            out.append(view.started_at >= self.since.astimezone(UTC))  # SQLite compares UTC wall times
        if self.until is not None:
            out.append(view.started_at < self.until.astimezone(UTC))
        for column, values in (
            (view.request_model, self.models), (view.provider, self.providers), (view.dialect, self.dialects),
            (view.user_id, self.users), (view.session_id, self.sessions), (view.client_address, self.clients),
            (view.status, self.statuses),
        ):  # fmt: skip
            if values:
                out.append(column.in_(values))
        if self.findings:
            out.append(or_(*(_has_finding(code) for code in self.findings)))
        if self.blocked:
            out.append(view.blocked)
        if self.contains:
            text = self.contains
            body = cast(view.request_body, Text)
            # The body is JSON text: a quote, a backslash or a line break in a message is
            # escaped there ("say \"hi\""), so it is also searched as a JSON string holds it.
            escaped = orjson.dumps(text).decode()[1:-1]
            searched = [(body, text), (view.output_text, text), (view.delivered_text, text)]
            if escaped != text:
                searched.append((body, escaped))
            out.append(or_(*(_holds(column, wanted) for column, wanted in searched)))
        return out


def _holds(column: ColumnElement[Any], text: str) -> ColumnElement[bool]:
    """``column`` holds ``text``, in any case: SQLite's ``lower`` folds ASCII letters only,
    so text with others is folded by Python's there (:class:`unicode_lower`)."""
    if text.isascii():
        return column.icontains(text, autoescape=True)
    pattern = "%" + re.sub(r"([/%_])", r"/\1", text) + "%"  # (as autoescape writes it: "/" escapes)
    return unicode_lower(column).like(unicode_lower(literal(pattern, Text())), escape="/")


class unicode_lower(GenericFunction[str]):
    """``lower`` of all letters: PostgreSQL's own; on SQLite, Python's
    (:data:`storage.database.UNICODE_LOWER`, on every connection that reads records)."""

    type = Text()
    inherit_cache = True


@compiles(unicode_lower)
def _lower(element: unicode_lower, compiler: Any, **kw: Any) -> str:
    return f"lower({compiler.process(element.clauses, **kw)})"


@compiles(unicode_lower, "sqlite")
def _sqlite_lower(element: unicode_lower, compiler: Any, **kw: Any) -> str:
    return f"{UNICODE_LOWER}({compiler.process(element.clauses, **kw)})"


def _has_finding(code: str) -> ColumnElement[bool]:
    """Whether the exchange has a finding ``code``: a whole item of ``finding_codes``.

    The view lists the codes comma-separated from the parsed JSON on both backends, so
    this is exact (``invalid_json`` does not match ``request_invalid_json``) and does not
    depend on how either backend spaces its JSON text.
    """
    return (literal(",") + view.finding_codes + literal(",")).contains(f",{code},", autoescape=True)


def prepare(conn: Connection) -> None:
    """Session settings for these queries, once per connection.

    PostgreSQL compiles a query with JIT when its estimated cost is high, and it
    estimates the view's derived columns (a subquery per row) so high that a page of
    ``list`` that runs in 15 ms would first spend 300 ms compiling.
    """
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("SET jit = off")
        conn.commit()  # a SET is undone with its transaction


def list_exchanges(
    conn: Connection, filters: Filters, *, limit: int, offset: int = 0, unreadable: Unreadable
) -> list[dict[str, Any]]:
    """The exchanges matching ``filters``, newest first: one page of ``limit`` rows after ``offset``.
    Values that cannot be read are None, and named in ``unreadable`` (:func:`records`).

    The page is chosen by id first, then only its rows are read whole: when the rows
    must be sorted (``--user a --user b``: no index gives them in order), SQLite would
    otherwise compute every derived column of every matching row before sorting, four
    times as slow.
    """
    newest = (view.started_at.desc(), view.id.desc())
    page = select(view.id).where(*filters.conditions()).order_by(*newest).limit(limit).offset(offset)
    stored = StoredValues(conn.dialect, exchange_view.columns)
    query = select(*stored.select(exchange_view.columns)).where(view.id.in_(page.scalar_subquery())).order_by(*newest)
    return list(records(conn.execute(query), stored, unreadable))


def count_exchanges(conn: Connection, filters: Filters) -> int:
    return conn.execute(select(func.count()).select_from(exchange_view).where(*filters.conditions())).scalar_one()


def iter_exchanges(
    conn: Connection, filters: Filters, *, batch: int = 1000, unreadable: Unreadable
) -> Iterator[dict[str, Any]]:
    """Every exchange matching ``filters``, oldest first, ``batch`` rows in memory at a time
    (values that cannot be read: as in :func:`list_exchanges`).

    PostgreSQL sends them through a server-side cursor (``stream_results``); SQLite's
    cursor reads them from the file as they are fetched.
    """
    stored = StoredValues(conn.dialect, exchange_view.columns)
    query = select(*stored.select(exchange_view.columns)).where(*filters.conditions())
    result = conn.execution_options(stream_results=True, yield_per=batch).execute(
        query.order_by(view.started_at, view.id)
    )
    yield from records(result, stored, unreadable)


def get_exchange(conn: Connection, id_or_prefix: str, *, unreadable: Unreadable) -> dict[str, Any]:
    """The whole record of one exchange: every column of ``exchanges`` and the view's derived ones
    (values that cannot be read: as in :func:`list_exchanges`).

    The id may be shortened to any prefix that is unique (``list`` shows the first 12
    characters); an unknown or ambiguous one is a :class:`QueryError`.
    """
    if _HEX(id_or_prefix):  # (ids are lower-case hex: one typed in upper case is the same id)
        id_or_prefix = id_or_prefix.lower()
    own = StoredValues(conn.dialect, _STORED)
    rows = conn.execute(select(*own.select(_STORED)).where(exchanges.c.id == id_or_prefix)).all()
    if not rows and id_or_prefix:
        rows = conn.execute(select(*own.select(_STORED)).where(_starts_with(id_or_prefix)).limit(2)).all()
    if not rows:
        raise QueryError(f"no exchange with the id {id_or_prefix!r}")
    if len(rows) > 1:
        raise QueryError(f"{id_or_prefix!r} is the start of several exchange ids; give more of it")
    (stored,) = records(rows, own, unreadable)
    columns = [view.id, *(view[name] for name in _FROM_VIEW)]  # (the id: what names an unreadable value's record)
    derived_values = StoredValues(conn.dialect, columns)
    found = conn.execute(select(*derived_values.select(columns)).where(view.id == rows[0].id)).one()
    (derived,) = records([found], derived_values, unreadable)
    return {name: derived[name] if name in derived else stored[name] for name in _RECORD}


def _starts_with(prefix: str) -> ColumnElement[bool]:
    """Ids that start with ``prefix``, found through the primary key's index.

    ``LIKE 'prefix%'`` alone would read the whole table on both backends (neither uses
    the index for it by default); the range from the prefix to the prefix with its last
    character raised by one holds exactly the ids that start with it, and the LIKE keeps
    the answer exact whatever the collation.
    """
    last = min(ord(prefix[-1]) + 1, sys.maxunicode)
    above = prefix[:-1] + chr(0xE000 if 0xD800 <= last <= 0xDFFF else last)  # no database takes a lone surrogate
    id = exchanges.c.id
    return and_(id >= prefix, id < above, id.startswith(prefix, autoescape=True))


def stats(conn: Connection, filters: Filters, by: Sequence[str]) -> list[dict[str, Any]]:
    """Totals per group of ``by`` keys (distinct :data:`GROUP_KEYS`); one row of totals when ``by`` is empty.

    A WebSocket connection's own record is not an exchange here (its answers are). Each
    row holds the keys, then ``exchanges``, ``with_usage`` (exchanges that reported
    usage), the token sums, ``cost_usd`` (the sum of the known costs, NULL when none is
    known) and ``priced`` (exchanges whose cost is known), ``errors`` (status failed), ``blocks`` and the time to first
    chunk percentiles. Rows come by day (when grouped by day), then most tokens first.
    """
    unknown = [key for key in by if key not in GROUP_KEYS]
    if unknown:
        raise QueryError(f"cannot group by {unknown[0]!r}; choose from {', '.join(GROUP_KEYS)}")
    keys = [GROUP_KEYS[key].label(key) for key in by]
    totals = (
        select(
            *keys,
            func.count().label("exchanges"),
            func.count().filter(view.usage_source == "provider").label("with_usage"),
            *(_total(name) for name in TOKEN_FIELDS),
            func.sum(view.cost_usd).label("cost_usd"),
            func.count(view.cost_usd).label("priced"),
            func.count().filter(view.status == "failed").label("errors"),
            func.count().filter(view.blocked).label("blocks"),
        )
        .where(*filters.conditions(), _answers())
        .group_by(*keys)
    )  # fmt: skip
    rows = {tuple(row[: len(by)]): dict(row._mapping) for row in conn.execute(totals)}
    for group, values in _percentiles(conn, filters, by).items():
        rows[group].update(values)
    for row in rows.values():  # a sum of doubles on SQLite: to the column's 12 places
        row["cost_usd"] = None if row["cost_usd"] is None else round(float(row["cost_usd"]), 12)
        row.update({name: int(row[name]) for name in TOKEN_FIELDS})  # token_sum's doubles
    fields = (*by, *STATS_FIELDS)
    ordered = sorted(
        ({name: row.get(name) for name in fields} for row in rows.values()),
        key=lambda r: -((r["input_tokens"] or 0) + (r["output_tokens"] or 0)),
    )
    return sorted(ordered, key=lambda r: r["day"] or "") if "day" in by else ordered


def _answers() -> ColumnElement[bool]:
    """Not a WebSocket connection's own record (``turn`` NULL with a ``connection_id``):
    its answers are counted in their turns' records."""
    return or_(view.turn.is_not(None), view.connection_id.is_(None))


def _total(name: str) -> ColumnElement[float]:
    """The sum of a token column (:func:`token_sum`), 0 when nothing was reported."""
    return token_sum(view[name]).label(name)


def token_sum(column: Any) -> ColumnElement[float]:
    """The sum of a token column's counts, as a double, 0 when there are none.

    The counts are the upstream's (hostile input, any 64-bit integer): a sum of integers
    would end the query in an error (SQLite's ``integer overflow`` once two rows of a
    group hold 2**62, PostgreSQL's ``bigint out of range`` casting its numeric back),
    and with it ``stats``, the review page and the budgets' totals. A double does not
    overflow and is exact to 2**53 tokens; a negative count is no count and adds nothing.
    The caller turns it into an integer."""
    return func.coalesce(func.sum(case((column >= 0, cast(column, Float)))), 0.0)


def _percentiles(conn: Connection, filters: Filters, by: Sequence[str]) -> dict[tuple, dict[str, int]]:
    """The :data:`PERCENTILES` of ``time_to_first_chunk_ms`` per group, by nearest rank.

    The database ranks the values within each group (a window function, on both
    backends) and returns only the ranked rows that are wanted, so memory does not grow
    with the number of exchanges. Nearest rank: the p-th percentile of n values is the
    ceil(p/100 * n)-th smallest, a value that occurred.
    """
    ttfc = view.time_to_first_chunk_ms
    partition = [GROUP_KEYS[key] for key in by] or None
    ranked = (
        select(
            *(GROUP_KEYS[key].label(key) for key in by),
            ttfc.label("ttfc"),
            func.row_number().over(partition_by=partition, order_by=ttfc).label("nth"),
            func.count().over(partition_by=partition).label("n"),
        )
        .where(*filters.conditions(), _answers(), ttfc.is_not(None))
        .subquery()
    )
    wanted = [ranked.c.nth == (ranked.c.n * p + 99) // 100 for p in PERCENTILES]  # ceil(p * n / 100)
    out: dict[tuple, dict[str, int]] = {}
    for row in conn.execute(select(ranked).where(or_(*wanted))):
        group = tuple(row[: len(by)])
        for p in PERCENTILES:
            if row.nth == (row.n * p + 99) // 100:
                out.setdefault(group, {})[f"time_to_first_chunk_p{p}_ms"] = row.ttfc
    return out


def records(rows: Iterable[Row], stored: StoredValues, unreadable: Unreadable) -> Iterator[dict[str, Any]]:
    """``rows`` as dicts with plain ``str`` keys (orjson refuses SQLAlchemy's
    ``quoted_name``) and times as aware UTC datetimes (SQLite gives naive UTC ones), their
    values decoded by ``stored``: one that cannot be read (on SQLite, where a column holds
    what anyone put there) is None, and its record is counted in ``unreadable``, so one
    planted value hides nothing else."""
    for row in rows:
        record = {str(name): value for name, value in row._mapping.items()}
        if problems := stored.decode(record):
            unreadable.add(f"{record.get('id')}: {', '.join(problems)}")
        yield {name: _utc(value) if isinstance(value, datetime) else value for name, value in record.items()}


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
