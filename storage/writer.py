"""The background writer: records in from the proxy, batched upserts out to the database.

mitmproxy's event loop only ever calls :meth:`AuditWriter.submit`, which puts a row on
a queue and returns. A single thread drains the queue in batches (up to ``batch_size``
rows, or whatever arrived within ``max_delay``) and writes each batch in one
transaction. Rows are upserted by id, so writing the same record twice is harmless,
which later lets a record be written first as ``in_progress`` and completed afterwards.

A batch that fails is kept and retried with backoff; nothing is dropped. (Keeping it
across a proxy restart is the spool's job.)
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError

from storage.database import DatabaseError
from storage.schema import exchanges

log = logging.getLogger(__name__)

_STOP = object()


class AuditWriter:
    """Writes exchange rows off the event loop, in batches."""

    def __init__(self, engine: Engine, batch_size: int = 500, max_delay: float = 0.05) -> None:
        self.engine = engine
        self.batch_size = batch_size
        self.max_delay = max_delay
        self.written = 0
        self.failed_attempts = 0
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._backlog: list[dict[str, Any]] = []  # rows of failed batches, retried first
        self._thread = threading.Thread(target=self._run, name="llm-audit-writer", daemon=True)
        self._upsert = _upsert_statement(engine)
        self._thread.start()

    def submit(self, row: dict[str, Any]) -> None:
        """Queue a row; never blocks."""
        self._queue.put(row)

    @property
    def pending(self) -> int:
        return self._queue.qsize() + len(self._backlog)

    def close(self, timeout: float = 30.0) -> None:
        """Write everything queued, then stop the thread (at most ``timeout`` seconds)."""
        self._queue.put(_STOP)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("llm-audit: %d audit records could not be written before shutdown", self.pending)
        self.engine.dispose()

    # -- the writer thread --------------------------------------------------------------

    def _run(self) -> None:
        stopping = False
        backoff = 0.5
        while True:
            batch, stopping = self._next_batch(stopping)
            if batch:
                try:
                    self._write(batch)
                    backoff = 0.5
                except SQLAlchemyError as e:
                    self.failed_attempts += 1
                    self._backlog = batch
                    log.warning("llm-audit: writing %d records failed (%s); retrying in %.1fs",
                                len(batch), str(getattr(e, "orig", e)).splitlines()[0], backoff)
                    if stopping and self.failed_attempts > 3:
                        log.error("llm-audit: giving up on %d records at shutdown", len(batch))
                        return
                    time.sleep(backoff)
                    backoff = min(backoff * 2, 5.0)
                    continue
            if stopping and not self._backlog and self._queue.empty():
                return

    def _next_batch(self, stopping: bool) -> tuple[list[dict[str, Any]], bool]:
        """Failed rows first, then whatever the queue yields within ``max_delay``."""
        batch, self._backlog = self._backlog, []
        if not batch and not stopping:
            item = self._queue.get()
            if item is _STOP:
                return batch, True
            batch.append(item)
        deadline = time.monotonic() + self.max_delay
        while len(batch) < self.batch_size:
            try:
                remaining = deadline - time.monotonic()
                item = self._queue.get(timeout=remaining) if remaining > 0 and not stopping else self._queue.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                stopping = True
                continue
            batch.append(item)
        return batch, stopping

    def _write(self, batch: list[dict[str, Any]]) -> None:
        # The same record may be queued twice in one batch (e.g. open then final);
        # keep the last version of each, in order.
        rows = list({row["id"]: row for row in batch}.values())
        with self.engine.begin() as conn:
            conn.execute(self._upsert, rows)
        self.written += len(rows)


def _upsert_statement(engine: Engine):
    """INSERT ... ON CONFLICT (id) DO UPDATE for the engine's backend."""
    insert = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}.get(engine.dialect.name)
    if insert is None:
        raise DatabaseError(f"unsupported database backend {engine.dialect.name!r}: use SQLite or PostgreSQL")
    stmt = insert(exchanges)
    return stmt.on_conflict_do_update(
        index_elements=[exchanges.c.id],
        set_={c.name: stmt.excluded[c.name] for c in exchanges.columns if c.name != "id"},
    )
