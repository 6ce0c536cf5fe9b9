"""The whole-body framing: a body read once it is complete, as one frame.

Everything that is not streamed frame by frame: a JSON answer, an error body. The reader
keeps the decoded body up to a size limit (the record cap: a body larger than that is
passed unread, finding ``body_too_large``) and gives it at the end as one frame whose
data is the body's bytes, for the dialect's ``on_body``. It reports no boundary: a gate
holds such a body whole, and a blocked one is replaced, never continued (no writer).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from addon.framing import Frame, Framing, register


@dataclass(frozen=True, slots=True)
class Body:
    """The one frame of a whole body (``data`` as bytes: the dialect parses them)."""

    raw: bytes
    event: str = "body"
    id: str = ""

    @property
    def data(self) -> str:
        return self.raw.decode("utf-8", "replace")


class WholeReader:
    """Keeps the body, up to ``limit`` bytes, and gives it as one frame at the end."""

    __slots__ = ("limit", "findings", "unreadable", "too_large", "_body")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.findings: list[tuple[str, str]] = []
        self.unreadable: str | None = None
        self.too_large = False  # over the limit: dropped, the rest passes unread
        self._body = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        if self.too_large:
            return []
        if len(self._body) + len(data) > self.limit:
            self.findings.append(("body_too_large", f"over {self.limit} bytes; not read"))
            self.unreadable = f"the body is over {self.limit} bytes"
            self.too_large = True
            self._body = bytearray()
        else:
            self._body += data
        return []

    def feed_bounded(self, data: bytes) -> list[tuple[Frame | None, int]]:
        self.feed(data)
        return []

    @property
    def held(self) -> int:
        return len(self._body)

    def unbound(self) -> list[Frame]:
        return []

    def end(self) -> list[Frame]:
        if self.too_large:
            return []
        body, self._body = bytes(self._body), bytearray()
        return [Body(body)]

    @property
    def pending_event(self) -> bool:
        return False


def reader(max_event_bytes: int, max_record_bytes: int, headers: Mapping[str, str]) -> WholeReader:
    """A reader keeping one body up to the record cap."""
    return WholeReader(max_record_bytes)


FRAMING = register(Framing("whole", reader, None, streamed=False))
