"""One JSON document per WebSocket message: OpenAI Realtime, Gemini Live, consumer Copilot.

A WebSocket message is already a frame: the proxy hands the reader one whole message per
:meth:`MessageReader.feed` call (``addon/mitm/websocket.py``), and the reader makes it one
frame, without looking into it. A message over ``max_event_bytes`` is not read (finding
``ws_message_too_large``) and passes on unchanged: the dialect never parses an unbounded
document on the event loop.

The writer makes each frame one message (:meth:`MessageWriter.encode_messages`): a
termination of two events is two messages, as the client's SDK expects them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from addon.framing import Frame, Framing, Message, register


class MessageReader:
    """A whole WebSocket message in, one frame out."""

    __slots__ = ("max_event_bytes", "findings", "unreadable", "offset")

    def __init__(self, max_event_bytes: int) -> None:
        self.max_event_bytes = max_event_bytes
        self.findings: list[tuple[str, str]] = []
        self.unreadable: str | None = None
        self.offset = 0  # bytes of the connection's direction read so far

    def feed(self, data: bytes) -> list[Frame]:
        self.offset += len(data)
        if len(data) > self.max_event_bytes:
            self.findings.append(("ws_message_too_large", f"a {len(data)}-byte message (limit {self.max_event_bytes})"))
            return []
        return [Message(data.decode("utf-8", "replace"))]

    def feed_bounded(self, data: bytes) -> list[tuple[Frame | None, int]]:
        return [(frame, self.offset) for frame in self.feed(data)] or [(None, self.offset)]

    @property
    def held(self) -> int:
        return 0

    def unbound(self) -> list[Frame]:
        return []

    def end(self) -> list[Frame]:
        return []

    @property
    def pending_event(self) -> bool:
        return False


class MessageWriter:
    """Each frame as one text message."""

    text = True  # the messages go as WebSocket text messages

    def encode_messages(self, frames: Sequence[Frame]) -> list[bytes]:
        return [frame.data.encode() for frame in frames]

    def encode(self, frames: Sequence[Frame], continues: bool) -> bytes:
        return b"".join(self.encode_messages(frames))


def reader(max_event_bytes: int, max_record_bytes: int, headers: Mapping[str, str]) -> MessageReader:
    return MessageReader(max_event_bytes)


WRITER = MessageWriter()
FRAMING = register(Framing("ws_json", reader, WRITER, streamed=True))
