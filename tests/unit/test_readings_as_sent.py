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
from conn_driver import connection
from hub_driver import Connection
from hub_driver import view as ws_view
from protoenc import end_stream, env, f, m, tag, varint

from addon.dialects import RequestSummary, RequestView
from addon.dialects.connect_rpc import DIALECT as CONNECT
from addon.dialects.connect_rpc import handles_credentials
from addon.dialects.copilot_chathub import DIALECT as COPILOT
from addon.dialects.cursor import DIALECT as CURSOR
from addon.dialects.rpc import UNMAPPED_CHARS, UNMAPPED_STRINGS
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
UNIFIED = "/aiserver.v1.ChatService/StreamUnifiedChatWithTools"
BIDI_APPEND = "/aiserver.v1.BidiService/BidiAppend"
UNARY_JSON = {"content-type": "application/json", "connect-protocol-version": "1"}
GET_CHAT = "/exa.api_server_pb.ApiServerService/GetChatMessage"
FILTERS = FilterSet(parse_rules(RULES), failure="closed")


def verdicts(dialect, doc, findings=(), prompt_kept: bool = False) -> set[str]:  # type: ignore[no-untyped-def]
    """The rules that blocked a request read as ``doc``; the record it gives keeps no key
    (but in a prompt, ``prompt_kept``: prompts are kept verbatim, as every dialect keeps them)."""
    record = ExchangeRecord(request_body=doc)
    for finding in findings:
        record.apply(finding)
    check_request(FILTERS, record, dialect, RequestSummary())
    assert prompt_kept or KEY.encode() not in orjson.dumps(record.to_row())  # (never stored: only its fingerprint)
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
    assert finding is None and verdicts(CURSOR, doc) == set()


def nested(text: str, depth: int) -> bytes:
    """``text`` as field 1 of a message nested ``depth`` levels deep."""
    value = f(1, text)
    for _ in range(depth):
        value = m(1, value)
    return value


@pytest.mark.parametrize(
    "fields",
    [
        [m(20, *(f(1, f"s{i}") for i in range(50_000)))] * 2 + [f(20, "Nightjar")],
        [m(3, nested("Nightjar", 40))],
    ],
    ids=["100k-strings", "40-levels-deep"],
)
def test_strings_past_the_readings_bounds_are_read_by_the_filters_and_refuse_nothing(fields):
    """What the record's reading of a Cursor request stops at (its 64 context strings, a
    message nested past 32 levels) the filters still read in the message's bytes: the
    word is found, and an ordinary request with a big context is no strings_unread
    (which `closed` would refuse)."""
    doc, finding = read_cursor(cursor_request(*fields))
    assert finding is None or finding.code == "protobuf_budget"  # (100k fields: past the reading's budget)
    assert verdicts(CURSOR, doc) == {"word"}


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
    assert events == [TextDelta(redacted(f"here: {KEY}"), sent=f"here: {KEY}")]  # (read in the answer's stream)
    assert normalizer.on_message(f(1, "plain")) == [TextDelta("plain")]


def test_a_cursor_tool_call_with_a_key_is_shown_to_the_output_filters_as_sent():
    view = RequestView("POST", "/agent.v1.AgentService/Run", "", CONNECT_PROTO)
    normalizer = CURSOR.normalizer(CURSOR.summarize(None, view))
    body = env(m(1, m(7, f(1, "tc1"), f(2, f'{{"cmd":"export K={KEY}"}}'))))
    events = [e for frame in connect_reader(1 << 20, 1 << 20, {}).feed(body) for e in normalizer.on_event(frame)]
    call = next(e for e in events if isinstance(e, ToolCallDelta))
    assert KEY not in call.arguments
    assert call.arguments_sent == f'{{"cmd":"export K={KEY}"}}'  # (read in the call's stream of arguments)


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


def _json_request(dialect, path: str, body: bytes, headers: dict):  # type: ignore[no-untyped-def]
    doc, finding = dialect.parse_request(body, RequestView("POST", path, "", headers))
    assert finding is None
    return doc


