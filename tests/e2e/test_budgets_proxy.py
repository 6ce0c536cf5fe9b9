"""Budgets end to end: a real mitmdump with a budget rule lets requests through up to the
limit and blocks the next before it goes upstream, in the API's own refusal, recorded
with the verdict; on SQLite and PostgreSQL. A burst through one proxy is seen at once
(its own records count as they are recorded); a second proxy sharing the database sees
the first one's use at its next refresh.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import httpx
import openai
import pytest
from conftest import Proxy, Upstream, new_database, start_proxy, wait_for
from sqlalchemy import insert

from storage.database import open_engine
from storage.schema import exchanges

pytestmark = pytest.mark.e2e

PROMPT = [{"role": "user", "content": "How many tokens does this take?"}]
MAX_TOKENS = 5


@pytest.fixture(scope="module")
def usage(upstreams) -> dict:
    """What one request of the tests uses, asked of the mock upstream directly."""
    up = upstreams["h1"]
    body = {"model": "gpt-4o", "messages": PROMPT, "max_tokens": MAX_TOKENS}
    usage = httpx.post(f"{up.url}/v1/chat/completions", json=body, timeout=30).json()["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    return usage


@pytest.fixture(scope="module")
def tokens_per_request(usage) -> int:
    return usage["total_tokens"]


def rules_file(tmp: Path, text: str) -> Path:
    (tmp / "rules.toml").write_text(text)
    return tmp / "rules.toml"


def budget_proxy(request, tmp: Path, backend: str, rules: str, *args: str, **database) -> Proxy:
    database = database or new_database(request, backend, tmp)
    return start_proxy(tmp, "--set", f"llm_rules={rules_file(tmp, rules)}", *args, **database)


def ask(proxy: Proxy, up: Upstream, user: str, stream: bool = False) -> tuple[str, object]:
    """One chat request as ``user``; its mock id and the SDK's answer (or the error raised)."""
    mock_id = uuid.uuid4().hex
    client = openai.OpenAI(base_url=f"{up.url}/v1", api_key="sk-test", max_retries=0, http_client=proxy.client())
    try:
        if stream:
            chunks = list(
                client.chat.completions.create(
                    model="gpt-4o",
                    messages=PROMPT,  # type: ignore[arg-type]
                    max_tokens=MAX_TOKENS,
                    user=user,
                    stream=True,
                    extra_headers={"x-mock-id": mock_id},
                )
            )
            return mock_id, chunks
        answer = client.chat.completions.create(
            model="gpt-4o",
            messages=PROMPT,  # type: ignore[arg-type]
            max_tokens=MAX_TOKENS,
            user=user,
            extra_headers={"x-mock-id": mock_id},
        )
        return mock_id, answer
    except openai.APIError as e:
        return mock_id, e


def assert_budget_block(proxy: Proxy, up: Upstream, mock_id: str, rule_id: str, figures: str) -> dict:
    row = proxy.mock_row(mock_id)
    assert (row["status"], row["error_code"]) == ("blocked", "content_filtered")
    (verdict,) = [v for v in row["verdicts"] if v["rule_id"] == rule_id]
    assert (verdict["action"], verdict["filter"], verdict["location"]) == ("block", "budget", "request")
    assert figures in verdict["reason"], verdict["reason"]
    assert rule_id in row["error_message"] and figures in row["error_message"]
    assert up.received(mock_id) == {}, "a request over its budget must never reach the upstream"
    return row


def test_a_token_budget_lets_requests_through_up_to_the_limit_and_blocks_the_next(
    request, tmp_path, upstreams, backend, tokens_per_request
):
    limit = 3 * tokens_per_request
    rules = f"""
[[rule]]
id = "daily-tokens"
kind = "budget"
period = "day"
per = "user"
limit_tokens = {limit}
action = "block"
"""
    # no refresh during the test: the burst is seen from this proxy's own records alone
    proxy = budget_proxy(request, tmp_path, backend, rules, "--set", "llm_budget_refresh_seconds=3600")
    up = upstreams["h1"]
    try:
        for _ in range(3):  # back to back: no waiting for the database
            _, answer = ask(proxy, up, "alice")
            assert isinstance(answer, openai.types.chat.ChatCompletion), answer
        mock_id, refused = ask(proxy, up, "alice")
        assert isinstance(refused, openai.BadRequestError), refused
        figures = f"user 'alice' used {limit:,} of {limit:,} total tokens today"
        assert "daily-tokens" in str(refused) and figures in str(refused)
        assert_budget_block(proxy, up, mock_id, "daily-tokens", figures)

        mock_id, chunks = ask(proxy, up, "alice", stream=True)  # a stream is refused in its own terms
        assert isinstance(chunks, openai.APIError) and chunks.code == "content_filter", chunks
        assert_budget_block(proxy, up, mock_id, "daily-tokens", figures)

        _, other = ask(proxy, up, "bob")  # a budget per user: bob has his own
        assert isinstance(other, openai.types.chat.ChatCompletion), other
        rows = proxy.rows("user_id = ? AND status = 'completed'", ("alice",))
        assert sum(r["input_tokens"] + r["output_tokens"] for r in rows) == limit
    finally:
        proxy.process.stop()


