"""The SignalR Hub Protocol over WebSocket: ``signalr_json`` and ``signalr_msgpack``.

A SignalR connection begins with a handshake in each direction, always one JSON object
ended by the Record Separator 0x1E, whatever hub protocol it names (the client's
``{"protocol": "json"|"messagepack", "version": 1}``, the server's ``{}`` or
``{"error": ...}``). After it, records are cut:

- JSON: one object per record, each ended by 0x1E (which JSON cannot hold unescaped);
- MessagePack: a VarInt length (1 to 5 bytes, least significant group first) then a body
  that is one MessagePack array.

Records are not aligned with WebSocket messages: one message may carry several, and a
record may span messages, so the reader buffers across the messages it is fed (one
:meth:`HubReader.feed` call per message, in order). Memory is bounded by
``max_event_bytes``: a record that outgrows it is skipped as it arrives (finding
``signalr_record_too_large``), however long it declares itself. MessagePack bodies are
decoded with the package's length limits and a budget on containers, so that a small
hostile body cannot become a huge object graph.

Each record is a :class:`HubMessage` frame, its ``message`` normalized to the JSON
protocol's field names for both encodings, so the dialects read one shape. Bad records
are findings (``signalr_invalid``), never exceptions. JSON is read as the peers' readers
take it (:mod:`addon.json_read`), the handshake included: a record only a lenient reader
takes (``NaN``, a lone surrogate escape) is read, with the finding ``lenient_json``.
Sans-IO: no mitmproxy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from addon import json_read
from addon.framing import Frame, Framing, register

RS = 0x1E  # the ASCII Record Separator that ends every JSON record
MAX_VARINT_BYTES = 5  # a SignalR length prefix is an unsigned 32-bit VarInt of 1 to 5 bytes
MAX_RECORD_LENGTH = 2**31 - 1  # the spec's largest payload (prefix FF FF FF FF 07)
# Records read from one WebSocket message: clients send a few; a message of a million
# empty records (lone 0x1E, zero lengths) would hold the event loop for seconds. The rest
# of such a message is not read (finding signalr_invalid: the failure policy decides).
MAX_RECORDS_PER_MESSAGE = 4096
#: The most arrays and maps one MessagePack record may decode into: a byte of input can
#: be an empty container (some 60 bytes of Python objects), so input size alone does not
#: bound memory; real hub messages hold a few hundred.
MAX_CONTAINERS = 20_000

#: Message type numbers (the same in both encodings) and the frame's ``event`` name.
TYPE_NAMES = {
    1: "invocation",
    2: "stream_item",
    3: "completion",
    4: "stream_invocation",
    5: "cancel_invocation",
    6: "ping",
    7: "close",
    8: "ack",
    9: "sequence",
}
TYPE_NUMBERS = {name: number for number, name in TYPE_NAMES.items()}
HANDSHAKE = "handshake"
UNKNOWN = "unknown"

#: MessagePack Completion ResultKind values.
RESULT_ERROR, RESULT_VOID, RESULT_VALUE = 1, 2, 3


@dataclass(frozen=True, slots=True)
class HubMessage:
    """One SignalR record: a :class:`~addon.framing.Frame` with the decoded message.

    ``event``: the type's name (:data:`TYPE_NAMES`, ``"handshake"`` or ``"unknown"``);
    ``data``: the record's JSON text (``""`` for MessagePack); ``id``: its invocationId
    or ``""``; ``message``: the record with the JSON protocol's field names; ``raw``: the
    record's bytes (without the separator or the length prefix).
    """

    event: str
    data: str
    id: str
    message: dict[str, Any]
    raw: bytes = b""


def hub_message(message: dict[str, Any]) -> HubMessage:
    """A frame for ``message`` (JSON field names), as the dialects build their
    terminations; either writer encodes it. An id read leniently (a lone surrogate
    escape) is written back as the same escape (:func:`addon.json_read.dumps`)."""
    data = json_read.dumps(message)
    kind = message.get("type")
    event = TYPE_NAMES.get(kind, UNKNOWN) if isinstance(kind, int) else HANDSHAKE
    return HubMessage(event, data, _id_of(message), message, data.encode())


def _id_of(message: Mapping[str, Any]) -> str:
    value = message.get("invocationId")
    return value if isinstance(value, str) else ""


def _json_record(raw: bytes, handshake: bool) -> tuple[HubMessage | None, str | None, bool]:
    """One JSON record read: (frame, None) or (frame or None, why it is malformed); and
    whether only a lenient reader takes its JSON (:func:`addon.json_read.loads`)."""
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        text = raw.decode("utf-8", "replace")
    try:
        obj, lenient = json_read.loads(text)  # (as JavaScript's JSON.parse takes it: a lone surrogate escape too)
    except ValueError as exc:
        return None, f"a record that is not JSON ({str(exc)[:120]})", False
    if not isinstance(obj, dict):
        return None, f"a record that is a JSON {type(obj).__name__}, not an object", lenient
    if handshake:
        return HubMessage(HANDSHAKE, text, "", obj, raw), None, lenient
    kind = obj.get("type")
    name = TYPE_NAMES.get(kind) if isinstance(kind, int) and not isinstance(kind, bool) else None
    frame = HubMessage(name or UNKNOWN, text, _id_of(obj), obj, raw)
    return frame, None if name else f"a record of unknown type {str(kind)[:40]!r}", lenient


def _from_array(items: list[Any]) -> tuple[dict[str, Any], str | None]:
    """A MessagePack record's array as a message with the JSON field names."""
    kind = items[0] if items else None
    if not isinstance(kind, int) or isinstance(kind, bool) or kind not in TYPE_NAMES:
        return {"type": kind if isinstance(kind, int) else None}, f"a record of unknown type {str(kind)[:40]!r}"
    message: dict[str, Any] = {"type": kind}
    if kind in (1, 2, 3, 4, 5):
        if len(items) < (4 if kind in (2, 3) else 3) or (kind in (1, 4) and len(items) < 5):
            return message, f"a type {kind} record of {len(items)} elements"
        if isinstance(items[1], dict) and items[1]:
            message["headers"] = items[1]
        if items[2] is not None:
            message["invocationId"] = items[2]
    if kind in (1, 4):
        message["target"] = items[3]
        message["arguments"] = items[4]
        if len(items) > 5 and items[5]:
            message["streamIds"] = items[5]
    elif kind == 2:
        message["item"] = items[3]
    elif kind == 3:
        result_kind = items[3]
        if result_kind == RESULT_ERROR and len(items) > 4:
            message["error"] = items[4]
        elif result_kind == RESULT_VALUE and len(items) > 4:
            message["result"] = items[4]
        elif result_kind != RESULT_VOID:
            return message, f"a completion of result kind {str(result_kind)[:20]!r}"
    elif kind == 7:
        if len(items) > 1 and items[1] is not None:
            message["error"] = items[1]
        if len(items) > 2:
            message["allowReconnect"] = items[2]
    elif kind in (8, 9):
        if len(items) < 2:
            return message, f"a type {kind} record without its sequence id"
        message["sequenceId"] = items[1]
    return message, None


