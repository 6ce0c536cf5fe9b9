"""The SSE framing: Server-Sent Events read (WHATWG HTML 9.2.5/9.2.6) and written.

The reader is :mod:`addon.framing.sse_parser` (its docstring says how it reads and why
it is our own); the event it dispatches is :class:`~addon.framing.sse_event.SSEEvent`;
:class:`SSEWriter` encodes the events a dialect appends to a stream it cut. Standard
library and :mod:`addon.framing` only: sans-IO, no mitmproxy.

The parser may be a compiled copy of its module (mypyc, built at install where a C
compiler exists; see ``setup.py``). :data:`COMPILED` tells which one runs. The pure
module is used instead when there is no compiled copy, when the copy is older than the
source (an editable checkout whose ``sse_parser.py`` was changed since the last install:
the compiled copy would run old code), or when ``LLM_AUDIT_PURE_PARSER=1`` is set.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

from addon.framing import Frame, Framing, register
from addon.framing.sse_event import SSEEvent

__all__ = ["COMPILED", "SSEEvent", "SSEParser", "SSEReader", "SSEWriter"]

_PARSER = "addon.framing.sse_parser"


def _choose_parser_module() -> None:
    """Load the pure parser under its own name when the compiled one must not be used.

    Run before the parser is imported: a module already in ``sys.modules`` is what the
    ``import`` below binds, so this decides which one every user of the parser gets.
    """
    if _PARSER in sys.modules:
        return
    source = Path(__file__).with_name("sse_parser.py")
    spec = importlib.util.find_spec(_PARSER)
    origin = spec.origin if spec is not None else None
    if origin is None or origin == str(source):
        return  # not compiled: the ordinary import finds the source
    if os.environ.get("LLM_AUDIT_PURE_PARSER") != "1":
        if os.stat(origin).st_mtime >= os.stat(source).st_mtime:
            return  # built from this source (or later): use it
        warnings.warn(
            f"{source} changed after its compiled copy {origin} was built: using the pure module"
            " (reinstall to rebuild it: scripts/_bootstrap.sh's ensure_venv, or pip install -e .)",
            RuntimeWarning,
            stacklevel=2,
        )
    pure = importlib.util.spec_from_file_location(_PARSER, source)
    assert pure is not None and pure.loader is not None
    module = importlib.util.module_from_spec(pure)
    sys.modules[_PARSER] = module
    pure.loader.exec_module(module)


_choose_parser_module()

from addon.framing import sse_parser  # noqa: E402 - after the choice above
from addon.framing.sse_parser import SSEParser, SSEReader  # noqa: E402

# Whether the parser is the compiled copy (scripts/bench prints it).
COMPILED: bool = (sse_parser.__file__ or "").endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


class SSEWriter:
    """Encodes frames as SSE events: an ``id:`` line when the frame has an id, an
    ``event:`` line unless the type is the default ``message``, one ``data:`` line.

    ``newline``: the line end, LF, or CRLF for a dialect whose servers frame with it
    (Gemini). Dialects build data as compact JSON, which never holds a line break.
    """

    __slots__ = ("newline",)

    def __init__(self, newline: bytes = b"\n") -> None:
        self.newline = newline

    def encode(self, frames: Sequence[Frame], continues: bool = True) -> bytes:
        return b"".join(map(self._event, frames))

    def _event(self, frame: Frame) -> bytes:
        nl = self.newline
        lines = [b"id: " + frame.id.encode()] if frame.id else []
        if frame.event != "message":
            lines.append(b"event: " + frame.event.encode())
        lines.append(b"data: " + frame.data.encode())
        return nl.join(lines) + nl + nl


SSE_WRITER = SSEWriter()


def reader(max_event_bytes: int, max_record_bytes: int, headers: Mapping[str, str]) -> SSEReader:
    """A reader for one event stream (events are bounded by ``max_event_bytes`` alone)."""
    return SSEReader(max_event_bytes)


FRAMING = register(
    Framing(
        "sse",
        reader,
        SSE_WRITER,
        streamed=True,
        media_types=("text/event-stream",),
        incomplete=("sse_incomplete_event", "the body ended inside an event"),
    )
)
