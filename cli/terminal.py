"""Text for a person on a terminal: colour when it is one, widths that CJK and combining
characters take, cutting and wrapping to a width, and recorded text made harmless.

Colour is used only when the stream is a terminal and ``NO_COLOR`` is not set
(https://no-color.org), so piped output is plain text. A table or page fits the
terminal's width (``COLUMNS``, else the terminal's, else 120 columns when piped). Text
from the database reaches the screen with its control characters and bidirectional
overrides made visible (``\\x1b``, ``\\u202e``): a recorded answer must not be able to
rewrite the auditor's terminal or reorder what it shows.
"""

from __future__ import annotations

import os
import re
import shutil
import unicodedata
from datetime import datetime
from typing import IO

ELLIPSIS = "…"
# control characters (not tab, newline), bidirectional marks and overrides, line and paragraph separators
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
STATUS_COLORS = {
    "completed": "32", "failed": "31", "blocked": "1;31", "client_aborted": "33", "upstream_aborted": "33",
    "interrupted": "33", "in_progress": "36",
}  # fmt: skip


class Style:
    """ANSI colours when ``enabled``; otherwise every method returns the text unchanged."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    @classmethod
    def for_stream(cls, stream: IO[str]) -> Style:
        return cls(stream.isatty() and not os.environ.get("NO_COLOR"))

    def __call__(self, text: str, code: str | None) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.enabled and code and text else text

    def bold(self, text: str) -> str:
        return self(text, "1")

    def dim(self, text: str) -> str:
        return self(text, "2")

    def status(self, text: str, status: str | None) -> str:
        return self(text, STATUS_COLORS.get(status or ""))


def terminal_width() -> int:
    return max(shutil.get_terminal_size(fallback=(120, 24)).columns, 20)


def visible(text: str) -> str:
    """``text`` with control characters (but tab and newline), bidirectional marks and
    overrides and Unicode's line and paragraph separators shown as ``\\xNN`` and ``\\uNNNN``."""
    return _CONTROL.sub(lambda m: ascii(m.group())[1:-1], text)


def one_line(text: str | None) -> str:
    """``text`` on one line: runs of whitespace (newlines too) become one space."""
    return visible(" ".join((text or "").split()))


def _char_width(char: str) -> int:
    if unicodedata.combining(char) or char in "\u200b\u200c\u200d\ufeff":
        return 0
    return 2 if unicodedata.east_asian_width(char) in "WF" else 1


def display_width(text: str) -> int:
    """Terminal columns ``text`` takes (wide CJK characters take two, combining marks none)."""
    return sum(_char_width(c) for c in text)


def _fitting(text: str, start: int, width: int) -> int:
    """The end of the longest piece of ``text`` from ``start`` that fits in ``width`` columns."""
    used = 0
    for i in range(start, len(text)):
        used += _char_width(text[i])
        if used > width:
            return i
    return len(text)


def clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` columns, with an ellipsis when something was cut."""
    if _fitting(text, 0, width) == len(text):
        return text
    return text[: _fitting(text, 0, width - 1)] + ELLIPSIS if width > 0 else ""


def pad(text: str, width: int, right: bool = False) -> str:
    space = " " * max(width - display_width(text), 0)
    return space + text if right else text + space


def wrap(line: str, width: int) -> list[str]:
    """One line of text cut into pieces of at most ``width`` columns, at spaces where possible."""
    pieces, start = [], 0
    while (end := _fitting(line, start, width)) < len(line):
        space = line.rfind(" ", start, end + 1)
        if space > start:
            pieces.append(line[start:space])
            start = space + 1
        else:
            pieces.append(line[start : max(end, start + 1)])
            start = max(end, start + 1)
    pieces.append(line[start:])
    return pieces


def timestamp(value: datetime | None, *, seconds: bool = True, precise: bool = False) -> str | None:
    """``2026-03-01 12:34:56`` (``.789`` when ``precise``; no seconds when not ``seconds``)."""
    if value is None:
        return None
    text = value.strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M")
    return text + (f".{value.microsecond // 1000:03d}" if precise else "")
