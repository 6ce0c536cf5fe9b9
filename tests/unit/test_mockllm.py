"""Tests of the mock LLM upstream: pure stream building, then the real process."""

from __future__ import annotations

import base64
import dataclasses
import gzip
import re
import socket
import ssl
import subprocess
import sys
import time
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import httpx
import orjson
import pytest

from mockllm.scenario import Scenario, ScenarioError
from mockllm.server import Exchange, Recent
from mockllm.streams import (
    CREATED,
    DIALECTS,
    REFUSAL_TEXT,
    SIGNATURE,
    STAMP_MARK,
    STAMP_PATTERN,
    TOOL_ARGUMENTS,
    anthropic_events,
    anthropic_message,
    gemini_json_stream,
    gemini_response,
    gemini_sse_events,
    generate,
    llm_stream_error_body,
    llm_stream_events,
    lmsp_events,
    lmsp_numbered_events,
    lmsp_response,
    openai_chat_chunks,
    openai_chat_completion,
    openai_response,
    openai_responses_events,
    plan_body,
    raw_chunks,
    split_awkwardly,
    stamp,
    stamp_time,
    tool_arguments,
)

REPO = Path(__file__).resolve().parents[2]
REQUEST: dict[str, Any] = {
    "version": "1.0",
    "stream": True,
    "model": "example-model",
    "messages": [{"role": "user", "content": "What is the weather in Vienna?"}],
    "metadata": {"request_id": "req-42"},
}

# --- helpers -----------------------------------------------------------------


@dataclass
class SSE:
    id: int | None
    event: str | None
    data: bytes


def sse_records(body: bytes) -> list[SSE]:
    """Minimal SSE parser (one-line fields, any line ends): the events with data."""
    records = []
    for block in body.replace(b"\r\n", b"\n").split(b"\n\n"):
        record = SSE(None, None, b"")
        for line in block.split(b"\n"):
            if line.startswith(b"id: "):
                record.id = int(line[4:])
            elif line.startswith(b"event: "):
                record.event = line[7:].decode()
            elif line.startswith(b"data: "):
                record.data = line[6:]
        if record.data:
            records.append(record)
    return records


def parse_sse(body: bytes) -> list[tuple[str | None, dict[str, Any]]]:
    """(event type, JSON data) per dispatched event."""
    return [(record.event, orjson.loads(record.data)) for record in sse_records(body)]


def assert_valid_llm_stream(items: list[bytes]) -> list[dict[str, Any]]:
    """Check the draft's envelope rules; return the parsed envelopes."""
    body = b"".join(items)
    events = parse_sse(body)
    assert len(events) == len(items), "one SSE event per item"
    envelopes = [data for _, data in events]
    assert all(event_type == data["type"] for event_type, data in events)
    assert all(data["v"] == "1.0" for data in envelopes)
    assert [data["seq"] for data in envelopes] == list(range(len(envelopes)))
    assert envelopes[0]["type"] == "stream.start"
    assert envelopes[0]["created"] == CREATED
    assert envelopes[-1]["type"] == "stream.end"
    return envelopes


def answer_text(envelopes: list[dict[str, Any]]) -> str:
    return "".join(e["delta"]["text"] for e in envelopes if e["type"] == "content.delta")


def expected(query: str, request: dict[str, Any] = REQUEST) -> list[bytes]:
    return llm_stream_events(request, Scenario.parse(query))


# --- pure: scenario ------------------------------------------------------------


def test_scenario_defaults_and_parsing() -> None:
    assert Scenario.parse() == Scenario()
    scenario = Scenario.parse("events=2&delay=0.5&gzip&unknown=1&text=a%20b", "events=7&crlf=true")
    assert scenario.events == 7  # header wins over query
    assert scenario.delay == 0.5
    assert scenario.gzip and scenario.crlf  # bare key means on
    assert scenario.text == "a b"
    assert Scenario.parse("raw=" + base64.urlsafe_b64encode(b"\xff\x00").decode().rstrip("=")).raw == b"\xff\x00"


@pytest.mark.parametrize("query", ["events=x", "events=-1", "delay=nan", "gzip=maybe", "status=99", "raw=%%%"])
def test_scenario_rejects_bad_values(query: str) -> None:
    with pytest.raises(ScenarioError):
        Scenario.parse(query)


# --- pure: streams -------------------------------------------------------------


def test_default_stream() -> None:
    items = expected("")
    envelopes = assert_valid_llm_stream(items)
    assert [e["type"] for e in envelopes] == (
        ["stream.start"] + ["content.delta"] * 5 + ["content.stop", "usage", "stream.end"]
    )
    assert envelopes[0]["model"] == "example-model"
    assert envelopes[0]["request_id"] == envelopes[-1]["request_id"] == "req-42"
    assert answer_text(envelopes) == "tök0 tök1 tök2 tök3 tök4"
    assert "ö".encode() in items[1]  # raw UTF-8 on the wire, not \u escapes
    assert envelopes[-3]["stop_reason"] == "end_turn"
    assert envelopes[-2]["input_tokens"] == 6 and envelopes[-2]["output_tokens"] == 5
    assert items[0] == (
        b'event: stream.start\ndata: {"v":"1.0","seq":0,"type":"stream.start",'
        b'"request_id":"req-42","model":"example-model","created":1749292800}\n\n'
    )


@pytest.mark.parametrize(
    ("query", "text"),
    [
        ("text=Hello%2C%20w%C3%B6rld%20%C2%B0&events=4", "Hello, wörld °"),
        ("events=0", ""),
        ("events=3&crlf=1&comment=1&model=other&usage=0", "tök0 tök1 tök2"),
    ],
)
def test_stream_variants_are_valid(query: str, text: str) -> None:
    items = expected(query, {})  # an empty request (e.g. invalid JSON) must work too
    envelopes = assert_valid_llm_stream(items)
    assert answer_text(envelopes) == text
    assert "request_id" not in envelopes[0]


def test_crlf_comment_framing() -> None:
    items = expected("events=1&crlf=1&comment=1&model=other&usage=0")
    assert items[0].startswith(b": keep-alive\r\n\r\nevent: stream.start\r\ndata: ")
    assert items[0].endswith(b"}\r\n\r\n") and b"\n\n" not in items[0].replace(b"\r\n", b"")
    assert b'"model":"other"' in items[0]
    assert b"usage" not in b"".join(items)


def test_size_gives_exact_utf8_bytes() -> None:
    envelopes = assert_valid_llm_stream(expected("events=3&size=1001"))
    texts = [e["delta"]["text"] for e in envelopes if e["type"] == "content.delta"]
    assert [len(t.encode()) for t in texts] == [1001] * 3
    assert "ö" in texts[0]


def test_ascii_gives_one_byte_a_character() -> None:
    envelopes = assert_valid_llm_stream(expected("events=3&size=1001&ascii=1"))
    texts = [e["delta"]["text"] for e in envelopes if e["type"] == "content.delta"]
    assert [len(t) for t in texts] == [len(t.encode()) for t in texts] == [1001] * 3
    assert texts[0].startswith("tok0 tok0 ")


