"""Making any row storable before it is sealed: what a backend cannot hold is reduced, with a finding.

The writer hands every row through :func:`prepare` on its thread, before the row joins the
hash chain (a row changed after its seal would break the chain). Whatever a row holds, the
prepared row can be serialized (orjson, the spool), written to SQLite and to PostgreSQL:

- JSON nested deeper than :data:`MAX_DEPTH` (254 levels: orjson writes no more; SQLite's
  JSON functions read 1000) is stored as its JSON text, a JSON string, whole;
- strings with lone surrogates (mitmproxy decodes header values and paths with
  ``surrogateescape``; lenient JSON parsers yield ``\\ud800``) get U+FFFD in their place;
- integers beyond 64 bits inside JSON become their decimal text; dict keys that are not
  strings become strings; a JSON column's value that is a bare number (a client's body
  ``1.0``) is stored as its JSON text (SQLite's column affinity would store the integer 1);
- on PostgreSQL, U+0000 (which text and ``jsonb`` cannot hold) becomes U+FFFD;
- a value larger than ``max_bytes`` (PostgreSQL's ``jsonb`` holds 256 MB, its text 1 GB,
  SQLite 1,000,000,000 bytes) keeps its first ``max_bytes`` bytes: the column then holds
  that text (a JSON column: a prefix of its JSON text, as a JSON string);
- a string longer than its column (``varchar(255)`` on PostgreSQL) is cut to fit; an
  integer outside its column's range, or a value of the wrong type, is stored as NULL; a key
  that is no column is dropped.

Each reduction adds a ``stored_reduced`` finding to the row's ``findings`` naming the column,
what was done, and for cut values the full length and the SHA-256 of the whole, so that
nothing is changed silently.

The common row costs one orjson serialization per JSON and content column, which the
chain's content hashes reuse (:data:`Prepared.hashes`), and a scan of the short strings.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import JSON, BigInteger, Boolean, DateTime, Integer, Numeric, String

from storage import chain
from storage.chain import CONTENT_COLUMNS, STORED_FORMS, split_big_strings
from storage.schema import exchanges

MAX_DEPTH = 254  # JSON nesting stored as JSON (orjson's limit); deeper is stored as its JSON text
MAX_VALUE_BYTES = 128 * 1024 * 1024  # one value's bytes as JSON; under every backend's limit
REDUCED = "stored_reduced"  # the finding code
_SORTED = orjson.OPT_SORT_KEYS
_NULL_HASH = hashlib.sha256(b"null").hexdigest()
_ESCAPED_NUL = re.compile(rb"(?<!\\)((?:\\\\)*)\\u0000")
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
_MINIMAL = (
    "id",
    "started_at",
    "first_chunk_at",
    "ended_at",
    "status",
    "dialect",
    "provider",
    "proxy_instance",
    "streamed",
    "http_method",
    "http_status",
    "request_model",
    "user_id",
    "session_id",
)


@dataclass(slots=True)
class Prepared:
    """A row as it is stored, and the content hashes of its content columns (for sealing)."""

    row: dict[str, Any]
    hashes: dict[str, str]


class _Notes:
    """The reductions made to one row, turned into findings at the end."""

    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, column: Any, what: str) -> None:
        name = column if isinstance(column, str) and column.isidentifier() and column.isascii() else repr(column)[:80]
        self.items.append(f"{name}: {what}")


def prepare(row: dict[str, Any], *, postgres: bool, max_bytes: int = MAX_VALUE_BYTES) -> Prepared:
    """The row as it can be stored on this backend (a copy when anything changed; see the module).

    Values that are plainly fine (an integer in range, a short ASCII string, a time, a
    boolean, NULL) are passed by type without a call: this loop runs for every column of
    every row. JSON and text columns are checked by serializing them, which also gives the
    content hashes.
    """
    notes = _Notes()
    hashes: dict[str, str] = {}
    changed: dict[str, Any] = {}
    dropped: list[str] = []
    streamed = _STREAMED if _may_hold_big_strings(row) else ()
    for name, value in row.items():
        kind = type(value)
        if kind is str:
            chars = _STR_CHARS.get(name)
            if chars is not None and len(value) <= chars and value.isascii() and not (postgres and "\x00" in value):
                continue
        elif kind is int:
            bounds = _INT_BOUNDS.get(name)
            if bounds is not None and bounds[0] <= value <= bounds[1]:
                continue
        elif value is None:
            if name in _SPECS:
                continue
        elif kind is float:
            if name in _NUMERIC and math.isfinite(value) and abs(value) < _NUMERIC[name]:
                continue
        elif kind is datetime or kind is bool:
            if _PLAIN.get(name) is kind:
                continue
        spec = _SPECS.get(name)
        if spec is None:
            dropped.append(name)
            notes.add(name, f"not a column of exchanges; dropped ({_digest_note(value)})")
            continue
        if value is None:
            continue
        check, content = spec
        if name in streamed and (digest := _streamed_hash(name, value, postgres, max_bytes)) is not None:
            hashes[name] = digest  # stored as it is
            continue
        if name in streamed and (cut := _cut_streamed(name, value, notes, postgres, max_bytes)) is not None:
            changed[name], hashes[name] = cut
            continue
        stored, encoded = check(name, value, notes, postgres, max_bytes)
        if content and encoded is not None:
            hashes[name] = hashlib.sha256(encoded).hexdigest()
        if stored is not value:
            changed[name] = stored
    for name in CONTENT_COLUMNS:
        if name not in hashes:
            hashes[name] = _NULL_HASH  # only NULL content has no hash by now
    out = row
    if changed or dropped:
        out = {k: v for k, v in row.items() if k not in dropped} | changed
    if any(out.get(name) is None for name in _REQUIRED):
        out = dict(out) if out is row else out
        _required(out, notes)
    if notes.items:
        out = dict(out) if out is row else out
        findings = out.get("findings")
        findings = list(findings) if isinstance(findings, list) else []
        findings += [{"code": REDUCED, "detail": item} for item in notes.items]
        out["findings"] = findings
    return Prepared(out, hashes)


def _may_hold_big_strings(row: dict[str, Any]) -> bool:
    """Whether the answer columns are worth a look for big strings (:func:`_streamed_hash`):
    a long answer text, or a response body of :data:`_STREAMED_FROM` bytes (compressed, it
    may hold far more text). The common row, a short answer, costs no look at all; a row
    passed by is hashed whole, as the checks always did."""
    text, body = row.get("output_text"), row.get("bytes_from_upstream")
    return (type(text) is str and len(text) >= chain.BIG_STRING) or (type(body) is int and body >= _STREAMED_FROM)


def _streamed_hash(name: str, value: Any, postgres: bool, max_bytes: int) -> str | None:
    """The content hash of a content value holding big strings (the answer of a long
    stream), taken piece by piece (:func:`storage.chain.split_big_strings`) instead of over
    its whole JSON, which would copy the text once more while the row is prepared. Only for
    a value the checks would store as it is; None (the checks run) for anything else: no
    big string, a text column's value that is not text, a value orjson refuses, U+0000 on
    PostgreSQL, over ``max_bytes``. The bytes hashed are those the checks would hash."""
    if name not in _JSON_COLUMNS and type(value) is not str:
        return None
    try:
        pieces = split_big_strings(value)
    except TypeError:
        return None
    if pieces is None:
        return None
    if postgres and (
        b"\\u0000" in pieces.skeleton or any("\x00" in text or "\\u0000" in text for *_, text in pieces.strings)
    ):
        return None  # as the checks see it: an escaped U+0000 in the JSON (or the text of one)
    digest = hashlib.sha256()
    size = 0
    try:
        for piece in pieces:
            digest.update(piece)
            size += len(piece)
    except TypeError:  # lone surrogates
        return None
    return digest.hexdigest() if size <= max_bytes else None


def _cut_streamed(name: str, value: Any, notes: _Notes, postgres: bool, max_bytes: int) -> tuple[str, str] | None:
    """A long text over ``max_bytes`` as JSON, cut as :func:`_check_text` cuts it (the
    same text kept, the same note, the same content hash) a slice at a time: that check
    holds the text's JSON, its UTF-8 and the part kept all at once, several times the
    text (a 200 MiB answer peaked at five times its size). (kept text, content hash), or
    None for anything else (the check runs): not a long text, not over, lone surrogates,
    U+0000 on PostgreSQL."""
    if (
        name in _JSON_COLUMNS
        or type(value) is not str
        or len(value) < chain.BIG_STRING
        or (postgres and "\x00" in value)
    ):
        return None  # (a JSON column's string is checked, and cut, as JSON)
    step = chain._SLICE
    json_size, size, whole = 2, 0, hashlib.sha256()
    keep: int | None = None  # characters kept: the whole ones within max_bytes of UTF-8
    kept_size = 0
    for i in range(0, len(value), step):
        part = value[i : i + step]
        try:
            json_size += len(orjson.dumps(part)) - 2
        except TypeError:  # lone surrogates
            return None
        data = part.encode()
        if keep is None and size + len(data) > max_bytes:
            head = data[: max_bytes - size].decode("utf-8", "ignore")
            keep, kept_size = i + len(head), size + len(head.encode())
        size += len(data)
        whole.update(data)
    if json_size <= max_bytes:
        return None
    kept = value if keep is None else value[:keep]
    kept_size = size if keep is None else kept_size
    notes.add(
        name,
        f"{size} bytes, over the {max_bytes} stored: kept the first {kept_size} bytes of "
        f"the text; sha256 of the whole: {whole.hexdigest()}",
    )
    digest = hashlib.sha256()
    for piece in chain.canonical_pieces(kept):
        digest.update(piece)
    return kept, digest.hexdigest()


def minimal_row(row: dict[str, Any], reason: str) -> dict[str, Any]:
    """What is kept of a row the database refused even after :func:`prepare`: who, when,
    its status, and a finding with the reason and the SHA-256 of what was refused."""
    kept = {name: row.get(name) for name in _MINIMAL if name in row}
    detail = f"the database refused the record ({reason}); kept only {', '.join(kept)}; {_digest_note(row)}"
    kept["findings"] = [{"code": REDUCED, "detail": detail}]
    return kept


def _required(out: dict[str, Any], notes: _Notes) -> None:
    """The NOT NULL columns: a row without them is given a placeholder, and says so."""
    for name, default in _REQUIRED.items():
        if out.get(name) is None:
            value = uuid.uuid4().hex if name == "id" else default
            notes.add(name, f"missing; stored {value!r}")
            out[name] = value


# -- the checks, one per column type ------------------------------------------------------------
# Each takes (column, value, notes, postgres, max_bytes) and returns (stored value, its JSON
# bytes when they were made, for the content hash). :func:`prepare` calls them for the
# values its fast path does not pass.


def _check_json(name: str, value: Any, notes: _Notes, postgres: bool, max_bytes: int) -> tuple[Any, bytes]:
    if type(value) in (int, float):  # (a client's body that is a bare number)
        # SQLite's JSON columns take a number's text as a number ("1.0" becomes the
        # integer 1), which no longer hashes as the value sealed: the record would read
        # as tampered with. Kept as its JSON text, on both backends alike.
        notes.add(name, "a bare number: stored as its JSON text, a JSON string")
        value = json.dumps(value)  # (NaN and Infinity as the lenient readers that took them write them)
    try:
        encoded = orjson.dumps(value, option=_SORTED)
    except TypeError:
        value = _sanitize(name, value, notes)
        encoded = orjson.dumps(value, option=_SORTED)
    if postgres and b"\\u0000" in encoded:
        notes.add(
            name, f"{encoded.count(b'\\u0000')} U+0000 characters stored as U+FFFD (PostgreSQL cannot hold U+0000)"
        )
        encoded = _ESCAPED_NUL.sub(rb"\1\\ufffd", encoded)
        value = orjson.loads(encoded)
        encoded = orjson.dumps(value, option=_SORTED)
    if len(encoded) > max_bytes:
        value = _cut(name, encoded.decode(), encoded, notes, max_bytes, "its JSON text")
        encoded = orjson.dumps(value)
    return value, encoded


def _check_text(
    name: str, value: Any, notes: _Notes, postgres: bool, max_bytes: int, chars: int | None = None
) -> tuple[Any, bytes | None]:
    if not isinstance(value, str):
        notes.add(name, f"a {type(value).__name__}, not text; stored as its text")
        value = _text_of(value)
    content = name in CONTENT_COLUMNS
    encoded = None
    if content or len(value) * 4 > max_bytes or not value.isascii():
        try:
            encoded = orjson.dumps(value)
        except TypeError:  # lone surrogates
            value = valid_text(value)
            notes.add(name, "lone surrogates replaced by U+FFFD")
            encoded = orjson.dumps(value)
    if postgres and "\x00" in value:
        notes.add(name, f"{value.count(chr(0))} U+0000 characters stored as U+FFFD (PostgreSQL cannot hold U+0000)")
        value = value.replace("\x00", "\ufffd")
        encoded = orjson.dumps(value) if encoded is not None else None
    if chars is not None and len(value) > chars:
        whole = value.encode()
        notes.add(
            name,
            f"{len(value)} characters, longer than the column's {chars}: kept the first {chars}; "
            f"sha256 of the whole: {hashlib.sha256(whole).hexdigest()}",
        )
        value = value[:chars]
        encoded = orjson.dumps(value) if encoded is not None else None
    if encoded is not None and len(encoded) > max_bytes:
        value = _cut(name, value, value.encode(), notes, max_bytes, "the text")
        encoded = orjson.dumps(value)
    return value, (encoded if content else None)


def _check_string(chars: int) -> Callable[..., tuple[Any, bytes | None]]:
    def check(name: str, value: Any, notes: _Notes, postgres: bool, max_bytes: int) -> tuple[Any, bytes | None]:
        return _check_text(name, value, notes, postgres, max_bytes, chars)

    return check


def _check_int(bounds: tuple[int, int]) -> Callable[..., tuple[Any, None]]:
    low, high = bounds

    def check(name: str, value: Any, notes: _Notes, postgres: bool, max_bytes: int) -> tuple[Any, None]:
        if isinstance(value, int) and not isinstance(value, bool):
            notes.add(name, f"{_int_text(value)} does not fit the column ({low}..{high}); stored NULL")
        else:
            notes.add(name, f"a {type(value).__name__}, not an integer; stored NULL")
        return None, None

    return check


def _check_number(name: str, value: Any, notes: _Notes, postgres: bool, max_bytes: int) -> tuple[Any, None]:
    if isinstance(value, int | float) and not isinstance(value, bool):
        if math.isfinite(value) and abs(value) < _NUMERIC[name]:
            return float(value), None
        notes.add(name, f"{value!r} does not fit the column (below {_NUMERIC[name]:g}); stored NULL")
    else:
        notes.add(name, f"a {type(value).__name__}, not a number; stored NULL")
    return None, None


def _check_time(name: str, value: Any, notes: _Notes, postgres: bool, max_bytes: int) -> tuple[Any, None]:
    notes.add(name, f"a {type(value).__name__}, not a time; stored NULL")
    return None, None


def _check_bool(name: str, value: Any, notes: _Notes, postgres: bool, max_bytes: int) -> tuple[Any, None]:
    notes.add(name, f"a {type(value).__name__}, not a boolean; stored {bool(value)}")
    return bool(value), None


def _specs() -> dict[str, tuple[Callable[..., tuple[Any, bytes | None]], bool]]:
    """Each column's (check, is content), by its type in :data:`storage.schema.exchanges`."""
    specs: dict[str, tuple[Callable[..., tuple[Any, bytes | None]], bool]] = {}
    for column in exchanges.columns:
        if column.name in STORED_FORMS:  # the writer's to fill, never a record's (a record carrying it drops it)
            continue
        kind = column.type
        check: Callable[..., tuple[Any, bytes | None]]
        if isinstance(kind, JSON):
            check = _check_json
        elif isinstance(kind, DateTime):
            check = _check_time
        elif isinstance(kind, Boolean):
            check = _check_bool
        elif isinstance(kind, Integer):  # BigInteger is one
            check = _check_int(_INT64 if isinstance(kind, BigInteger) else _INT32)
        elif isinstance(kind, Numeric):
            check = _check_number
        elif isinstance(kind, String) and kind.length:
            check = _check_string(kind.length)
        else:
            check = _check_text
        specs[column.name] = (check, column.name in CONTENT_COLUMNS)
    return specs


