"""Presenting what :mod:`storage.query` finds: tables and whole exchanges for a person,
JSON, JSON Lines and CSV for scripts.

For a person: a table fits the terminal's width (``COLUMNS``, else the terminal's, else
120 columns when piped), and colour is used only when stdout is a terminal and
``NO_COLOR`` is not set (https://no-color.org), so piped output is plain text. Text
from the database reaches the screen with its control characters and bidirectional
overrides made visible (``\\x1b``, ``\\u202e``): a recorded answer must not be able to
rewrite the auditor's terminal or reorder what it shows.

For scripts: the field names are the query's (the ``exchange_view`` column names),
times are ISO 8601 in UTC, JSON columns stay JSON (in CSV: JSON text), booleans are
``true``/``false``; the same on SQLite and PostgreSQL.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import time
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import IO, Any

import orjson

from addon.filters.messages import extract_messages

MACHINE_FORMATS = ("json", "jsonl", "csv")
ELLIPSIS = "…"
GAP = "  "  # between table columns
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")  # not tab, newline
STATUS_COLORS = {
    "completed": "32", "failed": "31", "blocked": "1;31", "client_aborted": "33", "upstream_aborted": "33",
    "interrupted": "33", "in_progress": "36",
}  # fmt: skip


# -- terminal ---------------------------------------------------------------------------------


class Style:
    """ANSI colours when ``enabled``; otherwise every method returns the text unchanged."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    @classmethod
    def for_stream(cls, stream: IO[str]) -> Style:
        return cls(stream.isatty() and not os.environ.get("NO_COLOR"))

    def __call__(self, text: str, code: str | None) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.enabled and code and text else text

    def bold(self, text: str) -> str:
        return self(text, "1")

    def dim(self, text: str) -> str:
        return self(text, "2")

    def status(self, text: str, status: str | None) -> str:
        return self(text, STATUS_COLORS.get(status or ""))


def terminal_width() -> int:
    return max(shutil.get_terminal_size(fallback=(120, 24)).columns, 20)


def visible(text: str) -> str:
    """``text`` with control characters (but tab and newline) and bidirectional overrides
    shown as ``\\xNN`` and ``\\uNNNN``."""
    return _CONTROL.sub(lambda m: ascii(m.group())[1:-1], text)


def one_line(text: str | None) -> str:
    """``text`` on one line: runs of whitespace (newlines too) become one space."""
    return visible(" ".join((text or "").split()))


def _char_width(char: str) -> int:
    if unicodedata.combining(char) or char in "\u200b\u200c\u200d\ufeff":
        return 0
    return 2 if unicodedata.east_asian_width(char) in "WF" else 1


def display_width(text: str) -> int:
    """Terminal columns ``text`` takes (wide CJK characters take two, combining marks none)."""
    return sum(_char_width(c) for c in text)


def _fitting(text: str, start: int, width: int) -> int:
    """The end of the longest piece of ``text`` from ``start`` that fits in ``width`` columns."""
    used = 0
    for i in range(start, len(text)):
        used += _char_width(text[i])
        if used > width:
            return i
    return len(text)


def clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` columns, with an ellipsis when something was cut."""
    if _fitting(text, 0, width) == len(text):
        return text
    return text[:_fitting(text, 0, width - 1)] + ELLIPSIS if width > 0 else ""


def pad(text: str, width: int, right: bool = False) -> str:
    space = " " * max(width - display_width(text), 0)
    return space + text if right else text + space


def wrap(line: str, width: int) -> list[str]:
    """One line of text cut into pieces of at most ``width`` columns, at spaces where possible."""
    pieces, start = [], 0
    while (end := _fitting(line, start, width)) < len(line):
        space = line.rfind(" ", start, end + 1)
        if space > start:
            pieces.append(line[start:space])
            start = space + 1
        else:
            pieces.append(line[start:max(end, start + 1)])
            start = max(end, start + 1)
    pieces.append(line[start:])
    return pieces


# -- tables -----------------------------------------------------------------------------------


@dataclass
class Column:
    """A table column: its header, its cells (one line each), and how it gives way.

    A ``flex`` column gives way first (down to ``min_width``), then the other columns
    with a ``min_width``, widest first; ``min_width`` None: never narrowed. When even
    that does not fit, the columns with the lowest ``keep`` are left out. ``colors``
    maps a cell to its colour.
    """

    header: str
    cells: list[str]
    min_width: int | None = None
    right: bool = False
    keep: int = 0
    flex: bool = False
    colors: Callable[[str], str | None] | None = None

    @property
    def natural(self) -> int:
        return max([display_width(self.header), *map(display_width, self.cells)])


def table(columns: Sequence[Column], width: int, style: Style) -> str:
    """The columns as a table of at most ``width`` columns: narrowed, then thinned out."""
    columns = list(columns)
    while True:
        widths = _narrowed(columns, width)
        if widths is not None or len(columns) == 1:
            break
        columns.remove(min(columns, key=lambda c: c.keep))
    widths = widths or [width]
    header = GAP.join(pad(clip(c.header, w), w, c.right) for c, w in zip(columns, widths, strict=True))
    lines = [style.bold(header.rstrip())]
    for i in range(len(columns[0].cells)):
        cells = []
        for c, w in zip(columns, widths, strict=True):
            cell = pad(clip(c.cells[i], w), w, c.right)
            cells.append(style(cell, c.colors(c.cells[i])) if c.colors else cell)
        lines.append(GAP.join(cells).rstrip())
    return "\n".join(lines)


def _narrowed(columns: Sequence[Column], width: int) -> list[int] | None:
    """Widths that fit ``width``, taken from the widest narrowable columns first; None if impossible."""
    widths = [c.natural for c in columns]
    floors = [min(c.min_width, w) if c.min_width is not None else w for c, w in zip(columns, widths, strict=True)]
    excess = sum(widths) + len(GAP) * (len(columns) - 1) - width
    for i, c in enumerate(columns):
        if c.flex and excess > 0:
            step = min(excess, widths[i] - floors[i])
            widths[i] -= step
            excess -= step
    while excess > 0:
        slack = [w - floor for w, floor in zip(widths, floors, strict=True)]
        i = max(range(len(columns)), key=slack.__getitem__)
        if slack[i] <= 0:
            return None
        widths[i] -= 1
        excess -= 1
    return widths


def exchanges_table(rows: Sequence[dict[str, Any]], width: int, style: Style) -> str:
    """``list`` for a person: time, id, who, which model, how it ended, tokens, the output's first words."""
    def cells(fn: Callable[[dict[str, Any]], Any]) -> list[str]:
        return [one_line(str(v)) if (v := fn(r)) is not None else "-" for r in rows]

    return table([
        Column("time (UTC)", cells(lambda r: _time(r["started_at"], seconds=False)), keep=9),
        Column("id", cells(lambda r: r["id"][:12]), keep=7),
        Column("client", cells(lambda r: r["client_address"]), min_width=15, keep=2),
        Column("user", cells(lambda r: r["user_id"]), min_width=8, keep=5),
        Column("provider", cells(lambda r: r["provider"]), min_width=9, keep=1),
        Column("model", cells(lambda r: r["request_model"]), min_width=12, keep=6),
        Column("status", cells(lambda r: r["status"]), keep=8, colors=lambda s: STATUS_COLORS.get(s)),
        Column("tokens", cells(_tokens), right=True, keep=3),
        Column("output", cells(_snippet), min_width=20, keep=4, flex=True),
    ], width, style)  # fmt: skip


def _tokens(row: dict[str, Any]) -> str | None:
    if row["input_tokens"] is None and row["output_tokens"] is None:
        return None
    return f"{_or_dash(row['input_tokens'])}/{_or_dash(row['output_tokens'])}"


def _snippet(row: dict[str, Any]) -> str:
    """The first words of what the client received, else the error."""
    text = one_line(row["client_text"])[:200]
    if not text and (row["error_code"] or row["error_message"]):
        text = f"[{row['error_code'] or 'error'}] {one_line(row['error_message'])[:200]}"
    return text


def stats_table(rows: Sequence[dict[str, Any]], by: Sequence[str], width: int, style: Style) -> str:
    """``stats`` for a person: the group keys, then the counts and sums right-aligned."""
    def cells(name: str) -> list[str]:
        return [_or_dash(r[name]) for r in rows]

    keys = [Column(key, [one_line(str(r[key])) if r[key] is not None else "-" for r in rows], min_width=8,
                   keep=9) for key in by]
    numbers = [
        ("exchanges", "exchanges"), ("with_usage", "with usage"), ("input_tokens", "input"),
        ("output_tokens", "output"), ("cache_read_input_tokens", "cached"), ("reasoning_output_tokens", "reasoning"),
        ("errors", "errors"), ("blocks", "blocks"), ("time_to_first_chunk_p50_ms", "ttfc p50 ms"),
        ("time_to_first_chunk_p95_ms", "ttfc p95 ms"),
    ]  # fmt: skip
    return table([*keys, *(Column(header, cells(name), right=True, keep=8) for name, header in numbers)],
                 width, style)


def _or_dash(value: Any) -> str:
    return "-" if value is None else str(value)


def _time(value: datetime | None, *, seconds: bool = True, precise: bool = False) -> str | None:
    """``2026-03-01 12:34:56`` (``.789`` when ``precise``; no seconds when not ``seconds``)."""
    if value is None:
        return None
    text = value.strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M")
    return text + (f".{value.microsecond // 1000:03d}" if precise else "")


# -- one exchange, as a person reads it ---------------------------------------------------------


class _Page:
    """Lines of ``show``: sections of labelled fields and indented text, wrapped to the width."""

    def __init__(self, width: int, style: Style) -> None:
        self.width, self.style, self.lines = width, style, []

    def heading(self, text: str) -> None:
        if self.lines:
            self.lines.append("")
        self.lines.append(self.style.bold(text))

    def field(self, label: str, value: str | None) -> None:
        if value:
            self.text(one_line(value), indent=2, first=f"{label:<12}")

    def text(self, text: str, indent: int, first: str = "") -> None:
        """``text`` (newlines kept) indented, the first line after ``first``."""
        lead = " " * indent
        for n, line in enumerate(visible(text.replace("\r\n", "\n")).expandtabs(4).split("\n")):
            prefix = lead + (first if n == 0 else " " * len(first))
            for piece in wrap(line, max(self.width - display_width(prefix), 10)):
                self.lines.append((prefix + piece).rstrip())
                prefix = lead + " " * len(first)


def _http_status(r: dict[str, Any]) -> str:
    """`` (HTTP 200)``; when the proxy replaced the upstream's answer, both statuses."""
    client, upstream = r.get("client_status"), r["http_status"]
    if client is not None and client != upstream:
        return f" (HTTP {client} to the client; the upstream sent {upstream})"
    return f" (HTTP {upstream})" if upstream else ""


def exchange_text(r: dict[str, Any], width: int, style: Style) -> str:
    """``show``: the whole exchange, request to outcome."""
    page = _Page(width, style)
    status = r["status"] + _http_status(r)
    page.lines.append(style.bold(f"exchange {r['id']}") + "  " + style.status(status, r["status"]))
    if r.get("erased_at") is not None:  # the reader must not take what follows for what was said
        page.lines.append(style.bold(f"ERASED at {r['erased_at']}: the content below is the erasure marker, "
                                     "not what was sent or answered"))
    _overview(page, r)
    _request(page, r["request_body"])
    _output(page, r)
    _usage(page, r)
    _problems(page, r)
    return "\n".join(page.lines)


def _overview(page: _Page, r: dict[str, Any]) -> None:
    page.field("started", f"{_time(r['started_at'], precise=True)} UTC" if r["started_at"] else None)
    timing = [f"first chunk after {_duration(r['time_to_first_chunk_ms'])}" if r["time_to_first_chunk_ms"] is not None
              else "no response body", f"took {_duration(r['duration_ms'])}" if r["duration_ms"] is not None else ""]
    page.field("timing", " · ".join(t for t in timing if t))
    model = r["request_model"] or "-"
    if r["response_model"] and r["response_model"] != r["request_model"]:
        model += f" (served by {r['response_model']})"
    page.field("model", model)
    protocol = [r["dialect"], f"provider {r['provider']}" if r["provider"] else "",
                "streamed" if r["streamed"] else "not streamed"]
    page.field("protocol", " · ".join(p for p in protocol if p))
    port = f":{r['server_port']}" if r["server_port"] else ""
    query = f"?{r['url_query']}" if r["url_query"] else ""
    page.field("upstream", f"{r['http_method'] or ''} {r['server_address'] or ''}{port}{r['url_path'] or ''}{query}")
    for label, name in (("client", "client_address"), ("user agent", "user_agent"), ("user", "user_id"),
                        ("session", "session_id"), ("request id", "request_id"), ("response id", "response_id"),
                        ("task", "task_id"), ("api key", "api_key_fingerprint"), ("proxy", "proxy_instance")):
        page.field(label, r[name])


def _request(page: _Page, body: Any) -> None:
    page.heading("request")
    if not isinstance(body, dict):
        page.text("(not JSON)" if body is None else body if isinstance(body, str) else _pretty(body), indent=2)
        return
    messages, tools = extract_messages(body), _declared_tools(body)
    if not messages and not tools:  # a shape no dialect has: as it is
        page.text(_pretty(body), indent=2)
    for message in messages:
        page.lines.append("  " + page.style.dim(message.role))
        page.text(message.text, indent=4)
    if tools:
        page.lines.append("  " + page.style.dim("tools"))
        for name, description in tools:
            page.text(f"{name} - {description}" if description else name, indent=4)


def _declared_tools(body: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, description) of each tool a request declares, whatever its API's shape
    (OpenAI ``tools[].function``, Responses and Anthropic ``tools[]``, Gemini
    ``tools[].functionDeclarations[]``, legacy ``functions[]``)."""
    specs: list[Any] = []
    for key in ("tools", "functions"):
        for item in body.get(key) if isinstance(body.get(key), list) else []:
            if isinstance(item, dict):
                specs += [item, item.get("function"), item.get("custom")]
                for nested in ("functionDeclarations", "function_declarations"):
                    specs += item.get(nested) if isinstance(item.get(nested), list) else []
    return [(spec["name"], one_line(spec.get("description") if isinstance(spec.get("description"), str) else ""))
            for spec in specs if isinstance(spec, dict) and isinstance(spec.get("name"), str)]


def _output(page: _Page, r: dict[str, Any]) -> None:
    output = r["output"] if isinstance(r["output"], dict) else {}
    choices = [c for c in output.get("choices") or [] if isinstance(c, dict)]
    page.heading("output")
    if not r["output_text"] and not any(c.get(part) for c in choices for part in ("text", "reasoning", "refusal")):
        page.text("(none)", indent=2)
    for choice in choices or [{"index": 0, "text": r["output_text"]}]:
        label = f"choice {choice.get('index')}" if len(choices) > 1 else ""
        stop = f"finish reason {choice['finish_reason']}" if choice.get("finish_reason") else ""
        if label or stop:
            page.lines.append("  " + page.style.dim(" · ".join(x for x in (label, stop) if x)))
        for part, name in (("reasoning", "reasoning"), ("refusal", "refusal")):
            if choice.get(part):
                page.lines.append("  " + page.style.dim(name))
                page.text(choice[part], indent=4)
        if choice.get("text"):
            page.text(choice["text"], indent=2)
    if r["delivered_text"] is not None:
        page.heading("delivered to the client (a content filter changed the output)")
        page.text(r["delivered_text"], indent=2)
    calls = [c for c in output.get("tool_calls") or r["tool_calls"] or [] if isinstance(c, dict)]
    if calls:
        page.heading("tool calls")
        for call in calls:
            cut = "" if call.get("complete", True) else " (cut off; arguments as received)"
            call_id = call.get("id")  # Gemini's calls have none: nothing to print then
            shown_id = " " + page.style.dim(f"id {one_line(str(call_id))}") if call_id is not None else ""
            page.lines.append(f"  {one_line(str(call.get('name')))}" + shown_id + cut)
            page.text(_arguments(call.get("arguments")), indent=4)


def _arguments(arguments: Any) -> str:
    """Tool call arguments pretty-printed when they are JSON, else as received."""
    if isinstance(arguments, str):
        try:
            return _pretty(orjson.loads(arguments))
        except orjson.JSONDecodeError:
            return arguments
    return _pretty(arguments)


def _pretty(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()


def _usage(page: _Page, r: dict[str, Any]) -> None:
    page.heading("usage")
    if r["usage_source"] != "provider":
        page.text("none reported by the upstream", indent=2)
        return
    parts = [("input", "input_tokens"), ("output", "output_tokens"), ("cache read", "cache_read_input_tokens"),
             ("cache write", "cache_write_input_tokens"), ("reasoning", "reasoning_output_tokens"),
             ("total", "total_tokens")]
    page.text(" · ".join(f"{label} {r[name]}" for label, name in parts if r[name] is not None), indent=2)


def _problems(page: _Page, r: dict[str, Any]) -> None:
    if r["error_code"] or r["error_message"]:
        page.heading("error")
        page.text(f"{r['error_code'] or 'error'}: {r['error_message'] or ''}", indent=2)
    findings = [f for f in r["findings"] or [] if isinstance(f, dict)]
    if findings:
        page.heading("findings")
        for f in findings:
            page.text(f"{f.get('code')}  {f.get('detail') or ''}", indent=2)
    verdicts = [v for v in r["verdicts"] or [] if isinstance(v, dict)]
    if verdicts:
        page.heading("filter verdicts")
        for v in verdicts:
            position = f"at {v['position']}" if v.get("position") is not None else None
            where = ", ".join(str(x) for x in (v.get("filter"), v.get("location"), position, v.get("match_hash")) if x)
            verdict = f"{v.get('action')}  {v.get('rule_id')}  {v.get('reason') or ''}"
            page.text(verdict + (f" ({where})" if where else ""), indent=2)
    parts = [("events", "event_count"), ("bytes to the client", "bytes_to_client"),
             ("bytes from the upstream", "bytes_from_upstream")]
    page.heading("transfer")
    page.text(" · ".join(f"{r[name]} {label}" for label, name in parts if r[name] is not None) or "-", indent=2)


def _duration(ms: int) -> str:
    return f"{ms} ms" if abs(ms) < 1000 else f"{ms / 1000:.3f} s"


# -- machine formats ------------------------------------------------------------------------


def write_records(rows: Iterable[dict[str, Any]], fmt: str, fields: Sequence[str], out: IO[str]) -> None:
    """Write ``rows`` as ``json`` (one array), ``jsonl`` or ``csv`` (header: ``fields``), one
    row at a time: ``rows`` may be a stream larger than memory."""
    if fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(fields)
        for row in rows:
            writer.writerow([_csv_cell(row[name]) for name in fields])
        return
    separator = "[\n" if fmt == "json" else ""
    for row in rows:
        out.write(separator + orjson.dumps(row).decode())
        separator = ",\n" if fmt == "json" else "\n"
    if fmt == "json":
        out.write("\n]\n" if separator == ",\n" else "[]\n")
    elif separator:
        out.write("\n")


def json_document(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n"


# A cell a spreadsheet would run as a formula (CWE-1236): its text starts with one of these.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
# Control characters other than line feed and tab, shown escaped (\x1b) in CSV cells.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _csv_cell(value: Any) -> str:
    """One CSV cell: recorded text is hostile, so a cell that would start a formula is
    prefixed with ``'`` (the OWASP rule; spreadsheets then show it as text) and control
    characters are escaped; numbers are left as they are."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    text = orjson.dumps(value).decode() if isinstance(value, dict | list) else str(value)
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


# -- progress -----------------------------------------------------------------------------------


class Progress:
    """A one-line progress bar on a terminal (``stream``, normally stderr), redrawn at most
    ten times a second; :meth:`track` passes the items through unchanged."""

    BAR = 30

    def __init__(self, total: int, stream: IO[str], what: str = "exchanges") -> None:
        self.total, self.stream, self.what = total, stream, what
        self._drawn = 0.0

    def track(self, items: Iterable[Any]) -> Iterator[Any]:
        n = 0
        for n, item in enumerate(items, 1):
            yield item
            if time.monotonic() - self._drawn >= 0.1:
                self._draw(n)
        self._draw(n, done=True)

    def _draw(self, n: int, done: bool = False) -> None:
        self._drawn = time.monotonic()
        share = n / self.total if self.total else 1.0
        filled = min(round(share * self.BAR), self.BAR)
        line = f"\r[{'#' * filled}{'.' * (self.BAR - filled)}] {min(share, 1.0):4.0%} {n}/{self.total} {self.what}"
        self.stream.write(line + ("\n" if done else ""))
        self.stream.flush()
