"""What the Chat Completions and legacy Completions APIs share: objects carrying
``choices`` (chunks and whole answers alike), their usage and errors, the ``[DONE]``
sentinel, and the whole answer their content filter leaves. Used by
:mod:`addon.dialects.openai_chat` and :mod:`addon.dialects.openai_completions`, so that
neither dialect imports the other; it registers no dialect.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from addon.dialects import BlockedResponse, int_field
from addon.dialects.blocking import json_response, kept
from addon.events import Event, StreamError, Usage

CHAT_PATH_SUFFIX = "/chat/completions"  # also ends in /completions: the legacy dialect must tell them apart
FILTER = "content_filter"  # the finish reason and Azure's error code for filtered content
DONE = "[DONE]"


# The fields of a chat.completion a filtered answer repeats (see blocking.kept).
ANSWER_FIELDS = ("id", "object", "created", "model", "usage", "system_fingerprint", "service_tier")


def filtered_answer(answer: dict[str, Any] | None, choice: Callable[[int], dict[str, Any]]) -> BlockedResponse | None:
    """A whole answer of the Chat or legacy Completions API as its content filter leaves
    it (HTTP 200): its id, model and usage, and ``choice(index)`` for each of its choices
    (choice 0 when it had none); ``None`` for no answer or an error answer."""
    if answer is None or "error" in answer:
        return None
    indices = [choice_index(c, i) for i, c in choices_of(answer)] or [0]
    return json_response(kept(answer, ANSWER_FIELDS) | {"choices": [choice(i) for i in indices]}, status=200)


def filter_results(rule_id: str) -> dict[str, Any]:
    """Azure's ``content_filter_results`` naming the rule as a custom blocklist."""
    return {"custom_blocklists": {"filtered": True, "details": [{"filtered": True, "id": rule_id}]}}


def choice_index(obj: dict[str, Any], position: int) -> int:
    """``obj["index"]``, or its position in the list when a server leaves it out."""
    index = obj.get("index")
    return index if isinstance(index, int) and not isinstance(index, bool) and index >= 0 else position


def choices_of(obj: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """``(position, choice)`` for each choice object of a chunk or a response."""
    choices = obj.get("choices")
    if not isinstance(choices, list):
        return []
    return [(position, choice) for position, choice in enumerate(choices) if isinstance(choice, dict)]


def add_usage(obj: dict[str, Any], out: list[Event]) -> None:
    usage = obj.get("usage")
    if not isinstance(usage, dict):
        groq = obj.get("x_groq")  # Groq's own place for streamed usage
        usage = groq.get("usage") if isinstance(groq, dict) else None
        if not isinstance(usage, dict):
            return
    prompt = usage.get("prompt_tokens_details")
    prompt = prompt if isinstance(prompt, dict) else {}
    completion = usage.get("completion_tokens_details")
    completion = completion if isinstance(completion, dict) else {}
    cache_read = int_field(prompt, "cached_tokens")
    if cache_read is None:
        cache_read = int_field(usage, "prompt_cache_hit_tokens")  # DeepSeek
    out.append(
        Usage(
            input_tokens=int_field(usage, "prompt_tokens"),
            output_tokens=int_field(usage, "completion_tokens"),
            cache_read_input_tokens=cache_read,
            cache_write_input_tokens=int_field(prompt, "cache_write_tokens"),
            reasoning_output_tokens=int_field(completion, "reasoning_tokens"),
        )
    )


def add_error(obj: dict[str, Any], out: list[Event]) -> None:
    """``{"error": {...}}``, ``{"error": "text"}`` or a top-level error object (vLLM)."""
    err = obj.get("error", obj)
    if err is None:
        return
    if isinstance(err, str):
        out.append(StreamError(None, err))
        return
    if not isinstance(err, dict):
        out.append(StreamError(None, None))
        return
    code = err.get("code") or err.get("type")
    message = err.get("message")
    out.append(StreamError(None if code is None else str(code), None if message is None else str(message)))
