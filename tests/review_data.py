"""Audit databases for the tests of ``llm-audit serve``: records written by the real
writer (:class:`storage.writer.AuditWriter`, so they are sealed into a hash chain as the
proxy seals them), with hostile content where a reviewer would read it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from addon.record import ExchangeRecord
from storage.database import open_engine
from storage.spool import Spool
from storage.writer import AuditWriter

INSTANCE = "review-test"
# What an answer may hold that a page must show as text: markup, a script, a markdown
# link, an ANSI escape and a right-to-left override.
HOSTILE = (
    '<script>alert("pwned")</script><img src=x onerror=alert(1)>'
    " [click me](javascript:alert(2)) \x1b[31mred\x1b[0m evil\u202etxt.exe"
)


def at(day: int, hour: int = 10) -> datetime:
    return datetime(2026, 3, day, hour, tzinfo=UTC)


def exchange(id: str, started: datetime, **values: Any) -> dict[str, Any]:
    """A final row as the proxy writes it: every column of a real record, then ``values``."""
    base = ExchangeRecord(dialect="openai-chat", proxy_instance=INSTANCE, started_at=started.timestamp()).to_row()
    base.update(
        id=id,
        status="completed",
        provider="openai",
        streamed=True,
        started_at=started,
        first_chunk_at=started + timedelta(milliseconds=120),
        ended_at=started + timedelta(milliseconds=1500),
        request_model="gpt-4o",
        client_address="10.0.0.1",
        http_method="POST",
        server_address="api.openai.com",
        url_path="/v1/chat/completions",
        http_status=200,
        request_headers={"user-agent": "test-agent/1", "authorization": "sha256:0123456789abcdef"},
        api_key_fingerprint="sha256:0123456789abcdef",
    )
    return base | values


ROWS = [
    exchange(
        "alice-1",
        at(1),
        user_id="alice",
        request_body={
            "model": "gpt-4o",
            "messages": [
                {"role": "system", "content": "Answer in one sentence."},
                {"role": "user", "content": "What is the Capital of France?"},
            ],
            "tools": [{"type": "function", "function": {"name": "lookup", "description": "Look a city up"}}],
        },
        output_text="Paris is the capital.",
        output={
            "choices": [
                {
                    "index": 0,
                    "text": "Paris is the capital.",
                    "reasoning": "France: Paris.",
                    "finish_reason": "tool_calls",
                }
            ],
            "tool_calls": [{"id": "call_1", "name": "lookup", "arguments": '{"city":"Paris"}', "complete": True}],
        },
        tool_calls=[{"id": "call_1", "name": "lookup", "arguments": '{"city":"Paris"}'}],
        input_tokens=100,
        output_tokens=20,
        usage_source="provider",
    ),
    exchange(
        "alice-2",
        at(2),
        user_id="alice",
        request_model="claude-x",
        provider="anthropic",
        dialect="anthropic-messages",
        status="failed",
        http_status=529,
        error_code="overloaded",
        error_message="Overloaded",
        findings=[{"code": "request_invalid_json", "detail": "not JSON"}],
        request_body="this is { not json",
    ),
    exchange(
        "bob-1",
        at(3),
        user_id="bob",
        status="blocked",
        error_code="content_filtered",
        client_status=400,
        request_body={"messages": [{"role": "user", "content": "the secret plan nightjar"}]},
        verdicts=[{"action": "block", "rule_id": "no-nightjar", "reason": "internal code name", "filter": "rules"}],
    ),
    exchange(
        "bob-2",
        at(4),
        user_id="bob",
        output_text="Nothing to see here, Project Nightjar",
        output={"choices": [{"index": 0, "text": "Nothing to see here, Project Nightjar"}], "tool_calls": []},
        delivered_text="Nothing to see here, ",
        verdicts=[
            {"action": "block", "rule_id": "no-nightjar", "reason": "code name", "location": "output", "position": 21}
        ],
        status="blocked",
        input_tokens=50,
        output_tokens=5,
        usage_source="provider",
    ),
    exchange(
        "evil-1",
        at(5),
        user_id="mallory",
        dialect="llm-stream",
        provider=None,
        request_model="m-local",
        status="upstream_aborted",
        request_body={"messages": [{"role": "user", "content": HOSTILE}]},
        output_text=HOSTILE,
        output={"choices": [{"index": 0, "text": HOSTILE}], "tool_calls": []},
        findings=[{"code": "missing_stream_end", "detail": HOSTILE}],
        input_tokens=10,
        output_tokens=1,
        usage_source="provider",
    ),
]
NEWEST_FIRST = ["evil-1", "bob-2", "bob-1", "alice-2", "alice-1"]


def fill(url: str, spool_dir: Path, rows: list[dict[str, Any]] = ROWS) -> None:
    """Write ``rows`` through the real writer into ``url`` (its schema created as the proxy creates it)."""
    engine = open_engine(url)
    writer = AuditWriter(engine, Spool(spool_dir / "spool.jsonl"), INSTANCE)
    for row in rows:
        writer.submit(row)
    writer.close()
    engine.dispose()
