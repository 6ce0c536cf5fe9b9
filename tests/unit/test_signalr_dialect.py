"""The generic SignalR dialect: a hub nobody mapped, read by what the hub protocol says."""

from __future__ import annotations

import json
import random
from typing import Literal

import msgpack
import pytest
from conn_driver import connection
from hub_driver import Connection, view

from addon.dialects.registry import detect_request, detect_websocket
from addon.dialects.signalr import DIALECT
from addon.events import Finish, ShownText, StreamError, TextDelta, TurnEnd
from addon.framing.signalr import HubMessage, varint

HELLO = b'{"protocol":"json","version":1}\x1e'
MSGPACK_HELLO = b'{"protocol":"messagepack","version":1}\x1e'


def rec(*messages: dict) -> bytes:
    return b"".join(json.dumps(m).encode() + b"\x1e" for m in messages)


def packed(*items: list) -> bytes:
    bodies = [msgpack.packb(i, use_bin_type=True) for i in items]
    return b"".join(varint(len(b)) + b for b in bodies)


PROMPT = {"type": 4, "invocationId": "1", "target": "StreamChat", "arguments": ["Tell me a joke", {"temp": 1}]}
ANSWER = [
    {"type": 2, "invocationId": "1", "item": "Why did "},
    {"type": 6},
    {"type": 2, "invocationId": "1", "item": "the chicken"},
    {"type": 2, "invocationId": "1", "item": " cross?"},
    {"type": 3, "invocationId": "1"},
]


def test_detection_by_the_handshake_on_any_path() -> None:
    assert DIALECT.websocket(view("/hubs/chat"), None) is None
    assert detect_websocket(view("/hubs/chat"), HELLO) == (DIALECT, "signalr_json")
    assert detect_websocket(view("/x"), MSGPACK_HELLO) == (DIALECT, "signalr_msgpack")
    assert detect_websocket(view("/x"), b'{"type":"session.update"}') is None
    assert not DIALECT.matches(view("/hubs/chat"))
    assert detect_request(view("/hubs/chat"), lambda: None) is None


def test_a_streamed_invocation_is_one_turn() -> None:
    conn = Connection(view("/hubs/chat"), HELLO)
    (doc,) = conn.send(rec(PROMPT))
    assert doc == {"messages": [{"role": "user", "content": "Tell me a joke"}], "hub_target": "StreamChat"}
    conn.receive(rec({}))
    events = conn.receive(rec(*ANSWER))
    assert events == [
        TextDelta("Why did "),
        TextDelta("the chicken"),
        TextDelta(" cross?"),
        Finish("stop"),
        TurnEnd(),
    ]
    (row,) = conn.close()
    assert row["output_text"] == "Why did the chicken cross?"
    assert row["status"] == "completed" and row["request_body"] == doc and row["findings"] == []


def test_any_split_of_the_server_messages_gives_the_same_rows() -> None:
    server = rec({}, *ANSWER)

    def rows(cuts: list[int]) -> list[dict]:
        conn = Connection(view("/hubs/chat"), HELLO)
        conn.send(rec(PROMPT))
        bounds = [0, *cuts, len(server)]
        for a, b in zip(bounds, bounds[1:]):
            conn.receive(server[a:b])
        return conn.close()

    whole = rows([])
    for cut in range(1, len(server)):
        assert rows([cut]) == whole, cut
    rng = random.Random(7)
    for _ in range(100):
        assert rows(sorted(rng.sample(range(1, len(server)), 4))) == whole


def test_msgpack_connections_read_the_same() -> None:
    conn = Connection(view("/hubs/chat"), MSGPACK_HELLO)
    assert conn.framing == "signalr_msgpack"
    conn.send(packed([4, {}, "1", "StreamChat", ["Tell me a joke", {"temp": 1}], []]))
    conn.receive(b"{}\x1e")
    conn.receive(packed([2, {}, "1", "Why did "], [6], [2, {}, "1", "the chicken cross?"], [3, {}, "1", 2]))
    (row,) = conn.close()
    assert row["output_text"] == "Why did the chicken cross?" and row["status"] == "completed"
    assert row["request_body"]["messages"][0]["content"] == "Tell me a joke"
    # the block answers in the connection's encoding
    conn.send(packed([4, {}, "2", "StreamChat", ["more"], []]))
    (completion,) = conn.normalizer.ending("r1", "no")
    assert conn.normalizer.writer.encode_messages([completion])[0][1:3] == b"\x95\x03"


