"""Exact response bytes of the mock, as pure functions (no I/O, no clock).

Everything the server writes is computed here first, so a test can build the
same bytes and compare them with what a client (or the proxy under test)
received. Determinism is therefore a feature: timestamps are the constant
:data:`CREATED`, ids are derived from a digest of the request and scenario
(the same request gets the same ids, different requests different ones) and
the default text is ``tök0 tök1 …`` (the ``ö`` makes every stream carry
multi-byte UTF-8; ``ascii`` gives ``tok0 tok1 …``).

Every dialect renders the same abstract answer: :func:`generate` turns a
request and a :class:`~mockllm.scenario.Scenario` into a :class:`Generation`
(reasoning deltas, text deltas, tool calls with their argument fragments,
why it stopped, token counts), and one builder per API turns that into that
API's wire format. So a knob like ``tool`` or ``error`` means the same thing
in every dialect, and the wire formats differ only where the APIs do.

A :class:`Dialect` bundles an API's builders: the streamed body as a list of
already-framed items (one per SSE event or JSON array element), the body of
a request that does not stream, and the HTTP error body; :data:`DIALECTS`
maps names to them. The transport shaping (truncation, gzip) lives in
:func:`plan_body`, which works on any list of items, including the ``raw``
chunks.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Literal

import brotli
import orjson
from backports import zstd

from .scenario import Scenario

CREATED = 1749292800
"""Fixed ``created`` timestamp (the draft's example value) to keep output reproducible."""
TOOL_CALL_ID = "call_1"
"""The llm-stream dialect's tool call id (its draft's example value)."""
TOOL_CITIES = ("Vienna", "Zürich", "Graz", "Linz")
"""The ``city`` argument of parallel tool call 0, 1, 2, … (cycling)."""
TOOL_ARGUMENTS = '{"city":"Vienna"}'
"""Arguments of the first tool call."""
REASONING_DELTAS = ("Let me", " think", " it över.")
"""Reasoning / thinking text, as streamed, with ``reasoning=1``."""
REFUSAL_TEXT = "I'm sorry, I can't help with thät."
"""Default answer with ``refusal=1`` (split into ``events`` deltas)."""
SIGNATURE = "bW9jay10aGlua2luZy1zaWduYXR1cmU="
"""Anthropic's opaque thinking signature (base64 of ``mock-thinking-signature``)."""
SYSTEM_FINGERPRINT = "fp_mock"
DEFAULT_MODEL = "mock-model"
"""Served when neither the scenario nor the request names a model."""

STAMP_MARK = b"~" + b"#" * 19
"""Where a ``stamp`` scenario's write time goes (see :func:`stamp`): JSON-safe ASCII."""
STAMP_LETTERS = b"abcdefghij"
"""The write time's digits 0 to 9, written as letters (see :func:`stamp`)."""
_TO_LETTERS = bytes.maketrans(b"0123456789", STAMP_LETTERS)
_TO_DIGITS = bytes.maketrans(STAMP_LETTERS, b"0123456789")
STAMP_PATTERN = re.compile(rb"~([a-j]{19})")
"""A write stamp in the bytes a client receives; :func:`stamp_time` reads its group."""

_AWKWARD_SIZES = (2, 3, 5)
"""Lengths that tool-argument fragments cycle through: they split JSON tokens like real streams do."""

Stop = Literal["end", "tool_use", "max_tokens", "error"]
Event = tuple[str, dict[str, Any]]
"""An event's type and its fields, before framing and numbering."""


# --- scenario handling shared by all dialects -------------------------------


def split_text(text: str, count: int) -> list[str]:
    """``text`` in ``count`` pieces of (nearly) equal length."""
    bounds = [len(text) * i // count for i in range(count + 1)] if count else []
    return [text[start:end] for start, end in zip(bounds, bounds[1:])]


def delta_texts(scenario: Scenario) -> list[str]:
    """The text of each content delta; concatenated they form the answer."""
    texts = _plain_delta_texts(scenario)
    if scenario.stamp:
        return [STAMP_MARK.decode() + text for text in texts]
    return texts


def _plain_delta_texts(scenario: Scenario) -> list[str]:
    count = scenario.events
    if scenario.text is not None:
        return split_text(scenario.text, count)
    word = "tok" if scenario.ascii else "tök"
    if scenario.size is not None:
        return [_exact_utf8(f"{word}{i} ", scenario.size) for i in range(count)]
    return [f"{word}{i}" if i == 0 else f" {word}{i}" for i in range(count)]


def stamp(data: bytes, now_ns: int) -> bytes:
    """``data`` with every :data:`STAMP_MARK` replaced by ``~`` and ``now_ns``'s 19
    digits written as the letters ``a`` to ``j`` (``0`` to ``9``).

    The server calls this at the moment of each write (``stamp`` scenarios), so a
    client can tell how long each event took to reach it. The mark and the stamp
    have the same length: event sizes do not change. Letters, not digits: the stamp is
    in the answer text that content filters read, and ``@`` with a run of 19 digits
    looks like an e-mail address and a card number to the PII detector in every delta,
    which ordinary text does not (a word of letters is what prose brings).
    """
    return data.replace(STAMP_MARK, b"~" + (b"%019d" % now_ns).translate(_TO_LETTERS))


def stamp_time(letters: bytes) -> int:
    """The ``time.time_ns()`` a stamp's 19 letters (:data:`STAMP_PATTERN`'s group) stand for."""
    return int(letters.translate(_TO_DIGITS))


def _exact_utf8(unit: str, size: int) -> str:
    """``unit`` repeated and cut to exactly ``size`` UTF-8 bytes.

    A multi-byte character cut in half is dropped and replaced by ``.``
    padding so the result is valid text of exactly the requested length.
    """
    encoded = unit.encode()
    repeated = (encoded * (size // len(encoded) + 1))[:size].decode(errors="ignore")
    return repeated + "." * (size - len(repeated.encode()))


def tool_arguments(index: int) -> str:
    """The complete JSON arguments of parallel tool call ``index``."""
    return orjson.dumps({"city": TOOL_CITIES[index % len(TOOL_CITIES)]}).decode()


def split_awkwardly(text: str) -> list[str]:
    """``text`` in fragments of 2, 3, 5, 2, … characters, cutting through keys and values."""
    pieces: list[str] = []
    start = 0
    while start < len(text):
        size = _AWKWARD_SIZES[len(pieces) % len(_AWKWARD_SIZES)]
        pieces.append(text[start : start + size])
        start += size
    return pieces


def served_model(request: dict[str, Any], scenario: Scenario) -> str:
    """The model the mock claims to serve: scenario, then request, then a default."""
    if scenario.model:
        return scenario.model
    model = request.get("model")
    return model if isinstance(model, str) and model else DEFAULT_MODEL


_PROMPT_KEYS = frozenset({"content", "text", "input", "instructions", "system", "prompt"})


def prompt_tokens(request: Any) -> int:
    """A deterministic stand-in for input tokens: words in prompt-like strings.

    Walking every ``content``/``text``/``input``/``instructions``/``system``/``prompt``
    key, whatever the nesting, makes the count work for all dialects'
    request shapes without knowing them.
    """
    total = 0
    stack = [request]  # iterative: a request nested thousands of levels deep is counted too
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            for key, value in item.items():
                if key in _PROMPT_KEYS and isinstance(value, str):
                    total += len(value.split())
                else:
                    stack.append(value)
    return total


def error_message(code: str) -> str:
    return f"mock error: {code}"


def seq_numbers(count: int, scenario: Scenario) -> list[int]:
    """Sequence numbers 0..count-1, skipping one after ``seq_gap`` events."""
    gap = scenario.seq_gap
    return [i if gap is None or i < gap else i + 1 for i in range(count)]


def sse_event(
    event_type: str | None,
    data: dict[str, Any] | bytes,
    scenario: Scenario,
    *,
    event_id: int | None = None,
    crlf: bool = False,
) -> bytes:
    """Frame one SSE event: optional ``id:`` and ``event:`` lines, one ``data:`` line.

    ``data`` is JSON-encoded unless it is bytes (OpenAI's ``[DONE]``).
    ``crlf`` (the scenario's or the dialect's: Google always uses it)
    switches line ends; ``comment`` prepends a separate comment-only block,
    which parsers must skip without dispatching an event.
    """
    newline = b"\r\n" if crlf or scenario.crlf else b"\n"
    lines = [b"id: %d" % event_id] if event_id is not None else []
    if event_type is not None:
        lines.append(b"event: " + event_type.encode())
    lines.append(b"data: " + (data if isinstance(data, bytes) else orjson.dumps(data)))
    framed = newline.join(lines) + newline + newline
    if scenario.comment:
        framed = b": keep-alive" + newline + newline + framed
    return framed


def with_end[T](items: list[T], end: T, scenario: Scenario) -> list[T]:
    """``items`` followed by the stream's terminal ``end``, unless ``no_end``."""
    return items if scenario.no_end else [*items, end]


def raw_chunks(scenario: Scenario) -> list[bytes]:
    """The ``raw`` body split into ``chunk``-sized writes (one write if unset)."""
    data = scenario.raw or b""
    step = scenario.chunk or len(data) or 1
    return [data[i : i + step] for i in range(0, len(data), step)]


@dataclass(frozen=True)
class BodyPlan:
    """The body as the server must write it."""

    writes: Iterable[bytes]
    """One item per write; the server paces between them (made lazily for ``repeat``)."""
    complete: bool
    """False: abort the transport after the writes instead of ending the body."""


BOMB_PIECE = b" " * (1 << 20)


def plan_body(items: list[bytes], scenario: Scenario, event_stream: bool = True) -> BodyPlan:
    """Apply truncation, repetition, the bomb and the Content-Encoding to a list of
    events (or raw chunks).

    Every item is compressed and flushed on its own (``zstd``: one frame each), so
    each write is decodable as soon as it arrives and the stream keeps streaming;
    the gzip trailer is appended to the last write of a complete body and is missing
    from a truncated one, like a real upstream dying.
    """
    complete = scenario.truncate_after is None
    if scenario.truncate_after is not None:
        items = items[: scenario.truncate_after]
    if scenario.bomb:
        return BodyPlan(_bombed(tuple(items), scenario.coding, scenario.bomb, event_stream, complete), complete)
    writes: Iterable[bytes] = items
    if scenario.repeat and len(items) > 1:
        writes = _repeated(items, scenario.repeat)
    if scenario.coding is not None:
        writes = _encoded(writes, Encoder(scenario.coding), complete)
    return BodyPlan(writes if scenario.repeat else list(writes), complete)


def _repeated(items: list[bytes], times: int) -> Iterator[bytes]:
    yield items[0]
    for _ in range(times + 1):
        yield items[1]
    yield from items[2:]


def _encoded(writes: Iterable[bytes], encoder: Encoder, complete: bool) -> Iterator[bytes]:
    """Each write compressed and flushed; the coding's end appended to the last one."""
    previous = None
    for item in writes:
        if previous is not None:
            yield previous
        previous = encoder.write(item)
    last = (previous or b"") + (encoder.end() if complete else b"")
    if last:
        yield last


@functools.lru_cache(maxsize=8)
def _bombed(items: tuple[bytes, ...], coding: str | None, mib: int, event_stream: bool, complete: bool) -> list[bytes]:
    """The writes of a body with a bomb after its first item (kept: made once per body)."""
    encoder = Encoder(coding)
    writes = [encoder.write(item) for item in items[:1]]
    head, tail = (b":", b"\n\n") if event_stream else (b"", b"")
    writes.append(encoder.write_pieces([head, *([BOMB_PIECE] * mib), tail]))
    writes += [encoder.write(item) for item in items[1:]]
    if complete:
        writes[-1] += encoder.end()
    return [w for w in writes if w]


class Encoder:
    """One body's Content-Encoding, applied write by write."""

    def __init__(self, coding: str | None) -> None:
        self.coding = coding
        if coding in ("gzip", "deflate"):
            self._z = zlib.compressobj(wbits=31 if coding == "gzip" else zlib.MAX_WBITS)
        elif coding == "br":
            self._br = brotli.Compressor(quality=5)

    def write(self, data: bytes) -> bytes:
        return self.write_pieces([data])

    def write_pieces(self, pieces: list[bytes]) -> bytes:
        """The pieces as one flushed write (a zstd frame of its own)."""
        if self.coding in ("gzip", "deflate"):
            return b"".join(self._z.compress(p) for p in pieces) + self._z.flush(zlib.Z_SYNC_FLUSH)
        if self.coding == "br":
            return b"".join(self._br.process(p) for p in pieces) + self._br.flush()
        if self.coding == "zstd":
            c = zstd.ZstdCompressor()
            return b"".join(c.compress(p) for p in pieces) + c.flush()
        return b"".join(pieces)

    def end(self) -> bytes:
        if self.coding in ("gzip", "deflate"):
            return self._z.flush()
        if self.coding == "br":
            return self._br.finish()
        return b""


# --- the abstract answer ----------------------------------------------------


@dataclass(frozen=True)
class ToolCall:
    """One generated tool call, as far as it got."""

    index: int
    """Position among the answer's parallel calls."""
    name: str
    fragments: list[str]
    """The arguments as streamed; all of them unless the token limit cut the call."""
    complete: bool

    @property
    def arguments(self) -> str:
        """The generated arguments: valid JSON only if ``complete``."""
        return "".join(self.fragments)


@dataclass(frozen=True)
class Generation:
    """What the mock model produced for one request, independent of any wire format.

    Every choice / candidate (``choices`` of them) gets this same answer.
    Each delta and each tool-argument fragment counts as one output token.
    """

    digest: str
    """Derived from request and scenario; the seed of every id."""
    model: str
    reasoning: list[str]
    texts: list[str]
    refusal: bool
    """``texts`` are a refusal, not an answer."""
    tool_calls: list[ToolCall]
    stop: Stop
    error: str | None
    choices: int
    input_tokens: int

    @property
    def text(self) -> str:
        return "".join(self.texts)

    @property
    def reasoning_text(self) -> str:
        return "".join(self.reasoning)

    @property
    def output_tokens(self) -> int:
        """Output tokens of one choice."""
        return len(self.reasoning) + len(self.texts) + sum(len(call.fragments) for call in self.tool_calls)

    def item_id(self, prefix: str, index: int) -> str:
        """A unique-looking id such as ``fc_<digest>01``."""
        return f"{prefix}_{self.digest}{index:02d}"

    def call_id(self, call: ToolCall, choice: int = 0, prefix: str = "call") -> str:
        """The id of ``call`` in ``choice``, unique across all choices."""
        return self.item_id(prefix, choice * len(self.tool_calls) + call.index)


def _request_int(value: Any) -> int | None:
    """A request's non-negative integer field, or None when absent or not one."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _take(parts: list[str], budget: int | None) -> tuple[list[str], int | None]:
    """The parts that fit in ``budget`` tokens (None: unlimited) and the budget left."""
    if budget is None:
        return parts, None
    kept = parts[:budget]
    return kept, budget - len(kept)


def _canonical(request: dict[str, Any]) -> bytes:
    """The request's bytes for the digest; a request only Python's json reads (a lone
    surrogate, NaN) is written by that reader too, as a server like vLLM would accept it."""
    try:
        return orjson.dumps(request, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return json.dumps(request, sort_keys=True).encode()


def generate(request: dict[str, Any], scenario: Scenario, *, max_tokens: Any = None, choices: Any = None) -> Generation:
    """The answer to ``request`` under ``scenario``.

    ``max_tokens`` and ``choices`` are the request's own fields for the
    output token limit and the number of choices (each dialect names them
    differently); the scenario's ``n`` wins over ``choices``. Output beyond
    the limit is cut (reasoning, then text, then tool arguments) and the
    answer stops with ``max_tokens``; ``truncate_tool`` sets the limit in
    the middle of the last tool call's arguments. An ``error`` keeps only
    ``error_after`` text deltas and no tool calls.
    """
    reasoning = list(REASONING_DELTAS) if scenario.reasoning else []
    if scenario.refusal:
        texts = split_text(REFUSAL_TEXT if scenario.text is None else scenario.text, scenario.events)
    else:
        texts = delta_texts(scenario)
    arguments = [split_awkwardly(tool_arguments(i)) for i in range(scenario.tools)] if scenario.tool else []
    calls: list[ToolCall] = []
    stop: Stop
    if scenario.error is not None:
        texts, stop = texts[: scenario.error_after], "error"
    else:
        budget = _request_int(max_tokens)
        if scenario.truncate_tool and arguments:
            budget = len(reasoning) + len(texts) + sum(map(len, arguments[:-1])) + len(arguments[-1]) // 2
        all_reasoning, all_texts = reasoning, texts
        reasoning, budget = _take(reasoning, budget)
        texts, budget = _take(texts, budget)
        for index, fragments in enumerate(arguments):
            if budget == 0:
                break
            kept, budget = _take(fragments, budget)
            calls.append(ToolCall(index, scenario.tool or "", kept, complete=kept == fragments))
        complete = (reasoning, texts, len(calls)) == (all_reasoning, all_texts, len(arguments))
        if not complete or not all(call.complete for call in calls):
            stop = "max_tokens"
        else:
            stop = "tool_use" if calls else "end"
    digest = hashlib.sha256(_canonical(request) + repr(scenario).encode())
    return Generation(
        digest=digest.hexdigest()[:24],
        model=served_model(request, scenario),
        reasoning=reasoning,
        texts=texts,
        refusal=scenario.refusal,
        tool_calls=calls,
        stop=stop,
        error=scenario.error,
        choices=scenario.n or _request_int(choices) or 1,
        input_tokens=prompt_tokens(request),
    )


@dataclass(frozen=True)
class Part:
    """One output item / content block of an answer, in order: reasoning, text, tool calls."""

    kind: Literal["reasoning", "text", "tool_call"]
    call: ToolCall | None = None


def output_parts(generation: Generation) -> list[Part]:
    """The answer's items; a text item is left out only when tool calls replace it."""
    parts = [Part("reasoning")] if generation.reasoning else []
    if generation.texts or not generation.tool_calls:
        parts.append(Part("text"))
    return parts + [Part("tool_call", call) for call in generation.tool_calls]


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


# --- HTTP errors --------------------------------------------------------------


@dataclass(frozen=True)
class HttpError:
    """How each API names the error of one HTTP status."""

    code: str
    """llm-stream and LMSP ``code``."""
    openai_type: str
    openai_code: str | None
    anthropic_type: str
    google_status: str


_INVALID = "invalid_request_error"
_HTTP_ERRORS = {
    400: HttpError("invalid_request", _INVALID, None, _INVALID, "INVALID_ARGUMENT"),
    401: HttpError("unauthorized", _INVALID, "invalid_api_key", "authentication_error", "UNAUTHENTICATED"),
    403: HttpError("forbidden", _INVALID, None, "permission_error", "PERMISSION_DENIED"),
    404: HttpError("not_found", _INVALID, "model_not_found", "not_found_error", "NOT_FOUND"),
    413: HttpError(
        "context_length_exceeded", _INVALID, "context_length_exceeded", "request_too_large", "INVALID_ARGUMENT"
    ),
    429: HttpError("rate_limited", "requests", "rate_limit_exceeded", "rate_limit_error", "RESOURCE_EXHAUSTED"),
    500: HttpError("internal_error", "server_error", None, "api_error", "INTERNAL"),
    503: HttpError("overloaded", "server_error", None, "overloaded_error", "UNAVAILABLE"),
    529: HttpError("overloaded", "server_error", None, "overloaded_error", "UNAVAILABLE"),
}


def http_error(status: int) -> HttpError:
    """The error names for ``status``; unlisted ones borrow their class's (400 or 500) with a ``http_N`` code."""
    if status in _HTTP_ERRORS:
        return _HTTP_ERRORS[status]
    like = _HTTP_ERRORS[500 if status >= 500 else 400]
    return HttpError(f"http_{status}", like.openai_type, None, like.anthropic_type, like.google_status)


def llm_stream_error_body(scenario: Scenario, status: int) -> bytes:
    """llm-stream: ``{"error": {"code", "message"}}``."""
    code = scenario.error or http_error(status).code
    return orjson.dumps({"error": {"code": code, "message": error_message(code)}})


def _openai_error(code: str | None, error_type: str) -> dict[str, Any]:
    return {"message": error_message(code or error_type), "type": error_type, "param": None, "code": code}


def openai_error_body(scenario: Scenario, status: int) -> bytes:
    """OpenAI (both APIs): ``{"error": {"message", "type", "param", "code"}}``."""
    error = http_error(status)
    return orjson.dumps({"error": _openai_error(scenario.error or error.openai_code, error.openai_type)})


def _anthropic_error(error_type: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": error_message(error_type)}}


def anthropic_error_body(scenario: Scenario, status: int) -> bytes:
    """Anthropic: ``{"type": "error", "error": {"type", "message"}}``; ``error`` names the type."""
    return orjson.dumps(_anthropic_error(scenario.error or http_error(status).anthropic_type))


def _google_error(status: int, google_status: str) -> dict[str, Any]:
    return {"error": {"code": status, "message": error_message(google_status), "status": google_status}}


def gemini_error_body(scenario: Scenario, status: int) -> bytes:
    """Google: ``{"error": {"code": 429, "message", "status": "RESOURCE_EXHAUSTED"}}``."""
    return orjson.dumps(_google_error(status, scenario.error or http_error(status).google_status))


def problem(status: int, code: str, detail: str) -> dict[str, Any]:
    """An LMSP problem document (RFC 9457 fields plus the LMSP ``code``).

    ``type`` is ``about:blank``, so ``title`` is the status phrase; the
    machine-readable reason is ``code``.
    """
    try:
        title = HTTPStatus(status).phrase
    except ValueError:
        title = "Error"
    return {"type": "about:blank", "title": title, "status": status, "detail": detail, "code": code}


def lmsp_error_body(scenario: Scenario, status: int) -> bytes:
    code = scenario.error or http_error(status).code
    return orjson.dumps(problem(status, code, error_message(code)))


# --- llm-stream -----------------------------------------------------------------


def llm_stream_events(request: dict[str, Any], scenario: Scenario) -> list[bytes]:
    """draft-llm-stream-00 (section 5): stream.start … stream.end.

    Order: stream.start, deltas, then either an error event (after
    ``error_after`` deltas) or [tool.call], content.stop, [usage]; finally
    stream.end unless ``no_end``. All content shares block index 0; a tool
    call stops that block with ``tool_use``. ``request_id`` is echoed from
    ``metadata.request_id`` when present and omitted otherwise.
    """
    request_id = _dict(request.get("metadata")).get("request_id")
    echo = {"request_id": request_id} if isinstance(request_id, str) else {}

    texts = delta_texts(scenario)
    if scenario.error is not None:
        texts = texts[: scenario.error_after]
    events: list[Event] = [("stream.start", {**echo, "model": served_model(request, scenario), "created": CREATED})]
    events += [("content.delta", {"index": 0, "role": "assistant", "delta": {"text": text}}) for text in texts]
    if scenario.error is not None:
        events.append(("error", {"code": scenario.error, "message": error_message(scenario.error)}))
    else:
        if scenario.tool is not None:
            events.append(
                (
                    "tool.call",
                    {"index": 0, "id": TOOL_CALL_ID, "name": scenario.tool, "arguments": TOOL_ARGUMENTS},
                )
            )
        stop_reason = "tool_use" if scenario.tool is not None else "end_turn"
        events.append(("content.stop", {"index": 0, "stop_reason": stop_reason}))
        if scenario.usage:
            events.append(("usage", {"input_tokens": prompt_tokens(request), "output_tokens": len(texts)}))
    events = with_end(events, ("stream.end", echo), scenario)

    return [
        sse_event(event_type, {"v": "1.0", "seq": seq, "type": event_type, **fields}, scenario)
        for (event_type, fields), seq in zip(events, seq_numbers(len(events), scenario))
    ]


# --- OpenAI Chat Completions ------------------------------------------------------

_CHAT_FINISH_REASONS = {"end": "stop", "tool_use": "tool_calls", "max_tokens": "length"}


def _chat_generation(request: dict[str, Any], scenario: Scenario) -> Generation:
    limit = request.get("max_completion_tokens", request.get("max_tokens"))
    return generate(request, scenario, max_tokens=limit, choices=request.get("n"))


def _chat_usage(generation: Generation) -> dict[str, Any]:
    completion = generation.output_tokens * generation.choices
    return {
        "prompt_tokens": generation.input_tokens,
        "completion_tokens": completion,
        "total_tokens": generation.input_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": len(generation.reasoning) * generation.choices},
    }


def _chat_deltas(generation: Generation, choice: int) -> list[dict[str, Any]]:
    """One choice's deltas, without the final (finish_reason) one.

    The first announces the role (``content: ""``, or ``refusal: ""`` for a
    refusal); reasoning comes llama.cpp style as ``reasoning_content``; a
    tool call starts with its id, type, name and empty arguments, then
    argument fragments keyed by ``index`` only.
    """
    refusal = generation.refusal
    deltas: list[dict[str, Any]] = [
        {"role": "assistant", "content": None if refusal else "", "refusal": "" if refusal else None}
    ]
    deltas += [{"reasoning_content": text} for text in generation.reasoning]
    deltas += [{"refusal" if refusal else "content": text} for text in generation.texts]
    for call in generation.tool_calls:
        start = {"index": call.index, "id": generation.call_id(call, choice), "type": "function"}
        deltas.append({"tool_calls": [{**start, "function": {"name": call.name, "arguments": ""}}]})
        deltas += [{"tool_calls": [{"index": call.index, "function": {"arguments": f}}]} for f in call.fragments]
    return deltas


def _round_robin[T](lists: list[list[T]]) -> list[tuple[int, T]]:
    """(list index, item) taking one item of each list in turn, as OpenAI interleaves ``n`` choices."""
    longest = max(map(len, lists), default=0)
    return [(i, items[k]) for k in range(longest) for i, items in enumerate(lists) if k < len(items)]


def openai_chat_chunks(request: dict[str, Any], scenario: Scenario) -> list[bytes]:
    """``chat.completion.chunk`` events as OpenAI streams them.

    Each chunk carries one choice's delta; choices interleave. Then, with
    ``stream_options.include_usage`` (and ``usage`` on), a ``choices: []``
    chunk with the usage (every other chunk then has ``usage: null``), and
    ``data: [DONE]``. An error replaces the final chunks with
    ``data: {"error": {...}}`` and ends the body.
    """
    generation = _chat_generation(request, scenario)
    include_usage = scenario.usage and _dict(request.get("stream_options")).get("include_usage") is True
    head = {
        "id": f"chatcmpl-{generation.digest}",
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": generation.model,
        "service_tier": "default",
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }

    def chunk(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> bytes:
        payload = {**head, "choices": choices}
        if include_usage:
            payload["usage"] = usage
        return sse_event(None, payload, scenario)

    final: list[tuple[dict[str, Any], str | None]] = []
    if generation.stop != "error":
        final.append(({}, _CHAT_FINISH_REASONS[generation.stop]))
    per_choice = [
        [(delta, None) for delta in _chat_deltas(generation, choice)] + final for choice in range(generation.choices)
    ]
    items = [
        chunk([{"index": choice, "delta": delta, "logprobs": None, "finish_reason": reason}])
        for choice, (delta, reason) in _round_robin(per_choice)
    ]
    if generation.error is not None:
        return [*items, sse_event(None, {"error": _openai_error(generation.error, "server_error")}, scenario)]
    if include_usage:
        items.append(chunk([], _chat_usage(generation)))
    return with_end(items, sse_event(None, b"[DONE]", scenario), scenario)


def openai_chat_completion(request: dict[str, Any], scenario: Scenario) -> dict[str, Any]:
    """The ``chat.completion`` object of a request that does not stream (scenario without ``error``)."""
    generation = _chat_generation(request, scenario)

    def message(choice: int) -> dict[str, Any]:
        text = generation.text
        body: dict[str, Any] = {
            "role": "assistant",
            "content": None if generation.refusal or (generation.tool_calls and not text) else text,
            "refusal": text if generation.refusal else None,
            "annotations": [],
        }
        if generation.reasoning:
            body["reasoning_content"] = generation.reasoning_text
        if generation.tool_calls:
            body["tool_calls"] = [
                {
                    "id": generation.call_id(call, choice),
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in generation.tool_calls
            ]
        return body

    completion: dict[str, Any] = {
        "id": f"chatcmpl-{generation.digest}",
        "object": "chat.completion",
        "created": CREATED,
        "model": generation.model,
        "choices": [
            {
                "index": choice,
                "message": message(choice),
                "logprobs": None,
                "finish_reason": _CHAT_FINISH_REASONS[generation.stop],
            }
            for choice in range(generation.choices)
        ],
    }
    if scenario.usage:
        completion["usage"] = _chat_usage(generation)
    return completion | {"service_tier": "default", "system_fingerprint": SYSTEM_FINGERPRINT}


# --- OpenAI legacy Completions --------------------------------------------------------


def _completion_choices(request: dict[str, Any], generation: Generation) -> int:
    """Choices of a Completions answer: ``n`` per prompt of a batch (a list of strings)."""
    prompt = request.get("prompt")
    batch = len(prompt) if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt) else 1
    return generation.choices * batch


def _completion_logprobs(request: dict[str, Any], text: str, offset: int) -> dict[str, Any] | None:
    """The ``logprobs`` of one text piece when the request asks for them (one token per piece)."""
    if _request_int(request.get("logprobs")) is None:
        return None
    return {"tokens": [text], "token_logprobs": [-0.25], "top_logprobs": [{text: -0.25}], "text_offset": [offset]}


def openai_completions_chunks(request: dict[str, Any], scenario: Scenario) -> list[bytes]:
    """``text_completion`` chunks as OpenAI streams them for ``POST /v1/completions``.

    Each chunk carries one choice's text piece (choices interleave); the last one of a
    choice has the ``finish_reason``; then, with ``stream_options.include_usage``, a
    ``choices: []`` chunk with the usage, and ``data: [DONE]``. An error replaces the
    final chunks with ``data: {"error": {...}}``. Reasoning, refusals and tools have no
    place in this API and are not sent.
    """
    generation = _chat_generation(request, scenario)
    choices = _completion_choices(request, generation)
    include_usage = scenario.usage and _dict(request.get("stream_options")).get("include_usage") is True
    head = {
        "id": f"cmpl-{generation.digest}",
        "object": "text_completion",
        "created": CREATED,
        "model": generation.model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }
    finish = None if generation.stop == "error" else _CHAT_FINISH_REASONS.get(generation.stop, "stop")
    offsets = [sum(map(len, generation.texts[:k])) for k in range(len(generation.texts))]
    per_choice = [
        [(text, offset, None) for text, offset in zip(generation.texts, offsets)]
        + ([("", len(generation.text), finish)] if finish else [])
        for _ in range(choices)
    ]
    items = [
        sse_event(
            None,
            {
                **head,
                "choices": [
                    {
                        "text": text,
                        "index": choice,
                        "finish_reason": reason,
                        "logprobs": _completion_logprobs(request, text, offset),
                    }
                ],
            },
            scenario,
        )
        for choice, (text, offset, reason) in _round_robin(per_choice)
    ]
    if generation.error is not None:
        return [*items, sse_event(None, {"error": _openai_error(generation.error, "server_error")}, scenario)]
    if include_usage:
        items.append(
            sse_event(None, {**head, "choices": [], "usage": _completion_usage(generation, choices)}, scenario)
        )
    return with_end(items, sse_event(None, b"[DONE]", scenario), scenario)


def _completion_usage(generation: Generation, choices: int) -> dict[str, Any]:
    completion = len(generation.texts) * choices
    return {
        "prompt_tokens": generation.input_tokens,
        "completion_tokens": completion,
        "total_tokens": generation.input_tokens + completion,
    }


def openai_completion(request: dict[str, Any], scenario: Scenario) -> dict[str, Any]:
    """The ``text_completion`` object of a request that does not stream."""
    generation = _chat_generation(request, scenario)
    choices = _completion_choices(request, generation)
    logprobs = _completion_logprobs(request, generation.text, 0)
    completion: dict[str, Any] = {
        "id": f"cmpl-{generation.digest}",
        "object": "text_completion",
        "created": CREATED,
        "model": generation.model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": [
            {
                "text": generation.text,
                "index": choice,
                "logprobs": logprobs,
                "finish_reason": _CHAT_FINISH_REASONS.get(generation.stop, "stop"),
            }
            for choice in range(choices)
        ],
    }
    if scenario.usage:
        completion["usage"] = _completion_usage(generation, choices)
    return completion


# --- OpenAI Responses -----------------------------------------------------------------

_ITEM_PREFIXES = {"reasoning": "rs", "text": "msg", "tool_call": "fc"}

_RESPONSE_ECHO: dict[str, Any] = {
    "instructions": None,
    "max_output_tokens": None,
    "parallel_tool_calls": True,
    "previous_response_id": None,
    "store": True,
    "temperature": 1.0,
    "tool_choice": "auto",
    "tools": [],
    "top_p": 1.0,
    "metadata": {},
}
"""Request fields a response object repeats, with the defaults it shows when they are absent."""


def _responses_generation(request: dict[str, Any], scenario: Scenario) -> Generation:
    return generate(request, scenario, max_tokens=request.get("max_output_tokens"))


def _responses_content(generation: Generation, text: str) -> dict[str, Any]:
    if generation.refusal:
        return {"type": "refusal", "refusal": text}
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}


def _responses_item(generation: Generation, index: int, part: Part, status: str | None) -> dict[str, Any]:
    """Output item ``index``; ``status=None`` is the empty one of ``output_item.added``."""
    item_id = generation.item_id(_ITEM_PREFIXES[part.kind], index)
    if part.kind == "reasoning":
        summary = [{"type": "summary_text", "text": generation.reasoning_text}] if status else []
        return {"id": item_id, "type": "reasoning", "summary": summary}
    if part.kind == "text":
        content = [_responses_content(generation, generation.text)] if status else []
        status = status or "in_progress"
        return {"id": item_id, "type": "message", "status": status, "content": content, "role": "assistant"}
    assert part.call is not None
    return {
        "id": item_id,
        "type": "function_call",
        "status": status or "in_progress",
        "arguments": part.call.arguments if status else "",
        "call_id": generation.call_id(part.call),
        "name": part.call.name,
    }


def _responses_usage(generation: Generation) -> dict[str, Any]:
    return {
        "input_tokens": generation.input_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": generation.output_tokens,
        "output_tokens_details": {"reasoning_tokens": len(generation.reasoning)},
        "total_tokens": generation.input_tokens + generation.output_tokens,
    }


def _openai_response(
    request: dict[str, Any], scenario: Scenario, generation: Generation, status: str, output: list[dict[str, Any]]
) -> dict[str, Any]:
    """The ``response`` object in a given lifecycle ``status`` with the ``output`` so far."""
    final = status in {"completed", "incomplete"}
    return {
        "id": f"resp_{generation.digest}",
        "object": "response",
        "created_at": CREATED,
        "status": status,
        "background": False,
        "completed_at": CREATED + 1 if status == "completed" else None,
        "error": {"code": generation.error, "message": error_message(generation.error)}
        if status == "failed" and generation.error is not None
        else None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "model": generation.model,
        "output": output,
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "top_logprobs": 0,
        "truncation": "disabled",
        "usage": _responses_usage(generation) if final and scenario.usage else None,
        "user": None,
        **{key: request.get(key, default) for key, default in _RESPONSE_ECHO.items()},
    }


def _terminal_status(generation: Generation) -> Literal["completed", "incomplete", "failed"]:
    if generation.stop == "error":
        return "failed"
    return "incomplete" if generation.stop == "max_tokens" else "completed"


def _responses_item_events(generation: Generation, index: int, part: Part, failed: bool) -> list[Event]:
    """Output item ``index``'s events between ``output_item.added`` and ``output_item.done``.

    A message's text lives in content part 0 (``output_text``, or
    ``refusal``), reasoning in summary part 0. A failed message stops after
    its deltas; a cut function call has no ``function_call_arguments.done``.
    """
    at = {"item_id": generation.item_id(_ITEM_PREFIXES[part.kind], index), "output_index": index}
    if part.kind == "reasoning":
        summary = {**at, "summary_index": 0}
        text = generation.reasoning_text
        return [
            ("response.reasoning_summary_part.added", {**summary, "part": {"type": "summary_text", "text": ""}}),
            *[("response.reasoning_summary_text.delta", {**summary, "delta": delta}) for delta in generation.reasoning],
            ("response.reasoning_summary_text.done", {**summary, "text": text}),
            ("response.reasoning_summary_part.done", {**summary, "part": {"type": "summary_text", "text": text}}),
        ]
    if part.kind == "text":
        content = {**at, "content_index": 0}
        extra: dict[str, Any] = {} if generation.refusal else {"logprobs": []}
        kind = "refusal" if generation.refusal else "output_text"
        events: list[Event] = [("response.content_part.added", {**content, "part": _responses_content(generation, "")})]
        events += [(f"response.{kind}.delta", {**content, "delta": delta, **extra}) for delta in generation.texts]
        if failed:
            return events
        done = {**content, kind.removeprefix("output_"): generation.text, **extra}
        part_done = {**content, "part": _responses_content(generation, generation.text)}
        return [*events, (f"response.{kind}.done", done), ("response.content_part.done", part_done)]
    assert part.call is not None
    events = [("response.function_call_arguments.delta", {**at, "delta": f}) for f in part.call.fragments]
    if part.call.complete:
        done = {**at, "name": part.call.name, "arguments": part.call.arguments}
        events.append(("response.function_call_arguments.done", done))
    return events


def _responses_event_list(request: dict[str, Any], scenario: Scenario) -> list[Event]:
    """Every Responses stream event, the terminal one last.

    created, in_progress, then each item: added (empty), its events, done
    (complete). An error stops inside the message and ends with
    ``response.failed``; a token limit marks the cut item ``incomplete`` and
    ends with ``response.incomplete``.
    """
    generation = _responses_generation(request, scenario)
    status = _terminal_status(generation)
    lifecycle = _openai_response(request, scenario, generation, "in_progress", [])
    events: list[Event] = [("response.created", {"response": lifecycle})]
    events.append(("response.in_progress", {"response": lifecycle}))
    output: list[dict[str, Any]] = []
    parts = output_parts(generation)
    for index, part in enumerate(parts):
        added = _responses_item(generation, index, part, None)
        events.append(("response.output_item.added", {"output_index": index, "item": added}))
        events += _responses_item_events(generation, index, part, failed=status == "failed")
        last = index == len(parts) - 1  # the item a failure or the token limit cuts
        item = _responses_item(generation, index, part, "incomplete" if last and status != "completed" else "completed")
        output.append(item)
        if not (last and status == "failed"):
            events.append(("response.output_item.done", {"output_index": index, "item": item}))
    events.append((f"response.{status}", {"response": _openai_response(request, scenario, generation, status, output)}))
    return events


def openai_responses_events(request: dict[str, Any], scenario: Scenario) -> list[bytes]:
    """Responses API stream: ``event:`` is the ``type``, ``sequence_number`` counts from 0."""
    events = _responses_event_list(request, scenario)
    if events[-1][0] != "response.failed":
        events = with_end(events[:-1], events[-1], scenario)
    return [
        sse_event(event_type, {"type": event_type, "sequence_number": seq, **fields}, scenario)
        for (event_type, fields), seq in zip(events, seq_numbers(len(events), scenario))
    ]


def openai_response(request: dict[str, Any], scenario: Scenario) -> dict[str, Any]:
    """The response object of a request that does not stream: the stream's final one."""
    response: dict[str, Any] = _responses_event_list(request, scenario)[-1][1]["response"]
    return response


# --- Anthropic Messages -----------------------------------------------------------------

_ANTHROPIC_STOP_REASONS = {"end": "end_turn", "tool_use": "tool_use", "max_tokens": "max_tokens"}


def _anthropic_generation(request: dict[str, Any], scenario: Scenario) -> Generation:
    return generate(request, scenario, max_tokens=request.get("max_tokens"))


def _anthropic_usage(generation: Generation, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": generation.input_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": output_tokens,
    }


def _anthropic_stop_reason(generation: Generation) -> str:
    if generation.refusal and generation.stop == "end":
        return "refusal"
    return _ANTHROPIC_STOP_REASONS[generation.stop]


def _anthropic_message(
    generation: Generation, content: list[dict[str, Any]], stop_reason: str | None, output_tokens: int
) -> dict[str, Any]:
    return {
        "id": f"msg_{generation.digest}",
        "type": "message",
        "role": "assistant",
        "model": generation.model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": _anthropic_usage(generation, output_tokens) | {"service_tier": "standard"},
    }


def _anthropic_block(generation: Generation, part: Part) -> dict[str, Any]:
    """A content block as ``content_block_start`` opens it (empty)."""
    if part.kind == "reasoning":
        return {"type": "thinking", "thinking": "", "signature": ""}
    if part.kind == "text":
        return {"type": "text", "text": ""}
    assert part.call is not None
    tool_id = generation.call_id(part.call, prefix="toolu")
    return {"type": "tool_use", "id": tool_id, "name": part.call.name, "input": {}}


def anthropic_events(request: dict[str, Any], scenario: Scenario) -> list[bytes]:
    """Messages stream: ``event: X`` with ``{"type": X, …}`` (see :func:`anthropic_event_objects`)."""
    return [sse_event(event["type"], event, scenario) for event in anthropic_event_objects(request, scenario)]


def anthropic_event_objects(request: dict[str, Any], scenario: Scenario) -> list[dict[str, Any]]:
    """The Messages stream's events as JSON objects ``{"type": X, …}``, before framing
    (Bedrock carries them in event-stream chunks, :mod:`mockllm.bedrock`).

    message_start (input tokens, a placeholder output count), one block per
    part (thinking with thinking_delta + signature_delta, text, tool_use
    with input_json_delta fragments after a first ``""``), a ping after the
    first block start, message_delta (stop reason, cumulative output
    tokens), message_stop. An error comes as ``event: error`` right after
    the partial text, and the stream ends there; a token limit leaves the
    cut tool_use block unstopped.
    """
    generation = _anthropic_generation(request, scenario)
    events: list[Event] = [("message_start", {"message": _anthropic_message(generation, [], None, 1)})]
    for index, part in enumerate(output_parts(generation)):
        events.append(("content_block_start", {"index": index, "content_block": _anthropic_block(generation, part)}))
        if index == 0:
            events.append(("ping", {}))
        deltas: list[dict[str, Any]]
        if part.kind == "reasoning":
            deltas = [{"type": "thinking_delta", "thinking": text} for text in generation.reasoning]
            deltas.append({"type": "signature_delta", "signature": SIGNATURE})
        elif part.kind == "text":
            deltas = [{"type": "text_delta", "text": text} for text in generation.texts]
        else:
            assert part.call is not None
            deltas = [{"type": "input_json_delta", "partial_json": f} for f in ["", *part.call.fragments]]
        events += [("content_block_delta", {"index": index, "delta": delta}) for delta in deltas]
        if generation.error is not None and part.kind == "text":
            events.append(("error", _anthropic_error(generation.error)))
            break
        if part.call is None or part.call.complete:
            events.append(("content_block_stop", {"index": index}))
    else:
        usage = _anthropic_usage(generation, generation.output_tokens)
        delta = {"stop_reason": _anthropic_stop_reason(generation), "stop_sequence": None}
        events.append(("message_delta", {"delta": delta, "usage": usage}))
        events = with_end(events, ("message_stop", {}), scenario)
    return [{"type": event_type, **fields} for event_type, fields in events]


def anthropic_message(request: dict[str, Any], scenario: Scenario) -> dict[str, Any]:
    """The message object of a request that does not stream (scenario without ``error``).

    A tool call cut by the token limit has no valid ``input`` and is left out.
    """
    generation = _anthropic_generation(request, scenario)
    content: list[dict[str, Any]] = []
    for part in output_parts(generation):
        if part.kind == "reasoning":
            content.append({"type": "thinking", "thinking": generation.reasoning_text, "signature": SIGNATURE})
        elif part.kind == "text":
            content += ({"type": "text", "text": f"tök{i} "} for i in range(scenario.blocks))
            content.append({"type": "text", "text": generation.text})
        elif part.call is not None and part.call.complete:
            content.append(_anthropic_block(generation, part) | {"input": orjson.loads(part.call.arguments)})
    return _anthropic_message(generation, content, _anthropic_stop_reason(generation), generation.output_tokens)


# --- Google Gemini ------------------------------------------------------------------------

_GEMINI_FINISH_REASONS = {"end": "STOP", "tool_use": "STOP", "max_tokens": "MAX_TOKENS"}
_GOOGLE_HTTP_STATUS = {error.google_status: status for status, error in reversed(_HTTP_ERRORS.items())}
"""HTTP status of a Google error status (``UNAVAILABLE`` → 503), for in-stream errors."""


def _gemini_generation(request: dict[str, Any], scenario: Scenario) -> Generation:
    config = _dict(request.get("generationConfig"))
    return generate(request, scenario, max_tokens=config.get("maxOutputTokens"), choices=config.get("candidateCount"))


def _gemini_response(
    generation: Generation,
    parts: list[dict[str, Any]],
    finish_reason: str | None,
    tokens: tuple[int, int],
    scenario: Scenario,
) -> dict[str, Any]:
    """A ``GenerateContentResponse``: every candidate gets ``parts``; ``tokens`` = (thoughts, candidates) so far."""
    candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}}
    if finish_reason is not None:
        candidate["finishReason"] = finish_reason
    response: dict[str, Any] = {"candidates": [{**candidate, "index": i} for i in range(generation.choices)]}
    if scenario.usage:
        thoughts, candidates = tokens
        prompt = generation.input_tokens
        usage = {
            "promptTokenCount": prompt,
            "candidatesTokenCount": candidates,
            "totalTokenCount": prompt + candidates + thoughts,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt}],
        }
        response["usageMetadata"] = usage | ({"thoughtsTokenCount": thoughts} if generation.reasoning else {})
    return response | {"modelVersion": generation.model, "responseId": generation.digest}


