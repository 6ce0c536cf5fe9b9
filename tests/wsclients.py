"""Drivers of the real WebSocket clients the end-to-end tests run (mockllm.websocket's protocols).

Each driver takes the upstream's base URL (``http(s)://host:port``: the WebSocket URL is
derived from it), the prompt text (or a list of them: one turn each, on one connection
where the protocol allows it), ``ca`` (the CA file the client trusts: the mock's without a
proxy, mitmproxy's through one; ``False`` turns verification off) and an optional
``proxy`` (``http://127.0.0.1:PORT``, reached with HTTP CONNECT): :func:`via` and
:func:`direct` make those two from the conftest fixtures. It returns a dict of what the
client saw: ``text`` (all turns), ``turns`` (per turn: ``text``, and ``status`` /
``usage`` where the protocol has them), ``events`` (kinds, in order), ``errors``,
``tool_calls`` (Realtime and Gemini Live; Gemini's are answered with ``{"result": "ok"}``),
``usage`` (the last turn's), ``close_code`` / ``close_reason`` (when the socket was closed
under it) and ``mock_id`` (the connection's id at the mock: ``Upstream.received(mock_id)``
/ ``Upstream.sent(mock_id)``; a driver that never reached the mock leaves it unknown there).

How each client is told a proxy and a CA (all of them build on the ``websockets`` library,
which speaks HTTP CONNECT itself since version 15, and otherwise reads ``HTTPS_PROXY`` /
``HTTP_PROXY`` from the environment):

* ``websockets`` itself: ``connect(uri, proxy=..., ssl=context)``.
* ``openai`` (``client.realtime.connect`` and ``client.beta.realtime.connect``): its
  ``websocket_connection_options`` are handed to ``websockets.connect`` unchanged, so
  ``{"proxy": url, "ssl": context}`` work although its TypedDict does not list them. The
  beta client dials ``wss://`` whatever ``base_url`` says: ``websocket_base_url`` is given.
* ``google-genai`` (``client.aio.live.connect``): ``HttpOptions.async_client_args``
  ``{"ssl": context, "proxy": url}`` reach ``websockets.connect`` (it keeps the keys
  ``connect`` accepts). It always dials ``wss://``: no plain-HTTP upstream.
* ``pysignalr``: takes ``ssl=``, but no proxy argument: it is given one through
  ``HTTPS_PROXY`` / ``HTTP_PROXY`` for the duration of the call (:func:`_proxy_env`). Its
  negotiate POST (aiohttp, ``trust_env`` off) would bypass the proxy, so through a proxy
  negotiation is skipped (a private switch of its transport: it has no public one).
* The environment alone also works for ``openai`` and ``google-genai`` (``from_env=True``;
  tested with openai 3.57, google-genai 3.6, websockets 17.4 through a plain mitmdump):
  ``HTTPS_PROXY`` (websockets' default ``proxy=True``) and ``SSL_CERT_FILE`` (OpenSSL's
  default paths; genai reads it itself), when the code passes neither option, as users' code does.
* ``@microsoft/signalr`` (Node, ``tests/node/signalr_clients.mjs``): a ``WebSocket`` class
  (the ``ws`` package) whose agent is ``https-proxy-agent``'s, with the CA passed to it;
  with ``skipNegotiation`` (the default here), since its negotiate fetch has no proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import websockets

NODE_DIR = Path(__file__).resolve().parent / "node"
REALTIME_MODEL = "gpt-realtime"
GEMINI_LIVE_MODEL = "gemini-live-2.5-flash"
GEMINI_LIVE_PATH = "/ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent"
VERTEX_LIVE_PATH = "/ws/google.cloud.aiplatform.v1beta1.LlmBidiService/BidiGenerateContent"
TIMEOUT = 20.0
RS = "\x1e"

Ca = Path | str | bool | None
Texts = str | list[str]


def via(proxy: Any) -> dict[str, Any]:
    """A driver's ``ca`` and ``proxy`` for going through ``proxy`` (conftest's ``Proxy``)."""
    return {"ca": proxy.ca, "proxy": proxy.url}


def direct(upstream: Any) -> dict[str, Any]:
    """A driver's ``ca`` for talking to ``upstream`` (conftest's ``Upstream``) without a proxy."""
    return {"ca": upstream.ca}


def ssl_context(url: str, ca: Ca) -> ssl.SSLContext | None:
    """The TLS context for ``url`` (None for plain ``http``/``ws``)."""
    if not url.startswith(("https:", "wss:")):
        return None
    if ca is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    return ssl.create_default_context(cafile=str(ca) if ca not in (None, True) else None)


def ws_url(base_url: str, path: str) -> str:
    """``http(s)://host:port`` + path as ``ws(s)://``."""
    return base_url.replace("https:", "wss:", 1).replace("http:", "ws:", 1).rstrip("/") + path


