"""Built-in detectors: credentials and personal data, as bounded regular expressions.

Every detector is a :class:`Matcher`: one compiled RE2 pattern (linear time whatever
the text: a model's output cannot make a check stall the proxy), the longest text it
can match (``span``), how many characters after a match can still change it
(``lookahead``), and an optional ``refine`` step that validates a candidate (Luhn,
IBAN mod-97) or narrows it to the part worth hashing. Bounded patterns are what make
streaming work: a blocking rule holds back at most ``span + lookahead - 1`` characters
of a stream (see :mod:`addon.filters.window`), so ``span`` must be finite and small.

RE2 has no lookarounds. The Python patterns these replace checked the characters around
a match with them (``\\b``, ``(?<![0-9])``, ``(?![A-Za-z0-9_-])``); here the pattern
reads those characters itself (:class:`Shape`: ``before`` and ``after``), and the
match proper is a named group. A negative one-character lookahead and a pattern that
reads one character that is not in the class (or the end) accept the same matches in
the same order of preference, so RE2's leftmost-first match is the one Python's
backtracking found; the next search starts at the end of the match proper, as
``finditer`` did (tests/unit/test_filters_re2.py compares both on crafted and random
text).

Why not detect-secrets (or another secrets scanner)
---------------------------------------------------
detect-secrets (Yelp) is the well-kept library here, and was considered. It does not fit
a per-piece stream check:

- its plugins yield secret *values* per line, not offsets, so verdicts could carry no
  position, and its heuristics (file types, line context) assume source files;
- several of its patterns are unbounded (JWT, Slack's ``(?:\\d+-)+``), so no hold-back
  window covers their longest match and a token cut across pieces could leak;
- its OpenAI pattern knows only the legacy key format, and it has no Anthropic or Google
  API key detector;
- its settings are process-global (``default_settings()``).

So this module keeps a focused pattern set for the credentials a conversation with a
model is likely to carry, modelled on the public rules of gitleaks and detect-secrets,
with every repetition bounded.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from re import _parser as re_parser  # type: ignore[attr-defined]  # the only way to ask re for a pattern's width (typeshed omits it)
from typing import Any

import re2  # type: ignore[import-untyped]

from addon.filters.prefix import MAX_SPAN, prefix_pattern

# Turns a candidate (the text, its start and end) into the span of a real hit, or None.
Refine = Callable[[str, int, int], tuple[int, int] | None]

# Python's ``\w`` (Unicode letters, digits, underscore) for RE2, whose ``\w`` is ASCII.
# The two differ only on code points Python's Unicode database does not assign yet.
WORD = r"\pL\pN_"
# Scripts written without spaces between words (Chinese, Japanese, Thai, Lao, Khmer,
# Burmese), Korean, whose particles join the word before them, and the apostrophes that
# are letters (U+02BC; the long-vowel marks of katakana): a word of another script sits
# right against their letters ("请告诉我Nightjar项目", "Nightjarについて", "Nightjar는",
# "Nightjarʼs"), and their words against one another ("夜鹰队"). Each of their
# characters is a word edge, as a space is: a keyword or a credential among them is
# found (a word of theirs right after a Latin letter still is not: "abc夜鹰").
NO_SPACE = (
    r"\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}\p{Bopomofo}\p{Yi}\p{Thai}\p{Lao}\p{Khmer}\p{Myanmar}"
    r"\p{Tibetan}\p{Javanese}\p{Balinese}\p{Tai_Tham}\p{New_Tai_Lue}\p{Tai_Viet}"
    r"\x{02BC}\x{3031}-\x{3035}\x{30FC}\x{FF70}"
)
NOT_WORD = rf"(?:[^{WORD}]|[{NO_SPACE}])"
_NO_SPACE_CHAR = re2.compile(rf"[{NO_SPACE}]")
# Python's ``\s`` (str.isspace), written as literal characters both parsers read alike.
SPACE = "[\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"

_UNANCHORED = re2._Anchor.UNANCHORED
_NO_MATCH = (-1, -1)


def re2_options(case_sensitive: bool = True) -> Any:
    """RE2's options for a rule: UTF-8, and a memory budget for large keyword lists."""
    options = re2.Options()
    options.case_sensitive = case_sensitive
    options.log_errors = False
    options.max_mem = 64 << 20
    return options


