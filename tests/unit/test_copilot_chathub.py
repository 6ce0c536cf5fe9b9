"""Copilot's ChatHub (Sydney and M365): prompts, cumulative snapshots, results, blocks."""

from __future__ import annotations

import json
import random
from pathlib import Path

from hub_driver import Connection, view

from addon.auditor import StreamAuditor, summary_into_record
from addon.dialects.copilot_chathub import DIALECT, ChatHubNormalizer
from addon.dialects.registry import detect_websocket
from addon.dialects.signalr import DIALECT as GENERIC
from addon.events import Finish, ResponseMeta, ShownText, StreamError, TextDelta, TextSnapshot, TurnEnd
from addon.filters.engine import FilterSet
from addon.filters.rules import parse_rules
from addon.framing import FRAMINGS
from addon.output_gate import OutputGate
from addon.record import ExchangeRecord

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "protocol-samples" / "copilot"
HELLO = b'{"protocol":"json","version":1}\x1e'
SYDNEY = "/sydney/ChatHub"
M365 = "/m365Copilot/Chathub/oid@tid"
M365_QUERY = "ClientRequestId=req-1&X-SessionId=sess-1&ConversationId=conv-1&access_token=eyJhbGciOi.secret.sig"


def rec(*messages: dict) -> bytes:
    return b"".join(json.dumps(m, ensure_ascii=False).encode() + b"\x1e" for m in messages)


def chat(text: str, invocation: str = "0", **extra: object) -> dict:
    arg = {
        "source": "cib",
        "optionsSets": ["h3precise", "galileo"],
        "tone": "Precise",
        "conversationId": "51D|BingProd|abc",
        "message": {"author": "user", "text": text, "messageType": "Chat"},
        **extra,
    }
    return {"type": 4, "invocationId": invocation, "target": "chat", "arguments": [arg]}


def bot(text: str, **extra: object) -> dict:
    return {"text": text, "author": "bot", "messageId": "m-1", "contentOrigin": "DeepLeo", **extra}


def update(*messages: dict, **extra: object) -> dict:
    return {"type": 1, "target": "update", "arguments": [{"messages": list(messages), **extra}]}


def final(invocation: str = "0", value: str = "Success", message: str | None = None, messages: list | None = None):
    item = {"messages": messages or [], "result": {"value": value, "message": message}}
    return [{"type": 2, "invocationId": invocation, "item": item}, {"type": 3, "invocationId": invocation}]


SYDNEY_TURN = [
    {},
    {"type": 1, "target": "update", "arguments": [{"throttling": {"maxNumUserMessagesInConversation": 5,
                                                                   "numUserMessagesInConversation": 1}}]},
    update(bot("The")),
    update(bot("The capital")),
    update({"text": "capital of France", "author": "bot", "messageType": "InternalSearchQuery", "messageId": "s"}),
    update(bot("The capital is Paris.")),
    *final(messages=[{"author": "user", "text": "q"},
                     bot("The capital is Paris.", suggestedResponses=[{"text": "Tell me more"}])]),
]  # fmt: skip


def test_detection_by_path_after_the_handshake() -> None:
    assert DIALECT.websocket(view(SYDNEY), None) is None
    assert detect_websocket(view(SYDNEY), HELLO) == (DIALECT, "signalr_json")
    assert detect_websocket(view(M365), HELLO) == (DIALECT, "signalr_json")
    assert detect_websocket(view("/m365copilot/chathub/x"), HELLO)[0] is DIALECT  # type: ignore[index]
    assert detect_websocket(view("/hubs/other"), HELLO) == (GENERIC, "signalr_json")
    consumer = detect_websocket(view("/c/api/chat"), b'{"event":"setOptions"}')  # consumer Copilot: not SignalR
    assert consumer is None or consumer[0] not in (DIALECT, GENERIC)
    assert DIALECT.websocket(view(SYDNEY), b'{"event":"setOptions"}') is None
    assert DIALECT.provider == "microsoft"


