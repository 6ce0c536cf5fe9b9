"""The per-connection pipeline (addon/connection_auditor.py) with the real WebSocket
dialects, under traffic meant to slip past it: what an output block must do however the
answer began, and what the record must say."""

from __future__ import annotations

import json
from typing import Any, Literal

import pytest
from conn_driver import RULES, connection

from addon.connection_auditor import ConnectionAuditor, Relay
from addon.dialects import Dialect, RequestView
from addon.dialects.gemini_live import DIALECT as GEMINI_LIVE
from addon.dialects.openai_realtime import DIALECT as REALTIME
from addon.record import Status


def auditor(dialect: Dialect, path: str, rules: str | None = RULES) -> tuple[ConnectionAuditor, list[dict[str, Any]]]:
    return connection(dialect, "ws_json", RequestView("GET", path, "", {}), rules)


def j(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def final(written: list[dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    rows: dict[Any, dict[str, Any]] = {}
    for row in written:
        rows[row["turn"]] = row
    return rows


def delivered(pairs: list[tuple[bytes, Relay]]) -> list[bytes]:
    out: list[bytes] = []
    for content, relay in pairs:
        out.extend([content] if relay.onward is None else [m for m, _ in relay.onward])
    return out


def test_a_spoken_question_s_answer_is_cut_when_its_first_text_is_blocked() -> None:
    """A voice client sends only audio (no message the record reads): the answer's first
    transcript delta holding the whole match must cut the answer (the protocol's error,
    response.done, a cancel upstream), not be withheld as text shown outside an answer
    while the rest of the answer flows and the turn is recorded as completed."""
    a, written = auditor(REALTIME, "/v1/realtime")
    a.from_client(j({"type": "input_audio_buffer.append", "audio": "AAAA"}), True)
    server = [
        {"type": "response.created", "response": {"id": "resp_1", "status": "in_progress", "output": []}},
        {"type": "response.output_item.added", "response_id": "resp_1", "output_index": 0,
         "item": {"id": "item_1", "type": "message", "role": "assistant", "content": []}},
        {"type": "response.content_part.added", "response_id": "resp_1", "item_id": "item_1", "output_index": 0,
         "content_index": 0, "part": {"type": "output_audio", "transcript": ""}},
        {"type": "response.output_audio_transcript.delta", "response_id": "resp_1", "item_id": "item_1",
         "output_index": 0, "content_index": 0, "delta": "The project is Nightjar, it"},
        {"type": "response.output_audio_transcript.delta", "response_id": "resp_1", "item_id": "item_1",
         "output_index": 0, "content_index": 0, "delta": " and it ships soon."},
    ]  # fmt: skip
    pairs = [(j(e), a.from_server(j(e), True)) for e in server]
    sent = [json.loads(m) for m in delivered(pairs)]
    assert not any("Nightjar" in json.dumps(e) for e in sent)
    assert [e["type"] for e in sent if e["type"] in ("error", "response.done")] == ["error", "response.done"]
    assert not any(e.get("delta") == " and it ships soon." for e in sent)  # the rest is not delivered
    assert any(json.loads(m)["type"] == "response.cancel" for _, r in pairs for m, _ in r.back)
    a.from_server(j({"type": "response.done", "response": {"id": "resp_1", "status": "cancelled"}}), True)
    assert final(written)[0]["status"] == Status.BLOCKED


def test_a_gemini_live_answer_to_audio_is_closed_when_its_first_text_is_blocked() -> None:
    a, written = auditor(GEMINI_LIVE, "/ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent")
    a.from_client(j({"setup": {"model": "models/gemini-live"}}), True)
    a.from_server(j({"setupComplete": {}}), True)
    a.from_client(j({"realtimeInput": {"audio": {"data": "AAAA", "mimeType": "audio/pcm"}}}), True)
    relay = a.from_server(
        j({"serverContent": {"outputTranscription": {"text": "It is Nightjar, and it ships soon as planned."}}}), True
    )
    assert relay.onward == [] and relay.close is not None and relay.close[0] == 1008
    a.closed(1008, "internal code name", None)
    assert final(written)[0]["status"] == Status.BLOCKED


def test_a_blocked_suggestion_after_a_copilot_answer_is_withheld_not_a_cut() -> None:
    from addon.dialects.copilot import DIALECT as COPILOT

    a, written = auditor(COPILOT, "/c/api/chat")
    a.from_client(j({"event": "send", "content": [{"type": "text", "text": "hi"}], "mode": "chat"}), True)
    for event in ({"event": "appendText", "messageId": "m1", "text": "Hello."}, {"event": "done", "messageId": "m1"}):
        a.from_server(j(event), True)
    relay = a.from_server(j({"event": "suggestedFollowups", "suggestions": ["What is Nightjar, then?"]}), True)
    assert relay.onward == [] and relay.back == [] and relay.close is None
    assert any(f["code"] == "output_withheld" for f in a.connection.findings)
    assert final(written)[0]["status"] == Status.COMPLETED and 1 not in final(written)


def test_an_item_whose_type_is_not_a_string_does_not_stop_the_audit() -> None:
    """A hostile upstream's ``output_item.done`` with ``"type": {}`` made the Responses
    reader raise: the connection was closed (failure closed) or, failure open, left
    unaudited and unfiltered for the rest of its life."""
    a, written = auditor(REALTIME, "/v1/realtime")
    a.from_client(j({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                     "content": [{"type": "input_text", "text": "hi"}]}}), True)  # fmt: skip
    a.from_server(j({"type": "response.created", "response": {"id": "resp_1"}}), True)
    for odd in ({}, [], 1):
        relay = a.from_server(j({"type": "response.output_item.added", "response_id": "resp_1", "output_index": 0,
                                 "item": {"id": "item_1", "type": odd}}), True)  # fmt: skip
        assert relay.close is None
        relay = a.from_server(j({"type": "response.output_item.done", "response_id": "resp_1", "output_index": 0,
                                 "item": {"id": "item_1", "type": odd}}), True)  # fmt: skip
        assert relay.close is None
    relay = a.from_server(j({"type": "response.output_text.delta", "response_id": "resp_1", "item_id": "item_2",
                             "delta": "It is Nightjar, and it ships soon."}), True)  # fmt: skip
    assert relay.close is None and relay.back  # still filtered: the answer is cut, the upstream told to stop
    assert not any(f["code"] == "audit_internal_error" for f in a.turns.record.findings)


def test_an_mcp_tool_s_credentials_in_a_session_update_never_reach_the_record() -> None:
    """Realtime (GA) sessions take MCP tools whose ``authorization`` and ``headers`` are
    the MCP server's credentials; the turn's request body keeps the tools."""
    a, written = auditor(REALTIME, "/v1/realtime", rules=None)
    tool = {
        "type": "mcp",
        "server_label": "crm",
        "server_url": "https://mcp.example.com/sse",
        "authorization": "oauth-secret-value-123",
        "headers": {"X-Api-Key": "header-secret-456", "X-Tenant": "acme"},
    }
    a.from_client(j({"type": "session.update", "session": {"instructions": "Be brief.", "tools": [tool]}}), True)
    a.from_client(j({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                     "content": [{"type": "input_text", "text": "hi"}]}}), True)  # fmt: skip
    a.closed(1000, "", True)
    stored = json.dumps(written, default=str)
    assert "oauth-secret-value-123" not in stored and "header-secret-456" not in stored
    body = final(written)[0]["request_body"]
    assert body["tools"][0]["server_url"] == tool["server_url"] and body["tools"][0]["headers"]["X-Tenant"] == "acme"
    assert body["tools"][0]["authorization"].startswith("[redacted sha256:")


def test_a_cut_answer_retrieved_from_the_conversation_is_withheld() -> None:
    """The server keeps the cut answer in its conversation: ``conversation.item.retrieve``
    (or a late ``conversation.item.done``) brings its whole text back after the turn."""
    a, written = auditor(REALTIME, "/v1/realtime")
    a.from_client(j({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                     "content": [{"type": "input_text", "text": "tell me"}]}}), True)  # fmt: skip
    a.from_server(j({"type": "response.created", "response": {"id": "resp_1"}}), True)
    a.from_server(j({"type": "response.output_text.delta", "response_id": "resp_1", "item_id": "item_1",
                     "delta": "It is Nightjar, and it ships soon."}), True)  # fmt: skip
    a.from_server(j({"type": "response.done", "response": {"id": "resp_1", "status": "cancelled"}}), True)
    a.from_client(j({"type": "conversation.item.retrieve", "item_id": "item_1"}), True)
    item = {"id": "item_1", "type": "message", "role": "assistant", "status": "incomplete",
            "content": [{"type": "output_text", "text": "It is Nightjar, and it ships soon."}]}  # fmt: skip
    for kind in ("conversation.item.retrieved", "conversation.item.done"):
        relay = a.from_server(j({"type": kind, "item": item}), True)
        assert relay.onward == [], kind


