"""What a mitmproxy flow tells the exchange record: the request side, the response's
status and headers, the user behind the connection, and who cut an exchange that
ended in the ``error`` hook.

These read the flow and write the record's fields the flow decides; the record alone
settles its status and error (:class:`~addon.record.ExchangeRecord`).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from typing import Any

from mitmproxy import http
from mitmproxy.connection import ConnectionState

from addon.auditor import DECODE_BUDGET, summary_into_record
from addon.decoding import IN_STEP, DecodeError, make_decoder
from addon.dialects import UNREADABLE, Dialect, RequestSummary, RequestView, canonical_path, media_type
from addon.dialects.registry import REGISTRY
from addon.events import Finding
from addon.hosts import server_name
from addon.local_user import is_transparent, local_user
from addon.mitm import early_end
from addon.record import OUTCOME_CLIENT_ABORTED, OUTCOME_UPSTREAM_ABORTED, ExchangeRecord, Status
from addon.redact import api_key_fingerprint, redact_headers, redact_path, redact_query, redact_values

#: The most a compressed request body is decoded to (past it, or at a compression
#: bomb's ratio: ``request_too_large``). Far above any API's own request limit
#: (Anthropic's is 32 MB), and no more than the same body sent uncompressed would hold
#: in memory: mitmproxy holds a request body whole, and that one is read at any size.
MAX_REQUEST_DECODED = 256 * 1024 * 1024
#: What a request is read of when only its answer told the proxy it is an exchange (an
#: event stream a dialect claims by its first event): read on the event loop, for a
#: summary (the model, the user), in the tap.
SNIFFED_REQUEST_BYTES = 1024 * 1024


#: A request line as detection read it, and the finding that says how (:func:`line_views`).
Line = tuple[RequestView, Finding | None]


def request_content(
    req: http.Request, max_bytes: int = MAX_REQUEST_DECODED, *, identity_too: bool = False
) -> tuple[bytes | None, list[Finding]]:
    """The request body as the upstream reads it, its Content-Encoding undone, and what
    was wrong with it; ``None`` when it decodes to more than ``max_bytes`` (``identity_too``:
    or is that large as sent) or at a compression bomb's ratio (finding
    ``request_too_large``): it is not read, and the request filters' failure policy
    decides. So it does for a coding that cannot be decoded (``request_decode_failed``:
    unknown, bad data, more empty gzip members or zstd frames than any encoder makes,
    or Content-Encoding sent twice, which servers read differently: Go takes the
    first): what decoded is read, but a server's decoder may read on.

    Why not mitmproxy's ``get_content``: it decodes the whole body in one call, so a
    0.5 MB gzip body of zeros took 1.5 s of the event loop and 512 MiB of memory (a
    32 MB one, 32 GiB). Here the proxy's bounded decoder reads a slice at a time and
    stops at the budget the response side uses (:data:`~addon.auditor.DECODE_BUDGET`).
    The bytes sent upstream are never touched."""
    raw = req.raw_content or b""
    codings = req.headers.get_all("content-encoding")
    encoding = ", ".join(codings).strip().lower()
    named = redact_values(encoding)  # (as the findings name it: a header's value may hold a key)
    if not raw:
        return raw, []
    if len(codings) > 1:
        return raw, [_undecoded(f"Content-Encoding sent {len(codings)} times ({named!r}): read as sent")]
    if encoding in ("", "identity"):
        if identity_too and len(raw) > max_bytes:
            return None, [_too_large(f"over the {max_bytes} bytes read", raw, len(raw), len(raw))]
        return raw, []
    decoder = make_decoder(encoding)
    if decoder is None:
        return raw, [_undecoded(f"unsupported Content-Encoding {named!r}: read as sent")]
    decoder.feed(raw)
    out = bytearray()
    try:
        for piece in decoder.slices(IN_STEP * 4):
            out += piece
            over = DECODE_BUDGET.exceeded(decoder.decoded, decoder.taken)
            if over is None and decoder.decoded > max_bytes:
                over = f"decoded size over the {max_bytes} bytes read"
            if over is not None:
                return None, [_too_large(over, raw, decoder.decoded, decoder.taken)]
    except DecodeError as e:  # what decodes before bad data is read; nothing decoding: the body as sent
        after = f", after {len(out)} bytes" if out else ""
        return (bytes(out) if out else raw), [_undecoded(f"Content-Encoding {named!r}{after}: {e}")]
    return bytes(out), []


def _undecoded(detail: str) -> Finding:
    return Finding("request_decode_failed", detail[:300])


def _too_large(reason: str, raw: bytes, decoded: int, taken: int) -> Finding:
    sizes = f"{decoded} bytes decoded from {taken} of {len(raw)}"
    return Finding("request_too_large", f"{reason}; {sizes}; sha256 {hashlib.sha256(raw).hexdigest()}")


def start_record(
    flow: http.HTTPFlow,
    dialect: Dialect,
    instance: str,
    parsed: tuple[Any, Finding | None] | None = None,
    content: tuple[bytes | None, list[Finding]] | None = None,
    line: Line | None = None,
) -> tuple[ExchangeRecord, RequestSummary]:
    """A record with the request side filled in, and what the dialect read from the
    request. ``parsed``: the body as detection already parsed it (else it is parsed
    here); ``content``: :func:`request_content` as detection already read it; ``line``:
    the view detection found the dialect in (:func:`detect_by_line`; by default, the path as sent)."""
    req = flow.request
    data, findings = content or request_content(req)
    view, obscured = line or line_views(req)[0]
    path, _, query = req.path.partition("?")  # (the record keeps the path as sent)
    if obscured is not None:
        findings = [obscured, *findings]
    if data is None:  # too large to read: the request line and headers tell what they can
        body_json, finding = UNREADABLE, None
    else:
        body_json, finding = parsed or dialect.parse_request(data, view)
    host = server_name(req.host, flow.client_conn.sni, req.host_header)
    record = ExchangeRecord(
        dialect=dialect.name,
        provider=dialect.provider_for(host),
        started_at=req.timestamp_start,
        server_address=host,
        server_port=req.port,
        http_method=req.method,
        url_path=redact_path(path),
        url_query=redact_query(query) or None,
        http_version=req.http_version,
        client_address=flow.client_conn.peername[0] if flow.client_conn.peername else None,
        proxy_instance=instance,
        api_key_fingerprint=api_key_fingerprint({k.lower(): v for k, v in req.headers.items(multi=True)}, query),
        request_headers=redact_headers(req.headers.items(multi=True)),
        request_body=_unread_body(data) if body_json is UNREADABLE else body_json,
    )
    for found in (*findings, finding):
        if found is not None:
            record.apply(found)
    readable = None if body_json is UNREADABLE else body_json
    summary = dialect.summarize(readable, view)
    summary.user_id = summary.user_id or proxy_user(flow) or redirected_user(flow)
    summary_into_record(record, summary)
    return record, summary


def line_views(req: http.Request) -> list[Line]:
    """The request line and headers as detection reads them, in the order it tries them:
    the path as sent; then, when servers that decode a path route it otherwise
    (:func:`~addon.dialects.canonical_path`), as they route it, and that in lower case
    (ASP.NET Core and IIS route without regard to case), each with the finding
    ``request_path_obscured`` (a client that encodes ``c`` as ``%63`` reaches vLLM's chat
    completions, and a line one dialect claims may be another's as decoded)."""
    path, _, query = req.path.partition("?")
    views: list[Line] = [(RequestView(req.method, path, query, req.headers), None)]
    canonical = canonical_path(path)
    for routed in dict.fromkeys((canonical, canonical.lower())):
        if routed != path:
            shown, as_routed = redact_path(path)[:300], redact_path(routed)[:300]  # (a ;jsessionid= is a credential)
            detail = f"the path as sent, {shown!r}, read as servers that decode it route it: {as_routed!r}"
            views.append(
                (RequestView(req.method, routed, query, req.headers), Finding("request_path_obscured", detail))
            )
    return views


def detect_by_line[Found](
    lines: list[Line], detect: Callable[[RequestView], Found | None]
) -> tuple[Found, Line] | None:
    """What ``detect`` finds in the first of ``lines`` (a request's :func:`line_views`) it
    finds anything in, and that view (with its finding); None when it finds nothing in any."""
    for line in lines:
        if (found := detect(line[0])) is not None:
            return found, line
    return None


def claimed_by_line(request: RequestView) -> bool:
    """Whether any dialect recognises this request by its line and headers: only then can
    :func:`~addon.dialects.registry.detect_request` claim it, and read its body."""
    return any(dialect.matches(request) for dialect in REGISTRY)


def _unread_body(data: bytes | None) -> str | None:
    """What the record keeps of a body no reader took: its text, or nothing when it was
    too large to read (the finding says its size and hash)."""
    return None if data is None else data.decode("utf-8", "replace")


def response_into_record(record: ExchangeRecord, resp: http.Response) -> None:
    """The response's status and headers, and whether its body is streamed."""
    record.http_status = resp.status_code
    record.response_headers = redact_headers(resp.headers.items(multi=True))
    event_stream = media_type(resp.headers.get("content-type", ""))[0] == "text/event-stream"
    # Gemini without alt=sse streams a JSON array: streamed too, though not an event stream.
    record.streamed = event_stream or (bool(record.stream_requested) and 200 <= resp.status_code < 300)


def proxy_user(flow: http.HTTPFlow) -> str | None:
    """The user mitmproxy's ``proxyauth`` authenticated, for exchanges whose request names none.

    proxyauth leaves ``(user, password)`` in ``flow.metadata["proxyauth"]``, on every
    request of a connection it authenticated (CONNECT tunnels too); only the name is used.
    """
    auth = flow.metadata.get("proxyauth")
    if isinstance(auth, tuple | list) and auth and isinstance(auth[0], str) and auth[0]:
        return auth[0]
    return None


def redirected_user(flow: http.HTTPFlow) -> str | None:
    """The local user whose connection transparent capture redirected here, for
    exchanges whose request names none (:mod:`addon.local_user`)."""
    conn = flow.client_conn
    if not is_transparent(conn.proxy_mode):
        return None
    return _connection_user(conn.id, conn.peername, flow.server_conn.address)


@functools.lru_cache(maxsize=4096)
def _connection_user(connection_id: str, peer: tuple | None, destination: tuple | None) -> str | None:
    """:func:`local_user`, once per client connection (its owner never changes): the
    ``/proc`` tables are read on the event loop, so not again for every request an
    HTTP/2 or keep-alive connection carries."""
    return local_user(peer, destination)


def abort_side(flow: http.HTTPFlow) -> str:
    """Who cut an exchange that ended in mitmproxy's ``error`` hook.

    mitmproxy's error messages do not say which side failed on HTTP/2 ("stream reset by
    client" is used for resets from either peer), so the kind of protocol error mitmproxy
    handled decides (:func:`addon.mitm.early_end.install_error_side`). Without it (errors
    mitmproxy raises outside that path), the connection states decide: a peer whose
    socket is no longer readable hung up; then the message.
    """
    side = early_end.error_side(flow)
    if side is not None:
        return OUTCOME_UPSTREAM_ABORTED if side == "upstream" else OUTCOME_CLIENT_ABORTED
    message = flow.error.msg if flow.error else ""
    server_gone = flow.server_conn is not None and not (flow.server_conn.state & ConnectionState.CAN_READ)
    client_gone = not (flow.client_conn.state & ConnectionState.CAN_READ)
    if server_gone and not client_gone:
        return OUTCOME_UPSTREAM_ABORTED
    if client_gone or "Client disconnected" in message:
        return OUTCOME_CLIENT_ABORTED
    if "reset" in message:
        return OUTCOME_CLIENT_ABORTED if "CANCEL" in message else OUTCOME_UPSTREAM_ABORTED
    return OUTCOME_UPSTREAM_ABORTED


def client_had_everything(record: ExchangeRecord) -> bool:
    """The dialect's terminal event was read and every upstream byte was passed on: a
    client that closes now (the openai SDK does, right after ``[DONE]``) lost nothing."""
    return (
        record.terminal_seen
        and record.status != Status.BLOCKED
        and record.bytes_to_client >= record.bytes_from_upstream
    )


def refused_by_mitmproxy(message: str) -> bool:
    """mitmproxy itself refused the upstream's response (request-smuggling checks such as
    Content-Length together with chunked, or its ``body_size_limit``)."""
    return ("from server, refusing" in message) or "body exceeds mitmproxy's body_size_limit" in message
