"""The text rules match on: what a person reads, not how it was encoded.

A keyword rule for ``Nightjar`` must not be defeated by ``Night\\u200djar`` (a zero-width
joiner), ``Night\\u00adjar`` (a soft hyphen) or ``Ｎｉｇｈｔｊａｒ`` (fullwidth letters): a
reader, and a model, sees the same word. So rules match on a *view* of the text:

- ``raw``: the text as it is (a rule with ``normalize = false``);
- ``nfkc`` (the default): Unicode default-ignorable code points removed
  (:data:`DEFAULT_IGNORABLE`), then each character in compatibility normal form NFKC
  (fullwidth and halfwidth forms, ligatures such as ``ﬁ``, mathematical alphanumerics
  such as ``𝐍``, superscripts, the Kelvin sign, no-break and other spaces become the
  plain characters);
- ``confusables`` (opt-in, ``confusables = true``): ``nfkc``, then letters of other
  scripts that look like Latin letters (Cyrillic ``і``, ``о``, Greek ``ο``, ...) become
  those letters (:data:`CONFUSABLES`). Opt-in because it also rewrites honest Cyrillic
  and Greek text, so a rule for a Latin word may then match inside it.

Each character is mapped on its own, never together with its neighbours, so the view of
a stream is the same however the stream is cut into pieces, and every character of the
view knows the original character it came from: :func:`fold` returns, for each
character of the view, its offset in the original text. That is what lets the hold-back
scanner release original characters and report original positions while matching on
the view (:mod:`addon.filters.window`). The price of mapping character by character:
NFKC's canonical composition across characters is not done (``e`` + U+0301 stays two
characters), which matters for no evasion by invisible characters, as U+0301 is visible.

Why not a library: the default-ignorable list is a short, stable table from Unicode's
``DerivedCoreProperties.txt`` (``unicodedata`` does not expose the property), NFKC is
``unicodedata.normalize``, and the confusables kept are the few dozen lookalikes of Latin
letters from ``confusables.txt`` that are single characters; the full table (and the
``confusable_homoglyphs`` package built on it) maps to multi-character skeletons that
would break the one-character-at-a-time mapping.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from functools import lru_cache

# Default_Ignorable_Code_Point (Unicode 15.1 DerivedCoreProperties.txt): characters a
# renderer shows as nothing unless it supports them: soft hyphen, combining grapheme
# joiner, Arabic letter mark, Hangul fillers, Khmer inherent vowels, Mongolian variation
# selectors, zero-width space / non-joiner / joiner, direction marks and embeddings, word
# joiner and invisible operators, variation selectors, the BOM, shorthand format
# controls, musical symbol formatting, and the tag characters.
DEFAULT_IGNORABLE: tuple[tuple[int, int], ...] = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160),
    (0x17B4, 0x17B5), (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E),
    (0x2060, 0x206F), (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)  # fmt: skip
_IGNORABLE = re.compile("[" + "".join(f"\\U{lo:08x}-\\U{hi:08x}" for lo, hi in DEFAULT_IGNORABLE) + "]")

# Single characters of other scripts that read as a Latin letter (a subset of Unicode's
# confusables.txt: Cyrillic, Greek, Armenian and Latin-extended lookalikes).
CONFUSABLES: dict[str, str] = {
    **dict.fromkeys("аɑα", "a"), **dict.fromkeys("сϲ", "c"), "ԁ": "d", **dict.fromkeys("еҽ", "e"),
    "ɡ": "g", "һ": "h", **dict.fromkeys("іιıӏ", "i"), **dict.fromkeys("јϳ", "j"), **dict.fromkeys("кκ", "k"),
    "ո": "n", **dict.fromkeys("оοօ", "o"), **dict.fromkeys("рρ", "p"), "ԛ": "q", "ѕ": "s",
    **dict.fromkeys("υս", "u"), **dict.fromkeys("νѵ", "v"), **dict.fromkeys("ԝѡ", "w"), "х": "x",
    **dict.fromkeys("уү", "y"),
    **dict.fromkeys("АΑ", "A"), **dict.fromkeys("ВΒ", "B"), **dict.fromkeys("СϹ", "C"), **dict.fromkeys("ЕΕ", "E"),
    **dict.fromkeys("НΗ", "H"), **dict.fromkeys("ІΙӀ", "I"), "Ј": "J", **dict.fromkeys("КΚ", "K"),
    **dict.fromkeys("МΜ", "M"), "Ν": "N", **dict.fromkeys("ОΟ", "O"), **dict.fromkeys("РΡ", "P"), "Ѕ": "S",
    **dict.fromkeys("ТΤ", "T"), **dict.fromkeys("ХΧ", "X"), **dict.fromkeys("ҮΥ", "Y"), "Ζ": "Z",
}  # fmt: skip

VIEWS = ("raw", "nfkc", "confusables")
DEFAULT_VIEW = "nfkc"

# A view of a text: the view and, for each of its characters, the offset in the text of
# the character it came from; ``None`` when the view is the text itself.
Folded = tuple[str, list[int] | None]
Fold = Callable[[str], Folded]


@lru_cache(maxsize=8192)
def _nfkc_char(ch: str) -> str:
    if _IGNORABLE.match(ch):
        return ""
    return _IGNORABLE.sub("", unicodedata.normalize("NFKC", ch))


@lru_cache(maxsize=8192)
def _confusable_char(ch: str) -> str:
    return "".join(CONFUSABLES.get(c, c) for c in _nfkc_char(ch))


def _unchanged(text: str, also: re.Pattern[str] | None, latin1_changed: bytes) -> bool:
    """Whether the fold leaves every character of ``text`` as it is: checked at C speed
    on the whole text, so that prose in any script costs no loop over its characters.

    A text in NFKC (``unicodedata.is_normalized``) holds no character that NFKC alone
    changes: such a character decomposes (NFKC of a character without a decomposition
    is itself) into something that does not compose back to it (else NFKC would leave
    it as it is), so NFKC of any text holding it replaces it. Then only the
    default-ignorable characters, which the fold removes, and ``also`` (the letters the
    confusables view maps) can change. ``tests/unit/test_filters_normalize.py`` checks
    this against the character-by-character fold for every code point.

    Text of Latin-1 characters alone (Western European prose) is checked by deleting
    ``latin1_changed`` (those of U+0080 to U+00FF the fold changes, as Latin-1 bytes)
    from its Latin-1 bytes with ``bytes.translate``, a table lookup per byte: 1.3 us
    for a KiB of it, against 14.6 us for the searches below (Python's engine reads a
    character at a time). Other scripts pay for the attempt: a 1 KiB piece that starts
    in Latin-1 and holds other characters fails to encode, 1.5 to 3.2 us more than the
    14.5 us it cost before (one that starts outside Latin-1 is not tried: 0.5 us). Within
    Latin-1 the fold is one character at a time: every character there is a starter
    whose decomposition (if it has one and is kept) composes back to it, so none
    combines with its neighbours.
    """
    if text[:1] <= "\xff":  # (a piece of another script mostly shows it at once: no failed attempt)
        try:
            latin1 = text.encode("latin-1")  # a copy for a one-byte string
        except UnicodeEncodeError:
            pass  # (the exception costs 1 to 3 us: the price other scripts pay for this shortcut)
        else:
            return len(latin1.translate(None, latin1_changed)) == len(latin1)
    return (
        unicodedata.is_normalized("NFKC", text)
        and _IGNORABLE.search(text) is None
        and (also is None or also.search(text) is None)
    )


def fold_each(text: str, one: Callable[[str], str]) -> Folded:
    """The fold character by character (``one`` maps a non-ASCII character), with no
    shortcut: what :func:`fold` gives, and what its whole-text check is tested against."""
    out: list[str] = []
    where: list[int] = []
    for i, ch in enumerate(text):
        mapped = ch if ch < "\x80" else one(ch)
        out.append(mapped)
        where.extend([i] * len(mapped))
    view = "".join(out)
    return (text, None) if view == text else (view, where)


def latin1_changed(one: Callable[[str], str]) -> bytes:
    """The characters from U+0080 to U+00FF that ``one`` changes, as Latin-1 bytes."""
    return bytes(cp for cp in range(0x80, 0x100) if one(chr(cp)) != chr(cp))


def _folder(one: Callable[[str], str], also: re.Pattern[str] | None = None) -> Fold:
    changed = latin1_changed(one)

    def fold(text: str) -> Folded:
        if text.isascii() or _unchanged(text, also, changed):  # the common cases, kept cheap
            return text, None
        return fold_each(text, one)

    return fold


nfkc_fold: Fold = _folder(_nfkc_char)
CONFUSABLE_LETTERS = re.compile("[" + "".join(sorted(CONFUSABLES)) + "]")
"""Any letter the confusables view maps (:data:`CONFUSABLES`)."""
confusables_fold: Fold = _folder(_confusable_char, CONFUSABLE_LETTERS)
_FOLDS: dict[str, Fold | None] = {"raw": None, "nfkc": nfkc_fold, "confusables": confusables_fold}


def folder(view: str) -> Fold | None:
    """The fold of a view (``None`` for ``raw``: the text is its own view)."""
    return _FOLDS[view]


def fold(text: str, view: str = DEFAULT_VIEW) -> Folded:
    """``text`` seen through ``view``, with each view character's offset in ``text``."""
    f = _FOLDS[view]
    return (text, None) if f is None else f(text)