def test_proxies_sharing_a_database_see_each_others_use_at_the_next_refresh(
    request, tmp_path, upstreams, backend, tokens_per_request
):
    limit = 2 * tokens_per_request
    rules = f"""
[[rule]]
id = "team-day"
kind = "budget"
period = "day"
limit_tokens = {limit}
action = "block"
reason = "the team's daily budget"
"""
    database = new_database(request, backend, tmp_path)
    proxies = []
    for name in ("proxy-a", "proxy-b"):
        tmp = tmp_path / name
        tmp.mkdir()
        set_name = ("--set", f"llm_audit_instance={name}", "--set", "llm_budget_refresh_seconds=1")
        proxies.append(budget_proxy(request, tmp, backend, rules, *set_name, **database))
    a, b = proxies
    up = upstreams["h1"]
    try:
        ids = [ask(a, up, "alice")[0], ask(a, up, "bob")[0]]
        for mock_id in ids:
            assert a.mock_row(mock_id)["status"] == "completed"
        mock_id, refused = ask(a, up, "carol")  # a's own use: at once
        assert isinstance(refused, openai.BadRequestError), refused
        figures = f"all exchanges used {limit:,} of {limit:,} total tokens today"
        assert_budget_block(a, up, mock_id, "team-day", figures)

        deadline = time.monotonic() + 15
        while True:  # b reads a's rows at its next refresh (every second)
            mock_id, answer = ask(b, up, "dave")
            if isinstance(answer, openai.BadRequestError) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert isinstance(answer, openai.BadRequestError), answer
        assert "the team's daily budget" in str(answer)
        assert_budget_block(b, up, mock_id, "team-day", "all exchanges used")
        wait_for(lambda: len(a.rows("status = 'blocked'")) >= 2, what="both blocks recorded")
    finally:
        for p in proxies:
            p.process.stop()


def test_a_usd_budget_counts_the_cost_of_each_exchange_and_blocks_at_the_limit(
    request, tmp_path, upstreams, backend, usage
):
    # $1 per input token, $2 per output token: each request costs a whole number of dollars
    (tmp_path / "prices.toml").write_text(
        '[[price]]\nprovider = "*"\nmodel = "gpt-4o"\ninput = 1000000\noutput = 2000000\n'
    )
    cost = usage["prompt_tokens"] + 2 * usage["completion_tokens"]
    limit = 3 * cost
    rules = f"""
[[rule]]
id = "key-monthly-usd"
kind = "budget"
period = "month"
per = "key"
limit_usd = {limit}
models = ["gpt-4o*"]
action = "block"
"""
    refresh = ("--set", "llm_budget_refresh_seconds=3600", "--set", f"llm_audit_prices={tmp_path / 'prices.toml'}")
    proxy = budget_proxy(request, tmp_path, backend, rules, *refresh)
    up = upstreams["h1"]
    try:
        ids = []
        for _ in range(3):
            mock_id, answer = ask(proxy, up, "alice")
            assert isinstance(answer, openai.types.chat.ChatCompletion), answer
            ids.append(mock_id)
        # this proxy's own cost is priced off the event loop within milliseconds
        time.sleep(0.3)
        mock_id, refused = ask(proxy, up, "bob")  # the same key: the budget is the key's
        assert isinstance(refused, openai.BadRequestError), refused
        figures = f"used ${limit:,.2f} of ${limit:,.2f} this month"
        assert figures in str(refused), str(refused)
        row = assert_budget_block(proxy, up, mock_id, "key-monthly-usd", figures)
        assert row["api_key_fingerprint"].startswith("sha256:")
        costs = [proxy.mock_row(i)["cost_usd"] for i in ids]
        assert [float(c) for c in costs] == [cost] * 3
    finally:
        proxy.process.stop()


