"""Drivers of the real WebSocket clients the end-to-end tests run (mockllm.websocket's protocols).

Each driver takes the upstream's base URL (``http(s)://host:port``: the WebSocket URL is
derived from it), the prompt text, ``ca`` (the CA file the client trusts: the mock's
without a proxy, mitmproxy's through one; ``False`` turns verification off) and an
optional ``proxy`` (``http://127.0.0.1:PORT``, reached with HTTP CONNECT). It returns a
dict of what the client saw: ``text``, ``events`` (kinds, in order), ``errors``,
``usage``, ``close_code`` / ``close_reason`` (when the socket was closed under it) and
``mock_id`` (the connection's id at the mock: ``Upstream.received(mock_id)`` /
``Upstream.sent(mock_id)``).

How each client is told a proxy and a CA (all of them build on the ``websockets`` library,
which speaks HTTP CONNECT itself since version 15, and otherwise reads ``HTTPS_PROXY`` /
``HTTP_PROXY`` from the environment):

* ``websockets`` itself: ``connect(uri, proxy=..., ssl=context)``.
* ``openai`` (``client.realtime.connect`` and ``client.beta.realtime.connect``): its
  ``websocket_connection_options`` are handed to ``websockets.connect`` unchanged, so
  ``{"proxy": url, "ssl": context}`` work although its TypedDict does not list them.
* ``google-genai`` (``client.aio.live.connect``): ``HttpOptions.async_client_args``
  ``{"ssl": context, "proxy": url}`` reach ``websockets.connect`` (it keeps the keys
  ``connect`` accepts). It always uses ``wss://``: no plain-HTTP upstream.
* ``pysignalr``: takes ``ssl=``, but no proxy argument: it is given one through
  ``HTTPS_PROXY`` / ``HTTP_PROXY`` for the duration of the call (:func:`_proxy_env`). Its
  negotiate POST (aiohttp, ``trust_env`` off) would bypass the proxy, so through a proxy
  negotiation is skipped (a private switch of its transport: it has no public one).
* ``@microsoft/signalr`` (Node, ``tests/node/signalr_clients.mjs``): a ``WebSocket`` class
  (the ``ws`` package) whose agent is ``https-proxy-agent``'s, with the CA passed to it.
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
from pathlib import Path
from typing import Any

import websockets

NODE_DIR = Path(__file__).resolve().parent / "node"
REALTIME_MODEL = "gpt-realtime"
GEMINI_LIVE_MODEL = "gemini-live-2.5-flash"
TIMEOUT = 20.0

Ca = Path | str | bool | None


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


def _seen(mock_id: str) -> dict[str, Any]:
    return {
        "text": "",
        "events": [],
        "errors": [],
        "usage": None,
        "close_code": None,
        "close_reason": None,
        "mock_id": mock_id,
    }


def _closed(seen: dict[str, Any], exc: websockets.ConnectionClosed) -> None:
    if exc.rcvd is not None:
        seen["close_code"], seen["close_reason"] = exc.rcvd.code, exc.rcvd.reason
    else:
        seen["close_code"] = 1006


def _connect(url: str, ca: Ca, proxy: str | None, **kwargs: Any) -> Any:
    """``websockets.connect`` with only the proxy given (never the environment's)."""
    context = ssl_context(url, ca)
    options: dict[str, Any] = {"proxy": proxy, "open_timeout": TIMEOUT, **kwargs}
    if context is not None:
        options["ssl"] = context
    return websockets.connect(url, **options)


def _run(coro: Any) -> dict[str, Any]:
    return asyncio.run(asyncio.wait_for(coro, TIMEOUT * 2))


# -- OpenAI Realtime ------------------------------------------------------------------------


def realtime_sdk(
    base_url: str,
    text: str,
    *,
    ca: Ca = None,
    proxy: str | None = None,
    beta: bool = False,
    audio: bool = False,
    cancel_after: int | None = None,
    model: str = REALTIME_MODEL,
    mock_id: str | None = None,
) -> dict[str, Any]:
    """One response through the official ``openai`` SDK (GA ``client.realtime``, or ``client.beta.realtime``)."""
    return _run(_realtime_sdk(base_url, text, ca, proxy, beta, audio, cancel_after, model, mock_id or uuid.uuid4().hex))


async def _realtime_sdk(
    base_url: str,
    text: str,
    ca: Ca,
    proxy: str | None,
    beta: bool,
    audio: bool,
    cancel_after: int | None,
    model: str,
    mock_id: str,
) -> dict[str, Any]:
    import openai

    seen = _seen(mock_id)
    # websocket_base_url: the beta client would dial wss:// whatever base_url's scheme
    client = openai.AsyncOpenAI(
        api_key="sk-test-realtime", base_url=f"{base_url.rstrip('/')}/v1", websocket_base_url=ws_url(base_url, "/v1")
    )
    options: dict[str, Any] = {"proxy": proxy}
    if (context := ssl_context(base_url, ca)) is not None:
        options["ssl"] = context
    realtime = client.beta.realtime if beta else client.realtime
    modalities = ["audio", "text"] if audio else ["text"]
    session: dict[str, Any] = (
        {"modalities": modalities} if beta else {"type": "realtime", "output_modalities": modalities}
    )
    deltas = 0
    try:
        async with realtime.connect(
            model=model,
            extra_query={"mock_id": mock_id},
            websocket_connection_options=options,  # type: ignore[arg-type]
        ) as conn:
            await conn.session.update(session=session)  # type: ignore[arg-type]
            item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
            await conn.conversation.item.create(item=item)  # type: ignore[arg-type]
            await conn.response.create()
            async for event in conn:
                seen["events"].append(event.type)
                if event.type == "session.created":
                    seen["model"] = event.session.model  # type: ignore[union-attr]
                elif event.type.endswith(("text.delta", "transcript.delta")):
                    seen["text"] += event.delta  # type: ignore[union-attr]
                    deltas += 1
                    if cancel_after is not None and deltas == cancel_after:
                        await conn.response.cancel()
                elif event.type == "error":
                    seen["errors"].append(event.error.model_dump())  # type: ignore[union-attr]
                elif event.type == "response.done":
                    response = event.response  # type: ignore[union-attr]
                    seen["status"] = response.status
                    seen["usage"] = response.usage.model_dump() if response.usage else None
                    break
    except websockets.ConnectionClosed as exc:
        _closed(seen, exc)
    return seen


def realtime_ws(
    base_url: str,
    text: str,
    *,
    ca: Ca = None,
    proxy: str | None = None,
    beta: bool = False,
    audio: bool = False,
    cancel_after: int | None = None,
    extra_events: list[dict[str, Any]] | None = None,
    model: str = REALTIME_MODEL,
    mock_id: str | None = None,
) -> dict[str, Any]:
    """One response with the ``websockets`` library and hand-written events (what browser code sends).

    ``extra_events`` are sent before ``response.create`` (e.g. an unknown one, to see ``error``).
    """
    return _run(
        _realtime_ws(
            base_url, text, ca, proxy, beta, audio, cancel_after, extra_events or [], model, mock_id or uuid.uuid4().hex
        )
    )


async def _realtime_ws(
    base_url: str,
    text: str,
    ca: Ca,
    proxy: str | None,
    beta: bool,
    audio: bool,
    cancel_after: int | None,
    extra_events: list[dict[str, Any]],
    model: str,
    mock_id: str,
) -> dict[str, Any]:
    seen = _seen(mock_id)
    url = ws_url(base_url, f"/v1/realtime?model={model}")
    headers = {"Authorization": "Bearer sk-test-realtime", "x-mock-id": mock_id}
    if beta:
        headers["OpenAI-Beta"] = "realtime=v1"
    modalities = ["audio", "text"] if audio else ["text"]
    session = {"modalities": modalities} if beta else {"type": "realtime", "output_modalities": modalities}
    deltas = 0
    try:
        async with _connect(url, ca, proxy, additional_headers=headers) as ws:
            await ws.send(json.dumps({"type": "session.update", "session": session}))
            item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
            await ws.send(json.dumps({"type": "conversation.item.create", "event_id": "evt_item", "item": item}))
            for event in extra_events:
                await ws.send(json.dumps(event))
            await ws.send(json.dumps({"type": "response.create", "event_id": "evt_response"}))
            async for message in ws:
                event = json.loads(message)
                seen["events"].append(event["type"])
                if event["type"] == "session.created":
                    seen["model"] = event["session"]["model"]
                elif event["type"].endswith(("text.delta", "transcript.delta")):
                    seen["text"] += event["delta"]
                    deltas += 1
                    if cancel_after is not None and deltas == cancel_after:
                        await ws.send(json.dumps({"type": "response.cancel"}))
                elif event["type"] == "error":
                    seen["errors"].append(event["error"])
                elif event["type"] == "response.done":
                    seen["status"] = event["response"]["status"]
                    seen["status_details"] = event["response"]["status_details"]
                    seen["usage"] = event["response"]["usage"]
                    break
    except websockets.ConnectionClosed as exc:
        _closed(seen, exc)
    return seen


# -- Gemini Live ----------------------------------------------------------------------------

GEMINI_LIVE_PATH = "/ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent"
VERTEX_LIVE_PATH = "/ws/google.cloud.aiplatform.v1beta1.LlmBidiService/BidiGenerateContent"


def gemini_live_sdk(
    base_url: str,
    text: str,
    *,
    ca: Ca = None,
    proxy: str | None = None,
    audio: bool = False,
    model: str = GEMINI_LIVE_MODEL,
    mock_id: str | None = None,
) -> dict[str, Any]:
    """One turn through ``google-genai``'s ``client.aio.live.connect`` (Gemini API, ``https`` only)."""
    return _run(_gemini_live_sdk(base_url, text, ca, proxy, audio, model, mock_id or uuid.uuid4().hex))


async def _gemini_live_sdk(
    base_url: str, text: str, ca: Ca, proxy: str | None, audio: bool, model: str, mock_id: str
) -> dict[str, Any]:
    from google import genai
    from google.genai import errors, types

    seen = _seen(mock_id)
    args: dict[str, Any] = {"proxy": proxy}
    if (context := ssl_context(base_url, ca)) is not None:
        args["ssl"] = context
    options = types.HttpOptions(base_url=base_url, headers={"x-mock-id": mock_id}, async_client_args=args)
    client = genai.Client(api_key="test-gemini-key", http_options=options)
    config = types.LiveConnectConfig(
        response_modalities=[types.Modality.AUDIO if audio else types.Modality.TEXT],
        output_audio_transcription=types.AudioTranscriptionConfig() if audio else None,
    )
    try:
        async with client.aio.live.connect(model=model, config=config) as session:
            turn = types.Content(role="user", parts=[types.Part(text=text)])
            await session.send_client_content(turns=turn, turn_complete=True)
            async for message in session.receive():
                content = message.server_content
                if content is not None:
                    seen["events"].append("serverContent")
                    if content.model_turn is not None:
                        seen["text"] += "".join(p.text for p in content.model_turn.parts or [] if p.text)
                    if content.output_transcription is not None and content.output_transcription.text:
                        seen["text"] += content.output_transcription.text
                if message.usage_metadata is not None:
                    seen["usage"] = message.usage_metadata.model_dump(exclude_none=True)
                if content is not None and content.turn_complete:
                    seen["events"].append("turnComplete")
                    break
    except errors.APIError as exc:
        seen["close_code"], seen["close_reason"] = exc.code, exc.message
        seen["errors"].append(str(exc))
    return seen


def gemini_live_ws(
    base_url: str,
    text: str,
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
) -> dict[str, Any]:
    """One turn with the ``websockets`` library: ``setup``, ``clientContent`` (camelCase, or snake_case
    as the Python SDK writes it), read until ``turnComplete``; ``binary`` asks the mock for binary frames."""
    args = (base_url, text, ca, proxy, audio, binary, snake_case, path, skip_setup, model, mock_id or uuid.uuid4().hex)
    return _run(_gemini_live_ws(*args))


async def _gemini_live_ws(
    base_url: str,
    text: str,
    ca: Ca,
    proxy: str | None,
    audio: bool,
    binary: bool,
    snake_case: bool,
    path: str,
    skip_setup: bool,
    model: str,
    mock_id: str,
) -> dict[str, Any]:
    seen = _seen(mock_id)
    seen["frame_kinds"] = []
    url = ws_url(base_url, f"{path}?key=test-gemini-key&mock_id={mock_id}{'&binary=1' if binary else ''}")
    modalities = ["AUDIO" if audio else "TEXT"]
    if snake_case:
        setup = {"model": f"models/{model}", "generation_config": {"response_modalities": modalities}}
        turn = {"client_content": {"turns": [{"role": "user", "parts": [{"text": text}]}], "turn_complete": True}}
    else:
        setup = {"model": f"models/{model}", "generationConfig": {"responseModalities": modalities}}
        turn = {"clientContent": {"turns": [{"role": "user", "parts": [{"text": text}]}], "turnComplete": True}}
    try:
        async with _connect(url, ca, proxy) as ws:
            if not skip_setup:
                await ws.send(json.dumps({"setup": setup}))
            await ws.send(json.dumps(turn))
            async for frame in ws:
                seen["frame_kinds"].append("binary" if isinstance(frame, bytes) else "text")
                message = json.loads(frame)
                seen["events"].append(next(iter(message)))
                content = message.get("serverContent") or {}
                for part in (content.get("modelTurn") or {}).get("parts") or []:
                    seen["text"] += part.get("text", "")
                seen["text"] += (content.get("outputTranscription") or {}).get("text", "")
                if "usageMetadata" in message:
                    seen["usage"] = message["usageMetadata"]
                if content.get("turnComplete"):
                    break
    except websockets.ConnectionClosed as exc:
        _closed(seen, exc)
    return seen


# -- consumer Copilot -----------------------------------------------------------------------


def copilot_ws(
    base_url: str,
    text: str,
    *,
    ca: Ca = None,
    proxy: str | None = None,
    mode: str = "chat",
    mock_id: str | None = None,
) -> dict[str, Any]:
    """The ``/c/api/chat`` flow as copilot.microsoft.com's page (and g4f) run it: ``setOptions``,
    ``send``, then the events until ``done``; a ``ping`` first, to see the ``pong``."""
    return _run(_copilot_ws(base_url, text, ca, proxy, mode, mock_id or uuid.uuid4().hex))


async def _copilot_ws(base_url: str, text: str, ca: Ca, proxy: str | None, mode: str, mock_id: str) -> dict[str, Any]:
    seen = _seen(mock_id)
    url = ws_url(base_url, f"/c/api/chat?api-version=2&clientSessionId={uuid.uuid4()}&accessToken=test-token")
    try:
        async with _connect(url, ca, proxy, additional_headers={"x-mock-id": mock_id}) as ws:
            await ws.send(json.dumps({"event": "ping"}))
            await ws.send(
                json.dumps({"event": "setOptions", "supportedFeatures": [], "supportedCards": [], "ads": None})
            )
            content = [{"type": "text", "text": text}]
            await ws.send(
                json.dumps(
                    {"event": "send", "conversationId": "conv-test", "content": content, "mode": mode, "context": {}}
                )
            )
            async for message in ws:
                event = json.loads(message)
                seen["events"].append(event["event"])
                if event["event"] == "appendText":
                    seen["text"] += event["text"]
                elif event["event"] == "error":
                    seen["errors"].append(event)
                    break
                elif event["event"] == "suggestedFollowups":
                    break
    except websockets.ConnectionClosed as exc:
        _closed(seen, exc)
    return seen


# -- SignalR: Copilot's ChatHub replayed, pysignalr, and the Node client ------------------------

RS = "\x1e"


def chathub_ws(
    base_url: str,
    text: str,
    *,
    ca: Ca = None,
    proxy: str | None = None,
    path: str = "/sydney/ChatHub",
    mock_id: str | None = None,
) -> dict[str, Any]:
    """A Sydney / M365 ChatHub turn the way EdgeGPT, sydney.py and PyRIT send it (SignalR JSON by
    hand): handshake, a ``Metrics`` telemetry call, one ``chat`` StreamInvocation; ``text`` is the
    last cumulative ``update`` snapshot, ``result`` the final item's ``result``."""
    return _run(_chathub_ws(base_url, text, ca, proxy, path, mock_id or uuid.uuid4().hex))


async def _chathub_ws(base_url: str, text: str, ca: Ca, proxy: str | None, path: str, mock_id: str) -> dict[str, Any]:
    seen = _seen(mock_id)
    seen.update(result=None, final=None, deltas="", last_update=False)
    url = ws_url(base_url, f"{path}?sec_access_token=test-token&mock_id={mock_id}")
    metrics = {"type": 1, "target": "Metrics", "arguments": [{"Timestamps": {"RequestSent": "2026-01-01T00:00:00Z"}}]}
    message = {"author": "user", "inputMethod": "Keyboard", "text": text, "messageType": "Chat", "requestId": "req-1"}
    chat = {"type": 4, "invocationId": "0", "target": "chat"}
    chat["arguments"] = [
        {"source": "cib", "tone": "Balanced", "isStartOfSession": True, "conversationId": "c1", "message": message}
    ]
    try:
        async with _connect(url, ca, proxy) as ws:
            await ws.send(json.dumps({"protocol": "json", "version": 1}) + RS)
            handshake = await ws.recv()
            seen["events"].append(f"handshake:{handshake.rstrip(RS)}")
            await ws.send(json.dumps(metrics) + RS + json.dumps(chat) + RS)
            done = False
            while not done:
                for record in str(await ws.recv()).split(RS):
                    if not record:
                        continue
                    msg = json.loads(record)
                    seen["events"].append(msg["type"])
                    arguments = msg.get("arguments") or [{}]
                    if msg["type"] == 1 and arguments[0].get("messages"):
                        seen["text"] = arguments[0]["messages"][0]["text"]
                        seen["deltas"] += arguments[0].get("writeAtCursor", "")
                        seen["last_update"] = seen["last_update"] or arguments[0].get("isLastUpdate", False)
                    elif msg["type"] == 2:
                        seen["result"] = msg["item"]["result"]
                        bots = [m for m in msg["item"].get("messages", []) if m.get("author") == "bot"]
                        seen["final"] = bots[-1]["text"] if bots else None
                    elif msg["type"] == 3:
                        if "error" in msg:
                            seen["errors"].append(msg["error"])
                        done = True
                    elif msg["type"] == 7:
                        seen["errors"].append(msg.get("error"))
                        done = True
    except websockets.ConnectionClosed as exc:
        _closed(seen, exc)
    return seen


@contextlib.contextmanager
def _proxy_env(proxy: str | None) -> Iterator[None]:
    """``HTTPS_PROXY`` / ``HTTP_PROXY`` set to ``proxy`` (and no ``NO_PROXY``) for a client that
    reads only the environment; restored after."""
    names = ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy", "NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy")
    saved = {name: os.environ.pop(name, None) for name in names}
    if proxy:
        os.environ["HTTPS_PROXY"] = os.environ["HTTP_PROXY"] = proxy
    try:
        yield
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value


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
) -> dict[str, Any]:
    """``pysignalr`` against a hub: ``stream`` calls ``Generate`` (string items), ``invoke`` calls
    ``Ask`` (a string result); JSON or MessagePack. It negotiates first (``POST …/negotiate``)."""
    with _proxy_env(proxy):
        return _run(_signalr_py(base_url, text, ca, protocol, method, path, mock_id or uuid.uuid4().hex))


