"""``llm-audit list``, ``show``, ``stats`` and ``export`` against real SQLite files and PostgreSQL.

Rows are written with SQLAlchemy as the proxy's writer would, one small data set per
backend with a known answer to every question. Most commands run in-process through
:func:`cli.main.main` (the same code as the console script, without its half-second
start-up); what depends on the process (exit statuses, one-line errors, a terminal's
colours, piped output) runs the real ``llm-audit`` as a subprocess.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import pty
import random
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
from sqlalchemy import insert, select

from cli import main as cli
from cli.formats import Progress
from cli.terminal import display_width, visible
from storage.database import open_engine
from storage.query import FIELDS, STATS_FIELDS, Filters, iter_exchanges
from storage.schema import ANSWER_BYTES, exchange_view, exchanges
from storage.stored import Unreadable
from storage.synth import fill

BIN = Path(sys.executable).parent
NOW = datetime.now(UTC)
ANSI = re.compile(r"\x1b\[")


def at(day: int, hour: int = 10) -> datetime:
    return datetime(2026, 3, day, hour, tzinfo=UTC)


def exchange(id: str, started: datetime, *, ttfc_ms: int | None, took_ms: int | None = 1500, **values) -> dict:
    return {
        "id": id, "status": "completed", "dialect": "openai-chat", "provider": "openai", "streamed": True,
        "started_at": started,
        "first_chunk_at": started + timedelta(milliseconds=ttfc_ms) if ttfc_ms is not None else None,
        "ended_at": started + timedelta(milliseconds=took_ms) if took_ms is not None else None,
        "request_model": "gpt-4o", "client_address": "10.0.0.1", "usage_source": "none",
        "request_headers": {"user-agent": "test-agent/1"}, "findings": [], "verdicts": [], "tool_calls": [],
        "output": {"choices": [], "tool_calls": []},
    } | values  # fmt: skip


def usage(input_tokens: int, output_tokens: int, **more) -> dict:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens, "usage_source": "provider", **more}


# One row per case; the tests below know every answer.
ROWS = [
    exchange(
        "alice-1",
        at(1),
        ttfc_ms=100,
        user_id="alice",
        session_id="s1",
        request_body={
            "model": "gpt-4o",
            "user": "alice",
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
        **usage(100, 20, cache_read_input_tokens=10),
    ),
    exchange(
        "alice-2",
        at(2),
        ttfc_ms=300,
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
        ttfc_ms=None,
        user_id="bob",
        client_address="10.0.0.2",
        status="blocked",
        error_code="content_filtered",
        request_body={
            "messages": [{"role": "user", "content": 'secret 50% of "C:\\Temp"\nnext line: Ärger in Москва'}]
        },
        verdicts=[{"action": "block", "rule_id": "r1", "reason": "a secret", "filter": "rules"}],
    ),
    exchange(
        "bob-2",
        at(4),
        ttfc_ms=200,
        user_id="bob",
        client_address="10.0.0.2",
        output_text="Nothing to see here",
        delivered_text="Nothing",
        verdicts=[{"action": "flag", "rule_id": "r2", "reason": "flagged"}],
        **usage(50, 5),
    ),
    exchange(
        "anon-1",
        at(5),
        ttfc_ms=400,
        dialect="llm-stream",
        provider=None,
        client_address="10.0.0.3",
        request_model="m-local",
        status="upstream_aborted",
        output_text="cut sh\x1b[31mort 東京",
        findings=[
            {"code": "missing_stream_end", "detail": ""},
            {"code": "invalid_json", "detail": "x"},
            {"code": "invalid_json", "detail": "y"},
        ],
        **usage(10, 1),
    ),
    exchange(
        "cut-1",
        at(6),
        ttfc_ms=500,
        user_id="carol",
        status="completed",
        output_text="held back",
        verdicts=[{"action": "block", "rule_id": "r3", "reason": "output rule"}],
        **usage(7, 3),
    ),
    exchange(
        "recent-1",
        NOW - timedelta(hours=2),
        ttfc_ms=50,
        user_id="dave",
        client_address="10.0.0.4",
        output_text="fresh",
        **usage(1, 1, reasoning_output_tokens=1),
    ),
]
OLDEST_FIRST = ["alice-1", "alice-2", "bob-1", "bob-2", "anon-1", "cut-1", "recent-1"]


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def url(request, tmp_path_factory) -> Iterator[str]:
    """A database of each backend holding :data:`ROWS` (read-only for the tests that use it)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('query') / 'audit.db'}"
    else:
        url = request.getfixturevalue("postgres").create_database()
    engine = open_engine(url)
    with engine.begin() as conn:
        for row in ROWS:  # one by one: the rows have different keys
            conn.execute(insert(exchanges), [row])
    engine.dispose()
    yield url


