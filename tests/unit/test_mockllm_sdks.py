"""The official SDKs (openai, anthropic, google-genai) against the mock, with no proxy.

Each SDK is pointed straight at a plain HTTP/1.1 mock (``base_url``, dummy API
keys, no retries) and must accept what the mock says: typed objects, stream
helpers, typed errors. This proves the mock speaks each API faithfully, so a
proxy test that makes the same calls through mitmproxy tests the proxy, not
the mock. The builders' output is also validated against the SDKs' pydantic
models, which are stricter than the SDKs' own parsing.
"""

from __future__ import annotations

import typing
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import orjson
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel

from mockllm.scenario import Scenario
from mockllm.streams import (
    REFUSAL_TEXT,
    anthropic_events,
    anthropic_message,
    gemini_response,
    gemini_sse_events,
    openai_chat_chunks,
    openai_chat_completion,
    openai_response,
    openai_responses_events,
    tool_arguments,
)

TEXT = "tök0 tök1 tök2 tök3 tök4"
REASONING = "Let me think it över."
MESSAGES: list[Any] = [{"role": "user", "content": "What is the weather in Vienna?"}]
CHAT_TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
RESPONSES_TOOLS: list[Any] = [{"type": "function", "strict": False, **CHAT_TOOLS[0]["function"]}]
ANTHROPIC_TOOLS: list[Any] = [{"name": "get_weather", "input_schema": CHAT_TOOLS[0]["function"]["parameters"]}]
CITIES = [orjson.loads(tool_arguments(i)) for i in range(2)]


@pytest.fixture(scope="module")
def mock_url(upstreams: dict[str, Any]) -> str:
    """The plain HTTP/1.1 mock of the shared ``upstreams`` fixture."""
    url: str = upstreams["h1"].url
    return url


def openai_client(url: str, mock: str = "") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="sk-mock", max_retries=0, default_headers={"x-mock": mock})


def anthropic_client(url: str, mock: str = "") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="sk-ant-mock", max_retries=0, default_headers={"x-mock": mock})


def genai_client(url: str, mock: str = "") -> genai.Client:
    """An API-key client (no ADC lookup); google-genai retries nothing unless told to.

    Use it in a ``with`` block: a client that is garbage-collected closes its connection pool.
    """
    options = genai_types.HttpOptions(base_url=url, headers={"x-mock": mock})
    return genai.Client(api_key="mock-key", http_options=options)


# --- OpenAI Chat Completions -------------------------------------------------------------


