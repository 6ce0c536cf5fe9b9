"""The filter interface: what a content filter sees, and what it answers.

A filter looks at an exchange twice: at the request, before it goes upstream, and at
each new piece of output as it streams back. Each time it answers with a
:class:`Verdict`, or ``None`` when it has nothing to say:

- ``allow``: nothing to record (the same as ``None``);
- ``flag``: record the verdict with the exchange and let the traffic through;
- ``block``: stop the exchange. A blocked request never goes upstream; a blocked
  response ends at once with an error for the client, and the text that caused it never
  reaches the client.

Writing a filter
----------------
A filter file is a Python module loaded with ``--set llm_filters=path/to/filters.py``
(the option may be given several times) and reloaded whenever the file changes. It
exposes either a list ``filters`` of objects with the :class:`Filter` members
(subclass :class:`BaseFilter` and override what you need), or plain top-level
functions ``check_request(ctx)`` and/or ``check_output(piece)`` (plus optional
``name = "..."`` and ``window = N``)::

    from addon.filters.api import BLOCK, BaseFilter, Verdict

    class NoPasswords(BaseFilter):
        name = "no-passwords"
        window = 64  # hold back 64 characters so a match is caught before it leaves

        def check_request(self, ctx):
            if any("password" in m.text.lower() for m in ctx.messages):
                return Verdict(BLOCK, "password-in-prompt", "the prompt mentions a password")

        def check_output(self, piece):
            tail = piece.recent(self.window + len(piece.text))
            i = tail.lower().find("password:")
            if i >= 0:
                start = piece.end - len(tail) + i
                return Verdict.for_match(BLOCK, "password-in-answer", "a password in the answer",
                                         tail[i:i + 9], start)

    filters = [NoPasswords()]

Rules for filters:

- They run on the proxy's event loop for every piece of every stream: be fast, do no
  I/O, never wait. A call that takes longer than the time budget, or raises, gives a
  ``filter_error`` verdict, and the proxy's failure policy decides what that means
  ("open": recorded, traffic continues; "closed": the exchange is blocked). A failing
  filter is not called again for the rest of that exchange.
- Never put the matched text in ``reason``: the audit record keeps reasons verbatim.
  :meth:`Verdict.for_match` keeps only a hash of the match.
- ``window`` is how much of each output stream the proxy holds back for you: set it to
  the length of the longest text you block on. Each piece is handed to
  ``check_output`` before any of it is released, and the last ``window`` characters of
  a stream stay held until more arrives (or the stream ends), so a match blocked on the
  piece that completes it has not left. ``0`` releases each piece once checked.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from exchange.request import Message, extract_messages, token_prompts

__all__ = [
    "ALLOW",
    "BLOCK",
    "FILTER_ERROR",
    "FLAG",
    "Action",
    "BaseFilter",
    "Filter",
    "Message",
    "OutputPiece",
    "RequestContext",
    "Verdict",
    "match_hash",
]

Action = Literal["allow", "flag", "block"]
ALLOW: Action = "allow"
FLAG: Action = "flag"
BLOCK: Action = "block"
_ACTIONS = (ALLOW, FLAG, BLOCK)
FILTER_ERROR = "filter_error"  # the rule id of the verdict for a check that could not run


def match_hash(text: str) -> str:
    """``sha256:`` and 16 hex digits: identifies a match across records, never reveals it."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Verdict:
    """A filter's answer about a request or a piece of output.

    ``rule_id`` names what matched (stable, for queries); ``reason`` says why, for a
    person. ``position`` is the character offset of the match: in the message text for
    a request (``location`` names the message), in the stream's text so far for output.
    ``match_hash`` identifies the matched text without containing it. The proxy sets
    ``filter`` to the filter's name, and ``location`` when it is left empty.
    """

    action: Action
    rule_id: str
    reason: str = ""
    position: int | None = None
    match_hash: str | None = None
    filter: str = ""
    location: str = ""

    def __post_init__(self) -> None:
        if self.action not in _ACTIONS:
            raise ValueError(f"action must be one of {', '.join(_ACTIONS)}, not {self.action!r}")

    @classmethod
    def for_match(cls, action: Action, rule_id: str, reason: str, matched: str, position: int) -> Verdict:
        """A verdict about ``matched`` at ``position`` that keeps only the text's hash."""
        return cls(action, rule_id, reason, position, match_hash(matched))

    def as_dict(self) -> dict[str, Any]:
        """The verdict as the audit record stores it."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class RequestContext:
    """Everything a filter may look at in a request, before it goes upstream.

    ``body`` is the parsed JSON body as the client sent it (``None`` when it is not
    JSON); ``messages`` is the conversation read from it whatever the API, system
    prompts first, tool calls and results included. ``tools`` are the names of the
    declared tools. ``user_id``, ``session_id`` and ``request_id`` come from the
    request's metadata when it has them. ``client_address`` is the client's IP address;
    ``user`` is who the proxy knows the client as (its proxy user name, or the
    fingerprint of its API key), ``None`` when unknown. ``unreadable`` names what the
    model reads that no filter can (a legacy Completions prompt of token ids).
    """

    dialect: str
    body: Any
    messages: tuple[Message, ...] = ()
    tools: frozenset[str] = frozenset()
    user_id: str | None = None
    session_id: str | None = None
    request_id: str | None = None
    client_address: str | None = None
    user: str | None = None
    unreadable: tuple[str, ...] = ()
    # the index in ``messages`` of the first message the proxy put beside the conversation
    # (every other string of the body), None when there is none
    beside: int | None = None
    # the index in ``messages`` of what the request declares (its tools and output
    # schemas, read apart: the PII detector leaves it), None when there is none
    declared: int | None = None

    @classmethod
    def from_body(
        cls, dialect: str, body: Any, read: set[int] | None = None, beside: bool = False, **fields: Any
    ) -> RequestContext:
        """A context whose ``messages`` are read from ``body``; other fields as given.
        ``read`` gets what of ``body`` they hold (:func:`~exchange.request.extract_messages`).
        ``beside``: the caller reads every other string of the body too, so text nested
        deeper than the conversation's reader goes is read, not unreadable."""
        cut: list[str] = []  # (text nested deeper than the reader goes: no filter reads it)
        messages = tuple(extract_messages(body, cut, read))
        unreadable = (*(("prompt: token ids",) if token_prompts(body) else ()), *([] if beside else cut))
        return cls(dialect, body, messages, **fields, unreadable=unreadable)


