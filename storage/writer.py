"""The background writer: records in from the proxy, upserts out to the database.

mitmproxy's event loop only ever calls :meth:`AuditWriter.submit`, which puts a row on
a queue and returns. A single thread drains the queue: the rows queued (and, while they
are only open rows, those that come within :data:`GROUP_SECONDS` of the first) are
written in one transaction (up to ``batch_size``); rows that queue while a write runs go
into the next one (group commit, and a final record is durable within tens of
milliseconds of its exchange's end).

Nothing is lost:

* Rows are upserted by id, and a row is only ever updated while it is still
  ``in_progress``: the write-ahead open record of an exchange is completed by its final
  record, and a late or repeated open record can never undo a final one.
* Every row is prepared first (:mod:`storage.prepare`): what the backend cannot hold
  (any nesting depth, any size, lone surrogates, huge integers, U+0000 on PostgreSQL) is
  reduced, with a ``stored_reduced`` finding, before the row is sealed.
* When a write fails (the database is down, the disk is full, ...), the batch goes to
  the :class:`~storage.spool.Spool`, fsync'd. While the spool holds anything, new rows
  are appended to it too, so the order is kept; the spool is replayed in order, then
  emptied, as soon as the database answers again (also after a restart).
* One record's trouble stays its own: a batch that fails while the database answers (a
  write that changes nothing tells) is written row by row; a row refused alone is
  reduced to a minimal row (:func:`storage.prepare.minimal_row`), sealed in its place;
  refused even then, or a sealed row from the spool refused alone (changing it would
  break its seal), it is quarantined (:mod:`storage.quarantine`), as is a spool line
  that cannot be read back. Replay never blocks behind one row.
* The thread survives anything: a failing step is logged and its rows are tried again
  (a row failing :data:`STRIKES` times is quarantined). Should the thread die anyway,
  the next :meth:`~AuditWriter.submit` logs it as an error and starts a new one, with
  the rows it held put back first.
* At start, rows this proxy instance left ``in_progress`` when it was killed are marked
  ``interrupted`` (after the spool is replayed, so spooled final records win).

Every final record is sealed into this instance's hash chain (:mod:`storage.chain`)
here, on the writer thread, in the order records are handed over and before it goes to
the database or the spool, so spooled records keep their place in the chain. The
``chains`` table follows the head in the same transaction, and a
:class:`~storage.checkpoint.Checkpointer` signs the head of what is committed. A status
file (:mod:`storage.status`) tells ``llm-audit status`` whether records flow.
"""

from __future__ import annotations

import logging
import os
import queue
import struct
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import orjson
from sqlalchemy import Column, Engine, MetaData, String, Table, Text, bindparam, select, text, update
from sqlalchemy.dialects import postgresql
from sqlalchemy.exc import SQLAlchemyError

from storage.adoption import adopt_interrupted, load_or_create_secret, open_mac
from storage.chain import CHAIN_COLUMNS, GENESIS, Chain, Head, is_sealed, utf8_size, utf8_slices
from storage.checkpoint import Checkpointer, CheckpointError
from storage.cost import Prices, cost_of
from storage.database import DatabaseError, first_line, insert_for, shown_url
from storage.headfile import HeadFile
from storage.lease import Lease
from storage.memory import release_freed_memory
from storage.prepare import MAX_VALUE_BYTES, Prepared, minimal_row, prepare
from storage.quarantine import Entry, Quarantine, recover
from storage.schema import ANSWER_BYTES, IN_PROGRESS, chains, exchanges
from storage.schema import quarantine as quarantine_table
from storage.spool import Spool, safe_name
from storage.status import WriterStatus, process_start, status_path

log = logging.getLogger(__name__)

_STOP = object()
RETRY_MIN, RETRY_MAX = 0.5, 5.0
# How long an open row waits for others to share its transaction. Streams begin at
# random moments, so without it each exchange's open row took a transaction (and an
# fsync of the head file) of its own. In process, with a row every 4 ms, the writer's
# CPU per exchange was 2.8 to 3.6 ms without any window and 1.3 to 1.5 ms when every row
# waited up to 20 ms (0.33 ms when all rows come at once). Final records do not wait:
# with them waiting too, "submit to durable" on SQLite (bench/writes.py, 20 s runs on one
# machine) was 35 to 38 ms at p99 (p50 18.5 ms), against 19 to 22 ms with no window and
# 12 to 24 ms as it is now (p50 1.4 to 3.6 ms); the full benchmark's 83.5 ms at p99 was
# over the crash window's 50 ms target.
GROUP_SECONDS = 0.02
STRIKES = 3  # unexpected failures of one row before it is quarantined
# Final records' ids remembered to refuse a second final record of one exchange: an
# exchange's records come within its lifetime, long inside this many others (about 0.5 MB).
FINAL_IDS_KEPT = 4096
_LAZY_AT = 1024 * 1024  # characters of answer text and arguments from which a row is bound lazily (SQLite)
# characters of answer text from which it is written apart: as bytes (SQLite), staged (PostgreSQL)
_BYTES_AT = 1024 * 1024
_TRIM_AFTER = 16 * 1024 * 1024  # characters of output in one batch after which freed memory is handed back
# an open record's chain columns and adoption proof (one statement needs every key)
_UNSEALED = dict.fromkeys((*CHAIN_COLUMNS, "open_mac"))