def test_tool_call() -> None:
    envelopes = assert_valid_llm_stream(expected("events=0&tool=get_weather"))
    assert [e["type"] for e in envelopes] == ["stream.start", "tool.call", "content.stop", "usage", "stream.end"]
    assert envelopes[1]["name"] == "get_weather" and envelopes[1]["arguments"] == TOOL_ARGUMENTS
    assert envelopes[2]["stop_reason"] == "tool_use"


def test_error_after_deltas() -> None:
    envelopes = assert_valid_llm_stream(expected("error=overloaded&error_after=2"))
    assert [e["type"] for e in envelopes] == ["stream.start", "content.delta", "content.delta", "error", "stream.end"]
    assert envelopes[3]["code"] == "overloaded"


def test_conformance_breakers() -> None:
    no_end = parse_sse(b"".join(expected("no_end=1")))
    assert no_end[-1][0] == "usage"
    gap = [data["seq"] for _, data in parse_sse(b"".join(expected("events=3&seq_gap=2")))]
    assert gap == [0, 1, 3, 4, 5, 6, 7]


def test_plan_truncates_and_gzips_incrementally() -> None:
    items = expected("events=3")
    assert plan_body(items, Scenario()).writes == items
    truncated = plan_body(items, Scenario(truncate_after=2))
    assert truncated.writes == items[:2] and not truncated.complete

    plan = plan_body(items, Scenario(gzip=True))
    assert len(plan.writes) == len(items) and plan.complete
    decoder = zlib.decompressobj(wbits=31)
    for write, item in zip(plan.writes, items):
        assert decoder.decompress(write) == item  # each write decodes on arrival
    assert decoder.eof
    assert gzip.decompress(b"".join(plan.writes)) == b"".join(items)

    cut = plan_body(items, Scenario(gzip=True, truncate_after=2))
    with pytest.raises(EOFError):  # no gzip trailer
        gzip.decompress(b"".join(cut.writes))


def test_stamp_marks_every_text_delta_and_keeps_sizes() -> None:
    items = expected("events=3&size=40&stamp=1")
    marked = [item for item in items if STAMP_MARK in item]
    assert len(marked) == 3
    stamped = [stamp(item, 1_760_000_000_123_456_789) for item in items]
    assert [len(s) for s in stamped] == [len(i) for i in items]
    texts = [data["delta"]["text"] for kind, data in parse_sse(b"".join(stamped)) if kind == "content.delta"]
    assert all(t.startswith("~bhgaaaaaaabcdefghij") and len(t[20:].encode()) == 40 for t in texts)


def test_raw_chunks_and_error_body() -> None:
    assert raw_chunks(Scenario(raw=b"abcdefg", chunk=3)) == [b"abc", b"def", b"g"]
    assert raw_chunks(Scenario(raw=b"abc")) == [b"abc"]
    assert orjson.loads(llm_stream_error_body(Scenario(status=429), 429)) == {
        "error": {"code": "rate_limited", "message": "mock error: rate_limited"}
    }


def test_exchange_log_is_bounded() -> None:
    log: Recent[Exchange] = Recent(limit=3)
    for i in range(5):
        log.add(str(i), Exchange(request={"i": i}))
    assert log.get("0") is None and log.get("1") is None
    assert log.get("4") is not None


# --- pure: shared answer ---------------------------------------------------------

CHAT_REQUEST: dict[str, Any] = {
    "model": "gpt-4o",
    "messages": [{"role": "user", "content": "What is the weather in Vienna?"}],
    "stream": True,
    "stream_options": {"include_usage": True},
}
RESPONSES_REQUEST: dict[str, Any] = {"model": "gpt-5", "input": "What is the weather in Vienna?", "stream": True}
ANTHROPIC_REQUEST: dict[str, Any] = {
    "model": "claude-sonnet-4",
    "max_tokens": 1024,
    "messages": [{"role": "user", "content": "What is the weather in Vienna?"}],
    "stream": True,
}
GEMINI_REQUEST: dict[str, Any] = {"contents": [{"role": "user", "parts": [{"text": "What is the weather in Vienna?"}]}]}
LMSP_REQUEST: dict[str, Any] = {
    "model": "qwen3:14b",
    "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Vienna?"}]}],
    "stream": True,
    "store": True,
}
DEFAULT_TEXT = "tök0 tök1 tök2 tök3 tök4"


def test_tool_arguments_split_awkwardly() -> None:
    fragments = split_awkwardly(TOOL_ARGUMENTS)
    assert fragments == ['{"', "cit", 'y":"V', "ie", "nna", '"}']
    assert [orjson.loads(tool_arguments(i)) for i in range(5)] == [
        {"city": city} for city in ("Vienna", "Zürich", "Graz", "Linz", "Vienna")
    ]


def test_generation_limits_and_errors() -> None:
    truncated = generate({}, Scenario.parse("events=2&tool=f&tools=2&truncate_tool=1"))
    assert truncated.stop == "max_tokens"
    assert [call.complete for call in truncated.tool_calls] == [True, False]
    assert truncated.tool_calls[1].arguments == '{"city":"Z'  # half of its 6 fragments
    limited = generate({}, Scenario.parse("reasoning=1&tool=f"), max_tokens=5)
    assert (limited.reasoning_text, limited.texts, limited.tool_calls, limited.stop) == (
        "Let me think it över.",
        ["tök0", " tök1"],
        [],
        "max_tokens",
    )
    assert generate({}, Scenario.parse("tool=f"), max_tokens=100).stop == "tool_use"
    failed = generate({}, Scenario.parse("error=boom&error_after=2&tool=f"))
    assert (failed.texts, failed.tool_calls, failed.stop) == (["tök0", " tök1"], [], "error")
    assert generate({}, Scenario.parse("n=3"), choices=2).choices == 3
    assert generate({}, Scenario(), choices=True).choices == 1  # a bool is not a count
    assert generate({"a": 1}, Scenario()).digest != generate({"a": 2}, Scenario()).digest
    assert generate({"a": 1}, Scenario()).digest == generate({"a": 1}, Scenario()).digest


def test_thinking_is_an_alias_of_reasoning() -> None:
    assert Scenario.parse("thinking=1").reasoning and Scenario.parse("", "thinking").reasoning


# --- pure: OpenAI Chat Completions -------------------------------------------------


def chat_stream(items: list[bytes]) -> tuple[list[dict[str, Any]], bool]:
    """The JSON chunks of a chat stream (validated) and whether it ended with ``[DONE]``."""
    records = sse_records(b"".join(items))
    assert len(records) == len(items) and all(r.event is None and r.id is None for r in records)
    done = records[-1].data == b"[DONE]"
    chunks = [orjson.loads(r.data) for r in (records[:-1] if done else records)]
    for chunk in chunks:
        if "error" not in chunk:
            assert chunk["object"] == "chat.completion.chunk" and chunk["created"] == CREATED
            assert chunk["id"] == chunks[0]["id"] and chunk["id"].startswith("chatcmpl-")
            assert len(chunk["choices"]) <= 1
    return chunks, done