def spans(regex: Any, data: bytes, pos: int) -> list[tuple[int, int]]:
    """RE2's leftmost match in ``data`` from byte ``pos``: the byte span of every group
    (``(-1, -1)`` for none; the first is ``(-1, -1)`` when nothing matched).

    The binding's own ``search`` builds a generator and a match object per call, which
    doubles the cost of the one search most pieces of a stream need; this is the call
    it makes underneath (google-re2's ``_Regexp._regexp.Match``).
    """
    result: list[tuple[int, int]] = regex._regexp.Match(_UNANCHORED, data, pos, len(data))
    return result


class Subject:
    """A text encoded once for RE2, with its byte offsets turned back into characters.

    Lone surrogates (which JSON can carry) become ``?``, one byte for one character, so
    offsets stay aligned and RE2 sees a character no pattern here matches.
    """

    __slots__ = ("text", "data", "ascii", "_b", "_c")

    def __init__(self, text: str) -> None:
        self.text = text
        self.data = text.encode("utf-8", "replace")
        self.ascii = len(self.data) == len(text)
        self._b = self._c = 0

    def char(self, b: int) -> int:
        """The character offset of byte offset ``b`` (a character boundary).

        Counted from the nearest offset known: the last one asked for, the start or the
        end. The first call on a piece is usually near its end (where a match may still be
        in progress: the hold point), and counting from the start there decoded the whole
        piece again (in process, the bench's 100 rules on 1 KiB non-ASCII pieces: the
        scanner 11.0 -> 10.5 us per piece, eight interleaved runs).
        """
        if self.ascii:
            return b
        data, last = self.data, self._b
        size = len(data)
        if abs(b - last) <= min(b, size - b):
            if b >= last:
                self._c += len(data[last:b].decode())
            else:
                self._c -= len(data[b:last].decode())
        elif b <= size - b:
            self._c = len(data[:b].decode())
        else:
            self._c = len(self.text) - len(data[b:].decode())
        self._b = b
        return self._c

    def byte(self, ch: int) -> int:
        """The byte offset of character offset ``ch``, counted from the nearer end."""
        if self.ascii:
            return ch
        text = self.text
        if ch <= len(text) - ch:
            return len(text[:ch].encode("utf-8", "replace"))
        return len(self.data) - len(text[ch:].encode("utf-8", "replace"))

    def back(self, b: int, chars: int) -> int:
        """The byte offset ``chars`` characters before byte offset ``b``."""
        if self.ascii:
            return max(0, b - chars)
        data = self.data
        for _ in range(chars):
            if b == 0:
                break
            b -= 1
            while b > 0 and 0x80 <= data[b] < 0xC0:
                b -= 1
        return b

    def after(self, b: int) -> int:
        """The byte offset of the character after the one at ``b``."""
        b += 1
        if not self.ascii:
            while b < len(self.data) and 0x80 <= self.data[b] < 0xC0:
                b += 1
        return b


@dataclass(frozen=True, slots=True)
class Hit:
    """One detection in a text: where it is, what kind it is, and the matched text.

    ``text`` is only ever hashed into a verdict; it is never recorded.
    """

    start: int
    end: int
    label: str
    text: str


@dataclass(frozen=True, slots=True)
class Candidate:
    """A match of a matcher's pattern, before ``refine``: character offsets in the text."""

    start: int
    end: int
    label: str
    narrow: tuple[int, int] | None  # the ``secret`` group's span, when it took part