class _Budget(Exception):
    """A MessagePack record decodes into more containers than :data:`MAX_CONTAINERS`."""


def _unpack(raw: bytes) -> Any:
    """``raw`` as one MessagePack value: strings as ``str``, binary as ``bytes``; the
    container count bounded (the hooks count every array and map as it is built)."""
    count = [0]

    def hook(value: Any) -> Any:
        count[0] += 1
        if count[0] > MAX_CONTAINERS:
            raise _Budget
        return value

    n = len(raw)
    return msgpack.unpackb(
        raw,
        raw=False,
        strict_map_key=False,
        use_list=True,
        list_hook=hook,
        object_hook=hook,
        max_str_len=n,
        max_bin_len=n,
        max_array_len=n,
        max_map_len=n,
        max_ext_len=n,
    )


def _msgpack_record(raw: bytes) -> tuple[HubMessage | None, str | None]:
    """One MessagePack record read: (frame, None) or (frame or None, why it is malformed)."""
    try:
        value = _unpack(raw)
    except _Budget:
        return None, f"a record of more than {MAX_CONTAINERS} arrays and maps"
    except (ValueError, TypeError, OverflowError, msgpack.UnpackException) as exc:  # format, depth, extra data, keys
        return None, f"a record that is not one MessagePack value ({type(exc).__name__})"
    if not isinstance(value, list):
        return None, f"a record that is a MessagePack {type(value).__name__}, not an array"
    message, problem = _from_array(value)
    kind = message.get("type")
    name = TYPE_NAMES.get(kind, UNKNOWN) if problem is None and isinstance(kind, int) else UNKNOWN
    return HubMessage(name, "", _id_of(message), message, raw), problem


