"""The OpenAI legacy Completions dialect (``POST .../completions`` with a ``prompt``).

OpenAI still serves it (``gpt-3.5-turbo-instruct``, ``davinci-002``), and so do vLLM,
llama.cpp, LocalAI, Ollama and most code-completion back ends (fill-in-the-middle with
``prompt`` and ``suffix``). Recognised by the request line and body shape only: a POST
whose path ends with ``/completions`` but not ``/chat/completions`` (that is
:mod:`addon.dialects.openai_chat`) and whose JSON body is an object with a ``prompt``.
The prompt is a string, a list of strings (a batch: one completion each, ``n`` times),
a list of token ids or a list of token-id lists (which no filter can read: see
:mod:`exchange.request`). An event stream nobody recognised is claimed when its
first chunk says ``"object": "text_completion"``.

Streamed responses are ``data:`` lines with one ``text_completion`` object each and end
with ``data: [DONE]``:

- ``choices[i].text`` is the increment of choice ``i`` (several prompts and ``n > 1``
  interleave choices, numbered across the batch); ``finish_reason`` (``stop``,
  ``length``, ``content_filter``) ends it.
- ``choices[i].logprobs`` (``tokens``, ``token_logprobs``, ``top_logprobs``,
  ``text_offset``) repeats the text as tokens: it is not read, so the text is never
  counted twice.
- ``usage`` arrives in a last chunk with ``choices: []`` when the request sets
  ``stream_options.include_usage`` (vLLM: ``continuous_usage_stats`` on every chunk).
- ``{"error": {...}}`` as chunk data is an error after HTTP 200.

Non-streamed answers are one ``text_completion`` object with the whole text per choice.

When a content filter stops an exchange, it ends the way openai-chat's does (the SDK's
``Completion`` knows the same finish reason): a chunk per unfinished choice with empty
``text`` and ``finish_reason: "content_filter"``, then ``[DONE]``. A request blocked
before it went upstream is refused with ``{"error": {..., "code": "content_filter"}}``,
as HTTP 400 or, for a streaming request, as the one chunk of the stream followed by
``[DONE]`` (the SDK raises ``APIError`` with that code).
"""

from __future__ import annotations

from typing import Any

from addon.dialects import (
    BlockedResponse,
    Dialect,
    JsonEventNormalizer,
    Normalizer,
    RequestSummary,
    RequestView,
    int_field,
    json_object,
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
    filtered_answer,
)
from addon.events import Event, Finding, Finish, ResponseMeta, TextDelta
from addon.framing import Frame, Message
from addon.record import MAX_CHOICES
from exchange.request import token_prompts

PATH_SUFFIX = "/completions"
OBJECT = "text_completion"


class OpenAICompletions(Dialect):
    name = "openai-completions"
    provider = "openai"

    def matches(self, request: RequestView) -> bool:
        if request.method.upper() != "POST":
            return False
        path = request.path.rstrip("/")
        return path.endswith(PATH_SUFFIX) and not path.endswith(CHAT_PATH_SUFFIX)

    def accepts_body(self, body: Any, request: RequestView) -> bool:
        return isinstance(body, dict) and "prompt" in body

    def sniff(self, first_event: Frame) -> bool:
        if OBJECT not in first_event.data:  # skip parsing streams that cannot be ours
            return False
        obj = json_object(first_event.data)
        return obj is not None and obj.get("object") == OBJECT and isinstance(obj.get("choices"), list)

    def summarize(self, body: Any, request: RequestView) -> RequestSummary:
        if not isinstance(body, dict):
            return RequestSummary()
        stream = body.get("stream", False)
        summary = RequestSummary(
            model=str_field(body, "model"),
            user_id=str_field(body, "user"),
            stream=stream if isinstance(stream, bool) else None,
        )
        if token_prompts(body):
            summary.findings.append(
                Finding("request_token_prompt", "the prompt is token ids: the request filters cannot read it")
            )
        return summary

    def normalizer(self, request: RequestSummary) -> Normalizer:
        return OpenAICompletionsNormalizer()

    def blocked_response(
        self, summary: RequestSummary, request_view: RequestView, rule_id: str, reason: str, streaming: bool
    ) -> BlockedResponse:
        error = {"error": openai_error(block_message(rule_id, reason), FILTER)}
        if streaming:
            return event_stream([frame(error), frame(DONE)])
        return json_response(error)


class OpenAICompletionsNormalizer(JsonEventNormalizer):
    """Turns ``text_completion`` chunks (or one whole ``text_completion``) into common events."""

    def __init__(self) -> None:
        super().__init__()
        self.answer: dict[str, Any] | None = None  # a whole text_completion read
        self.meta: tuple[Any, Any] = (None, None)  # (id, model) last reported
        self.created: int | None = None  # of the chunks, repeated by a termination chunk
        self.finished: dict[int, bool] = {}  # choice -> a finish_reason was read

    def on_json(self, event: Frame, obj: dict[str, Any]) -> list[Event]:
        out: list[Event] = []
        self._meta(obj, out)
        if "error" in obj or event.event == "error" or obj.get("object") == "error":
            add_error(obj, out)
        for position, choice in choices_of(obj):
            index = choice_index(choice, position)
            if len(self.finished) < MAX_CHOICES:  # (the record keeps no more: past them the upstream is hostile)
                self.finished.setdefault(index, False)
            self._choice(choice, index, out)
        add_usage(obj, out)
        return out

    def on_response(self, response: dict[str, Any]) -> list[Event]:
        self.answer = response
        return self.on_json(Message(), response)

    def filtered_body(self, rule_id: str, reason: str) -> BlockedResponse | None:
        """The ``text_completion`` read, each choice emptied and finished ``content_filter``."""
        return filtered_answer(
            self.answer, lambda index: {"text": "", "index": index, "logprobs": None, "finish_reason": FILTER}
        )

    def _meta(self, obj: dict[str, Any], out: list[Event]) -> None:
        response_id, model = obj.get("id"), obj.get("model")
        if (response_id, model) == self.meta:
            return
        self.meta = (response_id, model)
        self.created = int_field(obj, "created")
        response_id = response_id if isinstance(response_id, str) and response_id else None
        model = model if isinstance(model, str) and model else None
        if response_id or model:
            out.append(ResponseMeta(model=model, response_id=response_id, created=self.created))

    def _choice(self, choice: dict[str, Any], index: int, out: list[Event]) -> None:
        """A choice's text (``logprobs`` repeats it as tokens and is not read) and finish."""
        text = choice.get("text")
        if isinstance(text, str) and text:
            out.append(TextDelta(text, index))
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            if index in self.finished:
                self.finished[index] = True
            out.append(Finish(reason, choice=index))

    def ending(self, rule_id: str, reason: str) -> list[Frame]:
        """A ``content_filter`` chunk per unfinished choice (see :func:`unfinished`), then
        ``[DONE]``, repeating the stream's id, model and created. The chunk has no place
        for the rule or the reason, which stay in the audit record."""
        if self.ended:
            return []
        response_id, model = self.meta
        head = {
            "id": response_id if isinstance(response_id, str) and response_id else random_id("cmpl-"),
            "object": OBJECT,
            "created": self.created or unix_now(),
            "model": model if isinstance(model, str) else "",
        }
        chunks = [
            frame(head | {"choices": [{"text": "", "index": index, "logprobs": None, "finish_reason": FILTER}]})
            for index in unfinished(self.finished)
        ]
        return [*chunks, frame(DONE)]


DIALECT = OpenAICompletions()
