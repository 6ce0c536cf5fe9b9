"""The AWS Bedrock Runtime dialect: ``Converse``, ``ConverseStream``, ``InvokeModel`` and
``InvokeModelWithResponseStream``.

Recognised by the request line, on any host (``bedrock-runtime.<region>.amazonaws.com``
names the provider): a POST to ``…/model/{modelId}/converse-stream``, ``/converse``,
``/invoke-with-response-stream`` or ``/invoke``. The model is named only there,
percent-encoded; it may be a model id, an inference profile
(``us.anthropic.claude-sonnet-4-20250514-v1:0``) or an ARN, and it is the record's
request model (the answers never echo it).

Streams are AWS event streams (:mod:`addon.framing.eventstream`). ConverseStream sends
one JSON event per message, named by ``:event-type``::

    messageStart  (contentBlockStart?  contentBlockDelta*  contentBlockStop)*  messageStop  metadata

``contentBlockDelta.delta`` holds ``text``, a ``toolUse.input`` fragment (a tool call,
keyed by block as Anthropic's are) or ``reasoningContent`` (``text`` is reasoning; its
``signature`` and ``redactedContent`` are opaque and not text); ``messageStop`` gives the
stop reason and ``metadata``, last, the usage (input includes cache reads and writes,
as OpenTelemetry counts it; both spellings of the cache counts are read). Every payload
carries a random padding field ``p``, which is not content. A non-streamed ``Converse``
answer is the same content as one ``output.message``.

InvokeModel carries the model's own JSON. ``InvokeModelWithResponseStream`` wraps each
native event in a ``chunk`` event as base64 (``{"bytes": …}``): Anthropic Messages
inside (``anthropic_version: bedrock-…`` in the request, or Anthropic's event shapes)
are read by the Anthropic normalizer itself (:mod:`addon.dialects.messages`), Amazon
Nova's native events are ConverseStream's, read as above; other models' text is read
from the fields they are known to use (``generation``, ``outputText``, ``completion``,
``outputs[].text``, ``choices[]``, ``generations[].text``), and a payload with none of
them is recorded with the finding ``bedrock_unknown_payload``. The last chunk's
``amazon-bedrock-invocationMetrics`` gives the usage when the model's JSON gave none.

Exceptions arrive as ``:message-type: exception`` messages named by ``:exception-type``
(``throttlingException``, ``modelStreamErrorException``, …) with ``{"message": …}``: a
:class:`~addon.events.StreamError` with that type as its code, which ends the stream.

When a content filter stops an exchange, the client gets what Bedrock sends when it
rejects one: a stream being cut ends with a ``validationException`` exception message
naming the rule and reason (boto3 raises ``EventStreamError``); a streaming request
blocked before it went upstream gets HTTP 200 and an event stream of only that message;
any other blocked request gets HTTP 400 ``{"message": …}`` with ``x-amzn-ErrorType:
ValidationException`` (boto3 raises ``ClientError``, code ``ValidationException``). A
held ``Converse`` answer is replaced by the answer with no content and ``stopReason:
content_filtered`` (HTTP 200, its usage and metrics); a held Anthropic answer by the
Anthropic dialect's refusal.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import orjson

from addon.dialects import (
    BlockedResponse,
    Dialect,
    LimitNotice,
    Normalizer,
    OpenBlocks,
    RequestSummary,
    RequestView,
    int_field,
    json_strings,
    lenient_json,
    load_body_json,
    read_json_object,
    str_field,
)
from addon.dialects.blocking import block_message, event_stream, frame, json_response, kept
from addon.dialects.messages import AnthropicNormalizer
from addon.events import (
    Event,
    Finding,
    Finish,
    ShownText,
    StreamEnd,
    StreamError,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from addon.framing import Frame, Message
from addon.framing.eventstream import EVENTSTREAM_WRITER, MEDIA_TYPE
from addon.record import MAX_TOOL_CALLS
from exchange.request import tool_names

_PATH = re.compile(r"(?:^|/)model/([^/]+)/(converse-stream|converse|invoke-with-response-stream|invoke)$")
STREAMING = frozenset({"converse-stream", "invoke-with-response-stream"})
_NOT_TEXT = frozenset({"amazon-bedrock-invocationMetrics", "p"})  # a payload's keys that are not its text
CONVERSE = frozenset({"converse-stream", "converse"})
FILTER_EXCEPTION = "validationException"  # what Bedrock sends for a request it rejects
FILTER_ERROR_TYPE = "ValidationException"  # the same, as x-amzn-ErrorType names it
FILTERED_STOP = "content_filtered"  # Converse's stop reason for filtered content
METRICS = "amazon-bedrock-invocationMetrics"
#: A native chunk (not Anthropic's) only lenient readers take: botocore and the SDKs read it.
LENIENT_CHUNK = Finding("lenient_json", "a chunk's bytes: JSON only lenient readers take (the SDKs' do)")
# Anthropic Messages stream events: a chunk holding one is read by the Anthropic normalizer.
ANTHROPIC_EVENTS = frozenset(
    {
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "ping",
        "error",
    }
)
CONVERSE_EVENTS = (
    "messageStart",
    "contentBlockStart",
    "contentBlockDelta",
    "contentBlockStop",
    "messageStop",
    "metadata",
)


def operation(path: str) -> tuple[str, str]:
    """``("converse-stream", "us.amazon.nova-micro-v1:0")`` for a Bedrock path, else ``("", "")``."""
    match = _PATH.search(path)
    return (match[2], unquote(match[1])) if match else ("", "")


@dataclass(slots=True)
class BedrockRequestSummary(RequestSummary):
    """The request summary, plus the operation and whether an Invoke body is Anthropic's."""

    operation: str = ""
    anthropic: bool = False


