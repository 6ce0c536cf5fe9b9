"""The Windsurf dialect, sans-IO: GetChatMessage (cloud) and RawGetChatMessage (local LS),
protobuf and Connect JSON, credentials fingerprinted, errors, endings."""

from __future__ import annotations

import json

import orjson
import pytest
from pipeline import audit_bytes
from protoenc import end_stream, env, f, genv, m

from addon.dialects import RequestView
from addon.dialects.registry import detect_request
from addon.dialects.windsurf import DIALECT
from addon.framing.envelope import connect_reader
from addon.redact import fingerprint
from exchange.transcript import output_choices

GET_CHAT = "/exa.api_server_pb.ApiServerService/GetChatMessage"
RAW_CHAT = "/exa.language_server_pb.LanguageServerService/RawGetChatMessage"
CONNECT = {"content-type": "application/connect+proto", "connect-protocol-version": "1"}
GZIP = CONNECT | {"connect-content-encoding": "gzip"}
JSON_STREAM = {"content-type": "application/connect+json", "connect-protocol-version": "1"}
API_KEY = "sk-ws-01-abcdefghijklmnopqrstuvwxyz0123456789"
JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ3aW5kc3VyZiJ9.c2ln"


def view(path: str = GET_CHAT, headers: dict | None = None) -> RequestView:
    return RequestView("POST", path, "", headers or CONNECT)


def audit(body: bytes, chunks: list[int] | None = None, *, path: str = GET_CHAT, headers: dict | None = None) -> dict:
    req = view(path, headers)
    return audit_bytes(
        DIALECT,
        body,
        chunks,
        request=None,
        request_view=req,
        content_type=req.headers["content-type"],
        headers=headers or CONNECT,
    )


def every_split(body: bytes, **kw) -> dict:
    whole = audit(body, **kw)
    for cut in range(1, len(body)):
        assert audit(body, [cut], **kw) == whole, cut
    return whole


REQUEST = (
    m(1, f(1, "windsurf"), f(2, "1.12.0"), f(3, API_KEY), f(4, "en"), f(21, JWT))
    + f(2, "You are Cascade.")
    + m(3, f(1, "uuid-1"), f(2, 1), f(3, "Write a haiku"))
    + m(3, f(2, 2), f(3, "Autumn moon..."))
    + m(3, f(2, 4), f(3, "tool says hi"), f(7, "call-1"))
    + m(8, f(2, 8192))
    + f(16, "session-uuid")
    + f(21, "MODEL_SWE_1_5")
)


def test_get_chat_message_is_recognised_by_path():
    assert detect_request(view(), lambda: None) is DIALECT
    assert detect_request(view(RAW_CHAT), lambda: None) is DIALECT
    assert not DIALECT.matches(view("/exa.api_server_pb.ApiServerService/GetUserStatus"))
    assert DIALECT.provider_for("server.self-serve.windsurf.com") == "windsurf"
    assert DIALECT.provider_for("server.codeium.com") == "windsurf"


def test_the_request_reads_prompt_roles_model_and_fingerprints_the_metadata_credentials():
    doc, finding = DIALECT.parse_request(genv(REQUEST), view(headers=GZIP))
    assert finding is None
    assert doc["messages"] == [
        {"role": "system", "content": "You are Cascade."},
        {"role": "user", "content": "Write a haiku"},
        {"role": "assistant", "content": "Autumn moon..."},
        {"role": "tool", "content": "tool says hi"},
    ]
    assert doc["model"] == "MODEL_SWE_1_5" and doc["conversation_id"] == "session-uuid" and doc["client"] == "windsurf"
    assert doc["api_key"] == f"[redacted {fingerprint(API_KEY)}]" and doc["user_jwt"].startswith("[redacted sha256:")
    text = orjson.dumps(doc).decode()
    assert API_KEY not in text and JWT not in text
    summary = DIALECT.summarize(doc, view(headers=GZIP))
    assert summary.model == "MODEL_SWE_1_5" and summary.stream is True


RESPONSE = (
    genv(f(9, "Thinking about seasons."))
    + env(f(3, "Autumn "))
    + env(f(3, "leaves fall"))
    + env(m(6, f(1, "tc-1"), f(2, "search"), f(3, '{"q":')))
    + env(m(6, f(3, '"haiku"}')))
    + env(m(7, f(2, 100), f(3, 20), f(4, 30), f(5, 400), f(7, "msg_011C"), f(9, "claude-sonnet-4-6")) + f(5, 2))
    + end_stream()
)


