"""The filters of one proxy put together: the rules file's rules and user filters.

:class:`FilterSet` checks requests; its :meth:`FilterSet.output_guard` gives one
:class:`OutputGuard` per exchange, which checks output as it streams and says what may
be released to the client now. Both are sans-IO: the proxy feeds them and acts on their
answers (forwards or drops the request; emits the released text; ends a blocked stream
with its dialect's error).

User filters are the user's code running on the proxy's event loop. A call that raises,
returns something other than a :class:`Verdict` or ``None``, or takes longer than
``time_budget`` gives a ``filter_error`` verdict, and the filter is not called again for
the rest of that exchange (a call cannot be interrupted, only measured). What the
verdict does is the ``failure`` policy:

- ``"open"``: the verdict is a flag: recorded, and the traffic goes on without that
  filter's check. Availability first: a broken filter never breaks the service, but
  while it is broken, what it should catch passes.
- ``"closed"``: the verdict blocks the exchange. Safety first: nothing passes unchecked,
  and a broken filter stops all traffic it sees.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from itertools import islice
from typing import Any, Literal

from addon.filters.api import (
    ALLOW,
    BLOCK,
    FILTER_ERROR,
    FLAG,
    Filter,
    OutputPiece,
    RequestContext,
    TextSoFar,
    Verdict,
)
from addon.filters.detectors import Hit, Matcher
from addon.filters.normalize import Folded, fold
from addon.filters.rules import Rule
from addon.filters.window import MAX_HITS_PER_RULE, StreamScanner, gate_set

Failure = Literal["open", "closed"]
DEFAULT_TIME_BUDGET = 0.005  # seconds a user filter may take per call
#: The longest piece of output a user filter is handed in one call (:meth:`OutputGuard._user_pieces`).
USER_PIECE = 64 * 1024

StreamKey = tuple[int, str, str | None]  # (choice, kind, tool_key)
# The most streams one exchange's output is checked as: choices times kinds of text, and
# two per tool call (the record keeps 128 choices and 4096 calls, addon.record).
MAX_STREAMS = 4096


@dataclass(frozen=True, slots=True)
class Release:
    """What a piece of output allows: ``text`` to send to the client now, and verdicts."""

    text: str = ""
    verdicts: tuple[Verdict, ...] = ()


_WARM_UP = "Ordinary text, 1 2 3: the first search of a pattern builds its automaton."


class FilterSet:
    """The built-in rules and user filters one proxy runs, and how failures count."""

    def __init__(
        self,
        rules: Sequence[Rule] = (),
        filters: Sequence[Filter] = (),
        *,
        failure: Failure,
        time_budget: float = DEFAULT_TIME_BUDGET,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if failure not in ("open", "closed"):
            raise ValueError(f"failure must be 'open' or 'closed', not {failure!r}")
        self.request_rules = [r for r in rules if r.on_request]
        self.response_rules = [r for r in rules if r.on_response]
        self._request_gates = _gate_sets(self.request_rules)
        # The streams' combined searches are compiled, and RE2 builds the start of their
        # automata, here where the rules are loaded, not in the first stream that needs
        # them: for a hundred rules that is about a third of a second the event loop
        # would otherwise stall in the middle of traffic.
        StreamScanner(self.response_rules).feed(_WARM_UP)
        self.filters = [(f.name, f) for f in filters]
        self.failure = failure
        self.time_budget = time_budget
        self._clock = clock
        self.filter_hold = max((f.window for f in filters), default=0)

    @property
    def checks_output(self) -> bool:
        """Whether output needs an :class:`OutputGuard` at all."""
        return bool(self.response_rules or self.filters)

    @property
    def may_block_output(self) -> bool:
        """Whether output can be blocked: then streams are held back and may be cut.

        Flag-only rules never block, so with nothing else the output is checked as it
        passes and the client's bytes are not touched. A user filter may block (and, with
        ``failure="closed"``, so does one that fails).
        """
        return bool(self.filters) or any(r.action == BLOCK for r in self.response_rules)

    @property
    def hold(self) -> int:
        """The most characters a stream holds back.

        0 means every piece is released as soon as it is checked, so the proxy can
        forward the upstream's events unchanged.
        """
        holds = [r.hold(m) for r in self.response_rules for m in r.matchers]
        return max([self.filter_hold, *holds])

    def check_request(self, ctx: RequestContext) -> list[Verdict]:
        """Every verdict about a request; the proxy blocks it if any is ``block``."""
        return self.check_request_rules(ctx) + self.check_request_filters(ctx)

    def check_request_rules(self, ctx: RequestContext) -> list[Verdict]:
        """The rules' verdicts about a request, and the failure policy's on text no check
        can read. Thread-safe (RE2 and pure Python over the context), so the proxy finds
        a large request's off the event loop; the user filters' come from
        :meth:`check_request_filters`, on the event loop, where every other call of a
        user filter is made."""
        verdicts: list[Verdict] = []
        if ctx.unreadable and (self.request_rules or self.filters):
            # Text the model reads and no check can: the failure policy decides, as for a
            # filter that could not run.
            blocking = self.filters or any(r.action == BLOCK for r in self.request_rules)
            verdict = self._error("llm-audit", f"cannot be checked: {', '.join(ctx.unreadable)}", "request")
            verdicts.append(verdict if blocking else replace(verdict, action=FLAG))
        gates = _RequestGates(self._request_gates, [m.text for m in ctx.messages])
        for rule in self.request_rules:
            hits = gates.hits(rule)
            if ctx.declared is not None and rule.kind == "pii":  # (a tool's sample address is the application's)
                hits = ((i, hit) for i, hit in hits if i != ctx.declared)
            limit = 1 if rule.action == BLOCK else MAX_HITS_PER_RULE  # one hit is enough to block
            verdicts.extend(rule.verdict(hit, hit.start, f"messages[{i}]") for i, hit in islice(hits, limit))
        return verdicts

    def check_request_filters(self, ctx: RequestContext) -> list[Verdict]:
        """The user filters' verdicts about a request (see :meth:`check_request_rules`)."""
        verdicts: list[Verdict] = []
        for name, f in self.filters:
            found, _ = self.call(name, partial(f.check_request, ctx), "request")
            verdicts.extend(found)
        return verdicts

    def output_guard(self) -> OutputGuard:
        """A guard for the output of one exchange."""
        return OutputGuard(self)

    def call(self, name: str, check: Callable[[], object], location: str) -> tuple[list[Verdict], bool]:
        """Run one user filter check: its verdicts, and whether the filter failed."""
        start = self._clock()
        try:
            result = check()
            if result is not None and not isinstance(result, Verdict):
                raise TypeError(f"returned {type(result).__name__}, not a Verdict or None")
        except Exception as e:  # noqa: BLE001 - any failure of user code is a verdict
            return [self._error(name, f"{type(e).__name__}: {e}", location)], True
        elapsed = self._clock() - start
        verdicts = []
        if result is not None and result.action != ALLOW:
            verdicts.append(replace(result, filter=name, location=result.location or location))
        if elapsed > self.time_budget:
            reason = f"took {elapsed * 1000:.1f} ms, over the {self.time_budget * 1000:g} ms budget"
            verdicts.append(self._error(name, reason, location))
            return verdicts, True
        return verdicts, False

    def _error(self, name: str, reason: str, location: str) -> Verdict:
        action = FLAG if self.failure == "open" else BLOCK
        return Verdict(action, FILTER_ERROR, " ".join(reason.split())[:300], filter=name, location=location)


