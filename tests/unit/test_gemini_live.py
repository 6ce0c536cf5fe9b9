"""Gemini Live (BidiGenerateContent) over WebSocket: detection, the client's messages,
turns, usage, and the close that ends a blocked answer."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from addon.dialects import RequestView
from addon.dialects.gemini_live import DIALECT, GeminiLiveNormalizer, close_error
from addon.dialects.registry import detect_websocket
from addon.events import Finding, StreamError, TurnEnd
from tests.ws_turns import client, events, hostile_messages, text, turns

GEMINI_PATH = "/ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent"


def view(path: str = GEMINI_PATH) -> RequestView:
    return RequestView("GET", path, "key=AIza-test", {})


@pytest.mark.parametrize(
    "path",
    [
        GEMINI_PATH,
        "/ws/google.ai.generativelanguage.v1alpha.GenerativeService.BidiGenerateContentConstrained",
        "/ws/google.cloud.aiplatform.v1beta1.LlmBidiService/BidiGenerateContent",
    ],
)
def test_live_upgrades_are_claimed(path: str) -> None:
    assert detect_websocket(view(path), None) == (DIALECT, "ws_json")


def test_other_paths_are_not_and_the_host_names_the_provider() -> None:
    assert DIALECT.websocket(view("/v1beta/models/gemini-2.5-flash:streamGenerateContent"), None) is None
    assert not DIALECT.matches(view())
    assert DIALECT.provider_for("generativelanguage.googleapis.com") == "gcp.gemini"
    assert DIALECT.provider_for("us-central1-aiplatform.googleapis.com") == "gcp.vertex_ai"


def usage(prompt: int, response: int, key: str = "responseTokenCount", **more: object) -> dict:
    return {"usageMetadata": {"promptTokenCount": prompt, key: response, "totalTokenCount": prompt + response, **more}}


def test_two_turns_text_reasoning_usage() -> None:
    details = {
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 7}, {"modality": "AUDIO", "tokenCount": 3}],
        "responseTokensDetails": [{"modality": "AUDIO", "tokenCount": 5}],
    }
    messages = [
        {"setupComplete": {}},
        {"serverContent": {"modelTurn": {"parts": [{"text": "Let me think", "thought": True}]}}},
        {"serverContent": {"modelTurn": {"parts": [{"text": "Hel"}, {"inlineData": {"data": "AAAA"}}]}}},
        {"serverContent": {"modelTurn": {"parts": [{"text": "lo"}]}}},
        {"serverContent": {"generationComplete": True}},
        {"serverContent": {"turnComplete": True}, **usage(10, 5, cachedContentTokenCount=2, thoughtsTokenCount=4,
                                                          **details)},
        {"serverContent": {"outputTranscription": {"text": "Spoken"}}},
        {"serverContent": {"inputTranscription": {"text": "what the user said"}}},
        {"serverContent": {"turnComplete": True}, **usage(20, 1, key="candidatesTokenCount")},
    ]  # fmt: skip
    first, second = turns(GeminiLiveNormalizer(), messages)
    assert (text(first), text(first, "reasoning"), text(second)) == ("Hello", "Let me think", "Spoken")
    assert first.usage == {
        "input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 2, "reasoning_output_tokens": 4,
        "input_text_tokens": 7, "input_audio_tokens": 3, "output_audio_tokens": 5,
    }  # fmt: skip
    assert second.usage == {"input_tokens": 20, "output_tokens": 1}
    assert [r.choices[0].finish_reason for r in (first, second)] == ["STOP", "STOP"]
    assert "AAAA" not in repr(first) and "what the user said" not in repr(second)


def test_usage_comes_before_the_turn_end_in_the_same_message() -> None:
    out = events(GeminiLiveNormalizer(), [
        {"serverContent": {"modelTurn": {"parts": [{"text": "x"}]}}},
        {"serverContent": {"turnComplete": True}, **usage(1, 1)},
    ])  # fmt: skip
    assert isinstance(out[-1], TurnEnd) and [type(e).__name__ for e in out[-3:]] == ["Usage", "Finish", "TurnEnd"]


def test_usage_after_the_turn_is_a_finding_not_the_next_turns() -> None:
    messages = [
        {"serverContent": {"modelTurn": {"parts": [{"text": "x"}]}}},
        {"serverContent": {"turnComplete": True}},
        usage(3, 4),
        {"serverContent": {"modelTurn": {"parts": [{"text": "y"}]}}},
        {"serverContent": {"turnComplete": True}},
    ]
    first, second = turns(GeminiLiveNormalizer(), messages)  # (the finding lands on the record then open)
    assert first.usage == {} and second.usage == {}
    assert [f["code"] for f in second.findings] == ["ws_usage_after_turn"]
    assert '"input_tokens":3' in second.findings[0]["detail"]


def test_interrupted_and_turn_complete_reason() -> None:
    messages = [
        {"serverContent": {"outputTranscription": {"text": "Sure, the"}}},
        {"serverContent": {"interrupted": True}},
        {"serverContent": {"turnComplete": True}},
        {"serverContent": {"modelTurn": {"parts": [{"text": "z"}]}}},
        {"serverContent": {"turnComplete": True, "turnCompleteReason": "RESPONSE_REJECTED"}},
    ]
    first, second = turns(GeminiLiveNormalizer(), messages)
    assert first.choices[0].finish_reason == "interrupted" and second.choices[0].finish_reason == "RESPONSE_REJECTED"
    (cut,) = turns(GeminiLiveNormalizer(), messages[:2])  # no turnComplete (yet): the reason is there already
    assert cut.choices[0].finish_reason == "interrupted" and not cut.terminal_seen


def test_tool_calls_are_whole() -> None:
    messages = [
        {"toolCall": {"functionCalls": [{"id": "fc1", "name": "lookup", "args": {"q": "x"}}, {"name": "noargs"}]}},
        {"serverContent": {"turnComplete": True}},
    ]
    (record,) = turns(GeminiLiveNormalizer(), messages)
    calls = [c.as_dict() for c in record.tool_calls.values()]
    assert calls == [{"id": "fc1", "name": "lookup", "arguments": '{"q":"x"}'}, {"id": None, "name": "noargs",
                                                                                  "arguments": ""}]  # fmt: skip
    assert all(c.complete for c in record.tool_calls.values())


def test_go_away_and_snake_case() -> None:
    out = events(GeminiLiveNormalizer(), [
        {"goAway": {"timeLeft": "10s"}},
        {"server_content": {"model_turn": {"parts": [{"text": "a"}]}, "turn_complete": True}},
    ])  # fmt: skip
    assert Finding("ws_go_away", 'time left "10s"') in out
    assert isinstance(out[-1], TurnEnd)


def test_binary_messages_are_read_as_json() -> None:
    (record,) = turns(GeminiLiveNormalizer(), [b'{"serverContent":{"modelTurn":{"parts":[{"text":"bin"}]},'
                                               b'"turnComplete":true}}'])  # fmt: skip
    assert text(record) == "bin"


def test_client_messages() -> None:
    norm = GeminiLiveNormalizer()
    setup = {"setup": {"model": "models/gemini-live-2.5-flash", "generationConfig": {"responseModalities": ["AUDIO"]},
                       "systemInstruction": {"parts": [{"text": "You are terse."}]}, "tools": [{"functionDeclarations": []}]}}  # fmt: skip
    assert norm.on_client(client(setup)) == (
        {"model": "gemini-live-2.5-flash", "messages": [{"role": "system", "content": "You are terse."}],
         "tools": [{"functionDeclarations": []}]},
        [],
    )  # fmt: skip
    content = {"client_content": {"turns": [{"role": "user", "parts": [{"text": "Hi"}]},
                                            {"role": "model", "parts": [{"text": "Hello"}]}], "turn_complete": True}}  # fmt: skip
    assert norm.on_client(client(content))[0] == {
        "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    }
    assert norm.on_client(client({"realtimeInput": {"text": "typed"}}))[0] == {
        "messages": [{"role": "user", "content": "typed"}]
    }
    assert norm.on_client(client({"realtimeInput": {"audio": {"data": "AAAA" * 40, "mimeType": "audio/pcm"}}})) == (
        {},
        [],
    )
    tool = {"toolResponse": {"functionResponses": [{"id": "fc1", "name": "lookup", "response": {"r": 1}}]}}
    assert norm.on_client(client(tool))[0] == {
        "messages": [{"role": "tool", "content": '{"r":1}', "tool_call_id": "fc1", "name": "lookup"}]
    }


def test_blocks_close_the_connection() -> None:
    norm = GeminiLiveNormalizer()
    events(norm, [{"serverContent": {"modelTurn": {"parts": [{"text": "x"}]}}}])
    assert norm.ending("r", "x") == [] and norm.refusal(client("{}"), "r", "x") == []
    code, reason = norm.close_after_block("é" * 100)  # type: ignore[misc]
    assert code == 1008 and len(reason.encode()) <= 123 and reason == "é" * 61
    assert norm.close_after_block("short") == (1008, "short")
    assert norm.on_end() == [Finding("missing_stream_end", "the connection closed during a turn")]


def test_close_codes() -> None:
    assert close_error(1000, "") is None
    assert close_error(1011, "Internal error") == StreamError("ws_close_1011", "Internal error")
    assert close_error(None, "") == StreamError("ws_close_1006", None)


@pytest.mark.parametrize(
    "data",
    [
        "not json", "[1]", "{}", '{"serverContent": []}', '{"serverContent": {"modelTurn": {"parts": "x"}}}',
        '{"serverContent": {"modelTurn": {"parts": [1, {"text": 5}]}}}', '{"toolCall": {"functionCalls": [1]}}',
        '{"usageMetadata": {"promptTokenCount": "5", "promptTokensDetails": [1, {"modality": 3}]}}',
        '{"usageMetadata": {"promptTokenCount": 1e400}}', '{"usageMetadata": {"promptTokenCount": 99999999999999999999999}}',
        '{"goAway": {"timeLeft": {"a": [1]}}}', '{"toolCall": {"functionCalls": [{"args": 1e400}]}}',
    ],
)  # fmt: skip
def test_hostile_input_never_raises(data: str) -> None:
    norm = GeminiLiveNormalizer()
    out = events(norm, [data, {"serverContent": {"turnComplete": True}}])
    assert isinstance(out[-1], TurnEnd)
    doc, _ = norm.on_client(client(data))
    assert isinstance(doc, dict)


LIVE_KINDS = ("serverContent", "toolCall", "usageMetadata", "goAway", "setup", "clientContent", "realtimeInput",
              "toolResponse", "server_content", "setupComplete")  # fmt: skip
LIVE_KEYS = (
    "modelTurn", "parts", "text", "thought", "turnComplete", "turnCompleteReason", "interrupted", "outputTranscription",
    "functionCalls", "args", "id", "name", "promptTokenCount", "responseTokenCount", "promptTokensDetails", "modality",
    "tokenCount", "timeLeft", "model", "systemInstruction", "turns", "role", "functionResponses", "response",
    *LIVE_KINDS,
)  # fmt: skip


@given(st.lists(hostile_messages("kind", LIVE_KINDS, LIVE_KEYS).map(lambda m: {m.pop("kind"): m}), max_size=8))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_message_shapes_never_raise(messages: list[dict]) -> None:
    norm = GeminiLiveNormalizer()
    events(norm, messages)
    for message in messages:
        norm.on_client(client(json.dumps(message)))
    norm.on_end()


def test_zero_response_tokens_are_zero() -> None:
    (record,) = turns(GeminiLiveNormalizer(), [
        {"serverContent": {"modelTurn": {"parts": [{"text": "x"}]}, "turnComplete": True}, **usage(4, 0)},
    ])  # fmt: skip
    assert record.usage == {"input_tokens": 4, "output_tokens": 0}
