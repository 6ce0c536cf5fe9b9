"""Tamper evidence: the hash chain every final record joins.

Each proxy instance keeps one chain (its ``chain_id`` is the instance name, so proxies
sharing a database never contend). When a record is final, the writer *seals* it:

- ``content_hashes``: for each content column (:data:`CONTENT_COLUMNS`: prompts, output,
  tool calls) the SHA-256 of its canonical JSON. Content enters the chain only through
  these, so it can later be erased (``llm-audit erase``) without breaking the chain.
- ``record_hash`` = SHA-256 of the canonical serialization (:func:`canonical`) of the
  record's other audited columns, its content hashes, its chain id and ``prev_hash``,
  the ``record_hash`` of the record before it in the chain (:data:`GENESIS` for the
  first); ``chain_seq`` numbers the records 1, 2, 3, ... in chain order.

The canonical serialization is JSON with sorted keys and no spaces (orjson,
``OPT_SORT_KEYS``) of ``{"chain": id, "prev": hash, "content": {column: hash},
"fields": {column: value}}``, where ``fields`` holds every column of ``exchanges`` but
the content columns, the chain's own columns (:data:`CHAIN_COLUMNS`) and the derived
ones (:data:`DERIVED_COLUMNS`: the cost, recomputed from the hashed usage when prices
change), and times are
written ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (UTC; a database that returns naive times
returns UTC ones). NULL columns are left out, so that a column a later version adds does
not change the hashes of earlier records. ``chain_seq`` is not hashed: the order is carried by the links, so
that two records swapped in place are told apart from edited ones.

A chain alone does not stop whoever can write the database from rebuilding it; signed
checkpoints of its head, kept elsewhere (:mod:`storage.checkpoint`), do.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from storage.schema import ANSWER_BYTES, IN_PROGRESS, exchanges

GENESIS = "0" * 64  # the prev_hash of a chain's first record
ERASED = "[erased]"  # what erased content is replaced with
CHAIN_COLUMNS = ("chain_id", "chain_seq", "prev_hash", "record_hash", "content_hashes", "erased_at")
CONTENT_COLUMNS = ("request_body", "output_text", "output", "tool_calls", "delivered_text")
# Derived data, not evidence: the cost is computed from the usage (which is hashed) and a
# price list, and is computed again when prices change (llm-audit cost recompute); hashed,
# every recompute would break the chain of every record it touched.
DERIVED_COLUMNS = ("cost_usd", "cost_prices")
_FIRST = ("chain_id", "chain_seq", "prev_hash", "record_hash", "id")  # a sealed row's first keys
# Other forms of a content column, not fields (each: the content column it stands in for):
# a huge answer's UTF-8 bytes on SQLite, in place of output_text (storage/writer.py). The
# record is hashed with the content column; erasure drops the form (storage/erase.py).
STORED_FORMS = {ANSWER_BYTES: "output_text"}
FIELD_COLUMNS = tuple(
    str(c.name)
    for c in exchanges.columns
    if c.name not in (*CHAIN_COLUMNS, *CONTENT_COLUMNS, *DERIVED_COLUMNS, *STORED_FORMS)
)


def content_hash(value: Any) -> str:
    """SHA-256 (hex) of a content column's canonical JSON (``null`` for NULL), hashed piece
    by piece (:func:`canonical_pieces`): a huge answer is never serialized whole."""
    digest = hashlib.sha256()
    for piece in canonical_pieces(value):
        digest.update(piece)
    return digest.hexdigest()


# Strings of at least this many characters are serialized a slice at a time when a content
# value is hashed; containers beyond this many nodes are serialized whole (walking them in
# Python would cost more than the copy saves).
BIG_STRING = 1 << 20
_SLICE = 1 << 20
_MAX_NODES = 32


@dataclass(slots=True)
class Pieces:
    """A JSON value serialized with its big strings apart: ``skeleton`` is the canonical
    JSON of the value with each big string replaced by a marker, ``strings`` the
    (start, end) of each marker in it and its string, in the skeleton's order. Iterated,
    it gives the canonical JSON of the value itself, piece by piece."""

    skeleton: bytes
    strings: list[tuple[int, int, str]]

    def __iter__(self) -> Iterator[bytes | memoryview]:
        view = memoryview(self.skeleton)
        at = 0
        for start, end, text in self.strings:
            yield view[at:start]
            yield b'"'
            for i in range(0, len(text), _SLICE):  # orjson escapes character by character
                yield memoryview(orjson.dumps(text[i : i + _SLICE]))[1:-1]
            yield b'"'
            at = end
        yield view[at:]


def utf8_slices(text: str) -> Iterator[bytes]:
    """``text`` in UTF-8, :data:`_SLICE` characters at a time: a huge text is never encoded
    whole (a slice of a ``str`` never splits a character)."""
    for i in range(0, len(text), _SLICE):
        yield text[i : i + _SLICE].encode()


def utf8_size(text: str) -> int:
    """The length of ``text`` in UTF-8, counted a slice at a time (:func:`utf8_slices`)."""
    return len(text) if text.isascii() else sum(map(len, utf8_slices(text)))


def canonical_pieces(value: Any) -> Iterable[bytes | memoryview]:
    """``orjson.dumps(value, option=OPT_SORT_KEYS)`` in pieces whose concatenation is exactly
    those bytes, without the whole in memory when ``value`` holds big strings (the answer
    text of a long stream); raises ``TypeError`` where ``orjson.dumps`` does."""
    pieces = split_big_strings(value)
    return (orjson.dumps(value, option=orjson.OPT_SORT_KEYS),) if pieces is None else pieces


def split_big_strings(value: Any) -> Pieces | None:
    """``value``'s :class:`Pieces`, or None when it holds no string of :data:`BIG_STRING`
    characters (as the value, an item or a dict value) within its first :data:`_MAX_NODES`
    nodes. Raises ``TypeError`` where ``orjson.dumps(value, option=OPT_SORT_KEYS)`` does."""
    if not _holds_big_string(value):
        return None
    big: dict[str, str] = {}
    token = ""
    root: list[Any] = [value]
    stack: list[tuple[Any, Any]] = [(root, 0)]  # (container, key) of each value to look at
    while stack:
        parent, key = stack.pop()
        item = parent[key]
        kind = type(item)
        if kind is str:
            if len(item) >= BIG_STRING:
                token = token or uuid.uuid4().hex
                marker = f"{token}:{len(big)}"
                big[marker] = item
                parent[key] = marker
            continue
        if kind is not dict and kind is not list and kind is not tuple:
            continue
        copy: Any = dict(item) if kind is dict else list(item)  # the value itself is never changed
        parent[key] = copy
        stack.extend((copy, k) for k in (copy if kind is dict else range(len(copy))))
    if not big:
        return None
    skeleton = orjson.dumps(root[0], option=orjson.OPT_SORT_KEYS)
    strings = []
    for marker, text in big.items():
        quoted = f'"{marker}"'.encode()
        start = skeleton.find(quoted)
        if start < 0 or skeleton.find(quoted, start + 1) >= 0:
            return None  # the marker is in the content too (never, in practice): serialized whole
        strings.append((start, start + len(quoted), text))
    strings.sort()
    return Pieces(skeleton, strings)


def _holds_big_string(value: Any) -> bool:
    """Whether ``value`` holds a string of :data:`BIG_STRING` characters within its first
    :data:`_MAX_NODES` nodes: a look without copies, as every content value of every row
    gets it (beyond the budget: serialized whole, as a common prompt is)."""
    todo = [value]
    nodes = 0
    while todo:
        item = todo.pop()
        kind = type(item)
        if kind is str:
            if len(item) >= BIG_STRING:
                return True
        elif kind is dict or kind is list or kind is tuple:
            nodes += len(item)
            if nodes > _MAX_NODES:
                return False
            todo.extend(item.values() if kind is dict else item)
    return False


def utc_text(value: datetime) -> str:
    """``YYYY-MM-DDTHH:MM:SS.ffffffZ`` in UTC, as records and checkpoints write times
    (``isoformat``: several times faster than ``strftime``); a naive time is UTC."""
    if value.tzinfo is not None and value.utcoffset():
        value = value.astimezone(UTC)
    return value.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def _field(value: Any) -> Any:
    return utc_text(value) if isinstance(value, datetime) else value


def canonical(row: dict[str, Any], content_hashes: dict[str, str], chain_id: str, prev_hash: str) -> bytes:
    """The bytes a record's hash is taken over (see the module docstring)."""
    doc = {
        "chain": chain_id,
        "prev": prev_hash,
        "content": content_hashes,
        "fields": {name: _field(value) for name in FIELD_COLUMNS if (value := row.get(name)) is not None},
    }
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


