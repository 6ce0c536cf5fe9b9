"""The "LLM stream" content view, through mitmproxy's own content view API.

Each dialect's request and response (the mock upstream's bytes, streamed and not) are
rendered with ``contentviews.prettify_message`` as mitmweb and the console render them:
the view must be chosen automatically ("auto") and show what the audit record says
(the same pipeline reads both: ``tests/pipeline.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from mitmproxy import contentviews
from mitmproxy.test import taddons, tflow, tutils
from pipeline import audit_bytes

from addon.dialects import RequestView
from addon.dialects.registry import detect_request
from addon.mitm import contentview
from addon.record import ExchangeRecord
from mockllm.scenario import Scenario
from mockllm.streams import DIALECTS, openai_chat_completion

MESSAGES = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Weather in Vienna?"}]
SCENARIO = "reasoning=1&tool=get_weather&tools=2"


@dataclass(frozen=True)
class Case:
    """One dialect's request as a client sends it to the mock upstream."""

    mock: str  # the mock's dialect name (mockllm.streams.DIALECTS)
    path: str
    body: dict[str, Any]
    headers: tuple[tuple[str, str], ...] = (("content-type", "application/json"),)
    reasoning: bool = True  # the dialect carries reasoning


CASES = {
    "llm-stream": Case(
        "llm-stream",
        "/v1/llm/stream",
        {
            "version": "1.0",
            "stream": True,
            "model": "demo",
            "messages": MESSAGES,
            "tools": [{"name": "get_weather", "parameters": {"type": "object"}}],
            "metadata": {"user_id": "alice"},
        },
        (("content-type", "application/llm-request+json"),),
        reasoning=False,
    ),
    "openai-chat": Case(
        "openai-chat",
        "/v1/chat/completions",
        {
            "model": "gpt-4o",
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": MESSAGES,
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}],
        },
    ),
    "openai-responses": Case(
        "openai-responses",
        "/v1/responses",
        {
            "model": "gpt-5",
            "stream": True,
            "instructions": "Answer briefly.",
            "input": "Weather in Vienna?",
            "tools": [{"type": "function", "name": "get_weather", "parameters": {}}],
        },
    ),
    "anthropic-messages": Case(
        "anthropic",
        "/v1/messages",
        {
            "model": "claude-sonnet-4-5",
            "max_tokens": 1024,
            "stream": True,
            "system": "Answer briefly.",
            "messages": MESSAGES[1:],
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
        },
        (("content-type", "application/json"), ("anthropic-version", "2023-06-01")),
    ),
    "gemini": Case(
        "gemini",
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
        {
            "systemInstruction": {"parts": [{"text": "Answer briefly."}]},
            "contents": [{"role": "user", "parts": [{"text": "Weather in Vienna?"}]}],
            "tools": [{"functionDeclarations": [{"name": "get_weather"}]}],
        },
    ),
    "gemini-json-array": Case(
        "gemini-json",
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent",
        {
            "contents": [{"role": "user", "parts": [{"text": "Weather in Vienna?"}]}],
        },
    ),
    "lmsp": Case(
        "lmsp",
        "/lmsp/v1/responses",
        {
            "model": "qwen3",
            "stream": True,
            "instructions": "Answer briefly.",
            "input": "Weather in Vienna?",
            "tools": [{"type": "function", "name": "get_weather", "parameters": {}}],
        },
    ),
}


def flow_for(case: Case, scenario: str = SCENARIO, response: bytes | None = None, content_type: str | None = None):
    """A finished flow of ``case``: the request as sent and the mock's response body."""
    mock = DIALECTS[case.mock]
    if response is None:
        response = b"".join(mock.stream(case.body, Scenario.parse(scenario)))
    content_type = content_type or mock.stream_type
    request = tutils.treq(
        method=b"POST",
        path=case.path.encode(),
        content=orjson.dumps(case.body),
        headers=[(k.encode(), v.encode()) for k, v in case.headers],
    )
    return tflow.tflow(
        req=request, resp=tutils.tresp(headers=[(b"content-type", content_type.encode())], content=response)
    )


