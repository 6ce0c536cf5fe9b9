"""WebSocket upstreams of the mock: the LLM protocols that run over one long connection.

Routed by path (hypercorn serves WebSocket over HTTP/1.1, plain and TLS):

* ``/v1/realtime?model=...``: OpenAI Realtime. GA event names, or the beta ones when the
  upgrade carries ``OpenAI-Beta: realtime=v1``.
* ``/ws/google.ai.generativelanguage.{v1,v1beta,v1alpha}.GenerativeService.BidiGenerateContent``
  (and ``...Constrained``) and ``/ws/google.cloud.aiplatform.{version}.LlmBidiService/BidiGenerateContent``:
  Gemini Live. Answers are text frames, binary ones with ``?binary=1``; errors close the
  socket (1007 / 1008 and a reason), as the real service does.
* ``/c/api/chat``: consumer Copilot (plain JSON events, one per message).
* SignalR hubs (handshake, then JSON records ending in ``0x1E`` on text frames or
  length-prefixed MessagePack arrays on binary frames): the Copilot ChatHub at
  ``/sydney/ChatHub`` and ``/m365Copilot/Chathub/{anything}``, and a generic hub at
  ``/hubs/chat`` (``Generate`` streams strings, ``Ask`` returns one).

What the model says is steered from the prompt text (:class:`Plan`): ``say: X`` makes the
answer ``X`` (the rest of the text), ``delay_ms=N`` waits between pieces (also a query
parameter), ``fail_after=N`` ends the answer with the protocol's error after N pieces and
``close=CODE`` (``close_after=N``) closes the WebSocket instead; ``tool=NAME`` makes
Realtime and Gemini Live call that tool with ``{"text": X}``.

Realtime runs an out-of-band response (``response.create`` with ``response.conversation:
"none"``, its prompt the text of its own ``input``, else its ``instructions``) beside the
default one, as the service does. Two text responses whose prompts carry ``interleave=1``
take turns, a piece each, from the moment the second one is asked for, in the order the
client asked for them, each one's end (its done events and ``response.done``) one turn:
their events interleave the same way every run.

Each connection is kept like an HTTP exchange for ``/_mock/requests/{id}`` and
``/_mock/sent/{id}``: ``id`` is the upgrade's ``x-mock-id`` header or the ``mock_id``
query parameter. ``body`` is every frame payload received (or sent) concatenated;
``frames`` lists them one by one. ``close`` says who closed and how; hypercorn reports
every close the client starts as 1006 (it does not pass the client's code on).

A Gemini Live ``setup`` whose model contains ``blocked-model`` is refused with close 1008.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn
from urllib.parse import parse_qs

import msgpack
import orjson

Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Frame = str | bytes

DEFAULT_ANSWER = "Hello from the mock WebSocket model, answering your prompt."
PIECE = 4
"""Characters per streamed piece of an answer."""
KEEP = 4 * 1024 * 1024
"""Bytes of received / sent payloads a connection record keeps (each way)."""
KEEP_FRAMES = 10_000
"""Frames a connection record lists (each way)."""
RS = "\x1e"

_GEMINI_PATH = re.compile(
    r"^/ws/google\.(ai\.generativelanguage\.v1(alpha|beta)?\.GenerativeService\.BidiGenerateContent(Constrained)?"
    r"|cloud\.aiplatform\.v1(beta1)?\.LlmBidiService/BidiGenerateContent)$"
)


# -- what to answer ---------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """The answer a prompt asks for, and how to deliver it."""

    text: str = DEFAULT_ANSWER
    delay: float = 0.0
    fail_after: int | None = None
    close: int | None = None
    close_after: int = 0
    tool: str | None = None
    """Call this tool (Realtime, Gemini Live) with ``{"text": text}`` instead of answering."""
    interleave: bool = False
    """Take turns with another Realtime response that has it (:class:`_Turns`)."""

    @classmethod
    def parse(cls, prompt: str, query: dict[str, list[str]] | None = None) -> Plan:
        """The knobs in ``prompt`` (and ``delay_ms`` in the query); ``say:`` takes the rest."""
        knobs = dict(re.findall(r"\b(delay_ms|fail_after|close_after|close|interleave)=(\d+)", prompt))
        if "delay_ms" not in knobs and query and query.get("delay_ms"):
            knobs["delay_ms"] = query["delay_ms"][-1]
        said = re.search(r"say:\s*(.*)", prompt, re.DOTALL)
        text = (
            re.sub(r"\b(delay_ms|fail_after|close_after|close|interleave)=\d+\s*|\btool=\w+\s*", "", said[1]).strip()
            if said
            else ""
        )
        return cls(
            text=text or DEFAULT_ANSWER,
            delay=int(knobs.get("delay_ms", 0)) / 1000,
            fail_after=int(knobs["fail_after"]) if "fail_after" in knobs else None,
            close=int(knobs["close"]) if "close" in knobs else None,
            close_after=int(knobs.get("close_after", 0)),
            tool=tool[1] if (tool := re.search(r"\btool=(\w+)", prompt)) else None,
            interleave=knobs.get("interleave", "0") != "0",
        )

    def pieces(self) -> list[str]:
        return [self.text[i : i + PIECE] for i in range(0, len(self.text), PIECE)]

    @property
    def fails(self) -> bool:
        """The answer stops at ``fail_after`` with the protocol's error (after :meth:`paced` ends)."""
        return self.fail_after is not None and self.fail_after < len(self.pieces())

    async def paced(self, conn: Connection) -> AsyncIterator[tuple[int, str]]:
        """The pieces with their index, ``delay`` apart, up to ``fail_after``; closes ``conn``
        (:class:`Closed`) at ``close_after`` when the plan has a ``close``."""
        pieces = self.pieces()
        for index, piece in enumerate(pieces):
            if index and self.delay:
                await asyncio.sleep(self.delay)
            await self._maybe_close(conn, index)
            if self.fail_after is not None and index >= self.fail_after:
                return
            yield index, piece
        await self._maybe_close(conn, len(pieces))

    async def _maybe_close(self, conn: Connection, index: int) -> None:
        if self.close is not None and index >= self.close_after:
            await conn.close(self.close, "mock close")