class HubReader:
    """WebSocket messages of one direction in, SignalR records out (:class:`HubMessage`).

    The first record is the JSON handshake in both encodings; ``binary`` selects how the
    records after it are cut (MessagePack's VarInt prefix, else 0x1E).
    """

    __slots__ = (
        "max_event_bytes",
        "binary",
        "findings",
        "unreadable",
        "_buf",
        "_offset",
        "_boundary",
        "_handshaken",
        "_skip",
        "_dead",
    )

    def __init__(self, max_event_bytes: int, binary: bool) -> None:
        self.max_event_bytes = max_event_bytes
        self.binary = binary
        self.findings: list[tuple[str, str]] = []
        self.unreadable: str | None = None
        self._buf = bytearray()  # the unfinished record (JSON), or prefix and body (MessagePack)
        self._offset = 0  # bytes of this direction read so far
        self._boundary = 0  # offset just past the last whole record
        self._handshaken = False
        self._skip = 0  # MessagePack body bytes still to skip; -1: JSON, skip to the next 0x1E
        self._dead = False  # a length prefix that cannot be one: nothing after it can be framed

    # -- the Reader protocol ------------------------------------------------------------------

    def feed(self, data: bytes) -> list[Frame]:
        return [frame for frame, _ in self.feed_bounded(data) if frame is not None]

    def feed_bounded(self, data: bytes) -> list[tuple[Frame | None, int]]:
        out: list[tuple[Frame | None, int]] = []
        pos = 0
        while pos < len(data) and not self._dead:
            if len(out) >= MAX_RECORDS_PER_MESSAGE:
                self._invalid(f"more than {MAX_RECORDS_PER_MESSAGE} records in one message; the rest not read")
                self._buf, self._skip = bytearray(), 0  # (read again from the next message)
                self._boundary = self._offset + len(data)
                out.append((None, self._boundary))
                break
            if not self._handshaken or not self.binary:
                pos = self._json_step(data, pos, out)
            else:
                pos = self._msgpack_step(data, pos, out)
        self._offset += len(data)
        if self._dead:  # nothing after a broken prefix is held for a record
            self._boundary = self._offset
            out.append((None, self._offset))
        return out

    @property
    def held(self) -> int:
        return self._offset - self._boundary

    def unbound(self) -> list[Frame]:
        return []  # only an unfinished record is held: it has no frame yet

    def end(self) -> list[Frame]:
        if self._skip or (self._buf.strip() if not self.binary or not self._handshaken else self._buf):
            self.findings.append(("signalr_invalid", "the connection ended inside a record"))
        self._buf = bytearray()
        return []

    @property
    def pending_event(self) -> bool:
        return bool(self._buf)

    # -- records ------------------------------------------------------------------------------

    def _json_step(self, data: bytes, pos: int, out: list[tuple[Frame | None, int]]) -> int:
        """Read up to the next 0x1E (or the message's end): one JSON record at most."""
        end = data.find(RS, pos)
        stop = len(data) if end < 0 else end
        if self._skip:
            pass  # the record outgrew the limit: its bytes are not kept
        elif len(self._buf) + stop - pos > self.max_event_bytes:
            self._too_large(f"a JSON record longer than {self.max_event_bytes} bytes")
            self._skip = -1
        else:
            self._buf += memoryview(data)[pos:stop]
        if end < 0:
            return len(data)
        raw, skipped = bytes(self._buf), self._skip
        self._buf, self._skip = bytearray(), 0
        self._boundary = self._offset + end + 1
        handshake = not self._handshaken
        frame: HubMessage | None = None
        if not skipped and raw.strip():
            frame, problem, lenient = _json_record(raw, handshake)
            if problem:
                self._invalid(problem)
            if lenient:  # (read all the same: a peer's reader takes it, so the filters check it)
                what = "the handshake" if handshake else f"a {frame.event if frame else 'malformed'} record"
                self.findings.append(("lenient_json", f"{what}: JSON only lenient readers take"))
        if handshake and (raw.strip() or skipped):
            self._handshaken = True
        out.append((frame, self._boundary))
        return end + 1

    def _msgpack_step(self, data: bytes, pos: int, out: list[tuple[Frame | None, int]]) -> int:
        """Read one length prefix and body (or as much of it as the message holds)."""
        if self._skip:
            n = min(self._skip, len(data) - pos)
            self._skip -= n
            pos += n
            if not self._skip:
                self._boundary = self._offset + pos
                out.append((None, self._boundary))
            return pos
        length, size = _varint(self._buf) if self._buf else (None, 0)
        while length is None and pos < len(data):
            if len(self._buf) >= MAX_VARINT_BYTES:
                break
            self._buf.append(data[pos])
            pos += 1
            length, size = _varint(self._buf)
        if length is None:
            if len(self._buf) >= MAX_VARINT_BYTES:
                self._kill(f"a length prefix of more than {MAX_VARINT_BYTES} bytes")
            return pos
        if length > MAX_RECORD_LENGTH:
            self._kill(f"a declared record length of {length} bytes, beyond the protocol's 2 GB")
            return pos
        if length > self.max_event_bytes:
            self._too_large(f"a MessagePack record of {length} bytes (limit {self.max_event_bytes})")
            self._buf, self._skip = bytearray(), length
            return self._msgpack_step(data, pos, out) if length else pos
        need = size + length - len(self._buf)
        take = min(need, len(data) - pos)
        self._buf += memoryview(data)[pos : pos + take]
        pos += take
        if take < need:
            return pos
        raw = bytes(self._buf[size:])
        self._buf = bytearray()
        self._boundary = self._offset + pos
        frame, problem = _msgpack_record(raw)
        if problem:
            self._invalid(problem)
        out.append((frame, self._boundary))
        return pos

    def _invalid(self, detail: str) -> None:
        self.findings.append(("signalr_invalid", detail))

    def _too_large(self, detail: str) -> None:
        self.findings.append(("signalr_record_too_large", f"{detail}; skipped (it still passed through)"))

    def _kill(self, detail: str) -> None:
        """A length that cannot be framed: the rest of this direction is not read."""
        self._invalid(f"{detail}; the rest of the connection is not read")
        self.unreadable = detail
        self._dead, self._buf = True, bytearray()


