"""The per-connection pipeline of a message transport (WebSocket): messages in, turn
records out, and what each message becomes on its way.

mitmproxy hands a WebSocket's traffic to addons as whole messages in both directions,
never through a stream callable. This module reads them as the HTTP path reads bodies:
each direction has a reader of the connection's framing (:mod:`addon.framing`: one JSON
message per frame, SignalR's records), whose frames go to the connection's one
normalizer (server frames to ``on_event``, client frames to ``on_client``), whose events
fill the record of the current turn (:class:`~addon.turns.Turns`: one record per
answer, written ahead when the turn begins and final when its end marker, the
dialect's :class:`~addon.events.TurnEnd`, is read). The connection itself is one more
record (``turn`` NULL): who opened it, when, and how it ended.

What goes on. Without content filters every message goes on unchanged (a :class:`Relay`
with ``onward`` None). With them:

- each client frame is checked by the request filters before its message goes on; a
  blocked one is not forwarded (nor what follows it in its message, nor when its
  refusal cannot be built), the client gets the protocol's refusal
  (:meth:`~addon.dialects.Normalizer.refusal`) and the turn is recorded as blocked; the
  answer in progress, if any, goes on through its gate;
- server messages pass through an :class:`~addon.output_gate.OutputGate`, one per turn,
  which holds a message until the filters have passed all the text it carries (the
  guarantee of the HTTP path: no character of a match reaches the client). When it
  blocks, the client gets the protocol's end of the answer
  (:meth:`~addon.dialects.Normalizer.ending`), the upstream is asked to stop
  (:meth:`~addon.dialects.Normalizer.upstream_cancel`), and the rest of that answer is
  read into the record but not delivered, up to its end marker; the connection stays
  open for the next turn unless the protocol's errors are close codes
  (:meth:`~addon.dialects.Normalizer.close_after_block`).

Sans-IO: the mitmproxy adapter (:mod:`addon.mitm.websocket`) sends, drops and injects.
It never raises: a failure of the audit becomes a finding and the messages go on (with
filters, the failure policy decides).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from addon.dialects import Normalizer, unkept_of
from addon.dialects.blocking import block_message
from addon.events import Event, PromptText, TurnEnd
from addon.filters.api import Verdict
from addon.filters.engine import FilterSet
from addon.findings import UNREAD_MESSAGE
from addon.framing import Frame, Framing
from addon.output_gate import Framed, OutputGate
from addon.record import OUTCOME_CLIENT_ABORTED, OUTCOME_COMPLETE, OUTCOME_UPSTREAM_ABORTED, ExchangeRecord
from addon.turns import READ_ANYWAY, Turns, merge_request, unchecked

log = logging.getLogger(__name__)

#: One WebSocket message: its content, and whether it is a text message.
Out = tuple[bytes, bool]
#: Close codes of a connection that ended as its protocol ends one (RFC 6455 7.4.1):
#: normal, going away, and a close frame without a code.
NORMAL_CLOSES = frozenset({1000, 1001, 1005})
#: Reader findings about what the reader handed over all the same, not a message it could
#: not: :data:`~addon.turns.READ_ANYWAY`, and a record read as lenient JSON readers read it
#: (SignalR's: the filters check it).
READ_ALL_THE_SAME = READ_ANYWAY | {"lenient_json"}
#: Checks a client message's reading: the verdict that blocks it, if any.
RequestCheck = Callable[[FilterSet, ExchangeRecord, dict[str, Any]], Verdict | None]


class _EveryChoice:
    """Every choice (answer) a gate reads: the ``going_on`` of :meth:`OutputGate.idle`
    and :meth:`OutputGate.hand_over` where no turn's end says which answers go on."""

    def __contains__(self, item: object) -> bool:
        return True


EVERY_CHOICE: Any = _EveryChoice()


@dataclass(slots=True)
class Relay:
    """What becomes of one message: ``onward``, the messages that go on in its place
    (None: it goes on as it came); ``back``, messages to the side it came from (a
    refusal to the client, a cancel to the upstream); ``close``, a close (code, reason)
    of the whole connection once these are sent."""

    onward: list[Out] | None = None
    back: list[Out] = field(default_factory=list)
    close: tuple[int, str] | None = None


