"""The OpenAI Realtime dialect: JSON events over one WebSocket (``wss://.../v1/realtime``).

Recognised at the upgrade (:meth:`OpenAIRealtime.websocket`) by a path ending in
``/v1/realtime`` (Azure: ``/realtime`` under ``/openai/``), the beta header
``OpenAI-Beta: realtime=v1``, or a browser's ``Sec-WebSocket-Protocol: realtime``; the
HTTP endpoints beside it (``/v1/realtime/calls``, ``/client_secrets``) are not. The model
is the query's ``model=`` (Azure: ``deployment=``), then ``session.created``'s.

Every message is one JSON event with a ``type``. A session carries many responses, one
record each: ``response.created`` opens one, ``response.done`` (always sent, whatever
the outcome) ends it with :class:`~addon.events.TurnEnd`. The GA names and the older beta
names (``response.text.delta``, ``response.audio_transcript.delta``, ...) are both read;
which one the server speaks is remembered for what the proxy sends.

Two responses may be in progress at once (an out-of-band one, ``response.conversation:
"none"``, beside the default one), their events interleaved. Each response in progress
has a choice of its own for its text, calls and stop reason (the lowest no other one in
progress has: one at a time, always 0), so that the output filters read each as its own
text, and its ``TurnEnd`` names the others' choices as ``going_on``: its end ends only its
text (:meth:`~addon.output_gate.OutputGate._end_turn`).

- Text (``response.output_text.delta``) and the audio's transcript
  (``response.output_audio_transcript.delta``) are both the answer's text: the
  transcript is what the user hears, so the filters and the record treat it as what a
  text answer shows. The audio itself (base64) is never read or kept.
- The response, item and part bookkeeping is the Responses API's
  (:class:`~addon.dialects.responses.ResponsesNormalizer`, one reader per response in
  progress): ``*.done`` events, ``response.output_item.done`` and ``response.done``'s
  output fill in what the deltas missed; a final text that disagrees with them is a
  ``final_text_mismatch`` and :class:`~addon.events.ShownText`. Function calls are keyed by
  item id, with ``call_id`` and ``name`` from ``output_item.added`` or ``.done``.
- ``response.done``: usage (``cached_tokens`` read from the cache, and the text, audio
  and image counts), the stop reason (``completed`` -> ``stop``; ``incomplete`` with
  ``max_output_tokens`` -> ``length``, ``content_filter`` -> ``content_filter``;
  ``cancelled`` -> ``cancelled``; ``failed`` -> ``error`` with ``status_details.error``).
- Whole conversation items the server sends (``conversation.item.retrieved``, ``.done``,
  ``.added``, ``.created``) go to the output filters when the client did not write them:
  the server keeps a cut answer, and retrieving it would bring the blocked text back.
- ``error`` events are mostly recoverable (the session stays open). One about a client
  event (``error.event_id``) or arriving between responses is the finding
  ``realtime_error``: a StreamError would mark a response that went on fine, or the next
  one, as failed (its message still goes to the output filters). One during a response,
  about no client event, is its StreamError.
- The client's events (:meth:`RealtimeNormalizer.on_client`) read as the shared request
  shape: ``session.update`` instructions and ``response.create`` instructions as system
  messages, ``conversation.item.create`` items as user, assistant or tool messages;
  audio appends are control messages (never kept).

When an output filter cuts a response, the client gets an ``error`` event (type
``invalid_request_error``, code ``content_filtered``, the rule and reason: the one place
for a message), then, for each response in progress as the client knows it (the one
whose text was blocked, and one beside it, whose events waited behind the blocked text
and are dropped with it), the done events of its parts and items still open (in the
names the server speaks: GA ``response.output_text.done``, beta ``response.text.done``,
...) and its ``response.done``, ``incomplete`` with reason ``content_filter``: what
OpenAI sends when its own safety filter cuts a response, so a client handles it as a
moderation cut rather than as a server failure to retry (``failed``). Its output is
what the client received, parts typed in the session's names (GA ``output_text`` /
``output_audio``, beta ``text`` / ``audio``); a function call whose arguments were cut is
left out, so no client runs it. Upstream is asked to stop each response in progress
with ``response.cancel``, and what it still sends of them is the proxy's, not the
client's (:meth:`RealtimeNormalizer.for_proxy`). A client event a request filter blocks
is answered with an ``error`` whose ``error.event_id`` names it. Event ids the proxy
makes are ``event_llmaudit_...``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qs

from addon.dialects import (
    BlockedResponse,
    Dialect,
    JsonEventNormalizer,
    Normalizer,
    RequestSummary,
    RequestView,
    int_field,
    json_object,
    parse_json_body,
    str_field,
)
from addon.dialects.blocking import FILTERED_CODE, block_message, frame, json_response, openai_error, random_id
from addon.dialects.responses import ResponsesNormalizer, problem_error
from addon.events import (
    Event,
    Finding,
    Finish,
    PromptText,
    ResponseMeta,
    ShownText,
    StreamError,
    TextDelta,
    ToolCallDelta,
    TurnEnd,
    Usage,
)
from addon.framing import Frame
from addon.framing.ws_json import WRITER
from exchange.request import tool_names

FRAMING = "ws_json"
BETA_HEADER = "realtime=v1"
SUBPROTOCOL = "realtime"
PROXY_EVENT = "event_llmaudit_"  # the event ids of what the proxy sends (endings, cancels)
# response.status -> the record's stop reason; incomplete goes by status_details.reason
STOP_REASONS = {"completed": "stop", "cancelled": "cancelled", "failed": "error"}
INCOMPLETE_REASONS = {"max_output_tokens": "length", "content_filter": "content_filter"}
# Content part type -> the field holding its text (GA and beta names; audio: its transcript).
PART_TEXT = {"text": "text", "output_text": "text", "audio": "transcript", "output_audio": "transcript"}
AUDIO_PARTS = frozenset({"audio", "output_audio"})
# A part's done event, (GA, beta) by what it carries: indexed by the session being beta.
DONE_EVENTS = {
    "text": ("response.output_text.done", "response.text.done"),
    "transcript": ("response.output_audio_transcript.done", "response.audio_transcript.done"),
}
# Events only one generation of the API sends: which names the server speaks.
BETA_EVENTS = frozenset(
    {"response.text.delta", "response.text.done", "response.audio_transcript.delta", "response.audio.delta"}
)
GA_EVENTS = frozenset(
    {"response.output_text.delta", "response.output_audio_transcript.delta", "response.output_audio.delta"}
)
# Server events that carry a whole conversation item (the server keeps a cut answer:
# retrieve brings all of it back).
ITEM_EVENTS = frozenset(
    {"conversation.item.retrieved", "conversation.item.done", "conversation.item.added", "conversation.item.created"}
)
MAX_OPEN_RESPONSES = 8  # responses in progress at once (out-of-band ones run beside the default)
MAX_DETAIL = 300


@dataclass(slots=True)
class RealtimeSummary(RequestSummary):
    """The upgrade request's reading, plus whether it asked for the beta API."""

    beta: bool = False