class Closed(Exception):
    """The client went away, or the mock closed the socket: stop answering."""


# -- the connection -----------------------------------------------------------------------


@dataclass
class Recorded:
    """One WebSocket connection as ``/_mock/*`` shows it (duck-types :class:`mockllm.server.Exchange`)."""

    upgrade: dict[str, Any]
    """The upgrade request: method, path, query, headers."""
    received: bytearray = field(default_factory=bytearray)
    body: bytearray = field(default_factory=bytearray)
    frames_received: list[dict[str, Any]] = field(default_factory=list)
    frames_sent: list[dict[str, Any]] = field(default_factory=list)
    close: dict[str, Any] | None = None
    completed: bool = False
    disconnected: bool = False

    @property
    def request(self) -> dict[str, Any]:
        """``/_mock/requests/{id}``: the upgrade, and the client's frames so far."""
        return {**self.upgrade, "body_b64": base64.b64encode(self.received).decode(), "frames": self.frames_received}

    def got(self, frame: Frame) -> None:
        _keep(self.received, self.frames_received, frame)

    def wrote(self, frame: Frame) -> None:
        _keep(self.body, self.frames_sent, frame)

    def sent(self) -> dict[str, Any]:
        """``/_mock/sent/{id}``: the server's frames so far, and how the connection ended."""
        return {
            "body_b64": base64.b64encode(self.body).decode(),
            "size": len(self.body),
            "frames": self.frames_sent,
            "close": self.close,
            "completed": self.completed,
            "disconnected": self.disconnected,
        }


def _keep(payloads: bytearray, frames: list[dict[str, Any]], frame: Frame) -> None:
    """Record a frame, within :data:`KEEP` bytes and :data:`KEEP_FRAMES` frames."""
    data = frame.encode() if isinstance(frame, str) else frame
    payloads += data[: KEEP - len(payloads)]
    if len(frames) < KEEP_FRAMES:
        frames.append(_frame_info(frame))


def _frame_info(frame: Frame) -> dict[str, Any]:
    if isinstance(frame, str):
        return {"time": time.time(), "opcode": "text", "text": frame}
    return {"time": time.time(), "opcode": "binary", "b64": base64.b64encode(frame).decode()}


class Connection:
    """An accepted WebSocket: frames in (through a queue filled by a reader task) and out."""

    def __init__(self, receive: Receive, send: Send, record: Recorded, query: dict[str, list[str]]) -> None:
        self._receive, self._send, self.record, self.query = receive, send, record, query
        self._incoming: asyncio.Queue[Frame | None] = asyncio.Queue()
        self.closed = False
        self.binary = query.get("binary") == ["1"]

    async def pump(self) -> None:
        """Move client frames to the queue until the client disconnects."""
        while True:
            message = await self._receive()
            if message["type"] == "websocket.disconnect":
                self.closed = True
                if self.record.close is None:
                    self.record.close = {"by": "client", "code": message.get("code")}
                    self.record.disconnected = True
                await self._incoming.put(None)
                return
            if message["type"] == "websocket.receive":
                frame: Frame = message["bytes"] if message.get("bytes") is not None else message.get("text") or ""
                self.record.got(frame)
                await self._incoming.put(frame)

    async def next(self) -> Frame:
        """The next client frame; :class:`Closed` once the client is gone."""
        frame = await self._incoming.get()
        if frame is None:
            raise Closed
        return frame

    async def send(self, frame: Frame) -> None:
        if self.closed:
            raise Closed
        message: Message = {"type": "websocket.send"}
        message["bytes" if isinstance(frame, bytes) else "text"] = frame
        await self._send(message)
        self.record.wrote(frame)

    async def send_json(self, obj: Any) -> None:
        """One JSON message, as a binary frame when the connection asked ``binary=1``."""
        data = orjson.dumps(obj)
        await self.send(data if self.binary else data.decode())

    async def close(self, code: int = 1000, reason: str = "") -> NoReturn:
        """Close the WebSocket, then stop the handler (:class:`Closed`)."""
        if self.closed:
            raise Closed
        self.closed = True
        self.record.close = {"by": "server", "code": code, "reason": reason}
        self.record.completed = code == 1000
        await self._send({"type": "websocket.close", "code": code, "reason": reason})
        raise Closed


Handler = Callable[[Connection, dict[str, Any]], Awaitable[None]]


def handler_for(path: str) -> Handler | None:
    """The protocol served at ``path``, or None (the upgrade is refused)."""
    if path == "/v1/realtime":
        return serve_realtime
    if _GEMINI_PATH.match(path):
        return serve_gemini_live
    if path == "/c/api/chat":
        return serve_copilot
    if path.lower() == "/sydney/chathub" or path.lower().startswith("/m365copilot/chathub/"):
        return serve_signalr
    if path == "/hubs/chat":
        return serve_signalr
    return None


