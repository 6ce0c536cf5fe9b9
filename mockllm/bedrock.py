"""The mock's AWS Bedrock Runtime and Anthropic-on-Vertex routes (pure functions, like
:mod:`mockllm.streams`).

Bedrock, on any path prefix (``POST …/model/{modelId}/{operation}``, the model id
percent-encoded as boto3 sends it):

* ``converse-stream``: an AWS event stream (``application/vnd.amazon.eventstream``) of
  ConverseStream events, ``messageStart`` … ``messageStop``, ``metadata`` (usage); with
  ``reasoning`` a reasoning block (text, then a signature), with ``tool`` toolUse blocks
  whose input arrives in fragments, with ``error`` an exception message named by the
  code (``throttlingException``, say) after ``error_after`` text deltas.
* ``converse``: the same answer as one JSON object.
* ``invoke-with-response-stream``: ``chunk`` events whose ``bytes`` are the base64 of
  the model's own events: Anthropic Messages (:func:`mockllm.streams.anthropic_event_objects`)
  when the body has ``anthropic_version``, else Meta Llama's ``generation`` chunks; the
  last chunk carries ``amazon-bedrock-invocationMetrics``. An Anthropic ``error`` event
  becomes an exception message, as Bedrock delivers it.
* ``invoke``: the model's own JSON answer (an Anthropic message, or Llama's).

Every event payload carries a padding field ``p`` of varying length, as Bedrock's do;
messages carry real lengths and CRCs (encoded here, independently of the proxy's
writer, so each checks the other). Errors (``status``) are ``{"message": …}`` with the
error type in ``__type``, as botocore reads it.

Vertex: ``…/publishers/anthropic/models/{model}:streamRawPredict`` and ``:rawPredict``
are the Anthropic routes unchanged, the model named by the path.
"""

from __future__ import annotations

import base64
import re
import struct
import zlib
from typing import Any
from urllib.parse import unquote

import orjson

from .scenario import Scenario
from .streams import (
    DIALECTS,
    SIGNATURE,
    Dialect,
    Generation,
    anthropic_event_objects,
    anthropic_message,
    error_message,
    generate,
    http_error,
    output_parts,
    with_end,
)

EVENTSTREAM = "application/vnd.amazon.eventstream"
_PATH = re.compile(r"/model/([^/]+)/(converse-stream|converse|invoke-with-response-stream|invoke)$")
_VERTEX_PATH = re.compile(r"/publishers/anthropic/models/([^/:]+):(streamRawPredict|rawPredict)$")
_PAD = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
_STOP_REASONS = {"end": "end_turn", "tool_use": "tool_use", "max_tokens": "max_tokens"}
_ERROR_TYPES = {400: "ValidationException", 403: "AccessDeniedException", 404: "ResourceNotFoundException"}
_ERROR_TYPES |= {429: "ThrottlingException", 500: "InternalServerException", 503: "ServiceUnavailableException"}


# -- the wire format -----------------------------------------------------------------------------


def message(headers: list[tuple[str, str]], payload: bytes) -> bytes:
    """One event-stream message with string headers (type 7), lengths and both CRCs."""
    head = b""
    for name, value in headers:
        key, text = name.encode(), value.encode()
        head += bytes((len(key),)) + key + b"\x07" + struct.pack(">H", len(text)) + text
    prelude = struct.pack(">II", 16 + len(head) + len(payload), len(head))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    body = prelude + head + payload
    return body + struct.pack(">I", zlib.crc32(body))


def event(event_type: str, fields: dict[str, Any], number: int) -> bytes:
    """An ``event`` message, its JSON padded with ``p`` (a length that varies with ``number``)."""
    payload = orjson.dumps(fields | {"p": _PAD[: 3 + (number * 17) % 50]})
    headers = [(":event-type", event_type), (":content-type", "application/json"), (":message-type", "event")]
    return message(headers, payload)


def exception(exception_type: str, text: str) -> bytes:
    headers = [
        (":exception-type", exception_type),
        (":content-type", "application/json"),
        (":message-type", "exception"),
    ]
    return message(headers, orjson.dumps({"message": text}))


def _numbered(events: list[tuple[str, dict[str, Any]]]) -> list[bytes]:
    return [event(kind, fields, i) for i, (kind, fields) in enumerate(events)]


# -- Converse ------------------------------------------------------------------------------------


def _generation(request: dict[str, Any], scenario: Scenario) -> Generation:
    config = request.get("inferenceConfig")
    return generate(request, scenario, max_tokens=config.get("maxTokens") if isinstance(config, dict) else None)


def _usage(generation: Generation) -> dict[str, int]:
    out = generation.output_tokens
    return {"inputTokens": generation.input_tokens, "outputTokens": out, "totalTokens": generation.input_tokens + out}


def _tool_id(generation: Generation, index: int) -> str:
    return f"tooluse_{generation.digest}{index:02d}"


