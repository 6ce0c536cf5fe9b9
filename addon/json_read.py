"""JSON read as the clients read it: strictly and fast, and leniently when it must be;
and written back so that no value read that way makes the writer raise.

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


def dumps(value: Any) -> str:
    """``value`` as compact JSON, never raising for what :func:`loads` returns: orjson
    refuses what only lenient readers take (a lone surrogate, an id sent as
    ``"\ud800"``; an integer beyond 64 bits), and the standard library writes those,
    with ASCII escapes (the peer reads the same string back; a frame's text is encoded as
    UTF-8, which a lone surrogate is not). Values JSON has not (a MessagePack record's
    bytes, non-string keys) are written as their text or left out."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # (orjson.JSONEncodeError is one)
        return json.dumps(value, separators=(",", ":"), default=str, skipkeys=True)
