"""The exchange record: one audited request/response, accumulated from common events.

The record is filled in three stages: the request side when the request is detected,
the response side event by event as the body passes, and the outcome when the exchange
ends. ``to_row()`` gives the dict the storage layer writes; its keys are the
``exchanges`` table's columns.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from operator import attrgetter
from typing import Any

from addon.dialects.blocking import FILTERED_CODE
from addon.events import (
    Event,
    Finding,
    Finish,
    PromptText,
    Replayed,
    ResponseMeta,
    ShownText,
    StreamEnd,
    StreamError,
    TextDelta,
    TextSnapshot,
    ToolCallDelta,
    TurnEnd,
    Usage,
)
from storage.memory import release_freed_memory

# At most this many findings of one code keep their detail; later ones are only
# counted, so a stream of a million broken events cannot grow the record without bound.
FINDINGS_PER_CODE = 20

# A finding's detail is kept up to this many characters: the record holds up to
# FINDINGS_PER_CODE of each code, so no upstream string quoted in one may grow it (the
# longest detail by design, server_prompt, is 8 KiB of the prompt and a header).
MAX_FINDING_DETAIL = 16 * 1024

# The most content (answer text, reasoning, refusals, tool arguments, tool names and ids:
# UTF-8 bytes) one record keeps; the proxy's llm_audit_max_record_bytes sets it per exchange.
DEFAULT_MAX_RECORD_BYTES = 32 * 1024 * 1024

# What the upstream names rather than sends as content is bounded by count, not by the
# content cap: an event naming a new choice or tool call costs the record an object
# whatever its size (400,000 one-event choices held 338 MB and took 370 ms to write).
# Events beyond these are counted, not kept (finding record_limit, see to_row).
MAX_CHOICES = 128  # OpenAI's n is at most 128; the other vendors send one choice
MAX_TOOL_CALLS = 4096  # per answer: agents make many, their names, ids and arguments count toward the cap
MAX_TOOL_KEY = 256  # characters of a call's key (an upstream's item or call id) it is assembled by
MAX_FINISH_REASON = 64  # characters of a stop reason (the vendors' are words: stop, MALFORMED_FUNCTION_CALL)


class Status(StrEnum):
    """An exchange's status, as stored in the ``status`` column (the values are the
    strings the database and ``llm-audit`` read). Only the record sets it: through
    :meth:`ExchangeRecord.block`, :meth:`ExchangeRecord.fail` and
    :meth:`ExchangeRecord.finish`."""

    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    BLOCKED = "blocked"
    CLIENT_ABORTED = "client_aborted"
    UPSTREAM_ABORTED = "upstream_aborted"


# Outcomes the proxy adapter reports when an exchange ends.
OUTCOME_COMPLETE = "complete"  # the body ended as HTTP defines it
OUTCOME_CLIENT_ABORTED = "client_aborted"
OUTCOME_UPSTREAM_ABORTED = "upstream_aborted"
# The usage counts that have a column of their own; any other (audio, text, image tokens) is in usage_details.
USAGE_COLUMNS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_write_input_tokens",
    "reasoning_output_tokens",
)


class TextParts:
    """Text arriving in many small pieces, kept compactly.

    A stream brings its answer a few characters per event; kept as a list of those
    pieces, each small string costs some 50 bytes of object header, several times the
    text itself. Every ``COMPACT_AT`` pieces are joined into one string, so the memory
    stays close to the text's own size and every character is copied a bounded number
    of times. :meth:`whole` gives the whole text.
    """

    COMPACT_AT = 256
    GROW_AT = 1 << 23  # characters from which :meth:`whole` grows the text instead of joining
    TRIM_EVERY = 1 << 24  # characters of parts freed between hand-backs while it grows
    __slots__ = ("_chunks", "_tail", "carried")

    def __init__(self) -> None:
        self._chunks: list[str] = []
        self._tail: list[str] = []
        self.carried = 0  # bytes of the text the stream carried, kept or not (the record's content_bytes)

    def append(self, piece: str) -> None:
        tail = self._tail
        tail.append(piece)
        if len(tail) >= self.COMPACT_AT:
            self._chunks.append("".join(tail))
            tail.clear()

    def __iter__(self):
        yield from self._chunks
        yield from self._tail

    def whole(self) -> str:
        """The whole text, joined once and kept as the only part: the record and the row
        built from it then share one string. Were the parts kept beside it, a huge answer
        would be held twice while its row is written (the record lives until the flow does)."""
        chunks, tail = self._chunks, self._tail
        if len(chunks) + len(tail) == 1:
            return chunks[0] if chunks else tail[0]
        if not chunks and not tail:
            return ""
        if tail:
            chunks.append("".join(tail))
            tail.clear()
        text = "".join(chunks) if sum(map(len, chunks)) < self.GROW_AT else self._grown()
        chunks[:] = (text,)
        return text

    def _grown(self) -> str:
        """The parts joined by growing the first one in place, each freed once appended.

        Why not ``"".join``: a join holds every part and the whole at once, twice the text
        (for a 200 MiB answer that was the proxy's peak). Here ``text += part`` on a string
        nothing else refers to is resized where it is (CPython's in-place concatenation,
        kept in every version since 2.4; a big string's block is grown by ``mremap``, not
        copied), each part is dropped as soon as it is in, and the freed parts' pages are
        handed back as it goes (glibc would keep them), so the text and its parts together
        stay near the text's size. ``tests/unit/test_writer_memory.py`` measures it.

        Interrupted (an exception while it grows), the parts are put back in order, the
        text grown so far first, so a later call gives the whole text. Only when CPython
        cannot grow the text (no memory) does it drop it: the parts after it are kept,
        and the caller's error, recorded as an ``audit_internal_error`` finding, says so.
        """
        parts = self._chunks
        parts.reverse()  # popped from the end: the first part first
        text = parts.pop()
        part: str | None = None  # popped, not yet in the text
        freed = 0
        try:
            while parts:
                part = parts.pop()
                text += part
                freed += len(part)
                part = None
                if freed >= self.TRIM_EVERY:
                    release_freed_memory()
                    freed = 0
        except BaseException:
            parts.reverse()
            if part is not None:
                parts.insert(0, part)
            try:
                parts.insert(0, text)
            except UnboundLocalError:  # the failed in-place append dropped it (MemoryError)
                pass
            raise
        release_freed_memory()
        return text

    def __bool__(self) -> bool:
        return bool(self._chunks or self._tail)

    def clear(self) -> None:
        """Drop the text (a snapshot replaces it: :class:`~addon.events.TextSnapshot`)."""
        self._chunks.clear()
        self._tail.clear()
        self.carried = 0


@dataclass(slots=True)
class Choice:
    """One alternative answer: its text, reasoning and refusal, and its stop reason."""

    text: TextParts = field(default_factory=TextParts)
    reasoning: TextParts = field(default_factory=TextParts)
    refusal: TextParts = field(default_factory=TextParts)
    finish_reason: str | None = None

    def as_dict(self, index: int) -> dict[str, Any]:
        out: dict[str, Any] = {"index": index, "text": self.text.whole(), "finish_reason": self.finish_reason}
        if self.reasoning:
            out["reasoning"] = self.reasoning.whole()
        if self.refusal:
            out["refusal"] = self.refusal.whole()
        return out


@dataclass(slots=True)
class ToolCall:
    """A tool call being assembled from fragments."""

    key: str
    choice: int
    id: str | None = None
    name: str | None = None
    arguments: TextParts = field(default_factory=TextParts)
    complete: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments.whole()}


@dataclass(slots=True)
class ExchangeRecord:
    """Everything the audit keeps about one exchange."""

    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    dialect: str = ""
    provider: str | None = None
    started_at: float | None = None
    first_chunk_at: float | None = None
    ended_at: float | None = None
    status: Status = Status.IN_PROGRESS
    # where it went and came from
    server_address: str | None = None
    server_port: int | None = None
    http_method: str | None = None
    url_path: str | None = None
    url_query: str | None = None
    http_version: str | None = None
    http_status: int | None = None
    client_address: str | None = None
    proxy_instance: str | None = None
    api_key_fingerprint: str | None = None
    request_headers: dict[str, str] | None = None
    response_headers: dict[str, str] | None = None
    # request side
    request_model: str | None = None
    request_id: str | None = None
    user_id: str | None = None
    session_id: str | None = None
    task_id: str | None = None
    stream_requested: bool | None = None
    request_body: Any = None
    # response side
    streamed: bool = False
    response_model: str | None = None
    response_id: str | None = None
    choices: dict[int, Choice] = field(default_factory=dict)
    tool_calls: dict[str, ToolCall] = field(default_factory=dict)
    usage: dict[str, int | None] = field(default_factory=dict)
    error_code: str | None = None
    error_message: str | None = None
    terminal_seen: bool = False
    event_count: int = 0
    replayed_events: int = 0
    bytes_to_client: int = 0
    bytes_from_upstream: int = 0
    delivered_text: str | None = None  # set when a content filter made it differ from the output
    client_status: int | None = None  # the proxy's status when it replaced an answer the upstream sent
    connection_id: str | None = None  # the long-lived stream this turn's record came over
    turn: int | None = None  # this answer's position in it
    client_finish_reasons: list[str] | None = None  # the stop reasons the client got when a filter ended the answer
    findings: list[dict[str, str]] = field(default_factory=list)
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    # the cap on kept content, and the true size of all the content the exchange carried
    content_limit: int = DEFAULT_MAX_RECORD_BYTES
    content_bytes: int = 0
    content_kept: int = 0
    _finding_counts: dict[str, int] = field(default_factory=dict)
    # events the count limits left out (MAX_CHOICES, MAX_TOOL_CALLS, MAX_FINISH_REASON), by
    # the LEFT_OUT key naming them: reported by to_row
    _left_out: dict[str, int] = field(default_factory=dict)
    # set by the audit store when it takes this record final (not a column): a second
    # final submission is refused before anyone counts it
    submitted_final: bool = False

    # -- accumulation -------------------------------------------------------------------

    def apply(self, event: Event) -> None:
        """Fold one common event into the record.

        Dispatched on the event's class through a dict (one lookup per event, where a
        ``match`` over the classes tried them one by one); a subclass of an event class
        is folded as its class is."""
        fold = _FOLD.get(type(event))
        if fold is None:
            fold = next((f for cls, f in _FOLD.items() if isinstance(event, cls)), None)
            if fold is None:
                return
        fold(self, event)

    def add_text(self, text: str) -> None:
        """``apply(TextDelta(text))`` without the event: answer text of choice 0, the
        auditor's fast path (:meth:`~addon.dialects.Normalizer.read`)."""
        size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        kept = self.content_kept + size
        if kept > self.content_limit or not text:
            self._text(TextDelta(text))  # the cap cuts it: the one careful way
            return
        c = self.choices.get(0)
        if c is None:
            self._text(TextDelta(text))  # the first text of choice 0: it may be past MAX_CHOICES
            return
        parts = c.text
        self.content_bytes += size
        self.content_kept = kept
        parts.carried += size
        parts.append(text)

    def _text(self, event: TextDelta) -> None:
        c = self._choice(event.choice)
        if c is None:
            return
        kind = event.kind
        parts = c.text if kind == "text" else c.reasoning if kind == "reasoning" else c.refusal
        carried = self.content_bytes
        if text := self._fit(event.text):
            parts.append(text)
        parts.carried += self.content_bytes - carried

    def _snapshot(self, event: TextSnapshot) -> None:
        self._replace_text(event.text, event.choice, event.kind)

    def _finish(self, event: Finish) -> None:
        c = self._choice(event.choice)
        if c is None:
            return
        reason = event.reason
        if len(reason) > MAX_FINISH_REASON:
            self._leave_out("finish_reason")
            reason = reason[:MAX_FINISH_REASON]
        c.finish_reason = reason

    def _usage(self, event: Usage) -> None:
        usage = self.usage
        for name, value in zip(_USAGE_FIELDS, _usage_values(event)):
            if value is None:
                continue
            if isinstance(value, int | float) and not 0 <= value <= MAX_TOKEN_COUNT:
                self.add_finding("usage_invalid", f"{name} = {str(value)[:40]} is not a token count; not recorded")
            else:
                usage[name] = value

    def _meta(self, event: ResponseMeta) -> None:
        self.response_model = event.model or self.response_model
        self.response_id = event.response_id or self.response_id
        self.request_id = self.request_id or event.request_id

    def _error(self, event: StreamError) -> None:
        self.error_code, self.error_message = event.code, event.message

    def _terminal(self, event: StreamEnd | TurnEnd) -> None:
        self.terminal_seen = True

    def _replayed(self, event: Replayed) -> None:
        self.event_count -= 1
        self.replayed_events += 1

    def _finding(self, event: Finding) -> None:
        self.add_finding(event.code, event.detail)

    def _ignored(self, event: Event) -> None:
        """Events for the output filters only (text ends, shown and prompt text)."""

    def add_finding(self, code: str, detail: str = "") -> None:
        """Record a finding; details beyond ``FINDINGS_PER_CODE`` per code are only counted."""
        n = self._finding_counts.get(code, 0) + 1
        self._finding_counts[code] = n
        if n <= FINDINGS_PER_CODE:
            self.findings.append({"code": code, "detail": detail[:MAX_FINDING_DETAIL]})

    def _leave_out(self, what: str) -> None:
        """Count an event a count limit left out of the record (``what``: a LEFT_OUT key);
        to_row reports the counts, so the limit is visible without a finding per event."""
        self._left_out[what] = self._left_out.get(what, 0) + 1

    @property
    def content_truncated(self) -> bool:
        return self.content_kept < self.content_bytes

    def _fit(self, piece: str) -> str:
        """What of ``piece`` the cap leaves room for; its size counts either way.

        Bounds the memory of one exchange by the cap, not by the stream's length, while
        the metadata (usage, finish reasons, errors) keeps being read.
        """
        size = len(piece) if piece.isascii() else len(piece.encode("utf-8", "surrogatepass"))
        self.content_bytes += size
        kept = self.content_kept + size
        if kept <= self.content_limit:
            self.content_kept = kept
            return piece
        room = self.content_limit - self.content_kept
        if room <= 0:
            return ""
        cut = piece.encode("utf-8", "surrogatepass")[:room].decode("utf-8", "ignore")
        self.content_kept += len(cut.encode("utf-8", "surrogatepass"))
        return cut

    def _choice(self, index: int) -> Choice | None:
        """The choice ``index`` (made by its first event), or None past MAX_CHOICES: an
        upstream naming a new index per event must not make an object per event."""
        c = self.choices.get(index)
        if c is None:
            if len(self.choices) >= MAX_CHOICES:
                self._leave_out("choice")
                return None
            c = self.choices[index] = Choice()
        return c

    def _replace_text(self, text: str, choice: int, kind: str) -> None:
        """A snapshot replaces a choice's text of ``kind``: the replaced text no longer
        counts as kept or carried content, the snapshot does."""
        c = self._choice(choice)
        if c is None:
            return
        parts = c.text if kind == "text" else c.reasoning if kind == "reasoning" else c.refusal
        self.content_kept -= sum(len(p.encode("utf-8", "surrogatepass")) for p in parts)
        self.content_bytes -= parts.carried
        parts.clear()
        carried = self.content_bytes
        if text := self._fit(text):
            parts.append(text)
        parts.carried = self.content_bytes - carried

    def _tool_fragment(self, d: ToolCallDelta) -> None:
        """Fold a tool-call fragment into its call (created by the first one of its key,
        up to MAX_TOOL_CALLS). Its name and id count toward the cap as its arguments do:
        they are the upstream's strings too, of any length."""
        key = d.key if len(d.key) <= MAX_TOOL_KEY else d.key[:MAX_TOOL_KEY]
        call = self.tool_calls.get(key)
        if call is None:
            if len(self.tool_calls) >= MAX_TOOL_CALLS:
                self._leave_out("tool_call")
                return
            call = self.tool_calls[key] = ToolCall(key=key, choice=d.choice)
        if not call.id and d.id:
            call.id = self._fit(d.id) or None
        if not call.name and d.name:
            call.name = self._fit(d.name) or None
        if d.arguments and (arguments := self._fit(d.arguments)):
            call.arguments.append(arguments)
        call.complete = call.complete or d.complete

    # -- outcome ------------------------------------------------------------------------

    @property
    def output_text(self) -> str:
        c = self.choices.get(0)
        return c.text.whole() if c else ""

    def block(self, message: str, finish_reasons: list[str] | None = None) -> None:
        """A content filter stopped this exchange. ``finish_reasons``: the stop reasons the
        proxy's answer gave the client (``[]`` when it got an error or a cut stream), which
        are then the record's ``finish_reasons``, so that the record says what the client
        got; ``None`` keeps the upstream's (the client had them)."""
        self.status, self.error_code, self.error_message = Status.BLOCKED, FILTERED_CODE, message
        self.client_finish_reasons = finish_reasons

    def fail(self, code: str, message: str | None) -> None:
        """The exchange failed for a reason the proxy saw (mitmproxy refused the
        upstream's response, the upstream could not be reached), not one the upstream
        reported in its body: :meth:`finish` then settles the status as ``failed``."""
        self.error_code, self.error_message = code, message

    def finish(self, outcome: str, ended_at: float | None = None) -> None:
        """Settle the status once the exchange is over.

        An error reported by the upstream (an ``error`` event or an HTTP error status)
        is the most informative fact, then who cut the stream; a response whose body
        ended without the dialect's terminal event (for a JSON body: without being one
        whole JSON object) was cut by the upstream.
        """
        self.ended_at = ended_at or time.time()
        if self.status == Status.BLOCKED:
            return  # what the proxy cut is not the upstream's fault
        for call in self.tool_calls.values():
            if not call.complete:
                self.add_finding("tool_call_truncated", f"{call.name or call.key}: arguments cut off")
        if self.error_code is not None or self.error_message is not None or (self.http_status or 0) >= 400:
            self.status = Status.FAILED
        elif outcome == OUTCOME_CLIENT_ABORTED:
            self.status = Status.CLIENT_ABORTED
        elif outcome == OUTCOME_UPSTREAM_ABORTED or not self.terminal_seen:
            self.status = Status.UPSTREAM_ABORTED
        else:
            self.status = Status.COMPLETED

    def to_row(self) -> dict[str, Any]:
        """The ``exchanges`` row for this record."""
        findings = list(self.findings)
        for code, n in self._finding_counts.items():
            if n > FINDINGS_PER_CODE:
                findings.append({"code": code, "detail": f"{n - FINDINGS_PER_CODE} more not listed"})
        for what, n in self._left_out.items():
            findings.append({"code": "record_limit", "detail": LEFT_OUT[what].format(n=n)})
        choices = [c.as_dict(i) for i, c in sorted(self.choices.items())]
        tool_calls = [t.as_dict() for t in self.tool_calls.values()]
        # Choice 0's text is stored once, as output_text, and each call's arguments once,
        # in tool_calls, not again in ``output``: the answer of a long stream (or a tool
        # call carrying a whole file) would otherwise be written, hashed and held twice
        # (writing a 16 MB answer's row took 0.20-0.33 s of CPU with it, 0.06 s without). Read
        # them back with exchange.transcript.output_choices() and output_tool_calls().
        output_text = next((c.pop("text") for c in choices if c["index"] == 0), "")
        return {
            "id": self.id,
            "started_at": _ts(self.started_at),
            "first_chunk_at": _ts(self.first_chunk_at),
            "ended_at": _ts(self.ended_at),
            "status": str(self.status),  # the plain string, as stored
            "dialect": self.dialect,
            "provider": self.provider,
            "server_address": self.server_address,
            "server_port": self.server_port,
            "http_method": self.http_method,
            "url_path": self.url_path,
            "url_query": self.url_query,
            "http_version": self.http_version,
            "http_status": self.http_status,
            "client_address": self.client_address,
            "proxy_instance": self.proxy_instance,
            "api_key_fingerprint": self.api_key_fingerprint,
            "request_headers": self.request_headers,
            "response_headers": self.response_headers,
            "request_model": self.request_model,
            "response_model": self.response_model,
            "response_id": self.response_id,
            "request_id": self.request_id,
            "user_id": self.user_id,
            "session_id": self.session_id,
            "task_id": self.task_id,
            "streamed": self.streamed,
            "request_body": self.request_body,
            "output_text": output_text,
            "output": {
                "choices": choices,
                "tool_calls": [{"id": t.id, "name": t.name, "complete": t.complete} for t in self.tool_calls.values()],
            },
            "tool_calls": tool_calls,
            "finish_reasons": self.client_finish_reasons
            if self.client_finish_reasons is not None
            else [c["finish_reason"] for c in choices if c["finish_reason"] is not None],
            "input_tokens": self.usage.get("input_tokens"),
            "output_tokens": self.usage.get("output_tokens"),
            "cache_read_input_tokens": self.usage.get("cache_read_input_tokens"),
            "cache_write_input_tokens": self.usage.get("cache_write_input_tokens"),
            "reasoning_output_tokens": self.usage.get("reasoning_output_tokens"),
            "usage_source": "provider" if self.usage else "none",
            "usage_details": {k: v for k, v in self.usage.items() if k not in USAGE_COLUMNS} or None,
            # priced by the writer, off the event loop (storage/cost.py)
            "cost_usd": None,
            "cost_prices": None,
            "error_code": self.error_code,
            "error_message": self.error_message,
            "findings": findings,
            "verdicts": self.verdicts,
            "event_count": self.event_count,
            "replayed_events": self.replayed_events,
            "bytes_to_client": self.bytes_to_client,
            "bytes_from_upstream": self.bytes_from_upstream,
            "delivered_text": self.delivered_text,
            "client_status": self.client_status,
            "connection_id": self.connection_id,
            "turn": self.turn,
        }


