"""The stream callable mitmproxy calls with every chunk of a tapped response body, and
the output gate it forwards through when content filters check the output.

Rules from ``mitmproxy-notes.md`` that shape it: the stream callable is set in
``responseheaders``; it must never raise and never return ``b""`` mid-stream.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from mitmproxy import http

from addon.auditor import StreamAuditor
from addon.mitm import early_end
from addon.mitm.flow_state import BodyCopy, OutputCheck
from addon.output_gate import OutputGate
from addon.turns import Turns

log = logging.getLogger(__name__)


def make_tap(
    flow: http.HTTPFlow, auditor: StreamAuditor, copy: BodyCopy | None, turns: Turns | None = None
) -> Callable[[bytes], bytes | list[bytes]]:
    """The stream callable: forward what the auditor lets through (without content
    filters, each chunk as it came) and inspect a copy.

    ``b""`` is the end of the body. Never returns ``b""`` itself: mid-stream that would
    end an HTTP/1.1 body; an empty list sends nothing. When a filter blocks, the chunk
    returned carries the dialect's termination and is the last the client gets.
    ``copy`` keeps what the client gets for mitmproxy's views, unless the stream turns
    out not to be inference traffic.
    """

    def tap(chunk: bytes) -> bytes | list[bytes]:
        if turns is not None:
            turns.hold()  # (a turn this chunk ends is written once its bytes are counted)
        try:
            out = auditor.feed(chunk) if chunk else auditor.finish()
            if turns is not None and chunk:
                turns.answered()
            if auditor.stopped:
                if auditor.ending_trailers and flow.response is not None:
                    # (also at the body's end: mitmproxy sends the trailers after this call)
                    flow.response.trailers = http.Headers(
                        [(k.encode(), v.encode()) for k, v in auditor.ending_trailers]
                    )
                if chunk:
                    early_end.end_after_this_chunk(flow)
        except Exception:  # StreamAuditor guards itself; this is the last line
            log.exception("llm-audit: stream tap failed")
            # (a gate that may block fails closed; one that only flags holds nothing; a
            # stream the proxy ended gets nothing more)
            gate = auditor.gate
            out = chunk if (gate is None or gate.flags_only) and not auditor.stopped else b""
        finally:
            if turns is not None:
                turns.write_held()
        if copy is not None and out:
            if auditor.record is None and auditor.ignored:
                copy.data = None  # no dialect claimed it: not ours to show
            else:
                copy.add(out)
        return out or []

    return tap


def output_gate(check: OutputCheck | None, streamed: bool, encoding: str | None) -> OutputGate | None:
    """The gate between upstream and client when content filters check the output."""
    if check is None:
        return None
    filters = check.filters
    return OutputGate(
        filters.output_guard(),
        check.dialect.normalizer(check.summary),
        holds=streamed and filters.may_block_output,
        split_raw=encoding is None or encoding.strip().lower() in ("", "identity"),
        failure=filters.failure,
        whole=not streamed,
    )
