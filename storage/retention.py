"""Retention: deleting exchanges older than a cut-off, and recording that it happened.

Used by ``llm-audit purge`` and meant for the proxy's own periodic retention, so nothing
here knows about command lines. The EU AI Act (Article 26(6)) asks deployers of
high-risk AI systems to keep the logs for at least six months: :func:`check_cutoff`
refuses a cut-off that would delete younger records unless forced.

An exchange is purged when it *ended* before the cut-off. Rows still ``in_progress``
have not ended and are never purged. Rows a crash left ``interrupted`` never got an
``ended_at``; their ``started_at`` stands in for it (an exchange lasts minutes, the
retention months), else they would stay forever.

Deleting runs in batches, one short transaction each (delete up to ``batch_size`` of
the oldest matching rows, add them to the purge's ``purge_log`` row, commit), so the
proxy's writer is never locked out for long, and the log is right even when a purge is
interrupted: ``purge_log.deleted_count`` counts what is gone, ``finished_at`` stays
NULL.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import Connection, Engine, and_, delete, func, insert, not_, or_, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.sql.elements import ColumnElement

from storage.chain import GENESIS
from storage.database import DatabaseError, first_line
from storage.schema import IN_PROGRESS, chains, exchanges, purge_log
from storage.statements import MIN_RETENTION, Signer
from storage.verify import prefix_doubt, signed_heads

log = logging.getLogger(__name__)

#: The most days ``llm_audit_retention_days`` may keep: a century (more reaches no date).
MAX_RETENTION_DAYS = 36_500
_START = (chains.c.chain_id, chains.c.start_seq, chains.c.start_prev_hash)

_AGE = re.compile(r"(\d+)([hdw])")
_AGE_UNITS = {"h": "hours", "d": "days", "w": "weeks"}
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_DATETIME = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:?\d{2})")


class RetentionError(ValueError):
    """An age or date that cannot be used as a cut-off; the message is one line."""


@dataclass(frozen=True)
class PurgeResult:
    """What a purge deleted, or (``dry_run``) would delete."""

    count: int
    cutoff: datetime
    dry_run: bool
    log_id: int | None  # the purge_log row; None for a dry run
    # chains left whole because their records to be purged do not check (:func:`~storage.verify.prefix_doubt`)
    refused: dict[str, str] = field(default_factory=dict)


def parse_cutoff(older_than: str, now: datetime) -> datetime:
    """The cut-off (aware, UTC) for an age before ``now`` or a date.

    Accepted: ``Nh``, ``Nd``, ``Nw`` (hours, days, weeks: fixed lengths); an ISO 8601
    date ``YYYY-MM-DD`` (midnight UTC, the time zone of every time in the database); an
    ISO 8601 date and time with a UTC offset or ``Z``. Months and years are refused
    (their length varies, and ``m`` could mean minutes), as are times without an offset
    (local time or UTC?).
    """
    value = older_than.strip()
    if m := _AGE.fullmatch(value):
        try:
            return now.astimezone(UTC) - timedelta(**{_AGE_UNITS[m.group(2)]: int(m.group(1))})
        except OverflowError:
            raise RetentionError(f"{older_than!r} reaches before year 1") from None
    if _DATE.fullmatch(value):
        try:
            return datetime.combine(date.fromisoformat(value), datetime.min.time(), UTC)
        except ValueError as e:
            raise RetentionError(f"{older_than!r} is not a valid date ({e})") from None
    if _DATETIME.fullmatch(value):
        try:
            return datetime.fromisoformat(value).astimezone(UTC)
        except (ValueError, OverflowError) as e:  # OverflowError: its offset moves it past year 9999 or before 1
            raise RetentionError(f"{older_than!r} is not a valid date and time ({e})") from None
    if re.fullmatch(r"\d+(m|mo|y)", value, re.IGNORECASE):
        reason = "months and years vary in length (and m could be minutes); give days or weeks, e.g. 183d or 27w"
    elif re.fullmatch(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?", value):
        reason = "a time needs a UTC offset, e.g. 2025-01-31T12:00:00Z or 2025-01-31T12:00:00+01:00"
    else:
        reason = "use an age (Nh, Nd, Nw, e.g. 183d) or an ISO 8601 date (2025-01-31) or date and time with offset"
    raise RetentionError(f"{older_than!r}: {reason}")


def check_cutoff(cutoff: datetime, now: datetime, *, force: bool) -> None:
    """Refuse a cut-off that keeps less than :data:`MIN_RETENTION`, unless ``force``.

    The message says why, not how to override: the caller adds its own fix (``--force``,
    an option value).
    """
    if force or cutoff <= now - MIN_RETENTION:
        return
    raise RetentionError(
        f"the cut-off {cutoff.isoformat()} would delete exchanges younger than {MIN_RETENTION.days} days; "
        "the EU AI Act (Article 26(6)) asks deployers to keep logs for at least six months"
    )


def purge(
    engine: Engine,
    cutoff: datetime,
    *,
    dry_run: bool,
    actor: str,
    older_than: str,
    batch_size: int = 1000,
    signer: Signer | None = None,
    stop: threading.Event | None = None,
) -> PurgeResult:
    """Delete the exchanges that ended before ``cutoff`` (see the module docstring).

    ``actor`` (who) and ``older_than`` (the age or date as asked, e.g. ``183d``) go to
    ``purge_log``. A dry run only counts: it deletes and records nothing. Does not check
    the minimum retention: call :func:`check_cutoff` first. Database failures raise
    :class:`DatabaseError` saying how many rows were deleted before.

    A hash chain (:mod:`storage.chain`) must stay checkable, so it loses only a prefix:
    each chain is cut just before its first record that is not old enough (a record
    sealed late, e.g. one marked ``interrupted`` at a restart, waits for the next purge
    with the records after it). The chain's new start is recorded in ``chains`` and in
    the purge's ``purge_log`` row before anything is deleted, and, given a ``signer``,
    in a signed purge statement (:mod:`storage.statements`), without which
    ``verify --checkpoints`` calls the moved start tampering. The chains it cuts must
    check first (:func:`~storage.verify.prefix_doubt`: each matches its hash, links, and
    matches the checkpoints in the signer's folder): what is old is read from the
    database, which whoever can write it could have made say so. A chain whose records do
    not is left whole, and named in the result (``refused``).
    """
    if cutoff.tzinfo is None:
        raise ValueError("cutoff must be an aware datetime")
    cutoff = cutoff.astimezone(UTC)  # SQLite stores the UTC wall time as text
    try:
        with engine.connect() as conn:
            cuts, unreadable = _chain_cuts(conn, cutoff)
            begins = {r.chain_id: r.start_seq for r in conn.execute(select(*_START[:2])) if type(r.start_seq) is int}
            if dry_run:
                to_purge = or_(*(condition for condition, _ in _batches(cutoff, cuts, begins)))
                count = conn.execute(select(func.count()).select_from(exchanges).where(to_purge)).scalar_one()
                return PurgeResult(count, cutoff, dry_run=True, log_id=None)
    except SQLAlchemyError as e:
        raise DatabaseError(f"cannot count the exchanges to purge: {first_line(e)}") from None

    refused = unreadable | _doubts(engine, signer, cuts, begins)
    cuts = [cut for cut in cuts if cut.chain_id not in refused]
    begins = {chain_id: start for chain_id, start in begins.items() if chain_id not in refused}
    deleted = 0
    try:
        with engine.begin() as conn:
            starts = {cut.chain_id: {"seq": cut.last + 1, "prev_hash": cut.last_hash} for cut in cuts}
            if signer is not None and starts:
                signer.purge(cutoff, starts, datetime.now(UTC))
            log_id = conn.execute(
                insert(purge_log)
                .values(
                    purged_at=datetime.now(UTC),
                    actor=actor,
                    cutoff=cutoff,
                    older_than=older_than,
                    deleted_count=0,
                    chain_starts=starts,
                )
                .returning(purge_log.c.id)
            ).scalar_one()
            for cut in cuts:
                _move_start(conn, cut)
        stop = stop or threading.Event()
        for condition, order in _batches(cutoff, cuts, begins):
            while not stop.is_set():
                n, pause = _delete_batch(engine, log_id, condition, order, batch_size)
                deleted += n
                if n < batch_size:
                    break
                stop.wait(pause)
        if stop.is_set():  # (stopped between batches: purge_log's finished_at stays NULL, the next purge goes on)
            return PurgeResult(deleted, cutoff, dry_run=False, log_id=log_id, refused=refused)
        with engine.begin() as conn:
            conn.execute(update(purge_log).where(purge_log.c.id == log_id).values(finished_at=datetime.now(UTC)))
    except SQLAlchemyError as e:
        raise DatabaseError(f"purge failed after deleting {deleted} exchanges: {first_line(e)}") from None
    return PurgeResult(deleted, cutoff, dry_run=False, log_id=log_id, refused=refused)


@dataclass(frozen=True, slots=True)
class _Cut:
    """A chain loses its records up to ``last`` (whose hash the next record links to)."""

    chain_id: str
    last: int
    last_hash: str


def _old(cutoff: datetime) -> ColumnElement[bool]:
    """Ended before the cut-off (an interrupted record, which has no end: started before)."""
    c = exchanges.c
    return and_(c.status != IN_PROGRESS, func.coalesce(c.ended_at, c.started_at) < cutoff)


def _chain_cuts(conn: Connection, cutoff: datetime) -> tuple[list[_Cut], dict[str, str]]:
    """Where each chain is cut: before its first record that is not old enough; and the
    chains whose numbers cannot be read (a value the writer never writes, such as text
    in ``chain_seq`` on SQLite), each with why: left whole, named, not a purge's failure."""
    c = exchanges.c
    starts = {r.chain_id: r.start_seq for r in conn.execute(select(chains.c.chain_id, chains.c.start_seq))}
    first_kept = dict(
        conn.execute(
            select(c.chain_id, func.min(c.chain_seq))
            .where(c.chain_id.is_not(None), not_(_old(cutoff)))
            .group_by(c.chain_id)
        ).all()
    )
    last_seq = dict(
        conn.execute(
            select(c.chain_id, func.max(c.chain_seq)).where(c.chain_id.is_not(None)).group_by(c.chain_id)
        ).all()
    )
    cuts, unreadable = [], {}
    for chain_id, top in sorted(last_seq.items(), key=lambda item: str(item[0])):
        kept, start = first_kept.get(chain_id), starts.get(chain_id, 1)
        if not all(type(n) is int for n in (top, start, kept if kept is not None else 0)):
            unreadable[chain_id] = "its numbers or its start in the chains table are not integers"
            continue
        if kept is not None and (behind := _old_behind(conn, chain_id, kept, cutoff)):
            log.warning(
                "llm-audit: chain %r: %d exchanges that ended before the cut-off are kept behind record %d, which"
                " did not (a record sealed late, or dated ahead by a clock): they go once it does",
                chain_id,
                behind,
                kept,
            )
        last = kept - 1 if kept is not None else top
        if last < start:
            continue
        last_hash = conn.execute(
            select(c.record_hash).where(c.chain_id == chain_id, c.chain_seq == last).limit(1)
        ).scalar()
        if last_hash is not None:
            cuts.append(_Cut(chain_id, last, last_hash))
    return cuts, unreadable


def _doubts(engine: Engine, signer: Signer | None, cuts: list[_Cut], begins: dict[str, int]) -> dict[str, str]:
    """The chains whose records to be purged do not check (:func:`~storage.verify.prefix_doubt`):
    a cut's records, from the lowest still there (an unfinished purge's leftovers before
    the start, or records someone moved the start past, are checked too), and a chain's
    leftovers alone when nothing else of it is cut."""
    c = exchanges.c
    heads = signed_heads(signer)
    lasts = {cut.chain_id: cut.last for cut in cuts}
    lasts |= {chain_id: start - 1 for chain_id, start in begins.items() if start > 1 and chain_id not in lasts}
    if not lasts:
        return {}
    doubts = {}
    with engine.connect() as conn:
        starts = {r.chain_id: (r.start_seq, r.start_prev_hash) for r in conn.execute(select(*_START))}
        lowest = select(c.chain_id, func.min(c.chain_seq)).where(c.chain_id.is_not(None)).group_by(c.chain_id)
        lows = dict(conn.execute(lowest).all())
        for chain_id, last in lasts.items():
            start, start_prev = starts.get(chain_id, (1, GENESIS))
            low = lows.get(chain_id)
            if type(low) is not int:
                continue  # (nothing there to delete, or numbers _chain_cuts already named)
            first, link = (low, None) if low < start else (start, start_prev)
            doubt = prefix_doubt(conn, chain_id, first, link, last, heads.get(chain_id, {}))
            if doubt is not None:
                doubts[chain_id] = doubt
    return doubts


def _old_behind(conn: Connection, chain_id: str, kept: int, cutoff: datetime) -> int:
    """How many old records follow ``kept``, the chain's first record that is not old: a
    chain loses only a prefix, so they wait (for GDPR's storage limit: said, not silent)."""
    c = exchanges.c
    where = (c.chain_id == chain_id, c.chain_seq > kept, _old(cutoff))
    return int(conn.execute(select(func.count()).select_from(exchanges).where(*where)).scalar_one())


def _batches(
    cutoff: datetime, cuts: list[_Cut], begins: dict[str, int]
) -> list[tuple[ColumnElement[bool], ColumnElement]]:
    """The rows to purge: conditions, each with the indexed column that finds them in order.

    One per chain cut (its prefix, by number); one per other chain with records before
    its start (``begins``: each chain's start; only old ones), which a purge that did not finish left (signed gone already,
    the start moved past them); and one for old records in no chain (written before
    chains existed), so that every batch is an index range scan.
    """
    c = exchanges.c
    cut = {cut.chain_id for cut in cuts}
    return [
        *((and_(c.chain_id == cut.chain_id, c.chain_seq <= cut.last), c.chain_seq) for cut in cuts),
        *(
            (and_(c.chain_id == chain_id, c.chain_seq < start, _old(cutoff)), c.chain_seq)
            for chain_id, start in begins.items()
            if start > 1 and chain_id not in cut
        ),
        (and_(c.chain_id.is_(None), _old(cutoff)), c.started_at),
    ]


def _move_start(conn: Connection, cut: _Cut) -> None:
    """The chain starts after ``cut``, only ever forward: of two purges that overlap (the
    proxy's retention and an operator's, or two proxies'), the one with the older cut-off
    may commit last, and moving the start back would make the records the other deleted
    missing from the chain (``verify``: deleted)."""
    c = chains.c
    values = {"start_seq": cut.last + 1, "start_prev_hash": cut.last_hash}
    forward = update(chains).where(c.chain_id == cut.chain_id, c.start_seq < cut.last + 1).values(values)
    if (
        not conn.execute(forward).rowcount
        and conn.execute(select(c.chain_id).where(c.chain_id == cut.chain_id)).first() is None
    ):
        conn.execute(insert(chains).values(chain_id=cut.chain_id, head_seq=cut.last, head_hash=cut.last_hash, **values))


def _delete_batch(
    engine: Engine, log_id: int, condition: ColumnElement[bool], order: ColumnElement, batch_size: int
) -> tuple[int, float]:
    """Delete one batch and count it in ``purge_log``, in one transaction.

    Returns the rows deleted and how long to pause before the next batch. SQLite has a
    single writer and its busy handler is not fair: a proxy writer that waits for the
    lock polls every few to 100 ms, and a purge that takes the lock straight back after
    each commit could starve it. Pausing as long as the batch took leaves it at least
    half the time. PostgreSQL locks rows, not the table: no pause.
    """
    started = time.monotonic()
    batch = select(exchanges.c.id).where(condition).order_by(order).limit(batch_size)
    with engine.begin() as conn:
        n = conn.execute(delete(exchanges).where(exchanges.c.id.in_(batch.scalar_subquery()))).rowcount
        if n:
            conn.execute(
                update(purge_log).where(purge_log.c.id == log_id).values(deleted_count=purge_log.c.deleted_count + n)
            )
    return n, (max(time.monotonic() - started, 0.005) if engine.dialect.name == "sqlite" else 0.0)


class DailyPurge:
    """Automatic retention for the proxy: purge exchanges older than ``days``, daily.

    Runs on its own thread (a purge takes many short transactions; the proxy's event
    loop and the writer never wait for it), first shortly after start, then every
    ``interval`` seconds. Every failure is logged and retried at the next run: one
    statement that could not be written, or one row the purge cannot read, must not end
    retention until the proxy restarts. Each purge is a signed statement that ``verify
    --checkpoints`` accepts (``signer``: the proxy's checkpoint key and folder; the proxy
    runs no retention without one, since an unsigned purge is reported as tampering).
    """

    FIRST_RUN_DELAY = 5.0
    INTERVAL = 24 * 3600.0

    def __init__(self, engine: Engine, days: int, actor: str, signer: Signer) -> None:
        self.engine, self.days, self.actor, self.signer = engine, days, actor, signer
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llm-audit-retention", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop, without waiting: this runs on the proxy's event loop, and a purge waiting
        for SQLite's lock could hold it for seconds. A purge under way stops after its
        batch (its start moved, ``finished_at`` NULL: the next purge deletes the rest)."""
        self._stop.set()

    def _run(self) -> None:
        delay = self.FIRST_RUN_DELAY
        while not self._stop.wait(delay):
            delay = self.INTERVAL
            try:
                cutoff = datetime.now(UTC) - timedelta(days=self.days)
                result = purge(
                    self.engine,
                    cutoff,
                    dry_run=False,
                    actor=self.actor,
                    older_than=f"{self.days}d",
                    signer=self.signer,
                    stop=self._stop,
                )
            except DatabaseError as e:
                log.warning("llm-audit: automatic retention failed (%s); retrying in a day", e)
                continue
            except Exception as e:  # noqa: BLE001 - any failure waits for the next run, never ends retention
                log.error("llm-audit: automatic retention failed (%s: %s); retrying in a day", type(e).__name__, e)
                continue
            log.info("llm-audit: retention purged %d exchanges that ended before %s", result.count, cutoff.isoformat())
            for chain_id, problem in result.refused.items():
                log.error(
                    "llm-audit: retention left chain %r whole: it does not verify (%s); see llm-audit verify",
                    chain_id,
                    problem,
                )
