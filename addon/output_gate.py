"""Holding a stream's bytes back until the content filters have passed the text they carry.

A blocking filter must see a secret whole before any of it reaches the client, however
the upstream cuts it across events and chunks. :class:`~addon.filters.engine.OutputGuard`
decides, character by character, which output text may go out; this module turns that
into bytes: the client gets the upstream's own bytes, unchanged and in order, each
event as soon as all the text it carries is released. Nothing is re-encoded, so a
stream that is never blocked reaches the client byte for byte as it left the upstream,
only later by what the window needs.

How bytes map to text. The exchange's framing reader (:mod:`addon.framing`) reports the
decoded offset where every frame ends (an SSE event's blank line, a JSON-array element's
last byte), and where bytes that carry no frame end (a comment, line ends between events,
the array's closing bracket); the gate holds and releases by those boundaries only, and
never looks at the bytes itself. A frame's text pieces are
positions in the guard's streams; once every one of them is released (and every event
before it), the bytes up to the event's end may go. Without a Content-Encoding a raw
chunk is cut at that offset; a compressed chunk goes whole once all it decodes to may
go (a client cannot decode more from it than the proxy did). The proxy asks the
upstream for an uncompressed body when it may block, so that this is the rare case.

When the guard blocks, the held bytes are dropped and the stream is ended with the
dialect's own termination (:meth:`~addon.dialects.Normalizer.termination`). It must
continue from what the client received, not from what the proxy read ahead, so a
second normalizer (``forwarded``) reads exactly the released events; it also gives the
text the client was shown.

The auditor hands the gate each chunk once (:meth:`OutputGate.feed`: the raw bytes, what
they decoded to, the frames read with their events and ends) and gets back the bytes the
client may have; the gate does not call back. A gate that holds nothing checks the text
deltas of one hand-off as one piece per stream (:meth:`OutputGate._check_frames`).

Sans-IO: bytes and events in, bytes out; the proxy sends them and ends the stream.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from addon.dialects import Normalizer
from addon.events import (
    Event,
    Finding,
    ShownText,
    StreamError,
    TextDelta,
    TextSnapshot,
    ToolCallDelta,
    TurnEnd,
)
from addon.filters.api import BLOCK, FLAG, Verdict
from addon.filters.engine import FILTER_ERROR, MAX_STREAMS, USER_PIECE, OutputGuard, Release, StreamKey
from addon.filters.json_text import JsonEscapes
from addon.framing import Frame

#: One frame as the auditor read it: the frame (None: bytes that end without one), the
#: common events the dialect made of it, the decoded offset just past it, and the frame's
#: JSON object when the auditor's normalizer read it as text alone (its ``parsed``; else
#: None): the gate's normalizer reads the frame from that instead of parsing it again.
Framed = tuple[Frame | None, Sequence[Event], int, Any]
#: Characters of a whole body's text checked as one piece (:meth:`OutputGate.on_body`):
#: the bound a user filter's call has (:data:`~addon.filters.engine.USER_PIECE`), one for both.
BODY_PIECE = USER_PIECE


@dataclass(slots=True)
class _Held:
    """A completed frame the client has not received yet (``event`` None: bytes without one)."""

    end: int  # decoded offset just past the frame
    event: Frame | None
    needs: list[tuple[StreamKey, int]] | None  # stream positions the guard must release first (None: never)
    parsed: Any  # the frame's JSON object as the auditor parsed it (Framed), or None


def _cleared(needs: list[tuple[StreamKey, int]] | None, released: Callable[[StreamKey], int]) -> bool:
    """Whether the guard has released every stream position a held event needs.

    (A loop rather than ``any()`` over a generator of progress tuples: this runs for
    every event of a filtered stream; in process, 100 rules on 1 KiB deltas, the gate
    went 67.5 -> 62.0 us per event.)"""
    if needs is None:
        return False
    for key, pos in needs:
        if released(key) < pos:
            return False
    return True


def _still_needed(needs: list[tuple[StreamKey, int]], going_on: tuple[int, ...]) -> list[tuple[StreamKey, int]]:
    """What a held frame still waits for once a turn ended: positions in the streams of
    the answers ``going_on`` (the ended ones' are all released, and forgotten)."""
    return [need for need in needs if need[0][0] in going_on] if going_on else []


class OutputGate:
    """Releases an event stream's bytes as the guard clears the text they carry.

    ``holds`` False (only flag rules: nothing can block) checks the output the same
    way but forwards every chunk as it arrives. ``split_raw``: the body has no
    Content-Encoding, so raw offsets are decoded offsets and chunks may be cut.
    ``whole``: the body is read whole (a JSON answer): mitmproxy holds it while it may
    block, and a block replaces it. ``flags_only``: no filter of the guard can block, so the gate never holds or ends
    anything; the auditor then forwards the chunks itself and hands the gate only what it
    read (:class:`~addon.auditor.StreamAuditor` reads such a stream in runs).
    """

    def __init__(
        self,
        guard: OutputGuard,
        forwarded: Normalizer,
        *,
        holds: bool,
        split_raw: bool,
        failure: str,
        whole: bool = False,
    ) -> None:
        self.guard = guard
        self.forwarded = forwarded
        forwarded.keeps_delivered = True  # it reads only what the client gets: its termination may repeat it
        self.holds = holds
        self.whole = whole
        self.flags_only = not guard.may_block
        self.split_raw = split_raw
        self.failure = failure
        self.verdicts: list[Verdict] = []  # new verdicts, taken by the auditor
        self.delivered: list[str] = []  # choice 0's answer text as the client received it
        self.blocked: Verdict | None = None
        self.ended = False  # finish() made the last check of every stream
        self._raw: deque[tuple[bytes, int]] = deque()  # (raw chunk or its rest, decoded offset it reaches)
        self._decoded = 0  # decoded bytes of the body so far
        self._held: deque[_Held] = deque()
        self._free = 0  # decoded offset up to which the client may have the bytes
        # A compressed chunk goes whole, maybe after the frames it carries are cleared (a
        # later frame in it waits, or is blocked): its frames count as delivered only when
        # it is sent. ``deliver_on_send`` False counts them when cleared (a stream of turns
        # sets it: a turn's record must say what it got before the chunk's fate is known).
        self.deliver_on_send = not split_raw
        self._unsent: deque[tuple[int, Frame, Any]] = deque()  # (end, frame, parsed) cleared, its chunk not gone yet
        self._sent = 0  # the decoded offset the chunks sent so far reach
        self._escapes: dict[StreamKey, JsonEscapes] = {}  # each tool call's arguments, read as the tool reads them
        self._uncounted = False  # (a gate that only flags) said that streams past MAX_STREAMS went unchecked
        self._writing: StreamKey | None = None  # the stream the last text was of (see _check)
        self._let_go: set[StreamKey] = set()  # streams whose held text was let go, not fed since (see idle)

    # -- input ----------------------------------------------------------------------------

    def feed(self, raw: bytes | None, decoded: int, framed: Iterable[Framed]) -> bytes:
        """One step of the stream: the bytes the client may have now.

        ``raw``: a chunk from the upstream (None: none, e.g. a backlog read later);
        ``decoded``: how many decoded bytes were read since the last step (they belong to
        the last raw chunk); ``framed``: the frames those bytes completed, in order, each
        checked here and held until the guard releases all the text it carries. Once
        blocked, what was cleared before the block.
        """
        if raw is not None:
            self._raw.append((raw, self._decoded))
        self._decoded += decoded
        if self._raw:  # (without holding, what was read may come after its chunk went out)
            self._raw[-1] = (self._raw[-1][0], self._decoded)
        self._check_frames(framed)
        return self._release()

    def _check_frames(self, framed: Iterable[Framed]) -> None:
        """Check the frames of one hand-off, in order. Held, each frame is checked on its
        own. Not held (the gate only flags, or stopped holding under ``failure=open``),
        consecutive frames that are each one text delta of the same stream (nearly every
        frame) are fed to the guard as one piece: a gate that only flags is handed a
        whole run of a stream read in runs, and one check of a run's text costs less than
        one per event (the guard finds the same matches wherever its input is cut).

        Why not when held: mitmproxy hands the stream callable one HTTP chunk at a time,
        and upstreams send about one event per chunk, so there is rarely a batch to
        check (100 rules, 1 KiB deltas flat out through the proxy: 1.007× the frame by
        frame checks, ``scripts/bench --against``), while a batch that blocks would
        release none of its frames, where frame by frame the clear ones before the
        blocking one go out.
        """
        if self.holds:
            for item in framed:
                self._on_frame(*item)
            return
        key: StreamKey = (0, "text", None)
        batch: list[str] = []
        for item in framed:
            common = item[1]
            if len(common) == 1 and type(ev := common[0]) is TextDelta:
                stream = (ev.choice, ev.kind, None)
                if batch and stream != key:
                    self._check_batch(key, batch)
                    batch = []
                key = stream
                batch.append(ev.as_sent)
                continue
            if batch:
                self._check_batch(key, batch)
                batch = []
            self._on_frame(*item)
        if batch:
            self._check_batch(key, batch)

    def _check_batch(self, stream: StreamKey, texts: list[str]) -> None:
        """Check consecutive text deltas of ``stream`` that nothing holds as one piece."""
        if self.blocked is None:
            self._feed(stream, "".join(texts), [])

    def _on_frame(self, event: Frame | None, common: Iterable[Event], end: int, parsed: Any) -> None:
        """A frame of the stream is complete: check the output it carries.

        Once blocked, later events are not kept: nothing after the blocking one goes out.
        """
        if self.blocked is not None:
            return
        needs: list[tuple[StreamKey, int]] = []
        for ev in common:
            self._check(ev, needs)
            if self.blocked is not None:
                break
        if self.holds:  # (an event carrying the block is never released: it needs what never comes)
            self._held.append(_Held(end, event, None if self.blocked is not None else needs, parsed))

    def on_body(self, common: Iterable[Event], *, answer: bool = True) -> None:
        """A whole body (a JSON answer): check all its output at once.

        Consecutive text of one stream is checked as one piece, as a gate that holds
        nothing checks a run (:meth:`_check_frames`): the guard finds the same matches
        however its input is cut, but for a match longer than it holds back across a cut
        (an unbounded regex's window), and none of a whole body goes out before all of it
        is checked. One by one, the 300,000 tiny text blocks of an 11 MB Anthropic answer
        took 1.9 s under one keyword rule. A piece holds whole text blocks up to about
        :data:`BODY_PIECE` characters (a user filter's time budget is per call); one block
        longer than that is one piece, one search: cut, a rule's match longer than what
        the guard holds back across a cut (an unbounded regex's window) would pass, where
        whole it is found (the proxy reads a whole body in its reader thread).

        An answer (``answer``: a 2xx body with content; not a redirect, a 204, an empty
        body or an error's) that is not the JSON its dialect reads (``response_invalid_json``)
        is unreadable to the filters, whatever a client makes of it (the Python SDKs read
        UTF-16 and UTF-32 too): the failure policy decides, as for a stream that cannot be
        read (:meth:`unreadable`)."""
        key: StreamKey = (0, "text", None)
        batch: list[str] = []
        size = 0
        errored = not answer  # (an error's body that is not JSON was read as its text: the error's message)
        for ev in common:
            if type(ev) is TextDelta:
                stream = (ev.choice, ev.kind, None)
                if batch and (stream != key or size >= BODY_PIECE):
                    self._check_batch(key, batch)
                    batch, size = [], 0
                key = stream
                text = ev.as_sent
                batch.append(text)
                size += len(text)
                continue
            if batch:
                self._check_batch(key, batch)
                batch, size = [], 0
            if self.blocked is not None:
                return
            errored = errored or type(ev) is StreamError
            if type(ev) is Finding and ev.code == "response_invalid_json" and not errored:
                self.unreadable(f"{ev.code}: {ev.detail}")
                if self.blocked is not None:
                    return
            self._check(ev, [])
        if batch:
            self._check_batch(key, batch)
        if self.blocked is None:
            self._settle(self.guard.flush_all().values())
        self.ended = True  # (the last check of every stream: the auditor's last_checks makes none again)

    def end_turn(self) -> None:
        """The current turn ended without a frame saying so (the proxy's idle end of a
        turn), for a gate that holds nothing: its text is whole, as at a turn's end marker."""
        if self.blocked is None:
            self._end_turn([])

    def unreadable(self, reason: str) -> None:
        """The output cannot be checked (an event too large to parse): the failure policy decides.

        ``closed`` blocks; ``open`` records it and lets the rest of the stream through
        unchecked (nothing is held from here on). A whole body's gate holds nothing
        itself, but the body is held (by mitmproxy) when the gate may block: it decides too.
        """
        if self.blocked is not None or not (self.holds or (self.whole and not self.flags_only)):
            return
        verdict = Verdict(
            FLAG if self.failure == "open" else BLOCK, FILTER_ERROR, reason, filter="llm-audit", location="output"
        )
        self.verdicts.append(verdict)
        if verdict.action == FLAG:
            self.holds = False
            self._held.clear()
            self._deliver_unsent()  # (their chunks go with the rest now)
        else:
            self.blocked = verdict

    # -- output ---------------------------------------------------------------------------

    def _release(self) -> bytes:
        """The raw bytes the client may have now: once blocked, what was cleared before the block."""
        if not self.holds:
            if not self._raw:
                return b""
            out = b"".join(entry[0] for entry in self._raw)
            self._raw.clear()
            return out
        released = self.guard.released
        on_send = self.deliver_on_send
        while self._held:
            held = self._held[0]
            if not _cleared(held.needs, released):
                break
            self._held.popleft()
            if held.event is not None:
                if on_send:
                    self._unsent.append((held.end, held.event, held.parsed))
                else:
                    self._deliver(held.event, held.parsed)
            self._free = max(self._free, held.end)
        out = self._take(self._free)
        if on_send:
            self._deliver_unsent(self._sent)
        return out

    def _deliver_unsent(self, upto: int | None = None) -> None:
        """Count as delivered the cleared frames whose bytes went out: those ending by the
        decoded offset ``upto`` (None: all, their chunks go now)."""
        unsent = self._unsent
        while unsent and (upto is None or unsent[0][0] <= upto):
            _, event, parsed = unsent.popleft()
            self._deliver(event, parsed)

    def finish(self) -> bytes:
        """The body is over: a last check of every stream (a match only the end decides is
        found here), then what may still go.

        Bytes after the reader's last boundary (a cut-off event) are not released: no
        filter has seen the text they carry, and an event source discards them anyway.
        """
        if self.blocked is None:
            self._settle(self.guard.flush_all().values())
        self.ended = True
        return self._release()

    def take_all(self) -> bytes:
        """Every raw byte not released yet, as it came, and nothing held from here: for
        the caller's own failure under the failure policy ``open`` (what was held goes
        unchecked rather than being lost)."""
        out = b"".join(chunk for chunk, _ in self._raw)
        self._raw.clear()
        self._held.clear()
        self._deliver_unsent()
        self.holds = False
        return out

    def termination(self) -> bytes:
        """The end of a blocked stream in its own dialect, continuing what the client got."""
        verdict = self.blocked
        return self.forwarded.termination(verdict.rule_id, verdict.reason) if verdict is not None else b""

    def termination_trailers(self) -> list[tuple[str, str]]:
        """The trailers that end a blocked stream whose status travels in trailers (gRPC)."""
        verdict = self.blocked
        return self.forwarded.termination_trailers(verdict.rule_id, verdict.reason) if verdict is not None else []

    @property
    def delivered_text(self) -> str:
        return "".join(self.delivered)

    # -- internals ------------------------------------------------------------------------

    def _check(self, ev: Event, needs: list[tuple[StreamKey, int]]) -> None:
        """Feed the guard every string of ``ev`` a client may show a person: text of any
        kind, a tool call's name and arguments, an error's message.

        A stream's text is one text until the body ends (:meth:`finish`) or its turn does:
        the end of a content block, a stop reason, an error, even the terminal event is
        no place to stop looking for a match, since the clients join the text across them
        (the SDKs concatenate a choice's deltas after a ``finish_reason``, Anthropic's
        ``get_final_text`` joins the text blocks, and they read on after
        ``message_stop``). So a match cut across any of them is still one match. What a
        stream holds waits only while that stream is being written: when another's text
        comes (a tool call after the text, the answer after the reasoning) it goes, so
        the other's bytes are not held behind it for the rest of the answer, and the
        stream is still read as one text (:meth:`StreamScanner.let_go`). Names and error
        messages arrive whole and are checked whole."""
        match ev:
            case TextDelta(choice=choice, kind=kind):  # (as sent: what the record keeps may differ)
                self._feed((choice, kind, None), ev.as_sent, needs)
            case ShownText(text=text, choice=choice, kind="payload"):
                self._beside((choice, "payload", None), text, needs)
            case ShownText(text=text, choice=choice, kind=kind) | TextSnapshot(text=text, choice=choice, kind=kind):
                self._whole((choice, kind, None), text, needs)
            case ToolCallDelta(key=key, name=name, choice=choice, free_form=free_form):
                if name:
                    self._whole((choice, "tool_name", key), name, needs)
                if arguments := ev.arguments_sent:
                    self._arguments((choice, "tool_arguments", key), arguments, free_form, needs)
            case StreamError(message=message):
                if message:
                    self._whole((0, "error", None), message, needs)
            case TurnEnd(going_on=going_on):  # (a turn's end: its answer is whole, nothing waits for more)
                self._end_turn(needs, going_on)
            case Finding(code="text_interleaved" | "strings_unread" | "json_too_costly" as code, detail=detail):
                self.unreadable(f"{code}: {detail}")  # (the filters cannot read it as the client shows it)

    def _feed(self, stream: StreamKey, text: str, needs: list[tuple[StreamKey, int]]) -> None:
        if not self.guard.takes(stream):
            self._too_many()
            return
        if stream != self._writing:  # (another stream's bytes must not wait behind what this one held)
            writing = self._writing
            if writing is not None:
                length, released = self.guard.progress(writing)
                if released < length:  # (a match may still be in progress there: see idle)
                    self._let_go.add(writing)
                self._settle([self.guard.let_go(writing)])
            self._let_go.discard(stream)
            self._writing = stream
        choice, kind, tool_key = stream
        self._settle([self.guard.feed(text, choice=choice, kind=kind, tool_key=tool_key)])
        needs.append((stream, self.guard.progress(stream)[0]))  # released up to here: the event may go

    def _arguments(
        self, stream: StreamKey, arguments: str, free_form: bool, needs: list[tuple[StreamKey, int]]
    ) -> None:
        """A tool call's arguments, checked as the tool reads them: JSON with its string
        escapes decoded, or (a custom tool's input) free text as it is."""
        if not free_form:
            escapes = self._escapes.get(stream)
            if escapes is None:
                if not self.guard.takes(stream):
                    self._too_many()
                    return
                escapes = self._escapes[stream] = JsonEscapes()
            arguments = escapes.feed(arguments)
        self._feed(stream, arguments, needs)

    def _whole(self, stream: StreamKey, text: str, needs: list[tuple[StreamKey, int]]) -> None:
        """A string that arrives whole (a name, a message): checked and released at once."""
        self._feed(stream, text, needs)
        self._flush(stream)

    def _beside(self, stream: StreamKey, text: str, needs: list[tuple[StreamKey, int]]) -> None:
        """A message's whole text checked beside the stream being written (a protobuf
        answer's bytes read as text, :func:`~addon.dialects.rpc.payload_text`): checked
        and flushed at once, with no switch of streams, so the text stream keeps what it
        holds (the event carrying this waits behind it, in order). A switch here would let
        go of the text's held tail at every message of the answer."""
        if not self.guard.takes(stream):
            self._too_many()
            return
        choice, kind, tool_key = stream
        self._settle([self.guard.feed(text, choice=choice, kind=kind, tool_key=tool_key)])
        self._flush(stream)
        needs.append((stream, self.guard.progress(stream)[0]))

    def _end_turn(self, needs: list[tuple[StreamKey, int]], going_on: tuple[int, ...] = ()) -> None:
        """A turn's end: every stream is checked to its end and all its text released, and
        the next turn's streams start afresh (a long stream of turns would otherwise
        count every stream of every turn against MAX_STREAMS, and keep their scanners).
        What the frames held so far wait for is released: they need nothing now.

        ``going_on`` (the :class:`~addon.events.TurnEnd`'s): the choices of answers still in
        progress beside the one that ended (OpenAI Realtime's responses at once). Only the
        ended answer's streams end here (a match at its very end is still found); the
        others' are left as they are, their held text and what their checks know kept, and
        the frames held for them still wait for them: a word cut across the other
        answer's end is one word."""
        self._settle(self.guard.flush_all(going_on).values())
        if self.blocked is not None:
            return
        for held in self._held:
            if held.needs is not None:
                held.needs = _still_needed(held.needs, going_on)
        needs[:] = _still_needed(needs, going_on)
        self.guard.forget(going_on)
        self._escapes = {key: escapes for key, escapes in self._escapes.items() if key[0] in going_on}
        if self._let_go:
            self._let_go = {key for key in self._let_go if key[0] in going_on}
        if self._writing is not None and self._writing[0] not in going_on:
            self._writing = None

    def idle(self, going_on: Collection[int]) -> bool:
        """Whether a fresh gate (with other filters: a rules reload) may take over the
        answers on the choices ``going_on`` now, at a turn's end, without dropping
        anything or missing a match of the rules this one checks: nothing is blocked,
        held or unsent, every stream has released all its text, and none has a match
        in progress (a stream whose held text was let go for another's, :meth:`_feed`,
        is one until it is fed again: a later piece may still complete a match there,
        which this gate would block and a fresh one would not see begin). A stream
        holds nothing only where no match of a blocking rule may be in progress, so
        none spans the hand-over; a flag rule's may (it holds nothing), and a fresh
        gate reads the rest of each answer going on as a text of its own."""
        if self.blocked is not None or self._held or self._raw or self._unsent:
            return False
        return not any(key[0] in going_on for key in self._let_go)

    def hand_over(self, fresh: OutputGate, going_on: Collection[int]) -> None:
        """``fresh`` takes over the answers on the choices ``going_on`` from this gate,
        which is :meth:`idle`: their tool calls' argument decoders go with them (one may
        hold the start of an escape whose bytes the client has, its character not read)."""
        fresh._escapes.update((key, e) for key, e in self._escapes.items() if key[0] in going_on)

    def _too_many(self) -> None:
        """An answer with more text streams (choices, tool calls) than the guard checks:
        the failure policy decides, as for any output that cannot be checked; a gate that
        only flags says so once and checks the streams it has."""
        reason = f"more than {MAX_STREAMS} text streams (choices, tool calls) in one answer"
        if self.holds:
            self.unreadable(reason)
        elif not self._uncounted:
            self._uncounted = True
            self.verdicts.append(
                Verdict(FLAG, FILTER_ERROR, reason + ": the rest not checked", filter="llm-audit", location="output")
            )

    def _flush(self, stream: StreamKey) -> None:
        choice, kind, tool_key = stream
        self._settle([self.guard.flush(choice=choice, kind=kind, tool_key=tool_key)])

    def _settle(self, releases: Iterable[Release]) -> None:
        """Collect the verdicts; the guard counts what it released."""
        for release in releases:
            self.verdicts.extend(release.verdicts)
        self.blocked = self.guard.blocked

    def _deliver(self, event: Frame, parsed: Any) -> None:
        # (the hot path's answer: the text alone, or the events; a frame the auditor
        # parsed is not parsed again: in process, 100 rules on 1 KiB deltas, see BENCHMARKS.md)
        got = self.forwarded.read(event) if parsed is None else self.forwarded.read_parsed(event, parsed)
        if isinstance(got, str):
            self.delivered.append(got)
            return
        for ev in got:
            if isinstance(ev, TextDelta) and ev.choice == 0 and ev.kind == "text":
                self.delivered.append(ev.text)
            elif isinstance(ev, TextSnapshot) and ev.choice == 0 and ev.kind == "text":
                self.delivered[:] = [ev.text]

    def _take(self, upto: int) -> bytes:
        """Pop the raw bytes whose decoded content lies before ``upto``."""
        out = []
        raw = self._raw
        while raw:
            chunk, end = raw[0]
            if end <= upto:
                out.append(chunk)
                raw.popleft()
                self._sent = end
                continue
            start = end - len(chunk)
            if self.split_raw and upto > start:
                out.append(chunk[: upto - start])
                raw[0] = (chunk[upto - start :], end)
            break
        return b"".join(out)
