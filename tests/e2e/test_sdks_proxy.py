"""The official SDKs through a real mitmdump with the addon, for every vendor dialect.

Each test makes the same SDK call twice, once straight to the mock upstream and once
through the proxy (HTTP/1.1 to a plain upstream, and HTTP/2 over TLS), and checks that
the SDK's own streaming helpers see the same text and tool calls both ways, then that
the audit row (plain SQL, on SQLite and on PostgreSQL: the ``proxy`` fixture) says what
the SDK saw.
"""

from __future__ import annotations

import ssl
import time
import uuid
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import httpx2  # the anthropic SDK's HTTP client library
import openai
import orjson
import pytest
from conftest import Proxy, Upstream
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from exchange.transcript import output_choices

pytestmark = pytest.mark.e2e

MESSAGES: list[Any] = [{"role": "user", "content": "What is the weather in Vienna?"}]
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT_TOOLS: list[Any] = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
RESPONSES_TOOLS: list[Any] = [{"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": False}]
ANTHROPIC_TOOLS: list[Any] = [{"name": "get_weather", "input_schema": WEATHER}]
GEMINI_TOOLS = [genai_types.Tool(function_declarations=[genai_types.FunctionDeclaration(name="get_weather")])]


class Route:
    """Where an SDK call goes: straight to the mock, or through the proxy."""

    def __init__(self, proxy: Proxy, upstream: Upstream, transport: str) -> None:
        self.proxy, self.upstream, self.transport = proxy, upstream, transport
        self.url = upstream.url

    def http(self, via_proxy: bool, lib: Any = httpx) -> httpx.Client:
        """An HTTP client of ``lib`` (httpx, or httpx2 for the anthropic SDK) for this route."""
        ca = self.proxy.ca if via_proxy else self.upstream.ca
        verify = ssl.create_default_context(cafile=str(ca)) if ca else True
        proxy = self.proxy.url if via_proxy else None
        return lib.Client(proxy=proxy, verify=verify, http2=self.transport == "h2", timeout=30)

    def both(
        self, call: Callable[[httpx.Client, dict[str, str]], Any], scenario: str = "", lib: Any = httpx
    ) -> tuple[Any, Any, str]:
        """``call`` run directly and through the proxy: (direct result, proxied result, mock id)."""
        results = []
        for via_proxy in (False, True):
            mock_id = uuid.uuid4().hex
            with self.http(via_proxy, lib) as client:
                results.append(call(client, {"x-mock": scenario, "x-mock-id": mock_id}))
        return results[0], results[1], mock_id

    def row(self, mock_id: str) -> dict:
        return self.proxy.mock_row(mock_id)


@pytest.fixture(params=["h1", "h2"])
def route(request, proxy, upstreams) -> Route:
    return Route(proxy, upstreams[request.param], request.param)


def reasoning(row: dict, choice: int = 0) -> str | None:
    return row["output"]["choices"][choice].get("reasoning")


def calls(row: dict) -> list[tuple[str | None, str | None, Any]]:
    return [(c["id"], c["name"], orjson.loads(c["arguments"])) for c in row["tool_calls"]]


# -- OpenAI Chat Completions ---------------------------------------------------------------------


