"""Inference exchanges inside mitmproxy's own UIs: the "LLM stream" content view and the
flow list.

mitmweb, the console and ``mitmdump --flow-detail 3`` show message bodies through
content views. "LLM stream" renders an inference exchange of any dialect as a person
reads it:

- a request body: the dialect, model, user and session, the declared tools and the
  conversation as sent (system instructions, user and assistant turns, tool calls and
  results);
- a response body, streamed or not: the model, each choice's answer, reasoning and
  refusal, tool calls with pretty-printed arguments, usage, the error, and the audit's
  status, findings and content-filter verdicts.

What each part of the exchange says (a choice, a tool call, the usage, a verdict) is
written by :mod:`exchange.transcript`, as for ``llm-audit show``: the two views lay it
out differently but cannot disagree. The response is read by the audit's own pipeline (dialect registry, normalizer,
:class:`~addon.auditor.StreamAuditor`, :class:`~addon.record.ExchangeRecord`), so the
view and the database agree on what an exchange said, and no dialect is known here.
What only the proxy knew at the time (the record id and status, findings about the
upstream's bytes, filter verdicts) is left in ``flow.metadata["llm_audit"]`` by
:func:`annotate` when the exchange ends; it is saved with the flow (``-w``) too.

mitmproxy keeps no body of a streamed response: the addon hands back a bounded copy of
what the client received when the stream ends (``llm_audit_view_bytes``).

:func:`annotate` also marks the flow for the flow list: a comment such as
``gpt-4o · 12→34 tok · completed`` and, for a blocked exchange, the ⛔ marker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mitmproxy import contentviews, http
from mitmproxy.contentviews import Metadata
from mitmproxy.options import Options

from addon.auditor import SNIFF_LIMIT, StreamAuditor, summary_into_record
from addon.dialects import UNREADABLE, Dialect, RequestSummary, RequestView, media_type, parse_json_body
from addon.dialects.registry import detect_request, detect_response
from addon.framing import select
from addon.framing.sse import SSEParser
from addon.hosts import server_name
from addon.mitm.flow_record import detect_by_line, line_views, request_content
from addon.record import OUTCOME_COMPLETE, ExchangeRecord, Status
from exchange import transcript
from exchange.request import declared_tools, extract_messages

METADATA_KEY = "llm_audit"
BLOCKED_MARKER = ":no_entry:"  # ⛔ in mitmweb and the console
VIEW_NAME = "LLM stream"
LABEL = 12  # width of a field label


class LLMStreamContentview(contentviews.Contentview):
    """The "LLM stream" view; chosen automatically for every inference exchange."""

    @property
    def name(self) -> str:
        return VIEW_NAME

    def render_priority(self, data: bytes, metadata: Metadata) -> float:
        """Above the JSON view (1) for an inference exchange's messages; not offered for others."""
        flow, message = metadata.flow, metadata.http_message
        if not isinstance(flow, http.HTTPFlow) or message is None:
            return -1
        if _request_dialect(flow.request)[0] is not None:
            return 2
        response = flow.response
        return (
            2 if message is response and response is not None and _sniffed_dialect(response, data) is not None else -1
        )

    def prettify(self, data: bytes, metadata: Metadata) -> str:
        flow, message = metadata.flow, metadata.http_message
        if not isinstance(flow, http.HTTPFlow) or message is None:
            raise ValueError("not an HTTP message")
        audit = flow.metadata.get(METADATA_KEY)
        audit = audit if isinstance(audit, dict) else {}
        if message is flow.request:
            return request_text(flow.request, audit)
        return response_text(flow, data, audit)


def register() -> None:
    """Make the view available in mitmproxy's UIs (registering again replaces it)."""
    contentviews.add(LLMStreamContentview)


# -- reading the exchange -----------------------------------------------------------------------


def _request_dialect(request: http.Request) -> tuple[Dialect | None, RequestView, Callable[[], Any]]:
    """The dialect that recognises this request (as the proxy detects it), the request
    line and a parser of the body (parsed once, on demand)."""
    parsed: list[Any] = []

    def body() -> Any:
        if not parsed:
            data = request_content(request)[0]  # (as the proxy reads it)
            parsed.append(parse_json_body(data)[0] if data is not None else UNREADABLE)
        return parsed[0]

    lines = line_views(request)
    found = detect_by_line(lines, lambda view: detect_request(view, body))
    if found is None:
        return None, lines[0][0], body
    return found[0], found[1][0], body


def _sniffed_dialect(response: http.Response, data: bytes) -> Dialect | None:
    """The dialect that claims an event stream by its first event (the request told nothing)."""
    if media_type(response.headers.get("content-type", ""))[0] != "text/event-stream":
        return None
    events = SSEParser(max_event_bytes=SNIFF_LIMIT).feed(data[:SNIFF_LIMIT])
    return detect_response(events[0]) if events else None


def read_response(flow: http.HTTPFlow, data: bytes) -> ExchangeRecord:
    """The exchange record of a response body (decoded), read as the proxy reads it."""
    response = flow.response
    if response is None:
        raise ValueError("no response")
    dialect, view, body = _request_dialect(flow.request)
    dialect = dialect or _sniffed_dialect(response, data)
    if dialect is None:
        raise ValueError("not an inference exchange")
    summary = dialect.summarize(body(), view)
    record = ExchangeRecord(
        dialect=dialect.name,
        provider=dialect.provider_for(server_name(flow.request.host, flow.client_conn.sni, flow.request.host_header)),
        http_status=response.status_code,
    )
    summary_into_record(record, summary)
    normalizer = dialect.normalizer(summary)
    # The whole body is in memory already: no event needs skipping to bound it.
    auditor = StreamAuditor(
        record,
        normalizer,
        None,
        max(len(data) + 1, 1024),
        framing=select(response.headers.get("content-type", ""), response.status_code, normalizer.framing),
        max_record_bytes=len(data) + 1,
    )
    auditor.feed(data)
    auditor.end()
    record.finish(OUTCOME_COMPLETE)
    return record


