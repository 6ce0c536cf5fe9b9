"""The Anthropic Messages protocol (``POST /v1/messages``), shared by three dialects.

Anthropic's own API (:mod:`addon.dialects.anthropic`), Claude on Vertex AI
(:mod:`addon.dialects.anthropic_vertex`) and Claude inside Bedrock's InvokeModel
(:mod:`addon.dialects.bedrock`) all read Messages with the classes here; like
:mod:`addon.dialects.responses` this module registers no dialect itself.

Recognised by the request line and body, never by the host (the same API is served by
Anthropic, gateways, Vertex/Bedrock proxies and local servers): a POST to a path ending
in ``/messages`` (not ``/messages/count_tokens`` or ``/messages/batches``) whose body has
the Messages shape (``model``, a ``messages`` list and ``max_tokens``), or, when the
framework passes the request view to :meth:`AnthropicMessages.accepts_body`, that
carries an ``anthropic-version`` header. An event stream nobody recognised by its request
is claimed when its first event is ``message_start``.

Streamed responses are a sequence of typed events (the SSE ``event:`` name repeats the
JSON ``type``; dispatch is on the JSON ``type``)::

    message_start  content_block_start  content_block_delta*  content_block_stop  ...
    message_delta  message_stop                  (ping anywhere; error ends it early)

Usage follows OpenTelemetry GenAI: ``input_tokens`` includes cached tokens, which
Anthropic reports separately (``input_tokens`` + ``cache_read_input_tokens`` +
``cache_creation_input_tokens``). ``output_tokens`` in ``message_start`` is a placeholder;
the cumulative value of the last ``message_delta`` replaces it.

When a content filter stops an answer, it ends as Anthropic ends an answer its own
safety classifier stopped: ``stop_reason: "refusal"``, with ``stop_details`` (``type``
``refusal``, the rule and reason as ``explanation``). A stream being cut gets
``content_block_stop`` for each open text or thinking block, ``message_delta`` with
that stop reason and the output count so far, and ``message_stop``; a ``message_start``
of its own first when none was forwarded. An open tool-use block is left open: its
input is cut, and a client closing it would run the tool with it (SDKs keep it as
partial input; the stop reason says why). The SDKs' stream helpers finish normally
(``get_final_message()``, ``finalMessage()``), and the Vercel AI SDK reports
``finishReason: "content-filter"``. A held non-streamed answer is replaced by the same
message with no content (HTTP 200, its id, model and usage). A request blocked before
it went upstream gets that refused stream when it asked for one (message id fresh,
usage 0: nothing was generated), else Anthropic's error JSON with HTTP 400
(``invalid_request_error``, ``BadRequestError``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from addon.dialects import (
    BlockedResponse,
    Dialect,
    JsonEventNormalizer,
    LimitNotice,
    Normalizer,
    OpenBlocks,
    RequestSummary,
    RequestView,
    int_field,
    json_object,
    str_field,
)
from addon.dialects.blocking import block_message, event_stream, frame, json_response, kept, random_id
from addon.events import (
    Event,
    Finding,
    Finish,
    ResponseMeta,
    StreamEnd,
    StreamError,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from addon.framing import Frame
from addon.record import MAX_TOOL_CALLS
from exchange.request import tool_names

_NO_BLOCK = object()  # no block's text deltas may be read alone yet

# Content blocks that are tool invocations: client tools, Anthropic-run server tools
# (web_search, code_execution, ...) and MCP connector calls. All stream their input as
# input_json_delta fragments and are recorded as tool calls.
TOOL_BLOCKS = frozenset({"tool_use", "server_tool_use", "mcp_tool_use"})
FILTER_ERROR_TYPE = "invalid_request_error"  # Anthropic's type for a request refused on policy
REFUSAL = "refusal"  # the stop reason of an answer Anthropic's classifiers stopped
# Content blocks open at once the normalizer remembers (Anthropic opens one at a time; the
# record keeps no more tool calls): past it, an upstream naming a new index per event.
MAX_BLOCKS = MAX_TOOL_CALLS


class AnthropicMessages(Dialect):
    name = "anthropic-messages"
    provider = "anthropic"

    def matches(self, request: RequestView) -> bool:
        if request.method.upper() != "POST":
            return False
        path = request.path.partition("?")[0].rstrip("/")
        return path.endswith("/messages")

    def accepts_body(self, body: Any, request: RequestView) -> bool:
        """The Messages body shape, or an ``anthropic-version`` header.

        The header claims a request even with an unusual body (e.g. missing
        ``max_tokens``, which the API answers with a 400 worth auditing).
        """
        if request.headers.get("anthropic-version"):
            return True
        return (
            isinstance(body, dict)
            and isinstance(body.get("model"), str)
            and isinstance(body.get("messages"), list)
            and "max_tokens" in body
        )

    def sniff(self, first_event: Frame) -> bool:
        if first_event.event not in ("message_start", "message") or "message_start" not in first_event.data:
            return False
        obj = json_object(first_event.data)
        return obj is not None and obj.get("type") == "message_start" and isinstance(obj.get("message"), dict)

    def summarize(self, body: Any, request: RequestView) -> RequestSummary:
        if not isinstance(body, dict):
            return RequestSummary()
        metadata = body.get("metadata")
        stream = body.get("stream")
        return RequestSummary(
            model=str_field(body, "model"),
            user_id=str_field(metadata, "user_id") if isinstance(metadata, dict) else None,
            stream=stream if isinstance(stream, bool) else None,
            declared_tools=tool_names(body),
        )

    def normalizer(self, request: RequestSummary) -> Normalizer:
        return AnthropicNormalizer(request.model)

    def blocked_response(
        self, summary: RequestSummary, request_view: RequestView, rule_id: str, reason: str, streaming: bool
    ) -> BlockedResponse:
        if streaming:
            normalizer = self.normalizer(summary)
            return event_stream(normalizer.ending(rule_id, reason), normalizer.writer)
        return json_response(_filter_error(rule_id, reason))


def _filter_error(rule_id: str, reason: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": FILTER_ERROR_TYPE, "message": block_message(rule_id, reason)}}


def _dict(obj: Any, name: str) -> dict[str, Any] | None:
    value = obj.get(name)
    return value if isinstance(value, dict) else None


class AnthropicNormalizer(JsonEventNormalizer):
    """Reads Messages stream events (and whole message objects) into common events."""

    filter_stop_reason = REFUSAL

    def __init__(self, model: str | None = None) -> None:
        super().__init__()
        self.model = model  # asked for: names a message the proxy has to start itself
        self.message: dict[str, Any] | None = None  # message_start's message, or the whole message read
        self.usage: dict[str, int] = {}  # Anthropic's raw counts, merged as they arrive
        self.tool_blocks: dict[int | None, Any] = {}  # block index -> input of content_block_start
        self.json_seen: set[int | None] = set()  # open tool blocks that streamed a non-empty fragment
        self.text_blocks: dict[int | None, str] = {}  # open text / thinking block index -> its kind
        self.blocks = OpenBlocks()  # the blocks that got text, for interleaving
        self.blocks_limit = LimitNotice(
            f"content blocks open at once past the first {MAX_BLOCKS} not kept open: their text is read, "
            "their tool calls are not completed"
        )
        self.fast_block: Any = _NO_BLOCK  # the open block whose text deltas text_of may read alone

    # -- stream -------------------------------------------------------------------------

    def on_json(self, event: Frame, obj: dict[str, Any]) -> list[Event]:
        kind = obj.get("type")
        if not isinstance(kind, str):
            kind = event.event
        handler = _HANDLERS.get(kind)
        if handler is None:  # ping and types added after this was written
            return []
        return handler(self, obj)

    def text_of(self, event: Frame, obj: dict[str, Any]) -> str | None:
        """A ``text_delta`` (nearly every event of an answer): :meth:`_block_delta`
        changes nothing for it."""
        if obj.get("type") != "content_block_delta":
            return None
        delta = obj.get("delta")
        if type(delta) is not dict or delta.get("type") != "text_delta":
            return None
        text = delta.get("text")
        if type(text) is not str or not text:
            return None
        if obj.get("index") != self.fast_block and (self.blocks.full or self._text(int_field(obj, "index"), "text")):
            return None  # (interleaved, or past the blocks remembered: on_json reads it, with the finding)
        return text

    def _message_start(self, obj: dict[str, Any]) -> list[Event]:
        message = _dict(obj, "message")
        if message is None:
            return []
        self.message = message
        out: list[Event] = []
        content = message.get("content")
        if isinstance(content, list) and content:
            # Never sent by Anthropic (it starts with "content": []), but the SDKs' final
            # message starts from it: read and checked like any block, and reported.
            out.append(
                Finding(
                    "message_start_content", f"{len(content)} content block(s) in message_start; the SDKs show them"
                )
            )
            out += _whole_blocks(content, False, _start_key)
        out.append(ResponseMeta(model=str_field(message, "model"), response_id=str_field(message, "id")))
        # message_start's output_tokens is a preliminary count (1, or a few): only
        # message_delta's is final, so a stream cut before it records no output count.
        usage = self._merge_usage(message.get("usage"), final=False)
        if usage is not None:
            out.append(usage)
        return out

    def _block_start(self, obj: dict[str, Any]) -> list[Event]:
        block = _dict(obj, "content_block")
        if block is None:
            return []
        kind = block.get("type")
        index = int_field(obj, "index")
        if kind == "text":
            out = self._remember(self.text_blocks, index, "text")
            text = block.get("text")
            return [*out, *self._text(index, "text"), TextDelta(text)] if isinstance(text, str) and text else out
        if kind == "thinking":
            out = self._remember(self.text_blocks, index, "reasoning")
            text = block.get("thinking")
            if isinstance(text, str) and text:
                return [*out, *self._text(index, "reasoning"), TextDelta(text, kind="reasoning")]
            return out
        if kind in TOOL_BLOCKS:
            out = self._remember(self.tool_blocks, index, block.get("input"))
            return [*out, ToolCallDelta(_key(index), id=str_field(block, "id"), name=str_field(block, "name"))]
        return []  # redacted_thinking (opaque), *_tool_result, container_upload, future types

    def _block_delta(self, obj: dict[str, Any]) -> list[Event]:
        delta = _dict(obj, "delta")
        if delta is None:
            return []
        kind = delta.get("type")
        if kind == "text_delta":
            text = delta.get("text")
            return (
                [*self._text(int_field(obj, "index"), "text"), TextDelta(text)]
                if isinstance(text, str) and text
                else []
            )
        if kind == "thinking_delta":
            text = delta.get("thinking")
            if not isinstance(text, str) or not text:
                return []
            return [*self._text(int_field(obj, "index"), "reasoning"), TextDelta(text, kind="reasoning")]
        if kind == "input_json_delta":
            fragment = delta.get("partial_json")
            index = int_field(obj, "index")
            out: list[Event] = []
            if index not in self.tool_blocks:  # no content_block_start seen: still a tool call
                out = self._remember(self.tool_blocks, index, None)
            if not isinstance(fragment, str) or not fragment:  # the first fragment is often ""
                return out
            if index in self.tool_blocks:
                self.json_seen.add(index)
            return [*out, ToolCallDelta(_key(index), fragment)]
        return []  # signature_delta, citations_delta, future types

    def _remember(self, table: dict[int | None, Any], index: int | None, value: Any) -> list[Event]:
        """``table[index] = value`` (a block opened), unless that makes more than
        :data:`MAX_BLOCKS` open: then the block is not remembered (its text and fragments
        are still read; a tool call among them is not completed, nor is its start's input
        kept) and, the first time, the finding ``record_limit``."""
        if index in table or len(self.tool_blocks) + len(self.text_blocks) < MAX_BLOCKS:
            table[index] = value
            return []
        return self.blocks_limit.reached()

    def _text(self, index: int | None, kind: str) -> list[Event]:
        """Text of ``kind`` for block ``index``: noted, a finding when interleaved (:class:`OpenBlocks`)."""
        found = self.blocks.text(index, kind)
        if kind == "text":
            self.fast_block = _NO_BLOCK if found else index
        return found

    def _block_stop(self, obj: dict[str, Any]) -> list[Event]:
        index = int_field(obj, "index")
        self.blocks.end(index)
        if index == self.fast_block:
            self.fast_block = _NO_BLOCK
        self.text_blocks.pop(index, None)
        if index not in self.tool_blocks:
            return []
        start_input = self.tool_blocks.pop(index)
        streamed = index in self.json_seen
        self.json_seen.discard(index)  # (kept only while the block is open: bounded with it)
        arguments = ""
        if not streamed and isinstance(start_input, dict):
            # Nothing streamed: the input is the one content_block_start carried ({} for a
            # tool without parameters), as the SDKs and the non-streamed message have it.
            arguments = _compact_json(start_input)
        return [ToolCallDelta(_key(index), arguments, complete=True)]

    def _message_delta(self, obj: dict[str, Any]) -> list[Event]:
        out: list[Event] = []
        delta = _dict(obj, "delta")
        if delta is not None:
            reason = str_field(delta, "stop_reason")
            if reason is not None:
                out.append(Finish(reason))
            out.extend(_refusal(delta.get("stop_details")))
        usage = self._merge_usage(obj.get("usage"))
        if usage is not None:
            out.append(usage)
        return out

    def _message_stop(self, obj: dict[str, Any]) -> list[Event]:
        return [StreamEnd()]

    def _error(self, obj: dict[str, Any]) -> list[Event]:
        return [_error_event(obj.get("error"))]

    def _merge_usage(self, usage: Any, final: bool = True) -> Usage | None:
        """Merge one usage object into the counts so far; the resulting Usage, if any.

        ``final=False`` (``message_start``) leaves out the output counts, which are
        preliminary there.
        """
        if not isinstance(usage, dict):
            return None
        counts = self.usage
        changed = False
        names = _USAGE_NAMES if final else _INPUT_USAGE_NAMES
        for name in names:
            value = int_field(usage, name)
            if value is not None:
                counts[name] = value
                changed = True
        details = _dict(usage, "output_tokens_details") if final else None
        thinking = int_field(details, "thinking_tokens") if details is not None else None
        if thinking is not None:
            counts["thinking_tokens"] = thinking
            changed = True
        return _usage(counts) if changed else None

    def ending(self, rule_id: str, reason: str) -> list[Frame]:
        """A refusal after whatever was read: open text blocks closed, ``message_delta``
        (``refusal``), ``message_stop``; preceded by a ``message_start`` when none was read."""
        if self.ended:
            return []
        events: list[dict[str, Any]] = []
        if self.message is None:
            events.append({"type": "message_start", "message": _new_message(self.model)})
        events += [{"type": "content_block_stop", "index": i} for i in sorted(self.text_blocks, key=_block_order)]
        events.append(
            {
                "type": "message_delta",
                "delta": {
                    "stop_reason": REFUSAL,
                    "stop_sequence": None,
                    "stop_details": _refusal_details(rule_id, reason),
                },
                "usage": {"output_tokens": self.usage.get("output_tokens", 0)},
            }
        )
        events.append({"type": "message_stop"})
        return [frame(e, e["type"]) for e in events]

    def filtered_body(self, rule_id: str, reason: str) -> BlockedResponse | None:
        """The message read, refused: no content, its id, model and usage."""
        if self.message is None or self.message.get("type") != "message":
            return None
        refused = kept(self.message, ("id", "type", "role", "model", "usage")) | {
            "content": [],
            "stop_reason": REFUSAL,
            "stop_sequence": None,
            "stop_details": _refusal_details(rule_id, reason),
        }
        return json_response(refused, status=200)

    # -- whole message ------------------------------------------------------------------

    def on_response(self, response: dict[str, Any]) -> list[Event]:
        if response.get("type") == "error":
            return [_error_event(response.get("error"))]
        self.message = response
        out: list[Event] = [ResponseMeta(model=str_field(response, "model"), response_id=str_field(response, "id"))]
        reason = str_field(response, "stop_reason")
        content = response.get("content")
        out += _whole_blocks(content if isinstance(content, list) else [], reason == "max_tokens", _key)
        if reason is not None:
            out.append(Finish(reason))
        out.extend(_refusal(response.get("stop_details")))
        usage = _dict(response, "usage")
        if usage is not None:
            merged = self._merge_usage(usage)
            if merged is not None:
                out.append(merged)
        return out


_INPUT_USAGE_NAMES = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
_USAGE_NAMES = ("output_tokens", *_INPUT_USAGE_NAMES)


def _new_message(model: str | None) -> dict[str, Any]:
    """The message of a ``message_start`` the proxy sends itself: nothing generated."""
    return {
        "id": random_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": model or "",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }


def _refusal_details(rule_id: str, reason: str) -> dict[str, Any]:
    """``stop_details`` of a refusal by a content filter: the rule and reason, never the text."""
    return {"type": REFUSAL, "category": None, "explanation": block_message(rule_id, reason)}


def _block_order(index: int | None) -> int:
    return -1 if index is None else index


def _whole_blocks(blocks: list[Any], cut_last: bool, key: Callable[[int], str]) -> list[Event]:
    """Events for whole content blocks (a non-streamed message, or a message_start that
    carries content); ``cut_last``: the message stopped at max_tokens, so a tool call in
    the last block is not whole (the API documents it as incomplete)."""
    out: list[Event] = []
    for i, block in enumerate(blocks):
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind in ("text", "thinking"):
            text = block.get(kind)
            if isinstance(text, str) and text:
                out.append(TextDelta(text, kind="text" if kind == "text" else "reasoning"))
        elif kind in TOOL_BLOCKS:
            value = block.get("input")
            arguments = _compact_json(value) if value is not None else ""
            whole = not (cut_last and i == len(blocks) - 1)
            out.append(
                ToolCallDelta(
                    key(i), arguments, id=str_field(block, "id"), name=str_field(block, "name"), complete=whole
                )
            )
    return out


def _start_key(index: int) -> str:
    """Blocks of a message_start: numbered apart from the streamed blocks' indexes."""
    return f"start{index}"


