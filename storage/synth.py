"""A synthetic audit database, for measuring the queries at scale (``scripts/synth-db``).

Rows look like a year of a team's traffic: six dialects and their providers, a score of
models, a few hundred users on their own workstations (some users far busier than
others), mostly completed exchanges with some failures, aborts and blocks, token counts
and timings from skewed distributions, request bodies with a conversation, answers of
a few dozen words. Times increase with the rows, as the proxy writes them, and the
same seed gives the same database.

Rows go in with ``executemany`` in batches (10,000 by default), one transaction each,
through the same schema and migrations as the proxy's, so the indexes are the real ones.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import insert

from storage.database import DatabaseError, open_engine
from storage.schema import exchanges

# dialect: (share, [(provider, server), ...], models)
DIALECTS: dict[str, tuple[float, list[tuple[str | None, str]], list[str]]] = {
    "openai-chat": (0.40, [("openai", "api.openai.com"), ("azure.ai.openai", "corp.openai.azure.com"),
                           ("openrouter", "openrouter.ai")], ["gpt-4o", "gpt-4o-mini", "gpt-4.1", "o3-mini", "o4-mini"]),
    "anthropic-messages": (0.25, [("anthropic", "api.anthropic.com")],
                           ["claude-sonnet-4-5", "claude-opus-4-1", "claude-haiku-4-5"]),
    "openai-responses": (0.15, [("openai", "api.openai.com")], ["gpt-5", "gpt-5-mini", "o3"]),
    "gemini": (0.10, [("gcp.gemini", "generativelanguage.googleapis.com"),
                      ("gcp.vertex_ai", "europe-west4-aiplatform.googleapis.com")],
               ["gemini-2.5-pro", "gemini-2.5-flash"]),
    "llm-stream": (0.07, [(None, "llm.internal.example")], ["local-llama-70b", "local-qwen-32b"]),
    "lmsp": (0.03, [("lmsp", "agents.internal.example")], ["agent-large", "agent-small"]),
}  # fmt: skip
PATHS = {
    "openai-chat": "/v1/chat/completions",
    "anthropic-messages": "/v1/messages",
    "openai-responses": "/v1/responses",
    "gemini": "/v1beta/models/gemini:streamGenerateContent",
    "llm-stream": "/v1/llm/stream",
    "lmsp": "/lmsp/v1/responses",
}
STATUSES = [
    ("completed", 0.92),
    ("failed", 0.03),
    ("upstream_aborted", 0.02),
    ("client_aborted", 0.02),
    ("blocked", 0.007),
    ("interrupted", 0.003),
]
USER_AGENTS = [
    "OpenAI/Python 1.99.1",
    "Anthropic/Python 0.70.0",
    "google-genai-sdk/1.40.0",
    "curl/8.5.0",
    "vscode-copilot/1.250",
    "internal-agent/2.3",
]
WORDS = [
    "the", "a", "report", "summary", "customer", "invoice", "contract", "draft", "review", "code", "test",
    "function", "error", "log", "data", "table", "query", "result", "meeting", "plan", "budget", "risk", "policy",
    "compliance", "model", "answer", "question", "Vienna", "quarter", "revenue", "forecast", "migration",
    "database", "server", "deploy", "release", "ticket", "incident",
]  # fmt: skip
SYSTEM = "You are a careful assistant for the finance and engineering teams."


def rows(n: int, days: int, seed: int, end: datetime) -> Iterator[dict[str, Any]]:
    """``n`` exchange rows spread over the ``days`` before ``end``, oldest first."""
    rnd = random.Random(seed)
    dialects = list(DIALECTS)
    shares = [DIALECTS[d][0] for d in dialects]
    users = [f"user-{i:03d}" for i in range(1, 301)]
    user_weights = [1 / i for i in range(1, 301)]  # a few heavy users, a long tail
    workstation = {u: f"10.20.{rnd.randrange(1, 30)}.{rnd.randrange(2, 250)}" for u in users}
    start = end - timedelta(days=days)
    step = timedelta(days=days) / max(n, 1)
    for i in range(n):
        dialect = rnd.choices(dialects, shares)[0]
        _, providers, models = DIALECTS[dialect]
        provider, server = rnd.choice(providers)
        model = rnd.choice(models)
        user = rnd.choices(users, user_weights)[0] if rnd.random() > 0.1 else None
        status = rnd.choices([s for s, _ in STATUSES], [w for _, w in STATUSES])[0]
        started = start + step * i + timedelta(milliseconds=rnd.randrange(1000))
        yield _row(
            rnd,
            f"{rnd.getrandbits(128):032x}",
            dialect,
            provider,
            server,
            model,
            user,
            status,
            started,
            workstation.get(user or "", "10.20.0.1"),
        )


def _row(
    rnd: random.Random,
    id: str,
    dialect: str,
    provider: str | None,
    server: str,
    model: str,
    user: str | None,
    status: str,
    started: datetime,
    client: str,
) -> dict[str, Any]:
    prompt = " ".join(rnd.choices(WORDS, k=rnd.randrange(5, 40)))
    answer = " ".join(rnd.choices(WORDS, k=rnd.randrange(20, 80))) if status != "blocked" else ""
    reported = status not in ("blocked", "interrupted") and not (dialect == "openai-chat" and rnd.random() < 0.3)
    input_tokens = int(rnd.lognormvariate(6.5, 1.0)) if reported else None
    output_tokens = int(rnd.lognormvariate(5.5, 0.8)) if reported else None
    ttfc = None if status in ("blocked", "interrupted") else rnd.lognormvariate(-0.9, 0.6)
    duration = (ttfc or 0.01) + (output_tokens or 50) * rnd.uniform(0.005, 0.03)
    failed = status == "failed"
    return {
        "id": id, "status": status, "dialect": dialect, "provider": provider,
        "started_at": started,
        "first_chunk_at": started + timedelta(seconds=ttfc) if ttfc is not None else None,
        "ended_at": started + timedelta(seconds=duration) if status != "interrupted" else None,
        "server_address": server, "server_port": 443, "http_method": "POST", "url_path": PATHS[dialect],
        "http_version": "HTTP/1.1", "http_status": rnd.choice((429, 500, 503)) if failed else 200,
        "client_address": client, "proxy_instance": "proxy-1", "api_key_fingerprint": f"sha256:{id[:16]}",
        "request_headers": {"content-type": "application/json", "user-agent": rnd.choice(USER_AGENTS)},
        "response_headers": {"content-type": "text/event-stream"},
        "request_model": model, "response_model": model, "response_id": f"resp_{id[:20]}",
        "request_id": None, "user_id": user, "session_id": f"s-{id[:6]}" if rnd.random() < 0.5 else None,
        "streamed": True,
        "request_body": {"model": model, "stream": True, "messages": [{"role": "system", "content": SYSTEM},
                                                                       {"role": "user", "content": prompt}]},
        "output_text": answer, "output": {"choices": [{"index": 0, "finish_reason": "stop"}],
                                          "tool_calls": []},
        "tool_calls": [], "finish_reasons": ["stop"] if status == "completed" else [],
        "input_tokens": input_tokens, "output_tokens": output_tokens,
        "cache_read_input_tokens": int(input_tokens * rnd.random() * 0.5) if input_tokens else None,
        "cache_write_input_tokens": None,
        "reasoning_output_tokens": int(output_tokens * 0.3) if output_tokens and model.startswith("o") else None,
        "usage_source": "provider" if reported else "none",
        "error_code": ("content_filtered" if status == "blocked" else "rate_limit_exceeded" if failed else None),
        "error_message": "blocked by rule credentials" if status == "blocked" else "try again later" if failed else None,
        "findings": [{"code": "missing_stream_end", "detail": "the body ended without [DONE]"}]
        if status == "upstream_aborted" else [],
        "verdicts": [{"action": "block", "rule_id": "credentials", "reason": "a credential in the prompt",
                      "filter": "rules", "position": 12, "match_hash": "sha256:0123456789abcdef",
                      "location": "messages[1]"}] if status == "blocked" else [],
        "event_count": rnd.randrange(5, 200), "replayed_events": 0,
        "bytes_to_client": rnd.randrange(500, 50_000), "bytes_from_upstream": None, "delivered_text": None,
    }  # fmt: skip


def fill(url: str, n: int, *, days: int = 365, seed: int = 1, batch: int = 10_000, quiet: bool = False) -> int:
    """Add ``n`` synthetic exchanges to the database at ``url`` (schema upgraded first)."""
    engine = open_engine(url)
    written, pending, started = 0, [], time.monotonic()
    try:
        for row in rows(n, days, seed, datetime.now(UTC)):
            pending.append(row)
            if len(pending) == batch:
                written += _insert(engine, pending)
                pending = []
                if not quiet:
                    print(f"\r{written}/{n} rows, {time.monotonic() - started:.0f} s", end="", file=sys.stderr)
        written += _insert(engine, pending)
    finally:
        engine.dispose()
    if not quiet:
        print(f"\r{written}/{n} rows in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return written


def _insert(engine, batch: list[dict[str, Any]]) -> int:
    if batch:
        with engine.begin() as conn:
            conn.execute(insert(exchanges), batch)
    return len(batch)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/synth-db", description="Fill an audit database with synthetic exchanges."
    )
    parser.add_argument("--db", required=True, metavar="URL", help="SQLAlchemy URL (rows are added to what is there)")
    parser.add_argument("--rows", type=int, default=1_000_000, help="exchanges to add (default: 1000000)")
    parser.add_argument("--days", type=int, default=365, help="spread over the last N days (default: 365)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (default: 1)")
    args = parser.parse_args(argv)
    try:
        fill(args.db, args.rows, days=args.days, seed=args.seed)
    except DatabaseError as e:
        print(f"synth-db: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
