"""Budgets: spending and token limits over a UTC calendar day or month, checked before
a request goes upstream, from totals kept in memory.

A budget rule (``kind = "budget"`` in the rules file, parsed by :mod:`addon.filters.rules`)
limits what the exchanges in its scope used in the current period: US dollars
(``cost_usd``) or tokens (input, output or both), counted per user, per API key
fingerprint, per requested model, or for all of them together. A request whose subject
has reached the limit is blocked (or flagged) with a verdict that names the budget and
the figures.

The request hook must not touch the database, so :class:`BudgetBook` keeps the totals:

- ``snapshot``: what the audit database held at the last refresh (a thread reads it:
  :mod:`addon.mitm.budgets`, :mod:`storage.spend`), leaving out this proxy's own records since the book's
  ``epoch``;
- ``local``: what this proxy itself recorded since the ``epoch``, added as each final
  record is handed to the writer. A burst through one proxy is seen at once, and
  nothing is counted twice: the database part leaves out exactly the records the local
  part holds (this proxy instance's rows that started at or after the epoch).

A check is a dictionary lookup per budget. Periods are calendar periods in UTC (the time
zone of every time in the database, and of ``exchange_view.day``): a day budget starts
again at 00:00 UTC, a month budget on the 1st at 00:00 UTC. An exchange counts in the
period in which it *started*.

Sans-IO: the refresh thread hands in snapshots (:meth:`BudgetBook.refreshed`,
:meth:`BudgetBook.refresh_failed`), the proxy hands in final rows
(:meth:`BudgetBook.add`) and asks :meth:`BudgetBook.check`.
"""

from __future__ import annotations

import re
import time
import unicodedata
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from fnmatch import translate
from typing import Any, Literal, Protocol

from addon.filters.api import BLOCK, FILTER_ERROR, FLAG, Verdict

PERIODS = ("day", "month")
PER = ("user", "key", "model", "all")
METERS = ("usd", "input", "output", "total")
BUDGET_FILTER = "budget"  # the ``filter`` of every verdict a budget gives
SUBJECT_CHARS = 255  # of a user id or model name: the database's columns keep this many
STALE_AFTER_MIN = 15.0  # seconds: totals older than this (and 3 refreshes) cannot be trusted
UNPRICED_NOTES_MAX = 100  # models of unknown cost named in a line each; then one line for the rest
MODEL_IN_NOTE = 100  # characters of a model name in such a line
PENDING_MAX = 10_000  # rows waiting for their cost (BudgetBook.pending); beyond, counted unpriced

Period = Literal["day", "month"]


@dataclass(frozen=True, slots=True)
class Budget:
    """One budget rule: what it counts, over which period, for whom, and the limit."""

    id: str
    action: Literal["block", "flag"]
    period: Period
    per: str  # user | key | model | all
    meter: str  # usd | input | output | total
    limit: float
    providers: tuple[str, ...] = ()  # glob patterns; empty: any
    models: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    reason: str = ""
    _patterns: tuple[re.Pattern[str] | None, ...] = field(default=(None, None, None), compare=False, repr=False)

    def __post_init__(self) -> None:
        compiled = (
            _globs(tuple(_fold(p) for p in self.providers)),
            _globs(tuple(_fold(p) for p in self.models)),
            _globs(self.users),
        )
        object.__setattr__(self, "_patterns", compiled)

    def applies(self, provider: str | None, model: str | None, user: str | None) -> bool:
        """Whether an exchange of this provider, requested model and user is in scope
        (a pattern list never matches a missing value). Providers and models compare
        folded (:func:`fold`), user ids as they are."""
        values = (fold(provider), fold(model), None if user is None else user[:SUBJECT_CHARS])
        for pattern, value in zip(self._patterns, values):
            if pattern is not None and (value is None or pattern.fullmatch(value) is None):
                return False
        return True

    def subject(self, user: str | None, key: str | None, model: str | None) -> str | None:
        """Whose total an exchange counts in: the user, the key fingerprint, the model
        (folded), or ``""`` for all. ``None``: it has none (no user id), so this budget does
        not count it. Each as the database keeps it (its first :data:`SUBJECT_CHARS`
        characters), so that the totals read back after a restart are the same subject's."""
        match self.per:
            case "user":
                return None if user is None else user[:SUBJECT_CHARS]
            case "key":
                return key
            case "model":
                return fold(model)
        return ""

    def describe_limit(self) -> str:
        return _amount(self.meter, self.limit)


def fold(name: str | None) -> str | None:
    """A provider or model name as budgets compare it: its first :data:`SUBJECT_CHARS`
    characters (what the database keeps), NFKC-normalized, without surrounding blanks, in
    case-folded form. The name is the client's: ``GPT-4o``, ``gpt-4o `` or a full-width
    ``ｇｐｔ-4o`` that an upstream takes as ``gpt-4o`` must not fall outside a budget's
    ``models`` or count as a subject of its own (counting them together errs on the
    side of the limit)."""
    return None if name is None else _fold(name)


