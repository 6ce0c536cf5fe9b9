"""The hold-back: rules checked over a stream of text as it arrives.

A response streams as many small pieces; a secret or a card number can be cut across
any number of them. :class:`StreamScanner` checks one stream (one choice's text, its
reasoning, one tool call's arguments) and says, after each piece, which text may go to
the client now and which verdicts the rules gave.

How it works. Every piece is checked as it arrives, with RE2 (linear time, whatever the
patterns and the text). A check looks at the text from the earliest position where a
match may still be in progress (below) to the end: first one search of all the rules of
a view together (a *prefilter* of each rule's gate, see :class:`Matcher`: ordinary text
matches nothing, and then that one search is the whole check), and only when it finds
something, each rule's own search over the same text. When all of a view's rules block,
that search and the one below are one. A candidate is final once its ``lookahead``
characters have arrived and no longer match of its rule can still grow from it
("4111 1111 1111 111" before its last digit arrives, "qz" of ``q.{0,3}z`` in "qzq");
until then it is left for the next check.

What is held back. After each piece the stream is released up to the earliest position
``i`` where a match of a blocking rule may still be in progress: where ``text[i:]`` is
the start of a match, or a match whose deciding ``lookahead`` characters have not all
arrived. Each matcher knows the texts that may still grow into a match as an RE2
pattern (:mod:`addon.filters.prefix`); all of a view's blocking matchers are searched
together, anchored at the end (``(?:...)\\z``), and RE2's leftmost match is ``i``. So a
keyword rule holds back only a tail that is the start of a keyword ("the nigh" before
"tjar"), the e-mail detector the last word (it could be a local part), and text that
cannot be part of any match is released at once. Each rule still holds at most its
``hold`` (:meth:`addon.filters.rules.Rule.hold`: its window), which also bounds how far
back an unbounded pattern's match may start; a matcher without a prefix pattern (a
pattern Python's parser cannot read) holds its whole window, as before. Flag rules and
rules with window 0 (release-first) hold nothing back; they only report. The same
search over all rules (blocking or not) says where the next check must start.

Views. Rules match on a normalised view of the text (:mod:`addon.filters.normalize`:
invisible characters removed, NFKC, optionally confusables), so spans and holds count
view characters, and invisible characters cost no window. Positions and the release
are in original characters: each view character knows the original character it came
from, a view's release point is the original offset of its first unreleasable view
character, and the invisible characters inside a match lie between its first and last
view characters, so they are held with it.

Guarantee: no character of a match of a blocking rule is released, however the text is
cut, as long as the rule's window covers its longest match. Limits: an unbounded regex
longer than its window may leak its start; word edges (``\\b``) see at most ``CONTEXT``
characters before the text a check looks at.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import re2  # type: ignore[import-untyped]

from addon.filters import detectors
from addon.filters.api import BLOCK, Verdict
from addon.filters.detectors import Matcher, Subject, re2_options
from addon.filters.normalize import Fold, folder
from addon.filters.rules import Rule

CONTEXT = 32  # characters kept before a check's text, for word edges and the context patterns read
MAX_HITS_PER_RULE = 20  # a rule reports at most this many hits per stream, then stops
_NO_MATCH = (-1, -1)


@dataclass(slots=True)
class _Track:
    """One matcher of one rule, and how far it has looked."""

    rule: Rule
    matcher: Matcher
    hold: int  # the most characters it holds back (0: none)
    resume: int  # end of its last final candidate: the next scan starts no earlier
    hits: int = 0


class _Reach:
    """Where a match of some matchers may still be in progress, in one RE2 search.

    Each entry is a matcher and the most characters it may reach back (``cap``). The
    prefix patterns of all of them are one alternation, anchored at the end and searched
    from the longest cap back (a bounded pattern's prefixes are no longer than its
    longest match and lookahead, an unbounded one's are cut by the cap: the view's
    longest, so a rule with a short window on an unbounded pattern may hold up to that);
    matchers without a prefix pattern reach their whole cap.
    """

    __slots__ = ("pattern", "regex", "cap", "fixed", "behind")

    def __init__(self, entries: Sequence[tuple[Matcher, int]]) -> None:
        prefixes = [m.prefix for m, _ in entries if m.prefix is not None]
        # A prefix pattern may begin with the context its match needs before it (a
        # keyword's word edge): searched that many characters earlier.
        self.behind = max((m.behind for m, _ in entries), default=0)
        self.fixed = max((cap for m, cap in entries if m.prefix is None), default=0)
        self.cap = max(
            (cap if m.prefix_len is None else min(cap, m.prefix_len) for m, cap in entries if m.prefix is not None),
            default=0,
        )
        self.pattern = rf"(?:{'|'.join(dict.fromkeys(prefixes))})\z" if prefixes else ""
        self.regex = _try_compile(self.pattern) if prefixes else None
        if prefixes and self.regex is None:  # (too large for RE2's memory budget: hold the windows)
            self.fixed = max(cap for _, cap in entries)

    def start(self, subject: Subject, lo: int, length: int, floor: int) -> int:
        """The earliest view offset (at least ``floor``) where such a match may be in
        progress; ``length`` when none. ``subject`` is the view's text from ``lo``."""
        best = max(floor, length - self.fixed) if self.fixed else length
        at = max(floor, length - self.cap, lo)  # (a check's text starts before any match in progress)
        if self.regex is not None and at < best:
            found = detectors.spans(self.regex, subject.data, subject.back(subject.byte(at - lo), self.behind))
            if found[0] != _NO_MATCH:
                best = min(best, max(floor, lo + subject.char(found[0][0])))
        return best


