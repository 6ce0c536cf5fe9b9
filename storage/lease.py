"""One proxy per chain: the lease on a ``chains`` row.

A chain is one writer's sequence; two proxies started with one ``llm_audit_instance`` on
one database would both number records from the same head and fork the chain, which
``verify`` then reports as tampering forever. So a writer takes the lease on its chain's
row at start (``lease_holder``: host, pid and start time; ``lease_until``: now +
:data:`LEASE`) and renews it with a heartbeat from its thread. A second proxy finds the
lease held and is refused with one line naming the fix; a lease that lapsed (its holder
died without releasing it), or one held by a process of this host that no longer runs
(a proxy killed and restarted at once), is taken over. Claiming is one conditional ``UPDATE``, atomic
on SQLite and PostgreSQL alike.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, or_, select, update
from sqlalchemy.exc import SQLAlchemyError

from storage.chain import GENESIS
from storage.database import DatabaseError, first_line, insert_for
from storage.schema import chains
from storage.status import pid_alive

log = logging.getLogger(__name__)


class LeaseHeld(DatabaseError):
    """Another live proxy holds the chain's lease; the message names the fix."""


LEASE = timedelta(seconds=60)  # how long a lease runs without a heartbeat
RENEW_EVERY = 15.0  # seconds between heartbeats


def holder_name(started: datetime) -> str:
    """Who holds a lease: this host, process, its start and a random tag (two writers of
    one process, as in the tests, are two holders)."""
    return (
        f"{socket.gethostname()} pid {os.getpid()} since {started.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ} "
        f"#{secrets.token_hex(3)}"
    )


def _dead_here(holder: str | None) -> bool:
    """Whether ``holder`` names a process of this host that no longer runs."""
    host, _, rest = (holder or "").partition(" pid ")
    pid = rest.split(" ", 1)[0]
    return host == socket.gethostname() and pid.isdigit() and not pid_alive(int(pid))


def claim(engine: Engine, chain_id: str, holder: str, now: datetime | None = None) -> None:
    """Take the lease on ``chain_id`` for ``holder``, or raise :class:`DatabaseError` (one
    line naming the fix) when another proxy holds it."""
    now = now or datetime.now(UTC)
    c = chains.c
    insert = insert_for(engine)
    try:
        with engine.begin() as conn:
            conn.execute(
                insert(chains)
                .values(chain_id=chain_id, head_seq=0, head_hash=GENESIS, start_seq=1, start_prev_hash=GENESIS)
                .on_conflict_do_nothing(index_elements=["chain_id"])
            )
            free = or_(c.lease_holder.is_(None), c.lease_until < now, c.lease_holder == holder)
            take = update(chains).values(lease_holder=holder, lease_until=now + LEASE)
            other = None
            if not conn.execute(take.where(c.chain_id == chain_id, free)).rowcount:
                other = conn.execute(select(c.lease_holder, c.lease_until).where(c.chain_id == chain_id)).one()
                if (
                    _dead_here(other.lease_holder)
                    and conn.execute(take.where(c.chain_id == chain_id, c.lease_holder == other.lease_holder)).rowcount
                ):
                    other = None
    except SQLAlchemyError as e:
        raise DatabaseError(f"cannot take the lease on the hash chain {chain_id!r}: {first_line(e)}") from None
    if other is not None:
        raise LeaseHeld(
            f"another proxy ({other.lease_holder}) records into this database as instance {chain_id!r} (its lease "
            f"runs until {other.lease_until:%Y-%m-%dT%H:%M:%SZ}); give this proxy its own name with "
            f"--set llm_audit_instance=NAME, or stop the other one (a lease it left behind lapses "
            f"{int(LEASE.total_seconds())} s after its last heartbeat)"
        )


def renew(engine: Engine, chain_id: str, holder: str) -> bool:
    """The heartbeat: extend the lease; False when it is no longer ours (taken over after
    it lapsed). Database errors propagate (the caller retries at the next heartbeat)."""
    now = datetime.now(UTC)
    with engine.begin() as conn:
        return bool(
            conn.execute(
                update(chains)
                .where(chains.c.chain_id == chain_id, chains.c.lease_holder == holder)
                .values(lease_until=now + LEASE)
            ).rowcount
        )


def release(engine: Engine, chain_id: str, holder: str) -> None:
    """Give the lease up at shutdown, so the next start need not wait for it to lapse."""
    with engine.begin() as conn:
        conn.execute(
            update(chains)
            .where(chains.c.chain_id == chain_id, chains.c.lease_holder == holder)
            .values(lease_holder=None, lease_until=None)
        )


class Lease:
    """A writer's hold on its chain: taken at start, kept by the heartbeats of the writer
    thread (:meth:`keep`), given up at shutdown."""

    def __init__(self, engine: Engine, chain_id: str, started: datetime) -> None:
        self.engine, self.chain_id = engine, chain_id
        self.holder = holder_name(started)
        self.held = self._take()  # another proxy recording under this name: LeaseHeld, raised here
        self._at = time.monotonic()

    def _take(self) -> bool:
        """Claim the lease: another live proxy holding it raises :class:`LeaseHeld`; a
        database that cannot take the write now (locked, say) only delays it to the next
        heartbeat, as spooling delays records."""
        try:
            claim(self.engine, self.chain_id, self.holder)
        except LeaseHeld:
            raise
        except DatabaseError as e:
            log.warning("llm-audit: %s; retried at the next heartbeat", e)
            return False
        return True

    def keep(self) -> None:
        """Renew the lease every :data:`RENEW_EVERY` seconds (take it, when the start could
        not); a lease found taken over is logged as the error it is."""
        if time.monotonic() - self._at < RENEW_EVERY:
            return
        self._at = time.monotonic()
        try:
            if not self.held:
                self.held = self._take()
            elif not renew(self.engine, self.chain_id, self.holder):
                log.error(
                    "llm-audit: another proxy took over the lease on chain %r after this one missed its "
                    "heartbeats; the chain may fork: stop one of them",
                    self.chain_id,
                )
                self.held = False
        except LeaseHeld as e:
            log.error("llm-audit: %s", e)
        except SQLAlchemyError as e:
            log.warning("llm-audit: cannot renew the lease on chain %r (%s)", self.chain_id, first_line(e))

    def release(self) -> None:
        """Give the lease up (the end of the writer thread)."""
        release(self.engine, self.chain_id, self.holder)
