"""The Cursor dialect, sans-IO: detection, request readings, responses of each API, errors,
endings; the real StreamChat body from ../shared replayed when present."""

from __future__ import annotations

import base64
import gzip
import json
import re
from pathlib import Path

import orjson
import pytest
from pipeline import audit_bytes
from protoenc import end_stream, env, f, genv, m

from addon.auditor import StreamAuditor, summary_into_record
from addon.dialects import RequestView
from addon.dialects.cursor import DIALECT
from addon.dialects.protowire import field_int, field_text, parse
from addon.dialects.registry import detect_request
from addon.events import TextDelta, ToolCallDelta, TurnEnd, Usage
from addon.filters.engine import FilterSet
from addon.filters.rules import parse_rules
from addon.framing import select
from addon.framing.envelope import connect_reader, grpc_web_reader, parse_header_block, pct_decode
from addon.output_gate import OutputGate
from addon.record import ExchangeRecord
from addon.redact import fingerprint
from exchange.request import extract_messages
from exchange.transcript import output_choices

SHARED_CURSOR = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "protocol-samples" / "cursor"
CONNECT = {"content-type": "application/connect+proto", "connect-protocol-version": "1"}
GZIP = CONNECT | {"connect-content-encoding": "gzip"}
STREAM_CHAT = "/aiserver.v1.AiService/StreamChat"
UNIFIED = "/aiserver.v1.ChatService/StreamUnifiedChatWithTools"
AGENT = "/agent.v1.AgentService/Run"
RUN_SSE = "/agent.v1.AgentService/RunSSE"
BIDI_APPEND = "/aiserver.v1.BidiService/BidiAppend"
API_KEY = "sk-cursor-user-key-0123456789"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ1c2VyIn0.c2lnbmF0dXJl"


def view(path: str, headers: dict | None = None) -> RequestView:
    return RequestView("POST", path, "", headers or CONNECT)


def audit(
    body: bytes, path: str, chunks: list[int] | None = None, *, headers: dict | None = None, ctype: str = ""
) -> dict:
    req = view(path, headers)
    doc = None
    return audit_bytes(
        DIALECT,
        body,
        chunks,
        request=doc,
        request_view=req,
        content_type=ctype or req.headers["content-type"],
        headers=headers or CONNECT,
    )


def every_split(body: bytes, path: str, **kw) -> dict:
    """The row, checked to be the same at every split offset."""
    whole = audit(body, path, **kw)
    for cut in range(1, len(body)):
        assert audit(body, path, [cut], **kw) == whole, cut
    return whole


def codes(row: dict) -> list[str]:
    return [x["code"] for x in row["findings"]]


# -- detection ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        STREAM_CHAT,
        "/aiserver.v1.AiService/StreamChatWeb",
        "/aiserver.v1.AiService/StreamComposer",
        UNIFIED,
        "/aiserver.v1.ChatService/StreamUnifiedChatWithToolsSSE",
        "/aiserver.v1.ChatService/StreamUnifiedChatWithToolsIdempotent",
        AGENT,
        RUN_SSE,
        BIDI_APPEND,
        "/prefix/aiserver.v1.AiService/StreamChat",  # behind a reverse proxy's routing prefix
    ],
)
def test_cursor_chat_paths_are_recognised_by_path(path):
    assert detect_request(view(path), lambda: None) is DIALECT


@pytest.mark.parametrize(
    "path", ["/aiserver.v1.AiService/AvailableModels", "/aiserver.v1.DashboardService/GetCurrentPeriodUsage"]
)
def test_other_cursor_methods_are_not_chat(path):
    assert not DIALECT.matches(view(path))


def test_enveloped_requests_stream_and_the_bidirectional_methods_have_turns():
    assert all(DIALECT.streams_request(view(rpc)) for rpc in (UNIFIED, AGENT, STREAM_CHAT))
    assert DIALECT.has_turns(view(UNIFIED)) and DIALECT.has_turns(view(AGENT))
    assert DIALECT.has_turns(view("/aiserver.v1.ChatService/StreamUnifiedChatWithToolsSSE"))
    assert not DIALECT.has_turns(view(STREAM_CHAT)) and not DIALECT.has_turns(view(RUN_SSE))


def test_provider_is_cursor():
    assert DIALECT.provider_for("api2.cursor.sh") == "cursor" and DIALECT.provider_for("proxy.corp") == "cursor"