def test_gemini_live_code_the_model_writes_is_checked() -> None:
    """With code execution on, ``modelTurn`` parts carry ``executableCode`` and
    ``codeExecutionResult``: text a client shows, which no filter read."""
    path = "/ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent"
    for part in ({"executableCode": {"language": "PYTHON", "code": "print('It is Nightjar, and it ships soon')"}},
                 {"codeExecutionResult": {"outcome": "OUTCOME_OK", "output": "It is Nightjar, and it ships soon\\n"}}):  # fmt: skip
        a, _ = auditor(GEMINI_LIVE, path)
        a.from_client(j({"setup": {"model": "models/gemini-live"}}), True)
        a.from_client(j({"clientContent": {"turns": [{"role": "user", "parts": [{"text": "run it"}]}],
                                           "turnComplete": True}}), True)  # fmt: skip
        relay = a.from_server(j({"serverContent": {"modelTurn": {"parts": [part]}}}), True)
        assert relay.onward == [] and relay.close is not None, part


def test_a_realtime_error_between_answers_is_checked() -> None:
    """An ``error`` about a client event, or between responses, is no StreamError (the
    session goes on), but its message is text a client shows."""
    a, _ = auditor(REALTIME, "/v1/realtime")
    message = "Unknown parameter: It is Nightjar, and it ships soon."
    for event_id in ("evt_1", None):
        relay = a.from_server(j({"type": "error", "error": {"type": "invalid_request_error", "message": message,
                                                             "event_id": event_id}}), True)  # fmt: skip
        assert relay.onward == [], event_id


