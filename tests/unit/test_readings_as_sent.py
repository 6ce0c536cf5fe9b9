"""The filters read a protobuf, Connect or SignalR message's strings as sent; the record
keeps them fingerprinted and bounded (``addon.dialects.Reading``).

Before, the dialects fingerprinted a string holding a credential before anyone read it,
and kept 64 strings of 2000 characters of the fields nobody mapped: a key in the file
Cursor sends with a prompt, a word after the file's first 2000 characters or in its 65th
string, or a word beside a key went upstream past every request rule, and a key in an
unmapped answer or a Cursor tool call past the output rules.
"""

from __future__ import annotations

import json

import orjson
import pytest
from hub_driver import Connection
from hub_driver import view as ws_view
from protoenc import env, f, m

from addon.dialects import RequestSummary, RequestView
from addon.dialects.connect_rpc import DIALECT as CONNECT
from addon.dialects.copilot_chathub import DIALECT as COPILOT
from addon.dialects.cursor import DIALECT as CURSOR
from addon.dialects.rpc import CONTEXT_STRINGS, UNMAPPED_CHARS, UNMAPPED_STRINGS
from addon.dialects.signalr import DIALECT as SIGNALR
from addon.dialects.windsurf import DIALECT as WINDSURF
from addon.events import ShownText, TextDelta, ToolCallDelta
from addon.filters.engine import FilterSet
from addon.filters.rules import parse_rules
from addon.framing.envelope import connect_reader
from addon.mitm.content_filters import check_request
from addon.record import ExchangeRecord
from addon.redact import redacted

RULES = """
[[rule]]
id = "creds"
kind = "secrets"
scope = "both"
action = "block"

[[rule]]
id = "word"
kind = "keywords"
keywords = ["Nightjar"]
scope = "both"
action = "block"
"""
KEY = "AKIA" + "IOSFODNN7EXAMPLE"  # (an AWS access key id the secrets detector knows)
CONNECT_PROTO = {"content-type": "application/connect+proto", "connect-protocol-version": "1"}
CONNECT_JSON = {"content-type": "application/connect+json", "connect-protocol-version": "1"}
STREAM_CHAT = "/aiserver.v1.AiService/StreamChat"
GET_CHAT = "/exa.api_server_pb.ApiServerService/GetChatMessage"
FILTERS = FilterSet(parse_rules(RULES), failure="closed")


def verdicts(dialect, doc, findings=()) -> set[str]:  # type: ignore[no-untyped-def]
    """The rules that blocked a request read as ``doc``; the record it gives keeps no key."""
    record = ExchangeRecord(request_body=doc)
    for finding in findings:
        record.apply(finding)
    check_request(FILTERS, record, dialect, RequestSummary())
    assert KEY.encode() not in orjson.dumps(record.to_row())  # (never stored: only its fingerprint)
    return {v["rule_id"] for v in record.verdicts if v["action"] == "block"}


def cursor_request(*unmapped: bytes) -> bytes:
    """A StreamChat request: a question, a model, and ``unmapped`` fields (the open file is field 1)."""
    return env(m(2, f(1, "what does this do?"), f(2, 1)) + m(7, f(1, "gpt-4o")) + b"".join(unmapped))


def read_cursor(body: bytes):  # type: ignore[no-untyped-def]
    return CURSOR.parse_request(body, RequestView("POST", STREAM_CHAT, "", CONNECT_PROTO))


def test_a_key_in_the_open_file_is_found_and_the_record_keeps_its_fingerprint():
    text = f"import os\nAWS = '{KEY}'\n"
    doc, finding = read_cursor(cursor_request(m(1, f(1, "src/app.py"), f(2, text))))
    assert finding is None and doc["unmapped_strings"] == ["src/app.py", redacted(text)]
    assert verdicts(CURSOR, doc) == {"creds"}


@pytest.mark.parametrize(
    "file",
    [
        ["x" * 2500 + " Nightjar"],  # past the characters the record keeps of a string
        [f"line {i}" for i in range(UNMAPPED_STRINGS)] + ["Nightjar"],  # past the strings it keeps
        [f"Nightjar and {KEY}"],  # beside a key (its string kept as one fingerprint)
    ],
    ids=["past-2000-characters", "past-64-strings", "beside-a-key"],
)
def test_a_word_the_record_does_not_keep_as_sent_is_still_read(file):
    doc, finding = read_cursor(cursor_request(*(m(1, f(2, s)) for s in file)))
    assert finding is None
    assert "word" in verdicts(CURSOR, doc)
    kept = doc["unmapped_strings"]
    assert len(kept) <= UNMAPPED_STRINGS and all(len(s) <= UNMAPPED_CHARS for s in kept)
    assert not any("Nightjar" in s for s in kept)  # (the record's bounds are unchanged)


def test_an_innocent_request_reads_as_before():
    doc, finding = read_cursor(cursor_request(m(1, f(1, "src/app.py"), f(2, "print('hi')"))))
    assert finding is None and doc.unkept == [] and verdicts(CURSOR, doc) == set()


