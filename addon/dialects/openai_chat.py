"""The OpenAI Chat Completions dialect (``POST .../chat/completions``).

Recognised by the request line and body shape only: a POST whose path ends with
``/chat/completions`` and whose JSON body is an object with a ``messages`` list. That
covers OpenAI, Azure OpenAI (``/openai/deployments/{d}/chat/completions``), OpenRouter
(``/api/v1/chat/completions``), Groq, Gemini's OpenAI endpoint, vLLM, Ollama, llama.cpp
and gateways in front of them. An event stream whose request was not recognised is
claimed when its first chunk says ``"object": "chat.completion.chunk"``.

Streamed responses are ``data:`` lines with one ``chat.completion.chunk`` each and end
with ``data: [DONE]`` (the terminal event, handled by :class:`JsonEventNormalizer`).
What the chunks carry and the traps of the compatible servers:

- ``choices[i].delta`` holds the increment of choice ``i`` (``n > 1`` interleaves
  choices): ``content`` is answer text (so is ``audio.transcript``: a spoken answer's
  words), ``refusal`` a refusal, ``reasoning_content``
  (llama.cpp, DeepSeek, vLLM) or ``reasoning`` (OpenRouter, newer vLLM) is reasoning
  (vLLM sends both with the same text, read once; when they differ, both are read:
  clients show either). ``content`` may be a list of parts; a part of a type not known
  here is read as answer text (all its strings), with a finding, since a client may
  show it.
- ``delta.tool_calls[j]`` are fragments keyed by the call's ``index`` within its
  choice: the first carries ``id``, ``type`` and ``function.name``, later ones only
  ``index`` and a piece of ``function.arguments``; parallel calls interleave.
- ``finish_reason`` ends a choice, not the stream (OpenRouter repeats the finishing
  chunk, the second time with usage). A choice's tool calls are whole when it finishes
  for any reason but ``length`` (the token limit cut them).
- ``usage`` arrives, when asked for with ``stream_options.include_usage``, in a last
  chunk with ``choices: []``; 2026 OpenAI chunks carry ``"usage": null`` on every
  chunk, which reports nothing.
- ``{"error": {...}}`` as chunk data is an error after HTTP 200.

Non-streamed answers are one ``chat.completion`` object (:meth:`on_response`).

When a content filter stops an exchange: a stream being cut ends the way Azure OpenAI's
output filter ends one, with a chunk per unfinished choice carrying ``finish_reason:
"content_filter"`` (and, in Azure's ``content_filter_results.custom_blocklists`` shape,
the rule id), then ``[DONE]``; the SDK reports ``finish_reason == "content_filter"`` (its
parsing helpers raise ``ContentFilterFinishReasonError``). A held non-streamed answer is
replaced the same way: HTTP 200, the ``chat.completion`` with its id, model and usage,
each choice's message emptied and finished with ``content_filter``. A request blocked before it
went upstream is refused with an error: ``{"error": {..., "code": "content_filter"}}``
(Azure's code for filtered prompts) as HTTP 400, or, for a streaming request, as the
one chunk of the stream followed by ``[DONE]``, which the SDK raises as ``APIError``
with that code; a finish reason alone could not say which rule refused the request.
"""

from __future__ import annotations

from typing import Any

from addon import json_read
from addon.dialects import (
    BlockedResponse,
    Dialect,
    JsonEventNormalizer,
    Normalizer,
    RequestSummary,
    RequestView,
    int_field,
    json_object,
    json_strings,
    str_field,
)
from addon.dialects.blocking import (
    block_message,
    event_stream,
    frame,
    json_response,
    openai_error,
    random_id,
    unfinished,
    unix_now,
)
from addon.dialects.openai_choices import (
    CHAT_PATH_SUFFIX,
    DONE,
    FILTER,
    add_error,
    add_usage,
    choice_index,
    choices_of,
    filter_results,
    filtered_answer,
)
from addon.events import (
    Event,
    Finding,
    Finish,
    ResponseMeta,
    TextDelta,
    ToolCallDelta,
)
from addon.framing import Frame
from addon.record import MAX_CHOICES, MAX_TOOL_CALLS
from exchange.request import tool_names

