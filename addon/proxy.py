"""The mitmproxy adapter: options, hooks and the per-flow stream tap.

It holds the hooks; the other modules that import mitmproxy are its helpers (listed,
generated, in docs/architecture.md). For each flow it

1. ``request``: asks the dialect registry whether this is inference traffic (headers
   first, the body only when a dialect's headers/path match), opens a record and runs
   the request filters (a blocked request is answered here, in its dialect);
2. ``responseheaders``: turns on streaming for event streams, with a tap callable that
   feeds each chunk to the sans-IO auditor and forwards what it returns: the chunk
   unchanged, or, with output filters, the bytes whose text has passed them and, on a
   block, the dialect's termination, after which ``early_end`` ends the stream (an event
   stream no dialect claimed by its request is sniffed by its first event);
3. ``response`` / ``error``: settles the outcome and hands the row to the background
   writer, so the client's end of stream never waits for the database; then shows the
   exchange in mitmproxy's own UIs (:mod:`addon.contentview`): the stream's copy as the
   body for the content view, a comment for the flow list, a marker when blocked.

Rules from ``mitmproxy-notes.md`` that shape this code: the stream callable must be set
in ``responseheaders``; it must never raise and never return ``b""`` mid-stream; an
aborted stream fires ``error`` (not ``response``); on shutdown ``done`` runs before the
``error`` hooks of live flows.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import shlex
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mitmproxy import http
from mitmproxy.addonmanager import Loader
from mitmproxy.connection import ConnectionState

from addon import early_end, printed_output
from addon.auditor import StreamAuditor, summary_into_record
from addon.contentview import annotate, show_comment_column
from addon.dialects import UNREADABLE, Dialect, Normalizer, RequestSummary, RequestView, media_type, parse_json_body
from addon.dialects.blocking import block_message
from addon.dialects.registry import detect_request
from addon.events import Finding
from addon.filters.api import BLOCK, RequestContext, Verdict
from addon.filters.engine import FILTER_ERROR, FilterSet
from addon.filters.loader import FilterFiles
from addon.filters.rules import RulesError, load_rules
from addon.framing import select
from addon.hosts import server_name
from addon.local_user import is_transparent, local_user
from addon.output_gate import OutputGate
from addon.record import (
    DEFAULT_MAX_RECORD_BYTES,
    OUTCOME_CLIENT_ABORTED,
    OUTCOME_COMPLETE,
    OUTCOME_UPSTREAM_ABORTED,
    ExchangeRecord,
)
from addon.redact import api_key_fingerprint, redact_headers, redact_query
from exchange.messages import Message
from storage.checkpoint import (
    Checkpointer,
    CheckpointError,
    default_checkpoint_dir,
    default_key_path,
    load_or_create_key,
)
from storage.database import DatabaseError, default_url, open_engine
from storage.retention import MIN_RETENTION, DailyPurge
from storage.spool import Spool, SpoolLocked, default_spool_path
from storage.statements import Signer
from storage.writer import AuditWriter

log = logging.getLogger(__name__)

DEFAULT_MAX_EVENT_BYTES = 8 * 1024 * 1024
CHECKPOINT_OPTIONS = (
    "llm_audit_signing_key",
    "llm_audit_checkpoints",
    "llm_audit_checkpoint_every",
    "llm_audit_checkpoint_minutes",
    "llm_audit_checkpoint_command",
)
DEFAULT_VIEW_BYTES = 4 * 1024 * 1024
# Byte-size options: (option, attribute, smallest value); a smaller one is refused in one line.
SIZE_OPTIONS = (
    ("llm_audit_max_event_bytes", "max_event_bytes", 1024),
    ("llm_audit_max_record_bytes", "max_record_bytes", 1024),
    ("llm_audit_view_bytes", "view_bytes", 0),
)
START_GRACE = 1.0  # seconds after loading by which the addon must be recording


@dataclass(slots=True)
class FlowAudit:
    """What the addon keeps for one live flow."""

    record: ExchangeRecord | None
    normalizer: Normalizer | None
    auditor: StreamAuditor | None = None
    # set when content filters check this exchange's output
    filters: FilterSet | None = None
    dialect: Dialect | None = None
    summary: RequestSummary | None = None
    view: RequestView | None = None
    held_body: bool = False  # the response body is held whole to be checked (not streamed)
    copy: BodyCopy | None = None  # what the client received of a streamed body, for mitmproxy's views


class BodyCopy:
    """A copy of the streamed body a client received, handed to mitmproxy when the body
    ends: mitmproxy keeps no body of a streamed response, and its content views need one.

    A stream longer than ``limit`` bytes is not kept at all (``data`` becomes ``None``):
    a cut copy would show a transcript that ends where the stream did not.
    """

    __slots__ = ("data", "limit")

    def __init__(self, limit: int) -> None:
        self.data: bytearray | None = bytearray()
        self.limit = limit

    def add(self, chunk: bytes) -> None:
        if self.data is None:
            return
        if len(self.data) + len(chunk) > self.limit:
            self.data = None
        else:
            self.data += chunk


class LLMAudit:
    """Detects inference exchanges and records each one in the audit database."""

    def __init__(self) -> None:
        self.writer: AuditWriter | None = None
        self.retention: DailyPurge | None = None
        self.rules: list = []
        self.failure = "closed"
        self.filter_files: FilterFiles | None = None
        self.filterset: FilterSet | None = None
        self.flows: dict[str, FlowAudit] = {}
        self.instance = socket.gethostname()
        self.max_event_bytes = DEFAULT_MAX_EVENT_BYTES
        self.max_record_bytes = DEFAULT_MAX_RECORD_BYTES
        self.view_bytes = DEFAULT_VIEW_BYTES
        self.configured = False  # mitmproxy called configure (it does not when it refused an option)
        self.problem: str | None = None  # why the addon cannot record, when known
        self._watchdog: asyncio.Task | None = None
        self.running_ = False  # the proxy is serving traffic
        self.draining: dict[asyncio.Task, ExchangeRecord] = {}  # records waiting for their backlog to be read

    # -- options ------------------------------------------------------------------------

    def load(self, loader: Loader) -> None:
        early_end.install_error_side()
        printed_output.install(loader.master.addons.get("dumper"))  # mitmdump's flow lines show no credential
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
            "llm_audit_max_event_bytes",
            int,
            DEFAULT_MAX_EVENT_BYTES,
            "Largest SSE line or event the auditor inspects; larger ones pass through "
            "uninspected and are recorded as a finding.",
        )
        loader.add_option(
            "llm_audit_max_record_bytes",
            int,
            DEFAULT_MAX_RECORD_BYTES,
            "Most content one exchange's record keeps (answer text, reasoning, tool arguments, "
            "a non-stream body read whole; bytes); beyond it the record keeps what fits, the true "
            "sizes and the SHA-256 of the raw body (finding content_truncated).",
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
            "At least 183: the EU AI Act asks deployers to keep logs six months.",
        )
        loader.add_option(
            "llm_rules",
            str,
            "",
            "TOML file of content-filter rules (regular expressions, keywords, secrets, PII); "
            "a file with an error is refused with its line.",
        )
        loader.add_option(
            "llm_filters",
            Sequence[str],
            [],
            "Python files with content filters (reloaded when they change).",
        )
        loader.add_option(
            "llm_filter_failure",
            str,
            "closed",
            "What a content filter that raises or overruns its time budget does: "
            "closed (block the exchange) or open (record it, let the traffic pass).",
            choices=["closed", "open"],
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
            "llm_audit_view_bytes",
            int,
            DEFAULT_VIEW_BYTES,
            "Largest streamed body kept for mitmproxy's own views (the LLM stream content view, "
            "saved flows); a longer one is not kept. 0: none is kept.",
        )

    def _refuse_repeated_options(self, options: Any) -> None:
        """An llm-audit option given twice makes mitmproxy drop the whole addon without a
        word ("Received multiple values" is raised after ``load``, and swallowed): the
        proxy would serve traffic unaudited. Say so first; an error at start-up stops it."""
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

    def configure(self, updated: set[str]) -> None:
        """Apply option changes.

        Problems are logged as one ``llm-audit: ...`` error line instead of raised: a
        script's raised OptionsError is printed with a traceback, while an error line
        at start-up makes mitmdump exit ("Error logged during startup, exiting...").
        At run time the previous, working setting stays in force.
        """
        from mitmproxy import ctx

        self.configured = True
        for name, attribute, minimum in SIZE_OPTIONS:
            if name in updated and (value := _size_option(ctx.options, name, minimum)) is not None:
                setattr(self, attribute, value)
        if "llm_audit_instance" in updated:
            self.instance = ctx.options.llm_audit_instance or socket.gethostname()
        if updated & {"llm_audit_db", "llm_audit_spool", "llm_audit_instance", *CHECKPOINT_OPTIONS}:
            spool = ctx.options.llm_audit_spool or str(default_spool_path(self.instance))
            self._open_database(
                ctx.options.llm_audit_db or default_url(), Path(spool).expanduser(), self._checkpointer(ctx.options)
            )
            if self.writer is None and self.running_:
                self._stop_unrecorded(
                    "the audit database could not be opened after an option change; see the line above"
                )
        if updated & {"llm_audit_db", "llm_audit_spool", "llm_audit_instance", "llm_audit_retention_days"}:
            self._schedule_retention(ctx.options.llm_audit_retention_days)
        if updated & {"llm_rules", "llm_filters", "llm_filter_failure"}:
            self._load_filters(ctx.options.llm_rules, ctx.options.llm_filters, ctx.options.llm_filter_failure)

    def _load_filters(self, rules_path: str, filter_paths: Sequence[str], failure: str) -> None:
        """Build the filter set; a rules file or filter file with an error is refused in one line."""
        try:
            rules = load_rules(Path(rules_path).expanduser()) if rules_path else []
        except RulesError as e:
            log.error(f"llm-audit: {e}; fix the rules file or unset llm_rules")
            return
        self.filter_files = FilterFiles(filter_paths)
        for problem in self.filter_files.load():
            log.error(f"llm-audit: {problem}")
        self.rules, self.failure = rules, failure
        self._build_filterset()

    def _build_filterset(self) -> None:
        filters = self.filter_files.filters if self.filter_files else []
        self.filterset = FilterSet(self.rules, filters, failure=self.failure) if self.rules or filters else None
        if self.filterset is not None and self.filterset.may_block_output:
            # How a stream a filter stops ends cleanly. Installed only when needed: the
            # patch puts one more generator frame on every chunk of every flow.
            early_end.install()

    def _schedule_retention(self, days: int) -> None:
        if self.retention is not None:
            self.retention.close()
            self.retention = None
        if days and days < MIN_RETENTION.days:
            log.error(
                f"llm-audit: llm_audit_retention_days={days} would keep logs less than six months; "
                f"set it to {MIN_RETENTION.days} or more (or purge by hand with llm-audit purge --force)"
            )
        elif days and self.writer is not None:
            checkpointer = self.writer.checkpointer  # its key and folder sign each purge
            signer = Signer(checkpointer.directory, checkpointer.key) if checkpointer is not None else None
            self.retention = DailyPurge(self.writer.engine, days, actor=f"proxy {self.instance}", signer=signer)

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
            self.writer = AuditWriter(engine, spool, self.instance, checkpointer=checkpointer)
        except DatabaseError as e:
            spool.close()
            engine.dispose()
            log.error(f"llm-audit: {e}")
            return
        log.info(f"llm-audit: recording to {engine.url.render_as_string()} (spool {spool_path})")
        if spool:
            log.info(f"llm-audit: {spool.records} records from an earlier run wait in the spool; replaying")

    def running(self) -> None:
        """Under mitmweb, show the comments the addon writes in the flow list."""
        from mitmproxy import ctx

        self.running_ = True

        show_comment_column(ctx.options)

    # -- hooks --------------------------------------------------------------------------

    def request(self, flow: http.HTTPFlow) -> None:
        try:
            self._open(flow)
        except Exception:  # auditing must never break a request
            log.exception("llm-audit: failed to inspect a request; it is forwarded unaudited")

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        try:
            self._attach_tap(flow)
        except Exception:  # the record is written whatever happens
            log.exception("llm-audit: failed to inspect a response; it is forwarded unaudited")

    def response(self, flow: http.HTTPFlow) -> None:
        audit = self.flows.pop(flow.id, None)
        if audit is None or audit.record is None:
            return
        if audit.auditor is not None and audit.auditor.pending and not audit.held_body:
            self._after_backlog(audit, lambda: self._record_complete(flow, audit))
        else:
            self._record_complete(flow, audit)

    def _record_complete(self, flow: http.HTTPFlow, audit: FlowAudit) -> None:
        try:
            self._complete(flow, audit)
        except Exception as e:  # the record is written whatever happens
            log.exception("llm-audit: failed to finish a record")
            audit.record.add_finding("audit_internal_error", f"{type(e).__name__}: {e}"[:300])
            audit.record.finish(OUTCOME_COMPLETE)
        self._submit(audit.record)
        self._show(flow, audit)
        _release(audit)

    def error(self, flow: http.HTTPFlow) -> None:
        audit = self.flows.pop(flow.id, None)
        if audit is None or audit.record is None:
            return
        try:
            outcome = abort_side(flow)  # now: the connection states tell it only while the flow ends
        except Exception:  # the record is written; this is only the UI
            log.exception("llm-audit: failed to tell who cut an exchange")
            outcome = OUTCOME_UPSTREAM_ABORTED
        if audit.auditor is not None and audit.auditor.pending:
            self._after_backlog(audit, lambda: self._record_aborted(flow, audit, outcome))
        else:
            self._record_aborted(flow, audit, outcome)

    def _record_aborted(self, flow: http.HTTPFlow, audit: FlowAudit, outcome: str) -> None:
        record = audit.record
        try:
            message = flow.error.msg if flow.error else None
            if outcome == OUTCOME_CLIENT_ABORTED and _client_had_everything(record):
                outcome = OUTCOME_COMPLETE  # it hung up after the terminal event: nothing was lost
            if audit.auditor is not None:
                if outcome != OUTCOME_CLIENT_ABORTED:
                    audit.auditor.end(cut_by_upstream=True)
                else:
                    audit.auditor.report_limits()
            if flow.response is not None and record.http_status is None:
                _response_into_record(record, flow.response)  # refused before the responseheaders hook
            if message and _refused_by_mitmproxy(message):
                record.error_code, record.error_message = "response_refused", message
                record.add_finding("response_refused", message[:300])
            elif flow.response is None and outcome == OUTCOME_UPSTREAM_ABORTED:
                record.error_code, record.error_message = "upstream_error", message
        except Exception as e:  # our bug must not decide the policy
            log.exception("llm-audit: failed to settle an aborted exchange")
            record.add_finding("audit_internal_error", f"{type(e).__name__}: {e}"[:300])
            outcome = OUTCOME_UPSTREAM_ABORTED
        record.finish(outcome)
        self._submit(record)
        self._show(flow, audit)
        _release(audit)

    def done(self) -> None:
        """Record streams still open as cut off, then write everything queued."""
        for audit in self.flows.values():
            if audit.record is not None:
                audit.record.add_finding("proxy_shutdown", "the proxy stopped during the exchange")
                audit.record.finish(OUTCOME_CLIENT_ABORTED)
                self._submit(audit.record)
        self.flows.clear()
        for task, record in self.draining.items():  # ended, but their backlog was not read yet
            task.cancel()
            record.add_finding("proxy_shutdown", "the proxy stopped while the body was still being read")
            record.finish(OUTCOME_COMPLETE)
            self._submit(record)
        self.draining.clear()
        if self.retention is not None:
            self.retention.close()
            self.retention = None
        if self.writer is not None:
            self.writer.close()
            log.info(self.writer.summary())
            self.writer = None

    # -- internals ----------------------------------------------------------------------

    def _after_backlog(self, audit: FlowAudit, settle: Callable[[], None]) -> None:
        """Settle an ended exchange once its backlog of encoded bytes is read, in slices
        scheduled on the event loop: the hook returns at once, so the client's end of
        stream is not delayed and other flows run between the slices."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (a test driving the hooks): end() reads it all
            settle()
            return
        task = loop.create_task(_drain(audit.auditor, settle))
        self.draining[task] = audit.record
        task.add_done_callback(self._drained)

    def _drained(self, task: asyncio.Task) -> None:
        self.draining.pop(task, None)

    def _open(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None:
            return  # answered before it could go upstream (proxyauth's 407, map_local, server replay)
        req = flow.request
        path, _, query = req.path.partition("?")
        parsed: list[tuple[Any, Finding | None]] = []

        def body() -> Any:
            if not parsed:
                parsed.append(parse_json_body(req.get_content(strict=False) or b""))
            return parsed[0][0]

        view = RequestView(req.method, path, query, req.headers)
        dialect = detect_request(view, body)
        if dialect is None:
            return
        record, summary = self._start_record(flow, dialect, parsed[0] if parsed else None)
        audit = self.flows[flow.id] = FlowAudit(record, dialect.normalizer(summary))
        self._reload_filters()
        filters = self.filterset
        if filters is not None:
            block = self._check_request(filters, record, dialect, summary)
            if block is not None:
                self._answer_blocked(flow, record, dialect, summary, view, block)
                return  # answered by the proxy: the response hook writes the record
            if filters.checks_output:
                audit.filters, audit.dialect, audit.summary, audit.view = filters, dialect, summary, view
                if filters.may_block_output:
                    # A stream the proxy may cut must be one it can append to: not compressed.
                    req.headers["accept-encoding"] = "identity"
        self._submit(record)  # the write-ahead open record (status in_progress)

    def _reload_filters(self) -> None:
        """Pick up changed filter files (at most one stat per file a second), so a file
        that failed to load is used once it is fixed."""
        if self.filter_files is not None:
            changed, problems = self.filter_files.reload_if_changed()
            for problem in problems:
                log.error(f"llm-audit: {problem}")
            if changed:
                self._build_filterset()

    def _check_request(
        self, filters: FilterSet, record: ExchangeRecord, dialect: Dialect, summary: RequestSummary
    ) -> Verdict | None:
        """Run the request filters; the verdict that blocks the request, if any.

        A failure of the checking itself (not of one user filter, which the filter set
        handles) follows the failure policy too: ``closed`` blocks, ``open`` forwards.
        """
        try:
            fields = dict(
                tools=summary.declared_tools or frozenset(),
                user_id=summary.user_id,
                session_id=summary.session_id,
                request_id=summary.request_id,
                client_address=record.client_address,
            )
            body = record.request_body
            if isinstance(body, str):  # not JSON to any reader: its raw text is checked, and the policy decides
                context = RequestContext(
                    dialect.name, None, (Message("user", body),), **fields, unreadable=("the body is not JSON",)
                )
            else:
                context = RequestContext.from_body(
                    dialect.name, body if isinstance(body, (dict, list)) else None, **fields
                )
            verdicts = filters.check_request(context)
        except Exception as e:  # our bug must not let the blocked answer through
            log.exception("llm-audit: checking a request failed")
            action = BLOCK if filters.failure == "closed" else "flag"
            verdicts = [
                Verdict(action, FILTER_ERROR, f"{type(e).__name__}: {e}"[:300], filter="llm-audit", location="request")
            ]
        record.verdicts.extend(v.as_dict() for v in verdicts)
        return next((v for v in verdicts if v.action == BLOCK), None)

    def _answer_blocked(
        self,
        flow: http.HTTPFlow,
        record: ExchangeRecord,
        dialect: Dialect,
        summary: RequestSummary,
        view: RequestView,
        block: Verdict,
    ) -> None:
        """Answer in the dialect's own terms for a blocked exchange (the request, or a held body)."""
        answer = dialect.blocked_response(summary, view, block.rule_id, block.reason, streaming=bool(summary.stream))
        flow.response = http.Response.make(answer.status, answer.body, dict(answer.headers))
        record.block(block_message(block.rule_id, block.reason))
        record.bytes_to_client = len(answer.body)
        if record.http_status is None:  # a request blocked before it went upstream
            record.http_status = answer.status
            record.response_headers = dict(answer.headers)

    def _replace_held(self, flow: http.HTTPFlow, audit: FlowAudit, block: Verdict) -> None:
        """Replace a held answer a content filter blocked with the API's own filtered
        outcome (else the dialect's error answer); the record says what the client got:
        its status when it differs from the upstream's, none of the answer's text, and
        the stop reason it read."""
        record = audit.record
        try:
            filtered = audit.normalizer.filtered_body(block.rule_id, block.reason)
        except Exception as e:
            log.exception("llm-audit: making the filtered answer failed; the dialect's error is sent")
            record.add_finding("audit_internal_error", f"filtered answer: {type(e).__name__}: {e}"[:300])
            filtered = None
        answer = filtered or audit.dialect.blocked_response(
            audit.summary, audit.view, block.rule_id, block.reason, streaming=bool(audit.summary.stream)
        )
        flow.response = http.Response.make(answer.status, answer.body, dict(answer.headers))
        record.block(
            block_message(block.rule_id, block.reason),
            [audit.normalizer.filter_stop_reason] if filtered is not None else [],
        )
        record.bytes_to_client = len(answer.body)
        record.delivered_text = ""
        if answer.status != record.http_status:
            record.client_status = answer.status

    def _start_record(
        self, flow: http.HTTPFlow, dialect: Dialect, parsed: tuple[Any, Finding | None] | None = None
    ) -> tuple[ExchangeRecord, RequestSummary]:
        """A record with the request side filled in, and what the dialect read from the request."""
        req = flow.request
        content = req.get_content(strict=False) or b""
        body_json, finding = parsed or parse_json_body(content)
        path, _, query = req.path.partition("?")
        host = server_name(req.host, flow.client_conn.sni, req.host_header)
        record = ExchangeRecord(
            dialect=dialect.name,
            provider=dialect.provider_for(host),
            started_at=req.timestamp_start,
            server_address=host,
            server_port=req.port,
            http_method=req.method,
            url_path=path,
            url_query=redact_query(query) or None,
            http_version=req.http_version,
            client_address=flow.client_conn.peername[0] if flow.client_conn.peername else None,
            proxy_instance=self.instance,
            api_key_fingerprint=api_key_fingerprint({k.lower(): v for k, v in req.headers.items(multi=True)}, query),
            request_headers=redact_headers(req.headers.items(multi=True)),
            request_body=content.decode("utf-8", "replace") if body_json is UNREADABLE else body_json,
        )
        if finding is not None:
            record.apply(finding)
        readable = None if body_json is UNREADABLE else body_json
        summary = dialect.summarize(readable, RequestView(req.method, path, query, req.headers))
        summary.user_id = summary.user_id or proxy_user(flow) or redirected_user(flow)
        summary_into_record(record, summary)
        return record, summary

    def _attach_tap(self, flow: http.HTTPFlow) -> None:
        """Stream the response through a tap: every body of an inference exchange, and
        every event stream (an unrecognised one may still be claimed by its first event).

        The framing (:func:`addon.framing.select`) decides how the body is read: a
        streamed framing frame by frame as it flows (held frame by frame when filters may
        block), a whole body at its end (held whole when filters may block).
        """
        resp = flow.response
        audit = self.flows.get(flow.id)
        if audit is not None and audit.record is not None and audit.record.status == "blocked":
            return  # the proxy's own answer to a blocked request: nothing to read
        content_type = resp.headers.get("content-type", "")
        encoding = resp.headers.get("content-encoding")
        if audit is not None:
            framing = select(content_type, resp.status_code, audit.normalizer.framing)
            _response_into_record(audit.record, resp)
            audit.auditor = StreamAuditor(
                audit.record,
                audit.normalizer,
                encoding,
                self.max_event_bytes,
                framing=framing,
                max_record_bytes=self.max_record_bytes,
                gate=_output_gate(audit, framing.streamed, encoding),
            )
            if audit.filters is not None and audit.filters.may_block_output and not framing.streamed:
                audit.held_body = True  # checked whole in the response hook, before the client gets it
                return
        elif media_type(content_type)[0] == "text/event-stream":
            audit = self.flows[flow.id] = FlowAudit(None, None)
            audit.auditor = StreamAuditor(
                None,
                None,
                encoding,
                self.max_event_bytes,
                on_claim=self._claimer(flow, audit),
                max_record_bytes=self.max_record_bytes,
            )
        else:
            return
        if self.view_bytes:
            audit.copy = BodyCopy(self.view_bytes)
        flow.response.stream = _tap(flow, audit.auditor, audit.copy)

    def _claimer(self, flow: http.HTTPFlow, audit: FlowAudit) -> Callable[[Dialect], tuple[ExchangeRecord, Normalizer]]:
        """Called from the tap when a dialect claims an event stream by its first event."""

        def claim(dialect: Dialect) -> tuple[ExchangeRecord, Normalizer]:
            audit.record, summary = self._start_record(flow, dialect)
            audit.normalizer = dialect.normalizer(summary)
            _response_into_record(audit.record, flow.response)
            return audit.record, audit.normalizer

        return claim

    def _complete(self, flow: http.HTTPFlow, audit: FlowAudit) -> None:
        auditor = audit.auditor
        if auditor is not None:
            if audit.held_body:
                auditor.feed(flow.response.raw_content or b"")
            auditor.end()
            if audit.held_body and auditor.stopped:
                self._replace_held(flow, audit, auditor.gate.blocked)
        audit.record.finish(OUTCOME_COMPLETE)

    def _show(self, flow: http.HTTPFlow, audit: FlowAudit) -> None:
        """Show the finished exchange in mitmproxy's UIs: the stream's copy as the body
        (unless mitmproxy stored the streamed body itself, ``store_streamed_bodies``) for
        the content view, and the flow list annotations. Only mitmproxy's flow changes: the
        client has had every byte by now."""
        try:
            copy = audit.copy
            if copy is not None and copy.data is not None and flow.response and flow.response.raw_content is None:
                flow.response.raw_content = bytes(copy.data)
            annotate(flow, audit.record)
        except Exception:  # StreamAuditor guards itself; this is the last line
            log.exception("llm-audit: failed to annotate a flow")

    def _submit(self, record: ExchangeRecord) -> None:
        if self.writer is None:
            log.error("llm-audit: no database configured; record %s dropped", record.id)
            return
        self.writer.submit(record.to_row())


async def _drain(auditor: StreamAuditor, settle: Callable[[], None]) -> None:
    """Read a backlog a slice at a time, yielding to the event loop between slices."""
    while auditor.drain():
        await asyncio.sleep(0)
    settle()


def _release(audit: FlowAudit) -> None:
    """Let go of an ended exchange's text: mitmproxy may keep the flow (and so the
    stream callable) alive for as long as its connection lasts."""
    if audit.auditor is not None:
        audit.auditor.release()
    audit.record = audit.normalizer = audit.auditor = None


def _output_gate(audit: FlowAudit, streamed: bool, encoding: str | None) -> OutputGate | None:
    """The gate between upstream and client when content filters check the output."""
    filters = audit.filters
    if filters is None:
        return None
    return OutputGate(
        filters.output_guard(),
        audit.dialect.normalizer(audit.summary),
        holds=streamed and filters.may_block_output,
        split_raw=encoding is None or encoding.strip().lower() in ("", "identity"),
        failure=filters.failure,
    )


def _tap(flow: http.HTTPFlow, auditor: StreamAuditor, copy: BodyCopy | None) -> Callable[[bytes], Iterable[bytes]]:
    """The stream callable: forward what the auditor lets through (without content
    filters, each chunk as it came) and inspect a copy.

    ``b""`` is the end of the body. Never returns ``b""`` itself: mid-stream that would
    end an HTTP/1.1 body; an empty list sends nothing. When a filter blocks, the chunk
    returned carries the dialect's termination and is the last the client gets.
    ``copy`` keeps what the client gets for mitmproxy's views, unless the stream turns
    out not to be inference traffic.
    """

    def tap(chunk: bytes) -> bytes | list[bytes]:
        try:
            out = auditor.feed(chunk) if chunk else auditor.finish()
            if auditor.stopped and chunk:
                early_end.end_after_this_chunk(flow)
        except Exception:
            log.exception("llm-audit: stream tap failed")
            out = chunk if auditor.gate is None else b""
        if copy is not None and out:
            if auditor.record is None and auditor.ignored:
                copy.data = None  # no dialect claimed it: not ours to show
            else:
                copy.add(out)
        return out or []

    return tap


def proxy_user(flow: http.HTTPFlow) -> str | None:
    """The user mitmproxy's ``proxyauth`` authenticated, for exchanges whose request names none.

    proxyauth leaves ``(user, password)`` in ``flow.metadata["proxyauth"]``, on every
    request of a connection it authenticated (CONNECT tunnels too); only the name is used.
    """
    auth = flow.metadata.get("proxyauth")
    if isinstance(auth, tuple | list) and auth and isinstance(auth[0], str) and auth[0]:
        return auth[0]
    return None


def redirected_user(flow: http.HTTPFlow) -> str | None:
    """The local user whose connection transparent capture redirected here, for
    exchanges whose request names none (:mod:`addon.local_user`)."""
    conn = flow.client_conn
    if not is_transparent(conn.proxy_mode):
        return None
    return _connection_user(conn.id, conn.peername, flow.server_conn.address)


@functools.lru_cache(maxsize=4096)
def _connection_user(connection_id: str, peer: tuple | None, destination: tuple | None) -> str | None:
    """:func:`local_user`, once per client connection (its owner never changes): the
    ``/proc`` tables are read on the event loop, so not again for every request an
    HTTP/2 or keep-alive connection carries."""
    return local_user(peer, destination)


def abort_side(flow: http.HTTPFlow) -> str:
    """Who cut an exchange that ended in mitmproxy's ``error`` hook.

    mitmproxy's error messages do not say which side failed on HTTP/2 ("stream reset by
    client" is used for resets from either peer), so the kind of protocol error mitmproxy
    handled decides (:func:`addon.early_end.install_error_side`). Without it (errors
    mitmproxy raises outside that path), the connection states decide: a peer whose
    socket is no longer readable hung up; then the message.
    """
    side = early_end.error_side(flow)
    if side is not None:
        return OUTCOME_UPSTREAM_ABORTED if side == "upstream" else OUTCOME_CLIENT_ABORTED
    message = flow.error.msg if flow.error else ""
    server_gone = flow.server_conn is not None and not (flow.server_conn.state & ConnectionState.CAN_READ)
    client_gone = not (flow.client_conn.state & ConnectionState.CAN_READ)
    if server_gone and not client_gone:
        return OUTCOME_UPSTREAM_ABORTED
    if client_gone or "Client disconnected" in message:
        return OUTCOME_CLIENT_ABORTED
    if "reset" in message:
        return OUTCOME_CLIENT_ABORTED if "CANCEL" in message else OUTCOME_UPSTREAM_ABORTED
    return OUTCOME_UPSTREAM_ABORTED


def _size_option(options: Any, name: str, minimum: int) -> int | None:
    """The option's value, or None (and the line naming the fix) when it is below ``minimum``."""
    value = getattr(options, name)
    if value >= minimum:
        return value
    log.error(
        f"llm-audit: {name} must be at least {minimum} (bytes), got {value}; "
        f"fix it with --set {name}={options.default(name)}"
    )
    return None


def _client_had_everything(record: ExchangeRecord) -> bool:
    """The dialect's terminal event was read and every upstream byte was passed on: a
    client that closes now (the openai SDK does, right after ``[DONE]``) lost nothing."""
    return record.terminal_seen and record.status != "blocked" and record.bytes_to_client >= record.bytes_from_upstream


def _refused_by_mitmproxy(message: str) -> bool:
    """mitmproxy itself refused the upstream's response (request-smuggling checks such as
    Content-Length together with chunked, or its ``body_size_limit``)."""
    return ("from server, refusing" in message) or "body exceeds mitmproxy's body_size_limit" in message


def _response_into_record(record: ExchangeRecord, resp: http.Response) -> None:
    record.http_status = resp.status_code
    record.response_headers = redact_headers(resp.headers.items(multi=True))
    event_stream = media_type(resp.headers.get("content-type", ""))[0] == "text/event-stream"
    # Gemini without alt=sse streams a JSON array: streamed too, though not an event stream.
    record.streamed = event_stream or (bool(record.stream_requested) and 200 <= resp.status_code < 300)
