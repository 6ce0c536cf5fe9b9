"""Exact response bytes of the mock, as pure functions (no I/O, no clock).

Everything the server writes is computed here first, so a test can build the
same bytes and compare them with what a client (or the proxy under test)
received. Determinism is therefore a feature: the ``created`` timestamp is a
constant, ids are fixed and the default text is ``tök0 tök1 …`` (the ``ö``
makes every stream carry multi-byte UTF-8).

A dialect is one function ``(request, scenario) -> list[bytes]`` returning one
already-framed item per SSE event; :data:`DIALECTS` maps names to them. The
scenario handling every dialect needs (delta texts, SSE framing variants,
sequence numbers with gaps, token counts) lives in the helpers below, and the
transport shaping (truncation, gzip) in :func:`plan_body`, which works on any
list of items, including the ``raw`` chunks.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from .scenario import Scenario

CREATED = 1749292800
"""Fixed ``created`` timestamp (the draft's example value) to keep output reproducible."""
TOOL_CALL_ID = "call_1"
TOOL_ARGUMENTS = '{"city":"Vienna"}'
DEFAULT_MODEL = "mock-model"
"""Served when neither the scenario nor the request names a model."""

_STATUS_ERROR_CODES = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    413: "context_length_exceeded",
    429: "rate_limited",
    500: "internal_error",
    503: "overloaded",
    529: "overloaded",
}


# --- scenario handling shared by all dialects -------------------------------