_JOIN_EVERY = 1024


class TextSoFar:
    """The text of one output stream so far, joined only when a filter asks for it.

    Building the whole text on every piece would cost the square of its length.
    """

    __slots__ = ("_loose", "_parts", "length")

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._loose = 0  # pieces appended since the last join
        self.length = 0

    def append(self, text: str) -> None:
        self._parts.append(text)
        self.length += len(text)
        self._loose += 1
        if self._loose == _JOIN_EVERY:  # keep tiny pieces from piling up: join each batch once
            self._parts[-_JOIN_EVERY:] = ["".join(self._parts[-_JOIN_EVERY:])]
            self._loose = 0

    def text(self) -> str:
        if len(self._parts) > 1:
            self._parts[:] = ["".join(self._parts)]
            self._loose = 0
        return self._parts[0] if self._parts else ""

    def recent(self, n: int) -> str:
        """The last ``n`` characters, copying only those."""
        parts, need, i = [], n, len(self._parts)
        while i and need > 0:
            i -= 1
            part = self._parts[i]
            parts.append(part[-need:] if len(part) > need else part)
            need -= len(part)
        return "".join(reversed(parts))


@dataclass(frozen=True, slots=True)
class OutputPiece:
    """A new piece of output, handed to filters before any of it reaches the client.

    ``choice`` is the alternative answer (0 unless the client asked for several);
    ``kind`` is ``text``, ``reasoning``, ``refusal`` or ``tool_arguments`` (then
    ``tool_key`` names the tool call being assembled), or one of the strings that arrive
    whole: ``tool_name`` (with its ``tool_key``), ``error`` (the upstream's error
    message) and ``final_text`` (a final text that disagrees with the streamed deltas). ``text`` is the new piece;
    ``end`` is the length of the stream's text including it. ``final`` marks the call
    made once a stream is over, with ``text == ""``, before its held-back tail is
    released: the last chance to block.

    Read the text so far with :attr:`accumulated`, or just its end with
    :meth:`recent` (cheaper: the whole text costs its length on every call). Both are
    valid during the call only.
    """

    choice: int
    kind: Literal["text", "reasoning", "refusal", "tool_arguments", "tool_name", "error", "final_text"]
    text: str
    end: int
    tool_key: str | None = None
    final: bool = False
    _so_far: TextSoFar | None = None

    @property
    def accumulated(self) -> str:
        """The stream's whole text so far, this piece included."""
        return self._so_far.text() if self._so_far else self.text

    def recent(self, n: int) -> str:
        """The last ``n`` characters of the stream's text so far."""
        return self._so_far.recent(n) if self._so_far else self.text[-n:] if n > 0 else ""


@runtime_checkable
class Filter(Protocol):
    """What the proxy calls. Return ``None`` (or an ``allow`` verdict) to let things pass."""

    name: str
    window: int

    def check_request(self, ctx: RequestContext) -> Verdict | None: ...

    def check_output(self, piece: OutputPiece) -> Verdict | None: ...


class BaseFilter:
    """A :class:`Filter` that passes everything: override only what you check.

    ``name`` defaults to the class name; ``window`` to 0 (nothing held back). Both may
    be set on the class or on the instance.
    """

    name: str = ""
    window: int = 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.__dict__.get("name"):
            cls.name = cls.__name__

    def check_request(self, ctx: RequestContext) -> Verdict | None:
        return None

    def check_output(self, piece: OutputPiece) -> Verdict | None:
        return None
