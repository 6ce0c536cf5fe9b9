"""An exchange row in OpenTelemetry's GenAI terms: span name, attributes, metric dimensions, content.

Everything here reads a final ``exchanges`` row (what ``ExchangeRecord.to_row()`` returns)
and names its facts as the GenAI semantic conventions do (``gen_ai.*``, ``server.*``,
``error.type``), and the proxy's own facts under ``llm_audit.*``. It is pure (no SDK, no
I/O), so that what leaves the proxy is decided, and tested, in one place:

- only an allow-list of columns is read: never the request or response headers, the URL
  path or query, the error message (an upstream may echo part of a key in it) or a
  finding's detail; the credential appears only as the record's fingerprint;
- the content (prompt and answer) is read only by :func:`content`, which the exporter
  calls only when the content switch is on, within :data:`MAX_CONTENT_CHARS` per side;
- every value is bounded (:data:`MAX_ATTRIBUTE_CHARS`, :data:`MAX_LIST`) and one OTLP
  encodes (:func:`_text`, :func:`_put`): a client's model name or user id is hostile input.
  The export reads the record before the writer cleans it (:mod:`storage.prepare`), and
  the encoder drops a whole batch of spans, other exchanges' too, for a span name or
  status holding a lone surrogate, and silently drops an attribute holding one (a
  prompt hidden from the collector), or an integer beyond 64 bits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from exchange.request import extract_messages
from exchange.transcript import output_choices, output_tool_calls
from storage.prepare import valid_text

Row = Mapping[str, Any]
PREFIX = "llm_audit."
MAX_CONTENT_CHARS = 64 * 1024  # text per side (prompt, answer) of a content log record; the database keeps the whole
MAX_ITEMS = 256  # messages, choices, tool calls per side of a content log record
MAX_ATTRIBUTE_CHARS = 1024  # a span attribute's text (a model name, a user id: hostile input is cut)
MAX_LIST = 128  # items of a list attribute (finish reasons, findings, verdicts)
# gen_ai.operation.name per dialect; a dialect not listed is a chat
_OPERATIONS = {
    "gemini": "generate_content",
    "gemini-live": "generate_content",
    "openai-completions": "text_completion",
}
# statuses that are an error though the upstream reported none
_FAILED_STATUSES = frozenset({"blocked", "client_aborted", "upstream_aborted", "interrupted", "failed"})
# semconv's advisory histogram buckets (gen_ai.client.operation.duration, gen_ai.client.token.usage)
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
TOKEN_BUCKETS = tuple(float(4**i) for i in range(14))  # 1, 4, 16, ... 67108864


def operation_name(row: Row) -> str:
    """``gen_ai.operation.name``: Ollama's /api/generate is a text completion, Gemini
    generates content, everything else the proxy reads is a chat."""
    dialect = str(row.get("dialect") or "")
    if dialect == "ollama" and str(row.get("url_path") or "").endswith("/api/generate"):
        return "text_completion"
    return _OPERATIONS.get(dialect, "chat")


def provider_name(row: Row) -> str:
    """``gen_ai.provider.name`` (required): the record's provider, else its dialect (a
    custom value, as the conventions allow for protocols such as llm-stream)."""
    return str(row.get("provider") or row.get("dialect") or "_OTHER")


def error_type(row: Row) -> str | None:
    """``error.type``: the upstream's or the proxy's error code, else the HTTP status of a
    failed response, else the status of an exchange that did not complete."""
    if row.get("error_code"):
        return _text(row["error_code"])
    status = row.get("http_status")
    if isinstance(status, int) and status >= 400:
        return str(status)
    if row.get("status") in _FAILED_STATUSES:
        return str(row["status"])
    return None


def span_name(row: Row) -> str:
    """``{gen_ai.operation.name} {gen_ai.request.model}``, the operation alone without a model."""
    model = row.get("request_model")
    return f"{operation_name(row)} {_text(model)}" if model else operation_name(row)


def metric_attributes(row: Row) -> dict[str, Any]:
    """The low-cardinality dimensions of every metric (no user, no id: each would make a
    time series of its own)."""
    out: dict[str, Any] = {
        "gen_ai.operation.name": operation_name(row),
        "gen_ai.provider.name": provider_name(row),
    }
    _put(out, "gen_ai.request.model", row.get("request_model"))
    _put(out, "gen_ai.response.model", row.get("response_model"))
    _put(out, "server.address", row.get("server_address"))
    _put(out, "server.port", row.get("server_port"))
    _put(out, "error.type", error_type(row))
    return out


def span_attributes(row: Row) -> dict[str, Any]:
    """The span's attributes: the GenAI ones, then the proxy's own under ``llm_audit.``."""
    out = metric_attributes(row)
    _put(out, "gen_ai.response.id", row.get("response_id"))
    _put(out, "gen_ai.conversation.id", row.get("session_id"))
    if row.get("streamed"):
        out["gen_ai.request.stream"] = True
        ttfc = seconds_between(row.get("started_at"), row.get("first_chunk_at"))
        _put(out, "gen_ai.response.time_to_first_chunk", ttfc)
    reasons = row.get("finish_reasons")
    if isinstance(reasons, list) and reasons:
        out["gen_ai.response.finish_reasons"] = [_text(r) for r in reasons[:MAX_LIST]]
    for column, name in USAGE_ATTRIBUTES.items():
        _put(out, name, token_count(row.get(column)))
    own = {
        "exchange_id": row.get("id"),
        "status": row.get("status"),
        "dialect": row.get("dialect"),
        "user": row.get("user_id"),
        "client": row.get("client_address"),
        "proxy_instance": row.get("proxy_instance"),
        "api_key_fingerprint": row.get("api_key_fingerprint"),
        "request_id": row.get("request_id"),
        "http_status": row.get("http_status"),
        "task_id": row.get("task_id"),
        "connection_id": row.get("connection_id"),
        "turn": row.get("turn"),
        "cost_usd": cost(row.get("cost_usd")),
    }
    for key, value in own.items():
        _put(out, PREFIX + key, value)
    findings = _codes(row.get("findings"), "code")
    if findings:
        out[PREFIX + "findings"] = findings[:MAX_LIST]
    verdicts = [f"{v.get('action')}:{v.get('rule_id')}" for v in row.get("verdicts") or () if isinstance(v, Mapping)]
    if verdicts:
        out[PREFIX + "verdicts"] = [_text(v) for v in verdicts[:MAX_LIST]]
    return out


# usage columns and their GenAI attribute names
USAGE_ATTRIBUTES = {
    "input_tokens": "gen_ai.usage.input_tokens",
    "output_tokens": "gen_ai.usage.output_tokens",
    "cache_read_input_tokens": "gen_ai.usage.cache_read.input_tokens",
    "cache_write_input_tokens": "gen_ai.usage.cache_write.input_tokens",
    "reasoning_output_tokens": "gen_ai.usage.reasoning.output_tokens",
}


def content(row: Row) -> dict[str, Any]:
    """The prompt and the answer as the conventions' ``gen_ai.input.messages`` and
    ``gen_ai.output.messages`` (role, parts, finish reason).

    Each side keeps at most :data:`MAX_CONTENT_CHARS` of text (and :data:`MAX_ITEMS`
    messages): the prompt its latest messages (a conversation repeats its history in
    every request; the newest turn is the one this exchange added), the answer its first
    text; ``llm_audit.content_truncated`` says when something was cut. The database keeps
    the whole. Where a content filter changed the answer, the output is what the client
    got (``delivered_text``): the upstream's original stays in the database.

    What a filter blocked stays in the database only: an exchange it blocked leaves
    nothing but what its client got of the answer, its first choice's text
    (:func:`_withheld`)."""
    if _blocked(row):
        return _withheld(row)
    inputs_budget, outputs_budget = _Budget(), _Budget()
    inputs: list[dict[str, Any]] = []
    for m in reversed(extract_messages(row.get("request_body"))):
        if not inputs_budget.room(len(inputs)):
            break
        inputs.append({"role": _text(m.role), "parts": [{"type": "text", "content": inputs_budget.take(m.text)}]})
    inputs.reverse()
    outputs: list[dict[str, Any]] = []
    delivered = row.get("delivered_text")
    for choice in output_choices(row):
        if not outputs_budget.room(len(outputs)):
            break
        text = delivered if isinstance(delivered, str) and choice.get("index") == 0 else choice.get("text")
        parts: list[dict[str, Any]] = []
        for kind, value in (("reasoning", choice.get("reasoning")), ("text", text), ("refusal", choice.get("refusal"))):
            if isinstance(value, str) and value:
                parts.append({"type": kind, "content": outputs_budget.take(value)})
        outputs.append({"role": "assistant", "parts": parts, "finish_reason": _text(choice.get("finish_reason") or "")})
    calls: list[dict[str, Any]] = []
    for c in output_tool_calls(row):
        if outputs_budget.room(len(calls)):
            arguments = outputs_budget.take(str(c.get("arguments") or ""))
            call = {"type": "tool_call", "id": _text(c.get("id") or ""), "name": _text(c.get("name") or "")}
            calls.append(call | {"arguments": arguments})
    if calls:
        if not outputs:
            outputs.append({"role": "assistant", "parts": [], "finish_reason": "tool_call"})
        outputs[0]["parts"].extend(calls)
    out: dict[str, Any] = {"gen_ai.input.messages": inputs, "gen_ai.output.messages": outputs}
    if inputs_budget.cut or outputs_budget.cut:
        out[PREFIX + "content_truncated"] = True
    return out


def _blocked(row: Row) -> bool:
    """Whether a filter blocked the exchange (a verdict to block, of any rule or budget)."""
    return any(isinstance(v, Mapping) and v.get("action") == "block" for v in row.get("verdicts") or ())


def _withheld(row: Row) -> dict[str, Any]:
    """The content of an exchange a filter blocked: no prompt (a blocked request never
    reached the upstream: a ``secrets`` rule keeps a key from leaving), and of the answer
    only the text its client got (``delivered_text``), not its reasoning, other choices
    or tool calls, where the blocked text may be. Both sides, whichever a verdict names:
    a verdict's location is the filter's to write. ``llm_audit.content_withheld`` says so."""
    budget = _Budget()
    delivered = row.get("delivered_text")
    outputs = []
    if isinstance(delivered, str) and delivered:
        outputs.append({"role": "assistant", "parts": [{"type": "text", "content": budget.take(delivered)}]})
    out: dict[str, Any] = {"gen_ai.input.messages": [], "gen_ai.output.messages": outputs}
    out[PREFIX + "content_withheld"] = True
    if budget.cut:
        out[PREFIX + "content_truncated"] = True
    return out


class _Budget:
    """The text one side of a content record may still take."""

    def __init__(self) -> None:
        self.left = MAX_CONTENT_CHARS
        self.cut = False

    def room(self, items: int) -> bool:
        if items < MAX_ITEMS:
            return True
        self.cut = True
        return False

    def take(self, text: str) -> str:
        if len(text) > self.left:
            self.cut = True
            text = text[: self.left]
        self.left -= len(text)
        return _text(text, limit=None)


def seconds_between(start: Any, end: Any) -> float | None:
    """Seconds from ``start`` to ``end`` (datetimes), None when either is missing or they run backwards."""
    if not isinstance(start, datetime) or not isinstance(end, datetime):
        return None
    seconds = (end - start).total_seconds()
    return seconds if seconds >= 0 else None


def nanoseconds(value: Any) -> int | None:
    """A row's time as the epoch nanoseconds OpenTelemetry takes."""
    return int(value.timestamp() * 1e9) if isinstance(value, datetime) else None