PATH_SUFFIX = CHAT_PATH_SUFFIX
CHUNK_OBJECT = "chat.completion.chunk"
# Finish reasons that cut whatever was open: the token limit, and a content filter.
TRUNCATING_FINISHES = frozenset({"length", FILTER})
# Content part types that carry media or references, not text a person reads.
MEDIA_PARTS = frozenset({"image_url", "input_audio", "audio", "image", "file"})
MAX_PART_DEPTH = 6
_PART_META = frozenset({"type", "id", "index"})  # keys of a part that are not its text


class OpenAIChat(Dialect):
    name = "openai-chat"
    provider = "openai"

    def matches(self, request: RequestView) -> bool:
        return request.method.upper() == "POST" and request.path.rstrip("/").endswith(PATH_SUFFIX)

    def accepts_body(self, body: Any, request: RequestView) -> bool:
        return isinstance(body, dict) and isinstance(body.get("messages"), list)

    def sniff(self, first_event: Frame) -> bool:
        if CHUNK_OBJECT not in first_event.data:  # skip parsing streams that cannot be ours
            return False
        obj = json_object(first_event.data)
        return obj is not None and obj.get("object") == CHUNK_OBJECT and isinstance(obj.get("choices"), list)

    def summarize(self, body: Any, request: RequestView) -> RequestSummary:
        if not isinstance(body, dict):
            return RequestSummary()
        stream = body.get("stream", False)
        return RequestSummary(
            model=str_field(body, "model"),
            user_id=str_field(body, "user") or str_field(body, "safety_identifier"),
            stream=stream if isinstance(stream, bool) else None,
            declared_tools=tool_names(body),
        )

    def normalizer(self, request: RequestSummary) -> Normalizer:
        return OpenAIChatNormalizer(request.declared_tools)

    def blocked_response(
        self, summary: RequestSummary, request_view: RequestView, rule_id: str, reason: str, streaming: bool
    ) -> BlockedResponse:
        error = {"error": openai_error(block_message(rule_id, reason), FILTER)}
        if streaming:
            return event_stream([frame(error), frame(DONE)])
        return json_response(error)


