"""The Google Gemini dialect: ``generateContent`` and ``streamGenerateContent``.

One protocol served by two APIs: Google AI Studio
(``/v1beta/models/{model}:streamGenerateContent``) and Vertex AI
(``/v1/projects/{p}/locations/{l}/publishers/google/models/{model}:streamGenerateContent``),
and by any gateway that speaks it. Recognised by a POST whose path ends in the method
``:generateContent`` or ``:streamGenerateContent``; the host only names the provider.

The model is named only in the URL path. Every streamed chunk is a whole
``GenerateContentResponse``: ``text`` parts are deltas, parts with ``thought: true``
are reasoning, ``functionCall`` parts are whole calls (``args`` is a JSON object), and
``usageMetadata`` is cumulative. There is no terminal event: a chunk with a
``finishReason`` is the last content, so the response is complete when the body ends
after one. Without ``alt=sse`` the stream is one JSON array of those chunks, read at
the end by :meth:`GeminiNormalizer.on_body`, tolerantly when the upstream cut it.

When a content filter stops an exchange, the client gets Gemini's own safety outcomes.
A stream being cut ends with a chunk whose unfinished candidates carry ``finishReason:
"SAFETY"`` and, as ``finishMessage`` (which Vertex fills in and the SDK surfaces for
Vertex clients), the rule and reason; google-genai reports
``candidates[i].finish_reason == FinishReason.SAFETY``. A streaming request blocked
before it went upstream gets what Gemini sends for a blocked prompt, one chunk with
``promptFeedback.blockReason: "SAFETY"`` and the rule and reason as
``blockReasonMessage`` (google-genai: ``prompt_feedback.block_reason``), as an event
stream with ``alt=sse`` or as a one-element JSON array without. A held answer
(``generateContent``, or a JSON-array stream read whole) is replaced by the answer read
with each candidate emptied and finished ``SAFETY`` (HTTP 200, its model version,
response id and usage), in the same shape (object or array). A blocked
``generateContent`` gets Google's error JSON, HTTP 400 ``INVALID_ARGUMENT``
(google-genai raises ``ClientError``). Events are framed with CRLF, as Google frames
them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote

import orjson

from addon.dialects import (
    BlockedResponse,
    Dialect,
    JsonEventNormalizer,
    Normalizer,
    RequestSummary,
    RequestView,
    costly_finding,
    error_body_events,
    int_field,
    load_body_json,
    not_read_for_cost,
    str_field,
)
from addon.dialects.blocking import (
    BLOCKED_STATUS,
    block_message,
    event_stream,
    frame,
    json_response,
    unfinished,
)
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
from addon.framing import Frame, Writer
from addon.framing.json_array import JSON_ARRAY_WRITER
from addon.framing.sse import SSEWriter
from addon.record import MAX_CHOICES
from exchange.request import tool_names

GENERATE = "generateContent"
STREAM_GENERATE = "streamGenerateContent"
METHODS = frozenset({GENERATE, STREAM_GENERATE})
VERTEX_PROVIDER = "gcp.vertex_ai"
# The proto default: "not stopped yet" (proto3 JSON normally omits it).
UNSPECIFIED_FINISH = "FINISH_REASON_UNSPECIFIED"
SAFETY = "SAFETY"  # the finish and block reason of Gemini's own safety filters
CRLF = b"\r\n"  # Google's SSE line end
ARRAY_MEDIA_TYPE = "application/json; charset=UTF-8"  # the JSON-array stream, as Google labels it
# A streamed function call's partial argument may address a list element; indices this
# far beyond the list's end are ignored rather than padded (bounded memory).
MAX_INDEX_GAP = 1024
# usageMetadata's counts the record keeps: input, output, cached input, reasoning.
_COUNT_FIELDS = ("promptTokenCount", "candidatesTokenCount", "cachedContentTokenCount", "thoughtsTokenCount")
_NO_COUNTS = (None, None, None, None)


def _method_and_model(path: str) -> tuple[str, str]:
    """``("streamGenerateContent", "gemini-2.5-flash")`` for a Gemini path, else ``("", "")``.

    The model is the last path segment before the colon, so the Vertex prefix
    (``projects/…/publishers/google/models/``) and ``tunedModels/`` fall away. Some
    clients percent-encode the colon (``%3A``).
    """
    if "%" in path:
        path = unquote(path)
    resource, colon, method = path.rpartition(":")
    if not colon or method not in METHODS:
        return "", ""
    return method, resource.rpartition("/")[2]


@dataclass(slots=True)
class GeminiRequestSummary(RequestSummary):
    """The request summary, plus whether a stream is an event stream (``alt=sse``) or a
    JSON array: what the proxy sends into it must take the same form."""

    sse: bool = True


def _alt_sse(query: str) -> bool:
    return parse_qs(query).get("alt", [""])[-1] == "sse"


class Gemini(Dialect):
    name = "gemini"
    provider = "gcp.gemini"  # aiplatform.googleapis.com maps to gcp.vertex_ai by host

    def matches(self, request: RequestView) -> bool:
        return request.method == "POST" and bool(_method_and_model(request.path)[0])

    def accepts_body(self, body: Any, request: RequestView) -> bool:
        # The path is decisive; a body that is not JSON is still audited (the request
        # records a request_invalid_json finding), but a JSON body must be an object.
        return body is None or isinstance(body, dict)

    def summarize(self, body: Any, request: RequestView) -> RequestSummary:
        method, model = _method_and_model(request.path)
        return GeminiRequestSummary(
            model=model or None,
            stream=method == STREAM_GENERATE if method else None,
            declared_tools=tool_names(body),
            sse=_alt_sse(request.query),
        )

    def normalizer(self, request: RequestSummary) -> Normalizer:
        sse = request.sse if isinstance(request, GeminiRequestSummary) else True
        return GeminiNormalizer(sse, streamed=bool(request.stream))

    def blocked_response(
        self, summary: RequestSummary, request_view: RequestView, rule_id: str, reason: str, streaming: bool
    ) -> BlockedResponse:
        message = block_message(rule_id, reason)
        if not streaming:
            return json_response({"error": {"code": BLOCKED_STATUS, "message": message, "status": "INVALID_ARGUMENT"}})
        chunk = {"promptFeedback": {"blockReason": SAFETY, "blockReasonMessage": message}}
        if _alt_sse(request_view.query):
            return event_stream([frame(chunk)], GEMINI_SSE_WRITER)
        return event_stream([frame(chunk)], JSON_ARRAY_WRITER, [("content-type", ARRAY_MEDIA_TYPE)])


# -- errors ---------------------------------------------------------------------------------


def _error_event(err: Any) -> StreamError:
    """A Google API error object: ``{"code": 429, "message": …, "status": "RESOURCE_EXHAUSTED"}``.

    The ``status`` name is the stable, readable code; the numeric HTTP code is the
    fallback (the base :func:`error_body_events` would give the number).
    """
    if isinstance(err, str):
        return StreamError(None, err)
    if not isinstance(err, dict):
        return StreamError(None, None)
    code = str_field(err, "status")
    if code is None and isinstance(err.get("code"), (int, str)) and not isinstance(err.get("code"), bool):
        code = str(err["code"])
    return StreamError(code, str_field(err, "message"))


def gemini_error_body_events(body: bytes) -> list[Event]:
    """Events for an HTTP error body: Google's ``{"error": {…}}``, also wrapped in an array
    (``streamGenerateContent`` without ``alt=sse`` answers errors as ``[{"error": …}]``);
    any other shape goes to the vendor-neutral :func:`error_body_events`."""
    if (costly := costly_finding(body, "the error body")) is not None:
        return [StreamError(None, None), costly]
    try:
        obj = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        obj = None
    if isinstance(obj, list) and obj and isinstance(obj[0], dict):
        obj = obj[0]
    if isinstance(obj, dict) and isinstance(obj.get("error"), dict):
        return [_error_event(obj["error"])]
    return error_body_events(body)


# -- streamed function-call arguments (Vertex streamFunctionCallArguments) ---------------------

_PATH_STEP = re.compile(
    r"""\.(?P<name>[^.\[\]'"]+)|\[(?P<index>\d+)\]|\['(?P<sq>(?:[^'\\]|\\.)*)'\]|\["(?P<dq>(?:[^"\\]|\\.)*)"\]"""
)
_ESCAPE = re.compile(r"\\(.)")


def _json_path(path: Any) -> list[str | int] | None:
    """The steps of a normalized JSONPath (``$.a.b[0]['c d']``), or ``None`` if it is not one."""
    if not isinstance(path, str) or not path.startswith("$"):
        return None
    steps: list[str | int] = []
    pos = 1
    while pos < len(path):
        m = _PATH_STEP.match(path, pos)
        if m is None:
            return None
        if m["index"] is not None:
            steps.append(int(m["index"]))
        elif m["name"] is not None:
            steps.append(m["name"])
        else:
            steps.append(_ESCAPE.sub(r"\1", m["sq"] if m["sq"] is not None else m["dq"]))
        pos = m.end()
    return steps or None


class _Text:
    """A string argument arriving in pieces, joined once when the call is encoded."""

    __slots__ = ("pieces",)

    def __init__(self, first: str) -> None:
        self.pieces = [first]


def _join_text(value: Any) -> str:
    """``default`` for the JSON encoders: a :class:`_Text` is its joined pieces."""
    if isinstance(value, _Text):
        return "".join(value.pieces)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _assign(root: dict[str, Any], steps: list[str | int], value: Any, append: bool) -> None:
    """Set ``value`` at ``steps`` under ``root``, creating containers; with ``append`` a
    string continues the one already there (pieces kept, so long strings stay linear)."""
    node: Any = root
    for step, following in zip(steps, steps[1:]):
        child = _child(node, step)
        if not isinstance(child, dict if isinstance(following, str) else list):
            child = {} if isinstance(following, str) else []
            if not _put(node, step, child):
                return
        node = child
    last = steps[-1]
    if isinstance(value, str):
        existing = _child(node, last)
        if append and isinstance(existing, _Text):
            existing.pieces.append(value)
            return
        value = _Text(value)
    _put(node, last, value)


def _child(node: Any, step: str | int) -> Any:
    if isinstance(node, dict) and isinstance(step, str):
        return node.get(step)
    if isinstance(node, list) and isinstance(step, int) and step < len(node):
        return node[step]
    return None


def _put(node: Any, step: str | int, value: Any) -> bool:
    if isinstance(node, dict) and isinstance(step, str):
        node[step] = value
        return True
    if isinstance(node, list) and isinstance(step, int) and step <= len(node) + MAX_INDEX_GAP:
        node.extend([None] * (step + 1 - len(node)))
        node[step] = value
        return True
    return False


@dataclass(slots=True)
class _OpenCall:
    """A function call whose arguments are still streaming (``willContinue: true``)."""

    key: str
    name: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    whole_args: Any = None  # an ``args`` object sent with the parts, which wins
    continuing: set[str] = field(default_factory=set)  # JSON paths whose string goes on
    has_id: bool = False


def _encode_args(args: Any) -> str:
    """The arguments string: ``args`` as compact JSON (the wire has an object, not a string)."""
    if args is None:
        return ""
    try:
        return orjson.dumps(args, default=_join_text).decode()
    except (orjson.JSONEncodeError, TypeError):  # e.g. an integer beyond 64 bits from json.loads
        return json.dumps(args, ensure_ascii=False, separators=(",", ":"), default=_join_text)


# -- the normalizer ---------------------------------------------------------------------------


class GeminiNormalizer(JsonEventNormalizer):
    """Turns ``GenerateContentResponse`` chunks (SSE events or a JSON array) into events."""

    filter_stop_reason = SAFETY

    def __init__(self, sse: bool = True, streamed: bool = True) -> None:
        super().__init__()
        self.sse = sse  # an event stream (alt=sse), else a JSON array
        # Google frames events with CRLF; without alt=sse a stream is a JSON array.
        self.writer: Writer = GEMINI_SSE_WRITER if sse else JSON_ARRAY_WRITER
        if streamed and not sse:
            self.framing = "json-array"  # streamGenerateContent without alt=sse
        self.chunks = 0  # GenerateContentResponse objects read
        # candidate index -> it has a finishReason; the first MAX_CHOICES (the record keeps no
        # more: past them an upstream naming a new index per chunk)
        self.candidates: dict[int, bool] = {}
        self.finished = False  # a finishReason (or a blocked prompt) was seen
        self.calls = 0  # function calls so far, for unique keys
        self.open_calls: dict[int, _OpenCall] = {}  # candidate (one of candidates) -> call still streaming
        self.meta: tuple[str | None, str | None] = (None, None)
        self.usage: tuple[int | None, ...] | None = None  # the counts last reported
        self.answer: dict[str, Any] | None = None  # a whole response read (an array's last element)
        self.array = False  # the whole body read was a JSON array

    # -- event streams (alt=sse) ----------------------------------------------------------

    def on_json(self, event: Frame, obj: dict[str, Any]) -> list[Event]:
        out: list[Event] = []
        text = _plain_text(obj)
        if text is not None and (obj.get("modelVersion"), obj.get("responseId")) == self.meta:
            # Nearly every chunk: one candidate's text and the usage so far. What _chunk
            # would do, without walking the chunk again.
            self.chunks += 1
            self.candidates.setdefault(0, False)
            out.append(TextDelta(text))
            usage = obj.get("usageMetadata")
            if isinstance(usage, dict):
                self._usage(usage, out)
            return out
        self._chunk(obj, out)
        return out

    def on_end(self, cut: bool = False) -> list[Event]:
        return self._end(cut=cut and not self.sse)

    def ending(self, rule_id: str, reason: str) -> list[Frame]:
        """A last chunk finishing each unfinished candidate (see :func:`unfinished`) with
        ``SAFETY``, with the stream's model version and response id.

        The writer frames it: an SSE event with CRLF, or in the JSON-array form an
        element continuing the array when chunks were read (``,`` … ``]``), else the
        whole array.
        """
        if self.ended:
            return []
        message = block_message(rule_id, reason)
        final: dict[str, Any] = {
            "candidates": [
                {"finishReason": SAFETY, "finishMessage": message, "index": i} for i in unfinished(self.candidates)
            ]
        }
        model, response_id = self.meta
        if model:
            final["modelVersion"] = model
        if response_id:
            final["responseId"] = response_id
        return [frame(final)]

    @property
    def continues(self) -> bool:
        return self.chunks > 0

    def filtered_body(self, rule_id: str, reason: str) -> BlockedResponse | None:
        """The answer read, each candidate emptied and finished ``SAFETY``, in its shape."""
        answer = self.answer
        if answer is None or answer.get("error") is not None:
            return None
        message = block_message(rule_id, reason)
        final: dict[str, Any] = {
            "candidates": [
                {"finishReason": SAFETY, "finishMessage": message, "index": i} for i in sorted(self.candidates) or [0]
            ]
        }
        for name in ("usageMetadata", "modelVersion", "responseId"):
            if answer.get(name) is not None:
                final[name] = answer[name]
        if self.array:
            return json_response([final], 200, ARRAY_MEDIA_TYPE)
        return json_response(final, status=200)

    # -- whole bodies: generateContent, a streamed JSON array, an HTTP error ----------------

    def on_body(self, body: bytes, http_status: int) -> list[Event]:
        if http_status >= 400:
            return gemini_error_body_events(body)
        doc, finding = load_body_json(body)
        out: list[Event] = [finding] if finding else []
        if not_read_for_cost(finding):
            return [*out, StreamEnd()]  # (whole, only not read; nor piece by piece: the pieces make as much)
        if isinstance(doc, dict):  # generateContent: one whole response
            self.answer, self.array = doc, False
            self._chunk(doc, out)
            self._close_all(out)
            out.append(StreamEnd())
            return out
        if isinstance(doc, list):
            elements, cut = doc, False
        else:
            parsed = _array_prefix(body)
            if parsed is None:
                return [Finding("response_invalid_json", "the response body is neither a JSON object nor an array")]
            elements, cut = parsed
        self.array = True
        for element in elements:
            if isinstance(element, dict):
                self.answer = element
                self._chunk(element, out)
            else:
                out.append(Finding("response_invalid_json", "a response array element is not a JSON object"))
        out.extend(self._end(cut))
        return out

    # -- one GenerateContentResponse ------------------------------------------------------

    def _chunk(self, obj: dict[str, Any], out: list[Event]) -> None:
        self.chunks += 1
        if obj.get("error") is not None:
            out.append(_error_event(obj["error"]))
        meta = (str_field(obj, "modelVersion"), str_field(obj, "responseId"))
        if meta != self.meta and meta != (None, None):
            self.meta = meta
            out.append(ResponseMeta(model=meta[0], response_id=meta[1]))
        feedback = obj.get("promptFeedback")
        if isinstance(feedback, dict):
            reason = str_field(feedback, "blockReason")
            if reason:
                self.finished = True
                message = str_field(feedback, "blockReasonMessage") or f"the prompt was blocked ({reason})"
                out.append(Finish(reason, 0))
                out.append(StreamError(reason, message))
        candidates = obj.get("candidates")
        if isinstance(candidates, list):
            for position, candidate in enumerate(candidates):
                if isinstance(candidate, dict):
                    self._candidate(candidate, position, out)
        usage = obj.get("usageMetadata")
        if isinstance(usage, dict):
            self._usage(usage, out)

    def _candidate(self, candidate: dict[str, Any], position: int, out: list[Event]) -> None:
        index = int_field(candidate, "index")
        choice = position if index is None else index  # proto3 JSON omits index 0
        if len(self.candidates) < MAX_CHOICES:
            self.candidates.setdefault(choice, False)
        content = candidate.get("content")
        parts = content.get("parts") if isinstance(content, dict) else None
        if isinstance(parts, list):
            for part in parts:
                if not isinstance(part, dict):
                    continue
                call = part.get("functionCall")
                if isinstance(call, dict):
                    self._function_call(call, choice, out)
                    continue
                text = part.get("text")
                if isinstance(text, str) and text:
                    out.append(TextDelta(text, choice, "reasoning" if part.get("thought") is True else "text"))
        reason = str_field(candidate, "finishReason")
        if reason and reason != UNSPECIFIED_FINISH:
            self.finished = True
            if choice in self.candidates:
                self.candidates[choice] = True
            self._close(choice, out)  # a call still streaming now never completes
            out.append(Finish(reason, choice))

    def _function_call(self, call: dict[str, Any], choice: int, out: list[Event]) -> None:
        """A ``functionCall`` part: normally a whole call; with Vertex's
        ``streamFunctionCallArguments`` the first part has ``willContinue: true`` and
        later parts carry ``partialArgs`` until one without ``willContinue``."""
        name, call_id = str_field(call, "name"), str_field(call, "id")
        open_call = self.open_calls.get(choice)
        streaming = call.get("willContinue") is True or "partialArgs" in call
        if open_call is not None and name and open_call.name and name != open_call.name:
            self._close(choice, out)  # another function: the open one never finished
            open_call = None
        if open_call is None and (not streaming or choice not in self.candidates):
            # a whole call; or a part of one still streaming for a candidate past MAX_CHOICES,
            # whose events the record does not keep: read, not remembered
            if name is None and call_id is None and "args" not in call:
                return  # an empty functionCall closing nothing
            out.append(ToolCallDelta(self._key(), _encode_args(call.get("args")), call_id, name, choice, not streaming))
            return
        if open_call is None:
            open_call = self.open_calls[choice] = _OpenCall(self._key())
        if (name and not open_call.name) or (call_id and not open_call.has_id):
            open_call.name = open_call.name or name
            open_call.has_id = open_call.has_id or bool(call_id)
            out.append(ToolCallDelta(open_call.key, "", call_id, name, choice))
        partial = call.get("partialArgs")
        if isinstance(partial, list):
            for arg in partial:
                if isinstance(arg, dict):
                    self._partial_arg(open_call, arg)
        if call.get("args") is not None:
            open_call.whole_args = call["args"]
        if call.get("willContinue") is not True:
            del self.open_calls[choice]
            out.append(ToolCallDelta(open_call.key, self._arguments(open_call), choice=choice, complete=True))

    @staticmethod
    def _partial_arg(open_call: _OpenCall, arg: dict[str, Any]) -> None:
        path = arg.get("jsonPath")
        steps = _json_path(path)
        if steps is None or not isinstance(path, str):  # (a path is a string: _json_path says so)
            return
        if "stringValue" in arg:
            value = arg["stringValue"]
        elif "numberValue" in arg:
            value = arg["numberValue"]
        elif "boolValue" in arg:
            value = arg["boolValue"]
        elif "nullValue" in arg:
            value = None
        else:
            return
        _assign(open_call.args, steps, value, append=path in open_call.continuing)
        if arg.get("willContinue") is True:
            open_call.continuing.add(path)
        else:
            open_call.continuing.discard(path)

    @staticmethod
    def _arguments(open_call: _OpenCall) -> str:
        return _encode_args(open_call.whole_args if open_call.whole_args is not None else open_call.args)

    def _close(self, choice: int, out: list[Event]) -> None:
        """A streaming call that will get no more parts: keep what arrived, incomplete."""
        open_call = self.open_calls.pop(choice, None)
        if open_call is not None:
            out.append(ToolCallDelta(open_call.key, self._arguments(open_call), choice=choice))

    def _close_all(self, out: list[Event]) -> None:
        for choice in list(self.open_calls):
            self._close(choice, out)

    def _key(self) -> str:
        self.calls += 1
        return f"call{self.calls}"

    def _usage(self, usage: dict[str, Any], out: list[Event]) -> None:
        # Every chunk repeats the cumulative counts: compared as a tuple, a Usage is made
        # only when they changed.
        p, c, k, t = map(usage.get, _COUNT_FIELDS)
        counts = (  # (int_field's test: JSON gives no other int than int and bool)
            p if type(p) is int else None,
            c if type(c) is int else None,
            k if type(k) is int else None,
            t if type(t) is int else None,
        )
        # Vertex's first chunk may carry only trafficType: an all-None Usage says nothing.
        if counts != self.usage and counts != _NO_COUNTS:
            self.usage = counts
            # input, output, cached input, (cache writes: Gemini has none), reasoning
            out.append(Usage(counts[0], counts[1], counts[2], None, counts[3]))

    def _end(self, cut: bool) -> list[Event]:
        """The body is over: complete if a finishReason came and nothing was cut off."""
        out: list[Event] = []
        self._close_all(out)
        if self.ended:  # a [DONE] sentinel (a gateway's) already ended it
            return out
        if self.finished and not cut:
            self.ended = True
            out.append(StreamEnd())
        elif cut:
            out.append(Finding("missing_stream_end", "the response array was cut off"))
        else:
            out.append(Finding("missing_stream_end", "the body ended without a chunk carrying finishReason"))
        return out


def _plain_text(chunk: dict[str, Any]) -> str | None:
    """The text of a chunk that is one candidate (index 0) with one text part and
    nothing else :meth:`GeminiNormalizer._chunk` acts on but its usage; else None."""
    candidates = chunk.get("candidates")
    if type(candidates) is not list or len(candidates) != 1 or "promptFeedback" in chunk:
        return None
    candidate = candidates[0]
    if type(candidate) is not dict or chunk.get("error") is not None:
        return None
    content = candidate.get("content")
    parts = content.get("parts") if type(content) is dict else None
    if type(parts) is not list or len(parts) != 1:
        return None
    part = parts[0]
    if type(part) is not dict or "functionCall" in part or "thought" in part:
        return None
    text = part.get("text")
    if type(text) is not str or not text:
        return None
    index, reason = candidate.get("index"), candidate.get("finishReason")
    if (type(index) is int and index != 0) or (reason is not None and reason != UNSPECIFIED_FINISH):
        return None
    return text


def _array_prefix(body: bytes) -> tuple[list[Any], bool] | None:
    """The whole elements of a JSON array body that may be cut off, and whether it was.

    ``None`` when the body does not start a JSON array. This runs only when the fast
    parse of the whole body failed, i.e. on a cut stream. The standard library's
    ``JSONDecoder.raw_decode`` decodes one value from a position and reports where it
    ended, which is all a prefix reader needs; orjson has no such entry point, and a
    streaming JSON parser (ijson, …) would be a dependency for this rare path only.
    """
    text = body.decode("utf-8", "replace")
    decoder = json.JSONDecoder()
    pos, end = 0, len(text)
    while pos < end and text[pos] in " \t\r\n\ufeff":
        pos += 1
    if pos >= end or text[pos] != "[":
        return None
    pos += 1
    elements: list[Any] = []
    while True:
        while pos < end and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= end:
            return elements, True
        if text[pos] == "]":
            return elements, bool(text[pos + 1 :].strip())  # trailing garbage: not a clean end
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return elements, True
        elements.append(value)


GEMINI_SSE_WRITER = SSEWriter(CRLF)
DIALECT = Gemini()