def chat_choices(chunks: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Each choice reassembled from its deltas, checking the first-delta rules."""
    choices: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for choice in chunk.get("choices", []):
            delta = choice["delta"]
            state = choices.setdefault(
                choice["index"], {"content": "", "reasoning": "", "refusal": "", "tools": {}, "finish": None}
            )
            if not state.get("started"):
                assert delta["role"] == "assistant"
                state["started"] = True
            state["content"] += delta.get("content") or ""
            state["reasoning"] += delta.get("reasoning_content") or ""
            state["refusal"] += delta.get("refusal") or ""
            for call in delta.get("tool_calls", []):
                if call["index"] not in state["tools"]:
                    assert call["type"] == "function" and call["function"]["arguments"] == ""
                    state["tools"][call["index"]] = {
                        "id": call["id"],
                        "name": call["function"]["name"],
                        "arguments": "",
                    }
                else:
                    assert set(call) == {"index", "function"}
                state["tools"][call["index"]]["arguments"] += call["function"]["arguments"]
            state["finish"] = choice["finish_reason"] or state["finish"]
    return choices


def test_chat_stream_text_and_usage() -> None:
    chunks, done = chat_stream(openai_chat_chunks(CHAT_REQUEST, Scenario()))
    assert done
    choice = chat_choices(chunks)[0]
    assert (choice["content"], choice["finish"]) == (DEFAULT_TEXT, "stop")
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    assert all(chunk["usage"] is None for chunk in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] == 6
    assert chunks[-1]["usage"]["completion_tokens"] == 5 and chunks[-1]["usage"]["total_tokens"] == 11

    without = {key: value for key, value in CHAT_REQUEST.items() if key != "stream_options"}
    for request, query in [(without, ""), (CHAT_REQUEST, "usage=0")]:
        chunks, _ = chat_stream(openai_chat_chunks(request, Scenario.parse(query)))
        assert all("usage" not in chunk and chunk["choices"] for chunk in chunks)


def test_chat_stream_choices_interleave() -> None:
    chunks, _ = chat_stream(openai_chat_chunks({**CHAT_REQUEST, "n": 2}, Scenario.parse("events=2")))
    assert [chunk["choices"][0]["index"] for chunk in chunks if chunk["choices"]] == [0, 1] * 4
    assert {i: c["content"] for i, c in chat_choices(chunks).items()} == {0: "tök0 tök1", 1: "tök0 tök1"}
    assert chunks[-1]["usage"]["completion_tokens"] == 4


def test_chat_stream_parallel_tool_calls() -> None:
    chunks, done = chat_stream(
        openai_chat_chunks({**CHAT_REQUEST, "n": 2}, Scenario.parse("events=0&tool=get_weather&tools=2"))
    )
    choices = chat_choices(chunks)
    assert done and all(choice["finish"] == "tool_calls" for choice in choices.values())
    for choice in choices.values():
        assert [call["arguments"] for call in choice["tools"].values()] == [tool_arguments(0), tool_arguments(1)]
        assert {call["name"] for call in choice["tools"].values()} == {"get_weather"}
    ids = [call["id"] for choice in choices.values() for call in choice["tools"].values()]
    assert len(set(ids)) == 4 and all(i.startswith("call_") for i in ids)


def test_chat_stream_reasoning_refusal_and_truncated_tool() -> None:
    choice = chat_choices(chat_stream(openai_chat_chunks(CHAT_REQUEST, Scenario.parse("reasoning=1&events=2")))[0])[0]
    assert (choice["reasoning"], choice["content"]) == ("Let me think it över.", "tök0 tök1")
    chunks, _ = chat_stream(openai_chat_chunks(CHAT_REQUEST, Scenario.parse("refusal=1")))
    choice = chat_choices(chunks)[0]
    assert (choice["content"], choice["refusal"]) == ("", REFUSAL_TEXT)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None, "refusal": ""}
    choice = chat_choices(chat_stream(openai_chat_chunks(CHAT_REQUEST, Scenario.parse("tool=f&truncate_tool=1")))[0])[0]
    assert choice["finish"] == "length" and choice["tools"][0]["arguments"] == '{"city":"V'


def test_chat_stream_error() -> None:
    chunks, done = chat_stream(
        openai_chat_chunks(CHAT_REQUEST, Scenario.parse("error=server_overloaded&error_after=2"))
    )
    assert not done
    assert chunks[-1] == {
        "error": {
            "message": "mock error: server_overloaded",
            "type": "server_error",
            "param": None,
            "code": "server_overloaded",
        }
    }
    assert chat_choices(chunks[:-1])[0] == {
        "content": "tök0 tök1",
        "reasoning": "",
        "refusal": "",
        "tools": {},
        "finish": None,
        "started": True,
    }


def test_chat_framing_variants() -> None:
    items = openai_chat_chunks(CHAT_REQUEST, Scenario.parse("events=1&crlf=1&comment=1&no_end=1&model=other"))
    assert items[0].startswith(b": keep-alive\r\n\r\ndata: {") and items[0].endswith(b"}\r\n\r\n")
    chunks, done = chat_stream(items)
    assert not done and chunks[0]["model"] == "other"


def test_chat_completion_object() -> None:
    request = {**CHAT_REQUEST, "stream": False, "n": 2}
    completion = openai_chat_completion(request, Scenario.parse("reasoning=1&tool=get_weather"))
    assert completion["object"] == "chat.completion" and completion["id"].startswith("chatcmpl-")
    assert [choice["index"] for choice in completion["choices"]] == [0, 1]
    message = completion["choices"][0]["message"]
    assert message["content"] == DEFAULT_TEXT and message["reasoning_content"] == "Let me think it över."
    assert [call["function"] for call in message["tool_calls"]] == [
        {"name": "get_weather", "arguments": TOOL_ARGUMENTS}
    ]
    assert completion["choices"][0]["finish_reason"] == "tool_calls"
    assert completion["usage"]["completion_tokens"] == 2 * (3 + 5 + 6)
    assert "usage" not in openai_chat_completion(request, Scenario(usage=False))
    refused = openai_chat_completion(request, Scenario(refusal=True))["choices"][0]["message"]
    assert (refused["content"], refused["refusal"]) == (None, REFUSAL_TEXT)


# --- pure: OpenAI Responses ----------------------------------------------------------


def responses_stream(items: list[bytes]) -> list[dict[str, Any]]:
    """The events of a Responses stream: ``event:`` equals ``type``, sequence numbers from 0."""
    records = sse_records(b"".join(items))
    assert len(records) == len(items)
    events = [orjson.loads(r.data) for r in records]
    assert [r.event for r in records] == [e["type"] for e in events]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["usage"] is None
    return events


def of_type(events: list[dict[str, Any]], event_type: str) -> list[dict[str, Any]]:
    return [event for event in events if event["type"] == event_type]


def test_responses_stream_text_reasoning_and_tools() -> None:
    events = responses_stream(
        openai_responses_events(RESPONSES_REQUEST, Scenario.parse("reasoning=1&tool=get_weather&tools=2"))
    )
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.completed" and final["status"] == "completed"
    assert [item["type"] for item in final["output"]] == ["reasoning", "message", "function_call", "function_call"]
    assert [e["output_index"] for e in of_type(events, "response.output_item.added")] == [0, 1, 2, 3]
    text = "".join(e["delta"] for e in of_type(events, "response.output_text.delta"))
    assert text == DEFAULT_TEXT == of_type(events, "response.output_text.done")[0]["text"]
    assert final["output"][1]["content"][0]["text"] == text
    summary = "".join(e["delta"] for e in of_type(events, "response.reasoning_summary_text.delta"))
    assert summary == "Let me think it över." == final["output"][0]["summary"][0]["text"]
    for call in final["output"][2:]:
        assert call["id"].startswith("fc_") and call["call_id"].startswith("call_")
        deltas = [
            e["delta"] for e in of_type(events, "response.function_call_arguments.delta") if e["item_id"] == call["id"]
        ]
        assert "".join(deltas) == call["arguments"]
    assert [call["arguments"] for call in final["output"][2:]] == [tool_arguments(0), tool_arguments(1)]
    assert (
        final["usage"]["output_tokens"] == 3 + 5 + 12
        and final["usage"]["output_tokens_details"]["reasoning_tokens"] == 3
    )
    assert final["usage"]["input_tokens"] == 6
    assert openai_response(RESPONSES_REQUEST, Scenario.parse("reasoning=1&tool=get_weather&tools=2")) == final


def test_responses_stream_error_truncation_refusal() -> None:
    events = responses_stream(
        openai_responses_events(RESPONSES_REQUEST, Scenario.parse("error=server_error&error_after=1"))
    )
    assert events[-1]["type"] == "response.failed" and not of_type(events, "response.output_item.done")
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"] == {
        "code": "server_error",
        "message": "mock error: server_error",
    }
    assert failed["output"][0]["status"] == "incomplete" and failed["output"][0]["content"][0]["text"] == "tök0"

    events = responses_stream(
        openai_responses_events(RESPONSES_REQUEST, Scenario.parse("events=0&tool=f&truncate_tool=1"))
    )
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert not of_type(events, "response.function_call_arguments.done")
    assert of_type(events, "response.output_item.done")[-1]["item"]["status"] == "incomplete"

    events = responses_stream(openai_responses_events(RESPONSES_REQUEST, Scenario.parse("refusal=1&usage=0&no_end=1")))
    assert "".join(e["delta"] for e in of_type(events, "response.refusal.delta")) == REFUSAL_TEXT
    assert events[-1]["type"] == "response.output_item.done"  # no_end: no response.completed
    assert openai_response(RESPONSES_REQUEST, Scenario(usage=False))["usage"] is None


# --- pure: Anthropic Messages -----------------------------------------------------------


def anthropic_stream(items: list[bytes]) -> list[dict[str, Any]]:
    records = sse_records(b"".join(items))
    assert len(records) == len(items)
    events = [orjson.loads(r.data) for r in records]
    assert [r.event for r in records] == [e["type"] for e in events]
    assert events[0]["type"] == "message_start" and events[0]["message"]["content"] == []
    return events


def anthropic_blocks(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Content blocks reassembled from start/delta/stop."""
    blocks: list[dict[str, Any]] = []
    for event in events:
        if event["type"] == "content_block_start":
            assert event["index"] == len(blocks)
            blocks.append({**event["content_block"], "json": "", "stopped": False})
        elif event["type"] == "content_block_delta":
            block, delta = blocks[event["index"]], event["delta"]
            field = {"text_delta": "text", "thinking_delta": "thinking", "signature_delta": "signature"}
            if delta["type"] == "input_json_delta":
                block["json"] += delta["partial_json"]
            else:
                block[field[delta["type"]]] += delta[field[delta["type"]]]
        elif event["type"] == "content_block_stop":
            blocks[event["index"]]["stopped"] = True
    return blocks


def test_anthropic_stream_thinking_text_tools() -> None:
    events = anthropic_stream(
        anthropic_events(ANTHROPIC_REQUEST, Scenario.parse("thinking=1&tool=get_weather&tools=2"))
    )
    assert [e["type"] for e in events[-2:]] == ["message_delta", "message_stop"]
    assert events[2]["type"] == "ping"
    blocks = anthropic_blocks(events)
    assert [b["type"] for b in blocks] == ["thinking", "text", "tool_use", "tool_use"] and all(
        b["stopped"] for b in blocks
    )
    assert (blocks[0]["thinking"], blocks[0]["signature"]) == ("Let me think it över.", SIGNATURE)
    assert blocks[1]["text"] == DEFAULT_TEXT
    assert [orjson.loads(b["json"]) for b in blocks[2:]] == [{"city": "Vienna"}, {"city": "Zürich"}]
    first_json = [e for e in events if e["type"] == "content_block_delta" and e["index"] == 2][0]
    assert first_json["delta"] == {"type": "input_json_delta", "partial_json": ""}
    assert all(b["id"].startswith("toolu_") for b in blocks[2:])
    usage = events[0]["message"]["usage"]
    assert (usage["input_tokens"], usage["output_tokens"], usage["cache_read_input_tokens"]) == (6, 1, 0)
    assert events[-2]["delta"]["stop_reason"] == "tool_use" and events[-2]["usage"]["output_tokens"] == 3 + 5 + 12


def test_anthropic_stream_error_and_truncated_tool() -> None:
    events = anthropic_stream(
        anthropic_events(ANTHROPIC_REQUEST, Scenario.parse("error=overloaded_error&error_after=1"))
    )
    assert [e["type"] for e in events] == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "error",
    ]
    assert events[-1]["error"] == {"type": "overloaded_error", "message": "mock error: overloaded_error"}

    events = anthropic_stream(anthropic_events(ANTHROPIC_REQUEST, Scenario.parse("tool=make_file&truncate_tool=1")))
    blocks = anthropic_blocks(events)
    assert [(b["type"], b["stopped"]) for b in blocks] == [("text", True), ("tool_use", False)]
    assert blocks[1]["json"] == '{"city":"V'
    assert events[-2]["delta"]["stop_reason"] == "max_tokens" and events[-1]["type"] == "message_stop"
    assert (
        anthropic_stream(anthropic_events(ANTHROPIC_REQUEST, Scenario.parse("no_end=1")))[-1]["type"] == "message_delta"
    )
    assert (
        anthropic_stream(anthropic_events(ANTHROPIC_REQUEST, Scenario(refusal=True)))[-2]["delta"]["stop_reason"]
        == "refusal"
    )