def test_openai_chat_stream_helper_through_the_proxy(route):
    def call(http, headers):
        client = openai.OpenAI(base_url=f"{route.url}/v1", api_key="sk-test", max_retries=0, http_client=http)
        with client.chat.completions.stream(
            model="gpt-4o",
            messages=MESSAGES,
            tools=CHAT_TOOLS,
            stream_options={"include_usage": True},
            extra_headers=headers,
        ) as stream:
            deltas = "".join(e.delta for e in stream if e.type == "content.delta")
            return deltas, stream.get_final_completion()

    (direct_text, direct), (text, final), mock_id = route.both(call, "reasoning=1&tool=get_weather&tools=2")
    message = final.choices[0].message
    assert text == direct_text == message.content and text
    tool_calls = [(c.id, c.function.name, orjson.loads(c.function.arguments)) for c in message.tool_calls]
    assert [c[1:] for c in tool_calls] == [
        (c.function.name, orjson.loads(c.function.arguments)) for c in direct.choices[0].message.tool_calls
    ]

    row = route.row(mock_id)
    assert (row["dialect"], row["provider"], row["status"]) == ("openai-chat", "openai", "completed")
    assert row["output_text"] == message.content
    assert reasoning(row) == message.model_extra["reasoning_content"]
    assert calls(row) == tool_calls and len(tool_calls) == 2
    assert (row["input_tokens"], row["output_tokens"]) == (final.usage.prompt_tokens, final.usage.completion_tokens)
    assert (row["request_model"], row["response_model"], row["response_id"]) == ("gpt-4o", final.model, final.id)
    assert row["finish_reasons"] == [final.choices[0].finish_reason]
    assert row["findings"] == [] and row["streamed"] is True


def test_openai_chat_without_usage_requested_records_null_usage(route):
    def call(http, headers):
        client = openai.OpenAI(base_url=f"{route.url}/v1", api_key="sk-test", max_retries=0, http_client=http)
        return "".join(
            c.choices[0].delta.content or ""
            for c in client.chat.completions.create(
                model="gpt-4o", messages=MESSAGES, stream=True, extra_headers=headers
            )
            if c.choices
        )

    direct, text, mock_id = route.both(call)
    row = route.row(mock_id)
    assert text == direct == row["output_text"]
    assert (row["input_tokens"], row["output_tokens"], row["usage_source"]) == (None, None, "none")
    assert "stream_options" not in row["request_body"], "the proxy must not ask for usage on the client's behalf"


def test_openai_chat_non_streamed_choices_and_parallel_tool_calls(route):
    def call(http, headers):
        client = openai.OpenAI(base_url=f"{route.url}/v1", api_key="sk-test", max_retries=0, http_client=http)
        return client.chat.completions.create(
            model="gpt-4o", messages=MESSAGES, tools=CHAT_TOOLS, n=2, extra_headers=headers
        )

    direct, completion, mock_id = route.both(call, "tool=get_weather&tools=2")
    assert completion.model_dump(exclude={"id"}) == direct.model_dump(exclude={"id"})
    row = route.row(mock_id)
    assert (row["status"], row["streamed"]) == ("completed", False)
    sdk_calls = [
        (c.id, c.function.name, orjson.loads(c.function.arguments))
        for choice in completion.choices
        for c in choice.message.tool_calls
    ]
    assert calls(row) == sdk_calls and len(sdk_calls) == 4
    assert row["finish_reasons"] == [c.finish_reason for c in completion.choices]
    assert (row["input_tokens"], row["output_tokens"]) == (
        completion.usage.prompt_tokens,
        completion.usage.completion_tokens,
    )


def test_openai_chat_rate_limit_is_failed_with_the_error_code(route):
    def call(http, headers):
        client = openai.OpenAI(base_url=f"{route.url}/v1", api_key="sk-test", max_retries=0, http_client=http)
        with pytest.raises(openai.RateLimitError) as error:
            client.chat.completions.create(model="gpt-4o", messages=MESSAGES, extra_headers=headers)
        return error.value.code

    direct, code, mock_id = route.both(call, "status=429")
    row = route.row(mock_id)
    assert code == direct
    assert (row["status"], row["http_status"], row["error_code"]) == ("failed", 429, code)


def test_openai_chat_error_mid_stream_keeps_the_partial_text(route):
    def call(http, headers):
        client = openai.OpenAI(base_url=f"{route.url}/v1", api_key="sk-test", max_retries=0, http_client=http)
        seen = []
        with pytest.raises(openai.APIError) as error:
            for chunk in client.chat.completions.create(
                model="gpt-4o", messages=MESSAGES, stream=True, extra_headers=headers
            ):
                seen.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
        return "".join(seen), error.value.code

    direct, (text, code), mock_id = route.both(call, "error=server_overloaded&error_after=2")
    row = route.row(mock_id)
    assert (text, code) == direct
    assert (row["status"], row["error_code"], row["output_text"]) == ("failed", code, text)


