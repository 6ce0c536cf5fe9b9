"""The audit pipeline run on plain bytes, for the dialect unit tests: one helper for all.

It does what the proxy does for one exchange (record, request summary, StreamAuditor
fed chunk by chunk, end, outcome) without mitmproxy, so a test can feed the same bytes
split in many ways and compare the rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from addon.auditor import StreamAuditor, summary_into_record
from addon.dialects import Dialect, RequestView
from addon.framing import select
from addon.record import OUTCOME_COMPLETE, OUTCOME_UPSTREAM_ABORTED, ExchangeRecord

MAX_EVENT_BYTES = 8 * 1024 * 1024


def audit_bytes(
    dialect: Dialect,
    body: bytes,
    chunks: list[int] | None = None,
    *,
    request: Any,
    request_view: RequestView,
    encoding: str | None = None,
    outcome: str = OUTCOME_COMPLETE,
    event_stream: bool = True,
    status: int = 200,
    content_type: str | None = None,
    headers: Mapping[str, str] | None = None,
    max_record_bytes: int | None = None,
    **record_fields: Any,
) -> dict:
    """Feed ``body`` split at the ``chunks`` offsets; return the row without ids and times.

    ``content_type``: the response's, when the framing is chosen by it (as the proxy
    chooses it) rather than by ``event_stream``; ``headers``: the response's, for its reader;
    ``max_record_bytes``: the record's content cap (the proxy's default when None).
    """
    record = ExchangeRecord(dialect=dialect.name, streamed=event_stream, http_status=status, **record_fields)
    summary = dialect.summarize(request, request_view)
    summary_into_record(record, summary)
    normalizer = dialect.normalizer(summary)
    framing = select(content_type, status, normalizer.framing) if content_type is not None else None
    cap = {} if max_record_bytes is None else {"max_record_bytes": max_record_bytes}
    auditor = StreamAuditor(
        record,
        normalizer,
        encoding,
        MAX_EVENT_BYTES,
        event_stream=event_stream,
        framing=framing,
        headers=headers,
        **cap,
    )
    bounds = [0, *(chunks or []), len(body)]
    for a, b in zip(bounds, bounds[1:]):
        if b > a:
            auditor.feed(body[a:b])
    auditor.end(cut_by_upstream=outcome == OUTCOME_UPSTREAM_ABORTED)
    record.finish(outcome)
    return comparable_row(record)


def comparable_row(record: ExchangeRecord) -> dict:
    """The record's row without what differs from run to run (id and times)."""
    row = record.to_row()
    for key in ("id", "started_at", "first_chunk_at", "ended_at"):
        row.pop(key)
    return row
