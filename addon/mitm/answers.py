"""The proxy's own answers, in the dialect's terms: to a request a filter blocked, and
in place of a held answer a filter blocked. Each sets ``flow.response`` and makes the
record say what the client got."""

from __future__ import annotations

import logging

from mitmproxy import http

from addon.dialects import Dialect, RequestSummary, RequestView
from addon.dialects.blocking import BlockedResponse, block_message
from addon.filters.api import Verdict
from addon.mitm.flow_state import HeldWhole
from addon.record import ExchangeRecord

log = logging.getLogger(__name__)


def answer_blocked(
    flow: http.HTTPFlow,
    record: ExchangeRecord,
    dialect: Dialect,
    summary: RequestSummary,
    view: RequestView,
    block: Verdict,
) -> None:
    """Answer a request a filter blocked, before it goes upstream."""
    answer = dialect.blocked_response(summary, view, block.rule_id, block.reason, streaming=bool(summary.stream))
    _send(flow, answer)
    record.block(block_message(block.rule_id, block.reason))
    record.bytes_to_client = len(answer.body)
    record.http_status = answer.status  # nothing went upstream: the proxy's answer is the response
    record.response_headers = dict(answer.headers)


def replace_held(flow: http.HTTPFlow, held: HeldWhole, block: Verdict) -> None:
    """Replace a held answer a content filter blocked with the API's own filtered
    outcome (else the dialect's error answer); the record says what the client got:
    its status when it differs from the upstream's, none of the answer's text, and
    the stop reason it read."""
    record, check = held.record, held.output
    try:
        filtered = held.normalizer.filtered_body(block.rule_id, block.reason)
    except Exception as e:  # our bug must not let the blocked answer through
        log.exception("llm-audit: making the filtered answer failed; the dialect's error is sent")
        record.add_finding("audit_internal_error", f"filtered answer: {type(e).__name__}: {e}"[:300])
        filtered = None
    answer = filtered or check.dialect.blocked_response(
        check.summary, check.view, block.rule_id, block.reason, streaming=bool(check.summary.stream)
    )
    _send(flow, answer)
    record.block(
        block_message(block.rule_id, block.reason),
        [held.normalizer.filter_stop_reason] if filtered is not None else [],
    )
    record.bytes_to_client = len(answer.body)
    record.delivered_text = ""
    if answer.status != record.http_status:
        record.client_status = answer.status


def _send(flow: http.HTTPFlow, answer: BlockedResponse) -> None:
    flow.response = http.Response.make(answer.status, answer.body, dict(answer.headers))