def nested(text: str, depth: int) -> bytes:
    """``text`` as field 1 of a message nested ``depth`` levels deep."""
    value = f(1, text)
    for _ in range(depth):
        value = m(1, value)
    return value


@pytest.mark.parametrize(
    ("fields", "bound"),
    [
        (
            [m(20, *(f(1, f"s{i}") for i in range(CONTEXT_STRINGS // 2)))] * 2 + [f(20, "Nightjar")],
            f"first {CONTEXT_STRINGS}",
        ),
        ([m(3, nested("Nightjar", 40))], "nested deeper than"),
    ],
    ids=["strings", "depth"],
)
def test_strings_past_the_readers_bounds_are_unread_and_refused_under_closed(fields, bound):
    doc, finding = read_cursor(cursor_request(*fields))
    assert finding is not None and finding.code == "strings_unread" and bound in finding.detail
    assert verdicts(CURSOR, doc, [finding]) == {"filter_error"}


def test_windsurf_proto_and_json_requests_are_read_as_sent():
    body = env(m(1, f(3, "sk-ws-01-client-key")) + m(3, f(2, 1), f(3, "hi")) + m(9, f(1, "y" * 3000 + " Nightjar")))
    doc, finding = WINDSURF.parse_request(body, RequestView("POST", GET_CHAT, "", CONNECT_PROTO))
    assert finding is None and verdicts(WINDSURF, doc) == {"word"}

    message = {
        "metadata": {"apiKey": "sk-ws-01-client-key", "ideName": "windsurf"},  # the client's own: not a prompt
        "chatMessages": [{"source": "CHAT_MESSAGE_SOURCE_USER", "text": f"deploy with {KEY}"}],
        "context": {"openFile": "the Nightjar plan"},  # a key nobody maps: read as unmapped
    }
    doc, finding = WINDSURF.parse_request(env(json.dumps(message)), RequestView("POST", GET_CHAT, "", CONNECT_JSON))
    assert finding is None and verdicts(WINDSURF, doc) == {"creds", "word"}
    assert doc["messages"] == [{"role": "user", "content": redacted(f"deploy with {KEY}")}]
    assert doc["metadata"]["apiKey"].startswith("[redacted")


def test_a_connect_request_is_read_as_sent_but_for_the_clients_own_credentials():
    def read(message: dict) -> set[str]:
        doc, finding = CONNECT.parse_request(
            json.dumps(message).encode(),
            RequestView(
                "POST",
                "/acme.ai.v1.Chat/Generate",
                "",
                {"content-type": "application/json", "connect-protocol-version": "1"},
            ),
        )
        assert finding is None
        return verdicts(CONNECT, doc)

    assert read({"prompt": f"my key is {KEY}"}) == {"creds"}
    assert read({"apiKey": KEY, "prompt": "hello"}) == set()  # (a field named for a credential: the client's own)


def test_a_connect_answer_with_a_key_is_shown_to_the_output_filters_as_sent():
    normalizer = CONNECT.normalizer(
        CONNECT.summarize(None, RequestView("POST", "/acme.ai.v1.Chat/Generate", "", CONNECT_PROTO))
    )
    events = normalizer.on_message(f(1, f"here: {KEY}"))
    assert events == [TextDelta(redacted(f"here: {KEY}")), ShownText(f"here: {KEY}", kind="unmapped")]
    assert normalizer.on_message(f(1, "plain")) == [TextDelta("plain")]


def test_a_cursor_tool_call_with_a_key_is_shown_to_the_output_filters_as_sent():
    view = RequestView("POST", "/agent.v1.AgentService/Run", "", CONNECT_PROTO)
    normalizer = CURSOR.normalizer(CURSOR.summarize(None, view))
    body = env(m(1, m(7, f(1, "tc1"), f(2, f'{{"cmd":"export K={KEY}"}}'))))
    events = [e for frame in connect_reader(1 << 20, 1 << 20, {}).feed(body) for e in normalizer.on_event(frame)]
    call = next(e for e in events if isinstance(e, ToolCallDelta))
    assert KEY not in call.arguments
    assert ShownText(f'{{"cmd":"export K={KEY}"}}', kind="tool_arguments") in events


def test_a_signalr_prompt_and_copilot_history_are_read_as_sent():
    hello = b'{"protocol":"json","version":1}\x1e'
    conn = Connection(ws_view("/hub"), hello)
    prompt = {"type": 4, "invocationId": "1", "target": "Ask", "arguments": [f"use {KEY}", {"token": "client-token"}]}
    (doc,) = conn.send(json.dumps(prompt).encode() + b"\x1e")
    assert verdicts(SIGNALR, doc) == {"creds"}
    assert "client-token" not in json.dumps(doc) and "client-token" not in doc.unkept

    conn = Connection(ws_view("/sydney/ChatHub"), hello)
    arg = {"message": {"text": "and now?"}, "previousMessages": [{"author": "user", "text": f"Nightjar {KEY}"}]}
    (doc,) = conn.send(
        json.dumps({"type": 4, "invocationId": "0", "target": "chat", "arguments": [arg]}).encode() + b"\x1e"
    )
    assert verdicts(COPILOT, doc) == {"creds", "word"}