def expected_row(f, case: Case) -> dict:
    """What the audit pipeline reads from the flow's response."""
    path, _, query = case.path.partition("?")
    view = RequestView("POST", path, query, f.request.headers)
    dialect = detect_request(view, lambda: case.body)
    event_stream = f.response.headers["content-type"].startswith("text/event-stream")
    return audit_bytes(dialect, f.response.content, request=case.body, request_view=view, event_stream=event_stream)


def render(f, message) -> contentviews.ContentviewResult:
    with taddons.context():
        return contentviews.prettify_message(message, f)


@pytest.fixture(autouse=True, scope="module")
def registered():
    contentview.register()


@pytest.mark.parametrize("name", CASES)
def test_a_stream_of_every_dialect_shows_answer_reasoning_tool_calls_and_usage(name):
    case = CASES[name]
    f = flow_for(case)
    row = expected_row(f, case)
    result = render(f, f.response)
    assert result.view_name == "LLM stream", result.text
    text = result.text
    assert text.startswith(f"{row['dialect']} response · {row['status']}")
    assert row["output_text"] and row["output_text"] in text
    if case.reasoning:
        reasoning = row["output"]["choices"][0].get("reasoning")
        assert reasoning and f"reasoning\n  {reasoning.splitlines()[0]}" in text
    calls = row["tool_calls"]
    assert calls
    for call in calls:
        assert f"tool call {call['name']}" + (f" ({call['id']})\n" if call["id"] else "\n") in text
        pretty = orjson.dumps(orjson.loads(call["arguments"]), option=orjson.OPT_INDENT_2).decode()
        assert "\n".join("  " + line for line in pretty.splitlines()) in text  # arguments pretty-printed
    if row["input_tokens"] is not None:
        assert f"usage       input {row['input_tokens']} · output {row['output_tokens']}" in text


@pytest.mark.parametrize("name", CASES)
def test_the_request_of_every_dialect_shows_the_conversation_as_sent(name):
    case = CASES[name]
    f = flow_for(case)
    result = render(f, f.request)
    assert result.view_name == "LLM stream", result.text
    assert "\nuser\n  Weather in Vienna?" in result.text
    if name != "gemini-json-array":
        assert "tools       get_weather" in result.text
        assert "\nsystem\n  Answer briefly." in result.text


def test_a_json_answer_wins_over_the_json_view():
    case = CASES["openai-chat"]
    body = orjson.dumps(openai_chat_completion({**case.body, "stream": False}, Scenario.parse("tool=get_weather")))
    f = flow_for(case, response=body, content_type="application/json")
    result = render(f, f.response)
    assert result.view_name == "LLM stream"
    assert "openai-chat response · completed" in result.text and "tool call get_weather" in result.text


def test_an_error_answer_shows_the_error():
    case = CASES["anthropic-messages"]
    body = DIALECTS["anthropic"].error_body(Scenario.parse("status=429"), 429)
    f = flow_for(case, response=body, content_type="application/json")
    f.response.status_code = 429
    result = render(f, f.response)
    assert result.text.startswith("anthropic-messages response · failed")
    assert "\nerror\n  rate_limit_error: " in result.text


def test_a_stream_claimed_by_its_first_event_is_shown_too():
    """An event stream whose request no dialect recognised (e.g. a GET), as the proxy sniffs it."""
    f = flow_for(CASES["openai-chat"])
    f.request.method, f.request.path, f.request.content = "GET", "/stream", b""
    result = render(f, f.response)
    assert result.view_name == "LLM stream" and "tök0 tök1" in result.text


def test_other_flows_keep_mitmproxy_s_own_views():
    f = tflow.tflow(
        req=tutils.treq(method=b"POST", path=b"/api/items", content=b'{"a": 1}'),
        resp=tutils.tresp(headers=[(b"content-type", b"application/json")], content=b'{"b": 2}'),
    )
    assert render(f, f.request).view_name != "LLM stream"
    assert render(f, f.response).view_name != "LLM stream"
    sse = tutils.tresp(headers=[(b"content-type", b"text/event-stream")], content=b"data: hello\n\n")
    f = tflow.tflow(req=tutils.treq(method=b"GET", path=b"/events"), resp=sse)
    assert render(f, f.response).view_name != "LLM stream"


