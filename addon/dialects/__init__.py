"""What every dialect shares: the base classes and the helpers that read JSON bodies.

A dialect is one module (``addon/dialects/<name>.py``, defining ``DIALECT``) that
recognises its traffic and normalizes it into the common events of :mod:`addon.events`.
Importing one dialect imports this package and that module only; which dialects exist,
and the order they are tried in, is :mod:`addon.dialects.registry`.

When a content filter stops an exchange, the dialect also says what the client gets
instead: :meth:`Dialect.blocked_response` for a request blocked before it goes upstream,
:meth:`Normalizer.termination` for a stream cut while it flows (shared pieces in
:mod:`addon.dialects.blocking`).

Everything here is sans-IO: no mitmproxy, no database.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from hashlib import sha256
from typing import Any, TypeGuard
from urllib.parse import unquote

import orjson

from addon import json_read
from addon.dialects.blocking import BlockedResponse
from addon.dialects.providers import provider_for_host
from addon.events import Event, Finding, StreamEnd, StreamError, TextDelta
from addon.framing import Frame, Writer
from addon.framing.sse import SSE_WRITER


@dataclass(frozen=True, slots=True)
class RequestView:
    """What detection may look at: the request line and headers (names lower-case)."""

    method: str
    path: str
    query: str
    headers: Mapping[str, str]


def canonical_path(path: str) -> str:
    """``path`` as servers that decode it route it: percent-decoded once (uvicorn, and so
    vLLM, LiteLLM and every FastAPI server; Go's net/http, and so Ollama), repeated
    slashes merged and dot segments resolved (nginx), each segment's parameters after a
    ``;`` dropped (Tomcat, Jetty: Java gateways), a backslash read as a slash (a WHATWG
    URL parser's: Node's ``new URL``, Deno, Bun, Cloudflare Workers, Next.js routes; and
    ``%5C`` once decoded); ``path`` itself when it has none of those. Detection tries it after the path as sent (:func:`addon.mitm.flow_record.line_views`):
    ``/v1/chat/%63ompletions`` reaches vLLM's chat completions, and must not go past the
    audit and the filters. Only after: a server that does not decode a path (Bedrock,
    whose model ids are percent-encoded ARNs with slashes in them) routes it as sent."""
    if "%" not in path and "//" not in path and "/." not in path and ";" not in path and "\\" not in path:
        return path
    decoded = (unquote(path, errors="replace") if "%" in path else path).replace("\\", "/")
    segments: list[str] = []
    for segment in decoded.split("/"):
        segment = segment.partition(";")[0]
        if segment == "..":
            if segments:
                segments.pop()
        elif segment and segment != ".":
            segments.append(segment)
    return "/" + "/".join(segments) + ("/" if segments and decoded.endswith("/") else "")


@dataclass(slots=True)
class RequestSummary:
    """What a dialect reads from a request body for the record."""

    model: str | None = None
    user_id: str | None = None
    session_id: str | None = None
    request_id: str | None = None
    stream: bool | None = None
    task_id: str | None = None
    declared_tools: frozenset[str] | None = None
    findings: list[Finding] = field(default_factory=list)


class Normalizer(ABC):
    """Turns one response of a dialect into common events. One instance per exchange."""

    #: The stop reason a client reads when a content filter ends this dialect's answer
    #: (what :meth:`termination` and :meth:`filtered_body` carry); the record's
    #: ``finish_reasons`` of a blocked exchange.
    filter_stop_reason: str = "content_filter"
    #: Set by the output gate on the normalizer that reads what the client received: a
    #: dialect whose termination repeats the output so far (a final response object)
    #: keeps it then, and only then (the recording normalizer must not hold a copy).
    keeps_delivered: bool = False
    #: The framing (:mod:`addon.framing`) this dialect's successful answers are streamed in
    #: when the media type does not say (an event stream always is read as one).
    framing: str = "sse"
    #: Encodes :meth:`ending` for the client: the writer of the framing the stream is in.
    writer: Writer = SSE_WRITER
    #: The JSON object of the frame :meth:`read` last answered with its text alone, for
    #: :meth:`read_parsed` of a second normalizer reading the same frame (the output
    #: gate's); None where a dialect does not keep it.
    parsed: Any = None

    @abstractmethod
    def on_event(self, event: Frame) -> list[Event]:
        """Common events for one frame of a streamed response (an SSE event, an array element)."""

    def read(self, event: Frame) -> list[Event] | str:
        """:meth:`on_event` for the auditor's hot path, which may answer a frame whose only
        event is answer text of choice 0 with that text alone (a ``str``): nearly every
        frame of a stream is one, and the record appends it without a
        :class:`~addon.events.TextDelta` nobody else reads. ``[TextDelta(text)]`` is
        what :meth:`on_event` gives for it; dialects with such a fast path override it."""
        return self.on_event(event)

    def read_parsed(self, event: Frame, parsed: Any) -> list[Event] | str:
        """:meth:`read`, for a frame whose data another normalizer has parsed already:
        ``parsed`` is that normalizer's :attr:`parsed` right after it read the frame as
        text alone (the JSON object of the frame's data, which it only read). Dialects
        that parse JSON frames use it instead of parsing the same bytes again."""
        return self.read(event)

    def on_end(self, cut: bool = False) -> list[Event]:
        """Conformance checks once the streamed body is over (cleanly or cut by upstream).

        ``cut``: the body ended inside a frame (a JSON array never closed).
        """
        return []

    def on_body(self, body: bytes, http_status: int) -> list[Event]:
        """Common events for a whole body that is not an event stream.

        An HTTP error body gives the error; a JSON object is handed to
        :meth:`on_response` and, being complete, ends the exchange.
        """
        if http_status >= 400:
            return error_body_events(body)
        doc, finding = load_body_json(body)
        if not isinstance(doc, dict):
            if not_read_for_cost(finding):
                return [finding, StreamEnd()]  # (the body is whole; it was only not read)
            return [Finding("response_invalid_json", "the response body is not one JSON object")]
        return [*([finding] if finding else []), *self.on_response(doc), StreamEnd()]

    def on_response(self, response: dict[str, Any]) -> list[Event]:
        """Common events for a complete JSON response (a non-streamed answer)."""
        return []

    def filtered_body(self, rule_id: str, reason: str) -> BlockedResponse | None:
        """The answer that replaces a held, non-streamed body a content filter blocked.

        Built from the body this normalizer read: the API's own filtered outcome (HTTP
        200, the answer's id, model and usage, none of its content) where the API has
        one; ``None`` where it has none, and the dialect's error answer
        (:meth:`Dialect.blocked_response`) is sent instead.
        """
        return None

    @abstractmethod
    def ending(self, rule_id: str, reason: str) -> list[Frame]:
        """The frames that end this response's stream because a content filter cut it.

        They continue from what this normalizer has read, which must be what the client
        received, in the stream's own dialect: the events that dialect uses for a
        filtered or failed generation, then its clean end (sequence numbers and event
        ids continuing, open blocks closed where the dialect closes them), so that the
        client's SDK reports the filtered or failed outcome rather than a broken
        connection. None once the terminal event has been read. Pure: the normalizer
        does not change (feed the bytes through the auditor if the record should read
        them).
        """

    def termination(self, rule_id: str, reason: str) -> bytes:
        """:meth:`ending` as bytes, encoded by the framing's writer (:attr:`writer`)."""
        return self.writer.encode(self.ending(rule_id, reason), self.continues)

    def termination_trailers(self, rule_id: str, reason: str) -> list[tuple[str, str]]:
        """The HTTP trailers that go with :meth:`termination` (gRPC's status travels in
        them); ``[]`` for a framing whose writer has none."""
        trailers = getattr(self.writer, "trailers", None)
        return trailers(self.ending(rule_id, reason)) if trailers is not None else []

    # -- WebSocket connections (see Dialect.websocket): the client's side, and blocks ----

    def on_client(self, frame: Frame) -> tuple[dict[str, Any], list[Finding]]:
        """One client message of a WebSocket connection: its reading for the turn's
        record and the request filters, in the shared request shape (``{"messages":
        [{"role": ..., "content": ...}], "model": ...}``; ``{}`` for a control message: a
        ping, a handshake, audio), and findings. It also keeps the protocol state the
        answers need (the invocation a prompt opened, a response the client cancelled)."""
        return {}, []

    def refusal(self, frame: Frame, rule_id: str, reason: str) -> list[Frame]:
        """The frames the client gets instead of an answer when a request filter blocked
        its message ``frame`` (which is not forwarded): the protocol's own error for it."""
        return []

    def upstream_cancel(self) -> list[Frame]:
        """Frames (in the client's framing) that ask the upstream to stop the answer an
        output filter cut: the protocol's cancel, where it has one."""
        return []

    def on_close(self, code: int | None, reason: str) -> list[Event]:
        """What a WebSocket close during an answer means to this protocol (Gemini Live's
        errors are close codes): events for that answer's record; ``[]`` by default (the
        connection's record has the code in any case)."""
        return []

    def for_proxy(self, frame: Frame) -> bool:
        """Whether a server frame answers a message the proxy itself sent (the error for its
        cancel): the client never asked for it, so it is recorded but not delivered."""
        return False

    def close_after_block(self, reason: str) -> tuple[int, str] | None:
        """The WebSocket close (code, reason) that must follow a block, for a protocol
        whose errors are close codes; None: the connection stays open."""
        return None

    @property
    def continues(self) -> bool:
        """Whether frames of this body were read (a JSON array's ending then continues it)."""
        return True


class JsonEventNormalizer(Normalizer):
    """Base for dialects whose SSE events each carry one JSON object (every vendor API).

    It handles what they share: the ``[DONE]`` sentinel, data that is not a JSON
    object, events after the terminal event, and a stream that ends without one.
    Subclasses implement :meth:`on_json` and emit :class:`StreamEnd` for their
    terminal event.
    """

    #: ``data: [DONE]`` is not part of the protocol but some gateways append it: read
    #: as nothing at all (not even after the terminal event) rather than as the end.
    ignores_done: bool = False
    #: A subclass that overrides :meth:`on_event` reads frames its own way, so
    #: :meth:`read` must go through it; set per class.
    _own_on_event: bool = False
    #: Whether :meth:`text_of` is asked first; set per class (see __init_subclass__).
    _fast: bool = False
    #: Whether :meth:`read_parsed` may read from the parsed object: the class reads every
    #: frame through this base's own path (no ``on_event``, ``read`` or ``_read`` of its
    #: own, which might read more than the object); set per class.
    _reads_objects: bool = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._own_on_event = cls.on_event is not JsonEventNormalizer.on_event
        # text_of stands in for on_json: a subclass that overrides on_json below the
        # text_of it inherits (it reads more from each frame) gets no fast path until it
        # defines a text_of of its own; neither does a class without one.
        text_owner = next(c for c in cls.__mro__ if "text_of" in c.__dict__)
        json_owner = next(c for c in cls.__mro__ if "on_json" in c.__dict__)
        cls._fast = text_owner is not JsonEventNormalizer and issubclass(text_owner, json_owner)
        cls._reads_objects = not cls._own_on_event and all(
            getattr(cls, name) is getattr(JsonEventNormalizer, name) for name in ("read", "_read")
        )

    def __init__(self) -> None:
        self.ended = False

    def on_event(self, event: Frame) -> list[Event]:
        got = self._read(event)
        return [TextDelta(got)] if isinstance(got, str) else got

    def read(self, event: Frame) -> list[Event] | str:
        return self.on_event(event) if self._own_on_event else self._read(event)

    def read_parsed(self, event: Frame, parsed: Any) -> list[Event] | str:
        # (a subclass that reads frames its own way reads this one so too: it parses again)
        return self._read_object(event, parsed) if self._reads_objects else self.read(event)

    def _read(self, event: Frame) -> list[Event] | str:
        """One frame: its text alone when :meth:`text_of` knows the frame is only that,
        else its events. The JSON is parsed once, whichever way the frame goes."""
        data = event.data
        if data == "[DONE]":
            if self.ignores_done:
                return []
            ended = self.ended
            out: list[Event] = [_after_end(event)] if ended else []
            out.extend(self.on_done())
            return self._note_end(out, ended)
        if len(data) >= _COUNT_FROM and (costly := costly_finding(data, f"event {event.event!r}")) is not None:
            return [costly]  # (the length first: the name is not formatted for every event)
        obj, lenient = read_json_object(data)
        if obj is not None:
            if not lenient:
                return self._read_object(event, obj)
            got = self._read_object(event, obj)
            return [lenient_json(event), TextDelta(got)] if isinstance(got, str) else [lenient_json(event), *got]
        out = [_after_end(event)] if self.ended else []
        out.append(Finding("invalid_json", f"event {event.event!r}: data is not one JSON object"))
        return out

    def _read_object(self, event: Frame, obj: dict[str, Any]) -> list[Event] | str:
        """A frame whose data is the JSON object ``obj``; its text alone when it is only that."""
        ended = self.ended
        if ended:
            return self._note_end([_after_end(event), *self.on_json(event, obj)], ended)
        text = self.text_of(event, obj) if self._fast else None
        if text is not None:
            self.parsed = obj
            return text
        return self._note_end(self.on_json(event, obj), ended)

    def _note_end(self, out: list[Event], ended: bool) -> list[Event]:
        """``out``, noting whether it holds the terminal event."""
        if not ended:
            for e in out:
                if isinstance(e, StreamEnd):
                    self.ended = True
                    break
        return out

    def text_of(self, event: Frame, obj: dict[str, Any]) -> str | None:
        """The fast path: when ``on_json(event, obj)`` would give exactly
        ``[TextDelta(text)]`` (answer text of choice 0, not empty), do what it would do to
        the normalizer's state and return ``text``; else ``None``, changing nothing, and
        :meth:`on_json` reads the frame. Only called before the terminal event."""
        return None

    @abstractmethod
    def on_json(self, event: Frame, obj: dict[str, Any]) -> list[Event]:
        """Common events for one frame whose data is the JSON object ``obj``."""

    def on_done(self) -> list[Event]:
        """The ``data: [DONE]`` sentinel (OpenAI Chat Completions and compatibles)."""
        return [StreamEnd()]

    def on_end(self, cut: bool = False) -> list[Event]:
        if self.ended:
            return []
        return [Finding("missing_stream_end", "the stream ended without its terminal event")]


def _after_end(event: Frame) -> Finding:
    return Finding("event_after_stream_end", f"{event.event!r} after the terminal event")


class Dialect(ABC):
    """One inference protocol: how to recognise it and how to read it."""

    name: str
    provider: str | None = None  # gen_ai.provider.name when the host tells nothing better
    #: Requests are JSON (detection's parse of the body is reused); False for a dialect
    #: that reads its bodies itself in :meth:`parse_request` (protobuf).
    json_requests: bool = True

    def provider_for(self, host: str) -> str | None:
        """The provider serving ``host``: a known API host, else the dialect's default."""
        return provider_for_host(host) or self.provider

    @abstractmethod
    def matches(self, request: RequestView) -> bool:
        """Cheap check on the request line and headers; no body parsing."""

    def parse_request(self, content: bytes, request: RequestView) -> tuple[Any, Finding | None]:
        """The request body as the record keeps it and :meth:`summarize` reads it: JSON,
        read as the servers read it (:func:`parse_json_body`). A dialect whose requests
        are not JSON (protobuf) returns its own JSON-able reading of them, with a
        ``messages`` list in the shared shape so that the request filters and the
        transcript read its conversation as they read any other."""
        return parse_json_body(content)

    def streams_request(self, request: RequestView) -> bool:
        """Whether this request's body is read as it flows rather than whole: a client or
        bidirectional stream (gRPC, Connect), whose client may keep sending while the
        answer streams back, and need never end its body (Cursor's chat)."""
        return False

    def has_turns(self, request: RequestView) -> bool:
        """Whether this streamed request's stream carries many answers, one per turn,
        and may never end (Cursor's bidirectional chat): it is recorded as one record
        per turn, each written when its turn ends (see ``addon/turns.py``)."""
        return False

    def parse_request_message(self, payload: bytes, request: RequestView) -> tuple[dict[str, Any], list[Finding]]:
        """One message of a streamed request body (:meth:`streams_request`), read as
        :meth:`parse_request` reads a whole one: the record's ``request_body`` of the
        turn it starts or continues."""
        return {}, []

    def websocket(self, request: RequestView, first: bytes | None) -> str | None:
        """The framing (:mod:`addon.framing`) this dialect reads a WebSocket connection's
        messages in, if it reads the connection; else None (an HTTP-only dialect).

        Asked at the upgrade with ``first`` None (the path, query and headers, such as
        ``Sec-WebSocket-Protocol``, decide), and, when no dialect claimed the connection
        then, once more with the content of the client's first message (the SignalR
        handshake names the hub protocol). A WebSocket dialect's :meth:`summarize` reads
        the upgrade request (``body`` None) and its :meth:`normalizer` reads the whole
        connection: one normalizer for all its turns, since protocol state (a session's
        model, the invocation being answered) spans them.
        """
        return None

    def accepts_body(self, body: Any, request: RequestView) -> bool:
        """Confirm a line-and-headers match with the parsed body (``None`` if not JSON)."""
        return True

    def sniff(self, first_event: Frame) -> bool:
        """Claim an event stream whose request was not recognised, by its first event."""
        return False

    @abstractmethod
    def summarize(self, body: Any, request: RequestView) -> RequestSummary:
        """Read model, metadata and declared tools from the request (body parsed or ``None``)."""

    @abstractmethod
    def normalizer(self, request: RequestSummary) -> Normalizer:
        """A fresh normalizer for one response."""

    @abstractmethod
    def blocked_response(
        self, summary: RequestSummary, request_view: RequestView, rule_id: str, reason: str, streaming: bool
    ) -> BlockedResponse:
        """The whole answer to a request a content filter blocked before it went upstream.

        ``streaming``: the client asked for a stream and gets HTTP 200 with an event
        stream in this dialect that carries the block; otherwise this dialect's error
        JSON with HTTP 400. The message names ``rule_id`` and ``reason`` only.
        """


class Reading(dict[str, Any]):
    """A request reading a dialect builds itself (protobuf, a hub's invocation), in the
    shared shape the record keeps; and :attr:`unkept`, the text the request filters read
    that the record does not keep as sent.

    Why two: the record keeps what it cannot tell from a credential fingerprinted (a
    string of a field nobody mapped that holds an API key), and keeps strings nobody
    mapped only up to its bounds; the filters must read all of it, as sent, or a key
    pasted into a file, or the text after a file's first lines, goes upstream unchecked.
    An attribute rather than a key: a client's JSON body can hold any key, and the record
    must keep that body as sent. The record never stores :attr:`unkept`
    (:func:`unkept_of`)."""

    __slots__ = ("credentials", "unkept")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.unkept: list[str] = []
        # the client's own credentials the reading found in fields it maps (kept as
        # fingerprints), each as its whole field as sent (tag, length, value) and its
        # fingerprint: taken out of what the filters read, as a header is
        self.credentials: list[tuple[bytes, str]] = []


def unkept_of(reading: Any) -> list[str]:
    """The text of a request reading the record does not keep as sent ([] for a body read as JSON)."""
    return reading.unkept if isinstance(reading, Reading) else []


class _Unreadable:
    """The parsed value of a request body that is not JSON even to a lenient reader."""

    def __repr__(self) -> str:
        return "UNREADABLE"


UNREADABLE: Any = _Unreadable()
_COUNT_FROM = json_read.COUNT_FROM  # (an event this large is counted before it is parsed: read per event)


def parse_json_body(body: bytes) -> tuple[Any, Finding | None]:
    """Parse a request body as the servers that host models read it.

    orjson is strict; the Python servers in front of many models (vLLM, FastAPI and
    Starlette, llama-cpp-python) read request bodies with the standard library's
    ``json.loads``, which also accepts ``NaN``, ``Infinity``, numbers beyond a double
    (``1e400``), lone surrogate escapes (``\\ud800``) and a UTF-8 byte order mark. A
    body only that reader accepts is read the same way (duplicate keys: the last wins,
    in both readers), with a ``request_lenient_json`` finding, so nothing the upstream
    will act on escapes the audit and the filters. ``(UNREADABLE, finding)`` when it is
    JSON to neither.
    """
    if not body:
        return None, None
    costly = json_read.too_costly(body)
    if costly is not None:  # (a client's body must not make the proxy run out of memory)
        return UNREADABLE, Finding("request_too_large", f"not read: {costly}; sha256 {sha256(body).hexdigest()}")
    try:
        doc, lenient = json_read.loads(body)
    except ValueError as e:  # (JSONDecodeError and UnicodeDecodeError are ValueErrors)
        return UNREADABLE, Finding("request_invalid_json", str(e)[:200])
    return doc, Finding("request_lenient_json", "read as Python servers read it") if lenient else None


def load_body_json(body: bytes) -> tuple[Any, Finding | None]:
    """A whole response body as JSON, read as the client's SDK would read it.

    orjson refuses bytes that are not UTF-8; the SDKs decode with replacement, so a body
    with a stray invalid byte is read again with U+FFFD in its place (and a finding),
    rather than losing all its text. The Python SDKs (httpx's ``Response.json``, the
    standard library's ``json.loads`` of the bytes) also read a body with a byte order
    mark, and UTF-16 and UTF-32, so those are read in the encoding that reader finds
    (``json.detect_encoding``) and named lenient. ``(None, None)`` when it is not JSON at all.
    """
    if not body:
        return None, None
    costly = costly_finding(body, "the response body")
    if costly is not None:  # (an upstream's body must not make the proxy run out of memory)
        return None, costly
    try:
        return orjson.loads(body), None
    except orjson.JSONDecodeError:
        pass
    encoding = json.detect_encoding(body)  # ("utf-8-sig" drops a byte order mark)
    try:
        text, finding = body.decode(encoding), None
    except UnicodeDecodeError as e:
        text = body.decode(encoding, "replace")
        finding = Finding("response_invalid_utf8", f"invalid {encoding} at byte {e.start}; read with U+FFFD")
    try:
        doc, lenient = json_read.loads(text)
    except ValueError:
        return None, None  # simply not JSON
    if (lenient or encoding != "utf-8") and finding is None:
        finding = Finding("lenient_json", "the response body: JSON only lenient readers take (the SDKs' do)")
    return doc, finding


def media_type(value: str) -> tuple[str, dict[str, str]]:
    """Split ``type/subtype; a=b; c="d"`` into the lower-case type and its parameters.

    Hand-written because the standard library's parsers (``email.message``) are built
    for whole MIME messages and cost far more than this on the proxy's hot path.
    """
    kind, _, rest = value.partition(";")
    params: dict[str, str] = {}
    for part in rest.split(";"):
        name, eq, val = part.partition("=")
        if eq:
            params[name.strip().lower()] = val.strip().strip('"')
    return kind.strip().lower(), params


def accepted_media_types(accept: str) -> list[tuple[str, dict[str, str]]]:
    """The media ranges of an Accept header, in order (quoted commas respected)."""
    out, start, quoted = [], 0, False
    for i, ch in enumerate(accept):
        if ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            out.append(media_type(accept[start:i]))
            start = i + 1
    out.append(media_type(accept[start:]))
    return [m for m in out if m[0]]


def error_body_events(body: bytes) -> list[Event]:
    """Common events for an HTTP error body, whatever its vendor shape.

    Recognises ``{"error": {"code"|"type", "message"}}``, ``{"error": "text"}``,
    ``{"code", "message"}`` and RFC 9457 problem objects (``type``/``title``/``detail``).
    """
    obj, finding = load_body_json(body)
    if not_read_for_cost(finding):
        return [StreamError(None, None), finding]
    if obj is None and body:
        text = body[:500].decode("utf-8", "replace")
        return [StreamError(None, text or None), Finding("response_invalid_json", "error body is not JSON")]
    findings = [finding] if finding else []
    if not isinstance(obj, dict):
        return [StreamError(None, None), *findings]
    return [*_error_object_events(obj), *findings]


def _error_object_events(obj: dict[str, Any]) -> list[Event]:
    """The error of a parsed error body."""
    err = obj.get("error", obj)
    if isinstance(err, str):
        return [StreamError(None, err)]
    if not isinstance(err, dict):
        return [StreamError(None, None)]
    # A string code wins (OpenAI, LMSP problem objects); then a type (Anthropic, OpenAI);
    # then Google's status name, which says more than its numeric code.
    code = next((err[k] for k in ("code", "type", "status") if isinstance(err.get(k), str) and err[k]), err.get("code"))
    message = err.get("message") or err.get("detail") or err.get("title")
    return [StreamError(_str_or_none(code), _str_or_none(message))]


def costly_finding(data: str | bytes, what: str, code: str = "json_too_costly") -> Finding | None:
    """The finding for JSON ``what`` too costly to read whole (:func:`addon.json_read.too_costly`),
    or None: a reader that gets one does not parse ``data``. ``json_too_costly`` is the
    output filters' failure policy's; a request's reader says ``request_too_large``."""
    costly = json_read.too_costly(data)
    return Finding(code, f"{what}, not read: {costly}") if costly is not None else None


def not_read_for_cost(finding: Finding | None) -> TypeGuard[Finding]:
    """Whether :func:`load_body_json` left a body unread for what reading it would cost
    (it is whole: no other reading of it is tried)."""
    return finding is not None and finding.code == "json_too_costly"


def json_object(data: str | bytes) -> dict[str, Any] | None:
    """``data`` parsed as one JSON object (leniently when it must be: :func:`read_json_object`), or ``None``."""
    return read_json_object(data)[0]


def read_json_object(data: str | bytes) -> tuple[dict[str, Any] | None, bool]:
    """``data`` parsed as one JSON object, or ``None``; and whether only a lenient reader
    takes it (:func:`addon.json_read.loads`: the SDKs read it, so the audit does)."""
    try:
        obj, lenient = json_read.loads(data)
    except ValueError:  # (JSONDecodeError and UnicodeDecodeError are ValueErrors)
        return None, False
    return (obj, lenient) if isinstance(obj, dict) else (None, False)


@dataclass(slots=True)
class LimitNotice:
    """The finding ``record_limit`` a normalizer gives the first time one of its tables
    is full (an upstream naming a new block, item or call per event), then nothing: one
    finding per exchange and bound, however many keys are left out after it."""

    detail: str
    given: bool = False

    def reached(self) -> list[Event]:
        if self.given:
            return []
        self.given = True
        return [Finding("record_limit", self.detail)]


#: The content blocks with text an :class:`OpenBlocks` remembers open at once. Text of one
#: kind in two open blocks is interleaving (there are three kinds), so past a few it was
#: reported long before; the bound keeps a hostile upstream naming a new block per event
#: from growing the table without end.
MAX_OPEN_BLOCKS = 64


@dataclass(slots=True)
class OpenBlocks:
    """The content blocks (or output parts) of an answer that got text and have not ended,
    by kind of text.

    A client puts each block's text together on its own; the filters read a kind's text
    in arrival order, as one text (a match may span two blocks: the clients join them
    too). Text of one kind in two open blocks at once is interleaved: what the filters
    read is then not what any client shows, so it is a finding (``text_interleaved``),
    on which a gate that may block lets the failure policy decide (:mod:`addon.output_gate`).
    Counted per kind, so each piece costs the same however many blocks were opened. At
    most :data:`MAX_OPEN_BLOCKS` are remembered; a block past them is not (``record_limit``,
    once), its text still read.
    """

    _kinds: dict[Any, str] = field(default_factory=dict)  # block -> the kind of text it got
    _open: dict[str, int] = field(default_factory=dict)  # kind -> how many open blocks got text of it
    _groups: dict[Any, set[Any]] = field(default_factory=dict)  # group -> its open blocks that got text (end_group)
    _group_of: dict[Any, Any] = field(default_factory=dict)  # block -> its group
    _limit: LimitNotice = field(
        default_factory=lambda: LimitNotice(
            f"content blocks with text open at once past the first {MAX_OPEN_BLOCKS} not tracked for "
            "interleaving (text_interleaved was reported); their text is read"
        )
    )

    def text(self, block: Any, kind: str, group: Any = None) -> list[Event]:
        """Text of ``kind`` for ``block`` (of ``group``: an output item, whose end ends
        its parts): a finding when another open block has text of that kind."""
        had = self._kinds.get(block)
        if had != kind:
            if had is not None:
                self._open[had] -= 1
            elif len(self._kinds) >= MAX_OPEN_BLOCKS:  # (not remembered; the finding the first time)
                return self._limit.reached()
            elif group is not None:
                self._groups.setdefault(group, set()).add(block)
                self._group_of[block] = group
            self._kinds[block] = kind
            self._open[kind] = self._open.get(kind, 0) + 1
        if self._open[kind] > 1:
            return [Finding("text_interleaved", f"{kind} of block {block!r} while another block's was open")]
        return []

    def end(self, block: Any) -> None:
        """The block ended: its text is whole."""
        kind = self._kinds.pop(block, None)
        if kind is not None:
            self._open[kind] -= 1
            group = self._group_of.pop(block, None)
            members = self._groups.get(group) if group is not None else None
            if members is not None:
                members.discard(block)
                if not members:
                    del self._groups[group]

    def end_group(self, group: Any) -> None:
        """Every block of ``group`` ended (an output item is done, whether or not its
        parts' own done events came)."""
        for block in self._groups.pop(group, ()):
            self.end(block)

    @property
    def full(self) -> bool:
        """No new block is remembered now. A fast path that drops what :meth:`text`
        returns leaves a new block's text to its full reading then (which gets the finding)."""
        return len(self._kinds) >= MAX_OPEN_BLOCKS


def lenient_json(event: Frame) -> Finding:
    """The finding for an event only lenient readers take (:func:`read_json_object`)."""
    return Finding("lenient_json", f"event {event.event!r}: JSON only lenient readers take (the SDKs' do)")


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def str_field(obj: Mapping[str, Any], name: str) -> str | None:
    """``obj[name]`` if it is a string."""
    value = obj.get(name)
    return value if isinstance(value, str) else None


def int_field(obj: Mapping[str, Any], name: str) -> int | None:
    """``obj[name]`` if it is an integer (booleans are not)."""
    value = obj.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def as_text(value: bytes) -> str:
    """MessagePack's binary value as the text a peer may read in it: UTF-8, what is not
    UTF-8 as U+FFFD (as .NET's ``Encoding.UTF8.GetString`` reads a hub method's
    ``byte[]``): the filters must see a prompt or an answer sent as bytes."""
    return value.decode("utf-8", "replace")


def json_strings(
    value: Any,
    skip_keys: frozenset[str] = frozenset(),
    limit: int | None = None,
    max_chars: int | None = None,
    max_depth: int = 32,
    cut: list[str] | None = None,
    max_values: int | None = None,
    value_of: Callable[[Any, str], str] | None = None,
    keys: list[str] | None = None,
) -> list[str]:
    """Every non-empty string in a JSON value, depth first: what a dialect reads of a part
    or payload of unknown shape (the filters must see text a client may show). Bounded:
    ``max_depth`` levels, at most ``limit`` strings and ``max_chars`` characters in all
    (the last string cut to fit), at most ``max_values`` values visited (objects, arrays,
    numbers: a message of a million empty objects holds no string, and walking it cost
    the event loop half a second); keys in ``skip_keys`` are not read. ``value_of(key,
    string)`` gives what is read of a string under ``key`` (a credential's fingerprint).
    A binary value or key (MessagePack's, never JSON's) is read as text
    (:func:`as_text`). ``keys``, when given, gets the keys of the objects walked (each
    beside its value, so the values' bound bounds them; they neither count nor stop the
    walk: a map of many numbers is read as before): a protobuf map's keys are data in
    Connect's JSON codec, so a prompt or an answer may be one, though no record wants
    ``"role"`` and ``"text"``.

    ``cut``, when given, gets what the bounds left out, each reason once (strings, or
    objects or arrays that may hold some, deeper than ``max_depth``; a string past
    ``limit``; characters past ``max_chars``; values past ``max_values``): the filters
    cannot check that text, so a reader says so (finding ``strings_unread``) and the
    failure policy decides. The walk stops at the first string past ``limit`` or
    ``max_chars``, or the first value past ``max_values``."""
    out: list[str] = []
    budget = [max_chars if max_chars is not None else -1]
    values = [max_values if max_values is not None else -1]  # (left to visit; -1: no bound)
    stop = [False]
    reads_keys, keys_out = keys is not None, keys if keys is not None else []

    def left_out(reason: str) -> None:
        if cut is not None and reason not in cut:
            cut.append(reason)

    def walk(item: Any, depth: int) -> None:
        if values[0] == 0:
            stop[0] = True
            left_out(f"values past the first {max_values}")
            return
        values[0] -= 1
        if type(item) is bytes:  # (MessagePack's binary: a peer may read it as UTF-8 text)
            item = as_text(item)
        if isinstance(item, str):
            if not item:
                return
            if depth > max_depth:
                left_out(f"strings nested deeper than {max_depth} levels")
            elif (limit is not None and len(out) >= limit) or budget[0] == 0:
                stop[0] = True  # (one is enough to say so)
                left_out(f"strings past the first {limit}" if budget[0] else f"text past {max_chars} characters")
            else:
                if budget[0] > 0:
                    if len(item) > budget[0]:
                        left_out(f"text past {max_chars} characters")
                    item, budget[0] = item[: budget[0]], max(budget[0] - len(item), 0)
                out.append(item)
        elif isinstance(item, dict):
            if depth > max_depth:
                if item:
                    left_out(f"strings nested deeper than {max_depth} levels")
                return
            for key, v in item.items():
                if key not in skip_keys:
                    if type(key) is bytes:
                        key = as_text(key)
                    if reads_keys and key and isinstance(key, str):
                        keys_out.append(key)  # (bounded with the values: each key's value is one)
                    if type(v) is bytes:
                        v = as_text(v)
                    walk(value_of(key, v) if value_of is not None and isinstance(v, str) else v, depth + 1)
                    if stop[0]:
                        return
        elif isinstance(item, list):
            if depth > max_depth:
                if item:
                    left_out(f"strings nested deeper than {max_depth} levels")
                return
            for v in item:
                walk(v, depth + 1)
                if stop[0]:
                    return

    walk(value, 0)
    return out