# -- requests -------------------------------------------------------------------------------------

UNIFIED_REQUEST = m(
    1,
    m(1, f(1, "What does this do?"), f(2, 1), f(13, "bubble-1")),
    m(1, f(1, "It parses."), f(2, 2)),
    m(1, f(1, "And now?"), f(2, 1)),
    m(5, f(1, "claude-4-sonnet"), f(2, API_KEY)),
    f(23, "conv-42"),
    m(15, f(1, "def main(): pass"), f(9, JWT)),  # current_file, with a token in it
)


def test_a_unified_request_reads_conversation_model_and_fingerprints_credentials():
    doc, finding = DIALECT.parse_request(genv(UNIFIED_REQUEST), view(UNIFIED, GZIP))
    assert finding is None
    assert doc["rpc"] == "aiserver.v1.ChatService/StreamUnifiedChatWithTools" and doc["protocol"] == "connect"
    assert doc["messages"] == [
        {"role": "user", "content": "What does this do?"},
        {"role": "assistant", "content": "It parses."},
        {"role": "user", "content": "And now?"},
    ]
    assert doc["model"] == "claude-4-sonnet" and doc["conversation_id"] == "conv-42"
    assert doc["api_key"] == f"[redacted {fingerprint(API_KEY)}]"
    assert "def main(): pass" in doc["unmapped_strings"]
    text = orjson.dumps(doc).decode()
    assert API_KEY not in text and JWT not in text and "eyJhbGciOiJIUzI1NiJ9" not in text
    assert [(x.role, x.text) for x in extract_messages(doc)][-1] == ("user", "And now?")
    summary = DIALECT.summarize(doc, view(UNIFIED, GZIP))
    assert (summary.model, summary.session_id, summary.stream) == ("claude-4-sonnet", "conv-42", True)


def test_one_message_of_a_streamed_request_is_read_alone():
    result = m(2, f(1, 5), f(3, "ls output: a.py b.py"))
    doc, findings = DIALECT.parse_request_message(result, view(UNIFIED))
    assert findings == [] and doc["messages"] == [{"role": "tool", "content": "ls output: a.py b.py"}]


def test_an_old_stream_chat_request_and_its_api_key():
    body = m(2, f(1, "hi"), f(2, 1)) + m(7, f(1, "gpt-4o-mini"), f(2, API_KEY)) + f(9, "req-1") + f(15, "conv-1")
    doc, _ = DIALECT.parse_request(env(body), view(STREAM_CHAT))
    assert doc["messages"] == [{"role": "user", "content": "hi"}] and doc["model"] == "gpt-4o-mini"
    assert doc["request_id"] == "req-1" and doc["api_key"].startswith("[redacted sha256:")
    assert API_KEY not in orjson.dumps(doc).decode()


AGENT_RUN = m(
    1, m(1, f(1, "state blob")), m(2, m(1, f(1, "Fix the bug in app.py"))), m(3, f(1, "gpt-5")), f(5, "conv-7")
)


def test_an_agent_run_request_and_bidi_append_read_the_same():
    doc, _ = DIALECT.parse_request(env(AGENT_RUN), view(AGENT))
    assert doc["model"] == "gpt-5" and doc["conversation_id"] == "conv-7"
    assert doc["messages"] == [{"role": "user", "content": "Fix the bug in app.py"}]
    unary = {"content-type": "application/proto", "connect-protocol-version": "1"}
    append = f(1, AGENT_RUN.hex()) + m(2, f(1, "rid-1")) + f(3, 0)
    doc2, _ = DIALECT.parse_request(append, view(BIDI_APPEND, unary))
    assert doc2["request_id"] == "rid-1" and doc2["model"] == "gpt-5" and doc2["messages"] == doc["messages"]
    assert doc2["protocol"] == "connect_unary"
    doc3, finding = DIALECT.parse_request(f(1, "zz-not-hex"), view(BIDI_APPEND, unary))
    assert finding is not None and finding.code == "protobuf_invalid"


def test_a_broken_request_body_gives_a_finding_not_an_exception():
    doc, finding = DIALECT.parse_request(env(b"\x0a\x50short")[:-2], view(UNIFIED))
    assert finding is not None and doc["rpc"].endswith("StreamUnifiedChatWithTools")


# -- responses ------------------------------------------------------------------------------------

