"""What the exchange hooks keep for one live flow, as one explicit state per stage.

A flow the hooks watch is in exactly one of these states (the table of live flows maps
its id to it); each holds only what that stage needs, so no combination of optional
fields has to be read to know where a flow is:

- :class:`Recording`: a request a dialect recognised; its record is open (written
  ahead as ``in_progress``), the response has not begun;
- :class:`AnsweredByProxy`: a content filter blocked the request and the proxy
  answered it; nothing went upstream and there is no body to read;
- :class:`Sniffing`: an event stream no dialect claimed by its request; its first
  event decides (claimed, it becomes :class:`Streaming`; else nothing is recorded);
- :class:`Streaming`: the response body passes through the tap (as it arrives; a
  whole-body framing is read when it ends);
- :class:`HeldWhole`: content filters may block the output and the body is not
  streamed: mitmproxy holds it whole and it is checked before the client gets it.

Ended is no state object: ``response`` or ``error`` takes the flow out of the table,
writes its record and releases its auditor.
"""

from __future__ import annotations

from dataclasses import dataclass

from addon.auditor import StreamAuditor
from addon.dialects import Dialect, Normalizer, RequestSummary, RequestView
from addon.filters.engine import FilterSet
from addon.record import ExchangeRecord
from addon.turns import Turns


@dataclass(slots=True, frozen=True)
class OutputCheck:
    """Content filters check this exchange's output: the filter set in force when the
    request came, and the request as its dialect read it (a blocked or filtered answer
    is made from it)."""

    filters: FilterSet
    dialect: Dialect
    summary: RequestSummary
    view: RequestView


@dataclass(slots=True)
class Recording:
    """The request was recognised and its record opened; the response has not begun."""

    record: ExchangeRecord
    normalizer: Normalizer
    output: OutputCheck | None = None  # set when content filters check the output
    turns: Turns | None = None  # a long-lived stream: its records, one per turn


@dataclass(slots=True, frozen=True)
class AnsweredByProxy:
    """A request filter blocked the request; ``flow.response`` is the proxy's answer."""

    record: ExchangeRecord


@dataclass(slots=True, frozen=True)
class Sniffing:
    """An event stream the request did not reveal as inference traffic: the tap reads
    its first event, and a dialect that claims it turns the flow into
    :class:`Streaming`. Nothing is kept until then."""


@dataclass(slots=True, frozen=True)
class Streaming:
    """The body flows through the tap to the client and the auditor."""

    record: ExchangeRecord
    auditor: StreamAuditor
    copy: BodyCopy | None  # None when llm_audit_view_bytes is 0
    turns: Turns | None = None  # a long-lived stream: ``record`` is its first turn's, ``turns.record`` the current


@dataclass(slots=True, frozen=True)
class HeldWhole:
    """The body is held whole by mitmproxy and checked in the ``response`` hook, before
    the client gets any of it (a blocked one is replaced with the proxy's answer)."""

    record: ExchangeRecord
    auditor: StreamAuditor
    normalizer: Normalizer
    output: OutputCheck


FlowState = Recording | AnsweredByProxy | Sniffing | Streaming | HeldWhole
Recorded = Recording | AnsweredByProxy | Streaming | HeldWhole  # the states with a record


class BodyCopy:
    """A copy of the streamed body a client received, handed to mitmproxy when the body
    ends: mitmproxy keeps no body of a streamed response, and its content views need one.

    A stream longer than ``limit`` bytes is not kept at all (``data`` becomes ``None``):
    a cut copy would show a transcript that ends where the stream did not.
    """

    __slots__ = ("data", "limit")

    def __init__(self, limit: int) -> None:
        self.data: bytearray | None = bytearray()
        self.limit = limit

    def add(self, chunk: bytes) -> None:
        if self.data is None:
            return
        if len(self.data) + len(chunk) > self.limit:
            self.data = None
        else:
            self.data += chunk
