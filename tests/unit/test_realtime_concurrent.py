"""Two OpenAI Realtime responses in progress at once (an out-of-band response,
``response.conversation: "none"``, beside the default one), through the output filters.

Each response in progress is its own text for the filters, whatever the other sends in
between: a blocked word that response B writes across A's deltas, or across A's
``response.done``, is one word and blocks. A response's end checks only its own text to
its end (a word at its very end still blocks) and leaves the other's held text and
state in place. The proxy's ending gives every response the client has open its
``response.done``, the upstream is asked to cancel each one in progress, and the rest of
what was cut never reaches the client. One response at a time is unchanged."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conn_driver import connection

from addon.dialects import RequestView
from addon.dialects.openai_realtime import DIALECT, MAX_OPEN_RESPONSES, RealtimeNormalizer
from addon.events import Event, Finding, TextDelta, TurnEnd
from addon.filters.engine import FilterSet
from addon.filters.rules import parse_rules
from addon.framing import Message
from addon.output_gate import OutputGate
from addon.record import Status

RULES = """
[[rule]]
id = "no-code-name"
kind = "keywords"
keywords = ["Nightjar"]
scope = "response"
action = "block"
reason = "internal code name"
"""
FLAG_RULES = RULES.replace('action = "block"', 'action = "flag"')


# -- the server's events ----------------------------------------------------------------------


def where(rid: str) -> dict[str, Any]:
    return {"response_id": rid, "item_id": f"item_{rid}", "output_index": 0, "content_index": 0}


def created(rid: str) -> list[dict[str, Any]]:
    """``response.created``, its message item and its text part."""
    item = {"id": f"item_{rid}", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
    return [
        {"type": "response.created", "response": {"id": rid, "object": "realtime.response", "status": "in_progress",
                                                  "output": []}},
        {"type": "response.output_item.added", "response_id": rid, "output_index": 0, "item": item},
        {"type": "response.content_part.added", **where(rid), "part": {"type": "text", "text": ""}},
    ]  # fmt: skip


def delta(rid: str, text: str) -> dict[str, Any]:
    return {"type": "response.output_text.delta", **where(rid), "delta": text}


def finished(rid: str, text: str, status: str = "completed") -> list[dict[str, Any]]:
    """The done events of the part and item, then ``response.done``."""
    item = {"id": f"item_{rid}", "type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text}]}  # fmt: skip
    return [
        {"type": "response.output_text.done", **where(rid), "text": text},
        {"type": "response.content_part.done", **where(rid), "part": {"type": "text", "text": text}},
        {"type": "response.output_item.done", "response_id": rid, "output_index": 0, "item": item},
        {"type": "response.done", "response": {"id": rid, "object": "realtime.response", "status": status,
                                               "output": [item], "usage": {"input_tokens": 5, "output_tokens": 3}}},
    ]  # fmt: skip


# B ("The Nightjar sings.") writes the word across A's deltas: A's "thre" between "Nigh" and "tjar".
ACROSS_DELTAS = [
    *created("resp_A"), *created("resp_B"),
    delta("resp_A", "One "), delta("resp_B", "The "), delta("resp_A", "two "), delta("resp_B", "Nigh"),
    delta("resp_A", "thre"), delta("resp_B", "tjar"), delta("resp_B", " sings."), delta("resp_A", "e."),
    *finished("resp_A", "One two three."), *finished("resp_B", "The Nightjar sings."),
]  # fmt: skip
# B writes it across A's end: A's response.done between "Nigh" and "tjar".
ACROSS_DONE = [
    *created("resp_A"), *created("resp_B"),
    delta("resp_A", "One "), delta("resp_B", "The "), delta("resp_A", "two."), delta("resp_B", "Nigh"),
    *finished("resp_A", "One two."),
    delta("resp_B", "tjar"), delta("resp_B", " sings."), *finished("resp_B", "The Nightjar sings."),
]  # fmt: skip
# The word at the very end of A's text, B still open (and holding text) when A ends.
AT_A_S_END = [
    *created("resp_A"), *created("resp_B"),
    delta("resp_B", "Some "), delta("resp_A", "It is "), delta("resp_B", "Nig"), delta("resp_A", "Nightjar"),
    *finished("resp_A", "It is Nightjar"),
    delta("resp_B", "ht falls."), *finished("resp_B", "Some Night falls."),
]  # fmt: skip
# Both clean, interleaved, each ending with the start of the other's next word held.
CLEAN = [
    *created("resp_A"), *created("resp_B"),
    delta("resp_A", "Nigh"), delta("resp_B", "Nigh"), delta("resp_A", "t falls"), *finished("resp_A", "Night falls"),
    delta("resp_B", "tingale"), *finished("resp_B", "Nightingale"),
]  # fmt: skip


def one_at_a_time(text: str, rid: str = "resp_1") -> list[dict[str, Any]]:
    pieces = [text[i : i + 4] for i in range(0, len(text), 4)]
    return [*created(rid), *(delta(rid, p) for p in pieces), *finished(rid, text)]


# -- the connection, as the proxy reads it --------------------------------------------------------


class Client:
    """What a Realtime client gets through the connection auditor: the server's events as
    delivered, per response; the messages the proxy sent the upstream."""

    def __init__(self, rules: str = RULES) -> None:
        view = RequestView("GET", "/v1/realtime", "model=gpt-realtime", {})
        self.auditor, self.written = connection(DIALECT, "ws_json", view, rules)
        self.got: list[dict[str, Any]] = []  # the events the client received, in order
        self.upstream: list[dict[str, Any]] = []  # what the proxy itself sent the upstream

    def server(self, *messages: dict[str, Any]) -> Client:
        for message in messages:
            content = json.dumps(message).encode()
            relay = self.auditor.from_server(content, True)
            onward = [content] if relay.onward is None else [m for m, _ in relay.onward]
            self.got += [json.loads(m) for m in onward]
            self.upstream += [json.loads(m) for m, _ in relay.back]
        return self

    def text(self, rid: str) -> str:
        """A response's text as the client puts it together from its deltas."""
        return "".join(e["delta"] for e in self.got if e["type"].endswith(".delta") and e.get("response_id") == rid)

    def of(self, rid: str) -> list[str]:
        """The types of a response's events the client received, in order."""
        return [e["type"] for e in self.got if rid in (e.get("response_id"), (e.get("response") or {}).get("id"))]

    def rows(self) -> list[dict[str, Any]]:
        """The final row of each turn written, by turn."""
        rows = {row["turn"]: row for row in self.written}
        return [rows[k] for k in sorted(rows)]