@dataclass(frozen=True)
class Dial:
    """Where a driver connects, and how."""

    base_url: str
    ca: Ca = None
    proxy: str | None = None
    mock_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    timeout: float = TIMEOUT
    """For the whole conversation: then the driver returns what it saw, with ``timed_out``."""
    seen: dict[str, Any] = field(default_factory=dict)
    """What the client saw so far (filled by the driver)."""

    def __post_init__(self) -> None:
        self.seen.update(_seen(self.mock_id))

    def ssl(self) -> ssl.SSLContext | None:
        return ssl_context(self.base_url, self.ca)

    def connect(self, path: str, **kwargs: Any) -> Any:
        """``websockets.connect`` to ``path`` with only our proxy (never the environment's)."""
        # close_timeout: a driver that stops reading early must not wait long for the close reply
        options: dict[str, Any] = {"proxy": self.proxy, "open_timeout": self.timeout, "close_timeout": 2, **kwargs}
        if (context := self.ssl()) is not None:
            options["ssl"] = context
        return websockets.connect(ws_url(self.base_url, path), **options)


def _dial(base_url: str, ca: Ca, proxy: str | None, mock_id: str | None, timeout: float) -> Dial:
    return Dial(base_url, ca, proxy, mock_id or uuid.uuid4().hex, timeout)


def _turns(texts: Texts) -> list[str]:
    return [texts] if isinstance(texts, str) else list(texts)


def _seen(mock_id: str) -> dict[str, Any]:
    return {
        "text": "",
        "turns": [],
        "events": [],
        "errors": [],
        "tool_calls": [],
        "usage": None,
        "close_code": None,
        "close_reason": None,
        "mock_id": mock_id,
        "timed_out": False,
    }


def _turn(seen: dict[str, Any]) -> dict[str, Any]:
    """Start a turn's record."""
    seen["turns"].append(turn := {"text": ""})
    return turn


def _said(seen: dict[str, Any], turn: dict[str, Any], piece: str) -> None:
    turn["text"] += piece
    seen["text"] += piece


def _closed(seen: dict[str, Any], exc: websockets.ConnectionClosed) -> None:
    """The close the client got (1006: the connection ended without a close frame)."""
    frame = exc.rcvd
    seen["close_code"], seen["close_reason"] = (frame.code, frame.reason) if frame is not None else (1006, "")


def _closed_quietly(seen: dict[str, Any], ws: Any) -> None:
    """A close that ended an ``async for`` without raising (code 1000/1001)."""
    if ws.close_code is not None and seen["close_code"] is None:
        seen["close_code"], seen["close_reason"] = ws.close_code, ws.close_reason


def _run(dial: Dial, coro: Any) -> dict[str, Any]:
    """Run a driver's conversation; past ``dial.timeout``, what it saw so far, ``timed_out``."""

    async def bounded() -> None:
        try:
            await asyncio.wait_for(coro, dial.timeout)
        except TimeoutError:
            dial.seen["timed_out"] = True

    asyncio.run(bounded())
    return dial.seen


