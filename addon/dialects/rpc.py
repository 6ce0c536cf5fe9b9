"""What the Connect and gRPC dialects share (Cursor, Windsurf, any other service).

Which protocol a request speaks is in its content type (connect.md §6):

==============================================  ================  =============================
content type                                    protocol          how the status comes
==============================================  ================  =============================
``application/connect+proto`` / ``+json``       ``connect``       EndStreamResponse (flag 0x02)
``application/proto`` / ``application/json``    ``connect_unary`` HTTP status, error JSON body
(with ``Connect-Protocol-Version: 1``)
``application/grpc`` / ``+proto`` / ``+json``   ``grpc``          HTTP/2 trailers
``application/grpc-web`` / ``+proto`` / …       ``grpc_web``      trailer frame (flag 0x80)
``application/grpc-web-text`` (base64)          ``grpc_web_text`` trailer frame (flag 0x80)
==============================================  ================  =============================

Streams are read by the envelope framing (:mod:`addon.framing.envelope`), whose frames
:class:`RpcNormalizer` dispatches: data messages to the dialect's :meth:`~RpcNormalizer.
on_message`, the end (Connect's EndStreamResponse, gRPC-Web's trailer frame, or gRPC's
HTTP/2 trailers, which the proxy adapter hands over as a ``trailers`` frame) to a status:
:class:`StreamEnd` on success, :class:`StreamError` with the Connect code name and the
message otherwise. A unary body is one message, read whole.

A content filter ends a stream with ``permission_denied`` (gRPC status 7) and the rule
and reason in the message, in the stream's own protocol: a Connect EndStreamResponse,
gRPC trailers (:meth:`~addon.dialects.Normalizer.termination_trailers`), a gRPC-Web
trailer frame. A request blocked before it went upstream gets the same, as a whole
answer (:func:`blocked_answer`): a Connect stream holding only the EndStreamResponse, a
gRPC trailers-only response, a gRPC-Web trailer frame, or for unary Connect HTTP 403 and
``{"code": "permission_denied", "message": …}``; connect-es, connect-python, grpcio and
grpc-web clients all raise their usual error with that code.

Credentials travel inside these bodies (Cursor's ``ModelDetails.api_key``, Windsurf's
``ClientMetadata.api_key``, JWTs): what the dialects keep of a request replaces them by
their fingerprint (:func:`credential`, :func:`clean`), as headers are.
"""

from __future__ import annotations

import re
from abc import abstractmethod
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from addon import json_read
from addon.dialects import (
    BlockedResponse,
    Dialect,
    Normalizer,
    Reading,
    RequestSummary,
    RequestView,
    costly_finding,
    error_body_events,
    json_strings,
    media_type,
    read_json_object,
)
from addon.dialects.blocking import block_message
from addon.dialects.protowire import (
    LEN,
    MAX_FIELDS,
    MESSAGE_BUDGET,
    TOO_MANY_FIELDS,
    Budget,
    Message,
    budget,
    encode_field,
    encode_varint,
    field_text,
    messages_at,
    parse,
    strings,
)
from addon.events import Event, Finding, ShownText, StreamEnd, StreamError, TextDelta, ToolCallDelta, TurnEnd
from addon.findings import UNREAD_MESSAGE
from addon.framing import FRAMINGS, Frame, Writer
from addon.framing.envelope import (
    CONNECT_HTTP_STATUS,
    CONNECT_WRITER,
    GRPC_WEB_TEXT_WRITER,
    GRPC_WEB_WRITER,
    GRPC_WRITER,
    Envelope,
    RpcStatus,
    b64decode,
    code_name,
    code_number,
    parse_header_block,
    pct_decode,
)
from addon.redact import holds_secret, is_credential_name, redacted

CONNECT, CONNECT_UNARY, GRPC, GRPC_WEB = "connect", "connect_unary", "grpc", "grpc_web"
GRPC_WEB_TEXT = "grpc_web_text"
STREAM_PROTOCOLS = frozenset({CONNECT, GRPC, GRPC_WEB, GRPC_WEB_TEXT})  # each is its framing's name
WRITERS: dict[str, Writer] = {
    CONNECT: CONNECT_WRITER,
    GRPC: GRPC_WRITER,
    GRPC_WEB: GRPC_WEB_WRITER,
    GRPC_WEB_TEXT: GRPC_WEB_TEXT_WRITER,
}
#: The code a content filter's block carries (gRPC status 7).
BLOCK_CODE = "permission_denied"
# "/" [routing-prefix "/"] package "." Service "/" Method (connect.md §1)
_RPC_PATH = re.compile(r"/(?P<service>[A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)+)/(?P<method>[A-Za-z_]\w*)")
# What one request body may cost to read (its messages are the record's request_body).
MAX_REQUEST_MESSAGES = 1024
MAX_REQUEST_MESSAGE_BYTES = 8 * 1024 * 1024
#: What a reader reads of one message's strings nobody mapped (for the filters): how
#: many, and the characters of each. A message is at most MAX_REQUEST_MESSAGE_BYTES, so
#: a string is never cut (an open file of several MiB is one string), and the count
#: bounds the work, not an ordinary message; the record keeps far less of them
#: (UNMAPPED_STRINGS of UNMAPPED_CHARS).
READ_STRINGS = 4096
READ_CHARS = MAX_REQUEST_MESSAGE_BYTES
#: Strings a Windsurf JSON request reading reads of one message: those requests carry
#: the editor's context (open files, code blocks, rules: thousands of strings).
CONTEXT_STRINGS = 100_000
#: JSON values (objects, arrays, numbers, strings) a reading of one message's strings
#: visits at most: a message read as it passes is read on the event loop, and a SignalR
#: message of a million empty objects (4 MB) held no string and took 1.03 s to read (now
#: 0.13 s, most of it the JSON parse). Far above a conversation's (a few thousand); past
#: them the filters cannot read it whole.
MESSAGE_VALUES = 100_000
#: A Connect JSON response message only lenient readers take (the client's SDK reads it).
LENIENT_MESSAGE = Finding("lenient_json", "a Connect JSON message: JSON only lenient readers take (the SDKs' do)")
#: An EndStreamResponse only lenient readers take (connect-es's JSON.parse takes a lone surrogate escape).
LENIENT_END = Finding("lenient_json", "the EndStreamResponse: JSON only lenient readers take (the SDKs' do)")


