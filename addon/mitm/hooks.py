"""The exchange-hooks addon: mitmproxy's flow hooks, which turn each inference exchange
into a record, and the size options that bound what one exchange may cost.

For each flow it

1. ``request``: asks the dialect registry whether this is inference traffic (headers
   first, the body only when a dialect's headers/path match), opens a record and runs
   the budgets and request filters (a blocked request is answered here, in its dialect:
   :mod:`addon.mitm.answers`);
2. ``responseheaders``: turns on streaming, with the tap (:mod:`addon.mitm.tap`) that
   feeds each chunk to the sans-IO auditor and forwards what it returns: the chunk
   unchanged, or, with output filters, the bytes whose text has passed them and, on a
   block, the dialect's termination, after which ``early_end`` ends the stream (an event
   stream no dialect claimed by its request is sniffed by its first event); a body
   filters may block that is not streamed is held whole instead;
3. ``response`` / ``error``: settles the outcome and hands the record to the audit
   store, so the client's end of stream never waits for the database; then shows the
   exchange in mitmproxy's own UIs (:mod:`addon.mitm.contentview`): the stream's copy as
   the body for the content view, a comment for the flow list, a marker when blocked.

Each live flow is in one state of :mod:`addon.mitm.flow_state`. Rules from
``mitmproxy-notes.md`` that shape this code: a hook never raises; an aborted stream
fires ``error`` (not ``response``); on shutdown ``done`` runs before the ``error`` hooks
of live flows.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

from mitmproxy import http
from mitmproxy.addonmanager import Loader

from addon.auditor import StreamAuditor
from addon.dialects import UNREADABLE, Dialect, Normalizer, RequestSummary, RequestView, media_type, parse_json_body
from addon.dialects.blocking import block_message
from addon.dialects.registry import detect_request, detect_streamed_request
from addon.events import Finding
from addon.filters.api import Verdict
from addon.filters.engine import FilterSet
from addon.framing import DEFAULT_MAX_EVENT_BYTES, select
from addon.mitm import early_end, printed_output
from addon.mitm.answers import answer_blocked, replace_held
from addon.mitm.content_filters import ContentFilters, RequestCheck, check_message, check_rules, finish_check
from addon.mitm.contentview import annotate, show_comment_column
from addon.mitm.flow_record import (
    MAX_REQUEST_DECODED,
    SNIFFED_REQUEST_BYTES,
    Line,
    abort_side,
    claimed_by_line,
    client_had_everything,
    detect_by_line,
    line_views,
    refused_by_mitmproxy,
    request_content,
    response_into_record,
    start_record,
)
from addon.mitm.flow_state import (
    AnsweredByProxy,
    BodyCopy,
    FlowState,
    HeldWhole,
    OutputCheck,
    Recorded,
    Recording,
    Sniffing,
    Streaming,
)
from addon.mitm.store import AuditStore
from addon.mitm.tap import make_tap, output_gate
from addon.record import (
    DEFAULT_MAX_RECORD_BYTES,
    OUTCOME_CLIENT_ABORTED,
    OUTCOME_COMPLETE,
    OUTCOME_UPSTREAM_ABORTED,
    ExchangeRecord,
)
from addon.turns import DEFAULT_TURN_IDLE_SECONDS, RequestTap, Turns

log = logging.getLogger(__name__)


DEFAULT_VIEW_BYTES = 4 * 1024 * 1024
# Byte-size options: (option, attribute, smallest value); a smaller one is refused in one line.
SIZE_OPTIONS = (
    ("llm_audit_max_event_bytes", "max_event_bytes", 1024),
    ("llm_audit_max_record_bytes", "max_record_bytes", 1024),
    ("llm_audit_view_bytes", "view_bytes", 0),
)
# A request body larger than this, sent or decoded, is read in a worker thread (see
# ExchangeHooks._open_off_loop): JSON past 64 KiB, anything else (protobuf) past 8 KiB;
# so is a whole response body (a JSON answer, _read_whole_off_loop), and any compressed one.
# Below it the worst a body costs the loop is some tens of milliseconds: 64 KiB of JSON
# at most about 26 ms under the benchmark's 98 request rules (the tiniest messages, 1,850
# of them, about 10 ms), 8 KiB of protobuf at most about 25 ms (64 KiB of a Cursor request
# of tiny conversation messages took 245 ms). The hop to the thread (about 0.1 ms) is
# nothing beside the reading of a body past these.
HEAVY_BODY = 64 * 1024
HEAVY_BINARY_BODY = 8 * 1024


class RequestRead(NamedTuple):
    """A request read (:meth:`ExchangeHooks._read_request`): its dialect, line, record,
    what the dialect read of it and, with filters, the first step of their check."""

    dialect: Dialect
    view: RequestView
    record: ExchangeRecord
    summary: RequestSummary
    check: RequestCheck | None


class ExchangeHooks:
    """Detects inference exchanges and records each one through the audit store.

    ``store`` takes the records; ``filters`` gives the filter set for each new request.
    """

    def __init__(self, store: AuditStore, filters: ContentFilters) -> None:
        self.store = store
        self.filters = filters
        self.flows: dict[str, FlowState] = {}
        # exchanges waiting for their backlog to be read: their auditors and states
        # (with the outcome the exchange ended with: written so if the proxy stops first;
        # and, for a whole body read in the reader thread, how to read and settle it at once)
        self.draining: dict[asyncio.Task, tuple[StreamAuditor, Recorded, str, Callable[[], None] | None]] = {}
        self.max_event_bytes = DEFAULT_MAX_EVENT_BYTES
        self.max_record_bytes = DEFAULT_MAX_RECORD_BYTES
        self.view_bytes = DEFAULT_VIEW_BYTES
        self.turn_idle_seconds = DEFAULT_TURN_IDLE_SECONDS
        self.idle_watch: asyncio.Task | None = None  # ends idle turns of long-lived streams
        self.readers: ThreadPoolExecutor | None = None  # (made at the first large request, shut at done)
        self.stopped = False  # done() ran: the store takes no more records

    # -- options and the UI -------------------------------------------------------------

    def load(self, loader: Loader) -> None:
        early_end.install_error_side()
        printed_output.install(loader.master.addons.get("dumper"))  # mitmdump's flow lines show no credential
        loader.add_option(
            "llm_audit_max_event_bytes",
            int,
            DEFAULT_MAX_EVENT_BYTES,
            "Largest SSE line or event the auditor inspects; larger ones pass through "
            "uninspected and are recorded as a finding.",
        )
        loader.add_option(
            "llm_audit_max_record_bytes",
            int,
            DEFAULT_MAX_RECORD_BYTES,
            "Most content one exchange's record keeps (answer text, reasoning, tool arguments, "
            "a non-stream body read whole; bytes); beyond it the record keeps what fits, the true "
            "sizes and the SHA-256 of the raw body (finding content_truncated).",
        )
        loader.add_option(
            "llm_audit_view_bytes",
            int,
            DEFAULT_VIEW_BYTES,
            "Largest streamed body kept for mitmproxy's own views (the LLM stream content view, "
            "saved flows); a longer one is not kept. 0: none is kept. Of an audited WebSocket, "
            "the latest messages up to this size are kept.",
        )
        loader.add_option(
            "llm_audit_turn_idle_seconds",
            int,  # (mitmproxy's --set parses no floats)
            DEFAULT_TURN_IDLE_SECONDS,
            "A turn of a long-lived stream (Cursor's chat) that nothing arrived for this long is "
            "recorded as ended (finding turn_idle_timeout), though its end marker did not come.",
        )

    def configure(self, updated: set[str]) -> None:
        """Apply the size options; one below its smallest value is refused in one error
        line (which stops mitmdump at start-up) and the previous value stays."""
        from mitmproxy import ctx

        for name, attribute, minimum in SIZE_OPTIONS:
            if name in updated and (value := _size_option(ctx.options, name, minimum)) is not None:
                setattr(self, attribute, value)
        if "llm_audit_turn_idle_seconds" in updated:
            value = ctx.options.llm_audit_turn_idle_seconds
            if value > 0:
                self.turn_idle_seconds = value
            else:
                log.error(
                    f"llm-audit: llm_audit_turn_idle_seconds must be more than 0, got {value}; "
                    f"fix it with --set llm_audit_turn_idle_seconds={DEFAULT_TURN_IDLE_SECONDS}"
                )

    def running(self) -> None:
        """Under mitmweb, show the comments the addon writes in the flow list."""
        from mitmproxy import ctx

        show_comment_column(ctx.options)

    # -- hooks --------------------------------------------------------------------------

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        try:
            self._open_streamed(flow)
        except Exception:  # auditing must never break a request
            log.exception("llm-audit: failed to inspect a streamed request; it is forwarded unaudited")

    def request(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        """Open the request's record; for a large body, a coroutine mitmproxy awaits
        (see :meth:`_open`): a plain method, so a small request costs no task."""
        try:
            return self._open(flow)
        except Exception:  # auditing must never break a request
            log.exception("llm-audit: failed to inspect a request; it is forwarded unaudited")
            return None

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        try:
            self._read_response(flow)
        except Exception:  # auditing must never break a response
            log.exception("llm-audit: failed to inspect a response; it is forwarded unaudited")

    def response(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        """Settle and write the ended exchange's record; a whole body costly to read is
        read off the event loop first (:meth:`_read_whole_off_loop`)."""
        state = _current_turn(self.flows.pop(flow.id, None))
        if state is None or isinstance(state, Sniffing):
            return None
        if isinstance(state, Streaming | HeldWhole) and _loop_running() and _costly_whole_body(flow, state):
            return self._read_whole_off_loop(flow, state, lambda: self._record_complete(flow, state), OUTCOME_COMPLETE)
        if isinstance(state, Streaming) and state.auditor.pending:
            self._after_backlog(state.auditor, state, lambda: self._record_complete(flow, state), OUTCOME_COMPLETE)
        else:
            self._record_complete(flow, state)
        return None

    def error(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        state = _current_turn(self.flows.pop(flow.id, None))
        if state is None or isinstance(state, Sniffing):
            return None
        try:
            outcome = abort_side(flow)  # now: the connection states tell it only while the flow ends
        except Exception:  # the record is written whatever happens
            log.exception("llm-audit: failed to tell who cut an exchange")
            outcome = OUTCOME_UPSTREAM_ABORTED
        auditor = _auditor(state)
        if (
            isinstance(state, Streaming)
            and outcome != OUTCOME_CLIENT_ABORTED  # (then the body is not read: the client had what came)
            and _loop_running()
            and _costly_whole_body(flow, state)
        ):
            return self._read_whole_off_loop(flow, state, lambda: self._record_aborted(flow, state, outcome), outcome)
        if auditor is not None and auditor.pending:
            self._after_backlog(auditor, state, lambda: self._record_aborted(flow, state, outcome), outcome)
        else:
            self._record_aborted(flow, state, outcome)
        return None

    def done(self) -> None:
        """Submit the exchanges still open as cut off, and those whose backlog was not
        read yet as read so far; the store's ``done``, after this one, writes them."""
        for state in self.flows.values():
            if isinstance(state, Sniffing):
                continue
            if (auditor := _auditor(state)) is not None:
                auditor.catch_up()  # (it may end turns: the record is the current turn's after it)
                auditor.last_checks()
            self._submit_cut(state, "the proxy stopped during the exchange", OUTCOME_CLIENT_ABORTED)
            if (turns := _turns(state)) is not None:
                turns.close()
        self.flows.clear()
        self.stopped = True
        if self.readers is not None:
            # What waits for the reader is not read (a request waiting never went
            # upstream); what it is reading now is finished first: a body's auditor must
            # be left alone before its record is written below.
            self.readers.shutdown(wait=True, cancel_futures=True)
            self.readers = None
        for task, (auditor, state, outcome, finish) in self.draining.items():  # ended, not read to their end yet
            if task.done():
                continue  # settled and written; only its callback, which forgets it, has not run
            task.cancel()
            if finish is not None:  # a whole body: read here, now that the reader is done (bounded by the cap)
                finish()
                continue
            auditor.last_checks()  # (flag rules' verdicts on what was read)
            self._submit_cut(state, "the proxy stopped while the body was still being read", outcome)
        self.draining.clear()

    def _submit_cut(self, state: Recorded, detail: str, outcome: str) -> None:
        """Write the record of an exchange (its current turn's) the proxy's stop cut off;
        a turn nothing arrived for is no record."""
        turns = _turns(state)
        if turns is not None and not turns.pending:
            return
        record = _latest(state).record
        record.add_finding("proxy_shutdown", detail)
        record.finish(outcome)
        self.store.submit(record)

    # -- the request ----------------------------------------------------------------------

    def _open(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        """Open the record of a request a dialect recognises and run the request filters.

        A body over :data:`HEAVY_BODY` (JSON) or :data:`HEAVY_BINARY_BODY`, sent or
        decoded, is read off the event loop (:meth:`_open_off_loop`); the others here."""
        if flow.response is not None or flow.id in self.flows or _upgrades(flow.request):
            return None  # answered before it could go upstream (proxyauth's 407, ...), opened streamed, a WebSocket
        lines = line_views(flow.request)
        if not any(claimed_by_line(view) for view, _ in lines):
            return None  # (no dialect's: its body is never read, and never waits for the reader)
        filters = self.filters.current()
        running = _loop_running()  # (not when a test drives the hooks by hand: all is read here)
        heavy = HEAVY_BODY if "json" in flow.request.headers.get("content-type", "") else HEAVY_BINARY_BODY
        if running and len(flow.request.raw_content or b"") > heavy:
            return self._open_off_loop(flow, filters, lines)
        try:
            read = self._read_request(flow, filters, lines, heavy if running else MAX_REQUEST_DECODED)
        except _Heavy:  # (a small compressed body that decodes past it)
            return self._open_off_loop(flow, filters, lines)
        self._opened(flow, read, filters)
        return None

    async def _open_off_loop(self, flow: http.HTTPFlow, filters: FilterSet | None, lines: list[Line]) -> None:
        """:meth:`_read_request` in a worker thread, the rest on the event loop.

        Reading a request costs in proportion to what it holds, not to its size: 9.3 MB
        of 300,000 tiny messages took 2.8 s to read and check, and a compressed body
        decodes to many times its size. On the event loop that stalled every stream of
        every client meanwhile. The reader is one thread: threads share the interpreter
        with the loop, which kept about half its pace beside one reader and 4 % beside
        four (the review's measure), so requests are read one at a time. The request
        waits for its own reading, as it did; mitmproxy awaits the hook."""
        try:
            loop = asyncio.get_running_loop()
            read = await loop.run_in_executor(self._readers(), self._read_request, flow, filters, lines)
            if self.stopped:
                return  # (the proxy stopped while it was read: it never went upstream)
            self._opened(flow, read, filters)
        except Exception:  # auditing must never break a request
            log.exception("llm-audit: failed to inspect a request; it is forwarded unaudited")

    def _read_request(
        self, flow: http.HTTPFlow, filters: FilterSet | None, lines: list[Line], max_bytes: int = MAX_REQUEST_DECODED
    ) -> RequestRead | None:
        """What a request is (None: no dialect's, in any of its ``lines``: :func:`line_views`), its record and the rules' verdicts.
        Reads the flow and writes nothing shared, so it may run in a worker thread.
        Raises :class:`_Heavy` when the body decodes past ``max_bytes`` (on the loop:
        :data:`HEAVY_BODY` or :data:`HEAVY_BINARY_BODY`; it is read in the thread then)."""
        req = flow.request
        read: list[tuple[bytes | None, list[Finding]]] = []  # (each on demand: most requests are no dialect's)
        parsed: list[tuple[Any, Finding | None]] = []

        def content() -> tuple[bytes | None, list[Finding]]:
            if not read:
                read.append(request_content(req, max_bytes))
                if read[0][0] is None and max_bytes < MAX_REQUEST_DECODED:
                    raise _Heavy
            return read[0]

        def body() -> Any:
            if not parsed:
                data = content()[0]
                parsed.append(parse_json_body(data) if data is not None else (UNREADABLE, None))
            return parsed[0][0]

        found = detect_by_line(lines, lambda view: detect_request(view, body))
        if found is None:
            return None
        dialect, line = found
        reused = parsed[0] if parsed and dialect.json_requests else None
        record, summary = start_record(flow, dialect, self.store.instance, reused, content(), line)
        check = check_rules(filters, record, dialect, summary) if filters is not None else None
        return RequestRead(dialect, line[0], record, summary, check)

    def _opened(self, flow: http.HTTPFlow, read: RequestRead | None, filters: FilterSet | None) -> None:
        """A request read: its record opened, the budgets and user filters asked, and it
        is answered by the proxy if they block it, else forwarded with its record open."""
        if read is None:
            return
        dialect, view, record, summary = read.dialect, read.view, read.record, read.summary
        recording = self.flows[flow.id] = Recording(record, dialect.normalizer(summary))
        block = self.filters.check_budgets(record)  # from totals in memory: no database here
        if filters is not None and read.check is not None:
            block = finish_check(filters, record, read.check) or block
        if block is not None:
            answer_blocked(flow, record, dialect, summary, view, block)
            self.flows[flow.id] = AnsweredByProxy(record)
            return  # the response hook writes the record
        if filters is not None and filters.checks_output:
            recording.output = OutputCheck(filters, dialect, summary, view)
            if filters.may_block_output:
                # A stream the proxy may cut must be one it can append to: not compressed.
                flow.request.headers["accept-encoding"] = "identity"
        self.store.submit(record)  # the write-ahead open record (status in_progress)

    def _open_streamed(self, flow: http.HTTPFlow) -> None:
        """Open the record of a streamed request (a gRPC or Connect stream; Cursor's
        chat, with its turns) as it starts, and read its body as the client sends it
        (:mod:`addon.turns`): mitmproxy would otherwise hold the body until it
        ends, which a full-duplex client does not do before it has its answers."""
        if flow.response is not None or _upgrades(flow.request):
            return  # (a WebSocket is audited by addon.mitm.websocket)
        req = flow.request
        found = detect_by_line(line_views(req), detect_streamed_request)
        if found is None:
            return
        dialect, line = found
        view = line[0]
        record, summary = start_record(flow, dialect, self.store.instance, line=line)
        turns = Turns(record, flow.id if dialect.has_turns(view) else None, self.store.submit)
        recording = self.flows[flow.id] = Recording(record, dialect.normalizer(summary), turns=turns)
        filters = self.filters.current()
        if filters is not None and filters.checks_output:
            recording.output = OutputCheck(filters, dialect, summary, view)
        framing = select(req.headers.get("content-type", ""), 200, recording.normalizer.framing)
        reader = framing.reader(self.max_event_bytes, self.max_record_bytes, req.headers)
        tap = RequestTap(reader, dialect, view, turns, self.max_record_bytes)
        budget = self.filters.check_budgets(record)
        if budget is not None:  # over budget: its first message is not forwarded, the stream ends
            tap.check = lambda _record, _message: budget
            tap.on_block = functools.partial(self._block_streamed, flow, dialect, summary, view)
            tap.fail_open = False
        elif filters is not None and (filters.request_rules or filters.filters):
            tap.check = functools.partial(check_message, filters, dialect, summary)
            tap.on_block = functools.partial(self._block_streamed, flow, dialect, summary, view)
            tap.fail_open = filters.failure == "open"
        req.stream = tap
        turns.open()  # the write-ahead open record (of turn 0)
        if turns.has_turns:
            self._watch_idle_turns()

    def _block_streamed(
        self, flow: http.HTTPFlow, dialect: Dialect, summary: RequestSummary, view: RequestView, block: Verdict
    ) -> None:
        """A request filter blocked a message of a bidirectional stream: it was not
        forwarded, and the exchange ends towards the client in its dialect (the proxy's
        answer if the response has not begun, else the dialect's end of the stream)."""
        state = self.flows.get(flow.id)
        turns = _turns(state)
        if turns is None:
            return
        record = turns.record
        message = block_message(block.rule_id, block.reason)

        def answer(streaming: bool) -> tuple[http.Response | None, bytes, list[tuple[str, str]]]:
            live = self.flows.get(flow.id)
            if streaming and isinstance(live, Streaming):
                auditor = live.auditor
                auditor.stopped = True  # nothing more of the upstream is read or sent
                # (what the client got: a holding gate's second reader; else all the auditor read)
                gate = auditor.gate
                normalizer = gate.forwarded if gate is not None and gate.holds else auditor.normalizer
                if normalizer is not None:
                    ending = normalizer.termination(block.rule_id, block.reason)
                    record.block(message, [normalizer.filter_stop_reason] if ending else None)
                    record.bytes_to_client += len(ending)
                    return None, ending, normalizer.termination_trailers(block.rule_id, block.reason)
            blocked = dialect.blocked_response(summary, view, block.rule_id, block.reason, streaming=True)
            record.block(message)
            record.http_status = blocked.status  # the proxy's answer is the response
            record.response_headers = dict(blocked.headers)
            record.bytes_to_client = len(blocked.body)
            return http.Response.make(blocked.status, blocked.body, dict(blocked.headers)), b"", []

        early_end.end_from_request_side(flow, answer)

    def _watch_idle_turns(self) -> None:
        """Run :meth:`_end_idle_turns` every few seconds while long-lived streams are open."""
        if self.idle_watch is not None and not self.idle_watch.done():
            return
        try:
            self.idle_watch = asyncio.get_running_loop().create_task(self._idle_watch())
        except RuntimeError:  # no event loop (a test driving the hooks): no idle ends
            self.idle_watch = None

    async def _idle_watch(self) -> None:
        while any((turns := _turns(state)) is not None and turns.has_turns for state in self.flows.values()):
            await asyncio.sleep(min(5.0, self.turn_idle_seconds / 2))
            try:
                self._end_idle_turns(time.monotonic())
            except Exception:  # the watch must go on
                log.exception("llm-audit: failed to end an idle turn")

    def _end_idle_turns(self, now: float) -> None:
        """Record as ended each turn nothing arrived for: its end marker may have moved."""
        for state in self.flows.values():
            turns = _turns(state)
            if turns is None or not isinstance(state, Streaming) or turns.idle_for(now) < self.turn_idle_seconds:
                continue
            state.auditor.end_idle_turn(f"nothing arrived for {self.turn_idle_seconds:g} s")

    # -- the response ---------------------------------------------------------------------

    def _read_response(self, flow: http.HTTPFlow) -> None:
        """Tap the response: every body of an inference exchange, and every event stream
        (an unrecognised one may still be claimed by its first event).

        The framing (:func:`addon.framing.select`) decides how the body is read: a
        streamed framing frame by frame as it flows (held frame by frame when filters may
        block), a whole body at its end (held whole when filters may block).
        """
        resp = flow.response
        if resp is None:
            return  # never so in this hook: the check narrows the type
        match self.flows.get(flow.id):
            case Recording() as recording:
                self.flows[flow.id] = self._tap_recorded(flow, resp, recording)
            case None if media_type(resp.headers.get("content-type", ""))[0] == "text/event-stream":
                self.flows[flow.id] = self._sniff(flow, resp)
            case _:  # not inference traffic, or the proxy's own answer to a blocked request
                return

    def _tap_recorded(self, flow: http.HTTPFlow, resp: http.Response, recording: Recording) -> Streaming | HeldWhole:
        """The response of a recognised exchange: tapped, or held whole when filters may
        block a body whose framing is not streamed."""
        encoding = resp.headers.get("content-encoding")
        framing = select(resp.headers.get("content-type", ""), resp.status_code, recording.normalizer.framing)
        response_into_record(recording.record, resp)
        check = recording.output
        auditor = StreamAuditor(
            recording.record,
            recording.normalizer,
            encoding,
            self.max_event_bytes,
            framing=framing,
            max_record_bytes=self.max_record_bytes,
            gate=output_gate(check, framing.streamed, encoding),
            headers=resp.headers,
            on_turn_end=recording.turns.end_turn if recording.turns is not None else None,
        )
        if check is not None and check.filters.may_block_output and not framing.streamed:
            # checked whole in the response hook, before the client gets it
            return HeldWhole(recording.record, auditor, recording.normalizer, check)
        streaming = Streaming(recording.record, auditor, self._copy(), recording.turns)
        resp.stream = make_tap(flow, auditor, streaming.copy, recording.turns)
        return streaming

    def _sniff(self, flow: http.HTTPFlow, resp: http.Response) -> Sniffing:
        """Tap an event stream its request did not reveal; a dialect that claims it by
        its first event gets a record, and the flow becomes :class:`Streaming`."""
        copy = self._copy()

        def claim(dialect: Dialect) -> tuple[ExchangeRecord, Normalizer]:
            """Called from the tap when a dialect claims the stream by its first event."""
            content = request_content(flow.request, SNIFFED_REQUEST_BYTES, identity_too=True)
            record, summary = start_record(flow, dialect, self.store.instance, content=content)
            normalizer = dialect.normalizer(summary)
            response_into_record(record, resp)
            if isinstance(self.flows.get(flow.id), Sniffing):
                self.flows[flow.id] = Streaming(record, auditor, copy)
            return record, normalizer

        auditor = StreamAuditor(
            None,
            None,
            resp.headers.get("content-encoding"),
            self.max_event_bytes,
            on_claim=claim,
            max_record_bytes=self.max_record_bytes,
        )
        resp.stream = make_tap(flow, auditor, copy)
        return Sniffing()

    def _copy(self) -> BodyCopy | None:
        return BodyCopy(self.view_bytes) if self.view_bytes else None

    # -- the end ----------------------------------------------------------------------------

    def _record_complete(self, flow: http.HTTPFlow, state: Recorded) -> None:
        try:
            _complete(flow, state)
        except Exception as e:  # the record is written whatever happens
            log.exception("llm-audit: failed to finish a record")
            _latest(state).record.add_finding("audit_internal_error", f"{type(e).__name__}: {e}"[:300])
        state = _latest(state)  # (reading the rest may have ended turns)
        state.record.finish(OUTCOME_COMPLETE)
        self._write(flow, state)

    def _record_aborted(self, flow: http.HTTPFlow, state: Recorded, outcome: str) -> None:
        try:
            outcome = _settle_abort(flow, state, outcome)
        except Exception as e:  # the record is written whatever happens
            log.exception("llm-audit: failed to settle an aborted exchange")
            _latest(state).record.add_finding("audit_internal_error", f"{type(e).__name__}: {e}"[:300])
            outcome = OUTCOME_UPSTREAM_ABORTED
        state = _latest(state)  # (reading the rest may have ended turns)
        state.record.finish(outcome)
        self._write(flow, state)

    def _write(self, flow: http.HTTPFlow, state: Recorded) -> None:
        """Hand the ended exchange's record to the store, show it, let go of its text.
        (A long-lived stream's turn that nothing arrived for is no record.)"""
        turns = _turns(state)
        if turns is None or turns.pending:
            self.store.submit(state.record)
        if turns is not None:
            turns.close()
        _show(flow, state)
        auditor = _auditor(state)
        if auditor is not None:
            # mitmproxy may keep the flow (and so the stream callable) alive as long as
            # its connection lasts: the auditor drops the record and its text.
            auditor.release()

    def _after_backlog(self, auditor: StreamAuditor, state: Recorded, settle: Callable[[], None], outcome: str) -> None:
        """Settle an ended exchange once its backlog of encoded bytes is read, in slices
        scheduled on the event loop, so other flows run between the slices. (mitmproxy
        runs tasks eagerly: the first slice, at most ``CALL_SECONDS``, runs within the
        hook, before the client gets the end of the body.)"""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (a test driving the hooks): end() reads it all
            settle()
            return
        task = loop.create_task(_drain(auditor, settle))
        self.draining[task] = (auditor, state, outcome, None)
        task.add_done_callback(self._drained)

    def _drained(self, task: asyncio.Task) -> None:
        self.draining.pop(task, None)

    def _read_whole_off_loop(
        self, flow: http.HTTPFlow, state: Streaming | HeldWhole, settle: Callable[[], None], outcome: str
    ) -> Awaitable[None]:
        """Read a whole body (a JSON answer, or what came of one the upstream cut) in the
        reader thread, then ``settle`` its record on the loop, where user filters are asked.

        The dialect's reading of a body costs in proportion to what it holds: 11 MB of
        300,000 tiny Anthropic text blocks took 0.7 s in process, and on the event loop
        every stream stood still meanwhile. mitmproxy awaits the hook, as it waited for
        the reading on the loop before: a held answer (:class:`HeldWhole`) for its check,
        and one that went to the client as it came (:class:`Streaming`) so that the
        addons after this one (saving with ``-w``, the UIs) see the flow settled, with its
        body and comment. The wait is shielded: should mitmproxy cancel it, the record is
        still settled and written. Should the proxy stop first, :meth:`done` reads and
        settles it at once."""
        held = flow.response.raw_content or b"" if isinstance(state, HeldWhole) and flow.response else None

        def at_once() -> None:
            state.auditor.read_whole(held)
            settle()

        task = asyncio.get_running_loop().create_task(self._settle_whole(state.auditor, held, settle))
        self.draining[task] = (state.auditor, state, outcome, at_once)
        task.add_done_callback(self._drained)
        return asyncio.shield(task)

    async def _settle_whole(self, auditor: StreamAuditor, held: bytes | None, settle: Callable[[], None]) -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(self._readers(), auditor.read_whole, held)
        except Exception:  # (read_whole never raises: this is the thread pool's own failure)
            log.exception("llm-audit: failed to read a body off the event loop; it is read here")
        if not self.stopped:
            settle()

    def _readers(self) -> ThreadPoolExecutor:
        """The one reader thread (see :meth:`_open_off_loop`), made at its first use."""
        if self.readers is None:
            self.readers = ThreadPoolExecutor(1, thread_name_prefix="llm-audit-reader")
        return self.readers


class _Heavy(Exception):
    """A request body that decodes past what is read on the loop: read in the worker thread."""


def _loop_running() -> bool:
    """Whether an event loop runs here (mitmproxy's; not a test driving the hooks by hand)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _upgrades(request: http.Request) -> bool:
    """A WebSocket upgrade: no HTTP exchange to record (the WebSocket hooks audit it)."""
    return request.headers.get("upgrade", "").strip().lower() == "websocket"


def _turns(state: FlowState | None) -> Turns | None:
    return state.turns if isinstance(state, Recording | Streaming) else None


def _latest(state: Recorded) -> Recorded:
    """The exchange's state with its current turn's record (reading the body may end turns)."""
    current = _current_turn(state)
    return current if current is not None and not isinstance(current, Sniffing) else state


def _current_turn(state: FlowState | None) -> FlowState | None:
    """The flow's state with the record of its current turn (a long-lived stream's
    ``record`` is its first turn's)."""
    match state:
        case Recording(turns=Turns() as turns) if turns.record is not state.record:
            return dataclasses.replace(state, record=turns.record)
        case Streaming(turns=Turns() as turns) if turns.record is not state.record:
            return dataclasses.replace(state, record=turns.record)
    return state


def _status_fields(resp: http.Response | None) -> list[tuple[str, str]]:
    """The response's trailers, or the gRPC status of a header-only answer ("Trailers-Only")."""
    if resp is None:
        return []
    if resp.trailers:
        return list(resp.trailers.items(multi=True))
    return [(k, v) for k, v in resp.headers.items(multi=True) if k.lower().startswith("grpc-")]


def _costly_whole_body(flow: http.HTTPFlow, state: Streaming | HeldWhole) -> bool:
    """Whether the exchange ends with a whole body (not streamed: a JSON answer) whose
    reading is worth the reader thread: over :data:`HEAVY_BODY` of JSON or
    :data:`HEAVY_BINARY_BODY` of anything else, or compressed (what it decodes to is
    not known before)."""
    auditor, resp = state.auditor, flow.response
    if auditor.framing.streamed or not auditor.active or resp is None:
        return False
    if auditor.pending or (isinstance(state, HeldWhole) and "content-encoding" in resp.headers):
        return True
    size = len(resp.raw_content or b"") if isinstance(state, HeldWhole) else auditor.reader.held
    return size > (HEAVY_BODY if "json" in resp.headers.get("content-type", "") else HEAVY_BINARY_BODY)


def _auditor(state: Recorded) -> StreamAuditor | None:
    """The auditor reading the flow's body, once the response has begun."""
    return state.auditor if isinstance(state, Streaming | HeldWhole) else None


def _complete(flow: http.HTTPFlow, state: Recorded) -> None:
    """Read the rest of the body (a held one whole, replaced when a filter blocks it)
    and settle the record as complete."""
    match state:
        case Streaming(auditor=auditor):
            # (only gRPC's status travels in HTTP trailers; other framings' are not read)
            auditor.end(trailers=_status_fields(flow.response) if auditor.framing.name == "grpc" else ())
        case HeldWhole(auditor=auditor):
            auditor.read_whole((flow.response.raw_content if flow.response else None) or b"")  # (unless done)
            auditor.end()
            if auditor.stopped and auditor.gate is not None and auditor.gate.blocked is not None:
                replace_held(flow, state, auditor.gate.blocked)


def _settle_abort(flow: http.HTTPFlow, state: Recorded, outcome: str) -> str:
    """Read what an aborted exchange's auditor still holds and note why it failed; the
    outcome to finish it with (a client that hung up after the terminal event lost
    nothing)."""
    message = flow.error.msg if flow.error else None
    auditor = _auditor(state)
    if auditor is not None:
        auditor.catch_up()  # the record holds what came before it is judged
    if outcome == OUTCOME_CLIENT_ABORTED and client_had_everything(_latest(state).record):
        outcome = OUTCOME_COMPLETE
    if auditor is not None:
        if outcome != OUTCOME_CLIENT_ABORTED:
            auditor.end(cut_by_upstream=True)
        else:
            auditor.last_checks()  # (the text the client had: flag rules' verdicts)
            auditor.report_limits()
    record = _latest(state).record  # (of the turn current now: reading may have ended turns)
    if flow.response is not None and record.http_status is None:
        response_into_record(record, flow.response)  # refused before the responseheaders hook
    if message and refused_by_mitmproxy(message):
        record.fail("response_refused", message)
        record.add_finding("response_refused", message[:300])
    elif flow.response is None and outcome == OUTCOME_UPSTREAM_ABORTED:
        record.fail("upstream_error", message)
    return outcome


def _show(flow: http.HTTPFlow, state: Recorded) -> None:
    """Show the finished exchange in mitmproxy's UIs: the stream's copy as the body
    (unless mitmproxy stored the streamed body itself, ``store_streamed_bodies``) for
    the content view, and the flow list annotations. Only mitmproxy's flow changes: the
    client has had every byte by now."""
    try:
        copy = state.copy if isinstance(state, Streaming) else None
        if copy is not None and copy.data is not None and flow.response and flow.response.raw_content is None:
            flow.response.raw_content = bytes(copy.data)
        annotate(flow, state.record)
    except Exception:  # the record is written; this is only the UI
        log.exception("llm-audit: failed to annotate a flow")


async def _drain(auditor: StreamAuditor, settle: Callable[[], None]) -> None:
    """Read a backlog a slice at a time, yielding to the event loop between slices."""
    while auditor.drain():
        await asyncio.sleep(0)
    settle()


def _size_option(options: Any, name: str, minimum: int) -> int | None:
    """The option's value, or None (and the line naming the fix) when it is below ``minimum``."""
    value = getattr(options, name)
    if value >= minimum:
        return value
    log.error(
        f"llm-audit: {name} must be at least {minimum} (bytes), got {value}; "
        f"fix it with --set {name}={options.default(name)}"
    )
    return None