_SPECS = _specs()
# the content columns the record builds from the answer, the ones that hold a long stream's
# text (a prompt is hashed whole: looking through a long conversation for a big string would
# cost every row more than it saves)
_STREAMED_FROM = 64 * 1024
_STREAMED = frozenset(("output_text", "output", "tool_calls", "delivered_text"))
_JSON_COLUMNS = frozenset(c.name for c in exchanges.columns if isinstance(c.type, JSON))
# the fast path of :func:`prepare`: string columns' lengths, integer columns' ranges, and
# the type a time or boolean column takes as it is (NULL for the others)
_STR_CHARS = {c.name: c.type.length for c in exchanges.columns if isinstance(c.type, String) and c.type.length}
_INT_BOUNDS = {
    c.name: _INT64 if isinstance(c.type, BigInteger) else _INT32
    for c in exchanges.columns
    if isinstance(c.type, Integer)
}
# numeric columns: the bound their values stay below (numeric(20, 12): 10**8)
_NUMERIC = {
    c.name: 10.0 ** ((c.type.precision or 20) - (c.type.scale or 0))
    for c in exchanges.columns
    if isinstance(c.type, Numeric)
}
_PLAIN = {
    c.name: datetime if isinstance(c.type, DateTime) else bool
    for c in exchanges.columns
    if isinstance(c.type, DateTime | Boolean)
}
_REQUIRED = {"id": None, "status": "failed", "dialect": "unknown", "streamed": False}  # NOT NULL: placeholders


