"""The NDJSON framing: one JSON value per line (``application/x-ndjson``; Ollama's streams).

Each line is one frame (``Message(line, "line")``), reported as soon as its LF arrives,
with the offset just past that LF, so a line is audited (and filtered) while the body
flows. A CR before the LF is dropped (CRLF is tolerated), blank lines carry no frame
(their bytes are a boundary of their own). The reader does not parse: the dialect parses
each line's text, and a line that is not JSON is the dialect's finding; its bytes pass
unchanged like every other.

Memory is bounded by ``max_event_bytes``: only the unterminated line is kept, and a line
that outgrows the limit is dropped as it arrives (finding ``ndjson_line_too_long``) and
skipped up to its LF, however long it goes on; its bytes still count as held, so a gate
holding them applies the failure policy. A last line without LF is still read as a frame
when the body ends; :attr:`NDJSONReader.pending_event` then says the body ended inside a
line, which a dialect whose servers always end lines reports (``on_end(cut=True)``).
Standard library and :mod:`addon.framing` only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from addon.framing import Frame, Framing, Message, register

LINE = "line"  # the event name of an NDJSON frame
MEDIA_TYPE = "application/x-ndjson"


class NDJSONReader:
    """Decoded bytes of an NDJSON body in, its lines out (``Message(line, "line")``)."""

    __slots__ = (
        "max_event_bytes",
        "findings",
        "frames_read",
        "_line",
        "_skip",
        "_offset",
        "_boundary",
        "_ended_inside",
        "_invalid_utf8",
    )
    unreadable = None  # every body can be read line by line

    def __init__(self, max_event_bytes: int) -> None:
        self.max_event_bytes = max_event_bytes
        self.findings: list[tuple[str, str]] = []
        self.frames_read = 0
        self._line = bytearray()  # the unterminated line so far (grown in place)
        self._skip = False  # that line outgrew the limit: its bytes are not kept
        self._offset = 0  # decoded bytes scanned
        self._boundary = 0  # offset just past the last LF
        self._ended_inside = False  # the body ended with a line that had no LF
        self._invalid_utf8 = False

    # -- the Reader protocol ------------------------------------------------------------------

    def feed(self, data: bytes) -> list[Frame]:
        return [frame for frame, _ in self.feed_bounded(data) if frame is not None]

    def feed_bounded(self, data: bytes) -> list[tuple[Frame | None, int]]:
        out: list[tuple[Frame | None, int]] = []
        pos, size, base = 0, len(data), self._offset
        find = data.find
        while (lf := find(b"\n", pos)) >= 0:
            if self._line or self._skip:
                self._keep(data, pos, lf)
                raw = bytes(self._line)
            else:
                raw = data[pos:lf]  # the common case: a whole line in one chunk, one copy
                if len(raw) > self.max_event_bytes:
                    self._too_long()
            frame = self._line_frame(raw)
            self._boundary = base + lf + 1
            out.append((frame, self._boundary))
            self._line, self._skip = bytearray(), False
            pos = lf + 1
        if pos < size:
            self._keep(data, pos, size)
        self._offset = base + size
        return out

    @property
    def held(self) -> int:
        return self._offset - self._boundary

    def unbound(self) -> list[Frame]:
        return []  # only an unterminated line is held: it has no frame yet

    def end(self) -> list[Frame]:
        """A last line without LF is a frame too (the dialect is told: ``pending_event``)."""
        if not (self._line or self._skip):
            return []
        self._ended_inside = self._skip or bool(self._line.strip())
        frame = self._line_frame(bytes(self._line))
        self._line, self._skip = bytearray(), False
        return [frame] if frame is not None else []

    @property
    def pending_event(self) -> bool:
        return self._ended_inside or self._skip or bool(self._line.strip())

    # -- lines --------------------------------------------------------------------------------

    def _keep(self, data: bytes, start: int, stop: int) -> None:
        """Add ``data[start:stop]`` to the unterminated line, unless it outgrew the limit."""
        if self._skip:
            return
        if len(self._line) + stop - start > self.max_event_bytes:
            self._too_long()
            return
        self._line += memoryview(data)[start:stop]

    def _too_long(self) -> None:
        self.findings.append(("ndjson_line_too_long", f"NDJSON line longer than {self.max_event_bytes} bytes; skipped"))
        self._skip, self._line = True, bytearray()

    def _line_frame(self, raw: bytes) -> Message | None:
        """The frame of the line that starts at the last boundary: None for a blank or
        skipped one; a CR before the LF dropped."""
        if self._skip:
            return None
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if not raw.strip():
            return None
        self.frames_read += 1
        try:
            text = raw.decode()
        except UnicodeDecodeError as exc:
            if not self._invalid_utf8:
                self._invalid_utf8 = True
                self.findings.append(
                    (
                        "response_invalid_utf8",
                        f"invalid UTF-8 at byte {self._boundary + exc.start} of the body; read with U+FFFD",
                    )
                )
            text = raw.decode("utf-8", "replace")
        return Message(text, LINE)


class NDJSONWriter:
    """Encodes frames as lines: each frame's data (one JSON value, compact) and an LF."""

    def encode(self, frames: Sequence[Frame], continues: bool) -> bytes:
        return b"".join(frame.data.encode() + b"\n" for frame in frames)


NDJSON_WRITER = NDJSONWriter()


def reader(max_event_bytes: int, max_record_bytes: int, headers: Mapping[str, str]) -> NDJSONReader:
    """A reader for one NDJSON body (lines are bounded by ``max_event_bytes``)."""
    return NDJSONReader(max_event_bytes)


FRAMING = register(
    Framing("ndjson", reader, NDJSON_WRITER, streamed=True, media_types=(MEDIA_TYPE,), by_expectation=True)
)
