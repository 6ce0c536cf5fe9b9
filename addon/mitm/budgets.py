"""Budgets in the proxy: the thread that keeps their totals current from the audit database.

Budgets (:mod:`addon.filters.budgets`) are checked on the event loop against totals in
memory; :class:`SpendRefresher` reads the database's totals (:func:`storage.spend.read_spend`)
on a thread of its own, so no request ever waits for a query, and hands each snapshot to
the book in force. What is read per refresh:

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
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from addon.filters.budgets import BudgetBook, build_snapshot, period_start
from storage.database import first_line
from storage.spend import Spend, read_spend

log = logging.getLogger(__name__)

EARLIER_REFRESH = 300.0  # seconds between two reads of the month's earlier days
FIRST_TRY = 0.1  # seconds between tries while a book has no totals yet


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

    def _price(self, book: BudgetBook) -> None:
        try:
            for line in book.price_pending():
                log.warning(f"llm-audit: {line}")
        except Exception:  # the thread must go on
            log.exception("llm-audit: budgets: pricing this proxy's exchanges failed")

    def _refresh_once(self, book: BudgetBook, engine: Engine) -> float:
        """One refresh; the seconds until the next."""
        try:
            self.refresh(book, engine)
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
        today = read_spend(engine, day, day + timedelta(days=1), book.instance, book.epoch)
        earlier: list[Spend] = []
        month = period_start("month", now)
        if "month" in book.periods and month < day:
            which = (id(engine), f"{book.instance} {book.epoch.isoformat()}", day.isoformat())
            if self._earlier is None or self._earlier[0] != which or read_at - self._earlier[2] > EARLIER_REFRESH:
                self._earlier = (which, read_spend(engine, month, day, book.instance, book.epoch), read_at)
            earlier = self._earlier[1]
        book.refreshed(build_snapshot(book.budgets, today, earlier, now, read_at))
