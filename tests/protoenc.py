"""A small protobuf and envelope encoder for the Connect/gRPC dialect tests' fixtures.

Written for the tests, independent of the addon's own reader (``addon.dialects.protowire``)
so that a mistake in one is not repeated in the other: fields are built by hand from the
wire format (varint tags ``number << 3 | wire type``; 0 varint, 1 fixed 64, 2 length
delimited, 5 fixed 32, 3/4 group start/end).
"""

from __future__ import annotations

import gzip
import struct


def varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def f(number: int, value: int | str | bytes) -> bytes:
    """One field: an int as a varint, a str/bytes length-delimited."""
    if isinstance(value, int):
        return tag(number, 0) + varint(value)
    raw = value.encode() if isinstance(value, str) else value
    return tag(number, 2) + varint(len(raw)) + raw


def m(number: int, *fields: bytes) -> bytes:
    """A nested message field made of ``fields``."""
    return f(number, b"".join(fields))


def fixed64(number: int, value: int) -> bytes:
    return tag(number, 1) + struct.pack("<Q", value)


def fixed32(number: int, value: int) -> bytes:
    return tag(number, 5) + struct.pack("<I", value)


def group(number: int, *fields: bytes) -> bytes:
    return tag(number, 3) + b"".join(fields) + tag(number, 4)


def env(payload: bytes | str, flags: int = 0) -> bytes:
    """One 5-byte-prefixed envelope (the payload as given: compress it first for 0x01)."""
    raw = payload.encode() if isinstance(payload, str) else payload
    return bytes([flags]) + len(raw).to_bytes(4, "big") + raw


def genv(payload: bytes | str, flags: int = 1) -> bytes:
    """A gzip-compressed envelope (flag 0x01 added)."""
    raw = payload.encode() if isinstance(payload, str) else payload
    return env(gzip.compress(raw), flags | 1)


def end_stream(json_text: str = "{}", flags: int = 2) -> bytes:
    return env(json_text, flags)