class _Stream:
    __slots__ = ("key", "location", "scanner", "so_far")

    def __init__(self, key: StreamKey, fs: FilterSet) -> None:
        choice, kind, tool_key = key
        self.key = key
        if kind in ("tool_arguments", "tool_name"):
            self.location = f"output.tool_calls[{tool_key}].{'arguments' if kind == 'tool_arguments' else 'name'}"
        elif kind == "error":
            self.location = "output.error.message"
        else:
            self.location = f"output.choices[{choice}].{kind}"
        self.scanner = StreamScanner(fs.response_rules, extra_hold=fs.filter_hold, location=self.location)
        self.so_far = TextSoFar() if fs.filters else None


GateSets = dict[str, tuple[dict[Matcher, int], Any]]
"""Per view: each matcher's entry in its gate set, and the set (None: run every matcher)."""


def _gate_sets(rules: Sequence[Rule]) -> GateSets:
    """The RE2 sets of the request rules' gates, one per view the rules read."""
    by_view: dict[str, dict[Matcher, int]] = {}
    for rule in rules:
        entries = by_view.setdefault(rule.view, {})
        for m in rule.matchers:
            entries.setdefault(m, len(entries))
    return {view: (entries, gate_set(list(entries)) if len(entries) > 1 else None) for view, entries in by_view.items()}