def rpc_name(path: str) -> str | None:
    """``pkg.Service/Method`` of a Connect or gRPC path (a routing prefix dropped), else None."""
    m = _RPC_PATH.search(path)
    if m is None or m.end() != len(path):
        return None
    return f"{m['service']}/{m['method']}"


def protocol_of(headers: Mapping[str, str]) -> tuple[str, str] | None:
    """``(protocol, codec)`` of a request by its content type, None if it speaks neither.

    Unary Connect's ``application/<codec>`` counts only with ``Connect-Protocol-Version``,
    which tells it from any other JSON or protobuf API.
    """
    kind = media_type(headers.get("content-type", ""))[0]
    family, plus, codec = kind.partition("+")
    if family == "application/connect":
        return CONNECT, codec or "proto"
    if family == "application/grpc":
        return GRPC, codec or "proto"
    if family == "application/grpc-web":
        return GRPC_WEB, codec or "proto"
    if family == "application/grpc-web-text":
        return GRPC_WEB_TEXT, codec or "proto"
    if headers.get("connect-protocol-version") and not plus and kind.startswith("application/"):
        return CONNECT_UNARY, kind.removeprefix("application/")
    return None


@dataclass(slots=True)
class RpcSummary(RequestSummary):
    """The request summary, plus what the response is read and ended by."""

    protocol: str = CONNECT
    codec: str = "proto"
    rpc: str = ""


def summary_of(body: Any, request: RequestView) -> RpcSummary:
    """What every Connect/gRPC request says: protocol, codec, method; model and
    conversation from the dialect's reading of the body (``parse_request``'s doc)."""
    protocol, codec = protocol_of(request.headers) or (CONNECT_UNARY, "proto")
    doc = body if isinstance(body, dict) else {}
    model, conversation = doc.get("model"), doc.get("conversation_id")
    return RpcSummary(
        model=model if isinstance(model, str) else None,
        session_id=conversation if isinstance(conversation, str) else None,
        stream=protocol in STREAM_PROTOCOLS,
        protocol=protocol,
        codec=codec,
        rpc=rpc_name(request.path) or "",
    )


def request_messages(content: bytes, request: RequestView) -> tuple[list[bytes], list[Finding]]:
    """The messages of a whole request body: its envelopes' payloads (decompressed), or a
    unary body as one message. Bounded: at most :data:`MAX_REQUEST_MESSAGES` messages of
    :data:`MAX_REQUEST_MESSAGE_BYTES`."""
    protocol = (protocol_of(request.headers) or (CONNECT_UNARY, ""))[0]
    if protocol == CONNECT_UNARY:
        return ([content] if content else []), []
    reader = FRAMINGS[protocol].reader(MAX_REQUEST_MESSAGE_BYTES, 0, request.headers)
    frames = reader.feed(content)
    reader.end()
    findings = [Finding(code, detail) for code, detail in reader.findings]
    if reader.pending_event:
        findings.append(Finding("envelope_incomplete", "the request body ended inside an envelope"))
    payloads = [f.raw for f in frames if isinstance(f, Envelope) and f.event == "message"]
    if len(payloads) > MAX_REQUEST_MESSAGES:
        findings.append(Finding("envelope_too_large", f"{len(payloads)} request messages; the first read"))
        payloads = payloads[:MAX_REQUEST_MESSAGES]
    return payloads, findings


# -- credentials ------------------------------------------------------------------------------


def credential(value: str) -> str:
    """A credential found in a body, as the record keeps it: its fingerprint."""
    return redacted(value)


def own_credential(doc: Reading, number: int, value: str) -> str:
    """The client's own credential in field ``number`` of a message the dialect maps
    (Cursor's ``ModelDetails.api_key``, Windsurf's metadata): its fingerprint, for the
    record; the filters do not read that field (:func:`payload_text`), as they read no
    header."""
    kept = credential(value)
    doc.credentials.append((encode_field(number, value), kept))
    return kept


