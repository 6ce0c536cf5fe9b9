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

Guarantee: no character of a match of a blocking rule is released, however the text is
cut, as long as the rule's window covers its longest match. Limits: an unbounded regex
longer than its window may leak its start; a regex that looks further than one
character past its match (``foo(?!bar)``) is decided on the text so far and may block
where the whole text would not; lookbehinds see at most ``CONTEXT`` characters before
the overlap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from addon.filters.api import BLOCK, Verdict
from addon.filters.detectors import Matcher
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


class StreamScanner:
    """Checks one stream's text against rules and releases what is safe to send.

    ``extra_hold`` holds back at least that many characters whatever the rules need
    (user filters' windows). ``location`` is written into the verdicts; positions count
    from the stream's start.
    """

    def __init__(self, rules: Sequence[Rule], *, extra_hold: int = 0, location: str = "") -> None:
        self._tracks = [
            _Track(rule, m, rule.hold(m), max(MIN_STEP, (m.span + m.lookahead) // 4), 0, 0)
            for rule in rules
            for m in rule.matchers
        ]
        self._holding = [t for t in self._tracks if t.hold > 0]
        self._extra_hold = extra_hold
        self._location = location
        self._buf = ""  # the stream's text from ``_base`` on
        self._base = 0
        self._length = 0  # characters fed so far
        self._released = 0
        self._safe = 0  # what the holding tracks allow to release, as of their last check
        self._next_check = 0
        # The most text the checks and the release can still need; the buffer is cut
        # back to it once it has grown to twice that, so each character is copied a
        # bounded number of times.
        needs = [t.matcher.span + t.matcher.lookahead + t.step + t.hold for t in self._tracks]
        self._trim_at = 2 * (max(needs, default=0) + extra_hold + CONTEXT)
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
        """The most characters this scanner holds back between checks."""
        return max([self._extra_hold] + [t.hold for t in self._holding])

    def feed(self, text: str) -> tuple[str, list[Verdict]]:
        """Add a piece; return the text that may be released now and any new verdicts.

        After a block nothing more is released: the stream is to be ended.
        """
        if self.blocked is not None or not text:
            return "", []
        self._buf += text
        self._length += len(text)
        verdicts = self._check(final=False) if self._length >= self._next_check else []
        target = self._length - self._extra_hold
        if self._holding:
            target = min(target, self._safe)
        released = self._release(target)
        if len(self._buf) > self._trim_at:
            self._trim()
        return released, verdicts

    def flush(self) -> tuple[str, list[Verdict]]:
        """The end of the stream (or of one block of it): a last check, then the rest.

        Feeding may go on afterwards as a new block: positions keep counting, but no
        match spans the two.
        """
        if self.blocked is not None:
            return "", []
        verdicts = self._check(final=True)
        released = self._release(self._length)
        self._buf, self._base = "", self._length
        for t in self._tracks:
            t.checked = t.resume = self._length
        self._next_check = self._length
        return released, verdicts

    def _check(self, final: bool) -> list[Verdict]:
        verdicts: list[Verdict] = []
        base, buf = self._base, self._buf
        for t in self._tracks:
            if t.hits >= MAX_HITS_PER_RULE or (not final and self._length - t.checked < t.step):
                continue
            # Candidates ending closer than ``lookahead`` to the end are not final yet.
            limit = self._length if final else self._length - t.matcher.lookahead
            for m in t.matcher.regex.finditer(buf, t.scan_from() - base):
                if base + m.end() > limit:
                    break
                t.resume = base + m.end()
                hit = t.matcher.hit(m)
                if hit is None:
                    continue
                verdict = t.rule.verdict(hit, base, self._location)
                verdicts.append(verdict)
                t.hits += 1
                if verdict.action == BLOCK:
                    self.blocked = self.blocked or verdict
                    break
                if t.hits >= MAX_HITS_PER_RULE:
                    break
            t.checked = self._length
        self._next_check = min((t.checked + t.step for t in self._active()), default=1 << 62)
        self._safe = min((t.checked - t.hold for t in self._holding), default=0)
        return verdicts

    def _active(self) -> list[_Track]:
        return [t for t in self._tracks if t.hits < MAX_HITS_PER_RULE]

    def _release(self, target: int) -> str:
        if self.blocked is not None or target <= self._released:
            return ""
        out = self._buf[self._released - self._base : target - self._base]
        self._released = target
        return out

    def _trim(self) -> None:
        """Drop the text that is released and that no check will look at again."""
        keep = min([self._released] + [t.scan_from() - CONTEXT for t in self._active()])
        if keep > self._base:
            self._buf = self._buf[keep - self._base :]
            self._base = keep
