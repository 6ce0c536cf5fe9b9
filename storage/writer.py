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

Every final record is sealed into this instance's hash chain (:mod:`storage.chain`)
here, on the writer thread, in the order records are handed over and before it goes to
the database or the spool, so spooled records keep their place in the chain. The
``chains`` table follows the head in the same transaction, and a
:class:`~storage.checkpoint.Checkpointer` signs the head of what is committed.
"""

from __future__ import annotations

import ctypes
import logging
import queue
import re
import threading
import time
from datetime import datetime, timezone
from typing import Any

import orjson
from sqlalchemy import JSON, Engine, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError

from storage.chain import CHAIN_COLUMNS, GENESIS, Chain, Head, is_sealed
from storage.checkpoint import Checkpointer, CheckpointError
from storage.database import DatabaseError, first_line
from storage.schema import IN_PROGRESS, chains, exchanges
from storage.spool import Spool

log = logging.getLogger(__name__)

_STOP = object()
_JSON_COLUMNS = frozenset(c.name for c in exchanges.columns if isinstance(c.type, JSON))
_ESCAPED_NUL = re.compile(rb"(?<!\\)((?:\\\\)*)\\u0000")
RETRY_MIN, RETRY_MAX = 0.5, 5.0
_TRIM_AFTER = 16 * 1024 * 1024  # characters of output in one batch after which freed memory is handed back
_UNSEALED = dict.fromkeys(CHAIN_COLUMNS)  # an open record's chain columns (one statement needs every key)


class AuditWriter:
    """Writes exchange rows off the event loop, in batches, spooling what cannot be written."""

    def __init__(
        self,
        engine: Engine,
        spool: Spool,
        instance: str,
        batch_size: int = 500,
        max_delay: float = 0.05,
        checkpointer: Checkpointer | None = None,
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
        self._insert = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}[engine.dialect.name]
        self._postgres = engine.dialect.name == "postgresql"
        self.chain = Chain(instance, self._chain_head())
        self.committed = self.chain.head  # the chain's head as far as the database has it
        self.checkpointer = checkpointer
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
        self._checkpoint(final=True)
        self.spool.close()
        self.engine.dispose()

    def _chain_head(self) -> Head:
        """Where this instance's chain goes on: the furthest of the database and the spool."""
        c = exchanges.c
        try:
            with self.engine.connect() as conn:
                known = conn.execute(select(chains.c.head_seq, chains.c.head_hash)
                                     .where(chains.c.chain_id == self.instance)).first()
                last = conn.execute(select(c.chain_seq, c.record_hash).where(c.chain_id == self.instance)
                                    .order_by(c.chain_seq.desc()).limit(1)).first()
        except SQLAlchemyError as e:
            raise DatabaseError(f"cannot read the hash chain's head: {first_line(e)}") from None
        heads = [Head(), *(Head(r[0], r[1]) for r in (known, last) if r is not None)]
        for rows in self.spool.read(self.batch_size):
            heads += [Head(r["chain_seq"], r["record_hash"]) for r in rows
                      if is_sealed(r) and r.get("chain_id") == self.instance]
        return max(heads, key=lambda h: h.seq)

    # -- the writer thread --------------------------------------------------------------

    def _run(self) -> None:
        self._recover()
        stopping = False
        while True:
            batch, stopping = self._next_batch(stopping)
            if batch:
                self._store(batch)
                del batch  # not kept alive while the queue is waited on
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
        """Seal the final records, then to the database when nothing waits before this
        batch, else behind it in the spool."""
        batch = [self._seal(row) for row in batch]
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

    def _seal(self, row: dict[str, Any]) -> dict[str, Any]:
        """The row as stored (PostgreSQL-safe), sealed into the chain when final."""
        return self.chain.seal(_postgres_safe(row) if self._postgres else row)

    def _write(self, batch: list[dict[str, Any]]) -> None:
        # The same record may be queued twice in one batch (open, then final): keep the
        # last version of each, in order.
        rows = [_UNSEALED | row for row in {row["id"]: row for row in batch}.values()]
        ours = [row for row in rows if is_sealed(row) and row["chain_id"] == self.instance]
        head = max((Head(row["chain_seq"], row["record_hash"]) for row in ours), key=lambda h: h.seq, default=None)
        with self.engine.begin() as conn:
            conn.execute(self._upsert, rows)
            if head is not None:
                self._advance_head(conn, head)
        self.written += sum(1 for row in rows if row["status"] != IN_PROGRESS)  # final records
        if sum(len(row.get("output_text") or "") for row in rows) > _TRIM_AFTER:
            _release_memory()
        if head is not None and head.seq > self.committed.seq:
            self.committed = head
            self._checkpoint()

    def _advance_head(self, conn, head: Head) -> None:
        """Move the ``chains`` row of this instance to ``head`` (never backwards)."""
        stmt = self._insert(chains).values(chain_id=self.instance, head_seq=head.seq, head_hash=head.hash,
                                           start_seq=1, start_prev_hash=GENESIS)
        conn.execute(stmt.on_conflict_do_update(
            index_elements=[chains.c.chain_id],
            set_={"head_seq": stmt.excluded.head_seq, "head_hash": stmt.excluded.head_hash},
            where=chains.c.head_seq < stmt.excluded.head_seq,
        ))

    def _checkpoint(self, final: bool = False) -> None:
        if self.checkpointer is None:
            return
        try:
            path = self.checkpointer.committed(self.committed, final=final)
        except (OSError, CheckpointError) as e:
            log.error("llm-audit: cannot write a checkpoint (%s); the next one is tried at the next write", e)
            return
        if path is not None:
            log.info("llm-audit: checkpoint %s (chain %s at %d)", path, self.instance, self.committed.seq)

    def _mark_interrupted(self) -> None:
        """Rows this instance left open before this run started were cut by a crash: they
        become final (``interrupted``) and are sealed into the chain."""
        c = exchanges.c
        before = self.chain.head
        try:
            with self.engine.begin() as conn:
                open_rows = conn.execute(
                    select(exchanges).where(c.status == IN_PROGRESS, c.proxy_instance == self.instance,
                                            c.started_at < self.started).order_by(c.started_at)
                ).mappings().all()
                for row in open_rows:
                    sealed = self.chain.seal(dict(row) | {"status": "interrupted"})
                    conn.execute(update(exchanges).where(c.id == row["id"], c.status == IN_PROGRESS).values(
                        {name: sealed[name] for name in
                         ("status", "chain_id", "chain_seq", "prev_hash", "record_hash", "content_hashes")}))
                if open_rows:
                    self._advance_head(conn, self.chain.head)
        except SQLAlchemyError:
            self.chain.head = before  # nothing of it was written
            raise
        if open_rows:
            self.committed = self.chain.head
            log.warning("llm-audit: marked %d exchanges left open by an earlier run as interrupted", len(open_rows))


def _upsert_statement(engine: Engine):
    """INSERT ... ON CONFLICT (id) DO UPDATE ... WHERE the stored row is still in progress."""
    insert = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}.get(engine.dialect.name)
    if insert is None:
        raise DatabaseError(f"unsupported database backend {engine.dialect.name!r}: use SQLite or PostgreSQL")
    stmt = insert(exchanges)
    return stmt.on_conflict_do_update(
        index_elements=[exchanges.c.id],
        set_={c.name: stmt.excluded[c.name] for c in exchanges.columns if c.name != "id"},
        where=exchanges.c.status == IN_PROGRESS,
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


def _release_memory() -> None:
    """Hand freed heap memory back to the system after a huge record.

    Writing one record copies its text several times (the row, its hash, the driver's
    parameters); glibc keeps the freed pages, so a single 200 MB stream would leave the
    proxy a gigabyte larger for good. ``malloc_trim`` returns them (glibc only; a no-op
    elsewhere).
    """
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
