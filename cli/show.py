"""``show``'s page: the whole exchange, request to outcome, wrapped to the terminal.

What each part says comes from :mod:`exchange.transcript`, as in mitmproxy's view of the
same exchange; this module only lays it out: a header, the exchange's metadata (which
only the database knows: timings, client, transfer), then sections of indented text.
"""

from __future__ import annotations

from typing import Any

from cli.terminal import Style, display_width, one_line, timestamp, visible, wrap
from exchange import transcript
from exchange.request import declared_tools, extract_messages


class _Page:
    """Lines of ``show``: sections of labelled fields and indented text, wrapped to the width."""

    def __init__(self, width: int, style: Style) -> None:
        self.width, self.style = width, style
        self.lines: list[str] = []

    def heading(self, text: str) -> None:
        if self.lines:
            self.lines.append("")
        self.lines.append(self.style.bold(text))

    def label(self, text: str) -> None:
        """A dimmed label over indented text (a message's role, a choice's finish reason:
        recorded text, made visible like the rest)."""
        self.lines.append("  " + self.style.dim(one_line(text)))

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
    page.lines.append(style.bold(f"exchange {one_line(r['id'])}") + "  " + style.status(one_line(status), r["status"]))
    if r.get("erased_at") is not None:  # the reader must not take what follows for what was said
        page.lines.append(
            style.bold(
                f"ERASED at {r['erased_at']}: the content below is the erasure marker, not what was sent or answered"
            )
        )
    _overview(page, r)
    _request(page, r["request_body"])
    _output(page, r)
    _usage(page, r)
    _problems(page, r)
    return "\n".join(page.lines)


def _overview(page: _Page, r: dict[str, Any]) -> None:
    page.field("started", f"{timestamp(r['started_at'], precise=True)} UTC" if r["started_at"] else None)
    timing = [
        f"first chunk after {_duration(r['time_to_first_chunk_ms'])}"
        if r["time_to_first_chunk_ms"] is not None
        else "no response body",
        f"took {_duration(r['duration_ms'])}" if r["duration_ms"] is not None else "",
    ]
    page.field("timing", " · ".join(t for t in timing if t))
    page.field("model", transcript.model_line(r) or "-")
    protocol = [
        r["dialect"],
        f"provider {r['provider']}" if r["provider"] else "",
        "streamed" if r["streamed"] else "not streamed",
    ]
    page.field("protocol", " · ".join(p for p in protocol if p))
    port = f":{r['server_port']}" if r["server_port"] else ""
    query = f"?{r['url_query']}" if r["url_query"] else ""
    page.field("upstream", f"{r['http_method'] or ''} {r['server_address'] or ''}{port}{r['url_path'] or ''}{query}")
    for label, name in (
        ("client", "client_address"),
        ("user agent", "user_agent"),
        ("user", "user_id"),
        ("session", "session_id"),
        ("request id", "request_id"),
        ("response id", "response_id"),
        ("task", "task_id"),
        ("api key", "api_key_fingerprint"),
        ("proxy", "proxy_instance"),
    ):
        page.field(label, r[name])
    if r.get("connection_id"):  # one answer of a long-lived stream or WebSocket, or the connection's own record
        turn = f"turn {r['turn']}" if r.get("turn") is not None else "the connection itself (its answers are its turns)"
        page.field("connection", f"{r['connection_id']} · {turn}")


def _request(page: _Page, body: Any) -> None:
    page.heading("request")
    messages, tools = extract_messages(body), declared_tools(body)
    if not messages and not tools:  # a shape no dialect has: as it is
        page.text(transcript.body_text(body), indent=2)
    for message in messages:
        page.label(message.role)
        page.text(message.text, indent=4)
    if tools:
        page.label("tools")
        for tool in tools:
            description = " ".join(tool.description.split())  # one line, as the list shows it
            page.text(f"{tool.name} - {description}" if description else tool.name, indent=4)


def _output(page: _Page, r: dict[str, Any]) -> None:
    page.heading("output")
    if not transcript.has_output(r):
        page.text("(none)", indent=2)
    choices = transcript.choices(r)
    for choice in choices:
        _choice(page, choice, numbered=len(choices) > 1)
    if r["delivered_text"] is not None:
        page.heading("delivered to the client (a content filter changed the output)")
        page.text(r["delivered_text"], indent=2)
    calls = transcript.tool_calls(r)
    if calls:
        page.heading("tool calls")
        for call in calls:
            shown_id = " " + page.style.dim(f"id {one_line(call.id)}") if call.id else ""  # Gemini's have none
            page.lines.append(f"  {one_line(call.name)}" + shown_id + ("" if call.complete else transcript.CUT_OFF))
            page.text(call.arguments, indent=4)


def _choice(page: _Page, choice: transcript.Choice, *, numbered: bool) -> None:
    label = f"choice {choice.index}" if numbered else ""
    stop = f"finish reason {choice.finish_reason}" if choice.finish_reason else ""
    if label or stop:
        page.label(" · ".join(x for x in (label, stop) if x))
    for text, name in ((choice.reasoning, "reasoning"), (choice.refusal, "refusal")):
        if text:
            page.label(name)
            page.text(text, indent=4)
    if choice.text:
        page.text(choice.text, indent=2)


def _usage(page: _Page, r: dict[str, Any]) -> None:
    page.heading("usage")
    page.text(transcript.usage_line(r), indent=2)
    details = r.get("usage_details")
    if isinstance(details, dict) and details:  # by kind: audio, text, image tokens
        page.text(
            " · ".join(f"{k.removesuffix('_tokens').replace('_', ' ')} {v}" for k, v in details.items()), indent=2
        )
    cost = r.get("cost_usd")
    if isinstance(cost, int | float):  # derived from the usage above (docs/cost.md)
        page.text(f"cost ${cost:.6f} ({r.get('cost_prices') or 'unknown price data'})", indent=2)
    elif r.get("usage_source") == "provider":
        page.text("cost unknown (no price for this provider and model)", indent=2)


def _problems(page: _Page, r: dict[str, Any]) -> None:
    if error := transcript.error_line(r):
        page.heading("error")
        page.text(error, indent=2)
    for title, lines in (
        ("findings", transcript.finding_lines(r["findings"])),
        ("filter verdicts", transcript.verdict_lines(r["verdicts"])),
    ):
        if lines:
            page.heading(title)
            for line in lines:
                page.text(line, indent=2)
    parts = [
        ("events", "event_count"),
        ("bytes to the client", "bytes_to_client"),
        ("bytes from the upstream", "bytes_from_upstream"),
    ]
    page.heading("transfer")
    page.text(" · ".join(f"{r[name]} {label}" for label, name in parts if r[name] is not None) or "-", indent=2)


def _duration(ms: int) -> str:
    return f"{ms} ms" if abs(ms) < 1000 else f"{ms / 1000:.3f} s"
