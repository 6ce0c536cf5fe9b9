"""Ending a streamed response early and cleanly, and telling which peer broke an
exchange: the one place that uses mitmproxy's private API.

mitmproxy 12.3 has no public way to finish a response while the upstream is still
sending (``flow.kill()`` is ignored in transit; returning ``b""`` from the stream
callable ends an HTTP/1.1 body but breaks the kept-alive connection). A content filter
that stops a stream needs both halves: the client gets the injected end of the stream
and then a clean end of the response (HTTP/1.1 chunked terminator, HTTP/2 END_STREAM),
and the upstream is told to stop generating (HTTP/2: RST_STREAM CANCEL for that stream
only, so other streams on the connection carry on; HTTP/1.1: the connection is closed).

How: :func:`install` extends ``HttpStream.state_stream_response_body``. After the stream
callable has handled a chunk, if the flow was marked with :func:`end_after_this_chunk`,
it cancels the upstream side of this stream and finishes the flow towards the client
through mitmproxy's normal ``send_response(already_streamed=True)`` path (so the
``response`` hook fires, not ``error``). The technique is the one checked in
``shared/reference/early-termination.md``; mitmproxy is pinned to 12.3.x in
``pyproject.toml`` and ``tests/e2e/test_early_end.py`` proves it per protocol.

Which peer broke an exchange: mitmproxy's ``error`` hook gets only a message, and on
HTTP/2 the message is the same ("stream reset by client (CANCEL)") whether the client or
the upstream reset the stream. :func:`install_error_side` notes the side on the flow
(``flow.metadata["llm_audit_error_from"]``: ``client`` or ``upstream``) from the kind of
protocol error mitmproxy handles, before its ``error`` hook runs.

WebSocket (:func:`install_websocket_close`, :func:`install_websocket_fragments`,
:func:`install_websocket_inflate_bound`): closing with a code, cutting an injected text
message between characters, and a bound on what a compressed message may inflate to
(wsproto's permessage-deflate, which mitmproxy uses).
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable

from mitmproxy import http
from mitmproxy.proxy.layers import http as httplayer
from mitmproxy.proxy.layers.http import (
    ErrorCode,
    HttpStream,
    RequestData,
    RequestProtocolError,
    ResponseData,
    ResponseProtocolError,
)

METADATA_KEY = "llm_audit_end_stream"
REQUEST_END_KEY = "llm_audit_end_from_request"
_ENDED = "_llm_audit_ended_early"  # on the HttpStream: the early end happened
_PATCHED = "_llm_audit_patched"  # on the patched method
ERROR_SIDE_KEY = "llm_audit_error_from"


def end_after_this_chunk(flow: http.HTTPFlow) -> None:
    """Call from the stream callable: the chunk it returns now is the last the client gets."""
    flow.metadata[METADATA_KEY] = True


def install() -> None:
    """Patch ``HttpStream`` once per process (idempotent: script reloads call it again)."""
    original = HttpStream.state_stream_response_body
    if getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    def state_stream_response_body(self: HttpStream, event):
        yield from original(self, event)
        if (
            isinstance(event, ResponseData)
            and self.flow.metadata.get(METADATA_KEY)
            and not getattr(self, _ENDED, False)
        ):
            setattr(self, _ENDED, True)
            yield httplayer.SendHttp(
                RequestProtocolError(self.stream_id, "stopped by llm-audit content filter", ErrorCode.CANCEL),
                self.context.server,
            )
            yield from self.send_response(already_streamed=True)

    setattr(state_stream_response_body, _PATCHED, True)
    HttpStream.state_stream_response_body = state_stream_response_body  # type: ignore[method-assign]


#: What the client gets when a streamed request is blocked: called with whether the
#: response is already streaming to the client; returns (the whole answer to send, for a
#: response not begun) or (the bytes and trailers that end the one streaming).
RequestEnd = Callable[[bool], tuple[http.Response | None, bytes, list[tuple[str, str]]]]


def end_from_request_side(flow: http.HTTPFlow, answer: RequestEnd) -> None:
    """Call from the request's stream callable: a filter blocked a message of a
    bidirectional stream. After this chunk the upstream stream is cancelled and the
    client gets ``answer``'s end of the exchange (with ``response`` firing, not ``error``)."""
    flow.metadata[REQUEST_END_KEY] = answer


