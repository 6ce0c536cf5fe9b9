"""The WebSocket hooks (addon/mitm/websocket.py) driven by hand on mitmproxy's test flows:
what they keep of a long connection."""

from __future__ import annotations

import json

from mitmproxy.test import tflow
from mitmproxy.websocket import WebSocketMessage

from addon.mitm.content_filters import ContentFilters
from addon.mitm.hooks import ExchangeHooks
from addon.mitm.websocket import WebSocketHooks
from addon.record import ExchangeRecord

TEXT = 1  # the text opcode


class Store:
    instance = "test"

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def submit(self, record: ExchangeRecord) -> None:
        self.rows.append(record.to_row())


def test_a_long_session_does_not_keep_every_message_in_memory() -> None:
    """mitmproxy appends every message of a WebSocket to ``flow.websocket.messages`` for
    the connection's life; an hour of Realtime audio is hundreds of MB. The addon has read
    them into its records: the flow keeps only the latest, up to llm_audit_view_bytes."""
    store, filters = Store(), ContentFilters()
    ws_hooks = WebSocketHooks(store, filters, ExchangeHooks(store, filters))
    flow = tflow.twebsocketflow(messages=False)
    flow.request.path = "/v1/realtime?model=gpt-realtime"
    ws_hooks.websocket_start(flow)
    assert flow.websocket is not None
    audio = json.dumps({"type": "input_audio_buffer.append", "audio": "A" * 4000}).encode()
    for _ in range(5000):
        flow.websocket.messages.append(WebSocketMessage(TEXT, True, audio))
        ws_hooks.websocket_message(flow)
        assert flow.websocket.messages[-1].content == audio  # (what later addons read)
    assert sum(len(m.content) for m in flow.websocket.messages) <= ws_hooks.sizes.view_bytes
    ws_hooks.websocket_end(flow)
    assert store.rows[-1]["turn"] is None and store.rows[-1]["event_count"] == 5000