def test_a_completion_result_is_the_answer_of_a_plain_invocation() -> None:
    conn = Connection(view("/hub"), HELLO)
    conn.send(rec({"type": 1, "invocationId": "9", "target": "Ask", "arguments": ["2+2?"]}))
    events = conn.receive(rec({}, {"type": 3, "invocationId": "9", "result": "4"}))
    assert events == [TextDelta("4"), Finish("stop"), TurnEnd()]


def test_unmapped_items_are_shown_text_with_one_finding_per_turn() -> None:
    conn = Connection(view("/hub"), HELLO)
    conn.send(rec(PROMPT))
    events = conn.receive(
        rec(
            {},
            {"type": 1, "target": "ReceiveToken", "arguments": [{"delta": "Hello"}]},
            {"type": 2, "invocationId": "1", "item": {"content": "secret plan", "n": 3}},
            {"type": 2, "invocationId": "1", "item": {"content": "more"}},
            {"type": 3, "invocationId": "1"},
        )
    )
    shown = [e.text for e in events if isinstance(e, ShownText)]
    assert shown == ["Hello", "delta", "secret plan", "content\nn", "more", "content"]  # (keys too: a map's are data)
    (row,) = conn.close()
    (finding,) = row["findings"]
    assert finding["code"] == "signalr_unmapped"
    assert "ReceiveToken" in finding["detail"] and "secret plan" in finding["detail"]
    assert row["output_text"] == ""


def test_errors() -> None:
    conn = Connection(view("/hub"), HELLO)
    conn.send(rec(PROMPT))
    events = conn.receive(rec({}, {"type": 2, "invocationId": "1", "item": "par"}, ANSWER[-1] | {"error": "boom"}))
    assert events[-3:] == [StreamError("signalr_completion", "boom"), Finish("error"), TurnEnd()]
    (row,) = conn.close()
    assert row["status"] == "failed" and row["error_message"] == "boom" and row["output_text"] == "par"
    conn.send(rec(PROMPT | {"invocationId": "2"}))
    events = conn.receive(rec({"type": 7, "error": "server going away", "allowReconnect": True}))
    assert events == [StreamError("signalr_close", "server going away")]
    rows = conn.close()
    assert rows[-1]["status"] == "failed"
    assert [f["code"] for f in rows[-1]["findings"]] == ["signalr_missing_completion"]


def test_a_handshake_error_is_the_error() -> None:
    conn = Connection(view("/hub"), MSGPACK_HELLO)
    events = conn.receive(b'{"error":"Requested protocol \'messagepack\' is not available."}\x1e')
    assert isinstance(events[0], StreamError) and "messagepack" in (events[0].message or "")


def test_a_non_blocking_invocation_is_read_but_opens_no_turn() -> None:
    conn = Connection(view("/hub"), HELLO)
    (doc,) = conn.send(rec({"type": 1, "target": "Send", "arguments": ["hi there"]}))
    assert doc["messages"][0]["content"] == "hi there"
    assert conn.normalizer.ending("r", "x") == [] and conn.normalizer.upstream_cancel() == []
    assert conn.normalizer.refusal(conn.client_frames[-1], "r", "x") == []


def test_blocks_answer_in_the_protocol() -> None:
    conn = Connection(view("/hub"), HELLO)
    conn.send(rec(PROMPT))
    normalizer = conn.normalizer
    (frame,) = normalizer.ending("rule-1", "bad words")
    assert isinstance(frame, HubMessage) and frame.message == {
        "type": 3,
        "invocationId": "1",
        "error": "Blocked by content filter rule 'rule-1': bad words",
    }
    assert normalizer.ending("rule-1", "bad words") == [frame]  # pure
    (cancel,) = normalizer.upstream_cancel()
    assert normalizer.writer.encode_messages([cancel]) == [b'{"type":5,"invocationId":"1"}\x1e']
    assert normalizer.close_after_block("x") is None
    (refused,) = normalizer.refusal(conn.client_frames[-1], "rule-2", "no")
    assert refused.message["invocationId"] == "1" and "rule-2" in refused.message["error"]
    # the ending read back (as the adapter feeds it to the record) ends the turn as failed
    conn.receive(rec({}))
    events = conn.receive(normalizer.writer.encode_messages([frame])[0])
    assert events[-2:] == [Finish("error"), TurnEnd()]