def test_anthropic_message_object() -> None:
    message = anthropic_message(
        ANTHROPIC_REQUEST, Scenario.parse("thinking=1&tool=get_weather&truncate_tool=1&tools=2")
    )
    assert [block["type"] for block in message["content"]] == [
        "thinking",
        "text",
        "tool_use",
    ]  # the cut call is left out
    assert message["content"][2]["input"] == {"city": "Vienna"} and message["stop_reason"] == "max_tokens"
    assert message["usage"]["output_tokens"] == 3 + 5 + 6 + 3


# --- pure: Gemini ----------------------------------------------------------------------------


def gemini_answer(chunks: list[dict[str, Any]], candidate: int = 0) -> dict[str, Any]:
    """One candidate's text, thoughts, function calls and finish reason; the last usage."""
    answer: dict[str, Any] = {"text": "", "thought": "", "calls": [], "finish": None, "usage": None}
    for chunk in chunks:
        assert chunk["responseId"] == chunks[0]["responseId"] and chunk["modelVersion"]
        found = [c for c in chunk["candidates"] if c["index"] == candidate][0]
        for part in found["content"]["parts"]:
            if "functionCall" in part:
                answer["calls"].append(part["functionCall"])
            else:
                answer["thought" if part.get("thought") else "text"] += part["text"]
        answer["finish"] = found.get("finishReason", answer["finish"])
        answer["usage"] = chunk.get("usageMetadata")
    return answer


