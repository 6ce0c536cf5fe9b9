"""A JSON body is not read when reading it would cost the proxy gigabytes.

Neither orjson nor the standard library bounds what a parse makes: 32 MiB of ``{},``
(an answer under the record cap) made 1.15 GB of Python objects, and a request may be
read up to 256 MiB. A body over 1 MiB is counted first (:func:`addon.json_read.too_costly`):
past 500,000 objects and arrays, or 2,000,000 values, it is not read. A request is then
``request_too_large`` (the request filters' failure policy decides); an answer
``json_too_costly`` (held for blocking filters, the failure policy decides). Ordinary
large bodies (a long prompt, an image in base64) are far inside the bounds.
"""

from __future__ import annotations

import base64
import tracemalloc

import orjson
import pytest
from test_whole_answers import CASES, answer, auditor_for, settled

from addon.dialects import UNREADABLE, load_body_json, parse_json_body
from addon.filters.engine import FilterSet
from addon.filters.rules import parse_rules
from addon.json_read import COUNT_FROM, too_costly

OBJECTS = [{}] * 4_500_000  # (13.5 MB of JSON: estimated at some 560 MiB read, over the 512 MiB)
BLOCK = parse_rules('[[rule]]\nid = "k"\nkind = "keywords"\nkeywords = ["Nightjar"]\naction = "block"\n')


def padded(pad: list, **fields: object) -> bytes:
    return orjson.dumps({**fields, "pad": pad})


@pytest.mark.parametrize(
    ("pad", "bound"),
    [(OBJECTS, "about 4500004 objects and arrays"), ([1000] * 6_000_000, "6000002 values")],
    ids=["objects", "numbers"],
)
def test_a_request_of_too_many_values_is_not_read_and_the_policy_decides(pad, bound) -> None:
    body = padded(pad, model="gpt-4o", messages=[{"role": "user", "content": "Nightjar"}])
    doc, finding = parse_json_body(body)
    assert doc is UNREADABLE and finding is not None and finding.code == "request_too_large"
    assert bound in finding.detail and "sha256" in finding.detail


def test_ordinary_large_bodies_are_read() -> None:
    """A long prompt (3 MB of prose: commas, brackets in the text) and an image in base64
    (8 MB) are read as before."""
    prose = "It was, as they say, a [long] day {again}, and so on. " * 60_000
    image = base64.b64encode(bytes(range(256)) * 24_000).decode()
    for content in (prose, [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}}]):
        body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": content}]})
        assert len(body) > COUNT_FROM and too_costly(body) is None
        doc, finding = parse_json_body(body)
        assert finding is None and doc["messages"][0]["content"] == content


def test_an_answer_with_log_probabilities_is_read() -> None:
    """The top 20 log probabilities of each of 14,000 tokens: 14 MB and 600,000 objects
    and arrays, 254 MiB read, estimated at 367 MiB (an ordinary answer of an evaluation): read."""
    top = {"token": "ab", "logprob": -0.25, "bytes": [97, 98]}
    content = [top | {"top_logprobs": [top] * 20} for _ in range(14_000)]
    body = orjson.dumps({"choices": [{"index": 0, "logprobs": {"content": content}}]})
    assert len(body) > 12 << 20 and too_costly(body) is None


def test_a_small_body_is_never_counted() -> None:
    assert too_costly(b"[" + b"{}," * 300_000 + b"{}]") is None  # (under 1 MiB: what it makes is bounded)