class AuditWriter:
    """Writes exchange rows off the event loop, spooling what cannot be written now and
    quarantining what can be written nowhere; one record's trouble never stops the others."""

    def __init__(
        self,
        engine: Engine,
        spool: Spool,
        instance: str,
        batch_size: int = 500,
        group_seconds: float = GROUP_SECONDS,
        checkpointer: Checkpointer | None = None,
        max_value_bytes: int = MAX_VALUE_BYTES,
        prices: Prices | None = None,
    ) -> None:
        self.engine = engine
        # a price file's prices, tried before genai-prices' (storage/cost.py); the proxy
        # swaps it when its option changes: one reference, read once per row
        self.prices = prices
        self.spool = spool
        self.instance = instance
        self.batch_size = batch_size
        self.group_seconds = group_seconds
        self.max_value_bytes = max_value_bytes
        self.written = 0  # final records (open records are not counted)
        self.quarantined = 0  # records quarantined by this run
        self.started = datetime.now(UTC)
        self._process_start = process_start(os.getpid())  # (so status tells this process from a later one with its pid)
        self.last_write: datetime | None = None
        self.last_error: str | None = None
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._retry: deque[Any] = deque()  # rows put back after an unexpected failure: first in line
        self._finals = _RecentIds(FINAL_IDS_KEPT)  # ids of final records taken lately (see _once)
        self._strikes: dict[Any, int] = {}  # unexpected failures per record id
        self._inflight: list[Any] = []  # the rows the thread works on, neither written nor spooled yet
        self._inflight_head = Head()  # the chain's head before them
        self._held: list[dict[str, Any]] = []  # sealed rows neither the database nor the spool took
        self._upsert = _upsert_statement(engine)
        self._staged_upsert = _staged_upsert_statement()  # PostgreSQL's, for a huge answer (_stage)
        self._can_stage: bool | None = None  # PostgreSQL: may this role make a temporary table (asked once)
        self._head_upsert = _head_statement(engine)
        self._insert = insert_for(engine)
        self._postgres = engine.dialect.name == "postgresql"
        self._sqlite = engine.dialect.name == "sqlite"
        self._compiled: dict[tuple[str, ...], Any] = {}  # the upsert compiled per set of keys (_upsert_lazily)
        # (absolute: the quarantine table names the file for verify, which may run elsewhere)
        self.quarantine = Quarantine(spool.path.with_name(f"quarantine-{safe_name(instance)}.jsonl").absolute())
        self._unrecorded: list[Entry] = list(self.quarantine.entries())  # not known in the quarantine table yet
        self.status = WriterStatus(status_path(spool.path.parent, instance))
        self._secret = load_or_create_secret(spool.path.with_name(f"adoption-{safe_name(instance)}.key"))
        self._lease = Lease(engine, instance, self.started)  # a proxy already recording under this name: refused
        stored, head = self._chain_head()
        self.chain = Chain(instance, head)
        # the chain's head as far as the database has it: a checkpoint never signs a
        # record that lives only in the spool (verify would call its absence a truncation)
        self.committed = stored
        self.checkpointer = checkpointer
        if checkpointer is not None:
            checkpointer.since = head.seq + 1
        self._head_file = HeadFile(spool.path.with_name(f"head-{safe_name(instance)}.json"))
        self._vouch(stored)
        self._retry_at = 0.0
        self._backoff = RETRY_MIN
        self._recovered = False  # interrupted rows of an earlier run marked
        self._closing = False
        self._death: str | None = None  # why the last writer thread ended, until a new one starts
        self._thread = self._start_thread()

    def submit(self, row: dict[str, Any]) -> None:
        """Queue a row; never blocks. A writer thread found dead is restarted, loudly."""
        self._queue.put(row)
        if not self._thread.is_alive() and not self._closing:
            self._restart()

    @property
    def pending(self) -> int:
        """Rows not yet in the database: queued, in the works, spooled or held."""
        return self._in_memory() + self.spool.records

    def close(self, timeout: float = 30.0) -> None:
        """Write everything queued (to the database, else the spool), then stop."""
        if not self._thread.is_alive():
            self._restart()
        self._closing = True
        self._queue.put(_STOP)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("llm-audit: the writer did not finish within %.0fs", timeout)
        if self.spool:
            log.warning(
                "llm-audit: %d records wait in the spool %s (%d bytes); they are written at the next start",
                self.spool.records,
                self.spool.path,
                self.spool.size,
            )
        if self._in_memory():
            log.error(
                "llm-audit: %d records could be written neither to the database nor to the spool", self._in_memory()
            )
        if self.quarantined:
            log.warning(
                "llm-audit: %d records were quarantined in %s (listed in the quarantine table)",
                self.quarantined,
                self.quarantine.path,
            )
        self._checkpoint(final=True)
        self._report(force=True, alive=False, stopped=True)
        self.spool.close()
        self._head_file.close()
        self.engine.dispose()

    def summary(self) -> str:
        """Where every record went, for the shutdown line."""
        return (
            f"llm-audit: {self.written} audit records written, {self.spool.records} wait in the spool, "
            f"{self.quarantined} quarantined, {self._in_memory()} held in memory"
        )

    def _in_memory(self) -> int:
        return self._queue.qsize() + len(self._retry) + len(self._inflight) + len(self._held)

    def _vouch(self, stored: Head) -> None:
        """Compare the database's head with the last one this proxy wrote itself: records
        beyond it are not its own as far as it knows, and its checkpoints say so."""
        known = self._head_file.load()
        if known is None or stored.seq <= known.seq:
            return
        log.warning(
            "llm-audit: records %d..%d of chain %r are in the database, but this proxy last wrote record %d: "
            "its checkpoints name them as not written by it (verify reports them)",
            known.seq + 1,
            stored.seq,
            self.instance,
            known.seq,
        )
        if self.checkpointer is not None:
            self.checkpointer.unvouched = (known.seq + 1, stored.seq)

    def _chain_head(self) -> tuple[Head, Head]:
        """The chain's head in the database, and where this instance's chain goes on: the
        furthest of the database and the spool (counting spool lines that can no longer be
        read, as far as their place is known)."""
        c = exchanges.c
        try:
            with self.engine.connect() as conn:
                known = conn.execute(
                    select(chains.c.head_seq, chains.c.head_hash).where(chains.c.chain_id == self.instance)
                ).first()
                last = conn.execute(
                    select(c.chain_seq, c.record_hash)
                    .where(c.chain_id == self.instance)
                    .order_by(c.chain_seq.desc())
                    .limit(1)
                ).first()
        except SQLAlchemyError as e:
            raise DatabaseError(f"cannot read the hash chain's head: {first_line(e)}") from None
        heads = [Head(), *(Head(r[0], r[1]) for r in (known, last) if r is not None)]
        stored = Head(last[0], last[1]) if last is not None else Head()

        def torn(raw: bytes, _reason: str) -> None:
            found = recover(raw)
            if found.get("chain_id") == self.instance and "chain_seq" in found and "record_hash" in found:
                heads.append(Head(found["chain_seq"], found["record_hash"]))

        for rows in self.spool.read(self.batch_size, torn):
            heads += [
                Head(r["chain_seq"], r["record_hash"])
                for r in rows
                if is_sealed(r) and r.get("chain_id") == self.instance
            ]
        return stored, max(heads, key=lambda h: h.seq)

    # -- the writer thread --------------------------------------------------------------

    def _start_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name="llm-audit-writer", daemon=True)
        thread.start()
        return thread

    def _restart(self) -> None:
        log.error(
            "llm-audit: the writer thread died (%s); starting a new one (%d records wait in memory, none lost)",
            self._death or "reason unknown",
            self._in_memory(),
        )
        self._death = None
        self._thread = self._start_thread()

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as e:  # noqa: BLE001 - reported here, restarted by the next submit
            self._salvage()
            self._death = self.last_error = f"{type(e).__name__}: {e}"[:300]
            log.error("llm-audit: the writer thread stopped: %s", self._death)
            self._report(force=True, alive=False)

    def _serve(self) -> None:
        self._guarded(self._recover)
        stopping = False
        while True:
            batch, stopping = self._next_batch(stopping)
            if batch:
                self._guarded(self._store, batch)
                del batch  # not kept alive while the queue is waited on
            elif self.spool or self._held or self._unrecorded or not self._recovered:
                self._guarded(self._recover)
            self._report()
            self._lease.keep()
            if stopping and self._queue.empty() and not self._retry:
                self._guarded(self._recover, True)
                self._guarded(self._lease.release)
                return

    def _guarded(self, step: Callable[..., None], *args: Any) -> None:
        """Run one step; whatever it raises is logged and its rows are tried again."""
        try:
            step(*args)
        except Exception as e:  # the writer must survive anything
            self.last_error = f"{type(e).__name__}: {e}"[:300]
            log.exception("llm-audit: the writer failed (%s); its records are tried again", self.last_error)
            self._salvage()

    def _salvage(self) -> None:
        """Put the rows of an interrupted step back, first in line, and the chain's head where
        it was before them (none of them was written or spooled: they are sealed anew). They
        are tried one at a time; a row that failed alone :data:`STRIKES` times is quarantined."""
        rows, self._inflight = self._inflight, []
        if not rows:
            return
        self.chain.head = self._inflight_head
        if len(rows) > 1:  # tried again one at a time: only the failing row counts strikes
            self._retry.extendleft(reversed(rows))
            return
        row = rows[0]
        key = row.get("id") if isinstance(row, dict) else id(row)
        self._strikes[key] = strikes = self._strikes.get(key, 0) + 1
        if strikes < STRIKES:
            self._retry.appendleft(row)
        else:
            del self._strikes[key]
            self._quarantine_row(row, f"the writer failed on it {STRIKES} times ({self.last_error})")

    def _next_batch(self, stopping: bool) -> tuple[list[Any], bool]:
        """The rows queued now and those that come within :data:`GROUP_SECONDS` of the
        first, up to ``batch_size``: one transaction (and one fsync of the head file) for
        them all. Only open rows wait for company: once the batch holds a final record, it
        takes what is queued and is written, so the crash window of a finished exchange is
        not lengthened. Waits at most a second for the first row, so a waiting spool is
        retried even when no traffic comes; once stopping, takes what is queued and waits
        no more."""
        batch: list[Any] = []
        if self._retry:  # rows of a step that failed: one at a time, so one row's failure is its own
            batch.append(self._retry.popleft())
            self._inflight, self._inflight_head = batch, self.chain.head
            return batch, stopping
        timeout: float | None = None if stopping else 1.0
        closes = 0.0
        while len(batch) < self.batch_size:
            try:
                item = self._queue.get(timeout=timeout) if timeout else self._queue.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                stopping = True
                timeout = None
                continue
            if not self._once(item):
                continue
            batch.append(item)
            if stopping or _is_final(item):
                timeout = None  # a final record waits for no one: what is queued goes with it
                continue
            if timeout is None:
                continue
            if not closes:
                closes = time.monotonic() + self.group_seconds
            timeout = max(0.0, closes - time.monotonic())
        self._inflight, self._inflight_head = batch, self.chain.head
        return batch, stopping

    def _once(self, row: Any) -> bool:
        """Whether a row is to be written: not a second final record of an exchange whose
        final record was taken already. The upsert leaves a final row as it is, so the
        second would change nothing in the table, yet it would be sealed: a link of the
        hash chain with no row, which ``verify`` reports as a deleted record. The
        recorder submits each final record once; this keeps a bug there from reading as
        tampering (logged as an error, the first record stands)."""
        if not isinstance(row, dict) or row.get("status") == IN_PROGRESS:
            return True
        record_id = row.get("id")
        if not isinstance(record_id, str) or self._finals.add(record_id):
            return True
        log.error("llm-audit: record %s was submitted final twice; the first one stands", record_id)
        return False

    def _store(self, batch: list[Any]) -> None:
        """Prepare and seal the rows, then to the database when nothing waits before them,
        else behind it in the spool."""
        if sum(_answer_chars(row) for row in batch) > _TRIM_AFTER:
            release_freed_memory()  # the pieces a record joined its answer from are free: handed back before any copy
        prepared = [self._prepare(row) for row in batch]
        if self.spool or self._held or time.monotonic() < self._retry_at:
            self._spool([self._seal(p) for p in prepared])
            self._inflight = []
            self._recover()
            return
        sealed = [self._seal(p) for p in prepared]
        try:
            self._write(sealed)
        except Exception as e:  # noqa: BLE001 - a database refusal, or a row the driver cannot bind
            self._isolate(batch, prepared, sealed, e)
        self._inflight = []

    def _isolate(
        self, batch: list[Any], prepared: list[Prepared], sealed: list[dict[str, Any]], error: Exception
    ) -> None:
        """A batch failed: spool it when the database does not answer; else write its rows
        one by one, so that a row the database refuses affects that row alone."""
        if not self._answers():
            self._failed(error)
            self._spool(sealed)
            return
        log.warning(
            "llm-audit: a write of %d records failed while the database answers (%s); writing them one by one",
            len(batch),
            first_line(error),
        )
        self.chain.head = self._inflight_head
        for i, p in enumerate(prepared):
            if not self._write_one(p):
                self._spool([self._seal(q) for q in prepared[i:]])
                return
            self._inflight, self._inflight_head = batch[i + 1 :], self.chain.head

    def _write_one(self, p: Prepared) -> bool:
        """Write one fresh row; refused, its minimal row (sealed in its place); refused too,
        quarantine it. False when the database stopped answering (nothing of it written)."""
        mark = self.chain.head
        refusal = self._try_write(self._seal(p))
        if refusal is None:
            return True
        self.chain.head = mark
        if not self._answers():
            return False
        reason = first_line(refusal)
        refusal = self._try_write(self._seal(self._prepare(minimal_row(p.row, reason))))
        if refusal is None:
            log.error(
                "llm-audit: record %s was refused by the database (%s); a minimal row of it is written",
                p.row.get("id"),
                reason,
            )
            return True
        self.chain.head = mark
        if not self._answers():
            return False
        self._quarantine_row(self._seal(p), f"refused by the database, also reduced to a minimal row: {reason}")
        return True

    def _replay(self, rows: list[dict[str, Any]]) -> None:
        """Write rows from the spool or memory, already sealed: together, else one by one. A
        sealed row refused alone is quarantined (changing it would break its seal), an open
        row is reduced first. Raises the database's error when it stops answering."""
        try:
            self._write(rows)
            return
        except Exception as e:  # a database refusal, or a row the driver cannot bind
            if not self._answers():
                raise
            log.warning(
                "llm-audit: replaying %d records failed while the database answers (%s); one by one",
                len(rows),
                first_line(e),
            )
        for row in rows:
            refusal = self._try_write(row)
            if refusal is None:
                continue
            if not self._answers():
                raise refusal
            reason = first_line(refusal)
            if not is_sealed(row) and self._try_write(self._prepare(minimal_row(row, reason)).row) is None:
                continue
            self._quarantine_row(row, f"refused by the database: {reason}")

    def _try_write(self, row: dict[str, Any]) -> Exception | None:
        try:
            self._write([row])
        except Exception as e:  # noqa: BLE001
            return e
        return None

    def _answers(self) -> bool:
        """Whether the database takes a write now (one that changes nothing): tells a row it
        refuses from a database that refuses everything (down, locked, read-only)."""
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    update(chains).where(chains.c.chain_id == self.instance).values(head_seq=chains.c.head_seq)
                )
        except Exception:  # noqa: BLE001
            return False
        return True

    def _prepare(self, row: Any) -> Prepared:
        """The row as the backend can store it (:func:`storage.prepare.prepare`); a row that
        cannot even be prepared becomes its minimal row. A final row is priced first
        (:func:`storage.cost.cost_of`, which never raises), here on the writer thread: a
        price lookup never delays the event loop."""
        try:
            if isinstance(row, dict) and row.get("status") != IN_PROGRESS and row.get("cost_usd") is None:
                usd, source = cost_of(row, self.prices)
                if usd is not None:
                    row = row | {"cost_usd": usd, "cost_prices": source}
            return prepare(row, postgres=self._postgres, max_bytes=self.max_value_bytes)
        except Exception as e:  # noqa: BLE001
            reason = f"it could not be prepared: {type(e).__name__}: {e}"[:300]
            log.error("llm-audit: a record %s; a minimal row of it is written", reason)
            return prepare(
                minimal_row(row if isinstance(row, dict) else {}, reason),
                postgres=self._postgres,
                max_bytes=self.max_value_bytes,
            )

    def _seal(self, p: Prepared) -> dict[str, Any]:
        """The prepared row, sealed into the chain when final; a row that cannot be sealed
        (never a prepared one) is sealed as its minimal row."""
        if p.row["status"] == IN_PROGRESS:  # the proof that this proxy opened it (storage/adoption.py)
            return p.row | {"open_mac": open_mac(self._secret, self.instance, p.row)}
        try:
            return self.chain.seal(p.row, p.hashes)
        except Exception as e:  # noqa: BLE001 - the chain's head moved only if the seal succeeded
            reason = f"it could not be sealed: {type(e).__name__}: {e}"[:300]
            log.error("llm-audit: record %s: %s; a minimal row of it is written", p.row.get("id"), reason)
            small = self._prepare(minimal_row(p.row, reason))
            return self.chain.seal(small.row, small.hashes)

    def _spool(self, rows: list[dict[str, Any]]) -> None:
        rows, self._held = self._held + rows, []
        was_empty = not self.spool
        try:
            self.spool.append(rows)
        except OSError as e:
            self._held = rows
            log.error(
                "llm-audit: cannot write the spool %s (%s); %d records held in memory", self.spool.path, e, len(rows)
            )
            return
        except TypeError:  # a row orjson refuses (never a prepared one): the others go on
            self._spool_each(rows)
        if was_empty and self.spool:
            log.warning("llm-audit: spooling to %s until the database is back", self.spool.path)
        elif self.spool.records // 1000 > (self.spool.records - len(rows)) // 1000:
            log.warning("llm-audit: the spool holds %d records (%d bytes)", self.spool.records, self.spool.size)

    def _spool_each(self, rows: list[dict[str, Any]]) -> None:
        for i, row in enumerate(rows):
            try:
                self.spool.append([row])
            except TypeError as e:
                self._quarantine_row(row, f"cannot be written to the spool: {e}")
            except OSError:
                self._held += rows[i:]
                log.error(
                    "llm-audit: cannot write the spool %s; %d records held in memory", self.spool.path, len(rows) - i
                )
                return

    def _quarantine_row(self, row: Any, reason: str) -> None:
        """Keep a row that can be written nowhere in the quarantine file (held in memory when
        even that fails)."""
        try:
            raw = orjson.dumps(row, option=orjson.OPT_NON_STR_KEYS, default=repr)
        except TypeError:
            raw = repr(row).encode("utf-8", "backslashreplace")
        try:
            self._quarantine_line(raw, reason)
        except OSError as e:
            log.error(
                "llm-audit: cannot write the quarantine file %s (%s); the record is held in memory",
                self.quarantine.path,
                e,
            )
            if isinstance(row, dict):
                self._held.append(row)
                self._set_aside(row.get("chain_id"), row.get("chain_seq"))

    def _set_aside(self, chain_id: Any, seq: Any) -> None:
        """Tell the checkpoints of a record of this chain that is not written (quarantined,
        or held): the writer commits the later ones, and a checkpoint of them must name it."""
        if self.checkpointer is not None and chain_id == self.instance and isinstance(seq, int) and seq > 0:
            self.checkpointer.set_aside(seq)

    def _quarantine_line(self, raw: bytes, reason: str) -> None:
        """Quarantine one line (raises OSError); the quarantine table learns of it next."""
        entry = self.quarantine.add(raw, reason)
        if entry is None:
            return  # kept already (a replay cut short saw it before)
        self.quarantined += 1
        self._unrecorded.append(entry)
        self._set_aside(entry.chain_id, entry.chain_seq)
        what = (
            f"record {entry.chain_seq} of chain {entry.chain_id}"
            if entry.chain_seq is not None
            else f"record {entry.record_id or '(id unknown)'}"
        )
        # a warning, not an error: mitmdump exits when an error is logged while it starts,
        # and a spool quarantined at start must not keep the proxy from running
        log.warning("llm-audit: %s is quarantined in %s: %s", what, self.quarantine.path, reason)

    def _recover(self, force: bool = False) -> None:
        """Replay the spool, write held rows, record quarantined ones, then mark what an
        earlier run left open, when the database answers."""
        if not force and time.monotonic() < self._retry_at:
            return
        try:
            if self.spool:
                replayed = 0
                for rows in self.spool.read(self.batch_size, self._quarantine_line):
                    self._replay(rows)
                    replayed += len(rows)
                self.spool.clear()
                log.info("llm-audit: replayed %d records from the spool into the database", replayed)
            if self._held:
                held, self._held = self._held, []
                try:
                    self._replay(held)
                except Exception:
                    self._held = held + self._held
                    raise
            self._record_quarantine()
            if not self._recovered:
                self._mark_interrupted()
                self._recovered = True
            self._backoff = RETRY_MIN
        except OSError as e:  # the quarantine file: the spool is kept until it can be written
            log.error("llm-audit: cannot write the quarantine file %s (%s); the spool is kept", self.quarantine.path, e)
            self._failed(e)
        except Exception as e:  # noqa: BLE001 - the database's error: retried later
            self._failed(e)

    def _record_quarantine(self) -> None:
        """Put the quarantined lines in the ``quarantine`` table, and let this chain's head
        move past a quarantined record of it, so that ``verify`` sees (and names) the gap."""
        if not self._unrecorded:
            return
        entries = self._unrecorded
        ours = [
            Head(e.chain_seq, e.record_hash)
            for e in entries
            if e.chain_id == self.instance and e.chain_seq and e.record_hash
        ]
        stmt = self._insert(quarantine_table).on_conflict_do_nothing(index_elements=["file", "sha256"])
        with self.engine.begin() as conn:
            conn.execute(stmt, [e.as_row() for e in entries])
            if ours:
                self._advance_head(conn, max(ours, key=lambda head: head.seq))
        self._unrecorded = self._unrecorded[len(entries) :]

    def _failed(self, error: Exception) -> None:
        reason = first_line(error)
        self.last_error = reason
        log.warning("llm-audit: database write failed (%s); retrying in %.1fs", reason, self._backoff)
        self._retry_at = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, RETRY_MAX)

    def _write(self, batch: list[dict[str, Any]]) -> None:
        try:
            self._write_batch(batch)
        except _StagingFailed:
            self._write_batch(batch)  # staging is off from now on: the same rows, their answers bound

    def _write_batch(self, batch: list[dict[str, Any]]) -> None:
        # The same record may be queued twice in one batch (open, then final): keep the
        # last version of each, in order.
        rows: list[dict[str, Any]] = [_UNSEALED | row for row in {row["id"]: row for row in batch}.values()]
        ours = [row for row in rows if is_sealed(row) and row["chain_id"] == self.instance]
        head = max((Head(row["chain_seq"], row["record_hash"]) for row in ours), key=lambda h: h.seq, default=None)
        huge = sum(_answer_chars(row) for row in rows) > _TRIM_AFTER
        answers: dict[str, tuple[str, str]] = {}  # id: (answer text, record hash) written as bytes
        if self._sqlite:
            answers = {row["id"]: (row["output_text"], row["record_hash"]) for row in rows if _long_answer(row)}
            if answers:  # each row goes in without its answer; the answer follows, a slice at a time
                rows = [row | {"output_text": None} if row["id"] in answers else row for row in rows]
        large = [row for row in rows if _large(row)] if self._sqlite else []
        staged = [row for row in rows if _stageable(row)] if self._postgres else []
        if huge:  # the pieces its record joined the text from are free: handed back before the copies are made
            release_freed_memory()
        with self.engine.connect() as conn:
            with conn.begin():
                if staged and self._stage(conn, staged):
                    ids = {row["id"] for row in staged}
                    rows = [row for row in rows if row["id"] not in ids]
                    conn.execute(self._staged_upsert, [_without_answer(row) for row in staged])
                else:
                    staged = []
                if len(large) < len(rows):
                    conn.execute(self._upsert, [row for row in rows if not _large(row)] if large else rows)
                for row in large:
                    self._upsert_lazily(conn, row)
                for rid, (text, record_hash) in answers.items():
                    _write_answer_bytes(conn.connection.driver_connection, rid, text, record_hash)
                if head is not None:
                    self._advance_head(conn, head)
            if large or answers or staged:
                # Committed. A prepared statement keeps its last bound values until it
                # runs again, and sqlite3 caches its statements per connection: SQLite's
                # copies of the huge texts (what the client was delivered when a filter
                # made it differ, tool calls' arguments) stayed allocated until the next
                # row came; a huge answer's bytes filled the page cache. Closing this
                # connection frees them at once; the pool opens a new one for the next write.
                conn.invalidate()
        self.written += sum(1 for row in (*rows, *staged) if row["status"] != IN_PROGRESS)  # final records
        self.last_write = datetime.now(UTC)
        if huge:
            release_freed_memory()
        if head is not None and head.seq > self.committed.seq:
            self.committed = head
            self._head_file.save(head)
            self._checkpoint()

    def _stage(self, conn, rows: list[dict[str, Any]]) -> bool:
        """PostgreSQL: copy the rows' huge answers into this session's staging table, a
        slice at a time, for :data:`_staged_upsert_statement` to take them from; False
        (bind them as text, as before) where the role may not make a temporary table.

        Why: bound as a parameter, the answer is encoded whole by psycopg and copied whole
        again into libpq's buffer: a 200 MiB answer took the proxy to 3.4 times its size.
        ``COPY ... FROM STDIN`` in binary form takes the UTF-8 bytes in pieces, and a text
        column's binary form is its UTF-8 itself, so nothing is escaped or held whole.
        """
        pg = conn.connection.driver_connection
        if self._can_stage is None:
            # psycopg 3's COPY, and UTF-8 as the session reads it (binary COPY takes text
            # in the client encoding): another driver or encoding binds, as before
            why = None
            if type(pg).__module__.partition(".")[0] != "psycopg":
                why = f"the driver is {type(pg).__module__}, not psycopg 3"
            elif pg.info.encoding != "utf-8":
                why = f"the session's client encoding is {pg.info.encoding}, not UTF-8"
            elif not conn.execute(text("SELECT has_database_privilege(current_database(), 'TEMPORARY')")).scalar():
                why = "this database role may not create temporary tables"
            if why is None:
                self._can_stage = True
            else:
                self._stop_staging(why)
        if not self._can_stage:
            return False
        try:
            _copy_answers(pg, {row["id"]: row["output_text"] for row in rows})
        except Exception as e:
            self._stop_staging(f"staging failed: {first_line(e)}")
            raise _StagingFailed from e
        return True

    def _stop_staging(self, why: str) -> None:
        self._can_stage = False
        log.warning(
            "llm-audit: huge answers are bound as text on this database (%s): about three times their size in "
            "memory while written",
            why,
        )

    def _upsert_lazily(self, conn, row: dict[str, Any]) -> None:
        """Upsert one row with a huge text on SQLite, each parameter made as the driver binds it.

        Through SQLAlchemy, every parameter is made before the statement runs: the
        ``output`` column's JSON text (the answer once more) would be held while SQLite
        copies each bound value and then the whole record. Here the same statement, with
        the same bind processors (so the stored values are the same), goes to the DBAPI
        cursor with :class:`_LazyParameters`: ``sqlite3`` lets each value go once bound.
        """
        keys = tuple(row)
        compiled = self._compiled.get(keys)
        if compiled is None:
            compiled = self._compiled[keys] = self._upsert.compile(dialect=self.engine.dialect, column_keys=keys)
        cursor = conn.connection.cursor()
        try:
            cursor.execute(
                compiled.string,
                _LazyParameters(compiled.positiontup, compiled.construct_params(row), compiled._bind_processors),
            )
        finally:
            cursor.close()

    def _advance_head(self, conn, head: Head) -> None:
        """Move the ``chains`` row of this instance to ``head`` (never backwards)."""
        conn.execute(
            self._head_upsert,
            {
                "chain_id": self.instance,
                "head_seq": head.seq,
                "head_hash": head.hash,
                "start_seq": 1,
                "start_prev_hash": GENESIS,
            },
        )

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

    def _report(self, force: bool = False, alive: bool = True, stopped: bool = False) -> None:
        """Keep the status file current (at most about once a second; :class:`~storage.status.WriterStatus`
        also logs the heartbeat)."""
        doc = {
            "pid": os.getpid(),
            "pid_started": self._process_start,
            "instance": self.instance,
            "started": self.started,
            "database": shown_url(self.engine.url),
            "written": self.written,
            "spooled": self.spool.records,
            "quarantined": self.quarantined,
            "held": len(self._held),
            "queued": self._in_memory() - len(self._held),
            "last_write": self.last_write,
            "last_error": self.last_error,
            "writer_alive": alive,
            "stopped": stopped,
        }
        self.status.update(doc, force=force)

    def _mark_interrupted(self) -> None:
        """Rows this instance left open before this run started were cut by a crash: the
        ones that prove they are its own become ``interrupted`` and are sealed into the
        chain (:func:`~storage.adoption.adopt_interrupted`); others are reported, never sealed."""
        before = self.chain.head
        try:
            with self.engine.begin() as conn:
                adopted, foreign = adopt_interrupted(conn, self.chain, self._secret, self.instance, self.started)
                if adopted:
                    self._advance_head(conn, self.chain.head)
        except SQLAlchemyError:
            self.chain.head = before  # nothing of it was written
            raise
        if adopted:
            self.committed = self.chain.head
            self._head_file.save(self.committed)
            log.warning("llm-audit: marked %d exchanges left open by an earlier run as interrupted", adopted)
        if foreign:
            log.warning(
                "llm-audit: %d exchanges in progress under this instance (first: %s) were not opened by this "
                "proxy (their open_mac does not check out): left open, not sealed into the chain; inserted "
                "by hand, or opened with another adoption secret",
                len(foreign),
                foreign[0],
            )


