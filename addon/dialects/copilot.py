"""The consumer Copilot dialect: ``wss://copilot.microsoft.com/c/api/chat`` JSON events.

Recognised at the upgrade by a path ending in ``/c/api/chat``. No schema is published;
this reads what the public clients send and accept (docs/dialects.md names them). Each
message is a JSON object with an ``event`` key; a message may hold several objects one
after another and stray ``0x1E`` separators, so messages are split (at most
:data:`MAX_OBJECTS` objects each).

Client: ``send`` is the prompt (``content[].text``, a user message) with its ``mode``
(``chat``, ``smart``, ``reasoning``: the model the user picked, the only model choice the
client makes, so it is the record's request model); ``setOptions`` and the rest are
control messages.

Server: ``startMessage`` names the bot message of the answer; ``appendText`` carries its
text as deltas, ``chainOfThought`` its reasoning, ``partCompleted`` ends a part;
``done`` ends the turn (stop reason ``stop``). ``replaceText`` (semantics undocumented)
replaces text a client shows: the deltas stay the record's text (what streamed), the
replacement goes to the output filters as :class:`~addon.events.ShownText`. ``error``
(shape undocumented) is the turn's StreamError and ends it (stop reason ``error``; a
``done`` for the same message after it is not a new turn). ``challenge`` (a bot check
the client must pass before it is answered) is the finding ``copilot_challenge``.
``titleUpdate`` and ``suggestedFollowups`` (model-written text shown after the answer)
go to the output filters as :class:`~addon.events.ShownText`; ``citation``, image events,
``ping``: nothing (they carry no answer text).

When a filter cuts an answer (or blocks a ``send``), the client gets ``{"event":
"error", "messageId", "code": "content_filtered", "message"}`` then ``{"event":
"done", "messageId"}`` for the bot message (a fresh id for a blocked send), their ``id``
continuing the server's sequence: the error is the only place for the rule and reason,
and ``done`` is what every client waits for to end the answer. No error shape is
documented; the clients seen raise on any ``error`` event.
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any

import orjson

from addon.dialects import (
    BlockedResponse,
    Dialect,
    Normalizer,
    RequestSummary,
    RequestView,
    str_field,
)
from addon.dialects.blocking import FILTERED_CODE, block_message, frame, json_response, random_id
from addon.events import Event, Finding, Finish, ShownText, StreamError, TextDelta, TurnEnd
from addon.framing import Frame
from addon.framing.ws_json import WRITER

FRAMING = "ws_json"
PATH_SUFFIX = "/c/api/chat"
RECORD_SEPARATOR = "\x1e"
MAX_OBJECTS = 64  # JSON objects read from one message
MAX_SHOWN = 4096  # characters of one title or suggestion the filters read
MAX_ENDED = 32  # message ids remembered as ended (a late done repeats one)
MAX_DETAIL = 300
_DECODER = json.JSONDecoder()


def split_objects(data: str) -> tuple[list[dict[str, Any]], list[Finding]]:
    """The JSON objects of one message: one, or several back to back (``0x1E`` removed)."""
    if RECORD_SEPARATOR in data:
        data = data.replace(RECORD_SEPARATOR, "")
    try:
        one = orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    else:
        if isinstance(one, dict):
            return [one], []
        return [], [Finding("invalid_json", "a Copilot message is not a JSON object")]
    objects: list[dict[str, Any]] = []
    findings: list[Finding] = []
    pos, end = 0, len(data)
    while len(objects) < MAX_OBJECTS:
        while pos < end and data[pos] in " \t\r\n":
            pos += 1
        if pos >= end:
            return objects, findings
        start = pos
        try:
            obj, pos = _DECODER.raw_decode(data, pos)
        except (ValueError, RecursionError):  # (also integers beyond Python's digit limit)
            return objects, [*findings, Finding("invalid_json", f"a Copilot message is not JSON from offset {pos}")]
        if not isinstance(obj, dict):
            return objects, [
                *findings,
                Finding("invalid_json", "a Copilot message holds a JSON value that is not an object"),
            ]
        if not findings and _lenient(data[start:pos]):
            findings.append(LENIENT_MESSAGE)
        objects.append(obj)
    return objects, [
        *findings,
        Finding("invalid_json", f"a Copilot message holds more than {MAX_OBJECTS} objects; the rest unread"),
    ]


#: A message only lenient readers take (``NaN``, a lone surrogate escape): read all the
#: same, as the Copilot client's ``JSON.parse`` (a lone surrogate) or a Python peer reads it.
LENIENT_MESSAGE = Finding("lenient_json", "a Copilot message: JSON only lenient readers take")


_REQUEST_CODES = {"lenient_json": "request_lenient_json"}


def _lenient(text: str) -> bool:
    """Whether orjson (strict JSON) refuses an object Python's reader took."""
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return True
    return False


class Copilot(Dialect):
    name = "copilot"
    provider = "microsoft"

    def matches(self, request: RequestView) -> bool:
        return False  # a WebSocket protocol: the HTTP endpoints beside it carry no answer

    def websocket(self, request: RequestView, first: bytes | None) -> str | None:
        return FRAMING if request.path.rstrip("/").endswith(PATH_SUFFIX) else None

    def summarize(self, body: Any, request: RequestView) -> RequestSummary:
        return RequestSummary()  # the mode (model) and conversation come with each send

    def normalizer(self, request: RequestSummary) -> Normalizer:
        return CopilotNormalizer()

    def blocked_response(
        self, summary: RequestSummary, request_view: RequestView, rule_id: str, reason: str, streaming: bool
    ) -> BlockedResponse:
        """A blocked upgrade: a JSON error (HTTP 400); Copilot has no documented one."""
        return json_response({"error": {"code": FILTERED_CODE, "message": block_message(rule_id, reason)}})