@contextlib.contextmanager
def _proxy_env(proxy: str | None, ca: Ca = None) -> Iterator[None]:
    """``HTTPS_PROXY`` / ``HTTP_PROXY`` set to ``proxy`` (and no ``NO_PROXY``), and ``SSL_CERT_FILE``
    to ``ca`` when it is a file, for a client that reads only the environment; restored after."""
    names = ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy", "NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy")
    saved = {name: os.environ.pop(name, None) for name in (*names, "SSL_CERT_FILE")}
    if proxy:
        os.environ["HTTPS_PROXY"] = os.environ["HTTP_PROXY"] = proxy
    if ca not in (None, True, False):
        os.environ["SSL_CERT_FILE"] = str(ca)
    try:
        yield
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value


# -- OpenAI Realtime ------------------------------------------------------------------------


def _realtime_session(beta: bool, audio: bool) -> dict[str, Any]:
    modalities = ["audio", "text"] if audio else ["text"]
    return {"modalities": modalities} if beta else {"type": "realtime", "output_modalities": modalities}


def _user_item(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def _realtime_done(seen: dict[str, Any], turn: dict[str, Any], response: dict[str, Any]) -> None:
    turn.update(status=response["status"], status_details=response["status_details"], usage=response["usage"])
    seen.update(status=response["status"], status_details=response["status_details"], usage=response["usage"])


def realtime_sdk(
    base_url: str,
    text: Texts,
    *,
    ca: Ca = None,
    proxy: str | None = None,
    beta: bool = False,
    audio: bool = False,
    cancel_after: int | None = None,
    model: str = REALTIME_MODEL,
    from_env: bool = False,
    mock_id: str | None = None,
    timeout: float = TIMEOUT,
) -> dict[str, Any]:
    """Responses through the official ``openai`` SDK (GA ``client.realtime``, or ``client.beta.realtime``)
    on one connection; ``cancel_after`` deltas of a response, it sends ``response.cancel``.
    ``from_env``: the proxy and CA only as ``HTTPS_PROXY`` and ``SSL_CERT_FILE`` (code left as users write it)."""
    dial = _dial(base_url, ca, proxy, mock_id, timeout)
    with _proxy_env(proxy, ca) if from_env else contextlib.nullcontext():
        return _run(dial, _realtime_sdk(dial, _turns(text), beta, audio, cancel_after, model, from_env))


async def _realtime_sdk(
    dial: Dial, texts: list[str], beta: bool, audio: bool, cancel_after: int | None, model: str, from_env: bool
) -> dict[str, Any]:
    import openai

    seen = dial.seen
    client = openai.AsyncOpenAI(
        api_key="sk-test-realtime",
        base_url=f"{dial.base_url.rstrip('/')}/v1",
        websocket_base_url=ws_url(dial.base_url, "/v1"),
    )
    options: dict[str, Any] = {} if from_env else {"proxy": dial.proxy}
    if not from_env and (context := dial.ssl()) is not None:
        options["ssl"] = context
    realtime = client.beta.realtime if beta else client.realtime
    try:
        async with realtime.connect(
            model=model, extra_query={"mock_id": dial.mock_id}, websocket_connection_options=options
        ) as conn:
            await conn.session.update(session=_realtime_session(beta, audio))
            for text in texts:
                turn = _turn(seen)
                await conn.conversation.item.create(item=_user_item(text))
                await conn.response.create()
                deltas = 0
                async for event in conn:
                    seen["events"].append(event.type)
                    if event.type == "session.created":
                        seen["model"] = event.session.model
                    elif event.type.endswith(("text.delta", "transcript.delta")):
                        _said(seen, turn, event.delta)
                        deltas += 1
                        if deltas == cancel_after:
                            await conn.response.cancel()
                    elif event.type == "response.function_call_arguments.done":
                        seen["tool_calls"].append(
                            {"name": event.name, "call_id": event.call_id, "arguments": event.arguments}
                        )
                    elif event.type == "error":
                        seen["errors"].append(event.error.model_dump())
                    elif event.type == "response.done":
                        _realtime_done(seen, turn, event.response.model_dump())
                        break
                else:
                    _closed_quietly(seen, conn._connection)
                    break
    except websockets.ConnectionClosed as exc:
        _closed(seen, exc)
    return seen


def realtime_ws(
    base_url: str,
    text: Texts,
    *,
    ca: Ca = None,
    proxy: str | None = None,
    beta: bool = False,
    audio: bool = False,
    cancel_after: int | None = None,
    extra_events: list[dict[str, Any]] | None = None,
    model: str = REALTIME_MODEL,
    mock_id: str | None = None,
    timeout: float = TIMEOUT,
) -> dict[str, Any]:
    """Responses with the ``websockets`` library and hand-written events (what browser code sends).

    ``extra_events`` are sent before the first ``response.create`` (e.g. an unknown one, to see ``error``).
    """
    dial = _dial(base_url, ca, proxy, mock_id, timeout)
    return _run(dial, _realtime_ws(dial, _turns(text), beta, audio, cancel_after, extra_events or [], model))


async def _realtime_ws(
    dial: Dial,
    texts: list[str],
    beta: bool,
    audio: bool,
    cancel_after: int | None,
    extra_events: list[dict[str, Any]],
    model: str,
) -> dict[str, Any]:
    seen = dial.seen
    headers = {"Authorization": "Bearer sk-test-realtime", "x-mock-id": dial.mock_id}
    if beta:
        headers["OpenAI-Beta"] = "realtime=v1"
    try:
        async with dial.connect(f"/v1/realtime?model={model}", additional_headers=headers) as ws:
            await ws.send(json.dumps({"type": "session.update", "session": _realtime_session(beta, audio)}))
            for number, text in enumerate(texts):
                turn = _turn(seen)
                item = {"type": "conversation.item.create", "event_id": f"evt_item_{number}", "item": _user_item(text)}
                await ws.send(json.dumps(item))
                for event in extra_events if number == 0 else []:
                    await ws.send(json.dumps(event))
                await ws.send(json.dumps({"type": "response.create", "event_id": f"evt_response_{number}"}))
                deltas = 0
                async for message in ws:
                    event = json.loads(message)
                    seen["events"].append(event["type"])
                    if event["type"] == "session.created":
                        seen["model"] = event["session"]["model"]
                    elif event["type"].endswith(("text.delta", "transcript.delta")):
                        _said(seen, turn, event["delta"])
                        deltas += 1
                        if deltas == cancel_after:
                            await ws.send(json.dumps({"type": "response.cancel"}))
                    elif event["type"] == "response.function_call_arguments.done":
                        seen["tool_calls"].append({k: event[k] for k in ("name", "call_id", "arguments")})
                    elif event["type"] == "error":
                        seen["errors"].append(event["error"])
                    elif event["type"] == "response.done":
                        _realtime_done(seen, turn, event["response"])
                        break
                else:
                    _closed_quietly(seen, ws)
                    break
    except websockets.ConnectionClosed as exc:
        _closed(seen, exc)
    return seen


# -- Gemini Live ----------------------------------------------------------------------------


def gemini_live_sdk(
    base_url: str,
    text: Texts,
    *,
    ca: Ca = None,
    proxy: str | None = None,
    audio: bool = False,
    model: str = GEMINI_LIVE_MODEL,
    from_env: bool = False,
    mock_id: str | None = None,
    timeout: float = TIMEOUT,
) -> dict[str, Any]:
    """Turns through ``google-genai``'s ``client.aio.live.connect`` (Gemini API, ``https`` only).
    ``from_env``: the proxy and CA only as ``HTTPS_PROXY`` and ``SSL_CERT_FILE``."""
    dial = _dial(base_url, ca, proxy, mock_id, timeout)
    with _proxy_env(proxy, ca) if from_env else contextlib.nullcontext():
        return _run(dial, _gemini_live_sdk(dial, _turns(text), audio, model, from_env))


async def _gemini_live_sdk(dial: Dial, texts: list[str], audio: bool, model: str, from_env: bool) -> dict[str, Any]:
    from google import genai
    from google.genai import errors, types

    seen = dial.seen
    args: dict[str, Any] = {"proxy": dial.proxy}
    if (context := dial.ssl()) is not None:
        args["ssl"] = context
    options = types.HttpOptions(
        base_url=dial.base_url, headers={"x-mock-id": dial.mock_id}, async_client_args=None if from_env else args
    )
    client = genai.Client(api_key="test-gemini-key", http_options=options)
    config = types.LiveConnectConfig(
        response_modalities=[types.Modality.AUDIO if audio else types.Modality.TEXT],
        output_audio_transcription=types.AudioTranscriptionConfig() if audio else None,
    )
    try:
        async with client.aio.live.connect(model=model, config=config) as session:
            for text in texts:
                turn = _turn(seen)
                await session.send_client_content(turns=types.Content(role="user", parts=[types.Part(text=text)]))
                async for message in session.receive():
                    content = message.server_content
                    if content is not None:
                        seen["events"].append("serverContent")
                        if content.model_turn is not None:
                            _said(seen, turn, "".join(p.text for p in content.model_turn.parts or [] if p.text))
                        if content.output_transcription is not None and content.output_transcription.text:
                            _said(seen, turn, content.output_transcription.text)
                    if message.tool_call is not None:
                        calls = message.tool_call.function_calls or []
                        seen["tool_calls"] += [{"id": c.id, "name": c.name, "args": c.args} for c in calls]
                        answers = [
                            types.FunctionResponse(id=c.id, name=c.name, response={"result": "ok"}) for c in calls
                        ]
                        await session.send_tool_response(function_responses=answers)
                    if message.usage_metadata is not None:
                        turn["usage"] = seen["usage"] = message.usage_metadata.model_dump(exclude_none=True)
                    if content is not None and content.turn_complete:
                        seen["events"].append("turnComplete")
                        break
    except errors.APIError as exc:
        seen["close_code"], seen["close_reason"] = exc.code, exc.message
        seen["errors"].append(str(exc))
    return seen


def gemini_live_ws(
    base_url: str,
    text: Texts,
    *,
    ca: Ca = None,
    proxy: str | None = None,
    audio: bool = False,
    binary: bool = False,
    snake_case: bool = False,
    path: str = GEMINI_LIVE_PATH,
    skip_setup: bool = False,
    model: str = GEMINI_LIVE_MODEL,
    mock_id: str | None = None,
    timeout: float = TIMEOUT,
) -> dict[str, Any]:
    """Turns with the ``websockets`` library: ``setup``, ``clientContent`` (camelCase, or snake_case
    as the Python SDK writes it), read until ``turnComplete``; ``binary`` asks the mock for binary
    frames (``frame_kinds`` says what came)."""
    dial = _dial(base_url, ca, proxy, mock_id, timeout)
    return _run(dial, _gemini_live_ws(dial, _turns(text), audio, binary, snake_case, path, skip_setup, model))


def _gemini_messages(model: str, text: str, audio: bool, snake_case: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``setup`` and one complete ``clientContent`` turn, in either key style."""
    modalities = ["AUDIO" if audio else "TEXT"]
    turns = [{"role": "user", "parts": [{"text": text}]}]
    if snake_case:
        setup = {"model": f"models/{model}", "generation_config": {"response_modalities": modalities}}
        return {"setup": setup}, {"client_content": {"turns": turns, "turn_complete": True}}
    setup = {"model": f"models/{model}", "generationConfig": {"responseModalities": modalities}}
    return {"setup": setup}, {"clientContent": {"turns": turns, "turnComplete": True}}


def _gemini_tool_response(calls: list[dict[str, Any]], snake_case: bool) -> dict[str, Any]:
    answers = [{"id": c.get("id"), "name": c.get("name"), "response": {"result": "ok"}} for c in calls]
    if snake_case:
        return {"tool_response": {"function_responses": answers}}
    return {"toolResponse": {"functionResponses": answers}}


async def _gemini_live_ws(
    dial: Dial, texts: list[str], audio: bool, binary: bool, snake_case: bool, path: str, skip_setup: bool, model: str
) -> dict[str, Any]:
    seen = dial.seen
    seen["frame_kinds"] = []
    query = f"?key=test-gemini-key&mock_id={dial.mock_id}{'&binary=1' if binary else ''}"
    try:
        async with dial.connect(path + query) as ws:
            for number, text in enumerate(texts):
                setup, content = _gemini_messages(model, text, audio, snake_case)
                if number == 0 and not skip_setup:
                    await ws.send(json.dumps(setup))
                await ws.send(json.dumps(content))
                turn = _turn(seen)
                async for frame in ws:
                    seen["frame_kinds"].append("binary" if isinstance(frame, bytes) else "text")
                    message = json.loads(frame)
                    seen["events"].append(next(iter(message)))
                    if calls := (message.get("toolCall") or {}).get("functionCalls"):
                        seen["tool_calls"] += calls
                        await ws.send(json.dumps(_gemini_tool_response(calls, snake_case)))
                    server = message.get("serverContent") or {}
                    for part in (server.get("modelTurn") or {}).get("parts") or []:
                        _said(seen, turn, part.get("text", ""))
                    _said(seen, turn, (server.get("outputTranscription") or {}).get("text", ""))
                    if "usageMetadata" in message:
                        turn["usage"] = seen["usage"] = message["usageMetadata"]
                    if server.get("turnComplete"):
                        break
                else:
                    _closed_quietly(seen, ws)
                    break
    except websockets.ConnectionClosed as exc:
        _closed(seen, exc)
    return seen


# -- consumer Copilot -----------------------------------------------------------------------


def copilot_ws(
    base_url: str,
    text: Texts,
    *,
    ca: Ca = None,
    proxy: str | None = None,
    mode: str = "chat",
    mock_id: str | None = None,
    timeout: float = TIMEOUT,
) -> dict[str, Any]:
    """The ``/c/api/chat`` flow as copilot.microsoft.com's page (and g4f) run it: a ``ping``,
    ``setOptions``, then per turn a ``send`` and the events until ``suggestedFollowups``."""
    dial = _dial(base_url, ca, proxy, mock_id, timeout)
    return _run(dial, _copilot_ws(dial, _turns(text), mode))


async def _copilot_ws(dial: Dial, texts: list[str], mode: str) -> dict[str, Any]:
    seen = dial.seen
    path = f"/c/api/chat?api-version=2&clientSessionId={uuid.uuid4()}&accessToken=test-token"
    try:
        async with dial.connect(path, additional_headers={"x-mock-id": dial.mock_id}) as ws:
            await ws.send(json.dumps({"event": "ping"}))
            await ws.send(
                json.dumps({"event": "setOptions", "supportedFeatures": [], "supportedCards": [], "ads": None})
            )
            for text in texts:
                turn = _turn(seen)
                send = {"event": "send", "conversationId": "conv-test", "mode": mode, "context": {}}
                await ws.send(json.dumps({**send, "content": [{"type": "text", "text": text}]}))
                answer, failed = None, False  # the bot message of this turn (startMessage); an error came
                async for message in ws:
                    event = json.loads(message)
                    kind = event["event"]
                    seen["events"].append(kind)
                    if kind == "startMessage":
                        answer = event.get("messageId")
                    elif kind == "appendText":
                        _said(seen, turn, event["text"])
                    elif kind == "error":
                        seen["errors"].append(event)
                        failed = True
                    elif kind == "done" and failed:
                        break  # a failed answer gets no follow-ups
                    elif kind == "suggestedFollowups" and event.get("messageId") in (answer, None):
                        break  # (the page attaches them by messageId: a previous answer's are not this one's)
                else:
                    _closed_quietly(seen, ws)
                    break
    except websockets.ConnectionClosed as exc:
        _closed(seen, exc)
    return seen


# -- SignalR: Copilot's ChatHub replayed, pysignalr, and the Node client ------------------------


def chathub_ws(
    base_url: str,
    text: Texts,
    *,
    ca: Ca = None,
    proxy: str | None = None,
    path: str = "/sydney/ChatHub",
    mock_id: str | None = None,
    timeout: float = TIMEOUT,
) -> dict[str, Any]:
    """ChatHub turns the way EdgeGPT, sydney.py and PyRIT send them (SignalR JSON by hand):
    handshake, then per turn a ``Metrics`` telemetry call and one ``chat`` StreamInvocation (in one
    frame). A turn's ``text`` is its last cumulative ``update`` snapshot, ``deltas`` the M365
    ``writeAtCursor`` pieces, ``result`` / ``final`` the final item's result and bot text."""
    dial = _dial(base_url, ca, proxy, mock_id, timeout)
    return _run(dial, _chathub_ws(dial, _turns(text), path))


def _chat_invocation(invocation: str, text: str) -> dict[str, Any]:
    message = {"author": "user", "inputMethod": "Keyboard", "text": text, "messageType": "Chat", "requestId": "req-1"}
    argument = {"source": "cib", "tone": "Balanced", "isStartOfSession": invocation == "0", "conversationId": "c1"}
    return {"type": 4, "invocationId": invocation, "target": "chat", "arguments": [{**argument, "message": message}]}


async def _chathub_ws(dial: Dial, texts: list[str], path: str) -> dict[str, Any]:
    seen = dial.seen
    seen.update(result=None, final=None, deltas="", last_update=False)
    metrics = {"type": 1, "target": "Metrics", "arguments": [{"Timestamps": {"RequestSent": "2026-01-01T00:00:00Z"}}]}
    try:
        async with dial.connect(f"{path}?sec_access_token=test-token&mock_id={dial.mock_id}") as ws:
            await ws.send(json.dumps({"protocol": "json", "version": 1}) + RS)
            seen["events"].append(f"handshake:{str(await ws.recv()).rstrip(RS)}")
            for number, text in enumerate(texts):
                turn = _turn(seen)
                await ws.send(json.dumps(metrics) + RS + json.dumps(_chat_invocation(str(number), text)) + RS)
                while not _chathub_records(seen, turn, str(await ws.recv())):
                    pass
    except websockets.ConnectionClosed as exc:
        _closed(seen, exc)
    return seen


def _chathub_records(seen: dict[str, Any], turn: dict[str, Any], frame: str) -> bool:
    """Note one frame's records; True once the invocation completed (or the hub closed)."""
    done = False
    for record in filter(None, frame.split(RS)):
        message = json.loads(record)
        seen["events"].append(message["type"])
        arguments = message.get("arguments") or [{}]
        if message["type"] == 1 and arguments[0].get("messages"):
            turn["text"] = arguments[0]["messages"][0]["text"]  # cumulative: replace
            seen["deltas"] += arguments[0].get("writeAtCursor", "")
            seen["last_update"] = seen["last_update"] or arguments[0].get("isLastUpdate", False)
        elif message["type"] == 2:
            turn["result"] = seen["result"] = message["item"]["result"]
            bots = [m for m in message["item"].get("messages", []) if m.get("author") == "bot"]
            seen["final"] = bots[-1]["text"] if bots else None
        elif message["type"] in (3, 7):
            if message.get("error"):
                seen["errors"].append(message["error"])
            done = True
    seen["text"] = "".join(t["text"] for t in seen["turns"])
    return done


def signalr_py(
    base_url: str,
    text: str,
    *,
    ca: Ca = None,
    proxy: str | None = None,
    protocol: str = "json",
    method: str = "stream",
    path: str = "/hubs/chat",
    mock_id: str | None = None,
    timeout: float = TIMEOUT,
) -> dict[str, Any]:
    """``pysignalr`` against a hub: ``stream`` calls ``Generate`` (string ``items``), ``invoke`` calls
    ``Ask`` (a string ``result``); JSON or MessagePack. Without a proxy it negotiates first
    (``POST …/negotiate``)."""
    dial = _dial(base_url, ca, proxy, mock_id, timeout)
    with _proxy_env(proxy):
        return _run(dial, _signalr_py(dial, text, protocol, method, path))


async def _signalr_py(dial: Dial, text: str, protocol: str, method: str, path: str) -> dict[str, Any]:
    from pysignalr.client import SignalRClient
    from pysignalr.messages import CompletionMessage
    from pysignalr.protocol.json import JSONProtocol
    from pysignalr.protocol.messagepack import MessagepackProtocol

    seen = dial.seen
    seen.update(items=[], result=None)
    turn = _turn(seen)
    finished = asyncio.Event()
    url = ws_url(dial.base_url, path) if dial.proxy else f"{dial.base_url.rstrip('/')}{path}"
    client = SignalRClient(
        f"{url}?mock_id={dial.mock_id}",
        protocol=MessagepackProtocol() if protocol == "messagepack" else JSONProtocol(),
        headers={"x-mock-id": dial.mock_id},
        ssl=dial.ssl(),
        retry_count=1,
        connection_timeout=max(1, int(dial.timeout)),
    )
    if dial.proxy:  # at the ws(s):// URL negotiation would have given
        client._transport._skip_negotiation = True

    async def on_next(items: Any) -> None:
        for item in items if isinstance(items, list) else [items]:
            seen["items"].append(item)
            _said(seen, turn, str(item))

    async def on_complete(message: Any) -> None:
        seen["events"].append("completion")
        if isinstance(message, CompletionMessage):
            if message.error:
                seen["errors"].append(message.error)
            elif message.result is not None:
                seen["result"] = message.result
                _said(seen, turn, str(message.result))
        finished.set()

    async def on_error(message: CompletionMessage) -> None:
        seen["errors"].append(message.error)
        finished.set()

    async def on_close() -> None:
        seen["events"].append("close")
        finished.set()

    async def on_open() -> None:
        if method == "stream":
            await client.stream("Generate", [text], on_next=on_next, on_complete=on_complete, on_error=on_error)
        else:
            await client.send("Ask", [text], on_invocation=on_complete)  # type: ignore[list-item]

    client.on_open(on_open)
    client.on_close(on_close)
    client.on_error(on_error)
    runner = asyncio.create_task(client.run())
    waiter = asyncio.create_task(finished.wait())
    try:
        await asyncio.wait({runner, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if runner.done() and not runner.cancelled() and runner.exception() is not None:
            seen["errors"].append(repr(runner.exception()))
    finally:
        runner.cancel()
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await runner
    return seen


def signalr_node(
    base_url: str,
    text: str,
    *,
    ca: Ca = None,
    proxy: str | None = None,
    protocol: str = "json",
    method: str = "stream",
    path: str = "/hubs/chat",
    cancel_after: int | None = None,
    skip_negotiation: bool = True,
    mock_id: str | None = None,
    timeout: float = TIMEOUT,
    node: str = "node",
) -> dict[str, Any]:
    """``@microsoft/signalr`` (Node) against a hub (``tests/node/signalr_clients.mjs``): ``stream``
    (``Generate``; after ``cancel_after`` items it disposes the subscription, which sends
    CancelInvocation), ``invoke`` (``Ask``), or ``chat`` (Copilot's ChatHub ``chat`` stream, with
    ``update`` handlers: ``text`` is the last snapshot, ``updates`` all of them)."""
    mock_id = mock_id or uuid.uuid4().hex
    config = {
        "url": f"{base_url.rstrip('/')}{path}?mock_id={mock_id}",
        "text": text,
        "protocol": protocol,
        "method": method,
        "proxy": proxy,
        "ca": str(ca) if ca not in (None, True, False) else None,
        "insecure": ca is False,
        "cancelAfter": cancel_after,
        "skipNegotiation": skip_negotiation,
        "timeoutMs": int(timeout * 1000),
    }
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    done = subprocess.run(
        [node, str(NODE_DIR / "signalr_clients.mjs"), json.dumps(config)],
        capture_output=True,
        text=True,
        timeout=timeout + 30,
        cwd=NODE_DIR,
        env=env,
    )
    if done.returncode != 0:
        raise AssertionError(f"signalr_clients.mjs exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    seen["mock_id"] = mock_id
    return seen
