"""AWS Bedrock (boto3's ``bedrock-runtime``) and Anthropic on Vertex (the anthropic SDK's
``AnthropicVertex``) through a real mitmdump with the addon, against the mock upstream
(HTTP/1.1 plain, and TLS), with dummy credentials. boto3 speaks HTTP/1.1, so the proxy
does too; one test drives the same stream over HTTP/2 end to end with httpx.

Each test checks that what the SDK returns equals what the record says (text, model,
usage, stop reason, status) on SQLite and PostgreSQL, and that blocks by an output or a
request filter reach boto3 as its own errors (``EventStreamError``, ``ClientError``).
"""

from __future__ import annotations

import json
import ssl
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import anthropic
import boto3
import httpx2  # the anthropic SDK's HTTP client library
import orjson
import pytest
from botocore.config import Config
from botocore.eventstream import EventStreamBuffer
from botocore.exceptions import ClientError, EventStreamError
from conftest import BACKENDS, Proxy, Upstream, guarded_proxy, wait_for

pytestmark = pytest.mark.e2e

NOVA = "us.amazon.nova-micro-v1:0"
CLAUDE = "us.anthropic.claude-sonnet-4-20250514-v1:0"
ACCESS_KEY = "AKIAIOSFODNN7EXAMPLE"
SESSION_TOKEN = "FwoGZXIvYXdzEXAMPLE" + "Tok3n" * 20
MESSAGES: list[Any] = [{"role": "user", "content": [{"text": "What is the weather in Vienna?"}]}]
TOOLS = {
    "tools": [{"toolSpec": {"name": "get_weather", "inputSchema": {"json": {"type": "object", "properties": {}}}}}]
}
ANTHROPIC_BODY = {
    "anthropic_version": "bedrock-2023-05-31",
    "max_tokens": 100,
    "messages": [{"role": "user", "content": "hi"}],
}

WORD = "Nightjar"
RULES = f"""
[[rule]]
id = "no-code-name"
kind = "keywords"
keywords = ["{WORD}"]
scope = "response"
action = "block"
reason = "internal code name"

[[rule]]
id = "no-project"
kind = "keywords"
keywords = ["Project Falcon"]
scope = "request"
action = "block"
reason = "secret project"
"""
TEXT = f"Sure. The plan you ask about is called {WORD} and it " + "goes on and on " * 20
DIRTY = "events=60&delay=0.05&text=" + TEXT.replace(" ", "+")


@pytest.fixture(params=["h1", "h2"])
def upstream(request, upstreams) -> Upstream:
    return upstreams[request.param]


def client(proxy: Proxy, upstream: Upstream, scenario: str = "") -> tuple[Any, str]:
    """A boto3 bedrock-runtime client for the mock through the proxy, and the mock id its
    requests carry (``x-mock-id``; ``x-mock``: the scenario), added before signing."""
    mock_id = uuid.uuid4().hex
    bedrock = boto3.client(
        "bedrock-runtime",
        region_name="us-east-1",
        endpoint_url=upstream.url,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key="wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        aws_session_token=SESSION_TOKEN,
        verify=str(proxy.ca),
        config=Config(
            proxies={"http": proxy.url, "https": proxy.url}, retries={"total_max_attempts": 1}, read_timeout=30
        ),
    )

    def headers(request: Any, **_: Any) -> None:
        request.headers["x-mock-id"] = mock_id
        if scenario:
            request.headers["x-mock"] = scenario

    bedrock.meta.events.register("before-sign.bedrock-runtime.*", headers)
    return bedrock, mock_id


def assert_no_credentials(row: dict) -> None:
    stored = orjson.dumps(row).decode()
    assert ACCESS_KEY not in stored and SESSION_TOKEN not in stored and "Signature=" not in stored
    assert row["request_headers"]["authorization"].startswith("[redacted sha256:")
    assert row["request_headers"]["x-amz-security-token"].startswith("[redacted sha256:")
    assert row["api_key_fingerprint"].startswith("sha256:")


def converse_stream_view(stream: Any) -> dict[str, Any]:
    """What an application reads from ConverseStream: text, reasoning, tool calls, stop, usage."""
    view: dict[str, Any] = {"text": "", "reasoning": "", "tools": {}, "stop": None, "usage": None}
    for event in stream:
        if "contentBlockStart" in event:
            tool = event["contentBlockStart"]["start"]["toolUse"]
            view["tools"][event["contentBlockStart"]["contentBlockIndex"]] = [tool["toolUseId"], tool["name"], ""]
        elif "contentBlockDelta" in event:
            delta, index = event["contentBlockDelta"]["delta"], event["contentBlockDelta"]["contentBlockIndex"]
            view["text"] += delta.get("text", "")
            view["reasoning"] += delta.get("reasoningContent", {}).get("text", "")
            if "toolUse" in delta:
                view["tools"][index][2] += delta["toolUse"]["input"]
        elif "messageStop" in event:
            view["stop"] = event["messageStop"]["stopReason"]
        elif "metadata" in event:
            view["usage"] = event["metadata"]["usage"]
    return view