def converse_stream(request: dict[str, Any], scenario: Scenario) -> list[bytes]:
    """ConverseStream: one event message per event (see the module doc)."""
    generation = _generation(request, scenario)
    events: list[tuple[str, dict[str, Any]]] = [("messageStart", {"role": "assistant"})]
    for index, part in enumerate(output_parts(generation)):
        at: dict[str, Any] = {"contentBlockIndex": index}
        deltas: list[dict[str, Any]]
        if part.kind == "reasoning":
            deltas = [{"reasoningContent": {"text": t}} for t in generation.reasoning]
            deltas.append({"reasoningContent": {"signature": SIGNATURE}})
        elif part.kind == "text":
            deltas = [{"text": t} for t in generation.texts]
        else:
            assert part.call is not None
            start = {"toolUse": {"toolUseId": _tool_id(generation, part.call.index), "name": part.call.name}}
            events.append(("contentBlockStart", at | {"start": start}))
            deltas = [{"toolUse": {"input": f}} for f in part.call.fragments]
        events += [("contentBlockDelta", at | {"delta": d}) for d in deltas]
        if generation.error is not None and part.kind == "text":
            items = _numbered(events)
            return [*items, exception(generation.error, error_message(generation.error))]
        if part.call is None or part.call.complete:
            events.append(("contentBlockStop", at))
    events.append(("messageStop", {"stopReason": _STOP_REASONS[generation.stop]}))
    end = ("metadata", {"usage": _usage(generation), "metrics": {"latencyMs": 42}})
    return _numbered(with_end(events, end, scenario) if scenario.usage else events)


def converse(request: dict[str, Any], scenario: Scenario) -> dict[str, Any]:
    """A Converse answer: the same content as one ``output.message``."""
    generation = _generation(request, scenario)
    content: list[dict[str, Any]] = []
    for part in output_parts(generation):
        if part.kind == "reasoning":
            reasoning = {"reasoningText": {"text": generation.reasoning_text, "signature": SIGNATURE}}
            content.append({"reasoningContent": reasoning})
        elif part.kind == "text":
            content.append({"text": generation.text})
        elif part.call is not None and part.call.complete:
            tool = {"toolUseId": _tool_id(generation, part.call.index), "name": part.call.name}
            content.append({"toolUse": tool | {"input": orjson.loads(part.call.arguments)}})
    return {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": _STOP_REASONS[generation.stop],
        "usage": _usage(generation),
        "metrics": {"latencyMs": 42},
    }


# -- InvokeModel ---------------------------------------------------------------------------------


def _anthropic(request: dict[str, Any]) -> bool:
    return isinstance(request.get("anthropic_version"), str)


def _metrics(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {
        "inputTokenCount": input_tokens,
        "outputTokenCount": output_tokens,
        "invocationLatency": 42,
        "firstByteLatency": 7,
    }


def _chunk(native: dict[str, Any], number: int) -> bytes:
    return event("chunk", {"bytes": base64.b64encode(orjson.dumps(native)).decode()}, number)


def invoke_stream(request: dict[str, Any], scenario: Scenario) -> list[bytes]:
    """InvokeModelWithResponseStream: the model's events in ``chunk`` messages."""
    if not _anthropic(request):
        return [_chunk(c, i) for i, c in enumerate(_llama_chunks(request, scenario))]
    items: list[bytes] = []
    usage: dict[str, int] = {}
    for number, native in enumerate(anthropic_event_objects(request, scenario)):
        if native["type"] == "error":
            items.append(exception(native["error"]["type"], native["error"]["message"]))
            break
        if native["type"] in ("message_start", "message_delta"):
            usage |= native.get("message", native)["usage"]
        if native["type"] == "message_stop":
            metrics = _metrics(usage["input_tokens"], usage["output_tokens"])
            native = native | {"amazon-bedrock-invocationMetrics": metrics}
        items.append(_chunk(native, number))
    return items


def _llama_chunks(request: dict[str, Any], scenario: Scenario) -> list[dict[str, Any]]:
    """Meta Llama's native stream: ``generation`` pieces, then the stop reason and metrics."""
    generation = generate(request, scenario, max_tokens=request.get("max_gen_len"))
    chunks: list[dict[str, Any]] = [
        {"generation": text, "prompt_token_count": generation.input_tokens if i == 0 else None,
         "generation_token_count": i + 1, "stop_reason": None}
        for i, text in enumerate(generation.texts)
    ]  # fmt: skip
    stop = "length" if generation.stop == "max_tokens" else "stop"
    metrics = _metrics(generation.input_tokens, len(generation.texts))
    last = {"generation": "", "prompt_token_count": None, "generation_token_count": len(generation.texts)}
    chunks.append(last | {"stop_reason": stop, "amazon-bedrock-invocationMetrics": metrics})
    return chunks


def invoke(request: dict[str, Any], scenario: Scenario) -> dict[str, Any]:
    """InvokeModel: the model's own answer."""
    if _anthropic(request):
        return anthropic_message(request, scenario)
    generation = generate(request, scenario, max_tokens=request.get("max_gen_len"))
    return {
        "generation": generation.text,
        "prompt_token_count": generation.input_tokens,
        "generation_token_count": len(generation.texts),
        "stop_reason": "length" if generation.stop == "max_tokens" else "stop",
    }


def error_body(scenario: Scenario, status: int) -> bytes:
    """``{"message": …}``, the type in ``__type`` (what botocore reads without the header)."""
    kind = scenario.error or _ERROR_TYPES.get(status, http_error(status).code)
    return orjson.dumps({"message": error_message(kind), "__type": kind})


CONVERSE = Dialect("bedrock-converse", converse_stream, converse, error_body, EVENTSTREAM)
INVOKE = Dialect("bedrock-invoke", invoke_stream, invoke, error_body, EVENTSTREAM)


def match(path: str) -> tuple[Dialect, bool, str] | None:
    """The mock dialect, whether it streams, and the model a Bedrock or Vertex path names."""
    if found := _PATH.search(path):
        op = found[2]
        return (
            (CONVERSE if op.startswith("converse") else INVOKE),
            op in ("converse-stream", "invoke-with-response-stream"),
            unquote(found[1]),
        )
    if found := _VERTEX_PATH.search(unquote(path)):
        return DIALECTS["anthropic"], found[2] == "streamRawPredict", found[1]
    return None
