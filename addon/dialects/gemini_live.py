"""The Gemini Live dialect: ``BidiGenerateContent`` JSON messages over one WebSocket.

Recognised at the upgrade by a path holding ``BidiGenerateContent``: the Gemini API's
``/ws/google.ai.generativelanguage.<version>.GenerativeService.BidiGenerateContent`` (and
``...BidiGenerateContentConstrained``, for ephemeral tokens) and Vertex AI's
``/ws/google.cloud.aiplatform.<version>.LlmBidiService/BidiGenerateContent``; the host
names the provider (``gcp.gemini``, ``gcp.vertex_ai``). Messages may be text or binary
WebSocket messages: the ``ws_json`` reader decodes both as UTF-8 JSON.

The client's messages (camelCase or the Python SDK's snake_case keys) read as the shared
request shape: ``setup`` gives the model and the system instruction, ``clientContent``
turns and ``realtimeInput`` text are messages, ``toolResponse`` function responses are
tool messages; audio and video blobs are control messages, never kept.

The server's: ``serverContent.modelTurn.parts[].text`` is the answer (``thought`` parts
its reasoning), ``outputTranscription.text`` the transcript of a spoken answer (what the
user hears: answer text too); ``toolCall.functionCalls`` are whole calls; top-level
``usageMetadata`` is the turn's usage (``responseTokenCount``, or GenerateContent's
``candidatesTokenCount``; per-modality details). ``executableCode`` and ``codeExecutionResult`` parts (code execution) go to the output
filters. ``interrupted`` (the user spoke over the
answer) is the stop reason ``interrupted`` at once. Only ``turnComplete`` ends the turn (a
tool call does not: the answer after the tool's response is the same record): its stop
reason is ``turnCompleteReason``, else ``interrupted`` after an interruption, else
``STOP`` (Gemini's own name), then :class:`~addon.events.TurnEnd`, after the usage of the
same message. Usage arriving after the turn it counts ended is the
finding ``ws_usage_after_turn``, not added to the next turn: a record's counts must be
its own (billing audits add them up). ``goAway`` is the finding ``ws_go_away``.

Gemini Live has no JSON error message: the server closes the connection with a code and
a reason (:func:`close_error` reads them). So a cut answer gets no frames; the proxy closes
the connection with 1008 (policy violation) and the rule and reason
(:meth:`GeminiLiveNormalizer.close_after_block`), which the SDK raises as an ``APIError``.
"""

from __future__ import annotations

from typing import Any

import orjson

from addon.dialects import (
    BlockedResponse,
    Dialect,
    JsonEventNormalizer,
    Normalizer,
    RequestSummary,
    RequestView,
    int_field,
    parse_json_body,
    str_field,
)
from addon.dialects.blocking import BLOCKED_STATUS, block_message, json_response
from addon.events import (
    Event,
    Finding,
    Finish,
    PromptText,
    ShownText,
    StreamError,
    TextDelta,
    ToolCallDelta,
    TurnEnd,
    Usage,
)
from addon.framing import Frame
from addon.framing.ws_json import WRITER

FRAMING = "ws_json"
METHOD = "BidiGenerateContent"
POLICY_VIOLATION = 1008  # the WebSocket close code for a block
NORMAL_CLOSURE = 1000
MAX_CLOSE_REASON = 123  # bytes: a close frame's payload is 125, two of them the code
MAX_DETAIL = 300
# usageMetadata modality details -> the Usage fields they fill (input, output).
MODALITY_FIELDS = {
    "TEXT": ("input_text_tokens", "output_text_tokens"),
    "AUDIO": ("input_audio_tokens", "output_audio_tokens"),
    "IMAGE": ("input_image_tokens", None),
}
ROLES = {"model": "assistant", "user": "user", "system": "system", "function": "tool"}


class GeminiLive(Dialect):
    name = "gemini-live"
    provider = "gcp.gemini"  # *aiplatform.googleapis.com maps to gcp.vertex_ai by host

    def matches(self, request: RequestView) -> bool:
        return False  # a WebSocket protocol: no HTTP exchange is Live's

    def websocket(self, request: RequestView, first: bytes | None) -> str | None:
        return FRAMING if METHOD in request.path else None

    def summarize(self, body: Any, request: RequestView) -> RequestSummary:
        return RequestSummary()  # the model comes in the setup message

    def normalizer(self, request: RequestSummary) -> Normalizer:
        return GeminiLiveNormalizer()

    def blocked_response(
        self, summary: RequestSummary, request_view: RequestView, rule_id: str, reason: str, streaming: bool
    ) -> BlockedResponse:
        """A blocked upgrade: Google's error JSON (HTTP 400)."""
        error = {"code": BLOCKED_STATUS, "message": block_message(rule_id, reason), "status": "INVALID_ARGUMENT"}
        return json_response({"error": error})


