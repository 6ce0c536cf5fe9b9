"""The OpenTelemetry addon: its options, and the exporter's life beside the audit store.

Off by default. With ``--set llm_audit_otel=on`` every finished record the store hands to
its writer is handed to an :class:`~addon.otel_export.OtelExporter` too (a span, metrics;
with ``llm_audit_otel_content=true`` the prompt and answer as log records), configured
by the standard ``OTEL_*`` environment variables. The database never waits for the
export: the store gives the row to the writer first, and the export only queues it.

A problem that keeps the export from starting (the SDK not installed, a protocol it
cannot speak) is one ``llm-audit: ...`` error line; at start it stops mitmdump, as every
llm-audit error does, so that a proxy meant to export does not run silently without.

In the addon list it comes after the store: at shutdown the exchange hooks submit the
exchanges still open, the store closes the writer, then this flushes the export.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from mitmproxy.addonmanager import Loader

from addon.mitm.store import AuditStore
from addon.otel_export import OtelExporter, OtelUnavailable
from storage.cost import cost_of

log = logging.getLogger(__name__)

OPTIONS = frozenset({"llm_audit_otel", "llm_audit_otel_content", "llm_audit_instance"})


class OtelExport:
    """Starts, restarts and stops the OpenTelemetry export as its options say."""

    def __init__(self, store: AuditStore) -> None:
        self.store = store
        self.exporter: OtelExporter | None = None

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "llm_audit_otel",
            str,
            "off",
            "Export every exchange to OpenTelemetry over OTLP/HTTP (a span, GenAI metrics), configured by "
            "the OTEL_* environment variables (OTEL_EXPORTER_OTLP_ENDPOINT, ..._HEADERS, OTEL_SERVICE_NAME, ...).",
            choices=["off", "on"],
        )
        loader.add_option(
            "llm_audit_otel_content",
            bool,
            False,
            "With llm_audit_otel=on, also export each exchange's prompt and answer as an OpenTelemetry log "
            "record (gen_ai.input.messages, gen_ai.output.messages).",
        )

    def configure(self, updated: set[str]) -> None:
        from mitmproxy import ctx

        if not updated & OPTIONS:
            return
        self._stop(wait=False)
        if ctx.options.llm_audit_otel != "on":
            return
        try:
            self.exporter = OtelExporter(
                self.store.instance, content=ctx.options.llm_audit_otel_content, price=self._price
            )
        except OtelUnavailable as e:
            log.error(f"llm-audit: {e}")
            return
        except Exception as e:  # noqa: BLE001 - the SDK refusing its configuration: one line, no traceback
            log.error(f"llm-audit: cannot start the OpenTelemetry export: {type(e).__name__}: {e}")
            return
        self.store.export = self.exporter.submit
        what = "spans and metrics" + (" and content log records" if self.exporter.content else "")
        log.info(f"llm-audit: exporting {what} to OpenTelemetry at {self.exporter.endpoint}")

    def _price(self, row: Mapping[str, Any]) -> float | None:
        """The exchange's cost as the writer computes it for the database (the price file in
        force, else genai-prices' bundled list); None when the price is unknown."""
        return cost_of(row, self.store.prices).usd

    def done(self) -> None:
        self._stop(wait=True)

    def _stop(self, wait: bool) -> None:
        """Stop the export. At shutdown (``wait``) within its bounded time; at run time, when
        an option changed, on a thread of its own: a collector that is down would hold the
        event loop for seconds."""
        exporter, self.exporter = self.exporter, None
        if exporter is None:
            return
        self.store.export = None
        if wait:
            _close(exporter)
        else:
            threading.Thread(target=_close, args=(exporter,), name="llm-audit-otel-close", daemon=True).start()


def _close(exporter: OtelExporter) -> None:
    exporter.close()
    log.info(exporter.summary())
