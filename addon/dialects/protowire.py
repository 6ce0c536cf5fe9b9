"""A schema-less protobuf wire reader (and the little writing the dialects need).

Cursor and Windsurf publish no ``.proto``: what is known are field numbers others
reverse-engineered (cursor.md, windsurf.md), which move between releases. So the
protobuf dialects do not decode messages with generated classes; they walk the wire
format and follow the documented field paths (:func:`path`), trying to read a
length-delimited value as a nested message only where a path says one is, and collect
the UTF-8 strings of what they could not map (:func:`strings`) so that a moved field
still leaves its text in the record.

The wire format (protobuf encoding spec): each field is a varint tag
``number << 3 | wire type`` then a varint (0), 8 little-endian bytes (1), a varint
length and that many bytes (2: strings, bytes, nested messages, packed repeated
fields), or 4 bytes (5); 3 and 4 open and close a group (deprecated; skipped here).

Hostile input costs bounded work and never raises: a message is read as far as it is
valid and :attr:`Message.problem` says where it stopped; nesting is bounded by
:data:`MAX_DEPTH`, fields per message by :data:`MAX_FIELDS`, collected strings by the
caller's limits and :data:`STRINGS_BUDGET` (and :func:`strings` tells what they left out). Imported by the protobuf dialects; registers no dialect.
"""

from __future__ import annotations

import re
from contextvars import ContextVar, Token
from typing import NamedTuple

VARINT, I64, LEN, SGROUP, EGROUP, I32 = 0, 1, 2, 3, 4, 5
#: Fields read from one message at most; the rest is a problem, not memory.
MAX_FIELDS = 100_000
#: How deep nested messages (and groups) are followed.
MAX_DEPTH = 32
#: Fields :func:`strings` may read from nested messages in one call: the work of a walk
#: (about a microsecond a field), whatever the bytes (a blob that is no message stops at
#: its first field). Far above a real request's (hundreds to a few thousand).
STRINGS_BUDGET = 200_000
#: Fields all the reading of one message may parse together, a message counting one
#: more (see :func:`budget`): its nested messages, the dialect's paths and the string
#: walks. A real request holds hundreds to a few thousand (Cursor's conversation and code
#: chunks); the worst shapes found stop at it within 0.08 to 0.16 s of the event loop,
#: where a stream's message is read (the dialects' own work per item is not charged).
MESSAGE_BUDGET = 50_000
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]").search


class Budget:
    """What one message's reading may still parse (see :func:`budget`)."""

    __slots__ = ("fields", "first", "left", "token", "top_cut")

    def __init__(self, fields: int) -> None:
        self.fields = self.left = fields
        self.first = True  # the next parse is the message itself's
        self.top_cut = False  # the message itself was cut short by the budget
        self.token: Token[Budget | None] | None = None  # (while entered: what it replaced)

    def __enter__(self) -> Budget:
        self.token = _BUDGET.set(self)
        return self

    def __exit__(self, *_: object) -> None:
        if self.token is not None:
            _BUDGET.reset(self.token)

    @property
    def spent(self) -> bool:
        """Whether the reading ran out of it: what the record keeps stops there."""
        return self.left <= 0


_BUDGET: ContextVar[Budget | None] = ContextVar("protowire_budget", default=None)


def budget(fields: int = MESSAGE_BUDGET) -> Budget:
    """Bound the fields parsed while reading one message, in this thread, to ``fields``.

    Each limit of its own (:data:`MAX_FIELDS` a message, :data:`STRINGS_BUDGET` a walk)
    bounds one parse; a message of many nested messages, each parsed by a path, a check
    whether a value is text and a walk, multiplied them: 1.8 MB of tiny fields took 1.3 s
    of the event loop, and a stream's messages are read there. Every message parsed is
    charged its fields and one. Past the budget a message reads as cut short
    (:data:`OVER_BUDGET`), :meth:`Message.messages` finds none and the walks stop; the
    caller says so once, from :attr:`Budget.spent` (its dialect's finding). The filters
    read the message's bytes as text whatever its reading kept (``rpc.payload_text``),
    but not what a field of the message itself holds encoded (Cursor's BidiAppend
    carries its message hex-encoded): the message itself cut short by the budget
    (:attr:`Budget.top_cut`) is one its reader could not read, and says so as such.

    The budget is its own context manager (``with budget() as reading:``), a class
    rather than a generator: it is entered for every message of a stream."""
    return Budget(fields)


