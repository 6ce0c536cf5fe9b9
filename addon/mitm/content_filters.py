"""The content-filters addon: its options, the filter set in force, and the request check.

It loads the TOML rules and the Python filter files the options name, picks up changed
filter files while the proxy runs, and builds the :class:`~addon.filters.engine.FilterSet`
the exchange hooks use for each new request. When a filter may block output it installs
:mod:`addon.mitm.early_end`, the way a stream a filter stops ends cleanly.

The rules file's budgets go to a :class:`~addon.mitm.budgets.BudgetKeeper`: the audit
store hands it every final record (this proxy's own use, counted at once), its thread
refreshes the database's totals, and :meth:`ContentFilters.check_budgets` checks a
request against them without touching the database.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mitmproxy.addonmanager import Loader

from addon.dialects import Dialect, RequestSummary, unkept_of
from addon.filters.api import BLOCK, RequestContext, Verdict
from addon.filters.budgets import Budget
from addon.filters.engine import FILTER_ERROR, Failure, FilterSet
from addon.filters.loader import FilterFiles
from addon.filters.rules import Rule, RulesError, load_rules
from addon.findings import UNREAD_MESSAGE
from addon.mitm import early_end
from addon.mitm.budgets import BudgetKeeper
from addon.mitm.store import AuditStore
from addon.record import ExchangeRecord
from exchange.request import DECLARED, Beside, Message, strings_beside

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
        self.keeper = BudgetKeeper(store)
        if store is not None:
            store.listeners.append(self.keeper.recorded)

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "llm_rules",
            str,
            "",
            "TOML file of content-filter rules (regular expressions, keywords, secrets, PII) and budgets; "
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
        addon): read the budgets' totals before traffic."""
        self.keeper.start()

    def done(self) -> None:
        self.keeper.close()

    def check_budgets(self, record: ExchangeRecord) -> Verdict | None:
        """Check a new request against the budgets (in memory: no database here); every
        verdict is kept in the record, the one that blocks it returned."""
        verdicts = self.keeper.check(record)
        record.verdicts.extend(v.as_dict() for v in verdicts)
        return next((v for v in verdicts if v.action == BLOCK), None)

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
        self.keeper.configure(self.budgets, failure, self.refresh_seconds)
        self._build()

    def _build(self) -> None:
        filters = self.files.filters if self.files else []
        self.filterset = FilterSet(self.rules, filters, failure=self.failure) if self.rules or filters else None
        if self.filterset is not None and self.filterset.may_block_output:
            # How a stream a filter stops ends cleanly. Installed only when needed: the
            # patch puts one more generator frame on every chunk of every flow.
            early_end.install()
        if self.budgets or (self.filterset is not None and (self.filterset.request_rules or self.filterset.filters)):
            early_end.install_request_side()  # a blocked message of a bidirectional stream ends it


@dataclass(slots=True)
class RequestCheck:
    """A request's check, its first step done: what the filters read of the request and
    the rules' verdicts. That step may run off the event loop (a large request's, in
    :class:`~addon.mitm.hooks.ExchangeHooks`); :func:`finish_check` runs the rest on it.
    ``context`` is None when the first step failed (its verdict says so)."""

    context: RequestContext | None
    verdicts: list[Verdict]


def check_request(
    filters: FilterSet, record: ExchangeRecord, dialect: Dialect, summary: RequestSummary
) -> Verdict | None:
    """Run the request filters; the verdict that blocks the request, if any. Every
    verdict is kept in the record.

    A failure of the checking itself (not of one user filter, which the filter set
    handles) follows the failure policy too: ``closed`` blocks, ``open`` forwards.
    """
    return finish_check(filters, record, check_rules(filters, record, dialect, summary))


def check_rules(filters: FilterSet, record: ExchangeRecord, dialect: Dialect, summary: RequestSummary) -> RequestCheck:
    """The first step of :func:`check_request`: the context and the rules' verdicts.
    Thread-safe: it reads the record and writes nothing."""
    try:
        context = _request_context(record, dialect, summary)
        return RequestCheck(context, filters.check_request_rules(context))
    except Exception as e:  # our bug must not decide the policy
        log.exception("llm-audit: checking a request failed")
        return RequestCheck(None, [_failed(filters, e)])


