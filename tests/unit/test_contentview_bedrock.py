"""mitmproxy's view of a Bedrock exchange: the event stream read by its own framing."""

from __future__ import annotations

import orjson
from mitmproxy import contentviews
from mitmproxy.test import taddons, tflow, tutils

from addon.mitm import contentview
from mockllm import bedrock
from mockllm.scenario import Scenario

REQUEST = {"messages": [{"role": "user", "content": [{"text": "Weather in Vienna?"}]}]}


def test_a_converse_stream_shows_its_answer_tool_calls_and_usage():
    contentview.register()
    body = b"".join(bedrock.converse_stream(REQUEST, Scenario(tool="get_weather", reasoning=True)))
    request = tutils.treq(
        method=b"POST",
        path=b"/model/us.amazon.nova-micro-v1%3A0/converse-stream",
        content=orjson.dumps(REQUEST),
        headers=[(b"content-type", b"application/json")],
    )
    response = tutils.tresp(headers=[(b"content-type", bedrock.EVENTSTREAM.encode())], content=body)
    f = tflow.tflow(req=request, resp=response)
    with taddons.context():
        result = contentviews.prettify_message(f.response, f)
    assert result.view_name == "LLM stream", result.text
    assert result.text.startswith("bedrock response · completed")
    assert "tök0 tök1 tök2 tök3 tök4" in result.text and "tool call get_weather" in result.text
    assert "usage       input 3 · output 14" in result.text