# -- OpenAI Responses -------------------------------------------------------------------------------


def test_openai_responses_stream_helper_through_the_proxy(route):
    def call(http, headers):
        client = openai.OpenAI(base_url=f"{route.url}/v1", api_key="sk-test", max_retries=0, http_client=http)
        with client.responses.stream(
            model="gpt-5", input="Weather in Vienna?", tools=RESPONSES_TOOLS, extra_headers=headers
        ) as stream:
            deltas = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
            return deltas, stream.get_final_response()

    (direct_text, direct), (text, final), mock_id = route.both(call, "reasoning=1&tool=get_weather&tools=2")
    assert text == direct_text == final.output_text and text
    fn_calls = [(i.call_id, i.name, orjson.loads(i.arguments)) for i in final.output if i.type == "function_call"]
    assert [c[1:] for c in fn_calls] == [
        (i.name, orjson.loads(i.arguments)) for i in direct.output if i.type == "function_call"
    ]
    summary = "".join(s.text for i in final.output if i.type == "reasoning" for s in i.summary)

    row = route.row(mock_id)
    assert (row["dialect"], row["status"], row["output_text"]) == ("openai-responses", "completed", final.output_text)
    assert calls(row) == fn_calls and len(fn_calls) == 2
    assert reasoning(row) == summary and summary
    assert (row["input_tokens"], row["output_tokens"], row["reasoning_output_tokens"]) == (
        final.usage.input_tokens,
        final.usage.output_tokens,
        final.usage.output_tokens_details.reasoning_tokens,
    )
    assert (row["response_id"], row["response_model"]) == (final.id, final.model)
    assert row["findings"] == []


def test_openai_responses_failed_stream_and_non_streamed_answer(route):
    def failed(http, headers):
        client = openai.OpenAI(base_url=f"{route.url}/v1", api_key="sk-test", max_retries=0, http_client=http)
        events = list(client.responses.create(model="gpt-5", input="hi", stream=True, extra_headers=headers))
        return events[-1].type, "".join(e.delta for e in events if e.type == "response.output_text.delta")

    direct, (last, text), mock_id = route.both(failed, "error=server_error&error_after=2")
    row = route.row(mock_id)
    assert (last, text) == direct and last == "response.failed"
    assert (row["status"], row["error_code"], row["output_text"]) == ("failed", "server_error", text)

    def whole(http, headers):
        client = openai.OpenAI(base_url=f"{route.url}/v1", api_key="sk-test", max_retries=0, http_client=http)
        return client.responses.create(model="gpt-5", input="hi", extra_headers=headers)

    direct, response, mock_id = route.both(whole)
    row = route.row(mock_id)
    assert response.output_text == direct.output_text == row["output_text"]
    assert (row["status"], row["streamed"], row["output_tokens"]) == ("completed", False, response.usage.output_tokens)


# -- Anthropic Messages -------------------------------------------------------------------------------


