"""Ollama's native API as the mock answers it: ``POST …/api/chat`` and ``…/api/generate``.

A request streams unless its body says ``"stream": false`` (Ollama's default, unlike the
other APIs): the stream is NDJSON (``application/x-ndjson``), one object per line and per
write, so the server paces lines as it paces events. Thinking comes first (``thinking``),
then the text, then the tool calls (whole, in one line, ``arguments`` an object, as
Ollama sends them), then the last line with ``done: true``, ``done_reason`` and the counts.
An ``error`` scenario ends the stream with Ollama's error line ``{"error": "..."}``; an
HTTP error (``status >= 400``, or a failing request that does not stream) has the body
``{"error": "..."}``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson

from .scenario import Scenario
from .streams import Dialect, Generation, error_message, generate, http_error

NDJSON = "application/x-ndjson"
# The mock's stop, as Ollama's done_reason (a tool call ends with "stop" too).
DONE_REASONS = {"end": "stop", "tool_use": "stop", "max_tokens": "length"}


def _line(obj: dict[str, Any]) -> bytes:
    return orjson.dumps(obj) + b"\n"


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _generation(request: dict[str, Any], scenario: Scenario) -> Generation:
    options = request.get("options")
    limit = options.get("num_predict") if isinstance(options, dict) else None
    return generate(request, scenario, max_tokens=limit)


def _tool_calls(generation: Generation) -> list[dict[str, Any]]:
    """The whole calls (a call the token limit cut is never sent: Ollama parses calls whole)."""
    return [
        {
            "id": generation.call_id(call),
            "function": {"index": call.index, "name": call.name, "arguments": orjson.loads(call.arguments)},
        }
        for call in generation.tool_calls
        if call.complete
    ]


def _done(generation: Generation) -> dict[str, Any]:
    return {
        "done": True,
        "done_reason": DONE_REASONS.get(generation.stop, "stop"),
        "total_duration": 1_234_567,
        "load_duration": 12_345,
        "prompt_eval_count": generation.input_tokens,
        "prompt_eval_duration": 23_456,
        "eval_count": generation.output_tokens,
        "eval_duration": 345_678,
    }


def _lines(request: dict[str, Any], scenario: Scenario, chat: bool) -> list[bytes]:
    """The streamed lines of one answer: deltas, then the last line (or the error line)."""
    generation = _generation(request, scenario)
    head = {"model": generation.model, "created_at": _now()}

    def delta(text: str = "", thinking: str = "", calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        if not chat:
            return {**head, "response": text, **({"thinking": thinking} if thinking else {}), "done": False}
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if thinking:
            message["thinking"] = thinking
        if calls:
            message["tool_calls"] = calls
        return {**head, "message": message, "done": False}

    lines = [_line(delta(thinking=piece)) for piece in generation.reasoning]
    lines += [_line(delta(text=piece)) for piece in generation.texts]
    if generation.error is not None:
        return [*lines, _line({"error": error_message(generation.error)})]
    calls = _tool_calls(generation)
    if calls and chat:
        lines.append(_line(delta(calls=calls)))
    last = {**delta(), **_done(generation)}
    return lines if scenario.no_end else [*lines, _line(last)]


def _body(request: dict[str, Any], scenario: Scenario, chat: bool) -> dict[str, Any]:
    """The one JSON answer of a request with ``"stream": false``."""
    generation = _generation(request, scenario)
    answer: dict[str, Any] = {"model": generation.model, "created_at": _now()}
    if chat:
        message: dict[str, Any] = {"role": "assistant", "content": generation.text}
        if generation.reasoning:
            message["thinking"] = generation.reasoning_text
        if calls := _tool_calls(generation):
            message["tool_calls"] = calls
        answer["message"] = message
    else:
        answer["response"] = generation.text
        if generation.reasoning:
            answer["thinking"] = generation.reasoning_text
    return {**answer, **_done(generation)}


def chat_lines(request: dict[str, Any], scenario: Scenario) -> list[bytes]:
    return _lines(request, scenario, chat=True)


def generate_lines(request: dict[str, Any], scenario: Scenario) -> list[bytes]:
    return _lines(request, scenario, chat=False)


def chat_body(request: dict[str, Any], scenario: Scenario) -> dict[str, Any]:
    return _body(request, scenario, chat=True)


def generate_body(request: dict[str, Any], scenario: Scenario) -> dict[str, Any]:
    return _body(request, scenario, chat=False)


def error_body(scenario: Scenario, status: int) -> bytes:
    """Ollama's HTTP error body: ``{"error": "..."}``."""
    return orjson.dumps({"error": error_message(scenario.error or http_error(status).code)})


CHAT = Dialect("ollama-chat", chat_lines, chat_body, error_body, NDJSON, stream_default=True)
GENERATE = Dialect("ollama-generate", generate_lines, generate_body, error_body, NDJSON, stream_default=True)


def dialect_for(path: str) -> Dialect | None:
    """The Ollama endpoint a POST path names (any prefix), else None."""
    path = path.rstrip("/")
    return CHAT if path.endswith("/api/chat") else GENERATE if path.endswith("/api/generate") else None
