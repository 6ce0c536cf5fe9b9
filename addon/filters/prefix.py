"""What text could still become a match: prefix patterns for the hold-back.

A stream is released up to the earliest position where a match of a blocking rule may
still be in progress (see :mod:`addon.filters.window`). For a pattern ``r`` and the
``lookahead`` characters after a match that may still decide it, that is the earliest
``i`` such that ``text[i:]`` is a prefix of a string of ``L(r)`` followed by
``lookahead`` more characters. :func:`prefix_pattern` writes that set as an RE2 pattern,
derived from the pattern's parse tree (Python's ``re._parser``, the same parser
:func:`addon.filters.detectors.regex_width` uses):

- ``prefix(a b) = prefix(a) | a prefix(b)``, ``prefix(a | b) = prefix(a) | prefix(b)``,
- ``prefix(x{m,n}) = x{0,n-1} prefix(x)`` (fewer copies are a prefix of more),
- a literal or a class ``c``: ``c?``,
- anchors, word boundaries and lookarounds are dropped: the set only grows, so more is
  held, never less.

Searched as ``(?:...)\\z`` over the tail of the text, RE2's leftmost match start is the
release point. Python's parser reads the pattern, RE2 matches it: the two agree on the
syntax both accept, except a few RE2-only forms that Python reads differently
(``x{,3}`` is a repetition for Python and literal text for RE2; ``[[:alpha:]]`` is a
POSIX class for RE2 and a set with a stray ``]`` for Python). Those, and any pattern
Python cannot read (``\\pL``), get no prefix pattern (:class:`NoPrefix`): the caller
holds back the rule's whole window, as before. Classes are written back with the same
escapes (``\\d``, ``\\w``, ``\\s``), so they mean what RE2 makes of them in the rule.
"""

from __future__ import annotations

import re
import warnings
from re import _constants as c  # type: ignore[attr-defined]  # private, as for regex_width
from re import _parser as re_parser  # type: ignore[attr-defined]
from typing import Any

_CATEGORIES = {
    c.CATEGORY_DIGIT: r"\d",
    c.CATEGORY_NOT_DIGIT: r"\D",
    c.CATEGORY_SPACE: r"\s",
    c.CATEGORY_NOT_SPACE: r"\S",
    c.CATEGORY_WORD: r"\w",
    c.CATEGORY_NOT_WORD: r"\W",
}
_ZERO_WIDTH = (c.AT, c.ASSERT, c.ASSERT_NOT)
# RE2-only syntax that Python reads as something else (see the module docstring).
_DIVERGENT = re.compile(r"(?<!\\)\{,|\[:\^?[a-z]+:\]")
MAX_SPAN = 65536  # a pattern wider than this is treated as unbounded (``a+`` reports ~2**64)
MAX_PREFIX_CHARS = 200_000  # a prefix pattern larger than this is not worth compiling


class NoPrefix(Exception):
    """No prefix pattern can be derived: hold back the whole window instead."""


def prefix_pattern(pattern: str, ignore_case: bool, lookahead: int) -> tuple[str, int, int | None]:
    """The RE2 pattern of every text that may still grow into a match of ``pattern``
    (plus ``lookahead`` characters), and the shortest and longest match of ``pattern``
    (longest ``None``: unbounded).

    :class:`NoPrefix` when the pattern cannot be analysed.
    """
    if _DIVERGENT.search(pattern):
        raise NoPrefix("syntax Python and RE2 read differently")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "possible nested set": a POSIX class for RE2
            tree = re_parser.parse(pattern, re.IGNORECASE if ignore_case else 0)
    except (re.error, FutureWarning, RecursionError, OverflowError) as e:
        raise NoPrefix(str(e)) from None
    writer = _Writer()
    try:
        full, pre = writer.seq(list(tree.data))
    except RecursionError:
        raise NoPrefix("too deeply nested") from None
    tail = r"(?s:.)"
    out = f"(?:{pre}|{full}{tail}{{1,{lookahead}}})" if lookahead else pre
    if tree.state.flags & re.IGNORECASE:
        out = f"(?i:{out})"
    if tree.state.flags & re.DOTALL:
        out = f"(?s:{out})"
    if len(out) > MAX_PREFIX_CHARS:
        raise NoPrefix("too large")
    low, high = tree.getwidth()
    return out, low, (None if high > MAX_SPAN else high)