def assert_each_response_ended_once(client: Client, *rids: str) -> None:
    """Every response the client saw begin gets one ``response.done`` and nothing after it."""
    for rid in rids:
        kinds = client.of(rid)
        assert kinds[0] == "response.created", (rid, kinds)
        assert kinds.count("response.done") == 1 and kinds[-1] == "response.done", (rid, kinds)


# -- the word across the other response --------------------------------------------------------


@pytest.mark.parametrize("messages", [ACROSS_DELTAS, ACROSS_DONE], ids=["across-deltas", "across-done"])
def test_a_word_cut_across_the_other_response_is_one_word_and_blocks(messages: list[dict[str, Any]]) -> None:
    client = Client().server(*messages)
    assert "tjar" not in client.text("resp_B") and "Nightjar" not in json.dumps(client.got)
    (error,) = [e for e in client.got if e["type"] == "error"]
    assert error["error"]["code"] == "content_filtered"
    assert_each_response_ended_once(client, "resp_A", "resp_B")
    dones = {e["response"]["id"]: e["response"] for e in client.got if e["type"] == "response.done"}
    # the response whose text was blocked, and the one whose end waited behind it, are ended by the proxy
    for rid in ("resp_A", "resp_B"):
        assert dones[rid]["status"] == "incomplete", rid
        assert dones[rid]["status_details"] == {"type": "incomplete", "reason": "content_filter"}
    assert dones["resp_B"]["output"][0]["content"][0]["text"] == client.text("resp_B")