def test_anthropic_stream_helper_through_the_proxy(route):
    def call(http, headers):
        client = anthropic.Anthropic(base_url=route.url, api_key="sk-ant-test", max_retries=0, http_client=http)
        with client.messages.stream(
            model="claude-mock-1", max_tokens=1024, messages=MESSAGES, tools=ANTHROPIC_TOOLS, extra_headers=headers
        ) as stream:
            return "".join(stream.text_stream), stream.get_final_message()

    (direct_text, direct), (text, message), mock_id = route.both(call, "thinking=1&tool=get_weather&tools=2", httpx2)
    assert text == direct_text and text
    tool_uses = [(b.id, b.name, b.input) for b in message.content if b.type == "tool_use"]
    assert [t[1:] for t in tool_uses] == [(b.name, b.input) for b in direct.content if b.type == "tool_use"]
    thinking = "".join(b.thinking for b in message.content if b.type == "thinking")

    row = route.row(mock_id)
    assert (row["dialect"], row["provider"], row["status"]) == ("anthropic-messages", "anthropic", "completed")
    assert row["output_text"] == text and reasoning(row) == thinking and thinking
    assert calls(row) == tool_uses and len(tool_uses) == 2
    usage = message.usage
    cached = (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
    assert (row["input_tokens"], row["output_tokens"]) == (usage.input_tokens + cached, usage.output_tokens)
    assert (row["response_id"], row["response_model"], row["finish_reasons"]) == (
        message.id,
        message.model,
        [message.stop_reason],
    )
    assert row["findings"] == []


def test_anthropic_error_after_http_200_fails_the_exchange(route):
    def call(http, headers):
        client = anthropic.Anthropic(base_url=route.url, api_key="sk-ant-test", max_retries=0, http_client=http)
        seen = []
        with pytest.raises(anthropic.APIStatusError):
            with client.messages.stream(
                model="claude-mock-1", max_tokens=1024, messages=MESSAGES, extra_headers=headers
            ) as stream:
                seen.extend(stream.text_stream)
        return "".join(seen)

    direct, text, mock_id = route.both(call, "error=overloaded_error&error_after=2", httpx2)
    row = route.row(mock_id)
    assert text == direct == row["output_text"] and text
    assert (row["status"], row["http_status"], row["error_code"]) == ("failed", 200, "overloaded_error")


def test_anthropic_tool_call_cut_by_max_tokens_is_kept_with_a_finding(route):
    def call(http, headers):
        client = anthropic.Anthropic(base_url=route.url, api_key="sk-ant-test", max_retries=0, http_client=http)
        with client.messages.stream(
            model="claude-mock-1", max_tokens=1024, messages=MESSAGES, tools=ANTHROPIC_TOOLS, extra_headers=headers
        ) as stream:
            return stream.get_final_message().stop_reason

    direct, stop, mock_id = route.both(call, "tool=get_weather&truncate_tool=1", httpx2)
    row = route.row(mock_id)
    assert stop == direct == "max_tokens"
    assert row["finish_reasons"] == ["max_tokens"]
    assert "tool_call_truncated" in [f["code"] for f in row["findings"]]
    assert row["tool_calls"] and row["tool_calls"][0]["name"] == "get_weather"


def test_anthropic_non_streamed_message(route):
    def call(http, headers):
        client = anthropic.Anthropic(base_url=route.url, api_key="sk-ant-test", max_retries=0, http_client=http)
        return client.messages.create(
            model="claude-mock-1", max_tokens=1024, messages=MESSAGES, tools=ANTHROPIC_TOOLS, extra_headers=headers
        )

    direct, message, mock_id = route.both(call, "thinking=1&tool=get_weather", httpx2)
    assert [b.type for b in message.content] == [b.type for b in direct.content]
    row = route.row(mock_id)
    assert (row["status"], row["streamed"]) == ("completed", False)
    assert row["output_text"] == "".join(b.text for b in message.content if b.type == "text")
    assert calls(row) == [(b.id, b.name, b.input) for b in message.content if b.type == "tool_use"]


# -- Google Gemini ---------------------------------------------------------------------------------------


def genai_client(url: str, http: httpx.Client, headers: dict[str, str]) -> genai.Client:
    options = genai_types.HttpOptions(base_url=url, headers=headers, httpx_client=http)
    return genai.Client(api_key="gemini-test-key", http_options=options)


def test_gemini_stream_through_the_proxy(route):
    def call(http, headers):
        client = genai_client(route.url, http, headers)
        chunks = list(
            client.models.generate_content_stream(
                model="gemini-2.5-flash",
                contents="Weather in Vienna?",
                config=genai_types.GenerateContentConfig(tools=GEMINI_TOOLS),
            )
        )
        parts = [p for c in chunks for p in c.candidates[0].content.parts]
        text = "".join(p.text for p in parts if p.text and not p.thought)
        thought = "".join(p.text for p in parts if p.text and p.thought)
        fns = [(p.function_call.name, p.function_call.args) for p in parts if p.function_call]
        return text, thought, fns, chunks[-1]

    direct, (text, thought, fns, last), mock_id = route.both(call, "thinking=1&tool=get_weather&tools=2")
    assert (text, thought, fns) == direct[:3] and text and thought and len(fns) == 2
    row = route.row(mock_id)
    assert (row["dialect"], row["provider"], row["status"]) == ("gemini", "gcp.gemini", "completed")
    assert row["output_text"] == text and reasoning(row) == thought
    assert [(name, args) for _, name, args in calls(row)] == fns
    assert (row["request_model"], row["response_model"]) == ("gemini-2.5-flash", last.model_version)
    meta = last.usage_metadata
    assert (row["input_tokens"], row["output_tokens"], row["reasoning_output_tokens"]) == (
        meta.prompt_token_count,
        meta.candidates_token_count,
        meta.thoughts_token_count,
    )
    assert row["findings"] == [] and "gemini-test-key" not in str(row)


def test_gemini_non_streamed_candidates_and_rate_limit(route):
    def call(http, headers):
        client = genai_client(route.url, http, headers)
        return client.models.generate_content(
            model="gemini-2.5-flash", contents="hi", config=genai_types.GenerateContentConfig(candidate_count=2)
        )

    direct, response, mock_id = route.both(call)
    assert response.model_dump(exclude={"sdk_http_response"}) == direct.model_dump(exclude={"sdk_http_response"})
    row = route.row(mock_id)
    texts = ["".join(p.text for p in c.content.parts if p.text and not p.thought) for c in response.candidates]
    assert [c["text"] for c in output_choices(row)] == texts
    assert (row["status"], row["streamed"]) == ("completed", False)

    def limited(http, headers):
        with pytest.raises(genai_errors.ClientError) as error:
            genai_client(route.url, http, headers).models.generate_content(model="gemini-2.5-flash", contents="hi")
        return error.value.code

    direct, code, mock_id = route.both(limited, "status=429")
    row = route.row(mock_id)
    assert code == direct == 429
    assert (row["status"], row["http_status"], row["error_code"]) == ("failed", 429, "RESOURCE_EXHAUSTED")


def test_gemini_json_array_stream_is_streamed_and_audited(proxy, upstreams):
    """streamGenerateContent without alt=sse: a JSON array, forwarded as it comes."""
    up = upstreams["h1"]
    mock_id = uuid.uuid4().hex
    times = []
    with (
        proxy.client() as client,
        client.stream(
            "POST",
            f"{up.url}/v1beta/models/gemini-2.5-flash:streamGenerateContent",
            json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
            headers={"x-mock": "events=4&delay=0.3", "x-mock-id": mock_id, "x-goog-api-key": "secret-key"},
        ) as resp,
    ):
        body = b""
        for chunk in resp.iter_raw():
            body += chunk
            times.append(time.time())
    sent = up.sent(mock_id)
    assert body == sent["body"] and resp.headers["content-type"].startswith("application/json")
    assert times[0] < sent["last_write"] - 0.5, "the JSON array was held back"
    row = proxy.mock_row(mock_id)
    text = "".join(
        p["text"]
        for item in orjson.loads(body)
        for c in item["candidates"]
        for p in c["content"]["parts"]
        if "text" in p
    )
    assert (row["status"], row["streamed"], row["output_text"]) == ("completed", True, text)
    assert row["api_key_fingerprint"].startswith("sha256:")


# -- LMSP ---------------------------------------------------------------------------------------------------


def lmsp_events(body: bytes) -> list[tuple[str, str, dict]]:
    out = []
    for block in body.decode().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "data" in fields:
            out.append((fields.get("id"), fields.get("event"), orjson.loads(fields["data"])))
    return out


def test_lmsp_stream_and_a_resumed_task_are_audited_once(proxy, upstreams):
    up = upstreams["h1"]
    headers = {"Idempotency-Key": "01J8M5T7Z2K4N6Q8S0V3X5B9DG", "LMSP-Version": "1.0"}
    mock_id = uuid.uuid4().hex
    with proxy.client() as client:
        resp = client.post(
            f"{up.url}/lmsp/v1/responses",
            headers=headers | {"x-mock-id": mock_id},
            json={"model": "qwen3:14b", "input": "hi", "stream": True},
        )
    text = "".join(d["delta"] for _, e, d in lmsp_events(resp.content) if e == "response.output_text.delta")
    row = proxy.mock_row(mock_id)
    assert (row["dialect"], row["provider"], row["status"], row["output_text"]) == ("lmsp", "lmsp", "completed", text)
    stored = row["request_headers"]
    assert (stored["idempotency-key"], stored["lmsp-version"]) == (headers["Idempotency-Key"], "1.0")

    task = f"task_{uuid.uuid4().hex[:8]}"
    first_id, second_id = uuid.uuid4().hex, uuid.uuid4().hex
    with proxy.client() as client:
        with client.stream(
            "GET",
            f"{up.url}/lmsp/v1/tasks/{task}/events",
            headers={"x-mock-id": first_id, "x-mock": "events=12&delay=0.1"},
        ) as resp:
            seen = b""
            for chunk in resp.iter_raw():  # the client drops after a few events
                seen += chunk
                if seen.count(b"\n\n") >= 4:
                    break
        last_id = lmsp_events(seen)[-1][0]
        resumed = client.get(
            f"{up.url}/lmsp/v1/tasks/{task}/events", headers={"x-mock-id": second_id, "Last-Event-ID": last_id}
        )
    first, second = proxy.mock_row(first_id), proxy.mock_row(second_id)
    assert first["task_id"] == second["task_id"] == task
    assert first["status"] == "client_aborted" and second["status"] == "completed"
    everything = "".join(
        d["delta"] for _, e, d in lmsp_events(seen + resumed.content) if e == "response.output_text.delta"
    )
    assert first["output_text"] + second["output_text"] == everything
    # events the proxy had already audited for the first exchange (the client had not read
    # them yet) come again after the resume point: counted as replayed, their text not again
    assert second["event_count"] + second["replayed_events"] == len(lmsp_events(resumed.content))


def test_lmsp_synchronous_response_and_stored_retrieval(proxy, upstreams):
    up = upstreams["h1"]
    create_id, get_id = uuid.uuid4().hex, uuid.uuid4().hex
    with proxy.client() as client:
        created = client.post(
            f"{up.url}/lmsp/v1/responses",
            headers={"x-mock-id": create_id, "x-mock": "tool=get_weather"},
            json={
                "model": "qwen3:14b",
                "input": "weather?",
                "store": True,
                "tools": [{"type": "function", "name": "get_weather", "parameters": WEATHER}],
            },
        ).json()
        fetched = client.get(f"{up.url}/lmsp/v1/responses/{created['id']}", headers={"x-mock-id": get_id})
    assert fetched.status_code == 200
    for mock_id in (create_id, get_id):
        row = proxy.mock_row(mock_id)
        assert (row["dialect"], row["status"], row["streamed"], row["response_id"]) == (
            "lmsp",
            "completed",
            False,
            created["id"],
        )
        call = next(i for i in created["output"] if i["type"] == "function_call")
        assert row["tool_calls"] == [{"id": call["call_id"], "name": "get_weather", "arguments": call["arguments"]}]


def test_lmsp_expired_event_history_is_recorded(proxy, upstreams):
    up = upstreams["h1"]
    mock_id = uuid.uuid4().hex
    with proxy.client() as client:
        resp = client.get(
            f"{up.url}/lmsp/v1/tasks/task_old/events?after=3", headers={"x-mock": "expired=1", "x-mock-id": mock_id}
        )
    assert resp.status_code == 410
    row = proxy.mock_row(mock_id)
    assert (row["status"], row["http_status"], row["error_code"]) == ("failed", 410, "event_history_expired")