def test_a_json_messages_object_keys_are_read_as_data_by_the_filters_alone():
    """A protobuf map's keys are data in Connect's JSON codec (``map<string, string>``
    encodes as an object), so text may be a key; in the binary codec the same map's keys
    are string fields, always read. The filters read every key of a message of a service
    nobody maps and of a hub nobody maps (its payloads'), not those of a dialect that maps
    its schema (a rule naming ``message`` would block every message); the record keeps
    none of them (``"role"`` and ``"text"`` are nobody's text)."""
    labels = {"labels": {"the Nightjar plan": "yes"}, "prompt": "hello"}
    doc = _json_request(CONNECT, "/acme.ai.v1.Chat/Generate", json.dumps(labels).encode(), UNARY_JSON)
    assert verdicts(CONNECT, doc) == {"word"} and "Nightjar" not in json.dumps(doc)
    plain = _json_request(CONNECT, "/acme.ai.v1.Chat/Generate", b'{"prompt": "hello"}', UNARY_JSON)
    assert verdicts(CONNECT, plain) == set()

    message = {"chatMessages": [{"source": "CHAT_MESSAGE_SOURCE_USER", "text": "hi"}], "context": labels}
    doc = _json_request(WINDSURF, GET_CHAT, env(json.dumps(message)), CONNECT_JSON)
    assert verdicts(WINDSURF, doc) == set()  # (a mapped dialect's keys are its schema: not read)

    conn = Connection(ws_view("/hub"), b'{"protocol":"json","version":1}\x1e')
    prompt = {"type": 4, "invocationId": "1", "target": "Ask", "arguments": ["hello", {"the Nightjar plan": 1}]}
    (doc,) = conn.send(json.dumps(prompt).encode() + b"\x1e")
    assert verdicts(SIGNALR, doc) == {"word"} and "Nightjar" not in json.dumps(doc)


def test_a_large_map_of_numbers_is_read_as_before():
    """The keys are read beside their values, bounded by them: a map of 5,000 numbers
    (token counts, log probabilities) is neither refused nor cut from the record."""
    counts = {f"tok{i}": -0.5 for i in range(5000)}
    message = json.dumps({"counts": counts, "prompt": "hello, summarise this"}).encode()
    doc = _json_request(CONNECT, "/acme.ai.v1.Chat/Generate", message, UNARY_JSON)
    assert verdicts(CONNECT, doc) == set() and "hello, summarise this" in json.dumps(doc)
    body = env(json.dumps({"logprobs": counts, "text": "The answer is 42."}))
    _, row = answered(CONNECT, "/acme.ai.v1.Chat/Generate", body, headers=CONNECT_JSON)
    assert row["output_text"] == "The answer is 42." and row["verdicts"] == []


def test_the_keys_of_a_protocol_or_a_mapped_schema_are_not_text():
    """A rule naming a hub envelope's keys, or Copilot's, blocks nothing: only the keys
    of a payload nobody maps are read."""
    schema = FilterSet(
        parse_rules(
            '[[rule]]\nid = "k"\nkind = "keywords"\nkeywords = ["target", "arguments", "message"]\n'
            'scope = "request"\naction = "block"'
        ),
        failure="closed",
    )

    def blocked(dialect, doc) -> bool:  # type: ignore[no-untyped-def]
        record = ExchangeRecord(request_body=doc)
        check_request(schema, record, dialect, RequestSummary())
        return any(v["action"] == "block" for v in record.verdicts)

    hello = b'{"protocol":"json","version":1}\x1e'
    (doc,) = Connection(ws_view("/hub"), hello).send(
        json.dumps({"type": 1, "invocationId": "1", "target": "Ask", "arguments": ["hi"]}).encode() + b"\x1e"
    )
    assert not blocked(SIGNALR, doc)
    arg = {"message": {"text": "and now?"}, "previousMessages": [{"author": "user", "text": "hi"}]}
    (doc,) = Connection(ws_view("/sydney/ChatHub"), hello).send(
        json.dumps({"type": 4, "invocationId": "0", "target": "chat", "arguments": [arg]}).encode() + b"\x1e"
    )
    assert not blocked(COPILOT, doc)