def _compile(pattern: str) -> Any:
    options = re2_options()
    options.never_capture = True  # (rules may share group names)
    return re2.compile(pattern, options)


def _try_compile(pattern: str) -> Any:
    """A combined pattern, or None when it is too large for RE2 (each rule's own pattern
    compiled at load; many together may not): the caller does without it."""
    try:
        return _compile(pattern)
    except re2.error:
        return None


@lru_cache(maxsize=1024)
def _anchored(prefix: str) -> Any:
    """A matcher's prefix pattern, anchored at the end of the text (None: too large)."""
    return _try_compile(rf"(?:{prefix})\z")


def gate_pattern(m: Matcher) -> str:
    """What a matcher's combined search looks for: its gate, or its pattern as it matches."""
    if m.gate:
        return m.gate
    pattern: str = m.regex.pattern
    return pattern if m.regex.options.case_sensitive else f"(?i:{pattern})"


@dataclass(frozen=True, slots=True)
class _Plan:
    """The compiled searches of one view's rules (shared by every stream they check)."""

    prefilter: Any  # all matchers' gates at once: can anything match?
    behind: int  # the most context characters a matcher reads before a match
    scan: _Reach  # where the next check starts (all matchers)
    release: _Reach | None  # where the release stops (blocking matchers, at their holds); None: ``scan``
    keep_back: int  # the most characters the release may hold back
    scan_back: int  # the most characters a check may reach back
    # When every matcher blocks at its full hold and has a prefix pattern: the gates or
    # the prefix patterns in one search, so most pieces cost one search (_View.check).
    both: Any = None
    # Which matchers' gates occur in a text (an RE2 set, one entry per matcher, in the
    # order the plan lists them); None: run them all. When the prefilter finds something,
    # only those matchers run their own search: text that opens one gate (an "@" in a
    # sentence) costs one rule's search, not a hundred.
    gate_set: Any = None
    gate_of: tuple[int, ...] = ()  # each track's entry in ``gate_set`` (tracks in the order planned)


@lru_cache(maxsize=256)
def _plan(tracks: tuple[tuple[Matcher, int], ...]) -> _Plan:
    """``tracks``: each matcher with its hold (0: holds nothing)."""
    matchers = list(dict.fromkeys(m for m, _ in tracks))
    gates = "|".join(f"(?:{gate_pattern(m)})" for m in matchers)
    prefilter = _try_compile(gates) if matchers else None  # None: run every rule's own search
    scan_entries = [(m, m.hold) for m in matchers]
    release_entries = [(m, hold) for m, hold in tracks if hold > 0]
    same = {id(m) for m, _ in release_entries} == {id(m) for m in matchers} and all(
        hold >= m.span + m.lookahead - 1 for m, hold in release_entries
    )
    scan = _Reach(scan_entries)
    return _Plan(
        prefilter,
        max((m.behind for m in matchers), default=0),
        scan,
        None if same else _Reach(release_entries),
        max((hold for _, hold in release_entries), default=0),
        max((cap for _, cap in scan_entries), default=0),
        _try_compile(f"{gates}|{scan.pattern}") if same and prefilter and scan.regex and not scan.fixed else None,
        gate_set(matchers) if len(matchers) > 1 else None,
        tuple(matchers.index(m) for m, _ in tracks),
    )


def gate_set(matchers: list[Matcher]) -> Any:
    """An RE2 set of the matchers' gates (None when RE2 refuses it: then all of them run)."""
    options = re2_options()
    options.never_capture = True
    gates = re2.Set.SearchSet(options)
    try:
        for m in matchers:
            gates.Add(gate_pattern(m))
        gates.Compile()
    except re2.error:
        return None
    return gates


