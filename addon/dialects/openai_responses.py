"""The OpenAI Responses dialect (``POST .../responses``, ``GET .../responses/{id}``).

Recognised by the request line and body shape, never by the host, so it covers OpenAI,
Azure OpenAI (``/openai/responses``, ``/openai/v1/responses``), OpenRouter, vLLM,
Ollama, llama.cpp, LM Studio and gateways in front of them:

- a POST whose path ends with ``/responses`` and whose JSON body is an object with
  ``input`` or ``model`` (a create request, streamed with ``"stream": true``);
- a GET of ``.../responses/{id}`` whose id starts with ``resp`` (a retrieve: the
  response object, or its events with ``?stream=true``). A GET has no body to confirm
  the match, so the id's shape does it; ``.../responses/{id}/input_items`` is not an
  answer and is not matched.

Paths under ``/lmsp/`` belong to LMSP (:mod:`addon.dialects.lmsp`), which speaks the
same event names; they are excluded here whatever the registration order.

An event stream nobody recognised by its request is claimed when its first event is
``response.created`` carrying a nested ``response`` object.

Reading the events is :class:`~addon.dialects.responses.ResponsesNormalizer`'s job
(see there for the mapping). OpenAI specifics configured here: the JSON ``type`` names
the event (it equals the SSE ``event:``); ``sequence_number`` starts at 0, so a stream
whose first event has a higher one is a continuation (``GET ...?stream=true&
starting_after=N``); final events are ``response.completed``, ``.incomplete`` and
``.failed``; an ``error`` event is not final (``response.failed`` usually follows).

When a content filter stops an answer, the response ends the way OpenAI ends one its own
content filter stopped: ``incomplete``, with ``incomplete_details.reason``
``content_filter``. A stream gets ``response.incomplete``, its sequence number continuing
the stream's, carrying the whole response the stream announced (the SDK helpers insist
on the same id) with ``output`` as the client received it (open items marked
``incomplete``; see :meth:`~addon.dialects.responses.ResponsesNormalizer.output_so_far`),
so the Node SDK's ``finalResponse()`` and the Vercel AI SDK (``finishReason:
"content-filter"``) read it. A held non-streamed answer is replaced by that response
object (HTTP 200, no output). The rule and reason stay in the audit record: an
incomplete response has no place for a message. A request blocked before it went
upstream gets ``response.created`` and ``response.incomplete`` (sequence numbers 0 and
1, a fresh ``resp_`` id, empty output) when it asked for a stream, else OpenAI's error
JSON with code ``content_filtered`` and HTTP 400 (``BadRequestError`` in the SDK).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from addon.dialects import (
    BlockedResponse,
    Dialect,
    Normalizer,
    RequestSummary,
    RequestView,
    int_field,
    json_object,
    str_field,
)
from addon.dialects.blocking import (
    FILTERED_CODE,
    block_message,
    event_stream,
    frame,
    json_response,
    kept,
    openai_error,
    random_id,
    unix_now,
)
from addon.dialects.responses import ResponsesNormalizer
from addon.events import Event
from addon.framing import Frame
from exchange.request import tool_names

PATH_SUFFIX = "/responses"
LMSP_SEGMENT = "/lmsp/"
RESPONSE_ID_PREFIX = "resp"
FILTER_REASON = "content_filter"  # incomplete_details.reason of OpenAI's own content filter
# The fields of a held response its filtered replacement repeats (see blocking.kept).
ANSWER_FIELDS = ("id", "object", "created_at", "model", "usage", "parallel_tool_calls", "tool_choice", "tools")


class OpenAIResponses(Dialect):
    name = "openai-responses"
    provider = "openai"

    def matches(self, request: RequestView) -> bool:
        path = request.path
        if LMSP_SEGMENT in path:
            return False
        if request.method == "POST":
            return path.endswith(PATH_SUFFIX)
        if request.method == "GET":
            head, _, response_id = path.rpartition("/")
            return head.endswith(PATH_SUFFIX) and response_id.startswith(RESPONSE_ID_PREFIX)
        return False

    def accepts_body(self, body: Any, request: RequestView) -> bool:
        if request.method == "GET":
            return True  # a retrieve: the path's response id was the confirmation
        return isinstance(body, dict) and ("input" in body or "model" in body)

    def sniff(self, first_event: Frame) -> bool:
        if first_event.event not in ("response.created", "message"):
            return False
        obj = json_object(first_event.data)
        return (
            obj is not None
            and obj.get("type") == "response.created"
            and isinstance(obj.get("response"), dict)
            and obj["response"].get("object") == "response"
        )

    def summarize(self, body: Any, request: RequestView) -> RequestSummary:
        if request.method == "GET":
            stream = parse_qs(request.query).get("stream", [None])[-1]
            return RequestSummary(stream=None if stream is None else stream.lower() == "true")
        if not isinstance(body, dict):
            return RequestSummary()
        stream = body.get("stream")
        return RequestSummary(
            model=str_field(body, "model"),
            user_id=str_field(body, "user") or str_field(body, "safety_identifier"),
            session_id=_conversation_id(body.get("conversation")),
            stream=stream if isinstance(stream, bool) else None,
            declared_tools=tool_names(body),  # built-in tools have no name
        )

    def normalizer(self, request: RequestSummary) -> Normalizer:
        return OpenAIResponsesNormalizer(request.declared_tools, request.model)

    def blocked_response(
        self, summary: RequestSummary, request_view: RequestView, rule_id: str, reason: str, streaming: bool
    ) -> BlockedResponse:
        if streaming:
            normalizer = self.normalizer(summary)
            return event_stream(normalizer.ending(rule_id, reason), normalizer.writer)
        return json_response({"error": openai_error(block_message(rule_id, reason), FILTERED_CODE)})


def _conversation_id(conversation: Any) -> str | None:
    """``conversation``: an id, or ``{"id": ...}`` - the session the exchange belongs to."""
    if isinstance(conversation, str):
        return conversation
    if isinstance(conversation, dict):
        return str_field(conversation, "id")
    return None


class OpenAIResponsesNormalizer(ResponsesNormalizer):
    """OpenAI Responses events; a stream not starting at sequence number 0 is resumed."""

    def __init__(self, declared_tools: frozenset[str] | None = None, model: str | None = None) -> None:
        super().__init__(declared_tools)
        self.first = True
        self.model = model  # asked for: names a response the proxy has to create itself
        self.last_seq: int | None = None
        self.response: dict[str, Any] | None = None  # the response of the last lifecycle event

    def on_json(self, event: Frame, obj: dict[str, Any]) -> list[Event]:
        seq = int_field(obj, "sequence_number")
        if self.first:
            self.first = False
            self.continuation = seq is not None and seq > 0
        if seq is not None:
            self.last_seq = seq
        response = obj.get("response")
        if isinstance(response, dict):
            self.response = response
        return super().on_json(event, obj)

    def text_of(self, event: Frame, obj: dict[str, Any]) -> str | None:
        """A text delta after the first event, carrying no response: only its sequence
        number is noted (as :meth:`on_json` notes it)."""
        if self.first or "response" in obj:
            return None
        text = super().text_of(event, obj)
        if text is not None:
            seq = int_field(obj, "sequence_number")
            if seq is not None:
                self.last_seq = seq
        return text

    def on_response(self, response: dict[str, Any]) -> list[Event]:
        self.response = response
        return super().on_response(response)

    def ending(self, rule_id: str, reason: str) -> list[Frame]:
        """``response.incomplete`` (``content_filter``) for the response the stream
        announced, with the output the client received; when none was announced, a new
        response is created first."""
        if self.ended:
            return []
        events: list[tuple[str, dict[str, Any]]] = []
        response = self.response
        if response is None:
            response = _new_response(self.model)
            events.append(("response.created", response))
        events.append(("response.incomplete", _filtered(response, self.output_so_far())))
        seq = 0 if self.last_seq is None else self.last_seq + 1
        return [
            frame({"type": kind, "sequence_number": seq + n, "response": response}, kind)
            for n, (kind, response) in enumerate(events)
        ]

    def filtered_body(self, rule_id: str, reason: str) -> BlockedResponse | None:
        """The answer read, as an ``incomplete`` response with no output."""
        if self.response is None or self.response.get("object") != "response":
            return None
        return json_response(_filtered(kept(self.response, ANSWER_FIELDS), []), status=200)


def _filtered(response: dict[str, Any], output: list[dict[str, Any]]) -> dict[str, Any]:
    """``response`` as one a content filter stopped, with ``output``."""
    return response | {
        "status": "incomplete",
        "incomplete_details": {"reason": FILTER_REASON},
        "error": None,
        "output": output,
    }


def _new_response(model: str | None) -> dict[str, Any]:
    """A response object the proxy creates: in progress, nothing generated.

    It has the fields the SDK's ``Response`` model requires, with the API's defaults
    where they only echo request settings."""
    return {
        "id": random_id("resp_"),
        "object": "response",
        "created_at": unix_now(),
        "status": "in_progress",
        "model": model or "",
        "output": [],
        "error": None,
        "incomplete_details": None,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": None,
    }


DIALECT = OpenAIResponses()
