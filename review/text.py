"""Recorded text made visible and inert for a web page.

Prompts and answers are hostile input. Jinja2's autoescaping turns HTML into text; this
module handles what escaping leaves alone: control characters (an ANSI escape), the
bidirectional controls that reorder what a reader sees (U+202E), and the invisible
characters that hide text (zero-width spaces, word joiners), shown as ``\\x1b`` and
``\\u202e`` as ``llm-audit show`` shows them (:func:`cli.terminal.visible`, here widened
to the characters a browser, unlike a terminal, also honours). Every value a template
prints passes through :func:`visible` (the environment's ``finalize``), so a template
cannot forget it.
"""

from __future__ import annotations

import re
from typing import Any

from markupsafe import Markup

# C0 and C1 controls but tab and newline; bidi marks, embeddings, overrides and isolates;
# zero-width and invisible formatting characters; line and paragraph separators.
_HIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb]")


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
