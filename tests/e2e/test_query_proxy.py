"""``llm-audit`` querying exchanges a real mitmdump recorded, on SQLite and PostgreSQL.

A proxy with a rules file records a handful of real exchanges from the mock upstream
(llm-stream, OpenAI Chat with reasoning and a tool call, Anthropic with thinking, an
upstream error, a stream without its terminal event, a request a rule blocks); then
the real console script lists, shows, counts and exports them, and its output is parsed
back and checked against the rows. The filters run in this process through
``cli.main.main`` (the same code without the script's start-up each time), which
keeps the module fast.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import orjson
import pytest
from conftest import BACKENDS, BIN, ROOT, Proxy, Upstream, new_database, start_proxy

from cli import main as cli

pytestmark = pytest.mark.e2e

RULES = ROOT / "tests" / "fixtures" / "filters_e2e_rules.toml"  # blocks "Project Nightjar"
LLM_STREAM = {"content-type": "application/llm-request+json"}


@dataclass
class Recorded:
    """The proxy and the exchange id of each recorded case, by name."""

    proxy: Proxy
    ids: dict[str, str]

    def llm_audit(self, *args: str) -> subprocess.CompletedProcess:
        environ = {k: v for k, v in os.environ.items() if k != "LLM_AUDIT_DB"} | {"COLUMNS": "120"}
        return subprocess.run(
            [str(BIN / "llm-audit"), "--db", self.proxy.db_url, *args],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
            env=environ,
        )

    def json(self, *args: str) -> list[dict]:
        proc = self.llm_audit(*args, "--format", "jsonl")
        assert (proc.returncode, proc.stderr) == (0, ""), proc
        return [orjson.loads(line) for line in proc.stdout.splitlines()]

    def names(self, *args: str) -> set[str]:
        """Which cases ``llm-audit list ARGS`` finds (run in this process)."""
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert cli.main(["--db", self.proxy.db_url, "list", "--format", "jsonl", *args]) == 0
        by_id = {id: name for name, id in self.ids.items()}
        return {by_id[orjson.loads(line)["id"]] for line in out.getvalue().splitlines()}


def whole_ms(delta: timedelta) -> int:
    """Milliseconds rounded half up, as the view rounds them."""
    return (delta // timedelta(microseconds=1) + 500) // 1000


def send(proxy: Proxy, up: Upstream, path: str, body: dict, scenario: str = "", headers: dict | None = None) -> str:
    """One request through the proxy; returns the id of its final record."""
    mock_id = uuid.uuid4().hex
    with proxy.client() as client:
        client.post(
            f"{up.url}{path}",
            content=orjson.dumps(body),
            headers={"x-mock": scenario, "x-mock-id": mock_id, **(headers or {})},
        )
    return proxy.mock_row(mock_id)["id"]


def llm_stream(user: str, text: str, **metadata: str) -> dict:
    return {
        "version": "1.0",
        "stream": True,
        "model": "m-alpha",
        "metadata": {"user_id": user, **metadata},
        "messages": [{"role": "user", "content": text}],
    }


@pytest.fixture(scope="module", params=BACKENDS)
def recorded(request, tmp_path_factory, upstreams) -> Iterator[Recorded]:
    tmp = tmp_path_factory.mktemp(f"query-{request.param}")
    proxy = start_proxy(
        tmp, "--set", f"llm_rules={RULES}", upstream_ca=upstreams["h2"].ca, **new_database(request, request.param, tmp)
    )
    up = upstreams["h1"]
    chat = {
        "model": "gpt-4o", "stream": True, "stream_options": {"include_usage": True}, "user": "bob",
        "messages": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Weather in Vienna?"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Current weather",
                                                    "parameters": {"type": "object"}}}],
    }  # fmt: skip
    claude = {
        "model": "claude-mock-1",
        "max_tokens": 100,
        "stream": True,
        "metadata": {"user_id": "alice"},
        "system": "You are terse.",
        "messages": [{"role": "user", "content": "Think, then greet."}],
    }
    try:
        ids = {
            "hello": send(
                proxy,
                up,
                "/v1/llm/stream",
                llm_stream("alice", "Hello there", session_id="s-1"),
                "events=3&text=General Kenobi",
                LLM_STREAM,
            ),
            "tool": send(proxy, up, "/v1/chat/completions", chat, "reasoning&tool=get_weather"),
            "thinking": send(
                proxy, up, "/v1/messages", claude, "thinking&events=2", {"anthropic-version": "2023-06-01"}
            ),
            "error": send(
                proxy,
                up,
                "/v1/llm/stream",
                llm_stream("carol", "fail please"),
                "error=overloaded&error_after=1",
                LLM_STREAM,
            ),
            "cut": send(proxy, up, "/v1/llm/stream", llm_stream("carol", "end early"), "no_end", LLM_STREAM),
            "blocked": send(
                proxy,
                up,
                "/v1/chat/completions",
                {
                    "model": "gpt-4o",
                    "user": "bob",
                    "messages": [{"role": "user", "content": "All about Project Nightjar, please."}],
                },
            ),
        }
        yield Recorded(proxy, ids)
    finally:
        proxy.process.stop()


def test_list_formats_parse_back_to_the_recorded_rows(recorded):
    rows = recorded.json("list")
    assert {row["id"] for row in rows} == set(recorded.ids.values())
    assert [row["started_at"] for row in rows] == sorted((row["started_at"] for row in rows), reverse=True)
    as_json = orjson.loads(recorded.llm_audit("list", "--format", "json").stdout)
    as_csv = list(csv.DictReader(io.StringIO(recorded.llm_audit("list", "--format", "csv").stdout)))
    assert as_json == rows and [r["id"] for r in as_csv] == [r["id"] for r in rows]

    db = {r["id"]: r for r in recorded.proxy.rows()}
    for row, csv_row in zip(rows, as_csv, strict=True):
        stored = db[row["id"]]
        assert (row["status"], row["request_model"], row["user_id"]) == (
            stored["status"],
            stored["request_model"],
            stored["user_id"],
        )
        assert row["output_text"] == stored["output_text"] == (csv_row["output_text"] or stored["output_text"])
        assert row["request_body"] == stored["request_body"]
        assert row["time_to_first_chunk_ms"] == (
            None if stored["first_chunk_at"] is None else whole_ms(stored["first_chunk_at"] - stored["started_at"])
        )
        assert csv_row["status"] == row["status"] and csv_row["started_at"] == row["started_at"]
    tool = next(r for r in rows if r["id"] == recorded.ids["tool"])
    assert (tool["tool_call_count"], tool["provider"], tool["dialect"]) == (1, "openai", "openai-chat")
    assert tool["input_tokens"] is not None and tool["total_tokens"] == tool["input_tokens"] + tool["output_tokens"]

    table = recorded.llm_audit("list")
    assert table.returncode == 0 and table.stdout.startswith("time (UTC)") and "\x1b" not in table.stdout
    assert recorded.ids["hello"][:12] in table.stdout and "General Kenobi" in table.stdout


def test_filters_find_the_recorded_cases(recorded):
    assert recorded.names("--user", "alice") == {"hello", "thinking"}
    assert recorded.names("--user", "bob", "--model", "gpt-4o") == {"tool", "blocked"}
    assert recorded.names("--provider", "anthropic") == {"thinking"}
    assert recorded.names("--dialect", "llm-stream", "--session", "s-1") == {"hello"}
    assert recorded.names("--status", "failed", "--status", "upstream_aborted") == {"error", "cut"}
    assert recorded.names("--finding", "missing_stream_end") == {"cut"}
    assert recorded.names("--blocked") == {"blocked"}
    assert recorded.names("--contains", "general KENOBI") == {"hello"}  # in the output
    assert recorded.names("--contains", "weather in vienna") == {"tool"}  # in the request
    assert recorded.names("--client", "127.0.0.1", "--since", "1h") == set(recorded.ids)
    assert recorded.names("--until", "1h") == set()
    assert len(recorded.names("--limit", "2")) == 2


def test_show_reads_like_the_exchange_and_json_is_the_record(recorded):
    tool = recorded.llm_audit("show", recorded.ids["tool"][:10])
    assert tool.returncode == 0, tool.stderr
    for expected in (
        "completed (HTTP 200)",
        "model       gpt-4o",
        "user        bob",
        "first chunk after ",
        "\nrequest\n  system\n    Answer briefly.\n  user\n    Weather in Vienna?",
        "  tools\n    get_weather - Current weather",
        "\n  reasoning\n    ",
        "\ntool calls\n  get_weather id ",
        '\n      "city": "Vienna"\n',
        "\nusage\n  input ",
    ):
        assert expected in tool.stdout, (expected, tool.stdout)
    blocked = recorded.llm_audit("show", recorded.ids["blocked"]).stdout
    assert "blocked (HTTP 400)" in blocked and "\nfilter verdicts\n  block  no-project-nightjar  " in blocked
    cut = recorded.llm_audit("show", recorded.ids["cut"]).stdout
    assert "upstream_aborted" in cut and "\nfindings\n  missing_stream_end" in cut

    record = orjson.loads(recorded.llm_audit("show", recorded.ids["thinking"], "--format", "json").stdout)
    [stored] = recorded.proxy.rows("id = ?", (recorded.ids["thinking"],))
    assert record["output"] == stored["output"] and record["output"]["choices"][0]["reasoning"]
    assert record["request_headers"] == stored["request_headers"] and record["verdicts"] == stored["verdicts"]
    assert record["user_id"] == "alice" and record["duration_ms"] >= record["time_to_first_chunk_ms"] >= 0


def test_stats_count_what_was_recorded(recorded):
    by_user = {r["user"]: r for r in recorded.json("stats", "--by", "user")}
    assert {user: r["exchanges"] for user, r in by_user.items()} == {"alice": 2, "bob": 2, "carol": 2}
    assert (by_user["bob"]["blocks"], by_user["carol"]["errors"]) == (1, 1)
    assert by_user["alice"]["time_to_first_chunk_p50_ms"] is not None
    assert by_user["alice"]["input_tokens"] == sum(
        r["input_tokens"] or 0 for r in recorded.proxy.rows("user_id = ?", ("alice",))
    )
    by_day_status = recorded.json("stats", "--by", "day", "--by", "status", "--since", "1d")
    assert sum(r["exchanges"] for r in by_day_status) == 6
    assert {r["status"] for r in by_day_status} == {"completed", "failed", "upstream_aborted", "blocked"}


def test_export_streams_every_exchange_oldest_first(recorded):
    exported = recorded.llm_audit("export", "--since", "1d")
    assert (exported.returncode, exported.stderr) == (0, "")  # piped: no progress bar
    rows = [orjson.loads(line) for line in exported.stdout.splitlines()]
    assert rows == recorded.json("list")[::-1]
    as_csv = recorded.llm_audit("export", "--format", "csv", "--user", "carol").stdout
    assert [r["id"] for r in csv.DictReader(io.StringIO(as_csv))] == [recorded.ids["error"], recorded.ids["cut"]]


def test_errors_are_one_line_with_status_2(recorded):
    for args, fragment in (
        (["show", "f" * 32], "no exchange with the id"),
        (["stats", "--since", "2026-02-30"], "is not a valid date"),
    ):
        proc = recorded.llm_audit(*args)
        assert (proc.returncode, proc.stdout) == (2, ""), proc
        assert len(proc.stderr.splitlines()) == 1 and fragment in proc.stderr, proc.stderr