@dataclass(frozen=True, slots=True)
class Matcher:
    """A compiled RE2 pattern with the bounds the stream window needs.

    ``regex`` (RE2: linear time whatever the text) may read characters around the match
    proper, which the Python patterns these replace checked with lookarounds RE2 does
    not have: ``behind`` characters before it (a word edge, "no digit before"), and the
    ``lookahead`` characters after it. The match proper is then the named group of
    ``groups`` that took part (its name labels the hit when ``label`` is empty), or the
    whole match when ``groups`` is empty. Each candidate is read in the order Python's
    ``finditer`` read the old pattern: the next search starts at the end of the match
    proper, not of the characters read after it.

    ``span``: the longest match proper. ``lookahead``: how many characters after a
    match may decide it; a match is only final once they have arrived. ``refine``
    turns a candidate into the span of a real hit, or ``None`` when the candidate fails
    validation; a group named ``secret`` narrows the hit to itself. ``prefix``: an RE2
    pattern of every text that may still grow into a match (:mod:`addon.filters.prefix`),
    with ``prefix_len`` the longest (``None``: unbounded); no ``prefix`` means the
    stream holds back the whole window for this matcher. ``gate``: an RE2 pattern found
    in every match (the literal start of a credential, the ``@`` of an address), which a
    stream's one combined search looks for first (:mod:`addon.filters.window`); empty:
    the pattern itself.
    """

    regex: Any
    span: int
    lookahead: int = 1
    label: str = ""
    refine: Refine | None = None
    groups: tuple[str, ...] = ()
    behind: int = 0
    prefix: str | None = None
    prefix_len: int | None = None
    gate: str = ""

    @property
    def hold(self) -> int:
        """Characters a blocking rule must hold back to never release part of a match."""
        return self.span + self.lookahead - 1

    def candidates(self, subject: Subject, pos: int = 0) -> Iterator[Candidate]:
        """The pattern's matches in ``subject`` whose match proper starts at ``pos`` or
        later, in order, the next searched from the end of the last one's match proper."""
        data, regex = subject.data, self.regex
        index = regex.groupindex
        groups = [(name, index[name]) for name in self.groups]
        narrow = index.get("secret")
        b = subject.byte(pos)
        at = subject.back(b, self.behind)
        while at <= len(data):
            found = spans(regex, data, at)
            if found[0] == _NO_MATCH:
                return
            label, (start, end) = self.label, found[0]
            for name, g in groups:
                if found[g][0] >= 0:
                    label, (start, end) = self.label or ("" if name.startswith("_") else name), found[g]
                    break
            if start < b:  # seen through the characters before ``pos``: look further on
                at = subject.after(found[0][0])
                continue
            inner = None
            if narrow is not None and found[narrow][0] >= 0:
                inner = (subject.char(found[narrow][0]), subject.char(found[narrow][1]))
            yield Candidate(subject.char(start), subject.char(end), label, inner)
            b = end if end > start else subject.after(end)
            at = subject.back(b, self.behind)

    def hit(self, text: str, c: Candidate) -> Hit | None:
        """The hit a candidate stands for, if it is one."""
        span: tuple[int, int] | None = c.narrow or (c.start, c.end)
        if self.refine is not None:
            span = self.refine(text, c.start, c.end)
        if span is None:
            return None
        start, end = span
        return Hit(start, end, c.label, text[start:end])

    def find(self, text: str) -> Iterator[Hit]:
        """Every hit in a complete text."""
        for c in self.candidates(Subject(text)):
            hit = self.hit(text, c)
            if hit is not None:
                yield hit


def regex_width(regex: re.Pattern[str]) -> tuple[int, int | None]:
    """The shortest and longest text ``regex`` can match; longest ``None`` when unbounded.

    ``re`` computes this for its own optimiser; its parser is private but stable
    across the Python versions this project supports, and a change would fail the
    tests loudly rather than quietly.
    """
    low, high = re_parser.parse(regex.pattern, regex.flags).getwidth()
    return low, (high if high <= MAX_SPAN else None)