_CONTROL_BYTES = bytes((*range(9), 11, 12, *range(14, 32), 127))
_CONTROLS = bytes.maketrans(_CONTROL_BYTES, b"\n" * len(_CONTROL_BYTES))


def unread_text(payload: bytes, events: list[Event]) -> str | None:
    """What of a message's bytes its events did not carry to the filters already, as text
    (:func:`payload_text`): each string field whose value an event carries is blanked,
    so that a match in the answer's text is not reported twice. Only a whole field is
    blanked (its tag, length and value found together), so that a carried piece cannot
    blank the same letters inside another field's text. None when nothing that could be
    a word is left (a text delta's message).

    The searches for the fields are bounded (:data:`_BLANK_SEARCH` times the message's
    size in all): carried strings in an order no search expects cost no more; what is
    not blanked then is only checked twice."""
    blanker = _Blanker(payload)
    for ev in events:
        for carried in _carried(ev):  # (a string whole, else each line of a joined text)
            if not blanker.blank(carried) and "\n" in carried:
                for piece in carried.split("\n"):
                    if piece:
                        blanker.blank(piece)
    text = payload_text(bytes(blanker.data), [])
    return text if _WORDLIKE(text) else None


#: How many times its size the searches of :func:`unread_text` may read of a message.
_BLANK_SEARCH = 4


def unread_strings(payload: bytes, events: list[Event], cut: list[str]) -> str | None:
    """What of a JSON message's strings its events did not carry to the filters already
    (each carried string taken out once, whole), one per line; None if none is left.
    ``cut`` gets what the reading's bounds left out (:data:`READ_STRINGS`,
    :data:`MESSAGE_VALUES`)."""
    costly = json_read.too_costly(payload)
    if costly is not None:
        cut.append(f"the message, not read: {costly}")
        return None
    doc, _ = read_json_object(payload)
    if doc is None:
        return None
    carried = Counter(piece for ev in events for text in _carried(ev) for piece in (text, *text.split("\n")))
    left = []
    for found in json_strings(doc, limit=READ_STRINGS, cut=cut, max_values=MESSAGE_VALUES):
        if carried[found] > 0:
            carried[found] -= 1
        else:
            left.append(found)
    return "\n".join(left) if left else None


class _Blanker:
    """One message's bytes, whole string fields blanked in them one by one; the searches
    read at most :data:`_BLANK_SEARCH` times the message's size in all."""

    __slots__ = ("after", "data", "left")

    def __init__(self, payload: bytes) -> None:
        self.data = bytearray(payload)
        self.left = _BLANK_SEARCH * len(payload) + 4096  # bytes the searches may still read
        self.after = 0  # where the field blanked last ends

    def blank(self, text: str) -> bool:
        """Blank the first length-delimited field whose value is ``text``, looked for after
        the last one blanked, then from the start (events carry fields in order); whether
        one was (never, once the searches' bytes are spent)."""
        data, value = self.data, text.encode("utf-8", "replace")
        framed = encode_varint(len(value)) + value
        for start in (self.after, 0) if self.after else (0,):
            if self.left <= 0:
                return False
            at = data.find(framed, start)
            while at >= 0:
                self.left -= at - start
                tag = data[at - 1] if at >= 1 else 0x80
                long_tag = at >= 2 and data[at - 2] & 0x80 and data[at - 2] & 7 == LEN and tag < 0x80
                if (tag < 0x80 and tag & 7 == LEN) or long_tag:
                    data[at : at + len(framed)] = bytes(len(framed))
                    self.after = at + len(framed)
                    return True
                if self.left <= 0:
                    return False
                start, at = at + 1, data.find(framed, at + 1)
            self.left -= len(data) - start
        return False


def _carried(ev: Event) -> tuple[str, ...]:
    """The strings an event hands the filters (as sent: the record may keep them otherwise)."""
    if isinstance(ev, TextDelta):
        return (ev.as_sent,)
    if isinstance(ev, ShownText):
        return (ev.text,)
    if isinstance(ev, ToolCallDelta):
        return tuple(s for s in (ev.name, ev.arguments_sent) if s)
    if isinstance(ev, StreamError):
        return (ev.message,) if ev.message else ()
    return ()


_WORDLIKE = re.compile(r"\S\S").search


def payload_text(payload: bytes, credentials: list[tuple[bytes, str]]) -> str:
    """A protobuf message's bytes as text, for the request filters: every string a peer
    may read in it, whatever holds it (a field nobody maps, a mapped message's other
    fields, a string that also parses as a message, one with a byte that is not UTF-8, a
    group, a message nested past a reader's bounds). Every string field is its UTF-8
    bytes as they are, so the bytes read as text (undecodable bytes as U+FFFD) hold them
    all; the tags and lengths between them become line breaks, so that no two fields
    read as one word. The client's own ``credentials`` are taken out, each whole field
    (tag, length and value) where it stands, once: the client picks the value, so taking
    out every occurrence of it would let a key named like a word take that word out of
    the prompt (a key of ``a`` took every ``a``). A field whose bytes occur twice is left
    in: the filters read the key, which is the client's own doing."""
    for field, kept in credentials:
        if payload.count(field) == 1:
            payload = payload.replace(field, b"\n" + kept.encode() + b"\n")
    return payload.translate(_CONTROLS).decode("utf-8", "replace")  # (control bytes are ASCII: never in a character)


