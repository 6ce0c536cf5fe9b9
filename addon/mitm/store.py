"""The audit-store addon: where records go, and the guarantee that the proxy does not run
without recording.

It owns the database options (URL, spool, instance name, signing key and checkpoints,
retention), opens the writer when they are configured and closes it in ``done``, and
hands records to it (:meth:`AuditStore.submit`, which never waits for the database), and
then each final one to the OpenTelemetry export when it is on (:mod:`addon.mitm.otel`).
Problems are logged as one ``llm-audit: ...`` error line instead of raised: a script's
raised OptionsError is printed with a traceback, while an error line at start-up makes
mitmdump exit ("Error logged during startup, exiting..."). At run time the previous,
working database stays in force.

A proxy that passes traffic without recording it must not run silently: shortly after
start, and after an option change at run time, the proxy is stopped when no database
is open.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mitmproxy.addonmanager import Loader

from addon.record import ExchangeRecord, Status
from storage.checkpoint import (
    Checkpointer,
    CheckpointError,
    default_checkpoint_dir,
    default_key_path,
    load_or_create_key,
)
from storage.cost import Prices, PricesError, load_prices
from storage.database import DatabaseError, default_url, open_engine, shown_url
from storage.retention import MAX_RETENTION_DAYS, MIN_RETENTION, DailyPurge
from storage.spool import Spool, SpoolLocked, default_spool_path
from storage.statements import Signer
from storage.writer import AuditWriter

log = logging.getLogger(__name__)

CHECKPOINT_OPTIONS = (
    "llm_audit_signing_key",
    "llm_audit_checkpoints",
    "llm_audit_checkpoint_every",
    "llm_audit_checkpoint_minutes",
    "llm_audit_checkpoint_command",
)
DATABASE_OPTIONS = frozenset({"llm_audit_db", "llm_audit_spool", "llm_audit_instance", *CHECKPOINT_OPTIONS})
RETENTION_OPTIONS = frozenset({"llm_audit_db", "llm_audit_spool", "llm_audit_instance", "llm_audit_retention_days"})
START_GRACE = 1.0  # seconds after loading by which the addon must be recording


class AuditStore:
    """Opens the audit database and its writer, and takes the records to write."""

    def __init__(self) -> None:
        self.writer: AuditWriter | None = None
        self.retention: DailyPurge | None = None
        self.instance = socket.gethostname()
        self.configured = False  # mitmproxy called configure (it does not when it refused an option)
        self.problem: str | None = None  # why the addon cannot record, when known
        self._watchdog: asyncio.Task | None = None  # held: the event loop keeps only weak references to tasks
        self.serving = False  # the proxy is serving traffic
        # called with each row handed to the writer (budgets count the final ones); never raise
        self.listeners: list[Callable[[dict[str, Any]], None]] = []
        # the OpenTelemetry export (addon.mitm.otel), given each final row; never raises
        self.export: Callable[[dict[str, Any]], None] | None = None
        self.prices: Prices | None = None  # the price file in force (llm_audit_prices)

    def load(self, loader: Loader) -> None:
        self._refuse_repeated_options(loader.master.options)
        self._watch_start(loader.master)
        loader.add_option(
            "llm_audit_db",
            str,
            "",
            "SQLAlchemy URL of the audit database. Empty: $LLM_AUDIT_DB, else "
            "sqlite:///~/.local/share/llm-audit/audit.db ($XDG_DATA_HOME respected).",
        )
        loader.add_option(
            "llm_audit_instance",
            str,
            "",
            "Name of this proxy in the audit records (proxy_instance). Empty: the host name. "
            "Several proxies on one host sharing a database need distinct names.",
        )
        loader.add_option(
            "llm_audit_retention_days",
            int,
            0,
            "Purge exchanges that ended more than this many days ago, daily (0: never). "
            "At least 183 (the EU AI Act asks deployers to keep logs six months), at most 36500. "
            "Each purge is signed with the checkpoint key: without a usable key there is none.",
        )
        loader.add_option(
            "llm_audit_spool",
            str,
            "",
            "File that keeps records while the database cannot take them. Empty: "
            "~/.local/state/llm-audit/spool-INSTANCE.jsonl ($XDG_STATE_HOME respected).",
        )
        loader.add_option(
            "llm_audit_signing_key",
            str,
            "",
            "Ed25519 key that signs this proxy's checkpoints (created on first use). Empty: "
            "~/.local/share/llm-audit/signing-key.pem ($XDG_DATA_HOME respected).",
        )
        loader.add_option(
            "llm_audit_checkpoints",
            str,
            "",
            "Directory for this proxy's signed checkpoints of its hash chain. Empty: "
            "~/.local/share/llm-audit/checkpoints ($XDG_DATA_HOME respected).",
        )
        loader.add_option(
            "llm_audit_checkpoint_every",
            int,
            1000,
            "Write a checkpoint every N records (0: not by count).",
        )
        loader.add_option(
            "llm_audit_checkpoint_minutes",
            int,
            10,
            "Write a checkpoint at least every N minutes while records come (0: not by time). "
            "With both 0, only at shutdown and with llm-audit checkpoint.",
        )
        loader.add_option(
            "llm_audit_checkpoint_command",
            str,
            "",
            "Command run with each new checkpoint file's path appended, to keep a copy where the "
            "database's administrators cannot rewrite it (e.g. 'logger -t llm-audit -f' for syslog).",
        )
        loader.add_option(
            "llm_audit_prices",
            str,
            "",
            "TOML price file for negotiated rates and self-hosted models, tried before the prices of "
            "genai-prices (docs/cost.md). Read when the option is set; a file that cannot be used "
            "stops the proxy at start, and keeps the previous prices at run time.",
        )

    def configure(self, updated: set[str]) -> None:
        """Open the database when its options change (the first time, all of them)."""
        from mitmproxy import ctx

        self.configured = True
        if "llm_audit_instance" in updated:
            self.instance = ctx.options.llm_audit_instance or socket.gethostname()
        if "llm_audit_prices" in updated:
            self._load_prices(ctx.options.llm_audit_prices)
        if updated & DATABASE_OPTIONS:
            spool = ctx.options.llm_audit_spool or str(default_spool_path(self.instance))
            self._open_database(
                ctx.options.llm_audit_db or default_url(), Path(spool).expanduser(), self._checkpointer(ctx.options)
            )
            if self.writer is None and self.serving:
                self._stop_unrecorded(
                    "the audit database could not be opened after an option change; see the line above"
                )
        if updated & RETENTION_OPTIONS:
            self._schedule_retention(ctx.options.llm_audit_retention_days)

    def running(self) -> None:
        self.serving = True

    def done(self) -> None:
        """Write everything queued, then close the database. Runs after the exchange
        hooks' ``done`` (they come first in the addon list), which submits the records
        of the exchanges still open."""
        if self.retention is not None:
            self.retention.close()
            self.retention = None
        if self.writer is not None:
            self.writer.close()
            log.info(self.writer.summary())
            self.writer = None

    def submit(self, record: ExchangeRecord) -> None:
        """Queue the record's row for the writer thread; the caller never waits."""
        if self.writer is None:
            log.error("llm-audit: no database configured; record %s dropped", record.id)
            return
        final = record.status != Status.IN_PROGRESS
        if final and record.submitted_final:
            # The writer refuses it too (storage.writer's _once); refused here, the budgets
            # and the export do not count the exchange twice either.
            log.error("llm-audit: record %s was submitted final twice; the first one stands", record.id)
            return
        row = record.to_row()
        # first: the writer's thread takes the row over (and prices it) once submitted
        for listener in self.listeners:
            listener(row)
        if final and self.export is not None:
            self.export(row)
        record.submitted_final = final
        self.writer.submit(row)

    # -- not recording: say so and stop ---------------------------------------------------

    def _refuse_repeated_options(self, options: Any) -> None:
        """An llm-audit option given twice makes mitmproxy drop the whole addon without a
        word ("Received multiple values" is raised after ``load``, and swallowed): the
        proxy would serve traffic unaudited. Say so first; an error at start-up stops it.
        Every llm-audit addon's options are checked here: mitmproxy reads them all only
        after every addon of the script has loaded."""
        for name, value in getattr(options, "deferred", {}).items():
            values = getattr(value, "val", None)
            if (
                name.startswith(("llm_audit_", "llm_rules", "llm_filter"))
                and isinstance(values, list)
                and len(values) > 1
                and name != "llm_filters"
            ):
                self.problem = f"{name} is set more than once ({', '.join(repr(v) for v in values)})"
                log.error(f"llm-audit: {self.problem}; set it once (with --set or in config.yaml, not both)")

    def _watch_start(self, master: Any) -> None:
        """Stop the proxy if, shortly after start, the addon is not configured and recording.

        Whatever the cause (an option mitmproxy refused, a ``configure`` that failed), a
        proxy that passes traffic without recording it must not run silently.
        """
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # not under a running proxy (tests that drive the addon by hand)
        self._watchdog = loop.create_task(self._check_recording(master))

    async def _check_recording(self, master: Any) -> None:
        await asyncio.sleep(START_GRACE)
        if self.writer is not None and self.configured:
            return
        self._stop_unrecorded(
            self.problem
            or (
                "mitmproxy did not configure the addon; see the lines above"
                if not self.configured
                else "no audit database is open; see the lines above"
            ),
            master,
        )

    def _stop_unrecorded(self, cause: str, master: Any = None) -> None:
        """The one line that says the proxy is not recording, then stop it."""
        from mitmproxy import ctx

        log.error(f"llm-audit: not recording: {cause}. The proxy stops so that no traffic passes unaudited.")
        (master or ctx.master).shutdown()

    # -- the database, its checkpoints and its retention ----------------------------------

    def _open_database(self, url: str, spool_path: Path, checkpointer: Checkpointer | None) -> None:
        """Open the database and its writer; a URL that does not work leaves the writer
        in force as it was (at run time, the previous database goes on recording)."""
        try:
            engine = open_engine(url)
        except DatabaseError as e:
            log.error(f"llm-audit: {e}" + ("; still recording to the previous database" if self.writer else ""))
            return
        if self.writer is not None:
            self.writer.close()  # releases the spool, which the new writer may reuse
            self.writer = None
        try:
            spool = Spool(spool_path)
        except (SpoolLocked, OSError) as e:
            engine.dispose()
            log.error(f"llm-audit: cannot use the spool: {e}; set another path with --set llm_audit_spool=FILE")
            return
        try:
            self.writer = AuditWriter(engine, spool, self.instance, checkpointer=checkpointer, prices=self.prices)
        except DatabaseError as e:
            spool.close()
            engine.dispose()
            log.error(f"llm-audit: {e}")
            return
        log.info(f"llm-audit: recording to {shown_url(engine.url)} (spool {spool_path})")
        if spool:
            log.info(f"llm-audit: {spool.records} records from an earlier run wait in the spool; replaying")

    def _load_prices(self, path: str) -> None:
        """Read the price file (a small TOML file, once per option change: no per-request
        work). A file that cannot be used is one error line, as a filter file's is: at
        start-up it stops the proxy; at run time the prices in force stay."""
        try:
            prices = load_prices(path) if path else None
        except PricesError as e:
            log.error(f"llm-audit: {e}" + ("; the previous prices stay in force" if self.serving else ""))
            return
        self.prices = prices
        if self.writer is not None:
            self.writer.prices = prices
        if prices is not None:
            log.info(f"llm-audit: prices from {prices.path} ({len(prices.entries)} entries, {prices.label})")

    def _checkpointer(self, options: Any) -> Checkpointer | None:
        """Signs this proxy's chain head; None (and an error line) when the key is unusable."""
        key_path = (
            Path(options.llm_audit_signing_key).expanduser() if options.llm_audit_signing_key else default_key_path()
        )
        directory = (
            Path(options.llm_audit_checkpoints).expanduser()
            if options.llm_audit_checkpoints
            else default_checkpoint_dir()
        )
        try:
            key = load_or_create_key(key_path)
        except (CheckpointError, OSError) as e:
            log.error(f"llm-audit: {e}; fix it or set another key with --set llm_audit_signing_key=FILE")
            return None
        try:
            command = shlex.split(options.llm_audit_checkpoint_command)
        except ValueError as e:
            log.error(f"llm-audit: llm_audit_checkpoint_command cannot be read ({e}); quote it as a shell would")
            return None
        return Checkpointer(
            directory,
            key,
            self.instance,
            every=max(options.llm_audit_checkpoint_every, 0),
            seconds=max(options.llm_audit_checkpoint_minutes, 0) * 60.0,
            command=command,
        )

    def _schedule_retention(self, days: int) -> None:
        if self.retention is not None:
            self.retention.close()
            self.retention = None
        if days and days < MIN_RETENTION.days:
            log.error(
                f"llm-audit: llm_audit_retention_days={days} would keep logs less than six months; "
                f"set it to {MIN_RETENTION.days} or more (or purge by hand with llm-audit purge --force)"
            )
        elif days > MAX_RETENTION_DAYS:
            log.error(
                f"llm-audit: llm_audit_retention_days={days} is past any date; set it to at most {MAX_RETENTION_DAYS}"
                " (or 0: no automatic purge)"
            )
        elif days and self.writer is not None:
            checkpointer = self.writer.checkpointer  # its key and folder sign each purge
            if checkpointer is None:  # (unsigned, each purge would read as tampering to verify --checkpoints)
                log.error(
                    "llm-audit: automatic retention is off: it signs each purge with the checkpoint key, which "
                    "cannot be used (see the error above); purge by hand with llm-audit purge"
                )
                return
            signer = Signer(checkpointer.directory, checkpointer.key)
            self.retention = DailyPurge(self.writer.engine, days, actor=f"proxy {self.instance}", signer=signer)
