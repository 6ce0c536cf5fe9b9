"""The framing layer: how a response body is cut into frames, kept apart from the dialects.

A dialect reads *frames* (an SSE event, an element of a streamed JSON array, a whole
body), never bytes; a framing is the one module that knows where frames begin and end
in the bytes, as h11 keeps its readers apart from its state machine. Each framing gives:

- a **reader** (:class:`Reader`): decoded bytes in, completed frames out, and, for the
  output gate, the offset where each frame ends (``feed_bounded``) so that held bytes are
  released frame by frame at the reader's own boundaries;
- a **writer** (:class:`Writer`): frames out as bytes, for the frames a dialect appends
  when a content filter cuts its stream (:meth:`~addon.dialects.Normalizer.ending`).

Which framing reads an exchange is chosen per response by :func:`select`, from the
response's media type and the framing the dialect expects. Adding a framing is one module
that calls :func:`register`; nothing else changes (see ``docs/framings.md``).

Sans-IO: no mitmproxy, no database.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

#: The largest frame (an SSE line or event, a JSON-array element) a reader keeps by
#: default: ``llm_audit_max_event_bytes``. A larger one is skipped as it arrives, with a
#: finding, so that no upstream can make the proxy buffer without bound.
DEFAULT_MAX_EVENT_BYTES = 8 * 1024 * 1024


class Frame(Protocol):
    """What a dialect reads: one unit of a response body.

    :class:`~addon.framing.sse.SSEEvent` satisfies it as it is (no wrapper, no copy on the
    SSE hot path). ``event`` names the frame's type where the framing has one (SSE's
    ``event:`` field; other framings give a fixed name), ``data`` is its payload as text,
    ``id`` its id where the framing has ids ("" otherwise).
    """

    @property
    def event(self) -> str: ...

    @property
    def data(self) -> str: ...

    @property
    def id(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Message:
    """A frame of a framing that has no frame class of its own (a JSON-array element, a
    whole body), and the frames a dialect builds for its termination."""

    data: str = ""
    event: str = "message"
    id: str = ""


class Reader(Protocol):
    """Decoded body bytes in, frames out. Never raises on bad input: problems are
    appended to :attr:`findings` as ``(code, detail)`` (codes of :mod:`addon.findings`)."""

    findings: list[tuple[str, str]]

    @property
    def unreadable(self) -> str | None:
        """Why the body cannot be read in this framing (not a JSON array, say), else None:
        a gate holding it then applies the filter failure policy."""

    def feed(self, data: bytes) -> Sequence[Frame]:
        """The frames ``data`` completes (the fast path: no boundaries reported)."""

    def feed_bounded(self, data: bytes) -> list[tuple[Frame | None, int]]:
        """The frames ``data`` completes, each with the decoded offset just past its end.

        ``None`` marks bytes that end without a frame (an SSE comment block, line ends
        between events, a JSON array's closing bracket and the whitespace after it): they
        too may go to the client once what precedes them has. These ends are the only
        boundaries the output gate releases by: bytes after the last one are held.
        """

    @property
    def held(self) -> int:
        """Bytes read past the last boundary reported: what waits for a frame's end."""

    def unbound(self) -> Sequence[Frame]:
        """Stop reporting boundaries: the frames of what is held, read as ``feed`` reads."""

    def end(self) -> Sequence[Frame]:
        """The body is over: frames it completes (a whole body's one frame)."""

    @property
    def pending_event(self) -> bool:
        """Whether the body is (or, after :meth:`end`, ended) inside a frame."""


class Writer(Protocol):
    """Encodes the frames a dialect appends to a stream it cut."""

    def encode(self, frames: Sequence[Frame], continues: bool) -> bytes:
        """The bytes of ``frames``; ``continues``: frames of this body already reached the client."""


@dataclass(frozen=True, slots=True)
class Framing:
    """One framing: its name, how to make a reader for one body, and its writer.

    ``streamed``: frames are read (and filtered) as the body flows; otherwise the body is
    one frame, read at its end and, when filters may block, held whole until then.
    ``media_types``: response media types that select this framing whatever the dialect
    expects (``text/event-stream``; one ending in ``*`` claims every type it begins, as
    ``application/connect+*``); a framing without any is chosen only when the
    dialect expects it (a JSON array is served as ``application/json``, like any answer).
    ``incomplete``: the finding for a body that ended inside a frame though HTTP says it
    is whole (None: the dialect reports it, told by ``on_end(cut=True)``).
    ``by_expectation``: a framing with media types is also chosen for a 2xx answer of
    another type when the dialect expects it (NDJSON: Ollama versions label it otherwise).
    """

    name: str
    # (max_event_bytes, max_record_bytes, the body's headers) -> a reader for one body; the
    # headers name what a framing may need of them (a per-message compression, say)
    reader: Callable[[int, int, Mapping[str, str]], Reader]
    writer: Writer | None
    streamed: bool
    media_types: tuple[str, ...] = ()
    incomplete: tuple[str, str] | None = None
    by_expectation: bool = False


FRAMINGS: dict[str, Framing] = {}


def register(framing: Framing) -> Framing:
    FRAMINGS[framing.name] = framing
    return framing


def select(content_type: str, status: int, expected: str | None) -> Framing:
    """The framing of one response: claimed by its media type, else the one the dialect
    expects for a successful answer, else the whole body (a JSON answer, an error)."""
    kind = content_type.partition(";")[0].strip().lower()
    for framing in FRAMINGS.values():
        if any(kind == t or (t[-1] == "*" and kind.startswith(t[:-1])) for t in framing.media_types):
            return framing
    chosen = FRAMINGS.get(expected or "")
    if chosen is not None and (chosen.by_expectation or not chosen.media_types) and 200 <= status < 300:
        return chosen
    return FRAMINGS["whole"]


BUILTIN_FRAMINGS = ("sse", "json_array", "ndjson", "whole", "envelope", "eventstream", "ws_json", "signalr")


def _load_builtin_framings() -> None:
    """Import the built-in framing modules; each registers itself."""
    for module in BUILTIN_FRAMINGS:
        importlib.import_module(f"addon.framing.{module}")


_load_builtin_framings()