def test_a_json_answers_object_keys_reach_the_output_filters():
    body = env(json.dumps({"sentence": "Ask. "})) + env(json.dumps({"labels": {"the Nightjar plan": 1}}))
    sent, row = answered(CONNECT, "/acme.ai.v1.Chat/Generate", body, headers=CONNECT_JSON)
    assert row["status"] == "blocked" and b"Nightjar" not in sent
    assert "labels" not in (row["output_text"] or "")  # (the record keeps the strings, not the keys)


# -- every byte of a protobuf request, and every string of a hub's client record ------------------

SECRET_TEXT = f"Nightjar {KEY}"


def group_hiding(text: str) -> bytes:
    """``text`` inside a group inside a string that also parses as a message: a reader
    that takes it for a message (groups skipped) finds no string in it; a server reads
    the string whole."""
    raw = text.encode()
    return b"\x08\x01" + tag(1, 3) + tag(1, 2) + varint(len(raw)) + raw + tag(1, 4)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        (STREAM_CHAT, cursor_request(m(1, f(1, "a.py"), f(2, group_hiding(SECRET_TEXT))))),
        (STREAM_CHAT, cursor_request(m(1, f(1, "a.py"), f(2, "café: ".encode("latin-1") + SECRET_TEXT.encode())))),
        (
            STREAM_CHAT,
            env(m(2, f(1, "what does this do?"), f(2, 1), m(3, f(2, SECRET_TEXT)))),
        ),  # a mapped message's field
        (STREAM_CHAT, cursor_request(m(1, nested(SECRET_TEXT, 40)))),  # nested past the reader's depth
        (UNIFIED, env(m(1, m(1, f(1, "go on"), f(2, 1), m(18, f(1, "tc1"), f(2, SECRET_TEXT)))))),
        (BIDI_APPEND, env(f(1, (m(2, f(1, "hi")) + f(3, SECRET_TEXT)).hex()) + m(2, f(1, "rid")))),
    ],
    ids=["a-group-in-a-string", "not-utf-8", "mapped-message-field", "too-deep", "tool-results", "bidi-append-hex"],
)
def test_every_string_of_a_protobuf_request_reaches_the_filters(path, message):
    """Whatever holds it, a string of the message is in its bytes: the filters read them
    as text (addon.dialects.rpc.payload_text), so no wire trick and no field the reading
    skips hides a word or a key."""
    doc, finding = CURSOR.parse_request(message, RequestView("POST", path, "", CONNECT_PROTO))
    assert {"word", "creds"} <= verdicts(CURSOR, doc, [finding] if finding else [])


def test_the_clients_own_key_is_not_a_secret_going_upstream():
    """Cursor's ModelDetails.api_key and Windsurf's metadata keys are the client's own
    credentials (as its headers): fingerprinted, and not read by the filters."""
    doc, _ = read_cursor(env(m(2, f(1, "hi"), f(2, 1)) + m(7, f(1, "gpt-4o"), f(2, KEY))))
    assert verdicts(CURSOR, doc) == set() and doc["api_key"] == redacted(KEY)
    body = env(m(1, f(3, KEY)) + m(3, f(2, 1), f(3, "hi")))
    doc, _ = WINDSURF.parse_request(body, RequestView("POST", GET_CHAT, "", CONNECT_PROTO))
    assert verdicts(WINDSURF, doc) == set() and doc["api_key"] == redacted(KEY)


@pytest.mark.parametrize("key", ["Nightjar", "a", "the Nightjar plan"])
def test_the_clients_own_key_takes_out_its_field_not_its_value_everywhere(key):
    """The client picks its key: taking every occurrence of it out of what the filters
    read let a key named like the word (or ``a``) take the word out of a context string
    the record does not keep (past its 64). Only the key's own field is taken out."""
    context = [f(1, f"s{i}") for i in range(UNMAPPED_STRINGS)] + [f(1, "about the Nightjar plan")]
    body = env(m(2, f(1, "hi"), f(2, 1)) + m(7, f(1, "gpt-4o"), f(2, key)) + m(20, *context))
    doc, finding = read_cursor(body)
    assert finding is None and doc["api_key"] == redacted(key)
    assert verdicts(CURSOR, doc) == {"word"}


