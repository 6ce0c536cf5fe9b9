"""The AWS event-stream framing (``application/vnd.amazon.eventstream``): Bedrock's streams.

A body is a run of binary messages, back to back, cut anywhere by the transport::

    total_length u32 | headers_length u32 | prelude_crc u32     (the prelude, 12 bytes)
    headers (headers_length bytes) | payload | message_crc u32

All integers are big-endian; ``prelude_crc`` is the CRC-32 (zlib's) of the first 8
bytes, ``message_crc`` of everything before it. A header is ``name_len u8``, the name,
``type u8`` and a value of one of ten types (booleans true and false, byte, short,
int, long, byte array, string, timestamp, UUID).

:class:`EventStreamReader` reads messages as they arrive and reports the offset just
past each, so the output gate releases a stream message by message. It is written here
rather than taken from botocore's ``botocore.eventstream.EventStreamBuffer``, which the
proxy cannot use as it is: that parser raises on a bad CRC or a bad length and is then
stuck (a reader here must record a finding and let the bytes pass), it reports no
boundaries (the gate needs the end offset of every message), it buffers a message of
any length its limits allow (16 MiB of payload, not ``max_event_bytes``), and it copies
the whole buffer for every message taken from it.

What goes wrong is a finding, never an exception, and the bytes always pass unchanged:

- a prelude whose CRC does not match (``eventstream_crc_mismatch``) or whose lengths
  cannot be (``eventstream_invalid``): the lengths cannot be trusted, so nothing after
  it can be framed; the rest of the body is unreadable (a gate applies the failure
  policy);
- a message whose CRC does not match (``eventstream_crc_mismatch``) or whose headers
  are malformed (``eventstream_invalid``): its length is known (the prelude was
  sound), so the message is still read, as the client may read it, and the next
  one follows;
- a message longer than ``max_event_bytes`` (``eventstream_message_too_long``) is
  skipped as it arrives, without keeping its bytes (memory stays bounded).

:class:`EventStreamWriter` encodes the exception messages a dialect sends when a content
filter stops a stream (Bedrock's ``:message-type: exception``), with both CRCs.
Standard library and :mod:`addon.framing` only.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from addon.framing import Frame, Framing, register

MEDIA_TYPE = "application/vnd.amazon.eventstream"
PRELUDE = 12  # total_length, headers_length, prelude_crc
OVERHEAD = PRELUDE + 4  # and the message CRC: the smallest message
_PRELUDE = struct.Struct(">III")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The fixed-size header value types: type byte -> (size, struct format).
_FIXED = {2: (1, ">b"), 3: (2, ">h"), 4: (4, ">i"), 5: (8, ">q"), 8: (8, ">q")}

HeaderValue = bool | int | bytes | str | datetime | uuid.UUID


@dataclass(frozen=True, slots=True)
class EventStreamMessage:
    """One event-stream message as a frame.

    ``event`` is what names it: the ``:event-type`` of an event, the ``:exception-type``
    of an exception, the ``:error-code`` of an error; ``message_type`` is the
    ``:message-type`` header (``event`` when absent, as the SDKs read it); ``data`` the
    payload as text (JSON, for Bedrock); ``headers`` every header, typed.
    """

    event: str
    data: str
    message_type: str = "event"
    headers: Mapping[str, HeaderValue] = field(default_factory=dict)
    id: str = ""


class EventStreamReader:
    """Decoded body bytes in, :class:`EventStreamMessage` frames out (see the module doc)."""

    __slots__ = (
        "max_event_bytes",
        "findings",
        "frames_read",
        "unreadable",
        "_buf",
        "_total",
        "_skip",
        "_offset",
        "_boundary",
        "_ended_inside",
        "_invalid_utf8",
    )

    def __init__(self, max_event_bytes: int) -> None:
        self.max_event_bytes = max_event_bytes
        self.findings: list[tuple[str, str]] = []
        self.frames_read = 0
        self.unreadable: str | None = None  # set when a prelude cannot be trusted: nothing more is framed
        self._buf = bytearray()  # the current message's bytes so far
        self._total = 0  # the current message's total_length, once its prelude is read (0: not yet)
        self._skip = 0  # bytes of an oversized message still to pass unkept
        self._offset = 0  # decoded bytes fed
        self._boundary = 0  # offset just past the last message reported
        self._ended_inside = False
        self._invalid_utf8 = False

    # -- the Reader protocol ------------------------------------------------------------------

    def feed(self, data: bytes) -> list[Frame]:
        return [frame for frame, _ in self.feed_bounded(data) if frame is not None]

    def feed_bounded(self, data: bytes) -> list[tuple[Frame | None, int]]:
        out: list[tuple[Frame | None, int]] = []
        pos, end = 0, len(data)
        while pos < end and self.unreadable is None:
            if self._skip:
                step = min(self._skip, end - pos)
                self._skip -= step
                pos += step
                if not self._skip:
                    self._boundary = self._offset + pos
                    out.append((None, self._boundary))
                continue
            if not self._buf and not self._total:
                pos = self._whole_messages(data, pos, out)  # the fast path: no copy into the buffer
                if pos >= end or self.unreadable is not None:
                    break
            need = (self._total or PRELUDE) - len(self._buf)
            piece = data[pos : pos + need]
            self._buf += piece
            pos += len(piece)
            if len(piece) < need:
                break
            if not self._total:
                self._prelude(bytes(self._buf), pos, out)
            else:
                message, self._buf, self._total = bytes(self._buf), bytearray(), 0
                self._message_done(message, self._offset + pos, out)
        self._offset += end
        return out

    @property
    def held(self) -> int:
        return self._offset - self._boundary

    def unbound(self) -> list[Frame]:
        return []  # reading with boundaries costs nothing more: nothing is held back unread

    def end(self) -> list[Frame]:
        self._ended_inside = self._inside
        return []

    @property
    def pending_event(self) -> bool:
        return self._ended_inside or self._inside

    @property
    def _inside(self) -> bool:
        return bool(self._buf or self._total or self._skip)

    # -- reading ------------------------------------------------------------------------------

    def _whole_messages(self, data: bytes, pos: int, out: list[tuple[Frame | None, int]]) -> int:
        """Read the messages that lie whole in ``data`` from ``pos``; where the rest starts."""
        end = len(data)
        while end - pos >= PRELUDE and self.unreadable is None:
            total = self._check_prelude(data[pos : pos + PRELUDE], self._offset + pos)
            if total is None:
                return end
            if total > self.max_event_bytes or end - pos < total:
                return pos  # buffered (or skipped) by the general path
            self._message_done(data[pos : pos + total], self._offset + pos + total, out)
            pos += total
        return pos

    def _prelude(self, prelude: bytes, pos: int, out: list[tuple[Frame | None, int]]) -> None:
        """A prelude is complete in the buffer: keep reading the message, skip it, or stop."""
        total = self._check_prelude(prelude, self._offset + pos - PRELUDE)
        if total is None:
            self._buf = bytearray()
            return
        if total > self.max_event_bytes:
            self.findings.append(
                (
                    "eventstream_message_too_long",
                    f"a message of {total} bytes, over {self.max_event_bytes}; skipped",
                )
            )
            self._buf, self._skip = bytearray(), total - PRELUDE
            return
        self._total = total

    def _check_prelude(self, prelude: bytes, at: int) -> int | None:
        """The message's total length, or None (and the body unreadable) when the prelude
        cannot be trusted: its CRC does not match, or its lengths contradict each other."""
        total, headers_length, crc = _PRELUDE.unpack(prelude)
        if zlib.crc32(prelude[:8]) != crc:
            self._broken("eventstream_crc_mismatch", f"the prelude CRC of the message at byte {at} is wrong")
            return None
        if total < OVERHEAD or headers_length > total - OVERHEAD:
            self._broken(
                "eventstream_invalid", f"the message at byte {at}: total length {total}, headers {headers_length}"
            )
            return None
        return total

    def _broken(self, code: str, detail: str) -> None:
        """Stop framing: what follows cannot be cut into messages (the loops end)."""
        self.findings.append((code, f"{detail}; the rest of the body is not read"))
        self.unreadable = detail

    def _message_done(self, message: bytes, end: int, out: list[tuple[Frame | None, int]]) -> None:
        """A whole message (prelude checked): its frame, and the boundary after it."""
        self._boundary = end
        start = end - len(message)
        (crc,) = struct.unpack_from(">I", message, len(message) - 4)
        if zlib.crc32(memoryview(message)[:-4]) != crc:
            self.findings.append(
                ("eventstream_crc_mismatch", f"the message CRC of the message at byte {start} is wrong")
            )
        headers_length = struct.unpack_from(">I", message, 4)[0]
        headers, problem = parse_headers(memoryview(message)[PRELUDE : PRELUDE + headers_length])
        if problem is not None:
            self.findings.append(("eventstream_invalid", f"the message at byte {start}: {problem}"))
        payload = message[PRELUDE + headers_length : -4]
        self.frames_read += 1
        out.append((_frame(headers, self._text(payload, start)), end))

    def _text(self, payload: bytes, start: int) -> str:
        try:
            return payload.decode()
        except UnicodeDecodeError:
            if not self._invalid_utf8:
                self._invalid_utf8 = True
                self.findings.append(
                    (
                        "response_invalid_utf8",
                        f"the payload of the message at byte {start} is not UTF-8; read with U+FFFD",
                    )
                )
            return payload.decode("utf-8", "replace")


def _frame(headers: dict[str, HeaderValue], data: str) -> EventStreamMessage:
    kind = headers.get(":message-type")
    message_type = kind if isinstance(kind, str) else "event"
    name_header = {"exception": ":exception-type", "error": ":error-code"}.get(message_type, ":event-type")
    name = headers.get(name_header)
    return EventStreamMessage(name if isinstance(name, str) else "", data, message_type, headers)


def parse_headers(raw: memoryview) -> tuple[dict[str, HeaderValue], str | None]:
    """The headers of one message, and what is wrong with them (None: nothing).

    Malformed headers (a value running past the end, an unknown type, a repeated name)
    stop the parse there: the headers before it are kept.
    """
    headers: dict[str, HeaderValue] = {}
    pos, end = 0, len(raw)
    while pos < end:
        name_len = raw[pos]
        name_end = pos + 1 + name_len
        if name_len == 0 or name_end + 1 > end:
            return headers, f"a header name runs past the headers at header byte {pos}"
        name = bytes(raw[pos + 1 : name_end]).decode("utf-8", "replace")
        kind = raw[name_end]
        value, pos = _header_value(raw, kind, name_end + 1)
        if pos < 0:
            return headers, f"header {name!r}: a value of type {kind} that is unknown or runs past the headers"
        if name in headers:
            return headers, f"header {name!r} repeated"
        headers[name] = value
    return headers, None


def _header_value(raw: memoryview, kind: int, pos: int) -> tuple[Any, int]:
    """One header value of type ``kind`` at ``pos``, and where the next header starts (-1: bad)."""
    end = len(raw)
    if kind in (0, 1):
        return kind == 0, pos
    if kind in _FIXED:
        size, fmt = _FIXED[kind]
        if pos + size > end:
            return None, -1
        (number,) = struct.unpack_from(fmt, raw, pos)
        return (_timestamp(number) if kind == 8 else number), pos + size
    if kind in (6, 7):
        if pos + 2 > end:
            return None, -1
        (length,) = struct.unpack_from(">H", raw, pos)
        if pos + 2 + length > end:
            return None, -1
        value = bytes(raw[pos + 2 : pos + 2 + length])
        return (value.decode("utf-8", "replace") if kind == 7 else value), pos + 2 + length
    if kind == 9:
        if pos + 16 > end:
            return None, -1
        return uuid.UUID(bytes=bytes(raw[pos : pos + 16])), pos + 16
    return None, -1


def _timestamp(ms: int) -> datetime | int:
    """A timestamp header's time; milliseconds beyond what a datetime holds stay a number."""
    try:
        return _EPOCH + timedelta(milliseconds=ms)
    except OverflowError:
        return ms