def test_credentials_in_arguments_are_fingerprinted() -> None:
    conn = Connection(view("/hub"), HELLO)
    key = "sk-proj-" + "A1b2C3d4E5f6G7h8I9j0" * 3
    (doc,) = conn.send(rec(PROMPT | {"arguments": ["hello", {"apiKey": key}]}))
    assert key not in json.dumps(doc)


def test_client_cancel_finishes_as_cancelled() -> None:
    conn = Connection(view("/hub"), HELLO)
    conn.send(rec(PROMPT))
    conn.send(rec({"type": 5, "invocationId": "1"}))
    events = conn.receive(rec({}, {"type": 3, "invocationId": "1"}))
    assert events == [Finish("cancelled"), TurnEnd()]


def test_what_the_hub_sends_after_a_turn_ended_is_not_a_new_turn() -> None:
    conn = Connection(view("/hub"), HELLO)
    conn.send(rec(PROMPT))
    conn.receive(rec({}))
    (ending,) = conn.normalizer.ending("r", "x")
    conn.receive(conn.normalizer.writer.encode_messages([ending])[0])  # the proxy's ending, read back
    assert conn.receive(rec({"type": 2, "invocationId": "1", "item": {"late": "text"}}, ANSWER[-1])) == []
    conn.send(rec(PROMPT))  # the same id again: a new turn
    assert conn.receive(rec(*ANSWER))[-1] == TurnEnd()
    rows = conn.close()
    assert [r["status"] for r in rows] == ["failed", "completed"] and rows[1]["findings"] == []


def test_unmapped_pushes_without_a_turn_are_a_finding_at_the_end() -> None:
    conn = Connection(view("/hub"), HELLO)
    conn.receive(rec({}, {"type": 1, "target": "Broadcast", "arguments": ["news"]}))
    (row,) = conn.close()
    assert [f["code"] for f in row["findings"]] == ["signalr_unmapped"]


# -- through the proxy's per-connection pipeline (addon/connection_auditor.py) ------------------


def pipeline(dialect, framing: str, first: bytes, failure: Literal["open", "closed"] = "closed"):  # type: ignore[no-untyped-def]
    a, written = connection(dialect, framing, view("/hub"), failure=failure)
    a.from_client(first, True)
    return a, written


def test_an_output_block_through_the_connection_pipeline_msgpack() -> None:
    a, written = pipeline(DIALECT, "signalr_msgpack", MSGPACK_HELLO)
    a.from_client(packed([4, {}, "1", "Chat", ["hello"], []]), False)
    a.from_server(b"{}\x1e", True)
    relays = [
        a.from_server(packed([2, {}, "1", piece]), False)
        for piece in ("The plan is Nig", "htjar", " and more text after it")
    ]
    (cut,) = [r for r in relays if r.back]
    assert cut.back == [(packed([5, {}, "1"]), False)]  # CancelInvocation, in MessagePack, binary
    sent = [m for r in relays for m, _ in (r.onward or [])]
    assert all(b"htjar" not in m for m in sent)
    assert sent[-1].endswith(
        msgpack.packb([3, {}, "1", 1, "Blocked by content filter rule 'no-code-name': internal code name"])
    )


