"""What the SignalR dialects share (``signalr``, ``copilot_chathub``): the connection's
normalizer, which reads both directions and keeps the invocation being answered (a
turn), and the protocol's own answers to a block. The hub protocol's records are read by
:mod:`addon.framing.signalr`; a known hub's dialect maps its payloads by overriding
:meth:`HubNormalizer.on_invoke` and :meth:`HubNormalizer.on_server`. Registers no dialect.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from addon.dialects import Dialect, Normalizer, Reading, RequestSummary, RequestView, json_strings
from addon.dialects.blocking import BlockedResponse, block_message, json_response
from addon.dialects.rpc import MESSAGE_VALUES, clean, kept_text, own_key_value, unread_finding
from addon.events import Event, Finding, Finish, ShownText, StreamError, TextDelta, TurnEnd
from addon.framing import Frame
from addon.framing.signalr import HubMessage, HubWriter, hub_message

#: What one ``signalr_unmapped`` finding keeps: targets named, strings quoted, their length.
_FINDING_TARGETS, _FINDING_STRINGS, _FINDING_CHARS = 8, 4, 120
_ENDED_KEPT = 16  # ended invocations remembered
#: Client records that carry text to the hub: invocations, and a client stream's items
#: and completion.
_CLIENT_TEXT = frozenset(("invocation", "stream_invocation", "stream_item", "completion"))
#: The hub protocol's own keys (a record's envelope), which are nobody's text.
_ENVELOPE = frozenset(
    ("type", "invocationId", "target", "arguments", "streamIds", "headers", "item", "result", "error", "allowReconnect")
)


#: Strings read of one hub message at most: far above a conversation's (Copilot sends a
#: few dozen); past them the message is one the filters cannot check whole.
MESSAGE_STRINGS = 100_000


def strings_of(value: Any, cut: list[str] | None = None, keys: list[str] | None = None) -> list[str]:
    """The strings of a hub message's payload, as sent but for the values of keys named
    like credentials (the client's own, as a header's: fingerprinted). The request
    filters read these; the record keeps them with credentials fingerprinted
    (:func:`~addon.dialects.rpc.kept_text`). Not cut: the filters must see all of a
    prompt or an answer (the reader bounds a record's size), but for strings nested
    deeper than 32 levels (the walk's bound), which ``cut`` gets noted (see
    :func:`~addon.dialects.json_strings`), strings past the first :data:`MESSAGE_STRINGS`
    of a message and values past the first :data:`~addon.dialects.rpc.MESSAGE_VALUES` (no
    client sends so many; past them reading one costs the event loop more than a tenth of
    a second). ``keys`` gets the objects' keys (for the filters alone: see
    :func:`~addon.dialects.json_strings`)."""
    return json_strings(
        value, limit=MESSAGE_STRINGS, cut=cut, max_values=MESSAGE_VALUES, value_of=own_key_value, keys=keys
    )


def user_doc(text: str | list[str], target: Any, **extra: Any) -> Reading:
    """The shared request shape of one client invocation: its prompt ``text``, or the
    strings of its arguments (:func:`strings_of`: one per line, kept as
    :func:`~addon.dialects.rpc.kept_text` keeps them)."""
    doc = Reading(messages=[])
    doc["messages"].append({"role": "user", "content": text if isinstance(text, str) else kept_text(doc, text)})
    if isinstance(target, str):
        doc["hub_target"] = target
    doc.update({k: v for k, v in extra.items() if v is not None})
    return doc


class HubNormalizer(Normalizer):
    """One SignalR connection, both directions: the invocation being answered (a turn),
    and what a block sends. Subclasses map a known hub's payloads (:meth:`on_server`,
    :meth:`on_invoke`)."""

    framing = "signalr_json"
    #: Whether the filters read the payloads' object keys: a hub nobody mapped may key a
    #: map by text; a mapped hub's keys are its schema (a rule naming ``message`` would
    #: block every message of Copilot's).
    reads_keys = True

    def __init__(self) -> None:
        self.writer: HubWriter = HubWriter()  # (MessagePack once the client's handshake names it)
        self.active: str | None = None  # the invocation whose answer is the current turn
        self.cancelled = False  # the client cancelled it
        self.failed = False  # the hub reported the turn's failure in its payload (a known hub's error item)
        self.unmapped_targets: list[str] = []
        self.unmapped_count = 0
        self.unmapped_strings: list[str] = []
        self.unread: list[str] = []  # what the bounds left out of the client message being read
        # invocations whose turn ended (the last few): what the hub still sends for one
        # (its answer to a CancelInvocation after a block ended the turn) is not a new turn's
        self.ended: deque[str] = deque(maxlen=_ENDED_KEPT)

    # -- client messages --------------------------------------------------------------------

    def on_client(self, frame: Frame) -> tuple[dict[str, Any], list[Finding]]:
        if not isinstance(frame, HubMessage):
            return {}, []
        message = frame.message
        if frame.event == "handshake":
            if message.get("protocol") == "messagepack":
                self.framing, self.writer.binary = "signalr_msgpack", True
            return {}, []
        self.unread = []
        doc: dict[str, Any] = {}
        if frame.event in ("invocation", "stream_invocation"):
            doc = self.on_invoke(frame)
            if doc and frame.id:
                self._open(frame.id)
        elif frame.event == "cancel_invocation" and frame.id and frame.id == self.active:
            self.cancelled = True
        if frame.event in _CLIENT_TEXT:
            # Every string of the record reaches the request filters, whatever the reading
            # mapped: a prompt's other keys, a client-to-server stream's items, telemetry.
            reading = doc if isinstance(doc, Reading) else Reading(doc)
            keys: list[str] | None = [] if self.reads_keys else None
            reading.unkept.extend(strings_of(message, self.unread, keys))
            if keys := [k for k in keys or () if k not in _ENVELOPE]:  # (a payload's keys may be data: read, not kept)
                reading.unkept.append("\n".join(keys))
            doc = reading
        # strings the reading left out: the message is unread (turns.UNREAD_MESSAGE), the failure policy decides
        return doc, [unread_finding(self.unread, "a client message")] if self.unread else []

    def on_invoke(self, frame: HubMessage) -> dict[str, Any]:
        """The request reading of a client invocation ({} for one that is no prompt);
        a non-empty reading of one with an id opens a turn. What :func:`strings_of` leaves
        out goes to :attr:`unread` (the message is then not read whole)."""
        message = frame.message
        return user_doc(strings_of(message.get("arguments"), self.unread), message.get("target"))

    def _open(self, invocation: str) -> None:
        """A new turn: the invocation ``invocation`` is being answered."""
        self.active, self.cancelled, self.failed = invocation, False, False
        if invocation in self.ended:  # (an id used again: M365 numbers every turn "0")
            self.ended.remove(invocation)
        self.unmapped_targets, self.unmapped_count, self.unmapped_strings = [], 0, []

    # -- server messages --------------------------------------------------------------------

    def on_event(self, event: Frame) -> list[Event]:
        if not isinstance(event, HubMessage) or (event.id and event.id in self.ended):
            return []
        return self.on_server(event)

    def on_server(self, frame: HubMessage) -> list[Event]:
        """Common events for one server record."""
        message = frame.message
        if frame.event == "handshake":
            error = message.get("error")
            return [StreamError("signalr_handshake", str(error))] if error is not None else []
        if frame.event == "stream_item":
            item = message.get("item")
            if frame.id == self.active and isinstance(item, str):
                return [TextDelta(item)] if item else []
            return self._unmapped(f"item of {frame.id or '?'}", item)
        if frame.event == "invocation":
            return self._unmapped(str(message.get("target"))[:80], message.get("arguments"))
        if frame.event == "completion":
            return self.on_completion(frame)
        if frame.event == "close":
            error = message.get("error")
            return [StreamError("signalr_close", str(error))] if error else []
        return []  # ping, ack, sequence; an unknown record is the reader's finding

    def on_completion(self, frame: HubMessage) -> list[Event]:
        """The Completion of an invocation: the turn's end when it is the active one."""
        message = frame.message
        error = message.get("error")
        out: list[Event] = []
        if error is not None and "result" in message:
            out.append(Finding("signalr_invalid", f"a Completion of {frame.id!r} with both a result and an error"))
        if frame.id != self.active or not frame.id:
            # another invocation's (a call the client made beside the turn's): not this turn's
            # outcome, though the client may show its error
            return [*out, ShownText(str(error), kind="error")] if error else out
        if error is not None:
            out.append(StreamError("signalr_completion", str(error)))
        elif isinstance(message.get("result"), str):
            out.append(TextDelta(message["result"]))
        elif message.get("result") is not None:
            out.extend(self._unmapped(f"result of {frame.id}", message["result"]))
        failed = error is not None or self.failed
        return [*out, *self.end_turn("error" if failed else "cancelled" if self.cancelled else "stop")]

    def end_turn(self, reason: str) -> list[Event]:
        """The events that close the active turn: its unmapped summary, stop reason, end."""
        if self.active is not None:
            self.ended.append(self.active)
        self.active = None
        return [*self.unmapped_finding(), Finish(reason), TurnEnd()]

    def unmapped_finding(self) -> list[Event]:
        """The one ``signalr_unmapped`` finding of what was read since the last (none if nothing)."""
        out: list[Event] = []
        if self.unmapped_count:
            strings = "; ".join(repr(s[:_FINDING_CHARS]) for s in self.unmapped_strings)
            out.append(
                Finding(
                    "signalr_unmapped",
                    f"{self.unmapped_count} unmapped records ({', '.join(self.unmapped_targets)}): {strings}",
                )
            )
        self.unmapped_targets, self.unmapped_count, self.unmapped_strings = [], 0, []
        return out

    def _unmapped(self, where: str, value: Any) -> list[Event]:
        """The strings of a payload nobody mapped: shown text, noted for the finding; what
        the walk's bound left out (nested deeper than 32 levels) is ``strings_unread``."""
        cut: list[str] = []
        # (the client shows these as they are: the filters must too)
        keys: list[str] | None = [] if self.reads_keys else None
        found = json_strings(value, limit=MESSAGE_STRINGS, cut=cut, max_values=MESSAGE_VALUES, keys=keys)
        self.unmapped_count += 1
        if where not in self.unmapped_targets and len(self.unmapped_targets) < _FINDING_TARGETS:
            self.unmapped_targets.append(where)
        room = _FINDING_STRINGS - len(self.unmapped_strings)
        if room > 0:  # (the finding is stored: credentials fingerprinted, by key name too)
            kept = json_strings(value, limit=room, max_values=MESSAGE_VALUES, value_of=own_key_value)
            self.unmapped_strings.extend(clean(s) for s in kept)
        shown: list[Event] = [ShownText(s, kind="unmapped") for s in found]
        if keys:  # (a map's keys may be data too)
            shown.append(ShownText("\n".join(keys), kind="unmapped"))
        return [unread_finding(cut, where), *shown] if cut else shown

    def on_end(self, cut: bool = False) -> list[Event]:
        out = self.unmapped_finding()
        if self.active is not None:
            out.append(Finding("signalr_missing_completion", f"invocation {self.active!r} had no Completion"))
        return out

    # -- blocks -----------------------------------------------------------------------------

    def ending(self, rule_id: str, reason: str) -> list[Frame]:
        if self.active is None:
            return []
        return [completion_error(self.active, block_message(rule_id, reason))]

    def refusal(self, frame: Frame, rule_id: str, reason: str) -> list[Frame]:
        if not frame.id:
            return []  # a non-blocking invocation: the protocol allows no answer to it
        return [completion_error(frame.id, block_message(rule_id, reason))]

    def upstream_cancel(self) -> list[Frame]:
        return [hub_message({"type": 5, "invocationId": self.active})] if self.active is not None else []


def completion_error(invocation: str, message: str) -> HubMessage:
    """A Completion that fails ``invocation`` with ``message``."""
    return hub_message({"type": 3, "invocationId": invocation, "error": message})


class HubDialect(Dialect):
    """What every SignalR dialect shares: the connection is the exchange, claimed by its
    handshake (never an HTTP request of its own)."""

    def matches(self, request: RequestView) -> bool:
        return False  # a WebSocket dialect: claimed by :meth:`websocket`, never by an HTTP request

    def summarize(self, body: Any, request: RequestView) -> RequestSummary:
        return RequestSummary(stream=True)

    def blocked_response(
        self, summary: RequestSummary, request_view: RequestView, rule_id: str, reason: str, streaming: bool
    ) -> BlockedResponse:
        """A refused upgrade: SignalR clients read a failed negotiation's JSON ``error``."""
        return json_response({"error": block_message(rule_id, reason)}, 403)
