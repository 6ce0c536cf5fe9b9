"""The mock's Bedrock and Vertex routes: real event-stream bytes (botocore's own parser
checks both CRCs), padding, the exception scenario, and what the routes match."""

from __future__ import annotations

import base64

import orjson
from botocore.eventstream import EventStreamBuffer

from mockllm import bedrock
from mockllm.scenario import Scenario
from mockllm.server import route
from mockllm.streams import DIALECTS

REQUEST = {"messages": [{"role": "user", "content": [{"text": "Hello there"}]}]}
ANTHROPIC = {
    "anthropic_version": "bedrock-2023-05-31",
    "max_tokens": 50,
    "messages": [{"role": "user", "content": "hi"}],
}


def messages(items: list[bytes]) -> list[tuple[str, str, dict]]:
    buffer = EventStreamBuffer()
    buffer.add_data(b"".join(items))
    out = []
    for m in buffer:
        name = m.headers.get(":event-type") or m.headers.get(":exception-type")
        out.append((m.headers[":message-type"], name, orjson.loads(m.payload)))
    return out


def test_converse_stream_events_with_padding_reasoning_and_tools():
    read = messages(bedrock.converse_stream(REQUEST, Scenario(reasoning=True, tool="get_weather")))
    names = [name for _, name, _ in read]
    assert names[0] == "messageStart" and names[-2:] == ["messageStop", "metadata"]
    assert "contentBlockStart" in names
    assert all("p" in payload for _, _, payload in read)
    assert len({len(payload["p"]) for _, _, payload in read}) > 3  # the padding's length varies
    assert read[-2][2]["stopReason"] == "tool_use"
    assert (
        read[-1][2]["usage"]["outputTokens"]
        == read[-1][2]["usage"]["totalTokens"] - read[-1][2]["usage"]["inputTokens"]
    )


def test_an_error_is_an_exception_message_after_the_partial_text():
    read = messages(bedrock.converse_stream(REQUEST, Scenario(error="throttlingException", error_after=2)))
    assert read[-1][:2] == ("exception", "throttlingException")
    assert [p["delta"]["text"] for _, n, p in read if n == "contentBlockDelta"] == ["tök0", " tök1"]


def test_invoke_stream_wraps_anthropic_events_with_the_metrics_last():
    read = messages(bedrock.invoke_stream(ANTHROPIC, Scenario()))
    natives = [orjson.loads(base64.b64decode(p["bytes"])) for _, name, p in read if name == "chunk"]
    assert natives[0]["type"] == "message_start" and natives[-1]["type"] == "message_stop"
    assert natives[-1]["amazon-bedrock-invocationMetrics"]["outputTokenCount"] == 5


def test_routes():
    found = route("POST", "/model/us.amazon.nova-micro-v1:0/converse-stream", "", "application/json")
    assert found is not None and (found.dialect, found.stream, found.target) == (
        bedrock.CONVERSE,
        True,
        "us.amazon.nova-micro-v1:0",
    )
    found = route("POST", "/model/m/invoke", "", "application/json")
    assert found is not None and (found.dialect, found.stream) == (bedrock.INVOKE, False)
    vertex = "/v1/projects/p/locations/l/publishers/anthropic/models/claude@1:streamRawPredict"
    found = route("POST", vertex, "", "application/json")
    assert found is not None and (found.dialect, found.stream, found.target) == (
        DIALECTS["anthropic"],
        True,
        "claude@1",
    )