class _RequestGates:
    """The messages of one request, each seen once through each view and searched once
    for all the rules' gates (what every match of a matcher contains: the ``@`` of an
    address, a keyword): a rule runs its own search only on the messages whose gates it
    opens, and there only for the matchers whose gates opened. With a hundred rules an
    ordinary prompt costs one set search per view instead of a search per rule (the
    stream's check does the same, :mod:`addon.filters.window`), and a request of many
    messages costs a set search per message, not a step per message and rule (1,850
    tiny messages under the benchmark's 98 request rules: 130 ms before). The hits are
    the same as every matcher's own search would give, in the same order: a message
    without a matcher's gate has no match of it.
    """

    def __init__(self, sets: GateSets, texts: list[str]) -> None:
        self._sets = sets
        self._texts = texts
        self._views: dict[str, tuple[list[Folded], dict[int, set[int]] | None]] = {}

    def hits(self, rule: Rule) -> Iterator[tuple[int, Hit]]:
        """``(i, hit)`` for every hit of ``rule.find(texts[i])``, by message, then as the rule finds them."""
        folded, opened = self._view(rule.view)
        if opened is None:  # (no set: the view has one matcher, whose own search decides)
            for i, text in enumerate(folded):
                yield from ((i, hit) for hit in rule.find_folded(text, rule.matchers))
            return
        entries = self._sets[rule.view][0]
        wanted = {entries[m] for m in rule.matchers}
        for i in sorted(i for i, gates in opened.items() if not wanted.isdisjoint(gates)):
            matchers = [m for m in rule.matchers if entries[m] in opened[i]]
            yield from ((i, hit) for hit in rule.find_folded(folded[i], matchers))

    def _view(self, view: str) -> tuple[list[Folded], dict[int, set[int]] | None]:
        """Every message seen through ``view``, and the gates each opens (by message index;
        only messages that open any), once per view."""
        seen = self._views.get(view)
        if seen is None:
            gates = self._sets[view][1]
            folded = [fold(text, view) for text in self._texts]
            opened = None
            if gates is not None:
                opened = {i: set(found) for i, (text, _) in enumerate(folded) if (found := gates.Match(text))}
            seen = self._views[view] = (folded, opened)
        return seen