def record_hash(row: dict[str, Any], content_hashes: dict[str, str], chain_id: str, prev_hash: str) -> str:
    return hashlib.sha256(canonical(row, content_hashes, chain_id, prev_hash)).hexdigest()


def is_sealed(row: dict[str, Any]) -> bool:
    return row.get("record_hash") is not None


@dataclass(slots=True)
class Head:
    """The last record of a chain: its number and hash."""

    seq: int = 0
    hash: str = GENESIS


class Chain:
    """One writer's chain: seals final records in the order they are handed over.

    Not thread-safe: the writer thread alone uses it.
    """

    def __init__(self, chain_id: str, head: Head) -> None:
        self.chain_id = chain_id
        self.head = head

    def seal(self, row: dict[str, Any], hashes: dict[str, str] | None = None) -> dict[str, Any]:
        """A sealed copy of a final row (rows in progress, and sealed ones, are returned as they are).

        ``hashes`` are the content hashes when the caller already has them (the writer's
        preparation serializes every content column once). The chain's columns and the id
        come first in the copy, so that a spool line cut short still names its record.
        """
        if row["status"] == IN_PROGRESS or is_sealed(row):
            return row
        if hashes is None:
            hashes = {name: content_hash(row.get(name)) for name in CONTENT_COLUMNS}
        digest = record_hash(row, hashes, self.chain_id, self.head.hash)
        sealed = dict.fromkeys(_FIRST)
        sealed.update(row)
        sealed.update(
            chain_id=self.chain_id,
            chain_seq=self.head.seq + 1,
            prev_hash=self.head.hash,
            record_hash=digest,
            content_hashes=hashes,
        )
        self.head = Head(self.head.seq + 1, digest)
        return sealed


