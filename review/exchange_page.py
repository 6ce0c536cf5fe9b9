"""What the page of one exchange shows, in the order a reviewer reads it.

The pieces are those of ``llm-audit show`` (:mod:`exchange.transcript`,
:mod:`exchange.request`), so the page and the command never disagree on what an
exchange said; this module adds what a page can say in words: each finding's meaning
(:data:`addon.findings.CODES`, the table docs/findings.md is generated from), each filter
verdict as a sentence, and what the client received when a filter stopped the answer.

Never shown: the request and response headers (credential headers are fingerprinted, but
a header no rule knows could still carry a secret); the user agent is, as ``show`` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from addon.findings import CODES
from exchange import transcript
from exchange.request import Message, Tool, declared_tools, extract_messages


@dataclass(frozen=True)
class Explained:
    """A finding or verdict: its code or rule, a sentence, the recorded detail."""

    label: str
    sentence: str
    detail: str = ""


def facts(r: dict[str, Any]) -> list[tuple[str, str]]:
    """The exchange's metadata as (label, value) rows; empty values left out."""
    port = f":{r['server_port']}" if r.get("server_port") else ""
    rows = [
        ("started", _time(r.get("started_at"))),
        ("first chunk", _after(r.get("time_to_first_chunk_ms"))),
        ("ended", _time(r.get("ended_at"))),
        ("duration", _ms(r.get("duration_ms"))),
        ("model", transcript.model_line(r) or ""),
        ("provider", r.get("provider") or ""),
        ("protocol", f"{r['dialect']} · {'streamed' if r.get('streamed') else 'not streamed'}"),
        ("upstream", f"{r.get('http_method') or ''} {r.get('server_address') or ''}{port}{r.get('url_path') or ''}"),
        ("HTTP status", _http_status(r)),
        ("client", r.get("client_address") or ""),
        ("user agent", r.get("user_agent") or ""),
        ("user", r.get("user_id") or ""),
        ("session", r.get("session_id") or ""),
        ("request id", r.get("request_id") or ""),
        ("response id", r.get("response_id") or ""),
        ("task", r.get("task_id") or ""),
        ("API key", r.get("api_key_fingerprint") or ""),
        ("proxy", r.get("proxy_instance") or ""),
    ]
    if r.get("connection_id"):
        turn = f"turn {r['turn']}" if r.get("turn") is not None else "the connection's own record"
        rows.append(("connection", f"{r['connection_id']} · {turn}"))
    return [(label, value.strip()) for label, value in rows if value and value.strip()]


def _time(value: datetime | None) -> str:
    return f"{value:%Y-%m-%d %H:%M:%S}.{value.microsecond // 1000:03d} UTC" if value else ""


def _ms(ms: int | None) -> str:
    if ms is None:
        return ""
    return f"{ms} ms" if abs(ms) < 1000 else f"{ms / 1000:.3f} s"


def _after(ms: int | None) -> str:
    return f"after {_ms(ms)}" if ms is not None else "no response body"


def _http_status(r: dict[str, Any]) -> str:
    client, upstream = r.get("client_status"), r.get("http_status")
    if client is not None and client != upstream:
        return f"{client} to the client; the upstream sent {upstream}"
    return str(upstream) if upstream else ""


def messages(r: dict[str, Any]) -> list[Message]:
    return extract_messages(r.get("request_body"))


def tools(r: dict[str, Any]) -> list[Tool]:
    return declared_tools(r.get("request_body"))


def raw_request(r: dict[str, Any]) -> str | None:
    """The request body as it is, when no dialect's shape fits it (no messages, no tools)."""
    if messages(r) or tools(r):
        return None
    return transcript.body_text(r.get("request_body"))


def received(r: dict[str, Any]) -> str | None:
    """What the client received when it differs from what the upstream sent, in words."""
    if r.get("delivered_text") is not None:
        return "A content filter changed the answer: the client received only the text below."
    if r.get("status") == "blocked":
        status = r.get("client_status") or r.get("http_status")
        sent = f" (HTTP {status})" if status else ""
        return (
            f"A content filter blocked this exchange: the client received the API's filtered outcome{sent} "
            "and none of the blocked text."
        )
    return None


def findings(r: dict[str, Any]) -> list[Explained]:
    out = []
    for f in r.get("findings") or ():
        if isinstance(f, dict):
            code = str(f.get("code"))
            out.append(
                Explained(code, CODES.get(code, "A finding this version does not know."), str(f.get("detail") or ""))
            )
    return out


_ACTIONS = {
    "block": "blocked",
    "flag": "flagged",
    "allow": "allowed",
}


def verdicts(r: dict[str, Any]) -> list[Explained]:
    """Each content-filter verdict as a sentence: which rule did what, to what, and why."""
    out = []
    for v in r.get("verdicts") or ():
        if not isinstance(v, dict):
            continue
        done = _ACTIONS.get(str(v.get("action")), f"acted on ({v.get('action')})")
        what = "the answer" if transcript.is_output_verdict(v) else "the request"
        reason = f", because: {v['reason']}" if v.get("reason") else ""
        where = [str(x) for x in (v.get("filter"), v.get("location")) if x]
        if v.get("position") is not None:
            where.append(f"at character {v['position']}")
        if v.get("match_hash"):
            where.append(f"match {v['match_hash']}")
        out.append(
            Explained(str(v.get("rule_id")), f"The rule {v.get('rule_id')} {done} {what}{reason}.", " · ".join(where))
        )
    return out