def _varint(prefix: bytes | bytearray) -> tuple[int | None, int]:
    """The length a VarInt prefix gives and its size, or (None, 0) while it goes on."""
    value = 0
    for i, byte in enumerate(prefix):
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return value, i + 1
    return None, 0


def varint(n: int) -> bytes:
    """``n`` as a SignalR length prefix."""
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def handshake_framing(first: bytes) -> str | None:
    """The framing of a connection whose first client message is ``first``: a SignalR
    handshake (a JSON object then 0x1E) naming protocol ``json`` or ``messagepack``,
    version 1; None for anything else. Read exactly as the reader reads it after
    (:func:`_json_record`): leniently (which records ``lenient_json``), since a handshake
    read strictly here would leave a connection the hub accepts unclaimed, and unrecorded;
    and as UTF-8 text, since bytes in another encoding (a BOM, UTF-16) that ``json.loads``
    would take are a record the reader rejects, a connection claimed but never read."""
    end = first.find(RS, 0, 4097)  # (a handshake is short: no scan of a large first message)
    if end < 0 or end > 4096:
        return None
    frame, problem, _ = _json_record(first[:end], True)
    if frame is None or problem is not None:
        return None
    obj = frame.message
    if obj.get("version") != 1 or isinstance(obj.get("version"), bool):
        return None
    return {"json": JSON_FRAMING.name, "messagepack": MSGPACK_FRAMING.name}.get(obj.get("protocol"))  # type: ignore[arg-type]


