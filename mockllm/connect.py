"""The Connect protocol in the mock's ASGI app: the methods of :mod:`mockllm.rpc`.

Streaming calls (``application/connect+proto``, any method kind) are read envelope by
envelope as they arrive, and answered as they are read: a bidirectional call gets its
answers while its request is still open (HTTP/2 full duplex: ``receive()`` while
sending). Each data envelope is gzip-compressed (flag ``0x01``) at every other position
when the request's ``connect-accept-encoding`` names gzip, the way Cursor's server mixes
compressed and plain envelopes; request envelopes flagged compressed are gunzipped per
``connect-content-encoding``. The stream ends with the end-stream envelope (flag
``0x02``): ``{}``, or ``{"error": ...}`` for the scenario's ``error`` (Cursor's methods
add an ``aiserver.v1.ErrorDetails`` detail). A call whose conversation never ends by
itself (``agent.v1.AgentService/Run``) ends only when the client closes its side.

Unary calls (``application/proto``) are the bare message both ways; an error is an HTTP
status with Connect's JSON error body.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import struct
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import orjson

from .rpc import CURSOR_ERROR_DETAIL, METHODS, Answer, Method, cursor_error_details
from .scenario import Scenario, ScenarioError

Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

STREAM_TYPE = "application/connect+proto"
UNARY_TYPE = "application/proto"
COMPRESSED, END_STREAM = 0x01, 0x02
MAX_MESSAGE = 4 * 1024 * 1024
"""Larger request envelopes are refused (``resource_exhausted``)."""

# Connect code -> HTTP status of a unary error (the Connect protocol's table)
HTTP_STATUS = {
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


class Recorder(Protocol):
    """What the app keeps of an exchange for ``/_mock/*`` (:class:`mockllm.server.Exchange`)."""

    request: dict[str, Any]
    completed: bool
    disconnected: bool

    def wrote(self, data: bytes) -> None: ...


NewRecorder = Callable[[str, dict[str, Any]], Recorder]
"""Makes and keeps the record of an exchange, given its mock id and request."""


def _header(scope: dict[str, Any], name: bytes) -> str:
    return next((bytes(v).decode("latin-1") for k, v in scope["headers"] if k.lower() == name), "")


def route(scope: dict[str, Any]) -> Method | None:
    """The method a Connect request calls, if it is one the mock answers."""
    if scope["method"] != "POST" or (method := METHODS.get(scope["path"])) is None:
        return None
    content_type = _header(scope, b"content-type").split(";")[0].strip().lower()
    if content_type == STREAM_TYPE or (content_type == UNARY_TYPE and method.kind == "unary"):
        return method
    return None


def envelope(flags: int, data: bytes) -> bytes:
    return struct.pack(">BI", flags, len(data)) + data


def end_stream(error: tuple[str, str] | None, cursor: bool) -> bytes:
    """The end-stream message: ``{}``, or the error (with Cursor's detail for its methods)."""
    if error is None:
        return envelope(END_STREAM, b"{}")
    code, message = error
    body: dict[str, Any] = {"code": code, "message": message}
    if cursor:
        value = base64.b64encode(cursor_error_details(code, message)).decode().rstrip("=")
        body["details"] = [{"type": CURSOR_ERROR_DETAIL, "value": value, "debug": {"error": "ERROR_CUSTOM_MESSAGE"}}]
    return envelope(END_STREAM, orjson.dumps({"error": body}))


class _Request:
    """The request body, read from ``receive()`` as it arrives and cut into envelopes."""

    def __init__(self, receive: Receive, recorder: Recorder, compressed: bool) -> None:
        self._receive, self._recorder, self.compressed = receive, recorder, compressed
        self._buffer = bytearray()
        self.body = bytearray()
        self.ended = self.disconnected = False

    async def _more(self) -> bool:
        """Read the next chunk; False once the body has ended or the client has gone."""
        if self.ended:
            return False
        message = await self._receive()
        if message["type"] == "http.disconnect":
            self.ended = self.disconnected = True
            return False
        chunk = message.get("body", b"")
        self._buffer += chunk
        self.body += chunk
        self._recorder.request["body_b64"] = base64.b64encode(self.body).decode()
        self.ended = not message.get("more_body", False)
        return True

    async def whole(self) -> bytes:
        while await self._more():
            pass
        return bytes(self._buffer)

    async def messages(self) -> AsyncIterator[bytes]:
        """Each request message, decompressed; raises ValueError on a bad envelope."""
        while True:
            while len(self._buffer) < 5 or len(self._buffer) < 5 + struct.unpack_from(">I", self._buffer, 1)[0]:
                if len(self._buffer) >= 5 and struct.unpack_from(">I", self._buffer, 1)[0] > MAX_MESSAGE:
                    raise ValueError("request message too large")
                if not await self._more():
                    if self._buffer:
                        raise ValueError("request body ends inside an envelope")
                    return
            flags, size = struct.unpack_from(">BI", self._buffer)
            data = bytes(self._buffer[5 : 5 + size])
            del self._buffer[: 5 + size]
            if flags & COMPRESSED:
                if not self.compressed:
                    raise ValueError("compressed message without connect-content-encoding")
                data = gzip.decompress(data)
            yield data


async def serve(method: Method, scope: dict[str, Any], receive: Receive, send: Send, new_recorder: NewRecorder) -> None:
    """Answer one Connect call of ``method``."""
    mock_id = _header(scope, b"x-mock-id") or uuid.uuid4().hex
    recorder = new_recorder(
        mock_id,
        {
            "method": scope["method"],
            "path": bytes(scope["raw_path"]).decode("latin-1"),
            "query": bytes(scope["query_string"]).decode("latin-1"),
            "http_version": scope["http_version"],
            "headers": [[bytes(k).decode("latin-1"), bytes(v).decode("latin-1")] for k, v in scope["headers"]],
            "body_b64": "",
        },
    )

    async def recording_send(message: Message) -> None:
        await send(message)
        if message["type"] == "http.response.body":
            if message.get("body"):
                recorder.wrote(message["body"])
            if not message.get("more_body", False):
                recorder.completed = True

    id_header = (b"x-mock-id", mock_id.encode("latin-1"))
    try:
        scenario = Scenario.parse(bytes(scope["query_string"]).decode("latin-1"), _header(scope, b"x-mock") or None)
    except ScenarioError as exc:
        await _unary_error(recording_send, ("invalid_argument", str(exc)), id_header)
        return
    unary = method.kind == "unary" and _header(scope, b"content-type").startswith(UNARY_TYPE)
    request_coding = _header(scope, b"content-encoding" if unary else b"connect-content-encoding").lower()
    request = _Request(receive, recorder, request_coding == "gzip")
    if unary:
        await _serve_unary(method, scenario, request, recording_send, id_header)
    else:
        accepted = _header(scope, b"connect-accept-encoding").lower()
        gzip_out = "gzip" in (part.strip() for part in accepted.split(","))
        await _serve_stream(method, scenario, request, recording_send, id_header, gzip_out)
    recorder.disconnected = request.disconnected


async def _unary_error(send: Send, error: tuple[str, str], *headers: tuple[bytes, bytes]) -> None:
    code, message = error
    body = orjson.dumps({"code": code, "message": message})
    start_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]
    await send({"type": "http.response.start", "status": HTTP_STATUS.get(code, 500), "headers": start_headers})
    await send({"type": "http.response.body", "body": body})


async def _serve_unary(
    method: Method, scenario: Scenario, request: _Request, send: Send, id_header: tuple[bytes, bytes]
) -> None:
    body = await request.whole()
    if request.disconnected:
        return
    try:
        message = gzip.decompress(body) if request.compressed else body
        answer = method.conversation(scenario).answer(message)
    except (OSError, EOFError, ValueError) as exc:
        answer = Answer(error=("invalid_argument", f"bad request message: {exc}"))
    if answer.error is not None:
        await _unary_error(send, answer.error, id_header)
        return
    data = answer.messages[0] if answer.messages else b""
    headers = [(b"content-type", UNARY_TYPE.encode()), (b"content-length", str(len(data)).encode()), id_header]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def _serve_stream(
    method: Method,
    scenario: Scenario,
    request: _Request,
    send: Send,
    id_header: tuple[bytes, bytes],
    gzip_out: bool,
) -> None:
    headers = [(b"content-type", STREAM_TYPE.encode()), id_header]
    if gzip_out:
        headers.append((b"connect-content-encoding", b"gzip"))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    conversation = method.conversation(scenario)
    written = 0

    async def write(answer: Answer) -> bool:
        """Write the answer's messages; True if the stream is to end."""
        nonlocal written
        for data in answer.messages:
            if scenario.delay and written:
                await asyncio.sleep(scenario.delay)
            compress = gzip_out and written % 2 == 0 and data
            framed = envelope(COMPRESSED, gzip.compress(data, mtime=0)) if compress else envelope(0, data)
            await send({"type": "http.response.body", "body": framed, "more_body": True})
            written += 1
        return answer.done or answer.error is not None

    error: tuple[str, str] | None = None
    try:
        async for message in request.messages():
            answer = conversation.answer(message)
            if await write(answer):
                error = answer.error
                break
        else:
            if request.disconnected:
                return  # the client went away (an aborted Cursor stream): nobody to end it for
            answer = conversation.close()
            await write(answer)
            error = answer.error
    except (OSError, EOFError, ValueError) as exc:  # a bad envelope or a bad gzip member
        error = ("invalid_argument", f"bad request message: {exc}")
    await send({"type": "http.response.body", "body": end_stream(error, method.cursor), "more_body": False})