def test_a_key_whose_field_occurs_twice_is_left_for_the_filters():
    """Its field's bytes twice (the second inside a prompt): which one is the key's
    cannot be told without offsets, so neither is taken out; the secrets rule sees it."""
    field = f(2, KEY)
    body = env(m(2, f(1, "hi"), f(2, 1)) + m(7, f(1, "gpt-4o"), field) + m(20, f(1, field.decode("latin-1"))))
    doc, _ = read_cursor(body)
    assert doc["api_key"] == redacted(KEY) and "creds" in verdicts(CURSOR, doc)


def test_windsurf_reads_the_last_value_of_a_field_sent_twice():
    """Protobuf parsers keep the last value of a singular field: so does the reading."""
    raw_chat = "/exa.language_server_pb.LanguageServerService/RawGetChatMessage"
    body = env(m(2, f(2, 1), f(5, "hi"), f(5, SECRET_TEXT)) + f(5, "m"))
    doc, _ = WINDSURF.parse_request(body, RequestView("POST", raw_chat, "", CONNECT_PROTO))
    assert doc["messages"] == [{"role": "user", "content": SECRET_TEXT}]  # (a prompt: kept verbatim)
    assert {"word", "creds"} <= verdicts(WINDSURF, doc, prompt_kept=True)


def test_cursor_in_connects_json_codec_is_read_as_a_service_nobody_mapped():
    message = {"conversation": [{"text": SECRET_TEXT, "type": "MESSAGE_TYPE_HUMAN"}]}
    doc, finding = CURSOR.parse_request(env(json.dumps(message)), RequestView("POST", STREAM_CHAT, "", CONNECT_JSON))
    assert finding is None and {"word", "creds"} <= verdicts(CURSOR, doc)
    view = RequestView("POST", STREAM_CHAT, "", CONNECT_JSON)
    normalizer = CURSOR.normalizer(CURSOR.summarize(None, view))
    events = normalizer.on_message(json.dumps({"text": f"here: {KEY}"}).encode())
    assert events == [TextDelta(redacted(f"here: {KEY}"), sent=f"here: {KEY}"), ShownText("text", kind="payload")]


def test_a_cursor_file_of_several_mib_is_read_whole_not_refused():
    """A string is never cut for the filters (a message is at most 8 MiB): a big open
    file is read to its end, and is no strings_unread (which `closed` refuses)."""
    text = "x = 1\n" * 400_000 + "# Nightjar"  # 2.4 MB
    doc, finding = read_cursor(cursor_request(m(1, f(1, "big.py"), f(2, text))))
    assert finding is None and verdicts(CURSOR, doc) == {"word"}


def test_a_key_across_the_records_cut_is_kept_only_as_its_fingerprint():
    text = "x" * (UNMAPPED_CHARS - 10) + " " + KEY
    doc, _ = read_cursor(cursor_request(m(1, f(2, text))))
    assert doc["unmapped_strings"] == [redacted(text)]


def test_a_connect_message_that_is_no_json_is_unread():
    doc, finding = CONNECT.parse_request(
        b'{"prompt": "Nightjar"', RequestView("POST", "/acme.ai.v1.Chat/Generate", "", UNARY_JSON)
    )
    assert finding is not None and finding.code == "strings_unread"
    assert verdicts(CONNECT, doc, [finding]) == {"filter_error"}


@pytest.mark.parametrize(
    ("message", "blocked"),
    [
        ({"author": "the Nightjar plan"}, {"word"}),  # (a name like a credential's, holding a prompt)
        ({"private": "the Nightjar"}, {"word"}),
        ({"apiKey": KEY}, set()),  # (one token under a credential's name: the client's own)
    ],
)
def test_only_a_credential_under_a_credentials_name_is_the_clients_own(message, blocked):
    doc, _ = CONNECT.parse_request(
        json.dumps(message).encode(), RequestView("POST", "/acme.ai.v1.Chat/Generate", "", UNARY_JSON)
    )
    assert verdicts(CONNECT, doc) == blocked


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/acme.auth.v1.Auth/Login", True),
        ("/x.v1.S/RefreshToken", True),
        ("/x.v1.S/SignIn", True),
        ("/x.v1.S/GetUserJwt", True),
        ("/x.v1.S/CountTokens", False),
        ("/x.v1.AuthoringService/CreateDraft", False),
        ("/oauth-gw/acme.ai.v1.Chat/Generate", False),
    ],
)
def test_a_method_carries_credentials_by_its_own_words(path, expected):
    """Only a login's strings go unread: a service, a routing prefix or a word that holds
    one (CountTokens) turns neither the record's reading nor the filters off."""
    assert handles_credentials(path) is expected