# -- the text -------------------------------------------------------------------------------------


class _Text:
    """Lines of labelled fields and indented sections."""

    def __init__(self, title: str) -> None:
        self.lines = [title]

    def field(self, label: str, value: str | None) -> None:
        if value:
            self.lines.append(f"{label:<{LABEL}}{value}")

    def section(self, title: str, text: str, indent: int = 2) -> None:
        self.lines += ["", title]
        self.block(text, indent)

    def block(self, text: str, indent: int) -> None:
        self.lines += [" " * indent + line for line in (text.splitlines() or [""])]

    def __str__(self) -> str:
        return "\n".join(self.lines)


def request_text(request: http.Request, audit: dict[str, Any]) -> str:
    """The request as sent: model, metadata, declared tools and the conversation."""
    dialect, view, body = _request_dialect(request)
    if dialect is None:
        raise ValueError("not an inference request")
    summary = dialect.summarize(body(), view)
    text = _Text(f"{dialect.name} request")
    text.field("model", " · ".join(filter(None, [summary.model, _streaming(summary)])))
    text.field("user", summary.user_id)
    text.field("session", summary.session_id)
    text.field("request id", summary.request_id)
    text.field("tools", ", ".join(dict.fromkeys(tool.name for tool in declared_tools(body()))))
    messages = extract_messages(body())
    for message in messages:
        text.section(message.role, message.text)
    if not messages:
        text.section("body", transcript.body_text(body()))
    _verdicts(text, [v for v in audit.get("verdicts") or () if not transcript.is_output_verdict(v)])
    return str(text)


def response_text(flow: http.HTTPFlow, data: bytes, audit: dict[str, Any]) -> str:
    """The response as the audit reads it: answer, reasoning, tool calls, usage, problems."""
    record = read_response(flow, data)
    row = record.to_row()
    text = _Text(f"{record.dialect} response · {audit.get('status') or record.status}")
    text.field("model", transcript.model_line(row))
    text.field("record", f"{audit['id']} (llm-audit show {audit['id'][:12]})" if audit.get("id") else None)
    text.field("usage", transcript.usage_line(row))
    text.field("response id", row["response_id"])
    _choices(text, transcript.choices(row))
    for call in transcript.tool_calls(row):
        title = f"tool call {call.name}" + (f" ({call.id})" if call.id else "")
        text.section(title + ("" if call.complete else transcript.CUT_OFF), call.arguments)
    if error := transcript.error_line(row):
        text.section("error", error)
    if findings := transcript.finding_lines(audit["findings"] if "findings" in audit else row["findings"]):
        text.section("findings", "\n".join(findings))
    _verdicts(text, [v for v in audit.get("verdicts") or () if transcript.is_output_verdict(v)])
    return str(text)


def _choices(text: _Text, choices: list[transcript.Choice]) -> None:
    for choice in choices:
        suffix = f" (choice {choice.index})" if len(choices) > 1 else ""
        for part, said in (("reasoning", choice.reasoning), ("refusal", choice.refusal)):
            if said:
                text.section(part + suffix, said)
        if choice.text or not (choice.reasoning or choice.refusal):
            text.section("answer" + suffix, choice.text)
        if choice.finish_reason:
            text.block(f"(finish reason: {choice.finish_reason})", 2)


def _verdicts(text: _Text, verdicts: list[dict[str, Any]]) -> None:
    if lines := transcript.verdict_lines(verdicts):
        text.section("filter verdicts", "\n".join(lines))


def _streaming(summary: RequestSummary) -> str | None:
    return None if summary.stream is None else "stream" if summary.stream else "no stream"


# -- the flow list -------------------------------------------------------------------------------


def annotate(flow: http.HTTPFlow, record: ExchangeRecord) -> None:
    """Leave the audit's view of a finished exchange on its flow: the metadata the content
    view shows, a one-line comment for the flow list, the ⛔ marker when blocked.

    A comment the user wrote meanwhile is kept.
    """
    flow.metadata[METADATA_KEY] = {
        "id": record.id,
        "status": record.status,
        "findings": list(record.findings),
        "verdicts": list(record.verdicts),
    }
    if not flow.comment:
        flow.comment = summary_line(record)
    if record.status == Status.BLOCKED:
        flow.marked = BLOCKED_MARKER


def summary_line(record: ExchangeRecord) -> str:
    """``gpt-4o · 12→34 tok · completed``: model, tokens (when reported), status."""
    parts = [record.response_model or record.request_model or record.dialect]
    tokens_in, tokens_out = record.usage.get("input_tokens"), record.usage.get("output_tokens")
    if tokens_in is not None or tokens_out is not None:
        parts.append(f"{_count(tokens_in)}→{_count(tokens_out)} tok")
    rule = next((v.get("rule_id") for v in record.verdicts if v.get("action") == "block"), None)
    parts.append(f"blocked by {rule}" if record.status == Status.BLOCKED and rule else record.status)
    return " · ".join(parts)


def _count(n: int | None) -> str:
    return "?" if n is None else str(n)


def show_comment_column(options: Options) -> None:
    """In mitmweb, add the Comment column to the flow list, unless the user chose the
    columns (``web_columns``) themselves."""
    if "web_columns" in options and not options.has_changed("web_columns"):
        options.update(web_columns=[*options.web_columns, "comment"])
