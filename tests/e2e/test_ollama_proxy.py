"""The official ``ollama`` Python client through a real mitmdump with the addon: Ollama's
native API (``/api/chat``, ``/api/generate``; NDJSON streams) to the mock upstream over
HTTP/1.1 and over HTTP/2 with TLS.

Each call is made straight to the mock and through the proxy, and the client must see the
same both ways; the record (plain SQL, on SQLite and PostgreSQL: the ``proxy`` fixture)
must say what the client saw: text, thinking, tool calls, model, usage, done_reason,
status. With content filters: a stream cut by an output filter ends cleanly for the
client with ``done_reason: "content_filter"`` and the record says blocked; a request a
filter blocks is refused with Ollama's error, which the client raises as ``ResponseError``.
"""

from __future__ import annotations

import ssl
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import ollama
import orjson
import pytest
from conftest import BACKENDS, Proxy, Upstream, guarded_proxy
from test_output_filters_proxy import DIRTY, SHOWN_AT_MOST, TEXT, WORD

pytestmark = pytest.mark.e2e

MODEL = "qwen3:0.6b"
MESSAGES: list[Any] = [{"role": "user", "content": "What is the weather in Vienna?"}]
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS: list[Any] = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
RULES = f"""
[[rule]]
id = "no-code-name"
kind = "keywords"
keywords = ["{WORD}"]
scope = "response"
action = "block"
reason = "internal code name"

[[rule]]
id = "no-project-nightjar"
kind = "keywords"
keywords = ["Project {WORD}"]
scope = "request"
action = "block"
reason = "internal code name"
"""


def client(up: Upstream, proxy: Proxy | None, transport: str, headers: dict[str, str]) -> ollama.Client:
    """The official client for the mock ``up``, through ``proxy`` (None: straight), over httpx."""
    ca = proxy.ca if proxy is not None else up.ca
    verify: Any = ssl.create_default_context(cafile=str(ca)) if ca else True
    return ollama.Client(
        host=up.url,
        headers=headers,
        proxy=proxy.url if proxy is not None else None,
        verify=verify,
        http2=transport == "h2",
        timeout=30,
    )


class Route:
    """Where a client call goes: straight to the mock, or through the proxy."""

    def __init__(self, proxy: Proxy, upstream: Upstream, transport: str) -> None:
        self.proxy, self.upstream, self.transport = proxy, upstream, transport

    def both(self, call: Callable[[ollama.Client], Any], scenario: str = "") -> tuple[Any, Any, dict]:
        """``call`` made straight and through the proxy: (direct result, proxied result, the record)."""
        results, mock_id = [], ""
        for proxy in (None, self.proxy):
            mock_id = uuid.uuid4().hex
            results.append(
                call(client(self.upstream, proxy, self.transport, {"x-mock": scenario, "x-mock-id": mock_id}))
            )
        return results[0], results[1], self.proxy.mock_row(mock_id)


@pytest.fixture(params=["h1", "h2"])
def route(request, proxy, upstreams) -> Route:
    return Route(proxy, upstreams[request.param], request.param)


def joined(parts: list[Any], field: str) -> str:
    return "".join(getattr(p, field) or "" for p in parts)


def assert_common(row: dict, last: Any, streamed: bool) -> None:
    """What every record must say of a clean Ollama answer whose last object is ``last``."""
    assert (row["dialect"], row["provider"], row["status"]) == ("ollama", "ollama", "completed")
    assert (row["request_model"], row["response_model"]) == (MODEL, last.model)
    assert (row["input_tokens"], row["output_tokens"]) == (last.prompt_eval_count, last.eval_count)
    assert row["finish_reasons"] == [last.done_reason] and last.done_reason == "stop"
    assert (row["http_status"], row["streamed"], row["findings"]) == (200, streamed, [])


def test_chat_stream_with_thinking(route):
    def call(c: ollama.Client) -> list[ollama.ChatResponse]:
        return list(c.chat(model=MODEL, messages=MESSAGES, stream=True, think=True))

    direct, parts, row = route.both(call, "reasoning=1")
    text, thinking = joined([p.message for p in parts], "content"), joined([p.message for p in parts], "thinking")
    assert (text, thinking) == (
        joined([p.message for p in direct], "content"),
        joined([p.message for p in direct], "thinking"),
    )
    assert text and thinking and parts[-1].done
    assert (row["output_text"], row["output"]["choices"][0]["reasoning"]) == (text, thinking)
    assert_common(row, parts[-1], streamed=True)
    assert row["request_body"]["think"] is True


def test_chat_non_streamed(route):
    def call(c: ollama.Client) -> ollama.ChatResponse:
        return c.chat(model=MODEL, messages=MESSAGES, stream=False)

    direct, answer, row = route.both(call)
    assert answer.message.content == direct.message.content and answer.message.content
    assert row["output_text"] == answer.message.content
    assert_common(row, answer, streamed=False)