def test_a_sydney_turn() -> None:
    conn = Connection(view(SYDNEY), HELLO)
    conn.send(rec({"type": 6}))
    (doc,) = conn.send(rec(chat("What is the capital of France?")))
    assert doc == {
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "hub_target": "chat",
        "tone": "Precise",
        "optionsSets": ["h3precise", "galileo"],
        "conversationId": "51D|BingProd|abc",
    }
    events = conn.receive(rec(*SYDNEY_TURN))
    assert [e for e in events if isinstance(e, TextDelta)] == [
        TextDelta("The"),
        TextDelta(" capital"),
        TextDelta(" is Paris."),
    ]
    assert ShownText("capital of France", kind="side_message") in events
    assert ShownText("Tell me more", kind="suggestion") in events
    assert ResponseMeta(response_id="m-1") in events
    assert events[-2:] == [Finish("stop"), TurnEnd()]
    (row,) = conn.close()
    assert row["output_text"] == "The capital is Paris."
    assert row["status"] == "completed" and row["findings"] == [] and row["request_model"] is None
    assert row["dialect"] == "copilot-chathub"


def test_any_split_gives_the_same_row() -> None:
    server = rec(*SYDNEY_TURN)

    def rows(cuts: list[int]) -> list[dict]:
        conn = Connection(view(SYDNEY), HELLO)
        conn.send(rec(chat("q")))
        bounds = [0, *cuts, len(server)]
        for a, b in zip(bounds, bounds[1:]):
            conn.receive(server[a:b])
        return conn.close()

    whole = rows([])
    for cut in range(1, len(server), 3):
        assert rows([cut]) == whole, cut
    rng = random.Random(3)
    for _ in range(50):
        assert rows(sorted(rng.sample(range(1, len(server)), 5))) == whole


def test_a_retracted_answer_ends_with_the_last_snapshot() -> None:
    conn = Connection(view(SYDNEY), HELLO)
    conn.send(rec(chat("q")))
    events = conn.receive(
        rec(
            {},
            update(bot("Sure, here is")),
            update(bot("Sure, here is how to")),
            update(bot("Sorry, I can't help with that.", contentOrigin="Apology", messageId="m-2")),
            *final(),
        )
    )
    assert TextSnapshot("Sorry, I can't help with that.") in events
    (row,) = conn.close()
    assert row["output_text"] == "Sorry, I can't help with that."


def test_a_snapshot_replaces_the_recorded_text_and_its_size() -> None:
    record = ExchangeRecord(dialect="copilot-chathub", streamed=True, content_limit=12)
    for event in (TextDelta("Sure, "), TextDelta("here is"), TextSnapshot("Sorry."), TextDelta(" No.")):
        record.apply(event)
    assert record.output_text == "Sorry. No." and record.content_bytes == record.content_kept == 10
    assert not record.content_truncated
    record.apply(TextSnapshot("x" * 20))
    assert record.output_text == "x" * 12 and record.content_truncated and record.content_bytes == 20


def test_m365_cursor_deltas_are_not_added_to_the_snapshots() -> None:
    conn = Connection(view(M365, M365_QUERY), HELLO)
    assert conn.send(rec({"type": 1, "target": "Metrics", "arguments": [{"Timestamps": {"A": "1"}}]})) == []
    conn.send(rec(chat("你好")))
    cursor = {"j": "$['m-1'].adaptiveCards[0].body[0].text", "p": -1}
    conn.receive(
        rec(
            {},
            {"type": 6},
            update({"text": "正在处理…", "author": "bot", "contentOrigin": "EarlyProgress", "messageId": "p"}),
            update(bot("你好"), cursor=cursor),
            {"type": 1, "target": "update", "arguments": [{"writeAtCursor": "，世界"}]},
            update(bot("你好，世界")),
            {"type": 1, "target": "update", "arguments": [{"writeAtCursor": "！"}]},
            update(bot("你好，世界"), isLastUpdate=True),
            *final(message="你好，世界"),
        )
    )
    (row,) = conn.close()
    assert row["output_text"] == "你好，世界"
    assert row["session_id"] == "conv-1" and row["request_id"] == "req-1"
    assert "secret" not in json.dumps(row)


def test_cursor_deltas_are_the_answer_when_no_snapshot_comes() -> None:
    conn = Connection(view(M365), HELLO)
    conn.send(rec(chat("hi")))
    events = conn.receive(
        rec(
            {},
            {"type": 1, "target": "update", "arguments": [{"writeAtCursor": "Hel"}]},
            {"type": 1, "target": "update", "arguments": [{"writeAtCursor": "lo"}]},
            *final(message="Hello!"),
        )
    )
    assert ShownText("Hello!", kind="final_text") in events
    (row,) = conn.close()
    assert row["output_text"] == "Hello"


def test_a_final_text_alone_is_the_answer() -> None:
    conn = Connection(view(M365), HELLO)
    conn.send(rec(chat("hi")))
    conn.receive(rec({}, *final(message="Just this.")))
    (row,) = conn.close()
    assert row["output_text"] == "Just this." and row["status"] == "completed"