def is_realtime(request: RequestView) -> bool:
    """A Realtime WebSocket upgrade: by path, beta header or offered subprotocol."""
    path = request.path.rstrip("/")
    if path.endswith("/v1/realtime") or ("/openai/" in path and path.endswith("/realtime")):
        return True
    if BETA_HEADER in request.headers.get("openai-beta", ""):
        return True
    offered = request.headers.get("sec-websocket-protocol", "")
    return SUBPROTOCOL in (p.strip() for p in offered.split(","))


class OpenAIRealtime(Dialect):
    name = "openai-realtime"
    provider = "openai"  # *.openai.azure.com maps to azure.ai.openai by host

    def matches(self, request: RequestView) -> bool:
        return False  # a WebSocket protocol: no HTTP exchange is Realtime's

    def websocket(self, request: RequestView, first: bytes | None) -> str | None:
        return FRAMING if is_realtime(request) else None

    def summarize(self, body: Any, request: RequestView) -> RequestSummary:
        query = parse_qs(request.query)
        model = (query.get("model") or query.get("deployment") or [""])[-1]
        return RealtimeSummary(model=model or None, beta=BETA_HEADER in request.headers.get("openai-beta", ""))

    def normalizer(self, request: RequestSummary) -> Normalizer:
        return RealtimeNormalizer(request.model, isinstance(request, RealtimeSummary) and request.beta)

    def blocked_response(
        self, summary: RequestSummary, request_view: RequestView, rule_id: str, reason: str, streaming: bool
    ) -> BlockedResponse:
        """A blocked upgrade: OpenAI's error JSON (HTTP 400)."""
        return json_response({"error": openai_error(block_message(rule_id, reason), FILTERED_CODE)})