def test_gemini_sse_stream() -> None:
    items = gemini_sse_events(
        GEMINI_REQUEST, Scenario.parse("thinking=1&tool=get_weather&tools=2&model=gemini-2.5-flash")
    )
    assert all(item.startswith(b"data: {") and item.endswith(b"}\r\n\r\n") for item in items)
    chunks = [data for _, data in parse_sse(b"".join(items))]
    answer = gemini_answer(chunks)
    assert (answer["thought"], answer["text"], answer["finish"]) == ("Let me think it över.", DEFAULT_TEXT, "STOP")
    assert answer["calls"] == [
        {"name": "get_weather", "args": {"city": "Vienna"}},
        {"name": "get_weather", "args": {"city": "Zürich"}},
    ]
    assert len(chunks) == 3 + 5 + 1 and chunks[0]["modelVersion"] == "gemini-2.5-flash"
    assert answer["usage"] == {
        "promptTokenCount": 6,
        "candidatesTokenCount": 5 + 12,
        "totalTokenCount": 6 + 17 + 3,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 6}],
        "thoughtsTokenCount": 3,
    }
    assert [c["usageMetadata"]["candidatesTokenCount"] for c in chunks] == [0, 0, 0, 1, 2, 3, 4, 5, 17]  # cumulative


def test_gemini_variants() -> None:
    request = {**GEMINI_REQUEST, "generationConfig": {"candidateCount": 2}}
    chunks = [data for _, data in parse_sse(b"".join(gemini_sse_events(request, Scenario.parse("events=2&usage=0"))))]
    assert all(len(c["candidates"]) == 2 and "usageMetadata" not in c for c in chunks)
    assert gemini_answer(chunks, 1)["text"] == "tök0 tök1"
    truncated = gemini_answer(
        [
            data
            for _, data in parse_sse(
                b"".join(gemini_sse_events(GEMINI_REQUEST, Scenario.parse("tool=f&truncate_tool=1")))
            )
        ]
    )
    assert (truncated["finish"], truncated["calls"]) == ("MAX_TOKENS", [])
    failed = parse_sse(b"".join(gemini_sse_events(GEMINI_REQUEST, Scenario.parse("error=UNAVAILABLE&error_after=1"))))
    assert failed[-1][1] == {"error": {"code": 503, "message": "mock error: UNAVAILABLE", "status": "UNAVAILABLE"}}


def test_gemini_json_array_stream_and_response() -> None:
    scenario = Scenario.parse("events=2&tool=f")
    items = gemini_json_stream(GEMINI_REQUEST, scenario)
    assert items[0].startswith(b"[{") and items[1].startswith(b"\n,{") and items[-1].endswith(b"}]")
    chunks = orjson.loads(b"".join(items))
    assert [orjson.loads(item.lstrip(b"[\n,").removesuffix(b"]")) for item in items] == chunks  # one element per write
    assert gemini_answer(chunks) == gemini_answer(
        [data for _, data in parse_sse(b"".join(gemini_sse_events(GEMINI_REQUEST, scenario)))]
    )
    assert gemini_json_stream(GEMINI_REQUEST, Scenario.parse("events=0&no_end=1")) == [b"[]"]
    whole = gemini_response(GEMINI_REQUEST, Scenario.parse("thinking=1&tool=f"))
    assert whole["candidates"][0]["content"]["parts"] == [
        {"text": "Let me think it över.", "thought": True},
        {"text": DEFAULT_TEXT},
        {"functionCall": {"name": "f", "args": {"city": "Vienna"}}},
    ]
    assert whole["usageMetadata"]["candidatesTokenCount"] == 11 and whole["usageMetadata"]["thoughtsTokenCount"] == 3


# --- pure: LMSP -----------------------------------------------------------------------------------


def lmsp_stream(items: list[bytes]) -> list[tuple[int, str, dict[str, Any]]]:
    """(id, event, data) of an LMSP stream: ids from 1, a response_id on every event."""
    records = sse_records(b"".join(items))
    assert len(records) == len(items)
    assert [r.id for r in records] == list(range(1, len(records) + 1))
    events = [(r.id or 0, r.event or "", orjson.loads(r.data)) for r in records]
    assert len({data["response_id"] for _, _, data in events}) == 1
    return events


def test_lmsp_stream_and_response() -> None:
    scenario = Scenario.parse("reasoning=1&tool=get_weather")
    events = lmsp_stream(lmsp_events(LMSP_REQUEST, scenario))
    names = [name for _, name, _ in events]
    assert names[0] == "response.created" and events[0][2]["status"] == "in_progress"
    assert names[-1] == "response.completed" and events[-1][2]["usage"] == {
        "input_tokens": 3,
        "output_tokens": 14,
        "total_tokens": 17,
    }
    assert "".join(data["delta"] for _, name, data in events if name == "response.output_text.delta") == DEFAULT_TEXT
    done = [data["item"] for _, name, data in events if name == "response.output_item.done"]
    assert [item["type"] for item in done] == ["reasoning", "message", "function_call"]
    call = done[2]
    assert (call["name"], call["arguments"]) == ("get_weather", TOOL_ARGUMENTS)
    assert call["id"].startswith("fc_") and call["call_id"].startswith("call_")
    response = lmsp_response(LMSP_REQUEST, scenario)
    assert response["id"] == events[0][2]["response_id"] and response["output"] == done
    assert {key: response[key] for key in ("object", "status", "error", "incomplete_details")} == {
        "object": "response",
        "status": "completed",
        "error": None,
        "incomplete_details": None,
    }


