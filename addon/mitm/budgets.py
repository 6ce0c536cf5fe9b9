"""Budgets in the proxy: the books in force, and the thread that keeps their totals
current from the audit database.

Budgets (:mod:`addon.filters.budgets`) are checked on the event loop against totals in
memory; :class:`SpendRefresher` reads the database's totals (:func:`storage.spend.read_spend`)
on a thread of its own, so no request ever waits for a query, and hands each snapshot to
the book in force. :class:`BudgetKeeper` owns the books: a new one (a new epoch, nothing
counted locally yet) when the budgets or the audit writer change, which replaces the one
in force once its totals are read, and until then is fed the same records; at start the
first read is made before traffic (as the database is opened: :mod:`addon.mitm.store`).
What is read per refresh:

- today (00:00 UTC until the day's end), at every refresh;
- this month before today, for month budgets, only every :data:`EARLIER_REFRESH` seconds
  (those days hardly change: an exchange that started late yesterday and ended today, a
  spool replayed, another proxy's late rows), so a refresh reads one day's rows, not a
  month's.

Several proxies sharing a PostgreSQL database see each other's use at the next refresh;
each proxy sees its own at once (the book's ``local`` part).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from addon.filters.api import BLOCK, FILTER_ERROR, FLAG, Verdict
from addon.filters.budgets import BUDGET_FILTER, Budget, BudgetBook, build_snapshot, period_end, period_start
from addon.mitm.store import AuditStore
from addon.record import ExchangeRecord
from storage.cost import COLUMNS as COST_COLUMNS
from storage.cost import cost_of
from storage.database import first_line
from storage.spend import Spend, read_spend

log = logging.getLogger(__name__)

# what a book reads of a final row (BudgetBook.add), and what pricing it reads
BOOK_COLUMNS = tuple(dict.fromkeys(("status", "user_id", "api_key_fingerprint", "cost_usd", *COST_COLUMNS)))
EARLIER_REFRESH = 300.0  # seconds between two reads of the month's earlier days
FIRST_TRY = 0.1  # seconds between tries while a book has no totals yet
_NEW_BOOK = object()  # a writer no book is made for: the next sync makes a new book


class SpendRefresher:
    """Refreshes the book's database totals every ``book.refresh_seconds`` on its own thread.

    ``target`` returns the book and the engine to read at each refresh (either may change
    while the proxy runs: new rules, another database); ``None`` for the engine while no
    database is open. A failed read is kept in the book (:meth:`BudgetBook.refresh_failed`):
    its failure policy decides once the totals are too old. ``wake`` makes the thread
    price the rows the book waits for (and read a new book's totals) now.
    """

    def __init__(self, target: Callable[[], tuple[BudgetBook | None, Engine | None]]) -> None:
        self._target = target
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._earlier: tuple[tuple[int, str, str], list[Spend], float] | None = None
        self._thread = threading.Thread(target=self._run, name="llm-audit-budgets", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        """Price what the book's rows wait for whenever woken; read the totals every
        ``refresh_seconds`` (at once for a new book, every :data:`FIRST_TRY` until its
        first read works, every second while reads fail)."""
        last: BudgetBook | None = None
        due = 0.0
        while not self._stop.is_set():
            book, engine = self._target()
            if book is not None:
                self._price(book)
                if book is not last:
                    last, due = book, 0.0
                if engine is not None and time.monotonic() >= due:
                    due = time.monotonic() + self._refresh_once(book, engine)
                elif engine is None:
                    due = time.monotonic() + FIRST_TRY
            self._wake.wait(max(due - time.monotonic(), 0.0) if book is not None else 1.0)
            self._wake.clear()

    def refresh_now(self, book: BudgetBook, engine: Engine) -> None:
        """One refresh on the caller's thread (the proxy's start, before traffic)."""
        self._refresh_once(book, engine)

    def _price(self, book: BudgetBook) -> None:
        try:
            for line in book.price_pending():
                log.warning(f"llm-audit: {line}")
        except Exception:  # the thread must go on
            log.exception("llm-audit: budgets: pricing this proxy's exchanges failed")

    def _refresh_once(self, book: BudgetBook, engine: Engine) -> float:
        """One refresh; the seconds until the next."""
        try:
            failed = book.error
            self.refresh(book, engine)
            if failed is not None:
                log.info("llm-audit: budgets: the totals are read again")
            return book.refresh_seconds
        except SQLAlchemyError as e:
            problem = f"cannot read the totals: {first_line(e)}"
            if book.error != problem:
                log.warning(f"llm-audit: budgets: {problem}; retrying")
            book.refresh_failed(problem)
        except Exception as e:  # the thread must go on
            log.exception("llm-audit: budgets: refreshing the totals failed")
            book.refresh_failed(f"{type(e).__name__}: {e}")
        return FIRST_TRY if book.snapshot is None else min(book.refresh_seconds, 1.0)

    def refresh(self, book: BudgetBook, engine: Engine) -> None:
        """Read today's (and, for month budgets, this month's earlier) totals into ``book``."""
        read_at = time.monotonic()
        now = datetime.now(UTC)
        day = period_start("day", now)
        today = read_spend(engine, day, period_end("day", now), book.instance, book.epoch)
        earlier: list[Spend] = []
        month = period_start("month", now)
        if "month" in book.periods and month < day:
            which = (id(engine), f"{book.instance} {book.epoch.isoformat()}", day.isoformat())
            if self._earlier is None or self._earlier[0] != which or read_at - self._earlier[2] > EARLIER_REFRESH:
                self._earlier = (which, read_spend(engine, month, day, book.instance, book.epoch), read_at)
            earlier = self._earlier[1]
        book.refreshed(build_snapshot(book.budgets, today, earlier, now, read_at))


class BudgetKeeper:
    """The budget book in force, the one about to replace it, and their refresh thread."""

    def __init__(self, store: AuditStore | None) -> None:
        self.store = store
        self.budgets: list[Budget] = []
        self.failure: Literal["open", "closed"] = "closed"
        self.refresh_seconds = 5
        self.book: BudgetBook | None = None  # the one requests are checked against
        self.next: BudgetBook | None = None  # made for new budgets or a new writer, not read yet
        self._writer: object = None  # the audit writer the newest book was made for
        self._target: tuple[BudgetBook | None, Engine | None] = (None, None)  # for the thread, swapped whole
        self.refresher: SpendRefresher | None = None

    def configure(self, budgets: Sequence[Budget], failure: Literal["open", "closed"], refresh_seconds: int) -> None:
        """New rules: a new book for them (the one in force stays until it is read)."""
        self.budgets, self.failure, self.refresh_seconds = list(budgets), failure, refresh_seconds
        self._writer = _NEW_BOOK
        self._sync()

    def start(self) -> None:
        """Before traffic (mitmproxy's ``running``, the database open by now): read the
        new book's totals here, once, so the first requests are not refused for want of
        them. A failure is the thread's to retry."""
        book = self._sync()
        engine = self._target[1]
        if book is not None and book.snapshot is None and engine is not None and self.refresher is not None:
            self.refresher.refresh_now(book, engine)
        self._promote()  # (also when the refresh thread read the totals first)

    def close(self) -> None:
        if self.refresher is not None:
            self.refresher.close()
            self.refresher = None

    def check(self, record: ExchangeRecord) -> list[Verdict]:
        """The budgets' verdicts on a new request (in memory, O(budgets); never raises:
        a failure of the check itself follows the failure policy)."""
        if not self.budgets:
            return []
        try:
            self._sync()
            self._promote()
            book = self.book or self.next
            if book is None:
                return []
            now = datetime.fromtimestamp(record.started_at, UTC) if record.started_at else datetime.now(UTC)
            return book.check(record.provider, record.request_model, record.user_id, record.api_key_fingerprint, now)
        except Exception as e:  # our bug must not decide the policy
            log.exception("llm-audit: checking a request's budgets failed")
            action = BLOCK if self.failure == "closed" else FLAG
            reason = f"{type(e).__name__}: {e}"[:300]
            return [Verdict(action, FILTER_ERROR, reason, filter=BUDGET_FILTER, location="request")]

    def recorded(self, row: dict[str, Any]) -> None:
        """The audit store took a record: count a final one in the books (never raises).
        A book keeps the columns it reads only: a row waiting to be priced would otherwise
        hold the exchange's whole content."""
        books = {id(b): b for b in (self.book, self.next) if b is not None}
        if books:
            row = {name: row.get(name) for name in BOOK_COLUMNS}
        for book in books.values():
            try:
                book.add(row)
            except Exception:  # the record is written; only its count is missing
                log.exception("llm-audit: counting a record in the budgets failed")

    def _sync(self) -> BudgetBook | None:
        """The newest book, made anew when the budgets or the audit writer changed."""
        writer = self.store.writer if self.store is not None else None
        if not self.budgets:
            self.book = self.next = None
            self._target = (None, None)
            return None
        if self.next is None and self.book is not None and writer is self._writer:
            return self.book
        if self.next is not None and writer is self._writer:
            return self.next
        book = BudgetBook(
            self.budgets,
            instance=writer.instance if writer is not None else None,
            failure=self.failure,
            refresh_seconds=self.refresh_seconds,
        )
        self._writer, self.next = writer, book
        engine = getattr(writer, "engine", None)
        self._target = (book, engine if isinstance(engine, Engine) else None)
        if self.refresher is None:
            self.refresher = SpendRefresher(lambda: self._target)
        book.on_pending = self.refresher.wake
        if self.store is not None:
            book.pricer = self._price
        self.refresher.wake()
        return book

    def _promote(self) -> None:
        """The new book replaces the one in force once its totals are read (or once the
        wait is as long as totals may be old: then its failure policy decides)."""
        new = self.next
        if new is not None and (new.snapshot is not None or self.book is None or new.age() > new.stale_after):
            self.book, self.next = new, None

    def _price(self, row: Mapping[str, Any]) -> float | None:
        """A row's cost as the writer computes it (:func:`storage.cost.cost_of`, with the
        store's price file); called on the budgets' thread, never on the event loop."""
        return cost_of(row, self.store.prices if self.store is not None else None).usd
