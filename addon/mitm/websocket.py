"""The WebSocket addon: mitmproxy's WebSocket hooks, which turn each inference
connection into its turn records and carry out what the content filters decide.

mitmproxy hands a WebSocket to addons as messages (``websocket_start``,
``websocket_message`` for every whole message of either side, ``websocket_end``),
never through a stream callable. For each connection:

1. ``websocket_start``: the dialect registry is asked by the upgrade request (path,
   query, ``Sec-WebSocket-Protocol``); a connection no dialect claims by it waits for
   its first client message (the SignalR handshake names the hub protocol), and one that
   nothing claims then is let go;
2. ``websocket_message``: the message goes to the connection's sans-IO
   :class:`~addon.connection_auditor.ConnectionAuditor`, whose :class:`Relay` says what
   becomes of it: on unchanged (always, without content filters), or dropped and what
   goes in its place injected in order, refusals and cancels sent back, the connection
   closed with a code;
3. ``websocket_end``: the turn in progress is recorded as cut and the connection's own
   record says how it ended.

Order. mitmproxy sends an injected message after the hook that injected it returns and
after the messages it had already read; so while injected messages of a direction are on
their way, later messages of that direction are dropped and injected behind them too.
The addon knows its own injections when they pass the hook again by their content.
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from mitmproxy import http
from mitmproxy.addonmanager import Loader
from mitmproxy.websocket import WebSocketMessage

from addon.connection_auditor import ConnectionAuditor, Out, Relay
from addon.dialects import Dialect, RequestSummary, RequestView
from addon.dialects.registry import detect_websocket
from addon.filters.api import Verdict
from addon.filters.engine import FilterSet
from addon.framing import FRAMINGS
from addon.mitm import early_end
from addon.mitm.content_filters import ContentFilters, check_message
from addon.mitm.flow_record import Line, detect_by_line, line_views, response_into_record, start_record
from addon.mitm.hooks import ExchangeHooks
from addon.mitm.store import AuditStore
from addon.record import ExchangeRecord
from addon.turns import Turns

log = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class Sniffing:
    """No dialect claimed the connection by its upgrade: its first client message decides."""

    view: RequestView


@dataclass(slots=True)
class Live:
    """A connection being audited."""

    auditor: ConnectionAuditor
    # our injected messages on their way, per direction (True: from the client)
    ours: dict[bool, deque[bytes]] = field(default_factory=lambda: {True: deque(), False: deque()})
    closing: bool = False  # the proxy closed it
    kept: int = 0  # bytes of the messages mitmproxy keeps on the flow for its views


class WebSocketHooks:
    """Audits the WebSocket connections a dialect claims. ``sizes`` holds the size
    options (the exchange hooks own them)."""

    def __init__(self, store: AuditStore, filters: ContentFilters, sizes: ExchangeHooks) -> None:
        self.store, self.filters, self.sizes = store, filters, sizes
        self.connections: dict[str, Sniffing | Live] = {}

    def load(self, loader: Loader) -> None:
        early_end.install_websocket_close()
        early_end.install_websocket_fragments()
        early_end.install_websocket_inflate_bound()

    # -- hooks ------------------------------------------------------------------------------

    def websocket_start(self, flow: http.HTTPFlow) -> None:
        try:
            lines = line_views(flow.request)
            found = detect_by_line(lines, lambda view: detect_websocket(view, None))
            if found is None:
                self.connections[flow.id] = Sniffing(lines[0][0])
            else:
                (dialect, framing), line = found
                self.connections[flow.id] = self._start(flow, dialect, framing, line)
        except Exception:  # auditing must never break a connection
            log.exception("llm-audit: failed to inspect a WebSocket; it is not audited")

    def websocket_message(self, flow: http.HTTPFlow) -> None:
        try:
            self._message(flow)
        except Exception:  # auditing must never break a connection
            log.exception("llm-audit: failed to inspect a WebSocket message")

    def websocket_end(self, flow: http.HTTPFlow) -> None:
        state = self.connections.pop(flow.id, None)
        if not isinstance(state, Live):
            return
        try:
            ws = flow.websocket
            by_client = None if state.closing or ws is None else ws.closed_by_client
            code = ws.close_code if ws is not None else None
            state.auditor.closed(code, (ws.close_reason or "") if ws is not None else "", by_client)
        except Exception as e:  # the record is written whatever happens
            log.exception("llm-audit: failed to settle a WebSocket")
            state.auditor.connection.add_finding("audit_internal_error", f"{type(e).__name__}: {e}"[:300])
        self.store.submit(state.auditor.connection)

    def done(self) -> None:
        """Submit the connections still open as cut off (the store's ``done`` writes them)."""
        for state in self.connections.values():
            if isinstance(state, Live):
                auditor = state.auditor
                for record in (auditor.connection, *([auditor.turns.record] if auditor.turns.pending else [])):
                    record.add_finding("proxy_shutdown", "the proxy stopped during the connection")
                auditor.closed(1001, "the proxy stopped", None)
                self.store.submit(state.auditor.connection)
        self.connections.clear()

    # -- the connection ---------------------------------------------------------------------

    def _start(self, flow: http.HTTPFlow, dialect: Dialect, framing_name: str, line: Line | None = None) -> Live:
        """Open the connection's record and its first turn's, and its auditor."""
        connection, summary = self._record(flow, dialect, line)
        first, _ = self._record(flow, dialect, line)
        turns = Turns(first, flow.id, self.store.submit)
        framing = FRAMINGS[framing_name]
        auditor = ConnectionAuditor(
            framing,
            dialect.normalizer(summary),
            functools.partial(dialect.normalizer, summary),
            turns,
            connection,
            max_event_bytes=self.sizes.max_event_bytes,
            max_record_bytes=self.sizes.max_record_bytes,
            filters=self.filters.current,
            check=functools.partial(_check, dialect, summary),
        )
        self.store.submit(connection)  # the write-ahead connection record (in_progress)
        return Live(auditor)

    def _record(
        self, flow: http.HTTPFlow, dialect: Dialect, line: Line | None
    ) -> tuple[ExchangeRecord, RequestSummary]:
        record, summary = start_record(flow, dialect, self.store.instance, line=line)
        if flow.response is not None:
            response_into_record(record, flow.response)
        record.streamed = True
        record.connection_id = flow.id
        return record, summary

    def _message(self, flow: http.HTTPFlow) -> None:
        state = self.connections.get(flow.id)
        ws = flow.websocket
        if state is None or ws is None or not ws.messages:
            return
        message = ws.messages[-1]
        if isinstance(state, Sniffing):
            found = detect_websocket(state.view, message.content) if message.from_client else None
            if found is None:  # (a protocol of ours speaks first from the client)
                del self.connections[flow.id]
                return
            state = self.connections[flow.id] = self._start(flow, *found)
        self._bound_kept(state, ws.messages)
        side = message.from_client
        ours = state.ours[side]
        if message.injected and ours and ours[0] == message.content:
            ours.popleft()  # one of ours, on its way
            return
        auditor = state.auditor
        relay = (
            auditor.from_client(message.content, message.is_text)
            if side
            else auditor.from_server(message.content, message.is_text)
        )
        self._carry_out(flow, state, message, relay)

    def _carry_out(self, flow: http.HTTPFlow, state: Live, message: WebSocketMessage, relay: Relay) -> None:
        """Send what the relay says, in order."""
        side = message.from_client
        if relay.onward is not None or state.ours[side]:
            message.drop()
            onward: list[Out] = relay.onward if relay.onward is not None else [(message.content, message.is_text)]
            for content, text in onward:
                self._inject(flow, state, side, content, text)
        for content, text in relay.back:
            self._inject(flow, state, not side, content, text)
        if relay.close is not None and not state.closing:
            state.closing = True
            early_end.close_websocket(flow, *relay.close)

    def _bound_kept(self, state: Live, messages: list[WebSocketMessage]) -> None:
        """mitmproxy keeps every message of a WebSocket flow for its views for as long as
        the flow lives: an hour of a voice session is hundreds of megabytes. Keep the
        latest ones, up to ``llm_audit_view_bytes`` (the same bound as for a streamed
        body's copy): older ones are dropped (down to half of it, so that this is rare)."""
        state.kept += len(messages[-1].content)
        limit = self.sizes.view_bytes
        if state.kept <= limit:
            return
        drop = 0
        while drop < len(messages) - 1 and state.kept > limit // 2:
            state.kept -= len(messages[drop].content)
            drop += 1
        del messages[:drop]

    @staticmethod
    def _inject(flow: http.HTTPFlow, state: Live, from_client: bool, content: bytes, text: bool) -> None:
        """Send ``content`` on as a message of the side ``from_client`` names."""
        from mitmproxy import ctx

        state.ours[from_client].append(content)
        ctx.master.commands.call("inject.websocket", flow, not from_client, content, text)


def _check(
    dialect: Dialect, summary: RequestSummary, filters: FilterSet, record: ExchangeRecord, doc: dict[str, Any]
) -> Verdict | None:
    return check_message(filters, dialect, summary, record, doc)