class Field(NamedTuple):
    """One field as sent: its number, wire type and value (an int, or bytes for wire type 2)."""

    number: int
    wire: int
    value: int | bytes


def _varint(data: bytes, pos: int) -> tuple[int, int] | None:
    """The varint at ``pos`` and the position after it; None if truncated or over 10 bytes."""
    result = shift = 0
    end = min(len(data), pos + 10)
    while pos < end:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & 0xFFFF_FFFF_FFFF_FFFF, pos
        shift += 7
    return None


TOO_MANY_FIELDS = "over"  # how the problem of a message cut short by the field limit begins
OVER_BUDGET = "past"  # ... and by the budget of the whole message's reading (see budget)


def cut_by_budget(problem: str | None) -> bool:
    """Whether a message's problem is only that its reading's :func:`budget` ran out."""
    return problem is not None and problem.startswith(OVER_BUDGET)


def read_fields(data: bytes, max_fields: int = MAX_FIELDS) -> tuple[list[Field], str | None]:
    """The fields of one message in wire order, and why reading stopped early (None: it
    did not). Groups are skipped. Charged to the :func:`budget` when one is set: its
    fields and one for the message (a message of no fields costs its object and a walk)."""
    spent = _BUDGET.get()
    if spent is None:
        return _read_fields(data, max_fields, f"{TOO_MANY_FIELDS} {max_fields} fields")
    if spent.left > max_fields:
        read = _read_fields(data, max_fields, f"{TOO_MANY_FIELDS} {max_fields} fields")
    else:
        too_many = f"{OVER_BUDGET} the {spent.fields} fields its reading may parse"
        read = _read_fields(data, max(spent.left - 1, 0), too_many)
    spent.left -= len(read[0]) + 1
    if spent.first:
        spent.first, spent.top_cut = False, cut_by_budget(read[1])
    return read


def _spent() -> bool:
    """Whether this reading's :func:`budget` is spent: nothing more is parsed or walked."""
    spent = _BUDGET.get()
    return spent is not None and spent.left <= 0


def _read_fields(data: bytes, max_fields: int, too_many: str) -> tuple[list[Field], str | None]:
    fields: list[Field] = []
    pos, size = 0, len(data)
    while pos < size:
        if len(fields) >= max_fields:
            return fields, f"{too_many}; the rest was not read"
        start = pos
        tag = _varint(data, pos)
        if tag is None:
            return fields, f"truncated tag at byte {start}"
        key, pos = tag
        number, wire = key >> 3, key & 7
        if number == 0:
            return fields, f"field number 0 at byte {start}"
        value: int | bytes
        if wire == VARINT:
            read = _varint(data, pos)
            if read is None:
                return fields, f"truncated varint of field {number} at byte {start}"
            value, pos = read
        elif wire in (I64, I32):
            width = 8 if wire == I64 else 4
            if pos + width > size:
                return fields, f"truncated fixed-width field {number} at byte {start}"
            value = int.from_bytes(data[pos : pos + width], "little")
            pos += width
        elif wire == LEN:
            read = _varint(data, pos)
            if read is None or read[1] + read[0] > size:
                return fields, f"truncated length-delimited field {number} at byte {start}"
            length, pos = read
            value = data[pos : pos + length]
            pos += length
        elif wire == SGROUP:
            after = _skip_group(data, pos, number, 1)
            if after is None:
                return fields, f"unterminated group {number} at byte {start}"
            pos = after
            continue
        else:
            return fields, f"wire type {wire} of field {number} at byte {start} is not valid here"
        fields.append(Field(number, wire, value))
    return fields, None


def _skip_group(data: bytes, pos: int, number: int, depth: int) -> int | None:
    """The position just past the end-group tag of group ``number``; None if there is none."""
    if depth > MAX_DEPTH:
        return None
    size = len(data)
    while pos < size:
        tag = _varint(data, pos)
        if tag is None:
            return None
        key, pos = tag
        inner, wire = key >> 3, key & 7
        if wire == EGROUP:
            return pos if inner == number else None
        if wire == VARINT:
            read = _varint(data, pos)
            if read is None:
                return None
            pos = read[1]
        elif wire in (I64, I32):
            pos += 8 if wire == I64 else 4
        elif wire == LEN:
            read = _varint(data, pos)
            if read is None:
                return None
            pos = read[1] + read[0]
        elif wire == SGROUP:
            after = _skip_group(data, pos, inner, depth + 1)
            if after is None:
                return None
            pos = after
        else:
            return None
    return None