def install_request_side() -> None:
    """Patch ``HttpStream.state_stream_request_body`` once per process (idempotent).

    mitmproxy's public API cannot end a response from the request side, nor answer a
    request whose body is still streaming (``flow.response`` may not be set then). After
    the request's stream callable has handled a chunk of a flow marked by
    :func:`end_from_request_side`, this cancels the upstream stream and finishes the
    flow towards the client: the proxy's own answer when the response has not begun,
    else the dialect's end appended to the response streaming; either way through
    ``send_response`` as :func:`install` does.
    """
    original = HttpStream.state_stream_request_body
    if getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    def state_stream_request_body(self: HttpStream, event):
        yield from original(self, event)
        answer = self.flow.metadata.get(REQUEST_END_KEY)
        if isinstance(event, RequestData) and answer is not None and not getattr(self, _ENDED, False):
            setattr(self, _ENDED, True)
            yield from _end_from_request_side(self, answer)

    setattr(state_stream_request_body, _PATCHED, True)
    HttpStream.state_stream_request_body = state_stream_request_body  # type: ignore[method-assign]


def _end_from_request_side(stream: HttpStream, answer: RequestEnd):
    streaming = stream.server_state == stream.state_stream_response_body
    if not streaming and stream.server_state != stream.state_wait_for_response_headers:
        return  # the response is already being finished
    response, data, trailers = answer(streaming)
    yield httplayer.SendHttp(
        RequestProtocolError(stream.stream_id, "stopped by llm-audit content filter", ErrorCode.CANCEL),
        stream.context.server,
    )
    stream.client_state = stream.state_done  # what the client still sends goes nowhere
    if streaming:
        if data:
            yield httplayer.SendHttp(ResponseData(stream.stream_id, data), stream.context.client)
        if trailers and stream.flow.response is not None:
            stream.flow.response.trailers = http.Headers([(k.encode(), v.encode()) for k, v in trailers])
        yield from stream.send_response(already_streamed=True)
    elif response is not None:
        stream.flow.response = response
        yield from stream.send_response()


def error_side(flow: http.HTTPFlow) -> str | None:
    """``client`` or ``upstream``: whose protocol error ended this flow, when known."""
    side = flow.metadata.get(ERROR_SIDE_KEY)
    return side if side in ("client", "upstream") else None


def install_error_side() -> None:
    """Patch ``HttpStream.handle_protocol_error`` once per process (idempotent).

    A ``RequestProtocolError`` comes from the client's side of the stream, a
    ``ResponseProtocolError`` from the upstream's; the first one seen on a flow counts
    (mitmproxy then cancels the other side, which raises no second error hook).
    """
    original = HttpStream.handle_protocol_error
    if getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    def handle_protocol_error(self: HttpStream, event):
        flow = getattr(self, "flow", None)
        if flow is not None and ERROR_SIDE_KEY not in flow.metadata:
            flow.metadata[ERROR_SIDE_KEY] = "upstream" if isinstance(event, ResponseProtocolError) else "client"
        return (yield from original(self, event))

    setattr(handle_protocol_error, _PATCHED, True)
    HttpStream.handle_protocol_error = handle_protocol_error  # type: ignore[method-assign]


# -- closing a WebSocket with a code -------------------------------------------------------

_CLOSE = 8  # the close opcode (RFC 6455): an injected "message" of this type closes the connection