def _key(index: int | None) -> str:
    """Tool calls are keyed by content block: input_json_delta carries only the index."""
    return f"block{index}"


def _compact_json(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except (TypeError, orjson.JSONEncodeError):
        return ""


def _usage(counts: dict[str, int]) -> Usage:
    """OpenTelemetry usage from Anthropic's counts (input includes cache reads and writes)."""
    cache_read = counts.get("cache_read_input_tokens")
    cache_write = counts.get("cache_creation_input_tokens")
    uncached = counts.get("input_tokens")
    return Usage(
        input_tokens=None if uncached is None else uncached + (cache_read or 0) + (cache_write or 0),
        output_tokens=counts.get("output_tokens"),
        cache_read_input_tokens=cache_read,
        cache_write_input_tokens=cache_write,
        reasoning_output_tokens=counts.get("thinking_tokens"),
    )


def _refusal(details: Any) -> list[Event]:
    """``stop_details`` of a refusal: its explanation (else its category) as refusal text."""
    if not isinstance(details, dict) or details.get("type") != "refusal":
        return []
    text = str_field(details, "explanation") or str_field(details, "category")
    return [TextDelta(text, kind="refusal")] if text else []


def _error_event(error: Any) -> StreamError:
    """``{"type": "error", "error": {"type", "message"}}``; odd shapes still fail the exchange."""
    if isinstance(error, dict):
        code = str_field(error, "type") or str_field(error, "code")
        message = str_field(error, "message")
        if code is not None or message is not None:
            return StreamError(code, message)
    elif isinstance(error, str) and error:
        return StreamError(None, error)
    return StreamError("error", None)


_HANDLERS = {
    "message_start": AnthropicNormalizer._message_start,
    "content_block_start": AnthropicNormalizer._block_start,
    "content_block_delta": AnthropicNormalizer._block_delta,
    "content_block_stop": AnthropicNormalizer._block_stop,
    "message_delta": AnthropicNormalizer._message_delta,
    "message_stop": AnthropicNormalizer._message_stop,
    "error": AnthropicNormalizer._error,
}