@pytest.mark.parametrize(
    "record",
    [
        {"type": 2, "invocationId": "s1", "item": SECRET_TEXT},  # a client-to-server stream's item
        {"type": 3, "invocationId": "s1", "result": SECRET_TEXT},  # the client's completion
        {"type": 1, "target": "Metrics", "arguments": [{"note": SECRET_TEXT}]},  # telemetry (no turn)
        {
            "type": 4,
            "invocationId": "0",
            "target": "chat",
            "arguments": [{"message": {"text": "hi"}, "context": SECRET_TEXT}],
        },
    ],
    ids=["stream-item", "completion", "metrics", "chat-argument-key"],
)
def test_every_string_of_a_hub_client_record_reaches_the_filters(record):
    a, written = connection(COPILOT, "signalr_json", ws_view("/sydney/ChatHub"), RULES)
    a.from_client(b'{"protocol":"json","version":1}\x1e', True)
    a.from_server(b"{}\x1e", True)
    relay = a.from_client(json.dumps(record).encode() + b"\x1e", True)
    assert relay.onward == []  # refused: not forwarded
    assert KEY.encode() not in orjson.dumps(written)


def test_messagepack_keys_that_are_not_strings_never_raise():
    from addon.dialects.rpc import clean_json

    assert clean_json({1: "a", (2, 3): {"apiKey": "k"}}, texts=False) == {1: "a", (2, 3): {"apiKey": redacted("k")}}


def test_a_key_that_is_a_credential_is_kept_as_its_fingerprint():
    """A map keyed by API key: the record (clean_json) kept the key as sent."""
    from addon.dialects.rpc import clean_json

    assert clean_json({"keys": {KEY: {"owner": "ci"}}}) == {"keys": {redacted(KEY): {"owner": "ci"}}}


# -- every string of a protobuf answer message, checked beside its text -----------------------


def answered(
    dialect, path: str, body: bytes, filters: FilterSet = FILTERS, headers: dict | None = None
) -> tuple[bytes, dict]:  # type: ignore[no-untyped-def]
    """``body`` through an auditor whose output gate checks ``filters`` (RULES): what the client got, the row."""
    from addon.auditor import StreamAuditor, summary_into_record
    from addon.framing import select
    from addon.output_gate import OutputGate

    headers = headers or CONNECT_PROTO
    summary = dialect.summarize(None, RequestView("POST", path, "", headers))
    record = ExchangeRecord(dialect=dialect.name, streamed=True, http_status=200)
    summary_into_record(record, summary)
    normalizer = dialect.normalizer(summary)
    guard = filters.output_guard()
    gate = OutputGate(guard, dialect.normalizer(summary), holds=guard.may_block, split_raw=True, failure="closed")
    framing = select(headers["content-type"], 200, normalizer.framing)
    auditor = StreamAuditor(record, normalizer, None, 1 << 20, gate=gate, framing=framing, headers=headers)
    sent = auditor.feed(body) + auditor.finish()
    auditor.end()
    record.finish("complete")
    return sent, record.to_row()


@pytest.mark.parametrize(
    ("dialect", "path", "message"),
    [
        (CURSOR, STREAM_CHAT, f(1, "Here: ") + f(7, "the Nightjar plan")),  # a field known but not read
        (CURSOR, STREAM_CHAT, f(7, "the Nightjar plan") + f(1, "the Nigh")),  # its text a piece of the other's
        (CURSOR, "/agent.v1.AgentService/Run", m(1, m(2, f(1, "tc1"), f(2, "the Nightjar plan")))),
        (CONNECT, "/acme.ai.v1.Chat/Generate", f(1, group_hiding("the Nightjar plan"))),
    ],
    ids=["cursor-intermediate-text", "text-carried-elsewhere", "cursor-tool-call-started", "generic-group-in-a-string"],
)
def test_every_string_of_a_protobuf_answer_reaches_the_output_filters(dialect, path, message):
    sent, row = answered(dialect, path, env(m(2, f(1, "Ask about it. "))) + env(message) + env(f(1, "More.")))
    assert row["status"] == "blocked" and b"Nightjar" not in sent
    assert any(v["rule_id"] == "word" for v in row["verdicts"])