@dataclass(frozen=True, slots=True)
class Shape:
    """A built-in pattern: the match proper ``core`` (syntax Python and RE2 read alike,
    so its width and prefixes can be computed), and RE2 patterns for the characters
    that must (``before``) precede it and (``after``) follow it."""

    core: str
    before: str = ""
    after: str = ""
    gate: str = ""  # an RE2 pattern every match of ``core`` contains (default: ``core``)

    def pattern(self, name: str) -> str:
        return f"{self.before}(?P<{name}>{self.core}){self.after}"


def _matcher(shapes: dict[str, Shape], lookahead: int, label: str = "", refine: Refine | None = None) -> Matcher:
    """One RE2 alternation of ``shapes`` (each a named group), with its span and prefix."""
    regex = re2.compile("|".join(s.pattern(name) for name, s in shapes.items()), re2_options())
    # A match may still change until its ``lookahead`` characters have all arrived: the
    # texts still open are the prefixes of a match and ``lookahead - 1`` more characters.
    analysed = [prefix_pattern(s.core, False, lookahead - 1) for s in shapes.values()]
    highs = [high for _, _, high in analysed]
    assert None not in highs, f"built-in pattern {label or list(shapes)} must be bounded"
    span = max(high for high in highs if high is not None)
    prefix = "|".join(p for p, _, _ in analysed)
    behind = 2 if any(s.before for s in shapes.values()) else 0
    gate = "|".join(s.gate or s.core for s in shapes.values())
    return Matcher(regex, span, lookahead, label, refine, tuple(shapes), behind, prefix, span + lookahead - 1, gate)


# -- secrets -----------------------------------------------------------------------------

# The word edge ``\b`` before a credential's first letter, and the "no more of its
# characters" after it (``(?![A-Za-z0-9_-])``): characters RE2 reads around the match.
_EDGE = rf"(?:^|{NOT_WORD})"


def _end(chars: str) -> str:
    return f"(?:$|[^{chars}])"


# One named group per kind; a group named ``secret`` inside narrows the hit to the
# credential itself, so the hash does not depend on the words around it.
SECRET_SHAPES: dict[str, Shape] = {
    # sk-proj- / sk-svcacct- / sk-admin- keys and the legacy format; all carry "T3BlbkFJ"
    # ("OpenAI" in base64), which keeps the pattern from matching any "sk-" word.
    "openai_api_key": Shape(
        r"sk-(?:(?:proj|svcacct|admin)-(?:[A-Za-z0-9_-]{74}|[A-Za-z0-9_-]{58})T3BlbkFJ"
        r"(?:[A-Za-z0-9_-]{74}|[A-Za-z0-9_-]{58})|[A-Za-z0-9]{20}T3BlbkFJ[A-Za-z0-9]{20})",
        _EDGE,
        _end("A-Za-z0-9_-"),
        gate=r"sk-",
    ),
    # (The version digits were ``\d``, any Unicode digit; keys are ASCII.)
    "anthropic_api_key": Shape(
        r"sk-ant-(?:api|admin)[0-9][0-9]-[A-Za-z0-9_-]{93}AA", _EDGE, _end("A-Za-z0-9_-"), gate=r"sk-"
    ),
    "aws_access_key_id": Shape(
        r"(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[A-Z2-7]{16}", _EDGE, f"(?:$|{NOT_WORD})", gate=r"A(?:KIA|SIA|BIA|CCA|3T)"
    ),
    "aws_secret_access_key": Shape(
        rf"(?i:aws_?secret_?(?:access_?)?key)[\"']?{SPACE}{{0,3}}[:=]{SPACE}{{0,3}}[\"']?(?P<secret>[A-Za-z0-9/+]{{40}})",
        "",
        _end("A-Za-z0-9/+="),
        gate=r"(?i:aws_?secret)",
    ),
    "github_token": Shape(
        r"(?:gh[pousr]_[A-Za-z0-9]{36}|github_pat_[A-Za-z0-9_]{82})",
        _EDGE,
        _end("A-Za-z0-9_"),
        gate=r"gh[pousr]_|github_pat_",
    ),
    "google_api_key": Shape(r"AIza[A-Za-z0-9_-]{35}", _EDGE, _end("A-Za-z0-9_-"), gate=r"AIza"),
    "slack_token": Shape(r"xox[bpas]-[0-9]{8,13}-[A-Za-z0-9-]{8,90}", _EDGE, _end("A-Za-z0-9-"), gate=r"xox[bpas]-"),
    "stripe_secret_key": Shape(r"[rs]k_live_[A-Za-z0-9]{24,99}", _EDGE, _end("A-Za-z0-9"), gate=r"[rs]k_live_"),
    # The header is enough: once it is seen the stream is stopped before the key body.
    "private_key": Shape(r"-----BEGIN (?:[A-Z0-9]{1,12} ){0,2}PRIVATE KEY(?: BLOCK)?-----", gate=r"-----BEGIN "),
    # A JWT is recognised by its header and the start of its payload (both base64 JSON
    # objects, "eyJ" = '{"'); matching no further keeps the pattern, and so the window,
    # bounded whatever the payload's length.
    "jwt": Shape(r"eyJ[A-Za-z0-9_-]{8,150}\.eyJ[A-Za-z0-9_-]{8}", _EDGE, gate=r"eyJ"),
}
SECRET_TYPES = tuple(SECRET_SHAPES)