def event_id() -> str:
    """A fresh event id for an event the proxy sends."""
    return random_id(PROXY_EVENT)


def realtime_usage(usage: Any) -> Usage | None:
    """``response.usage``: ``input_tokens`` include ``cached_tokens``; the per-modality
    counts are parts of the totals."""
    if not isinstance(usage, dict):
        return None
    inp, out = _object(usage.get("input_token_details")), _object(usage.get("output_token_details"))
    report = Usage(
        input_tokens=int_field(usage, "input_tokens"),
        output_tokens=int_field(usage, "output_tokens"),
        cache_read_input_tokens=int_field(inp, "cached_tokens"),
        input_text_tokens=int_field(inp, "text_tokens"),
        input_audio_tokens=int_field(inp, "audio_tokens"),
        input_image_tokens=int_field(inp, "image_tokens"),
        output_text_tokens=int_field(out, "text_tokens"),
        output_audio_tokens=int_field(out, "audio_tokens"),
    )
    return None if report == Usage() else report


def stop_reason(status: str, details: dict[str, Any]) -> str:
    """The record's stop reason for a response's final ``status`` and ``status_details``."""
    if status == "incomplete":
        reason = str_field(details, "reason")
        return INCOMPLETE_REASONS.get(reason or "", reason or status)
    return STOP_REASONS.get(status, status)


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


