"""Incremental Content-Encoding decoders, for inspection only.

mitmproxy hands the stream callable the body still content-encoded. The proxy forwards
those bytes untouched (never re-encoding, never asking upstream for another encoding)
and decodes a copy here so the auditor can read it. Output per input chunk is capped so
a compression bomb cannot blow up memory in one call: the caller keeps calling
``decode(b"")`` until it returns nothing, feeding each piece on as it comes.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import brotli
import zstandard

MAX_OUTPUT_PER_CALL = 4 * 1024 * 1024


class Decoder:
    """Decodes one body incrementally; a chain of codings is applied in reverse order."""

    def __init__(self, steps: list[Callable[[bytes], bytes]]) -> None:
        self.steps = steps

    def decode(self, data: bytes) -> bytes:
        for step in self.steps:
            data = step(data)
        return data


def _zlib_step(wbits: int) -> Callable[[bytes], bytes]:
    d = zlib.decompressobj(wbits)

    def step(data: bytes) -> bytes:
        return d.decompress(d.unconsumed_tail + data, MAX_OUTPUT_PER_CALL)

    return step


def _brotli_step() -> Callable[[bytes], bytes]:
    d = brotli.Decompressor()
    return d.process


def _zstd_step() -> Callable[[bytes], bytes]:
    d = zstandard.ZstdDecompressor().decompressobj()
    return d.decompress


def _deflate_step() -> Callable[[bytes], bytes]:
    """zlib-wrapped deflate, falling back to raw deflate on the first chunk."""
    state: dict[str, Callable[[bytes], bytes]] = {}

    def step(data: bytes) -> bytes:
        if "inner" not in state:
            if not data:
                return b""
            wrapped = (data[0] & 0x0F) == 8 and len(data) > 1 and ((data[0] << 8) | data[1]) % 31 == 0
            state["inner"] = _zlib_step(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
        return state["inner"](data)

    return step


_STEPS: dict[str, Callable[[], Callable[[bytes], bytes]]] = {
    "gzip": lambda: _zlib_step(zlib.MAX_WBITS | 16),
    "x-gzip": lambda: _zlib_step(zlib.MAX_WBITS | 16),
    # "deflate" is zlib-wrapped by the standard, raw in some servers: auto-detect both.
    "deflate": _deflate_step,
    "br": _brotli_step,
    "zstd": _zstd_step,
}


def make_decoder(content_encoding: str | None) -> Decoder | None:
    """A decoder for the header value, ``Decoder([])`` for identity, ``None`` if unknown."""
    codings = [c.strip().lower() for c in (content_encoding or "").split(",") if c.strip()]
    codings = [c for c in codings if c != "identity"]
    steps = []
    for coding in reversed(codings):
        factory = _STEPS.get(coding)
        if factory is None:
            return None
        steps.append(factory())
    return Decoder(steps)
