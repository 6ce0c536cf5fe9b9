"""The per-connection pipeline of a WebSocket (addon/connection_auditor.py), with a toy
protocol of one JSON message per frame: without filters every message goes on as it
came; each answer is one turn record, written when its end marker is read; a content
filter holds a server message until its text has passed, cuts an answer with the
protocol's ending (the rest of that answer is read, not delivered) and leaves the next
turn to flow; a blocked client message is not forwarded and the client gets a refusal."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conn_driver import RULES, connection

from addon.connection_auditor import ConnectionAuditor, Relay
from addon.dialects import Normalizer, RequestSummary, RequestView
from addon.events import Event, Finding, Finish, TextDelta, TurnEnd
from addon.filters.engine import FilterSet
from addon.filters.rules import parse_rules
from addon.framing import Frame, Framing, Message
from addon.framing.ws_json import FRAMING, WRITER
from addon.mitm.content_filters import check_message
from addon.record import ExchangeRecord, Status
from addon.turns import Turns


class Toy(Normalizer):
    """Client ``{"say": text}``; server ``{"delta": text}`` ... ``{"done": true}``."""

    framing = "ws_json"
    writer = WRITER

    def __init__(self) -> None:
        self.answering = False

    def on_event(self, event: Frame) -> list[Event]:
        obj = json.loads(event.data)
        if "boom" in obj:
            raise RuntimeError("a bug of ours")
        if "delta" in obj:
            self.answering = True
            return [TextDelta(obj["delta"])]
        if obj.get("done"):
            self.answering = False
            return [Finish("stop"), TurnEnd()]
        return []

    def on_client(self, frame: Frame) -> tuple[dict[str, Any], list[Finding]]:
        obj = json.loads(frame.data)
        self.answering = self.answering or "say" in obj  # (a question opens the answer)
        return ({"messages": [{"role": "user", "content": obj["say"]}]} if "say" in obj else {}), []

    def ending(self, rule_id: str, reason: str) -> list[Frame]:
        if not self.answering:
            return []
        return [Message(json.dumps({"error": reason})), Message(json.dumps({"done": True}))]

    def refusal(self, frame: Frame, rule_id: str, reason: str) -> list[Frame]:
        return [Message(json.dumps({"refused": reason}))]

    def upstream_cancel(self) -> list[Frame]:
        return [Message('{"cancel":true}')]


class ToyDialect:
    name = "toy"


def auditor(
    rules: str | None = None, failure: str = "closed", framing: Framing = FRAMING
) -> tuple[ConnectionAuditor, list[dict[str, Any]]]:
    written: list[dict[str, Any]] = []
    turns = Turns(ExchangeRecord(dialect="toy"), "conn-1", lambda r: written.append(r.to_row()))
    filters = FilterSet(parse_rules(rules), failure=failure) if rules else None  # type: ignore[arg-type]

    def check(fs: FilterSet, record: ExchangeRecord, doc: dict[str, Any]):  # type: ignore[no-untyped-def]
        from addon.dialects.ollama import DIALECT

        return check_message(fs, DIALECT, RequestSummary(), record, doc)

    a = ConnectionAuditor(
        framing,
        Toy(),
        Toy,
        turns,
        ExchangeRecord(dialect="toy", connection_id="conn-1"),
        max_event_bytes=1 << 20,
        max_record_bytes=1 << 20,
        filters=lambda: filters,
        check=check,
    )
    return a, written


def j(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def delivered(relays: list[tuple[bytes, Relay]]) -> list[bytes]:
    out: list[bytes] = []
    for content, relay in relays:
        out.extend([content] if relay.onward is None else [m for m, _ in relay.onward])
    return out


def final(written: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last row written of each turn."""
    rows: dict[Any, dict[str, Any]] = {}
    for row in written:
        rows[row["turn"]] = row
    return [rows[k] for k in sorted(rows)]


def test_without_filters_every_message_goes_on_and_each_answer_is_a_turn() -> None:
    a, written = auditor()
    for turn in ("first", "second"):
        assert a.from_client(j({"say": f"{turn} question"}), True) == Relay()
        for piece in ("an ", "answer"):
            assert a.from_server(j({"delta": piece}), True) == Relay()
        assert a.from_server(j({"done": True}), True) == Relay()
    rows = final(written)
    assert [(r["turn"], r["status"], r["output_text"]) for r in rows] == [
        (0, Status.COMPLETED, "an answer"),
        (1, Status.COMPLETED, "an answer"),
    ]
    assert rows[1]["request_body"]["messages"] == [{"role": "user", "content": "second question"}]
    assert {r["connection_id"] for r in rows} == {"conn-1"}