def test_a_word_at_the_very_end_of_one_response_blocks_while_the_other_is_open() -> None:
    client = Client().server(*AT_A_S_END)
    assert "Nightjar" not in client.text("resp_A")
    assert any(e["type"] == "error" for e in client.got)
    assert_each_response_ended_once(client, "resp_A", "resp_B")


def test_two_clean_responses_interleaved_reach_the_client_as_they_came() -> None:
    client = Client().server(*CLEAN)
    assert client.got == CLEAN  # every event, in order, unchanged
    assert [r["status"] for r in client.rows()] == [Status.COMPLETED, Status.COMPLETED]


@pytest.mark.parametrize("messages", [ACROSS_DELTAS, ACROSS_DONE], ids=["across-deltas", "across-done"])
def test_flag_rules_read_each_response_as_its_own_text(messages: list[dict[str, Any]]) -> None:
    client = Client(FLAG_RULES).server(*messages)
    assert client.got == messages  # flags change nothing on the wire
    verdicts = [v for row in client.rows() for v in row["verdicts"]]
    assert [(v["rule_id"], v["location"], v["position"]) for v in verdicts] == [
        ("no-code-name", "output.choices[1].text", 4)  # B's own text, "The Nightjar", from its start
    ]


# -- after the cut --------------------------------------------------------------------------------


def test_every_response_in_progress_is_cancelled_and_the_rest_of_it_never_reaches_the_client() -> None:
    """Cut with both responses in progress: both are cancelled, and what the upstream still
    sends of either (their cancelled ends) is the proxy's, while a new response flows."""
    cut_at = ACROSS_DELTAS.index(delta("resp_B", " sings.")) + 1  # (the word is whole once what follows it came)
    client = Client().server(*ACROSS_DELTAS[:cut_at])
    assert sorted(m["response_id"] for m in client.upstream if m["type"] == "response.cancel") == ["resp_A", "resp_B"]
    got = len(client.got)
    client.server(
        delta("resp_A", "e."), delta("resp_B", " Mor"), *finished("resp_A", "One two three.", "cancelled"),
        delta("resp_B", "e."), *finished("resp_B", "The Nightjar sings. More.", "cancelled"),
    )  # fmt: skip
    assert client.got[got:] == []  # the rest of both cut responses
    after = [*created("resp_C"), delta("resp_C", "All "), delta("resp_C", "fine."), *finished("resp_C", "All fine.")]
    client.server(*after)
    assert client.got[got:] == after  # a new response flows
    assert_each_response_ended_once(client, "resp_A", "resp_B", "resp_C")


def test_after_a_cut_across_the_other_s_end_the_rest_of_the_cut_response_is_not_delivered() -> None:
    cut_at = ACROSS_DONE.index(delta("resp_B", " sings.")) + 1
    client = Client().server(*ACROSS_DONE[:cut_at])
    assert [m["response_id"] for m in client.upstream if m["type"] == "response.cancel"] == ["resp_B"]  # A is done
    got = len(client.got)
    client.server(delta("resp_B", " Mor"), *finished("resp_B", "The Nightjar sings. Mor", "cancelled"))
    assert client.got[got:] == []
    client.server(*one_at_a_time("All fine.", "resp_C"))
    assert client.text("resp_C") == "All fine."
    assert_each_response_ended_once(client, "resp_A", "resp_B", "resp_C")


# -- the records ------------------------------------------------------------------------------------