def finish_check(filters: FilterSet, record: ExchangeRecord, check: RequestCheck) -> Verdict | None:
    """The rest of :func:`check_request`, on the event loop: the user filters, and the
    verdicts into the record; the verdict that blocks the request, if any."""
    verdicts = check.verdicts
    if check.context is not None:
        try:
            verdicts = verdicts + filters.check_request_filters(check.context)
            first, count = check.context.beside, len(check.context.messages)
            if first is not None:
                verdicts = _once(verdicts, {f"messages[{i}]" for i in range(first, count)})
        except Exception as e:  # our bug must not decide the policy
            log.exception("llm-audit: checking a request failed")
            verdicts = [_failed(filters, e)]
    record.verdicts.extend(v.as_dict() for v in verdicts)
    return next((v for v in verdicts if v.action == BLOCK), None)


def _failed(filters: FilterSet, e: Exception) -> Verdict:
    """The verdict on a request whose checking failed: the failure policy's."""
    action = BLOCK if filters.failure == "closed" else "flag"
    return Verdict(action, FILTER_ERROR, f"{type(e).__name__}: {e}"[:300], filter="llm-audit", location="request")


def check_message(
    filters: FilterSet, dialect: Dialect, summary: RequestSummary, record: ExchangeRecord, message: dict[str, Any]
) -> Verdict | None:
    """Run the request filters on one message of a streamed request (a bidirectional
    stream's prompt or tool result, read by the dialect); the verdict that blocks it."""
    probe = ExchangeRecord(request_body=message, client_address=record.client_address)
    verdict = check_request(filters, probe, dialect, summary)
    record.verdicts.extend(probe.verdicts)
    return verdict


def _once(verdicts: list[Verdict], beside: set[str]) -> list[Verdict]:
    """The verdicts, less those on the text beside the conversation (``beside``: its
    locations) that repeat a rule's match found in the messages already: that text may
    hold what the messages do (a protobuf message's bytes hold its prompt), and one match
    is one verdict."""
    seen = {(v.rule_id, v.match_hash) for v in verdicts if v.location not in beside and v.match_hash}
    return [v for v in verdicts if v.location not in beside or (v.rule_id, v.match_hash) not in seen]


def _request_context(record: ExchangeRecord, dialect: Dialect, summary: RequestSummary) -> RequestContext:
    """What the request filters read of a request: its conversation and metadata. A body
    that is not JSON to any reader is checked as raw text, and the policy decides; so it
    does for a body the dialect could not read whole (a finding of
    :data:`~addon.findings.UNREAD_MESSAGE`: a protobuf body that does not parse, strings
    past a reader's bounds)."""
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
    # Beside the conversation: a dialect's own reading of what the record keeps fingerprinted
    # or cut (protobuf), else every other string of the body (a document's text, fields no
    # reader lists; apart, the tools and schemas it declares), a message each: a request
    # of thousands of strings is not thousands of checks.
    read: set[int] = set()
    unkept = unkept_of(body)
    parsed = body if isinstance(body, (dict, list)) else None
    context = RequestContext.from_body(dialect.name, parsed, read=read, beside=parsed is not None, **fields)
    beside = Beside(unkept, []) if unkept else strings_beside(parsed, read)
    if beside.text or beside.declared:
        context = replace(context, beside=len(context.messages))
    if beside.text:
        context = replace(context, messages=(*context.messages, Message("context", "\n".join(beside.text))))
    if beside.declared:
        declared = Message(DECLARED, "\n".join(beside.declared))
        context = replace(context, messages=(*context.messages, declared), declared=len(context.messages))
    if not beside.whole:
        context = replace(context, unreadable=(*context.unreadable, "the body holds too many values to read them all"))
    unread = tuple(f"{f['code']}: {f['detail']}" for f in record.findings if f["code"] in UNREAD_MESSAGE)
    return replace(context, unreadable=(*context.unreadable, *unread)) if unread else context