class _RecentIds:
    """The last ``size`` ids added, for a membership test (bounded memory)."""

    def __init__(self, size: int) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._size = size

    def add(self, record_id: str) -> bool:
        """Add an id; False when it was among the recent ones already."""
        if record_id in self._ids:
            return False
        self._ids[record_id] = None
        if len(self._ids) > self._size:
            self._ids.popitem(last=False)
        return True


def _upsert_statement(engine: Engine) -> Any:
    """INSERT ... ON CONFLICT (id) DO UPDATE ... WHERE the stored row is still in progress."""
    stmt = insert_for(engine)(exchanges)
    return stmt.on_conflict_do_update(
        index_elements=[exchanges.c.id],
        set_={c.name: stmt.excluded[c.name] for c in exchanges.columns if c.name != "id"},
        where=exchanges.c.status == IN_PROGRESS,
    )


# PostgreSQL's staging table for huge answers: one per session (temporary), emptied by
# every commit, so a staged answer never outlives the transaction that wrote its row.
# Named with its schema wherever it is read or written: a table of that name elsewhere on
# the search path (made by anyone who may create tables) is never the one used.
_STAGE = Table(
    "llm_audit_answers", MetaData(), Column("id", String, primary_key=True), Column("answer", Text), schema="pg_temp"
)
_STAGE_DDL = (
    "CREATE TEMPORARY TABLE IF NOT EXISTS llm_audit_answers (id text PRIMARY KEY, answer text) ON COMMIT DELETE ROWS"
)
_COPY_STAGE = "COPY pg_temp.llm_audit_answers (id, answer) FROM STDIN (FORMAT BINARY)"
_PGCOPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0)  # signature, flags, no extension
_PGCOPY_TRAILER = struct.pack("!h", -1)
_COPY_MAX_CHARS = (2**31 - 1) // 4  # a field's length is a signed 32-bit count of bytes