def test_a_match_in_the_answers_text_is_reported_once():
    """The bytes checked beside the text are what its events did not carry: a flag on a
    word of a text delta is one verdict, not one for the text and one for the bytes."""
    flags = FilterSet(parse_rules(RULES.replace('action = "block"', 'action = "flag"')), failure="closed")
    body = env(m(2, f(1, "the Nightjar "))) + env(m(2, f(1, "plan, with "))) + env(m(2, f(1, KEY))) + end_stream()
    sent, row = answered(CURSOR, UNIFIED, body, flags)
    assert sent == body and row["status"] == "completed"
    assert sorted((v["rule_id"], v["location"]) for v in row["verdicts"]) == [
        ("creds", "output.choices[0].text"),
        ("word", "output.choices[0].text"),
    ]


@pytest.mark.parametrize(
    "moved",
    [{"message": {"text": "the Nightjar plan"}}, {"deltaMessage": {"text": "ok", "note": "the Nightjar plan"}}],
    ids=["no-delta-message", "delta-message-other-key"],
)
def test_a_json_answers_strings_in_keys_nobody_maps_reach_the_output_filters(moved):
    """Windsurf in Connect's JSON codec: a key a release moved the text to, or one beside
    the text, is checked beside the answer (its other strings, not the text again)."""
    raw_chat = "/exa.language_server_pb.LanguageServerService/RawGetChatMessage"
    body = env(json.dumps({"deltaMessage": {"text": "Ask. ", "inProgress": True}})) + env(json.dumps(moved))
    sent, row = answered(WINDSURF, raw_chat, body, headers=CONNECT_JSON)
    assert row["status"] == "blocked" and b"Nightjar" not in sent


WORD_ONLY = FilterSet(parse_rules(RULES[RULES.index('[[rule]]\nid = "word"') :]), failure="closed")


@pytest.mark.parametrize(
    ("dialect", "path", "headers", "messages", "kept_as_fingerprint"),
    [
        (CONNECT, "/acme.ai.v1.Chat/Generate", CONNECT_PROTO, [f(1, "the Night"), f(1, f"jar plan {KEY}")], KEY),
        (
            CURSOR,
            "/agent.v1.AgentService/Run",
            CONNECT_PROTO,
            [m(1, m(7, f(1, "tc1"), f(2, '{"cmd":"the Night'))), m(1, m(7, f(1, "tc1"), f(2, f'jar {KEY}"}}')))],
            KEY,
        ),
        (CONNECT, "/acme.ai.v1.Chat/Generate", CONNECT_JSON, [b'{"out": "the Night"}', b'{"token": "jar"}'], "jar"),
        (CONNECT, "/acme.ai.v1.Chat/Generate", CONNECT_JSON, [b'{"token": "Nightjar"}'], "Nightjar"),
    ],
    ids=["generic-text-then-a-key", "cursor-tool-call-then-a-key", "json-then-a-credential-key", "json-credential-key"],
)
def test_an_answer_piece_the_record_keeps_fingerprinted_is_read_as_sent_in_its_stream(
    dialect, path, headers, messages, kept_as_fingerprint
):  # type: ignore[no-untyped-def]
    """Before, such a piece reached the output filters as its fingerprint in the answer's
    text and as sent only on its own beside it (a JSON value under a key named like a
    credential not even that): a word begun in the piece before it, or the value itself,
    went to the client past a blocking keyword rule (no secrets rule loaded). The record
    keeps the piece's fingerprint."""
    sent, row = answered(dialect, path, b"".join(env(x) for x in messages), WORD_ONLY, headers)
    assert row["status"] == "blocked" and b"jar" not in sent
    assert [v["rule_id"] for v in row["verdicts"]] == ["word"]
    stored = orjson.dumps(row).decode()
    assert kept_as_fingerprint not in stored and "[redacted sha256:" in stored