# -- writers ----------------------------------------------------------------------------------


class JsonHubWriter:
    """Records as one text message: each frame's JSON then 0x1E."""

    text = True

    def encode_messages(self, frames: Sequence[Frame]) -> list[bytes]:
        if not frames:
            return []
        return [b"".join(frame.data.encode() + b"\x1e" for frame in frames)]

    def encode(self, frames: Sequence[Frame], continues: bool) -> bytes:
        return b"".join(self.encode_messages(frames))


class MsgpackHubWriter:
    """Records as one binary message of VarInt-prefixed MessagePack arrays, built from
    each :class:`HubMessage`'s ``message`` (frames that are not one are left out)."""

    text = False

    def encode_messages(self, frames: Sequence[Frame]) -> list[bytes]:
        records = [_pack(frame.message) for frame in frames if isinstance(frame, HubMessage)]
        return [b"".join(varint(len(r)) + r for r in records)] if records else []

    def encode(self, frames: Sequence[Frame], continues: bool) -> bytes:
        return b"".join(self.encode_messages(frames))


class HubWriter:
    """The writer of one connection: JSON records until its handshake names MessagePack
    (the normalizer sets :attr:`binary` then), since the encoding is known only once the
    connection is under way, after whoever asked for the writer took it."""

    __slots__ = ("binary",)

    def __init__(self, binary: bool = False) -> None:
        self.binary = binary

    @property
    def text(self) -> bool:
        return not self.binary

    def encode_messages(self, frames: Sequence[Frame]) -> list[bytes]:
        return (MSGPACK_WRITER if self.binary else JSON_WRITER).encode_messages(frames)

    def encode(self, frames: Sequence[Frame], continues: bool) -> bytes:
        return b"".join(self.encode_messages(frames))


def _pack(message: Mapping[str, Any]) -> bytes:
    """A message with the JSON field names as its MessagePack array."""
    kind = message.get("type")
    headers = message.get("headers") or {}
    invocation = message.get("invocationId")
    items: list[Any]
    if kind in (1, 4):
        items = [kind, headers, invocation, message.get("target"), message.get("arguments") or []]
        items.append(message.get("streamIds") or [])
    elif kind == 2:
        items = [kind, headers, invocation, message.get("item")]
    elif kind == 3:
        if "error" in message:
            items = [kind, headers, invocation, RESULT_ERROR, message["error"]]
        elif "result" in message:
            items = [kind, headers, invocation, RESULT_VALUE, message["result"]]
        else:
            items = [kind, headers, invocation, RESULT_VOID]
    elif kind == 5:
        items = [kind, headers, invocation]
    elif kind == 7:
        items = [kind, message.get("error")]
        if "allowReconnect" in message:
            items.append(bool(message["allowReconnect"]))
    elif kind in (8, 9):
        items = [kind, message.get("sequenceId")]
    else:
        items = [kind]
    return msgpack.packb(items, use_bin_type=True)


def _reader(binary: bool) -> Callable[[int, int, Mapping[str, str]], HubReader]:
    def reader(max_event_bytes: int, max_record_bytes: int, headers: Mapping[str, str]) -> HubReader:
        return HubReader(max_event_bytes, binary)

    return reader


JSON_WRITER = JsonHubWriter()
MSGPACK_WRITER = MsgpackHubWriter()
JSON_FRAMING = register(Framing("signalr_json", _reader(False), JSON_WRITER, streamed=True))
MSGPACK_FRAMING = register(Framing("signalr_msgpack", _reader(True), MSGPACK_WRITER, streamed=True))