CHAT_BODY = (
    genv(f(4, "") + f(5, "<|BEGIN_SYSTEM|>You are Cursor.<|END_SYSTEM|>"))
    + env(b"")
    + env(f(1, "Hel"))
    + env(f(1, "lo ✓"))
    + end_stream()
)


def test_stream_chat_text_and_the_server_prompt_at_every_split():
    row = every_split(CHAT_BODY, STREAM_CHAT, headers=GZIP)
    assert row["output_text"] == "Hello ✓" and row["status"] == "completed"
    [prompt] = [x for x in row["findings"] if x["code"] == "server_prompt"]
    assert "You are Cursor." in prompt["detail"] and prompt["detail"].startswith("45 bytes, sha256 ")
    assert row["event_count"] == 5


def test_the_server_prompts_remembered_as_reported_are_bounded():
    """The upstream names its prompts: a stream of distinct ones grew a set of digests
    without end; past MAX_PROMPTS each is a finding again, which the record counts."""
    from addon.dialects.cursor import MAX_PROMPTS, CursorNormalizer

    prompts = [env(f(5, f"prompt {i}")) for i in range(MAX_PROMPTS + 10)]
    row = audit(genv(f(4, "")) + b"".join(prompts) + b"".join(prompts[:3]) + end_stream(), STREAM_CHAT, headers=GZIP)
    assert "more not listed" in row["findings"][-1]["detail"] and codes(row).count("server_prompt") == 21
    normalizer = DIALECT.normalizer(DIALECT.summarize(None, view(STREAM_CHAT)))
    assert isinstance(normalizer, CursorNormalizer)
    for i in range(MAX_PROMPTS * 10):
        normalizer._chat(parse(f(5, f"prompt {i}")), [])
    assert len(normalizer.prompts) == MAX_PROMPTS


UNIFIED_BODY = (
    env(m(5, f(1, "pad")))
    + env(m(2, m(25, f(1, "Let me think."))))
    + env(m(2, f(1, "Answer")))
    + env(m(1, f(1, 5), f(3, "tool-1"), f(9, "read_file"), f(10, '{"path":"a.py"}')))
    + end_stream()
)


def test_unified_text_thinking_and_tool_calls():
    row = every_split(UNIFIED_BODY, UNIFIED)
    choice = output_choices(row)[0]
    assert choice["text"] == "Answer" and choice["reasoning"] == "Let me think."
    assert row["tool_calls"] == [{"id": "tool-1", "name": "read_file", "arguments": '{"path":"a.py"}'}]
    assert "tool_call_truncated" not in codes(row)
    assert codes(row) == []


def test_agent_text_thinking_turn_end_and_usage():
    normalizer = DIALECT.normalizer(DIALECT.summarize(None, view(AGENT)))
    reader = connect_reader(1 << 20, 1 << 20, {})
    body = (
        env(m(1, m(1, f(1, "Hi"))))
        + env(m(1, m(4, f(1, "hmm"))))
        + env(m(1, m(13)))  # heartbeat
        + env(m(1, m(2, f(1, "tc1"), m(2, f(1, "x")))))
        + env(m(1, m(7, f(1, "tc1"), f(2, '{"cmd":"ls"}'))))
        + env(m(1, m(3, f(1, "tc1"))))
        + env(m(1, m(14, f(1, 100), f(2, 20), f(3, 80))))
        + env(m(1, m(1, f(1, "next turn"))))
    )
    events = [e for frame in reader.feed(body) for e in normalizer.on_event(frame)]
    assert [e for e in events if isinstance(e, TextDelta)] == [
        TextDelta("Hi"),
        TextDelta("hmm", 0, "reasoning"),
        TextDelta("next turn"),
    ]
    calls = [e for e in events if isinstance(e, ToolCallDelta)]
    assert calls[0].key == "tc1" and calls[1].arguments == '{"cmd":"ls"}' and calls[2].complete
    at = events.index(TurnEnd())
    assert events[at - 1] == Usage(100, 20, 80, None)
    assert not any(e.__class__.__name__ == "Finding" for e in events)
    assert normalizer.on_end() != []  # no EndStreamResponse yet: the stream is still open


def test_an_empty_turn_ended_still_ends_the_turn():
    normalizer = DIALECT.normalizer(DIALECT.summarize(None, view(AGENT)))
    [frame] = connect_reader(1 << 20, 1 << 20, {}).feed(env(m(1, m(14))))
    assert normalizer.on_event(frame) == [TurnEnd()]


