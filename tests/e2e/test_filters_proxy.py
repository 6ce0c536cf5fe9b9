"""Content filters on requests, end to end: a blocked request never goes upstream and
the client's SDK sees its API's normal refusal; a flagged one passes and is recorded.

A real mitmdump with a rules file (tests/fixtures/filters_e2e_rules.toml), the mock
upstream, the official SDKs, and the audit rows read with plain SQL on both backends.
"""

from __future__ import annotations

import ssl
import time
import uuid
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2
import openai
import orjson
import pytest
from conftest import BACKENDS, ROOT, Proxy, guarded_proxy, mitmdump_at_start, start_proxy
from google.genai import types as genai_types
from test_sdks_proxy import MESSAGES, genai_client

pytestmark = pytest.mark.e2e

RULES = ROOT / "tests" / "fixtures" / "filters_e2e_rules.toml"
FORBIDDEN = "Tell me everything about Project Nightjar."
PROMPT: list[Any] = [{"role": "user", "content": FORBIDDEN}]


@pytest.fixture(scope="module", params=BACKENDS)
def guarded(request, tmp_path_factory, upstreams) -> Iterator[Proxy]:
    yield from guarded_proxy(request, tmp_path_factory, RULES, "filters", upstreams)


def headers() -> tuple[str, dict[str, str]]:
    mock_id = uuid.uuid4().hex
    return mock_id, {"x-mock-id": mock_id}


def assert_blocked(proxy: Proxy, up, mock_id: str, streamed: bool) -> dict:
    row = proxy.mock_row(mock_id)
    assert (row["status"], row["error_code"]) == ("blocked", "content_filtered")
    assert row["http_status"] == (200 if streamed else 400)
    assert [(v["action"], v["rule_id"]) for v in row["verdicts"]] == [("block", "no-project-nightjar")]
    assert "Nightjar" not in row["error_message"] and "Nightjar" not in orjson.dumps(row["verdicts"]).decode()
    assert up.received(mock_id) == {}, "a blocked request must never reach the upstream"
    return row


def openai_client(proxy: Proxy, url: str, transport: str = "h1") -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{url}/v1", api_key="sk-test", max_retries=0, http_client=proxy.client(http2=transport == "h2")
    )


@pytest.fixture(params=["h1", "h2"])
def transport(request) -> str:
    return request.param


def test_openai_chat_stream_and_non_stream_are_refused_as_the_api_does(guarded, upstreams, transport):
    up = upstreams[transport]
    mock_id, hdrs = headers()
    with pytest.raises(openai.APIError) as error:
        for _ in openai_client(guarded, up.url, transport).chat.completions.create(
            model="gpt-4o", messages=PROMPT, stream=True, extra_headers=hdrs
        ):
            pass
    assert error.value.code == "content_filter"
    assert_blocked(guarded, up, mock_id, streamed=True)

    mock_id, hdrs = headers()
    with pytest.raises(openai.BadRequestError):
        openai_client(guarded, up.url, transport).chat.completions.create(
            model="gpt-4o", messages=PROMPT, extra_headers=hdrs
        )
    assert_blocked(guarded, up, mock_id, streamed=False)


def test_openai_responses_stream_ends_incomplete_by_content_filter(guarded, upstreams, transport):
    up = upstreams[transport]
    mock_id, hdrs = headers()
    events = list(
        openai_client(guarded, up.url, transport).responses.create(
            model="gpt-5", input=FORBIDDEN, stream=True, extra_headers=hdrs
        )
    )
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "content_filter"
    assert_blocked(guarded, up, mock_id, streamed=True)


def test_anthropic_stream_is_a_refusal(guarded, upstreams, transport):
    up = upstreams[transport]
    mock_id, hdrs = headers()
    http = httpx2.Client(
        proxy=guarded.url,
        verify=ssl.create_default_context(cafile=str(guarded.ca)),
        timeout=30,
        http2=transport == "h2",
    )
    client = anthropic.Anthropic(base_url=up.url, api_key="sk-ant-test", max_retries=0, http_client=http)
    with client.messages.stream(model="claude-mock-1", max_tokens=100, messages=PROMPT, extra_headers=hdrs) as s:
        message = s.get_final_message()
    assert (message.stop_reason, message.content) == ("refusal", [])
    assert_blocked(guarded, up, mock_id, streamed=True)


def test_gemini_stream_reports_a_safety_block(guarded, upstreams, transport):
    up = upstreams[transport]
    mock_id, hdrs = headers()
    with guarded.client(http2=transport == "h2") as http:
        chunks = list(
            genai_client(up.url, http, hdrs).models.generate_content_stream(
                model="gemini-2.5-flash", contents=FORBIDDEN
            )
        )
    assert chunks[0].prompt_feedback.block_reason == genai_types.BlockedReason.SAFETY
    assert_blocked(guarded, up, mock_id, streamed=True)


def test_llm_stream_gets_start_error_end(guarded, upstreams, transport):
    up = upstreams[transport]
    mock_id, hdrs = headers()
    body = {"version": "1.0", "stream": True, "model": "m", "messages": PROMPT}
    with guarded.client(http2=transport == "h2") as c:
        resp = c.post(
            f"{up.url}/v1/llm/stream",
            content=orjson.dumps(body),
            headers=hdrs | {"content-type": "application/llm-request+json"},
        )
    kinds = [line.split(": ", 1)[1] for line in resp.text.splitlines() if line.startswith("event: ")]
    assert kinds == ["stream.start", "error", "stream.end"] and '"content_filtered"' in resp.text
    assert_blocked(guarded, up, mock_id, streamed=True)


