"""The generic Connect/gRPC dialect (``grpc``): what it claims, the trace it records, the
statuses of each protocol, endings and blocked answers; the Connect spec's examples."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import orjson
import pytest
from pipeline import audit_bytes
from protoenc import end_stream, env, f, genv, m

from addon.dialects import RequestView
from addon.dialects.connect_rpc import DIALECT
from addon.dialects.registry import detect_request
from addon.dialects.rpc import MESSAGE_VALUES, READ_STRINGS
from addon.framing import Message, select
from addon.framing.envelope import grpc_web_reader, parse_header_block, pct_decode, pct_encode
from addon.record import ExchangeRecord

SHARED_CONNECT = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "protocol-samples" / "connect"
PATH = "/acme.ai.v1.ChatService/Generate"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ1c2VyIn0.c2lnbmF0dXJl"


def view(content_type: str, path: str = PATH, **headers: str) -> RequestView:
    return RequestView("POST", path, "", {"content-type": content_type, **headers})


def audit(
    body: bytes, content_type: str, chunks: list[int] | None = None, *, status: int = 200, **headers: str
) -> dict:
    req = view(content_type, **headers)
    return audit_bytes(
        DIALECT,
        body,
        chunks,
        request=None,
        request_view=req,
        content_type=content_type,
        headers=req.headers,
        status=status,
    )


def every_split(body: bytes, content_type: str, **headers: str) -> dict:
    whole = audit(body, content_type, **headers)
    for cut in range(1, len(body)):
        assert audit(body, content_type, [cut], **headers) == whole, cut
    return whole


# -- what it claims -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_view",
    [
        view("application/connect+proto"),
        view("application/connect+json"),
        view("application/grpc"),
        view("application/grpc+proto", "/routing/prefix/acme.ai.v1.ChatService/Generate"),
        view("application/grpc-web+proto"),
        view("application/proto", **{"connect-protocol-version": "1"}),
        view("application/json", **{"connect-protocol-version": "1"}),
    ],
)
def test_connect_and_grpc_requests_are_claimed(request_view):
    assert detect_request(request_view, lambda: None) is DIALECT


@pytest.mark.parametrize(
    "request_view",
    [
        view("application/json"),  # an ordinary JSON API: no connect-protocol-version
        view("application/proto"),
        view("application/connect+proto", "/v1/chat/completions"),  # no /pkg.Service/Method path
        view("application/grpc", "/Service/Method"),  # no package
        view("application/json", "/api/v1.2/items", **{"connect-protocol-version": "1"}),
    ],
)
def test_ordinary_apis_are_not_claimed(request_view):
    assert not DIALECT.matches(request_view)


def test_an_openai_request_stays_openai():
    req = RequestView("POST", "/v1/chat/completions", "", {"content-type": "application/json"})
    claimed = detect_request(req, lambda: {"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert claimed is not None and claimed.name == "openai-chat"


# -- the trace --------------------------------------------------------------------------------


def test_the_request_trace_has_method_protocol_counts_sizes_and_strings():
    body = genv(m(1, f(1, "Summarise this"), f(2, 3)) + f(3, JWT)) + env(f(1, "second"))
    doc, finding = DIALECT.parse_request(
        body, view("application/connect+proto", **{"connect-content-encoding": "gzip"})
    )
    assert finding is None
    assert doc["rpc"] == "acme.ai.v1.ChatService/Generate" and doc["protocol"] == "connect"
    assert doc["request_messages"] == 2 and doc["request_bytes"] > 0
    assert doc["messages"][0]["content"].startswith("Summarise this\n[redacted sha256:")
    assert doc["messages"][1] == {"role": "user", "content": "second"}
    assert JWT not in orjson.dumps(doc).decode()


def test_response_strings_are_the_text_and_the_end_stream_the_status():
    body = env(m(1, f(1, "Hello"), f(2, 5))) + env(f(1, " world")) + end_stream()
    row = every_split(body, "application/connect+proto")
    assert row["output_text"] == "Hello world" and row["status"] == "completed" and row["event_count"] == 3


def test_a_connect_error_and_json_codec():
    body = env(json.dumps({"text": "partial"})) + end_stream(
        '{"error":{"code":"resource_exhausted","message":"quota"}}'
    )
    row = every_split(body, "application/connect+json")
    assert row["output_text"] == "partial" and (row["error_code"], row["error_message"]) == (
        "resource_exhausted",
        "quota",
    )
    assert row["status"] == "failed"


def codes(row: dict) -> list[str]:
    return [x["code"] for x in row["findings"]]


def test_json_messages_only_lenient_readers_take_are_read_with_a_finding():
    """A message the client's JSON reader takes (NaN for Python's json.loads, a lone
    surrogate escape for JSON.parse) is read, its strings checked, and the record says so;
    the EndStreamResponse the same."""
    body = env('{"text": "partial", "score": NaN}') + end_stream(
        '{"error": {"code": "internal", "message": "x"}, "n": 1e400}'
    )
    row = every_split(body, "application/connect+json")
    assert row["output_text"] == "partial" and row["error_code"] == "internal"
    assert codes(row).count("lenient_json") == 2
    strict = audit(env('{"text": "partial"}') + end_stream(), "application/connect+json")
    assert "lenient_json" not in codes(strict)


def test_a_unary_json_answer_only_lenient_readers_take_is_read_with_a_finding():
    row = audit(b'{"text": "\\ud800 answer", "n": NaN}', "application/json", **{"connect-protocol-version": "1"})
    assert "answer" in row["output_text"] and "lenient_json" in codes(row)


def test_a_json_request_message_only_lenient_readers_take_is_read_with_a_finding():
    request = view("application/connect+json")
    doc, finding = DIALECT.parse_request(env('{"prompt": "Summarise this", "t": NaN}'), request)
    assert doc["messages"] == [{"role": "user", "content": "Summarise this"}]
    assert finding is not None and finding.code == "request_lenient_json"
    doc, findings = DIALECT.parse_request_message(b'{"prompt": "again", "t": Infinity}', request)
    assert doc["messages"][0]["content"] == "again" and [f.code for f in findings] == ["request_lenient_json"]
    assert DIALECT.parse_request(env('{"prompt": "strict"}'), request)[1] is None


@pytest.mark.parametrize(
    "end, status, code",
    [("{not json", "completed", "end_stream_invalid"), ('{"error":{}}', "failed", "end_stream_invalid")],
)
def test_an_invalid_end_stream_is_a_finding(end, status, code):
    row = audit(env(f(1, "x")) + end_stream(end), "application/connect+proto")
    assert row["status"] == status and code in [x["code"] for x in row["findings"]]


def grpc_run(body: bytes, trailers: str) -> dict:
    """A gRPC response: the body, then the HTTP/2 trailers as the adapter hands them over."""
    req = view("application/grpc")
    summary = DIALECT.summarize(None, req)
    normalizer = DIALECT.normalizer(summary)
    record = ExchangeRecord(dialect="grpc")
    reader = select("application/grpc", 200, normalizer.framing).reader(1 << 20, 1 << 20, {})
    for frame in [*reader.feed(body), Message(trailers, "trailers")]:
        for event in normalizer.on_event(frame):
            record.apply(event)
    for event in normalizer.on_end():
        record.apply(event)
    record.finish("complete")
    return record.to_row()


def test_grpc_status_comes_from_the_trailers_frame():
    ok = grpc_run(env(f(1, "fine")), "grpc-status: 0\r\ngrpc-message: \r\n")
    assert ok["status"] == "completed" and ok["output_text"] == "fine"
    failed = grpc_run(env(f(1, "x")), f"grpc-status: 8\r\ngrpc-message: {pct_encode('quota exceeded ✗')}\r\n")
    assert failed["status"] == "failed" and failed["error_code"] == "resource_exhausted"
    assert failed["error_message"] == "quota exceeded ✗"
    missing = grpc_run(env(f(1, "x")), "content-type: x\r\n")
    assert "end_stream_invalid" in [x["code"] for x in missing["findings"]]


def test_grpc_web_trailers_in_the_body():
    body = env(f(1, "web")) + env(b"grpc-status:14\r\ngrpc-message:down\r\n", 0x80)
    row = every_split(body, "application/grpc-web+proto")
    assert (row["error_code"], row["error_message"], row["output_text"]) == ("unavailable", "down", "web")


def test_unary_connect_bodies_and_errors():
    ok = audit(f(1, "unary answer"), "application/proto", **{"connect-protocol-version": "1"})
    assert ok["output_text"] == "unary answer" and ok["status"] == "completed"
    error = audit(
        b'{"code":"permission_denied","message":"no"}',
        "application/json",
        status=403,
        **{"connect-protocol-version": "1"},
    )
    assert (error["error_code"], error["error_message"], error["status"]) == ("permission_denied", "no", "failed")


# -- endings and blocked answers ---------------------------------------------------------------


def test_blocked_answers_in_each_protocol():
    grpc = view("application/grpc+proto")
    answer = DIALECT.blocked_response(DIALECT.summarize(None, grpc), grpc, "r1", "why", True)
    headers = dict(answer.headers)
    assert answer.status == 200 and answer.body == b"" and headers["grpc-status"] == "7"  # trailers-only
    assert "r1" in pct_decode(headers["grpc-message"]) and headers["content-type"] == "application/grpc+proto"
    web = view("application/grpc-web+proto")
    answer = DIALECT.blocked_response(DIALECT.summarize(None, web), web, "r1", "why", True)
    [frame] = grpc_web_reader(1 << 20, 1 << 20, {}).feed(answer.body)
    assert parse_header_block(frame.data)["grpc-status"] == "7"
    unary = view("application/json", **{"connect-protocol-version": "1"})
    answer = DIALECT.blocked_response(DIALECT.summarize(None, unary), unary, "r1", "why", False)
    assert answer.status == 403 and json.loads(answer.body)["code"] == "permission_denied"
    assert ("content-type", "application/json") in answer.headers


def test_a_grpc_stream_cut_by_a_filter_ends_in_trailers():
    normalizer = DIALECT.normalizer(DIALECT.summarize(None, view("application/grpc")))
    assert normalizer.termination("r1", "why") == b""
    assert normalizer.termination_trailers("r1", "why")[0] == ("grpc-status", "7")
    normalizer.on_event(Message("grpc-status: 0\r\n", "trailers"))
    assert normalizer.termination_trailers("r1", "why") == []  # the status was already sent


# -- the Connect spec's examples (shared) -------------------------------------------------------


@pytest.mark.skipif(not SHARED_CONNECT.exists(), reason="../shared/reference/protocol-samples not present")
def test_the_connect_spec_examples():
    doc = json.loads((SHARED_CONNECT / "connectrpc-protocol-spec-streaming-examples.json").read_text())
    example = doc["client_streaming_success"]
    request = b"".join(bytes.fromhex(h) for h in example["request_envelopes_hex"])
    parsed, _ = DIALECT.parse_request(request, view(example["request_content_type"]))
    assert [x["content"] for x in parsed["messages"]] == ["Buf", "Connect"] and parsed["request_messages"] == 2
    response = b"".join(bytes.fromhex(h) for h in example["response_envelopes_hex"])
    row = every_split(response, "application/connect+json")
    assert row["output_text"] == "Hello, Buf and Connect!" and row["status"] == "completed"
    failure = doc["server_streaming_failure"]
    body = bytes.fromhex(failure["response_envelopes_hex"][0])
    row = every_split(body, failure["content_type"])
    assert (row["error_code"], row["error_message"], row["status"]) == ("unavailable", "overloaded", "failed")


def test_grpc_web_text_streams_and_blocked_answers():
    body = base64.b64encode(env(f(1, "text form"))) + base64.b64encode(
        env(b"grpc-status:5\r\ngrpc-message:gone\r\n", 0x80)
    )
    row = every_split(body, "application/grpc-web-text")
    assert (row["output_text"], row["error_code"], row["error_message"]) == ("text form", "not_found", "gone")
    text = view("application/grpc-web-text")
    answer = DIALECT.blocked_response(DIALECT.summarize(None, text), text, "r1", "why", True)
    assert ("content-type", "application/grpc-web-text+proto") in answer.headers
    [frame] = grpc_web_reader(1 << 20, 1 << 20, {}).feed(base64.b64decode(answer.body))
    assert parse_header_block(frame.data)["grpc-status"] == "7"
    request, _ = DIALECT.parse_request(base64.b64encode(env(f(1, "asked"))), text)
    assert request["protocol"] == "grpc_web_text" and request["messages"] == [{"role": "user", "content": "asked"}]


def test_json_keys_named_like_credentials_are_fingerprinted():
    body = env(json.dumps({"apiKey": "plain-looking-key-123", "prompt": "hi"}))
    doc, _ = DIALECT.parse_request(body, view("application/connect+json"))
    assert "plain-looking-key-123" not in orjson.dumps(doc).decode() and "hi" in doc["messages"][0]["content"]


def test_the_strings_of_a_method_that_carries_credentials_are_not_kept():
    login = view("application/grpc", "/acme.auth.v1.Auth/Login")
    doc, _ = DIALECT.parse_request_message(m(1, f(1, "alice"), f(2, "hunter2-password")), login)
    assert "hunter2" not in orjson.dumps(doc).decode()
    normalizer = DIALECT.normalizer(DIALECT.summarize(None, login))
    assert normalizer.on_message(f(1, "a-session-token-value")) == []
    doc, _ = DIALECT.parse_request_message(f(1, "hello there"), view("application/grpc"))
    assert doc["messages"] == [{"role": "user", "content": "hello there"}]


def test_strings_no_field_maps_are_checked_by_the_request_filters():
    from addon.dialects import RequestSummary
    from addon.filters.engine import FilterSet
    from addon.filters.rules import parse_rules
    from addon.mitm.content_filters import check_request

    rules = '[[rule]]\nid = "x"\nkind = "keywords"\nkeywords = ["FORBIDDEN"]\nscope = "request"\naction = "block"\n'
    record = ExchangeRecord(request_body={"messages": [], "unmapped_strings": ["context: FORBIDDEN"]})
    verdict = check_request(FilterSet(parse_rules(rules), failure="closed"), record, DIALECT, RequestSummary())
    assert verdict is not None and verdict.rule_id == "x"


def deep(value: object, depth: int) -> object:
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("message", "bound"),
    [
        (env(json.dumps({"a": deep("Nightjar", 40)})), "deeper than 32 levels"),
        (env(json.dumps({"a": [f"s{i}" for i in range(READ_STRINGS)] + ["Nightjar"]})), f"first {READ_STRINGS}"),
        (env(b"".join(f(1, f"s{i}") for i in range(READ_STRINGS)) + f(1, "Nightjar")), f"first {READ_STRINGS}"),
        (env(json.dumps({"a": [{}] * MESSAGE_VALUES + ["Nightjar"]})), f"values past the first {MESSAGE_VALUES}"),
    ],
)
@pytest.mark.parametrize("fail_open", [False, True])
def test_strings_past_the_readers_bounds_are_unread_and_the_policy_decides(message, bound, fail_open):
    """A streamed request message whose strings lie past what the reader of an unmapped
    service reads (nested deeper than 32 levels, past READ_STRINGS strings, bounds far above an
    ordinary message: JSON and protobuf; no string is cut, READ_CHARS being the message's bound) is not read whole: ``strings_unread``, which the request tap
    treats as unread, so ``closed`` blocks it and ``open`` lets it go with the finding,
    where the filters used to pass it unsaid; the response side says so too."""
    from addon.filters.api import Verdict
    from addon.framing.envelope import connect_reader
    from addon.turns import RequestTap, Turns

    codec = "proto" if message[5:6] != b"{" else "json"
    request = view(f"application/connect+{codec}")
    written: list[dict] = []
    turns = Turns(ExchangeRecord(dialect=DIALECT.name), "c", lambda r: written.append(r.to_row()))
    blocks: list[Verdict] = []

    def check(record: ExchangeRecord, doc: dict) -> Verdict | None:
        text = "\n".join(m["content"] for m in doc.get("messages", []))
        return Verdict("block", "k", "code name", location="request") if "Nightjar" in text else None

    tap = RequestTap(connect_reader(8 << 20, 8 << 20, {}), DIALECT, request, turns, 8 << 20, check, blocks.append)
    tap.fail_open = fail_open
    fine = env(json.dumps({"a": deep("hello", 30)})) if codec == "json" else env(f(1, "hello"))
    assert tap(fine) == fine
    out = tap(message)
    if fail_open:
        assert out == message and blocks == []
    else:
        assert out == [] and [v.rule_id for v in blocks] == ["filter_error"]
    (finding,) = [x for x in turns.record.findings if x["code"] == "strings_unread"]
    assert bound in finding["detail"] and finding["detail"].startswith("a request message")
    normalizer = DIALECT.normalizer(DIALECT.summarize(None, request))
    events = normalizer.on_message(message[5:])
    assert [type(e).__name__ for e in events][:1] == ["Finding"] and events[0].code == "strings_unread"
    assert bound in events[0].detail
    assert not any(type(e).__name__ == "Finding" for e in normalizer.on_message(fine[5:]))


def test_a_long_prompt_or_answer_of_an_unmapped_service_is_read_whole():
    """An ordinary long string (a prompt, an answer) is far inside the reader's bounds:
    read whole, no strings_unread (which under `closed` would refuse it)."""
    from addon.dialects.rpc import message_strings

    long = "word " * 20_000 + "Nightjar"
    for payload, codec in ((json.dumps({"prompt": long}).encode(), "json"), (f(1, long), "proto")):
        cut: list[str] = []
        found, _ = message_strings(payload, codec, cut)
        assert found == [long] and cut == []


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (env(json.dumps({"a": deep("Nightjar", 40)})), "strings_unread"),
        (env(b"".join(f(1, f"s{i}") for i in range(READ_STRINGS)) + f(1, "Nightjar")), "strings_unread"),
    ],
)
@pytest.mark.parametrize("failure", ["closed", "open"])
def test_a_whole_request_body_read_in_part_is_the_failure_policy_s(body, code, failure):
    """A unary request (the whole body read at once, not streamed message by message) whose
    reading left strings out was recorded with the finding, and the request filters
    passed it as read: now the policy decides, as for a streamed message."""
    from addon.dialects import RequestSummary
    from addon.filters.engine import FilterSet
    from addon.filters.rules import parse_rules
    from addon.mitm.content_filters import check_request

    codec = "proto" if body[5:6] != b"{" else "json"
    doc, finding = DIALECT.parse_request(body, view(f"application/connect+{codec}"))
    assert finding is not None and finding.code == code
    record = ExchangeRecord(request_body=doc)
    record.apply(finding)
    rules = '[[rule]]\nid = "x"\nkind = "keywords"\nkeywords = ["Nightjar"]\nscope = "request"\naction = "block"\n'
    verdict = check_request(FilterSet(parse_rules(rules), failure=failure), record, DIALECT, RequestSummary())
    # (a protobuf message's bytes are read as text too: the word past the bound is found all the same)
    found = [] if codec == "json" else ["x"]
    assert (verdict is not None) == (failure == "closed" or bool(found))
    assert [v["rule_id"] for v in record.verdicts] == ["filter_error", *found]
