"""Incremental Server-Sent Events parser (WHATWG HTML 9.2.5/9.2.6, "event stream interpretation").

Why our own parser rather than httpx-sse / the SDKs' ``SSEDecoder``: the audit must see
exactly the events a conforming ``EventSource`` would see, and the popular Python
decoders deviate in ways that change what is recorded (events for data-less blocks, a
surviving BOM that loses the first event, ``int()``-parsed ``retry``, ``splitlines``
line breaking). The rules implemented here, and those pitfalls, are summarised in
``shared/reference/sse-algorithm.md``.

Design constraints, and how they are met:

* Bytes may be split anywhere by the network. UTF-8 is decoded incrementally (a
  character cut by a chunk end is held back until the rest arrives); a CR at the end of
  one chunk ends the line at once and a directly following LF - even at the start of the
  next chunk - is swallowed; the leading BOM is stripped from the first *decoded*
  character, so a BOM arriving one byte per chunk is still recognised.
* The proxy runs this for every streamed byte on its event loop, so there are no
  per-character Python loops, and per-event work is kept small, in three tiers:
  a chunk that is exactly one common block (``[id: I] [event: T] data: D``, the usual
  one-event-per-flush case, of any size) is handled with a handful of string calls
  (:meth:`SSEParser._one_block`; a huge event completed by a later chunk too), with
  line ends found by one-character ``str.find`` (a memchr: megabyte events cost about
  a copy); a larger chunk's run of uniform blocks is taken apart
  with ``split``/``partition`` and turned into events with ``map``
  (:meth:`SSEParser._fast_blocks`); everything else goes line by line through the
  generic interpreter (:meth:`SSEParser._interpret`), whose state lives in local
  variables. The two fast tiers verify their shape exactly (by counting line ends) and
  fall back to the generic path on any doubt, so they never change the result - the
  tests compare all tiers against a naive reference parser.
* Line ends: within a chunk, CRLF and CR are folded to LF (same lines as splitting on
  all three; ``str.splitlines`` is never used, it also splits on U+2028, NEL, VT, FF...).
* A hostile or broken upstream must not make the proxy buffer without bound: a line or an
  event's data larger than ``max_event_bytes`` is dropped *while it arrives* (skip modes),
  recorded as a finding, and parsing resumes with the next line / event.
* The parser never raises on bad input: problems are appended to :attr:`SSEParser.findings`
  as ``(code, detail)`` tuples using the stable codes of :mod:`addon.findings`.

It is the reading half of the SSE framing (:mod:`addon.framing.sse`): :class:`SSEReader` adds
the boundaries the output gate releases bytes by. Standard library and :mod:`addon.framing`
only: sans-IO, no mitmproxy.

This module may be compiled with mypyc (``setup.py``, at install, where a C compiler
exists); :mod:`addon.framing.sse` then uses the compiled copy unless it is older than
this file. The source is the same either way: mypyc measured faster than Cython here,
see ``setup.py``.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterable, Sequence
from itertools import repeat as _repeat
from typing import cast

from addon.framing import DEFAULT_MAX_EVENT_BYTES, Frame
from addon.framing.sse_event import EventShell, SSEEvent

__all__ = ["SSEParser", "SSEReader"]

_NOT_LF_SEARCH = re.compile(r"[^\n]").search
_LONE_CR_SEARCH = re.compile(r"\r(?!\n)").search

# Fields whose loss changes the delivered event: if a line carrying one of them is too
# long to keep, the whole event is dropped rather than delivered with a wrong
# type/id/data. (Comments and unknown fields are ignored anyway, so only the line goes.)
_EVENT_FIELDS = frozenset(("data", "event", "id", "retry"))

# A line arriving in many small chunks is kept as a list of pieces (joined once, when it
# ends); every this many pieces the newest ones are merged, so the list stays short.
_PENDING_COMPACT_AT = 256

# Below this many characters of complete lines a chunk is not worth the block fast path.
_FAST_MIN_CHARS = 256
# A held data line this long is finished on its own (SSEParser._pending_data_line); a
# shorter one is joined and read with the rest of the chunk in one pass, which is cheaper
# than a second pass over the rest (in process, 1460-byte chunks of small OpenAI Chat and
# Gemini deltas were 12 to 17% slower with the shortcut taken for every held line).
_BIG_LINE_CHARS = 8192

_utf8_decode = codecs.utf_8_decode
_partition = str.partition
# Field spellings the block fast path understands (exactly one space after the colon).
_FAST_PREFIXES = ("data: ", "event: ", "id: ")


# Blank lines are found line end by line end: ``str.find`` of one character is a memchr,
# while a two-character search ("\n\n") walks every character - slower by far on the
# megabyte lines of a huge event, and no faster on the short lines of small ones.


def _fold_line_ends(text: str) -> str:
    """``text`` with CRLF and CR turned into LF (the caller knows it holds a CR).

    When every CR is the first half of a CRLF (Gemini's framing), deleting the CRs gives
    the same text; one search for a lone CR and a one-character replace cost about half
    what the two-character replace of CRLF does (2.7 + 3.0 against 11.1 ms over the
    benchmark's Gemini stream in 1460-byte chunks, ``/work/tmp/crlf.py``)."""
    if _LONE_CR_SEARCH(text) is None:
        return text.replace("\r", "")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _blank_line_end(text: str, start: int, stop: int) -> int:
    """The index just past the first blank line in ``text[start:stop]`` (after an LF), or -1."""
    find = text.find
    i = find("\n", start, stop)
    while i >= 0:
        if i + 1 < stop and text[i + 1] == "\n":
            return i + 2
        i = find("\n", i + 1, stop)
    return -1


def _last_blank_line_end(text: str, start: int, end: int) -> int:
    """The index just past the last blank line in ``text[start:end]``, which ends with an LF; or -1."""
    rfind = text.rfind
    i = end - 1
    while i > start:
        j = rfind("\n", start, i)
        if j < 0:
            return -1
        if j == i - 1:
            return i + 1
        i = j
    return -1


def _new_event(event: str, data: str, ident: str, retry: int | None) -> SSEEvent:
    """An SSEEvent, built the fast way (see :class:`~addon.framing.sse_event.EventShell`)."""
    ev = EventShell()
    ev.event = event
    ev.data = data
    ev.id = ident
    ev.retry = retry
    ev.__class__ = SSEEvent  # type: ignore[assignment]
    return cast(SSEEvent, ev)


class SSEParser:
    """Feed body bytes in, get completed :class:`SSEEvent` objects out.

    ``feed(chunk)`` returns the events completed by that chunk; ``end()`` marks the end
    of the body (the end of the stream is not a line end: a pending partial line and a
    pending partial event are discarded; :attr:`pending_event` then tells whether
    there was one).
    After ``end()`` the parser is ready for a new body (as after an ``EventSource``
    reconnection): ``last_event_id`` and ``retry`` are kept, everything else is reset.
    """

    __slots__ = (
        "max_event_bytes",
        "last_event_id",
        "retry",
        "findings",
        "events_dispatched",
        "_errors",
        "_undecoded",
        "_bytes_fed",
        "_bom_pending",
        "_skip_lf",
        "_skip_line",
        "_skip_event",
        "_pending",
        "_pending_len",
        "_pending_fresh",
        "_data",
        "_data_len",
        "_event_type",
        "_id_buf",
        "_in_block",
        "_ended_inside_event",
    )

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        if max_event_bytes < 1:
            raise ValueError("max_event_bytes must be positive")
        self.max_event_bytes = max_event_bytes
        self.last_event_id = ""  # the event source's last event ID string
        self.retry: int | None = None  # the reconnection time, once a valid one is seen
        self.findings: list[tuple[str, str]] = []
        self.events_dispatched = 0
        self._ended_inside_event = False
        self._reset_body()

    def _reset_body(self) -> None:
        """State that belongs to one body (one connection), not to the event source."""
        # Strict decoding until the first invalid byte: that is how an invalid sequence is
        # told apart from a U+FFFD that was really sent as EF BF BD.
        self._errors = "strict"
        self._undecoded = b""  # the start of a character cut by the end of the last chunk
        self._bytes_fed = 0
        self._bom_pending = True
        self._skip_lf = False  # the last line ended with a CR: swallow one LF if next
        self._skip_line = False  # inside an oversize line: discard up to its line end
        self._skip_event = False  # inside an oversize event: discard up to the blank line
        self._pending: list[str] = []  # pieces of the current, unterminated line
        self._pending_len = 0
        self._pending_fresh = 0  # pieces appended since the last compaction
        self._data: list[str] = []  # data lines of the current block (joined with LF)
        self._data_len = 0
        self._event_type = ""
        # The spec's "last event ID buffer": not reset by dispatch, so ids persist. A new
        # body starts from the committed id (as browsers do on reconnection); an id from
        # a block that never got its blank line is dropped with that block.
        self._id_buf = self.last_event_id
        self._in_block = False  # a field line was seen since the last blank line

    @property
    def buffered_chars(self) -> int:
        """Characters held for the current line and block: bounded by the size limit."""
        return self._pending_len + self._data_len + len(self._event_type) + len(self._id_buf)

    # ------------------------------------------------------------------ bytes -> text

    def feed(self, piece: bytes | bytearray | memoryview) -> list[SSEEvent]:
        """Parse the next piece of the body; return the events it completed."""
        if not piece:
            return []
        # (typed bytes from here: the compiled parser's operations on it are then direct)
        chunk: bytes = piece if type(piece) is bytes else bytes(piece)
        if chunk[-2:] == b"\n\n" and self._at_clean_block_start():
            # The common case, first: a live stream's chunk that is one whole event, at a
            # block start with nothing held back. A chunk ending in LF holds no cut
            # character, so plain strict decoding gives what the incremental path
            # would; invalid UTF-8 goes the long way, for its finding.
            try:
                text = chunk.decode()
            except UnicodeDecodeError:
                pass
            else:
                self._bytes_fed += len(chunk)
                if "\r" in text:  # not at the end: no CRLF can be split after this chunk
                    text = _fold_line_ends(text)
                elif len(text) <= self.max_event_bytes:
                    ev = self._one_block(text)
                    if ev is not None:
                        return [ev]
                return self._lines(text)
        # UTF-8 decoding with the incremental decoder's own primitive: with final=False
        # an incomplete character at the end is left unconsumed and kept for the next
        # chunk (this is what codecs' IncrementalDecoder does, minus a Python-level
        # wrapper that costs a noticeable share when chunks hold one small event each).
        data = self._undecoded + chunk if self._undecoded else chunk
        try:
            text, used = _utf8_decode(data, self._errors, False)
        except UnicodeDecodeError as exc:
            text, used = self._decode_invalid(data, exc, False)
        self._undecoded = bytes(data[used:]) if used != len(data) else b""
        self._bytes_fed += len(chunk)
        if not text:
            return []
        if self._bom_pending:
            # Exactly one leading BOM: checked on the first decoded character, so a BOM
            # split across chunks is still whole here, and a second BOM stays data.
            self._bom_pending = False
            self._ended_inside_event = False  # a new body has begun
            if text[0] == "\ufeff":
                text = text[1:]
                if not text:
                    return []
        if self._skip_lf:
            self._skip_lf = False
            if text[0] == "\n":  # second half of a CRLF split across chunks
                text = text[1:]
                if not text:
                    return []
        if self._skip_line:
            text = self._skip_rest_of_line(text)
            if not text:
                return []
        if "\r" in text:
            # A CR ends its line now; remember to swallow an LF that starts the next chunk.
            self._skip_lf = text[-1] == "\r"
            # Within one chunk, CRLF / CR / LF -> LF gives exactly the same lines as
            # splitting on the three terminators (a CRLF pair is always one line end),
            # and lets one LF-only code path serve CRLF framing (Gemini's "\r\n\r\n").
            text = _fold_line_ends(text)
        return self._lines(text)

    def _lines(self, text: str) -> list[SSEEvent]:
        """Parse decoded text with LF line ends (CR and CRLF folded), from where the last chunk ended."""
        if (
            text[-2:] == "\n\n"
            and not (self._pending or self._in_block or self._skip_event)
            and len(text) <= self.max_event_bytes
        ):
            # Live streams flush one event per chunk, whatever its size.
            ev = self._one_block(text)
            if ev is not None:
                return [ev]
        events: list[SSEEvent] = []
        if len(text) + self._pending_len < _FAST_MIN_CHARS:
            lines = text.split("\n")
            tail = lines.pop()  # after the last line end: unterminated ("" if none)
            if lines:
                if self._pending:
                    pending = self._pending
                    pending.append(lines[0])
                    lines[0] = "".join(pending)
                    self._pending = []
                    self._pending_len = 0
                    self._pending_fresh = 0
                self._interpret(lines, events)
            if tail:
                self._hold(tail)
            return events

        last_nl = text.rfind("\n")
        if last_nl < 0:
            self._hold(text)  # no line end yet: the line goes on
            return events
        if self._pending:
            done = self._pending_data_line(text, events) if self._pending_len >= _BIG_LINE_CHARS else 0
            if done:
                if done < len(text):
                    events += self._lines(text[done:])
                return events
            pending = self._pending
            last_nl += self._pending_len
            pending.append(text)
            text = "".join(pending)
            self._pending = []
            self._pending_len = 0
            self._pending_fresh = 0
            if text[-2:] == "\n\n" and not (self._in_block or self._skip_event) and len(text) <= self.max_event_bytes:
                # A large event that took several chunks, completed by this one.
                ev = self._one_block(text)
                if ev is not None:
                    return [ev]
        # text[:end] is a whole number of lines starting at a line start, each ending in LF.
        end = last_nl + 1
        pos = self._fast_blocks(text, end, events)
        if pos < end:
            self._interpret(text[pos:last_nl].split("\n"), events)
        if end < len(text):
            self._hold(text[end:])
        return events

    def _one_block(self, text: str, start: int = 0, stop: int | None = None) -> SSEEvent | None:
        """The event of a text that is exactly one common block, else None.

        The per-chunk shortcut of :meth:`_fast_blocks`, for ``[id: I\\n][event: T\\n]data: D\\n\\n``
        at a block start (the caller checks that, that ``text`` ends with a blank
        line and that it is within the size limit). Each line end is found with
        ``str.find`` on one character (a memchr, fast for an event of megabytes); the
        data line's end being the LF before the final one proves there are no other
        lines. The result is what the generic path would dispatch; anything else
        (comments, retry, multi-line data, an id-only block, an id with U+0000, other
        spellings) returns None and is left to it.
        """
        if stop is None:
            stop = len(text)
        end = stop - 2  # the LF that ends the data line
        find = text.find
        ident = None
        event = "message"
        first = text[start]
        if first == "e":
            if not text.startswith("event: ", start):
                return None
            nl = find("\n", start, stop)
            if nl == end:
                return None
            event = text[start + 7 : nl] or "message"
            start = nl + 1
        elif first == "i":
            if not text.startswith("id: ", start):
                return None
            nl = find("\n", start, stop)
            ident = text[start + 4 : nl]
            if nl == end or "\0" in ident:
                return None
            start = nl + 1
            if text.startswith("event: ", start):
                nl = find("\n", start, stop)
                if nl == end:
                    return None
                event = text[start + 7 : nl] or "message"
                start = nl + 1
        if find("\n", start, stop) != end:
            return None
        if text.startswith("data: ", start):
            data = text[start + 6 : end]
        elif text.startswith("data:", start):
            data = text[start + 5 : end]
        else:
            return None
        if ident is None:
            ident = self.last_event_id  # == the id buffer at a block start
        else:
            self._id_buf = self.last_event_id = ident
        ev = _new_event(event, data, ident, self.retry)
        self.events_dispatched += 1
        return ev

    def _decode_invalid(self, data: bytes, exc: UnicodeDecodeError, final: bool) -> tuple[str, int]:
        """Record the first invalid UTF-8 of this body, then decode with replacement.

        Strict decoding is what tells an invalid sequence apart from a U+FFFD that was
        really sent as EF BF BD. The finding is recorded once per body, so from here on
        the body is decoded with ``errors="replace"`` and no further detection is needed.
        ``exc.start`` counts from the start of ``data``, which begins with the bytes
        held back from earlier chunks.
        """
        offset = self._bytes_fed - len(self._undecoded) + exc.start
        self.findings.append(("sse_invalid_utf8", f"invalid UTF-8 at about byte {offset} of the body; read as U+FFFD"))
        self._errors = "replace"
        return _utf8_decode(data, "replace", final)

    def end(self) -> list[SSEEvent]:
        """End of body. Nothing is dispatched: the end of the stream is not a line end.

        Returns a list for symmetry with :meth:`feed` (always empty): an event is only
        ever dispatched by the blank line that ends it, which ``feed`` has already seen.
        """
        if self._undecoded:  # a character cut off by the end of the body
            try:
                tail, _ = _utf8_decode(self._undecoded, self._errors, True)
            except UnicodeDecodeError as exc:
                tail, _ = self._decode_invalid(self._undecoded, exc, True)
            if not self._skip_line:
                # Only replacement characters (no line end): part of the discarded line.
                self._pending.append(tail)
                self._pending_len += len(tail)
        inside = self._inside_event()
        self._reset_body()
        self._ended_inside_event = inside
        return []

    @property
    def pending_event(self) -> bool:
        """Whether the body is inside an event; after :meth:`end`, whether it ended inside one.

        "Inside" means a field line (or the start of a non-comment line) was seen since
        the last blank line. ``end()`` discards such a partial event without a finding:
        whether that deserves ``sse_incomplete_event`` depends on how the body ended
        (not when the upstream cut the connection), which only the caller knows.
        """
        return self._ended_inside_event or self._inside_event()

    def _at_clean_block_start(self) -> bool:
        """Whether the next byte starts a block with nothing held back or to skip.

        The precondition of the one-event-per-chunk shortcuts: a chunk that ends with a
        blank line can then be decoded whole and read as one block.
        """
        return not (
            self._undecoded
            or self._bom_pending
            or self._skip_lf
            or self._skip_line
            or self._pending
            or self._in_block
            or self._skip_event
        )

    def _inside_event(self) -> bool:
        return bool(self._in_block or self._skip_event or (self._pending_len and self._pending[0][:1] != ":"))

    # ------------------------------------------------------------------ text -> events

    def _fast_blocks(self, text: str, end: int, events: list[SSEEvent]) -> int:
        """Dispatch a run of uniform events with C-level string operations.

        Almost every LLM stream is a run of blocks of one fixed shape:
        ``data: D\\n\\n`` (OpenAI Chat, Gemini after CRLF folding), ``event: T\\ndata: D\\n\\n``
        (Anthropic, OpenAI Responses, llm-stream) or ``id: I\\nevent: T\\ndata: D\\n\\n``.
        Interpreting such blocks line by line costs several Python operations per line;
        here a run of them is taken apart with ``str.split``/``partition`` and the events
        are built with ``map``, which is what makes this parser about twice as fast per
        event as a line-at-a-time decoder.

        The shape is *verified*, not assumed (see the LF count argument below): the run
        is used only if every block in it consists of exactly the shape's lines, and
        such blocks give the same events as the generic path (one space removed after
        the colon, default type "message", event type reset by the blank line, the id
        persisting, retry unchanged). Anything else - comments, retry, multi-line data,
        other spellings, an id with U+0000, anything near the size limit - is left to
        :meth:`_interpret`. Returns how far ``text`` was consumed (everything before that
        position has been interpreted, generically or here).
        """
        pos = 0
        if self._data or self._event_type or self._in_block or self._skip_event:
            # Finish the block in progress, up to its blank line: generically, unless all
            # that is left of it is its data line.
            pos = _blank_line_end(text, 0, end)
            if pos < 0:
                return 0
            if not self._last_data_line(text, pos - 2, events):
                self._interpret(text[: pos - 1].split("\n"), events)
        # Blank lines between blocks change nothing in this (clean) state.
        m = _NOT_LF_SEARCH(text, pos, end)
        pos = m.start() if m is not None else end
        stop = _last_blank_line_end(text, pos, end)  # end of the last complete block
        if stop < 0 or stop - pos > self.max_event_bytes:
            return pos  # no complete block, or a size limit might be involved
        first_end = _blank_line_end(text, pos, stop) - 2  # the LF ending the first block's last line
        if first_end + 2 == stop:
            # One block (e.g. a large event, or the last one of a burst).
            ev = self._one_block(text, pos, stop)
            if ev is None:
                return pos
            events.append(ev)
            return stop
        if stop - pos < _FAST_MIN_CHARS:
            return pos  # little to gain
        # The shape: the field lines of the first block, each "name: value" for one of
        # the fast fields, each field at most once, data last.
        shape = []
        for line in text[pos:first_end].split("\n", 3):
            for prefix in _FAST_PREFIXES:
                if line.startswith(prefix):
                    shape.append(prefix)
                    break
            else:
                return pos
        if shape[-1] != "data: " or len(set(shape)) != len(shape):
            return pos
        head = shape[0]
        pieces: Sequence[str] = text[pos + len(head) : stop - 2].split("\n\n" + head)
        k = len(pieces)
        # k blocks of n field lines hold exactly (n + 1) * k LFs: 2 per "\n\n<head>"
        # separator (k - 1 of them), 2 at the end, so (n - 1) * k inside the pieces. Each
        # piece that has all n - 1 "\n<field>" separators below holds at least n - 1
        # LFs; hence exactly those, and no value contains a line end.
        if text.count("\n", pos, stop) != (len(shape) + 1) * k:
            return pos
        columns: dict[str, Sequence[str]] = {}
        for field, next_field in zip(shape, shape[1:]):
            # Cut each piece at its next field: the part before is this field's value.
            values, seps, pieces = zip(*map(_partition, pieces, _repeat("\n" + next_field)))
            if not all(seps):
                return pos
            columns[field] = values
        columns[shape[-1]] = pieces
        datas = columns["data: "]
        event_types = columns.get("event: ")
        types: Iterable[str]
        if event_types is None:
            types = _repeat("message")
        elif "" in event_types:  # "event:" with an empty value means the default type
            types = [t or "message" for t in event_types]
        else:
            types = event_types
        event_ids = columns.get("id: ")
        ids: Iterable[str]
        if event_ids is None:
            ids = _repeat(self._id_buf)
        elif text.find("\0", pos, stop) >= 0:
            return pos  # an id with U+0000 must be ignored: leave that to the generic path
        else:
            self._id_buf = event_ids[-1]
            ids = event_ids
        objs = list(map(_new_event, types, datas, ids, _repeat(self.retry)))
        events += objs
        self.events_dispatched += len(objs)
        self.last_event_id = self._id_buf
        return stop

    def _last_data_line(self, text: str, stop: int, events: list[SSEEvent]) -> bool:
        """Finish the block in progress if ``text[:stop]``, the rest of it before its blank
        line, is one ``data`` line; whether it was.

        That is how a large event ends when it spans chunks: its ``event:`` line came in
        an earlier chunk (so the block is in progress), its data line ends in this one.
        The generic path would slice the line out, split it and partition it again:
        three copies of what may be megabytes (huge events at 16 KiB chunks went 0.94x
        the fastest peer decoder's speed, BENCHMARKS.md). Anything :meth:`_interpret`
        would record a finding for (a line or an event over the limit) is left to it.
        """
        if self._skip_event or not text.startswith("data:") or text.find("\n", 0, stop) >= 0:
            return False
        start = 6 if text.startswith("data: ") else 5
        if not self._fits(stop, stop - start):
            return False
        self._end_block_with(text[start:stop], events)
        return True

    def _pending_data_line(self, text: str, events: list[SSEEvent]) -> int:
        """Finish the block if the held line is a ``data`` line that ``text`` ends, followed
        by the block's blank line; how much of ``text`` that took (0: it is not so).

        The same as :meth:`_last_data_line` for a data line that arrived in pieces (a
        huge event at 16 KiB reads): its value is joined from them once, instead of the
        pieces being joined into the line and the value sliced out of it again.
        """
        pending = self._pending
        head = pending[0]
        if self._skip_event or len(head) < 6 or not head.startswith("data:"):
            return 0  # (six characters tell "data: " from "data:" followed by more)
        nl = text.find("\n")
        if nl < 0 or text[nl + 1 : nl + 2] != "\n":
            return 0
        start = 6 if head[5] == " " else 5
        stop = self._pending_len + nl  # the line's length
        if not self._fits(stop, stop - start):
            return 0
        pending[0] = head[start:]
        pending.append(text[:nl])
        value = "".join(pending)
        self._pending = []
        self._pending_len = 0
        self._pending_fresh = 0
        self._end_block_with(value, events)
        return nl + 2

    def _fits(self, line_chars: int, value_chars: int) -> bool:
        """Whether a data line of this length and value length stays within the size
        limits (else :meth:`_interpret` records which one it broke)."""
        limit = self.max_event_bytes
        return line_chars <= limit and self._data_len + value_chars + 1 <= limit

    def _end_block_with(self, value: str, events: list[SSEEvent]) -> None:
        """The block's last data line ``value``, then its blank line: what :meth:`_interpret`
        does for those two lines (dispatch, the id committed, the block's state reset)."""
        data = self._data
        data.append(value)
        ident = self._id_buf
        events.append(_new_event(self._event_type or "message", "\n".join(data), ident, self.retry))
        self.last_event_id = ident
        self.events_dispatched += 1
        self._data = []
        self._data_len = 0
        self._event_type = ""
        self._in_block = False

    def _hold(self, piece: str) -> None:
        """Keep an unterminated piece of a line, unless the line grew past the limit."""
        size = self._pending_len + len(piece)
        if size > self.max_event_bytes:
            prefix = self._pending_prefix(piece, min(8, self.max_event_bytes + 1))
            if prefix[0] != ":":
                self._in_block = True  # as for a complete line: a field line, if unknown
            self._line_too_long(prefix)
            self._pending = []
            self._pending_len = 0
            self._pending_fresh = 0
            self._skip_line = True
            return
        pending = self._pending
        pending.append(piece)
        self._pending_len = size
        self._pending_fresh += 1
        if self._pending_fresh >= _PENDING_COMPACT_AT:
            # Merge only the pieces added since the last merge: total copying stays
            # linear even for a long line arriving one byte per chunk.
            merged = "".join(pending[-_PENDING_COMPACT_AT:])
            del pending[-_PENDING_COMPACT_AT:]
            pending.append(merged)
            self._pending_fresh = 0

    def _pending_prefix(self, piece: str, size: int) -> str:
        """The first ``size`` characters of the pending line followed by ``piece``."""
        head: list[str] = []
        got = 0
        for part in self._pending:
            head.append(part)
            got += len(part)
            if got >= size:
                break
        else:
            head.append(piece)
        return "".join(head)[:size]

    def _skip_rest_of_line(self, text: str) -> str:
        """In skip-line mode: drop text up to and including the next line end."""
        # Two memchr-speed finds rather than a regex: this runs over every character of
        # an oversize line, which may be as long as a hostile upstream likes.
        lf = text.find("\n")
        cr = text.find("\r", 0, lf if lf >= 0 else len(text))
        if cr < 0 and lf < 0:
            return ""  # the oversize line goes on: keep nothing
        self._skip_line = False
        if cr >= 0:
            if cr + 1 == len(text):
                self._skip_lf = True  # an LF starting the next chunk belongs to this CR
                return ""
            return text[cr + 2 :] if text[cr + 1] == "\n" else text[cr + 1 :]
        return text[lf + 1 :]

    def _line_too_long(self, prefix: str) -> None:
        """Record an oversize line; drop its event too if it carried an event field.

        ``prefix`` is the line's first min(8, limit + 1) characters: enough to see
        "retry:" and "event:", and never more than a line that has just outgrown the
        limit is known to hold - so the decision is the same however the line was
        chunked. (With an absurdly small limit a field name may be cut; then only the
        line is dropped.)
        """
        if not self._skip_event:
            self.findings.append(
                (
                    "sse_line_too_long",
                    f"line longer than {self.max_event_bytes} characters; skipped",
                )
            )
            if prefix.partition(":")[0] in _EVENT_FIELDS:
                self._drop_event()

    def _drop_event(self) -> None:
        self._skip_event = True
        self._data = []
        self._data_len = 0
        self._event_type = ""

    def _interpret(self, lines: list[str], events: list[SSEEvent]) -> None:
        """Interpret complete lines. The hot loop: state lives in locals until the end."""
        limit = self.max_event_bytes
        data = self._data
        data_len = self._data_len
        event_type = self._event_type
        id_buf = self._id_buf
        last_id = self.last_event_id
        retry = self.retry
        skip_event = self._skip_event
        in_block = self._in_block
        append = events.append
        dispatched = 0

        for line in lines:
            if not line:
                # Blank line: dispatch (WHATWG 9.2.6 "dispatch the event").
                last_id = id_buf
                in_block = False
                if skip_event:
                    skip_event = False  # the oversize event ends here; resume normally
                elif data:
                    append(_new_event(event_type or "message", "\n".join(data), last_id, retry))
                    dispatched += 1
                    data = []
                    data_len = 0
                event_type = ""
                continue
            if skip_event:
                continue
            if len(line) > limit:
                # The whole line arrived within one chunk: same rule as a growing one.
                if line[0] != ":":
                    in_block = True
                self._skip_event = skip_event
                self._line_too_long(line[: min(8, limit + 1)])
                skip_event = self._skip_event
                if skip_event:
                    data = []
                    data_len = 0
                    event_type = ""
                continue
            name, colon, value = line.partition(":")
            if colon:
                if not name:
                    continue  # comment
                if value and value[0] == " ":
                    value = value[1:]
            in_block = True
            if name == "data":
                data_len += len(value) + 1
                if data_len > limit:
                    self.findings.append(
                        (
                            "sse_event_too_long",
                            f"event data longer than {limit} characters; event skipped",
                        )
                    )
                    skip_event = True
                    data = []
                    data_len = 0
                    event_type = ""
                    continue
                data.append(value)
            elif name == "event":
                event_type = value
            elif name == "id":
                if "\0" not in value:
                    id_buf = value
            elif name == "retry":
                if value.isdigit() and value.isascii():
                    try:
                        retry = int(value)
                    except ValueError:  # beyond int's str-conversion digit limit
                        pass
            # any other field name: ignored

        self._data = data
        self._data_len = data_len
        self._event_type = event_type
        self._id_buf = id_buf
        self.last_event_id = last_id
        self.retry = retry
        self._skip_event = skip_event
        self._in_block = in_block
        self.events_dispatched += dispatched


class SSEReader(SSEParser):
    """The parser as a framing reader: :meth:`feed_bounded` also says where each event ends.

    Bounded reading is one pass over the bytes: it finds each line end itself (LF, CR or
    CRLF; line ends are ASCII, so a UTF-8 character never spans one), decodes the line and
    hands the lines of a block to the parser's own interpreter (:meth:`SSEParser._interpret`),
    so the offset just past each blank line is known as the line is read: that is the
    boundary, with the event the blank line dispatched (or None: a comment block, a blank
    line between events, the LF of a CRLF whose CR ended a blank line). Only the
    unterminated line is kept as bytes; what the block read so far holds is the parser's,
    bounded as always. :meth:`feed` (no boundaries) is the parser's own, unchanged, and
    :meth:`unbound` hands the unterminated line over to it. So does a line that outgrows
    ``max_event_bytes``: the parser records it (``sse_line_too_long``) and skips the rest
    of it as it arrives, so no line is held beyond the limit, however long it goes on.
    """

    __slots__ = ("_line", "_offset", "_boundary", "_oversize")
    unreadable = None  # every body can be read as an event stream

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        super().__init__(max_event_bytes)
        self._line = bytearray()  # the unterminated line, bounded reading only (grown in place)
        self._oversize = False  # that line outgrew the limit: the parser skips the rest of it
        self._offset = 0  # body offset where that line starts
        self._boundary = 0  # body offset of the last boundary reported

    def feed_bounded(self, data: bytes) -> list[tuple[Frame | None, int]]:
        """Events ``data`` completes with their end offsets (``None``: a block without one)."""
        if data[-2:] == b"\n\n" and not (self._line or self._oversize) and self._at_clean_block_start():
            one = self._one_event(data)
            if one is not None:
                return one
        if self._oversize:
            data = self._skip_oversize(data)
        if self._line and data.find(b"\n") < 0 and data.find(b"\r") < 0:
            self._line += data  # the line goes on: no copy of what it holds so far
            self._check_line()
            return []
        buf = self._line + data if self._line else data
        base = self._offset  # body offset of buf[0]
        out: list[tuple[Frame | None, int]] = []
        pos, size = 0, len(buf)
        if self._skip_lf and size:  # the LF of a CRLF whose CR ended the last chunk
            self._skip_lf = False
            if buf[0] == 0x0A:
                pos = 1
                if not self._inside_event():  # after a blank line: padding, released with it
                    out.append((None, self._bound(base + 1)))
        block: list[str] = []  # lines of the block being read, interpreted at its blank line
        find = buf.find
        lf = cr = -1  # the next LF and CR at or after pos (-1: none; recomputed once passed)
        while pos < size:
            if lf < pos:
                lf = find(b"\n", pos)
                if lf < 0:
                    lf = size
            if cr < pos:
                cr = find(b"\r", pos)
                if cr < 0:
                    cr = size
            stop = min(lf, cr)
            if stop == size:
                break  # no line end: the line goes on
            after = stop + 1
            if stop == cr:
                if after < size and buf[after] == 0x0A:
                    after += 1  # CRLF: one line end
                elif after == size:
                    self._skip_lf = True  # an LF opening the next chunk belongs to this CR
            line = self._decode_line(buf[pos:stop], base + pos)
            block.append(line)
            pos = after
            if not line:  # a blank line: the block ends here
                events: list[SSEEvent] = []
                self._interpret(block, events)
                block = []
                out.append((events[0] if events else None, self._bound(base + pos)))
        if block:
            self._interpret(block, [])  # (no blank line among them: they dispatch nothing)
        self._line = bytearray(buf[pos:])
        self._offset = base + pos
        self._bytes_fed = self._offset  # (for the offsets of later findings, once unbound)
        self._check_line()
        return out

    def _one_event(self, data: bytes) -> list[tuple[Frame | None, int]] | None:
        """The common case of :meth:`feed_bounded`, or None to take the general path.

        A live stream's chunk is usually one whole common event at a clean block start
        (the caller checks that, and that ``data`` ends with a blank line). Then the
        chunk decodes whole (an LF at the end leaves no character cut) and its only
        boundary is its end, so the line-by-line pass is not needed. Invalid UTF-8 (for
        its finding at its offset), CR line ends, an oversize chunk and every block
        :meth:`SSEParser._one_block` does not take go the general way.
        """
        try:
            text = data.decode()
        except UnicodeDecodeError:
            return None
        if len(text) > self.max_event_bytes or "\r" in text:
            return None
        ev = self._one_block(text)
        if ev is None:
            return None
        self._offset += len(data)
        self._bytes_fed = self._offset
        return [(ev, self._bound(self._offset))]

    def _check_line(self) -> None:
        """Hand an unterminated line longer than the limit to the parser, which records
        it and skips it (:meth:`SSEParser._hold`); the rest of it goes there too."""
        if len(self._line) > self.max_event_bytes:
            self.unbound()
            self._oversize = True

    def _skip_oversize(self, data: bytes) -> bytes:
        """Feed the parser the rest of an oversize line, up to and including its line
        end; what follows it is read bounded again."""
        lf, cr = data.find(b"\n"), data.find(b"\r")
        ends = [i for i in (lf, cr) if i >= 0]
        if not ends:
            self.feed(data)
            self._offset += len(data)
            return b""
        stop = min(ends) + 1
        if data[stop - 1 : stop] == b"\r" and data[stop : stop + 1] == b"\n":
            stop += 1  # CRLF: one line end
        self.feed(data[:stop])
        self._offset += stop
        self._bytes_fed = self._offset
        self._oversize = False
        return data[stop:]

    def _bound(self, offset: int) -> int:
        self._boundary = offset
        return offset

    def _decode_line(self, raw: bytes | bytearray, at: int) -> str:
        """One line's text, decoded as :meth:`feed` decodes it (``at``: its body offset).

        The first line of the body loses one leading BOM; invalid UTF-8 gets the same
        finding, at the same offset, as the parser gives, once per body.
        """
        try:
            line = raw.decode("utf-8", self._errors)
        except UnicodeDecodeError as exc:
            self.findings.append(
                ("sse_invalid_utf8", f"invalid UTF-8 at about byte {at + exc.start} of the body; read as U+FFFD")
            )
            self._errors = "replace"
            line = raw.decode("utf-8", "replace")
        if self._bom_pending:
            self._bom_pending = False
            self._ended_inside_event = False  # a new body has begun
            if line[:1] == "\ufeff":
                line = line[1:]
        return line

    @property
    def held(self) -> int:
        return self._offset + len(self._line) - self._boundary

    @property
    def pending_event(self) -> bool:
        return super().pending_event or (bool(self._line) and self._line[:1] != b":")

    def unbound(self) -> list[SSEEvent]:
        rest, self._line = bytes(self._line), bytearray()
        self._offset += len(rest)
        return self.feed(rest)

    def end(self) -> list[SSEEvent]:
        self.unbound()  # (a line without its end completes no event)
        return super().end()