class Message:
    """One message read: its fields, why reading stopped early, and the nested messages
    looked at so far (each length-delimited value is parsed at most once)."""

    __slots__ = ("fields", "problem", "_nested")

    def __init__(self, data: bytes, max_fields: int = MAX_FIELDS) -> None:
        self.fields, self.problem = read_fields(data, max_fields)
        self._nested: dict[int, list[Message]] = {}

    def values(self, number: int) -> list[int | bytes]:
        """Every value of field ``number`` (repeated fields: all of them, in order)."""
        return [f.value for f in self.fields if f.number == number]

    def numbers(self) -> set[int]:
        """The field numbers present."""
        return {f.number for f in self.fields}

    def messages(self, number: int) -> list[Message]:
        """The values of field ``number`` that read as whole messages (a string that does
        not is skipped: a path expecting a message there found none).

        A nested message cut short by the field limit is still one (padding must not
        hide what follows it from view without a trace): it is kept with what was read,
        and :meth:`cut_short` reports it."""
        found = self._nested.get(number)
        if found is None:
            if _spent():
                return []  # (not remembered: this message's reading goes no further)
            found = []
            for value in self.values(number):
                if _spent():
                    break
                if isinstance(value, bytes):
                    nested = Message(value)
                    if nested.problem is None or nested.problem.startswith((TOO_MANY_FIELDS, OVER_BUDGET)):
                        found.append(nested)
            self._nested[number] = found
        return found

    def cut_short(self) -> str | None:
        """Why this message, or a nested one read so far, was not read to its end (call
        it after reading the paths): what may hide behind it was not seen. A cut by the
        reading's :func:`budget` is not one: whoever set the budget says so, once."""
        if self.problem is not None and not cut_by_budget(self.problem):
            return self.problem
        for number, nested in self._nested.items():
            for msg in nested:
                if (problem := msg.cut_short()) is not None:
                    return f"field {number}: {problem}"
        return None


def parse(data: bytes) -> Message:
    """``data`` read as one message (never raises; see :attr:`Message.problem`)."""
    return Message(data)


def path(msg: Message, *numbers: int) -> list[int | bytes]:
    """The values at a field path: ``path(m, 2, 1)`` is field 1 of every message in field 2.

    Every step but the last goes through nested messages (repeated ones included), the
    last gives the values found there; ``[]`` where the path leads nowhere.
    """
    level = [msg]
    for number in numbers[:-1]:
        level = [nested for m in level for nested in m.messages(number)]
    return [value for m in level for value in m.values(numbers[-1])] if numbers else []


def messages_at(msg: Message, *numbers: int) -> list[Message]:
    """The nested messages at a field path (every step read as a message)."""
    level = [msg]
    for number in numbers:
        level = [nested for m in level for nested in m.messages(number)]
    return level


