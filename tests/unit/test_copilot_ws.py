"""Consumer Copilot (``/c/api/chat``) over WebSocket: detection, split messages, turns,
the client's sends, and the error and done the proxy sends."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from addon.dialects import RequestView
from addon.dialects.copilot import DIALECT, MAX_OBJECTS, CopilotNormalizer, split_objects
from addon.dialects.registry import detect_websocket
from addon.events import Finding, ShownText, StreamError, TurnEnd
from tests.ws_turns import SAMPLES, client, events, hostile_messages, parsed, text, turns

SAMPLE_DIR = SAMPLES / "copilot"
BOT = "cunqiwyXHxKALffniSEnf"


def answer(bot: str = BOT, pieces: tuple[str, ...] = ("Received", "! Test"), first_id: int = 1) -> list[dict]:
    n = iter(range(first_id, first_id + 100))
    return [
        {"event": "received", "conversationId": "c1", "messageId": "user1", "id": str(next(n))},
        {"event": "startMessage", "conversationId": "c1", "messageId": bot, "id": str(next(n))},
        *({"event": "appendText", "messageId": bot, "partId": "0", "text": t, "id": str(next(n))} for t in pieces),
        {"event": "partCompleted", "messageId": bot, "partId": "0", "id": str(next(n))},
        {"event": "done", "messageId": bot, "id": str(next(n))},
        {"event": "titleUpdate", "conversationId": "c1", "title": "t", "id": str(next(n))},
        {"event": "suggestedFollowups", "messageId": bot, "suggestions": ["More?"], "id": str(next(n))},
    ]


def test_chat_upgrade_is_claimed() -> None:
    chat = RequestView("GET", "/c/api/chat", "api-version=2", {})
    assert detect_websocket(chat, None) == (DIALECT, "ws_json")
    assert DIALECT.websocket(RequestView("GET", "/c/api/conversations", "", {}), None) is None
    assert not DIALECT.matches(chat)
    assert DIALECT.provider_for("copilot.microsoft.com") == "microsoft"


def test_two_answers_are_two_turns() -> None:
    records = turns(CopilotNormalizer(), [*answer(), *answer("bot2", ("Second",), 20)])
    assert [text(r) for r in records] == ["Received! Test", "Second"]
    assert [r.choices[0].finish_reason for r in records] == ["stop", "stop"]
    assert all(r.terminal_seen and not r.findings for r in records)


def test_concatenated_objects_and_record_separators_are_split() -> None:
    message = '{"event":"connected"}\x1e{"event":"startMessage","messageId":"b"}  {"event":"appendText","messageId":"b","text":"hi"}\x1e'
    (record,) = turns(CopilotNormalizer(), [message, '{"event":"done","messageId":"b"}'])
    assert text(record) == "hi"
    objects, findings = split_objects("{}" * (MAX_OBJECTS + 5))
    assert len(objects) == MAX_OBJECTS and findings[0].code == "invalid_json"
    objects, findings = split_objects('{"a":1}{"b":')
    assert objects == [{"a": 1}] and findings[0].code == "invalid_json"


def test_reasoning_replace_challenge() -> None:
    out = events(CopilotNormalizer(), [
        {"event": "startMessage", "messageId": "b"},
        {"event": "chainOfThought", "messageId": "b", "text": "thinking"},
        {"event": "appendText", "messageId": "b", "text": "draft"},
        {"event": "replaceText", "messageId": "b", "text": "final"},
        {"event": "challenge", "method": "hashcash"},
        {"event": "done", "messageId": "b"},
    ])  # fmt: skip
    assert ShownText("final", 0, "replaced_text") in out
    assert Finding("copilot_challenge", 'method "hashcash"') in out
    (record,) = turns(CopilotNormalizer(), [{"event": "chainOfThought", "text": "t"}, {"event": "done"}])
    assert text(record, "reasoning") == "t"


def test_error_ends_the_turn_and_a_later_done_is_not_a_new_one() -> None:
    messages = [
        {"event": "startMessage", "messageId": "b"},
        {"event": "appendText", "messageId": "b", "text": "par"},
        {"event": "error", "messageId": "b", "message": "Something went wrong", "code": "Throttled"},
        {"event": "done", "messageId": "b"},
    ]
    (record,) = turns(CopilotNormalizer(), messages)
    assert (record.error_code, record.error_message) == ("Throttled", "Something went wrong")
    assert record.choices[0].finish_reason == "error"
    out = events(CopilotNormalizer(), [{"event": "error"}])
    assert isinstance(out[0], StreamError) and out[0].code == "error" and isinstance(out[-1], TurnEnd)


@pytest.mark.skipif(not SAMPLE_DIR.exists(), reason="../shared protocol samples not present")
def test_shared_captures() -> None:
    lines = (SAMPLE_DIR / "savevsgames-AI-PII-Sanitizer_copilot-v2-captured-events.jsonl").read_text().splitlines()
    records = turns(CopilotNormalizer(), lines)
    assert text(records[0]) == ". Want to try checking another one?" and records[0].terminal_seen
    assert len(records) == 1  # titleUpdate, ping, pong: nothing
    flow = (SAMPLE_DIR / "unresolved-repo_copilot-v2-cdp-observed-flow.txt").read_text().splitlines()
    norm = CopilotNormalizer()
    sent = [norm.on_client(client(line))[0] for line in flow if '"event":"se' in line and "..." not in line]
    assert sent == [{"messages": [{"role": "user", "content": "This is an automated test message."}], "model": "chat"}]
    received = [line for line in flow if line.startswith("{") and '"event":"se' not in line]
    record, *rest = turns(norm, received)  # (the last line holds the author's "...": not JSON)
    assert text(record) == "Received! TestFeel free.\n" and record.terminal_seen
    assert [f["code"] for r in rest for f in r.findings] == ["invalid_json"]


def test_client_messages() -> None:
    norm = CopilotNormalizer()
    send = {"event": "send", "conversationId": "c", "mode": "reasoning",
            "content": [{"type": "text", "text": "Hi"}, {"type": "image", "url": "https://x/y.png"}]}  # fmt: skip
    assert norm.on_client(client(send)) == ({"messages": [{"role": "user", "content": "Hi"}], "model": "reasoning"}, [])
    assert norm.on_client(client({"event": "setOptions", "supportedFeatures": []})) == ({}, [])
    doc, findings = norm.on_client(client("nope"))
    assert doc == {} and findings[0].code == "request_invalid_json"


def test_ending_and_refusal_are_error_then_done() -> None:
    norm = CopilotNormalizer()
    assert norm.ending("r", "x") == []
    events(norm, answer()[:3])  # received, startMessage, one appendText (ids 1..3)
    error, done = parsed(norm.ending("r1", "why"))
    assert error == {"event": "error", "messageId": BOT, "code": "content_filtered",
                     "message": "Blocked by content filter rule 'r1': why", "id": "4"}  # fmt: skip
    assert done == {"event": "done", "messageId": BOT, "id": "5"}
    (record,) = turns(CopilotNormalizer(), [*answer()[:3], orjson.dumps(error).decode(), orjson.dumps(done).decode()])
    assert record.error_code == "content_filtered" and record.terminal_seen
    error, done = parsed(norm.refusal(client({"event": "send"}), "r", "x"))
    assert error["event"] == "error" and done["event"] == "done" and error["messageId"] == done["messageId"]
    assert norm.close_after_block("x") is None and norm.upstream_cancel() == []


@pytest.mark.parametrize(
    "data",
    [
        "", "x", "[1]", '{"event": 5}', '{"event": "appendText", "text": 5}', '{"event": "appendText"}',
        '{"event": "done", "messageId": 3}', '{"event": "error", "message": {"a": 1}}', '{"id": "99999999999999999999999"}',
        '{"event": "send", "content": "x"}', '{"event": "send", "content": [1, {"text": 2}]}', "[" * 10000,
        '{"a": ' + "9" * 5000 + "}{}",
    ],
)  # fmt: skip
def test_hostile_input_never_raises(data: str) -> None:
    norm = CopilotNormalizer()
    out = events(norm, [data, *answer()])
    assert isinstance(out[-1], TurnEnd) or any(isinstance(e, TurnEnd) for e in out)
    doc, _ = norm.on_client(client(data))
    assert isinstance(doc, dict)


COPILOT_EVENTS = ("startMessage", "appendText", "replaceText", "partCompleted", "done", "error", "challenge",
                  "chainOfThought", "send", "received", "titleUpdate")  # fmt: skip
COPILOT_KEYS = ("event", "messageId", "partId", "text", "content", "mode", "id", "code", "message", "method", "type")


@given(st.lists(hostile_messages("event", COPILOT_EVENTS, COPILOT_KEYS), max_size=8))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_event_shapes_never_raise(messages: list[dict]) -> None:
    norm = CopilotNormalizer()
    events(norm, ["".join(json.dumps(m) for m in messages)] + [json.dumps(m) for m in messages])
    for message in messages:
        norm.on_client(client(json.dumps(message)))
    parsed(norm.ending("r", "x"))
    norm.on_end()


def test_a_message_only_lenient_readers_take_is_read_with_the_finding() -> None:
    """``NaN`` (a Python peer) or a lone surrogate escape (the client's JSON.parse): the
    message was read all the same, silently; now with ``lenient_json`` (request side:
    ``request_lenient_json``, not unread, so no failure policy)."""
    objects, findings = split_objects('{"event":"appendText","messageId":"b","text":"hi \\ud800","x":NaN}')
    assert objects[0]["text"] == "hi \ud800" and [f.code for f in findings] == ["lenient_json"]
    objects, findings = split_objects('{"a":1}\x1e{"b":NaN}\x1e{"c":NaN}')
    assert len(objects) == 3 and [f.code for f in findings] == ["lenient_json"]
    assert split_objects('{"a":1}{"b":2}') == ([{"a": 1}, {"b": 2}], [])
    reading, findings = CopilotNormalizer().on_client(
        client('{"event":"send","content":[{"type":"text","text":"hi"}],"x":NaN}')
    )
    assert reading["messages"] == [{"role": "user", "content": "hi"}]
    assert [f.code for f in findings] == ["request_lenient_json"]