class CopilotNormalizer(Normalizer):
    """A whole Copilot chat connection: its answers, one turn each, and the client's sends."""

    framing = FRAMING
    writer = WRITER

    def __init__(self) -> None:
        self.message_id: str | None = None  # the bot message being answered
        self.in_turn = False
        self.ended: deque[str] = deque(maxlen=MAX_ENDED)
        self.last_id: int | None = None  # the server's last numeric event id

    def on_event(self, event: Frame) -> list[Event]:
        objects, out = split_objects(event.data)
        events: list[Event] = list(out)
        for obj in objects:
            self._event(obj, events)
        return events

    def on_end(self, cut: bool = False) -> list[Event]:
        if self.in_turn:
            return [Finding("missing_stream_end", "the connection closed during an answer")]
        return []

    def _event(self, obj: dict[str, Any], out: list[Event]) -> None:
        seq = obj.get("id")
        if isinstance(seq, str) and seq.isdigit() and len(seq) < 19:
            self.last_id = int(seq)
        kind = obj.get("event")
        message_id = str_field(obj, "messageId")
        if kind == "startMessage":
            self.message_id, self.in_turn = message_id, True
        elif kind == "appendText":
            self._text(obj, message_id, "text", out)
        elif kind == "chainOfThought":
            self._text(obj, message_id, "reasoning", out)
        elif kind == "replaceText":
            text = obj.get("text")
            if isinstance(text, str) and text:
                out.append(ShownText(text, 0, "replaced_text"))
        elif kind in ("done", "error"):
            self._end(kind, obj, message_id, out)
        elif kind == "challenge":
            out.append(Finding("copilot_challenge", f"method {_short(obj.get('method'))}"))
        elif kind in ("titleUpdate", "suggestedFollowups"):
            self._shown(obj, out)

    @staticmethod
    def _shown(obj: dict[str, Any], out: list[Event]) -> None:
        """A title or follow-up suggestions: model-written text the page shows after the
        answer, checked by the output filters as the answer is (not part of its text)."""
        texts = [obj.get("title")] if obj.get("event") == "titleUpdate" else obj.get("suggestions")
        for text in texts if isinstance(texts, list) else []:
            if isinstance(text, str) and text:
                out.append(ShownText(text[:MAX_SHOWN], 0, "suggestion"))

    def _text(self, obj: dict[str, Any], message_id: str | None, kind: str, out: list[Event]) -> None:
        text = obj.get("text")
        if isinstance(text, str) and text:
            if not self.in_turn:
                self.message_id, self.in_turn = message_id or self.message_id, True
            out.append(TextDelta(text, 0, kind))

    def _end(self, kind: str, obj: dict[str, Any], message_id: str | None, out: list[Event]) -> None:
        if message_id is not None and message_id in self.ended:
            return  # the same answer's end again (a done after its error)
        if kind == "error":
            code = str_field(obj, "code") or str_field(obj, "errorCode") or "error"
            message = str_field(obj, "message") or str_field(obj, "text") or _short(obj)
            out.append(StreamError(code, message))
        out.append(Finish("stop" if kind == "done" else "error"))
        out.append(TurnEnd())
        ended = message_id or self.message_id
        if ended is not None:
            self.ended.append(ended)
        self.message_id, self.in_turn = None, False

    # -- client messages ------------------------------------------------------------------

    def on_client(self, frame: Frame) -> tuple[dict[str, Any], list[Finding]]:
        objects, unread = split_objects(frame.data)
        # (the request-side codes: a message the filters could not read takes the failure
        # policy; one read leniently was read, as the server reads it)
        findings = [Finding(_REQUEST_CODES.get(f.code, "request_invalid_json"), f.detail) for f in unread]
        reading: dict[str, Any] = {}
        for obj in objects:
            if obj.get("event") != "send":
                continue  # setOptions, consents, pings: control
            content = obj.get("content")
            texts = (
                [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str) and p["text"]]
                if isinstance(content, list)
                else []
            )
            if texts:
                reading.setdefault("messages", []).append({"role": "user", "content": "\n".join(texts)})
            mode = str_field(obj, "mode")
            if mode:
                reading["model"] = mode
        return reading, findings

    # -- what the proxy sends --------------------------------------------------------------

    def ending(self, rule_id: str, reason: str) -> list[Frame]:
        if not self.in_turn:
            return []
        return self._error_and_done(self.message_id or random_id(""), rule_id, reason)

    def refusal(self, frame_: Frame, rule_id: str, reason: str) -> list[Frame]:
        return self._error_and_done(random_id(""), rule_id, reason)

    def _error_and_done(self, message_id: str, rule_id: str, reason: str) -> list[Frame]:
        events: list[dict[str, Any]] = [
            {
                "event": "error",
                "messageId": message_id,
                "code": FILTERED_CODE,
                "message": block_message(rule_id, reason),
            },
            {"event": "done", "messageId": message_id},
        ]
        if self.last_id is not None:
            for n, event in enumerate(events, 1):
                event["id"] = str(self.last_id + n)
        return [frame(event) for event in events]


def _short(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()[:MAX_DETAIL]
    except (orjson.JSONEncodeError, TypeError):
        return str(type(value).__name__)


DIALECT = Copilot()
