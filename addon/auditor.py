"""The per-exchange pipeline: response bytes in, a filled exchange record out.

Event streams are read as they pass:
bytes ─▶ Content-Encoding decoder ─▶ SSE parser ─▶ dialect normalizer ─▶ record
Any other body of an inference exchange (a JSON answer, an error, Gemini's streamed
JSON array) is forwarded as it arrives too, and a copy, bounded in size, is read whole
at the end: bytes ─▶ copy ─▶ decoder ─▶ normalizer ``on_body`` ─▶ record.

With output content filters, an :class:`~addon.output_gate.OutputGate` sits on the
event path: :meth:`StreamAuditor.feed` then returns only the bytes whose text the
filters have passed, and, when a filter blocks, the dialect's termination instead of the
rest (the proxy then ends the stream).

It is sans-IO (no mitmproxy, no database) so that it can be tested with plain bytes,
and it never lets an exception escape into the proxy: a failure of the auditor becomes
an ``audit_internal_error`` finding and the exchange's bytes keep flowing (with a gate,
the filter failure policy decides whether they still may).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from addon.decoding import Decoder, make_decoder
from addon.dialects import Dialect, Normalizer, RequestSummary, detect_response
from addon.dialects.blocking import FILTERED_CODE, block_message
from addon.events import Event, StreamEnd
from addon.output_gate import OutputGate
from addon.record import ExchangeRecord
from addon.sse import SSEEvent, SSEParser

log = logging.getLogger(__name__)

# How much of an unclaimed event stream is read looking for its first event before the
# auditor gives up and lets it pass uninspected.
SNIFF_LIMIT = 64 * 1024
# The largest non-stream body kept for reading at the end.
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024


class StreamAuditor:
    """Reads one streamed response body as it passes.

    With a ``normalizer`` the dialect is known from the request. Without one the
    auditor sniffs: the first SSE event decides, through the registry, whether the
    stream is inference traffic (``on_claim`` is then called to create the record).
    """

    def __init__(
        self,
        record: ExchangeRecord | None,
        normalizer: Normalizer | None,
        content_encoding: str | None,
        max_event_bytes: int,
        on_claim: Callable[[Dialect], tuple[ExchangeRecord, Normalizer]] | None = None,
        *,
        event_stream: bool = True,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        gate: OutputGate | None = None,
    ) -> None:
        self.record = record
        self.normalizer = normalizer
        self.on_claim = on_claim
        self.parser = SSEParser(max_event_bytes=max_event_bytes)
        self.event_stream = event_stream
        self.max_body_bytes = max_body_bytes
        self.body: bytearray | None = None if event_stream else bytearray()  # the raw copy
        self.decoder: Decoder | None = make_decoder(content_encoding)
        self.sniffed_bytes = 0  # decoded bytes read while no dialect has claimed the stream
        self.ignored = False  # sniffing decided this stream is not ours
        self.failed = False  # the auditor broke; bytes still pass
        self.too_large = False  # a non-stream body over max_body_bytes: passed unread
        self._reported_findings = 0
        self.gate = gate
        self.stopped = False  # a filter blocked: the stream is to end after what feed returned
        self.max_event_bytes = max_event_bytes
        if self.decoder is None and record is not None:
            record.add_finding("decode_failed", f"unsupported Content-Encoding {content_encoding!r}")
            if gate is not None:
                gate.unreadable(f"unsupported Content-Encoding {content_encoding!r}")

    @property
    def active(self) -> bool:
        return not (self.ignored or self.failed or self.decoder is None)

    def feed(self, chunk: bytes, now: float | None = None) -> bytes:
        """Inspect one chunk from the upstream; return the bytes the client gets now.

        Without a gate that is the chunk itself, at once.
        """
        record = self.record
        if record is not None:
            if record.first_chunk_at is None:
                record.first_chunk_at = now or time.time()
            record.bytes_from_upstream += len(chunk)
        if self.stopped:
            return b""
        gate = self.gate
        if gate is not None:
            gate.add_raw(chunk)
        if self.active:
            if self.body is not None:
                self._keep(chunk)
            else:
                self._inspect(chunk)
        out = chunk if gate is None else self._gated(gate.release())
        if record is not None:
            record.bytes_to_client += len(out)
        return out

    def finish(self) -> bytes:
        """The upstream's body is complete: the bytes the client still gets.

        For the stream callable's end-of-body call; :meth:`end` then settles the record.
        """
        if self.gate is None or self.stopped:
            return b""
        out = self._gated(self.gate.finish())
        if self.record is not None:
            self.record.bytes_to_client += len(out)
        return out

    def release(self) -> None:
        """The exchange is recorded: drop what it kept (the record and its text, the
        parser, the gate); anything fed later passes through untouched."""
        self.record = self.normalizer = self.gate = self.decoder = self.body = None
        self.parser = SSEParser()

    def _inspect(self, chunk: bytes) -> None:
        gate = self.gate
        try:
            data = self.decoder.decode(chunk)
            while data:
                self.sniffed_bytes += len(data)
                if gate is None:
                    self._dispatch(self.parser.feed(data))
                else:
                    gate.add_decoded(len(data))
                    self._frame(gate, data)
                data = self.decoder.decode(b"") if self.active else b""
        except Exception as e:  # noqa: BLE001 - the traffic must never see our bugs
            self._fail(e)

    def _frame(self, gate: OutputGate, data: bytes) -> None:
        """Parse event by event, so the gate knows where each event's bytes end."""
        framer = gate.framer
        if framer is None:  # the gate does not hold bytes back: parse as usual
            self._dispatch(self.parser.feed(data))
            return
        for piece, end in framer.feed(data):
            events = self.parser.feed(piece)
            if events:
                self._dispatch(events, end)
            else:  # a comment or a stray blank line: its bytes still go in order
                gate.on_event(None, (), end)
        if framer.pending > self.max_event_bytes:
            gate.unreadable(f"an event over {self.max_event_bytes} bytes cannot be checked")
            if gate.framer is None:  # let through unchecked (llm_filter_failure=open)
                self._dispatch(self.parser.feed(framer.rest()))

    def _gated(self, out: bytes, terminate: bool = True) -> bytes:
        """Take the gate's verdicts; once it blocks, end the stream with the termination."""
        gate = self.gate
        record = self.record
        if gate.verdicts:
            if record is not None:
                record.verdicts.extend(v.as_dict() for v in gate.verdicts)
            gate.verdicts.clear()
        if gate.blocked is None:
            return out
        self.stopped = True
        if record is not None:
            verdict = gate.blocked
            record.status, record.error_code = "blocked", FILTERED_CODE
            record.error_message = block_message(verdict.rule_id, verdict.reason)
        if not terminate:
            return out
        if not gate.split_raw:
            if record is not None:
                record.add_finding("termination_not_sent", "the response body is compressed")
            return out
        try:
            return out + gate.termination()
        except Exception as e:  # noqa: BLE001 - a clean end without the dialect's events still beats a hang
            self._fail(e)
            return out

    def end(self, cut_by_upstream: bool = False) -> None:
        """The body is over: flush the parser and run the dialect's end checks."""
        if self.too_large and not cut_by_upstream:
            self.record.apply(StreamEnd())  # HTTP says the body is whole; it was only not read
        if self.gate is not None and self.record is not None and self.gate.framer is not None:
            delivered = self.gate.delivered_text
            if delivered != (self.record.output_text or ""):
                self.record.delivered_text = delivered
        if self.stopped or not self.active:
            return  # (a stream a filter stopped did not end by itself: nothing to check)
        if self.body is not None:
            self._read_body()
            return
        try:
            self._dispatch(self.parser.end())
            self._collect_parser_findings()
            if self.record is not None and self.normalizer is not None:
                for ev in self.normalizer.on_end():
                    self.record.apply(ev)
                if self.parser.pending_event and not cut_by_upstream:
                    self.record.add_finding("sse_incomplete_event", "the body ended inside an event")
        except Exception as e:  # noqa: BLE001
            self._fail(e)

    def _keep(self, chunk: bytes) -> None:
        if len(self.body) + len(chunk) > self.max_body_bytes:
            self.record.add_finding("body_too_large", f"over {self.max_body_bytes} bytes; not read")
            self.body = None
            self.too_large = self.ignored = True
        else:
            self.body += chunk

    def _read_body(self) -> None:
        try:
            parts = [self.decoder.decode(bytes(self.body))]
            while parts[-1]:
                parts.append(self.decoder.decode(b""))
            events = self.normalizer.on_body(b"".join(parts), self.record.http_status or 0)
            for ev in events:
                self.record.apply(ev)
            if self.gate is not None:
                self.gate.on_body(events)
                self._gated(b"", terminate=False)  # the proxy replaces a blocked body whole
        except Exception as e:  # noqa: BLE001 - a body the decoder or the dialect cannot read
            self._fail(e)

    def _dispatch(self, events: list[SSEEvent], end: int = 0) -> None:
        """Normalize and record parsed events; with a gate, check them (``end``: where they end)."""
        gate = self.gate
        for event in events:
            if self.normalizer is None and not self._claim(event):
                return
            record = self.record
            record.event_count += 1
            common: list[Event] = self.normalizer.on_event(event)
            for ev in common:
                record.apply(ev)
            if gate is not None:
                gate.on_event(event, common, end)
        if self.normalizer is None and self.sniffed_bytes > SNIFF_LIMIT:
            self.ignored = True
        self._collect_parser_findings()

    def _claim(self, first_event: SSEEvent) -> bool:
        dialect = detect_response(first_event) if self.on_claim else None
        if dialect is None:
            self.ignored = True
            return False
        self.record, self.normalizer = self.on_claim(dialect)
        return True

    def _collect_parser_findings(self) -> None:
        findings = self.parser.findings
        if self.record is not None and len(findings) > self._reported_findings:
            for code, detail in findings[self._reported_findings :]:
                self.record.add_finding(code, detail)
            self._reported_findings = len(findings)

    def _fail(self, error: Exception) -> None:
        self.failed = True
        log.exception("llm-audit: inspecting the stream failed; it passes uninspected from here")
        detail = f"{type(error).__name__}: {error}"[:300]
        if self.record is not None:
            self.record.add_finding("audit_internal_error", detail)
        if self.gate is not None:
            self.gate.unreadable(f"the audit failed: {detail}")


def summary_into_record(record: ExchangeRecord, summary: RequestSummary) -> None:
    """Copy what the dialect read from the request body into the record."""
    record.request_model = summary.model
    record.user_id = summary.user_id
    record.session_id = summary.session_id
    record.request_id = summary.request_id
    record.task_id = summary.task_id
    record.stream_requested = summary.stream
    for finding in summary.findings:
        record.apply(finding)