@pytest.fixture
def empty_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'audit.db'}"
    return request.getfixturevalue("postgres").create_database()


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """``llm-audit ARGS`` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        stack.enter_context(_environ(env or {}))
        try:
            status = cli.main(list(args))
        except SystemExit as e:  # argparse
            status = e.code
    return status, out.getvalue(), err.getvalue()


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.pop("LLM_AUDIT_DB", None)
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def llm_audit(*args: str, env: dict[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess:
    """The real console script, as a user runs it."""
    environ = {k: v for k, v in os.environ.items() if k not in ("LLM_AUDIT_DB", "NO_COLOR")} | (env or {})
    return subprocess.run(
        [str(BIN / "llm-audit"), *args], check=False, capture_output=True, text=True, timeout=60, env=environ, **kwargs
    )


def ids(url: str, *args: str) -> list[str]:
    status, out, err = run("--db", url, "list", "--format", "jsonl", *args)
    assert (status, err) == (0, ""), err
    return [orjson.loads(line)["id"] for line in out.splitlines()]


# -- list ---------------------------------------------------------------------------------------


def test_list_is_newest_first_with_the_views_fields(url):
    status, out, err = run("--db", url, "list", "--format", "json")
    assert (status, err) == (0, "")
    rows = orjson.loads(out)
    assert [r["id"] for r in rows] == OLDEST_FIRST[::-1]
    assert all(list(r) == list(FIELDS) for r in rows)
    alice = next(r for r in rows if r["id"] == "alice-1")
    assert alice["started_at"] == "2026-03-01T10:00:00+00:00"
    assert (alice["duration_ms"], alice["time_to_first_chunk_ms"], alice["total_tokens"]) == (1500, 100, 120)
    assert (alice["day"], alice["blocked"], alice["streamed"], alice["tool_call_count"]) == (
        "2026-03-01",
        False,
        True,
        1,
    )
    assert alice["request_body"]["messages"][1]["content"] == "What is the Capital of France?"
    assert alice["user_agent"] == "test-agent/1"


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--user", "alice"], ["alice-2", "alice-1"]),
        (["--user", "alice", "--user", "bob"], ["bob-2", "bob-1", "alice-2", "alice-1"]),
        (["--model", "claude-x"], ["alice-2"]),
        (["--provider", "anthropic"], ["alice-2"]),
        (["--dialect", "llm-stream"], ["anon-1"]),
        (["--session", "s1"], ["alice-1"]),
        (["--client", "10.0.0.2"], ["bob-2", "bob-1"]),
        (["--status", "failed", "--status", "upstream_aborted"], ["anon-1", "alice-2"]),
        (["--finding", "invalid_json"], ["anon-1"]),  # not alice-2's request_invalid_json
        (["--finding", "request_invalid_json"], ["alice-2"]),
        (["--finding", "missing_stream_end", "--finding", "request_invalid_json"], ["anon-1", "alice-2"]),
        (["--finding", "invalid%"], []),
        (["--blocked"], ["cut-1", "bob-1"]),  # by status, and by a block verdict
        (["--contains", "capital of france"], ["alice-1"]),  # request, any case
        (["--contains", "PARIS"], ["alice-1"]),  # output
        (["--contains", "東京"], ["anon-1"]),
        (["--contains", "nothing to see"], ["bob-2"]),  # what the upstream said, not what the client got
        (["--contains", "50%"], ["bob-1"]),  # a LIKE wildcard is a plain character
        (["--contains", 'of "c:\\temp"'], ["bob-1"]),  # a quote and a backslash, escaped in the body's JSON
        (["--contains", '"\nnext'], ["bob-1"]),  # a line break too
        (["--contains", "not json"], ["alice-2"]),  # a body that was not JSON, kept as a string
        (["--since", "2026-03-02", "--until", "2026-03-04"], ["bob-1", "alice-2"]),
        (["--since", "2026-03-02T11:00:00+01:00", "--until", "2026-03-03T10:00:00Z"], ["alice-2"]),
        (["--since", "12h"], ["recent-1"]),
        (["--until", "1d", "--since", "2026-03-06"], ["cut-1"]),
        (["--user", "bob", "--since", "2026-03-04", "--status", "completed"], ["bob-2"]),
        (["--user", "nobody"], []),
    ],
)
def test_filters(url, args, expected):
    assert ids(url, *args) == expected


def test_contains_folds_the_case_of_any_letter(url):
    """SQLite's lower() folds ASCII letters only; PostgreSQL's, as its database's
    LC_CTYPE does (all letters but under C or POSIX, as the test server's)."""
    expected = ["bob-1"]
    if url.startswith("postgresql"):
        with open_engine(url, migrate=False).connect() as conn:
            if conn.exec_driver_sql("SHOW lc_ctype").scalar() in ("C", "POSIX"):
                expected = []
    assert ids(url, "--contains", "ärger IN москва") == expected
    assert ids(url, "--contains", "Ärger in Москва") == ["bob-1"]  # (as written: on every backend)


def test_limit_and_offset_page_through(url):
    pages = [ids(url, "--limit", "3", "--offset", str(offset)) for offset in (0, 3, 6, 9)]
    assert pages == [OLDEST_FIRST[::-1][0:3], OLDEST_FIRST[::-1][3:6], OLDEST_FIRST[::-1][6:], []]


def test_json_jsonl_and_csv_carry_the_same_rows(url):
    _, as_json, _ = run("--db", url, "list", "--format", "json")
    _, as_jsonl, _ = run("--db", url, "list", "--format", "jsonl")
    _, as_csv, _ = run("--db", url, "search", "--format", "csv")
    rows = orjson.loads(as_json)
    assert [orjson.loads(line) for line in as_jsonl.splitlines()] == rows
    table = list(csv.DictReader(io.StringIO(as_csv)))
    assert [list(r) for r in table] == [list(FIELDS)] * len(rows)
    for json_row, csv_row in zip(rows, table, strict=True):
        assert csv_row == {name: _csv(value) for name, value in json_row.items()}


def _csv(value) -> str:
    """What a JSON value looks like in the CSV (times are already ISO text in the JSON):
    control characters escaped, a cell that would start a formula prefixed with ``'``."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    text = orjson.dumps(value).decode() if isinstance(value, dict | list) else str(value)
    text = re.sub(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", lambda m: f"\\x{ord(m.group()):02x}", text)
    return "'" + text if text.startswith(("=", "+", "-", "@", "\t")) else text


def test_table_fits_the_width_and_shows_no_control_characters(url):
    for width in (60, 100, 160):
        status, out, _ = run("--db", url, "list", env={"COLUMNS": str(width)})
        assert status == 0
        lines = out.splitlines()
        assert lines[0].startswith("time (UTC)")
        assert all(display_width(line) <= width for line in lines), (width, out)
        assert not ANSI.search(out) and "\x1b" not in out
    _, wide, _ = run("--db", url, "list", "--dialect", "llm-stream", env={"COLUMNS": "200"})
    assert "cut sh\\x1b[31mort 東京" in wide  # the escape sequence made visible, not obeyed
    assert "anon-1" in wide and "10/1" in wide and "upstream_aborted" in wide
    assert run("--db", url, "list", "--user", "nobody")[1] == "no exchanges match\n"


def test_a_full_page_says_how_to_get_the_next(url):
    _, out, _ = run("--db", url, "list", "--limit", "2", env={"COLUMNS": "120"})
    assert out.splitlines()[-1] == "(more with --offset 2)"
    assert "more with" not in run("--db", url, "list", "--limit", "50")[1]


@pytest.mark.parametrize("empty_url", ["sqlite", "postgresql"], indirect=True)
def test_view_milliseconds_are_exact_and_alike_on_both_backends(empty_url):
    """Whole milliseconds rounded half away from zero, across second boundaries too."""
    start = datetime(2026, 3, 1, 23, 59, 59, 999_999, tzinfo=UTC)
    cases = {
        "half": (7_500, 8),
        "below": (7_499, 7),
        "carry": (500, 1),
        "zero": (0, 0),
        "long": (86_400_000_001, 86_400_000),
    }
    engine = open_engine(empty_url)
    with engine.begin() as conn:
        for id, (micros, _) in cases.items():
            conn.execute(
                insert(exchanges),
                [
                    exchange(
                        id, start, ttfc_ms=None, took_ms=None, first_chunk_at=start + timedelta(microseconds=micros)
                    )
                ],
            )
        got = dict(conn.execute(select(exchange_view.c.id, exchange_view.c.time_to_first_chunk_ms)).all())
    engine.dispose()
    assert got == {id: ms for id, (_, ms) in cases.items()}


# -- show ---------------------------------------------------------------------------------------


def test_show_reads_like_the_exchange(url):
    status, out, err = run("--db", url, "show", "alice-1", env={"COLUMNS": "100"})
    assert (status, err) == (0, "")
    assert out.startswith("exchange alice-1  completed\n")
    for expected in (
        "  started     2026-03-01 10:00:00.000 UTC",
        "first chunk after 100 ms · took 1.500 s",
        "  user        alice",
        "  session     s1",
        "  user agent  test-agent/1",
        "\nrequest\n  system\n    Answer in one sentence.\n  user\n    What is the Capital of France?",
        "  tools\n    lookup - Look a city up",
        "\noutput\n  finish reason tool_calls\n  reasoning\n    France: Paris.\n  Paris is the capital.",
        '\ntool calls\n  lookup id call_1\n    {\n      "city": "Paris"\n    }',
        "\nusage\n  input 100 · output 20 · cache read 10 · total 120",
    ):
        assert expected in out, (expected, out)
    assert all(display_width(line) <= 100 for line in out.splitlines())


def test_show_outcomes_findings_and_verdicts(url):
    _, failed, _ = run("--db", url, "show", "alice-2")
    assert "failed (HTTP 529)" in failed
    assert "\nrequest\n  this is { not json\n" in failed
    assert "\nerror\n  overloaded: Overloaded" in failed and "\nfindings\n  request_invalid_json  not JSON" in failed
    assert "\nusage\n  none reported by the upstream" in failed
    _, blocked, _ = run("--db", url, "show", "bob-1")
    assert "\nfilter verdicts\n  block  r1  a secret (rules)" in blocked and "no response body" in blocked
    _, filtered, _ = run("--db", url, "show", "bob-2")
    assert "\ndelivered to the client (a content filter changed the output)\n  Nothing\n" in filtered
    _, cut, _ = run("--db", url, "show", "anon")  # a unique start of an id
    assert "cut sh\\x1b[31mort 東京" in cut and "\x1b" not in cut


def test_show_says_what_the_client_got_and_prints_no_id_a_call_does_not_have(tmp_path):
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    engine = open_engine(url)
    with engine.begin() as conn:
        conn.execute(
            insert(exchanges),
            [
                exchange(
                    "held-1",
                    at(6),
                    ttfc_ms=10,
                    dialect="lmsp",
                    status="blocked",
                    http_status=200,
                    client_status=400,
                    output_text="The secret",
                    delivered_text="",
                    error_code="content_filtered",
                )
            ],
        )
        conn.execute(
            insert(exchanges),
            [
                exchange(
                    "gem-1",
                    at(7),
                    ttfc_ms=10,
                    dialect="gemini",
                    http_status=200,
                    tool_calls=[{"id": None, "name": "get_weather", "arguments": '{"city":"Vienna"}'}],
                )
            ],
        )
    engine.dispose()
    _, held, _ = run("--db", url, "show", "held-1")
    assert held.startswith("exchange held-1  blocked (HTTP 400 to the client; the upstream sent 200)\n")
    _, gem, _ = run("--db", url, "show", "gem-1")
    assert "\ntool calls\n  get_weather\n" in gem and "None" not in gem


def test_bidirectional_overrides_and_control_characters_are_shown_escaped():
    assert visible("pay \u202eevil\u2066 \x1b[2J\tand\n") == "pay \\u202eevil\\u2066 \\x1b[2J\tand\n"


def test_show_json_is_the_whole_record(url):
    status, out, _ = run("--db", url, "show", "bob-2", "--format", "json")
    assert status == 0
    record = orjson.loads(out)
    stored = [c.name for c in exchanges.columns if c.name != ANSWER_BYTES]  # a huge answer's bytes: in output_text
    assert list(record) == stored + [n for n in FIELDS if n not in exchanges.c]
    assert record["verdicts"] == [{"action": "flag", "rule_id": "r2", "reason": "flagged"}]
    assert (record["delivered_text"], record["client_text"], record["blocked"]) == ("Nothing", "Nothing", False)
    assert record["request_headers"] == {"user-agent": "test-agent/1"}
    assert record["ended_at"] == "2026-03-04T10:00:01.500000+00:00"


@pytest.mark.parametrize("ident, message", [
    ("nope", "no exchange with the id 'nope'"),
    ("%", "no exchange with the id '%'"),  # not a wildcard
    ("alice-", "'alice-' is the start of several exchange ids; give more of it"),
])  # fmt: skip
def test_show_unknown_or_ambiguous_id(url, ident, message):
    assert run("--db", url, "show", ident) == (2, "", f"llm-audit: {message}\n")


# -- stats --------------------------------------------------------------------------------------


def stats_json(url: str, *args: str) -> list[dict]:
    status, out, err = run("--db", url, "stats", "--format", "json", *args)
    assert (status, err) == (0, ""), err
    return orjson.loads(out)


def test_stats_totals(url):
    [total] = stats_json(url)
    assert total == {
        "exchanges": 7, "with_usage": 5, "input_tokens": 168, "output_tokens": 30, "cache_read_input_tokens": 10,
        "reasoning_output_tokens": 1, "cost_usd": None, "priced": 0, "errors": 1, "blocks": 2,
        # ttfc of six exchanges: 50 100 200 300 400 500; nearest rank 3 and 6
        "time_to_first_chunk_p50_ms": 200, "time_to_first_chunk_p95_ms": 500,
    }  # fmt: skip


def test_stats_by_user(url):
    rows = {r["user"]: r for r in stats_json(url, "--by", "user")}
    assert list(rows) == ["alice", "bob", None, "carol", "dave"]  # most tokens first
    assert {k: rows["alice"][k] for k in ("exchanges", "input_tokens", "errors", "blocks")} == {
        "exchanges": 2,
        "input_tokens": 100,
        "errors": 1,
        "blocks": 0,
    }
    assert (rows["alice"]["time_to_first_chunk_p50_ms"], rows["alice"]["time_to_first_chunk_p95_ms"]) == (100, 300)
    assert (rows["bob"]["blocks"], rows["bob"]["time_to_first_chunk_p50_ms"]) == (1, 200)
    assert rows["carol"]["blocks"] == 1


def test_stats_by_several_keys_and_days(url):
    rows = stats_json(url, "--by", "day,status", "--by", "client", "--until", "2026-03-04")
    assert [(r["day"], r["status"], r["client"], r["exchanges"]) for r in rows] == [
        ("2026-03-01", "completed", "10.0.0.1", 1),
        ("2026-03-02", "failed", "10.0.0.1", 1),
        ("2026-03-03", "blocked", "10.0.0.2", 1),
    ]
    assert rows[2]["time_to_first_chunk_p50_ms"] is None  # blocked: no response body
    assert list(rows[0]) == ["day", "status", "client", *STATS_FIELDS]


def test_stats_formats_and_table(url):
    _, as_csv, _ = run("--db", url, "stats", "--by", "model", "--format", "csv")
    table = list(csv.DictReader(io.StringIO(as_csv)))
    assert [r["model"] for r in table] == ["gpt-4o", "m-local", "claude-x"]
    assert table[0]["exchanges"] == "5" and table[2]["input_tokens"] == "0"
    _, as_jsonl, _ = run("--db", url, "stats", "--by", "provider", "--format", "jsonl")
    assert [orjson.loads(line)["provider"] for line in as_jsonl.splitlines()] == ["openai", None, "anthropic"]
    _, text, _ = run("--db", url, "stats", "--by", "model", env={"COLUMNS": "120"})
    assert text.splitlines()[0].split() == [
        "model",
        "exchanges",
        "with",
        "usage",
        "input",
        "output",
        "cached",
        "reasoning",
        "cost",
        "$",
        "errors",
        "blocks",
        "ttfc",
        "p50",
        "ms",
        "ttfc",
        "p95",
        "ms",
    ]
    assert text.splitlines()[1].split()[:2] == ["gpt-4o", "5"]


@pytest.mark.parametrize("empty_url", ["sqlite", "postgresql"], indirect=True)
def test_stats_percentiles_match_a_computation_in_python(empty_url):
    """A synthetic database (storage/synth.py): the database's nearest ranks equal Python's."""
    fill(empty_url, 3000, days=20, seed=7, batch=1000, quiet=True)
    engine = open_engine(empty_url)
    with engine.connect() as conn:
        rows = conn.execute(select(exchange_view.c.request_model, exchange_view.c.time_to_first_chunk_ms)).all()
    engine.dispose()
    by_model: dict[str, list[int]] = {}
    for model, ttfc in rows:
        if ttfc is not None:
            by_model.setdefault(model, []).append(ttfc)
    stats = {r["model"]: r for r in stats_json(empty_url, "--by", "model")}
    assert sum(r["exchanges"] for r in stats.values()) == 3000
    for model, values in by_model.items():
        values.sort()
        for p in (50, 95):
            assert stats[model][f"time_to_first_chunk_p{p}_ms"] == values[-(-len(values) * p // 100) - 1], (model, p)


# -- export -------------------------------------------------------------------------------------


def test_export_streams_oldest_first_in_both_formats(url):
    status, jsonl, err = run("--db", url, "export")
    assert (status, err) == (0, "")  # stderr is not a terminal: no progress bar
    rows = [orjson.loads(line) for line in jsonl.splitlines()]
    assert [r["id"] for r in rows] == OLDEST_FIRST
    assert rows == orjson.loads(run("--db", url, "list", "--format", "json")[1])[::-1]
    _, as_csv, _ = run("--db", url, "export", "--format", "csv", "--user", "bob")
    assert [r["id"] for r in csv.DictReader(io.StringIO(as_csv))] == ["bob-1", "bob-2"]


def test_export_reads_in_batches(url):
    engine = open_engine(url)
    try:
        with engine.connect() as conn:
            assert [r["id"] for r in iter_exchanges(conn, Filters(), batch=2, unreadable=Unreadable())] == OLDEST_FIRST
    finally:
        engine.dispose()


def test_progress_bar():
    stream = io.StringIO()
    assert list(Progress(3, stream).track(iter("abc"))) == ["a", "b", "c"]
    assert stream.getvalue().endswith("\r[" + "#" * 30 + "] 100% 3/3 exchanges\n")


# -- the console script: terminals, pipes, errors ---------------------------------------------------


def on_a_terminal(*args: str, env: dict[str, str], stream: str = "stdout") -> tuple[str, str]:
    """What ``llm-audit ARGS`` writes to a (pseudo-)terminal as its ``stream``, and to a pipe as the other."""
    master, slave = pty.openpty()
    environ = {k: v for k, v in os.environ.items() if k not in ("LLM_AUDIT_DB", "NO_COLOR")} | env
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, stream: slave}
    proc = subprocess.run([str(BIN / "llm-audit"), *args], **streams, timeout=60, env=environ, check=False)
    os.close(slave)
    chunks = []
    with contextlib.suppress(OSError):  # EIO once everything is read
        while chunk := os.read(master, 65536):
            chunks.append(chunk)
    os.close(master)
    assert proc.returncode == 0, proc
    piped = proc.stderr if stream == "stdout" else proc.stdout
    return b"".join(chunks).decode(), piped.decode()


def test_colour_only_on_a_terminal_and_never_with_no_color(tmp_path):
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    engine = open_engine(url)
    with engine.begin() as conn:
        conn.execute(insert(exchanges), [ROWS[1]])
    engine.dispose()
    coloured, _ = on_a_terminal("--db", url, "list", env={"COLUMNS": "100"})
    assert "\x1b[31mfailed" in coloured and "\x1b[1mtime (UTC)" in coloured
    assert not ANSI.search(on_a_terminal("--db", url, "list", env={"COLUMNS": "100", "NO_COLOR": "1"})[0])
    piped = llm_audit("--db", url, "list")
    assert piped.returncode == 0 and "failed" in piped.stdout and not ANSI.search(piped.stdout)


def test_export_draws_a_progress_bar_on_a_terminal_and_nothing_else_in_the_rows(tmp_path):
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    fill(url, 2500, days=5, quiet=True)
    bar, rows = on_a_terminal("--db", url, "export", env={}, stream="stderr")
    assert bar.endswith("] 100% 2500/2500 exchanges\r\n")  # the terminal turns \n into \r\n
    assert len(rows.splitlines()) == 2500 and all(line.startswith('{"id":') for line in rows.splitlines())


def assert_one_line_error(status: int, out: str, err: str, *fragments: str) -> None:
    assert (status, out) == (2, ""), (status, out, err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["show", "0123456789ab"], ["llm-audit: no exchange with the id '0123456789ab'"]),
        (["list", "--since", "2025-13-45"], ["argument --since: '2025-13-45' is not a valid date"]),
        (["list", "--until", "yesterday"], ["argument --until: 'yesterday': use an age (Nh, Nd, Nw"]),
        (["export", "--since", "3m"], ["months and years vary in length"]),
        (["stats", "--by", "weekday"], ["argument --by: cannot group by 'weekday'; choose from model, provider"]),
        (["stats", "--by", "model,colour"], ["cannot group by 'model,colour'"]),
        (["list", "--format", "xml"], ["argument --format: invalid choice: 'xml'"]),
        (["list", "--limit", "0"], ["'0' is not a positive whole number"]),
        (["list", "--offset", "-1"], ["argument --offset: '-1' is not a whole number of 0 or more"]),
        (["show"], ["the following arguments are required: ID"]),
    ],
)
def test_errors_are_one_line_with_status_2(tmp_path, args, fragments):
    open_engine(f"sqlite:///{tmp_path / 'audit.db'}").dispose()
    assert_one_line_error(*run("--db", f"sqlite:///{tmp_path / 'audit.db'}", *args), *fragments)


@pytest.mark.parametrize(
    "command",
    [
        ["list"],
        ["show", "x"],
        ["stats"],
        ["export"],
        ["verify"],
        # commands that change records already there: a mistyped path is no new database either
        ["cost", "recompute"],
        ["purge", "--older-than", "400d"],
        ["erase", "--user", "alice"],
    ],
)
@pytest.mark.parametrize("state", ["missing", "empty file", "no schema"])
def test_a_command_on_existing_records_never_creates_a_database(tmp_path, command, state):
    folder = tmp_path / "nowhere"
    path = folder / "audit.db"
    if state != "missing":
        folder.mkdir()
        path.touch()
    if state == "no schema":
        sqlite3.connect(path).execute("CREATE TABLE t (x)").connection.close()
    status, out, err = run("--db", f"sqlite:///{path}", *command)
    fragment = "holds no audit database" if state == "no schema" else "there is no audit database at"
    assert_one_line_error(status, out, err, fragment)
    assert folder.exists() == (state != "missing") and (not path.exists() or state != "missing")


@pytest.mark.parametrize("command", [["list"], ["show", "x"], ["stats"], ["export"]])
def test_an_unreachable_database_is_one_line_with_status_2(command):
    assert_one_line_error(
        *run("--db", "postgresql+psycopg://nobody@127.0.0.1:1/audit", *command),
        "cannot open the audit database",
        "--db URL or LLM_AUDIT_DB",
    )


def test_a_database_that_fails_while_reading_is_one_line(tmp_path):
    path = tmp_path / "audit.db"
    open_engine(f"sqlite:///{path}").dispose()
    path.write_bytes(b"SQLite format 3\x00" + random.Random(1).randbytes(4096))  # a ruined file
    assert_one_line_error(*run("--db", f"sqlite:///{path}", "list"), "llm-audit: ")


@pytest.mark.parametrize("args, fragment", [
    (["show", "0123456789ab"], "llm-audit: no exchange with the id '0123456789ab'"),
    (["--db", "postgresql+psycopg://nobody@127.0.0.1:1/audit", "list"], "llm-audit: cannot open the audit database"),
    (["list", "--since", "2025-13-45"], "llm-audit list: error: argument --since: '2025-13-45' is not a valid date"),
])  # fmt: skip
def test_the_console_script_fails_in_one_line_with_status_2(tmp_path, args, fragment):
    open_engine(f"sqlite:///{tmp_path / 'audit.db'}").dispose()
    proc = llm_audit("--db", f"sqlite:///{tmp_path / 'audit.db'}", *args)
    assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, fragment)


def test_reads_the_proxys_database_and_llm_audit_db(tmp_path):
    db = tmp_path / "llm-audit" / "audit.db"
    engine = open_engine(f"sqlite:///{db}")
    with engine.begin() as conn:
        conn.execute(insert(exchanges), [ROWS[0]])
    engine.dispose()
    default = llm_audit("list", "--format", "jsonl", env={"XDG_DATA_HOME": str(tmp_path)})
    assert [orjson.loads(line)["id"] for line in default.stdout.splitlines()] == ["alice-1"]
    other = tmp_path / "other.db"
    from_env = llm_audit(
        "list", "--format", "jsonl", env={"XDG_DATA_HOME": str(tmp_path), "LLM_AUDIT_DB": f"sqlite:///{other}"}
    )
    assert from_env.returncode == 2 and f"there is no audit database at {other}" in from_env.stderr
    assert not other.exists()  # a read-only command creates nothing


def test_piped_into_a_reader_that_stops_early(tmp_path):
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    fill(url, 3000, days=5, quiet=True)
    proc = subprocess.run(
        f"'{BIN / 'llm-audit'}' --db '{url}' export | head -c 100",
        shell=True,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert len(proc.stdout) == 100 and proc.stderr == ""


@pytest.mark.parametrize("args", [[], ["list"], ["search"], ["show"], ["stats"], ["export"]])
def test_help_shows_examples(args):
    status, out, err = run(*args, "--help")
    assert (status, err) == (0, "")
    assert "examples:\n  llm-audit " in out


def test_synthetic_database_script_fills_a_database(tmp_path):
    url = f"sqlite:///{tmp_path / 'synth.db'}"
    proc = subprocess.run(
        [
            str(Path(__file__).resolve().parents[2] / "scripts" / "synth-db"),
            "--db",
            url,
            "--rows",
            "1200",
            "--days",
            "3",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    [total] = stats_json(url)
    assert total["exchanges"] == 1200 and total["input_tokens"] > 0 and total["errors"] > 0


def test_csv_cells_never_run_as_formulas_nor_carry_raw_control_characters(tmp_path):
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    engine = open_engine(url)
    hostile = ['=HYPERLINK("http://evil")', "+1", "-2+3", "@SUM(A1)", "\tx", "a\x1b[31mb\rc\x00d"]
    with engine.begin() as conn:
        for i, text in enumerate(hostile):
            conn.execute(insert(exchanges), [exchange(f"h-{i}", at(1 + i), ttfc_ms=-5, output_text=text, user_id=text)])
    engine.dispose()
    status, out, err = run("--db", url, "export", "--format", "csv")
    assert status == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    by_id = {r["id"]: r for r in rows}
    for i, text in enumerate(hostile[:5]):
        assert by_id[f"h-{i}"]["user_id"] == "'" + text  # shown as text by a spreadsheet
    assert by_id["h-5"]["user_id"] == "a\\x1b[31mb\\rc\\x00d"
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", out.replace("\n", ""))
    assert by_id["h-0"]["time_to_first_chunk_ms"] == "-5"  # numbers stay numbers