def test_a_value_under_a_credentials_name_is_fingerprinted_where_it_occurs():
    """Marked where it occurs, not by its text: an equal string under another key is kept."""
    normalizer = CONNECT.normalizer(
        CONNECT.summarize(None, RequestView("POST", "/acme.ai.v1.Chat/Generate", "", CONNECT_JSON))
    )
    event, keys = normalizer.on_message(b'{"author": "Alice", "text": "Alice wrote"}')
    assert event.text == f"{redacted('Alice')}\nAlice wrote" and event.sent == "Alice\nAlice wrote"
    assert keys == ShownText("author\ntext", kind="payload")
    event, _ = normalizer.on_message(b'{"author": "Alice", "text": "Alice"}')
    assert event.text == f"{redacted('Alice')}\nAlice" and event.sent == "Alice\nAlice"


FLAGS = FilterSet(parse_rules(RULES.replace('action = "block"', 'action = "flag"')), failure="closed")


def flagged(dialect, doc) -> list[str]:  # type: ignore[no-untyped-def]
    record = ExchangeRecord(request_body=doc)
    check_request(FLAGS, record, dialect, RequestSummary())
    return [v["location"] for v in record.verdicts]


def test_a_match_in_a_request_is_reported_once():
    """The bytes the filters read beside a request's messages hold those messages too: a
    match found in a message is not reported again for the bytes (a flag is one verdict
    per match), while a match only the bytes hold still is."""
    doc, _ = read_cursor(env(m(2, f(1, "about Nightjar?"), f(2, 1)) + m(1, f(2, "file about Nightjar"))))
    assert len(flagged(CURSOR, doc)) == 2  # (the prompt, the file: not the bytes again)
    doc, _ = CONNECT.parse_request(env(f(1, "Nightjar")), RequestView("POST", "/a.b.v1.C/G", "", CONNECT_PROTO))
    assert flagged(CONNECT, doc) == ["messages[0]"]
    doc, _ = read_cursor(cursor_request(m(1, f(2, group_hiding("the Nightjar plan")))))
    assert len(flagged(CURSOR, doc)) == 1  # (only the bytes hold it)


def test_a_multi_line_text_delta_is_reported_once():
    body = env(m(2, f(1, "line one\nthe Nightjar\nline three"))) + end_stream()
    sent, row = answered(CURSOR, UNIFIED, body, FLAGS)
    assert [v["location"] for v in row["verdicts"]] == ["output.choices[0].text"]


# -- one message's reading has a field budget ----------------------------------------------------


TINY = m(1, f(1, "ab"))  # a context item of one two-letter string


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (STREAM_CHAT, cursor_request(m(20, *[TINY] * 99_000), f(21, "Nightjar"))),
        (
            UNIFIED,
            env(
                b"".join(m(1, m(1, f(1, "hi"), f(2, 1)), m(20, *[TINY] * 99_000)) for _ in range(3)) + f(9, "Nightjar")
            ),
        ),
    ],
    ids=["stream-chat", "unified-three-requests"],
)
def test_a_request_of_many_tiny_fields_is_read_within_its_budget_and_checked_whole(path, body):
    """Each limit bounded one parse, and a message's reading parsed its fields many times
    over: 1.8 MB of three requests of 99,000 tiny strings took 1.3 s of the event loop.
    The reading now stops at its budget and says so (no failure policy: nothing is
    unread), and the filters find the word after it in the message's bytes."""
    doc, finding = CURSOR.parse_request(body, RequestView("POST", path, "", CONNECT_PROTO))
    assert finding is not None and finding.code == "protobuf_budget"
    assert verdicts(CURSOR, doc, [finding]) == {"word"}


def test_an_answer_of_many_tiny_fields_is_read_within_its_budget_and_checked_whole():
    message = m(40, *[m(1, f(1, "ab"))] * 99_000) + f(7, "the Nightjar plan")  # (40: a field nobody maps, walked)
    sent, row = answered(CURSOR, STREAM_CHAT, env(m(2, f(1, "Ask about it. "))) + env(message) + env(f(1, "More.")))
    assert row["status"] == "blocked" and b"Nightjar" not in sent
    assert "protobuf_budget" in [x["code"] for x in row["findings"]]