class _StagingFailed(Exception):
    """Staging a batch's answers failed; its transaction is rolled back and staging turned off."""


def _staged_upsert_statement() -> Any:
    """The upsert of a row whose answer waits in :data:`_STAGE` (PostgreSQL): the answer is
    read there by the statement itself, so the row goes in whole, in one statement, as any
    other (an answer set by a later UPDATE would change a final record, which the proxy
    role's trigger refuses)."""
    answer = select(_STAGE.c.answer).where(_STAGE.c.id == bindparam("staged_id")).scalar_subquery()
    stmt = postgresql.insert(exchanges).values(output_text=answer)
    return stmt.on_conflict_do_update(
        index_elements=[exchanges.c.id],
        set_={c.name: stmt.excluded[c.name] for c in exchanges.columns if c.name != "id"},
        where=exchanges.c.status == IN_PROGRESS,
    )


def _stageable(row: dict[str, Any]) -> bool:
    """Whether a row's answer goes through the staging table: a huge answer, as on SQLite
    (:func:`_long_answer`), without U+0000 (which prepare has already made U+FFFD on
    PostgreSQL; a row still holding one is left to the plain statement, to be refused and
    reduced as before)."""
    if not _long_answer(row):
        return False
    answer: str = row["output_text"]
    return len(answer) < _COPY_MAX_CHARS and "\x00" not in answer


