"""A tiny protobuf wire-format encoder and decoder for the mock's Connect and gRPC answers.

The mock writes protobuf by hand instead of using generated classes: it then needs no
code generation before it starts, and the tests' real clients, which decode with classes
generated from ``tests/fixtures/proto``, check the mock's field numbers independently.
Only what the mock needs: varints, length-delimited fields (strings, bytes, messages),
and reading fields back from a request.
"""

from __future__ import annotations

Field = tuple[int, int | bytes]
"""A decoded field: its number and its value (an int for varints, bytes otherwise)."""


def varint(value: int) -> bytes:
    """``value`` (non-negative, or a negative int64 as two's complement) as a varint."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def uint(number: int, value: int) -> bytes:
    """A varint field; protobuf omits zero values, and so does this."""
    return varint(number << 3) + varint(value) if value else b""


def blob(number: int, value: bytes | str) -> bytes:
    """A length-delimited field: a string (UTF-8), bytes or an encoded message."""
    data = value.encode() if isinstance(value, str) else value
    return varint(number << 3 | 2) + varint(len(data)) + data


def text(number: int, value: str) -> bytes:
    """A string field, omitted when empty (as protobuf does)."""
    return blob(number, value) if value else b""


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if not byte & 0x80:
            return value, at


def fields(data: bytes) -> list[Field]:
    """The fields of one message, in order; ValueError on bytes that are not protobuf."""
    out: list[Field] = []
    at = 0
    while at < len(data):
        key, at = _read_varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _read_varint(data, at)
            out.append((number, value))
        elif wire == 2:
            size, at = _read_varint(data, at)
            if at + size > len(data):
                raise ValueError("truncated field")
            out.append((number, data[at : at + size]))
            at += size
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            out.append((number, data[at : at + size]))
            at += size
        else:
            raise ValueError(f"unsupported wire type {wire}")
    return out


def get(data: bytes, *path: int) -> list[int | bytes]:
    """Every value at field ``path`` (message field numbers, then the wanted field), in order."""
    values: list[int | bytes] = [data]
    for number in path:
        values = [v for message in values if isinstance(message, bytes) for n, v in fields(message) if n == number]
    return values


def get_text(data: bytes, *path: int) -> str:
    """The last string at ``path`` (protobuf's last-one-wins), or ``""``."""
    found = [v for v in get(data, *path) if isinstance(v, bytes)]
    return found[-1].decode(errors="replace") if found else ""