def close_error(code: int | None, reason: str) -> StreamError | None:
    """What a connection's close means for the turn in progress: a close other than a
    normal one (1000) is the server's error, its code ``ws_close_<code>`` (1006 when no
    close frame came: the connection was lost); None for a normal close."""
    if code == NORMAL_CLOSURE:
        return None
    return StreamError(f"ws_close_{code if code is not None else 1006}", reason or None)


def close_reason(reason: str) -> str:
    """``reason`` cut to fit a close frame (123 bytes of UTF-8, whole characters)."""
    return reason.encode()[:MAX_CLOSE_REASON].decode("utf-8", "ignore")


def _get(obj: dict[str, Any], camel: str, snake: str) -> Any:
    value = obj.get(camel)
    return obj.get(snake) if value is None else value


def _first(value: int | None, other: int | None) -> int | None:
    return other if value is None else value


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _content_text(content: Any) -> str:
    """The text parts of a ``Content`` (or a bare string, as some clients send)."""
    if isinstance(content, str):
        return content
    parts = _object(content).get("parts")
    texts = (
        [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]
        if isinstance(parts, list)
        else []
    )
    return "".join(texts)


def _json_text(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except (orjson.JSONEncodeError, TypeError):
        return str(value)[:MAX_DETAIL]


class GeminiLiveNormalizer(JsonEventNormalizer):
    """A whole Live session: its turns and the client's messages."""

    framing = FRAMING
    writer = WRITER
    filter_stop_reason = "SAFETY"

    def __init__(self) -> None:
        super().__init__()
        self.in_turn = False  # something of a turn arrived since the last turnComplete
        self.interrupted = False
        self.calls = 0

    # -- server messages ------------------------------------------------------------------

    def on_json(self, event: Frame, obj: dict[str, Any]) -> list[Event]:
        out: list[Event] = []
        content = _get(obj, "serverContent", "server_content")
        ending = False
        if isinstance(content, dict):
            ending = self._content(content, out)
        call = _get(obj, "toolCall", "tool_call")
        if isinstance(call, dict):
            self._tool_call(call, out)
        usage = _get(obj, "usageMetadata", "usage_metadata")
        if isinstance(usage, dict):
            self._usage(usage, out)
        away = _get(obj, "goAway", "go_away")
        if isinstance(away, dict):
            out.append(Finding("ws_go_away", f"time left {_json_text(_get(away, 'timeLeft', 'time_left'))}"))
        if ending:
            out.append(Finish(self._reason(content)))
            out.append(TurnEnd())
            self.in_turn = self.interrupted = False
        return out

    def on_close(self, code: int | None, reason: str) -> list[Event]:
        error = close_error(code, reason)
        return [error] if error is not None else []

    def on_end(self, cut: bool = False) -> list[Event]:
        if self.in_turn:
            return [Finding("missing_stream_end", "the connection closed during a turn")]
        return []

    def _content(self, content: dict[str, Any], out: list[Event]) -> bool:
        """``serverContent``: text, transcript, interruption; whether it ends the turn."""
        turn = _get(content, "modelTurn", "model_turn")
        parts = _object(turn).get("parts")
        for part in parts if isinstance(parts, list) else []:
            if isinstance(part, dict) and isinstance(part.get("text"), str) and part["text"]:
                self.in_turn = True
                out.append(TextDelta(part["text"], 0, "reasoning" if part.get("thought") is True else "text"))
            elif isinstance(part, dict):
                self._code(part, out)
        heard = _object(_get(content, "inputTranscription", "input_transcription")).get("text")
        if isinstance(heard, str) and heard:  # what the user said (a voice prompt): the turn's request side
            out.append(PromptText(heard, piece=True))
        text = _object(_get(content, "outputTranscription", "output_transcription")).get("text")
        if isinstance(text, str) and text:
            self.in_turn = True
            out.append(TextDelta(text))
        if content.get("interrupted") is True:  # the user spoke over the answer: it stops here
            self.interrupted = self.in_turn = True
            out.append(Finish("interrupted"))
        return _get(content, "turnComplete", "turn_complete") is True

    def _code(self, part: dict[str, Any], out: list[Event]) -> None:
        """Code the model wrote and what running it printed (code execution): shown to the
        user, so checked by the output filters (:class:`~addon.events.ShownText`), not the answer's text."""
        for key, snake, field in (
            ("executableCode", "executable_code", "code"),
            ("codeExecutionResult", "code_execution_result", "output"),
        ):
            text = _object(_get(part, key, snake)).get(field)
            if isinstance(text, str) and text:
                self.in_turn = True
                out.append(ShownText(text, 0, "code"))

    def _reason(self, content: dict[str, Any]) -> str:
        reason = str_field(content, "turnCompleteReason") or str_field(content, "turn_complete_reason")
        if reason and not reason.endswith("UNSPECIFIED"):
            return reason
        return "interrupted" if self.interrupted else "STOP"

    def _tool_call(self, call: dict[str, Any], out: list[Event]) -> None:
        calls = _get(call, "functionCalls", "function_calls")
        for fc in calls if isinstance(calls, list) else []:
            if isinstance(fc, dict):
                self.in_turn = True
                self.calls += 1
                call_id = str_field(fc, "id")
                args = fc.get("args")
                arguments = "" if args is None else _json_text(args)
                out.append(
                    ToolCallDelta(call_id or f"call{self.calls}", arguments, call_id, str_field(fc, "name"), 0, True)
                )

    def _usage(self, usage: dict[str, Any], out: list[Event]) -> None:
        counts: dict[str, int | None] = {
            "input_tokens": int_field(usage, "promptTokenCount"),
            "output_tokens": _first(int_field(usage, "responseTokenCount"), int_field(usage, "candidatesTokenCount")),
            "cache_read_input_tokens": int_field(usage, "cachedContentTokenCount"),
            "reasoning_output_tokens": int_field(usage, "thoughtsTokenCount"),
        }
        for side, key in ((0, "promptTokensDetails"), (1, "responseTokensDetails")):
            details = usage.get(key)
            for detail in details if isinstance(details, list) else []:
                if isinstance(detail, dict):
                    name = MODALITY_FIELDS.get(str_field(detail, "modality") or "", (None, None))[side]
                    if name is not None:
                        counts[name] = int_field(detail, "tokenCount")
        report = Usage(**counts)
        if report == Usage():
            return
        if self.in_turn:
            out.append(report)
        else:  # the turn it counts was already written: its record cannot take it any more
            shown = {k: v for k, v in counts.items() if v is not None}
            out.append(Finding("ws_usage_after_turn", _json_text(shown)[:MAX_DETAIL]))

    # -- client messages ------------------------------------------------------------------

    def on_client(self, frame: Frame) -> tuple[dict[str, Any], list[Finding]]:
        doc, finding = parse_json_body(frame.data.encode("utf-8", "surrogatepass"))
        findings = [finding] if finding is not None else []
        if not isinstance(doc, dict):
            if finding is None:
                findings.append(Finding("request_invalid_json", "a client message is not one JSON object"))
            return {}, findings
        setup = doc.get("setup")
        if isinstance(setup, dict):
            return _setup(setup), findings
        content = _get(doc, "clientContent", "client_content")
        if isinstance(content, dict):
            turns = content.get("turns")
            messages = [_turn(t) for t in turns if isinstance(t, dict)] if isinstance(turns, list) else []
            return _messages([m for m in messages if m["content"]]), findings
        realtime = _get(doc, "realtimeInput", "realtime_input")
        if isinstance(realtime, dict):
            text = realtime.get("text")
            return _messages([{"role": "user", "content": text}] if isinstance(text, str) and text else []), findings
        response = _get(doc, "toolResponse", "tool_response")
        if isinstance(response, dict):
            answers = _get(response, "functionResponses", "function_responses")
            tools = [_tool_message(r) for r in answers if isinstance(r, dict)] if isinstance(answers, list) else []
            return _messages(tools), findings
        return {}, findings

    def ending(self, rule_id: str, reason: str) -> list[Frame]:
        return []  # no JSON error exists: the close (close_after_block) ends the answer

    def close_after_block(self, reason: str) -> tuple[int, str] | None:
        return POLICY_VIOLATION, close_reason(reason)


def _messages(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"messages": messages} if messages else {}


def _setup(setup: dict[str, Any]) -> dict[str, Any]:
    reading: dict[str, Any] = {}
    model = str_field(setup, "model")
    if model:
        reading["model"] = model.rpartition("/")[2]  # models/<id>, Vertex projects/.../models/<id>
    system = _content_text(_get(setup, "systemInstruction", "system_instruction"))
    if system:
        reading["messages"] = [{"role": "system", "content": system}]
    if isinstance(setup.get("tools"), list):
        reading["tools"] = setup["tools"]
    return reading


def _turn(content: dict[str, Any]) -> dict[str, Any]:
    role = str_field(content, "role") or "user"
    return {"role": ROLES.get(role, role), "content": _content_text(content)}


def _tool_message(response: dict[str, Any]) -> dict[str, Any]:
    result = response.get("response")
    return {
        "role": "tool",
        "content": result if isinstance(result, str) else _json_text(result),
        "tool_call_id": str_field(response, "id"),
        "name": str_field(response, "name"),
    }


DIALECT = GeminiLive()
