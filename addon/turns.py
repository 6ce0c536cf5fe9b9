"""The records of one long-lived bidirectional stream, one per turn, and the tap that
reads its request body as the client sends it.

Cursor's chat (Connect over HTTP/2, ``StreamUnifiedChatWithTools``, ``agent.v1.AgentService/Run``)
keeps one stream open for a whole session: the client writes its prompt, tool results and
heartbeats on the request side while answers stream back, and neither side need end its
body. mitmproxy would hold such a request body until it ends (never), so the hooks stream
it (``flow.request.stream``) through :func:`make_request_tap`, and record the stream as a
sequence of turns:

- turn 0's record is opened (written ahead, ``in_progress``) when the request starts;
- a turn ends when its dialect reads the turn's end marker (:class:`~addon.events.TurnEnd`),
  or when nothing has arrived for ``llm_audit_turn_idle_seconds`` (finding
  ``turn_idle_timeout``: a marker whose field moved must not keep a record open for ever);
  its record is then written as complete at once, not when the stream ends;
- the next turn's record opens with the first thing of it that arrives after that (a
  client message with a prompt or a tool result, or an answer); a turn that only
  heartbeats or the stream's closing frame arrived for is not a record.

Every record of the stream has the same ``connection_id`` and its ``turn`` number.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Any

from addon.dialects import Dialect, RequestView, unkept_of
from addon.filters.api import BLOCK, Verdict
from addon.filters.engine import FILTER_ERROR
from addon.findings import UNREAD_MESSAGE
from addon.framing import Frame, Reader
from addon.record import OUTCOME_COMPLETE, ExchangeRecord, Status
from addon.redact import redact_values

log = logging.getLogger(__name__)

DEFAULT_TURN_IDLE_SECONDS = 60
# The request side of a turn a record keeps, at most (a client can send without end).
MAX_REQUEST_MESSAGES = 1000
# Reader findings that still hand the message over; any other means a message went unread.
READ_ANYWAY = frozenset({"envelope_reserved_flags", "sse_invalid_utf8"})

# What a turn's record takes over from the one before: the request side and the response's head.
_CARRIED = (
    "dialect",
    "provider",
    "server_address",
    "server_port",
    "http_method",
    "url_path",
    "url_query",
    "http_version",
    "http_status",
    "client_address",
    "proxy_instance",
    "api_key_fingerprint",
    "request_headers",
    "response_headers",
    "request_model",
    "user_id",
    "session_id",
    "task_id",
    "stream_requested",
    "streamed",
    "connection_id",
    "content_limit",
)
assert set(_CARRIED) <= {f.name for f in fields(ExchangeRecord)}


class Turns:
    """The turn records of one stream: the current one, and how each is written."""

    def __init__(
        self, first: ExchangeRecord, connection_id: str | None, submit: Callable[[ExchangeRecord], None]
    ) -> None:
        """``connection_id``: the stream's id when it has turns (else it is one exchange,
        whose request body merely streams: no id, no turn number, never idle-ended)."""
        if connection_id is not None:
            first.connection_id, first.turn = connection_id, 0
        self.record = first
        self.has_turns = connection_id is not None
        self.submit = submit
        self.opened = False  # the current turn's write-ahead row was submitted
        self.closed = False  # the exchange is recorded: what still arrives opens no record
        self.last_activity = time.monotonic()
        # While the tap handles a chunk, the turns it ends wait here to be written: what
        # the chunk sends for them is counted only once the gate has decided (see hold).
        self._held: list[ExchangeRecord] | None = None

    def open(self) -> None:
        """The current turn began (a prompt, an answer): write its record ahead, once.

        A record already settled (a filter blocked the turn in the chunk that began it)
        is not written ahead: it is final, and a final record written twice would take
        two links of the hash chain for one row; the turn's end writes it."""
        self.touch()
        if not self.opened and not self.closed:
            self.opened = True
            if self.record.status == Status.IN_PROGRESS:
                self.submit(self.record)

    def touch(self) -> None:
        """Something arrived (a heartbeat, say): the stream is not idle, but no turn begins."""
        self.last_activity = time.monotonic()

    def answered(self) -> None:
        """Response bytes were read: the turn begins once its record has an answer in it
        (text, a tool call, an error), not with a keep-alive or the stream's closing frame."""
        if _has_answer(self.record):
            self.open()
        else:
            self.touch()

    def close(self) -> None:
        """The stream's last record is written (its response ended, or it was cut): a
        client still sending on its half of the stream starts no turn that nobody ends."""
        self.closed = True

    def end_turn(self, record: ExchangeRecord) -> ExchangeRecord:
        """The current turn is over: write its record as complete; the next turn's record.

        An end marker for a turn that never began (nothing of it arrived) writes nothing:
        a stream of bare markers must not make a record each. A turn whose answer came
        with its end marker (in one chunk, before :meth:`answered` could open it) began."""
        if self.closed or (not self.opened and not _has_answer(record)):
            self.record = _next_turn(record, same_turn=True)
            return self.record
        record.finish(OUTCOME_COMPLETE)
        if self._held is not None:
            self._held.append(record)
        else:
            self.submit(record)
        self.record = _next_turn(record)
        self.opened = False
        return self.record

    def hold(self) -> None:
        """Keep the records of turns that end from now until :meth:`write_held`: the
        stream callable's chunk may end a turn before the bytes the client gets for it
        are known (a compressed chunk goes whole, once all it decodes to is checked)."""
        self._held = []

    def write_held(self) -> None:
        """Write the turns that ended while held, in order. Never raises."""
        held, self._held = self._held or [], None
        for record in held:
            try:
                self.submit(record)
            except Exception:  # (the stream callable's last line: it must not raise)
                log.exception("llm-audit: writing a turn's record failed")

    def idle_for(self, now: float) -> float:
        """How long an open turn has waited for anything (0 when no turn is open)."""
        return now - self.last_activity if self.opened and self.has_turns else 0.0

    @property
    def pending(self) -> bool:
        """The current turn has a record to write when the stream ends: it was opened,
        or its answer came without anything opening it (read only as the body ended)."""
        return self.opened or (not self.closed and _has_answer(self.record))