def test_unmapped_fields_give_a_finding_with_their_strings_and_the_exchange_is_kept():
    body = env(f(1, "kept")) + env(m(40, f(1, "moved text"), f(2, JWT))) + end_stream()
    row = every_split(body, STREAM_CHAT)
    assert row["output_text"] == "kept" and row["status"] == "completed"
    [finding] = [x for x in row["findings"] if x["code"] == "protobuf_unmapped"]
    assert "StreamChatResponse: fields [40]" in finding["detail"] and "moved text" in finding["detail"]
    assert JWT not in finding["detail"] and "[redacted sha256:" in finding["detail"]


def test_a_truncated_message_is_a_finding():
    row = audit(env(f(1, "ok") + b"\x0a\x30abc") + end_stream(), STREAM_CHAT)
    assert row["output_text"] == "ok" and "protobuf_invalid" in codes(row)


def test_a_gzip_bomb_in_the_stream_is_skipped_and_the_rest_read():
    bomb = gzip.compress(b"\0" * (32 * 1024 * 1024), 9)
    body = env(bomb, 1) + env(f(1, "after")) + end_stream()
    row = audit_bytes(
        DIALECT, body, None, request=None, request_view=view(STREAM_CHAT, GZIP),
        content_type="application/connect+proto", headers=GZIP,
    )  # fmt: skip
    assert row["output_text"] == "after" and "envelope_too_large" in codes(row)


# -- errors ---------------------------------------------------------------------------------------


def error_details(number: int, title: str, detail: str) -> bytes:
    return f(1, number) + m(2, f(1, title), f(2, detail)) + f(3, 1)


def test_an_end_stream_error_with_error_details_is_read():
    value = base64.b64encode(error_details(50, "Rate limited", "Try again in 1 minute")).decode().rstrip("=")
    error = {
        "error": {
            "code": "resource_exhausted",
            "message": "Error",
            "details": [{"type": "aiserver.v1.ErrorDetails", "value": value}],
        }
    }
    row = every_split(env(f(1, "par")) + end_stream(json.dumps(error)), STREAM_CHAT)
    assert row["status"] == "failed" and row["error_code"] == "resource_exhausted"
    assert row["error_message"] == "ERROR_RATE_LIMITED: Rate limited: Try again in 1 minute"


def test_run_sse_grpc_web_trailers_with_status_details():
    details = error_details(30, "Outdated", "Your version of Cursor no longer supports this action.")
    status = f(1, 9) + f(2, "outdated") + m(3, f(1, "type.googleapis.com/aiserver.v1.ErrorDetails"), f(2, details))
    block = f"grpc-status: 9\r\ngrpc-message: outdated%20client\r\ngrpc-status-details-bin: {base64.b64encode(status).decode().rstrip('=')}\r\n"
    headers = {"content-type": "application/grpc-web+proto"}
    body = env(m(1, m(1, f(1, "x")))) + env(block, 0x80)
    row = every_split(body, RUN_SSE, headers=headers)
    assert row["error_code"] == "failed_precondition"
    assert (
        row["error_message"]
        == "outdated client: ERROR_OUTDATED_CLIENT: Outdated: Your version of Cursor no longer supports this action."
    )
    ok = audit(env(m(1, m(1, f(1, "x")))) + env("grpc-status:0\r\n", 0x80), RUN_SSE, headers=headers)
    assert ok["status"] == "completed" and ok["output_text"] == "x"


# -- endings and blocked answers ---------------------------------------------------------------


def read_error_details(value: str) -> tuple[int | None, str | None, str | None]:
    msg = parse(base64.b64decode(value + "=" * (-len(value) % 4)))
    return field_int(msg, 1), field_text(msg, 2, 1), field_text(msg, 2, 2)