def _fold(name: str) -> str:
    return unicodedata.normalize("NFKC", name[:SUBJECT_CHARS]).strip().casefold()


def _globs(patterns: tuple[str, ...]) -> re.Pattern[str] | None:
    """Shell-style patterns (``gpt-4o*``) as one regular expression."""
    return re.compile("|".join(f"(?:{translate(p)})" for p in patterns)) if patterns else None


@dataclass(slots=True)
class Totals:
    """What a subject used in a period: tokens, dollars, and what could not be counted."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    exchanges: int = 0
    unpriced: int = 0  # exchanges whose cost is unknown (NULL cost_usd): counted as $0
    no_usage: int = 0  # exchanges the upstream reported no token counts for: counted as 0 tokens

    def add(self, other: Totals) -> None:
        """Add ``other``'s figures, writing only the fields it adds to: the budgets' thread
        adds the costs of this proxy's rows to the same totals the event loop adds their
        tokens to (:meth:`BudgetBook.price_pending`), and ``x += 0`` from one thread would
        write back a value the other has just replaced."""
        for name in _TOTALS_FIELDS:
            if value := getattr(other, name):
                setattr(self, name, getattr(self, name) + value)

    def value(self, meter: str) -> float:
        match meter:
            case "usd":
                return self.cost_usd
            case "input":
                return self.input_tokens
            case "output":
                return self.output_tokens
        return self.input_tokens + self.output_tokens

    @classmethod
    def of_row(cls, row: Mapping[str, Any]) -> Totals:
        """One final exchange row's contribution. A negative count (the upstream's bytes)
        adds nothing, as in the database's totals (:func:`storage.query.token_sum`): it
        would take from the total, and a reply could reopen a budget it spent."""
        inp, out, cost = row.get("input_tokens"), row.get("output_tokens"), row.get("cost_usd")
        return cls(
            max(inp or 0, 0),
            max(out or 0, 0),
            float(cost or 0),
            1,
            1 if cost is None else 0,
            1 if inp is None and out is None else 0,
        )


_TOTALS_FIELDS = ("input_tokens", "output_tokens", "cost_usd", "exchanges", "unpriced", "no_usage")


class Spend(Protocol):
    """What the exchanges of one combination of the columns budgets group by used, as the
    database query returns it (:class:`storage.spend.Spend`)."""

    @property
    def user_id(self) -> str | None: ...
    @property
    def api_key_fingerprint(self) -> str | None: ...
    @property
    def request_model(self) -> str | None: ...
    @property
    def provider(self) -> str | None: ...
    @property
    def input_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def cost_usd(self) -> float: ...
    @property
    def exchanges(self) -> int: ...
    @property
    def unpriced(self) -> int: ...
    @property
    def no_usage(self) -> int: ...


def period_key(period: str, t: datetime) -> str:
    """The calendar period (UTC) of ``t``: ``2026-12-02`` for a day, ``2026-12`` for a month."""
    t = t.astimezone(UTC)
    return f"{t:%Y-%m-%d}" if period == "day" else f"{t:%Y-%m}"


def period_start(period: str, t: datetime) -> datetime:
    """The start of the calendar period (UTC) ``t`` is in."""
    t = t.astimezone(UTC)
    day = t.replace(hour=0, minute=0, second=0, microsecond=0)
    return day if period == "day" else day.replace(day=1)


def period_end(period: str, t: datetime) -> datetime:
    """The start of the next period (the end of ``t``'s, exclusive)."""
    start = period_start(period, t)
    if period == "day":
        return start + timedelta(days=1)
    return (start + timedelta(days=32)).replace(day=1)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Totals read from the database at ``read_at``, per budget and subject, for the
    periods named in ``keys`` (period -> key); made on the refresh thread."""

    keys: dict[str, str]
    totals: dict[tuple[str, str], Totals]
    read_at: float  # time.monotonic() of the read


def build_snapshot(
    budgets: Iterable[Budget], today: Iterable[Spend], earlier: Iterable[Spend], now: datetime, read_at: float
) -> Snapshot:
    """Sum the database's combinations into each budget's subjects: ``today`` counts for
    day and month budgets, ``earlier`` (this month before today) for month budgets."""
    budgets = list(budgets)
    totals: dict[tuple[str, str], Totals] = {}
    for rows, periods in ((today, ("day", "month")), (earlier, ("month",))):
        for row in rows:
            spent = Totals(row.input_tokens, row.output_tokens, row.cost_usd, row.exchanges, row.unpriced, row.no_usage)
            for b in budgets:
                if b.period not in periods or not b.applies(row.provider, row.request_model, row.user_id):
                    continue
                subject = b.subject(row.user_id, row.api_key_fingerprint, row.request_model)
                if subject is not None:
                    totals.setdefault((b.id, subject), Totals()).add(spent)
    return Snapshot({p: period_key(p, now) for p in PERIODS}, totals, read_at)


class BudgetBook:
    """The budgets in force and their totals: the database's, refreshed by a thread, and
    this proxy's own since ``epoch``.

    The event loop calls :meth:`add` and :meth:`check`; the refresh thread only replaces
    the snapshot (one reference, swapped whole), so no lock is needed.
    """

    def __init__(
        self,
        budgets: Iterable[Budget],
        *,
        instance: str | None,
        failure: Literal["open", "closed"],
        refresh_seconds: float,
        epoch: datetime | None = None,
        clock: Any = time.monotonic,
    ) -> None:
        self.budgets = list(budgets)
        self.instance = instance  # the proxy_instance of this proxy's own rows
        self.failure = failure
        self.refresh_seconds = refresh_seconds
        self.epoch = (epoch or datetime.now(UTC)).astimezone(UTC)
        self._clock = clock
        self.snapshot: Snapshot | None = None
        self.error: str | None = None  # why the last refresh failed; None after a good one
        self.local: dict[tuple[str, str, str], Totals] = {}  # (budget, period key, subject)
        self.unpriced_models: set[tuple[str, str | None]] = set()  # (budget, model) reported once
        self._newest = self.epoch  # the start of the newest record added, and its periods' keys
        self._newest_keys: set[str] | None = None
        # Prices a row (US dollars, None when unknown), on the refresh thread; the rows
        # waiting for it, and who to wake. Only that thread adds costs to local totals,
        # only the event loop tokens: no field is written by both.
        self.pricer: Callable[[Mapping[str, Any]], float | None] | None = None
        self.pending: deque[tuple[list[tuple[str, Totals]], Mapping[str, Any]]] = deque()
        self.on_pending: Callable[[], None] | None = None
        self.periods = sorted({b.period for b in self.budgets})
        self.created = clock()

    @property
    def stale_after(self) -> float:
        return max(STALE_AFTER_MIN, 3 * self.refresh_seconds)

    # -- from the refresh thread ------------------------------------------------------

    def refreshed(self, snapshot: Snapshot) -> None:
        self.snapshot, self.error = snapshot, None

    def refresh_failed(self, error: str) -> None:
        self.error = error

    # -- from the event loop ------------------------------------------------------------

    def add(self, row: Mapping[str, Any]) -> None:
        """Count a final exchange row this proxy hands to the writer (open rows, and rows
        that started before the epoch, are the database's to count).

        The writer prices a row on its own thread, so a row comes here without its cost:
        with a ``pricer`` its cost is added by :meth:`price_pending` (the refresh thread,
        woken by ``on_pending``), its tokens at once; without one it counts as unpriced.
        """
        started = row.get("started_at")
        if row.get("status") == "in_progress" or not isinstance(started, datetime) or started < self.epoch:
            return
        self._forget_past_periods(started)
        contribution = Totals.of_row(row)
        later = self.pricer is not None and row.get("cost_usd") is None
        if later:
            contribution.unpriced = 0  # (until priced)
        user, key, model = row.get("user_id"), row.get("api_key_fingerprint"), row.get("request_model")
        to_price: list[tuple[str, Totals]] = []
        for b in self.budgets:
            if not b.applies(row.get("provider"), model, user):
                continue
            subject = b.subject(user, key, model)
            if subject is None:
                continue
            totals = self.local.setdefault((b.id, period_key(b.period, started), subject), Totals())
            totals.add(contribution)
            if b.meter == "usd" and later:
                to_price.append((b.id, totals))
        if to_price and len(self.pending) >= PENDING_MAX:
            # the budgets' thread is not pricing (a database read that hangs): counted as
            # an unknown cost, which the refusal says, rather than memory without end
            for _, totals in to_price:
                totals.unpriced += 1
        elif to_price:
            self.pending.append((to_price, row))
            if self.on_pending is not None:
                self.on_pending()

    def _forget_past_periods(self, started: datetime) -> None:
        """Drop the local totals of periods before the newest record's: no check reads
        them again, and kept they would grow with every period (and with every user id a
        client makes up). A record that started before is never newer than the clock."""
        keys = {period_key(p, started) for p in self.periods}
        if self._newest_keys is None or (started >= self._newest and keys != self._newest_keys):
            if self._newest_keys is not None:
                self.local = {k: v for k, v in self.local.items() if k[1] in keys}
            self._newest, self._newest_keys = started, keys

    def price_pending(self) -> list[str]:
        """Price the rows :meth:`add` left without a cost (on the refresh thread: a first
        lookup of a model takes milliseconds) and add their cost. Returns the lines to
        log: a USD budget's first exchange of a model whose cost is unknown."""
        notes = []
        while self.pending and self.pricer is not None:
            targets, row = self.pending.popleft()
            usd = self.pricer(row)
            for budget_id, totals in targets:
                if usd is not None:
                    totals.cost_usd += usd
                    continue
                totals.unpriced += 1
                model = row.get("request_model")
                model = model[:MODEL_IN_NOTE] if isinstance(model, str) else None
                if (budget_id, model) in self.unpriced_models or len(self.unpriced_models) > UNPRICED_NOTES_MAX:
                    continue
                self.unpriced_models.add((budget_id, model))
                if len(self.unpriced_models) > UNPRICED_NOTES_MAX:  # model names are the client's: a bound
                    notes.append(
                        f"budget {budget_id!r}: more models of unknown cost, not named one by one; their "
                        "exchanges count as $0 too"
                    )
                    continue
                notes.append(
                    f"budget {budget_id!r}: the cost of {model or 'an unnamed model'!r} is unknown; its "
                    "exchanges count as $0 (give its price in a price file: llm_audit_prices)"
                )
        return notes

    def total(self, budget: Budget, subject: str, now: datetime) -> Totals:
        """What ``subject`` used in ``budget``'s current period: database plus local."""
        key = period_key(budget.period, now)
        result = Totals()
        snap = self.snapshot
        if snap is not None and snap.keys.get(budget.period) == key:
            if (found := snap.totals.get((budget.id, subject))) is not None:
                result.add(found)
        if (mine := self.local.get((budget.id, key, subject))) is not None:
            result.add(mine)
        return result

    def check(
        self,
        provider: str | None,
        model: str | None,
        user: str | None,
        key: str | None,
        now: datetime | None = None,
    ) -> list[Verdict]:
        """The verdicts about a new request: a budget whose subject has reached its limit,
        and, when the database's totals cannot be trusted, the failure policy's verdict."""
        now = now or datetime.now(UTC)
        verdicts: list[Verdict] = []
        applicable = [b for b in self.budgets if b.applies(provider, model, user)]
        if not applicable:
            return verdicts
        problem = self.unavailable()
        if problem is not None:
            names = ", ".join(repr(b.id) for b in applicable)
            action = BLOCK if self.failure == "closed" else FLAG
            reason = f"budget {names} cannot be checked: {problem}"
            verdicts.append(Verdict(action, FILTER_ERROR, reason[:300], filter=BUDGET_FILTER, location="request"))
        for b in applicable:
            subject = b.subject(user, key, model)
            if subject is None:
                continue
            used = self.total(b, subject, now)
            if used.value(b.meter) >= b.limit:
                verdicts.append(
                    Verdict(
                        b.action, b.id, self.reason(b, subject, used, now), filter=BUDGET_FILTER, location="request"
                    )
                )
        return verdicts

    def age(self) -> float:
        """Seconds since the book was made."""
        return self._clock() - self.created

    def unavailable(self) -> str | None:
        """Why the database's totals cannot be trusted now, or ``None``."""
        snap = self.snapshot
        if snap is None:
            return f"the totals were not read yet ({self.error})" if self.error else "the totals were not read yet"
        age = self._clock() - snap.read_at
        if age > self.stale_after:
            return f"the totals are {age:.0f} s old ({self.error or 'no refresh'})"
        return None

    def reason(self, budget: Budget, subject: str, used: Totals, now: datetime) -> str:
        """The verdict's reason: the budget, whose total, the figures and the period."""
        who = {"user": f"user {subject!r}", "key": f"key {subject}", "model": f"model {subject!r}"}.get(
            budget.per, "all exchanges"
        )
        when = f"{'today' if budget.period == 'day' else 'this month'} ({period_key(budget.period, now)} UTC)"
        value = used.value(budget.meter)
        amount = _amount("usd", value) if budget.meter == "usd" else f"{int(value):,}"
        figures = f"{who} used {amount} of {budget.describe_limit()} {when}"
        if budget.meter == "usd" and used.unpriced:
            figures += f"; {used.unpriced} exchanges without a known cost counted as $0"
        elif budget.meter != "usd" and used.no_usage:
            figures += f"; {used.no_usage} exchanges without token counts counted as 0"
        head = budget.reason or f"budget {budget.id!r} reached"
        return f"{head}: {figures}"[:300]


def _amount(meter: str, value: float) -> str:
    if meter == "usd":
        return f"${value:,.2f}"
    return f"{int(value):,} {'total' if meter == 'total' else meter} tokens"
