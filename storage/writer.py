"""The background writer: records in from the proxy, batched upserts out to the database.

mitmproxy's event loop only ever calls :meth:`AuditWriter.submit`, which puts a row on
a queue and returns. A single thread drains the queue in batches (up to ``batch_size``
rows, or whatever arrived within ``max_delay``) and writes each batch in one
transaction.

Nothing is lost:

* Rows are upserted by id, and a row is only ever updated while it is still
  ``in_progress``: the write-ahead open record of an exchange is completed by its final
  record, and a late or repeated open record can never undo a final one.
* When a write fails (the database is down, the disk is full, ...), the batch goes to
  the :class:`~storage.spool.Spool`, fsync'd. While the spool holds anything, new rows
  are appended to it too, so the order is kept; the spool is replayed in order, then
  emptied, as soon as the database answers again (also after a restart).
* At start, rows this proxy instance left ``in_progress`` when it was killed are marked
  ``interrupted`` (after the spool is replayed, so spooled final records win).
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
from datetime import datetime, timezone
from typing import Any

import orjson
from sqlalchemy import JSON, Engine, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError

from storage.database import DatabaseError
from storage.schema import exchanges
from storage.spool import Spool

log = logging.getLogger(__name__)

_STOP = object()
_JSON_COLUMNS = frozenset(c.name for c in exchanges.columns if isinstance(c.type, JSON))
_ESCAPED_NUL = re.compile(rb"(?<!\\)((?:\\\\)*)\\u0000")
RETRY_MIN, RETRY_MAX = 0.5, 5.0


class AuditWriter:
    """Writes exchange rows off the event loop, in batches, spooling what cannot be written."""

    def __init__(
        self,
        engine: Engine,
        spool: Spool,
        instance: str,
        batch_size: int = 500,
        max_delay: float = 0.05,
    ) -> None:
        self.engine = engine
        self.spool = spool
        self.instance = instance
        self.batch_size = batch_size
        self.max_delay = max_delay
        self.written = 0  # final records (open records are not counted)
        self.started = datetime.now(timezone.utc)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._held: list[dict[str, Any]] = []  # rows neither the database nor the spool took
        self._upsert = _upsert_statement(engine)
        self._postgres = engine.dialect.name == "postgresql"
        self._retry_at = 0.0
        self._backoff = RETRY_MIN
        self._recovered = False  # interrupted rows of an earlier run marked
        self._thread = threading.Thread(target=self._run, name="llm-audit-writer", daemon=True)
        self._thread.start()

    def submit(self, row: dict[str, Any]) -> None:
        """Queue a row; never blocks."""
        self._queue.put(row)

    @property
    def pending(self) -> int:
        """Rows not yet in the database: queued, spooled or held."""
        return self._queue.qsize() + self.spool.records + len(self._held)

    def close(self, timeout: float = 30.0) -> None:
        """Write everything queued (to the database, else the spool), then stop."""
        self._queue.put(_STOP)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("llm-audit: the writer did not finish within %.0fs", timeout)
        if self.spool:
            log.warning(
                "llm-audit: %d records wait in the spool %s (%d bytes); they are written at the next start",
                self.spool.records, self.spool.path, self.spool.size,
            )
        if self._held:
            log.error("llm-audit: %d records could be written neither to the database nor to the spool", len(self._held))
        self.spool.close()
        self.engine.dispose()

    # -- the writer thread --------------------------------------------------------------

    def _run(self) -> None:
        self._recover()
        stopping = False
        while True:
            batch, stopping = self._next_batch(stopping)
            if batch:
                self._store(batch)
            elif self.spool or not self._recovered:
                self._recover()
            if stopping and self._queue.empty():
                self._recover(force=True)
                return

    def _next_batch(self, stopping: bool) -> tuple[list[dict[str, Any]], bool]:
        """What the queue yields within ``max_delay`` (waiting at most a second for the first
        row, so a waiting spool is retried even when no traffic comes)."""
        batch: list[dict[str, Any]] = []
        deadline = None
        while len(batch) < self.batch_size:
            try:
                if stopping:
                    item = self._queue.get_nowait()
                elif deadline is None:
                    item = self._queue.get(timeout=1.0)
                else:
                    item = self._queue.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                break
            if item is _STOP:
                stopping = True
                continue
            batch.append(item)
            deadline = deadline or time.monotonic() + self.max_delay
        return batch, stopping

    def _store(self, batch: list[dict[str, Any]]) -> None:
        """To the database when nothing waits before this batch, else behind it in the spool."""
        if not self.spool and not self._held and time.monotonic() >= self._retry_at:
            try:
                self._write(batch)
                return
            except SQLAlchemyError as e:
                self._failed(e)
        self._spool(batch)
        self._recover()

    def _spool(self, rows: list[dict[str, Any]]) -> None:
        rows, self._held = self._held + rows, []
        was_empty = not self.spool
        try:
            self.spool.append(rows)
        except OSError as e:
            self._held = rows
            log.error("llm-audit: cannot write the spool %s (%s); %d records held in memory", self.spool.path, e, len(rows))
            return
        if was_empty:
            log.warning("llm-audit: spooling to %s until the database is back", self.spool.path)
        elif self.spool.records // 1000 > (self.spool.records - len(rows)) // 1000:
            log.warning("llm-audit: the spool holds %d records (%d bytes)", self.spool.records, self.spool.size)

    def _recover(self, force: bool = False) -> None:
        """Replay the spool, then mark what an earlier run left open, when the database answers."""
        if not force and time.monotonic() < self._retry_at:
            return
        try:
            if self.spool:
                replayed = 0
                for rows in self.spool.read(self.batch_size):
                    self._write(rows)
                    replayed += len(rows)
                self.spool.clear()
                log.info("llm-audit: replayed %d records from the spool into the database", replayed)
            if self._held:
                self._write(self._held)
                self._held = []
            if not self._recovered:
                self._mark_interrupted()
                self._recovered = True
            self._backoff = RETRY_MIN
        except SQLAlchemyError as e:
            self._failed(e)

    def _failed(self, error: SQLAlchemyError) -> None:
        reason = str(getattr(error, "orig", None) or error).strip().splitlines()[0]
        log.warning("llm-audit: database write failed (%s); retrying in %.1fs", reason, self._backoff)
        self._retry_at = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, RETRY_MAX)

    def _write(self, batch: list[dict[str, Any]]) -> None:
        # The same record may be queued twice in one batch (open, then final): keep the
        # last version of each, in order.
        rows = list({row["id"]: row for row in batch}.values())
        if self._postgres:
            rows = [_postgres_safe(row) for row in rows]
        with self.engine.begin() as conn:
            conn.execute(self._upsert, rows)
        self.written += sum(1 for row in rows if row["status"] != "in_progress")  # final records

    def _mark_interrupted(self) -> None:
        """Rows this instance left open before this run started were cut by a crash."""
        with self.engine.begin() as conn:
            result = conn.execute(
                update(exchanges)
                .where(exchanges.c.status == "in_progress")
                .where(exchanges.c.proxy_instance == self.instance)
                .where(exchanges.c.started_at < self.started)
                .values(status="interrupted")
            )
        if result.rowcount:
            log.warning("llm-audit: marked %d exchanges left open by an earlier run as interrupted", result.rowcount)


def _upsert_statement(engine: Engine):
    """INSERT ... ON CONFLICT (id) DO UPDATE ... WHERE the stored row is still in progress."""
    insert = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}.get(engine.dialect.name)
    if insert is None:
        raise DatabaseError(f"unsupported database backend {engine.dialect.name!r}: use SQLite or PostgreSQL")
    stmt = insert(exchanges)
    return stmt.on_conflict_do_update(
        index_elements=[exchanges.c.id],
        set_={c.name: stmt.excluded[c.name] for c in exchanges.columns if c.name != "id"},
        where=exchanges.c.status == "in_progress",
    )


def _postgres_safe(row: dict[str, Any]) -> dict[str, Any]:
    """PostgreSQL text and jsonb cannot hold U+0000: store U+FFFD in its place.

    Only rows that contain one are copied, so the common case costs a scan.
    """
    out = None
    for name, value in row.items():
        fixed = value
        if isinstance(value, str):
            if "\x00" in value:
                fixed = value.replace("\x00", "\ufffd")
        elif name in _JSON_COLUMNS and value is not None:
            encoded = orjson.dumps(value)
            if b"\\u0000" in encoded:
                fixed = orjson.loads(_ESCAPED_NUL.sub(rb"\1\\ufffd", encoded))
        if fixed is not value:
            out = out or dict(row)
            out[name] = fixed
    return out or row