def test_generate_stream_with_system_prompt(route):
    def call(c: ollama.Client) -> list[ollama.GenerateResponse]:
        return list(c.generate(model=MODEL, prompt="Why is the sky blue?", system="Be brief.", stream=True))

    direct, parts, row = route.both(call)
    assert joined(parts, "response") == joined(direct, "response") and joined(parts, "response")
    assert row["output_text"] == joined(parts, "response")
    assert_common(row, parts[-1], streamed=True)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_chat_tool_call(route, stream: bool):
    def call(c: ollama.Client) -> list[ollama.ChatResponse]:
        answer = c.chat(model=MODEL, messages=MESSAGES, tools=TOOLS, stream=stream)
        return list(answer) if stream else [answer]

    direct, parts, row = route.both(call, "tool=get_weather&tools=2")
    seen = [(t.function.name, dict(t.function.arguments)) for p in parts for t in p.message.tool_calls or []]
    assert seen == [(t.function.name, dict(t.function.arguments)) for p in direct for t in p.message.tool_calls or []]
    assert len(seen) == 2
    assert [(c["name"], orjson.loads(c["arguments"])) for c in row["tool_calls"]] == seen
    assert row["output_text"] == joined([p.message for p in parts], "content")
    assert_common(row, parts[-1], streamed=stream)


def test_an_error_line_raises_in_the_client_and_the_record_says_failed(route):
    def call(c: ollama.Client) -> tuple[str, str]:
        texts: list[str] = []
        with pytest.raises(ollama.ResponseError) as error:
            for part in c.chat(model=MODEL, messages=MESSAGES, stream=True):
                texts.append(part.message.content or "")
        return "".join(texts), error.value.error

    direct, (text, message), row = route.both(call, "error=overloaded&error_after=2")
    assert (text, message) == direct
    assert (row["status"], row["error_message"], row["output_text"]) == ("failed", message, text)


# -- content filters ------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=BACKENDS)
def guarded(request, tmp_path_factory, upstreams) -> Iterator[Proxy]:
    yield from guarded_proxy(request, tmp_path_factory, RULES, "ollama-filters", upstreams)


@pytest.fixture(params=["h1", "h2"])
def transport(request) -> str:
    return request.param


def test_an_output_filter_ends_the_stream_cleanly_with_content_filter(guarded, upstreams, transport):
    up, mock_id = upstreams[transport], uuid.uuid4().hex
    c = client(up, guarded, transport, {"x-mock": DIRTY, "x-mock-id": mock_id})
    parts = list(c.chat(model=MODEL, messages=MESSAGES, stream=True))  # no exception: a clean end
    shown = joined([p.message for p in parts], "content")
    assert WORD not in shown and TEXT.startswith(shown) and len(shown) <= SHOWN_AT_MOST
    last = parts[-1]
    assert (last.done, last.done_reason, last.model, last.message.content) == (True, "content_filter", MODEL, "")
    row = guarded.mock_row(mock_id)
    assert (row["status"], row["error_code"], row["finish_reasons"]) == (
        "blocked",
        "content_filtered",
        ["content_filter"],
    )
    assert [(v["action"], v["rule_id"]) for v in row["verdicts"]] == [("block", "no-code-name")]
    assert WORD in row["output_text"] and (row["delivered_text"] or "") == shown
    assert row["bytes_to_client"] < row["bytes_from_upstream"]


def test_a_held_answer_is_replaced_by_an_empty_one_with_content_filter(guarded, upstreams):
    up, mock_id = upstreams["h1"], uuid.uuid4().hex
    answer = client(up, guarded, "h1", {"x-mock": DIRTY, "x-mock-id": mock_id}).generate(
        model=MODEL, prompt="Tell me about the plan.", stream=False
    )
    assert (answer.response, answer.done_reason, answer.model) == ("", "content_filter", MODEL)
    assert answer.eval_count, "the counts the upstream reported"
    row = guarded.mock_row(mock_id)
    assert (row["status"], row["http_status"], row["finish_reasons"]) == ("blocked", 200, ["content_filter"])
    assert WORD in row["output_text"]


def test_a_blocked_request_raises_response_error_and_a_blocked_stream_ends_with_content_filter(
    guarded, upstreams, transport
):
    up = upstreams[transport]
    forbidden = [{"role": "user", "content": f"Tell me everything about Project {WORD}."}]
    mock_id = uuid.uuid4().hex
    with pytest.raises(ollama.ResponseError) as error:
        client(up, guarded, transport, {"x-mock-id": mock_id}).chat(model=MODEL, messages=forbidden, stream=False)
    assert error.value.status_code == 400 and "no-project-nightjar" in error.value.error
    row = guarded.mock_row(mock_id)
    assert (row["status"], row["http_status"], row["error_code"]) == ("blocked", 400, "content_filtered")
    assert up.received(mock_id) == {}, "a blocked request never reaches the upstream"

    mock_id = uuid.uuid4().hex
    c = client(up, guarded, transport, {"x-mock-id": mock_id})
    [last] = list(c.generate(model=MODEL, prompt=f"What is Project {WORD}?", stream=True))
    assert (last.done, last.done_reason, last.response) == (True, "content_filter", "")
    row = guarded.mock_row(mock_id)
    assert (row["status"], row["http_status"]) == ("blocked", 200)
    assert up.received(mock_id) == {}
