"""Recorded text made visible and inert for a web page.

Prompts and answers are hostile input. Jinja2's autoescaping turns HTML into text; this
module handles what escaping leaves alone: control characters (an ANSI escape), the
bidirectional controls that reorder what a reader sees (U+202E), and the invisible
characters that hide text, shown as ``\\x1b`` and ``\\u202e`` as ``llm-audit show``
shows them (:func:`cli.terminal.visible`, here widened to the characters a browser, unlike
a terminal, also honours). Invisible means every format character (Unicode category Cf:
zero-width spaces, word joiners, the soft hyphen, and the tag characters U+E0020-E007F
that "ASCII smuggling" uses to hide a whole instruction in a prompt), the variation
selectors (which can carry hidden bytes after a visible character) and the fillers that
draw nothing (Hangul fillers, U+034F); emoji's own selector U+FE0F is left, as it hides
nothing. Every value a template prints passes through :func:`visible` (the environment's
``finalize``), so a template cannot forget it.
"""

from __future__ import annotations

import re
from typing import Any

from markupsafe import Markup

# C0 and C1 controls but tab and newline; every format character (category Cf: bidi
# marks, embeddings, overrides and isolates, zero-width characters, the soft hyphen, the
# tag characters) as of Unicode 15, and the whole plane 14 (tags, variation selectors
# 17-256); variation selectors 1-15 and the characters that draw nothing; line and
# paragraph separators; lone surrogates (which no page could encode).
# tests/unit/test_serve.py checks every Cf character of the running Python against it.
_HIDDEN = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\xad\u034f\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2"
    "\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u2028-\u202e\u2060-\u206f\u3164"
    "\ufe00-\ufe0e\ufeff\uffa0\ufff0-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f"
    "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff\ud800-\udfff]"
)


def visible(text: str) -> str:
    """``text`` with every hidden or reordering character written as its escape (``\\u202e``)."""
    return _HIDDEN.sub(lambda m: ascii(m.group())[1:-1], text)


def finalize(value: Any) -> Any:
    """What a template prints: text made visible; markup the templates built themselves as it is."""
    if value is None:
        return ""
    if isinstance(value, Markup) or not isinstance(value, str):
        return value
    return visible(value)