class OutputGuard:
    """Checks one exchange's output, stream by stream, and says what may be released.

    A stream is one choice's ``text``, ``reasoning`` or ``refusal``, one tool call's
    arguments or name (``kind="tool_arguments"`` / ``"tool_name"`` with its ``tool_key``),
    the upstream's error message (``kind="error"``) or a final text that disagrees with
    the deltas (``kind="final_text"``). Feed each piece as it
    arrives and send only the released text; call :meth:`flush` when a stream ends (a
    content block closes, a tool call completes) or :meth:`flush_all` at the end of the
    response. Once :attr:`blocked` is set, nothing more is released anywhere: the proxy
    ends the response.
    """

    def __init__(self, fs: FilterSet) -> None:
        self._fs = fs
        self._streams: dict[StreamKey, _Stream] = {}
        self._failed: set[int] = set()  # filters (by index) that failed in this exchange
        self.blocked: Verdict | None = None

    @property
    def may_block(self) -> bool:
        """Whether any of its filters can block; else it only records verdicts (flags)."""
        return self._fs.may_block_output

    @property
    def asks_user_filters(self) -> bool:
        """Whether checking may call user filters (their code runs only on the event
        loop); without them a check is the rules' alone, which any thread may run."""
        return bool(self._fs.filters)

    def feed(self, text: str, *, choice: int = 0, kind: str = "text", tool_key: str | None = None) -> Release:
        """A new piece of one stream: what may be released now, and the verdicts."""
        if self.blocked is not None or not text:
            return Release()
        stream = self._stream((choice, kind, tool_key))
        verdicts = self._user_pieces(stream, stream.so_far, text) if stream.so_far is not None else []
        if self.blocked is None:
            released, found = stream.scanner.feed(text)
            verdicts.extend(found)
            self.blocked = stream.scanner.blocked
            if self.blocked is None:
                return Release(released, tuple(verdicts))
        return Release("", tuple(verdicts))

    def flush(self, *, choice: int = 0, kind: str = "text", tool_key: str | None = None) -> Release:
        """The end of a stream: a last check, then the rest of its text."""
        stream = self._streams.get((choice, kind, tool_key))
        if self.blocked is not None or stream is None:
            return Release()
        verdicts = self._run_filters(stream, "", final=True)
        if self.blocked is None:
            released, found = stream.scanner.flush()
            verdicts.extend(found)
            self.blocked = stream.scanner.blocked
            if self.blocked is None:
                return Release(released, tuple(verdicts))
        return Release("", tuple(verdicts))

    def flush_all(self, going_on: Collection[int] = ()) -> dict[StreamKey, Release]:
        """The end of the response: :meth:`flush` every stream seen, by its key, but those
        of the choices ``going_on`` (answers still in progress beside the one that ended,
        :class:`~addon.events.TurnEnd`): their text is not at its end."""
        return {
            key: self.flush(choice=key[0], kind=key[1], tool_key=key[2])
            for key in list(self._streams)
            if key[0] not in going_on
        }

    def let_go(self, key: StreamKey) -> Release:
        """Release what stream ``key`` holds, still reading it as one text (:meth:`StreamScanner.let_go`):
        the verdicts of a match the break completes."""
        stream = self._streams.get(key)
        if stream is None or self.blocked is not None:
            return Release()
        verdicts = stream.scanner.let_go()
        self.blocked = stream.scanner.blocked
        return Release("", tuple(verdicts))

    def forget(self, going_on: Collection[int] = ()) -> None:
        """A turn is over and its streams flushed: the next turn's streams start afresh
        (on a stream of turns one guard lasts for the whole body). The streams of the
        choices ``going_on`` (answers still in progress, :meth:`flush_all`) are kept, with
        their held text and everything their checks know."""
        if going_on:
            self._streams = {key: s for key, s in self._streams.items() if key[0] in going_on}
        else:
            self._streams.clear()

    def takes(self, key: StreamKey) -> bool:
        """Whether a piece of stream ``key`` can be checked: a stream seen, or room for a
        new one (:data:`MAX_STREAMS`: each holds a scanner, and an upstream names them)."""
        return key in self._streams or len(self._streams) < MAX_STREAMS

    def progress(self, key: StreamKey) -> tuple[int, int]:
        """How many characters of a stream were fed, and how many released."""
        stream = self._streams.get(key)
        return (stream.scanner.length, stream.scanner.released) if stream is not None else (0, 0)

    def released(self, key: StreamKey) -> int:
        """How many characters of a stream were released: :meth:`progress`'s second half,
        asked for every held event before it goes (no tuple made for it)."""
        stream = self._streams.get(key)
        return stream.scanner.released if stream is not None else 0

    def _stream(self, key: StreamKey) -> _Stream:
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = _Stream(key, self._fs)
        return stream

    def _user_pieces(self, stream: _Stream, so_far: TextSoFar, text: str) -> list[Verdict]:
        """User filters' verdicts on a new piece, handed to them in slices of at most
        :data:`USER_PIECE` characters: their time budget is per call, and one string of
        megabytes (a model's one long answer, read whole) would be one call, over budget
        for a filter that keeps within it on a stream of the same text."""
        if len(text) <= USER_PIECE:
            so_far.append(text)
            return self._run_filters(stream, text, final=False)
        verdicts: list[Verdict] = []
        for start in range(0, len(text), USER_PIECE):
            piece = text[start : start + USER_PIECE]
            so_far.append(piece)
            verdicts += self._run_filters(stream, piece, final=False)
            if self.blocked is not None:
                break
        return verdicts

    def _run_filters(self, stream: _Stream, text: str, final: bool) -> list[Verdict]:
        verdicts: list[Verdict] = []
        if stream.so_far is None:
            return verdicts
        choice, kind, tool_key = stream.key
        piece = OutputPiece(choice, kind, text, stream.so_far.length, tool_key, final, stream.so_far)  # type: ignore[arg-type]
        for i, (name, f) in enumerate(self._fs.filters):
            if i in self._failed:
                continue
            found, failed = self._fs.call(name, partial(f.check_output, piece), stream.location)
            if failed:
                self._failed.add(i)
            verdicts.extend(found)
        self.blocked = next((v for v in verdicts if v.action == BLOCK), None)
        return verdicts