def test_the_response_reads_text_reasoning_tool_calls_usage_model_and_finish_at_every_split():
    row = every_split(RESPONSE, headers=GZIP)
    choice = output_choices(row)[0]
    assert choice["text"] == "Autumn leaves fall" and choice["reasoning"] == "Thinking about seasons."
    assert choice["finish_reason"] == "stop" and row["status"] == "completed"
    assert row["tool_calls"] == [{"id": "tc-1", "name": "search", "arguments": '{"q":"haiku"}'}]
    assert (row["input_tokens"], row["output_tokens"]) == (530, 20)  # fresh + cache write + cache read
    assert (row["cache_read_input_tokens"], row["cache_write_input_tokens"]) == (400, 30)
    assert row["response_model"] == "claude-sonnet-4-6" and row["response_id"] == "msg_011C"
    assert [x["code"] for x in row["findings"]] == []


def test_an_end_stream_error_fails_the_exchange():
    error = {"error": {"code": "permission_denied", "message": "blocked by our content policy"}}
    row = every_split(env(f(3, "par")) + end_stream(json.dumps(error)))
    assert row["status"] == "failed" and row["error_code"] == "permission_denied"
    assert row["error_message"] == "blocked by our content policy"


def test_a_stream_without_its_end_is_upstream_aborted():
    row = audit(env(f(3, "par")))
    assert row["status"] == "upstream_aborted" and "missing_stream_end" in [x["code"] for x in row["findings"]]


def test_unmapped_response_fields_are_reported_with_their_strings():
    row = audit(env(f(3, "a") + f(44, "new field text")) + end_stream())
    [finding] = [x for x in row["findings"] if x["code"] == "protobuf_unmapped"]
    assert "fields [44]" in finding["detail"] and "new field text" in finding["detail"]


@pytest.mark.parametrize("headers", [CONNECT, JSON_STREAM])
def test_the_ending_and_the_blocked_answer_are_permission_denied(headers):
    summary = DIALECT.summarize(None, view(headers=headers))
    body = DIALECT.normalizer(summary).termination("r1", "why")
    [frame] = connect_reader(1 << 20, 1 << 20, {}).feed(body)
    error = json.loads(frame.data)["error"]
    assert error["code"] == "permission_denied" and "r1" in error["message"]
    answer = DIALECT.blocked_response(summary, view(headers=headers), "r1", "why", True)
    codec = headers["content-type"].rpartition("+")[2]
    assert answer.status == 200 and ("content-type", f"application/connect+{codec}") in answer.headers


def test_raw_get_chat_message_in_protobuf():
    request = m(1, f(3, API_KEY)) + m(2, f(2, 1), f(5, "Explain this")) + f(3, "System override") + f(5, "gpt-4o")
    doc, _ = DIALECT.parse_request(env(request), view(RAW_CHAT))
    assert doc["messages"] == [
        {"role": "system", "content": "System override"},
        {"role": "user", "content": "Explain this"},
    ]
    assert doc["model"] == "gpt-4o" and API_KEY not in orjson.dumps(doc).decode()
    body = env(m(1, f(5, "It "), f(6, 1))) + env(m(1, f(5, "works"), f(6, 0))) + end_stream()
    row = every_split(body, path=RAW_CHAT)
    assert row["output_text"] == "It works" and output_choices(row)[0]["finish_reason"] == "stop"


def test_raw_get_chat_message_in_connect_json():
    request = {
        "metadata": {"apiKey": API_KEY, "ideName": "vscode"},
        "chatMessages": [{"source": "CHAT_MESSAGE_SOURCE_USER", "text": "Hello"}],
        "chatModelName": "gpt-4o",
    }
    doc, _ = DIALECT.parse_request(env(json.dumps(request)), view(RAW_CHAT, JSON_STREAM))
    assert doc["messages"] == [{"role": "user", "content": "Hello"}] and doc["model"] == "gpt-4o"
    assert API_KEY not in orjson.dumps(doc).decode() and doc["metadata"]["ideName"] == "vscode"
    body = (
        env(json.dumps({"deltaMessage": {"text": "Hi ", "inProgress": True}}))
        + env(json.dumps({"deltaMessage": {"text": "there"}}))
        + end_stream()
    )
    row = every_split(body, path=RAW_CHAT, headers=JSON_STREAM)
    assert row["output_text"] == "Hi there" and row["status"] == "completed"
    error = audit(
        env(json.dumps({"deltaMessage": {"text": "quota exceeded", "isError": True}})) + end_stream(),
        path=RAW_CHAT,
        headers=JSON_STREAM,
    )
    assert error["status"] == "failed" and error["error_message"] == "quota exceeded"