def test_messagepack_binary_is_read_as_text_a_peer_may_read() -> None:
    """A hub method taking ``byte[]`` reads it as UTF-8 (.NET, with U+FFFD for what is
    not): a prompt or an answer sent as MessagePack binary was never read, and passed
    every filter; it is now read as text (and a binary key too)."""
    a, _ = pipeline(DIALECT, "signalr_msgpack", MSGPACK_HELLO)
    relay = a.from_client(packed([4, {}, "1", "Chat", [b"what is Night\xffjar? no: Nightjar", {}], []]), False)
    assert relay.onward == [] and b"Blocked by content filter rule 'no-code-name'" in relay.back[0][0]

    a, _ = pipeline(DIALECT, "signalr_msgpack", MSGPACK_HELLO)
    relay = a.from_client(packed([4, {}, "1", "Chat", ["hello", {b"the Nightjar plan": 1}], []]), False)
    assert relay.onward == [] and b"Blocked by content filter rule 'no-code-name'" in relay.back[0][0]

    a, _ = pipeline(DIALECT, "signalr_msgpack", MSGPACK_HELLO)
    a.from_client(packed([4, {}, "1", "Chat", ["hello"], []]), False)
    a.from_server(b"{}\x1e", True)
    relay = a.from_server(packed([2, {}, "1", {"part": b"the Nightjar plan"}]), False)
    assert all(b"Nightjar" not in m for m, _ in (relay.onward or []))
    assert any(b"no-code-name" in m for m, _ in relay.onward or [])


def test_a_refused_prompt_through_the_connection_pipeline() -> None:
    a, written = pipeline(DIALECT, "signalr_json", HELLO)
    relay = a.from_client(rec(PROMPT | {"arguments": ["what is Nightjar?"]}), True)
    assert relay.onward == []
    (back,) = relay.back
    assert json.loads(back[0].rstrip(b"\x1e")) == {
        "type": 3,
        "invocationId": "1",
        "error": "Blocked by content filter rule 'no-code-name': internal code name",
    }
    assert written[-1]["status"] == "blocked"


def test_records_only_lenient_json_readers_take_are_claimed_read_and_checked() -> None:
    """A handshake and records only lenient JSON readers take (NaN) are read as the others:
    the connection is recorded, a blocked word in such a record is refused, an innocent one
    goes on (read, not "unreadable"), and the turns' records say the JSON was lenient."""
    lenient_hello = b'{"protocol":"json","version":1,"x":NaN}\x1e'
    a, written = pipeline(DIALECT, "signalr_json", lenient_hello)
    prompt = rec(PROMPT | {"arguments": ["what is Nightjar?"]}).replace(b"}\x1e", b',"n":NaN}\x1e')
    assert a.from_client(prompt, True).onward == []  # refused: the filters read it
    again = rec(PROMPT | {"invocationId": "2", "arguments": ["hello"]}).replace(b"}\x1e", b',"n":NaN}\x1e')
    assert a.from_client(again, True).onward is None  # goes on as it came
    a.from_server(rec({}, {"type": 3, "invocationId": "2", "result": "hi"}), True)
    rows = {row["turn"]: row for row in written}
    assert (rows[0]["status"], rows[1]["status"], rows[1]["output_text"]) == ("blocked", "completed", "hi")
    assert [f["code"] for f in rows[0]["findings"]] == ["lenient_json", "lenient_json"]  # the handshake's, the prompt's
    assert [f["code"] for f in rows[1]["findings"]] == ["lenient_json"]


def test_a_completion_of_another_invocation_is_not_the_turns_outcome() -> None:
    conn = Connection(view("/hub"), HELLO)
    conn.send(rec(PROMPT))
    events = conn.receive(rec({}, {"type": 3, "invocationId": "other", "error": "nope"}))
    assert events == [ShownText("nope", kind="error")]
    events = conn.receive(rec({"type": 3, "invocationId": "1", "result": "x", "error": "both"}))
    assert [type(e).__name__ for e in events] == ["Finding", "StreamError", "Finish", "TurnEnd"]


def test_unmapped_server_strings_reach_the_output_filters_unredacted() -> None:
    """A key a server invocation carries is what a client shows: the output filters must
    see it (a secrets rule), only the stored finding keeps its fingerprint."""
    from addon.dialects.hub import HubNormalizer
    from addon.events import Finding, ShownText
    from addon.framing.signalr import hub_message

    n = HubNormalizer()
    key = "AKIAQWERTYUIOPASDFGH"
    events = n.on_event(hub_message({"type": 1, "target": "show", "arguments": [key]}))
    assert events == [ShownText(key, kind="unmapped")]
    (finding,) = n.unmapped_finding()
    assert isinstance(finding, Finding) and key not in finding.detail