def test_each_response_done_ends_a_record_each_response_on_its_own_choice() -> None:
    """What the record does with two responses at once: each ``response.done`` ends the
    record then in progress (its usage, id and stop reason); each response's text is its own
    choice of the record in which it arrives (B's beside A: choice 1), never mixed into the
    other's."""
    client = Client(FLAG_RULES.replace("Nightjar", "Nothing")).server(*ACROSS_DONE)
    first, second = client.rows()
    assert first["response_id"] == "resp_A" and first["output_text"] == "One two."
    b_before = {"index": 1, "text": "The Nigh", "finish_reason": None}  # B's text before A's end
    assert first["output"]["choices"][1] == b_before
    assert second["response_id"] == "resp_B" and second["output_text"] == ""
    assert second["output"]["choices"] == [{"index": 1, "text": "tjar sings.", "finish_reason": "stop"}]


@pytest.mark.parametrize(
    ("messages", "statuses", "delivered"),
    [
        (ACROSS_DELTAS, [Status.BLOCKED, Status.COMPLETED], "One two thre"),
        (ACROSS_DONE, [Status.COMPLETED, Status.BLOCKED], ""),
    ],
    ids=["across-deltas", "across-done"],
)
def test_a_cut_blocks_the_record_in_progress(
    messages: list[dict[str, Any]], statuses: list[Status], delivered: str
) -> None:
    """The block goes to the record in progress (A's, or after A's end B's), its verdict
    located on B's choice; its ``delivered_text`` is what the client got of choice 0 in
    that record's turn; the cut B's end, read but not delivered, ends the other record."""
    rows = Client().server(*messages).rows()
    assert [r["status"] for r in rows] == statuses
    blocked = rows[statuses.index(Status.BLOCKED)]
    assert [v["location"] for v in blocked["verdicts"]] == ["output.choices[1].text"]
    (b,) = [c for c in blocked["output"]["choices"] if c["index"] == 1]
    assert "tjar sings." in b["text"]  # B's text as the upstream sent it
    assert blocked["delivered_text"] == delivered


# -- the gate fed Realtime events ---------------------------------------------------------------------


def gate_run(messages: list[dict[str, Any]], rules: str = RULES) -> tuple[OutputGate, list[dict[str, Any]]]:
    """An output gate fed the messages' events as the connection reads them; the events it released."""
    filters = FilterSet(parse_rules(rules), failure="closed")
    gate = OutputGate(filters.output_guard(), RealtimeNormalizer(), holds=True, split_raw=True, failure="closed")
    reading = RealtimeNormalizer()
    released, offset = b"", 0
    for message in messages:
        data = json.dumps(message)
        content = (data + "\n").encode()
        offset += len(content)
        frame = Message(data)
        released += gate.feed(content, len(content), [(frame, reading.on_event(frame), offset, None)])
        if gate.blocked is not None:
            break
    return gate, [json.loads(line) for line in released.splitlines()]


@pytest.mark.parametrize("messages", [ACROSS_DELTAS, ACROSS_DONE, AT_A_S_END], ids=["deltas", "done", "end"])
def test_the_gate_reads_each_response_as_its_own_text(messages: list[dict[str, Any]]) -> None:
    gate, released = gate_run(messages)
    assert gate.blocked is not None and gate.blocked.rule_id == "no-code-name"
    for rid in ("resp_A", "resp_B"):
        assert "Nightjar" not in "".join(e["delta"] for e in released if e == delta(rid, e.get("delta", "")))


def test_the_gate_passes_two_clean_responses_whole() -> None:
    gate, released = gate_run(CLEAN)
    assert gate.blocked is None and released == CLEAN


def test_one_response_at_a_time_is_unchanged() -> None:
    """The ordinary session: each response on choice 0, its end the whole turn's end."""
    reading = RealtimeNormalizer()
    out: list[Event] = []
    for message in [*one_at_a_time("Hello there."), *one_at_a_time("Bye now.", "resp_2")]:
        out += reading.on_event(Message(json.dumps(message)))
    assert [e for e in out if isinstance(e, TurnEnd)] == [TurnEnd(), TurnEnd()]
    assert {e.choice for e in out if isinstance(e, TextDelta)} == {0}
    gate, _ = gate_run(one_at_a_time("The Nightjar sings."))
    assert gate.blocked is not None
    client = Client().server(*one_at_a_time("The Nightjar sings."), *one_at_a_time("All fine.", "resp_2"))
    assert "tjar" not in client.text("resp_1") and client.text("resp_2") == "All fine."
    assert [m["response_id"] for m in client.upstream] == ["resp_1"]
    assert [r["status"] for r in client.rows()] == [Status.BLOCKED, Status.COMPLETED]