def test_openai_chat_create(mock_url: str) -> None:
    completion = openai_client(mock_url).chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert completion.choices[0].message.content == TEXT
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None and (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (
        6,
        5,
    )

    called = openai_client(mock_url, "tool=get_weather&tools=2").chat.completions.create(
        model="gpt-4o", messages=MESSAGES, tools=CHAT_TOOLS, n=2
    )
    assert [choice.index for choice in called.choices] == [0, 1]
    calls = called.choices[1].message.tool_calls or []
    assert [orjson.loads(call.function.arguments) for call in calls] == CITIES
    assert called.choices[1].finish_reason == "tool_calls"


def test_openai_chat_create_stream(mock_url: str) -> None:
    stream = openai_client(mock_url).chat.completions.create(
        model="gpt-4o", messages=MESSAGES, stream=True, stream_options={"include_usage": True}, n=2
    )
    texts = {0: "", 1: ""}
    usage = None
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
        usage = chunk.usage or usage
    assert texts == {0: TEXT, 1: TEXT}
    assert usage is not None and usage.completion_tokens == 10

    arguments: dict[int, str] = {}
    for chunk in openai_client(mock_url, "events=0&tool=get_weather&tools=2").chat.completions.create(
        model="gpt-4o", messages=MESSAGES, tools=CHAT_TOOLS, stream=True
    ):
        for call in chunk.choices[0].delta.tool_calls or []:
            fragment = call.function.arguments if call.function else None
            arguments[call.index] = arguments.get(call.index, "") + (fragment or "")
    assert [orjson.loads(arguments[i]) for i in (0, 1)] == CITIES


def test_openai_chat_stream_helper(mock_url: str) -> None:
    client = openai_client(mock_url, "reasoning=1&tool=get_weather")
    with client.chat.completions.stream(
        model="gpt-4o", messages=MESSAGES, tools=CHAT_TOOLS, stream_options={"include_usage": True}
    ) as stream:
        deltas = [event.delta for event in stream if event.type == "content.delta"]
        final = stream.get_final_completion()
    message = final.choices[0].message
    assert "".join(deltas) == message.content == TEXT
    assert [(call.function.name, call.function.arguments) for call in message.tool_calls or []] == [
        ("get_weather", tool_arguments(0))
    ]
    assert message.model_extra == {"reasoning_content": REASONING}  # llama.cpp's field, unknown to the SDK
    assert final.usage is not None and final.usage.completion_tokens == 3 + 5 + 6

    strict: list[Any] = [{"type": "function", "function": {**CHAT_TOOLS[0]["function"], "strict": True}}]
    with pytest.raises(openai.LengthFinishReasonError):  # a tool call cut by the token limit, for a parsing helper
        with openai_client(mock_url, "tool=get_weather&truncate_tool=1").chat.completions.stream(
            model="gpt-4o", messages=MESSAGES, tools=strict
        ) as stream:
            stream.until_done()


def test_openai_chat_errors(mock_url: str) -> None:
    with pytest.raises(openai.RateLimitError) as limited:
        openai_client(mock_url, "status=429").chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert limited.value.code == "rate_limit_exceeded" and limited.value.type == "requests"
    with pytest.raises(openai.APIError) as failed:
        for _ in openai_client(mock_url, "error=server_overloaded&error_after=2").chat.completions.create(
            model="gpt-4o", messages=MESSAGES, stream=True
        ):
            pass
    assert failed.value.code == "server_overloaded" and failed.value.message == "mock error: server_overloaded"
    refused = openai_client(mock_url, "refusal=1").chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert (refused.choices[0].message.content, refused.choices[0].message.refusal) == (None, REFUSAL_TEXT)


# --- OpenAI Responses -------------------------------------------------------------------------


def test_openai_responses_create(mock_url: str) -> None:
    client = openai_client(mock_url, "reasoning=1&tool=get_weather")
    events = list(
        client.responses.create(model="gpt-5", input="Weather in Vienna?", tools=RESPONSES_TOOLS, stream=True)
    )
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert [event.sequence_number for event in events] == list(range(len(events)))
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert text == TEXT
    final = events[-1].response
    assert [item.type for item in final.output] == ["reasoning", "message", "function_call"]
    call = final.output[2]
    assert call.type == "function_call" and (call.name, call.arguments) == ("get_weather", tool_arguments(0))
    assert call.call_id.startswith("call_") and (call.id or "").startswith("fc_")
    assert final.usage is not None and final.usage.output_tokens_details.reasoning_tokens == 3

    whole = openai_client(mock_url).responses.create(model="gpt-5", input="Weather in Vienna?")
    assert whole.output_text == TEXT and whole.status == "completed"


def test_openai_responses_stream_helper(mock_url: str) -> None:
    client = openai_client(mock_url, "reasoning=1&tool=get_weather&tools=2")
    with client.responses.stream(model="gpt-5", input="Weather in Vienna?", tools=RESPONSES_TOOLS) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == TEXT
    calls = [item for item in final.output if item.type == "function_call"]
    assert [orjson.loads(call.arguments) for call in calls] == CITIES


def test_openai_responses_errors(mock_url: str) -> None:
    events = list(
        openai_client(mock_url, "error=server_error&error_after=2").responses.create(
            model="gpt-5", input="hi", stream=True
        )
    )
    assert events[-1].type == "response.failed"
    failed = events[-1].response
    assert failed.error is not None and failed.error.code == "server_error"
    assert failed.output[0].content[0].text == "tök0 tök1"
    with pytest.raises(openai.InternalServerError):
        openai_client(mock_url, "status=500").responses.create(model="gpt-5", input="hi")
    with pytest.raises(openai.InternalServerError):  # a request that does not stream fails as a whole
        openai_client(mock_url, "error=server_error").responses.create(model="gpt-5", input="hi")


# --- Anthropic Messages ---------------------------------------------------------------------------


def test_anthropic_messages_create(mock_url: str) -> None:
    message = anthropic_client(mock_url, "thinking=1&tool=get_weather").messages.create(
        model="claude-sonnet-4", max_tokens=1024, messages=MESSAGES, tools=ANTHROPIC_TOOLS
    )
    assert [block.type for block in message.content] == ["thinking", "text", "tool_use"]
    assert message.content[0].thinking == REASONING
    assert message.content[1].text == TEXT
    assert message.content[2].input == CITIES[0]
    assert message.stop_reason == "tool_use" and message.usage.input_tokens == 6


def test_anthropic_messages_stream(mock_url: str) -> None:
    client = anthropic_client(mock_url, "thinking=1&tool=get_weather&tools=2")
    with client.messages.stream(
        model="claude-sonnet-4", max_tokens=1024, messages=MESSAGES, tools=ANTHROPIC_TOOLS
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == TEXT
    assert [block.type for block in final.content] == ["thinking", "text", "tool_use", "tool_use"]
    assert [block.input for block in final.content if block.type == "tool_use"] == CITIES
    assert final.stop_reason == "tool_use" and final.usage.output_tokens == 3 + 5 + 12

    with anthropic_client(mock_url, "tool=make_file&truncate_tool=1").messages.stream(
        model="claude-sonnet-4", max_tokens=1024, messages=MESSAGES, tools=ANTHROPIC_TOOLS
    ) as stream:
        cut = stream.get_final_message()
    assert cut.stop_reason == "max_tokens" and cut.content[-1].type == "tool_use"


def test_anthropic_errors(mock_url: str) -> None:
    with pytest.raises(anthropic.RateLimitError) as limited:
        anthropic_client(mock_url, "status=429").messages.create(model="claude", max_tokens=10, messages=MESSAGES)
    assert limited.value.body == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "mock error: rate_limit_error"},
    }
    received = []
    with pytest.raises(anthropic.APIStatusError) as failed:
        with anthropic_client(mock_url, "error=overloaded_error&error_after=2").messages.stream(
            model="claude", max_tokens=10, messages=MESSAGES
        ) as stream:
            for text in stream.text_stream:
                received.append(text)
    assert received == ["tök0", " tök1"]  # the partial answer came before the error event
    assert failed.value.body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "mock error: overloaded_error"},
    }