async def _signalr_py(
    base_url: str, text: str, ca: Ca, protocol: str, method: str, path: str, mock_id: str
) -> dict[str, Any]:
    from pysignalr.client import SignalRClient
    from pysignalr.messages import CompletionMessage
    from pysignalr.protocol.json import JSONProtocol
    from pysignalr.protocol.messagepack import MessagepackProtocol

    seen = _seen(mock_id)
    seen.update(items=[], result=None)
    finished = asyncio.Event()
    proxied = bool(os.environ.get("HTTPS_PROXY"))
    # Its negotiate POST (aiohttp) ignores the environment's proxy: through one, go straight to
    # the upgrade (which websockets sends through HTTPS_PROXY), at the ws(s):// URL negotiation would give.
    url = ws_url(base_url, path) if proxied else f"{base_url.rstrip('/')}{path}"
    client = SignalRClient(
        f"{url}?mock_id={mock_id}",
        protocol=MessagepackProtocol() if protocol == "messagepack" else JSONProtocol(),
        headers={"x-mock-id": mock_id},
        ssl=ssl_context(base_url, ca),
        retry_count=1,
        connection_timeout=int(TIMEOUT),
    )

    async def on_next(items: Any) -> None:
        for item in items if isinstance(items, list) else [items]:
            seen["items"].append(item)
            seen["text"] += str(item)

    async def on_complete(message: Any) -> None:
        seen["events"].append("completion")
        if isinstance(message, CompletionMessage):
            if message.error:
                seen["errors"].append(message.error)
            elif message.result is not None:
                seen["result"] = message.result
                seen["text"] += str(message.result)
        finished.set()

    async def on_error(message: CompletionMessage) -> None:
        seen["errors"].append(message.error)
        finished.set()

    async def on_open() -> None:
        if method == "stream":
            await client.stream("Generate", [text], on_next=on_next, on_complete=on_complete, on_error=on_error)
        else:
            await client.send("Ask", [text], on_invocation=on_complete)  # type: ignore[list-item]

    if proxied:
        client._transport._skip_negotiation = True
    client.on_open(on_open)
    client.on_error(on_error)
    runner = asyncio.create_task(client.run())
    waiter = asyncio.create_task(finished.wait())
    await asyncio.wait({runner, waiter}, timeout=TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
    if runner.done() and runner.exception() is not None:
        seen["errors"].append(repr(runner.exception()))
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
    node: str = "node",
) -> dict[str, Any]:
    """``@microsoft/signalr`` (Node) against a hub (``tests/node/signalr_clients.mjs``): ``stream``
    (``Generate``; ``cancel_after`` items then dispose the subscription, which sends CancelInvocation),
    ``invoke`` (``Ask``), or ``chat`` (Copilot's ChatHub ``chat`` stream, ``update`` handlers on)."""
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
    }
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    done = subprocess.run(
        [node, str(NODE_DIR / "signalr_clients.mjs"), json.dumps(config)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT * 2,
        cwd=NODE_DIR,
        env=env,
    )
    if done.returncode != 0:
        raise AssertionError(f"signalr_clients.mjs exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    seen["mock_id"] = mock_id
    return seen