# -- more responses in progress than the dialect keeps ----------------------------------------------


def read(reading: RealtimeNormalizer, *messages: dict[str, Any]) -> list[Event]:
    out: list[Event] = []
    for message in messages:
        out += reading.on_event(Message(json.dumps(message)))
    return out


def eight_open() -> list[dict[str, Any]]:
    return [m for i in range(MAX_OPEN_RESPONSES) for m in created(f"resp_{i}")]


def test_a_response_past_the_ones_kept_is_text_interleaved_before_any_text() -> None:
    """A 9th response in progress forgets the oldest one, whose choice it takes (the gate's
    streams of that choice never ended): the finding text_interleaved comes first in that
    frame's events, before any text; so does an evicted response that comes back (read
    anew, on another choice), and its end."""
    reading = RealtimeNormalizer()
    read(reading, *eight_open(), delta("resp_0", "Call me x"))
    for message in [delta("resp_8", "Nightjar"), created("resp_9")[0]]:  # (a delta of a response never announced too)
        events = read(reading, message)
        assert isinstance(events[0], Finding) and events[0].code == "text_interleaved", events
    assert set(reading.evicted) == {"resp_0", "resp_1"}
    read(reading, *finished("resp_2", "."))  # (room for one: resp_0 comes back without evicting)
    events = read(reading, delta("resp_0", "tjar sings."))
    assert [type(e) for e in events] == [Finding, TextDelta] and events[0].code == "text_interleaved"
    assert not any(isinstance(e, Finding) for e in read(reading, *finished("resp_4", ".")))  # (a kept one: none)
    events = read(reading, finished("resp_1", "Its text.")[-1])  # (the evicted one's response.done)
    assert isinstance(events[0], Finding) and events[0].code == "text_interleaved"
    assert [e.text for e in events if type(e) is TextDelta] == ["Its text."] and not reading.evicted


def test_responses_never_ended_are_kept_within_bounds() -> None:
    """An upstream opening responses without ending them: at most MAX_OPEN_RESPONSES in
    progress and as many evicted are remembered, and what the proxy cut stays within them."""
    reading = RealtimeNormalizer()
    for i in range(100):
        read(reading, *created(f"resp_{i}"))
        if i % 10 == 0:
            reading.upstream_cancel()
    assert len(reading.responses) == len(reading.evicted) == MAX_OPEN_RESPONSES
    assert reading.cut <= set(reading.responses) | set(reading.evicted)


def test_a_ninth_response_does_not_continue_the_text_of_the_one_it_evicted() -> None:
    """resp_0 ends on a word character; the 9th response takes its choice: read as the
    continuation, "x" + "Nightjar" would be no word and pass. The eviction blocks first
    (failure policy closed): no text of the new response reaches the client, every
    response the client saw begin is ended once, and each is cancelled upstream."""
    client = Client().server(*eight_open(), delta("resp_0", "Call me x"), *created("resp_8"))
    client.server(delta("resp_8", "Nightjar"), delta("resp_8", " sings."), *finished("resp_8", "Nightjar sings."))
    assert "Nightjar" not in json.dumps(client.got)
    (error,) = [e for e in client.got if e["type"] == "error"]
    assert error["error"]["code"] == "content_filtered"
    assert_each_response_ended_once(client, *(f"resp_{i}" for i in range(MAX_OPEN_RESPONSES)))
    cancelled = {m["response_id"] for m in client.upstream if m["type"] == "response.cancel"}
    assert cancelled == {f"resp_{i}" for i in range(MAX_OPEN_RESPONSES + 1)}
    blocked = client.rows()[0]
    assert blocked["status"] == Status.BLOCKED
    assert "text_interleaved" in [f["code"] for f in blocked["findings"]]