def test_connect_json_only_lenient_readers_take_is_read_with_the_finding():
    """``NaN`` or a lone surrogate escape: read as the language server and the client
    read it (it was, silently), now with ``lenient_json`` / ``request_lenient_json``; a
    message without ``deltaMessage`` and a lone surrogate is reported, not a crash."""
    request = '{"chatMessages": [{"source": "CHAT_MESSAGE_SOURCE_USER", "text": "Hello"}], "temperature": NaN}'
    doc, finding = DIALECT.parse_request(env(request), view(RAW_CHAT, JSON_STREAM))
    assert doc["messages"] == [{"role": "user", "content": "Hello"}] and finding.code == "request_lenient_json"
    body = env('{"deltaMessage": {"text": "Hi \\ud800", "inProgress": true}}') + env('{"x": "\\udc00"}') + end_stream()
    row = audit(body, path=RAW_CHAT, headers=JSON_STREAM)
    assert row["output_text"].startswith("Hi ")
    codes = [f["code"] for f in row["findings"]]
    assert codes.count("lenient_json") == 2 and "protobuf_unmapped" in codes


def test_a_json_answer_message_past_the_readers_values_bound_says_what_the_filters_did_not_read():
    """What of a JSON answer message no field carries is read for the output filters; a
    message of very many values (a million empty objects held no string and took a
    second of the event loop) is read to MESSAGE_VALUES, and the rest is said unread
    (``strings_unread``: the output filters' failure policy decides)."""
    from addon.dialects.rpc import MESSAGE_VALUES

    message = {"deltaMessage": {"text": "Hi"}, "pad": [{}] * MESSAGE_VALUES + ["Nightjar"]}
    row = audit(env(json.dumps(message)) + end_stream(), path=RAW_CHAT, headers=JSON_STREAM)
    assert row["output_text"] == "Hi"
    [detail] = [x["detail"] for x in row["findings"] if x["code"] == "strings_unread"]
    assert detail == f"a response message: values past the first {MESSAGE_VALUES} not read"


def test_a_unary_json_answer_past_the_readers_values_bound_is_the_failure_policy_s():
    """A unary answer (a whole JSON body, held by mitmproxy for blocking filters) whose
    strings are not all read: its gate holds nothing itself, so it let the answer go
    unchecked past the bound; now the failure policy decides (closed: refused)."""
    from addon.auditor import StreamAuditor
    from addon.dialects.rpc import MESSAGE_VALUES
    from addon.filters.engine import FilterSet
    from addon.filters.rules import parse_rules
    from addon.framing import select
    from addon.mitm.flow_state import OutputCheck
    from addon.mitm.tap import output_gate
    from addon.record import OUTCOME_COMPLETE, ExchangeRecord

    rules = '[[rule]]\nid = "k"\nkind = "keywords"\nkeywords = ["Nightjar"]\nscope = "response"\naction = "block"\n'
    filters = FilterSet(parse_rules(rules), failure="closed")
    headers = {"content-type": "application/json", "connect-protocol-version": "1"}
    request = view(RAW_CHAT, headers)
    summary = DIALECT.summarize(None, request)
    record = ExchangeRecord(dialect=DIALECT.name, streamed=False, http_status=200)
    normalizer = DIALECT.normalizer(summary)
    framing = select("application/json", 200, normalizer.framing)
    gate = output_gate(OutputCheck(filters, DIALECT, summary, request), framing.streamed, None)
    auditor = StreamAuditor(record, normalizer, None, 1 << 24, gate=gate, framing=framing, headers=headers)
    message = {"deltaMessage": {"text": "Hi"}, "pad": [{}] * MESSAGE_VALUES + ["Nightjar"]}
    auditor.read_whole(json.dumps(message).encode())
    auditor.end()
    record.finish(OUTCOME_COMPLETE)
    row = record.to_row()
    assert auditor.stopped and row["status"] == "blocked"
    assert [v["rule_id"] for v in row["verdicts"]] == ["filter_error"] and "strings_unread" in row["verdicts"][0][
        "reason"
    ]