def calls(row: dict) -> list[list]:
    return [[c["id"], c["name"], c["arguments"]] for c in row["tool_calls"]]


# -- ConverseStream and Converse ---------------------------------------------------------------------


def test_converse_stream(proxy, upstream):
    bedrock, mock_id = client(proxy, upstream, "reasoning=1&tool=get_weather&tools=2")
    response = bedrock.converse_stream(modelId=NOVA, messages=MESSAGES, toolConfig=TOOLS)
    sdk = converse_stream_view(response["stream"])
    assert sdk["text"] and sdk["reasoning"] and len(sdk["tools"]) == 2

    row = proxy.mock_row(mock_id)
    assert (row["dialect"], row["provider"], row["status"], row["streamed"]) == (
        "bedrock",
        "aws.bedrock",
        "completed",
        True,
    )
    assert (row["http_status"], row["request_model"]) == (response["ResponseMetadata"]["HTTPStatusCode"], NOVA)
    assert row["output_text"] == sdk["text"]
    assert row["output"]["choices"][0]["reasoning"] == sdk["reasoning"]
    assert calls(row) == [sdk["tools"][i] for i in sorted(sdk["tools"])]
    assert row["finish_reasons"] == [sdk["stop"]] == ["tool_use"]
    assert (row["input_tokens"], row["output_tokens"]) == (sdk["usage"]["inputTokens"], sdk["usage"]["outputTokens"])
    assert row["findings"] == [] and row["event_count"] > 5
    assert row["request_body"]["messages"] == MESSAGES
    assert_no_credentials(row)


def test_converse(proxy, upstream):
    bedrock, mock_id = client(proxy, upstream, "tool=get_weather")
    answer = bedrock.converse(modelId=CLAUDE, messages=MESSAGES, toolConfig=TOOLS)
    content = answer["output"]["message"]["content"]
    row = proxy.mock_row(mock_id)
    assert (row["dialect"], row["status"], row["streamed"], row["request_model"]) == (
        "bedrock",
        "completed",
        False,
        CLAUDE,
    )
    assert row["output_text"] == "".join(block.get("text", "") for block in content)
    assert calls(row) == [
        [b["toolUse"]["toolUseId"], b["toolUse"]["name"], json.dumps(b["toolUse"]["input"], separators=(",", ":"))]
        for b in content
        if "toolUse" in b
    ]
    assert row["finish_reasons"] == [answer["stopReason"]]
    assert (row["input_tokens"], row["output_tokens"]) == (
        answer["usage"]["inputTokens"],
        answer["usage"]["outputTokens"],
    )


def test_a_stream_exception_is_boto3s_event_stream_error_and_fails_the_record(proxy, upstream):
    bedrock, mock_id = client(proxy, upstream, "error=throttlingException&error_after=2")
    text = ""
    with pytest.raises(EventStreamError) as raised:
        for event in bedrock.converse_stream(modelId=NOVA, messages=MESSAGES)["stream"]:
            text += event.get("contentBlockDelta", {}).get("delta", {}).get("text", "")
    error = raised.value.response["Error"]
    row = proxy.mock_row(mock_id)
    assert (row["status"], row["error_code"], row["error_message"]) == ("failed", error["Code"], error["Message"])
    assert error["Code"] == "throttlingException" and row["output_text"] == text and text


def test_an_http_error_is_boto3s_client_error(proxy, upstream):
    bedrock, mock_id = client(proxy, upstream, "status=429")
    with pytest.raises(ClientError) as raised:
        bedrock.converse(modelId=NOVA, messages=MESSAGES)
    row = proxy.mock_row(mock_id)
    assert raised.value.response["Error"]["Code"] == "ThrottlingException"
    assert (row["status"], row["http_status"], row["error_code"]) == ("failed", 429, "ThrottlingException")


def test_converse_stream_over_http2_end_to_end(proxy, upstreams):
    """boto3 speaks HTTP/1.1, and so then does the proxy to the upstream: an HTTP/2
    client makes the whole path HTTP/2 (the body read back with botocore's own parser)."""
    upstream, mock_id = upstreams["h2"], uuid.uuid4().hex
    with proxy.client(http2=True) as http:
        response = http.post(
            f"{upstream.url}/model/{quote(NOVA, safe='')}/converse-stream",
            json={"messages": MESSAGES},
            headers={"x-mock-id": mock_id, "x-mock": "events=40"},
        )
    assert (response.http_version, upstream.received(mock_id)["http_version"]) == ("HTTP/2", "2")
    buffer = EventStreamBuffer()
    buffer.add_data(response.content)
    events = [(m.headers[":event-type"], orjson.loads(m.payload)) for m in buffer]
    text = "".join(p["delta"].get("text", "") for kind, p in events if kind == "contentBlockDelta")
    row = proxy.mock_row(mock_id)
    assert (row["status"], row["request_model"], row["output_text"]) == ("completed", NOVA, text)
    assert row["output_tokens"] == events[-1][1]["usage"]["outputTokens"] == 40


