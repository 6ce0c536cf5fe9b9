"""The rules file: the built-in filters, configured in TOML.

One ``[[rule]]`` table per rule::

    [[rule]]
    id = "internal-hosts"        # required, unique: recorded with every verdict
    kind = "regex"               # regex | keywords | secrets | pii
    pattern = '\\b[a-z0-9-]+\\.corp\\.example\\.com\\b'   # RE2 syntax
    case_sensitive = false       # regex: default true; keywords: default false
    scope = "both"               # request | response | both (the default)
    action = "block"             # block | flag: required
    window = 80                  # optional: characters held back, see below
    reason = "internal host name"  # optional: recorded with the verdict
    normalize = true             # default: match on the normalised text (see below)
    confusables = false          # opt-in: also read lookalike letters of other scripts as Latin

    [[rule]]
    id = "code-names"
    kind = "keywords"
    keywords = ["Bluebird", "Project Nightjar"]   # whole words; longest first
    action = "flag"

    [[rule]]
    id = "credentials"
    kind = "secrets"             # types = [...] picks from detectors.SECRET_TYPES (default all)
    action = "block"

    [[rule]]
    id = "personal-data"
    kind = "pii"
    types = ["email", "card", "iban"]   # the default
    action = "flag"

    [[rule]]
    id = "daily-tokens"
    kind = "budget"              # a limit on use, not on text: addon.filters.budgets
    period = "day"               # day | month: calendar periods in UTC
    per = "user"                 # user | key | model | all (the default)
    limit_tokens = 200000        # or limit_usd = 50.0 (from cost_usd)
    tokens = "total"             # total (input + output, the default) | input | output
    models = ["gpt-4o*"]         # optional scope: providers, models, users (glob patterns)
    action = "block"

``pattern`` is RE2 syntax (linear-time matching, see :mod:`addon.filters.prefix` and
docs/filters.md); a pattern RE2 cannot run (lookarounds, backreferences) is refused.

``window`` is the most characters of a response stream a blocking rule holds back so
that a match is caught before any of it reaches the client; it holds back only what
could still become a match (:mod:`addon.filters.window`). It defaults to the longest
match the rule can make (plus the characters after it that decide it): computed from
the pattern for a bounded ``regex`` (256 when it is unbounded, e.g. ``\\w+``: give
``window`` for longer matches), the longest keyword, 167 for ``secrets``, 38 for a card
number, 44 for an IBAN and 346 for an e-mail address. ``0`` means release-first:
nothing is held back and a match is reported (and still stops the stream) when seen.
A smaller window than the default lets the start of a longer match through. ``flag``
rules never hold text back.

Every rule matches on a normalised view of the text (:mod:`addon.filters.normalize`):
default-ignorable characters (zero-width joiners, soft hyphens, ...) removed and NFKC
applied (fullwidth letters, ligatures, ...), so ``Night\u200djar`` and ``Ｎightjar`` match
the keyword ``Nightjar``; keywords are normalised the same way. ``normalize = false``
matches the raw text. ``confusables = true`` also reads Cyrillic, Greek and Armenian
lookalikes of Latin letters (``і``, ``о``, ``ο``) as those letters; it is opt-in because
it rewrites honest Cyrillic and Greek text too. Positions in verdicts are in the
original text.

TOML and not YAML: ``tomllib`` is in the standard library, TOML has no implicit typing
(YAML reads ``no`` as false), literal strings ``'...'`` hold regular expressions
without doubled backslashes, and its syntax errors carry the line. Any error in the file
refuses the whole file with :class:`RulesError`: ``path:line: reason``.
"""

from __future__ import annotations

import functools
import itertools
import logging
import re
import tomllib
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn

import re2  # type: ignore[import-untyped]

from addon.filters.api import Verdict, match_hash
from addon.filters.budgets import METERS, PER, PERIODS, Budget, Period
from addon.filters.detectors import (
    NOT_WORD,
    PII,
    PII_TYPES,
    SECRET_TYPES,
    Hit,
    Matcher,
    re2_options,
    secrets_matcher,
)
from addon.filters.normalize import DEFAULT_VIEW, Folded, fold
from addon.filters.prefix import MAX_PREFIX_CHARS, MAX_SPAN, NoPrefix, pattern_width, prefix_pattern

log = logging.getLogger(__name__)