def test_a_hub_message_of_very_many_strings_is_read_to_its_bound_and_the_policy_decides():
    """Every string of a hub message reaches the filters; a message of more than
    100,000 (no client sends so many) cost the event loop seconds at the 8 MiB a message
    may have. Past the bound the message is not read whole: strings_unread, the failure
    policy decides. A key among many strings is still fingerprinted in the record."""
    from addon.dialects.hub import MESSAGE_STRINGS

    hello = b'{"protocol":"json","version":1}\x1e'
    conn = Connection(ws_view("/hub"), hello)
    many = {"type": 1, "invocationId": "1", "target": "Ask", "arguments": ["ab"] * MESSAGE_STRINGS + ["Nightjar"]}
    (doc,) = conn.send(json.dumps(many).encode() + b"\x1e")
    assert "Nightjar" not in doc.unkept
    assert [f["code"] for f in conn.record.to_row()["findings"]] == ["strings_unread"]
    conn = Connection(ws_view("/hub"), hello)
    keyed = {"type": 1, "invocationId": "1", "target": "Ask", "arguments": ["ab"] * 5000 + [f"use {KEY}"]}
    (doc,) = conn.send(json.dumps(keyed).encode() + b"\x1e")
    assert KEY not in json.dumps(doc) and verdicts(SIGNALR, doc) == {"creds"}
    assert conn.record.to_row()["findings"] == []


@pytest.mark.parametrize("filler", [{}, [], 0, None], ids=["objects", "arrays", "numbers", "nulls"])
def test_a_hub_message_of_very_many_values_is_read_to_its_bound_and_the_policy_decides(filler):
    """A message of a million empty objects (4 MB) holds no string, but every value was
    walked, several times over (the credentials' copy, then the strings): 1.03 s of the
    event loop. The walk stops at MESSAGE_VALUES: strings_unread, the failure policy
    decides; the word after the bound is not read whole, so the record does not keep it."""
    from addon.dialects.rpc import MESSAGE_VALUES

    hello = b'{"protocol":"json","version":1}\x1e'
    conn = Connection(ws_view("/hub"), hello)
    many = {"type": 1, "invocationId": "1", "target": "Ask", "arguments": [filler] * MESSAGE_VALUES + ["Nightjar"]}
    (doc,) = conn.send(json.dumps(many).encode() + b"\x1e")
    assert "Nightjar" not in doc.unkept
    [finding] = conn.record.to_row()["findings"]
    assert finding["code"] == "strings_unread" and f"values past the first {MESSAGE_VALUES}" in finding["detail"]


def test_json_strings_stops_at_its_values_bound_and_reads_keyed_values_as_told():
    from addon.dialects import json_strings

    cut: list[str] = []
    assert json_strings([{}, "a", [1, "b"], "c"], max_values=5, cut=cut) == ["a"]
    assert cut == ["values past the first 5"]
    cut = []
    assert json_strings([{}, "a", [1, "b"], "c"], max_values=7, cut=cut) == ["a", "b", "c"] and cut == []
    shown = json_strings({"apiKey": "k1", "x": ["apiKey"], "y": {"token": "t"}}, value_of=lambda k, v: f"{k}={v}")
    assert shown == ["apiKey=k1", "apiKey", "token=t"]


@pytest.mark.parametrize(
    "found",
    [
        ["plain", "text"],
        [KEY, "after"],
        ["before", KEY],
        ["a", f"x {KEY} y", "b"],
        [KEY[:8], KEY[8:]],  # a key in two strings is in neither
        ["aws_secret_access_key", "= " + "A" * 40],  # nor a key whose name and value are apart
        [f"eyJ{'a' * 20}.eyJ{'b' * 20}", "", "sk-" + "A" * 20 + "T3BlbkFJ" + "B" * 20],
    ],
)
def test_strings_kept_are_those_each_strings_own_check_keeps(found):
    """One search of the strings joined decides that none holds a key (it costs one
    search, not one a string); when it finds one, each string is checked as before."""
    from addon.dialects.rpc import clean, kept_strings

    kept = [clean(s) for s in found]
    expected = ("\n".join(kept), "\n".join(found) if kept != found else None)
    assert kept_strings(found) == expected
