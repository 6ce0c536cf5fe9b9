"""The event :mod:`addon.framing.sse` dispatches, in a module of its own.

Why apart from the parser: the parser module may be compiled (mypyc, see
``setup.py``), and mypyc turns a dataclass it compiles into a native class; this one
stays an ordinary Python dataclass either way, so events are the same objects (same
class, pickling, ``dataclasses.fields``, frozen) whichever parser made them, and the
parser can build them the fast way (:class:`EventShell`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EventShell", "SSEEvent"]


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event, as a WHATWG ``MessageEvent`` would carry it.

    ``id`` is the event source's *last event ID* at dispatch time (it persists across
    events until changed), and ``retry`` is the reconnection time in effect after this
    event's block (``None`` while no valid ``retry`` field has been seen).
    """

    event: str = "message"
    data: str = ""
    id: str = ""
    retry: int | None = None


class EventShell:
    """An :class:`SSEEvent` being built: the same slots, but neither frozen nor with an ``__init__``.

    Why: the parser creates one event per event of every stream, on the proxy's hot path,
    and a frozen dataclass is slow to create: its ``__init__`` stores each field with
    ``object.__setattr__``, and the other ways in (``object.__new__``, the slots'
    ``__set__``) are slow calls too. A shell is created by a plain call (no Python
    ``__init__``), filled with plain attribute stores, and then becomes an SSEEvent by
    assigning ``__class__``, which Python allows between classes of the same layout (the
    same slots in the same order on the same base): about a third of the cost. The
    result is an ordinary SSEEvent: same class, equal to ``SSEEvent(...)``, immutable.
    Defined here, not in the parser's module: a class compiled by mypyc has another layout.
    """

    __slots__ = ("event", "data", "id", "retry")
    event: str
    data: str
    id: str
    retry: int | None