def install_websocket_close() -> None:
    """Teach mitmproxy's WebSocket layer to close a connection with a code and reason.

    mitmproxy 12.3 can inject messages into a WebSocket but not close one: ``flow.kill()``
    drops both connections without a close frame, which a client reports as 1006
    "abnormal closure", not the protocol's own error (Gemini Live's errors are close
    codes). The patched ``WebsocketLayer.relay_messages`` takes an injected message of
    the close opcode (:func:`close_websocket`) as a close: both peers get a close frame
    with that code and reason, then the layer ends as it does when a peer closes.
    """
    from mitmproxy.proxy.layers import websocket as wslayer

    original = wslayer.WebsocketLayer.relay_messages
    if getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    def relay_messages(self: wslayer.WebsocketLayer, event):
        if isinstance(event, wslayer.WebSocketMessageInjected) and event.message.type == _CLOSE:
            yield from _close_both(self, event.message.content)
            return
        yield from original(self, event)

    setattr(relay_messages, _PATCHED, True)
    wslayer.WebsocketLayer.relay_messages = relay_messages  # type: ignore[method-assign]


def _close_both(layer, payload: bytes):
    """Close both sides of a WebSocket as the layer does when a peer closes."""
    import time

    import wsproto.events
    from mitmproxy.proxy import commands
    from mitmproxy.proxy.layers import websocket as wslayer
    from wsproto import ConnectionState

    code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1000
    reason = payload[2:].decode("utf-8", "replace")
    flow = layer.flow
    if flow.websocket is not None:
        flow.websocket.timestamp_end = time.time()
        flow.websocket.close_code, flow.websocket.close_reason = code, reason
    for ws in (layer.client_ws, layer.server_ws):
        if ws.state in {ConnectionState.OPEN, ConnectionState.REMOTE_CLOSING}:
            yield ws.send2(wsproto.events.CloseConnection(code, reason))
        yield commands.CloseConnection(ws.conn)
    yield wslayer.WebsocketEndHook(flow)
    flow.live = False
    layer._handle_event = layer.done


def close_websocket(flow: http.HTTPFlow, code: int, reason: str) -> None:
    """Close ``flow``'s WebSocket with ``code`` and ``reason`` (at most the 123 bytes a
    close frame holds), after the messages injected before (see :func:`install_websocket_close`)."""
    from mitmproxy import ctx
    from mitmproxy.proxy.layers.websocket import WebSocketMessageInjected
    from mitmproxy.websocket import WebSocketMessage

    data = reason.encode()[:123].decode("utf-8", "ignore").encode()
    message = WebSocketMessage(_CLOSE, False, code.to_bytes(2, "big") + data)
    ctx.master.addons.get("proxyserver").inject_event(WebSocketMessageInjected(flow, message))


def install_websocket_fragments() -> None:
    """Make mitmproxy cut a text message it sends in pieces only between characters.

    mitmproxy 12.3 sends a message an addon injected (or changed) as frames of 4000
    bytes, each decoded on its own with ``errors="replace"``
    (``websocket.Fragmentizer``): a cut inside a UTF-8 character turns it into two
    U+FFFD on the wire. The proxy injects every message the content filters held, so a
    long answer in Japanese would reach the client changed, and the addon would not
    know its own message when it passes the hook again (it matches them by content).
    The patched ``Fragmentizer`` moves each cut of a text message back to the start of
    the character it falls in; binary messages and cuts between characters are as before.
    """
    from mitmproxy.proxy.layers import websocket as wslayer

    original = wslayer.Fragmentizer.__call__
    if getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    def fragments(self: wslayer.Fragmentizer, content: bytes):
        if not self.is_text:
            yield from original(self, content)
            return
        for start, end in _text_cuts(content, self.fragment_lengths, self.FRAGMENT_SIZE):
            yield self.msg(content[start:end], end == len(content))

    setattr(fragments, _PATCHED, True)
    wslayer.Fragmentizer.__call__ = fragments  # type: ignore[method-assign]