def clean(value: str) -> str:
    """A string kept from a field nobody mapped: itself, or its fingerprint when it holds
    a credential the secrets detector knows (a JWT, an API key)."""
    return redacted(value) if holds_secret(value) else value


def clean_text(value: str | None) -> str | None:
    """:func:`clean` of a string that may be missing (an id, a model name: kept as sent
    unless it holds a credential)."""
    return clean(value) if value is not None else None


def clean_json(value: Any, depth: int = 0, max_depth: int = 32, texts: bool = True) -> Any:
    """A JSON body (Connect's JSON codec) with credentials fingerprinted: values of keys
    named like credentials (``apiKey``, ``userJwt``: the client's own, as a header's),
    and, unless ``texts`` is False, other strings and keys holding a known secret (a map
    keyed by API key; a reader of the text the filters read fingerprints those only in
    what the record keeps: :func:`kept_text`). Bounded: what lies deeper than ``max_depth`` levels is None. A
    reader of its strings passes one level more than :func:`~addon.dialects.json_strings`
    reads, so that the bound that cuts them is that one's, which says so
    (:data:`STRINGS_DEPTH`)."""
    if depth > max_depth:
        return None
    if isinstance(value, dict):
        return {
            (clean(k) if texts and isinstance(k, str) else k): credential(v)
            if isinstance(v, str) and _credential_value(k, v, texts)
            else clean_json(v, depth + 1, max_depth, texts)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [clean_json(v, depth + 1, max_depth, texts) for v in value]
    return clean(value) if texts and isinstance(value, str) else value


def own_key_value(key: Any, value: str) -> str:
    """What a reader of strings reads of ``value`` under ``key``: its fingerprint when it
    is the client's own credential (:func:`clean_json` with ``texts`` False, one value at
    a time: for :func:`~addon.dialects.json_strings`' ``value_of``)."""
    return credential(value) if _credential_value(key, value, False) else value


def _credential_value(key: Any, value: str, texts: bool) -> bool:
    """Whether ``value`` is the client's own credential: under a key named like one
    (``apiKey``, ``token``). For the record, any such value; for the filters' reading
    (``texts`` False) only a value that reads as one token: a name as broad as the
    headers' rules (``author``, ``monkey``, ``private``) must not hide a prompt."""
    return isinstance(key, str) and is_credential_name(key) and (texts or (len(value) < 4096 and not _SPACE(value)))


_SPACE = re.compile(r"\s").search


#: How deep :func:`clean_json` goes for a reader of strings: one level past
#: :func:`~addon.dialects.json_strings`'s bound (32), which reports what it cuts.
STRINGS_DEPTH = 33


def over_budget(what: str, reading: Budget) -> Finding:
    """The finding of a protobuf message whose reading ran out of its field budget: in
    a message nested in it, ``protobuf_budget`` (the filters read its bytes); in the
    message itself, ``protobuf_invalid`` (what its fields hold, decoded, was not read:
    the failure policy decides on a request)."""
    if reading.top_cut:
        return Finding("protobuf_invalid", f"{what}: over the {MESSAGE_BUDGET} fields its reading may parse")
    return Finding("protobuf_budget", f"{what}: past the {MESSAGE_BUDGET} fields its reading may parse")


def unread_finding(cut: list[str], what: str) -> Finding:
    """The finding ``strings_unread``: ``what`` held strings past a reader's bounds
    (``cut``: which, from :func:`~addon.dialects.json_strings`), which no filter checked."""
    return Finding("strings_unread", f"{what}: {'; '.join(cut)} not read")


# -- statuses ---------------------------------------------------------------------------------


def google_rpc_status(number: int, message: str, details: tuple[tuple[str, bytes, Any], ...]) -> bytes:
    """``google.rpc.Status{1 code, 2 message, 3 repeated Any{1 type_url, 2 value}}``, for
    ``grpc-status-details-bin``."""
    body = encode_field(1, number) + encode_field(2, message)
    for kind, value, _ in details:
        body += encode_field(3, encode_field(1, f"type.googleapis.com/{kind}") + encode_field(2, value))
    return body


def block_status(
    rule_id: str, reason: str, details: tuple[tuple[str, bytes, Mapping[str, Any] | None], ...] = ()
) -> RpcStatus:
    """The status a content filter's block ends an exchange with."""
    message = block_message(rule_id, reason)
    return RpcStatus(BLOCK_CODE, message, details, google_rpc_status(code_number(BLOCK_CODE), message, details))


def blocked_answer(summary: RequestSummary, status: RpcStatus) -> BlockedResponse:
    """The whole answer to a blocked request, in its protocol (see the module docstring)."""
    protocol = summary.protocol if isinstance(summary, RpcSummary) else CONNECT
    codec = summary.codec if isinstance(summary, RpcSummary) else "proto"
    if protocol == CONNECT_UNARY:
        body = orjson.dumps({"code": status.code, "message": status.message})
        return BlockedResponse(CONNECT_HTTP_STATUS.get(status.code, 500), [("content-type", "application/json")], body)
    if protocol == GRPC:  # trailers-only: the status in the one HEADERS block
        headers = [("content-type", f"application/grpc+{codec}"), *GRPC_WRITER.trailers([status])]
        return BlockedResponse(200, headers, b"")
    kind = {GRPC_WEB: "application/grpc-web", GRPC_WEB_TEXT: "application/grpc-web-text"}.get(protocol)
    writer = WRITERS[protocol] if kind else CONNECT_WRITER
    content_type = f"{kind or 'application/connect'}+{codec}"
    return BlockedResponse(200, [("content-type", content_type)], writer.encode([status], False))


# -- the normalizer ---------------------------------------------------------------------------


class RpcNormalizer(Normalizer):
    """Reads the frames of one Connect or gRPC response; dialects read its messages."""

    filter_stop_reason = BLOCK_CODE
    #: The answer's text is read (False: a method that carries credentials, a login).
    reads_text = True
    #: Its JSON messages are read by field names, which may leave strings unread (their
    #: other strings are then checked beside the text). False: every string is read.
    maps_json = False

    def __init__(self, summary: RequestSummary) -> None:
        rpc = summary if isinstance(summary, RpcSummary) else RpcSummary()
        self.protocol, self.codec, self.rpc = rpc.protocol, rpc.codec, rpc.rpc
        self.framing = self.protocol if self.protocol in STREAM_PROTOCOLS else "whole"
        self.writer = WRITERS.get(self.protocol, CONNECT_WRITER)
        self.ended = False
        self.messages = 0  # data messages read
        self.message_bytes = 0

    @abstractmethod
    def on_message(self, raw: bytes) -> list[Event]:
        """Common events for one data message (its bytes, decompressed)."""

    def describe_details(self, details: list[tuple[str, bytes]]) -> str | None:
        """A dialect's reading of an error's details (``(type, serialized message)``):
        text added to the error message; None when it knows none of them."""
        return None

    def status_frame(self, rule_id: str, reason: str) -> RpcStatus:
        """The status a content filter ends this stream with (a dialect may add details)."""
        return block_status(rule_id, reason)

    def on_event(self, event: Frame) -> list[Event]:
        out: list[Event] = []
        if self.ended:
            out.append(Finding("event_after_stream_end", f"{event.event!r} after the end of the stream"))
        if event.event == "end_stream":
            out.extend(self._end_stream(event.data))
        elif event.event == "trailers":
            out.extend(self._trailers(event.data))
        else:
            raw = getattr(event, "raw", None)
            payload = raw if isinstance(raw, bytes) else event.data.encode()
            self.messages += 1
            self.message_bytes += len(payload)
            if payload:  # a zero-length message is a keepalive
                out.extend(self._message(payload))
        return out

    def _message(self, payload: bytes) -> list[Event]:
        """One data message's events; and what of it they did not carry, for the output
        filters (checked beside the answer's text, not recorded): a protobuf message's
        bytes as text (:func:`unread_text`: every string of it, whatever field holds it),
        a JSON message's other strings (:func:`unread_strings`: a key a release moved)."""
        with budget() as reading:
            out = self.on_message(payload)
        at = next((i for i, ev in enumerate(out) if type(ev) is TurnEnd), len(out))  # (before a turn's end: its own)
        if reading.spent:
            out.insert(at, over_budget("a response message", reading))
            at += 1
        if self.reads_text and (self.codec != "json" or self.maps_json):
            cut: list[str] = []
            rest = unread_strings(payload, out, cut) if self.codec == "json" else unread_text(payload, out)
            if cut:  # (the filters cannot read all of it: the failure policy decides)
                out.insert(at, unread_finding(cut, "a response message"))
                at += 1
            if rest is not None:
                out.insert(at, ShownText(rest, kind="payload"))
        return out

    def on_end(self, cut: bool = False) -> list[Event]:
        if self.ended:
            return []
        what = {GRPC: "gRPC status", GRPC_WEB: "trailer frame", GRPC_WEB_TEXT: "trailer frame"}.get(self.protocol)
        what = what or "EndStreamResponse"
        return [Finding("missing_stream_end", f"the stream ended without its {what}")]

    def on_body(self, body: bytes, http_status: int) -> list[Event]:
        """A unary answer (or a stream's error answered with an HTTP status): an error
        body is Connect's ``{"code", "message"}``; a successful one, one message."""
        if http_status >= 400:
            return error_body_events(body)
        out = self._message(body) if body else []
        self.ended = True
        return [*out, StreamEnd()]

    def ending(self, rule_id: str, reason: str) -> list[Frame]:
        return [] if self.ended else [self.status_frame(rule_id, reason)]

    # -- the end of a stream ----------------------------------------------------------------

    def _end_stream(self, data: str) -> list[Event]:
        """Connect's EndStreamResponse: ``{}`` (or metadata only) is success. JSON only
        lenient readers take is read (the clients' readers take it), with ``lenient_json``."""
        self.ended = True
        if (costly := costly_finding(data, "the EndStreamResponse")) is not None:
            return [costly, StreamEnd()]
        doc, lenient = read_json_object(data)
        if doc is None:
            return [Finding("end_stream_invalid", "the EndStreamResponse is not one JSON object"), StreamEnd()]
        out: list[Event] = [LENIENT_END] if lenient else []
        error = doc.get("error")
        if error is None:
            return [*out, StreamEnd()]
        if not isinstance(error, dict) or not isinstance(error.get("code"), str):
            out += [Finding("end_stream_invalid", "an error without a code"), StreamError("unknown", None)]
            return [*out, StreamEnd()]
        message = error.get("message") if isinstance(error.get("message"), str) else None
        details = []
        for item in error.get("details") or []:
            if isinstance(item, dict) and isinstance(item.get("type"), str) and isinstance(item.get("value"), str):
                value = b64decode(item["value"])
                if value is not None:
                    details.append((item["type"], value))
        return [*out, StreamError(error["code"], self._with_details(message, details)), StreamEnd()]

    def _trailers(self, data: str) -> list[Event]:
        """gRPC's status: ``grpc-status`` 0 is success; details from ``grpc-status-details-bin``."""
        self.ended = True
        block = parse_header_block(data)
        status = block.get("grpc-status", "")
        if not status.isdigit():
            problem = f"grpc-status {status!r}" if status else "no grpc-status"
            return [Finding("end_stream_invalid", problem), StreamError("unknown", None), StreamEnd()]
        if int(status) == 0:
            return [StreamEnd()]
        message = pct_decode(block["grpc-message"]) if "grpc-message" in block else None
        details = []
        raw = b64decode(block.get("grpc-status-details-bin", "")) or b""
        status_msg = parse(raw)
        message = message or field_text(status_msg, 2)
        for any_msg in messages_at(status_msg, 3):
            url = field_text(any_msg, 1) or ""
            value = next((v for v in any_msg.values(2) if isinstance(v, bytes)), b"")
            details.append((url.rpartition("/")[2], value))
        return [StreamError(code_name(int(status)), self._with_details(message, details)), StreamEnd()]

    def _with_details(self, message: str | None, details: list[tuple[str, bytes]]) -> str | None:
        described = self.describe_details(details) if details else None
        if described is None:
            return message
        if not message or message == "Error" or message in described:  # (Cursor's message is always "Error")
            return described
        return f"{message}: {described}"


class RpcDialect(Dialect):
    """Base of the Connect/gRPC dialects: bodies are protobuf (or Connect's JSON), read by
    the dialect itself (:meth:`read_message`, one request message at a time, into the
    request's reading); the summary and the blocked answers are the protocol's."""

    json_requests = False

    @abstractmethod
    def read_message(self, payload: bytes, request: RequestView, doc: Reading, findings: list[Finding]) -> None:
        """Read one request message into ``doc`` (see :func:`new_doc`), problems into ``findings``."""

    def streams_request(self, request: RequestView) -> bool:
        """Every enveloped request (all but unary Connect): a client or bidirectional
        stream cannot be told from a server stream by its path, and a full-duplex client
        waits for answers before it sends (or ends) the rest of its body."""
        protocol = protocol_of(request.headers)
        return protocol is not None and protocol[0] != CONNECT_UNARY

    def parse_request(self, content: bytes, request: RequestView) -> tuple[Any, Finding | None]:
        payloads, findings = request_messages(content, request)
        doc = new_doc(request)
        for payload in payloads:
            self._read(payload, request, doc, findings)
        return finished_doc(doc, len(payloads), sum(map(len, payloads))), first_finding(findings)

    def parse_request_message(self, payload: bytes, request: RequestView) -> tuple[dict[str, Any], list[Finding]]:
        doc, findings = new_doc(request), list[Finding]()
        self._read(payload, request, doc, findings)
        return finished_doc(doc, 1, len(payload)), findings

    def _read(self, payload: bytes, request: RequestView, doc: Reading, findings: list[Finding]) -> None:
        """One request message: the dialect's reading, and for a protobuf message its bytes
        as text (:func:`payload_text`) for the filters, whatever the reading could map."""
        with budget() as reading:
            self.read_message(payload, request, doc, findings)
        if reading.spent:
            findings.append(over_budget("a request message", reading))
        if (protocol_of(request.headers) or ("", "proto"))[1] != "json" and self.reads_text(request):
            doc.unkept.append(payload_text(payload, doc.credentials))

    def reads_text(self, request: RequestView) -> bool:
        """Whether this request's text is read at all (False: a method that carries the
        client's credentials, a login: its metadata alone is kept)."""
        return True

    def accepts_body(self, body: Any, request: RequestView) -> bool:
        return True  # the request line decides; the body is not JSON

    def summarize(self, body: Any, request: RequestView) -> RequestSummary:
        return summary_of(body, request)

    def blocked_response(
        self, summary: RequestSummary, request_view: RequestView, rule_id: str, reason: str, streaming: bool
    ) -> BlockedResponse:
        normalizer = self.normalizer(summary)
        status = normalizer.status_frame(rule_id, reason) if isinstance(normalizer, RpcNormalizer) else None
        return blocked_answer(summary, status or block_status(rule_id, reason))


# -- what a dialect could not map -------------------------------------------------------------

#: Strings a finding or a request reading keeps of fields nobody mapped, and their length.
UNMAPPED_STRINGS = 64
UNMAPPED_CHARS = 2000
_FINDING_STRINGS, _FINDING_CHARS = 16, 200


def unmapped(kind: str, msg: Message, known: frozenset[int]) -> list[Event]:
    """Findings for one decoded message: ``protobuf_invalid`` when its wire format broke
    off, ``protobuf_unmapped`` when it has fields ``known`` does not list and those hold
    text, or when it has no known field at all (the schema moved: the text went
    somewhere else). The strings are kept, cut, credentials fingerprinted."""
    out: list[Event] = []
    if (problem := msg.cut_short()) is not None:
        out.append(Finding("protobuf_invalid", f"{kind}: {problem}"))
    numbers = msg.numbers()
    unknown = numbers - known
    if not unknown:
        return out
    cut: list[str] = []
    shown = strings(msg, READ_STRINGS, READ_CHARS, skip=known, cut=cut)
    found = [clean(s)[:_FINDING_CHARS] for s in shown[:_FINDING_STRINGS]]
    if found or not numbers & known:
        detail = f"{kind}: fields {sorted(unknown)[:32]}; strings {orjson.dumps(found).decode()}"
        out.append(Finding("protobuf_unmapped", detail))
    if found:
        # Text a client may render from a field that moved: the output filters check it
        # (ShownText: checked, not recorded as the answer), so a move is no way past them;
        # all of it, and what the bounds leave out is said (strings_unread).
        out.append(ShownText("\n".join(shown), kind="unmapped"))
        if cut:
            out.append(unread_finding(cut, f"{kind}'s fields nobody mapped"))
    return out


def unmapped_strings(msg: Message, mapped: frozenset[int]) -> list[str]:
    """The first strings of a request message's fields the dialect did not map, as sent
    (context the model reads: open files, rules; moved fields), for the record
    (:func:`add_strings`). The filters read them all in the message's bytes
    (:func:`payload_text`), so the walk stops at what the record keeps: a request of
    thousands of strings costs no more than one of 64."""
    return strings(msg, UNMAPPED_STRINGS, READ_CHARS, skip=mapped)


# -- request readings -------------------------------------------------------------------------


def new_doc(request: RequestView) -> Reading:
    """The start of a request's reading: which method, in which protocol, its conversation
    in the shared ``messages`` shape (``{"role", "content"}``, as the request filters and
    transcripts read any API's)."""
    protocol = (protocol_of(request.headers) or (CONNECT_UNARY, ""))[0]
    return Reading(rpc=rpc_name(request.path) or request.path, protocol=protocol, messages=[])


def add_message(doc: dict[str, Any], role: str, content: str | None) -> None:
    """One message of the conversation (empty text is none)."""
    if content:
        doc["messages"].append({"role": role, "content": content})


def add_strings(doc: Reading, found: list[str]) -> None:
    """Strings of unmapped fields (as sent): the record keeps :data:`UNMAPPED_STRINGS` of
    them over the whole request, each cut at :data:`UNMAPPED_CHARS`, credentials
    fingerprinted; the request filters read every one as sent (:attr:`Reading.unkept`
    gets each the record does not keep so)."""
    if not found:
        return
    kept = doc.setdefault("unmapped_strings", [])
    for value in found:
        recorded = clean(value)[:UNMAPPED_CHARS] if len(kept) < UNMAPPED_STRINGS else None
        if recorded is not None:
            kept.append(recorded)
        if recorded != value:
            doc.unkept.append(value)


def kept_text(doc: Reading, found: list[str]) -> str:
    """The strings of a message nobody mapped as the record keeps them, one per line,
    credentials fingerprinted; the filters read each one it does not keep as sent
    (:attr:`Reading.unkept`)."""
    kept, sent = kept_strings(found)
    if sent is not None:
        doc.unkept.append(sent)
    return kept


def message_strings(
    payload: bytes,
    codec: str,
    cut: list[str] | None = None,
    value_of: Callable[[Any, str], str] = own_key_value,
    keys: list[str] | None = None,
) -> tuple[list[str], bool]:
    """The strings of one message (bounded), as sent but for the values of keys named
    like credentials (the client's own: fingerprinted; what a JSON message's value is
    read as is ``value_of``'s); and whether its JSON is JSON only
    to lenient readers (:func:`addon.json_read.loads`: Python's ``json.loads`` takes
    ``NaN``, JavaScript's ``JSON.parse`` a lone surrogate escape; a peer acts on such a
    message, so the audit reads it too, and says so). The filters read these; the record
    keeps them with credentials fingerprinted (:func:`kept_text`,
    :func:`kept_strings`).

    ``cut`` gets what the bounds left out (strings past the first
    :data:`READ_STRINGS`, characters of a string past
    :data:`READ_CHARS`, JSON nested deeper than 32 levels, a protobuf
    message nested past :func:`~addon.dialects.protowire.strings`' bounds): no filter
    reads that text, so the reader says so (:func:`unread_finding`)
    and the failure policy decides. The bounds are far above an ordinary prompt or answer
    (a long one is one string), so that only a message built to hide text meets them.
    ``keys`` gets a JSON message's object keys (:func:`~addon.dialects.json_strings`: a
    map's keys are data), for the filters alone."""
    if codec != "json":
        msg = parse(payload)
        if cut is not None and msg.problem is not None and msg.problem.startswith(TOO_MANY_FIELDS):
            cut.append(f"fields of a message past the first {MAX_FIELDS}")
        return strings(msg, READ_STRINGS, READ_CHARS, cut=cut), False
    costly = json_read.too_costly(payload)
    if costly is not None:
        if cut is not None:
            cut.append(f"the message, not read: {costly}")
        return [], False
    doc, lenient = read_json_object(payload)  # (keys named like credentials fingerprinted first: "apiKey", "token")
    if doc is None and payload.strip() and cut is not None:
        cut.append("the message, which is no JSON object to any reader")
    found = json_strings(doc, limit=READ_STRINGS, cut=cut, max_values=MESSAGE_VALUES, value_of=value_of, keys=keys)
    if cut is not None and any(len(s) > READ_CHARS for s in found):
        cut.append(f"characters of a string past the first {READ_CHARS}")
    return [s if len(s) <= READ_CHARS else s[:READ_CHARS] for s in found], lenient  # (an OwnKey stays one)


def strings_answer(raw: bytes, codec: str) -> list[Event]:
    """An answer message no field path is known in (a service nobody mapped, Cursor's
    JSON codec): its strings are the answer's text (credentials fingerprinted in the
    record, read as sent by the output filters: a value under a key named like one too,
    since the client shows it whatever its key)."""
    cut: list[str] = []
    keys: list[str] = []
    found, lenient = message_strings(raw, codec, cut, OwnKey.marked, keys)
    out: list[Event] = [LENIENT_MESSAGE] if lenient else []
    if cut:
        out.append(unread_finding(cut, "a response message"))
    if found:
        kept, sent = kept_strings(found)
        out.append(TextDelta(kept, sent=sent))
    if keys:  # (checked beside the text, not recorded: a map's keys are data, but no answer's text)
        out.append(ShownText("\n".join(keys), kind="payload"))
    return out


def read_strings_message(payload: bytes, codec: str, doc: Reading, findings: list[Finding]) -> None:
    """A request message no field path is known in (a service nobody mapped, Cursor's
    JSON codec): its strings (:func:`message_strings`) are the user's message."""
    cut: list[str] = []
    keys: list[str] = []
    found, lenient = message_strings(payload, codec, cut, keys=keys)
    if keys:  # (the filters read them, the record does not keep them)
        doc.unkept.append("\n".join(keys))
    if lenient:
        findings.append(Finding("request_lenient_json", "a Connect JSON request message: read as servers read it"))
    if cut:  # (the message is not read whole: turns.UNREAD_MESSAGE, the failure policy decides)
        findings.append(unread_finding(cut, "a request message"))
    add_message(doc, "user", kept_text(doc, found))


class OwnKey(str):
    """A string of an answer read as sent whose record keeps its fingerprint: a value
    under a key named like a credential (:func:`own_key_value`), marked where it occurs,
    not by its text (an ``"author"`` equal to it elsewhere is kept as it is)."""

    kept: str

    @classmethod
    def marked(cls, key: Any, value: str) -> str:
        """``value`` as the filters read it, marked with what the record keeps when that
        differs (for :func:`~addon.dialects.json_strings`' ``value_of``)."""
        kept = own_key_value(key, value)
        if kept is value:
            return value
        own = cls(value)
        own.kept = kept
        return own


def kept_strings(found: list[str], sep: str = "\n") -> tuple[str, str | None]:
    """Strings of an answer nobody mapped, joined by ``sep``: as the record keeps them
    (credentials fingerprinted: those the secrets detector knows, and each
    :class:`OwnKey`), and as sent when that differs (the output filters must read that,
    in the answer's stream: :attr:`~addon.events.TextDelta.sent`), else None."""
    own = any(type(s) is OwnKey for s in found)
    secret = holds_secret("\n".join(found))  # one search, not one a string (200,000: 0.6 s)
    if not own and not secret:
        return sep.join(found), None  # (a string's key is the joined text's: the patterns' edges take a line feed)
    kept = [s.kept if type(s) is OwnKey else clean(s) if secret else s for s in found]
    changed = any(raw is not recorded for raw, recorded in zip(found, kept, strict=True))
    return sep.join(kept), sep.join(found) if changed else None


def finished_doc(doc: Reading, payloads: int, size: int) -> Reading:
    """The reading as the record keeps it: the message count and size, no empty parts."""
    doc["request_messages"], doc["request_bytes"] = payloads, size
    finished = Reading({k: v for k, v in doc.items() if v not in (None, [], "")})
    finished.unkept, finished.credentials = doc.unkept, doc.credentials
    return finished


def first_finding(findings: list[Finding]) -> Finding | None:
    """``parse_request`` returns one finding: the first that says a message went unread
    (:data:`~addon.findings.UNREAD_MESSAGE`: the request filters' failure policy reads
    it), else the first; saying how many more there were."""
    if not findings:
        return None
    first = next((f for f in findings if f.code in UNREAD_MESSAGE), findings[0])
    more = len(findings) - 1
    return Finding(first.code, f"{first.detail} (+{more} more findings)") if more else first