class Bedrock(Dialect):
    name = "bedrock"
    provider = "aws.bedrock"

    def matches(self, request: RequestView) -> bool:
        return request.method.upper() == "POST" and bool(operation(request.path)[0])

    def summarize(self, body: Any, request: RequestView) -> RequestSummary:
        op, model = operation(request.path)
        version = str_field(body, "anthropic_version") if isinstance(body, dict) else None
        return BedrockRequestSummary(
            model=model or None,
            stream=op in STREAMING,
            declared_tools=tool_names(body),
            operation=op,
            anthropic=op not in CONVERSE and bool(version and version.startswith("bedrock-")),
        )

    def normalizer(self, request: RequestSummary) -> Normalizer:
        if not isinstance(request, BedrockRequestSummary):
            return BedrockNormalizer("converse-stream", request.model, False)
        return BedrockNormalizer(request.operation, request.model, request.anthropic)

    def blocked_response(
        self, summary: RequestSummary, request_view: RequestView, rule_id: str, reason: str, streaming: bool
    ) -> BlockedResponse:
        if streaming:
            frames = [_filter_exception(rule_id, reason)]
            return event_stream(frames, EVENTSTREAM_WRITER, [("content-type", MEDIA_TYPE)])
        body = orjson.dumps({"message": block_message(rule_id, reason)})
        headers = [("content-type", "application/json"), ("x-amzn-errortype", FILTER_ERROR_TYPE)]
        return BlockedResponse(400, headers, body)


def _filter_exception(rule_id: str, reason: str) -> Message:
    return frame({"message": block_message(rule_id, reason)}, FILTER_EXCEPTION)