def _gemini_final_parts(generation: Generation) -> list[dict[str, Any]]:
    """Complete function calls (args as an object, never streamed), else an empty text part."""
    calls: list[dict[str, Any]] = [
        {"functionCall": {"name": call.name, "args": orjson.loads(call.arguments)}}
        for call in generation.tool_calls
        if call.complete
    ]
    return calls or [{"text": ""}]


def _gemini_chunks(request: dict[str, Any], scenario: Scenario) -> list[dict[str, Any]]:
    """Stream chunks: one per thought part, one per text part, then the final one.

    Usage is cumulative on every chunk. The final chunk carries the function
    calls and ``finishReason``; an error replaces it with Google's error
    object, which ends the stream.
    """
    generation = _gemini_generation(request, scenario)
    n = generation.choices
    steps = [([{"text": text, "thought": True}], (n, 0)) for text in generation.reasoning]
    steps += [([{"text": text}], (0, n)) for text in generation.texts]
    chunks: list[dict[str, Any]] = []
    thoughts = candidates = 0
    for parts, (more_thoughts, more_candidates) in steps:
        thoughts, candidates = thoughts + more_thoughts, candidates + more_candidates
        chunks.append(_gemini_response(generation, parts, None, (thoughts, candidates), scenario))
    if generation.error is not None:
        status = _GOOGLE_HTTP_STATUS.get(generation.error, 500)
        return [*chunks, _google_error(status, generation.error)]
    candidates += n * sum(len(call.fragments) for call in generation.tool_calls)
    final = _gemini_response(
        generation,
        _gemini_final_parts(generation),
        _GEMINI_FINISH_REASONS[generation.stop],
        (thoughts, candidates),
        scenario,
    )
    return with_end(chunks, final, scenario)