def _without_answer(row: dict[str, Any]) -> dict[str, Any]:
    params = {k: v for k, v in row.items() if k != "output_text"}
    params["staged_id"] = row["id"]
    return params


def _copy_answers(pg: Any, answers: dict[str, str]) -> None:
    """``COPY`` the answers into :data:`_STAGE` in PostgreSQL's binary format, one UTF-8
    slice at a time (:func:`storage.chain.utf8_slices`). ``pg``: the transaction's own
    psycopg connection."""
    with pg.cursor() as cur:
        cur.execute(_STAGE_DDL)
        with cur.copy(_COPY_STAGE) as copy:
            copy.write(_PGCOPY_HEADER)
            for rid, answer in answers.items():
                key = rid.encode()
                size = utf8_size(answer)
                copy.write(struct.pack("!hi", 2, len(key)) + key + struct.pack("!i", size))
                for data in utf8_slices(answer):
                    copy.write(data)
            copy.write(_PGCOPY_TRAILER)


def _head_statement(engine: Engine) -> Any:
    """INSERT ... ON CONFLICT (chain_id) DO UPDATE the head, WHERE it moves forward.

    Built once, its values bound per call: building it anew for every batch made its
    ``excluded`` proxies and its cache key again at every commit (the writer profile's
    ``_make_proxy`` and ``_generate_cache_key`` calls).
    """
    stmt = insert_for(engine)(chains)
    return stmt.on_conflict_do_update(
        index_elements=[chains.c.chain_id],
        set_={"head_seq": stmt.excluded.head_seq, "head_hash": stmt.excluded.head_hash},
        where=chains.c.head_seq < stmt.excluded.head_seq,
    )