# -- ids only a lenient reader takes --------------------------------------------------------------


def signalr_auditor(failure: Literal["open", "closed"]) -> tuple[ConnectionAuditor, list[dict[str, Any]]]:
    from addon.dialects.signalr import DIALECT as SIGNALR

    a, written = connection(SIGNALR, "signalr_json", RequestView("GET", "/hub", "", {}), failure=failure)
    a.from_client(b'{"protocol":"json","version":1}\x1e', True)
    a.from_server(b"{}\x1e", True)
    return a, written


@pytest.mark.parametrize("failure", ["open", "closed"])
def test_a_blocked_invocation_whose_id_is_a_lone_surrogate_is_refused_with_that_id(failure: str) -> None:
    """The hub's JSON.parse takes ``"\\ud800"`` as an id, so the reader does: the refusal
    of a blocked invocation carries it back (building it raised, and the blocked
    invocation went to the hub under failure policy open, the connection closed 1011
    under closed)."""
    a, written = signalr_auditor(failure)
    relay = a.from_client(b'{"type":4,"invocationId":"\\ud800","target":"Chat","arguments":["Nightjar?"]}\x1e', True)
    assert relay.onward == [] and relay.close is None and not a.failed
    ((back, text),) = relay.back
    assert text and back.endswith(b"\x1e")
    refusal = json.loads(back[:-1])
    assert refusal["type"] == 3 and refusal["invocationId"] == "\ud800" and "no-code-name" in refusal["error"]
    assert final(written)[0]["status"] == Status.BLOCKED


def test_a_blocked_answer_whose_id_is_a_lone_surrogate_is_ended_and_the_audit_goes_on() -> None:
    """The answer's Completion and the hub's CancelInvocation carry the id back; the
    filters keep checking the next answers (the ending raised: the match went on under
    failure policy open and nothing was checked after it)."""
    a, written = signalr_auditor("open")
    sid = b'"\\ud800"'
    a.from_client(b'{"type":4,"invocationId":' + sid + b',"target":"Chat","arguments":["hi"]}\x1e', True)
    sent = [b'{"type":2,"invocationId":' + sid + b',"item":"the code name is Nightjar"}\x1e',
            b'{"type":2,"invocationId":' + sid + b',"item":" today."}\x1e',
            b'{"type":3,"invocationId":' + sid + b"}\x1e"]  # fmt: skip
    relays = [(m, a.from_server(m, True)) for m in sent]
    got = delivered(relays)
    assert [json.loads(m[:-1]) for m in got] == [
        {
            "type": 3,
            "invocationId": "\ud800",
            "error": "Blocked by content filter rule 'no-code-name': internal code name",
        }
    ]
    assert [json.loads(m[:-1]) for r in relays for m, _ in r[1].back] == [{"type": 5, "invocationId": "\ud800"}]
    a.from_client(b'{"type":4,"invocationId":"2","target":"Chat","arguments":["again"]}\x1e', True)
    again = b'{"type":2,"invocationId":"2","item":"Nightjar again"}\x1e'
    assert a.from_server(again, True).onward != [(again, True)] and not a.failed
    assert final(written)[0]["status"] == Status.BLOCKED


def test_a_blocked_copilot_answer_whose_message_id_is_a_lone_surrogate_is_ended_with_it() -> None:
    from addon.dialects.copilot import DIALECT as COPILOT

    a, written = auditor(COPILOT, "/c/api/chat")
    a.from_client(j({"event": "send", "content": [{"type": "text", "text": "hi"}]}), True)
    sent = [b'{"event":"startMessage","messageId":"\\ud800"}',
            b'{"event":"appendText","messageId":"\\ud800","text":"the code name is Nightjar"}',
            b'{"event":"appendText","messageId":"\\ud800","text":" today"}',
            b'{"event":"done","messageId":"\\ud800"}',
            j({"event": "startMessage", "messageId": "m2"}),
            j({"event": "appendText", "messageId": "m2", "text": "again Nightjar here"}),
            j({"event": "done", "messageId": "m2"})]  # fmt: skip
    got = [json.loads(m) for m in delivered([(m, a.from_server(m, True)) for m in sent])]
    assert [(e["event"], e["messageId"]) for e in got] == [
        ("startMessage", "\ud800"), ("error", "\ud800"), ("done", "\ud800"),
        ("startMessage", "m2"), ("error", "m2"), ("done", "m2"),
    ]  # fmt: skip
    assert not a.failed and "Nightjar" not in json.dumps(got)