def install_websocket_inflate_bound() -> None:
    """Bound what a WebSocket message may inflate to (permessage-deflate), as the
    proxy's own decoder bounds an HTTP body (:data:`~addon.auditor.DECODE_BUDGET`).

    mitmproxy 12.3 decompresses a compressed message through wsproto's
    ``PerMessageDeflate``, which inflates each piece of a frame whole: a 1 MB frame of
    zeros from either peer becomes 1 GiB in the proxy's memory before any hook sees it,
    on any WebSocket through the proxy. The patched extension inflates at most what the
    budget still allows a message (more than 16 MiB at over 100 times the compressed
    bytes read, or more than 1 GiB, is a bomb) and past it closes the connection with
    1009 (message too big), as RFC 6455 has a peer do with a message it cannot take. A
    message within the budget is inflated exactly as before."""
    from wsproto import extensions
    from wsproto.frame_protocol import CloseReason

    from addon.auditor import DECODE_BUDGET

    deflate = extensions.PerMessageDeflate
    original_payload, original_complete = deflate.frame_inbound_payload_data, deflate.frame_inbound_complete
    if getattr(original_payload, _PATCHED, False):
        return

    @functools.wraps(original_payload)
    def payload(self: extensions.PerMessageDeflate, proto: object, data: bytes) -> bytes | CloseReason:
        if not self._inbound_compressed or not self._inbound_is_compressible or self._decompressor is None:
            return original_payload(self, proto, data)  # type: ignore[arg-type]
        taken, made = getattr(self, _INFLATED, (0, 0))
        taken += len(data)
        allowed = min(DECODE_BUDGET.max_decoded, max(DECODE_BUDGET.floor, DECODE_BUDGET.ratio * taken))
        try:
            out = self._decompressor.decompress(bytes(data), max(1, allowed - made + 1))  # (0 is no limit)
        except zlib.error:
            return CloseReason.INVALID_FRAME_PAYLOAD_DATA
        made += len(out)
        if self._decompressor.unconsumed_tail or DECODE_BUDGET.exceeded(made, taken):
            return CloseReason.MESSAGE_TOO_BIG
        setattr(self, _INFLATED, (taken, made))
        return out

    @functools.wraps(original_complete)
    def complete(self: extensions.PerMessageDeflate, proto: object, fin: bool) -> bytes | CloseReason | None:
        if fin:
            setattr(self, _INFLATED, (0, 0))  # (the next message has a budget of its own)
        return original_complete(self, proto, fin)  # type: ignore[arg-type]

    setattr(payload, _PATCHED, True)
    deflate.frame_inbound_payload_data = payload  # type: ignore[method-assign]
    deflate.frame_inbound_complete = complete  # type: ignore[method-assign]


_INFLATED = "_llm_audit_inflated"  # on a PerMessageDeflate: (compressed bytes read, bytes inflated) of its message


def _text_cuts(content: bytes, lengths: list[int], size: int) -> list[tuple[int, int]]:
    """The (start, end) of each frame of a text message: where mitmproxy cuts it (the
    frames it came in, when its length is unchanged; else ``size`` bytes each), each
    cut moved back to a UTF-8 character's first byte."""
    same = len(content) == sum(lengths)
    pieces: list[tuple[int, int]] = []
    start = at = 0
    for length in lengths[:-1] if same else ():
        at += length
        start = _cut(content, start, at, pieces)
    while not same and len(content) - start > size:
        before, start = start, _cut(content, start, start + size, pieces)
        if start == before:
            break  # (the rest is one character)
    pieces.append((start, len(content)))
    return pieces


def _cut(content: bytes, start: int, cut: int, pieces: list[tuple[int, int]]) -> int:
    """Cut a frame from ``start`` at ``cut``, or before the character ``cut`` falls in
    (after it, when the frame would be empty); where the next frame starts."""
    at = cut
    while at > start and content[at] & 0xC0 == 0x80:  # a continuation byte
        at -= 1
    if at == start:
        at = cut
        while at < len(content) and content[at] & 0xC0 == 0x80:
            at += 1
    if start < at < len(content):
        pieces.append((start, at))
        return at
    return start