def gemini_sse_events(request: dict[str, Any], scenario: Scenario) -> list[bytes]:
    """``streamGenerateContent?alt=sse``: ``data:`` events with Google's CRLF framing."""
    return [sse_event(None, chunk, scenario, crlf=True) for chunk in _gemini_chunks(request, scenario)]


def gemini_json_stream(request: dict[str, Any], scenario: Scenario) -> list[bytes]:
    """``streamGenerateContent`` without ``alt=sse``: one JSON array, written an element at a time."""
    elements = [orjson.dumps(chunk) for chunk in _gemini_chunks(request, scenario)]
    items = [(b"[" if i == 0 else b"\n,") + element for i, element in enumerate(elements)]
    return [*items[:-1], items[-1] + b"]"] if items else [b"[]"]


def gemini_response(request: dict[str, Any], scenario: Scenario) -> dict[str, Any]:
    """``generateContent``: the whole answer in one response (scenario without ``error``)."""
    generation = _gemini_generation(request, scenario)
    parts: list[dict[str, Any]] = []
    if generation.reasoning:
        parts.append({"text": generation.reasoning_text, "thought": True})
    if generation.texts or not generation.tool_calls:
        parts.append({"text": generation.text})
    parts += [part for part in _gemini_final_parts(generation) if "functionCall" in part]
    n = generation.choices
    tokens = (n * len(generation.reasoning), n * (generation.output_tokens - len(generation.reasoning)))
    return _gemini_response(generation, parts, _GEMINI_FINISH_REASONS[generation.stop], tokens, scenario)


