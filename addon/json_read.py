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
#: What one parse may make, as :func:`too_costly` estimates it. 32 MiB of ``{},`` (an
#: answer under the record cap) made 1.15 GB of Python objects, 32 MiB of ``1000,``
#: 614 MB; an answer with the top 20 log probabilities of each of 11,600 tokens (14 MiB,
#: half a million objects) makes 143 MB, and is estimated at about 110 MB.
MAX_PARSE_BYTES = 256 * 1024 * 1024
#: The estimate's bytes per object or array (an empty dict is 64 bytes, its slot in the
#: container holding it 8), and per value (a comma: a number is 28 bytes, a short string
#: about 50, some shared, with its slot).
_PER_CONTAINER, _PER_VALUE = 72, 40


def too_costly(data: str | bytes) -> str | None:
    """Why parsing ``data`` whole would cost the proxy too much memory, or None.

    The estimate: the document's size (four times it when it is not ASCII: a Python
    string of characters past Latin-1 takes up to four bytes each), and per object or
    array and per comma what Python makes of one. A comma or a bracket inside a string
    counts too, so text is overestimated (prose has about one comma in 20 characters:
    some 2 bytes a byte), never under. Why counted rather than parsed with a limit:
    neither orjson nor the standard library bounds what a parse makes, and a streaming
    parser would not give the dialects their documents; counting is a few passes at
    memory speed (a few ms for 32 MiB)."""
    if len(data) < COUNT_FROM:
        return None
    if isinstance(data, str):
        containers, values = data.count("{") + data.count("["), data.count(",")
    else:
        containers, values = data.count(b"{") + data.count(b"["), data.count(b",")
    estimate = len(data) * (1 if data.isascii() else 4) + containers * _PER_CONTAINER + values * _PER_VALUE
    if estimate > MAX_PARSE_BYTES:
        return (
            f"{len(data)} bytes of JSON with about {containers} objects and arrays and {values} values: "
            f"about {estimate >> 20} MiB read, over the {MAX_PARSE_BYTES >> 20} MiB one reading may make"
        )
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