def test_lmsp_stream_ends_with_response_failed_and_a_plain_request_gets_a_problem(guarded, upstreams, transport):
    up = upstreams[transport]
    mock_id, hdrs = headers()
    with guarded.client(http2=transport == "h2") as c:
        resp = c.post(
            f"{up.url}/lmsp/v1/responses", json={"model": "m", "input": FORBIDDEN, "stream": True}, headers=hdrs
        )
    events = [line.split(": ", 1)[1] for line in resp.text.splitlines() if line.startswith("event: ")]
    assert events[-1] == "response.failed" and '"content_filtered"' in resp.text
    assert_blocked(guarded, up, mock_id, streamed=True)

    mock_id, hdrs = headers()
    with guarded.client(http2=transport == "h2") as c:
        resp = c.post(f"{up.url}/lmsp/v1/responses", json={"model": "m", "input": FORBIDDEN}, headers=hdrs)
    assert resp.status_code == 400 and resp.headers["content-type"] == "application/problem+json"
    assert resp.json()["code"] == "content_filtered"  # an RFC 9457 problem, as LMSP errors are
    assert_blocked(guarded, up, mock_id, streamed=False)


def test_flagged_request_passes_and_is_recorded_without_the_match(guarded, upstreams):
    up = upstreams["h1"]
    mock_id, hdrs = headers()
    prompt = [{"role": "user", "content": "Mail the summary to jane.doe@example.org please."}]
    text = (
        openai_client(guarded, up.url)
        .chat.completions.create(model="gpt-4o", messages=prompt, extra_headers=hdrs)
        .choices[0]
        .message.content
    )
    row = guarded.mock_row(mock_id)
    assert row["status"] == "completed" and row["output_text"] == text
    [verdict] = row["verdicts"]
    assert (verdict["action"], verdict["rule_id"]) == ("flag", "personal-data")
    assert verdict["match_hash"].startswith("sha256:") and "jane.doe" not in orjson.dumps(verdict).decode()
    sent = orjson.loads(up.received(mock_id)["body"])
    assert sent["messages"] == prompt, "a flagged request goes upstream unchanged"


def test_unfiltered_request_has_no_verdicts(guarded, upstreams):
    mock_id, hdrs = headers()
    openai_client(guarded, upstreams["h1"].url).chat.completions.create(
        model="gpt-4o", messages=MESSAGES, extra_headers=hdrs
    )
    assert guarded.mock_row(mock_id)["verdicts"] == []


def test_a_rules_file_with_an_error_stops_the_proxy_with_its_line(tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\nid = "x"\nkind = "regex"\npattern = "(unclosed"\naction = "block"\n')
    proc = mitmdump_at_start(
        tmp_path,
        f"llm_rules={rules}",
        env={"XDG_STATE_HOME": str(tmp_path / "state"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out
    assert [line for line in out.splitlines() if f"{rules}:4" in line and "llm-audit:" in line], out


BROKEN_FILTER = """
def check_request(ctx):
    raise RuntimeError("this filter is broken")
"""
WORKING_FILTER = """
from addon.filters.api import BLOCK, Verdict

def check_request(ctx):
    if any("launch codes" in m.text for m in ctx.messages):
        return Verdict(BLOCK, "no-launch-codes", "asks for launch codes")
"""


@pytest.mark.parametrize("policy, status, action", [("closed", "blocked", "block"), ("open", "completed", "flag")])
def test_a_failing_filter_blocks_or_passes_by_policy_and_is_recorded(tmp_path, upstreams, policy, status, action):
    up = upstreams["h1"]
    filter_file = tmp_path / "filters.py"
    filter_file.write_text(BROKEN_FILTER)
    proxy = start_proxy(tmp_path, "--set", f"llm_filters={filter_file}", "--set", f"llm_filter_failure={policy}")
    try:
        mock_id, hdrs = headers()
        client = openai_client(proxy, up.url)
        if policy == "closed":
            with pytest.raises(openai.BadRequestError):
                client.chat.completions.create(model="gpt-4o", messages=MESSAGES, extra_headers=hdrs)
        else:
            client.chat.completions.create(model="gpt-4o", messages=MESSAGES, extra_headers=hdrs)
        row = proxy.mock_row(mock_id)
        assert row["status"] == status
        assert [(v["action"], v["rule_id"]) for v in row["verdicts"]] == [(action, "filter_error")]
        assert "this filter is broken" in row["verdicts"][0]["reason"]
        assert bool(up.received(mock_id)) is (policy == "open")
    finally:
        proxy.process.stop()


def test_a_changed_filter_file_is_reloaded_without_restarting(tmp_path, upstreams):
    up = upstreams["h1"]
    filter_file = tmp_path / "filters.py"
    filter_file.write_text("def check_request(ctx):\n    return None\n")
    proxy = start_proxy(tmp_path, "--set", f"llm_filters={filter_file}")
    try:
        ask = [{"role": "user", "content": "What are the launch codes?"}]
        mock_id, hdrs = headers()
        openai_client(proxy, up.url).chat.completions.create(model="gpt-4o", messages=ask, extra_headers=hdrs)
        assert proxy.mock_row(mock_id)["status"] == "completed"
        time.sleep(1.1)  # a new mtime, and past the once-a-second look
        filter_file.write_text(WORKING_FILTER)
        time.sleep(1.1)
        mock_id, hdrs = headers()
        with pytest.raises(openai.BadRequestError):
            openai_client(proxy, up.url).chat.completions.create(model="gpt-4o", messages=ask, extra_headers=hdrs)
        row = proxy.mock_row(mock_id)
        assert (row["status"], row["verdicts"][0]["rule_id"]) == ("blocked", "no-launch-codes")
    finally:
        proxy.process.stop()