# For the width only, RE2-only syntax as Python's parser can read it with the same width:
# a POSIX or Unicode class is one character, ``x{,n}`` literal text, ``\\z`` nothing.
_FOR_WIDTH = re.compile(r"\\\\|(\[:\^?[a-z]+:\]|\\[pP](?:\{[^}]*\}|[A-Za-z]))|(\{,)|(\\z)")


def _for_width(m: re.Match[str]) -> str:
    return "a" if m[1] else "\\{," if m[2] else "" if m[3] else m[0]


def pattern_width(pattern: str, ignore_case: bool) -> tuple[int, int | None] | None:
    """The shortest and longest match of a pattern without a prefix pattern (longest
    ``None``: unbounded), so its hold covers its longest match; ``None`` when unknown.

    Without it such a pattern counted as unbounded and held the default 256 characters:
    a bounded but longer match (``[[:alpha:]]{300}``, a 20,000-character literal whose
    prefix pattern is "too large") leaked its start before the block.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = re_parser.parse(_FOR_WIDTH.sub(_for_width, pattern), re.IGNORECASE if ignore_case else 0)
    except (re.error, RecursionError, OverflowError):
        return None
    low, high = tree.getwidth()
    return low, (None if high > MAX_SPAN else high)


def _char(code: int) -> str:
    ch = chr(code)
    return ch if ch.isascii() and ch.isalnum() else f"\\x{{{code:x}}}"


class _Writer:
    """Writes a parse tree back as RE2 syntax: each node's full pattern and its prefixes."""

    def seq(self, items: list[tuple[Any, Any]]) -> tuple[str, str]:
        """(full, prefix) of a sequence: prefix(a rest) = prefix(a) | a prefix(rest)."""
        items = [item for item in items if item[0] not in _ZERO_WIDTH]
        if not items:
            return "", ""
        fulls: list[str] = []
        prefixes: list[str] = []
        for op, av in items:
            full, pre = self.node(op, av)
            fulls.append(full)
            prefixes.append(pre)
        # Built from the end: P(i) = (?:pre_i|full_i P(i+1)).
        pre = prefixes[-1]
        for i in range(len(items) - 2, -1, -1):
            pre = f"(?:{prefixes[i]}|{fulls[i]}{pre})"
        return "".join(fulls), pre

    def node(self, op: Any, av: Any) -> tuple[str, str]:
        if op is c.LITERAL:
            return _char(av), f"(?:{_char(av)})?"
        if op is c.NOT_LITERAL:
            cls = f"[^{_char(av)}]"
            return cls, f"{cls}?"
        if op is c.ANY:
            return ".", ".?"
        if op is c.IN:
            cls = self.cls(av)
            return cls, f"{cls}?"
        if op is c.BRANCH:
            parts = [self.seq(list(alt)) for alt in av[1]]
            return "(?:" + "|".join(f for f, _ in parts) + ")", "(?:" + "|".join(p for _, p in parts) + ")"
        if op is c.SUBPATTERN:
            _, add, delete, sub = av
            full, pre = self.seq(list(sub))
            flags = ("i" if add & re.IGNORECASE else "") + ("s" if add & re.DOTALL else "")
            off = ("i" if delete & re.IGNORECASE else "") + ("s" if delete & re.DOTALL else "")
            mode = flags + (f"-{off}" if off else "")
            return f"(?{mode}:{full})", f"(?{mode}:{pre})"
        if op is c.ATOMIC_GROUP:
            return self.seq(list(av))
        if op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
            low, high, sub = av
            full, pre = self.seq(list(sub))
            if high == 0 or not full:
                return "", ""
            top = "" if high >= c.MAXREPEAT else str(high)
            below = "*" if high >= c.MAXREPEAT else f"{{0,{high - 1}}}"
            return f"(?:{full}){{{low},{top}}}", f"(?:{full}){below}{pre}"
        raise NoPrefix(f"unsupported construct {op}")

    def cls(self, items: list[tuple[Any, Any]]) -> str:
        out: list[str] = []
        for op, av in items:
            if op is c.NEGATE:
                out.insert(0, "^")
            elif op is c.LITERAL:
                out.append(_char(av))
            elif op is c.RANGE:
                out.append(f"{_char(av[0])}-{_char(av[1])}")
            elif op is c.CATEGORY and av in _CATEGORIES:
                out.append(_CATEGORIES[av])
            else:
                raise NoPrefix(f"unsupported class item {op}")
        return "[" + "".join(out) + "]"
