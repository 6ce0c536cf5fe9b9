"""Values SQLite may hold anything in, read row by row: what every reader of records shares.

SQLite keeps whatever a writer puts in any column: text that is no JSON in a JSON column,
``yesterday`` in a time column, a BLOB where text belongs. SQLAlchemy decodes JSON and
time columns as it fetches, so one such value, planted by whoever can write the
database, stopped ``list``, ``export`` and the review pages for every record. So on
SQLite those columns are selected as their stored text (:meth:`StoredValues.select`) and
decoded here, one row at a time (:meth:`StoredValues.decode`): a value that cannot be
read becomes None and is named, and the rest of the row and the other rows are read.
``verify`` reads the same way, more strictly (``strict``): there a value is the
writer's own text or the record is tampered with, because SQL reads the text itself.

PostgreSQL types what it stores (``jsonb``, ``timestamptz``, ``text``): nothing to do there.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from sqlalchemy import JSON, Column, DateTime, Dialect, String, type_coerce
from sqlalchemy.sql.elements import ColumnElement

__all__ = ["StoredValues"]


class StoredValues:
    """How to read ``columns`` (of a table or a view) through ``dialect``, row by row."""

    def __init__(self, dialect: Dialect, columns: Iterable[Column[Any]]) -> None:
        self.sqlite = dialect.name == "sqlite"
        self.decoders: dict[str, Any] = {}  # JSON and time columns: their decoder
        self.encoders: dict[str, Any] = {}  # time columns: the text the writer stores for a value
        self.texts: list[str] = []  # text columns: a BLOB there is no text
        if not self.sqlite:
            return
        for col in columns:
            if isinstance(col.type, (JSON, DateTime)):
                impl = col.type.dialect_impl(dialect)
                self.decoders[col.name] = impl.result_processor(dialect, None)
                if isinstance(col.type, DateTime):
                    self.encoders[col.name] = impl.bind_processor(dialect)
            elif isinstance(col.type, String):
                self.texts.append(col.name)

    def select(self, columns: Iterable[ColumnElement[Any]]) -> list[ColumnElement[Any]]:
        """``columns`` to select, the ones decoded here as their stored text."""
        return [type_coerce(col, String).label(col.name) if col.name in self.decoders else col for col in columns]

    def decode(self, record: dict[str, Any], strict: bool = False) -> list[str]:
        """Decode ``record``'s columns in place; what could not be read, one ``name: why``
        each (the value is then None). ``strict`` (verify): also what SQL would read
        otherwise than the value read here."""
        problems = []
        for name in self.texts:
            if isinstance(record.get(name), bytes):
                record[name] = None
                problems.append(f"{name}: a BLOB, no text")
        for name, decode in self.decoders.items():
            text = record.get(name)
            if text is None or decode is None:
                continue
            try:
                record[name] = decode(text)
            except (ValueError, TypeError) as e:
                record[name] = None
                problems.append(f"{name}: {type(e).__name__}")
                continue
            if strict and (problem := self._written_otherwise(name, text, record[name])) is not None:
                problems.append(f"{name}: {problem}")
        return problems

    def _written_otherwise(self, name: str, text: Any, value: Any) -> str | None:
        """Why SQL reads ``text`` otherwise than ``value`` (None: it does not).

        A time the hash reads as the same instant (``2026-01-02T03:04:05+05:00``, or
        without its microseconds) sorts elsewhere in ``list --since`` and ``purge``, and
        a JSON object holding a key twice shows SQL the first value, the hash the last.
        """
        if name in self.encoders:
            if value.tzinfo is not None or self.encoders[name](value) != text:
                return f"{str(text)[:40]!r} is no time as the writer writes it (SQL compares the text)"
            return None
        key = _duplicate_key(text)
        return None if key is None else f"an object holds the key {str(key)[:40]!r} twice (SQL reads the first)"


class _Duplicate(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _unique_pairs(pairs: list[tuple[str, Any]]) -> None:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _Duplicate(key)
        seen.add(key)


def _duplicate_key(stored: Any) -> str | None:
    """The first key some object of the stored JSON text holds twice, else None.

    The writer serializes dicts, so it never stores one; a forger can. The hash is taken
    over the value as verify reads it (the last of the two, as orjson and Python do),
    while SQLite's ``json_extract`` and ``->>`` read the first: a record whose SQL shows
    forged content would check out. Python's own parser is used for its pairs hook
    (orjson has none); a third of orjson's speed, and only text that can hold an object
    is read twice.
    """
    if not isinstance(stored, str) or not stored.lstrip().startswith(("{", "[")):
        return None
    try:
        json.loads(stored, object_pairs_hook=_unique_pairs)
    except _Duplicate as e:
        return e.key
    except (ValueError, RecursionError):
        return None  # (orjson read it; what Python's parser refuses cannot be told apart here)
    return None