KINDS = ("regex", "keywords", "secrets", "pii", "budget")
SCOPES = ("request", "response", "both")
ACTIONS = ("block", "flag")
DEFAULT_REGEX_SPAN = 256  # the longest match an unbounded pattern is assumed to make
_TOKEN_METERS = tuple(m for m in METERS if m != "usd")  # tokens = "total" (input + output), "input", "output"
FILTER_NAME = "rules"  # the ``filter`` of every verdict a rule gives

_COMMON_KEYS = {"id", "kind", "scope", "action", "window", "reason", "normalize", "confusables"}
_KIND_KEYS = {
    "regex": {"pattern", "case_sensitive"},
    "keywords": {"keywords", "case_sensitive"},
    "secrets": {"types"},
    "pii": {"types"},
}
# A budget (addon.filters.budgets) matches no text: of the common keys it takes only these.
_BUDGET_KEYS = {"id", "kind", "action", "reason", "period", "per", "limit_usd", "limit_tokens", "tokens"} | {
    "providers",
    "models",
    "users",
}
_DEFAULT_REASONS = {
    "regex": "matches the rule's pattern",
    "keywords": "contains a listed keyword",
    "secrets": "a credential",
    "pii": "personal data",
}


class RulesError(Exception):
    """The rules file was refused: where (``path:line``) and why."""

    def __init__(self, path: str, line: int | None, reason: str) -> None:
        self.path, self.line, self.reason = path, line, reason
        super().__init__(f"{path}:{line}: {reason}" if line else f"{path}: {reason}")


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule of the file, compiled: its matchers and what a match means."""

    id: str
    kind: str
    action: Literal["block", "flag"]
    scope: str
    matchers: tuple[Matcher, ...]
    window: int | None = None  # None: each matcher's own hold
    reason: str = ""
    view: str = DEFAULT_VIEW  # how the text is read: addon.filters.normalize.VIEWS

    @property
    def on_request(self) -> bool:
        return self.scope != "response"

    @property
    def on_response(self) -> bool:
        return self.scope != "request"

    def hold(self, matcher: Matcher) -> int:
        """Characters of a stream this rule holds back for ``matcher`` (0 for flag rules)."""
        if self.action != "block":
            return 0
        return matcher.hold if self.window is None else self.window

    def find(self, text: str) -> Iterator[Hit]:
        """Every hit in a complete text (a request message), matched on the rule's view;
        ``start`` and ``end`` are offsets in ``text``, ``text`` the view's match."""
        return self.find_folded(fold(text, self.view), self.matchers)

    def find_folded(self, folded: Folded, matchers: Iterable[Matcher]) -> Iterator[Hit]:
        """:meth:`find` on a text already seen through the rule's view, with only
        ``matchers`` of the rule's (those that may match it; in the rule's order)."""
        view, where = folded
        for matcher in matchers:
            for hit in matcher.find(view):
                if where is None:
                    yield hit
                else:
                    yield Hit(where[hit.start], where[hit.end - 1] + 1, hit.label, hit.text)

    def verdict(self, hit: Hit, position: int, location: str = "") -> Verdict:
        """The verdict for a hit at ``position`` of the original text (the hash is of the
        normalised match, composed, so evasions of one word and its spellings share its
        hash)."""
        reason = self.reason or _DEFAULT_REASONS[self.kind]
        if hit.label:
            reason = f"{reason} ({hit.label})"
        matched = hit.text if self.view == "raw" else unicodedata.normalize("NFC", hit.text)
        return Verdict(self.action, self.id, reason, position, match_hash(matched), FILTER_NAME, location)