def test_a_failed_result_is_the_error_and_throttling_a_finding() -> None:
    conn = Connection(view(SYDNEY), HELLO)
    conn.send(rec(chat("q")))
    throttle = {"maxNumUserMessagesInConversation": 5, "numUserMessagesInConversation": 5}
    events = conn.receive(
        rec({}, {"type": 1, "target": "update", "arguments": [{"throttling": throttle}]}, *final(value="Throttled",
                                                                                              message="Too many"))
    )  # fmt: skip
    assert StreamError("Throttled", "Too many") in events and events[-2:] == [Finish("error"), TurnEnd()]
    (row,) = conn.close()
    assert row["status"] == "failed" and row["error_code"] == "Throttled"
    assert [f["code"] for f in row["findings"]] == ["copilot_throttled"]


def test_previous_messages_are_part_of_the_request() -> None:
    conn = Connection(view(SYDNEY), HELLO)
    earlier = [{"author": "user", "text": "hello"}, {"author": "bot", "text": "hi!"}]
    (doc,) = conn.send(rec(chat("and now?", previousMessages=earlier)))
    assert doc["messages"] == [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi!"},
        {"role": "user", "content": "and now?"},
    ]


def test_a_chat_without_its_text_is_read_by_its_strings() -> None:
    conn = Connection(view(SYDNEY), HELLO)
    (doc,) = conn.send(rec({"type": 4, "invocationId": "0", "target": "chat", "arguments": [{"prompt": "moved"}]}))
    assert doc["messages"][0]["content"] == "moved"


def test_blocks_end_the_turn_as_copilot_clients_read_a_failure() -> None:
    conn = Connection(view(SYDNEY), HELLO)
    conn.send(rec(chat("q", "3")))
    conn.receive(rec({}, update(bot("partial"))))
    normalizer = conn.normalizer
    frames = normalizer.ending("r1", "no way")
    (data,) = normalizer.writer.encode_messages(frames)
    assert data == (
        b'{"type":2,"invocationId":"3","item":{"result":{"value":"Filtered",'
        b'"message":"Blocked by content filter rule \'r1\': no way"}}}\x1e{"type":3,"invocationId":"3"}\x1e'
    )
    assert [f.message for f in normalizer.upstream_cancel()] == [{"type": 5, "invocationId": "3"}]
    assert normalizer.refusal(conn.client_frames[-1], "r1", "no way") == frames
    events = conn.receive(data)
    assert StreamError("Filtered", "Blocked by content filter rule 'r1': no way") in events
    (row,) = conn.close()
    assert row["output_text"] == "partial" and row["status"] == "failed"
    assert normalizer.ending("r1", "x") == []  # no turn open any more


BLOCK = """
[[rule]]
id = "no-code-name"
kind = "keywords"
keywords = ["Nightjar"]
scope = "response"
action = "block"
reason = "internal code name"
"""


def test_the_output_gate_checks_a_rewritten_snapshot_whole() -> None:
    filters = FilterSet(parse_rules(BLOCK), failure="closed")
    record = ExchangeRecord(dialect="copilot-chathub", streamed=True, http_status=101)
    summary = DIALECT.summarize(None, view(SYDNEY))
    summary_into_record(record, summary)
    normalizer, forwarded = ChatHubNormalizer(), ChatHubNormalizer()
    for n in (normalizer, forwarded):
        n.on_client(FRAMINGS["signalr_json"].reader(1 << 20, 0, {}).feed(HELLO)[0])
        n._open("0")
    gate = OutputGate(filters.output_guard(), forwarded, holds=True, split_raw=True, failure="closed")
    auditor = StreamAuditor(record, normalizer, None, 1 << 20, gate=gate, framing=FRAMINGS["signalr_json"], headers={})
    first, more = "Hello there, my good friend", "Hello there, my good friend, how are you doing today?"
    body = rec({}, update(bot(first)), update(bot(more)), update(bot("Our Nightjar plan")), update(bot("Our Nightjar")))
    sent = b"".join(auditor.feed(body[i : i + 40]) for i in range(0, len(body), 40))
    assert b"Nightjar" not in sent and b"Hello" in sent
    assert b'"value":"Filtered"' in gate.termination()
    assert gate.delivered_text.startswith("Hello")