class _Response(ResponsesNormalizer):
    """One response of the session, read with the Responses API's item, part and call
    bookkeeping (the Realtime events are named after it), plus Realtime's part types.
    Made at ``response.created`` and dropped at ``response.done``: a long session holds
    only the responses in progress."""

    def __init__(self, response: dict[str, Any], declared_tools: frozenset[str] | None, keeps: bool, slot: int) -> None:
        super().__init__(declared_tools)
        self.response = response  # the object response.created announced
        self.keeps_delivered = keeps
        self.slot = slot  # its choice in the common events (RealtimeNormalizer._open)
        self.cancelled = False  # the client asked to cancel it (response.cancel)
        self.parts_done: set[tuple[str, int]] = set()  # (item id, content index) whose done event came

    def ending(self, rule_id: str, reason: str) -> list[Frame]:
        return []  # the session's normalizer ends responses (RealtimeNormalizer.ending)

    def _settle_parts(self, item_id: str, space: str, parts: Any, out: list[Event]) -> None:
        if isinstance(parts, list):
            for index, part in enumerate(parts):
                if isinstance(part, dict):
                    self._settle_part(item_id, index, part, out)

    def _settle_part(self, item_id: str, index: int, part: dict[str, Any], out: list[Event]) -> None:
        name = PART_TEXT.get(str_field(part, "type") or "")
        text = part.get(name) if name else None
        if isinstance(text, str):
            self._settle_text((item_id, "content", index), text, "text", out)

    def _part_done(self, obj: dict[str, Any], out: list[Event]) -> None:
        """``response.content_part.done``: its text or transcript settles the part."""
        part = obj.get("part")
        if isinstance(part, dict):
            key = (self._item_id(obj), int_field(obj, "content_index") or 0)
            self._settle_part(key[0], key[1], part, out)
            self.parts_done.add(key)

    def _transcript_delta(self, obj: dict[str, Any], out: list[Event]) -> None:
        self._delta(obj, out, "content", "content_index", "text")

    def _transcript_done(self, obj: dict[str, Any], out: list[Event]) -> None:
        self._done(obj, out, "content", "content_index", "transcript", "text")

    def _arguments_done(self, obj: dict[str, Any], out: list[Event]) -> None:
        """``.done`` carries the call's ``call_id`` and ``name`` (Realtime's, not Responses')."""
        self._settle_call(self._item_id(obj), obj.get("arguments"), obj, True, out)

    def _done(self, obj: dict[str, Any], out: list[Event], space: str, index_field: str, field: str, kind: str) -> None:
        super()._done(obj, out, space, index_field, field, kind)
        self.parts_done.add((self._item_id(obj), int_field(obj, index_field) or 0))

    def delivered(self, beta: bool) -> list[tuple[int, dict[str, Any]]]:
        """The output the client received, by output index, parts typed in the session's
        names; calls whose arguments were cut are left out (a client must not run them)."""
        items = []
        for index, item in zip(sorted(self.items), self.output_so_far()):
            if item.get("type") == "function_call" and item.get("status") == "incomplete":
                continue
            if item.get("type") == "message" and isinstance(item.get("content"), list):
                item_id = str_field(item, "id") or f"#{index}"
                parts = [
                    (self.part_types.get((item_id, i), ""), p.get("text", "")) for i, p in enumerate(item["content"])
                ]
                item = dict(item, content=[_delivered_part(kind, text, beta) for kind, text in parts])
            items.append((index, item))
        return items

    def filtered(self, beta: bool) -> dict[str, Any]:
        """Its ``response.done`` object when a filter cut it: ``incomplete`` with reason
        ``content_filter``, the output the client received."""
        return self.response | {
            "object": "realtime.response",
            "status": "incomplete",
            "status_details": {"type": "incomplete", "reason": "content_filter"},
            "output": [item for _, item in self.delivered(beta)],
            "usage": None,
        }

    def closing(self, beta: bool) -> list[dict[str, Any]]:
        """The done events of the parts and items still open, in the session's names
        (beta ``response.text.done`` / ``response.audio_transcript.done``), so that a
        client's items end as they end when the server cuts them (status incomplete)."""
        response_id = self.response.get("id")
        events: list[dict[str, Any]] = []
        for index, item in self.delivered(beta):
            if index in self.items_done:
                continue
            item_id = str_field(item, "id") or f"#{index}"
            content = item.get("content") if item.get("type") == "message" else None
            for part_index, part in enumerate(content if isinstance(content, list) else []):
                if (item_id, part_index) in self.parts_done:
                    continue
                where = {
                    "response_id": response_id,
                    "item_id": item_id,
                    "output_index": index,
                    "content_index": part_index,
                }
                audio = "transcript" in part
                name, field = ("transcript", "transcript") if audio else ("text", "text")
                events.append({"type": DONE_EVENTS[name][beta], **where, field: part[field]})
                events.append(
                    {
                        "type": "response.content_part.done",
                        **where,
                        "part": {"type": "audio" if audio else "text", field: part[field]},
                    }
                )
            events.append(
                {"type": "response.output_item.done", "response_id": response_id, "output_index": index, "item": item}
            )
        return events


def _on_slot(events: list[Event], slot: int) -> list[Event]:
    """A response's events on its choice ``slot`` (the Responses reader says choice 0)."""
    return [_slotted(ev, slot) for ev in events]


def _slotted(ev: Event, slot: int) -> Event:
    if type(ev) is TextDelta:
        return TextDelta(ev.text, slot, ev.kind, ev.sent)
    if type(ev) is ShownText:
        return ShownText(ev.text, slot, ev.kind)
    if type(ev) is ToolCallDelta:
        return replace(ev, choice=slot)
    if type(ev) is Finish:
        return Finish(ev.reason, slot)
    return ev