def secrets_matcher(types: tuple[str, ...] = SECRET_TYPES) -> Matcher:
    """One alternation of the chosen secret patterns, so a stream is scanned once."""
    return _matcher({name: SECRET_SHAPES[name] for name in types}, lookahead=1)


# -- payment cards -----------------------------------------------------------------------

# Issuer prefixes (IIN ranges, compared as strings of equal length) and card lengths.
_CARD_RANGES: tuple[tuple[str, str, Sequence[int]], ...] = (
    ("4", "4", (13, 16, 19)),  # Visa
    ("51", "55", range(16, 17)),  # Mastercard
    ("2221", "2720", range(16, 17)),  # Mastercard 2-series
    ("34", "34", range(15, 16)),  # American Express
    ("37", "37", range(15, 16)),
    ("300", "305", range(14, 20)),  # Diners Club
    ("36", "36", range(14, 20)),
    ("38", "39", range(16, 20)),
    ("6011", "6011", range(16, 20)),  # Discover
    ("644", "649", range(16, 20)),
    ("65", "65", range(16, 20)),
    ("3528", "3589", range(16, 20)),  # JCB
    ("62", "62", range(16, 20)),  # UnionPay
    ("2200", "2204", range(16, 20)),  # Mir
    ("50", "50", range(13, 20)),  # Maestro
    ("56", "69", range(13, 20)),
)


