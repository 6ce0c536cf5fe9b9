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
#: What one parse may make, as :func:`too_costly` estimates it: half a GiB. 32 MiB of
#: ``{},`` (an answer under the record cap) made 1.15 GB of Python objects, and a tiny
#: chat message made 769 bytes of 40 of JSON (1.4 million of them: some 1 GB); an answer with the top 20 log
#: probabilities of 14,000 tokens (14 MB) makes 254 MiB, estimated at 367 MiB, and is read.
MAX_PARSE_BYTES = 512 * 1024 * 1024
#: The estimate's bytes per object or array, per value (a comma: a number is 96 to 104
#: bytes with its slot, a short string about 111) and per object member (a colon: a
#: member of a small object costs up to some 250 bytes of the dict's table). Fitted to
#: what tracemalloc measured orjson making of each shape (empty and filled objects and
#: arrays, numbers, strings, chat messages, log probabilities): the estimate was 1.0 to
#: 1.8 times what they made. One long string is not covered: tracemalloc counted some 13
#: times its size at the peak of orjson's parse of it.
_PER_CONTAINER, _PER_VALUE, _PER_MEMBER = 16, 112, 256


def too_costly(data: str | bytes) -> str | None:
    """Why parsing ``data`` whole would cost the proxy too much memory, or None.

    The estimate: the document's size (four times it when it is not ASCII: a Python
    string of characters past Latin-1 takes up to four bytes each), and what Python
    makes per object or array, per comma and per colon. A bracket, a comma or a colon
    inside a string counts too, so text is overestimated (prose has about one comma in
    20 characters). Why counted rather than parsed with a limit: neither orjson nor the
    standard library bounds what a parse makes, and a streaming parser would not give
    the dialects their documents; counting is four passes at memory speed (48 ms for
    33 MiB)."""
    if len(data) < COUNT_FROM:
        return None
    if isinstance(data, str):
        containers, values, members = data.count("{") + data.count("["), data.count(","), data.count(":")
    else:
        containers, values, members = data.count(b"{") + data.count(b"["), data.count(b","), data.count(b":")
    size = len(data) * (1 if data.isascii() else 4)
    estimate = size + containers * _PER_CONTAINER + values * _PER_VALUE + members * _PER_MEMBER
    if estimate > MAX_PARSE_BYTES:
        return (
            f"{len(data)} bytes of JSON with about {containers} objects and arrays, {values} values and "
            f"{members} members: about {estimate >> 20} MiB read, over the {MAX_PARSE_BYTES >> 20} MiB one reading may make"
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