def _delivered_part(kind: str, text: str, beta: bool) -> dict[str, Any]:
    """A part as the final item carries it: ``kind`` as ``content_part.added`` said."""
    if kind in AUDIO_PARTS:
        return {"type": "audio" if beta else "output_audio", "transcript": text}
    return {"type": "text" if beta else "output_text", "text": text}


# Response-scoped events (GA and beta names) -> the reader's method.
_RESPONSE_EVENTS = {
    "response.output_item.added": _Response._item_added,
    "response.output_item.done": _Response._item_done,
    "response.content_part.added": _Response._part_added,
    "response.content_part.done": _Response._part_done,
    "response.output_text.delta": _Response._text_delta,
    "response.text.delta": _Response._text_delta,
    "response.output_text.done": _Response._text_done,
    "response.text.done": _Response._text_done,
    "response.output_audio_transcript.delta": _Response._transcript_delta,
    "response.audio_transcript.delta": _Response._transcript_delta,
    "response.output_audio_transcript.done": _Response._transcript_done,
    "response.audio_transcript.done": _Response._transcript_done,
    "response.function_call_arguments.delta": _Response._arguments_delta,
    "response.function_call_arguments.done": _Response._arguments_done,
}


class RealtimeNormalizer(JsonEventNormalizer):
    """A whole Realtime session: its responses, one turn each, and the client's events."""

    framing = FRAMING
    writer = WRITER

    def __init__(self, model: str | None = None, beta: bool = False) -> None:
        super().__init__()
        self.model = model
        self.beta = beta  # the server speaks the beta event names
        self.declared_tools: frozenset[str] | None = None  # the session's, once it says
        self.responses: dict[str, _Response] = {}  # in progress, oldest first
        # responses forgotten in progress (_open: past MAX_OPEN_RESPONSES), oldest first, at most as many
        self.evicted: dict[str, _Response] = {}
        self.cut: set[str] = set()  # responses in progress that the proxy ended for the client (for_proxy)

    # -- server events --------------------------------------------------------------------

    def on_json(self, event: Frame, obj: dict[str, Any]) -> list[Event]:
        kind = obj.get("type")
        if not isinstance(kind, str):
            return [Finding("missing_field", "a Realtime event without a type")]
        if kind in BETA_EVENTS or kind in GA_EVENTS:
            self.beta = kind in BETA_EVENTS
        out: list[Event] = []
        handler = _RESPONSE_EVENTS.get(kind)
        if handler is not None:
            reader = self._reader(str_field(obj, "response_id"), out)
            handler(reader, obj, out)
            if reader.slot:
                return _on_slot(out, reader.slot)
        elif kind == "response.created":
            self._created(_object(obj.get("response")), out)
        elif kind == "response.done":
            self._finished(_object(obj.get("response")), out)
        elif kind in ("session.created", "session.updated"):
            self._session(_object(obj.get("session")), out)
        elif kind == "error":
            self._error(_object(obj.get("error")), out)
        elif kind in ITEM_EVENTS:
            _item_shown(_object(obj.get("item")), out)
        elif kind == "conversation.item.input_audio_transcription.completed":
            transcript = str_field(obj, "transcript")
            if transcript:  # what the user said (a voice prompt): the turn's request side
                out.append(PromptText(transcript))
        return out  # audio, rate limits, conversation items, VAD: nothing for the record

    def on_end(self, cut: bool = False) -> list[Event]:
        if self.responses:
            return [Finding("missing_stream_end", "the connection closed during a response")]
        return []

    def _session(self, session: dict[str, Any], out: list[Event]) -> None:
        if session.get("type") == "realtime" or "output_modalities" in session:
            self.beta = False
        elif "modalities" in session:
            self.beta = True
        if isinstance(session.get("tools"), list):
            self.declared_tools = tool_names(session)
        model = str_field(session, "model")
        if model:
            self.model = model
            out.append(ResponseMeta(model=model))

    def _open(self, response: dict[str, Any], out: list[Event]) -> _Response:
        """A response in progress, on the lowest choice no other one in progress has.

        Why a choice each: two responses may be in progress at once (an out-of-band one,
        ``response.conversation: "none"``, beside the default one), their deltas
        interleaved on the one socket. The output filters read each choice as a text of its
        own and its end (``response.done``'s :class:`~addon.events.TurnEnd`, naming the
        others as ``going_on``) as that text's end alone; on one choice the two would be
        one text, a word of one cut by the other's deltas or end. One at a time, every
        response is choice 0, as before.

        At most :data:`MAX_OPEN_RESPONSES` are kept (an upstream may open responses and
        never end them: each holds its items, parts and the filters' streams of its
        choice). A response past that forgets the oldest one in progress, which is noted
        in :attr:`evicted` (as many at most, the oldest forgotten), and is the finding
        ``text_interleaved``, put first in ``out``, before any event of the frame: the
        new response takes the evicted one's choice, whose streams the output gate never
        ended, so its text would be read as the continuation of the evicted one's (``x`` +
        ``Nightjar``: no word edge), and what the evicted one still sends is read anew on
        another choice. What the filters read is then not what the client shows, and the
        gate hands that to the failure policy (``closed``: blocked) before any of that text.
        A response evicted earlier that comes back is the same finding (unless the proxy
        cut it: the rest of it is the proxy's). The evicted ones are cancelled and ended
        with the others when a filter cuts (:meth:`ending`, :meth:`upstream_cancel`)."""
        key = str_field(response, "id") or random_id("resp_llmaudit_")
        back = self.evicted.pop(key, None)
        if len(self.responses) >= MAX_OPEN_RESPONSES:  # never done: forget the oldest
            oldest, forgotten = next(iter(self.responses.items()))
            del self.responses[oldest]
            if len(self.evicted) >= MAX_OPEN_RESPONSES:
                dropped = next(iter(self.evicted))
                del self.evicted[dropped]
                self.cut.discard(dropped)
            self.evicted[oldest] = forgotten
            out.insert(0, Finding("text_interleaved", f"more than {MAX_OPEN_RESPONSES} responses in progress at once"))
        elif back is not None and key not in self.cut:
            out.insert(0, Finding("text_interleaved", "a response forgotten in progress went on"))
        reader = _Response(dict(response, id=key), self.declared_tools, self.keeps_delivered, self._free_slot())
        if back is not None:
            reader.cancelled = back.cancelled
        self.responses[key] = reader
        return reader

    def _free_slot(self) -> int:
        """The lowest choice no response in progress has (at most MAX_OPEN_RESPONSES)."""
        taken = {reader.slot for reader in self.responses.values()}
        return next(slot for slot in range(MAX_OPEN_RESPONSES + 1) if slot not in taken)

    def _reader(self, response_id: str | None, out: list[Event]) -> _Response:
        """The response an event belongs to; one never announced is read all the same."""
        if response_id is not None:
            return self.responses.get(response_id) or self._open({"id": response_id}, out)
        return next(reversed(self.responses.values())) if self.responses else self._open({}, out)

    def _created(self, response: dict[str, Any], out: list[Event]) -> None:
        response_id = str_field(response, "id")
        if response_id in self.responses:
            self.responses[response_id].response = response
        else:
            self._open(response, out)
        out.append(ResponseMeta(model=self.model, response_id=response_id))

    def _finished(self, response: dict[str, Any], out: list[Event]) -> None:
        """``response.done``: the turn's output settled, usage, stop reason, then TurnEnd,
        which names the responses still in progress (their choices) as going on."""
        response_id = str_field(response, "id")
        reader = self.responses.pop(response_id, None) if response_id else None
        if reader is None:
            if response_id in self.evicted:  # (its text, read anew on another choice: _open)
                del self.evicted[response_id]
                if response_id not in self.cut:
                    out.append(Finding("text_interleaved", "a response forgotten in progress ended"))
            reader = _Response(response, self.declared_tools, False, self._free_slot())
        self.cut.discard(response_id or "")
        answer: list[Event] = [ResponseMeta(model=self.model, response_id=response_id)]
        status = str_field(response, "status")
        reader._output(response.get("output"), status, answer)
        usage = realtime_usage(response.get("usage"))
        if usage is not None:
            answer.append(usage)
        details = _object(response.get("status_details"))
        if status is None:
            answer.append(Finding("missing_field", "response.done without a status"))
        else:
            answer.append(Finish(stop_reason(status, details)))
        if status == "failed":
            err = details.get("error")
            answer.append(problem_error(err) if isinstance(err, dict) else StreamError(None, "the response failed"))
        out += _on_slot(answer, reader.slot) if reader.slot else answer
        out.append(TurnEnd(tuple(r.slot for r in self.responses.values())))

    def _error(self, err: dict[str, Any], out: list[Event]) -> None:
        if self.responses and str_field(err, "event_id") is None:
            out.append(problem_error(err))
            return
        parts = (str_field(err, k) for k in ("type", "code", "message", "event_id"))
        out.append(Finding("realtime_error", " / ".join(p for p in parts if p)[:MAX_DETAIL]))
        message = str_field(err, "message")
        if message:  # (no StreamError, but a client shows it: the output filters read it)
            out.append(ShownText(message, 0, "error"))

    # -- client events --------------------------------------------------------------------

    def on_client(self, frame: Frame) -> tuple[dict[str, Any], list[Finding]]:
        doc, finding = parse_json_body(frame.data.encode("utf-8", "surrogatepass"))
        findings = [finding] if finding is not None else []
        if not isinstance(doc, dict):
            if finding is None:
                findings.append(Finding("request_invalid_json", "a client event is not one JSON object"))
            return {}, findings
        kind = doc.get("type")
        if kind == "session.update":
            return _settings(_object(doc.get("session"))), findings
        if kind == "response.create":
            response = _object(doc.get("response"))
            reading, inputs = _settings(response), response.get("input")
            messages = [m for item in inputs if (m := _item_message(item))] if isinstance(inputs, list) else []
            if messages:
                reading["messages"] = [*reading.get("messages", []), *messages]
            return reading, findings
        if kind == "conversation.item.create":
            message = _item_message(doc.get("item"))
            return ({"messages": [message]} if message else {}), findings
        if kind == "response.cancel":
            response_id = str_field(doc, "response_id")
            reader = self.responses.get(response_id) if response_id else self._current()
            if reader is None and response_id:
                reader = self.evicted.get(response_id)
            if reader is not None:
                reader.cancelled = True
        return {}, findings  # audio appends, commits, truncates: control, never kept

    def _current(self) -> _Response | None:
        return next(reversed(self.responses.values())) if self.responses else None

    # -- what the proxy sends --------------------------------------------------------------

    def ending(self, rule_id: str, reason: str) -> list[Frame]:
        """The ``error``, then each response in progress as the client knows it closed:
        the done events of its open parts and items and its ``response.done``, filtered.

        Every one of them, not only the one whose text was blocked: the responses share
        the socket, so what the upstream sent of the others after the blocked text was
        held behind it (their ``response.done`` too, maybe) and is dropped with it, and a
        client waiting for a response's end must get one. The evicted ones too
        (:meth:`_open`): the client has them open."""
        if not self.responses and not self.evicted:
            return []
        events = [{"type": "error", "error": _error(rule_id, reason, None)}]
        for reader in [*self.evicted.values(), *self.responses.values()]:
            events += [*reader.closing(self.beta), {"type": "response.done", "response": reader.filtered(self.beta)}]
        return [frame({"type": e.pop("type"), "event_id": event_id(), **e}) for e in events]

    def refusal(self, frame_: Frame, rule_id: str, reason: str) -> list[Frame]:
        blocked = json_object(frame_.data) or {}
        error = _error(rule_id, reason, str_field(blocked, "event_id"))
        return [frame({"type": "error", "event_id": event_id(), "error": error})]

    def for_proxy(self, frame: Frame) -> bool:
        """An error about an event the proxy sent (its ``response.cancel``, ``event_llmaudit_…``),
        or an event of a response the proxy cut (:meth:`upstream_cancel`), up to its own
        ``response.done``: the client has that response's end from the proxy already, and
        another response beside it may go on (the connection's suppression of the rest of
        a cut answer ends with the first response that ends). Parsed only when the data
        names one of them."""
        data = frame.data
        ours = PROXY_EVENT in data
        if not ours and not (self.cut and any(response_id in data for response_id in self.cut)):
            return False
        obj = json_object(data)
        if obj is None:
            return False
        error = obj.get("error") if ours and obj.get("type") == "error" else None
        if isinstance(error, dict):
            return str(error.get("event_id") or "").startswith(PROXY_EVENT)
        return (str_field(obj, "response_id") or str_field(_object(obj.get("response")), "id")) in self.cut

    def upstream_cancel(self) -> list[Frame]:
        """``response.cancel`` for each response in progress (the proxy's ending closed them
        all for the client, :meth:`ending`), unless the client cancelled it already (the
        server would answer a second cancel with an error the client never caused); each is
        noted as cut, so that the rest of it is the proxy's (:meth:`for_proxy`). The evicted
        ones too (:meth:`_open`): the upstream may still send them."""
        self.cut.update(self.evicted, self.responses)
        return [
            frame({"type": "response.cancel", "event_id": event_id(), "response_id": reader.response["id"]})
            for reader in [*self.evicted.values(), *self.responses.values()]
            if not reader.cancelled
        ]