class _View:
    """One way of reading the stream (see :mod:`addon.filters.normalize`) and the tracks
    of the rules that read it that way.

    ``buf`` holds the view's text from ``base`` on (view offsets); ``where`` the original
    offset of each of its characters, or ``None`` while the view is the original text
    itself (ASCII, or text no fold changes: the common case costs no map). ``scan_from``
    is where the next check starts, ``hold_from`` the first view character the release
    must keep back, and ``safe`` its original offset.
    """

    __slots__ = (
        "fold",
        "tracks",
        "holding",
        "plan",
        "buf",
        "base",
        "length",
        "where",
        "scan_from",
        "hold_from",
        "safe",
        "keep_back",
        "trim_at",
    )

    def __init__(self, fold: Fold | None, tracks: list[_Track]) -> None:
        self.fold = fold
        self.tracks = tracks
        self.holding = [t for t in tracks if t.hold > 0]
        self.plan = _plan(tuple((t.matcher, t.hold) for t in tracks))
        self.buf = ""
        self.base = 0
        self.length = 0
        self.where: array[int] | None = None
        self.scan_from = 0
        self.hold_from = 0
        self.safe = 0
        self.keep_back = self.plan.keep_back
        # The buffer is cut back to what the checks and the release still need once it
        # has grown past this, so each character is copied a bounded number of times.
        self.trim_at = 2 * (max(self.plan.keep_back, self.plan.scan_back) + CONTEXT) + 256

    def state(self) -> tuple[Any, ...]:
        """What a check changes (:meth:`StreamScanner.let_go` checks as if at an end, then undoes it)."""
        where = None if self.where is None else array("q", self.where)
        tracks = [(t.resume, t.hits) for t in self.tracks]
        return (self.buf, self.base, self.length, where, self.scan_from, self.hold_from, self.safe, tracks)

    def restore(self, state: tuple[Any, ...]) -> None:
        self.buf, self.base, self.length, self.where, self.scan_from, self.hold_from, self.safe, tracks = state
        for t, (resume, hits) in zip(self.tracks, tracks, strict=True):
            t.resume, t.hits = resume, hits

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
        """Check the new text; the verdicts (positions in the original text) and the first block."""
        verdicts: list[Verdict] = []
        blocked: Verdict | None = None
        if self.length == self.scan_from and not final:
            return verdicts, blocked
        plan = self.plan
        lo = max(self.base, self.scan_from - CONTEXT)
        subject = Subject(self.buf[lo - self.base :])
        at = subject.back(subject.byte(self.scan_from - lo), plan.behind)
        if plan.both is not None and not final and self._settled(subject, lo, at, end):
            return verdicts, blocked
        active = [t for t in self.tracks if t.hits < MAX_HITS_PER_RULE]
        if active and (plan.prefilter is None or detectors.spans(plan.prefilter, subject.data, at)[0] != _NO_MATCH):
            if plan.gate_set is not None:
                # The whole subject, context included: a gate found only in the context
                # runs its rule for nothing, but none is missed (a slice from ``at``
                # would change what ``^`` and ``\b`` see).
                opened = set(plan.gate_set.Match(subject.data) or ())  # (None: no gate)
                gate_of = plan.gate_of
                active = [t for i, t in enumerate(self.tracks) if gate_of[i] in opened and t.hits < MAX_HITS_PER_RULE]
            blocked = self._run(active, subject, lo, final, end, location, verdicts)
        if not final and blocked is None:
            self.scan_from = plan.scan.start(subject, lo, self.length, self.scan_from)
            if self.holding:
                if plan.release is None:  # (the same search: all rules block, at their full holds)
                    self.hold_from = self.scan_from
                else:
                    self.hold_from = plan.release.start(subject, lo, self.length, self.hold_from)
                self.safe = self.original(self.hold_from, end)
        return verdicts, blocked

    def _settled(self, subject: Subject, lo: int, at: int, end: int) -> bool:
        """The one-search check of a view whose rules all block: True when no gate starts
        before the leftmost match in progress (which then starts the hold and the next
        check) nor after it, or when there is neither (all of it is settled). A gate after
        a match in progress (a card number after a host name being written) sends the
        piece the long way, which decides it now: left for a later check, it was held and
        found only once the match in progress was decided, the text before it released
        where the long way blocks at once (found by tests/unit/test_filters_window.py)."""
        plan, data = self.plan, subject.data
        found = detectors.spans(plan.both, data, at)[0]
        if found == _NO_MATCH:
            # No gate and nothing in progress: all of it is settled. (The long way finds
            # that too, after two more searches.) Only where no prefix pattern matches at
            # the very end: keyword rules, on text that does not end with the start of a
            # keyword, most pieces; the other kinds' prefixes match even the empty end.
            start = self.length
        else:
            if found[1] < len(data):  # a gate (the prefix patterns end at the end)
                return False
            if found[0] < found[1]:  # a match in progress: a gate in it (to the end) or after it?
                if detectors.spans(plan.prefilter, data, found[0])[0] != _NO_MATCH:
                    return False
            start = lo + subject.char(found[0])
            if start < self.length - plan.scan.cap:  # (an unbounded one, cut by the cap: the long way)
                return False
        self.scan_from = self.hold_from = max(self.scan_from, start)
        self.safe = self.original(self.hold_from, end)
        return True

    def _run(
        self, active: list[_Track], subject: Subject, lo: int, final: bool, end: int, location: str, out: list[Verdict]
    ) -> Verdict | None:
        """Each rule's own search over the checked text (the prefilter found something)."""
        blocked: Verdict | None = None
        text = subject.text
        for t in active:
            # Candidates ending closer than ``lookahead`` to the end are not final yet, nor
            # any from where a match of the rule may still be in progress: a longer one
            # may grow there ("qz" of q.{0,3}z in "qzq" before "z" arrives).
            start = max(t.resume, self.scan_from)
            limit = self.length if final else self.length - t.matcher.lookahead
            growing = self.length if final else self._in_progress(t.matcher, subject, lo, start)
            for c in t.matcher.candidates(subject, start - lo):
                if lo + c.end > limit or lo + c.start >= growing:
                    break
                t.resume = lo + c.end
                hit = t.matcher.hit(text, c)
                if hit is None:
                    continue
                verdict = t.rule.verdict(hit, self.original(lo + hit.start, end), location)
                out.append(verdict)
                t.hits += 1
                if verdict.action == BLOCK:
                    blocked = blocked or verdict
                    break
                if t.hits >= MAX_HITS_PER_RULE:
                    break
        return blocked

    def _in_progress(self, m: Matcher, subject: Subject, lo: int, start: int) -> int:
        """The earliest view offset from ``start`` where a match of ``m`` may still grow."""
        if m.prefix is None:
            return self.length
        at = max(start, lo, self.length - (m.span + m.lookahead))
        regex = _anchored(m.prefix)
        if regex is None:  # (then its reach holds the whole window: lookahead alone decides)
            return self.length
        found = detectors.spans(regex, subject.data, subject.back(subject.byte(at - lo), m.behind))
        return self.length if found[0] == _NO_MATCH else lo + subject.char(found[0][0])

    def end_block(self) -> None:
        """The block is over: no match spans it and what follows."""
        self.buf, self.base, self.where = "", self.length, None if self.where is None else array("q")
        for t in self.tracks:
            t.resume = self.length
        self.scan_from = self.hold_from = self.length

    def trim(self) -> None:
        """Drop the text no check (and no release point) will look at again."""
        if len(self.buf) <= self.trim_at:
            return
        keep = min(self.scan_from - CONTEXT, self.hold_from if self.holding else self.length)
        if keep > self.base:
            cut = keep - self.base
            self.buf = self.buf[cut:]
            if self.where is not None:
                del self.where[:cut]
            self.base = keep


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
                by_view.setdefault(rule.view, []).append(_Track(rule, m, rule.hold(m), 0))
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
        """The most characters (of a view) this scanner may hold back."""
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

    def let_go(self) -> list[Verdict]:
        """Another stream of the answer came (a tool call after the text, the answer after
        the reasoning): what this one holds goes now, so that the other's bytes are not
        held behind it, but it is still read with whatever of it follows: a match across
        the break is found and blocks the rest (the client then has only the part before
        the break, which matched nothing on its own).

        What holds it may be a match that only its end decides (a keyword waiting for the
        next character to show it is a whole word): the break is checked as an end first,
        and a block found so stands. Otherwise the views are put back as they were, so
        the text after the break is read with the text before it."""
        if self.blocked is not None or self._released == self._length:
            return []  # (nothing held: nothing to check or let go, the common case)
        saved = [_View.state(view) for view in self._views]
        verdicts: list[Verdict] = []
        for view in self._views:
            self._check(view, True, verdicts)
        if self.blocked is not None:
            return verdicts
        for view, state in zip(self._views, saved, strict=True):
            view.restore(state)
        self._release(self._length)
        return []

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
