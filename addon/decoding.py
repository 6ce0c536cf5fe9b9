"""Bounded, incremental Content-Encoding decoders, for inspection only.

mitmproxy hands the stream callable the body still content-encoded. The proxy forwards
those bytes untouched (never re-encoding, never asking upstream for another encoding)
and decodes a copy here so the auditor can read it.

A compressed body can inflate a thousandfold (a 1.6 KB brotli body to 1 GiB), and the
auditor runs on mitmproxy's event loop, so nothing here decodes more than asked for:
:meth:`Decoder.feed` only queues the encoded bytes, :meth:`Decoder.read` returns at most
``limit`` decoded bytes and does a bounded amount of work (at most :data:`READ_STEPS`
steps of at most :data:`IN_STEP` encoded bytes each, even when they decode to nothing:
a body may hold thousands of empty gzip members or zstd frames), and the caller decides
how much to read per call and when to stop (:class:`DecodeBudget`). The encoded bytes
wait in a queue read through an offset, so the cost stays in proportion to the input
however many members it holds. Concatenated gzip members and zstd frames are read one
after the other, as the standard tools do. The output does not depend on how the input
was split.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator

import brotli
from backports import zstd

# Encoded bytes handed to a decompressor per step: small, so that the backlog kept
# here, not inside the decompressor, holds what is not decoded yet.
IN_STEP = 16 * 1024
# Steps one read may take before it returns, with or without output: what bounds a
# read's work when the steps decode nothing (empty members, a long gzip header).
READ_STEPS = 32
GZIP_MAGIC = b"\x1f\x8b"
GARBAGE = "gzip: trailing garbage after the last member"
# Members (gzip) or frames (zstd) that decode to nothing, at most, per body: each costs a
# new decompressor (a zstd one 10 to 15 us, for 9 bytes of input), so a run of them is
# the cheapest input to spend the proxy's CPU on; no encoder makes more than a few.
MAX_EMPTY_MEMBERS = 64


class DecodeError(Exception):
    """The body is not valid in its Content-Encoding."""


class Stage:
    """One coding: encoded bytes queued by :meth:`feed`, decoded by :meth:`read`.

    A step hands the decompressor a view of the queue at ``_pos`` and moves ``_pos`` past
    what it used; what follows a member's end simply stays queued for the next member.
    """

    def __init__(self) -> None:
        self._in = bytearray()
        self._pos = 0  # how much of _in is consumed

    @property
    def backlog(self) -> int:
        """Encoded bytes queued and not yet handed to the decompressor."""
        return len(self._in) - self._pos

    def feed(self, data: bytes) -> None:
        """Queue ``data``. The consumed front is dropped now and then (not per read), all
        but the last step's bytes: a zstd decompressor may hand some of them back."""
        cut = self._pos - IN_STEP
        if cut > 0 and cut >= len(self._in) // 2:
            del self._in[:cut]
            self._pos -= cut
        self._in += data

    def _view(self, size: int) -> memoryview:
        """The next ``size`` queued bytes, not copied (released before the next feed)."""
        return memoryview(self._in)[self._pos : self._pos + size]

    def _take(self, size: int = IN_STEP) -> bytes:
        """The next ``size`` queued bytes, consumed."""
        with self._view(size) as view:
            piece = bytes(view)
        self._pos += len(piece)
        return piece

    def read(self, limit: int) -> bytes:
        """At most ``limit`` decoded bytes; ``b""`` when it needs more input or when its
        :data:`READ_STEPS` steps decoded nothing (:meth:`drained` tells which: a caller
        reads on while it is False).
        """
        for _ in range(READ_STEPS):
            out = self._step(limit)
            if out is None:
                break
            if out:
                return out
        return b""

    def _step(self, limit: int) -> bytes | None:
        """One step of at most ``limit`` bytes; None: nothing to work on without more input."""
        raise NotImplementedError

    def drained(self) -> bool:
        """Whether nothing fed so far is left to decode or read without more input."""
        raise NotImplementedError


class IdentityStage(Stage):
    """No coding: the bytes as they are (the caller reads them in the same slices)."""

    def _step(self, limit: int) -> bytes | None:
        return self._take(limit) or None

    def drained(self) -> bool:
        return self.backlog == 0