def test_a_costly_answer_is_not_read_and_its_memory_stays_small() -> None:
    body = b"[" + b"{}," * (8 << 20) + b"{}]"  # 24 MiB of empty objects
    tracemalloc.start()
    try:
        doc, finding = load_body_json(body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert doc is None and finding is not None and finding.code == "json_too_costly"
    assert peak < 16 << 20  # (read, it made some 900 MB)


@pytest.mark.parametrize("failure", ["closed", "open"])
def test_a_held_costly_answer_is_the_failure_policy_s(failure) -> None:
    """An answer the proxy cannot afford to read is not checked either: with blocking
    filters it goes to the failure policy (the SDK would read it, and show its text)."""
    case = CASES["anthropic-messages"]
    message = orjson.loads(answer(case, "events=3&text=the+Nightjar+plan"))
    message["pad"] = OBJECTS
    filters = FilterSet(BLOCK, failure=failure)
    outcome = settled(auditor_for(case, filters, cap=32 << 20), orjson.dumps(message), ahead=True)
    row = outcome["row"]
    assert [f["code"] for f in row["findings"]] == ["json_too_costly"]
    assert [v["rule_id"] for v in row["verdicts"]] == ["filter_error"]
    assert outcome["stopped"] == (failure == "closed")


def test_a_costly_answer_passes_with_its_finding_without_filters() -> None:
    case = CASES["anthropic-messages"]
    message = orjson.loads(answer(case, "events=3"))
    message["pad"] = OBJECTS
    outcome = settled(auditor_for(case, None, cap=32 << 20), orjson.dumps(message), ahead=True)
    assert [f["code"] for f in outcome["row"]["findings"]] == ["json_too_costly"]
    assert not outcome["stopped"] and not outcome["row"]["output_text"]
    assert outcome["row"]["status"] == "completed"  # (the body was whole: it was only not read)


@pytest.mark.parametrize("failure", ["closed", "open"])
def test_a_streamed_event_too_costly_to_read_is_the_failure_policy_s(failure) -> None:
    """An event of 13.5 MB of empty objects and the word (a proxy whose events may be
    32 MiB): parsed, some 470 MB of objects for one event. Not read now:
    json_too_costly, and a gate that may block decides by the policy."""
    from test_output_gate import gated

    case = CASES["openai-chat"]
    chunk = {"id": "c", "object": "chat.completion.chunk", "model": "m", "pad": OBJECTS}
    chunk["choices"] = [{"index": 0, "delta": {"content": "the Nightjar plan"}}]
    body = b"data: " + orjson.dumps(chunk) + b"\n\ndata: [DONE]\n\n"
    sent, row, auditor = gated(case, body, [], FilterSet(BLOCK, failure=failure), max_event_bytes=32 << 20)
    assert "json_too_costly" in [f["code"] for f in row["findings"]]
    assert [v["rule_id"] for v in row["verdicts"]] == ["filter_error"]
    received = b"".join(sent)
    if failure == "closed":
        assert auditor.stopped and b"Nightjar" not in received
    else:
        assert received == body


# 7.5 MB (under the 8 MiB a Connect envelope may have) of members: estimated at some 530 MiB.
COSTLY = b'{"pad":{' + b'"":0,' * 1_500_000 + b'"":0},"text":"the Nightjar plan"}'


def test_a_connect_json_message_too_costly_is_not_read_and_says_so() -> None:
    """Connect's JSON codec (Windsurf, Cursor, any unmapped service), request and answer."""
    from addon.dialects.rpc import message_strings, unread_strings

    cut: list[str] = []
    assert message_strings(COSTLY, "json", cut) == ([], False) and "not read" in cut[0]
    cut = []
    assert unread_strings(COSTLY, [], cut) is None and "not read" in cut[0]


def test_a_windsurf_json_request_and_answer_too_costly_are_not_read() -> None:
    from protoenc import env
    from test_windsurf import JSON_STREAM, RAW_CHAT, view

    from addon.dialects.windsurf import DIALECT

    _, finding = DIALECT.parse_request(env(COSTLY), view(RAW_CHAT, JSON_STREAM))
    assert finding is not None and finding.code == "request_too_large"
    normalizer = DIALECT.normalizer(DIALECT.summarize(None, view(RAW_CHAT, JSON_STREAM)))
    assert [e.code for e in normalizer._json_message(COSTLY)] == ["json_too_costly"]


@pytest.mark.parametrize("name", ["gemini", "lmsp", "openai-chat"])
def test_an_error_body_too_costly_is_an_error_not_read(name) -> None:
    case = CASES[name]
    normalizer = case.dialect.normalizer(case.dialect.summarize(case.request, case.view))
    events = normalizer.on_body(COSTLY, 500)
    assert [type(e).__name__ for e in events] == ["StreamError", "Finding"] and events[1].code == "json_too_costly"


def test_an_llm_stream_event_too_costly_is_not_read() -> None:
    from addon.framing import Message

    case = CASES["llm-stream"]
    normalizer = case.dialect.normalizer(case.dialect.summarize(case.request, case.view))
    events = normalizer.on_event(Message(COSTLY.decode(), "content.delta"))
    assert [e.code for e in events] == ["json_too_costly"]