# -- writing --------------------------------------------------------------------------------


def encode_message(headers: Sequence[tuple[str, str]], payload: bytes) -> bytes:
    """One message with string headers, its lengths and both CRCs."""
    head = b"".join(_string_header(name, value) for name, value in headers)
    total = OVERHEAD + len(head) + len(payload)
    prelude = struct.pack(">II", total, len(head))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    body = prelude + head + payload
    return body + struct.pack(">I", zlib.crc32(body))


def _string_header(name: str, value: str) -> bytes:
    key, text = name.encode(), value.encode()
    return bytes((len(key),)) + key + b"\x07" + struct.pack(">H", len(text)) + text


class EventStreamWriter:
    """Encodes each frame as an exception message: ``event`` is its ``:exception-type``,
    ``data`` its JSON payload (``{"message": ...}``). Messages need no separator, so
    continuing a stream and starting one are the same bytes."""

    def encode(self, frames: Sequence[Frame], continues: bool) -> bytes:
        headers = (":message-type", "exception"), (":content-type", "application/json")
        return b"".join(
            encode_message((headers[0], (":exception-type", f.event), headers[1]), f.data.encode()) for f in frames
        )


EVENTSTREAM_WRITER = EventStreamWriter()


def reader(max_event_bytes: int, max_record_bytes: int, headers: Mapping[str, str]) -> EventStreamReader:
    """A reader for one body (messages are bounded by ``max_event_bytes``)."""
    return EventStreamReader(max_event_bytes)


FRAMING = register(
    Framing(
        "eventstream",
        reader,
        EVENTSTREAM_WRITER,
        streamed=True,
        media_types=(MEDIA_TYPE,),
        incomplete=("eventstream_incomplete", "the body ended inside an event-stream message"),
    )
)