def test_lmsp_failed_and_incomplete() -> None:
    events = lmsp_stream(lmsp_events(LMSP_REQUEST, Scenario.parse("error=model_crashed&error_after=2&no_end=1")))
    assert [name for _, name, _ in events][-2:] == ["response.output_text.delta", "response.failed"]
    assert events[-1][2]["error"] == {
        "type": "about:blank",
        "title": "Internal Server Error",
        "status": 500,
        "detail": "mock error: model_crashed",
        "code": "model_crashed",
    }
    events = lmsp_stream(lmsp_events(LMSP_REQUEST, Scenario.parse("tool=f&truncate_tool=1&usage=0")))
    assert events[-1][1:] == (
        "response.incomplete",
        {
            "response_id": events[0][2]["response_id"],
            "status": "incomplete",
            "incomplete_details": {"reason": "max_output_tokens"},
        },
    )
    gap = lmsp_numbered_events(LMSP_REQUEST, Scenario.parse("events=1&seq_gap=2"))
    assert [event_id for event_id, _ in gap] == [1, 2, 4, 5, 6]


def test_error_bodies_per_dialect() -> None:
    scenario = Scenario(status=429)
    assert orjson.loads(DIALECTS["openai-chat"].error_body(scenario, 429)) == {
        "error": {
            "message": "mock error: rate_limit_exceeded",
            "type": "requests",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
    assert orjson.loads(DIALECTS["anthropic"].error_body(Scenario(status=529), 529)) == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "mock error: overloaded_error"},
    }
    assert orjson.loads(DIALECTS["gemini"].error_body(scenario, 429))["error"]["status"] == "RESOURCE_EXHAUSTED"
    assert orjson.loads(DIALECTS["lmsp"].error_body(Scenario(error="context_length_exceeded"), 400)) == {
        "type": "about:blank",
        "title": "Bad Request",
        "status": 400,
        "detail": "mock error: context_length_exceeded",
        "code": "context_length_exceeded",
    }
    assert (
        orjson.loads(DIALECTS["openai-responses"].error_body(Scenario(), 418))["error"]["type"]
        == "invalid_request_error"
    )
    assert orjson.loads(DIALECTS["llm-stream"].error_body(Scenario(), 502))["error"]["code"] == "http_502"


# --- process -------------------------------------------------------------------


def start_mock(tmp_path: Path, tls: bool) -> tuple[str, Path | None, subprocess.Popen[bytes]]:
    """Start ``python -m mockllm`` on a free port; return (url, ca path or None, process)."""
    ready = tmp_path / "ready"
    cmd = [sys.executable, "-m", "mockllm", "--port", "0", "--ready-file", str(ready)]
    ca = None
    if tls:
        cmd += ["--tls", "--cert-dir", str(tmp_path / "certs")]
        ca = tmp_path / "certs" / "ca.pem"
    with (tmp_path / "stdout").open("wb") as out, (tmp_path / "stderr").open("wb") as err:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=err)
    deadline = time.monotonic() + 10
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"mock-llm did not start: {(tmp_path / 'stderr').read_text()}")
        time.sleep(0.02)
    return ready.read_text(), ca, proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    assert proc.wait(timeout=10) == 0, "SIGTERM must stop the mock cleanly"


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path | None]]:
    url, ca, proc = start_mock(tmp_path_factory.mktemp("plain"), tls=False)
    yield url, ca
    _stop(proc)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path | None]]:
    url, ca, proc = start_mock(tmp_path_factory.mktemp("tls"), tls=True)
    yield url, ca
    _stop(proc)


def client(ca: Path | None, http2: bool = True) -> httpx.Client:
    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(ca)) if ca else True
    return httpx.Client(http2=http2, verify=verify, timeout=10)


def sent(url: str, ca: Path | None, mock_id: str) -> dict[str, Any]:
    with client(ca) as c:
        record: dict[str, Any] = c.get(f"{url}/_mock/sent/{mock_id}").raise_for_status().json()
    return record


def test_announces_one_line(tmp_path: Path) -> None:
    url, ca, proc = start_mock(tmp_path, tls=True)
    try:
        assert re.fullmatch(r"https://127\.0\.0\.1:\d+", url)
        assert (tmp_path / "stdout").read_text() == f"mock-llm listening on {url} (ca: {ca})\n"
        with client(ca) as c:
            assert c.get(url + "/_mock/health").text == "ok"
    finally:
        _stop(proc)


@pytest.mark.parametrize(
    ("server", "http2", "version"),
    [("plain", True, "HTTP/1.1"), ("tls", True, "HTTP/2"), ("tls", False, "HTTP/1.1")],
)
def test_normal_stream(server: str, http2: bool, version: str, request: pytest.FixtureRequest) -> None:
    url, ca = request.getfixturevalue(server)
    mock_id = uuid.uuid4().hex
    with client(ca, http2) as c:
        response = c.post(f"{url}/v1/llm/stream?events=4", json=REQUEST, headers={"x-mock-id": mock_id})
        received = c.get(f"{url}/_mock/requests/{mock_id}").json()
    assert response.status_code == 200 and response.http_version == version
    assert response.headers["content-type"] == "text/event-stream"
    assert response.headers["x-mock-id"] == mock_id
    assert response.content == b"".join(expected("events=4"))
    record = sent(url, ca, mock_id)
    assert base64.b64decode(record["body_b64"]) == response.content
    assert record["completed"] and not record["aborted"]
    assert [n for _, n in record["chunks"]] == [len(item) for item in expected("events=4")]
    assert received["method"] == "POST" and received["query"] == "events=4"
    assert orjson.loads(base64.b64decode(received["body_b64"])) == REQUEST
    assert ["x-mock-id", mock_id] in received["headers"]


def test_routing_by_content_type_and_invalid_json(plain: tuple[str, Path | None]) -> None:
    url, ca = plain
    with client(ca) as c:
        response = c.post(
            f"{url}/any/path", content=b"{not json", headers={"content-type": "application/llm-request+json; x=y"}
        )
        assert response.content == b"".join(expected("", {}))
        assert c.post(f"{url}/other", json=REQUEST).status_code == 404
        bad = c.post(f"{url}/v1/llm/stream?events=lots", json=REQUEST)
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "mock_bad_scenario"


def test_pacing(tls: tuple[str, Path | None]) -> None:
    url, ca = tls
    mock_id = uuid.uuid4().hex
    with (
        client(ca) as c,
        c.stream(
            "POST", f"{url}/v1/llm/stream", json=REQUEST, headers={"x-mock-id": mock_id, "x-mock": "events=3&delay=0.2"}
        ) as response,
    ):
        chunks = response.iter_raw()
        head = b""
        while b"\n\n" not in head:
            head += next(chunks)
        first_event_at = time.time()
        body = head + b"".join(chunks)
    assert body == b"".join(expected("events=3&delay=0.2"))
    record = sent(url, ca, mock_id)
    assert first_event_at < record["last_write"]
    assert record["last_write"] - record["first_write"] >= 6 * 0.2 * 0.9  # 7 events, 6 pauses


def test_stamp_is_the_time_of_each_write(plain: tuple[str, Path | None]) -> None:
    url, ca = plain
    before = time.time_ns()
    with client(ca) as c:
        response = c.post(f"{url}/v1/llm/stream?events=3&delay=0.05&stamp=1", json=REQUEST)
    after = time.time_ns()
    stamps = [stamp_time(s) for s in STAMP_PATTERN.findall(response.content)]
    assert len(stamps) == 3 and stamps == sorted(stamps)
    assert before <= stamps[0] and stamps[-1] <= after
    assert stamps[2] - stamps[0] >= 2 * 0.05e9 * 0.9  # paced: stamped at the write, not when built


