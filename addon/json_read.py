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

#: A document this large is first counted (:func:`too_costly`): below it, what a parse
#: makes is bounded by the size (36 MiB of Python objects at most, from 1 MiB of ``{},``).
COUNT_FROM = 1 << 20
#: Objects and arrays one parse of a whole body may make (an empty object is 64 bytes
#: as a Python dict, from 3 bytes of JSON): 32 MiB of ``{},`` made 1.15 GB.
MAX_CONTAINERS = 500_000
#: Values one parse may make, counted by their commas (a comma inside a string counts
#: too, so the count is high for text: prose has about one in 20 characters, so this is
#: 40 MB of prose, far past any model's context). 32 MiB of ``1000,`` made 614 MB.
MAX_VALUES = 2_000_000


def too_costly(data: str | bytes) -> str | None:
    """Why parsing ``data`` whole would cost the proxy too much memory, or None.

    Why counted rather than parsed with a limit: neither orjson nor the standard
    library bounds what a parse makes, and a streaming parser would not give the
    dialects their documents. Counting the structural characters is a few passes at
    memory speed (a few ms for 32 MiB)."""
    if len(data) < COUNT_FROM:
        return None
    if isinstance(data, str):
        containers, values = data.count("{") + data.count("["), data.count(",")
    else:
        containers, values = data.count(b"{") + data.count(b"["), data.count(b",")
    if containers > MAX_CONTAINERS:
        return f"about {containers} JSON objects and arrays in {len(data)} bytes, over the {MAX_CONTAINERS} one reading makes"
    if values > MAX_VALUES:
        return f"about {values} JSON values in {len(data)} bytes, over the {MAX_VALUES} one reading makes"
    return None


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