# --- LMSP 1.0 -------------------------------------------------------------------------------


def _lmsp_generation(request: dict[str, Any], scenario: Scenario) -> Generation:
    return generate(request, scenario, max_tokens=request.get("max_output_tokens"))


def _lmsp_item(generation: Generation, index: int, part: Part, complete: bool) -> dict[str, Any]:
    """Output item ``index`` per section 6.2; ``complete=False`` is the empty one of ``output_item.added``."""
    item_id = generation.item_id(_ITEM_PREFIXES[part.kind], index)
    if part.kind == "reasoning":
        summary = [{"type": "summary_text", "text": generation.reasoning_text}] if complete else []
        return {"id": item_id, "type": "reasoning", "summary": summary}
    if part.kind == "text":
        content = [{"type": "output_text", "text": generation.text}] if complete else []
        return {"id": item_id, "type": "message", "role": "assistant", "content": content}
    assert part.call is not None
    arguments = part.call.arguments if complete else ""
    call_id = generation.call_id(part.call)
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": part.call.name, "arguments": arguments}


def _lmsp_usage(generation: Generation) -> dict[str, int]:
    total = generation.input_tokens + generation.output_tokens
    return {"input_tokens": generation.input_tokens, "output_tokens": generation.output_tokens, "total_tokens": total}


