"""``show``'s page: the whole exchange, request to outcome, wrapped to the terminal."""

from __future__ import annotations

from typing import Any

import orjson

from addon.filters.messages import extract_messages
from cli.terminal import Style, display_width, one_line, timestamp, visible, wrap


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
    page.field("started", f"{timestamp(r['started_at'], precise=True)} UTC" if r["started_at"] else None)
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