def is_negotiate(scope: dict[str, Any]) -> bool:
    """A SignalR client's ``POST {hub}/negotiate`` (it asks before upgrading, unless told to skip)."""
    path = scope["path"]
    return (
        scope["method"] == "POST"
        and path.endswith("/negotiate")
        and handler_for(path[: -len("/negotiate")]) is not None
    )


async def negotiate(send: Send) -> None:
    """Negotiate version 1: WebSockets only; the client then upgrades with ``?id=<connectionToken>``."""
    token = uuid.uuid4().hex
    body = orjson.dumps(
        {
            "connectionId": token[:16],
            "connectionToken": token,
            "negotiateVersion": 1,
            "availableTransports": [{"transport": "WebSockets", "transferFormats": ["Text", "Binary"]}],
        }
    )
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if bytes(key).lower() == name:
            return bytes(value).decode("latin-1")
    return None


async def serve(scope: dict[str, Any], receive: Receive, send: Send, keep: Callable[[str, Any], None]) -> None:
    """Serve one WebSocket scope; ``keep(mock_id, record)`` stores it for ``/_mock/*``."""
    if (await receive())["type"] != "websocket.connect":
        return
    query_string = bytes(scope["query_string"]).decode("latin-1")
    query = parse_qs(query_string)
    mock_id = _header(scope, b"x-mock-id") or (query.get("mock_id") or [uuid.uuid4().hex])[-1]
    record = Recorded(
        {
            "method": "GET",
            "path": bytes(scope["raw_path"]).decode("latin-1"),
            "query": query_string,
            "http_version": scope["http_version"],
            "headers": [[bytes(k).decode("latin-1"), bytes(v).decode("latin-1")] for k, v in scope["headers"]],
            "websocket": True,
        }
    )
    keep(mock_id, record)
    handler = handler_for(scope["path"])
    if handler is None:
        record.close = {"by": "server", "code": 403, "reason": "no route"}
        await send({"type": "websocket.close", "code": 1008, "reason": f"no WebSocket route for {scope['path']}"})
        return
    accept: Message = {"type": "websocket.accept", "headers": [(b"x-mock-id", mock_id.encode("latin-1"))]}
    protocols = scope.get("subprotocols") or []
    if protocols:
        accept["subprotocol"] = protocols[0]
    await send(accept)
    conn = Connection(receive, send, record, query)
    pump = asyncio.create_task(conn.pump())
    try:
        await handler(conn, scope)
    except Closed:
        pass
    finally:
        pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pump


def _loads(frame: Frame) -> Any:
    try:
        return orjson.loads(frame)
    except orjson.JSONDecodeError:
        return None


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