def _lmsp_outcome(generation: Generation, scenario: Scenario) -> dict[str, Any]:
    """The fields a final event and the response object share: status, usage, error, incomplete_details."""
    status = _terminal_status(generation)
    fields: dict[str, Any] = {"status": status}
    if status == "failed":
        assert generation.error is not None
        return fields | {"error": problem(500, generation.error, error_message(generation.error))}
    if status == "incomplete":
        fields["incomplete_details"] = {"reason": "max_output_tokens"}
    return fields | ({"usage": _lmsp_usage(generation)} if scenario.usage else {})


def lmsp_response(request: dict[str, Any], scenario: Scenario) -> dict[str, Any]:
    """The response object (section 6.2), also what a stream leaves stored: a failed one keeps its partial output."""
    generation = _lmsp_generation(request, scenario)
    output = [_lmsp_item(generation, i, part, True) for i, part in enumerate(output_parts(generation))]
    outcome = _lmsp_outcome(generation, scenario)
    return {
        "id": f"resp_{generation.digest}",
        "object": "response",
        "created_at": CREATED,
        "status": outcome["status"],
        "model": generation.model,
        "output": output,
        "usage": outcome.get("usage"),
        "error": outcome.get("error"),
        "incomplete_details": outcome.get("incomplete_details"),
    }