def test_the_ending_is_a_permission_denied_end_stream_with_error_details_that_decode():
    normalizer = DIALECT.normalizer(DIALECT.summarize(None, view(UNIFIED)))
    body = normalizer.termination("no-secrets", "a secret was found")
    [frame] = connect_reader(1 << 20, 1 << 20, {}).feed(body)
    assert frame.event == "end_stream"
    error = json.loads(frame.data)["error"]
    assert error["code"] == "permission_denied" and "no-secrets" in error["message"]
    [detail] = error["details"]
    assert detail["type"] == "aiserver.v1.ErrorDetails"
    number, title, text = read_error_details(detail["value"])
    assert number == 29 and title == "Blocked by content filter" and "a secret was found" in (text or "")
    assert detail["debug"]["error"] == "ERROR_CUSTOM_MESSAGE"
    # the normalizer reads its own ending as a block with that message
    events = normalizer.on_event(frame)
    assert "ERROR_CUSTOM_MESSAGE: Blocked by content filter" in str(events)
    assert normalizer.ending("r", "x") == []  # once ended, nothing more


def test_run_sse_ending_is_a_grpc_web_trailer_frame_with_the_details():
    headers = {"content-type": "application/grpc-web+proto"}
    normalizer = DIALECT.normalizer(DIALECT.summarize(None, view(RUN_SSE, headers)))
    [frame] = grpc_web_reader(1 << 20, 1 << 20, {}).feed(normalizer.termination("r1", "why"))
    block = parse_header_block(frame.data)
    assert block["grpc-status"] == "7" and "r1" in pct_decode(block["grpc-message"])
    status = parse(base64.b64decode(block["grpc-status-details-bin"] + "=="))
    assert field_int(status, 1) == 7 and field_text(status, 3, 1) == "type.googleapis.com/aiserver.v1.ErrorDetails"


def test_blocked_requests_get_their_protocols_answer():
    summary = DIALECT.summarize(None, view(UNIFIED))
    answer = DIALECT.blocked_response(summary, view(UNIFIED), "r1", "why", True)
    assert answer.status == 200 and ("content-type", "application/connect+proto") in answer.headers
    [frame] = connect_reader(1 << 20, 1 << 20, {}).feed(answer.body)
    assert json.loads(frame.data)["error"]["code"] == "permission_denied"
    unary = {"content-type": "application/proto", "connect-protocol-version": "1"}
    answer = DIALECT.blocked_response(
        DIALECT.summarize(None, view(BIDI_APPEND, unary)), view(BIDI_APPEND, unary), "r1", "why", False
    )
    assert answer.status == 403 and json.loads(answer.body)["code"] == "permission_denied"
    web = {"content-type": "application/grpc-web+proto"}
    answer = DIALECT.blocked_response(
        DIALECT.summarize(None, view(RUN_SSE, web)), view(RUN_SSE, web), "r1", "why", True
    )
    [frame] = grpc_web_reader(1 << 20, 1 << 20, {}).feed(answer.body)
    assert frame.event == "trailers" and parse_header_block(frame.data)["grpc-status"] == "7"


# -- the real body (shared) -----------------------------------------------------------------------


@pytest.mark.skipif(not SHARED_CURSOR.exists(), reason="../shared/reference/protocol-samples not present")
def test_the_real_stream_chat_body_gives_the_expected_text_at_every_split():
    hexed = (SHARED_CURSOR / "zhengwenj-cursor-api_tests-data-stream_data.hex.txt").read_text()
    body = bytes.fromhex(re.sub(r"\s", "", hexed))
    expected = "我是一个智能编程助手，旨在帮助你解答与编程相关的问题。如果你有任何编程方面的疑问或需要代码的帮助，请随时告诉我！"
    row = every_split(body, STREAM_CHAT, headers=GZIP)
    assert row["output_text"] == expected
    assert row["status"] == "completed" and row["error_code"] is None  # end-stream {}
    assert codes(row) == ["server_prompt"] and "powered by GPT-4o mini" in row["findings"][0]["detail"]


# -- a content filter cutting the stream as it flows (the output gate) ---------------------------

BLOCK = """
[[rule]]
id = "no-code-name"
kind = "keywords"
keywords = ["Nightjar"]
scope = "response"
action = "block"
reason = "internal code name"
"""


def gated(body: bytes, cuts: list[int]) -> tuple[bytes, dict]:
    """``body`` through an auditor with an output gate that may block: what the client got, the row."""
    filters = FilterSet(parse_rules(BLOCK), failure="closed")
    req = view(UNIFIED, GZIP)
    summary = DIALECT.summarize(None, req)
    record = ExchangeRecord(dialect="cursor", streamed=True, http_status=200)
    summary_into_record(record, summary)
    normalizer = DIALECT.normalizer(summary)
    gate = OutputGate(filters.output_guard(), DIALECT.normalizer(summary), holds=True, split_raw=True, failure="closed")
    framing = select("application/connect+proto", 200, normalizer.framing)
    auditor = StreamAuditor(record, normalizer, None, 1 << 20, gate=gate, framing=framing, headers=GZIP)
    bounds = [0, *cuts, len(body)]
    sent = [auditor.feed(body[a:b]) for a, b in zip(bounds, bounds[1:]) if b > a and not auditor.stopped]
    sent.append(auditor.finish())
    auditor.end()
    record.finish("complete")
    return b"".join(sent), record.to_row()