def _put(out: dict[str, Any], name: str, value: Any) -> None:
    """Set an attribute unless the value is unknown (OpenTelemetry has no null), or is a
    number OTLP cannot carry (an integer beyond 64 bits, an infinite or NaN float)."""
    if value is None or value == "":
        return
    if isinstance(value, bool):
        out[name] = value
    elif isinstance(value, int):
        if -(2**63) <= value < 2**63:
            out[name] = value
    elif isinstance(value, float):
        if math.isfinite(value):
            out[name] = value
    else:
        out[name] = _text(value)


def _text(value: Any, limit: int | None = MAX_ATTRIBUTE_CHARS) -> str:
    """``value``'s text, cut to ``limit`` characters, with U+FFFD for each lone surrogate
    (as the database stores it): what OTLP can encode."""
    text = str(value)[:limit]
    if text.isascii():
        return text
    try:
        text.encode()
        return text
    except UnicodeEncodeError:
        return valid_text(text)


def token_count(value: Any) -> int | None:
    """A token count OTLP can carry (a lenient reader takes integers beyond 64 bits)."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63
    return value if ok else None


def cost(value: Any) -> float | None:
    """``cost_usd`` as a float (the column is a decimal; NULL when the price is unknown or
    beyond a float)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        cost = float(value)
    except (TypeError, ValueError):
        return None
    return cost if cost >= 0 and math.isfinite(cost) else None


def _codes(items: Any, key: str) -> list[str]:
    return [_text(i.get(key)) for i in items or () if isinstance(i, Mapping) and i.get(key)]
