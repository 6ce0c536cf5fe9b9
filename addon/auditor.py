"""The per-exchange pipeline: response bytes in, a filled exchange record out.

Bodies are read as they pass, by the reader of the exchange's framing
(:mod:`addon.framing`: an event stream, Gemini's streamed JSON array, a whole body):
bytes ─▶ Content-Encoding decoder ─▶ framing reader ─▶ dialect normalizer ─▶ record.
A streamed framing's frames go to the normalizer's ``on_event`` as they complete; a
whole body (a JSON answer, an error) is kept by its reader, bounded by the record cap,
and read at the end by the normalizer's ``on_body``.

What one exchange may cost is bounded. The record keeps at most ``max_record_bytes`` of
content (:class:`~addon.record.ExchangeRecord` counts the rest; a SHA-256 of the raw
upstream bytes is kept, cheaply, so that what was not kept can still be identified). A
compressed body is decoded in slices: per stream-callable call at most ``CALL_SECONDS``
of decoding and parsing, the rest waits as encoded bytes (a backlog) for the next call
or, once the body has ended, for :meth:`StreamAuditor.drain` in slices the proxy
schedules on the event loop; and per exchange at most what :data:`DECODE_BUDGET`
allows, after which inspection stops (finding ``inspection_stopped``) while the bytes
keep passing unchanged. Neither changes what is read, only when; nor does reading a
stream that nothing holds back in runs of raw chunks (:data:`READ_RUN`).

With output content filters, an :class:`~addon.output_gate.OutputGate` sits on the
event path: :meth:`StreamAuditor.feed` then returns only the bytes whose text the
filters have passed, and, when a filter blocks, the dialect's termination instead of the
rest (the proxy then ends the stream). The auditor reads a chunk through to the record
first, then hands it to the gate in one call (the raw bytes, their decoded size, the
frames with their events and the reader's end offsets): one hand-off per chunk. Filters
that only flag hold nothing back: their gate is handed what was read, a run at a time,
and the chunks go to the client as they came.

It is sans-IO (no mitmproxy, no database) so that it can be tested with plain bytes,
and it never lets an exception escape into the proxy: a failure of the auditor becomes
an ``audit_internal_error`` finding and the exchange's bytes keep flowing (with a gate,
the filter failure policy decides whether they still may).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping

from addon.decoding import DecodeBudget, DecodeError, Decoder, make_decoder
from addon.dialects import Dialect, Normalizer, RequestSummary
from addon.dialects.blocking import block_message
from addon.dialects.registry import detect_response
from addon.events import Event, StreamEnd, TextDelta, TurnEnd
from addon.framing import Frame, Framing, Message, select
from addon.framing.whole import Body
from addon.output_gate import Framed, OutputGate
from addon.record import DEFAULT_MAX_RECORD_BYTES, ExchangeRecord
from addon.redact import redact_values

log = logging.getLogger(__name__)

# How much of an unclaimed event stream is read looking for its first event before the
# auditor gives up and lets it pass uninspected.
SNIFF_LIMIT = 64 * 1024
# Decoded bytes read from the decoder at a time, and the time one stream-callable call
# may spend decoding and parsing a compressed body (checked after every slice): what
# another flow can wait for this one.
SLICE = 16 * 1024
CALL_SECONDS = 0.005
# What one exchange may decode: a compressed body decoding to more than 100 times its
# size (past the first 16 MiB), or to more than 1 GiB, is a bomb, not an answer.
DECODE_BUDGET = DecodeBudget(max_decoded=1024 * 1024 * 1024, ratio=100, floor=16 * 1024 * 1024)
# Encoded bytes allowed to wait for decoding: an upstream sending faster than the
# auditor decodes stops being inspected rather than being held in memory.
MAX_BACKLOG = 16 * 1024 * 1024
# A stream nothing holds back (no output filter that can block, no turns) is read in
# runs of about this many bytes rather than chunk by chunk: its bytes pass at once either
# way, and nothing reads the record (or a flag's verdict) before the body ends, while a
# run of events costs less to read than its events one call at a time (the reader's and
# the dispatch's fixed cost per call, paid once a run: in process 4.0 against 5.7 µs per
# small delta; a gate that only flags checks a run's text as one piece). What a run holds is
# read when it fills, when the body ends (in the response hook, before mitmproxy's later
# addons see the flow: the last run of the bench's paced stream took 0.1 ms) or when it
# is cut (:meth:`StreamAuditor.catch_up`), so the record holds the same; only when the
# reading happens changes (and with it, as with where chunks were cut, the order of the
# reader's findings among the dialect's).
READ_RUN = 32 * 1024
# ... or of this many chunks: an upstream sending tiny chunks must not make a flow hold
# thousands of objects (16,384 two-byte chunks held 0.7 MB).
READ_RUN_CHUNKS = 256


class StreamAuditor:
    """Reads one streamed response body as it passes.

    With a ``normalizer`` the dialect is known from the request. Without one the
    auditor sniffs: the first SSE event decides, through the registry, whether the
    stream is inference traffic (``on_claim`` is then called to create the record).
    ``framing`` is the proxy's choice (:func:`addon.framing.select`); without it,
    ``event_stream`` says whether the body is an event stream, and the dialect's expected
    framing and the record's status decide otherwise.
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
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        gate: OutputGate | None = None,
        framing: Framing | None = None,
        headers: Mapping[str, str] | None = None,
        on_turn_end: Callable[[ExchangeRecord], ExchangeRecord] | None = None,
    ) -> None:
        self.record = record
        self.on_turn_end = on_turn_end
        self.normalizer = normalizer
        self.on_claim = on_claim
        self.framing = framing or _framing_of(event_stream, normalizer, record)
        self.headers: Mapping[str, str] = headers if headers is not None else {}
        self.reader = self.framing.reader(max_event_bytes, max_record_bytes, self.headers)
        self.max_record_bytes = max_record_bytes
        if record is not None:
            record.content_limit = max_record_bytes
        self.decoder: Decoder | None = make_decoder(content_encoding)
        self.sha256 = hashlib.sha256()  # of every raw byte from the upstream
        self.sniffed_bytes = 0  # decoded bytes read while no dialect has claimed the stream
        self.ignored = False  # sniffing decided this stream is not ours
        self.failed = False  # the auditor broke; bytes still pass
        self.too_large = False  # a non-stream body over max_record_bytes: passed unread
        self.halted: str | None = None  # why inspection stopped (a bomb, bad encoding); bytes still pass
        self._over_budget = False  # halted by the decode budget (reported at the end, with the sizes)
        self._limits_reported = False
        self._read_ahead = False  # read_whole ran: a whole body is read, up to the gate's check of
        self._body_events: list[Event] | None = None  # these events (None: nothing to check)
        self._body_is_answer = False  # the whole body is a 2xx answer with content (see OutputGate.on_body)
        self.gate = gate
        if gate is not None and on_turn_end is not None:
            gate.deliver_on_send = False  # (each turn's delivered text is noted at its end: _close_turn)
        self.stopped = False  # a filter blocked: the stream is to end after what feed returned
        self.ending_trailers: list[tuple[str, str]] = []  # and with these HTTP trailers (gRPC's status)
        self.max_event_bytes = max_event_bytes
        # What the gate has not been handed yet (see _to_gate), and what it released.
        self._raw_chunk: bytes | None = None
        self._decoded_size = 0
        self._framed: list[Framed] = []
        self._released: list[bytes] = []
        self._counted = 0  # bytes of _released already counted into a turn's record
        # Raw chunks of a run not read yet (see READ_RUN), and their size.
        self._run: list[bytes] = []
        self._run_size = 0
        if self.decoder is None and record is not None:
            coding = redact_values(content_encoding)  # (a header's value: it may hold a key)
            record.add_finding("decode_failed", f"unsupported Content-Encoding {coding!r}")
            self._unreadable(f"unsupported Content-Encoding {coding!r}")

    @property
    def active(self) -> bool:
        return not (self.ignored or self.failed or self.halted or self.decoder is None)

    @property
    def pending(self) -> bool:
        """Encoded bytes wait to be decoded and read (see :meth:`drain`)."""
        decoder = self.decoder
        return self.active and decoder is not None and decoder.encoded and not decoder.drained()

    def feed(self, chunk: bytes, now: float | None = None) -> bytes:
        """Inspect one chunk from the upstream; return the bytes the client gets now.

        Without a gate, or with one that only flags, that is the chunk itself, at once.
        A stream nothing holds back is read in runs (:data:`READ_RUN`): its record lags
        by up to a run until :meth:`catch_up` or :meth:`end`.
        """
        record = self.record
        gate = self.gate
        passes = gate is None or gate.flags_only  # the chunk goes as it came: nothing is held back
        if record is not None:
            if record.first_chunk_at is None:
                record.first_chunk_at = now or time.time()
            record.bytes_from_upstream += len(chunk)
            if passes and not self.stopped:  # (counted now: a turn it ends is written before feed returns)
                record.bytes_to_client += len(chunk)
            self.sha256.update(chunk)  # (before any claim too: the hash covers the whole body)
        elif self.on_claim is not None:
            self.sha256.update(chunk)
        if self.stopped:
            return b""
        self._raw_chunk = None if passes else chunk
        decoder = self.decoder
        if decoder is not None and not (self.ignored or self.failed or self.halted):  # (self.active)
            if decoder.encoded:
                decoder.feed(chunk)
                # A gate holding bytes needs each chunk read before the next one (the
                # bytes it releases are counted per raw chunk): it reads within the
                # exchange's decode budget, not per call.
                self._work(None if gate is not None and gate.holds else CALL_SECONDS)
            elif passes and self.on_turn_end is None and self.normalizer is not None:
                run = self._run
                run.append(chunk)
                self._run_size += len(chunk)
                if self._run_size >= READ_RUN or len(run) >= READ_RUN_CHUNKS:
                    self._read_run()
            else:
                self._read(chunk)
        if gate is None:
            if record is None and self.record is not None:  # (claimed by this chunk's first event)
                self.record.bytes_to_client += len(chunk)
            return chunk
        out = self._gated(gate, self._released_now(), terminate=self.framing.streamed)  # (a whole one is replaced)
        if passes:  # (the gate took what was read; the chunk goes after what it had)
            return out + chunk
        self._count_sent(out, None if gate.split_raw else record)
        return out

    def catch_up(self) -> None:
        """Read the chunks of the current run: the record then holds everything that
        came (for an exchange cut before its end; :meth:`end` does it itself)."""
        if self._run:
            self._read_run()

    def last_checks(self) -> None:
        """The exchange is over and all of it that will be read is read: a gate that holds
        nothing (it only flags, or stopped holding under ``failure=open``) checks what it
        was not handed yet and the end of the text (a match only the end decides: a keyword
        as the last word, an address at the very end), unless the body's end did it
        (:meth:`finish`: a second check would ask user filters again). Its verdicts go into the record; a block
        found now stops nothing (the client had the text), so it is a verdict only.
        :meth:`end` does it itself. Never raises."""
        gate = self.gate
        if gate is None or gate.holds or gate.ended:
            return
        try:
            self._to_gate()
            gate.finish()  # (what bytes it gives back are not sent: the exchange is over)
            self._take_verdicts(gate)
        except Exception as e:  # noqa: BLE001 - the traffic must never see our bugs
            self._fail(e)

    def end_idle_turn(self, reason: str) -> None:
        """The proxy ends the current turn of a stream of turns (``reason``: nothing
        arrived for a while; its end marker may have moved): the turn's record is written
        complete, with the finding ``turn_idle_timeout``, and the gate's verdicts, the
        bytes and the text sent so far are the turn's.

        A gate that holds nothing back first checks the turn's text to its end, as a
        marker would (a match only the end decides). One that may block keeps holding the
        turn's last text: the idle end is a guess (the answer may go on after a long
        pause, and a word cut across the pause must still be seen whole; the proxy could
        not send what a check releases until the next chunk anyway).

        A turn whose compressed bytes still wait to be read is not over: a slice of them
        is read (``CALL_SECONDS``, on the event loop) and the turn ends at a later call,
        once they are. Never raises."""
        try:
            if self.on_turn_end is None or self.record is None:
                return
            gate = self.gate
            self._work(CALL_SECONDS)
            if self.pending:
                return
            if gate is not None and self.active and not self.stopped:
                self._to_gate()
                if not gate.holds:
                    gate.end_turn()
                self._close_turn(gate)
            record = self.record
            if record is not None:
                record.add_finding("turn_idle_timeout", reason)
                record.apply(TurnEnd())  # complete as far as it came, with the finding
                self.record = self.on_turn_end(record)
        except Exception as e:  # noqa: BLE001 - the traffic must never see our bugs
            self._fail(e)

    def _read_run(self) -> None:
        run = self._run
        data = run[0] if len(run) == 1 else b"".join(run)
        self._run, self._run_size = [], 0
        if self.active:
            self._read(data)

    def drain(self, seconds: float = CALL_SECONDS) -> bool:
        """Work off the backlog for about ``seconds``; whether some of it is left."""
        self._work(seconds)
        self._to_gate()  # (a gate that holds bytes leaves no backlog: nothing is released here)
        return self.pending

    def finish(self) -> bytes:
        """The upstream's body is complete: the bytes the client still gets.

        For the stream callable's end-of-body call; :meth:`end` then settles the record.
        """
        gate = self.gate
        if gate is None or self.stopped or gate.flags_only:
            return b""  # (a gate that only flags holds nothing: its last checks come with end())
        self._work(None)  # the gate decides on everything before the body may end
        out = self._gated(gate, self._released_now() + gate.finish())
        self._count_sent(out)
        return out

    def release(self) -> None:
        """The exchange is recorded: drop what it kept (the record and its text, the
        reader, the gate); anything fed later passes through untouched."""
        self.record = self.normalizer = self.gate = self.decoder = None
        self._run, self._run_size = [], 0
        self._fresh_reader()

    def _fresh_reader(self) -> None:
        """A reader holding nothing (and keeping no whole body): what it held is let go,
        its findings taken into the record first."""
        self._collect_reader_findings()
        self.reader = self.framing.reader(self.max_event_bytes, 0, self.headers)

    def _work(self, seconds: float | None) -> None:
        """Decode and read the backlog, slice by slice, for up to ``seconds`` (None: all
        of it, within the exchange's decode budget). A read that decodes nothing (empty
        gzip members, zstd frames) is bounded too and may leave work: the loop goes on
        while the decoder is not drained, checking the time after every read."""
        decoder = self.decoder
        if not self.pending or decoder is None:
            return
        deadline = None if seconds is None else time.perf_counter() + seconds
        try:
            for data in decoder.slices(SLICE):
                if data:
                    reason = DECODE_BUDGET.exceeded(decoder.decoded, decoder.taken)
                    if reason is not None:
                        self._halt("inspection_stopped", reason)
                        return
                    self._read(data)
                if not self.active or (deadline is not None and time.perf_counter() >= deadline):
                    break
            if self.pending and decoder.backlog > MAX_BACKLOG:
                self._halt("inspection_stopped", f"over {MAX_BACKLOG} encoded bytes wait to be decoded")
        except DecodeError as e:
            self._halt("decode_failed", str(e)[:300])
        except Exception as e:  # noqa: BLE001 - the traffic must never see our bugs
            self._fail(e)

    def _read(self, data: bytes) -> None:
        """Read decoded bytes: the reader keeps a whole body, or frames a stream."""
        gate = self.gate
        try:
            if not self.framing.streamed:
                self.reader.feed(data)
                self._check_reader()
                return
            self.sniffed_bytes += len(data)
            if gate is None:
                self._dispatch(self.reader.feed(data))
            else:
                self._decoded_size += len(data)
                self._frame(gate, data)
            self._check_reader()  # (a gate holding bytes may have had no frame: its findings are taken here)
        except Exception as e:  # noqa: BLE001 - the traffic must never see our bugs
            self._fail(e)

    def _check_reader(self) -> None:
        """Take the reader's findings; a body it cannot read is passed (or, held, judged) unread."""
        self._collect_reader_findings()
        reason = self.reader.unreadable
        if reason is None or self.ignored:
            return
        if not self.framing.streamed:  # a whole body over the record cap
            self.too_large = self.ignored = True
            # Not read, so not checked: one held for blocking filters goes to the failure
            # policy (it went out unchecked: a word past the cap reached the client).
            self._unreadable(f"the body cannot be inspected: {reason}")
        elif self.gate is not None:
            self._unreadable(f"the body cannot be inspected: {reason}")
            self.ignored = True

    def _halt(self, code: str, reason: str) -> None:
        """Stop inspecting: the rest passes unread (with a gate, the failure policy decides)."""
        self.halted = reason
        if self.record is not None and code == "decode_failed":
            self.record.add_finding(code, reason)
        self._over_budget = code == "inspection_stopped"
        gate, raw = self.gate, self._raw_chunk
        if gate is not None and gate.holds and not gate.split_raw and raw is not None:
            # The compressed chunk in hand did not decode whole: handed over now, it would
            # count as checked (all it decoded to was) and go out. The policy decides first.
            self._raw_chunk = None
            self._unreadable(f"the body cannot be inspected: {reason}")
            if gate.blocked is None:  # (open: it goes, unchecked)
                self._raw_chunk = raw
        else:
            self._unreadable(f"the body cannot be inspected: {reason}")
        self._fresh_reader()

    def _frame(self, gate: OutputGate, data: bytes) -> None:
        """Read frame by frame, so the gate knows where each frame's bytes end."""
        reader = self.reader
        if not gate.holds:  # the gate does not hold bytes back: read as usual
            self._dispatch(reader.feed(data))
            return
        for frame, end in reader.feed_bounded(data):
            if frame is not None:
                self._dispatch((frame,), end)
            else:  # bytes without a frame (an SSE comment): they still go in order
                self._framed.append((None, (), end, None))
        if reader.held > self.max_event_bytes:
            self._unreadable(f"an event over {self.max_event_bytes} bytes cannot be checked")
            if not gate.holds:  # let through unchecked (llm_filter_failure=open)
                self._dispatch(reader.unbound())

    def _to_gate(self) -> None:
        """Hand the gate what came since the last hand-off (the raw chunk, the size it
        decoded to, the frames read with their events and ends); keep what it releases."""
        gate = self.gate
        if gate is None or (self._raw_chunk is None and not self._decoded_size and not self._framed):
            return
        raw, framed, decoded = self._raw_chunk, self._framed, self._decoded_size
        self._raw_chunk, self._framed, self._decoded_size = None, [], 0
        released = gate.feed(raw, decoded, framed)
        if released:
            self._released.append(released)

    def _released_now(self) -> bytes:
        """What the gate released for the client, the current chunk handed to it first."""
        self._to_gate()
        return self._take_released()

    def _take_released(self) -> bytes:
        out, self._released = b"".join(self._released), []
        return out

    def _count_sent(self, out: bytes, arrival: ExchangeRecord | None = None) -> None:
        """Count what a call sends to the client, less what a turn that ended in it took
        into its own record (:meth:`_close_turn`); ``arrival``: the record the rest goes
        to instead of the current one (a compressed chunk goes whole: all of it to the
        turn it came in, as its ``bytes_from_upstream``; the proxy writes the turns a
        chunk ended only after this, :meth:`~addon.turns.Turns.hold`)."""
        record = arrival if arrival is not None else self.record
        if record is not None:
            record.bytes_to_client += len(out) - self._counted
        self._counted = 0

    def _unreadable(self, reason: str) -> None:
        """The output cannot be checked from here: the gate's failure policy decides, after
        it has checked every frame read before (in order, as they came)."""
        if self.gate is not None:
            self._to_gate()
            self.gate.unreadable(reason)

    def _gated(self, gate: OutputGate, out: bytes, terminate: bool = True) -> bytes:
        """Take the gate's verdicts; once it blocks, end the stream with the termination
        (once: a turn's end may have settled the block before the chunk's end, and a
        stream the proxy already ended gets no second ending)."""
        self._take_verdicts(gate)
        if gate.blocked is None or self.stopped:
            return out
        record = self.record
        self.stopped = True
        verdict = gate.blocked
        message = block_message(verdict.rule_id, verdict.reason)
        if record is not None and gate.holds:  # (a turn's record may be written before the body ends)
            self._note_delivered(gate, record)
        if not terminate:  # a held body: the proxy replaces it whole and says what the client got
            if record is not None:
                record.block(message)
            return out
        if not gate.split_raw:
            if record is not None:
                record.block(message, [])
                record.add_finding("termination_not_sent", "the response body is compressed")
            return out
        try:
            ending = gate.termination()
            self.ending_trailers = gate.termination_trailers()
        except Exception as e:  # noqa: BLE001 - a clean end without the dialect's events still beats a hang
            self._fail(e)
            if record is not None:
                record.block(message, [])
            return out
        if record is not None:  # (no ending: the client already had the upstream's own end)
            record.block(message, [gate.forwarded.filter_stop_reason] if ending else None)
        return out + ending

    @staticmethod
    def _note_delivered(gate: OutputGate, record: ExchangeRecord) -> None:
        """The text the client got, when a filter made it differ from the output."""
        delivered = gate.delivered_text
        if delivered != (record.output_text or ""):
            record.delivered_text = delivered

    def _take_verdicts(self, gate: OutputGate) -> None:
        if gate.verdicts:
            if self.record is not None:
                self.record.verdicts.extend(v.as_dict() for v in gate.verdicts)
            gate.verdicts.clear()

    def end(self, cut_by_upstream: bool = False, trailers: Iterable[tuple[str, str]] = ()) -> None:
        """The body is over: read what waits, flush the parser, read the HTTP trailers
        (gRPC's status), run the dialect's end checks, and note what the limits left out.

        The proxy works the backlog off with :meth:`drain` first; what is left is read
        here at once (within the decode budget).
        """
        self.catch_up()
        self._work(None)
        if trailers and not self.stopped and self.active:
            self._trailers(trailers)
        try:
            self._settle(cut_by_upstream)
        finally:
            self.last_checks()
            self.report_limits()

    def _settle(self, cut_by_upstream: bool) -> None:
        if (self.too_large or self.halted) and not cut_by_upstream and self.record is not None:
            self.record.apply(StreamEnd())  # HTTP says the body is whole; it was only not read
        gate = self.gate
        if gate is not None:
            self._to_gate()  # (frames read after the body ended are checked, no longer sent)
            if self.record is not None and gate.holds and self.framing.streamed:
                # (a whole body's text is checked below: the client has none of it yet)
                self._note_delivered(gate, self.record)
            if gate.verdicts:
                self._gated(gate, b"", terminate=False)  # verdicts of text read after the body ended
        if self.stopped or not self.active:
            return  # (a stream a filter stopped did not end by itself: nothing to check)
        if not self.framing.streamed:
            self._read_body()
            return
        try:
            reader = self.reader
            self._dispatch(reader.end())
            self._collect_reader_findings()
            inside = reader.pending_event
            if self.record is not None and self.normalizer is not None:
                for ev in self.normalizer.on_end(cut=inside):
                    self.record.apply(ev)
                incomplete = self.framing.incomplete
                if inside and incomplete is not None and not cut_by_upstream:
                    self.record.add_finding(*incomplete)
        except Exception as e:  # noqa: BLE001
            self._fail(e)

    def _trailers(self, fields: Iterable[tuple[str, str]]) -> None:
        """The response's HTTP trailers (gRPC's status), or the status fields of a
        header-only answer: read by the dialect as one last frame of the body."""
        record, normalizer = self.record, self.normalizer
        if record is None or normalizer is None:
            return
        block = "".join(f"{name}: {value}\r\n" for name, value in fields)
        try:  # (not through the gate: trailers carry a status, no text, and no body bytes)
            for ev in normalizer.on_event(Message(block, "trailers")):
                record.apply(ev)
        except Exception as e:  # noqa: BLE001 - trailers the dialect cannot read
            self._fail(e)

    def report_limits(self) -> None:
        """Findings for what the limits kept out of the record, with the true sizes and
        the SHA-256 of the raw body (as far as it came); once, when the exchange ends."""
        record = self.record
        if record is None or self._limits_reported:
            return
        self._limits_reported = True
        if not (record.content_truncated or self.too_large or self._over_budget):
            return
        raw = f"{record.bytes_from_upstream} bytes from the upstream, sha256 {self.sha256.hexdigest()}"
        decoded = self.decoder.decoded if self.decoder is not None and self.decoder.encoded else None
        if record.content_truncated or self.too_large:
            what = (
                f"body over {self.max_record_bytes} bytes not kept"
                if self.too_large
                else f"kept {record.content_kept} of {record.content_bytes} content bytes"
            )
            record.add_finding("content_truncated", f"{what} (cap {self.max_record_bytes}); {raw}")
        if self._over_budget:
            sizes = f"; {decoded} bytes decoded" if decoded is not None else ""
            record.add_finding("inspection_stopped", f"{self.halted}{sizes}; {raw}")

    def read_whole(self, held: bytes | None = None) -> None:
        """Read a whole body (a JSON answer, an error) into the record, up to the gate:
        the costly part of :meth:`end` for such a body, which :meth:`end` then leaves out.

        ``held``: a body mitmproxy held whole (:class:`~addon.mitm.flow_state.HeldWhole`),
        fed here. Why apart: decoding a body and the dialect's reading cost in proportion
        to what it holds (11 MB of 300,000 tiny Anthropic text blocks took 0.7 s), so the
        proxy runs this in its reader thread, off the event loop. It touches only this
        exchange's auditor, record, normalizer and gate (the gate only keeps the held
        bytes, and checks the body's text here only when no user filter is to be asked:
        user filters are called with :meth:`end`, on the loop). A second call does
        nothing. Never raises."""
        if self._read_ahead or self.framing.streamed:
            return
        self._read_ahead = True
        if held is not None:
            self.feed(held)
        self.catch_up()
        self._work(None)
        if not self.stopped and self.active:
            self._body_events = self._whole_body_events()
            if self.gate is not None and not self.gate.guard.asks_user_filters:
                self._read_body()  # (the rules' check: end() then finds it done)

    def _whole_body_events(self) -> list[Event] | None:
        """The whole body's one frame, read by the dialect into the record; its events
        (None: no record, or the dialect could not read it)."""
        record, normalizer = self.record, self.normalizer
        if record is None or normalizer is None:
            return None
        try:
            for frame in self.reader.end():
                if isinstance(frame, Body):
                    status = record.http_status or 0
                    self._body_is_answer = bool(frame.raw) and 200 <= status < 300 and status not in (204, 205)
                    events = normalizer.on_body(frame.raw, status)
                    for ev in events:
                        record.apply(ev)
                    return events
        except Exception as e:  # noqa: BLE001 - a body the dialect cannot read
            self._fail(e)
        return None

    def _read_body(self) -> None:
        """The whole body's events (read ahead by :meth:`read_whole`, or now), checked by the gate."""
        events = self._body_events if self._read_ahead else self._whole_body_events()
        self._read_ahead, self._body_events = True, None
        gate = self.gate
        if gate is None or events is None:
            return
        try:
            gate.on_body(events, answer=self._body_is_answer)
            self._gated(gate, b"", terminate=False)  # the proxy replaces a blocked body whole
        except Exception as e:  # noqa: BLE001 - a filter the gate could not run
            self._fail(e)

    def _dispatch(self, events: Iterable[Frame], end: int = 0) -> None:
        """Normalize and record frames; with a gate, check them (``end``: where they end).

        The hot loop of the audit: a frame that is only answer text (nearly all of them)
        comes from the normalizer as that text (:meth:`Normalizer.read`) and goes into
        the record directly; its ``TextDelta`` is made only for a gate, which reads it."""
        gate = self.gate
        record, normalizer = self.record, self.normalizer
        if gate is None and self.on_turn_end is None and record is not None and normalizer is not None:
            # The common case, with nothing that could swap the record or the normalizer
            # between frames (a claim, a turn's end): the loop at its tightest.
            read, add_text, apply = normalizer.read, record.add_text, record.apply
            for event in events:
                record.event_count += 1
                got = read(event)
                if isinstance(got, str):
                    add_text(got)
                else:
                    for ev in got:
                        apply(ev)
            if self.reader.findings:
                self._collect_reader_findings()
            return
        for event in events:
            if self.stopped and self.on_turn_end is not None:
                return  # a filter ended a stream of turns: what follows the block is no turn's
            if self.normalizer is None and not self._claim(event):
                return
            record, normalizer = self.record, self.normalizer
            if record is None or normalizer is None:
                return
            record.event_count += 1
            got = normalizer.read(event)
            if isinstance(got, str):
                record.add_text(got)
                if gate is not None:
                    self._framed.append((event, [TextDelta(got)], end, normalizer.parsed))
                continue
            common: list[Event] = got
            framed = gate is not None
            if gate is not None and self.on_turn_end is not None and any(type(ev) is TurnEnd for ev in common):
                self._framed.append((event, common, end, None))
                self._gate_before_turn_end(gate)
                framed = False
            for ev in common:
                record.apply(ev)
                if type(ev) is TurnEnd and self.on_turn_end is not None:
                    record = self.record = self.on_turn_end(record)
            if framed:
                self._framed.append((event, common, end, None))
        if self.normalizer is None and self.sniffed_bytes > SNIFF_LIMIT:
            self.ignored = True
        if self.reader.findings:
            self._collect_reader_findings()

    def _gate_before_turn_end(self, gate: OutputGate) -> None:
        """A frame ends a turn: the gate checks what was read up to it first, so that the
        verdicts on the turn's text, and a block with its ending, go into the turn's own
        record before that record is written (the released bytes and the ending go out
        with this chunk, in order).

        A compressed chunk is not handed over yet: it goes whole, and only part of what it
        decodes to may have been read so far (its slices are read one at a time), so the
        gate could clear it on the first slice's frames. It is handed with the rest of
        the chunk's frames, at the end of :meth:`feed`."""
        raw = None
        if not gate.split_raw:
            raw, self._raw_chunk = self._raw_chunk, None
        self._to_gate()
        if raw is not None:
            self._raw_chunk = raw
        self._close_turn(gate)

    def _close_turn(self, gate: OutputGate) -> None:
        """The gate has checked the current turn to its end: its verdicts, a block with
        its ending, the bytes released for it and the text its client got go into the
        turn's record, before that record is written; the gate's delivered text starts
        again for the next turn."""
        record = self.record
        if gate.verdicts or gate.blocked is not None:
            self._released.append(self._gated(gate, b""))
        if record is None:
            return
        if gate.holds:
            self._note_delivered(gate, record)
            gate.delivered.clear()
        if not gate.flags_only:  # (else the chunks were counted as they came, in feed)
            sent = sum(map(len, self._released)) - self._counted
            record.bytes_to_client += sent
            self._counted += sent

    def _claim(self, first_event: Frame) -> bool:
        on_claim = self.on_claim
        dialect = detect_response(first_event) if on_claim is not None else None
        if on_claim is None or dialect is None:
            self.ignored = True
            return False
        self.record, self.normalizer = on_claim(dialect)
        return True

    def _collect_reader_findings(self) -> None:
        """Move the reader's findings into the record, emptying the reader's list (as the
        request tap and the WebSocket auditor do): the record keeps FINDINGS_PER_CODE of
        each code and counts the rest, so a stream of a million broken frames costs a
        count, not a million entries held for the exchange's life. Before a dialect claims
        the stream (no record yet) they wait in the reader, at most SNIFF_LIMIT's worth,
        for the record the claim makes."""
        findings = self.reader.findings
        record = self.record
        if record is not None and findings:
            add = record.add_finding
            for code, detail in findings:
                add(code, detail)
            findings.clear()

    def _fail(self, error: Exception) -> None:
        try:  # what the reader found before the failure (earlier in the same run) is kept
            self._collect_reader_findings()
        except Exception:
            log.debug("llm-audit: reader findings lost in a failure", exc_info=True)
        self.failed = True
        log.exception("llm-audit: inspecting the stream failed; it passes uninspected from here")
        detail = f"{type(error).__name__}: {error}"[:300]
        if self.record is not None:
            self.record.add_finding("audit_internal_error", detail)
        self._unreadable(f"the audit failed: {detail}")


def _framing_of(event_stream: bool, normalizer: Normalizer | None, record: ExchangeRecord | None) -> Framing:
    """The framing when the caller names none: an event stream, else what the dialect
    expects for the record's status (a whole body when nothing is known)."""
    status = record.http_status if record is not None and record.http_status is not None else 200
    expected = normalizer.framing if normalizer is not None else None
    return select("text/event-stream" if event_stream else "", status, expected)


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