def fold_answer_bytes(record: dict[str, Any], sqlite: bool) -> str | None:
    """Put a huge answer stored as UTF-8 bytes (``output_text_utf8``, on SQLite) back in
    ``output_text``, where the record was hashed with it; what is wrong with the stored
    form (None: nothing). The column is removed from ``record`` either way.

    Only the writer fills the column, on SQLite, with the UTF-8 of a final record's
    answer while ``output_text`` is NULL: any other value there (bytes beside a text,
    bytes that are not UTF-8, a number or a text SQLite let in, anything on PostgreSQL,
    whose view never reads it) is tampering, whatever the hash says.
    """
    data = record.pop(ANSWER_BYTES, None)
    if data is None:
        return None
    if not sqlite:
        return f"{ANSWER_BYTES} holds a value on PostgreSQL, where the proxy never writes it"
    if not isinstance(data, bytes | memoryview):
        return f"{ANSWER_BYTES} holds a {type(data).__name__}, not bytes"
    if record.get("output_text") is not None:
        return f"{ANSWER_BYTES} holds bytes beside output_text"
    try:
        record["output_text"] = bytes(data).decode()
    except UnicodeDecodeError:
        return f"{ANSWER_BYTES} holds bytes that are not UTF-8"
    return None


def check_record(row: dict[str, Any]) -> str | None:
    """What is wrong with one sealed record by itself (None: it matches its hashes).

    Erased content is not recomputed: its stored hash stands for it.
    """
    hashes = row.get("content_hashes")
    if not isinstance(hashes, dict) or not hashes or not set(hashes) <= set(CONTENT_COLUMNS):
        return "its content hashes are missing or altered"
    if row.get("erased_at") is None:
        changed = [name for name, digest in hashes.items() if content_hash(row.get(name)) != digest]
        if changed:
            return f"its content ({', '.join(changed)}) does not match its hash"
    if record_hash(row, hashes, row["chain_id"], row.get("prev_hash") or "") != row["record_hash"]:
        return "its fields do not match its hash"
    return None
