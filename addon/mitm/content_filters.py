"""The content-filters addon: its options, the filter set in force, and the request check.

It loads the TOML rules and the Python filter files the options name, picks up changed
filter files while the proxy runs, and builds the :class:`~addon.filters.engine.FilterSet`
the exchange hooks use for each new request. When a filter may block output it installs
:mod:`addon.mitm.early_end`, the way a stream a filter stops ends cleanly.

The rules file's budgets go to a :class:`~addon.filters.budgets.BudgetBook`: the audit
store hands it every final record (this proxy's own use, counted at once), a thread
(:mod:`addon.mitm.budgets`) refreshes the database's totals, and
:meth:`ContentFilters.check_budgets` checks a request against it without touching the
database. A book counts this proxy's records from its creation on (its epoch): it is
made anew when the rules or the audit database change.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mitmproxy.addonmanager import Loader
from sqlalchemy import Engine

from addon.dialects import Dialect, RequestSummary
from addon.filters.api import BLOCK, RequestContext, Verdict
from addon.filters.budgets import BUDGET_FILTER, Budget, BudgetBook
from addon.filters.engine import FILTER_ERROR, Failure, FilterSet
from addon.filters.loader import FilterFiles
from addon.filters.rules import Rule, RulesError, load_rules
from addon.mitm import early_end
from addon.mitm.budgets import SpendRefresher
from addon.mitm.store import AuditStore
from addon.record import ExchangeRecord
from exchange.request import Message

log = logging.getLogger(__name__)

OPTIONS = frozenset({"llm_rules", "llm_filters", "llm_filter_failure", "llm_budget_refresh_seconds"})
DEFAULT_REFRESH_SECONDS = 5


class ContentFilters:
    """Owns the rules, the filter files and the filter set built from them, and the budgets."""

    def __init__(self, store: AuditStore | None = None) -> None:
        self.rules: list[Rule] = []
        self.budgets: list[Budget] = []
        self.failure: Failure = "closed"
        self.refresh_seconds = DEFAULT_REFRESH_SECONDS
        self.files: FilterFiles | None = None
        self.filterset: FilterSet | None = None
        self.store = store
        self.book: BudgetBook | None = None
        self._book_writer: object = None  # the audit writer the book was made for
        self.refresher: SpendRefresher | None = None
        self._target: tuple[BudgetBook | None, Engine | None] = (None, None)  # for the refresh thread
        if store is not None:
            store.listeners.append(self._recorded)

    def load(self, loader: Loader) -> None:
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
            "llm_budget_refresh_seconds",
            int,
            DEFAULT_REFRESH_SECONDS,
            "How often budgets re-read their totals from the audit database (seconds); this "
            "proxy's own exchanges count at once, other proxies' at the next read.",
        )

    def configure(self, updated: set[str]) -> None:
        """Reload the rules and filter files when their options change. A file with an
        error is refused in one line; with a bad rules file the previous set stays."""
        from mitmproxy import ctx

        if "llm_budget_refresh_seconds" in updated:
            if ctx.options.llm_budget_refresh_seconds >= 1:
                self.refresh_seconds = ctx.options.llm_budget_refresh_seconds
            else:
                log.error(
                    "llm-audit: llm_budget_refresh_seconds must be at least 1, got "
                    f"{ctx.options.llm_budget_refresh_seconds}; fix it with "
                    f"--set llm_budget_refresh_seconds={DEFAULT_REFRESH_SECONDS}"
                )
        if updated & OPTIONS:
            self._load(ctx.options.llm_rules, ctx.options.llm_filters, ctx.options.llm_filter_failure)

    def running(self) -> None:
        """The audit store has opened its database by now (it configures after this
        addon): make the budget book for it, so its totals are read before traffic."""
        self._sync_book()

    def done(self) -> None:
        if self.refresher is not None:
            self.refresher.close()
            self.refresher = None

    # -- budgets ----------------------------------------------------------------------------

    def check_budgets(self, record: ExchangeRecord) -> Verdict | None:
        """Check a new request against the budgets (in memory, O(budgets)); every verdict
        is kept in the record, the one that blocks it returned. A failure of the check
        itself follows the failure policy."""
        if not self.budgets:
            return None
        try:
            book = self._sync_book()
            if book is None:
                return None
            now = datetime.fromtimestamp(record.started_at, UTC) if record.started_at else datetime.now(UTC)
            verdicts = book.check(
                record.provider, record.request_model, record.user_id, record.api_key_fingerprint, now
            )
        except Exception as e:  # our bug must not decide the policy
            log.exception("llm-audit: checking a request's budgets failed")
            action = BLOCK if self.failure == "closed" else "flag"
            reason = f"{type(e).__name__}: {e}"[:300]
            verdicts = [Verdict(action, FILTER_ERROR, reason, filter=BUDGET_FILTER, location="request")]
        record.verdicts.extend(v.as_dict() for v in verdicts)
        return next((v for v in verdicts if v.action == BLOCK), None)

    def _recorded(self, row: dict[str, Any]) -> None:
        """The audit store took a record: count a final one in the budgets (never raises)."""
        book = self.book
        if book is None:
            return
        try:
            book.add(row)
        except Exception:  # the record is written; only its count is missing
            log.exception("llm-audit: counting a record in the budgets failed")

    def _sync_book(self) -> BudgetBook | None:
        """The book for the budgets and the audit writer in force: a new one (a new epoch,
        nothing counted locally yet) when either changed."""
        writer = self.store.writer if self.store is not None else None
        if not self.budgets:
            self.book = None
            self._target = (None, None)
            return None
        if self.book is None or writer is not self._book_writer:
            self.book = BudgetBook(
                self.budgets,
                instance=writer.instance if writer is not None else None,
                failure=self.failure,
                refresh_seconds=self.refresh_seconds,
            )
            self._book_writer = writer
            engine = getattr(writer, "engine", None)
            self._target = (self.book, engine if isinstance(engine, Engine) else None)
            if self.refresher is None:
                self.refresher = SpendRefresher(self._refresh_target)
            self.book.on_pending = self.refresher.wake
            self.refresher.wake()
        return self.book

    def _refresh_target(self) -> tuple[BudgetBook | None, Engine | None]:
        """What the refresh thread reads, and into which book (read from that thread: one
        tuple, swapped whole, so a book is never paired with another writer's database)."""
        return self._target

    def current(self) -> FilterSet | None:
        """The filter set for a new exchange, after picking up changed filter files (at
        most one stat per file a second), so a file that failed to load is used once it
        is fixed. None: no rules and no filters."""
        if self.files is not None:
            changed, problems = self.files.reload_if_changed()
            for problem in problems:
                log.error(f"llm-audit: {problem}")
            if changed:
                self._build()
        return self.filterset

    def _load(self, rules_path: str, filter_paths: Sequence[str], failure: Failure) -> None:
        try:
            rules = load_rules(Path(rules_path).expanduser()) if rules_path else []
        except RulesError as e:
            log.error(f"llm-audit: {e}; fix the rules file or unset llm_rules")
            return
        self.files = FilterFiles(filter_paths)
        for problem in self.files.load():
            log.error(f"llm-audit: {problem}")
        self.rules = [r for r in rules if isinstance(r, Rule)]
        self.budgets = [r for r in rules if isinstance(r, Budget)]
        self.failure = failure
        self.book = None  # new rules, a new book
        self._sync_book()
        self._build()

    def _build(self) -> None:
        filters = self.files.filters if self.files else []
        self.filterset = FilterSet(self.rules, filters, failure=self.failure) if self.rules or filters else None
        if self.filterset is not None and self.filterset.may_block_output:
            # How a stream a filter stops ends cleanly. Installed only when needed: the
            # patch puts one more generator frame on every chunk of every flow.
            early_end.install()
        if self.filterset is not None and (self.filterset.request_rules or self.filterset.filters):
            early_end.install_request_side()  # a blocked message of a bidirectional stream ends it


def check_request(
    filters: FilterSet, record: ExchangeRecord, dialect: Dialect, summary: RequestSummary
) -> Verdict | None:
    """Run the request filters; the verdict that blocks the request, if any. Every
    verdict is kept in the record.

    A failure of the checking itself (not of one user filter, which the filter set
    handles) follows the failure policy too: ``closed`` blocks, ``open`` forwards.
    """
    try:
        verdicts = filters.check_request(_request_context(record, dialect, summary))
    except Exception as e:  # our bug must not decide the policy
        log.exception("llm-audit: checking a request failed")
        action = BLOCK if filters.failure == "closed" else "flag"
        verdicts = [
            Verdict(action, FILTER_ERROR, f"{type(e).__name__}: {e}"[:300], filter="llm-audit", location="request")
        ]
    record.verdicts.extend(v.as_dict() for v in verdicts)
    return next((v for v in verdicts if v.action == BLOCK), None)


def check_message(
    filters: FilterSet, dialect: Dialect, summary: RequestSummary, record: ExchangeRecord, message: dict[str, Any]
) -> Verdict | None:
    """Run the request filters on one message of a streamed request (a bidirectional
    stream's prompt or tool result, read by the dialect); the verdict that blocks it."""
    probe = ExchangeRecord(request_body=message, client_address=record.client_address)
    verdict = check_request(filters, probe, dialect, summary)
    record.verdicts.extend(probe.verdicts)
    return verdict


def _request_context(record: ExchangeRecord, dialect: Dialect, summary: RequestSummary) -> RequestContext:
    """What the request filters read of a request: its conversation and metadata. A body
    that is not JSON to any reader is checked as raw text, and the policy decides."""
    fields: dict[str, Any] = dict(
        tools=summary.declared_tools or frozenset(),
        user_id=summary.user_id,
        session_id=summary.session_id,
        request_id=summary.request_id,
        client_address=record.client_address,
    )
    body = record.request_body
    if isinstance(body, str):
        return RequestContext(
            dialect.name, None, (Message("user", body),), **fields, unreadable=("the body is not JSON",)
        )
    return RequestContext.from_body(dialect.name, body if isinstance(body, (dict, list)) else None, **fields)