def _item_shown(item: dict[str, Any], out: list[Event]) -> None:
    """A whole item the server sends: the text or call arguments of one the client did not
    write go to the output filters (:class:`~addon.events.ShownText`), not to the record
    (its response's events gave them)."""
    if item.get("role") in ("user", "system"):
        return
    message = _item_message(item) if item.get("type") != "function_call_output" else None
    for call in message.get("tool_calls", ()) if message else ():
        arguments = call["function"].get("arguments")
        if isinstance(arguments, str) and arguments:
            out.append(ShownText(arguments, 0, "conversation_item"))
    if message and message.get("content"):
        out.append(ShownText(message["content"], 0, "conversation_item"))


def _error(rule_id: str, reason: str, blocked_event: str | None) -> dict[str, Any]:
    return {
        "type": "invalid_request_error",
        "code": FILTERED_CODE,
        "message": block_message(rule_id, reason),
        "param": None,
        "event_id": blocked_event,
    }


def _settings(settings: dict[str, Any]) -> dict[str, Any]:
    """``session.update.session`` or ``response.create.response``: instructions as a
    system message, the model and the tools."""
    reading: dict[str, Any] = {}
    instructions = settings.get("instructions")
    if isinstance(instructions, str) and instructions:
        reading["messages"] = [{"role": "system", "content": instructions}]
    if isinstance(settings.get("model"), str):
        reading["model"] = settings["model"]
    if isinstance(settings.get("tools"), list):
        reading["tools"] = settings["tools"]
    return reading


def _item_message(item: Any) -> dict[str, Any] | None:
    """A conversation item as a shared-shape message: a message's text parts (and any
    transcript the client sent, never audio), a tool's output, a call."""
    if not isinstance(item, dict):
        return None
    kind = item.get("type")
    if kind == "function_call_output":
        output = item.get("output")
        return {
            "role": "tool",
            "content": output if isinstance(output, str) else "",
            "tool_call_id": item.get("call_id"),
        }
    if kind == "function_call":
        call = {"name": item.get("name"), "arguments": item.get("arguments")}
        return {"role": "assistant", "tool_calls": [{"id": item.get("call_id"), "function": call}]}
    if kind not in (None, "message"):
        return None
    role = str_field(item, "role") or "user"
    content = item.get("content")
    texts = []
    for part in content if isinstance(content, list) else []:
        if isinstance(part, dict):
            text = part.get("text") if isinstance(part.get("text"), str) else part.get("transcript")
            if isinstance(text, str) and text:
                texts.append(text)
    return {"role": role, "content": "\n".join(texts)} if texts else None


DIALECT = OpenAIRealtime()