@pytest.mark.parametrize("server", ["plain", "tls"])
def test_truncation_is_a_transport_error(server: str, request: pytest.FixtureRequest) -> None:
    url, ca = request.getfixturevalue(server)
    mock_id = uuid.uuid4().hex
    received = bytearray()
    started = time.monotonic()
    with client(ca) as c, pytest.raises(httpx.RemoteProtocolError):
        with c.stream(
            "POST", f"{url}/v1/llm/stream?truncate_after=2&delay=0.05", json=REQUEST, headers={"x-mock-id": mock_id}
        ) as response:
            for chunk in response.iter_raw():
                received += chunk
    assert time.monotonic() - started < 3  # an abort, not an idle timeout
    assert bytes(received) == b"".join(expected("")[:2])
    record = sent(url, ca, mock_id)
    assert record["aborted"] and not record["completed"]
    assert base64.b64decode(record["body_b64"]) == bytes(received)


def test_truncation_wire_http1(plain: tuple[str, Path | None]) -> None:
    url, _ = plain
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"POST /v1/llm/stream?truncate_after=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        wire = b""
        while data := sock.recv(65536):
            wire += data
    first = expected("", {})[0]
    assert b"transfer-encoding: chunked" in wire.lower()
    assert wire.endswith(b"\r\n\r\n%x\r\n%s\r\n" % (len(first), first))  # closed without 0\r\n\r\n


def test_truncation_wire_http2_is_rst_stream(tls: tuple[str, Path | None]) -> None:
    url, ca = tls
    host, port = url.removeprefix("https://").rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(ca))
    context.set_alpn_protocols(["h2"])
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    path = "/v1/llm/stream?truncate_after=2"
    headers = [(":method", "POST"), (":path", path), (":scheme", "https"), (":authority", host)]
    conn.send_headers(1, headers, end_stream=True)
    data, reset = b"", None
    raw_sock = socket.create_connection((host, int(port)), timeout=5)
    with context.wrap_socket(raw_sock, server_hostname=host) as sock:
        assert sock.selected_alpn_protocol() == "h2"
        sock.sendall(conn.data_to_send())
        while reset is None:
            for event in conn.receive_data(sock.recv(65536)):
                if isinstance(event, h2.events.DataReceived):
                    data += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamReset):
                    reset = event
                assert not isinstance(event, h2.events.StreamEnded)
            sock.sendall(conn.data_to_send())
    assert reset.error_code == h2.errors.ErrorCodes.INTERNAL_ERROR
    assert data == b"".join(expected("", {})[:2])


@pytest.mark.parametrize("server", ["plain", "tls"])
def test_gzip(server: str, request: pytest.FixtureRequest) -> None:
    url, ca = request.getfixturevalue(server)
    mock_id = uuid.uuid4().hex
    with client(ca) as c:
        response = c.post(f"{url}/v1/llm/stream?gzip=1", json=REQUEST, headers={"x-mock-id": mock_id})
    assert response.headers["content-encoding"] == "gzip"
    assert response.content == b"".join(expected(""))  # httpx decoded it
    wire = base64.b64decode(sent(url, ca, mock_id)["body_b64"])
    assert wire == b"".join(plan_body(expected(""), Scenario(gzip=True)).writes)


def test_status_gives_json(tls: tuple[str, Path | None]) -> None:
    url, ca = tls
    with client(ca) as c:
        response = c.post(f"{url}/v1/llm/stream?status=429", json=REQUEST)
    assert response.status_code == 429
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"error": {"code": "rate_limited", "message": "mock error: rate_limited"}}


def test_raw_chunks_over_the_wire(plain: tuple[str, Path | None]) -> None:
    url, ca = plain
    raw = b'data: {"broken": \xc3\n\ndata: [DONE]\n\n'
    query = f"raw={base64.urlsafe_b64encode(raw).decode()}&chunk=5"
    mock_id = uuid.uuid4().hex
    with client(ca) as c:
        response = c.post(f"{url}/v1/llm/stream?{query}", json=REQUEST, headers={"x-mock-id": mock_id})
    assert response.content == raw
    assert [n for _, n in sent(url, ca, mock_id)["chunks"]] == [5] * 6 + [len(raw) - 30]