def test_an_output_block_cuts_the_answer_and_the_next_turn_flows() -> None:
    a, written = auditor(RULES)
    a.from_client(j({"say": "tell me"}), True)
    relays = []
    for piece in ("The project is Nig", "htjar and more", " text"):
        content = j({"delta": piece})
        relays.append((content, a.from_server(content, True)))
    (cut,) = [relay for _, relay in relays if relay.back]
    assert cut.back == [(b'{"cancel":true}', True)]  # the upstream is asked to stop
    sent = delivered(relays)
    assert all(b"Nightjar" not in m and b"htjar" not in m for m in sent)
    assert json.loads(sent[-1]) == {"done": True} and "error" in json.loads(sent[-2])
    assert a.from_server(j({"delta": "more"}), True).onward == []  # the rest of the cut answer is not delivered
    assert a.from_server(j({"done": True}), True).onward == []  # nor the upstream's own end
    # the next turn flows again
    a.from_client(j({"say": "again"}), True)
    again = [a.from_server(c, True) for c in (j({"delta": "fine"}), j({"done": True}))]
    assert delivered(list(zip((j({"delta": "fine"}), j({"done": True})), again))) == [
        j({"delta": "fine"}),
        j({"done": True}),
    ]
    rows = final(written)
    assert [(r["turn"], r["status"]) for r in rows] == [(0, Status.BLOCKED), (1, Status.COMPLETED)]
    assert "Nightjar" in rows[0]["output_text"]  # the record has what the upstream sent
    assert "Nightjar" not in (rows[0]["delivered_text"] or "")


def test_a_blocked_client_message_is_refused_and_not_forwarded() -> None:
    a, written = auditor(RULES)
    relay = a.from_client(j({"say": "what is Nightjar?"}), True)
    assert relay.onward == [] and json.loads(relay.back[0][0]) == {"refused": "internal code name"}
    assert a.from_client(j({"say": "hello"}), True) == Relay()
    rows = final(written)
    assert rows[0]["status"] == Status.BLOCKED and rows[0]["turn"] == 0


def test_the_reader_s_findings_on_a_refused_message_are_its_turn_s() -> None:
    """A refused message may carry more records (SignalR), a malformed one among them: the
    reader's finding on it is in the refused turn's record, not in the next turn's (left in
    the reader, it also made the next, innocent message look unreadable: refused)."""
    from addon.framing.signalr import JSON_FRAMING

    a, written = auditor(RULES, framing=JSON_FRAMING)
    a.from_client(b'{"protocol":"json","version":1}\x1e', True)
    a.from_server(b"{}\x1e", True)
    relay = a.from_client(b'{"type":1,"say":"what is Nightjar?"}\x1e{not json\x1e', True)
    assert relay.onward == [] and relay.back
    a.from_client(b'{"type":1,"say":"hello"}\x1e', True)
    a.from_server(b'{"type":1,"delta":"hi"}\x1e{"type":1,"done":true}\x1e', True)
    rows = final(written)
    assert [(r["turn"], r["status"]) for r in rows] == [(0, Status.BLOCKED), (1, Status.COMPLETED)]
    assert [f["code"] for f in rows[0]["findings"]] == ["signalr_invalid"]
    assert rows[1]["findings"] == []


def test_a_connection_closed_during_an_answer_records_the_partial_turn() -> None:
    a, written = auditor()
    a.from_client(j({"say": "q"}), True)
    a.from_server(j({"delta": "partial"}), True)
    a.closed(1006, "", by_client=False)
    row = final(written)[0]
    assert row["status"] == Status.UPSTREAM_ABORTED and row["output_text"] == "partial"
    connection = a.connection.to_row()
    assert connection["status"] == Status.UPSTREAM_ABORTED
    assert any(f["code"] == "websocket_closed" for f in connection["findings"])