class OpenAIChatNormalizer(JsonEventNormalizer):
    """Turns ``chat.completion.chunk`` events (or one ``chat.completion``) into common events."""

    def __init__(self, declared_tools: frozenset[str] | None = None) -> None:
        super().__init__()
        self.declared_tools = declared_tools
        self.meta: tuple[Any, Any] = (None, None)  # (id, model) last reported
        # (choice, tool index) -> [record key, call id]; a new id at a used index starts a new call
        self.calls: dict[tuple[int, int], list[Any]] = {}
        self.open_calls: dict[int, list[str]] = {}  # choice -> keys not yet known whole
        self.reused: int = 0
        self.created: int | None = None  # of the chunks, repeated by a termination chunk
        self.finished: dict[int, bool] = {}  # choice -> a finish_reason was read
        self.answer: dict[str, Any] | None = None  # a whole chat.completion read

    # -- streamed chunks ----------------------------------------------------------------

    def on_json(self, event: Frame, obj: dict[str, Any]) -> list[Event]:
        out: list[Event] = []
        self._meta(obj, out)
        if "error" in obj or event.event == "error" or obj.get("object") == "error":
            add_error(obj, out)
        for position, choice in choices_of(obj):
            self._chunk_choice(choice, position, out)
        add_usage(obj, out)
        return out

    def text_of(self, event: Frame, obj: dict[str, Any]) -> str | None:
        """A chunk whose one choice (index 0) brings only ``delta.content`` text: no
        new id or model, no error, usage, finish reason, tool call, reasoning or refusal
        (what :meth:`on_json` would read from it; it would only note that choice 0 exists)."""
        choices = obj.get("choices")
        if type(choices) is not list or len(choices) != 1:
            return None
        choice = choices[0]
        if type(choice) is not dict:
            return None
        delta = choice.get("delta")
        if type(delta) is not dict:
            return None
        content = delta.get("content")
        if type(content) is not str or not content:
            return None
        index = choice.get("index")
        if type(index) is int and index > 0:  # (choice_index: anything else is position 0)
            return None
        reason = choice.get("finish_reason")
        if type(reason) is str and reason:
            return None
        if (obj.get("id"), obj.get("model")) != self.meta or event.event == "error" or _not_plain(obj):
            return None
        if len(delta) > 1 and _more_than_content(delta):
            return None
        self.finished.setdefault(0, False)
        return content

    def _meta(self, obj: dict[str, Any], out: list[Event]) -> None:
        response_id, model = obj.get("id"), obj.get("model")
        if (response_id, model) == self.meta:
            return
        self.meta = (response_id, model)
        self.created = int_field(obj, "created")
        response_id = response_id if isinstance(response_id, str) and response_id else None
        model = model if isinstance(model, str) and model else None  # Azure's filter chunk: ""
        if response_id or model:
            out.append(ResponseMeta(model=model, response_id=response_id, created=int_field(obj, "created")))

    def _chunk_choice(self, choice: dict[str, Any], position: int, out: list[Event]) -> None:
        index = choice_index(choice, position)
        if len(self.finished) < MAX_CHOICES:  # (the record keeps no more: past them the upstream is hostile)
            self.finished.setdefault(index, False)
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            delta = choice.get("message")  # a server sending whole messages as chunks
        if isinstance(delta, dict):
            _texts(delta, index, out)
            tool_calls = delta.get("tool_calls")
            if isinstance(tool_calls, list):
                for j, call in enumerate(tool_calls):
                    if isinstance(call, dict):
                        self._tool_fragment(index, choice_index(call, j), call, out)
            function_call = delta.get("function_call")  # legacy functions API
            if isinstance(function_call, dict):
                self._tool_fragment(index, -1, {"function": function_call}, out)
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            if index in self.finished:
                self.finished[index] = True
            out.append(Finish(reason, choice=index))
            if reason not in TRUNCATING_FINISHES:
                for key in self.open_calls.pop(index, ()):
                    out.append(ToolCallDelta(key, choice=index, complete=True))

    def _tool_fragment(self, choice: int, index: int, call: dict[str, Any], out: list[Event]) -> None:
        call_id, name, arguments = _call_fields(call)
        slot = self.calls.get((choice, index))
        if slot is None and len(self.calls) >= MAX_TOOL_CALLS:  # (read and checked, not remembered)
            key = f"{choice}.{index}" if index >= 0 else f"{choice}.function_call"
            out.append(ToolCallDelta(key, arguments, id=call_id, name=name, choice=choice))
            return
        if slot is None or (call_id is not None and slot[1] is not None and call_id != slot[1]):
            # a new call; servers that number every call 0 are told apart by their ids
            if slot is None:
                key = f"{choice}.{index}" if index >= 0 else f"{choice}.function_call"
            else:
                self.reused += 1
                key = f"{choice}.{index}.{self.reused}"
            slot = self.calls[(choice, index)] = [key, call_id]
            self.open_calls.setdefault(choice, []).append(key)
            if name is not None and self.declared_tools is not None and name not in self.declared_tools:
                out.append(Finding("undeclared_tool", name))
        elif slot[1] is None and call_id is not None:
            slot[1] = call_id
        out.append(ToolCallDelta(slot[0], arguments, id=call_id, name=name, choice=choice))

    def ending(self, rule_id: str, reason: str) -> list[Frame]:
        """A ``content_filter`` chunk per unfinished choice (see :func:`unfinished`), then
        ``[DONE]``. The chunks repeat the stream's id, model and created; a choice the
        stream never showed is introduced with ``role: assistant``. A chunk has a place
        for the rule id (Azure's ``content_filter_results``) but none for the reason,
        which stays in the audit record."""
        if self.ended:
            return []
        response_id, model = self.meta
        head = {
            "id": response_id if isinstance(response_id, str) and response_id else random_id("chatcmpl-"),
            "object": CHUNK_OBJECT,
            "created": self.created or unix_now(),
            "model": model if isinstance(model, str) else "",
        }
        results = filter_results(rule_id)
        chunks = []
        for index in unfinished(self.finished):
            choice = {
                "index": index,
                "delta": {} if index in self.finished else {"role": "assistant"},
                "logprobs": None,
                "finish_reason": FILTER,
                "content_filter_results": results,
            }
            chunks.append(frame(head | {"choices": [choice]}))
        return [*chunks, frame(DONE)]

    # -- a whole chat.completion ----------------------------------------------------------

    def filtered_body(self, rule_id: str, reason: str) -> BlockedResponse | None:
        """The ``chat.completion`` read, each choice emptied and finished ``content_filter``."""
        message = {"role": "assistant", "content": None, "refusal": None}
        return filtered_answer(
            self.answer,
            lambda index: {
                "index": index,
                "message": message,
                "logprobs": None,
                "finish_reason": FILTER,
                "content_filter_results": filter_results(rule_id),
            },
        )

    def on_response(self, response: dict[str, Any]) -> list[Event]:
        self.answer = response
        out: list[Event] = []
        self._meta(response, out)
        if "error" in response or response.get("object") == "error":
            add_error(response, out)
        for position, choice in choices_of(response):
            self._response_choice(choice, position, out)
        add_usage(response, out)
        return out

    def _response_choice(self, choice: dict[str, Any], position: int, out: list[Event]) -> None:
        index = choice_index(choice, position)
        reason = choice.get("finish_reason")
        reason = reason if isinstance(reason, str) and reason else None
        complete = reason not in TRUNCATING_FINISHES  # the same rule as for streams
        message = choice.get("message")
        if isinstance(message, dict):
            _texts(message, index, out)
            calls = message.get("tool_calls")
            calls = [(str(j), c) for j, c in enumerate(calls)] if isinstance(calls, list) else []
            if isinstance(message.get("function_call"), dict):
                calls.append(("function_call", {"function": message["function_call"]}))
            for j, call in calls:
                if isinstance(call, dict):
                    call_id, name, arguments = _call_fields(call)
                    if name is not None and self.declared_tools is not None and name not in self.declared_tools:
                        out.append(Finding("undeclared_tool", name))
                    out.append(
                        ToolCallDelta(f"{index}.{j}", arguments, id=call_id, name=name, choice=index, complete=complete)
                    )
        if reason is not None:
            out.append(Finish(reason, choice=index))