class _Pending:
    """The messages of one direction that were read but have not gone on yet, by
    length: released bytes are cut back into messages at their boundaries."""

    __slots__ = ("items", "size")

    def __init__(self) -> None:
        self.items: deque[list[Any]] = deque()  # [remaining length, is text]
        self.size = 0  # their bytes

    def add(self, length: int, text: bool) -> None:
        self.items.append([length, text])
        self.size += length

    def split(self, released: bytes) -> list[Out]:
        """``released`` (the next bytes of the direction) as the messages they were;
        bytes ending inside a message go as a message of their own (a framing whose
        frames may share or straddle messages, SignalR, allows that)."""
        out: list[Out] = []
        at = 0
        while at < len(released) and self.items:
            item = self.items[0]
            n = min(item[0], len(released) - at)
            out.append((released[at : at + n], item[1]))
            at += n
            item[0] -= n
            if item[0] == 0:
                self.items.popleft()
        self.size -= at
        return out

    def clear(self) -> None:
        self.items.clear()
        self.size = 0


class ConnectionAuditor:
    """Reads one WebSocket connection's messages into its turn records.

    ``filters`` gives the filter set in force (asked again at every turn, so that a rules
    reload reaches a connection that stays open for hours); ``check`` runs the request
    filters on one client message's reading. ``make_normalizer`` makes the second
    normalizer a gate needs (it reads only what the client got, for the endings).
    """

    def __init__(
        self,
        framing: Framing,
        normalizer: Normalizer,
        make_normalizer: Callable[[], Normalizer],
        turns: Turns,
        connection: ExchangeRecord,
        *,
        max_event_bytes: int,
        max_record_bytes: int,
        filters: Callable[[], FilterSet | None],
        check: RequestCheck,
    ) -> None:
        self.normalizer, self.make_normalizer = normalizer, make_normalizer
        self.turns, self.connection = turns, connection
        self.max_record_bytes = max_record_bytes
        # Server bytes the gate may hold waiting for the filters (messages without text, such
        # as audio, queue behind held text): beyond it the failure policy decides.
        self.max_held = max_event_bytes
        self.client_reader = framing.reader(max_event_bytes, max_record_bytes, {})
        self.server_reader = framing.reader(max_event_bytes, max_record_bytes, {})
        self.writer = normalizer.writer
        self.current_filters, self.check = filters, check
        self.filters: FilterSet | None = None
        self.gate: OutputGate | None = None
        self.gate_filters: FilterSet | None = None  # the filter set the gate checks with
        self.forwarded: Normalizer | None = None  # reads what the client got (with a gate)
        self.server_offset = 0  # server bytes read so far
        self.gate_base = 0  # where the current gate's offsets begin
        self.server_pending = _Pending()
        self.client_pending = _Pending()
        self.client_held = bytearray()  # (checking) client bytes not gone on yet
        self.client_from = 0  # offset of client_held[0]
        self.suppressing = False  # the answer was cut: the rest of it is read, not delivered
        self.turn_over = False  # a frame of this message ended the turn
        self.going_on: tuple[int, ...] = ()  # the answers that turn's end left in progress (TurnEnd.going_on)
        self.holding_current = False  # the message being read is among the held bytes
        self.failed = False
        # the proxy cut an answer (and sent the upstream a cancel, where the protocol has
        # one): only then can an upstream frame be the proxy's, the answer to its cancel or
        # the rest of what it cut (Normalizer.for_proxy, not asked of every message)
        self.asked_upstream = False
        self._next_gate()

    # -- the client's messages ------------------------------------------------------------

    def from_client(self, content: bytes, text: bool) -> Relay:
        self.connection.event_count += 1
        self.holding_current = False  # (whether this message is among the held bytes, for _fail)
        if self.failed:
            return Relay()
        try:
            return self._client(content, text)
        except Exception as e:  # noqa: BLE001 - the traffic must never see our bugs
            return self._fail(e, content, text, from_client=True)

    def _client(self, content: bytes, text: bool) -> Relay:
        filters = self.filters
        reader = self.client_reader
        if filters is None or not (filters.request_rules or filters.filters):
            for frame in reader.feed(content):
                self._client_frame(frame)
            self._collect(reader)
            self.client_from += len(content)
            return Relay()
        # Checking: a message's bytes go on once every frame in them has passed.
        self.client_pending.add(len(content), text)
        self.client_held += content
        self.holding_current = True
        release = self.client_from
        closed = filters.failure == "closed"
        for item, end in reader.feed_bounded(content):
            if item is not None:
                frame = item
                doc, unread = self._client_frame(frame)
                verdict = self.check(filters, self.turns.record, doc) if doc or unkept_of(doc) else None
                if verdict is None and unread is not None and closed:
                    verdict = unchecked(unread)
                if verdict is not None:
                    return self._refuse(frame, verdict, release)
            release = end
        problem = self._reader_problem(reader)
        self._collect(reader)
        if problem is not None:
            if closed:
                return self._refuse(None, unchecked(problem), release)
            release = self.client_from + len(self.client_held)  # (unread bytes pass unchecked)
        out = self._client_release(release)
        if len(out) == 1 and len(out[0][0]) == len(content) and not self.client_held:
            return Relay()  # (the message goes on as it came)
        return Relay(onward=out)

    def _client_release(self, upto: int) -> list[Out]:
        n = upto - self.client_from
        released = bytes(self.client_held[:n])
        del self.client_held[:n]
        self.client_from = upto
        return self.client_pending.split(released)

    def _client_frame(self, frame: Frame) -> tuple[dict[str, Any], str | None]:
        """Read one client frame into the current turn: its reading, and why it could not
        be read whole (else None)."""
        doc, findings = self.normalizer.on_client(frame)
        if self.forwarded is not None:
            self.forwarded.on_client(frame)  # (it keeps the same protocol state for its endings)
        record = self.turns.record
        merge_request(record, doc, self.max_record_bytes)
        for finding in findings:
            record.apply(finding)
        if doc.get("messages") or findings:
            self.turns.open()
        else:
            self.turns.touch()
        unread = next((f"{f.code}: {f.detail}" for f in findings if f.code in UNREAD_MESSAGE), None)
        return doc, unread

    def _refuse(self, frame: Frame | None, verdict: Verdict, release: int) -> Relay:
        """A request filter blocked a client message: what came before it goes on, it and
        the rest of its message do not, the client gets the protocol's refusal, and the
        turn is recorded as blocked. The reader's findings on the message (its frames
        after the blocked one included) are that turn's: collected before its record is
        written, not left for the next message to put in the next turn's."""
        self._collect(self.client_reader)
        before = self._client_release(release)
        self.client_from += len(self.client_held)
        self.client_held.clear()  # (from here the refused message is nobody's to forward: not even _fail's)
        self.client_pending.clear()
        record = self.turns.record
        record.verdicts.append(verdict.as_dict())
        record.block(block_message(verdict.rule_id, verdict.reason))
        try:
            back = self._refusal(frame, verdict)
        except Exception as e:  # noqa: BLE001 - our bug: the failure policy decides, the message stays refused
            relay = self._fail(e, b"", True, from_client=True)  # (nothing is held: it forwards nothing)
            self.turns.open()
            self.turns.end_turn(record)
            return relay if relay.close is not None else Relay(onward=before)
        record.bytes_to_client += sum(len(m) for m, _ in back)
        self.turns.open()
        self.turns.end_turn(record)
        self._gate_after_refusal()
        return Relay(onward=before, back=back, close=self.normalizer.close_after_block(verdict.reason))

    def _refusal(self, frame: Frame | None, verdict: Verdict) -> list[Out]:
        """The protocol's refusal of the client message ``frame`` (none for a message the
        reader could not read), as messages to the client; the normalizers learn the
        client's view of it."""
        normalizer = self.forwarded or self.normalizer
        frames = normalizer.refusal(frame, verdict.rule_id, verdict.reason) if frame is not None else []
        for reader in {id(n): n for n in (self.normalizer, normalizer)}.values():
            for refused in frames:  # both learn the client's view: that request was answered
                reader.on_event(refused)
        return self._encode(frames)

    def _gate_after_refusal(self) -> None:
        """After a refused client message (the end of its turn): the filters in force are
        read again (the client's next messages are checked with them); the gate stays,
        unless the set changed and it is idle (nothing of an answer going on waits, is
        held, or may be a match in progress), when a fresh one with the new set takes
        over as at a turn's end (:meth:`_reload`).

        The server's answer in progress is not the refused message's: a gate swapped
        while it holds that answer's text would drop the text, and the messages it held
        would be cut at the wrong boundaries (a piece of JSON to the client)."""
        self._read_filters()
        gate = self.gate
        if gate is not None:
            if self.filters is self.gate_filters or self.server_pending.items or not gate.idle(EVERY_CHOICE):
                gate.delivered.clear()  # (what the client gets from here is the next turn's)
                return
        self._new_gate()
        if gate is not None and self.gate is not None:
            gate.hand_over(self.gate, EVERY_CHOICE)

    # -- the server's messages ------------------------------------------------------------

    def from_server(self, content: bytes, text: bool) -> Relay:
        self.connection.event_count += 1
        self.holding_current = False
        if self.failed:
            return Relay()
        try:
            return self._server(content, text)
        except Exception as e:  # noqa: BLE001 - the traffic must never see our bugs
            return self._fail(e, content, text, from_client=False)

    def _server(self, content: bytes, text: bool) -> Relay:
        record = self.turns.record
        if record.first_chunk_at is None:
            record.first_chunk_at = time.time()
        record.bytes_from_upstream += len(content)
        self.connection.bytes_from_upstream += len(content)
        reader, gate = self.server_reader, self.gate
        self.server_offset += len(content)
        if self.suppressing or gate is None:
            frames = reader.feed(content)
            # (asked before the frames are read: reading the end of what the proxy cut ends it)
            ours = self.asked_upstream and frames and all(self.normalizer.for_proxy(f) for f in frames)
            for frame in frames:
                self._server_frame(frame)
            self._collect(reader)
            if ours or self.suppressing:  # (the upstream's answer to the proxy's own message; the rest of a cut answer)
                if self.turn_over:
                    self.suppressing = False
                self._end_of_message()
                return Relay(onward=[])
            self._delivered(len(content))
            self._end_of_message()
            return Relay()
        bounded = reader.feed_bounded(content)
        if self.asked_upstream and all(item is not None and self.normalizer.for_proxy(item) for item, _ in bounded):
            for item, _ in bounded:
                self._server_frame(item)  # type: ignore[arg-type]
            self.gate_base += len(content)  # (the gate never sees it: its offsets skip it)
            self._collect(reader)
            self._end_of_message()
            return Relay(onward=[])  # (the upstream's answer to the proxy's own message)
        self.server_pending.add(len(content), text)
        framed: list[Framed] = []
        for item, end in bounded:
            framed.append((item, self._server_frame(item) if item is not None else (), end - self.gate_base, None))
        problem = self._reader_problem(reader)
        self._collect(reader)
        self.holding_current = True
        released = gate.feed(content, len(content), framed)
        if problem is None and self.server_pending.size - len(released) > self.max_held:
            problem = f"over {self.max_held} bytes of messages wait for the filters"
        if problem is not None:
            gate.unreadable(f"a message cannot be checked: {problem}")
            released += gate.feed(None, 0, ())
        self._verdicts(gate)
        if gate.blocked is not None:
            relay = self._cut(gate, released)
            self._end_of_message()
            return relay
        out = self.server_pending.split(released)
        self._delivered(len(released))
        self._end_of_message()
        if len(out) == 1 and len(out[0][0]) == len(content) and not self.server_pending.items:
            return Relay()  # (the message goes on as it came)
        return Relay(onward=out)

    def _server_frame(self, frame: Frame) -> list[Event]:
        """Read one server frame into the current turn (its end marker is acted on once
        the whole message is read and checked: :meth:`_end_of_message`)."""
        record = self.turns.record
        record.event_count += 1
        events = self.normalizer.on_event(frame)
        for ev in events:
            record.apply(ev)
            if type(ev) is TurnEnd:
                self.turn_over = True
                self.going_on = ev.going_on
            elif type(ev) is PromptText:
                self._transcribed(record, ev)
        return events

    def _transcribed(self, record: ExchangeRecord, prompt: PromptText) -> None:
        """A voice prompt's transcript: a user message of the turn, as a typed one is
        (pieces of one transcript are joined)."""
        body = record.request_body if isinstance(record.request_body, dict) else {}
        messages = body.get("messages") or []
        last = messages[-1] if messages else None
        if (
            prompt.piece
            and isinstance(last, dict)
            and last.get("transcribed")
            and len(last["content"]) < self.max_record_bytes
        ):
            last["content"] += prompt.text
            return
        merge_request(
            record, {"messages": [{"role": "user", "content": prompt.text, "transcribed": True}]}, self.max_record_bytes
        )
        self.turns.open()

    def _end_of_message(self) -> None:
        """After a server message: the turn it answered begins (its record written ahead)
        or, when it carried the turn's end, is written, and the next turn gets a gate.

        Not while another answer goes on (OpenAI Realtime's responses at once): the gate
        keeps reading that one's text, as one text with what follows (the gate ended only
        the ended answer's, :meth:`OutputGate._end_turn`); what it counts as the client's
        text starts again, for the next turn's record. The filters in force are read
        again all the same, and a changed set gets its gate once that drops nothing
        (:meth:`_reload`)."""
        self.turns.answered()
        if not self.turn_over:
            return
        self.turn_over = False
        going_on, self.going_on = self.going_on, ()
        self.turns.end_turn(self.turns.record)
        if self.suppressing:
            return
        if going_on and self.gate is not None:
            self.gate.delivered.clear()
            self._reload(self.gate, going_on)
        elif not self.server_pending.items:
            self._next_gate()

    def _reload(self, gate: OutputGate, going_on: tuple[int, ...]) -> None:
        """A turn ended while the answers ``going_on`` go on: the filters in force are read
        again, so that the client's next messages are checked with a reloaded set at
        once, and when the set changed, a fresh gate with it takes over, if the old one
        is idle (:meth:`OutputGate.idle`: no message waits, no text is held, no match of
        a blocking rule may be in progress in the answers going on).

        Why not at once: the old gate may hold text of an answer going on (the start of a
        word the next piece may complete) or hold messages behind it; ending its streams
        as a turn's end would release that text checked as an end, and a fresh gate would
        read the rest as a new text, so a match across the two would reach the client
        (and dropping them would lose the answer). So the old filters check the output
        until such a turn end (on a connection whose responses always overlap, the first
        one where the others hold nothing); from there the fresh gate reads the rest of
        each answer going on as a text of its own: a match of a rule new to the set that
        began before it is not found (its start went out under the old set), a flag
        rule's match across it is not flagged, and positions count from the hand-over."""
        self._read_filters()
        if self.filters is self.gate_filters or self.server_pending.items or not gate.idle(going_on):
            return
        self._new_gate()
        if self.gate is not None:
            gate.hand_over(self.gate, going_on)

    def _cut(self, gate: OutputGate, released: bytes) -> Relay:
        """An output filter blocked the answer: what was cleared before goes, then the
        protocol's end of the answer; the upstream is asked to stop; the rest of the
        answer is read, not delivered, up to its end (unless this message ended it, and
        no other answer goes on beside it: the protocol's ending closed that one too)."""
        verdict = gate.blocked
        assert verdict is not None
        record = self.turns.record
        out = self.server_pending.split(released)
        self.server_pending.clear()
        forwarded = gate.forwarded
        self.turns.answered()  # (this message may begin the answer: a voice client's question is no message)
        if not self.turns.pending and not self.turn_over:
            return self._withhold(verdict, out)
        frames = forwarded.ending(verdict.rule_id, verdict.reason)
        for frame in frames:
            forwarded.on_event(frame)  # the client's view of the turn: it ended
        ending = self._encode(frames)
        record.block(block_message(verdict.rule_id, verdict.reason), [forwarded.filter_stop_reason] if frames else None)
        sent = len(released) + sum(len(m) for m, _ in ending)
        record.bytes_to_client += sent
        self.connection.bytes_to_client += sent
        record.delivered_text = gate.delivered_text
        self.turns.open()
        answering = not self.turn_over or bool(self.going_on)
        cancel = self._encode(self.normalizer.upstream_cancel()) if answering else []
        self.asked_upstream = self.asked_upstream or answering
        self.suppressing = answering
        self.gate = None  # (a new one comes with the next turn)
        return Relay(onward=out + ending, back=cancel, close=self.normalizer.close_after_block(verdict.reason))

    def _withhold(self, verdict: Verdict, out: list[Out]) -> Relay:
        """Output a filter blocked outside any answer (a title or suggestions shown after
        one): that message and what was held with it are withheld, the verdict goes to the
        connection's record, and nothing else changes (no turn is cut or begun)."""
        record = self.turns.record
        self.connection.verdicts.extend(record.verdicts)
        record.verdicts.clear()
        self.connection.add_finding("output_withheld", f"{verdict.rule_id}: {verdict.reason}"[:300])
        self._next_gate()
        return Relay(onward=out)

    # -- the gate ---------------------------------------------------------------------------

    def _next_gate(self) -> None:
        """A new turn: the filters in force now, and a fresh gate for its answer."""
        self._read_filters()
        self._new_gate()

    def _read_filters(self) -> None:
        """The filters in force now (the request checks use them from here); on a
        failure to read them, the ones read last."""
        try:
            self.filters = self.current_filters()
        except Exception:
            log.exception("llm-audit: could not read the content filters")

    def _new_gate(self) -> None:
        """A fresh gate with the filters read last (None: they check no output)."""
        filters = self.gate_filters = self.filters
        self.gate = None
        if filters is None or not filters.checks_output:
            return
        if self.forwarded is None:
            self.forwarded = self.make_normalizer()
        self.gate = OutputGate(
            filters.output_guard(),
            self.forwarded,
            holds=filters.may_block_output,
            split_raw=True,
            failure=filters.failure,
        )
        self.gate_base = self.server_offset

    def _verdicts(self, gate: OutputGate) -> None:
        if gate.verdicts:
            self.turns.record.verdicts.extend(v.as_dict() for v in gate.verdicts)
            gate.verdicts.clear()

    def _delivered(self, n: int) -> None:
        self.turns.record.bytes_to_client += n
        self.connection.bytes_to_client += n

    # -- the end ----------------------------------------------------------------------------

    def closed(self, code: int | None, reason: str, by_client: bool | None) -> None:
        """The connection ended: the turn in progress is recorded as cut, with what it
        has, and the connection's record says how it ended (``by_client`` None: the proxy
        closed it)."""
        who = "the client" if by_client else "the upstream" if by_client is not None else "the proxy"
        turns = self.turns
        answered = (turns.record.turn or 0) + (1 if turns.pending else 0)
        detail = f"code {code if code is not None else 'none'} by {who} after {answered} turns"
        detail += f": {reason}"[:200] if reason else ""
        if turns.pending:
            record = turns.record
            gate = self.gate
            if gate is not None and not gate.holds:  # the end of the text the client had: flag rules' last checks
                gate.finish()
                self._verdicts(gate)
            # the dialect's end checks (an answer never completed), and what the close means to it
            for ev in [*self.normalizer.on_end(cut=True), *self.normalizer.on_close(code, reason)]:
                record.apply(ev)
            record.add_finding("websocket_closed", f"during the answer: {detail}")
            record.finish(OUTCOME_UPSTREAM_ABORTED if by_client is False else OUTCOME_CLIENT_ABORTED)
            turns.submit(record)
        turns.close()
        connection = self.connection
        connection.add_finding("websocket_closed", detail)
        normal = code in NORMAL_CLOSES
        if not normal and code is not None and code != 1006:
            connection.fail(f"websocket_{code}", reason or None)
        connection.terminal_seen = normal or code != 1006
        outcome = OUTCOME_COMPLETE if normal else OUTCOME_CLIENT_ABORTED if by_client else OUTCOME_UPSTREAM_ABORTED
        connection.finish(outcome)

    # -- helpers ----------------------------------------------------------------------------

    def _encode(self, frames: Sequence[Frame]) -> list[Out]:
        """Frames as WebSocket messages, by the framing's writer (one message each where
        the framing has one frame per message)."""
        if not frames:
            return []
        writer = self.writer
        encode = getattr(writer, "encode_messages", None)
        messages = encode(frames) if encode is not None else [writer.encode(frames, True)]
        return [(m, bool(getattr(writer, "text", True))) for m in messages]

    def _collect(self, reader: Any) -> None:
        findings = reader.findings
        if findings:
            for code, detail in findings:
                self.turns.record.add_finding(code, detail)
            findings.clear()

    @staticmethod
    def _reader_problem(reader: Any) -> str | None:
        """Why the reader could not hand over a message it read (None: it could)."""
        problem = next((f"{code}: {detail}" for code, detail in reader.findings if code not in READ_ALL_THE_SAME), None)
        return problem or reader.unreadable

    def _fail(self, error: Exception, content: bytes, text: bool, from_client: bool) -> Relay:
        """Our bug: a finding, and from here the messages go on unread; with filters and
        the failure policy closed, the connection is closed instead (nothing unchecked
        may pass). What was held for the filters goes on first, unchecked, not lost."""
        log.exception("llm-audit: reading a WebSocket message failed")
        self.turns.record.add_finding("audit_internal_error", f"websocket: {type(error).__name__}: {error}"[:300])
        self.failed = True
        filters = self.filters
        if filters is not None and filters.failure == "closed" and (filters.may_block_output or filters.request_rules):
            return Relay(onward=[], close=(1011, "llm-audit: the audit failed"))
        if from_client:
            held = self.client_pending.split(bytes(self.client_held))
            self.client_held.clear()
        else:
            held = self.server_pending.split(self.gate.take_all()) if self.gate is not None else []
        if not held:
            return Relay()
        return Relay(onward=held if self.holding_current else [*held, (content, text)])