@pytest.mark.parametrize("server", ["plain", "tls"])
def test_client_disconnect_stops_writes(server: str, request: pytest.FixtureRequest) -> None:
    url, ca = request.getfixturevalue(server)
    mock_id = uuid.uuid4().hex
    with client(ca) as c:
        with c.stream(
            "POST", f"{url}/v1/llm/stream?events=30&delay=0.05", json=REQUEST, headers={"x-mock-id": mock_id}
        ) as response:
            next(response.iter_raw())  # leaving the block early closes (h1) or resets (h2) it
    deadline = time.monotonic() + 5
    while not (record := sent(url, ca, mock_id))["disconnected"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert record["disconnected"] and not record["completed"]
    assert len(record["chunks"]) < 10


# --- process: the dialects' routes -----------------------------------------------------


@pytest.mark.parametrize(
    ("path", "request_body", "content_type", "build"),
    [
        ("/v1/chat/completions", CHAT_REQUEST, "text/event-stream", openai_chat_chunks),
        ("/openai/v1/chat/completions", {**CHAT_REQUEST, "stream": False}, "application/json", None),
        ("/v1/responses", RESPONSES_REQUEST, "text/event-stream", openai_responses_events),
        ("/v1/messages", ANTHROPIC_REQUEST, "text/event-stream", anthropic_events),
        ("/lmsp/v1/responses", {**LMSP_REQUEST, "store": False}, "text/event-stream", lmsp_events),
    ],
)
def test_inference_routes(
    plain: tuple[str, Path | None], path: str, request_body: dict[str, Any], content_type: str, build: Any
) -> None:
    url, ca = plain
    mock_id = uuid.uuid4().hex
    with client(ca) as c:
        response = c.post(f"{url}{path}?tool=get_weather", json=request_body, headers={"x-mock-id": mock_id})
    assert response.status_code == 200 and response.headers["content-type"] == content_type
    scenario = Scenario.parse("tool=get_weather")
    expected_body = (
        b"".join(build(request_body, scenario))
        if build
        else orjson.dumps(openai_chat_completion(request_body, scenario))
    )
    assert response.content == expected_body
    assert base64.b64decode(sent(url, ca, mock_id)["body_b64"]) == expected_body


def test_gemini_routes(plain: tuple[str, Path | None]) -> None:
    url, ca = plain
    base = f"{url}/v1beta/models/gemini-2.5-flash"
    scenario = dataclasses.replace(
        Scenario.parse("events=2&tool=f"), model="gemini-2.5-flash"
    )  # the URL names the model
    with client(ca) as c:
        sse = c.post(f"{base}:streamGenerateContent?alt=sse&events=2&tool=f", json=GEMINI_REQUEST)
        array = c.post(f"{base}:streamGenerateContent?events=2&tool=f", json=GEMINI_REQUEST)
        whole = c.post(f"{base}:generateContent?events=2&tool=f", json=GEMINI_REQUEST)
        other = c.post(
            f"{url}/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse&model=gemini-x", json=GEMINI_REQUEST
        )
    assert sse.headers["content-type"] == "text/event-stream"
    assert sse.content == b"".join(gemini_sse_events(GEMINI_REQUEST, scenario))
    assert array.headers["content-type"] == "application/json; charset=UTF-8"
    assert array.content == b"".join(gemini_json_stream(GEMINI_REQUEST, scenario))
    assert whole.json() == gemini_response(GEMINI_REQUEST, scenario)
    assert parse_sse(other.content)[0][1]["modelVersion"] == "gemini-x"


def test_stream_flag_errors_and_unknown_routes(plain: tuple[str, Path | None]) -> None:
    url, ca = plain
    with client(ca) as c:
        failed = c.post(f"{url}/v1/messages?error=overloaded_error", json={**ANTHROPIC_REQUEST, "stream": False})
        limited = c.post(f"{url}/v1/chat/completions?status=429", json=CHAT_REQUEST)
        problem = c.post(f"{url}/lmsp/v1/responses?status=503", json=LMSP_REQUEST)
        gzipped = c.post(f"{url}/v1/responses?gzip=1&events=2", json=RESPONSES_REQUEST)
        assert c.get(f"{url}/v1/chat/completions").status_code == 404
        assert c.post(f"{url}/v1/embeddings", json=CHAT_REQUEST).status_code == 404
    assert failed.status_code == 500 and failed.json()["error"]["type"] == "overloaded_error"
    assert limited.status_code == 429 and limited.json()["error"]["code"] == "rate_limit_exceeded"
    assert problem.status_code == 503 and problem.headers["content-type"] == "application/problem+json"
    assert problem.json()["code"] == "overloaded"
    assert gzipped.headers["content-encoding"] == "gzip"
    assert gzipped.content == b"".join(openai_responses_events(RESPONSES_REQUEST, Scenario.parse("gzip=1&events=2")))


def test_lmsp_stored_responses(plain: tuple[str, Path | None]) -> None:
    url, ca = plain
    request = {**LMSP_REQUEST, "stream": False}
    with client(ca) as c:
        created = c.post(
            f"{url}/lmsp/v1/responses",
            json=request,
            headers={"x-mock": "events=3", "Idempotency-Key": "01J8M5T7Z2K4N6Q8S0V3X5B9DG", "LMSP-Version": "1.0"},
        ).json()
        streamed = c.post(f"{url}/lmsp/v1/responses?error=boom", json={**LMSP_REQUEST, "input": "other"})
        unstored = c.post(f"{url}/lmsp/v1/responses?events=4", json={**request, "store": False}).json()
        fetched = c.get(f"{url}/lmsp/v1/responses/{created['id']}")
        failed_id = orjson.loads(sse_records(streamed.content)[0].data)["response_id"]
        failed = c.get(f"{url}/lmsp/v1/responses/{failed_id}").json()
        missing = c.get(f"{url}/lmsp/v1/responses/{unstored['id']}")
    assert created == lmsp_response(request, Scenario(events=3)) and created["status"] == "completed"
    assert fetched.status_code == 200 and fetched.json() == created
    assert failed["status"] == "failed" and failed["error"]["code"] == "boom"
    assert missing.status_code == 404 and missing.json()["code"] == "response_not_found"


def test_lmsp_task_events_resume(plain: tuple[str, Path | None]) -> None:
    url, ca = plain
    task = f"{url}/lmsp/v1/tasks/task-{uuid.uuid4().hex}/events"
    with client(ca) as c:
        full = c.get(f"{task}?events=3&tool=f").content  # the first access fixes the task's events
        assert [r.id for r in sse_records(full)] == list(range(1, 10))
        received = bytearray()
        with pytest.raises(httpx.RemoteProtocolError), c.stream("GET", f"{task}?truncate_after=4") as cut:
            for chunk in cut.iter_raw():
                received += chunk
        last_id = sse_records(bytes(received))[-1].id
        rest = c.get(task, headers={"Last-Event-ID": str(last_id)}).content
        assert bytes(received) + rest == full
        assert c.get(f"{task}?after=7", headers={"Last-Event-ID": "1"}).content == b"".join(
            f for f in split_events(full) if sse_records(f)[0].id in (8, 9)
        )
        expired = c.get(f"{task}?expired=1", headers={"Last-Event-ID": "8"})
        retained = c.get(f"{task}?after=6&retain=3")
        too_old = c.get(f"{task}?after=5&retain=3")
        bad = c.get(f"{task}?after=x")
    assert expired.status_code == 410 and expired.headers["content-type"] == "application/problem+json"
    assert {key: expired.json()[key] for key in ("title", "status", "code")} == {
        "title": "Gone",
        "status": 410,
        "code": "event_history_expired",
    }
    assert [r.id for r in sse_records(retained.content)] == [7, 8, 9]
    assert too_old.status_code == 410 and bad.status_code == 400


def split_events(body: bytes) -> list[bytes]:
    """The framed events of an LF-framed SSE body."""
    return [block + b"\n\n" for block in body.split(b"\n\n") if block]


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "zstd"])
def test_plan_encodes_every_coding_and_carries_a_bomb(coding: str) -> None:
    from addon.decoding import make_decoder

    items = expected("events=3")
    for scenario in (Scenario(encoding=coding), Scenario(encoding=coding, bomb=2)):
        writes = list(plan_body(items, scenario).writes)
        decoder = make_decoder(coding)
        out = bytearray()
        for write in writes:
            decoder.feed(write)
            while data := decoder.read(1 << 20):
                out += data
        bomb = b":" + b" " * (2 << 20) + b"\n\n" if scenario.bomb else b""
        assert bytes(out) == items[0] + bomb + b"".join(items[1:])
        if scenario.bomb:
            assert sum(map(len, writes)) < 64 * 1024


def test_plan_repeats_the_second_item_lazily() -> None:
    items = expected("events=3")
    writes = plan_body(items, Scenario(repeat=1000)).writes
    assert not isinstance(writes, list)
    body = list(writes)
    assert len(body) == len(items) + 1000 and body.count(items[1]) == 1001


def test_cert_names_add_hosts_and_addresses_to_the_leaf(tmp_path: Path) -> None:
    """``--cert-name`` lets the mock stand in for a provider's real host (the transparent
    capture test routes ``api.openai.com`` to it): the leaf names it besides localhost."""
    from cryptography import x509

    from mockllm.certs import generate

    paths = generate(tmp_path, ("api.openai.com", "api.anthropic.com", "203.0.113.10", "localhost"))
    leaf = x509.load_pem_x509_certificates(paths.cert.read_bytes())[0]
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost", "api.openai.com", "api.anthropic.com"]
    assert [str(a) for a in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "::1", "203.0.113.10"]
