"""JSON read as the clients read it: strictly and fast, and leniently when it must be.

orjson is strict; the readers on the other side of the proxy are not. Python's
``json.loads`` (the openai and anthropic SDKs, and the Python servers in front of many
models) also takes ``NaN``, ``Infinity``, numbers beyond a double (``1e400``) and lone
surrogate escapes (``\\ud800``, which JavaScript's ``JSON.parse`` takes too). A message
only such a reader takes is still acted on or shown to the user, so the audit reads it
the same way: skipped as unreadable, its text would reach the client (or the model)
past every filter. One place for the rule, for the framings and the dialects alike.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def loads(data: str | bytes) -> tuple[Any, bool]:
    """``data`` parsed, and whether only a lenient reader takes it; ValueError when none does."""
    try:
        return orjson.loads(data), False
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(data), True
    except RecursionError as e:  # (nesting deeper than Python's stack: unreadable to the SDKs too)
        raise ValueError("nested too deeply") from e
