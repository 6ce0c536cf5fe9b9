"""Any SignalR hub over WebSocket (dialect ``signalr``): hubs the project has no dialect for.

A connection is claimed by its first client message, the SignalR handshake
(:func:`addon.framing.signalr.handshake_framing`), on any path; a known hub's dialect
(Copilot's ChatHub) is tried first. Without a schema, what is read is what the hub
protocol itself says:

- a client Invocation or StreamInvocation with an ``invocationId`` opens a turn: its
  request reading is one ``user`` message of the strings of its arguments (bounded,
  credentials fingerprinted) and ``hub_target``; one without an id (no answer allowed)
  is read the same way for the request filters but opens no turn;
- server StreamItems of the turn's invocation that are strings are the answer's text,
  as is a string ``result`` of its Completion (a non-streamed invocation's answer); the
  strings of any other item, result or server invocation are shown text (the output
  filters check them) and one ``signalr_unmapped`` finding per turn names their targets;
- the turn's Completion ends it (``stop``, or ``error`` with a :class:`StreamError` when
  it carries one); a Close with an error is a :class:`StreamError`; pings, acks and
  sequence messages carry nothing.

A block answers in the protocol's own terms: a Completion with an error for the
invocation (a cut answer, or a refused request), and a CancelInvocation toward the hub.
The protocol state lives in the normalizer (:class:`HubNormalizer`, shared with the known
hubs' dialects), which reads both directions of the connection.
"""

from __future__ import annotations

from addon.dialects import Normalizer, RequestSummary, RequestView
from addon.dialects.hub import HubDialect, HubNormalizer
from addon.framing.signalr import handshake_framing


class SignalR(HubDialect):
    name = "signalr"

    def websocket(self, request: RequestView, first: bytes | None) -> str | None:
        return handshake_framing(first) if first is not None else None

    def normalizer(self, request: RequestSummary) -> Normalizer:
        return HubNormalizer()


DIALECT = SignalR()