# -- InvokeModelWithResponseStream and InvokeModel -------------------------------------------------------


def test_invoke_with_response_stream_anthropic_inside(proxy, upstream):
    bedrock, mock_id = client(proxy, upstream, "reasoning=1")
    response = bedrock.invoke_model_with_response_stream(modelId=CLAUDE, body=json.dumps(ANTHROPIC_BODY))
    events = [json.loads(e["chunk"]["bytes"]) for e in response["body"]]
    text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    start = events[0]["message"]
    final = [e for e in events if e["type"] == "message_delta"][-1]
    row = proxy.mock_row(mock_id)
    assert (row["dialect"], row["status"], row["request_model"]) == ("bedrock", "completed", CLAUDE)
    assert (row["output_text"], row["response_model"], row["response_id"]) == (text, start["model"], start["id"])
    assert row["finish_reasons"] == [final["delta"]["stop_reason"]]
    assert (row["input_tokens"], row["output_tokens"]) == (
        start["usage"]["input_tokens"],
        final["usage"]["output_tokens"],
    )
    assert row["output"]["choices"][0]["reasoning"] and row["findings"] == []


def test_invoke_with_response_stream_other_model(proxy, upstream):
    bedrock, mock_id = client(proxy, upstream)
    response = bedrock.invoke_model_with_response_stream(
        modelId="meta.llama3-8b-instruct-v1:0", body=b'{"prompt":"hi"}'
    )
    chunks = [json.loads(e["chunk"]["bytes"]) for e in response["body"]]
    metrics = chunks[-1]["amazon-bedrock-invocationMetrics"]
    row = proxy.mock_row(mock_id)
    assert (row["status"], row["output_text"]) == ("completed", "".join(c["generation"] for c in chunks))
    assert (row["input_tokens"], row["output_tokens"]) == (metrics["inputTokenCount"], metrics["outputTokenCount"])
    assert row["finish_reasons"] == [chunks[-1]["stop_reason"]]


def test_invoke_model(proxy, upstream):
    bedrock, mock_id = client(proxy, upstream)
    answer = json.loads(bedrock.invoke_model(modelId=CLAUDE, body=json.dumps(ANTHROPIC_BODY))["body"].read())
    row = proxy.mock_row(mock_id)
    assert (row["status"], row["streamed"]) == ("completed", False)
    assert row["output_text"] == answer["content"][0]["text"]
    assert (row["response_model"], row["finish_reasons"]) == (answer["model"], [answer["stop_reason"]])
    assert row["output_tokens"] == answer["usage"]["output_tokens"]


# -- Anthropic on Vertex -------------------------------------------------------------------------------


def test_anthropic_vertex_stream_and_message(proxy, upstream):
    verify = ssl.create_default_context(cafile=str(proxy.ca))
    for stream in (True, False):
        mock_id = uuid.uuid4().hex
        with httpx2.Client(proxy=proxy.url, verify=verify, timeout=30) as http:
            vertex = anthropic.AnthropicVertex(
                region="us-east5",
                project_id="my-project",
                access_token="ya29.dummy-token",
                base_url=f"{upstream.url}/v1",
                http_client=http,
                max_retries=0,
            )
            kwargs: dict[str, Any] = {
                "model": "claude-sonnet-4@20250514",
                "max_tokens": 100,
                "messages": [{"role": "user", "content": "hi"}],
                "extra_headers": {"x-mock-id": mock_id},
            }
            if stream:
                with vertex.messages.stream(**kwargs) as events:
                    message = events.get_final_message()
            else:
                message = vertex.messages.create(**kwargs)
        row = proxy.mock_row(mock_id)
        assert row["url_path"].endswith(":streamRawPredict" if stream else ":rawPredict")
        assert (row["dialect"], row["provider"], row["status"], row["streamed"]) == (
            "anthropic-messages",
            "gcp.vertex_ai",
            "completed",
            stream,
        )
        assert (row["request_model"], row["response_model"]) == ("claude-sonnet-4@20250514", message.model)
        assert row["output_text"] == message.content[0].text
        assert (row["output_tokens"], row["finish_reasons"]) == (message.usage.output_tokens, [message.stop_reason])


# -- content filters: boto3 sees Bedrock's own errors ------------------------------------------------------