# -- reductions --------------------------------------------------------------------------------


def _cut(name: str, text: str, whole: bytes, notes: _Notes, max_bytes: int, what: str) -> str:
    """The first ``max_bytes`` bytes of ``text`` (whole UTF-8 characters), noted with the whole's length and hash."""
    kept = whole[:max_bytes].decode("utf-8", "ignore")
    notes.add(
        name,
        f"{len(whole)} bytes, over the {max_bytes} stored: kept the first {len(kept.encode())} bytes of "
        f"{what}; sha256 of the whole: {hashlib.sha256(whole).hexdigest()}",
    )
    return kept


def _sanitize(name: str, value: Any, notes: _Notes) -> Any:
    """A copy of a JSON value orjson refused, made serializable (iteratively: any depth).

    Strings get U+FFFD for lone surrogates, keys become strings, integers beyond 64 bits
    their decimal text, other objects their text; nested deeper than :data:`MAX_DEPTH`, the
    whole value becomes its JSON text.
    """
    counts = {"surrogates": 0, "keys": 0, "integers": 0, "objects": 0}
    depth = 0
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any, int]] = [(value, root, 0, 1)]  # (value, parent, key in parent, depth)
    while stack:
        item, parent, key, level = stack.pop()
        if isinstance(item, dict | list | tuple):
            depth = max(depth, level)
        if isinstance(item, dict):
            copy: dict[str, Any] = {}
            for k, v in item.items():
                if not isinstance(k, str):
                    counts["keys"] += 1
                    k = _text_of(k)
                k = _clean_str(k, counts)
                copy[k] = None
                stack.append((v, copy, k, level + 1))
            parent[key] = copy
        elif isinstance(item, list | tuple):
            items: list[Any] = [None] * len(item)
            stack.extend((v, items, i, level + 1) for i, v in enumerate(item))
            parent[key] = items
        else:
            parent[key] = _clean_leaf(item, counts)
    clean = root[0]
    for what, n in counts.items():
        if n:
            notes.add(
                name,
                {
                    "surrogates": f"{n} strings with lone surrogates: U+FFFD in their place",
                    "keys": f"{n} keys that are not strings turned into strings",
                    "integers": f"{n} integers beyond 64 bits stored as their decimal text",
                    "objects": f"{n} values that are not JSON stored as their text",
                }[what],
            )
    if depth > MAX_DEPTH:
        text = json_text(clean)
        notes.add(
            name,
            f"nested {depth} levels deep, more than the {MAX_DEPTH} stored as JSON: stored as its JSON "
            f"text ({len(text)} characters, sha256 {hashlib.sha256(text.encode()).hexdigest()})",
        )
        return text
    return clean