def test_a_blocked_word_never_reaches_the_client_and_the_stream_ends_with_the_block():
    body = (
        env(m(2, f(1, "Ask about the ")))
        + genv(m(2, f(1, "Night")))
        + env(m(2, f(1, "jar plan and more")))
        + env(m(2, f(1, " text after it")))
        + end_stream()
    )
    for cut in range(1, len(body)):
        received, row = gated(body, [cut])
        frames = connect_reader(1 << 20, 1 << 20, GZIP).feed(received)
        text = "".join(field_text(parse(x.raw), 2, 1) or "" for x in frames if x.event == "message")
        assert "Nightjar" not in text and "Night" not in text and text in ("", "Ask about the "), cut
        assert frames[-1].event == "end_stream", cut
        assert json.loads(frames[-1].data)["error"]["code"] == "permission_denied"
        assert row["status"] == "blocked", cut
    harmless = env(m(2, f(1, "Ask about the "))) + genv(m(2, f(1, "Day"))) + env(m(2, f(1, "light"))) + end_stream()
    for cut in range(1, len(harmless)):
        received, row = gated(harmless, [cut])
        assert received == harmless and row["status"] == "completed" and row["output_text"] == "Ask about the Daylight"


# -- what an attacker may try against the request filters ----------------------------------------


def agent_prompt(*action_fields: bytes) -> bytes:
    """AgentClientMessage{1 run_request{2 action{...}}}."""
    return m(1, m(2, *action_fields))


def test_a_field_sent_twice_is_read_as_protobuf_parsers_read_it_the_last_value():
    doc, _ = DIALECT.parse_request_message(m(1, m(1, f(1, "hello"), f(1, "FORBIDDEN"), f(2, 1))), view(UNIFIED))
    assert doc["messages"] == [{"role": "user", "content": "FORBIDDEN"}]
    normalizer = DIALECT.normalizer(DIALECT.summarize(None, view(UNIFIED)))
    events = normalizer.on_event(
        connect_reader(1 << 20, 1 << 20, {}).feed(env(m(2, f(1, "benign"), f(1, "LEAKED"))))[0]
    )
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["LEAKED"]


def test_padding_past_the_field_limit_is_reported_not_silently_hiding_the_prompt():
    """The reading stops at its field budget and says so; the filters read the prompt in
    the message's bytes all the same (before the budget: protobuf_invalid, refused under
    closed, after parsing all 100,001 fields)."""
    padded = m(1, f(99, 0) * 100_001 + m(2, f(1, "FORBIDDEN")))
    doc, findings = DIALECT.parse_request_message(padded, view(AGENT))
    assert [x.code for x in findings] == ["protobuf_budget"]
    assert "FORBIDDEN" in "\n".join(doc.unkept)


def test_every_string_of_an_action_and_text_with_control_characters_reach_the_request_filters():
    many = agent_prompt(*(f(1, f"s{i}") for i in range(64)), f(1, "FORBIDDEN"))
    doc, _ = DIALECT.parse_request_message(many, view(AGENT))
    assert "FORBIDDEN" in doc["messages"][0]["content"]
    doc, _ = DIALECT.parse_request_message(agent_prompt(f(1, "please FORBIDDEN\x0b")), view(AGENT))
    assert "FORBIDDEN" in doc["messages"][0]["content"]


def test_text_in_a_field_that_moved_is_still_checked_by_the_output_filters():
    """A release that moves the answer text to a field the dialect does not know: the
    client shows it, so the filters check it (and the record notes the move)."""
    body = env(m(2, f(1, "Ask about the "))) + env(m(2, f(77, "Nightjar plan"))) + end_stream()
    received, row = gated(body, [])
    assert b"Nightjar" not in received and row["status"] == "blocked"
    assert "protobuf_unmapped" in [x["code"] for x in row["findings"]]