def _is_final(row: Any) -> bool:
    """Whether a queued row ends its exchange (anything but a write-ahead open row)."""
    return not isinstance(row, dict) or row.get("status") != IN_PROGRESS


def _answer_chars(row: Any) -> int:
    """The length of a row's answer text (0 for anything else: a row not yet prepared may hold anything)."""
    text = row.get("output_text") if isinstance(row, dict) else None
    return len(text) if type(text) is str else 0


def _long_answer(row: dict[str, Any]) -> bool:
    """Whether a row's answer is written as bytes (:func:`_write_answer_bytes`): a final,
    sealed record's, of :data:`_BYTES_AT` characters or more. An open row keeps its text:
    adoption (``storage/adoption.py``) seals it as stored."""
    text = row.get("output_text")
    return type(text) is str and len(text) >= _BYTES_AT and row["status"] != IN_PROGRESS and is_sealed(row)


def _write_answer_bytes(sqlite: Any, rid: str, text: str, record_hash: str) -> None:
    """Write a huge answer into ``output_text_utf8`` of the row just upserted, a slice at a time.

    Bound as a text parameter, SQLite would copy the answer and then build the whole row
    in memory around it: about twice the text, on top of the text the proxy holds. A
    zero-filled BLOB in a row's last column is the one value SQLite writes without
    making it, and incremental blob I/O then fills it in place: one slice in memory.
    ``sqlite``: the transaction's own ``sqlite3`` connection, so the row and its answer
    are committed together or not at all.

    Only the row this batch wrote gets the bytes: one without an answer in either
    column and sealed with this record's hash (the upsert leaves a row that was already
    final as it is, and that row keeps its own answer).
    """
    size = utf8_size(text)
    mine = f"id = ? AND output_text IS NULL AND {ANSWER_BYTES} IS NULL AND record_hash = ?"
    if not sqlite.execute(
        f"UPDATE exchanges SET {ANSWER_BYTES} = zeroblob(?) WHERE {mine}", (size, rid, record_hash)
    ).rowcount:
        return  # the row was final already: it keeps its own answer
    (rowid,) = sqlite.execute("SELECT rowid FROM exchanges WHERE id = ?", (rid,)).fetchone()
    with sqlite.blobopen("exchanges", ANSWER_BYTES, rowid) as blob:
        for data in utf8_slices(text):
            blob.write(data)