# --- Google Gemini ------------------------------------------------------------------------------------


def test_genai_generate_content(mock_url: str) -> None:
    with genai_client(mock_url) as client:
        response = client.models.generate_content(model="gemini-2.5-flash", contents="Weather in Vienna?")
    assert response.text == TEXT and response.model_version == "gemini-2.5-flash"
    assert response.usage_metadata is not None and response.usage_metadata.candidates_token_count == 5

    config = genai_types.GenerateContentConfig(candidate_count=2)
    with genai_client(mock_url, "thinking=1&tool=get_weather") as client:
        both = client.models.generate_content(model="gemini-2.5-flash", contents="Weather in Vienna?", config=config)
    assert len(both.candidates or []) == 2
    parts = both.candidates[1].content.parts
    assert [(part.thought, part.text) for part in parts[:2]] == [(True, REASONING), (None, TEXT)]
    assert [(call.name, call.args) for call in both.function_calls or []] == [("get_weather", CITIES[0])]


def test_genai_generate_content_stream(mock_url: str) -> None:
    with genai_client(mock_url, "thinking=1&tool=get_weather&tools=2") as client:
        chunks = list(client.models.generate_content_stream(model="gemini-2.5-flash", contents="Weather in Vienna?"))
    parts = [part for chunk in chunks for part in chunk.candidates[0].content.parts]
    assert "".join(part.text or "" for part in parts if not part.thought) == TEXT
    assert "".join(part.text or "" for part in parts if part.thought) == REASONING
    assert [call.args for call in chunks[-1].function_calls or []] == CITIES
    assert chunks[-1].candidates[0].finish_reason == genai_types.FinishReason.STOP
    usage = chunks[-1].usage_metadata
    assert usage is not None and (usage.prompt_token_count, usage.thoughts_token_count) == (3, 3)


