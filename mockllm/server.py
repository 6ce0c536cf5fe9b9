"""ASGI app and hypercorn runner of the mock LLM upstream.

Inference routes (any path prefix, e.g. ``/v1``, unless shown whole), each
answered in its API's format and shaped by the
:class:`~mockllm.scenario.Scenario` in the query / ``x-mock``:

* ``POST /v1/llm/stream``, and any POST with ``Content-Type:
  application/llm-request+json`` whatever the path: llm-stream SSE.
* ``POST …/chat/completions``: OpenAI Chat Completions.
* ``POST …/completions`` (not ``…/chat/completions``): OpenAI legacy Completions.
* ``POST …/responses`` (not under ``/lmsp/``): OpenAI Responses.
* ``POST …/v1/messages``: Anthropic Messages.
* ``POST …/models/{model}:streamGenerateContent`` (SSE with ``?alt=sse``, a
  streamed JSON array without) and ``…:generateContent``: Google Gemini.
* ``POST …/api/chat`` and ``…/api/generate``: Ollama's native API, NDJSON
  (:mod:`mockllm.ollama`).
* ``POST …/model/{modelId}/converse-stream`` (and ``/converse``,
  ``/invoke-with-response-stream``, ``/invoke``): AWS Bedrock, and
  ``…/publishers/anthropic/models/{model}:streamRawPredict`` / ``:rawPredict``:
  Anthropic on Vertex (:mod:`mockllm.bedrock`).
* ``POST /lmsp/v1/responses``: LMSP 1.0; ``GET /lmsp/v1/responses/{id}``
  returns a response stored with ``store: true`` (the last
  :data:`MAX_RECORDS`); ``GET /lmsp/v1/tasks/{task_id}/events`` streams a
  task's events, replaying those after ``?after=N`` or ``Last-Event-ID``.

Connect calls of the protobuf methods in :mod:`mockllm.rpc` (Cursor, Windsurf, an echo
service) are answered by :mod:`mockllm.connect`; WebSocket upgrades (OpenAI Realtime,
Gemini Live, Copilot, SignalR hubs) and SignalR's negotiate by :mod:`mockllm.websocket`.

The JSON body's ``stream: true`` picks streaming where the API has that
switch (Gemini decides by path instead). Control routes:

* ``GET /_mock/sent/{id}``: what the server wrote for request ``id``.
* ``GET /_mock/requests/{id}``: the request the server received.
* ``GET /_mock/health``: ``200 ok``.

``id`` is the request's ``x-mock-id`` header, or a generated one that is
returned in the ``x-mock-id`` response header.

Truncation (``truncate_after``): the app returns without sending the final
``more_body=False`` message; hypercorn treats that exactly like an exception
(``send(None)`` then ``StreamClosed`` for an unfinished response) without
logging a traceback. What that shows on the wire, verified with raw clients
against hypercorn 0.18:

* HTTP/1.1 (plain or TLS): the connection is closed right after the last
  chunk, without the ``0\\r\\n\\r\\n`` terminator (TLS: close_notify, then FIN).
  Clients report an incomplete chunked body.
* HTTP/2: stock hypercorn 0.18 sends *nothing*: no RST_STREAM, no END_STREAM,
  no GOAWAY. The stream just hangs until the idle connection hits
  ``keep_alive_timeout`` and the socket is closed (never, if other streams
  keep the connection busy). :class:`_AbortingH2Protocol` fixes that: after
  the already written data is flushed, it sends ``RST_STREAM(INTERNAL_ERROR)``
  for the stream, which is what real proxies/upstreams do when a response
  dies mid-body. :func:`serve` installs it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import hashlib
import json
import re
import socket
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qs

import h2.errors
import h2.exceptions
import hypercorn.protocol
import orjson
from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config
from hypercorn.protocol.events import EndBody, EndData, Event, StreamClosed
from hypercorn.protocol.h2 import H2Protocol

from . import bedrock, connect, ollama, websocket
from .certs import CertPaths
from .scenario import Scenario, ScenarioError
from .streams import (
    DIALECTS,
    BodyPlan,
    Dialect,
    lmsp_numbered_events,
    lmsp_response,
    lmsp_task_request,
    plan_body,
    problem,
    raw_chunks,
    stamp,
)

Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

LLM_STREAM_PATH = "/v1/llm/stream"
LLM_REQUEST_TYPE = "application/llm-request+json"
MAX_RECORDS = 1000
"""How many exchanges, stored LMSP responses and LMSP tasks the mock remembers (each)."""
_GEMINI_PATH = re.compile(r"/models/([^/:]+):(streamGenerateContent|generateContent)$")
_LMSP_RESPONSE_PATH = re.compile(r"/lmsp/v1/responses/([^/]+)$")
_LMSP_TASK_EVENTS_PATH = re.compile(r"/lmsp/v1/tasks/([^/]+)/events$")
# How long an aborting h2 stream waits for its buffered data to reach the
# socket before resetting anyway (a client that stopped reading must not pin
# the task forever).
_H2_DRAIN_TIMEOUT = 5.0


# What an exchange keeps of a very long body for /_mock/* (its size and hash cover all).
KEEP_BODY = 16 * 1024 * 1024
KEEP_CHUNKS = 100_000


@dataclass
class Exchange:
    """One request and everything written in reply, for ``/_mock/*`` inspection."""

    request: dict[str, Any]
    chunks: list[tuple[float, int]] = field(default_factory=list)
    body: bytearray = field(default_factory=bytearray)
    completed: bool = False
    """The body was ended cleanly."""
    aborted: bool = False
    """The server deliberately aborted the transport (``truncate_after``)."""
    disconnected: bool = False
    """The client went away before the body was complete."""

    size: int = 0
    """Bytes written in all (``body`` keeps the first ``KEEP_BODY`` of them)."""
    sha256: Any = field(default_factory=hashlib.sha256)
    """Of every byte written, for comparing with what a client received."""

    def wrote(self, data: bytes) -> None:
        """Record a body write; called right after ``await send()`` returned."""
        if len(self.chunks) < KEEP_CHUNKS:
            self.chunks.append((time.time(), len(data)))
        if len(self.body) < KEEP_BODY:
            self.body += data[: KEEP_BODY - len(self.body)]
        self.size += len(data)
        self.sha256.update(data)

    def sent(self) -> dict[str, Any]:
        return {
            "chunks": self.chunks,
            "size": self.size,
            "sha256": self.sha256.hexdigest(),
            "body_b64": base64.b64encode(self.body).decode(),
            "first_write": self.chunks[0][0] if self.chunks else None,
            "last_write": self.chunks[-1][0] if self.chunks else None,
            "completed": self.completed,
            "aborted": self.aborted,
            "disconnected": self.disconnected,
        }


class Recent[V]:
    """The last ``limit`` values added, by key, so a long benchmark can't grow memory."""

    def __init__(self, limit: int = MAX_RECORDS) -> None:
        self._limit = limit
        self._items: OrderedDict[str, V] = OrderedDict()

    def add(self, key: str, value: V) -> None:
        self._items.pop(key, None)
        self._items[key] = value
        while len(self._items) > self._limit:
            self._items.popitem(last=False)

    def get(self, key: str) -> V | None:
        return self._items.get(key)


@dataclass(frozen=True)
class Route:
    """Which dialect answers a request, and how."""

    dialect: Dialect
    kind: Literal["inference", "lmsp_response", "lmsp_task_events"] = "inference"
    stream: bool | None = None
    """Inference: whether to stream; None: the request body's ``stream: true`` decides."""
    target: str | None = None
    """The model a Gemini URL names, the stored response id or the task id."""


def route(method: str, path: str, query: str, content_type: str) -> Route | None:
    """The route of a request, by method and path (and llm-stream's content type)."""
    if method == "GET":
        if match := _LMSP_RESPONSE_PATH.search(path):
            return Route(DIALECTS["lmsp"], "lmsp_response", target=match[1])
        if match := _LMSP_TASK_EVENTS_PATH.search(path):
            return Route(DIALECTS["lmsp"], "lmsp_task_events", target=match[1])
        return None
    if method != "POST":
        return None
    if path == LLM_STREAM_PATH or content_type == LLM_REQUEST_TYPE:
        return Route(DIALECTS["llm-stream"], stream=True)
    if path.endswith("/chat/completions"):
        return Route(DIALECTS["openai-chat"])
    if path.endswith("/completions"):
        return Route(DIALECTS["openai-completions"])
    if path.endswith("/lmsp/v1/responses"):
        return Route(DIALECTS["lmsp"])
    if path.endswith("/responses") and "/lmsp/" not in path:
        return Route(DIALECTS["openai-responses"])
    if path.endswith("/v1/messages"):
        return Route(DIALECTS["anthropic"])
    if ollama_dialect := ollama.dialect_for(path):
        return Route(ollama_dialect)
    if match := _GEMINI_PATH.search(path):
        if match[2] == "generateContent":
            return Route(DIALECTS["gemini"], stream=False, target=match[1])
        sse = parse_qs(query).get("alt") == ["sse"]
        return Route(DIALECTS["gemini" if sse else "gemini-json"], stream=True, target=match[1])
    if aws := bedrock.match(path):  # Bedrock Runtime, and Anthropic on Vertex
        return Route(aws[0], stream=aws[1], target=aws[2])
    return None


@dataclass(frozen=True)
class Reply:
    """A response before transport shaping: ``status >= 400`` is sent whole, anything else paced."""

    status: int
    content_type: str
    items: list[bytes]

    @classmethod
    def problem(cls, status: int, code: str, detail: str) -> Reply:
        """An LMSP problem document."""
        return cls(status, "application/problem+json", [orjson.dumps(problem(status, code, detail))])


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def _problem(code: str, message: str) -> bytes:
    return orjson.dumps({"error": {"code": code, "message": message}})


async def _send_json(
    send: Send,
    status: int,
    body: bytes,
    headers: tuple[tuple[bytes, bytes], ...] = (),
    content_type: str = "application/json",
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type.encode()),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None if the client disconnected first."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body += message.get("body", b"")
        if not message.get("more_body", False):
            return bytes(body)


def _load_request(body: bytes) -> dict[str, Any]:
    """The JSON request object, read as the Python servers that host models read it
    (``json.loads``: ``NaN``, ``Infinity``, a byte order mark are accepted); anything
    else (invalid JSON, a list) becomes ``{}``."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        try:
            parsed = json.loads(body)
        except (ValueError, RecursionError):
            return {}
    return parsed if isinstance(parsed, dict) else {}


async def _wait_disconnect(receive: Receive, disconnected: asyncio.Event) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    disconnected.set()


async def _disconnected_within(disconnected: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` unless the client disconnects first; True if it did."""
    try:
        async with asyncio.timeout(seconds):
            await disconnected.wait()
    except TimeoutError:
        return False
    return True


class MockLLM:
    """The ASGI application. State (the exchange log) lives on the instance."""

    def __init__(self, max_records: int = MAX_RECORDS) -> None:
        self.exchanges: Recent[Exchange] = Recent(max_records)
        self.lmsp_responses: Recent[dict[str, Any]] = Recent(max_records)
        """LMSP responses created with ``store: true``, by id."""
        self.lmsp_tasks: Recent[list[tuple[int, bytes]]] = Recent(max_records)
        """Each LMSP task's (event id, framed event) list, made on first access."""

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            if scope["path"].startswith("/_mock/"):
                await self._control(scope, send)
            elif websocket.is_negotiate(scope):  # a SignalR hub's POST …/negotiate
                await websocket.negotiate(send)
            else:
                await self._exchange(scope, receive, send)
        elif scope["type"] == "websocket":  # mockllm.websocket: Realtime, Gemini Live, Copilot, SignalR
            await websocket.serve(scope, receive, send, self.exchanges.add)

    @staticmethod
    async def _lifespan(receive: Receive, send: Send) -> None:
        """Acknowledge lifespan so hypercorn doesn't log a support warning."""
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _control(self, scope: dict[str, Any], send: Send) -> None:
        path = scope["path"]
        if scope["method"] == "GET" and path == "/_mock/health":
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"text/plain"), (b"content-length", b"2")],
                }
            )
            await send({"type": "http.response.body", "body": b"ok"})
            return
        kind, _, mock_id = path.removeprefix("/_mock/").partition("/")
        exchange = self.exchanges.get(mock_id)
        if scope["method"] == "GET" and kind in {"sent", "requests"} and exchange is not None:
            await _send_json(send, 200, orjson.dumps(exchange.sent() if kind == "sent" else exchange.request))
        else:
            await _send_json(send, 404, _problem("not_found", f"no {scope['method']} {path}"))

    async def _exchange(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if (rpc_method := connect.route(scope)) is not None:  # read as it arrives: bidi streams
            await connect.serve(rpc_method, scope, receive, send, self._keep)
            return
        body = await _read_body(receive)
        if body is None:
            return
        mock_id = _header(scope, b"x-mock-id") or uuid.uuid4().hex
        exchange = Exchange(
            request={
                "method": scope["method"],
                "path": bytes(scope["raw_path"]).decode("latin-1"),
                "query": bytes(scope["query_string"]).decode("latin-1"),
                "http_version": scope["http_version"],
                "headers": [[bytes(k).decode("latin-1"), bytes(v).decode("latin-1")] for k, v in scope["headers"]],
                "body_b64": base64.b64encode(body).decode(),
            }
        )
        self.exchanges.add(mock_id, exchange)
        id_header = (b"x-mock-id", mock_id.encode("latin-1"))

        async def recording_send(message: Message) -> None:
            await send(message)
            if message["type"] == "http.response.body":
                if message.get("body"):
                    exchange.wrote(message["body"])
                if not message.get("more_body", False):
                    exchange.completed = True

        content_type = (_header(scope, b"content-type") or "").split(";")[0].strip().lower()
        query = bytes(scope["query_string"]).decode("latin-1")
        found = route(scope["method"], scope["path"], query, content_type)
        if found is None:
            message = f"no route for {scope['method']} {scope['path']}"
            await _send_json(recording_send, 404, _problem("not_found", message), (id_header,))
            return
        try:
            scenario = Scenario.parse(query, _header(scope, b"x-mock"))
        except ScenarioError as exc:
            await _send_json(recording_send, 400, _problem("mock_bad_scenario", str(exc)), (id_header,))
            return
        reply = self._reply(found, scenario, body, query, _header(scope, b"last-event-id"))
        if reply.status >= 400:
            await _send_json(recording_send, reply.status, b"".join(reply.items), (id_header,), reply.content_type)
            return
        headers = [(b"content-type", reply.content_type.encode())]
        if reply.content_type == "text/event-stream":
            headers.append((b"cache-control", b"no-cache"))
        headers.append(id_header)
        if scenario.coding is not None:
            headers.append((b"content-encoding", scenario.coding.encode()))
        event_stream = reply.content_type == "text/event-stream"
        if scenario.bomb:  # compressing the bomb takes a while: not on the event loop
            plan = await asyncio.to_thread(plan_body, reply.items, scenario, event_stream)
        else:
            plan = plan_body(reply.items, scenario, event_stream)
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        await self._stream(plan, scenario, receive, recording_send, exchange)

    def _keep(self, mock_id: str, request: dict[str, Any]) -> Exchange:
        self.exchanges.add(mock_id, exchange := Exchange(request))
        return exchange

    def _reply(self, found: Route, scenario: Scenario, body: bytes, query: str, last_event_id: str | None) -> Reply:
        """What to answer, before pacing, truncation and gzip."""
        dialect = found.dialect
        if scenario.status >= 400:
            return Reply(scenario.status, dialect.error_type, [dialect.error_body(scenario, scenario.status)])
        if found.kind == "lmsp_response":
            stored = self.lmsp_responses.get(found.target or "")
            if stored is None:
                return Reply.problem(404, "response_not_found", f"no stored response {found.target}")
            return Reply(200, "application/json", [orjson.dumps(stored)])
        if found.kind == "lmsp_task_events":
            after = parse_qs(query).get("after", [last_event_id])[-1]  # ``after`` wins over Last-Event-ID
            return self._task_events(found.target or "", scenario, after)

        request = _load_request(body)
        if found.target is not None:  # the model a Gemini URL names is the request's model
            scenario = dataclasses.replace(scenario, model=scenario.model or found.target)
        stream = request.get("stream", dialect.stream_default) is True if found.stream is None else found.stream
        if not stream and scenario.error is not None:  # a failure without a stream to report it in
            return Reply(500, dialect.error_type, [dialect.error_body(scenario, 500)])
        if dialect is DIALECTS["lmsp"] and request.get("store") is True:
            response = lmsp_response(request, scenario)
            self.lmsp_responses.add(response["id"], response)
        if scenario.raw is not None:
            items = raw_chunks(scenario)
        elif stream:
            items = dialect.stream(request, scenario)
        else:
            assert dialect.body is not None
            items = [orjson.dumps(dialect.body(request, scenario))]
        return Reply(200, dialect.stream_type if stream else "application/json", items)

    def _task_events(self, task_id: str, scenario: Scenario, after: str | None) -> Reply:
        """A task's events after event id ``after`` (LMSP 6.4), or ``410`` if some of them have expired.

        The event list is made from the first access's scenario and kept, so
        a client that resumes sees the same events; ``expired`` and
        ``retain`` are read per request, so one task can be resumed and then
        found expired.
        """
        if after is not None and not after.strip().isdigit():
            return Reply.problem(400, "invalid_request", "after / Last-Event-ID must be a non-negative integer")
        last_seen = int(after) if after is not None else 0
        events = self.lmsp_tasks.get(task_id)
        if events is None:
            events = lmsp_numbered_events(lmsp_task_request(task_id), scenario)
            self.lmsp_tasks.add(task_id, events)
        wanted = [(event_id, framed) for event_id, framed in events if event_id > last_seen]
        kept = len(events) if scenario.retain is None else scenario.retain
        if scenario.expired or len(wanted) > kept:
            detail = f"events of task {task_id} after {last_seen} have expired"
            return Reply.problem(410, "event_history_expired", detail)
        return Reply(200, "text/event-stream", [framed for _, framed in wanted])

    @staticmethod
    async def _stream(plan: BodyPlan, scenario: Scenario, receive: Receive, send: Send, exchange: Exchange) -> None:
        """Write the planned body with the scenario's pacing, then end or abort it.

        A watcher consumes ``receive()`` so a client that goes away stops the
        writes (recorded as ``disconnected``) instead of streaming into a void.
        """
        disconnected = asyncio.Event()
        watcher = asyncio.create_task(_wait_disconnect(receive, disconnected))
        try:
            for index, data in enumerate(plan.writes):
                pause = scenario.first_delay if index == 0 else scenario.delay
                if disconnected.is_set() or (pause and await _disconnected_within(disconnected, pause)):
                    exchange.disconnected = True
                    return
                if scenario.stamp and scenario.coding is None:
                    data = stamp(data, time.time_ns())
                await send({"type": "http.response.body", "body": data, "more_body": True})
            if plan.complete:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            else:
                # Returning with the body unfinished makes hypercorn abort (see module doc).
                exchange.aborted = True
        finally:
            watcher.cancel()


class _AbortingH2Protocol(H2Protocol):
    """hypercorn's HTTP/2 protocol, plus RST_STREAM for responses that die mid-body.

    hypercorn closes an unfinished stream only internally (module doc); here a
    ``StreamClosed`` for a stream that never got ``EndBody`` first drains the
    data already accepted from the app (so the client sees everything recorded
    as sent), then resets the stream. The buffer is then closed and the stream
    unblocked so hypercorn's own send loop hits ``StreamClosedError`` and does
    its usual cleanup.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._finished: set[int] = set()

    async def stream_send(self, event: Event) -> None:
        if isinstance(event, (EndBody, EndData)):
            self._finished.add(event.stream_id)
        elif isinstance(event, StreamClosed):
            if event.stream_id in self._finished:
                self._finished.discard(event.stream_id)
            elif (buffer := self.stream_buffers.get(event.stream_id)) is not None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_H2_DRAIN_TIMEOUT):
                        await buffer.drain()
                with contextlib.suppress(h2.exceptions.ProtocolError):
                    self.connection.reset_stream(event.stream_id, h2.errors.ErrorCodes.INTERNAL_ERROR)
                    await self._flush()
                await buffer.close()
                self.priority.unblock(event.stream_id)
                await self.has_data.set()
        await super().stream_send(event)


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket; port 0 picks a free port (read it from ``getsockname``)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # small SSE events must not wait
    sock.bind(address)
    sock.listen(128)
    return sock


async def serve(
    app: MockLLM,
    sock: socket.socket,
    certs: CertPaths | None,
    *,
    on_ready: Callable[[], None],
    stop: asyncio.Event,
) -> None:
    """Serve ``app`` on ``sock`` (taken over) until ``stop`` is set.

    With ``certs``: TLS with ALPN h2 + http/1.1; without: plain HTTP/1.1.
    ``on_ready`` runs once hypercorn accepts connections: hypercorn starts the
    shutdown-trigger coroutine only after its TLS context and servers are up,
    so that is where we announce readiness.
    """
    # ProtocolWrapper looks the class up in this module at each new connection.
    hypercorn.protocol.H2Protocol = _AbortingH2Protocol  # type: ignore[misc]  # a class replaced on purpose
    config = Config()
    config.bind = [f"fd://{sock.detach()}"]
    config.loglevel = "WARNING"
    config.graceful_timeout = 1.0  # a stop must not wait for long test streams
    if certs is not None:
        config.certfile = str(certs.cert)
        config.keyfile = str(certs.key)
        config.alpn_protocols = ["h2", "http/1.1"]

    async def shutdown_trigger() -> None:
        on_ready()
        await stop.wait()

    await hypercorn_serve(app, config, shutdown_trigger=shutdown_trigger, mode="asgi")  # type: ignore[arg-type]