class BedrockNormalizer(Normalizer):
    """Reads one Bedrock answer: an event stream (Converse or Invoke) or a whole JSON body."""

    framing = "eventstream"
    writer = EVENTSTREAM_WRITER

    def __init__(self, op: str, model: str | None, anthropic: bool) -> None:
        self.converse = op in CONVERSE
        self.model = model
        # The Anthropic normalizer reads Anthropic's own JSON inside Invoke chunks and bodies.
        self.inner: AnthropicNormalizer | None = AnthropicNormalizer(model) if anthropic else None
        # What the client reads when a filter ends the answer: a cut stream's exception
        # (no stop reason), a held answer's content_filtered, or a held Claude answer's refusal.
        held = self.inner.filter_stop_reason if self.inner is not None else FILTERED_STOP
        self.filter_stop_reason = FILTER_EXCEPTION if op in STREAMING else held
        self.ended = False
        self.usage_seen = False
        self.tool_blocks: set[int | None] = set()  # open toolUse blocks, at most MAX_TOOL_CALLS
        self.blocks_limit = LimitNotice(
            f"toolUse blocks open at once past the first {MAX_TOOL_CALLS} not kept open: "
            "their fragments are read, their calls not completed"
        )
        self.blocks = OpenBlocks()  # the blocks that got text, for interleaving
        self.unknown_reported = False
        self.answer: dict[str, Any] | None = None  # a whole Converse answer read

    # -- event streams ----------------------------------------------------------------------

    def on_event(self, event: Frame) -> list[Event]:
        out: list[Event] = []
        if self.ended:
            out.append(Finding("event_after_stream_end", f"{event.event!r} after the terminal event"))
        kind = getattr(event, "message_type", "event")
        if kind == "exception":
            self.ended = True  # the services end the stream with it
            message, lenient = _message(event.data)
            if lenient:
                out.append(lenient_json(event))
            out.append(StreamError(event.event or "exception", message))
        elif kind == "error":
            self.ended = True
            message = getattr(event, "headers", {}).get(":error-message")
            out.append(StreamError(event.event or "error", message if isinstance(message, str) else None))
        else:
            obj, lenient = read_json_object(event.data)
            if lenient:
                out.append(lenient_json(event))
            if obj is None:
                out.append(Finding("invalid_json", f"event {event.event!r}: data is not one JSON object"))
            elif self.converse:
                out += self._converse(event.event, obj)
            elif event.event == "chunk":
                out += self._chunk(obj)
        self._note(out)
        return out

    def on_end(self, cut: bool = False) -> list[Event]:
        if self.ended:
            return []
        return [Finding("missing_stream_end", "the stream ended without its last event")]

    def ending(self, rule_id: str, reason: str) -> list[Frame]:
        """A ``validationException`` naming the rule and reason, unless the stream is over."""
        return [] if self.ended else [_filter_exception(rule_id, reason)]

    def _anthropic(self) -> AnthropicNormalizer:
        """The Anthropic normalizer, made when the answer turns out to be Claude's."""
        if self.inner is None:
            self.inner = AnthropicNormalizer(self.model)
            if self.filter_stop_reason == FILTERED_STOP:
                self.filter_stop_reason = self.inner.filter_stop_reason
        return self.inner

    def _note(self, out: list[Event]) -> None:
        """Keep what later events depend on: the end, and whether usage came."""
        for ev in out:
            if isinstance(ev, StreamEnd):
                self.ended = True
            elif isinstance(ev, Usage):
                self.usage_seen = True

    # -- Converse events ----------------------------------------------------------------------

    def _converse(self, kind: str, obj: dict[str, Any]) -> list[Event]:
        index = int_field(obj, "contentBlockIndex")
        if kind == "contentBlockStart":
            tool = _dict(_dict(obj, "start"), "toolUse")
            if not tool:
                return []  # a server tool's result block, future kinds
            out = self._tool_block(index)
            return [*out, ToolCallDelta(_key(index), id=str_field(tool, "toolUseId"), name=str_field(tool, "name"))]
        if kind == "contentBlockDelta":
            return self._delta(index, _dict(obj, "delta"))
        if kind == "contentBlockStop":
            if index in self.tool_blocks:
                self.tool_blocks.discard(index)
                return [ToolCallDelta(_key(index), complete=True)]
            self.blocks.end(index)
            return []
        if kind == "messageStop":
            reason = str_field(obj, "stopReason")
            return [Finish(reason)] if reason else []
        if kind == "metadata":
            usage = _converse_usage(_dict(obj, "usage"))
            return [*([usage] if usage else []), StreamEnd()]
        return []  # messageStart, and events added later

    def _delta(self, index: int | None, delta: dict[str, Any]) -> list[Event]:
        text = str_field(delta, "text")
        if text:
            return [*self.blocks.text(index, "text"), TextDelta(text)]
        tool = _dict(delta, "toolUse")
        if tool:
            out = self._tool_block(index)
            fragment = str_field(tool, "input")
            return [*out, ToolCallDelta(_key(index), fragment)] if fragment else out
        thought = str_field(_dict(delta, "reasoningContent"), "text")
        if thought:
            return [*self.blocks.text(index, "reasoning"), TextDelta(thought, kind="reasoning")]
        return []  # a signature or redacted reasoning (opaque), server tool results, citations

    def _tool_block(self, index: int | None) -> list[Event]:
        """A toolUse block opened: remembered (its stop completes the call) unless
        :data:`~addon.record.MAX_TOOL_CALLS` are open, which only an upstream naming a new
        index per event does; then not (its fragments are still read), and the first time
        the finding ``record_limit``."""
        if index in self.tool_blocks or len(self.tool_blocks) < MAX_TOOL_CALLS:
            self.tool_blocks.add(index)
            return []
        return self.blocks_limit.reached()

    # -- InvokeModelWithResponseStream chunks ---------------------------------------------------

    def _chunk(self, obj: dict[str, Any]) -> list[Event]:
        raw = str_field(obj, "bytes")
        if raw is None:
            return [Finding("invalid_json", "a chunk without its bytes")]
        try:  # as botocore decodes it: characters outside the alphabet are skipped
            text = base64.b64decode(raw).decode("utf-8", "replace")
        except (binascii.Error, ValueError):
            return [Finding("invalid_json", "a chunk's bytes are not base64")]
        native, lenient = read_json_object(text)
        if native is None:
            return [Finding("invalid_json", "a chunk's bytes are not one JSON object")]
        kind = native.get("type")
        if self.inner is not None or (isinstance(kind, str) and kind in ANTHROPIC_EVENTS):
            # (the Anthropic normalizer reads the text again: lenient JSON is its finding then)
            out = self._anthropic().on_event(Message(text, kind if isinstance(kind, str) else "message"))
        else:
            out = self._native(native, streamed=True)
            if lenient:
                out = [LENIENT_CHUNK, *out]
        self._note(out)
        return out + self._metrics(native, out)

    def _native(self, native: dict[str, Any], streamed: bool) -> list[Event]:
        """Events of one native JSON object of a model that is not Anthropic's."""
        events = [name for name in CONVERSE_EVENTS if isinstance(native.get(name), dict)]
        if events:  # Amazon Nova: ConverseStream's events, each under its name
            return [ev for name in events for ev in self._converse(name, native[name])]
        output = _dict(native, "output")
        if isinstance(output.get("message"), dict):  # Nova's whole answer: Converse's
            return self._converse_answer(native)
        out = _native_events(native, streamed)
        if out is None:
            if set(native) <= {METRICS, "p"}:
                return []
            # An application may show any of it: the output filters check its strings
            # (ShownText: checked, not recorded as the answer).
            text_part = {
                k: v for k, v in native.items() if k not in _NOT_TEXT
            }  # (top level only: a nested "p" is text)
            cut: list[str] = []  # (what the bounds left out: no filter reads it, the policy decides)
            shown = "\n".join(json_strings(text_part, max_chars=64 * 1024, cut=cut))
            out = [Finding("strings_unread", f"a native payload: {'; '.join(cut)} not read")] if cut else []
            if shown:
                out.append(ShownText(shown, kind="unknown_payload"))
            if not self.unknown_reported:
                self.unknown_reported = True
                out.append(Finding("bedrock_unknown_payload", f"keys {sorted(native)[:8]}"))
        return out

    def _metrics(self, native: dict[str, Any], out: list[Event]) -> list[Event]:
        """The invocation metrics of the last chunk: usage if none came, and the end."""
        metrics = native.get(METRICS)
        if not isinstance(metrics, dict):
            return []
        extra: list[Event] = []
        if not self.usage_seen:
            usage = _counts(
                int_field(metrics, "inputTokenCount"),
                int_field(metrics, "outputTokenCount"),
                int_field(metrics, "cacheReadInputTokenCount"),
                int_field(metrics, "cacheWriteInputTokenCount"),
            )
            if usage is not None:
                extra.append(usage)
        if not self.ended:
            extra.append(StreamEnd())
        self._note(extra)
        return extra

    # -- whole bodies ---------------------------------------------------------------------------

    def on_body(self, body: bytes, http_status: int) -> list[Event]:
        if http_status >= 400:
            return _aws_error(body)
        return super().on_body(body, http_status)

    def on_response(self, response: dict[str, Any]) -> list[Event]:
        if self.converse:
            return self._converse_answer(response)
        if self.inner is not None or response.get("type") == "message":
            return self._anthropic().on_response(response)
        return self._native(response, streamed=False)

    def _converse_answer(self, answer: dict[str, Any]) -> list[Event]:
        """A whole Converse answer (``output.message.content`` blocks, ``stopReason``, ``usage``)."""
        self.answer = answer
        out: list[Event] = []
        content = _dict(_dict(answer, "output"), "message").get("content")
        for i, block in enumerate(content if isinstance(content, list) else []):
            if not isinstance(block, dict):
                continue
            text = str_field(block, "text")
            thought = str_field(_dict(_dict(block, "reasoningContent"), "reasoningText"), "text")
            tool = _dict(block, "toolUse")
            if text:
                out.append(TextDelta(text))
            elif thought:
                out.append(TextDelta(thought, kind="reasoning"))
            elif tool:
                arguments = _json_text(tool["input"]) if "input" in tool else ""
                name, call_id = str_field(tool, "name"), str_field(tool, "toolUseId")
                out.append(ToolCallDelta(_key(i), arguments, call_id, name, complete=True))
        reason = str_field(answer, "stopReason")
        if reason:
            out.append(Finish(reason))
        usage = _converse_usage(_dict(answer, "usage"))
        return out + ([usage] if usage else [])

    def filtered_body(self, rule_id: str, reason: str) -> BlockedResponse | None:
        """A Converse answer emptied and stopped ``content_filtered``; an Anthropic answer refused."""
        if self.inner is not None:
            return self.inner.filtered_body(rule_id, reason)
        if self.answer is None:
            return None
        filtered = kept(self.answer, ("usage", "metrics")) | {
            "output": {"message": {"role": "assistant", "content": []}},
            "stopReason": FILTERED_STOP,
        }
        return json_response(filtered, status=200)