def text(value: int | bytes | None) -> str | None:
    """A length-delimited value as a string (invalid UTF-8 as U+FFFD); None for a number."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else None


def field_text(msg: Message, *numbers: int) -> str | None:
    """The string at a path of singular fields, or None: the *last* one found, as every
    protobuf parser reads a field sent twice (the last value wins, and a message sent
    twice is merged), so the audit reads what the client or the server reads."""
    return next((t for v in reversed(path(msg, *numbers)) if (t := text(v)) is not None), None)


def field_int(msg: Message, *numbers: int) -> int | None:
    """The number (varint or fixed) at a path of singular fields: the last one, as above."""
    return next((v for v in reversed(path(msg, *numbers)) if isinstance(v, int)), None)


def readable(value: bytes) -> str | None:
    """``value`` as text when it is text: UTF-8 without control characters other than
    tab and line ends, or UTF-8 with some that does not read as a message (a nested
    message's tags and lengths are control bytes; text with an ANSI colour or a stray
    ``\\v`` in it is still text a person reads, and the filters must see it)."""
    try:
        decoded = value.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not decoded or not _CONTROL(decoded):
        return decoded or None
    nested = Message(value)
    if cut_by_budget(nested.problem):
        return None  # (cannot tell, past the reading's budget: not kept; the filters read the bytes)
    return decoded if not nested.fields or nested.problem is not None else None


def strings(
    msg: Message,
    limit: int = 64,
    max_chars: int = 2000,
    skip: frozenset[int] = frozenset(),
    depth: int = 0,
    cut: list[str] | None = None,
) -> list[str]:
    """The text strings found in ``msg``, depth first, at most ``limit`` of them, each cut
    at ``max_chars`` characters: what a reader keeps of fields it could not map.

    A length-delimited value that looks like text is a string; one that does not is read
    as a nested message and searched in turn, down to :data:`MAX_DEPTH` levels and while
    the fields read that way stay under :data:`STRINGS_BUDGET` (nested junk costs bounded
    work; an image or other blob that is no message stops at its first bytes and costs
    nearly nothing). ``skip``: field numbers of ``msg`` itself not to search (those the
    dialect did map).

    ``cut``, when given, gets what the bounds left out, each reason once (a string past
    ``limit``, characters past ``max_chars``, a message nested past the depth or the
    budget): no filter reads that text, so the reader says so (finding
    ``strings_unread``) and the failure policy decides."""
    out: list[str] = []
    _Collect(out, limit, max_chars, cut).walk(msg, skip, depth)
    return out


class _Collect:
    """One :func:`strings` walk: what it found, its bounds, and what they left out."""

    __slots__ = ("budget", "cut", "limit", "max_chars", "out")

    def __init__(self, out: list[str], limit: int, max_chars: int, cut: list[str] | None) -> None:
        self.out, self.limit, self.max_chars, self.cut = out, limit, max_chars, cut
        self.budget = STRINGS_BUDGET

    def left_out(self, reason: str) -> None:
        if self.cut is not None and reason not in self.cut:
            self.cut.append(reason)

    def walk(self, msg: Message, skip: frozenset[int], depth: int) -> bool:
        """Collect ``msg``'s strings; False once the walk must stop (``limit`` reached, or
        the reading's :func:`budget` spent)."""
        for f in msg.fields:
            if _spent():
                return False
            if f.wire != LEN or f.number in skip or not isinstance(f.value, bytes):
                continue
            found = readable(f.value)
            if found is not None:
                if len(self.out) >= self.limit:
                    self.left_out(f"strings past the first {self.limit}")
                    return False
                if len(found) > self.max_chars:
                    self.left_out(f"characters of a string past the first {self.max_chars}")
                self.out.append(found[: self.max_chars])
                continue
            nested = self._nested(f.value)
            if nested is None:
                continue
            if depth >= MAX_DEPTH:
                self.left_out(f"messages nested deeper than {MAX_DEPTH} levels")
            elif not self.walk(nested, frozenset(), depth + 1):
                return False
        return True

    def _nested(self, value: bytes) -> Message | None:
        """``value`` read as a message with fields (None: it is none), its fields charged
        to the budget. One cut short by the budget or :data:`MAX_FIELDS` is searched as
        far as it was read, and the rest is told."""
        if self.budget <= 0:
            self.left_out(f"values past the first {STRINGS_BUDGET} fields read")
            return None
        nested = Message(value, max_fields=min(self.budget, MAX_FIELDS))
        self.budget -= len(nested.fields)
        if cut_by_budget(nested.problem):  # (said once, by whoever set the budget)
            return nested
        if nested.problem is not None and nested.problem.startswith(TOO_MANY_FIELDS):
            self.left_out(
                f"values past the first {STRINGS_BUDGET} fields read"
                if self.budget <= 0
                else f"fields of a message past the first {MAX_FIELDS}"
            )
            return nested
        return nested if nested.fields and nested.problem is None else None


# -- writing: the few messages the dialects send (error details) ------------------------------


def encode_varint(value: int) -> bytes:
    """A non-negative integer as a varint."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_field(number: int, value: int | bytes | str) -> bytes:
    """One field: an int as a varint, bytes or a string length-delimited."""
    if isinstance(value, int):
        return encode_varint(number << 3 | VARINT) + encode_varint(value)
    raw = value.encode() if isinstance(value, str) else value
    return encode_varint(number << 3 | LEN) + encode_varint(len(raw)) + raw