class ZlibStage(Stage):
    """gzip (members one after the other) or zlib/raw deflate (one stream)."""

    def __init__(self, wbits: int) -> None:
        super().__init__()
        self.wbits = wbits
        self._d = zlib.decompressobj(wbits)
        self._padding = False  # zero bytes followed the last member
        self._more = False  # the last step filled its limit: output may be waiting
        self._empty = _EmptyMembers()

    def _step(self, limit: int) -> bytes | None:
        d = self._d
        if d.eof:
            return self._after_end()
        if not self.backlog and not self._more:
            return None
        with self._view(IN_STEP) as piece:
            try:
                out = d.decompress(piece, limit)
            except zlib.error as e:
                raise DecodeError(f"{self.name}: {e}") from None
            self._pos += len(piece) - len(d.unused_data if d.eof else d.unconsumed_tail)  # (both at an end)
        self._more = len(out) >= limit and not d.eof
        self._empty.decoded(out)
        return out

    def _after_end(self) -> bytes | None:
        """What follows a member's end: the next member, zero padding (gzip(1) ignores it
        after the last member) or nothing yet. Anything else is an error, raised here, a
        step after the one that ended the member: its output was returned."""
        head = self._in[self._pos : self._pos + len(GZIP_MAGIC)]
        if not head:
            return None
        if not self.wbits & 16:
            raise DecodeError("deflate: data after the end of the stream")
        if self._padding or not head[0]:
            self._skip_padding()
        elif GZIP_MAGIC.startswith(head):  # (its first byte alone too: a legal split)
            self._empty.next_member(self.name, "members")
            self._d = zlib.decompressobj(self.wbits)
        else:
            raise DecodeError(GARBAGE)
        return b""

    def _skip_padding(self) -> None:
        """Consume the zero bytes of the next step; any other byte after them is garbage."""
        with self._view(IN_STEP) as view:
            window = bytes(view)
        zeros = len(window) - len(window.lstrip(b"\0"))
        self._pos += zeros
        self._padding = True
        if zeros < len(window):
            raise DecodeError(GARBAGE)

    @property
    def name(self) -> str:
        return "gzip" if self.wbits & 16 else "deflate"

    def drained(self) -> bool:
        return self.backlog == 0 and not self._more


class DeflateStage(ZlibStage):
    """``deflate``: zlib-wrapped by the standard, raw in some servers; the first two
    bytes tell which."""

    def __init__(self) -> None:
        super().__init__(zlib.MAX_WBITS)
        self._detected = False

    def _step(self, limit: int) -> bytes | None:
        if not self._detected:
            if self.backlog < 2:
                return None
            head = self._in[self._pos : self._pos + 2]
            wrapped = (head[0] & 0x0F) == 8 and ((head[0] << 8) | head[1]) % 31 == 0
            self.wbits = zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS
            self._d = zlib.decompressobj(self.wbits)
            self._detected = True
        return super()._step(limit)

    def drained(self) -> bool:
        return self.backlog < 2 if not self._detected else super().drained()


class BrotliStage(Stage):
    """br: ``output_buffer_limit`` bounds each call; after a full buffer only empty
    input may follow until the decompressor accepts more."""

    def __init__(self) -> None:
        super().__init__()
        self._d = brotli.Decompressor()
        self._out = b""  # the buffer grows in blocks past the limit: the excess waits here
        self._more = False  # the last call filled its limit: output may be waiting

    def _step(self, limit: int) -> bytes | None:
        if self._out:
            out, self._out = self._out[:limit], self._out[limit:]
            return out
        d = self._d
        try:
            piece = self._take() if d.can_accept_more_data() else b""
            if d.is_finished():
                if piece.strip(b"\0"):
                    raise DecodeError("br: data after the end of the stream")
                self._more = False
                return None
            out = d.process(piece, output_buffer_limit=limit)
        except brotli.error as e:
            raise DecodeError(f"br: {e}") from None
        self._more = len(out) >= limit
        if not out and not piece:
            return None
        out, self._out = out[:limit], out[limit:]
        return out

    def drained(self) -> bool:
        return self.backlog == 0 and not self._out and not self._more


class ZstdStage(Stage):
    """zstd: one decompressor per frame (a body may hold several; a decompressor ends
    with its frame). It keeps the input of a step it had no room to decode yet; what it
    kept past the frame's end it hands back (``unused_data``), and ``_pos`` moves back
    over those bytes (the queue keeps the last step's bytes, see :meth:`Stage.feed`)."""

    def __init__(self) -> None:
        super().__init__()
        self._d = zstd.ZstdDecompressor()
        self._empty = _EmptyMembers()

    def _step(self, limit: int) -> bytes | None:
        d = self._d
        if d.eof and self.backlog:
            self._empty.next_member("zstd", "frames")
            d = self._d = zstd.ZstdDecompressor()
        if d.eof or (d.needs_input and not self.backlog):
            return None
        with self._view(IN_STEP if d.needs_input else 0) as piece:
            try:
                out = d.decompress(piece, max_length=limit)
            except zstd.ZstdError as e:
                raise DecodeError(f"zstd: {e}") from None
            self._pos += len(piece) - len(d.unused_data)
        self._empty.decoded(out)
        return out

    def drained(self) -> bool:
        return self.backlog == 0 and (self._d.eof or self._d.needs_input)