# -- shared readers ---------------------------------------------------------------------------


def _dict(obj: Any, name: str) -> dict[str, Any]:
    value = obj.get(name) if isinstance(obj, dict) else None
    return value if isinstance(value, dict) else {}


def _key(index: int | None) -> str:
    """Tool calls are keyed by content block, as the Anthropic dialect keys them."""
    return f"block{index}"


def _json_text(value: Any) -> str:
    """Tool input as compact JSON; input too deep for orjson (over 254 levels) by the
    standard library, and "" when even that cannot write it."""
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        pass
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except (RecursionError, TypeError, ValueError):
        return ""


def _message(data: str) -> tuple[str | None, bool]:
    """An exception's message (its JSON's ``message``, else its first 500 characters),
    and whether only lenient readers take its JSON (botocore's ``json.loads`` does)."""
    obj, lenient = read_json_object(data)
    if obj is not None:
        return str_field(obj, "message") or str_field(obj, "Message"), lenient
    return data[:500] or None, False


def _first_int(obj: dict[str, Any], *names: str) -> int | None:
    return next((v for name in names if (v := int_field(obj, name)) is not None), None)


def _counts(uncached: int | None, output: int | None, read: int | None, write: int | None) -> Usage | None:
    """OpenTelemetry usage from Bedrock's counts: its input count leaves out the cache."""
    if uncached is None and output is None:
        return None
    return Usage(
        input_tokens=None if uncached is None else uncached + (read or 0) + (write or 0),
        output_tokens=output,
        cache_read_input_tokens=read,
        cache_write_input_tokens=write,
    )