def lmsp_numbered_events(request: dict[str, Any], scenario: Scenario) -> list[tuple[int, bytes]]:
    """(event id, framed event) of an LMSP stream (section 6.3); ids count from 1.

    Every ``data`` carries the top-level ``response_id``. Items run
    ``output_item.added`` (empty) → text deltas → ``output_item.done``
    (complete; function calls arrive whole here). The final event is
    ``response.completed``, ``response.incomplete`` (token limit) or
    ``response.failed`` (``error``, right after the partial text).
    """
    generation = _lmsp_generation(request, scenario)
    response_id = {"response_id": f"resp_{generation.digest}"}
    events: list[Event] = [("response.created", {"status": "in_progress"})]
    for index, part in enumerate(output_parts(generation)):
        added = _lmsp_item(generation, index, part, False)
        events.append(("response.output_item.added", {"output_index": index, "item": added}))
        if part.kind == "text":
            item_id = generation.item_id(_ITEM_PREFIXES[part.kind], index)
            events += [("response.output_text.delta", {"item_id": item_id, "delta": text}) for text in generation.texts]
            if generation.error is not None:
                break
        item = _lmsp_item(generation, index, part, True)
        events.append(("response.output_item.done", {"output_index": index, "item": item}))
    outcome = _lmsp_outcome(generation, scenario)
    final = (f"response.{outcome['status']}", outcome)
    events = [*events, final] if generation.error is not None else with_end(events, final, scenario)
    ids = [seq + 1 for seq in seq_numbers(len(events), scenario)]
    return [
        (event_id, sse_event(event_type, {**response_id, **fields}, scenario, event_id=event_id))
        for (event_type, fields), event_id in zip(events, ids)
    ]