class _EmptyMembers:
    """Counts the members (frames) of a body that decoded to nothing (:data:`MAX_EMPTY_MEMBERS`)."""

    __slots__ = ("count", "output")

    def __init__(self) -> None:
        self.count = 0
        self.output = False  # the current member decoded something

    def decoded(self, out: bytes) -> None:
        self.output = self.output or bool(out)

    def next_member(self, coding: str, what: str) -> None:
        """One member ended and the next begins; past the limit, the body is not read on."""
        if not self.output:
            self.count += 1
            if self.count > MAX_EMPTY_MEMBERS:
                raise DecodeError(f"{coding}: over {MAX_EMPTY_MEMBERS} {what} that decode to nothing; not read further")
        self.output = False


_STAGES: dict[str, Callable[[], Stage]] = {
    "gzip": lambda: ZlibStage(zlib.MAX_WBITS | 16),
    "x-gzip": lambda: ZlibStage(zlib.MAX_WBITS | 16),
    "deflate": DeflateStage,
    "br": BrotliStage,
    "zstd": ZstdStage,
}


class Decoder:
    """Decodes one body incrementally through its chain of codings (the last one
    applied by the server is undone first)."""

    def __init__(self, stages: list[Stage]) -> None:
        self.stages = stages or [IdentityStage()]
        self.encoded = not isinstance(self.stages[0], IdentityStage)
        self.fed = 0  # encoded bytes queued so far
        self.decoded = 0  # decoded bytes returned so far

    def feed(self, data: bytes) -> None:
        """Queue encoded bytes (no decoding happens here)."""
        self.stages[0].feed(data)
        self.fed += len(data)

    @property
    def taken(self) -> int:
        """Encoded bytes handed to the decompressor so far."""
        return self.fed - self.stages[0].backlog

    @property
    def backlog(self) -> int:
        """Encoded bytes queued, not yet decoded."""
        return self.stages[0].backlog

    def read(self, limit: int) -> bytes:
        """At most ``limit`` decoded bytes after a bounded amount of work; ``b""`` when
        nothing is decoded yet: :meth:`drained` then tells whether more input is needed
        (True) or work is left for the next read (False), so a caller reads while
        ``read(limit) or not drained()``."""
        out = self._read(len(self.stages) - 1, limit)
        self.decoded += len(out)
        return out

    def slices(self, limit: int) -> Iterator[bytes]:
        """Each :meth:`read` of at most ``limit`` bytes until the decoder is drained: what
        every caller loops over (one may be ``b""``, a read that decoded nothing, its work
        bounded all the same); the caller may stop between any two."""
        while (out := self.read(limit)) or not self.drained():
            yield out

    def _read(self, index: int, limit: int) -> bytes:
        """A read of stage ``index``; a stage that needs input is fed one read of the stage
        before it and read once more, so each stage reads at most twice per call."""
        stage = self.stages[index]
        out = stage.read(limit)
        if out or index == 0 or not stage.drained():
            return out
        more = self._read(index - 1, limit)
        if not more:
            return b""
        stage.feed(more)
        return stage.read(limit)

    def drained(self) -> bool:
        """Whether every byte fed so far has been decoded and read, as far as it can be
        without more input."""
        return all(stage.drained() for stage in self.stages)


def make_decoder(content_encoding: str | None) -> Decoder | None:
    """A decoder for the header value (identity included), ``None`` if a coding is unknown."""
    codings = [c.strip().lower() for c in (content_encoding or "").split(",") if c.strip()]
    stages = []
    for coding in reversed([c for c in codings if c != "identity"]):
        factory = _STAGES.get(coding)
        if factory is None:
            return None
        stages.append(factory())
    return Decoder(stages)


class DecodeBudget:
    """What one exchange may decode: a compression bomb stops here, not in memory.

    Decoding stops once the decoded size passes ``max_decoded``, or passes ``floor``
    while being more than ``ratio`` times the encoded bytes read; ordinary
    compressed text stays far below both (a stream of JSON events compresses some 5 to
    20 times).
    """

    def __init__(self, max_decoded: int, ratio: int, floor: int) -> None:
        self.max_decoded = max_decoded
        self.ratio = ratio
        self.floor = floor

    def exceeded(self, decoded: int, encoded: int) -> str | None:
        """Why decoding must stop now, or None."""
        if decoded > self.max_decoded:
            return f"decoded size over {self.max_decoded} bytes"
        if decoded > self.floor and decoded > self.ratio * encoded:
            return f"compression ratio over {self.ratio}:1 ({decoded} bytes from {encoded})"
        return None
