"""Ollama's native API: ``POST /api/chat`` and ``POST /api/generate``.

Recognised by a POST whose path ends with ``/api/chat`` or ``/api/generate`` (also behind
a prefix, as Open WebUI serves it at ``/ollama/api/chat``) and whose body is a JSON
object naming a ``model``, so that other web applications' ``/api/chat`` routes are not
claimed. The OpenAI-compatible ``/v1/chat/completions`` that Ollama also serves stays
with the ``openai-chat`` dialect: its path does not end like these.

A request streams unless it says ``"stream": false``. A stream is NDJSON
(:mod:`addon.framing.ndjson`, ``application/x-ndjson``), one object per line; each line
is a delta: ``message.content`` (chat) or ``response`` (generate) is answer text,
``message.thinking`` / ``thinking`` is reasoning, and ``message.tool_calls[]`` are whole
calls whose ``function.arguments`` is a JSON object (recorded as its JSON text). The
last line has ``done: true`` with ``done_reason`` (the finish), ``prompt_eval_count`` and
``eval_count`` (the usage) and timings (not recorded). An error after the stream began is
a line ``{"error": "..."}`` and ends it; before it began, Ollama answers an HTTP error
with that body. A non-streamed answer is the one object a stream's lines add up to.

When a content filter stops an exchange, the client gets what it gets at any normal end
of an Ollama answer: a last line with ``done: true`` and ``done_reason:
"content_filter"`` (empty ``message.content`` or ``response``). The official ``ollama``
client ends its iteration cleanly on it and hands the caller the reason; the other
choice, an ``{"error": ...}`` line, would make the client raise ``ResponseError`` in the
middle of the caller's loop, losing the answer shown so far, for what is an ordinary
stop rather than a failure. A held non-streamed answer is replaced by the answer read,
its text emptied and ``done_reason: "content_filter"`` (HTTP 200, its model and counts).
A request blocked before it went upstream gets, when streaming, that one last line as
the whole stream (HTTP 200), else Ollama's error shape ``{"error": "..."}`` with HTTP
400, which the client raises as ``ResponseError`` with the rule and reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
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
    str_field,
)
from addon.dialects.blocking import block_message, event_stream, frame, json_response, kept
from addon.events import Event, Finding, Finish, ResponseMeta, StreamEnd, StreamError, TextDelta, ToolCallDelta, Usage
from addon.framing import Frame
from addon.framing.ndjson import MEDIA_TYPE, NDJSON_WRITER
from exchange.request import tool_names

CHAT, GENERATE = "chat", "generate"
PATH_SUFFIXES = {"/api/chat": CHAT, "/api/generate": GENERATE}
FILTER = "content_filter"  # the done_reason of an answer a content filter stopped
# The fields of an answer that carry no generated text: kept when a filter empties it.
KEPT_FIELDS = (
    "model",
    "created_at",
    "total_duration",
    "load_duration",
    "prompt_eval_count",
    "prompt_eval_duration",
    "eval_count",
    "eval_duration",
)


def go_field(body: dict[str, Any], name: str) -> Any:
    """``body``'s field ``name`` as Ollama reads it: Go's ``encoding/json`` takes a key
    that matches a field's name in any case (``MODEL``, ``Model``; with Unicode's simple
    folds, so ``ſ`` is ``s`` and the Kelvin sign ``k``), and of several, the last. Read
    exactly, ``{"MODEL": …}`` was no Ollama request (no record, no filter) and
    ``{"model": "small", "Model": "large"}`` recorded the model the server did not run."""
    found = None
    for key, value in body.items():  # (Go sets the field at each key that matches it: the last one stays)
        if key == name or (isinstance(key, str) and len(key) == len(name) and key.casefold() == name):
            found = value
    return found


def _endpoint(path: str) -> str | None:
    """``"chat"`` or ``"generate"`` for an Ollama API path (any prefix), else None."""
    path = path.rstrip("/")
    return next((endpoint for suffix, endpoint in PATH_SUFFIXES.items() if path.endswith(suffix)), None)


@dataclass(slots=True)
class OllamaRequestSummary(RequestSummary):
    """The request summary, plus which endpoint it went to (the answer's shape differs)."""

    endpoint: str = CHAT


class Ollama(Dialect):
    name = "ollama"
    provider = "ollama"

    def matches(self, request: RequestView) -> bool:
        return request.method.upper() == "POST" and _endpoint(request.path) is not None

    def accepts_body(self, body: Any, request: RequestView) -> bool:
        return isinstance(body, dict) and isinstance(go_field(body, "model"), str)

    def summarize(self, body: Any, request: RequestView) -> RequestSummary:
        endpoint = _endpoint(request.path) or CHAT
        if not isinstance(body, dict):
            return OllamaRequestSummary(endpoint=endpoint)
        stream = go_field(body, "stream")  # Ollama streams unless told not to
        model = go_field(body, "model")
        return OllamaRequestSummary(
            model=model if isinstance(model, str) else None,
            stream=stream if isinstance(stream, bool) else True if stream is None else None,
            declared_tools=tool_names(body),
            endpoint=endpoint,
        )

    def normalizer(self, request: RequestSummary) -> Normalizer:
        endpoint = request.endpoint if isinstance(request, OllamaRequestSummary) else CHAT
        return OllamaNormalizer(endpoint, streamed=request.stream is not False, model=request.model)

    def blocked_response(
        self, summary: RequestSummary, request_view: RequestView, rule_id: str, reason: str, streaming: bool
    ) -> BlockedResponse:
        if not streaming:
            return json_response({"error": block_message(rule_id, reason)})
        endpoint = summary.endpoint if isinstance(summary, OllamaRequestSummary) else CHAT
        last = _last_line(endpoint, {"model": summary.model or "", "created_at": _now()})
        return event_stream([frame(last)], NDJSON_WRITER, [("content-type", MEDIA_TYPE)])


class OllamaNormalizer(JsonEventNormalizer):
    """Turns Ollama's NDJSON lines (or its one JSON answer) into common events."""

    filter_stop_reason = FILTER
    writer = NDJSON_WRITER

    def __init__(self, endpoint: str = CHAT, streamed: bool = True, model: str | None = None) -> None:
        super().__init__()
        self.endpoint = endpoint
        self.framing = "ndjson" if streamed else "whole"
        self.model = model  # the request's, until an answer names its own
        self.created_at: str | None = None
        self.meta_model: str | None = None  # the model last reported as ResponseMeta
        self.calls = 0  # tool calls so far, for unique keys
        self.answer: dict[str, Any] | None = None  # a non-streamed answer read

    def on_json(self, event: Frame, obj: dict[str, Any]) -> list[Event]:
        out = self._part(obj)
        if obj.get("done") is True or "error" in obj:
            out.append(StreamEnd())  # the last line (an error line is the last too)
        return out

    def on_response(self, response: dict[str, Any]) -> list[Event]:
        self.answer = response
        return self._part(response)

    def on_end(self, cut: bool = False) -> list[Event]:
        out = super().on_end(cut)
        if cut:
            out.append(Finding("ndjson_unterminated_line", "the body's last line has no line feed"))
        return out

    def ending(self, rule_id: str, reason: str) -> list[Frame]:
        """The last line of a stream a filter stopped (see the module docstring)."""
        if self.ended:
            return []
        return [frame(_last_line(self.endpoint, {"model": self.model or "", "created_at": self.created_at or _now()}))]

    def filtered_body(self, rule_id: str, reason: str) -> BlockedResponse | None:
        """The answer read, its text emptied and finished ``content_filter`` (HTTP 200)."""
        if self.answer is None or "error" in self.answer:
            return None
        return json_response(_last_line(self.endpoint, kept(self.answer, KEPT_FIELDS)), 200)

    # -- one object ---------------------------------------------------------------------------

    def _part(self, obj: dict[str, Any]) -> list[Event]:
        """The events of one line or answer: a delta, maybe the last one."""
        if "error" in obj:
            return [_error(obj["error"])]
        out: list[Event] = []
        model = str_field(obj, "model")
        if model and model != self.meta_model:
            self.model = self.meta_model = model
            out.append(ResponseMeta(model=model))
        self.created_at = str_field(obj, "created_at") or self.created_at
        message = obj.get("message")
        if isinstance(message, dict):
            self._text(message, "content", "thinking", out)
            calls = message.get("tool_calls")
            for call in calls if isinstance(calls, list) else []:
                self._tool_call(call, out)
        else:
            self._text(obj, "response", "thinking", out)
        if obj.get("done") is True:
            reason = str_field(obj, "done_reason")
            if reason:
                out.append(Finish(reason))
            usage = Usage(input_tokens=int_field(obj, "prompt_eval_count"), output_tokens=int_field(obj, "eval_count"))
            if usage != Usage():
                out.append(usage)
        return out

    @staticmethod
    def _text(obj: dict[str, Any], text_key: str, thinking_key: str, out: list[Event]) -> None:
        thinking, text = obj.get(thinking_key), obj.get(text_key)
        if isinstance(thinking, str) and thinking:
            out.append(TextDelta(thinking, kind="reasoning"))
        if isinstance(text, str) and text:
            out.append(TextDelta(text))

    def _tool_call(self, call: Any, out: list[Event]) -> None:
        """One whole call: ``{"id"?, "function": {"name", "arguments": {...}}}``."""
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            out.append(Finding("missing_field", "a tool call without a function object"))
            return
        self.calls += 1
        name, call_id = str_field(function, "name"), str_field(call, "id")
        out.append(ToolCallDelta(f"call{self.calls}", _arguments(function.get("arguments")), call_id, name, 0, True))


def _arguments(value: Any) -> str:
    """The arguments as JSON text (Ollama sends an object; a string is kept as sent)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    try:
        return orjson.dumps(value).decode()
    except (orjson.JSONEncodeError, TypeError):  # e.g. an integer beyond 64 bits
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _error(err: Any) -> StreamError:
    """``{"error": "text"}`` (Ollama), or an object some proxies in front of it send."""
    if isinstance(err, dict):
        return StreamError(str_field(err, "code") or str_field(err, "type"), str_field(err, "message"))
    return StreamError(None, err if isinstance(err, str) else None)


def _last_line(endpoint: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The last object of an answer a filter stopped: empty text, ``done_reason`` the filter's."""
    empty: dict[str, Any] = {"message": {"role": "assistant", "content": ""}} if endpoint == CHAT else {"response": ""}
    return {**fields, **empty, "done": True, "done_reason": FILTER}


def _now() -> str:
    """The current time as Ollama writes ``created_at`` (RFC 3339, UTC)."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


DIALECT = Ollama()