def load_rules(path: str | Path) -> list[Rule | Budget]:
    """Read and compile a rules file; :class:`RulesError` says where and why it is wrong."""
    name = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise RulesError(name, None, f"cannot read the rules file: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RulesError(name, raw[: e.start].count(b"\n") + 1, "the file is not UTF-8 text") from None
    return parse_rules(text, name)


def parse_rules(text: str, path: str = "<rules>") -> list[Rule | Budget]:
    """Compile the rules of a TOML text (``path`` only names it in errors): content
    rules and budgets, in the file's order."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise _syntax_error(e, path) from None
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise RulesError(path, None, "nested too deeply to be a rules file (rules are flat [[rule]] tables)") from None
    lines = _Lines(text)
    for key in data:
        if key != "rule":
            raise RulesError(path, lines.top_level(key), f"unknown top-level key {key!r} (rules are [[rule]] tables)")
    tables = data.get("rule", [])
    if not isinstance(tables, list):
        raise RulesError(path, lines.top_level("rule"), "'rule' must be an array of [[rule]] tables")
    rules: list[Rule | Budget] = []
    seen: set[str] = set()
    for index, table in enumerate(tables):
        entry = _Entry(table, index, lines, path)
        rule = entry.compile()
        if rule.id in seen:
            entry.fail("id", f"duplicate id {rule.id!r}")
        seen.add(rule.id)
        rules.append(rule)
    return rules


def _syntax_error(e: tomllib.TOMLDecodeError, path: str) -> RulesError:
    """tomllib puts the position at the end of its message: move it to the front."""
    message = str(e)
    m = re.search(r" \(at line (\d+), column (\d+)\)$", message)
    if m is None:
        return RulesError(path, None, f"TOML syntax error: {message}")
    return RulesError(path, int(m[1]), f"TOML syntax error: {message[: m.start()]} (column {m[2]})")


class _Lines:
    """Finds the line of a rule's key in the file text, since tomllib gives no positions.

    Rules written as ``[[rule]]`` tables are found by their headers; a rule written
    another way (an inline array) is reported without a line.
    """

    _HEADER = re.compile(r"\s*\[\[\s*rule\s*\]\]")

    def __init__(self, text: str) -> None:
        self.lines = text.split("\n")  # TOML's line ends, as tomllib counts them
        self.headers = [n for n, line in enumerate(self.lines) if self._HEADER.match(line)]

    def of(self, index: int, key: str | None) -> int | None:
        """The line of ``key`` in the ``index``-th rule (its header line if not found)."""
        if index >= len(self.headers):
            return None
        start = self.headers[index]
        end = self.headers[index + 1] if index + 1 < len(self.headers) else len(self.lines)
        return self._find(key, start, end) or start + 1

    def top_level(self, key: str) -> int | None:
        return self._find(key, 0, len(self.lines))

    def _find(self, key: str | None, start: int, end: int) -> int | None:
        if key is None:
            return None
        k = re.escape(key)
        pattern = re.compile(rf"""\s*(?:{k}|"{k}"|'{k}')\s*=|\s*\[+\s*{k}\s*\]""")
        return next((n + 1 for n in range(start, end) if pattern.match(self.lines[n])), None)


_MISSING = object()


class _Entry:
    """One ``[[rule]]`` table being checked and compiled; every error names its line."""

    def __init__(self, table: Any, index: int, lines: _Lines, path: str) -> None:
        self.table, self.index, self.lines, self.path = table, index, lines, path

    def fail(self, key: str | None, reason: str) -> NoReturn:
        raise RulesError(self.path, self.lines.of(self.index, key), f"{self.name()}: {reason}")

    def name(self) -> str:
        """How messages name the rule: its id, else its place in the file."""
        rule_id = self.table.get("id") if isinstance(self.table, dict) else None
        return f"rule {rule_id!r}" if isinstance(rule_id, str) else f"rule #{self.index + 1}"

    def get(self, key: str, kind: type, default: Any = _MISSING) -> Any:
        value = self.table.get(key, _MISSING)
        if value is _MISSING:
            if default is _MISSING:
                self.fail(None, f"missing {key!r}")
            return default
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            self.fail(key, f"{key!r} must be {_TYPE_NAMES[kind]}, not {value!r}")
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: Any = _MISSING) -> str:
        value = self.get(key, str, default)
        if value not in choices:
            self.fail(key, f"{key!r} must be one of {', '.join(choices)}, not {value!r}")
        return value

    def strings(self, key: str, allowed: tuple[str, ...] | None = None) -> tuple[str, ...]:
        values = self.get(key, list, None)
        if values is None:
            return allowed or ()
        if not values or not all(isinstance(v, str) and v.strip() for v in values):
            self.fail(key, f"{key!r} must be a non-empty list of non-empty strings")
        unknown = [v for v in values if allowed is not None and v not in allowed]
        if unknown:
            self.fail(key, f"unknown {key} {', '.join(map(repr, unknown))} (known: {', '.join(allowed or ())})")
        return tuple(dict.fromkeys(values))

    def compile(self) -> Rule | Budget:
        if not isinstance(self.table, dict):
            self.fail(None, "must be a table")
        rule_id = self.get("id", str)
        if not rule_id.strip():
            self.fail("id", "'id' must not be empty")
        kind = self.choice("kind", KINDS)
        allowed = _BUDGET_KEYS if kind == "budget" else _COMMON_KEYS | _KIND_KEYS[kind]
        for key in self.table:
            if key not in allowed:
                self.fail(key, f"unknown key {key!r} (a {kind} rule takes: {', '.join(sorted(allowed))})")
        if kind == "budget":
            return self._budget(rule_id)
        action: Literal["block", "flag"] = "block" if self.choice("action", ACTIONS) == "block" else "flag"
        scope = self.choice("scope", SCOPES, "both")
        window = self.get("window", int, None)
        if window is not None and not 0 <= window <= MAX_SPAN:
            self.fail("window", f"'window' must be between 0 and {MAX_SPAN}, not {window}")
        reason = self.get("reason", str, "")
        view = self._view()
        match kind:
            case "regex":
                matchers = self._regex(window)
            case "keywords":
                matchers = self._keywords(view)
            case "secrets":
                matchers = (secrets_matcher(self.strings("types", SECRET_TYPES)),)
            case _:
                matchers = tuple(PII[t] for t in self.strings("types", PII_TYPES))
        return Rule(rule_id, kind, action, scope, matchers, window, reason, view)

    def _budget(self, rule_id: str) -> Budget:
        """A budget rule (:mod:`addon.filters.budgets`): a limit, a period, whose total."""
        action: Literal["block", "flag"] = "block" if self.choice("action", ACTIONS) == "block" else "flag"
        period: Period = "day" if self.choice("period", PERIODS) == "day" else "month"
        per = self.choice("per", PER, "all")
        usd, tokens = self.table.get("limit_usd"), self.table.get("limit_tokens")
        if usd is None and tokens is None:
            self.fail(None, "missing a limit: give limit_usd = 50.0 (US dollars) or limit_tokens = 1000000")
        if usd is not None and tokens is not None:
            self.fail("limit_tokens", "give limit_usd or limit_tokens, not both (one budget counts one thing)")
        if usd is not None:
            if "tokens" in self.table:
                self.fail("tokens", "'tokens' says which tokens limit_tokens counts: drop it from a limit_usd budget")
            meter, limit = "usd", usd
            if not isinstance(limit, int | float) or isinstance(limit, bool) or not 0 < limit < float("inf"):
                self.fail("limit_usd", f"'limit_usd' must be a number of US dollars above 0, not {limit!r}")
        else:
            meter, limit = self.choice("tokens", _TOKEN_METERS, "total"), tokens
            if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
                self.fail("limit_tokens", f"'limit_tokens' must be a whole number of tokens above 0, not {limit!r}")
        return Budget(
            rule_id,
            action,
            period,
            per,
            meter,
            float(limit),
            providers=self.strings("providers"),
            models=self.strings("models"),
            users=self.strings("users"),
            reason=self.get("reason", str, ""),
        )

    def _view(self) -> str:
        normalize = self.get("normalize", bool, True)
        confusables = self.get("confusables", bool, False)
        if confusables and not normalize:
            self.fail("confusables", "'confusables' needs the normalised text: drop 'normalize = false'")
        return "confusables" if confusables else "nfkc" if normalize else "raw"

    def _regex(self, window: int | None) -> tuple[Matcher, ...]:
        pattern = self.get("pattern", str)
        case_sensitive = self.get("case_sensitive", bool, True)
        if _ANY_BYTE.search(pattern):
            self.fail("pattern", "\\C (any byte) is not supported: a match must start and end on a character")
        try:
            regex = re2.compile(pattern, re2_options(case_sensitive))
        except re2.error as e:
            reason = _re2_reason(e)
            if _python_reads(pattern):  # valid, but needs backtracking: lookarounds, backreferences...
                self.fail("pattern", f"pattern not supported by RE2 (linear-time matching): {reason}")
            self.fail("pattern", f"bad regular expression: {reason}")
        prefix: str | None
        try:
            prefix, low, high = prefix_pattern(pattern, not case_sensitive, 0)  # (lookahead 1, less the last)
            re2.compile(prefix, re2_options())  # (it must compile: else hold the window)
        except (NoPrefix, re2.error):
            prefix, width = None, pattern_width(pattern, not case_sensitive)
            low, high = width or (0 if _matches_empty(regex) else 1, None)
        if low == 0:
            self.fail("pattern", "the pattern can match empty text")
        # A pattern's own bound wins; an unbounded one is scanned as far as the window.
        span = high or window or DEFAULT_REGEX_SPAN
        return (Matcher(regex, span, prefix=prefix, prefix_len=high),)

    def _keyword_search(
        self, given: tuple[str, ...], view: str, case_sensitive: bool
    ) -> tuple[list[Spelled], str, Any]:
        """The keywords as the view shows them (every spelling of their letters), their
        alternation and its compiled search. When RE2 cannot take that (a long list,
        "pattern too large"), their whole spellings (as written, NFC and NFD: fewer
        alternatives, and words sharing their starts), with a warning naming the rule.

        One alternation, longest first, with word edges that also work for words that
        start or end with punctuation ("C++"): no letter, digit or _ on either side."""
        # A keyword is read the way the text is: "Ｎightjar" in the file is "Nightjar".
        spelled = _spelled_keywords(given, view)
        if any(not "".join(unit[0] for unit in units).strip() for units in spelled):
            self.fail("keywords", "a keyword is only invisible characters")
        pattern = _alternation(spelled, case_sensitive)
        if len(pattern) <= MAX_KEYWORD_PATTERN:  # (larger, RE2 would refuse it after flooding stderr)
            try:
                return spelled, pattern, _keyword_regex(pattern, case_sensitive)
            except re2.error:
                pass
        whole = _spelled_keywords(given, view, every_spelling=False)
        whole_pattern = _alternation(whole, case_sensitive)
        if len(whole_pattern) >= len(pattern):  # (no letter with other spellings: nothing to give up)
            whole, whole_pattern = spelled, pattern
        try:
            regex = _keyword_regex(whole_pattern, case_sensitive)
        except re2.error as e:  # (too many keywords for RE2's memory budget): one line, not a traceback
            self.fail("keywords", f"too many or too long keywords for RE2: {_re2_reason(e)}")
        if whole is not spelled:
            log.warning(
                "%s: too many keywords to match every spelling of their letters; each is matched "
                "as written, composed (NFC) and decomposed (NFD)",
                self.name(),
            )
        return whole, whole_pattern, regex

    def _keywords(self, view: str) -> tuple[Matcher, ...]:
        given = self.strings("keywords")
        if not given:
            self.fail(None, "missing 'keywords'")
        case_sensitive = self.get("case_sensitive", bool, False)
        spelled, words_pattern, regex = self._keyword_search(given, view, case_sensitive)
        prefix: str | None
        try:
            prefix = _keyword_prefixes(spelled, case_sensitive)
            re2.compile(prefix, re2_options())
        except (NoPrefix, re2.error):  # a long list ("too large"): hold the rule's whole window, as before
            prefix = None
        span = _longest(spelled[0])
        # The words alone find every match: the word edges are Unicode classes, a large
        # automaton, left to the rule's own search.
        gate = words_pattern if case_sensitive else f"(?i:{words_pattern})"
        return (Matcher(regex, span, groups=("_keyword",), behind=1, prefix=prefix, prefix_len=span, gate=gate),)


# RE2's ``\C`` matches one byte of the UTF-8 text, so a match may start or end inside a
# character: its byte offsets have no character offset, and the first non-ASCII text a
# stream checks would raise (UnicodeDecodeError) instead of being filtered. An even run
# of backslashes before it is escaped backslashes; ``\C`` inside a class RE2 refuses.
_ANY_BYTE = re.compile(r"(?<!\\)(?:\\\\)*\\C")


def _re2_reason(e: Exception) -> str:
    return e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else str(e)


# Python's ``re`` (the engine before RE2) matched ASCII ``i`` case-insensitively with
# U+0130 (İ) and U+0131 (ı) too, RE2 does not (their case folds are Turkic-only): without
# this "NİGHTJAR" or "nıghtjar" would get past a "nightjar" keyword. ``i`` is the only
# ASCII letter on which the two engines differ.
_DOTTED_I = "[iI\u0130\u0131]"


def _keyword_prefixes(spelled: list[Spelled], case_sensitive: bool) -> str:
    """The texts a keyword match may still grow from: a word edge (the text's start or a
    character that is no letter, digit or ``_``), then the start of a keyword, at least
    its first character (or the start of its spelling: the ``e`` of an ``é`` that a
    U+0301 may still follow). The edge is part of the pattern, so a word that merely
    ends in a keyword's first letters ("Morni" for "nightjar") holds nothing back; the
    hold starts one character early, at the edge (the window searches ``behind``
    characters before where a match may start).
    :class:`~addon.filters.prefix.NoPrefix` when too large.
    """
    alternatives, size = [], 0
    for units in spelled:
        rest = ""
        for unit in reversed(units[1:]):
            rest = f"(?:{_unit_then(unit, rest, case_sensitive)})?"
        alternatives.append(f"(?:{_unit_then(units[0], rest, case_sensitive)})")
        size += len(alternatives[-1]) + 1
        if size > MAX_PREFIX_CHARS:  # (known before the whole of a long list is written out)
            raise NoPrefix("too large")
    pattern = rf"(?:^|{NOT_WORD})(?:{'|'.join(alternatives)})"
    if len(pattern) > MAX_PREFIX_CHARS:
        raise NoPrefix("too large")
    return pattern if case_sensitive else f"(?i:{pattern})"


# A keyword as the view may show it: for each of its letters (a character and the
# combining marks after it), every spelling of that letter the view can hold ("é", and
# "e" + U+0301), longest first.
Spelled = tuple[tuple[str, ...], ...]

# The longest keyword alternation tried with every spelling of every letter. RE2 refuses
# a pattern from about 2.2 to 3.5 million characters, by its kind ("pattern too large",
# after flooding stderr: measured here, 30,000 Vietnamese words of 8 letters, 2.2 million,
# fail; 150,000 ASCII words, 1.8 million, compile); every spelling of every letter makes
# a list of Vietnamese, most letters with a mark or two, about four times as long as the
# list. Beyond it, or when RE2 refuses the pattern, a list is matched in its whole
# spellings, as written, NFC and NFD (as before every spelling was).
MAX_KEYWORD_PATTERN = 1_500_000

# Combining marks on one letter whose orders are all tried (4! = 24 orders); a letter
# with more is matched with its marks in their canonical order, and as written.
MAX_MARK_ORDERS = 4


def _spelled_keywords(words: Iterable[str], view: str, every_spelling: bool = True) -> list[Spelled]:
    """The keywords as the view shows them, each letter with all its spellings, longest
    keyword first (one alternation: the longest of overlapping keywords wins).

    The view maps one character at a time (:mod:`addon.filters.normalize`), so it does
    not compose ``e`` and a combining U+0301 that follows it, nor put marks in their
    canonical order: ``Café`` written decomposed, ``한국`` in conjoining jamo, a word with
    some letters composed and others not, or a letter's marks in another order (Arabic
    shadda and fatha, Hebrew dagesh and qamats) looks the same and is another string. So
    each letter of a keyword matches every spelling canonically equivalent to it, and the
    keyword as written (its marks in an order kept whole, past MAX_MARK_ORDERS). The raw
    view matches the keyword as written. Without ``every_spelling`` (a list too large for
    that), each keyword is matched as written and in its whole NFC and NFD spellings."""
    spelled: dict[str, Spelled] = {}
    for word in words:
        if view == "raw":
            spelled.setdefault(word, tuple((ch,) for ch in word))
            continue
        written = fold(word, view)[0]
        if every_spelling:
            seen = fold(unicodedata.normalize("NFC", written), view)[0]
            spelled.setdefault(seen, tuple(_equivalents(letter, view) for letter in _letters(seen)))
            spellings: tuple[str, ...] = (written,)
        else:
            spellings = (written, *(fold(unicodedata.normalize(form, word), view)[0] for form in ("NFC", "NFD")))
        for spelling in spellings:
            spelled.setdefault(spelling, tuple((ch,) for ch in spelling))
    return sorted(spelled.values(), key=_longest, reverse=True)


def _letters(text: str) -> list[str]:
    """``text`` cut before each character that is no combining mark (canonical class 0):
    each piece a letter and the marks on it."""
    letters: list[str] = []
    for ch in text:
        if letters and unicodedata.combining(ch):
            letters[-1] += ch
        else:
            letters.append(ch)
    return letters


@functools.lru_cache(maxsize=4096)  # (a list of thousands of words spells the same letters)
def _equivalents(letter: str, view: str) -> tuple[str, ...]:
    """``letter`` (a character and the combining marks on it) and every spelling
    canonically equivalent to it, as the view shows them, longest first: composed,
    decomposed or in part, its marks in any order that keeps the order of marks of one
    class (``ệ``: ``ẹ`` + U+0302, ``ê`` + U+0323, ``e`` and both marks in either order;
    ``ẹ́``: ``é`` + U+0323 too; ``한``: ``하`` + ``ᆫ``)."""
    nfd = unicodedata.normalize("NFD", letter)
    if nfd == letter and len(letter) == 1:
        return (letter,)
    base, marks = nfd[0], nfd[1:]
    orders = itertools.permutations(marks) if len(marks) <= MAX_MARK_ORDERS else iter([tuple(marks)])
    found = {fold(letter, view)[0]: None}
    for order in orders:
        for cut in range(len(order) + 1):
            head = unicodedata.normalize("NFC", base + "".join(order[:cut]))
            spelling = head + "".join(order[cut:])
            if len(head) == 1 and unicodedata.normalize("NFD", spelling) == nfd:
                found[fold(spelling, view)[0]] = None
    return tuple(sorted(found, key=len, reverse=True))


def _longest(units: Spelled) -> int:
    """The most characters a match of this keyword can take."""
    return sum(len(unit[0]) for unit in units)


def _alternation(spelled: list[Spelled], case_sensitive: bool) -> str:
    """All keywords in all their spellings, one RE2 alternation."""
    return "|".join("".join(_unit_pattern(unit, case_sensitive) for unit in units) for units in spelled)


def _keyword_regex(alternation: str, case_sensitive: bool) -> Any:
    """The keyword search: the alternation between word edges (:data:`NOT_WORD`)."""
    return re2.compile(rf"(?:^|{NOT_WORD})(?P<_keyword>{alternation})(?:$|{NOT_WORD})", re2_options(case_sensitive))


@functools.lru_cache(maxsize=4096)  # (a long list spells the same letters again and again)
def _unit_pattern(unit: tuple[str, ...], case_sensitive: bool) -> str:
    """One character of a keyword in any of its spellings, as RE2 syntax."""
    if len(unit) == 1:
        return _keyword_pattern(unit[0], case_sensitive)
    return "(?:" + "|".join(_keyword_pattern(spelling, case_sensitive) for spelling in unit) + ")"


def _unit_then(unit: tuple[str, ...], then: str, case_sensitive: bool) -> str:
    """One character of a keyword followed by ``then``, or the start of a spelling of it
    that the text may end with (RE2 syntax, to be grouped)."""
    return _unit_pattern(unit, case_sensitive) + then + _partial_pattern(unit, case_sensitive)


@functools.lru_cache(maxsize=4096)  # (a long list spells the same letters again and again)
def _partial_pattern(unit: tuple[str, ...], case_sensitive: bool) -> str:
    """``|`` and each start of a character's spellings that is no spelling of it (the
    ``e`` of ``e`` + U+0301: the text may end there, the mark still to come); empty
    when there is none."""
    starts = dict.fromkeys(s[:end] for s in unit for end in range(1, len(s)))
    return "".join("|" + _keyword_pattern(start, case_sensitive) for start in starts if start not in unit)


def _keyword_pattern(word: str, case_sensitive: bool) -> str:
    """A keyword as RE2 syntax: escaped, with the i's Python's ``re`` also matched."""
    escaped = re.escape(word)
    return escaped if case_sensitive else re.sub(_DOTTED_I, lambda _: _DOTTED_I, escaped)


def _python_reads(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError):
        return False
    return True


def _matches_empty(regex: Any) -> bool:
    """Whether a pattern Python cannot analyse matches empty text somewhere in a probe."""
    for probe in ("", " a\n0_-.\u00e9 ", "a", "0"):
        for m in regex.finditer(probe):
            if m.start() == m.end():
                return True
    return False


_TYPE_NAMES = {str: "a string", int: "an integer", bool: "true or false", list: "a list"}