# -- field readers of chunks and whole responses ------------------------------------------------


def _not_plain(chunk: dict[str, Any]) -> bool:
    """Whether a chunk has more to read than its choices: an error, or usage (``add_usage``)."""
    return (
        "error" in chunk or chunk.get("object") == "error" or isinstance(chunk.get("usage"), dict) or "x_groq" in chunk
    )


def _more_than_content(delta: dict[str, Any]) -> bool:
    """Whether a delta carries anything :func:`_texts` or the tool reading would emit
    besides its ``content`` string."""
    for name in ("reasoning_content", "reasoning", "refusal"):
        value = delta.get(name)
        if isinstance(value, str) and value:
            return True
    tool_calls = delta.get("tool_calls")
    return (
        (isinstance(tool_calls, list) and len(tool_calls) > 0)
        or isinstance(delta.get("function_call"), dict)
        or isinstance(delta.get("audio"), dict)
    )


def _texts(part: dict[str, Any], choice: int, out: list[Event]) -> None:
    """Answer, reasoning and refusal text of a delta or a message."""
    reasoning, other = part.get("reasoning_content"), part.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        out.append(TextDelta(reasoning, choice, "reasoning"))
    # vLLM sends both with the same text: read once; different texts are both shown
    # somewhere, each by the clients that read its field, but the filters read one
    # reasoning text: interleaved, it is neither (see addon.dialects.OpenBlocks)
    if isinstance(other, str) and other and other != reasoning:
        out.append(TextDelta(other, choice, "reasoning"))
        if isinstance(reasoning, str) and reasoning:  # (after the text: what either holds whole is checked first)
            out.append(Finding("text_interleaved", "reasoning_content and reasoning carry different text"))
    content = part.get("content")
    if isinstance(content, str):
        if content:
            out.append(TextDelta(content, choice))
    elif isinstance(content, list):  # content parts (Mistral's thinking chunks, some gateways)
        for item in content:
            if isinstance(item, dict):
                _content_part(item, choice, out)
            elif isinstance(item, str) and item:  # not the API's shape, but text a client may show
                out.append(TextDelta(item, choice))
    refusal = part.get("refusal")
    if isinstance(refusal, str) and refusal:
        out.append(TextDelta(refusal, choice, "refusal"))
    audio = part.get("audio")  # (an answer spoken, modalities ["text", "audio"]: its words are the transcript)
    transcript = audio.get("transcript") if isinstance(audio, dict) else None
    if isinstance(transcript, str) and transcript:
        out.append(TextDelta(transcript, choice))