def test_what_an_evicted_response_sends_later_never_reaches_the_client() -> None:
    """resp_0 holds "The Nigh" when a 9th response evicts it; its "tjar sings." read anew
    on another choice would pass. It is blocked at the eviction, and the rest of resp_0
    (cancelled upstream with the others) is the proxy's."""
    client = Client().server(*eight_open(), delta("resp_1", "fine."), delta("resp_0", "The Nigh"), *created("resp_8"))
    got = len(client.got)
    client.server(delta("resp_8", " ok."), delta("resp_0", "tjar sings."), *finished("resp_0", "The Nightjar sings."))
    assert client.got[got:] == [] and "Nigh" not in json.dumps(client.got)
    assert_each_response_ended_once(client, *(f"resp_{i}" for i in range(MAX_OPEN_RESPONSES)))
    client.server(*finished("resp_8", " ok."), *one_at_a_time("All fine.", "resp_C"))
    assert client.text("resp_C") == "All fine."


# -- a rules reload while responses overlap ----------------------------------------------------------


def reload(client: Client, rules: str) -> None:
    """The rules file changed: the filter set in force from now on."""
    new = FilterSet(parse_rules(rules), failure="closed")
    client.auditor.current_filters = lambda: new


def test_a_reload_reaches_a_connection_whose_responses_always_overlap() -> None:
    """A response the upstream leaves open (no text of its own) beside every other: no
    turn ends with none left open, yet the reloaded rules check the next responses (from
    the first response's end after the reload) and the client's messages at once."""
    client = Client(RULES.replace("Nightjar", "Albatross")).server(*created("resp_keep"))
    client.server(*one_at_a_time("The Nightjar sings.", "resp_1"))
    assert client.text("resp_1") == "The Nightjar sings."  # (not blocked yet)
    reload(client, RULES.replace('scope = "response"', 'scope = "both"'))
    client.server(*one_at_a_time("The Nightjar sings.", "resp_2"))  # (began under the old set: its gate's)
    client.server(*one_at_a_time("The Nightjar sings.", "resp_3"), *one_at_a_time("The Nightjar sings.", "resp_4"))
    assert "Nightjar" not in client.text("resp_3") + client.text("resp_4")
    asked = {"type": "conversation.item.create", "event_id": "evt_1",
             "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Nightjar?"}]}}  # fmt: skip
    relay = client.auditor.from_client(json.dumps(asked).encode(), True)
    assert relay.onward == [] and [json.loads(m)["error"]["event_id"] for m, _ in relay.back] == ["evt_1"]


def test_a_reload_waits_while_the_response_going_on_may_be_writing_a_match() -> None:
    """B's " Nigh" was let go when A wrote (the client has it), and A's end is a turn end
    with B going on: a fresh gate would read B's "tjar" as a new text and pass it. The old
    gate keeps B until a turn end where nothing of it is in progress: "tjar" blocks."""
    client = Client().server(
        *created("resp_A"), *created("resp_B"), delta("resp_B", "The Nigh"), delta("resp_A", "One.")
    )
    assert client.text("resp_B") == "The Nigh"  # (let go for A's text)
    reload(client, RULES.replace('"Nightjar"', '"Nightjar", "Albatross"'))
    client.server(
        *finished("resp_A", "One."), delta("resp_B", "tjar sings."), *finished("resp_B", "The Nightjar sings.")
    )
    assert client.text("resp_B") == "The Nigh"
    assert_each_response_ended_once(client, "resp_A", "resp_B")
    client.server(*one_at_a_time("An Albatross.", "resp_C"))  # (the reloaded set, at the next turn)
    assert "Albatross" not in client.text("resp_C")