# What each count of ExchangeRecord._left_out says in its record_limit finding.
LEFT_OUT: dict[str, str] = {
    "choice": f"events of choices past the first {MAX_CHOICES} not kept: {{n}}",
    "tool_call": f"fragments of tool calls past the first {MAX_TOOL_CALLS} not kept: {{n}}",
    "finish_reason": f"stop reasons cut to {MAX_FINISH_REASON} characters: {{n}}",
}
# The largest token count recorded (2^53: exact as a double, and two of them add up within
# a 64-bit integer). The counts are the upstream's bytes: a negative count took from every
# sum of usage and a budget's total, two of 2^62 overflowed exchange_view.total_tokens on
# PostgreSQL (bigint out of range: no SELECT of the view over that row) and SQLite's sums.
MAX_TOKEN_COUNT = 2**53
_USAGE_FIELDS: tuple[str, ...] = Usage.__slots__
_usage_values = attrgetter(*_USAGE_FIELDS)  # all of a Usage's counts in one call
# How each event class is folded into the record (ExchangeRecord.apply).
_FOLD: dict[type, Any] = {
    ShownText: ExchangeRecord._ignored,
    PromptText: ExchangeRecord._ignored,
    TextDelta: ExchangeRecord._text,
    TextSnapshot: ExchangeRecord._snapshot,
    ToolCallDelta: ExchangeRecord._tool_fragment,
    Finish: ExchangeRecord._finish,
    Usage: ExchangeRecord._usage,
    ResponseMeta: ExchangeRecord._meta,
    StreamError: ExchangeRecord._error,
    StreamEnd: ExchangeRecord._terminal,
    TurnEnd: ExchangeRecord._terminal,
    Replayed: ExchangeRecord._replayed,
    Finding: ExchangeRecord._finding,
}


def _ts(t: float | None) -> datetime | None:
    """Epoch seconds to an aware UTC datetime (the storage layer's time type)."""
    return None if t is None else datetime.fromtimestamp(t, tz=UTC)