@pytest.fixture(scope="module", params=BACKENDS)
def guarded(request, tmp_path_factory, upstreams) -> Iterator[Proxy]:
    yield from guarded_proxy(request, tmp_path_factory, RULES, "bedrock-filters", upstreams)


def assert_cut(proxy: Proxy, upstream: Upstream, mock_id: str, shown: str) -> dict:
    assert WORD not in shown and TEXT.startswith(shown)
    row = proxy.mock_row(mock_id)
    assert (row["status"], row["error_code"]) == ("blocked", "content_filtered")
    assert WORD in row["output_text"] and (row["delivered_text"] or "") == shown
    assert row["finish_reasons"] == ["validationException"]
    sent = wait_for(
        lambda: (s := upstream.sent(mock_id)) and (s["disconnected"] or s["completed"]) and s,
        timeout=5,
        what="the upstream's stream to end",
    )
    assert sent["disconnected"] and not sent["completed"], "the upstream must be told to stop"
    return row


def test_an_output_filter_cuts_converse_stream_with_a_validation_exception(guarded, upstream):
    bedrock, mock_id = client(guarded, upstream, DIRTY)
    shown = ""
    with pytest.raises(EventStreamError) as raised:
        for event in bedrock.converse_stream(modelId=NOVA, messages=MESSAGES)["stream"]:
            shown += event.get("contentBlockDelta", {}).get("delta", {}).get("text", "")
    error = raised.value.response["Error"]
    assert error["Code"] == "validationException" and "no-code-name" in error["Message"]
    assert_cut(guarded, upstream, mock_id, shown)


def test_an_output_filter_cuts_invoke_with_response_stream(guarded, upstream):
    bedrock, mock_id = client(guarded, upstream, DIRTY)
    shown = ""
    with pytest.raises(EventStreamError) as raised:
        response = bedrock.invoke_model_with_response_stream(modelId=CLAUDE, body=json.dumps(ANTHROPIC_BODY))
        for event in response["body"]:
            native = json.loads(event["chunk"]["bytes"])
            shown += native.get("delta", {}).get("text", "") if native["type"] == "content_block_delta" else ""
    assert raised.value.response["Error"]["Code"] == "validationException"
    assert_cut(guarded, upstream, mock_id, shown)


def test_a_blocked_request_is_boto3s_error_streaming_or_not(guarded, upstream):
    secret = [{"role": "user", "content": [{"text": "Tell me about Project Falcon"}]}]
    bedrock, mock_id = client(guarded, upstream)
    with pytest.raises(EventStreamError) as streamed:
        list(bedrock.converse_stream(modelId=NOVA, messages=secret)["stream"])
    assert streamed.value.response["Error"]["Code"] == "validationException"
    row = guarded.mock_row(mock_id)
    assert (row["status"], row["http_status"]) == ("blocked", 200) and upstream.received(mock_id) == {}

    bedrock, mock_id = client(guarded, upstream)
    with pytest.raises(ClientError) as refused:
        bedrock.converse(modelId=NOVA, messages=secret)
    error = refused.value.response["Error"]
    assert (refused.value.response["ResponseMetadata"]["HTTPStatusCode"], error["Code"]) == (400, "ValidationException")
    assert "no-project" in error["Message"]
    row = guarded.mock_row(mock_id)
    assert (row["status"], row["http_status"]) == ("blocked", 400) and upstream.received(mock_id) == {}


def test_a_held_converse_answer_is_replaced_by_a_filtered_one(guarded, upstream):
    bedrock, mock_id = client(guarded, upstream, "text=" + TEXT.replace(" ", "+"))
    answer = bedrock.converse(modelId=NOVA, messages=MESSAGES)
    assert (answer["stopReason"], answer["output"]["message"]["content"]) == ("content_filtered", [])
    row = guarded.mock_row(mock_id)
    assert (row["status"], row["error_code"], row["finish_reasons"]) == (
        "blocked",
        "content_filtered",
        ["content_filtered"],
    )
    assert WORD in row["output_text"] and row["delivered_text"] == ""
    assert row["input_tokens"] == answer["usage"]["inputTokens"]


def test_a_held_anthropic_invoke_answer_is_replaced_by_a_refusal(guarded, upstream):
    bedrock, mock_id = client(guarded, upstream, "text=" + TEXT.replace(" ", "+"))
    answer = json.loads(bedrock.invoke_model(modelId=CLAUDE, body=json.dumps(ANTHROPIC_BODY))["body"].read())
    assert (answer["stop_reason"], answer["content"]) == ("refusal", [])
    assert "no-code-name" in answer["stop_details"]["explanation"]
    row = guarded.mock_row(mock_id)
    assert (row["status"], row["finish_reasons"]) == ("blocked", ["refusal"])