def test_genai_errors(mock_url: str) -> None:
    with genai_client(mock_url, "status=429") as client, pytest.raises(genai_errors.ClientError) as limited:
        client.models.generate_content(model="gemini-2.5-flash", contents="hi")
    assert (limited.value.code, limited.value.status) == (429, "RESOURCE_EXHAUSTED")
    received = []
    with (
        genai_client(mock_url, "error=UNAVAILABLE&error_after=2") as client,
        pytest.raises(genai_errors.ServerError) as failed,
    ):
        for chunk in client.models.generate_content_stream(model="gemini-2.5-flash", contents="hi"):
            received.append(chunk.text)
    assert received == ["tök0", " tök1"] and (failed.value.code, failed.value.status) == (503, "UNAVAILABLE")


# --- the builders against the SDKs' models ----------------------------------------------------------

STREAM_SCENARIOS = [
    "reasoning=1&tool=get_weather&tools=2",
    "refusal=1&usage=0",
    "tool=f&truncate_tool=1",
    "error=server_error&error_after=2&reasoning=1",
    "n=2&events=0",
]


def stream_data(items: list[bytes]) -> Iterator[dict[str, Any]]:
    """The JSON ``data`` of every event (not OpenAI's ``[DONE]``)."""
    for line in b"".join(items).replace(b"\r\n", b"\n").split(b"\n"):
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            yield orjson.loads(line[6:])


def models_by_type(union: Any) -> dict[str, type[BaseModel]]:
    """The members of a discriminated union of event models, by their ``type`` literal."""
    members = typing.get_args(union)
    if not hasattr(members[0], "model_fields"):  # Annotated[Union[...], discriminator]
        members = typing.get_args(members[0])
    return {typing.get_args(model.model_fields["type"].annotation)[0]: model for model in members}


@pytest.mark.parametrize("query", STREAM_SCENARIOS)
def test_builders_validate_against_sdk_models(query: str) -> None:
    scenario = Scenario.parse(query)
    whole = Scenario.parse(query.replace("error=server_error&", ""))  # requests that do not stream never fail inline
    request = {"model": "m", "messages": MESSAGES, "input": "hi", "stream_options": {"include_usage": True}}
    for data in stream_data(openai_chat_chunks(request, scenario)):
        if "error" not in data:
            ChatCompletionChunk.model_validate(data)
    ChatCompletion.model_validate(openai_chat_completion(request, whole))

    responses_events = models_by_type(ResponseStreamEvent)
    for data in stream_data(openai_responses_events(request, scenario)):
        responses_events[data["type"]].model_validate(data)
    Response.model_validate(openai_response(request, whole))

    anthropic_models = models_by_type(RawMessageStreamEvent)
    for data in stream_data(anthropic_events(request, scenario)):
        if data["type"] not in {"ping", "error"}:  # the SDK handles those before its models
            anthropic_models[data["type"]].model_validate(data)
    Message.model_validate(anthropic_message(request, whole))

    for data in stream_data(gemini_sse_events(request, scenario)):
        if "error" not in data:
            genai_types.GenerateContentResponse.model_validate(data)
    genai_types.GenerateContentResponse.model_validate(gemini_response(request, whole))