def test_shared_sydney_frames() -> None:
    if not SHARED.exists():
        return
    lines = (SHARED / "hncboy-ai-beehive_sydney-chathub-frames.txt").read_text().splitlines()
    records = [line.replace('}}}{"type":3', '}}}\x1e{"type":3') for line in lines if line.startswith("{")]
    conn = Connection(view(SYDNEY), HELLO)
    conn.send(rec(chat("q", "1")))
    events = conn.receive(b"{}\x1e" + "".join(r + "\x1e" for r in records[:3]).encode())
    assert TextDelta("你") in events
    assert StreamError("InvalidRequest", events[-3].message) == events[-3]  # type: ignore[union-attr]
    conn.send(rec(chat("q", "2")))
    events = conn.receive((records[3] + "\x1e").encode())
    assert isinstance(events[0], StreamError) and events[0].code == "InvalidSession"
    rows = conn.close()
    assert [r["error_code"] for r in rows] == ["InvalidRequest", "InvalidSession"]
    assert rows[0]["output_text"] == "你"


def test_shared_m365_samples() -> None:
    if not SHARED.exists():
        return
    text = (SHARED / "unresolved-repo_m365-chathub-har-report-05-samples.txt").read_text()
    blocks, current = [], []
    for line in text.splitlines():
        if line.startswith("#"):
            if current:
                blocks.append(json.loads("".join(current)))
            current = []
        else:
            current.append(line)
    blocks.append(json.loads("".join(current)))
    records = [b for b in blocks if "type" in b]
    assert [r["type"] for r in records] == [1, 1, 3]  # the update, the Metrics telemetry, the Completion
    conn = Connection(view(M365), HELLO)
    assert conn.send(rec(records[1])) == []  # telemetry: no prompt
    conn.send(rec(chat("hi", "0")))
    events = conn.receive(rec({}, records[0], records[2]))
    assert TextDelta("你好") in events and events[-1] == TurnEnd()
    (row,) = conn.close()
    assert row["output_text"] == "你好" and row["status"] == "completed"


def test_an_output_block_through_the_connection_pipeline() -> None:
    from test_signalr_dialect import pipeline

    a, written = pipeline(DIALECT, "signalr_json", HELLO)
    a.from_client(rec(chat("tell me", "5")), True)
    a.from_server(rec({}), True)
    texts = ["The plan", "The plan is Nightjar", "The plan is Nightjar and a long tail of more text"]
    relays = [a.from_server(rec(update(bot(t))), True) for t in texts]
    (cut,) = [r for r in relays if r.back]
    assert cut.back == [(b'{"type":5,"invocationId":"5"}\x1e', True)]
    sent = b"".join(m for r in relays for m, _ in (r.onward or []))
    assert b"Nightjar" not in sent
    assert sent.endswith(
        b'{"type":2,"invocationId":"5","item":{"result":{"value":"Filtered","message":"Blocked by content filter '
        b'rule \'no-code-name\': internal code name"}}}\x1e{"type":3,"invocationId":"5"}\x1e'
    )
    assert a.from_server(rec(*final("5", message="The plan is Nightjar")), True).onward == []
    assert [r["status"] for r in written][-1] == "blocked"


def test_the_final_cards_markdown_is_checked_once() -> None:
    conn = Connection(view(SYDNEY), HELLO)
    conn.send(rec(chat("q")))
    card = {"type": "AdaptiveCard", "body": [{"type": "TextBlock", "text": "Paris [^1^]"}]}
    events = conn.receive(
        rec({}, update(bot("Paris", adaptiveCards=[card])), *final(messages=[bot("Paris", adaptiveCards=[card])]))
    )
    assert [e for e in events if isinstance(e, ShownText)] == [ShownText("Paris [^1^]", kind="card")]


def test_cursor_deltas_kept_for_comparison_are_bounded(monkeypatch) -> None:
    """The normalizer's copy of a turn's cursor deltas (kept only to compare snapshots and
    the final text with) stops growing at MAX_TEXT: an endless turn is not endless memory."""
    from addon.dialects import copilot_chathub
    from addon.framing.signalr import hub_message

    monkeypatch.setattr(copilot_chathub, "MAX_TEXT", 100)
    n = ChatHubNormalizer()
    n.on_client(hub_message(chat("hi")))
    events = []
    for _ in range(50):
        events += n.on_event(
            hub_message({"type": 1, "target": "update", "arguments": [{"writeAtCursor": "abcdefghij"}]})
        )
    assert sum(len(e.text) for e in events if isinstance(e, TextDelta)) == 500  # every delta still reaches the record
    assert len(n.text) <= 100