def _large(row: dict[str, Any]) -> bool:
    """Whether a row carries huge texts to bind (what the client was delivered, tool calls'
    arguments; on SQLite the answer itself goes in as bytes, :func:`_write_answer_bytes`),
    written through :meth:`AuditWriter._upsert_lazily`."""
    size = len(row.get("output_text") or "") + len(row.get("delivered_text") or "")
    calls = row.get("tool_calls")
    if isinstance(calls, list):
        size += sum(len(a) for c in calls if isinstance(c, dict) and isinstance(a := c.get("arguments"), str))
    return size >= _LAZY_AT


class _LazyParameters:
    """A statement's DBAPI parameters, each made by its bind processor when the driver asks
    for it: ``sqlite3`` takes any sequence, binds item by item and drops each item once
    SQLite has its copy, so a big JSON text lives only while it is bound."""

    __slots__ = ("_names", "_params", "_processors")

    def __init__(self, names: Sequence[str], params: dict[str, Any], processors: dict[str, Callable[[Any], Any]]):
        self._names, self._params, self._processors = names, params, processors

    def __len__(self) -> int:
        return len(self._names)

    def __getitem__(self, index: int) -> Any:
        name = self._names[index]
        value = self._params[name]
        process = self._processors.get(name)
        return value if process is None else process(value)
