"""The llm-stream 1.0 dialect (draft-spk-agentproto-llm-stream-00).

Recognised by the request media type ``application/llm-request+json``, by an Accept
header asking for ``text/event-stream; profile="llm-stream-1.0"``, or by a response
stream whose first event is ``stream.start`` with ``"v":"1.0"``.

Besides extraction, the normalizer checks the event envelope against the draft and
reports every deviation as a finding; it never changes the traffic.

When a content filter stops an exchange, the client gets what the draft defines for it:
open content blocks end with ``content.stop`` and ``stop_reason: "content_filter"``
(section 5.3.3), then an ``error`` event with code ``content_filtered`` (5.3.6), then
``stream.end``, seq continuing. A request blocked before it went upstream gets the
same from ``stream.start`` (seq 0) on; one that did not ask for a stream gets
``{"error": {"code": "content_filtered", "message"}}`` with HTTP 400.
"""

from __future__ import annotations

from typing import Any

from addon.dialects import (
    BlockedResponse,
    Dialect,
    Normalizer,
    RequestSummary,
    RequestView,
    accepted_media_types,
    costly_finding,
    int_field,
    json_object,
    lenient_json,
    media_type,
    read_json_object,
    str_field,
)
from addon.dialects.blocking import FILTERED_CODE, block_message, event_stream, frame, json_response, unix_now
from addon.events import (
    Event,
    Finding,
    Finish,
    ResponseMeta,
    StreamEnd,
    StreamError,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from addon.framing import Frame
from addon.json_read import COUNT_FROM as _COUNT_FROM
from exchange.request import tool_names

REQUEST_MEDIA_TYPE = "application/llm-request+json"
PROFILE = "llm-stream-1.0"
VERSION = "1.0"
EVENT_TYPES = frozenset({"stream.start", "content.delta", "content.stop", "tool.call", "usage", "error", "stream.end"})
SEQ_LIMIT = 2**53  # draft section 8.4: beyond the safe integer range of JSON

# REQUIRED fields per event type, beyond v/seq/type (draft section 5.3).
REQUIRED = {
    "stream.start": ("model", "created"),
    "content.delta": ("index", "role", "delta"),
    "content.stop": ("index", "stop_reason"),
    "tool.call": ("index", "id", "name", "arguments"),
    "usage": ("input_tokens", "output_tokens"),
    "error": ("code", "message"),
    "stream.end": (),
}
ENVELOPE_REQUIRED = ("version", "stream", "model", "messages")
FILTER_STOP_REASON = "content_filter"  # section 5.3.3: the endpoint's safety system stopped it


class LLMStream(Dialect):
    name = "llm-stream"
    provider = None  # the draft is vendor-neutral; the host tells nothing reliable

    def matches(self, request: RequestView) -> bool:
        content_type = request.headers.get("content-type")
        if content_type and media_type(content_type)[0] == REQUEST_MEDIA_TYPE:
            return True
        accept = request.headers.get("accept")
        if accept and "llm-stream" in accept:
            return any(
                kind == "text/event-stream" and params.get("profile") == PROFILE
                for kind, params in accepted_media_types(accept)
            )
        return False

    def sniff(self, first_event: Frame) -> bool:
        if first_event.event not in ("stream.start", "message"):
            return False
        obj = json_object(first_event.data)
        return obj is not None and obj.get("type") == "stream.start" and obj.get("v") == VERSION

    def summarize(self, body: Any, request: RequestView) -> RequestSummary:
        if not isinstance(body, dict):
            return RequestSummary()
        metadata = body["metadata"] if isinstance(body.get("metadata"), dict) else {}
        summary = RequestSummary(
            model=str_field(body, "model"),
            user_id=str_field(metadata, "user_id"),
            session_id=str_field(metadata, "session_id"),
            request_id=str_field(metadata, "request_id"),
            stream=body.get("stream") if isinstance(body.get("stream"), bool) else None,
            declared_tools=tool_names(body),
        )
        summary.findings.extend(_envelope_findings(body))
        return summary

    def normalizer(self, request: RequestSummary) -> Normalizer:
        return LLMStreamNormalizer(request.declared_tools, request.model, request.request_id)

    def blocked_response(
        self, summary: RequestSummary, request_view: RequestView, rule_id: str, reason: str, streaming: bool
    ) -> BlockedResponse:
        if streaming:
            normalizer = self.normalizer(summary)
            return event_stream(normalizer.ending(rule_id, reason), normalizer.writer)
        return json_response({"error": {"code": FILTERED_CODE, "message": block_message(rule_id, reason)}})


def _envelope_findings(body: dict[str, Any]) -> list[Finding]:
    findings = [Finding("request_missing_field", name) for name in ENVELOPE_REQUIRED if name not in body]
    if "version" in body and body["version"] != VERSION:
        findings.append(Finding("request_invalid_field", f'version is {body["version"]!r}, not "1.0"'))
    if "messages" in body and not isinstance(body["messages"], list):
        findings.append(Finding("request_invalid_field", "messages is not an array"))
    return findings


class LLMStreamNormalizer(Normalizer):
    """Extracts llm-stream events and checks the envelope, seq and lifecycle rules."""

    def __init__(
        self, declared_tools: frozenset[str] | None, model: str | None = None, request_id: str | None = None
    ) -> None:
        self.declared_tools = declared_tools
        self.model = model  # asked for: names a stream.start the proxy has to send itself
        self.request_id = request_id  # metadata.request_id, echoed in what the proxy sends
        self.seen_any = False
        self.last_seq: int | None = None
        self.ended = False
        self.errored = False  # an error event was read (the draft allows one per stream)
        self.open_blocks: set[int] = set()

    def on_event(self, event: Frame) -> list[Event]:
        got = self.read(event)
        return [TextDelta(got)] if isinstance(got, str) else got

    def read(self, event: Frame) -> list[Event] | str:
        """The event's common events, checked; a ``content.delta`` of block 0 that passes
        every check is its text alone (see :meth:`Normalizer.read`)."""
        data = event.data
        if len(data) >= _COUNT_FROM and (costly := costly_finding(data, f"event {event.event!r}")) is not None:
            self.seen_any = True
            return [costly]
        obj, lenient = read_json_object(data)
        out: list[Event] = [lenient_json(event)] if lenient else []
        first = not self.seen_any
        self.seen_any = True
        if obj is None:
            out.append(Finding("invalid_json", f"event {event.event!r}: data is not one JSON object"))
            if first:
                out.append(Finding("first_event_not_stream_start", f"first event is {event.event!r}"))
            return out
        kind = obj.get("type")
        if self.ended:
            out.append(Finding("event_after_stream_end", f"{kind!r} after stream.end"))
        if first and kind != "stream.start":
            out.append(Finding("first_event_not_stream_start", f"first event is {kind!r}"))
        self._check_envelope(event, obj, kind, out)
        name = kind if isinstance(kind, str) else ""
        handler = _HANDLERS.get(name)
        if handler is None:
            if isinstance(kind, str):
                out.append(Finding("unknown_event_type", kind))
            return out
        missing = [key for key in REQUIRED[name] if key not in obj]
        if missing:
            out.append(Finding("missing_field", f"{kind}: {', '.join(missing)}"))
        elif not out and name == "content.delta":
            text = self._text_of(obj)
            if text is not None:
                return text
        handler(self, obj, out)
        return out

    def _text_of(self, obj: dict[str, Any]) -> str | None:
        """What :meth:`_content_delta` reads when it is answer text of block 0, noted as
        it notes it; else None, changing nothing."""
        if int_field(obj, "index"):
            return None
        delta = obj.get("delta")
        text = delta.get("text") if type(delta) is dict else None
        if type(text) is not str or not text:
            return None
        self.open_blocks.add(0)
        return text

    def on_end(self, cut: bool = False) -> list[Event]:
        out: list[Event] = []
        if not self.ended:
            out.append(Finding("missing_stream_end", "the body ended without stream.end"))
        for index in sorted(self.open_blocks):
            out.append(Finding("missing_content_stop", f"content block {index}"))
        return out

    def ending(self, rule_id: str, reason: str) -> list[Frame]:
        """``content.stop`` (``content_filter``) for each open block, ``error``
        (``content_filtered``; left out when the stream already had its one error),
        ``stream.end``; preceded by ``stream.start`` when none was read. The request id is
        echoed as section 4.6 asks; the model of a ``stream.start`` of the proxy's own is
        the one asked for (``""`` when unknown)."""
        if self.ended:
            return []
        echo = {"request_id": self.request_id} if self.request_id else {}
        events: list[tuple[str, dict[str, Any]]] = []
        if not self.seen_any:
            events.append(("stream.start", {**echo, "model": self.model or "", "created": unix_now()}))
        events += [("content.stop", {"index": i, "stop_reason": FILTER_STOP_REASON}) for i in sorted(self.open_blocks)]
        if not self.errored:
            events.append(("error", {"code": FILTERED_CODE, "message": block_message(rule_id, reason)}))
        events.append(("stream.end", echo))
        seq = 0 if self.last_seq is None else self.last_seq + 1
        return [
            frame({"v": VERSION, "seq": seq + n, "type": kind, **fields}, kind)
            for n, (kind, fields) in enumerate(events)
        ]

    # -- envelope -----------------------------------------------------------------------

    def _check_envelope(self, event: Frame, obj: dict[str, Any], kind: Any, out: list[Event]) -> None:
        if "v" not in obj:
            out.append(Finding("version_mismatch", "v is missing"))
        elif obj["v"] != VERSION:
            out.append(Finding("version_mismatch", f"v is {obj['v']!r}"))
        if kind is None:
            out.append(Finding("missing_field", "type"))
        elif kind != event.event:
            out.append(Finding("type_mismatch", f"type {kind!r}, SSE event {event.event!r}"))
        self._check_seq(obj.get("seq"), kind, out)

    def _check_seq(self, seq: Any, kind: Any, out: list[Event]) -> None:
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
            out.append(Finding("seq_invalid", f"{kind!r}: seq is {seq!r}"))
            return
        if seq >= SEQ_LIMIT:
            out.append(Finding("seq_exhausted", f"seq {seq}"))
        last = self.last_seq
        if kind == "stream.start" and seq != 0:
            out.append(Finding("stream_start_seq_not_zero", f"seq {seq}"))
        elif last is None:
            if seq != 0:
                out.append(Finding("seq_gap", f"expected 0, got {seq}"))
        elif seq == last:
            out.append(Finding("seq_repeat", f"seq {seq} again"))
        elif seq < last:
            out.append(Finding("seq_decrease", f"seq {seq} after {last}"))
        elif seq > last + 1:
            out.append(Finding("seq_gap", f"expected {last + 1}, got {seq}"))
        self.last_seq = seq if last is None else max(last, seq)

    # -- event types --------------------------------------------------------------------

    def _stream_start(self, obj: dict[str, Any], out: list[Event]) -> None:
        out.append(
            ResponseMeta(
                model=str_field(obj, "model"),
                request_id=str_field(obj, "request_id"),
                created=int_field(obj, "created"),
            )
        )

    def _content_delta(self, obj: dict[str, Any], out: list[Event]) -> None:
        index = int_field(obj, "index") or 0
        delta = obj.get("delta")
        text = delta.get("text") if isinstance(delta, dict) else None
        if not isinstance(text, str):
            out.append(Finding("missing_field", "content.delta: delta.text"))
            return
        self.open_blocks.add(index)
        out.append(TextDelta(text, choice=index))

    def _content_stop(self, obj: dict[str, Any], out: list[Event]) -> None:
        index = int_field(obj, "index") or 0
        self.open_blocks.discard(index)
        reason = str_field(obj, "stop_reason")
        if reason is not None:
            out.append(Finish(reason, choice=index))

    def _tool_call(self, obj: dict[str, Any], out: list[Event]) -> None:
        index = int_field(obj, "index") or 0
        call_id, name = str_field(obj, "id"), str_field(obj, "name")
        arguments = obj.get("arguments")
        if not isinstance(arguments, str):
            arguments = "" if arguments is None else str(arguments)
        self.open_blocks.add(index)
        if name is not None and self.declared_tools is not None and name not in self.declared_tools:
            out.append(Finding("undeclared_tool", name))
        key = call_id or f"block{index}"
        out.append(ToolCallDelta(key, arguments, id=call_id, name=name, choice=index, complete=True))

    def _usage(self, obj: dict[str, Any], out: list[Event]) -> None:
        out.append(Usage(input_tokens=int_field(obj, "input_tokens"), output_tokens=int_field(obj, "output_tokens")))

    def _error(self, obj: dict[str, Any], out: list[Event]) -> None:
        self.errored = True
        out.append(StreamError(str_field(obj, "code"), str_field(obj, "message")))

    def _stream_end(self, obj: dict[str, Any], out: list[Event]) -> None:
        self.ended = True
        out.append(StreamEnd())


_HANDLERS = {
    "stream.start": LLMStreamNormalizer._stream_start,
    "content.delta": LLMStreamNormalizer._content_delta,
    "content.stop": LLMStreamNormalizer._content_stop,
    "tool.call": LLMStreamNormalizer._tool_call,
    "usage": LLMStreamNormalizer._usage,
    "error": LLMStreamNormalizer._error,
    "stream.end": LLMStreamNormalizer._stream_end,
}
assert set(_HANDLERS) == EVENT_TYPES == set(REQUIRED)

DIALECT = LLMStream()