def test_the_upstream_s_error_for_the_proxy_s_cancel_is_not_delivered() -> None:
    """OpenAI Realtime: after a cut the proxy cancels the response; an error the upstream
    sends about that cancel (its event id is the proxy's) is the proxy's, not the client's."""
    from addon.dialects.openai_realtime import DIALECT as REALTIME

    a, _ = dialect_auditor(REALTIME)
    theirs = j({"type": "error", "error": {"type": "invalid_request_error", "message": "x", "event_id": "evt_1"}})
    ours = j(
        {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "no response", "event_id": "event_llmaudit_abc"},
        }
    )
    assert a.from_server(theirs, True) == Relay()
    a.asked_upstream = True  # (a cut on this connection sent the upstream a response.cancel)
    assert a.from_server(ours, True) == Relay(onward=[])


def test_a_gemini_live_close_during_an_answer_is_that_answer_s_error() -> None:
    """Gemini Live reports errors only as close codes: one during an answer is its error."""
    from addon.dialects.gemini_live import DIALECT as LIVE

    a, written = dialect_auditor(LIVE)
    a.from_client(
        j({"clientContent": {"turns": [{"role": "user", "parts": [{"text": "q"}]}], "turnComplete": True}}), True
    )
    a.from_server(j({"serverContent": {"modelTurn": {"parts": [{"text": "part"}]}}}), True)
    a.closed(1011, "Internal error", by_client=False)
    (row,) = final(written)
    assert (row["error_code"], row["error_message"], row["output_text"]) == ("ws_close_1011", "Internal error", "part")


def dialect_auditor(dialect: Any) -> tuple[ConnectionAuditor, list[dict[str, Any]]]:
    """A connection auditor with a real WebSocket dialect and no filters."""
    return connection(dialect, "ws_json", RequestView("GET", "/v1/realtime", "model=m", {}), rules=None)


REALTIME_VOICE = [
    {"type": "response.created", "response": {"id": "r", "status": "in_progress"}},
    {"type": "conversation.item.input_audio_transcription.completed", "item_id": "i", "transcript": "what time is it"},
    {"type": "response.output_text.delta", "response_id": "r", "item_id": "o", "output_index": 0, "content_index": 0, "delta": "noon"},
    {"type": "response.done", "response": {"id": "r", "status": "completed", "output": []}},
]  # fmt: skip
LIVE_VOICE = [
    {"serverContent": {"inputTranscription": {"text": "what time"}}},
    {"serverContent": {"inputTranscription": {"text": " is it"}}},
    {"serverContent": {"modelTurn": {"parts": [{"text": "noon"}]}}},
    {"serverContent": {"turnComplete": True}},
]


@pytest.mark.parametrize("name, messages", [("realtime", REALTIME_VOICE), ("live", LIVE_VOICE)])
def test_a_voice_prompt_s_transcript_is_the_turn_s_request_side(name: str, messages: list[dict[str, Any]]) -> None:
    """Realtime transcribes what the user said in a server event, and Gemini Live in
    pieces: either is a user message of the turn it asked for."""
    from addon.dialects.gemini_live import DIALECT as LIVE
    from addon.dialects.openai_realtime import DIALECT as REALTIME

    a, written = dialect_auditor(REALTIME if name == "realtime" else LIVE)
    for message in messages:
        a.from_server(j(message), True)
    (row,) = final(written)
    assert row["request_body"]["messages"] == [{"role": "user", "content": "what time is it", "transcribed": True}]
    assert row["output_text"] == "noon"


def test_our_own_failure_under_failure_open_lets_what_was_held_go_not_lose_it() -> None:
    a, written = auditor(RULES, failure="open")
    a.from_client(j({"say": "q"}), True)
    held = j({"delta": "The project is Nig"})
    assert a.from_server(held, True).onward == []  # held: a match may be in progress
    boom = j({"boom": 1})
    relay = a.from_server(boom, True)
    assert relay.onward == [(held, True), (boom, True)]  # unchecked, in order, nothing lost
    assert a.from_server(j({"delta": "more"}), True) == Relay()  # and from here unread
    assert any(f["code"] == "audit_internal_error" for f in a.turns.record.findings)


def test_our_own_failure_under_failure_closed_closes_the_connection() -> None:
    a, _ = auditor(RULES)
    a.from_client(j({"say": "q"}), True)
    relay = a.from_server(j({"boom": 1}), True)
    assert relay.onward == [] and relay.close is not None and relay.close[0] == 1011