def test_what_the_proxy_recorded_is_shown_with_the_stream():
    """Status, findings and verdicts the proxy left on the flow (``annotate``) are shown
    with the transcript, request verdicts with the request."""
    case = CASES["openai-chat"]
    f = flow_for(case, "events=3")
    record = ExchangeRecord(dialect="openai-chat", request_model="gpt-4o", status="blocked")
    record.usage.update(input_tokens=5, output_tokens=3)
    record.add_finding("missing_stream_end", "the stream ended without its terminal event")
    record.verdicts += [
        {
            "action": "flag",
            "rule_id": "code-names",
            "reason": "",
            "filter": "rules",
            "position": 3,
            "match_hash": "sha256:ab",
            "location": "request",
        },
        {
            "action": "block",
            "rule_id": "internal-hosts",
            "reason": "internal host name",
            "filter": "rules",
            "position": 12,
            "match_hash": "sha256:cd",
            "location": "output.choices[0].text",
        },
    ]
    contentview.annotate(f, record)
    assert f.comment == "gpt-4o · 5→3 tok · blocked by internal-hosts"
    assert f.marked == ":no_entry:"

    response = render(f, f.response).text
    assert response.startswith("openai-chat response · blocked")
    assert f"record      {record.id} (llm-audit show {record.id[:12]})" in response
    assert "\nfindings\n  missing_stream_end  the stream ended without its terminal event" in response
    # the verdict line is exchange.transcript's, the same as llm-audit show prints
    assert "block  internal-hosts  internal host name (rules, output.choices[0].text, at 12, sha256:cd)" in response
    assert "code-names" not in response
    request = render(f, f.request).text
    assert "flag  code-names (rules, request, at 3, sha256:ab)" in request and "internal-hosts" not in request


def test_a_comment_the_user_wrote_is_kept():
    f = flow_for(CASES["openai-chat"])
    f.comment = "look at this one"
    contentview.annotate(f, ExchangeRecord(dialect="openai-chat", status="completed"))
    assert f.comment == "look at this one" and f.marked == ""


@pytest.mark.parametrize(
    ("usage", "status", "line"),
    [
        ({}, "completed", "gpt-4o · completed"),
        ({"input_tokens": 1234, "output_tokens": 567}, "completed", "gpt-4o · 1234→567 tok · completed"),
        ({"input_tokens": 12}, "upstream_aborted", "gpt-4o · 12→? tok · upstream_aborted"),
    ],
)
def test_the_flow_list_comment(usage, status, line):
    record = ExchangeRecord(dialect="openai-chat", request_model="gpt-4o", status=status)
    record.usage.update(usage)
    assert contentview.summary_line(record) == line


@pytest.mark.parametrize("stream", [True, False])
def test_a_legacy_completions_exchange_shows_its_prompt_and_every_choice(stream):
    case = Case(
        "openai-completions",
        "/v1/completions",
        {
            "model": "gpt-3.5-turbo-instruct",
            "stream": stream,
            "prompt": ["Weather in Vienna?", "And Graz?"],
            "stream_options": {"include_usage": True},
        },
    )
    mock = DIALECTS[case.mock]
    body = (
        b"".join(mock.stream(case.body, Scenario.parse("")))
        if stream
        else orjson.dumps(mock.body(case.body, Scenario.parse("")))
    )
    f = flow_for(case, response=body, content_type=None if stream else "application/json")
    row = expected_row(f, case)
    request = render(f, f.request)
    assert request.view_name == "LLM stream" and "\nuser\n  Weather in Vienna?" in request.text
    assert "\nuser\n  And Graz?" in request.text
    result = render(f, f.response)
    assert result.view_name == "LLM stream", result.text
    assert result.text.startswith("openai-completions response · completed")
    assert row["output_text"] in result.text and len(row["output"]["choices"]) == 2
    assert f"usage       input {row['input_tokens']} · output {row['output_tokens']}" in result.text