def _has_answer(record: ExchangeRecord) -> bool:
    """The turn's record has an answer in it (text, a tool call, an error), not only a
    keep-alive or the stream's closing frame."""
    return bool(
        record.choices or record.tool_calls or record.error_code is not None or record.error_message is not None
    )


def _next_turn(previous: ExchangeRecord, same_turn: bool = False) -> ExchangeRecord:
    """A fresh record for the turn after ``previous`` (or in its place), on the same stream."""
    carried: dict[str, Any] = {name: getattr(previous, name) for name in _CARRIED}
    turn = previous.turn if same_turn else (previous.turn or 0) + 1
    return ExchangeRecord(**carried, turn=turn, started_at=time.time())


class RequestTap:
    """The request body's stream callable: each message it completes is read into the
    current turn's record (its prompt, its tool results), which it opens when it starts
    a turn.

    Without request filters every chunk goes upstream as it came. With them (``check``)
    a message's bytes are held until it is complete and checked: one a filter blocks is
    not forwarded, nor is anything after it, and ``on_block`` ends the exchange towards
    the client. A message too large to check (over the reader's frame limit) follows
    the filter failure policy (``fail_open``).
    """

    def __init__(
        self,
        reader: Reader,
        dialect: Dialect,
        view: RequestView,
        turns: Turns,
        max_record_bytes: int,
        check: Callable[[ExchangeRecord, dict[str, Any]], Verdict | None] | None = None,
        on_block: Callable[[Verdict], None] | None = None,
        fail_open: bool = True,
    ) -> None:
        self.reader, self.dialect, self.view, self.turns = reader, dialect, view, turns
        self.max_record_bytes = max_record_bytes
        self.check, self.on_block, self.fail_open = check, on_block, fail_open
        self.blocked = False
        self._held = bytearray()  # (with check) bytes not yet released: the message being read
        self._held_from = 0  # offset of _held[0] in the body

    def __call__(self, chunk: bytes) -> bytes | list[bytes]:
        if self.blocked:
            return []  # nothing after a blocked message goes upstream
        if self.turns.closed:
            # The exchange is recorded (its response ended): its records are final and
            # sealed, so nothing more is read into them (the row the writer holds shares
            # their request body). What the client still sends goes unread; with request
            # filters, unchecked it does not go at all (the RPC is over: an upstream
            # discards it anyway).
            return chunk if self.check is None else ([] if chunk else b"")
        try:
            if self.check is None:
                self._read(self.reader.feed(chunk) if chunk else self.reader.end())
                return chunk
            return self._checked(chunk)
        except Exception as e:  # our bug: the failure policy decides, as for a filter that fails
            log.exception("llm-audit: reading a streamed request failed")
            self.turns.record.add_finding("audit_internal_error", f"request stream: {type(e).__name__}: {e}"[:300])
            if self.check is None:
                return chunk  # (the fast path holds nothing)
            if not self.fail_open:
                return self._block(unchecked("the audit failed"), self._held_from)
            self.check = None  # what is held (this chunk included) goes, unchecked from here
            out, self._held = bytes(self._held), bytearray()
            return out

    def _read(self, frames: Sequence[Frame]) -> None:
        for frame in frames:
            self._message(frame)
        self._collect_findings()

    def _message(self, frame: Frame) -> tuple[dict[str, Any], str | None]:
        """Read one client message into the current turn: its reading, and why it could
        not be read whole (a protobuf cut short, say), else None."""
        raw = getattr(frame, "raw", None)
        payload = raw if isinstance(raw, bytes) else frame.data.encode()
        if not payload:
            self.turns.touch()  # an empty message (a keep-alive): nothing to read
            return {}, None
        doc, findings = self.dialect.parse_request_message(payload, self.view)
        record = self.turns.record
        merge_request(record, doc, self.max_record_bytes)
        for finding in findings:
            record.apply(finding)
        if doc.get("messages") or findings:  # a prompt or a tool result (or what could not be read)
            self.turns.open()
        else:  # a heartbeat, a control message
            self.turns.touch()
        unread = next((f"{f.code}: {f.detail}" for f in findings if f.code in UNREAD_MESSAGE), None)
        return doc, unread

    def _checked(self, chunk: bytes) -> bytes | list[bytes]:
        """Hold the message being read; release each one the filters pass.

        A message that cannot be checked (its dialect could not read it whole, the reader
        skipped it: too large, not decompressible) follows the failure policy: with
        ``fail_open`` it passes unchecked, and the messages after it are checked again;
        else it is blocked like one a filter blocks.
        """
        self._held += chunk
        release = self._held_from
        bounded = self.reader.feed_bounded(chunk) if chunk else [(f, None) for f in self.reader.end()]
        for frame, end in bounded:
            if frame is not None:
                doc, unread = self._message(frame)
                verdict = self._verdict(doc)
                if verdict is None and unread is not None and not self.fail_open:
                    verdict = unchecked(unread)
                if verdict is not None:
                    return self._block(verdict, release)
            elif not self.fail_open and (problem := self._reader_problem(collect=False)) is not None:
                return self._block(unchecked(problem), release)  # (bytes of a message the reader skipped)
            release = self._held_from + len(self._held) if end is None else end
        problem = self._reader_problem()
        if problem is not None:
            if not self.fail_open:
                return self._block(unchecked(problem), release)
            release = self._held_from + len(self._held)  # (what the reader skipped passes unchecked)
        if not chunk:
            release = self._held_from + len(self._held)  # the body ended: what is left goes
        return self._release(release) or ([] if chunk else b"")

    def _reader_problem(self, collect: bool = True) -> str | None:
        """Why the reader could not hand over a message it read past (None: it could);
        ``collect``: its findings go to the record now."""
        reader = self.reader
        problem = next((f"{code}: {detail}" for code, detail in reader.findings if code not in READ_ANYWAY), None)
        if problem is None and reader.unreadable is not None:
            problem = reader.unreadable
        if problem is None and reader.held > self.reader_limit:
            problem = f"a request message over {self.reader_limit} bytes"
        if collect:
            self._collect_findings()
        return problem

    @property
    def reader_limit(self) -> int:
        return getattr(self.reader, "max_event_bytes", 8 * 1024 * 1024)

    def _release(self, upto: int) -> bytes:
        n = upto - self._held_from
        out = bytes(self._held[:n])
        del self._held[:n]
        self._held_from = upto
        return out

    def _block(self, verdict: Verdict, release: int) -> bytes | list[bytes]:
        """A filter blocked a message: it and what follows stay here; the messages before go."""
        self.blocked = True
        self._collect_findings()
        out = self._release(release)
        self._held = bytearray()
        if self.on_block is not None:
            self.on_block(verdict)
        return out or []

    def _verdict(self, doc: dict[str, Any]) -> Verdict | None:
        return self.check(self.turns.record, doc) if self.check is not None and (doc or unkept_of(doc)) else None

    def _collect_findings(self) -> None:
        findings = self.reader.findings
        if findings:
            for code, detail in findings:
                self.turns.record.add_finding(code, detail)
            findings.clear()


