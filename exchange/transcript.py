"""An exchange as a person reads it: the pieces of text both of its views show.

mitmproxy's "LLM stream" view (:mod:`addon.mitm.contentview`) and ``llm-audit show``
(:mod:`cli.show`) lay an exchange out differently (two tabs of a flow; one page wrapped to
a terminal), but must never disagree on what it said: how a model, a choice, a tool call,
the usage, an error, a finding or a filter verdict reads is written once, here. Each view
only arranges these pieces.

Everything is read from a row with the columns of the ``exchanges`` table (what
``ExchangeRecord.to_row()`` returns and ``storage.query.get_exchange`` reads back) and
from the request body (its conversation and tools are read by :mod:`exchange.request`,
the one reader of request bodies); values a database written by something else may hold
in any shape are checked, never trusted. Nothing here prints or escapes: text for a terminal
is made harmless by the terminal's view.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

Row = Mapping[str, Any]
CUT_OFF = " (cut off; arguments as received)"
# Usage columns, in the order both views list them.
USAGE_PARTS = (
    ("input", "input_tokens"), ("output", "output_tokens"), ("cache read", "cache_read_input_tokens"),
    ("cache write", "cache_write_input_tokens"), ("reasoning", "reasoning_output_tokens"), ("total", "total_tokens"),
)  # fmt: skip
NO_USAGE = "none reported by the upstream"


@dataclass(frozen=True, slots=True)
class Choice:
    """One choice of the output: its answer, reasoning and refusal, and why it stopped."""

    index: Any
    text: str
    reasoning: str = ""
    refusal: str = ""
    finish_reason: str = ""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call of the output; ``arguments`` pretty-printed when they are JSON."""

    name: str
    id: str | None
    arguments: str
    complete: bool = True


# -- the request ----------------------------------------------------------------------------------


def body_text(body: Any) -> str:
    """A request body no dialect's shape fits, as it is: JSON pretty-printed, text as sent."""
    if body is None:
        return "(not JSON)"
    return body if isinstance(body, str) else pretty(body)


# -- the response ---------------------------------------------------------------------------------


def model_line(row: Row) -> str | None:
    """The model asked for, and the one that answered when another did."""
    asked, served = row.get("request_model"), row.get("response_model")
    if served and served != asked:
        return f"{asked or '-'} (served by {served})"
    return asked or None


def output_choices(row: Row) -> list[dict[str, Any]]:
    """A row's ``output.choices``, each with its ``text``: choice 0's is ``output_text``.

    :meth:`addon.record.ExchangeRecord.to_row` does not repeat choice 0's text in ``output``; a row
    written before it did (its choice 0 keeps its own ``text``). Anything in ``output``
    that is not a choice object is left out: this reads rows from the database, which
    anyone with write access may have changed.
    """
    output = row.get("output")
    found = output.get("choices") if isinstance(output, Mapping) else None
    if not isinstance(found, list):
        return []
    text = row.get("output_text")
    out: list[dict[str, Any]] = []
    for c in found:
        if isinstance(c, Mapping):
            if type(c.get("index")) is int and c["index"] == 0 and "text" not in c:
                c = {**c, "text": text if isinstance(text, str) else ""}
            out.append(dict(c))
    return out


def choices(row: Row) -> list[Choice]:
    """The output's choices; when it has none, its text as one (an older or foreign row)."""
    found = [_choice(c) for c in output_choices(row)]
    if not found and row.get("output_text"):
        return [Choice(0, row["output_text"])]
    return found


def _choice(c: dict[str, Any]) -> Choice:
    return Choice(
        c.get("index"),
        _text(c.get("text")),
        _text(c.get("reasoning")),
        _text(c.get("refusal")),
        _text(c.get("finish_reason")),
    )


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def has_output(row: Row) -> bool:
    """Whether the output says anything at all (text, reasoning or a refusal)."""
    return bool(row.get("output_text")) or any(c.text or c.reasoning or c.refusal for c in choices(row))


def output_tool_calls(row: Row) -> list[dict[str, Any]]:
    """A row's ``output.tool_calls``, each with its ``arguments`` from the ``tool_calls`` column.

    :meth:`addon.record.ExchangeRecord.to_row` keeps a call's arguments once, in the
    ``tool_calls`` column (the same calls in the same order); ``output.tool_calls`` says
    whether each is complete. A row written before keeps them in both. A call the column
    does not have (a changed row) gets no arguments rather than another call's.
    """
    output = row.get("output")
    found = output.get("tool_calls") if isinstance(output, Mapping) else None
    if not isinstance(found, list):
        return []
    column = row.get("tool_calls")
    column = column if isinstance(column, list) and len(column) == len(found) else []
    out: list[dict[str, Any]] = []
    for i, c in enumerate(found):
        if isinstance(c, Mapping):
            if "arguments" not in c:
                kept = column[i] if column else None
                c = {**c, "arguments": kept.get("arguments") if isinstance(kept, Mapping) else None}
            out.append(dict(c))
    return out


def tool_calls(row: Row) -> list[ToolCall]:
    """The output's tool calls (the ``tool_calls`` column when the output has none)."""
    calls = output_tool_calls(row) or row.get("tool_calls") or []
    return [
        ToolCall(
            str(c.get("name")),
            None if c.get("id") in (None, "") else str(c["id"]),
            arguments_text(c.get("arguments")),
            c.get("complete", True) is not False,
        )
        for c in calls
        if isinstance(c, dict)
    ]


def usage_line(row: Row) -> str:
    """The tokens the upstream reported, ``input 12 · output 34 · total 46``."""
    if row.get("usage_source") != "provider":
        return NO_USAGE
    return " · ".join(f"{label} {row[name]}" for label, name in USAGE_PARTS if row.get(name) is not None) or NO_USAGE


def error_line(row: Row) -> str | None:
    """``code: message`` of an exchange that failed, else None."""
    if not (row.get("error_code") or row.get("error_message")):
        return None
    return f"{row.get('error_code') or 'error'}: {row.get('error_message') or ''}"


def finding_lines(findings: Iterable[Any]) -> list[str]:
    """``code  detail``, one line per finding."""
    return [f"{f.get('code')}  {f.get('detail') or ''}".rstrip() for f in findings or () if isinstance(f, dict)]


def verdict_lines(verdicts: Iterable[Any]) -> list[str]:
    """``action  rule  reason (filter, location, at position, match hash)``, one per verdict."""
    return [_verdict_line(v) for v in verdicts or () if isinstance(v, dict)]


def _verdict_line(v: dict[str, Any]) -> str:
    position = f"at {v['position']}" if v.get("position") is not None else None
    where = ", ".join(str(x) for x in (v.get("filter"), v.get("location"), position, v.get("match_hash")) if x)
    line = f"{v.get('action')}  {v.get('rule_id')}" + (f"  {v['reason']}" if v.get("reason") else "")
    return line + (f" ({where})" if where else "")


def is_output_verdict(verdict: Any) -> bool:
    """Whether a verdict is about the output (else about the request)."""
    return isinstance(verdict, dict) and str(verdict.get("location") or "").startswith("output")


# -- values ---------------------------------------------------------------------------------------


def arguments_text(arguments: Any) -> str:
    """Tool call arguments pretty-printed when they are JSON, else as received."""
    if isinstance(arguments, str):
        try:
            return pretty(orjson.loads(arguments))
        except orjson.JSONDecodeError:
            return arguments
    return pretty(arguments)


def pretty(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()
