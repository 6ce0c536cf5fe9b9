"""The streamed JSON array framing: a top-level array whose elements arrive one by one.

Gemini's ``streamGenerateContent`` without ``alt=sse`` answers ``[{...}\\n,\\r\\n{...}\\n]``,
flushing each element as it is generated. :class:`JSONArrayReader` yields each element as
a frame as soon as its last byte arrives, with the offset just past it, so the element is
audited (and filtered) while the array flows. It does not parse: it finds where an element
ends (brackets and braces counted outside strings, escapes skipped), and the dialect parses
the element's text. Structural bytes are ASCII and UTF-8 never uses ASCII bytes inside a
multi-byte character, so the bytes are scanned undecoded, with regular expressions that
jump from one structural byte to the next (strings, where the text is, cost one search).

Memory is bounded by ``max_event_bytes``: a larger element is skipped while it arrives
(its bytes still count, so a gate holding them applies the failure policy). The reader
never raises: a body that is not an array, or data after it, is a finding and makes the
rest unreadable. Standard library and :mod:`addon.framing` only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from addon.framing import Frame, Framing, Message, register

# Where the reader is in the array.
_BEFORE, _BETWEEN, _ELEMENT, _AFTER, _BROKEN = range(5)

_NON_SPACE = re.compile(rb"[^ \t\r\n]").search
_STRING_STOP = re.compile(rb'["\\]').search  # inside a string: its end, or an escape
_NESTED_STOP = re.compile(rb'[\[\]{}"]').search  # inside an object or array
_SCALAR_STOP = re.compile(rb"[ \t\r\n,\]]").search  # just past a number or literal
_BOM = b"\xef\xbb\xbf"


class JSONArrayReader:
    """Decoded bytes of a JSON array in, its elements out (``Message(data, "element")``)."""

    __slots__ = (
        "max_event_bytes",
        "findings",
        "frames_read",
        "unreadable",
        "_state",
        "_depth",
        "_in_string",
        "_escape",
        "_scalar",
        "_pieces",
        "_size",
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
        self.unreadable: str | None = None  # why the body cannot be read as an array
        self._state = _BEFORE
        self._depth = 0  # open brackets and braces in the current element
        self._in_string = False
        self._escape = False  # the last byte seen was a backslash in a string
        self._scalar = False  # the element is a number or literal: it ends at a delimiter
        self._pieces: list[bytes] = []  # the current element's bytes so far
        self._size = 0
        self._skip = False  # the current element outgrew the limit: its bytes are not kept
        self._offset = 0  # decoded bytes scanned
        self._boundary = 0  # offset just past the last frame or closing bracket reported
        self._ended_inside = False
        self._invalid_utf8 = False

    # -- the Reader protocol ------------------------------------------------------------------

    def feed(self, data: bytes) -> list[Frame]:
        return [frame for frame, _ in self.feed_bounded(data) if frame is not None]

    def feed_bounded(self, data: bytes) -> list[tuple[Frame | None, int]]:
        out: list[tuple[Frame | None, int]] = []
        pos, end = 0, len(data)
        while pos < end and self._state != _BROKEN:
            if self._state == _ELEMENT:
                pos = self._scan_element(data, pos, out)
            else:
                pos = self._between(data, pos, out)
        self._offset += end
        return out

    @property
    def held(self) -> int:
        return self._offset - self._boundary

    def unbound(self) -> list[Frame]:
        return []  # nothing is held back from reading: boundaries cost nothing here

    def end(self) -> list[Frame]:
        self._ended_inside = self._state in (_BETWEEN, _ELEMENT)
        return []

    @property
    def pending_event(self) -> bool:
        return self._ended_inside or self._state in (_BETWEEN, _ELEMENT)

    # -- scanning -----------------------------------------------------------------------------

    def _between(self, data: bytes, pos: int, out: list[tuple[Frame | None, int]]) -> int:
        """Outside any element: skip whitespace and commas; open, close or start an element."""
        m = _NON_SPACE(data, pos)
        if m is None:
            if self._state == _AFTER:  # whitespace after the array: padding, a boundary too
                self._boundary = self._offset + len(data)
                out.append((None, self._boundary))
            return len(data)
        pos = m.start()
        byte = data[pos : pos + 1]
        state = self._state
        if state == _BEFORE:
            at = self._offset + pos
            if at < len(_BOM) and data[pos] == _BOM[at]:  # a byte order mark, maybe split
                return pos + 1
            if byte != b"[":
                return self._broken("the response body is not a JSON array", pos)
            self._state = _BETWEEN
            return pos + 1
        if state == _AFTER:
            return self._broken("data after the end of the JSON array", pos)
        if byte == b",":
            return pos + 1
        if byte == b"]":
            self._state = _AFTER
            self._boundary = self._offset + pos + 1
            out.append((None, self._boundary))
            return pos + 1
        self._start_element()
        if byte in b"[{":
            self._depth = 1
        elif byte == b'"':
            self._in_string = True
        else:
            self._scalar = True
            return pos  # the scalar's own bytes are taken by the element scan
        self._keep(data[pos : pos + 1])
        return pos + 1

    def _start_element(self) -> None:
        self._state = _ELEMENT
        self._pieces, self._size, self._skip = [], 0, False
        self._depth, self._in_string, self._escape, self._scalar = 0, False, False, False

    def _scan_element(self, data: bytes, pos: int, out: list[tuple[Frame | None, int]]) -> int:
        """Inside an element: find where it ends, keeping its bytes (up to the limit)."""
        start, end = pos, len(data)
        while pos < end:
            if self._escape:
                self._escape = False
                pos += 1
                continue
            if self._in_string:
                m = _STRING_STOP(data, pos)
                if m is None:
                    pos = end
                    break
                pos = m.end()
                if data[m.start()] == 0x5C:  # a backslash: the next byte is escaped
                    self._escape = True
                    continue
                self._in_string = False
                if self._depth == 0:  # a string element ends with its closing quote
                    return self._element_done(data, start, pos, out)
                continue
            if self._scalar:
                m = _SCALAR_STOP(data, pos)
                if m is None:
                    pos = end
                    break
                return self._element_done(data, start, m.start(), out)
            m = _NESTED_STOP(data, pos)
            if m is None:
                pos = end
                break
            pos = m.end()
            byte = data[m.start()]
            if byte == 0x22:  # '"'
                self._in_string = True
            elif byte in b"[{":
                self._depth += 1
            else:
                self._depth -= 1
                if self._depth == 0:
                    return self._element_done(data, start, pos, out)
        self._keep(data[start:pos])
        return pos

    def _element_done(self, data: bytes, start: int, stop: int, out: list[tuple[Frame | None, int]]) -> int:
        """The element ends at ``stop``: report it (or, if it was skipped, its boundary)."""
        self._keep(data[start:stop])
        self._state = _BETWEEN
        self._boundary = self._offset + stop
        out.append((None if self._skip else self._frame(b"".join(self._pieces)), self._boundary))
        self._pieces = []
        return stop

    def _keep(self, piece: bytes) -> None:
        """Add bytes to the current element, unless it has grown past the limit."""
        if self._skip or not piece:
            return
        self._size += len(piece)
        if self._size > self.max_event_bytes:
            self.findings.append(
                ("sse_event_too_long", f"JSON array element longer than {self.max_event_bytes} bytes; skipped")
            )
            self._skip, self._pieces = True, []
            return
        self._pieces.append(piece)

    def _frame(self, raw: bytes) -> Message:
        self.frames_read += 1
        try:
            text = raw.decode()
        except UnicodeDecodeError as exc:
            if not self._invalid_utf8:
                self._invalid_utf8 = True
                self.findings.append(
                    (
                        "response_invalid_utf8",
                        f"invalid UTF-8 at about byte {self._boundary - len(raw) + exc.start}"
                        " of the body; read with U+FFFD",
                    )
                )
            text = raw.decode("utf-8", "replace")
        return Message(text, "element")

    def _broken(self, reason: str, pos: int) -> int:
        """Stop reading: the rest of the body cannot be framed (the scan loop ends)."""
        self.findings.append(("response_invalid_json", reason))
        self.unreadable = reason
        self._state = _BROKEN
        self._pieces = []
        return pos


class JSONArrayWriter:
    """Encodes frames as elements continuing the array (``,elem]``) or as a whole one (``[elem]``)."""

    def encode(self, frames: Sequence[Frame], continues: bool) -> bytes:
        if not frames:
            return b""
        body = b",".join(frame.data.encode() for frame in frames)
        return (b"," if continues else b"[") + body + b"]"


JSON_ARRAY_WRITER = JSONArrayWriter()


def reader(max_event_bytes: int, max_record_bytes: int, headers: Mapping[str, str]) -> JSONArrayReader:
    """A reader for one array (elements are bounded by ``max_event_bytes``)."""
    return JSONArrayReader(max_event_bytes)


FRAMING = register(Framing("json-array", reader, JSON_ARRAY_WRITER, streamed=True))