def unchecked(problem: str) -> Verdict:
    """The verdict on a request message the filters could not check (failure policy closed)."""
    reason = f"a request message could not be checked ({problem})"[:300]
    return Verdict(BLOCK, FILTER_ERROR, reason, filter="llm-audit", location="request")


def merge_request(record: ExchangeRecord, doc: dict[str, Any], max_record_bytes: int) -> None:
    """Add one client message's reading to the turn's request body: its conversation
    messages appended, the first model named kept."""
    if not doc:
        return
    body = record.request_body if isinstance(record.request_body, dict) else {}
    messages = body.setdefault("messages", [])
    new = doc.get("messages") or []
    if len(messages) + len(new) > MAX_REQUEST_MESSAGES or _size(messages) > max_record_bytes:
        record.add_finding(
            "content_truncated",
            f"more than {MAX_REQUEST_MESSAGES} request messages or {max_record_bytes} bytes in one turn; the rest not kept",
        )
    else:
        messages.extend(new)
    for key, value in doc.items():
        if key != "messages" and key not in body:
            body[key] = redact_values(value) if key == "tools" else value  # (an MCP tool carries its server's key)
    record.request_body = body
    model = doc.get("model")
    if isinstance(model, str) and model and not record.request_model:
        record.request_model = model


def _size(messages: list[Any]) -> int:
    return sum(len(str(m.get("content", ""))) if isinstance(m, dict) else 0 for m in messages)