def delta_texts(scenario: Scenario) -> list[str]:
    """The text of each content delta; concatenated they form the answer."""
    count = scenario.events
    if scenario.text is not None:
        text = scenario.text
        bounds = [len(text) * i // count for i in range(count + 1)] if count else []
        return [text[start:end] for start, end in zip(bounds, bounds[1:])]
    if scenario.size is not None:
        return [_exact_utf8(f"tök{i} ", scenario.size) for i in range(count)]
    return [f"tök{i}" if i == 0 else f" tök{i}" for i in range(count)]


def _exact_utf8(unit: str, size: int) -> str:
    """``unit`` repeated and cut to exactly ``size`` UTF-8 bytes.

    A multi-byte character cut in half is dropped and replaced by ``.``
    padding so the result is valid text of exactly the requested length.
    """
    encoded = unit.encode()
    repeated = (encoded * (size // len(encoded) + 1))[:size].decode(errors="ignore")
    return repeated + "." * (size - len(repeated.encode()))


def served_model(request: dict[str, Any], scenario: Scenario) -> str:
    """The model the mock claims to serve: scenario, then request, then a default."""
    if scenario.model:
        return scenario.model
    model = request.get("model")
    return model if isinstance(model, str) and model else DEFAULT_MODEL


def prompt_tokens(request: Any) -> int:
    """A deterministic stand-in for input tokens: words in ``content``/``text`` strings.

    Walking every ``content`` and ``text`` key, whatever the nesting, makes
    the count work for all dialects' request shapes without knowing them.
    """
    if isinstance(request, list):
        return sum(prompt_tokens(item) for item in request)
    if not isinstance(request, dict):
        return 0
    total = 0
    for key, value in request.items():
        if key in {"content", "text"} and isinstance(value, str):
            total += len(value.split())
        else:
            total += prompt_tokens(value)
    return total


def error_message(code: str) -> str:
    return f"mock error: {code}"


def seq_numbers(count: int, scenario: Scenario) -> list[int]:
    """Sequence numbers 0..count-1, skipping one after ``seq_gap`` events."""
    gap = scenario.seq_gap
    return [i if gap is None or i < gap else i + 1 for i in range(count)]


def sse_event(event_type: str | None, payload: dict[str, Any], scenario: Scenario) -> bytes:
    """Frame one SSE event (``event:`` line optional, one-line JSON ``data:``).

    ``crlf`` switches line ends; ``comment`` prepends a separate comment-only
    block, which parsers must skip without dispatching an event.
    """
    newline = b"\r\n" if scenario.crlf else b"\n"
    lines = [b"event: " + event_type.encode()] if event_type is not None else []
    lines.append(b"data: " + orjson.dumps(payload))
    framed = newline.join(lines) + newline + newline
    if scenario.comment:
        framed = b": keep-alive" + newline + newline + framed
    return framed


def raw_chunks(scenario: Scenario) -> list[bytes]:
    """The ``raw`` body split into ``chunk``-sized writes (one write if unset)."""
    data = scenario.raw or b""
    step = scenario.chunk or len(data) or 1
    return [data[i : i + step] for i in range(0, len(data), step)]


def error_body(scenario: Scenario) -> bytes:
    """JSON problem body for ``status >= 400``."""
    code = scenario.error or _STATUS_ERROR_CODES.get(scenario.status, f"http_{scenario.status}")
    return orjson.dumps({"error": {"code": code, "message": error_message(code)}})


@dataclass(frozen=True)
class BodyPlan:
    """The body as the server must write it."""

    writes: list[bytes]
    """One item per write; the server paces between them."""
    complete: bool
    """False: abort the transport after the writes instead of ending the body."""


def plan_body(items: list[bytes], scenario: Scenario) -> BodyPlan:
    """Apply truncation and gzip to a list of events (or raw chunks).

    With gzip every item is compressed and ``Z_SYNC_FLUSH``-ed on its own, so
    each write is decodable as soon as it arrives and the stream keeps
    streaming; the gzip trailer is appended to the last write of a complete
    body and is missing from a truncated one, like a real upstream dying.
    """
    complete = scenario.truncate_after is None
    if scenario.truncate_after is not None:
        items = items[: scenario.truncate_after]
    if not scenario.gzip:
        return BodyPlan(list(items), complete)
    compressor = zlib.compressobj(wbits=31)  # 31: gzip container
    writes = [compressor.compress(item) + compressor.flush(zlib.Z_SYNC_FLUSH) for item in items]
    if complete:
        trailer = compressor.flush()
        if writes:
            writes[-1] += trailer
        else:
            writes.append(trailer)
    return BodyPlan(writes, complete)


# --- dialects ---------------------------------------------------------------


def llm_stream_events(request: dict[str, Any], scenario: Scenario) -> list[bytes]:
    """draft-llm-stream-00 (section 5): stream.start … stream.end.

    Order: stream.start, deltas, then either an error event (after
    ``error_after`` deltas) or [tool.call], content.stop, [usage]; finally
    stream.end unless ``no_end``. All content shares block index 0; a tool
    call stops that block with ``tool_use``. ``request_id`` is echoed from
    ``metadata.request_id`` when present and omitted otherwise.
    """
    metadata = request.get("metadata")
    request_id = metadata.get("request_id") if isinstance(metadata, dict) else None
    echo = {"request_id": request_id} if isinstance(request_id, str) else {}

    texts = delta_texts(scenario)
    if scenario.error is not None:
        texts = texts[: scenario.error_after]
    events: list[tuple[str, dict[str, Any]]] = [
        ("stream.start", {**echo, "model": served_model(request, scenario), "created": CREATED})
    ]
    events += [
        ("content.delta", {"index": 0, "role": "assistant", "delta": {"text": text}})
        for text in texts
    ]
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
            events.append(
                ("usage", {"input_tokens": prompt_tokens(request), "output_tokens": len(texts)})
            )
    if not scenario.no_end:
        events.append(("stream.end", echo))

    return [
        sse_event(event_type, {"v": "1.0", "seq": seq, "type": event_type, **fields}, scenario)
        for (event_type, fields), seq in zip(events, seq_numbers(len(events), scenario))
    ]


Dialect = Callable[[dict[str, Any], Scenario], list[bytes]]

DIALECTS: dict[str, Dialect] = {"llm-stream": llm_stream_events}