def _converse_usage(usage: dict[str, Any]) -> Usage | None:
    """Converse's ``usage``; the cache counts come as ``…Tokens`` or ``…TokenCount``."""
    return _counts(
        int_field(usage, "inputTokens"),
        int_field(usage, "outputTokens"),
        _first_int(usage, "cacheReadInputTokens", "cacheReadInputTokenCount"),
        _first_int(usage, "cacheWriteInputTokens", "cacheWriteInputTokenCount"),
    )


# Native answers of the models Bedrock hosts: (list key, text key, stop key) per shape.
_LISTS = (
    ("outputs", "text", "stop_reason"),
    ("generations", "text", "finish_reason"),
    ("results", "outputText", "completionReason"),
)
_TEXTS = ("generation", "outputText", "completion")
_STOPS = ("stop_reason", "completionReason", "finish_reason")


def _native_events(native: dict[str, Any], streamed: bool) -> list[Event] | None:
    """Text, stop reasons and usage of a native answer or chunk; None when its shape is unknown."""
    out: list[Event] = []
    known = False
    for name in _TEXTS:
        if name in native:
            known = True
            text = str_field(native, name)
            if text:
                out.append(TextDelta(text))
    for list_key, text_key, stop_key in _LISTS:
        items = native.get(list_key)
        if isinstance(items, list):
            known = True
            for choice, item in enumerate(items):
                if isinstance(item, dict):
                    out += _item_events(item, choice, text_key, stop_key)
    choices = native.get("choices")
    if isinstance(choices, list):  # OpenAI-style (gpt-oss, DeepSeek, …)
        known = True
        for position, item in enumerate(choices):
            if isinstance(item, dict):
                index = int_field(item, "index")
                choice = position if index is None else index
                message = _dict(item, "delta" if streamed else "message") or _dict(item, "message")
                text = str_field(message, "content") or str_field(item, "text")
                out += [TextDelta(text, choice)] if text else []
                reason = str_field(item, "finish_reason")
                out += [Finish(reason, choice)] if reason else []
    reason = next((r for name in _STOPS if (r := str_field(native, name))), None)
    if reason:
        known = True
        out.append(Finish(reason))
    usage = _counts(
        _first_int(native, "prompt_token_count", "inputTextTokenCount"),
        _first_int(native, "generation_token_count", "totalOutputTextTokenCount"),
        None,
        None,
    )
    if usage is not None:
        known = True
        out.append(usage)
    return out if known else None


def _item_events(item: dict[str, Any], choice: int, text_key: str, stop_key: str) -> list[Event]:
    out: list[Event] = []
    text = str_field(item, text_key)
    if text:
        out.append(TextDelta(text, choice))
    reason = str_field(item, stop_key)
    if reason:
        out.append(Finish(reason, choice))
    return out


def _aws_error(body: bytes) -> list[Event]:
    """An AWS REST-JSON error body: ``{"message": …}``, the type in ``__type`` or ``code``
    when the body names it (else only in the ``x-amzn-ErrorType`` header)."""
    obj, finding = load_body_json(body)
    findings = [finding] if finding else []
    if not isinstance(obj, dict):
        text = body[:500].decode("utf-8", "replace") or None
        return [StreamError(None, text), *findings]
    code = str_field(obj, "__type") or str_field(obj, "code") or str_field(obj, "Code")
    if code:
        code = code.rpartition("#")[2]  # "com.amazon.coral.validate#ValidationException"
    return [StreamError(code, str_field(obj, "message") or str_field(obj, "Message")), *findings]


DIALECT = Bedrock()
