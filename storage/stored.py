"""Values SQLite may hold anything in, read row by row: what every reader of records shares.

SQLite keeps whatever a writer puts in any column: text that is no JSON in a JSON column,
``yesterday`` in a time column, a BLOB where a number or text belongs. SQLAlchemy decodes
JSON, time, number and boolean columns as it fetches, so one such value, planted by
whoever can write the database, stopped ``list``, ``export`` and the review pages for
every record. So on SQLite every column is selected as it is stored
(:meth:`StoredValues.select`) and read here, one row at a time
(:meth:`StoredValues.decode`): a value of another type, or that cannot be decoded,
becomes None and is named, and the rest of the row and the other rows are read.
``verify`` reads the same way, more strictly (``strict``): there a value must also be the
writer's own text, because SQL reads the text itself.

PostgreSQL types what it stores (``jsonb``, ``timestamptz``, ``bigint``, ``text``):
nothing to do there.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import orjson
from sqlalchemy import JSON, Boolean, Column, DateTime, Dialect, Integer, LargeBinary, Numeric, String, type_coerce
from sqlalchemy.sql.elements import ColumnElement

from storage.schema import JSON_BARE_NUMBER, JSON_LISTS, JSON_OBJECTS

__all__ = ["StoredValues", "Unreadable"]

# What SQLite gives back for a value the writer stored in a column of each kind.
_INTEGER, _NUMBER, _TEXT = (int,), (int, float), (str,)
_KIND_NAMES: dict[tuple[type, ...], str] = {_INTEGER: "integer", _NUMBER: "number", _TEXT: "text"}
# The Python types of the JSON columns' values as the writer stores them (storage.schema)
_SHAPES: dict[str, tuple[type, ...]] = {name: (list, str) for name in JSON_LISTS} | {
    name: (dict, str) for name in JSON_OBJECTS
}


class Unreadable:
    """The records a reader met with values llm-audit did not write: how many, and the
    first few named ("ID: column: why"). Bounded: an export of a database planted with
    millions of them keeps no list of them all."""

    KEEP = 10

    def __init__(self) -> None:
        self.count = 0
        self.named: list[str] = []

    def add(self, line: str) -> None:
        self.count += 1
        if len(self.named) < self.KEEP:
            self.named.append(line)

    def __bool__(self) -> bool:
        return self.count > 0


class _Unreadable(Exception):
    """Why a stored value is not one the writer stores (the message)."""


class StoredValues:
    """How to read ``columns`` (of a table or a view) through ``dialect``, row by row."""

    def __init__(self, dialect: Dialect, columns: Iterable[Column[Any]]) -> None:
        self.sqlite = dialect.name == "sqlite"
        self.kinds: dict[str, tuple[type, ...]] = {}  # the Python types a column's stored value may have
        self.decoders: dict[str, Any] = {}  # JSON and time columns: their SQLAlchemy decoder
        self.encoders: dict[str, Any] = {}  # time columns: the text the writer stores for a value
        self.booleans: list[str] = []
        if not self.sqlite:
            return
        for col in columns:
            kind = col.type
            if isinstance(kind, LargeBinary):
                continue  # (bytes: read as they are)
            if isinstance(kind, (JSON, DateTime)):
                impl = kind.dialect_impl(dialect)
                self.decoders[col.name] = impl.result_processor(dialect, None)
                if isinstance(kind, DateTime):
                    self.encoders[col.name] = impl.bind_processor(dialect)
            elif isinstance(kind, Boolean):
                self.booleans.append(col.name)
            elif isinstance(kind, Integer):
                self.kinds[col.name] = _INTEGER
            elif isinstance(kind, Numeric):
                self.kinds[col.name] = _NUMBER
            elif isinstance(kind, String):
                self.kinds[col.name] = _TEXT

    def select(self, columns: Iterable[ColumnElement[Any]]) -> list[ColumnElement[Any]]:
        """``columns`` to select, each read here as it is stored (SQLAlchemy decodes none)."""
        raw = {*self.decoders, *self.booleans, *self.kinds}
        return [type_coerce(col, String).label(col.name) if col.name in raw else col for col in columns]

    def decode(self, record: dict[str, Any], strict: bool = False) -> list[str]:
        """Read ``record``'s columns in place; what could not be read, one ``name: why``
        each (the value is then None). ``strict`` (verify): also what SQL would read
        otherwise than the value read here."""
        problems = []
        for name, kinds in self.kinds.items():
            value = record.get(name)
            if (
                value is not None
                and type(value) not in kinds
                and not (
                    not strict and kinds is _INTEGER and type(value) is float  # (the view's sum past 2^63 is a real)
                )
            ):
                record[name] = None
                problems.append(f"{name}: {_what(value)}, no {_KIND_NAMES[kinds]}")
        for name in self.booleans:
            value = record.get(name)
            if value is None:
                continue
            record[name] = bool(value) if type(value) is int and value in (0, 1) else None
            if record[name] is None:
                problems.append(f"{name}: {_what(value)}, no boolean")
        for name, decode in self.decoders.items():
            stored = record.get(name)
            if stored is None or decode is None:
                continue
            try:
                record[name] = self._read(name, stored, decode, strict)
            except (_Unreadable, ValueError, TypeError) as e:
                record[name] = None
                problems.append(f"{name}: {e if isinstance(e, _Unreadable) else type(e).__name__}")
        return problems

    def _read(self, name: str, stored: Any, decode: Any, strict: bool) -> Any:
        """A JSON or time column's value; raises :class:`_Unreadable` (or the decoder's error)."""
        if name in self.encoders:
            if type(stored) is not str:
                raise _Unreadable(f"{_what(stored)}, no time")
            value = decode(stored)
            if strict and (value.tzinfo is not None or self.encoders[name](value) != stored):
                raise _Unreadable(f"{stored[:40]!r} is no time as the writer writes it (SQL compares the text)")
            return value
        if type(stored) in _NUMBER and name == JSON_BARE_NUMBER:
            return stored  # (JSON text that is a number: SQLite's column affinity stores it as one)
        if type(stored) is not str:
            raise _Unreadable(f"{_what(stored)}, no JSON text")
        value = decode(stored)
        shape = _SHAPES.get(name)
        if shape is not None and value is not None and type(value) not in shape:
            raise _Unreadable(f"JSON {type(value).__name__}, no {shape[0].__name__}")
        if strict and orjson.dumps(value).decode() != stored:
            # The writer stores orjson's text of the value, and SQL reads the text: an
            # escape (\u0068 for h) hides a word from --contains, a key held twice shows
            # json_extract the first value where the hash read the last.
            key = _duplicate_key(stored)
            raise _Unreadable(
                "its JSON text is not as the writer writes it (SQL reads the text)"
                if key is None
                else f"an object holds the key {key[:40]!r} twice (SQL reads the first)"
            )
        return value


def _what(value: Any) -> str:
    """What SQLite gave back, in words (its storage class)."""
    return {bytes: "a BLOB", int: "an integer", float: "a real number", str: "text"}.get(type(value), "a value")


class _Duplicate(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _unique_pairs(pairs: list[tuple[str, Any]]) -> None:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _Duplicate(key)
        seen.add(key)


def _duplicate_key(stored: str) -> str | None:
    """The first key some object of ``stored`` (JSON text) holds twice, else None: what
    makes its text differ from the writer's, named (Python's parser, for its pairs hook)."""
    try:
        json.loads(stored, object_pairs_hook=_unique_pairs)
    except _Duplicate as e:
        return str(e.key)
    except (ValueError, RecursionError):
        pass
    return None
