"""A WebSocket connection of a SignalR dialect run on plain bytes, for the unit tests.

It does what the proxy's WebSocket adapter does with the sans-IO parts, without
mitmproxy: detection by the first client message, one reader per direction, the
connection's one normalizer, one record per turn (a TurnEnd closes it).
"""

from __future__ import annotations

from typing import Any

from pipeline import comparable_row

from addon.auditor import summary_into_record
from addon.dialects import RequestView
from addon.dialects.registry import detect_websocket
from addon.events import Event, Finding, TurnEnd
from addon.framing import FRAMINGS, Frame
from addon.record import OUTCOME_COMPLETE, ExchangeRecord

LIMIT = 1 << 20


def view(path: str, query: str = "") -> RequestView:
    return RequestView("GET", path, query, {"upgrade": "websocket"})


class Connection:
    """One connection: feed it client and server messages; read its turns' rows."""

    def __init__(self, request: RequestView, first: bytes, limit: int = LIMIT) -> None:
        detected = detect_websocket(request, None) or detect_websocket(request, first)
        assert detected is not None, "no dialect claimed the connection"
        self.dialect, self.framing = detected
        framing = FRAMINGS[self.framing]
        self.client = framing.reader(limit, limit, {})
        self.server = framing.reader(limit, limit, {})
        self.summary = self.dialect.summarize(None, request)
        self.normalizer = self.dialect.normalizer(self.summary)
        self.rows: list[dict[str, Any]] = []
        self.events: list[Event] = []
        self.docs: list[dict[str, Any]] = []
        self.client_frames: list[Frame] = []
        self.record = self._record()
        self.send(first)

    def _record(self) -> ExchangeRecord:
        record = ExchangeRecord(dialect=self.dialect.name, streamed=True, http_status=101)
        summary_into_record(record, self.summary)
        return record

    def send(self, data: bytes) -> list[dict[str, Any]]:
        """A client message: the request readings of its records."""
        docs = []
        for frame in self.client.feed(data):
            self.client_frames.append(frame)
            doc, findings = self.normalizer.on_client(frame)
            for finding in findings:
                self.record.apply(finding)
            if doc:
                docs.append(doc)
                self.record.request_body = doc
        self._reader_findings(self.client)
        self.docs.extend(docs)
        return docs

    def receive(self, data: bytes) -> list[Event]:
        """A server message: the events of its records, applied to the turn's record."""
        out: list[Event] = []
        for frame in self.server.feed(data):
            for event in self.normalizer.on_event(frame):
                out.append(event)
                self.record.event_count += 1
                self.record.apply(event)
                if isinstance(event, TurnEnd):
                    self._close_turn()
        self._reader_findings(self.server)
        self.events.extend(out)
        return out

    def close(self) -> list[dict[str, Any]]:
        """The connection is over: the unfinished turn's record, if it read anything."""
        self.server.end()
        self.client.end()
        self._reader_findings(self.server)
        self._reader_findings(self.client)
        for event in self.normalizer.on_end():
            self.record.apply(event)
        if self.record.request_body is not None or self.record.choices or self.record.findings:
            self._close_turn()
        return self.rows

    def _reader_findings(self, reader: Any) -> None:
        for code, detail in reader.findings:
            self.record.apply(Finding(code, detail))
        reader.findings.clear()

    def _close_turn(self) -> None:
        self.record.finish(OUTCOME_COMPLETE)
        self.rows.append(comparable_row(self.record))
        self.record = self._record()
