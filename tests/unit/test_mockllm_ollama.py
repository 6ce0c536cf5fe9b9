"""The mock's Ollama API (mockllm/ollama.py): routes, NDJSON lines, whole answers, errors."""

from __future__ import annotations

import orjson

from mockllm import ollama
from mockllm.scenario import Scenario
from mockllm.server import route

CHAT = {"model": "qwen3", "messages": [{"role": "user", "content": "hi"}]}


def objects(items: list[bytes]) -> list[dict]:
    assert all(item.endswith(b"\n") and item.count(b"\n") == 1 for item in items), "one line per write"
    return [orjson.loads(item) for item in items]


def test_routes_stream_by_default_as_ndjson_and_leave_openai_chat_alone():
    for path, dialect in (("/api/chat", ollama.CHAT), ("/x/api/generate", ollama.GENERATE)):
        found = route("POST", path, "", "application/json")
        assert found is not None and found.dialect is dialect
        assert (dialect.stream_default, dialect.stream_type) == (True, "application/x-ndjson")
    found = route("POST", "/v1/chat/completions", "", "application/json")
    assert found is not None and found.dialect.name == "openai-chat"


def test_chat_lines_thinking_text_tool_calls_then_done():
    parts = objects(ollama.chat_lines(CHAT, Scenario(reasoning=True, tool="get_weather")))
    assert "".join(p["message"].get("thinking", "") for p in parts) == "Let me think it över."
    assert "".join(p["message"]["content"] for p in parts) == "tök0 tök1 tök2 tök3 tök4"
    [call] = [c for p in parts for c in p["message"].get("tool_calls", [])]
    assert call["function"]["name"] == "get_weather" and call["function"]["arguments"] == {"city": "Vienna"}
    assert [p["done"] for p in parts].count(True) == 1 and parts[-1]["done_reason"] == "stop"
    assert parts[-1]["eval_count"] == 14 and parts[-1]["prompt_eval_count"] == 1


def test_generate_error_line_truncated_tool_and_no_end():
    parts = objects(ollama.generate_lines({"model": "m", "prompt": "hi"}, Scenario(error="boom", error_after=1)))
    assert parts[-1] == {"error": "mock error: boom"} and parts[0]["response"] == "tök0"
    parts = objects(ollama.chat_lines(CHAT, Scenario(tool="get_weather", truncate_tool=True)))
    assert parts[-1]["done_reason"] == "length" and not any("tool_calls" in p["message"] for p in parts)
    assert not objects(ollama.chat_lines(CHAT, Scenario(no_end=True)))[-1]["done"]


def test_whole_answers_and_error_body():
    body = ollama.generate_body({"model": "m", "prompt": "hi"}, Scenario(reasoning=True))
    assert (body["response"], body["thinking"], body["done"]) == (
        "tök0 tök1 tök2 tök3 tök4",
        "Let me think it över.",
        True,
    )
    assert ollama.chat_body(CHAT, Scenario())["message"]["content"] == "tök0 tök1 tök2 tök3 tök4"
    assert orjson.loads(ollama.error_body(Scenario(), 404)) == {"error": "mock error: not_found"}