def test_messages_held_behind_text_are_bounded() -> None:
    """Messages without text (audio) queue behind held text; past the limit the failure
    policy decides (closed: the answer is cut), instead of memory growing."""
    a, written = auditor(RULES)
    a.max_held = 10_000
    a.from_client(j({"say": "q"}), True)
    assert a.from_server(j({"delta": "The project is Nig"}), True).onward == []
    relays = [a.from_server(j({"audio": "A" * 1000}), True) for _ in range(12)]
    cut = [r for r in relays if r.back]
    assert cut and json.loads(cut[0].onward[-1][0]) == {"done": True}  # the protocol's end of the answer
    a.from_server(j({"done": True}), True)  # the upstream's own end (after the cancel)
    assert final(written)[0]["status"] == Status.BLOCKED


def test_a_turn_cut_by_a_close_gets_the_last_checks_of_flag_rules() -> None:
    """A flag rule's match that only the end decides (the answer's very last word) is
    flagged when a close cuts the turn, by either side, as when the turn ends itself."""
    flag = '[[rule]]\nid = "code"\nkind = "keywords"\nkeywords = ["Nightjar"]\naction = "flag"\n'
    for close in ("client", "upstream", None):
        a, written = auditor(flag)
        a.from_client(j({"say": "question"}), True)
        for piece in ("the plan is ", "Nightjar"):
            a.from_server(j({"delta": piece}), True)
        if close is None:
            a.from_server(j({"done": True}), True)
        else:
            a.closed(1006, "", by_client=close == "client")
        row = final(written)[-1]
        assert row["output_text"] == "the plan is Nightjar", close
        assert [v["rule_id"] for v in row["verdicts"]] == ["code"], close


@pytest.mark.parametrize("failure", ["open", "closed"])
def test_a_refused_message_stays_refused_when_its_refusal_cannot_be_built(failure: str) -> None:
    """Our bug in building the refusal (once: a lone surrogate id orjson refused) must not
    let the blocked message go on: the failure policy decides for the rest, the message
    is dropped all the same, and the turn is recorded as blocked."""
    a, written = auditor(RULES, failure=failure, framing=_signalr_json())
    a.from_client(b'{"protocol":"json","version":1}\x1e', True)
    a.from_server(b"{}\x1e", True)

    def broken(frame: Frame, rule_id: str, reason: str) -> list[Frame]:
        raise TypeError("str is not valid UTF-8: surrogates not allowed")

    a.normalizer.refusal = broken  # type: ignore[method-assign]
    assert a.forwarded is not None
    a.forwarded.refusal = broken  # type: ignore[method-assign]
    clean, blocked = b'{"type":1,"say":"hello"}\x1e', b'{"type":1,"say":"what is Nightjar?"}\x1e'
    relay = a.from_client(clean + blocked, True)
    assert relay.back == []
    if failure == "open":
        assert relay.onward == [(clean, True)]  # what came before it, checked, goes on; it does not
        assert relay.close is None
    else:
        assert relay.onward == [] and relay.close is not None and relay.close[0] == 1011
    row = final(written)[0]
    assert row["status"] == Status.BLOCKED
    assert "audit_internal_error" in [f["code"] for f in row["findings"]]


def _signalr_json() -> Framing:
    from addon.framing.signalr import JSON_FRAMING

    return JSON_FRAMING


def test_a_refusal_while_the_gate_holds_the_answer_leaves_the_answer_whole() -> None:
    """A client message refused while the server's answer is held (the start of a word a
    later piece may complete): the answer goes on whole, message by message, in order
    (a fresh gate took the place of the one holding it: the held text was lost and the
    messages after it were cut at the wrong boundaries, pieces of JSON to the client)."""
    a, _ = auditor(RULES)
    a.from_client(j({"say": "a question"}), True)
    sent = [j({"delta": "The "}), j({"delta": "Nigh"})]
    relays = [(m, a.from_server(m, True)) for m in sent]
    refused = a.from_client(j({"say": "and Nightjar?"}), True)
    assert refused.onward == [] and json.loads(refused.back[0][0]) == {"refused": "internal code name"}
    rest = [j({"delta": "tingale"}), j({"done": True})]
    relays += [(m, a.from_server(m, True)) for m in rest]
    assert delivered(relays) == sent + rest
    assert not a.failed
