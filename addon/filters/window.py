"""The hold-back window: rules checked over a stream of text as it arrives.

A response streams as many small pieces; a secret or a card number can be cut across
any number of them. :class:`StreamScanner` checks one stream (one choice's text, its
reasoning, one tool call's arguments) and says, after each piece, which text may go to
the client now and which verdicts the rules gave.

How it works. Each rule's matcher knows the longest text it matches (``span``) and how
many characters after a match can still change it (``lookahead``). A check runs the
matcher over the not-yet-checked text plus the last ``span + lookahead`` characters
before it, so a match split across pieces is seen whole, and the cost of a check is
bounded by that overlap, never by the whole stream. A candidate that ends less than
``lookahead`` characters before the end of the text so far may still grow or vanish
("4111 1111 1111 111" before its last digit arrives), so it is left for the next check.
A blocking rule holds back ``span + lookahead - 1`` characters (its ``hold``, see
:meth:`addon.filters.rules.Rule.hold`): by the time a match is final, none of it has
been released. Flag rules and rules with window 0 (release-first) hold nothing back;
they only report.

Checks are batched: a matcher is run again once a quarter of its span has arrived (at
least ``MIN_STEP`` characters), so a stream of one-character pieces costs a constant amount of
scanning per character instead of a full overlap per piece. The price is that text is
released in steps: a blocking rule holds between ``hold`` and ``hold + step - 1``
characters.

Views. Rules match on a normalised view of the text (:mod:`addon.filters.normalize`:
invisible characters removed, NFKC, optionally confusables), so spans, holds and steps
count view characters, and invisible characters cost no window. Positions and the
release are in original characters: each view character knows the original character
it came from, a view's release point is the original offset of its first unreleasable
view character, and the invisible characters inside a match lie between its first and
last view characters, so they are held with it.

Guarantee: no character of a match of a blocking rule is released, however the text is
cut, as long as the rule's window covers its longest match. Limits: an unbounded regex
longer than its window may leak its start; a regex that looks further than one
character past its match (``foo(?!bar)``) is decided on the text so far and may block
where the whole text would not; lookbehinds see at most ``CONTEXT`` characters before
the overlap.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from addon.filters.api import BLOCK, Verdict
from addon.filters.detectors import Matcher
from addon.filters.normalize import Fold, folder
from addon.filters.rules import Rule

CONTEXT = 32  # characters kept before a check's overlap, for lookbehinds and \b
MIN_STEP = 16  # checks are at least this many characters apart (one-character pieces)
MAX_HITS_PER_RULE = 20  # a rule reports at most this many hits per stream, then stops


@dataclass(slots=True)
class _Track:
    """One matcher of one rule, and how far it has looked."""

    rule: Rule
    matcher: Matcher
    hold: int
    step: int
    checked: int  # length of the stream at this track's last check
    resume: int  # end of its last final candidate: the next scan starts no earlier
    hits: int = 0

    def scan_from(self) -> int:
        """The earliest start of a match the last check could not settle."""
        return max(self.resume, self.checked - self.matcher.span - self.matcher.lookahead)


class _View:
    """One way of reading the stream (see :mod:`addon.filters.normalize`) and the tracks
    of the rules that read it that way.

    ``buf`` holds the view's text from ``base`` on (view offsets); ``where`` the original
    offset of each of its characters, or ``None`` while the view is the original text
    itself (ASCII, or text no fold changes: the common case costs no map). ``safe`` is the
    original offset up to which this view's blocking tracks allow a release.
    """

    __slots__ = (
        "fold",
        "tracks",
        "holding",
        "buf",
        "base",
        "length",
        "where",
        "next_check",
        "safe",
        "keep_back",
        "trim_at",
    )

    def __init__(self, fold: Fold | None, tracks: list[_Track]) -> None:
        self.fold = fold
        self.tracks = tracks
        self.holding = [t for t in tracks if t.hold > 0]
        self.buf = ""
        self.base = 0
        self.length = 0
        self.where: array[int] | None = None
        self.next_check = 0
        self.safe = 0
        # the next check's release point can be this far back from the view's end
        self.keep_back = max((t.hold for t in self.holding), default=0)
        # The most text the checks and the release can still need; the buffer is cut
        # back to it once it has grown to twice that, so each character is copied a
        # bounded number of times.
        needs = [t.matcher.span + t.matcher.lookahead + t.step + t.hold for t in tracks]
        self.trim_at = 2 * (max(needs, default=0) + CONTEXT)

    def add(self, text: str, start: int) -> None:
        """A piece of the stream that starts at original offset ``start``."""
        view, where = (text, None) if self.fold is None else self.fold(text)
        if where is not None and self.where is None:
            self.where = array("q", range(self.base, self.base + len(self.buf)))  # the same offsets so far
        if self.where is not None:
            self.where.extend(range(start, start + len(text)) if where is None else [start + w for w in where])
        self.buf += view
        self.length += len(view)

    def original(self, index: int, end: int) -> int:
        """The original offset of the view's character at ``index``; ``end`` past the view's end.

        Before ``base`` (a finished block, all of it released): 0, which releases nothing.
        """
        if index >= self.length:
            return end
        if index < self.base:
            return 0
        return index if self.where is None else self.where[index - self.base]

    def check(self, final: bool, end: int, location: str) -> tuple[list[Verdict], Verdict | None]:
        """Run the due tracks; the verdicts (positions in the original text) and the first block."""
        verdicts: list[Verdict] = []
        blocked: Verdict | None = None
        base, buf = self.base, self.buf
        for t in self.tracks:
            if t.hits >= MAX_HITS_PER_RULE or (not final and self.length - t.checked < t.step):
                continue
            # Candidates ending closer than ``lookahead`` to the end are not final yet.
            limit = self.length if final else self.length - t.matcher.lookahead
            for m in t.matcher.regex.finditer(buf, t.scan_from() - base):
                if base + m.end() > limit:
                    break
                t.resume = base + m.end()
                hit = t.matcher.hit(m)
                if hit is None:
                    continue
                verdict = t.rule.verdict(hit, self.original(base + hit.start, end), location)
                verdicts.append(verdict)
                t.hits += 1
                if verdict.action == BLOCK:
                    blocked = blocked or verdict
                    break
                if t.hits >= MAX_HITS_PER_RULE:
                    break
            t.checked = self.length
        self.next_check = min((t.checked + t.step for t in self._active()), default=1 << 62)
        if self.holding:
            self.safe = self.original(max(0, min(t.checked - t.hold for t in self.holding)), end)
        return verdicts, blocked

    def end_block(self) -> None:
        """The block is over: no match spans it and what follows."""
        self.buf, self.base, self.where = "", self.length, None if self.where is None else array("q")
        for t in self.tracks:
            t.checked = t.resume = self.length
        self.next_check = self.length

    def trim(self) -> None:
        """Drop the text no check (and no release point) will look at again."""
        if len(self.buf) <= self.trim_at:
            return
        keep = min([self.length - self.keep_back] + [t.scan_from() - CONTEXT for t in self._active()])
        if keep > self.base:
            cut = keep - self.base
            self.buf = self.buf[cut:]
            if self.where is not None:
                del self.where[:cut]
            self.base = keep

    def _active(self) -> list[_Track]:
        return [t for t in self.tracks if t.hits < MAX_HITS_PER_RULE]


class StreamScanner:
    """Checks one stream's text against rules and releases what is safe to send.

    ``extra_hold`` holds back at least that many characters whatever the rules need
    (user filters' windows). ``location`` is written into the verdicts; positions count
    from the stream's start, in original characters. Each rule reads the stream through
    its view (:attr:`Rule.view`); the release is in original characters: a character is
    released once every view has passed all view characters it contributes to, and
    invisible characters inside a match are held with it.
    """

    def __init__(self, rules: Sequence[Rule], *, extra_hold: int = 0, location: str = "") -> None:
        by_view: dict[str, list[_Track]] = {}
        for rule in rules:
            for m in rule.matchers:
                track = _Track(rule, m, rule.hold(m), max(MIN_STEP, (m.span + m.lookahead) // 4), 0, 0)
                by_view.setdefault(rule.view, []).append(track)
        self._views = [_View(folder(view), tracks) for view, tracks in by_view.items()]
        self._holding = [v for v in self._views if v.holding]
        self._extra_hold = extra_hold
        self._location = location
        self._pending = ""  # original text fed and not released yet
        self._length = 0  # characters fed so far
        self._released = 0
        self.blocked: Verdict | None = None

    @property
    def length(self) -> int:
        """Characters fed so far."""
        return self._length

    @property
    def released(self) -> int:
        """Characters released so far (the first ``released`` of the stream)."""
        return self._released

    @property
    def hold(self) -> int:
        """The most characters (of a view) this scanner holds back between checks."""
        return max([self._extra_hold] + [v.keep_back for v in self._holding])

    def feed(self, text: str) -> tuple[str, list[Verdict]]:
        """Add a piece; return the text that may be released now and any new verdicts.

        After a block nothing more is released: the stream is to be ended.
        """
        if self.blocked is not None or not text:
            return "", []
        start = self._length
        self._pending += text
        self._length += len(text)
        verdicts: list[Verdict] = []
        for view in self._views:
            view.add(text, start)
            if view.length >= view.next_check:
                self._check(view, False, verdicts)
        target = self._length - self._extra_hold
        if self._holding:
            target = min([target] + [v.safe for v in self._holding])
        released = self._release(target)
        for view in self._views:
            view.trim()
        return released, verdicts

    def flush(self) -> tuple[str, list[Verdict]]:
        """The end of the stream (or of one block of it): a last check, then the rest.

        Feeding may go on afterwards as a new block: positions keep counting, but no
        match spans the two.
        """
        if self.blocked is not None:
            return "", []
        verdicts: list[Verdict] = []
        for view in self._views:
            self._check(view, True, verdicts)
        released = self._release(self._length)
        for view in self._views:
            view.end_block()
        return released, verdicts

    def _check(self, view: _View, final: bool, verdicts: list[Verdict]) -> None:
        found, blocked = view.check(final, self._length, self._location)
        verdicts.extend(found)
        self.blocked = self.blocked or blocked

    def _release(self, target: int) -> str:
        if self.blocked is not None or target <= self._released:
            return ""
        cut = target - self._released
        out, self._pending = self._pending[:cut], self._pending[cut:]
        self._released = target
        return out