def luhn_ok(digits: str) -> bool:
    """The Luhn checksum of a string of digits is valid."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def card_ok(digits: str) -> bool:
    """A known issuer prefix with a length it issues, and a valid Luhn checksum."""
    n = len(digits)
    known = any(lo <= digits[: len(lo)] <= hi and n in lengths for lo, hi, lengths in _CARD_RANGES)
    return known and luhn_ok(digits)


def _card_span(text: str, start: int, end: int) -> tuple[int, int] | None:
    digits = text[start:end].replace(" ", "").replace("-", "")
    return (start, end) if card_ok(digits) else None


# 13 to 19 digits, single spaces or dashes allowed between them. The whole run must be
# the number: a digit run on by one separator makes it part of a longer number (so
# before it: no digit, nor a digit and a separator; after it: the same).
CARD = _matcher(
    {
        "card": Shape(
            r"[0-9](?:[ -]?[0-9]){12,18}",
            r"(?:^|[^0-9 -]|(?:^|[^0-9])[ -])",
            r"(?:$|[^0-9 -]|[ -](?:$|[^0-9]))",
            gate=r"[0-9](?:[ -]?[0-9]){12}",
        )
    },
    lookahead=2,
    label="card",
    refine=_card_span,
)


# -- IBAN --------------------------------------------------------------------------------

# fmt: off
IBAN_LENGTHS: dict[str, int] = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22,
    "BI": 27, "BR": 29, "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DJ": 27,
    "DK": 18, "DO": 28, "EE": 20, "EG": 29, "ES": 24, "FI": 18, "FK": 18, "FO": 18, "FR": 27,
    "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27, "GT": 28, "HR": 21, "HU": 28, "IE": 22,
    "IL": 23, "IQ": 23, "IS": 26, "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28, "LC": 32,
    "LI": 21, "LT": 20, "LU": 20, "LV": 21, "LY": 25, "MC": 27, "MD": 24, "ME": 22, "MK": 19,
    "MN": 20, "MR": 27, "MT": 31, "MU": 30, "NI": 28, "NL": 18, "NO": 15, "OM": 23, "PK": 24,
    "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "RU": 33, "SA": 24, "SC": 31,
    "SD": 18, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "SO": 23, "ST": 25, "SV": 28, "TL": 23,
    "TN": 24, "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20, "YE": 30,
}
# fmt: on


def iban_ok(iban: str) -> bool:
    """An IBAN without spaces: its country's length and a valid mod-97 checksum."""
    if IBAN_LENGTHS.get(iban[:2]) != len(iban) or not iban[2:4].isdigit():
        return False
    rearranged = iban[4:] + iban[:4]
    return int("".join(str(int(ch, 36)) for ch in rearranged)) % 97 == 1


def _iban_span(text: str, start: int, end: int) -> tuple[int, int] | None:
    """The IBAN at the start of a candidate: as many characters as its country uses.

    The candidate may run on into the next group of capitals or digits ("… 00 EUR"),
    so the country's length, not the candidate's, ends the IBAN.
    """
    n = IBAN_LENGTHS.get(text[start : start + 2])
    if n is None:
        return None
    seen = 0
    for stop in range(start, end):
        seen += text[stop] != " "
        if seen == n:
            break
    else:
        return None
    stop += 1
    after = text[stop : stop + 1]  # (a letter of a script written without spaces is an edge: NO_SPACE)
    if (after.isalnum() and _NO_SPACE_CHAR.match(after) is None) or not iban_ok(text[start:stop].replace(" ", "")):
        return None
    return start, stop


# Country, check digits, groups of four (spaces optional), a last short group.
IBAN = _matcher(
    {
        "iban": Shape(
            r"[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?",
            r"(?:^|[^A-Za-z0-9])",
            gate=r"[A-Z]{2}[0-9]{2}",
        )
    },
    lookahead=2,
    label="iban",
    refine=_iban_span,
)


# -- e-mail ------------------------------------------------------------------------------

# A 64-character local part, up to four domain labels and a top-level domain. What may
# follow refuses a match that the next characters would extend ("a@b.co" in "a@b.com",
# "a@b.com" in "a@b.com.au"), so a match is final two characters after it.
EMAIL = _matcher(
    {
        "email": Shape(
            r"[A-Za-z0-9._%+-]{1,64}@(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.){1,4}[A-Za-z]{2,24}",
            r"(?:^|[^A-Za-z0-9._%+-])",
            r"(?:$|[^A-Za-z0-9.-]|\.(?:$|[^A-Za-z0-9-]))",
            gate="@",
        )
    },
    lookahead=2,
    label="email",
)

PII: dict[str, Matcher] = {"email": EMAIL, "card": CARD, "iban": IBAN}
PII_TYPES = tuple(PII)
