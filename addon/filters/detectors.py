"""Built-in detectors: credentials and personal data, as bounded regular expressions.

Every detector is a :class:`Matcher`: one compiled pattern, the longest text it can
match (``span``), how many characters after a match can still change it
(``lookahead``), and an optional ``refine`` step that validates a candidate (Luhn,
IBAN mod-97) or narrows it to the part worth hashing. Bounded patterns are what make
streaming work: a blocking rule holds back ``span + lookahead - 1`` characters of a
stream (see :mod:`addon.filters.window`), so ``span`` must be finite and small.

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

# A pattern wider than this is treated as unbounded (``a+`` reports ~2**64).
MAX_SPAN = 65536

# Turns a candidate match into the span of a real hit, or None when it is not one.
Refine = Callable[[re.Match[str]], tuple[int, int] | None]


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
class Matcher:
    """A compiled pattern with the bounds the stream window needs.

    ``span``: the longest text the pattern matches. ``lookahead``: how many characters
    after a match the pattern may look at to decide it (``(?!\\w)`` needs one, a
    separator and a digit need two); a match is only final once they have arrived.
    ``refine`` turns a candidate into the span of a real hit, or ``None`` when the
    candidate fails validation. ``label`` names the hits; when empty, the name of the
    matching group of the pattern does (one pattern, several kinds of secret).
    """

    regex: re.Pattern[str]
    span: int
    lookahead: int = 1
    label: str = ""
    refine: Refine | None = None

    @property
    def hold(self) -> int:
        """Characters a blocking rule must hold back to never release part of a match."""
        return self.span + self.lookahead - 1

    def hit(self, m: re.Match[str]) -> Hit | None:
        """The hit a candidate match stands for, if it is one."""
        span = self.refine(m) if self.refine else m.span()
        if span is None:
            return None
        start, end = span
        return Hit(start, end, self.label or m.lastgroup or "", m.string[start:end])

    def find(self, text: str) -> Iterator[Hit]:
        """Every hit in a complete text."""
        for m in self.regex.finditer(text):
            hit = self.hit(m)
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


def _matcher(pattern: str, lookahead: int, label: str = "", refine: Refine | None = None) -> Matcher:
    regex = re.compile(pattern)
    _, span = regex_width(regex)
    assert span is not None, f"built-in pattern {label or pattern!r} must be bounded"
    return Matcher(regex, span, lookahead, label, refine)


# -- secrets -----------------------------------------------------------------------------

# One named group per kind; a group named ``secret`` inside narrows the hit to the
# credential itself, so the hash does not depend on the words around it.
SECRET_PATTERNS: dict[str, str] = {
    # sk-proj- / sk-svcacct- / sk-admin- keys and the legacy format; all carry "T3BlbkFJ"
    # ("OpenAI" in base64), which keeps the pattern from matching any "sk-" word.
    "openai_api_key": r"\bsk-(?:(?:proj|svcacct|admin)-(?:[A-Za-z0-9_-]{74}|[A-Za-z0-9_-]{58})T3BlbkFJ"
    r"(?:[A-Za-z0-9_-]{74}|[A-Za-z0-9_-]{58})|[A-Za-z0-9]{20}T3BlbkFJ[A-Za-z0-9]{20})(?![A-Za-z0-9_-])",
    "anthropic_api_key": r"\bsk-ant-(?:api|admin)\d\d-[A-Za-z0-9_-]{93}AA(?![A-Za-z0-9_-])",
    "aws_access_key_id": r"\b(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[A-Z2-7]{16}\b",
    "aws_secret_access_key": r"(?i:aws_?secret_?(?:access_?)?key)[\"']?\s{0,3}[:=]\s{0,3}[\"']?"
    r"(?P<secret>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])",
    "github_token": r"\b(?:gh[pousr]_[A-Za-z0-9]{36}|github_pat_[A-Za-z0-9_]{82})(?![A-Za-z0-9_])",
    "google_api_key": r"\bAIza[A-Za-z0-9_-]{35}(?![A-Za-z0-9_-])",
    "slack_token": r"\bxox[bpas]-[0-9]{8,13}-[A-Za-z0-9-]{8,90}(?![A-Za-z0-9-])",
    "stripe_secret_key": r"\b[rs]k_live_[A-Za-z0-9]{24,99}(?![A-Za-z0-9])",
    # The header is enough: once it is seen the stream is stopped before the key body.
    "private_key": r"-----BEGIN (?:[A-Z0-9]{1,12} ){0,2}PRIVATE KEY(?: BLOCK)?-----",
    # A JWT is recognised by its header and the start of its payload (both base64 JSON
    # objects, "eyJ" = '{"'); matching no further keeps the pattern, and so the window,
    # bounded whatever the payload's length.
    "jwt": r"\beyJ[A-Za-z0-9_-]{8,150}\.eyJ[A-Za-z0-9_-]{8}",
}
SECRET_TYPES = tuple(SECRET_PATTERNS)


def _secret_span(m: re.Match[str]) -> tuple[int, int]:
    if "secret" in m.re.groupindex and m.start("secret") >= 0:
        return m.span("secret")
    return m.span()


def secrets_matcher(types: tuple[str, ...] = SECRET_TYPES) -> Matcher:
    """One alternation of the chosen secret patterns, so a stream is scanned once."""
    pattern = "|".join(f"(?P<{name}>{SECRET_PATTERNS[name]})" for name in types)
    return _matcher(pattern, lookahead=1, refine=_secret_span)


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


def _card_span(m: re.Match[str]) -> tuple[int, int] | None:
    digits = re.sub(r"[ -]", "", m.group())
    return m.span() if card_ok(digits) else None


# 13 to 19 digits, single spaces or dashes allowed between them. The whole run must be
# the number: a digit run on by one separator makes it part of a longer number.
CARD = _matcher(
    r"(?<![0-9])(?<![0-9][ -])[0-9](?:[ -]?[0-9]){12,18}(?![ -]?[0-9])", lookahead=2, label="card", refine=_card_span
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


def _iban_span(m: re.Match[str]) -> tuple[int, int] | None:
    """The IBAN at the start of a candidate: as many characters as its country uses.

    The candidate may run on into the next group of capitals or digits ("… 00 EUR"),
    so the country's length, not the candidate's, ends the IBAN.
    """
    text, n = m.group(), IBAN_LENGTHS.get(m.group()[:2])
    if n is None:
        return None
    seen = 0
    for end, ch in enumerate(text, 1):  # noqa: B007 - `end` is read after the loop
        seen += ch != " "
        if seen == n:
            break
    else:
        return None
    following = m.string[m.start() + end : m.start() + end + 1]
    if following.isalnum() or not iban_ok(text[:end].replace(" ", "")):
        return None
    return m.start(), m.start() + end


# Country, check digits, groups of four (spaces optional), a last short group.
IBAN = _matcher(
    r"(?<![A-Za-z0-9])[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?",
    lookahead=2,
    label="iban",
    refine=_iban_span,
)


# -- e-mail ------------------------------------------------------------------------------

# A 64-character local part, up to four domain labels and a top-level domain. The
# lookaheads refuse a match that the next characters would extend ("a@b.co" in
# "a@b.com", "a@b.com" in "a@b.com.au"), so a match is final two characters after it.
EMAIL = _matcher(
    r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]{1,64}@"
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.){1,4}[A-Za-z]{2,24}"
    r"(?![A-Za-z0-9-])(?!\.[A-Za-z0-9-])",
    lookahead=2,
    label="email",
)

PII: dict[str, Matcher] = {"email": EMAIL, "card": CARD, "iban": IBAN}
PII_TYPES = tuple(PII)
