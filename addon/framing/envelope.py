"""The 5-byte envelope framing of Connect streams, gRPC and gRPC-Web.

All three cut a body into length-prefixed messages the same way::

    flags (1 byte)  length (4 bytes, unsigned, big-endian)  message (length bytes)

and differ only in what the flag bits mean (connect.md §2, §4, §5):

- ``connect`` (``application/connect+proto``, ``+json``, any ``application/connect+*``):
  bit 0 (``0x01``) the message is compressed with ``Connect-Content-Encoding``; bit 1
  (``0x02``) it is the EndStreamResponse, JSON whatever the codec (``0x03``: compressed).
- ``grpc`` (``application/grpc``, ``+proto``, ``+json``; not ``-web``): bit 0 only,
  compressed with ``grpc-encoding``; the status travels in HTTP/2 trailers, which the
  proxy adapter hands the dialect as a ``trailers`` frame of its own.
- ``grpc_web`` (``application/grpc-web``, ``+proto``, ``+json``): bit 0 as in gRPC, and
  the most significant bit (``0x80``, ``0x81`` compressed) marks the trailer frame, an
  HTTP/1-style header block (``grpc-status:0\\r\\ngrpc-message:…\\r\\n``) in the body.
- ``grpc_web_text`` (``application/grpc-web-text``, ``+proto``): gRPC-Web in base64, read
  quartet by quartet (padding may end any quartet: servers encode each message alone).

One :class:`EnvelopeReader` serves them all (the text form through :class:`Base64EnvelopeReader`). Envelope boundaries have nothing to do with
DATA frames or chunks, so the reader keeps the 5-byte prefix across feeds and reports
the offset just past every envelope (``feed_bounded``): the output gate releases a
message's bytes once the dialect has read it. Memory is bounded by ``max_event_bytes``:
a longer envelope is skipped as it arrives (finding ``envelope_too_large``), and a
compressed message is decompressed through :mod:`addon.decoding`'s bounded decoders as
its bytes arrive (each feed's work in proportion to the feed, not one long call at the
message's end), stopping once the output passes that limit, so a gzip bomb costs at
most the limit. A zero-length envelope is a valid frame (Cursor sends them as
keepalives).

The writers encode the frames a dialect ends a stream with: an :class:`RpcStatus`
becomes a Connect EndStreamResponse envelope, a gRPC-Web trailer frame, or, for gRPC,
nothing in the body and trailers (:meth:`GrpcWriter.trailers`) the adapter sends.
The gRPC status numbers and the Connect code names (:data:`CODES`) live here, once.

Sans-IO; standard library and :mod:`addon.decoding` only.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_to_bytes

import orjson

from addon.decoding import DecodeError, Decoder, make_decoder
from addon.framing import Frame, Framing, register

PREFIX = 5
FLAG_COMPRESSED = 0x01
FLAG_END_STREAM = 0x02  # Connect's EndStreamResponse
FLAG_TRAILERS = 0x80  # gRPC-Web's trailer frame
# Decompressed bytes read from a decoder at a time, checked against the limit after each.
_SLICE = 64 * 1024

#: The gRPC status codes by number (doc/statuscodes.md); the Connect codes are their
#: snake_case names (Connect spells CANCELLED ``canceled``).
CODES = (
    "ok",
    "canceled",
    "unknown",
    "invalid_argument",
    "deadline_exceeded",
    "not_found",
    "already_exists",
    "permission_denied",
    "resource_exhausted",
    "failed_precondition",
    "aborted",
    "out_of_range",
    "unimplemented",
    "internal",
    "unavailable",
    "data_loss",
    "unauthenticated",
)
_NUMBERS = {name: number for number, name in enumerate(CODES)}
#: The HTTP status of a unary Connect error with each code (connect.md §3).
CONNECT_HTTP_STATUS = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}


def code_name(number: int) -> str:
    """The Connect code of a gRPC status number (``unknown`` for a number gRPC does not define)."""
    return CODES[number] if 0 <= number < len(CODES) else "unknown"


def code_number(name: str) -> int:
    """The gRPC status number of a Connect code (2, UNKNOWN, for a name Connect does not define)."""
    return _NUMBERS.get(name, 2)


# -- frames ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Envelope:
    """One envelope read: ``raw`` the message (decompressed), ``flags`` as sent.

    ``event``: ``message`` (a data message), ``end_stream`` (Connect's EndStreamResponse
    JSON) or ``trailers`` (gRPC-Web's header block).
    """

    raw: bytes
    flags: int = 0
    event: str = "message"
    id: str = ""

    @property
    def data(self) -> str:
        return self.raw.decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class RpcStatus:
    """The frame a dialect ends a stream with: an error status, in every protocol's terms.

    ``code`` is the Connect code (``permission_denied``), :attr:`grpc` its number;
    ``details`` are ``(fully-qualified type, serialized message, debug JSON or None)``,
    sent as Connect error details; ``status_details`` is the serialized
    ``google.rpc.Status`` gRPC carries them in (``grpc-status-details-bin``), built by the
    dialect (the framing knows no protobuf).
    """

    code: str
    message: str
    details: tuple[tuple[str, bytes, Mapping[str, Any] | None], ...] = ()
    status_details: bytes = b""
    event: str = "status"
    id: str = ""

    @property
    def grpc(self) -> int:
        return code_number(self.code)

    @property
    def data(self) -> str:
        return end_stream_json(self).decode()


def end_stream_json(status: RpcStatus) -> bytes:
    """Connect's EndStreamResponse carrying ``status``: ``{"error": {code, message, details}}``."""
    error: dict[str, Any] = {"code": status.code, "message": status.message}
    if status.details:
        error["details"] = [
            {"type": kind, "value": _b64(value), **({"debug": dict(debug)} if debug is not None else {})}
            for kind, value, debug in status.details
        ]
    return orjson.dumps({"error": error})


def _b64(value: bytes) -> str:
    """Unpadded standard base64, as Connect and gRPC ``-bin`` metadata carry binary values."""
    return base64.b64encode(value).decode().rstrip("=")


def b64decode(value: str) -> bytes | None:
    """Padded or unpadded base64 (standard or URL-safe alphabet); None when it is not base64."""
    text = value.strip().replace("-", "+").replace("_", "/")
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except ValueError:
        return None


def pct_encode(message: str) -> str:
    """``grpc-message``'s percent-encoding: UTF-8, bytes outside printable ASCII and ``%`` escaped."""
    return "".join(chr(b) if 0x20 <= b <= 0x7E and b != 0x25 else f"%{b:02X}" for b in message.encode())


def pct_decode(value: str) -> str:
    """A ``grpc-message`` as text (invalid UTF-8 read as U+FFFD)."""
    return unquote_to_bytes(value).decode("utf-8", "replace")


def parse_header_block(text: str) -> dict[str, str]:
    """A trailer block (``name: value`` lines, CRLF or LF) as a dict, names lower-case."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        name, colon, value = line.partition(":")
        if colon and name.strip():
            out[name.strip().lower()] = value.strip()
    return out


def status_trailers(status: RpcStatus) -> list[tuple[str, str]]:
    """The gRPC trailers of ``status``: ``grpc-status``, ``grpc-message`` (and the details)."""
    out = [("grpc-status", str(status.grpc)), ("grpc-message", pct_encode(status.message))]
    if status.status_details:
        out.append(("grpc-status-details-bin", _b64(status.status_details)))
    return out


# -- the reader -----------------------------------------------------------------------------


class EnvelopeReader:
    """Body bytes in, :class:`Envelope` frames out, for one of the three protocols.

    ``end_stream_flag``: 0x02 marks Connect's EndStreamResponse; ``trailer_flag``: 0x80
    marks gRPC-Web's trailers. ``encoding`` names the per-message compression.
    """

    __slots__ = (
        "max_event_bytes",
        "encoding",
        "end_stream_flag",
        "trailer_flag",
        "findings",
        "unreadable",
        "frames_read",
        "_head",
        "_flags",
        "_need",
        "_pieces",
        "_skip",
        "_length",
        "_decoder",
        "_failure",
        "_offset",
        "_boundary",
        "_ended_inside",
        "_odd_flags",
    )

    def __init__(
        self, max_event_bytes: int, encoding: str | None, *, end_stream_flag: bool = False, trailer_flag: bool = False
    ) -> None:
        self.max_event_bytes = max_event_bytes
        self.encoding = (encoding or "").strip().lower() or None
        self.end_stream_flag = end_stream_flag
        self.trailer_flag = trailer_flag
        self.findings: list[tuple[str, str]] = []
        self.unreadable: str | None = None  # set when a message cannot be read (its content is unknown)
        self.frames_read = 0
        self._head = bytearray()  # the prefix of the envelope being read, until it has 5 bytes
        self._flags = 0
        self._need = -1  # message bytes still to come (-1: reading a prefix)
        self._pieces: list[bytes] = []  # the message (decompressed as it comes, if compressed)
        self._skip = False  # the envelope is over the limit: its bytes are not kept
        self._length = 0  # the envelope's length
        self._decoder: Decoder | None = None  # a compressed message's, while it comes
        self._failure: tuple[str, str] | None = None  # why the message cannot be read (a finding at its end)
        self._offset = 0  # bytes scanned
        self._boundary = 0  # offset just past the last envelope
        self._ended_inside = False
        self._odd_flags = False  # reserved flag bits were reported once

    # -- the Reader protocol --------------------------------------------------------------

    def feed(self, data: bytes) -> list[Frame]:
        return [frame for frame, _ in self.feed_bounded(data) if frame is not None]

    def feed_bounded(self, data: bytes) -> list[tuple[Frame | None, int]]:
        out: list[tuple[Frame | None, int]] = []
        pos, end = 0, len(data)
        view = memoryview(data)
        while pos < end:
            if self._need < 0:
                take = min(PREFIX - len(self._head), end - pos)
                self._head += view[pos : pos + take]
                pos += take
                if len(self._head) < PREFIX:
                    break
                self._start()
                if self._need == 0:
                    self._done(pos, out)
                continue
            take = min(self._need, end - pos)
            if not self._skip and self._failure is None:
                self._keep(bytes(view[pos : pos + take]))
            self._need -= take
            pos += take
            if self._need == 0:
                self._done(pos, out)
        self._offset += end
        return out

    @property
    def held(self) -> int:
        return self._offset - self._boundary

    @property
    def scanned(self) -> int:
        """Bytes read so far."""
        return self._offset

    def unbound(self) -> list[Frame]:
        return []  # nothing is held back from reading: boundaries cost nothing here

    def end(self) -> list[Frame]:
        self._ended_inside = self._inside
        return []

    @property
    def pending_event(self) -> bool:
        return self._ended_inside or self._inside

    @property
    def _inside(self) -> bool:
        return bool(self._head) or self._need >= 0

    # -- envelopes ------------------------------------------------------------------------

    def _start(self) -> None:
        """A prefix is complete: the envelope's flags and length."""
        head = self._head
        self._flags = head[0]
        self._need = self._length = int.from_bytes(head[1:5], "big")
        head.clear()
        self._pieces = []
        self._decoder = self._failure = None
        self._skip = self._need > self.max_event_bytes
        if self._skip:
            self.findings.append(
                ("envelope_too_large", f"envelope of {self._need} bytes, over {self.max_event_bytes}; skipped")
            )
        elif self._flags & FLAG_COMPRESSED:
            self._decoder = self._message_decoder()

    def _done(self, pos: int, out: list[tuple[Frame | None, int]]) -> None:
        """The envelope's last byte is at ``pos`` of this feed: report it and its end."""
        self._boundary = self._offset + pos
        self._need = -1
        frame = None if self._skip else self._frame(b"".join(self._pieces))
        self._pieces = []
        out.append((frame, self._boundary))

    def _frame(self, payload: bytes) -> Envelope | None:
        flags = self._flags
        if self.trailer_flag and flags & FLAG_TRAILERS:
            event = "trailers"
        elif self.end_stream_flag and flags & FLAG_END_STREAM:
            event = "end_stream"
        else:
            event = "message"
        known = FLAG_COMPRESSED | (FLAG_END_STREAM if self.end_stream_flag else 0)
        known |= FLAG_TRAILERS if self.trailer_flag else 0
        if flags & ~known and not self._odd_flags:
            self._odd_flags = True
            self.findings.append(
                ("envelope_reserved_flags", f"flags 0x{flags:02x}: reserved bits set; read as {event}")
            )
        if self._failure is not None:  # (a compressed message's)
            self._unread(*self._failure)
            return None
        self.frames_read += 1
        return Envelope(payload, flags, event)

    def _message_decoder(self) -> Decoder | None:
        """The decoder of a compressed message; None, the reason kept as its failure, if
        there is none."""
        encoding = self.encoding
        decoder = make_decoder(encoding) if encoding and encoding != "identity" else None
        if decoder is None:
            named = encoding not in (None, "identity")
            why = f"unsupported message encoding {encoding!r}" if named else "compressed flag without an encoding"
            self._failure = ("envelope_decompress_failed", why)
        return decoder

    def _keep(self, data: bytes) -> None:
        """Keep the message's next bytes; a compressed message's are decompressed now, at
        most ``max_event_bytes`` of output (past it, or on bad data, the message is
        dropped and the reason kept)."""
        decoder = self._decoder
        if decoder is None:
            self._pieces.append(data)
            return
        decoder.feed(data)
        try:
            for piece in decoder.slices(_SLICE):
                if decoder.decoded > self.max_event_bytes:
                    size = f"a {self._length}-byte {self.encoding} message"
                    self._drop(
                        ("envelope_too_large", f"{size} decompresses to over {self.max_event_bytes} bytes; skipped")
                    )
                    return
                if piece:
                    self._pieces.append(piece)
        except DecodeError as e:
            self._drop(("envelope_decompress_failed", str(e)[:200]))

    def _drop(self, failure: tuple[str, str]) -> None:
        """The message cannot be read: let go of it; ``failure`` is reported at its end."""
        self._failure = failure
        self._decoder = None
        self._pieces = []

    def _unread(self, code: str, detail: str) -> None:
        """A message whose content cannot be known: a finding, and a gate holding the
        stream applies the failure policy (what the message says was not checked)."""
        self.findings.append((code, detail))
        self.unreadable = detail


# -- the writers ----------------------------------------------------------------------------


def envelope(flags: int, payload: bytes) -> bytes:
    """One envelope: flags, big-endian length, payload."""
    return bytes((flags,)) + len(payload).to_bytes(4, "big") + payload


def _data_envelope(frame: Frame) -> bytes:
    """A data message: an :class:`Envelope`'s raw bytes (uncompressed), or a frame's text."""
    raw = frame.raw if isinstance(frame, Envelope) else frame.data.encode()
    return envelope(0, raw)


class ConnectWriter:
    """Connect: data messages, and an :class:`RpcStatus` as the EndStreamResponse (0x02)."""

    def encode(self, frames: Sequence[Frame], continues: bool) -> bytes:
        return b"".join(
            envelope(FLAG_END_STREAM, end_stream_json(f)) if isinstance(f, RpcStatus) else _data_envelope(f)
            for f in frames
        )

    def trailers(self, frames: Sequence[Frame]) -> list[tuple[str, str]]:
        return []  # Connect never uses HTTP trailers


class GrpcWebWriter:
    """gRPC-Web: data messages, and an :class:`RpcStatus` as the trailer frame (0x80)."""

    def encode(self, frames: Sequence[Frame], continues: bool) -> bytes:
        out = []
        for f in frames:
            if isinstance(f, RpcStatus):
                block = "".join(f"{name}:{value}\r\n" for name, value in status_trailers(f))
                out.append(envelope(FLAG_TRAILERS, block.encode()))
            else:
                out.append(_data_envelope(f))
        return b"".join(out)

    def trailers(self, frames: Sequence[Frame]) -> list[tuple[str, str]]:
        return []  # the trailers are in the body


class GrpcWriter:
    """gRPC: data messages in the body; an :class:`RpcStatus` only in the HTTP/2 trailers
    (:meth:`trailers`), which the adapter sends."""

    def encode(self, frames: Sequence[Frame], continues: bool) -> bytes:
        return b"".join(_data_envelope(f) for f in frames if not isinstance(f, RpcStatus))

    def trailers(self, frames: Sequence[Frame]) -> list[tuple[str, str]]:
        status = next((f for f in frames if isinstance(f, RpcStatus)), None)
        return status_trailers(status) if status is not None else []


class GrpcWebTextWriter:
    """gRPC-Web in base64 (``application/grpc-web-text``): the gRPC-Web bytes, encoded;
    appended at a quartet boundary, so the stream stays valid base64."""

    def encode(self, frames: Sequence[Frame], continues: bool) -> bytes:
        return base64.b64encode(GRPC_WEB_WRITER.encode(frames, continues))

    def trailers(self, frames: Sequence[Frame]) -> list[tuple[str, str]]:
        return []  # the trailers are in the body


class Base64EnvelopeReader:
    """``application/grpc-web-text``: base64 text in, gRPC-Web frames out.

    Each quartet decodes on its own (a padded one ends a message a server encoded
    alone), and the gRPC-Web reader reads what it decodes. A frame's boundary is reported
    in the body's own (text) offsets: the end of the quartet holding its last byte when
    the frame ends there, else the start of that quartet (the bytes up to it belong to
    frames already read; the rest is released with a later frame). Whitespace is skipped;
    a character outside base64 makes the rest unreadable (a finding).
    """

    __slots__ = ("inner", "findings", "_quartet", "_quartet_start", "_offset", "_boundary", "_broken")

    def __init__(self, inner: EnvelopeReader) -> None:
        self.inner = inner
        self.findings = inner.findings  # one list: the inner reader's findings are this reader's
        self._quartet = bytearray()
        self._quartet_start = 0  # text offset of the quartet's first character
        self._offset = 0  # text bytes scanned
        self._boundary = 0
        self._broken: str | None = None

    @property
    def unreadable(self) -> str | None:
        return self._broken or self.inner.unreadable

    def feed(self, data: bytes) -> list[Frame]:
        return [frame for frame, _ in self.feed_bounded(data) if frame is not None]

    def feed_bounded(self, data: bytes) -> list[tuple[Frame | None, int]]:
        out: list[tuple[Frame | None, int]] = []
        start = self._offset
        self._offset = start + len(data)
        for run in _BASE64_RUN.finditer(data):  # (whitespace between runs is skipped)
            if self._broken is not None:
                break
            self._feed_run(run.group(), start + run.start(), out)
        return out

    def _feed_run(self, run: bytes, run_start: int, out: list[tuple[Frame | None, int]]) -> None:
        """Decode a run of base64 characters in bulk, a segment at a time (a segment ends
        with a padded quartet: a message a server encoded alone); the partial quartet at
        its end waits for more. Bulk, because a byte-at-a-time loop costs the event loop
        about a second per megabyte an upstream sends."""
        carried = len(self._quartet)
        if not carried:
            self._quartet_start = run_start
        text = bytes(self._quartet) + run
        self._quartet.clear()
        usable = len(text) - len(text) % 4
        pos = 0
        while pos < usable and self._broken is None:
            pad = text.find(b"=", pos, usable)
            seg_end = usable if pad < 0 else (pad // 4 + 1) * 4
            self._decode_segment(text[pos:seg_end], pos, carried, run_start, out)
            pos = seg_end
        rest = text[usable:]
        if rest and self._broken is None:
            if usable:
                self._quartet_start = run_start + usable - carried
            self._quartet += rest

    def _decode_segment(
        self, segment: bytes, at: int, carried: int, run_start: int, out: list[tuple[Frame | None, int]]
    ) -> None:
        """Decode the whole quartets of ``segment`` (at offset ``at`` of the run's text,
        whose first ``carried`` characters came before the run) and read the frames they
        complete. A frame ending inside a quartet is released only up to that quartet's
        start."""

        def quartet_start(offset: int) -> int:  # body offset of the quartet at text offset ``offset``
            return self._quartet_start if offset < carried else run_start + offset - carried

        try:
            decoded = base64.b64decode(segment, validate=True)
        except ValueError:
            self._broken = f"not base64 near byte {quartet_start(at)}"
            self.findings.append(("envelope_decompress_failed", f"grpc-web-text: {self._broken}"))
            return
        base = self.inner.scanned
        for frame, frame_end in self.inner.feed_bounded(decoded):
            r = frame_end - base
            boundary = quartet_start(at + len(segment)) if r >= len(decoded) else quartet_start(at + r // 3 * 4)
            self._boundary = max(self._boundary, boundary)
            out.append((frame, self._boundary))

    @property
    def held(self) -> int:
        return self._offset - self._boundary

    def unbound(self) -> list[Frame]:
        return []

    def end(self) -> list[Frame]:
        return self.inner.end()

    @property
    def pending_event(self) -> bool:
        return bool(self._quartet) or self.inner.pending_event


_BASE64_RUN = re.compile(rb"[^ \t\r\n]+")
CONNECT_WRITER = ConnectWriter()
GRPC_WEB_WRITER = GrpcWebWriter()
GRPC_WRITER = GrpcWriter()
GRPC_WEB_TEXT_WRITER = GrpcWebTextWriter()
INCOMPLETE = ("envelope_incomplete", "the body ended inside an envelope")


def connect_reader(max_event_bytes: int, max_record_bytes: int, headers: Mapping[str, str]) -> EnvelopeReader:
    """A Connect stream's reader (messages compressed with ``connect-content-encoding``)."""
    return EnvelopeReader(max_event_bytes, headers.get("connect-content-encoding"), end_stream_flag=True)


def grpc_reader(max_event_bytes: int, max_record_bytes: int, headers: Mapping[str, str]) -> EnvelopeReader:
    """A gRPC body's reader (messages compressed with ``grpc-encoding``)."""
    return EnvelopeReader(max_event_bytes, headers.get("grpc-encoding"))


def grpc_web_reader(max_event_bytes: int, max_record_bytes: int, headers: Mapping[str, str]) -> EnvelopeReader:
    """A gRPC-Web body's reader (``grpc-encoding``; trailers in a 0x80 frame)."""
    return EnvelopeReader(max_event_bytes, headers.get("grpc-encoding"), trailer_flag=True)


def grpc_web_text_reader(
    max_event_bytes: int, max_record_bytes: int, headers: Mapping[str, str]
) -> Base64EnvelopeReader:
    """A gRPC-Web text body's reader: base64 of what :func:`grpc_web_reader` reads."""
    return Base64EnvelopeReader(grpc_web_reader(max_event_bytes, max_record_bytes, headers))


CONNECT = register(
    Framing(
        "connect",
        connect_reader,
        CONNECT_WRITER,
        streamed=True,
        media_types=("application/connect+*",),
        incomplete=INCOMPLETE,
    )
)
GRPC = register(
    Framing(
        "grpc",
        grpc_reader,
        GRPC_WRITER,
        streamed=True,
        media_types=("application/grpc", "application/grpc+*"),
        incomplete=INCOMPLETE,
    )
)
GRPC_WEB = register(
    Framing(
        "grpc_web",
        grpc_web_reader,
        GRPC_WEB_WRITER,
        streamed=True,
        media_types=("application/grpc-web", "application/grpc-web+*"),
        incomplete=INCOMPLETE,
    )
)
GRPC_WEB_TEXT = register(
    Framing(
        "grpc_web_text",
        grpc_web_text_reader,
        GRPC_WEB_TEXT_WRITER,
        streamed=True,
        media_types=("application/grpc-web-text", "application/grpc-web-text+*"),
        incomplete=INCOMPLETE,
    )
)