def test_a_reload_hands_a_tool_call_s_cut_escape_to_the_fresh_gate() -> None:
    """B's arguments end in the start of an escape (``\\u004``: the client has it, the
    filters read its character when it is whole) when A's end hands B to a fresh gate: the
    fresh gate reads the rest with it, ``\\u004E`` + ``ightjar`` = Nightjar, and blocks."""
    call = {"id": "item_call", "type": "function_call", "call_id": "call_1", "name": "say", "arguments": ""}
    args = {"type": "response.function_call_arguments.delta", "response_id": "resp_B", "item_id": "item_call",
            "output_index": 0, "call_id": "call_1"}  # fmt: skip
    client = Client(RULES.replace("Nightjar", "Albatross")).server(
        *created("resp_A"), created("resp_B")[0],
        {"type": "response.output_item.added", "response_id": "resp_B", "output_index": 0, "item": call},
        args | {"delta": '{"text": "The \\u004'},
    )  # fmt: skip
    reload(client, RULES)
    client.server(*finished("resp_A", "One."), args | {"delta": 'Eightjar sings."}'})
    assert [e.get("delta") for e in client.got if e["type"] == args["type"]] == ['{"text": "The \\u004']
    assert [e["error"]["code"] for e in client.got if e["type"] == "error"] == ["content_filtered"]


# -- a client message refused while an answer goes on --------------------------------------------

BOTH = RULES.replace('scope = "response"', 'scope = "both"')
ASKED = {"type": "conversation.item.create", "event_id": "evt_1",
         "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Nightjar?"}]}}  # fmt: skip


def refuse(client: Client) -> None:
    relay = client.auditor.from_client(json.dumps(ASKED).encode(), True)
    assert relay.onward == [] and [json.loads(m)["error"]["event_id"] for m, _ in relay.back] == ["evt_1"]


@pytest.mark.parametrize("reloaded", [False, True], ids=["same-rules", "reloaded"])
def test_a_refused_client_message_leaves_the_answer_in_progress_whole(reloaded: bool) -> None:
    """The gate holds the answer's "Nigh" (a later piece may complete a match) when the
    client sends a message a request rule refuses: the answer goes on whole, each message
    as it came (a fresh gate in the holding one's place lost "Nigh" and cut the messages
    after it at the wrong boundaries: the client got pieces of JSON), with a reload in
    between too (the gate that holds text keeps the answer)."""
    client = Client(BOTH).server(*created("resp_1"), delta("resp_1", "The "), delta("resp_1", "Nigh"))
    assert client.text("resp_1") == "The "
    if reloaded:
        reload(client, BOTH.replace('"Nightjar"', '"Nightjar", "Albatross"'))
    refuse(client)
    client.server(delta("resp_1", "tingale sings."), *finished("resp_1", "The Nightingale sings."))
    assert client.text("resp_1") == "The Nightingale sings."
    assert_each_response_ended_once(client, "resp_1")
    assert not client.auditor.failed


def test_a_word_across_a_refused_client_message_still_blocks() -> None:
    client = Client(BOTH).server(*created("resp_1"), delta("resp_1", "The "), delta("resp_1", "Nigh"))
    refuse(client)
    client.server(delta("resp_1", "tjar sings."), *finished("resp_1", "The Nightjar sings."))
    assert client.text("resp_1") == "The "
    assert_each_response_ended_once(client, "resp_1")
    assert [e["type"] for e in client.upstream] == ["response.cancel"]


def test_a_refusal_between_answers_gives_the_next_answer_the_reloaded_rules() -> None:
    """Nothing of an answer goes on at the refusal: the next answer is checked with the
    rules in force then (a fresh gate), as after any turn's end."""
    client = Client(BOTH).server(*one_at_a_time("One two.", "resp_1"))
    reload(client, BOTH.replace('"Nightjar"', '"Nightjar", "Albatross"'))
    refuse(client)
    client.server(*one_at_a_time("An Albatross flies.", "resp_2"))
    assert "Albatross" not in client.text("resp_2")
    assert_each_response_ended_once(client, "resp_2")