def lmsp_events(request: dict[str, Any], scenario: Scenario) -> list[bytes]:
    """``POST /lmsp/v1/responses`` with ``stream: true``."""
    return [framed for _, framed in lmsp_numbered_events(request, scenario)]


def lmsp_task_request(task_id: str) -> dict[str, Any]:
    """The request a task's events are generated from: only its id, so each task has its own response id."""
    return {"task_id": task_id}


# --- registry ---------------------------------------------------------------------------------

Builder = Callable[[dict[str, Any], Scenario], list[bytes]]


@dataclass(frozen=True)
class Dialect:
    """One inference API as the mock answers it."""

    name: str
    stream: Builder
    """The streamed body: one framed item per event (or JSON array element)."""
    body: Callable[[dict[str, Any], Scenario], dict[str, Any]] | None
    """The JSON body of a request that does not stream; None: the API always streams."""
    error_body: Callable[[Scenario, int], bytes]
    """The JSON body of an HTTP error status."""
    stream_type: str = "text/event-stream"
    error_type: str = "application/json"
    stream_default: bool = False
    """Whether a request whose body says nothing of ``stream`` streams (Ollama: yes)."""


_GEMINI_JSON_STREAM_TYPE = "application/json; charset=UTF-8"

DIALECTS: dict[str, Dialect] = {
    dialect.name: dialect
    for dialect in (
        Dialect("llm-stream", llm_stream_events, None, llm_stream_error_body),
        Dialect("openai-chat", openai_chat_chunks, openai_chat_completion, openai_error_body),
        Dialect("openai-completions", openai_completions_chunks, openai_completion, openai_error_body),
        Dialect("openai-responses", openai_responses_events, openai_response, openai_error_body),
        Dialect("anthropic", anthropic_events, anthropic_message, anthropic_error_body),
        Dialect("gemini", gemini_sse_events, gemini_response, gemini_error_body),
        Dialect("gemini-json", gemini_json_stream, gemini_response, gemini_error_body, _GEMINI_JSON_STREAM_TYPE),
        Dialect("lmsp", lmsp_events, lmsp_response, lmsp_error_body, error_type="application/problem+json"),
    )
}