def _content_part(item: dict[str, Any], choice: int, out: list[Event]) -> None:
    kind = item.get("type")
    if kind == "text" and isinstance(item.get("text"), str):
        if item["text"]:
            out.append(TextDelta(item["text"], choice))
    elif kind == "refusal" and isinstance(item.get("refusal"), str):
        if item["refusal"]:
            out.append(TextDelta(item["refusal"], choice, "refusal"))
    elif kind == "thinking":
        thinking = item.get("thinking")
        parts = thinking if isinstance(thinking, list) else [{"text": thinking}]
        for p in parts:
            text = p.get("text") if isinstance(p, dict) else None
            if isinstance(text, str) and text:
                out.append(TextDelta(text, choice, "reasoning"))
    elif kind not in MEDIA_PARTS:
        cut: list[str] = []  # (what the walk's bound left out: no filter reads it, the policy decides)
        strings = json_strings(item, skip_keys=_PART_META, max_depth=MAX_PART_DEPTH, cut=cut)
        if cut:
            out.append(Finding("strings_unread", f"content part {str(kind)[:40]!r}: {'; '.join(cut)} not read"))
        if strings:
            out.append(Finding("unknown_content_part", f"type {str(kind)[:40]!r}: read as answer text"))
            out.extend(TextDelta(s, choice) for s in strings)


def _call_fields(call: dict[str, Any]) -> tuple[str | None, str | None, str]:
    """(id, name, arguments) of a tool call or a fragment of one."""
    call_id = call.get("id")
    call_id = call_id if isinstance(call_id, str) and call_id else None
    spec = call.get("function")
    if isinstance(spec, dict):
        name, arguments = spec.get("name"), spec.get("arguments")
    else:
        spec = call.get("custom")  # custom tools: free-form input instead of JSON arguments
        name, arguments = (spec.get("name"), spec.get("input")) if isinstance(spec, dict) else (None, None)
    name = name if isinstance(name, str) and name else None
    if not isinstance(arguments, str):
        # an object where the API has a JSON string (some compatible servers): keep it as JSON
        arguments = "" if arguments is None else json_read.dumps(arguments)  # (lenient values too: never raises)
    return call_id, name, arguments


DIALECT = OpenAIChat()