def nested(value: object, depth: int) -> object:
    for _ in range(depth):
        value = [value]
    return value


def test_a_prompt_nested_past_the_readers_bound_is_unread_and_the_policy_decides() -> None:
    """Arguments nested deeper than the walk reads (32 levels) are not read by the
    filters: the message is not read whole (``strings_unread``), so ``closed`` refuses it
    and ``open`` lets it go on with the finding, where it used to reach the hub unchecked
    and unsaid. Within the bound a blocked word is refused and an innocent prompt goes on."""
    for failure in ("closed", "open"):
        a, written = pipeline(DIALECT, "signalr_json", HELLO, failure)
        within = a.from_client(rec(PROMPT | {"arguments": [nested("what is Nightjar?", 30)]}), True)
        assert within.onward == [] and within.back  # (the filters read it: refused)
        fine = a.from_client(rec(PROMPT | {"invocationId": "2", "arguments": [nested("hello", 30)]}), True)
        assert fine.onward is None and not fine.back
        a.from_server(rec({}, {"type": 3, "invocationId": "2", "result": "hi"}), True)
        deep = a.from_client(rec(PROMPT | {"invocationId": "3", "arguments": ["hello", nested("Nightjar", 40)]}), True)
        if failure == "closed":
            assert deep.onward == []
            (back,) = deep.back
            assert json.loads(back[0].rstrip(b"\x1e"))["invocationId"] == "3"
            row = written[-1]
            assert row["status"] == "blocked"
            assert "could not be checked (strings_unread" in row["verdicts"][-1]["reason"]
        else:
            assert deep.onward is None and not deep.back  # (forwarded, flagged)
            a.from_server(rec({"type": 3, "invocationId": "3", "result": "ok"}), True)
            row = written[-1]
            assert row["status"] == "completed"
        (finding,) = [f for f in row["findings"] if f["code"] == "strings_unread"]
        assert "deeper than 32 levels" in finding["detail"]


def test_server_strings_nested_past_the_readers_bound_are_a_finding() -> None:
    """An unmapped item nested deeper than the walk reads: its shallow strings are shown
    text, and what the bound left out is the finding ``strings_unread`` (before them)."""
    from addon.dialects.hub import HubNormalizer
    from addon.events import Finding
    from addon.framing.signalr import hub_message

    n = HubNormalizer()
    n.on_client(hub_message(PROMPT))
    events = n.on_event(hub_message({"type": 2, "invocationId": "1", "item": ["shallow", nested("Nightjar", 40)]}))
    assert [type(e).__name__ for e in events] == ["Finding", "ShownText"]
    assert isinstance(events[0], Finding) and events[0].code == "strings_unread"
    assert "item of 1" in events[0].detail and "deeper than 32 levels" in events[0].detail
    assert n.on_event(hub_message({"type": 2, "invocationId": "1", "item": [nested("fine", 30)]})) == [
        ShownText("fine", kind="unmapped")
    ]


@pytest.mark.parametrize("failure", ["closed", "open"])
def test_an_answer_with_strings_past_the_readers_bound_is_the_failure_policy_s(failure: str) -> None:
    """Server strings nested deeper than the walk reads reach the client unread by any
    filter: the finding `strings_unread` now goes to the failure policy (it was only
    recorded: "Nightjar" 40 levels deep passed under `closed`)."""
    a, written = pipeline(DIALECT, "signalr_json", HELLO, failure)
    a.from_client(rec(PROMPT), True)
    a.from_server(b"{}\x1e", True)
    relay = a.from_server(rec({"type": 2, "invocationId": "1", "item": ["x", nested("Nightjar", 40)]}), True)
    if failure == "open":
        assert relay.onward is None  # (forwarded as it came)
    else:
        assert b"Nightjar" not in b"".join(m for m, _ in relay.onward) and relay.back  # (cancelled)
    a.from_server(rec({"type": 3, "invocationId": "1"}), True)
    row = written[-1]
    action = "block" if failure == "closed" else "flag"
    assert [(v["rule_id"], v["action"]) for v in row["verdicts"]] == [("filter_error", action)]
    assert row["status"] == ("blocked" if failure == "closed" else "completed")