def _object(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty one (a client's odd field is not a crash)."""
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


# -- OpenAI Realtime ------------------------------------------------------------------------

_REALTIME_QUIET = {
    "input_audio_buffer.append",
    "input_audio_buffer.clear",
    "conversation.item.delete",
    "conversation.item.truncate",
    "conversation.item.retrieve",
    "output_audio_buffer.clear",
}


@dataclass
class _Turns:
    """Realtime responses that take turns, a piece each (the ``interleave`` knob), in the
    order they were asked for: once two have joined, the first one's turn, then the next."""

    order: list[str] = field(default_factory=list)
    paired: asyncio.Event = field(default_factory=asyncio.Event)
    moved: asyncio.Condition = field(default_factory=asyncio.Condition)

    def join(self, response_id: str) -> None:
        """Called as the client's ``response.create`` is handled: the order is the client's."""
        self.order.append(response_id)
        if len(self.order) >= 2:
            self.paired.set()

    async def take(self, response_id: str) -> None:
        """Wait for the response's turn (nothing to wait for when it never joined)."""
        if response_id not in self.order:
            return
        await self.paired.wait()
        async with self.moved:
            await self.moved.wait_for(lambda: self.order[0] == response_id)

    async def give(self, response_id: str, leave: bool = False) -> None:
        """The response's turn is over: the next one's (``leave``: it is done)."""
        if response_id not in self.order:
            return
        async with self.moved:
            self.order.remove(response_id)
            if not leave:
                self.order.append(response_id)
            elif not self.order:
                self.paired.clear()
            self.moved.notify_all()


@dataclass
class _Realtime:
    """A Realtime session: its names (GA or beta), settings, conversation and live responses."""

    conn: Connection
    beta: bool
    model: str
    modalities: list[str] = field(default_factory=lambda: ["text"])
    instructions: str = ""
    last_user_text: str = ""
    active: asyncio.Task[None] | None = None  # the default response in progress
    active_id: str | None = None
    beside: set[asyncio.Task[None]] = field(default_factory=set)  # out-of-band responses in progress
    cancels: dict[str, asyncio.Event] = field(default_factory=dict)  # each response in progress: its cancel
    turns: _Turns = field(default_factory=_Turns)
    id: str = field(default_factory=lambda: _id("sess"))

    def name(self, ga: str, beta: str) -> str:
        return beta if self.beta else ga

    async def emit(self, kind: str, **fields: Any) -> None:
        await self.conn.send_json({"type": kind, "event_id": _id("event"), **fields})

    def session(self) -> dict[str, Any]:
        common = {"id": self.id, "model": self.model, "instructions": self.instructions, "tools": []}
        if self.beta:
            return {"object": "realtime.session", "modalities": self.modalities, **common}
        return {"type": "realtime", "object": "realtime.session", "output_modalities": self.modalities, **common}

    async def error(self, message: str, event_id: str | None, code: str = "invalid_value") -> None:
        error = {"type": "invalid_request_error", "code": code, "message": message, "param": None}
        await self.emit("error", error={**error, "event_id": event_id})

    async def handle(self, event: Any) -> None:
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            await self.error("The event is not a JSON object with a type.", None, "invalid_json")
            return
        kind, event_id = event["type"], event.get("event_id")
        if kind == "session.update":
            self.configure(_object(event.get("session")))
            await self.emit("session.updated", session=self.session())
        elif kind == "conversation.item.create":
            await self.add_item(_object(event.get("item")), event.get("previous_item_id"))
        elif kind == "response.create":
            options = _object(event.get("response"))
            out_of_band = options.get("conversation") == "none"
            if not out_of_band and self.active is not None and not self.active.done():
                await self.error(
                    "Conversation already has an active response", event_id, "conversation_already_has_active_response"
                )
                return
            self.start(options, out_of_band)
        elif kind == "response.cancel":
            wanted = event.get("response_id") or self.active_id
            cancel = self.cancels.get(wanted) if isinstance(wanted, str) else None
            if cancel is None:
                await self.error(
                    "Cancellation failed: no active response found", event_id, "response_cancel_not_active"
                )
            else:
                cancel.set()
        elif kind == "input_audio_buffer.commit":
            await self.emit("input_audio_buffer.committed", previous_item_id=None, item_id=_id("item"))
        elif kind not in _REALTIME_QUIET:
            await self.error(f"Invalid value: '{kind}'. Supported values are: session.update, ...", event_id)

    def configure(self, session: dict[str, Any]) -> None:
        wanted = session.get("output_modalities") or session.get("modalities")
        if isinstance(wanted, list):
            self.modalities = [str(m) for m in wanted]
        if isinstance(session.get("instructions"), str):
            self.instructions = session["instructions"]

    async def add_item(self, item: dict[str, Any], previous: Any) -> None:
        item = {"id": item.get("id") or _id("item"), "object": "realtime.item", "status": "completed", **item}
        texts = [part.get("text") for part in _list(item.get("content")) if isinstance(part, dict)]
        if item.get("role") == "user" and any(isinstance(t, str) for t in texts):
            self.last_user_text = " ".join(t for t in texts if isinstance(t, str))
        if self.beta:
            await self.emit("conversation.item.created", previous_item_id=previous, item=item)
        else:
            await self.emit("conversation.item.added", previous_item_id=previous, item=item)
            await self.emit("conversation.item.done", previous_item_id=previous, item=item)

    def start(self, options: dict[str, Any], out_of_band: bool) -> None:
        """A response, in a task of its own; an out-of-band one's prompt is its own input."""
        response_id = _id("resp")
        prompt = (_input_text(options.get("input")) if out_of_band else self.last_user_text) or str(
            options.get("instructions") or ""
        )
        plan = Plan.parse(prompt, self.conn.query)
        if plan.interleave:
            self.turns.join(response_id)
        self.cancels[response_id] = asyncio.Event()
        task = asyncio.create_task(self.respond(options, response_id, prompt, plan))
        if out_of_band:
            self.beside.add(task)
            task.add_done_callback(self.beside.discard)
        else:
            self.active, self.active_id = task, response_id

    async def respond(self, options: dict[str, Any], response_id: str, prompt: str, plan: Plan) -> None:
        """Stream one response; ``response.cancel`` ends it as ``cancelled``."""
        try:
            with contextlib.suppress(Closed):
                await self._respond(options, response_id, prompt, plan)
        finally:
            self.cancels.pop(response_id, None)

    async def _respond(self, options: dict[str, Any], response_id: str, prompt: str, plan: Plan) -> None:
        modalities = options.get("output_modalities") or options.get("modalities") or self.modalities
        audio = "audio" in modalities
        cancelled = self.cancels[response_id]
        response: dict[str, Any] = {"object": "realtime.response", "id": response_id, "status": "in_progress"}
        response |= {"status_details": None, "output": [], "conversation_id": _id("conv"), "usage": None}
        response[self.name("output_modalities", "modalities")] = modalities
        await self.emit("response.created", response=response)
        at = {"response_id": response_id, "output_index": 0}
        if plan.tool is not None:
            item, said = await self._function_call(plan, plan.tool, at, cancelled)
        else:
            item, said = await self._message(plan, audio, at, cancelled)
        await self.emit("response.output_item.done", **at, item=item)
        status = "completed"
        details: dict[str, Any] | None = None
        if cancelled.is_set():
            status, details = "cancelled", {"type": "cancelled", "reason": "client_cancelled"}
        elif plan.fails:
            error = {"type": "server_error", "code": "mock_failure", "message": "The mock failed on purpose."}
            status, details = "failed", {"type": "failed", "error": error}
        usage = self.usage(prompt, said, audio)
        response |= {"status": status, "status_details": details, "output": [item], "usage": usage}
        await self.emit("response.done", response=response)
        await self.turns.give(response_id, leave=True)

    async def _message(
        self, plan: Plan, audio: bool, at: dict[str, Any], cancelled: asyncio.Event
    ) -> tuple[dict[str, Any], str]:
        """An assistant message item: text deltas, or transcript and audio deltas; it and its
        text. Taking turns (``interleave``), a piece is a turn, and so is the end (its done
        events here, up to the response's ``response.done``)."""
        item: dict[str, Any] = {
            "id": _id("item"),
            "object": "realtime.item",
            "type": "message",
            "status": "in_progress",
        }
        item |= {"role": "assistant", "content": []}
        await self.emit("response.output_item.added", **at, item=item)
        part_at = {**at, "item_id": item["id"], "content_index": 0}
        kind, key = ("audio", "transcript") if audio else ("text", "text")
        await self.emit("response.content_part.added", **part_at, part={"type": kind, key: ""})
        text_delta = self.name("response.output_text", "response.text")
        transcript = self.name("response.output_audio_transcript", "response.audio_transcript")
        audio_name = self.name("response.output_audio", "response.audio")
        said = ""
        response_id = at["response_id"]
        async for index, piece in plan.paced(self.conn):
            await self.turns.take(response_id)
            if cancelled.is_set():
                break
            said += piece
            await self.emit(f"{transcript if audio else text_delta}.delta", **part_at, delta=piece)
            if audio and index < 2:
                await self.emit(f"{audio_name}.delta", **part_at, delta=base64.b64encode(b"\x00\x01" * 8).decode())
            await self.turns.give(response_id)
        await self.turns.take(response_id)
        if audio:
            await self.emit(f"{audio_name}.done", **part_at)
            await self.emit(f"{transcript}.done", **part_at, transcript=said)
        else:
            await self.emit(f"{text_delta}.done", **part_at, text=said)
        await self.emit("response.content_part.done", **part_at, part={"type": kind, key: said})
        finished = not cancelled.is_set() and not plan.fails
        content_type = self.name("output_audio" if audio else "output_text", kind)
        item |= {"status": "completed" if finished else "incomplete", "content": [{"type": content_type, key: said}]}
        return item, said

    async def _function_call(
        self, plan: Plan, name: str, at: dict[str, Any], cancelled: asyncio.Event
    ) -> tuple[dict[str, Any], str]:
        """A function call item whose arguments (``{"text": <the answer>}``) stream in pieces."""
        item: dict[str, Any] = {"id": _id("item"), "object": "realtime.item", "type": "function_call"}
        item |= {"status": "in_progress", "name": name, "call_id": _id("call"), "arguments": ""}
        await self.emit("response.output_item.added", **at, item=item)
        call_at = {**at, "item_id": item["id"], "call_id": item["call_id"]}
        arguments = orjson.dumps({"text": plan.text}).decode()
        pieces = Plan(arguments, plan.delay, plan.fail_after, plan.close, plan.close_after)
        said = ""
        async for _, piece in pieces.paced(self.conn):
            if cancelled.is_set():
                break
            said += piece
            await self.emit("response.function_call_arguments.delta", **call_at, delta=piece)
        await self.emit("response.function_call_arguments.done", **call_at, name=name, arguments=said)
        finished = not cancelled.is_set() and not pieces.fails
        return item | {"status": "completed" if finished else "incomplete", "arguments": said}, said

    @staticmethod
    def usage(prompt: str, said: str, audio: bool) -> dict[str, Any]:
        """Token counts derived from the texts, so a test can predict them: words in, pieces out."""
        input_tokens = len(prompt.split()) + 1
        output_tokens = -(-len(said) // PIECE)
        audio_tokens = output_tokens * 2 if audio else 0
        cached = {"text_tokens": 0, "audio_tokens": 0, "image_tokens": 0}
        details = {"text_tokens": input_tokens, "audio_tokens": 0, "image_tokens": 0, "cached_tokens": 0}
        return {
            "total_tokens": input_tokens + output_tokens + audio_tokens,
            "input_tokens": input_tokens,
            "output_tokens": output_tokens + audio_tokens,
            "input_token_details": {**details, "cached_tokens_details": cached},
            "output_token_details": {"text_tokens": output_tokens, "audio_tokens": audio_tokens},
        }


async def serve_realtime(conn: Connection, scope: dict[str, Any]) -> None:
    beta = (_header(scope, b"openai-beta") or "").strip().lower() == "realtime=v1"
    model = (conn.query.get("model") or ["gpt-realtime"])[-1]
    session = _Realtime(conn, beta, model)
    await session.emit("session.created", session=session.session())
    try:
        while True:
            await session.handle(_loads(await conn.next()))
    finally:
        for task in [session.active, *session.beside]:
            if task is not None:
                task.cancel()


def _input_text(items: Any) -> str:
    """The text of the messages in a ``response.create``'s ``input`` (an out-of-band prompt)."""
    parts = [part for item in _list(items) for part in _list(_object(item).get("content"))]
    return " ".join(part["text"] for part in parts if isinstance(part, dict) and isinstance(part.get("text"), str))


# -- Gemini Live ----------------------------------------------------------------------------


def _pick(obj: dict[str, Any], camel: str, snake: str) -> Any:
    return obj.get(camel, obj.get(snake))


def _turn_text(content: dict[str, Any]) -> str:
    """The text parts of a ``clientContent``'s turns."""
    parts = [part for turn in _list(content.get("turns")) for part in _list(_object(turn).get("parts"))]
    return " ".join(part["text"] for part in parts if isinstance(part, dict) and isinstance(part.get("text"), str))


async def serve_gemini_live(conn: Connection, scope: dict[str, Any]) -> None:
    audio = await _gemini_setup(conn)
    pending: list[str] = []
    waiting: tuple[Plan, str] | None = None  # a turn that called a tool: answered after the toolResponse
    while True:
        message = _loads(await conn.next())
        if not isinstance(message, dict):
            await conn.close(1007, "Invalid JSON payload received.")
        content = _pick(message, "clientContent", "client_content")
        realtime = _pick(message, "realtimeInput", "realtime_input")
        if _pick(message, "toolResponse", "tool_response") is not None:
            if waiting is not None:
                (plan, prompt), waiting = waiting, None
                await _gemini_turn(conn, plan, prompt, audio)
            continue
        if isinstance(content, dict):
            pending.append(_turn_text(content))
            if not _pick(content, "turnComplete", "turn_complete"):
                continue
        elif isinstance(realtime, dict) and isinstance(realtime.get("text"), str):
            pending.append(realtime["text"])
        elif isinstance(realtime, dict):
            continue  # audio / video chunks: no voice activity detection here
        else:
            await conn.close(1007, "Invalid request: unknown message.")
        prompt, pending = " ".join(pending), []
        plan = Plan.parse(prompt, conn.query)
        if plan.tool is None:
            await _gemini_turn(conn, plan, prompt, audio)
        else:
            call = {"id": _id("call"), "name": plan.tool, "args": {"text": plan.text}}
            await conn.send_json({"toolCall": {"functionCalls": [call]}})
            waiting = (dataclasses.replace(plan, tool=None), prompt)


async def _gemini_setup(conn: Connection) -> bool:
    """Read the ``setup`` (or close the socket as the service does); True if it asks for audio."""
    first = _loads(await conn.next())
    if not isinstance(first, dict):
        await conn.close(1007, "Invalid JSON payload received.")
    setup = first.get("setup")
    if not isinstance(setup, dict):
        await conn.close(1007, "Invalid request: the first message must be setup.")
    model = str(setup.get("model") or "").removeprefix("models/")
    if "blocked-model" in model:  # how the service refuses a model: a policy close, no JSON error
        reason = f"models/{model} is not found for API version v1beta, or is not supported for bidiGenerateContent."
        await conn.close(1008, reason)
    config = _pick(setup, "generationConfig", "generation_config") or {}
    modalities = _pick(config, "responseModalities", "response_modalities") or ["TEXT"]
    await conn.send_json({"setupComplete": {}})
    return "AUDIO" in [str(m).upper() for m in modalities]


async def _gemini_turn(conn: Connection, plan: Plan, prompt: str, audio: bool) -> None:
    said = ""
    async for _, piece in plan.paced(conn):
        said += piece
        if audio:
            blob = {"mimeType": "audio/pcm;rate=24000", "data": base64.b64encode(b"\x00\x01" * 8).decode()}
            await conn.send_json({"serverContent": {"modelTurn": {"parts": [{"inlineData": blob}]}}})
            await conn.send_json({"serverContent": {"outputTranscription": {"text": piece}}})
        else:
            await conn.send_json({"serverContent": {"modelTurn": {"role": "model", "parts": [{"text": piece}]}}})
    if plan.fails:
        await conn.close(1011, "Internal error encountered.")
    await conn.send_json({"serverContent": {"generationComplete": True}})
    prompt_tokens, response_tokens = len(prompt.split()) + 1, -(-len(said) // PIECE)
    usage = {
        "promptTokenCount": prompt_tokens,
        "responseTokenCount": response_tokens,
        "totalTokenCount": prompt_tokens + response_tokens,
    }
    await conn.send_json({"serverContent": {"turnComplete": True}, "usageMetadata": usage})


# -- consumer Copilot (/c/api/chat) --------------------------------------------------------


async def serve_copilot(conn: Connection, scope: dict[str, Any]) -> None:
    sequence = iter(range(1_000_000))

    async def event(name: str, **fields: Any) -> None:
        await conn.send(orjson.dumps({"event": name, **fields, "id": str(next(sequence))}).decode())

    await event("connected", requestId=uuid.uuid4().hex)
    while True:
        message = _loads(await conn.next())
        if not isinstance(message, dict):
            continue
        kind = message.get("event")
        if kind == "ping":
            await event("pong")
        elif kind == "send":
            parts = _list(message.get("content"))
            prompt = " ".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
            conversation = message.get("conversationId") or uuid.uuid4().hex[:21]
            await _copilot_turn(conn, event, Plan.parse(prompt, conn.query), str(conversation))


async def _copilot_turn(conn: Connection, event: Callable[..., Awaitable[None]], plan: Plan, conversation: str) -> None:
    stamp = "2026-01-01T00:00:00.000Z"
    await event("received", conversationId=conversation, messageId=uuid.uuid4().hex[:21], createdAt=stamp)
    message_id, part_id = uuid.uuid4().hex[:21], "0"
    await event("startMessage", conversationId=conversation, messageId=message_id, createdAt=stamp)
    async for _, piece in plan.paced(conn):
        await event("appendText", messageId=message_id, partId=part_id, text=piece)
    if plan.fails:
        await event("error", messageId=message_id, code="mockFailure", message="The mock failed on purpose.")
        return
    await event("partCompleted", messageId=message_id, partId=part_id)
    await event("done", messageId=message_id)
    await event("titleUpdate", conversationId=conversation, title="Mock conversation")
    await event("suggestedFollowups", messageId=message_id, suggestions=["Tell me more.", "Anything else?"])


# -- SignalR --------------------------------------------------------------------------------


class _Hub:
    """SignalR framing (JSON or MessagePack, chosen by the handshake) over one connection."""

    def __init__(self, conn: Connection, msgpack_protocol: bool) -> None:
        self.conn, self.msgpack = conn, msgpack_protocol
        self._bytes, self._text = b"", ""

    def push(self, data: bytes | str) -> None:
        """Bytes that came before the reader started (in the handshake's frame)."""
        if isinstance(data, bytes):
            self._bytes = data
        else:
            self._text = data

    async def records(self) -> AsyncIterator[dict[str, Any]]:
        """Client messages as JSON-shaped dicts, however they were framed."""
        frame: Frame = b"" if self.msgpack else ""  # first, what push() left
        while True:
            if self.msgpack:
                buffer = self._bytes + (frame if isinstance(frame, bytes) else frame.encode())
                bodies, self._bytes = _varint_split(buffer)
                for body in bodies:
                    yield _from_msgpack(_unpack(body))
            else:
                text = self._text + (frame if isinstance(frame, str) else frame.decode("utf-8", "replace"))
                *records, self._text = text.split(RS)
                for record in records:
                    if record.strip() and isinstance(parsed := _loads(record), dict):
                        yield parsed
            frame = await self.conn.next()

    def encode(self, message: dict[str, Any]) -> Frame:
        if not self.msgpack:
            return orjson.dumps(message).decode() + RS
        body = msgpack.packb(_to_msgpack(message), use_bin_type=True)
        return _varint(len(body)) + body

    async def send(self, *messages: dict[str, Any]) -> None:
        """The messages in one WebSocket frame (real hubs batch e.g. the last item and the completion)."""
        frames = [self.encode(m) for m in messages]
        await self.conn.send(
            b"".join(f for f in frames if isinstance(f, bytes)) if self.msgpack else "".join(map(str, frames))
        )


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _varint_split(buffer: bytes) -> tuple[list[bytes], bytes]:
    """Complete length-prefixed bodies, and the incomplete rest."""
    bodies, pos = [], 0
    while pos < len(buffer):
        length, shift, at = 0, 0, pos
        while at < len(buffer) and shift <= 28:
            byte = buffer[at]
            length |= (byte & 0x7F) << shift
            at += 1
            shift += 7
            if not byte & 0x80:
                break
        else:
            break
        if at + length > len(buffer):
            break
        bodies.append(buffer[at : at + length])
        pos = at + length
    return bodies, buffer[pos:]


def _unpack(body: bytes) -> Any:
    """One MessagePack body, or None when it is not one (the hub then ignores it)."""
    try:
        return msgpack.unpackb(body, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException):
        return None


def _from_msgpack(array: Any) -> dict[str, Any]:
    """A MessagePack hub message as the JSON protocol's dict (spec §4 layouts)."""
    if not isinstance(array, list) or not array:
        return {}
    kind = array[0]
    if kind in (1, 4) and len(array) >= 5:
        return {"type": kind, "invocationId": array[2], "target": array[3], "arguments": array[4]}
    if kind in (2, 5) and len(array) >= 3:
        return {"type": kind, "invocationId": array[2], **({"item": array[3]} if len(array) > 3 else {})}
    if kind == 7:
        return {"type": 7, "error": array[1] if len(array) > 1 else None}
    return {"type": kind}


def _to_msgpack(message: dict[str, Any]) -> list[Any]:
    kind, headers, invocation = message["type"], message.get("headers", {}), message.get("invocationId")
    if kind == 1:
        return [1, headers, invocation, message["target"], message["arguments"], []]
    if kind == 2:
        return [2, headers, invocation, message["item"]]
    if kind == 3:
        if "error" in message:
            return [3, headers, invocation, 1, message["error"]]
        if "result" in message:
            return [3, headers, invocation, 3, message["result"]]
        return [3, headers, invocation, 2]
    if kind == 7:
        return [7, message.get("error"), bool(message.get("allowReconnect"))]
    return [kind]


async def serve_signalr(conn: Connection, scope: dict[str, Any]) -> None:
    """Handshake, then answer invocations (each in a task, so a cancel can stop a stream)."""
    first = await conn.next()
    text = first.decode("utf-8", "replace") if isinstance(first, bytes) else first
    handshake = _loads(text.split(RS)[0]) if RS in text else None
    if not isinstance(handshake, dict) or handshake.get("version") != 1:
        await conn.close(1002, "the first message must be a SignalR handshake")
    assert isinstance(handshake, dict)
    protocol = handshake.get("protocol")
    if protocol not in ("json", "messagepack"):
        error = orjson.dumps({"error": f"Requested protocol '{protocol}' is not available."}).decode() + RS
        await conn.send(error)
        await conn.close(1000)
    hub = _Hub(conn, protocol == "messagepack")
    rest = text.split(RS, 1)[1]  # records sent in the handshake's frame
    if rest:
        hub.push(rest.encode() if hub.msgpack else rest)
    ack = "{}" + RS
    await conn.send(ack.encode() if hub.msgpack else ack)
    await hub.send({"type": 6})
    chathub = scope["path"] != "/hubs/chat"
    m365 = scope["path"].lower().startswith("/m365copilot/")
    running: dict[str, tuple[asyncio.Task[None], asyncio.Event]] = {}
    try:
        async for message in hub.records():
            kind, invocation = message.get("type"), message.get("invocationId")
            if kind == 6:
                continue
            if kind == 7:
                await conn.close(1000)
            if kind == 5 and isinstance(invocation, str) and invocation in running:
                running[invocation][1].set()
                continue
            if kind not in (1, 4) or not isinstance(invocation, str):
                continue  # non-blocking invocations (ChatHub "Metrics" telemetry) get no answer
            stop = asyncio.Event()
            if chathub:
                work = _chathub_turn(hub, message, m365)
            else:
                work = _generic_call(hub, message, stop)
            running[invocation] = (asyncio.create_task(_quietly(work)), stop)
    finally:
        for task, _ in running.values():
            task.cancel()


async def _quietly(work: Awaitable[None]) -> None:
    with contextlib.suppress(Closed):
        await work


def _prompt_argument(message: dict[str, Any]) -> str | None:
    arguments = message.get("arguments")
    if isinstance(arguments, list) and arguments and isinstance(arguments[0], str):
        return arguments[0]
    return None


async def _generic_call(hub: _Hub, message: dict[str, Any], stop: asyncio.Event) -> None:
    """``Generate`` (stream) yields string pieces; ``Ask`` (invoke) returns the whole answer."""
    invocation, target, prompt = message["invocationId"], message.get("target"), _prompt_argument(message)
    done = {"type": 3, "invocationId": invocation}
    if (target, message["type"]) not in {("Generate", 4), ("Ask", 1)}:
        await hub.send({**done, "error": f"Unknown hub method '{target}'"})
        return
    if prompt is None:
        await hub.send({**done, "error": f"Failed to invoke '{target}': expected one string argument."})
        return
    plan = Plan.parse(prompt, hub.conn.query)
    said = ""
    async for _, piece in plan.paced(hub.conn):
        if stop.is_set():
            await hub.send(done)
            return
        said += piece
        if message["type"] == 4:
            await hub.send({"type": 2, "invocationId": invocation, "item": piece})
    if plan.fails:
        await hub.send({**done, "error": "An unexpected error occurred invoking the mock."})
    else:
        await hub.send(done if message["type"] == 4 else {**done, "result": said})


async def _chathub_turn(hub: _Hub, message: dict[str, Any], m365: bool) -> None:
    """Copilot's ``chat``: cumulative ``update`` invocations, one final item, an empty completion."""
    invocation = message["invocationId"]
    done = {"type": 3, "invocationId": invocation}
    argument = (message.get("arguments") or [None])[0]
    user = argument.get("message") if isinstance(argument, dict) else None
    if message.get("target") != "chat" or not isinstance(user, dict) or not isinstance(user.get("text"), str):
        await hub.send({**done, "error": f"Unknown hub method '{message.get('target')}'"})
        return
    prompt: str = user["text"]
    request_id, bot_id = str(user.get("requestId") or uuid.uuid4()), str(uuid.uuid4())
    plan = Plan.parse(prompt, hub.conn.query)
    throttled = "throttle" in prompt.lower()
    limit = 5 if throttled else 30
    throttling = {"maxNumUserMessagesInConversation": limit, "numUserMessagesInConversation": limit if throttled else 1}

    def update(**fields: Any) -> dict[str, Any]:
        return {"type": 1, "target": "update", "arguments": [{**fields, "requestId": request_id}]}

    def bot(text: str) -> dict[str, Any]:
        card = {"type": "AdaptiveCard", "version": "1.0", "body": [{"type": "TextBlock", "text": text, "wrap": True}]}
        return {
            "text": text,
            "author": "bot",
            "createdAt": "2026-01-01T00:00:00+00:00",
            "messageId": bot_id,
            "offense": "None",
            "adaptiveCards": [card],
            "sourceAttributions": [],
            "contentOrigin": "DeepLeo",
        }

    await hub.send(update(throttling=throttling))
    said = ""
    if not throttled:
        async for index, piece in plan.paced(hub.conn):
            said += piece
            fields: dict[str, Any] = {"messages": [bot(said)]}
            if m365:
                fields["writeAtCursor"] = piece
                if index == 0:
                    fields["cursor"] = {"j": f"$['{bot_id}'].adaptiveCards[0].body[0].text", "p": -1}
            await hub.send(update(**fields))
        if plan.fails:
            await hub.send({**done, "error": "An unexpected error occurred invoking 'chat' on the server."})
            return
        if m365:
            await hub.send(update(messages=[bot(said)], isLastUpdate=True))
    echo = {"text": prompt, "author": "user", "messageId": str(user.get("messageId") or uuid.uuid4())}
    final = {**bot(said), "suggestedResponses": [{"text": "Tell me more.", "author": "user"}]}
    result = (
        {"value": "Throttled", "message": "Request is throttled.", "serviceVersion": "mock"}
        if throttled
        else {"value": "Success", "message": said, "serviceVersion": "mock"}
    )
    item = {
        "messages": [echo] if throttled else [echo, final],
        "firstNewMessageIndex": 1,
        "conversationId": str(argument.get("conversationId") or "mock-conversation"),
        "requestId": request_id,
        "throttling": throttling,
        "result": result,
    }
    await hub.send({"type": 2, "invocationId": invocation, "item": item}, done)