def test_a_streamed_rpc_over_budget_ends_in_its_dialect_before_any_message_goes_upstream(
    request, tmp_path, upstreams, proto_python
):
    """A Connect stream (Cursor's chat, read as the client sends it) is checked as it opens:
    over budget (another proxy's use, in the database before this one started), its message
    is not forwarded and connect-py reports the refusal."""
    from test_connect_proxy import PROMPT as PROMPT_TEXT
    from test_connect_proxy import PyClient, py_stream_chat

    database = new_database(request, "sqlite", tmp_path)
    engine = open_engine(database["db_url"])
    with engine.begin() as conn:
        conn.execute(
            insert(exchanges).values(
                id=uuid.uuid4().hex,
                status="completed",
                dialect="openai-chat",
                streamed=False,
                started_at=datetime.now(UTC),
                proxy_instance="another-proxy",
                input_tokens=10,
            )
        )
    engine.dispose()
    rules = '[[rule]]\nid = "ten-tokens"\nkind = "budget"\nperiod = "day"\nlimit_tokens = 10\naction = "block"\n'
    proxy = start_proxy(
        tmp_path, "--set", f"llm_rules={rules_file(tmp_path, rules)}", upstream_ca=upstreams["h2"].ca, **database
    )
    try:
        py = PyClient(proxy, upstreams["h2"])
        mock_id = uuid.uuid4().hex
        code, message = py_stream_chat(py.upstream.url, py.http(proxy), {"x-mock-id": mock_id})
        assert code == "PERMISSION_DENIED" and "ten-tokens" in message, (code, message)
        assert "all exchanges used 10 of 10 total tokens today" in message
        row = proxy.mock_row(mock_id)
        assert row["status"] == "blocked"
        assert [v["rule_id"] for v in row["verdicts"]] == ["ten-tokens"]
        assert PROMPT_TEXT not in upstreams["h2"].received(mock_id).get("body", b"").decode("utf-8", "replace")
    finally:
        proxy.process.stop()


@pytest.mark.parametrize("failure", ["closed", "open"])
def test_totals_that_cannot_be_read_follow_the_failure_policy(tmp_path, upstreams, postgres, failure):
    """PostgreSQL down: once the totals are older than 3 refreshes (at least 15 s), closed
    refuses a request in a budget's scope and open lets it pass, both with the verdict;
    the records, spooled meanwhile, reach the database when it is back."""
    rules = '[[rule]]\nid = "big"\nkind = "budget"\nperiod = "day"\nlimit_tokens = 1000000000\naction = "block"\n'
    url = postgres.create_database()
    options = ("--set", "llm_budget_refresh_seconds=1", "--set", f"llm_filter_failure={failure}")
    proxy = start_proxy(
        tmp_path, "--set", f"llm_rules={rules_file(tmp_path, rules)}", *options, db_url=url, pg=postgres
    )
    up = upstreams["h1"]
    try:
        _, answer = ask(proxy, up, "alice")
        assert isinstance(answer, openai.types.chat.ChatCompletion), answer
        postgres.stop()
        try:
            stopped = time.monotonic()
            wait_for(lambda: "budgets: cannot read the totals" in proxy.process.output, what="a failed refresh")
            mock_id, answer = ask(proxy, up, "alice")  # the last totals are recent enough yet
            assert isinstance(answer, openai.types.chat.ChatCompletion), answer
            time.sleep(max(0.0, stopped + 17 - time.monotonic()))  # 15 s and the last refresh's second
            mock_id, answer = ask(proxy, up, "alice")
            if failure == "open":  # recorded, and the request passed
                assert isinstance(answer, openai.types.chat.ChatCompletion), answer
            else:
                assert isinstance(answer, openai.BadRequestError), answer
                assert "budget 'big' cannot be checked: the totals are" in str(answer)
        finally:
            postgres.start()
        row = proxy.mock_row(mock_id, timeout=30)  # spooled during the outage, written now
        (verdict,) = [v for v in row["verdicts"] if v["rule_id"] == "filter_error"]
        assert (verdict["action"], verdict["filter"]) == ("block" if failure == "closed" else "flag", "budget")
        assert "cannot read the totals" in verdict["reason"], verdict["reason"]
        assert row["status"] == ("blocked" if failure == "closed" else "completed")
    finally:
        proxy.process.stop()