def _clean_str(value: str, counts: dict[str, int]) -> str:
    try:
        value.encode()
        return value
    except UnicodeEncodeError:
        counts["surrogates"] += 1
        return valid_text(value)


def _clean_leaf(value: Any, counts: dict[str, int]) -> Any:
    if isinstance(value, str):
        return _clean_str(value, counts)
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return value
    if isinstance(value, int):
        if _INT64[0] <= value <= 2**64 - 1:
            return value
        counts["integers"] += 1
        return _int_text(value)
    counts["objects"] += 1
    return _clean_str(_text_of(value), counts)


def json_text(value: Any) -> str:
    """JSON text of a value however deep (orjson stops at 254 levels), iteratively; a leaf
    orjson refuses is written as its text (U+FFFD for lone surrogates)."""
    out: list[str] = []
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, _Raw):
            out.append(item.text)
        elif isinstance(item, dict):
            parts: list[Any] = []
            for i, (k, v) in enumerate(item.items()):
                parts += [_Raw(("," if i else "") + _leaf_json(k if isinstance(k, str) else _text_of(k)) + ":"), v]
            stack += [_Raw("}"), *reversed(parts)]
            out.append("{")
        elif isinstance(item, list | tuple):
            parts = []
            for i, v in enumerate(item):
                parts += [_Raw(","), v] if i else [v]
            stack += [_Raw("]"), *reversed(parts)]
            out.append("[")
        else:
            out.append(_leaf_json(item))
    return "".join(out)


def _leaf_json(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return orjson.dumps(valid_text(_text_of(value))).decode()


@dataclass(slots=True)
class _Raw:
    text: str


def valid_text(value: str) -> str:
    """``value`` with U+FFFD for each lone surrogate (pairs written as two code points are joined)."""
    return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _int_text(value: int) -> str:
    try:
        return str(value)
    except ValueError:  # more digits than Python converts
        return f"[an integer of {value.bit_length()} bits]"


def _text_of(value: Any) -> str:
    try:
        return value if isinstance(value, str) else str(value)
    except Exception:  # noqa: BLE001 - any object's str() may fail; the row is written regardless
        return f"[a {type(value).__name__}]"


def _digest_note(value: Any) -> str:
    """The size and SHA-256 of a value as JSON, for a finding about what was not kept."""
    try:
        data = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS, default=_text_of)
    except TypeError:
        data = _text_of(value).encode("utf-8", "replace")
    return f"{len(data)} bytes as JSON, sha256 {hashlib.sha256(data).hexdigest()}"
