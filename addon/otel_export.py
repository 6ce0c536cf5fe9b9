"""OpenTelemetry export of finished exchanges: a span each, GenAI metrics, and optionally
the content as log records, sent over OTLP/HTTP by the OpenTelemetry SDK.

The export is a side branch of the records' way to the database and never stands in it:

- :meth:`OtelExporter.submit` runs on mitmproxy's event loop, right after the row was
  handed to the writer. It copies the few columns the export reads into a bounded queue
  and returns; a full queue drops the export of that exchange (counted), never the row,
  which the writer already has.
- One thread of its own (``llm-audit-otel``) turns the rows into spans, metric
  measurements and log records. The SDK's batch processors and periodic metric reader
  send them from their own threads, each behind a bounded queue, so a collector that is
  down or slow costs retries in those threads and nothing else.
- What was not delivered (queue full, export failed, left at shutdown) is counted and
  said in a warning line (at most one a minute while it grows) and in the shutdown
  summary. The SDK's own log lines are kept out of the proxy's log (one failing
  collector would print several per batch); the last one is quoted in ours.
- :meth:`OtelExporter.close` stops the thread and shuts the SDK down within a bounded
  time (:data:`SHUTDOWN_SECONDS`), sending what it can.

Configuration is the SDK's: ``OTEL_EXPORTER_OTLP_ENDPOINT`` and the per-signal
endpoints, ``OTEL_EXPORTER_OTLP_HEADERS``, ``..._TIMEOUT``, ``..._COMPRESSION``,
``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_METRIC_EXPORT_INTERVAL``,
``OTEL_BSP_*`` / ``OTEL_BLRP_*``. Only the ``http/protobuf`` protocol is built in;
``OTEL_{TRACES,METRICS,LOGS}_EXPORTER=none`` turns one signal off.

The SDK is an optional dependency (``pip install 'llm-audit[otel]'``); it is imported only
when the export is turned on.
"""

from __future__ import annotations

import inspect
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from addon import otel_semconv as semconv

log = logging.getLogger(__name__)

QUEUE_SIZE = 2048  # rows waiting for the export thread; beyond it an exchange's export is dropped
SHUTDOWN_SECONDS = 5.0  # what close() may take in all, whatever the collector does
WARN_EVERY = 60.0  # seconds between two "not delivered" warnings (the first comes at once)
CHECK_EVERY = 1.0  # seconds between the export thread's looks at failed batches while no row comes
SCOPE = "llm-audit"
MAX_DIMENSION_VALUES = 200  # distinct values of a metric dimension the traffic writes (_Dimensions)
# distinct sets of those dimensions (_Dimensions): times the 7 statuses of llm_audit.exchanges,
# under the SDK's 2,000 series an instrument, past which it folds new ones away unsaid
MAX_DIMENSION_SETS = 250
LOG_BATCH = 64  # content log records per export request
# the columns the export reads; the content ones only with the content switch on
COLUMNS = (
    "id", "dialect", "provider", "status", "started_at", "first_chunk_at", "ended_at", "server_address",
    "server_port", "url_path", "http_status", "client_address", "proxy_instance", "api_key_fingerprint",
    "request_model", "response_model", "response_id", "request_id", "user_id", "session_id", "task_id",
    "streamed", "finish_reasons", *semconv.USAGE_ATTRIBUTES, "error_code", "findings", "verdicts",
    "connection_id", "turn", "cost_usd", "usage_details",
)  # fmt: skip
CONTENT_COLUMNS = ("request_body", "output_text", "output", "tool_calls", "delivered_text")
PROTOCOL = "http/protobuf"
_STOP = object()


class OtelUnavailable(Exception):
    """The export cannot start: the message is the one line that names the fix."""


@dataclass
class Signals:
    """Which of the three signals are exported (``OTEL_*_EXPORTER=none`` turns one off)."""

    traces: bool = True
    metrics: bool = True
    logs: bool = True


def signals_from_env(env: Mapping[str, str]) -> Signals:
    """The signals to export and the protocol check, from the standard variables; raises
    :class:`OtelUnavailable` for a protocol or exporter this build cannot honour."""
    for var in ("OTEL_EXPORTER_OTLP_PROTOCOL", *(f"OTEL_EXPORTER_OTLP_{s}_PROTOCOL" for s in _SIGNALS)):
        value = env.get(var, "").strip()
        if value and value != PROTOCOL:
            raise OtelUnavailable(
                f"{var}={value} is not supported: llm-audit exports with OTLP/HTTP; set {var}={PROTOCOL} "
                "(collectors take both on their own ports: 4318 for HTTP)"
            )
    on: dict[str, bool] = {}
    for signal in _SIGNALS:
        var = f"OTEL_{signal}_EXPORTER"
        value = env.get(var, "").strip().lower()
        if value not in ("", "otlp", "none"):
            raise OtelUnavailable(f"{var}={value} is not supported: set {var}=otlp, or none to turn that signal off")
        on[signal.lower()] = value != "none"
    return Signals(**on)


_SIGNALS = ("TRACES", "METRICS", "LOGS")


class _Counting:
    """A span or log exporter that counts what it delivered and what it failed to.

    Wraps the OTLP exporter: the batch processor gives it batches on its own thread. It
    is duck-typed (the SDK's exporter classes are imported only when the export is on),
    hence the casts where it is handed over."""

    def __init__(self, inner: Any, success: Any) -> None:
        self.inner, self.success = inner, success
        self.delivered = 0
        self.failed = 0

    def export(self, batch: Sequence[Any]) -> Any:
        result = self.inner.export(batch)
        if result == self.success:
            self.delivered += len(batch)
        else:
            self.failed += len(batch)
        return result

    def shutdown(self, *args: Any, **kwargs: Any) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))


class _LastMessage(logging.Handler):
    """Keeps the SDK's last warning (why an export failed) for our own lines, without the
    collector's credentials: the SDK's message quotes the request's error, and a
    connection error names the URL with its query (``/v1/traces?api_key=...``)."""

    def __init__(self, secrets: Sequence[str] = ()) -> None:
        super().__init__(logging.WARNING)
        self.last: str | None = None
        self.secrets = sorted({s for s in secrets if len(s) >= 3}, key=len, reverse=True)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed SDK message must not break its thread
            message = str(record.msg)
        if "shutdown" not in message.lower():  # the SDK's lines about our own shutdown are no cause
            self.last = scrub(message, self.secrets)[:300]


_URL_QUERY = re.compile(r"(?<=[^\s?])\?[^\s'\"()<>,]+")
_URL_USERINFO = re.compile(r"//[^/\s@'\"]*@")
_OTLP_PATH_SEGMENTS = frozenset({"v1", "traces", "metrics", "logs"})  # the signals' own paths: no secret


def scrub(message: str, secrets: Sequence[str]) -> str:
    """A message of the SDK as our log may quote it: every query string and user part of
    a URL removed, and each known secret of the collector's settings replaced."""
    for secret in secrets:
        message = message.replace(secret, "[redacted]")
    message = _URL_USERINFO.sub("//[redacted]@", message)
    return _URL_QUERY.sub("?[query removed]", message)


def collector_secrets(env: Mapping[str, str]) -> list[str]:
    """What the collector's settings hold that our lines must not show: the values of
    ``OTEL_EXPORTER_OTLP_*HEADERS``, and the user part, the path's own segments (some
    services take their key there: ``/ingest/KEY/v1/traces``) and the query values of
    every ``OTEL_EXPORTER_OTLP_*ENDPOINT`` (as written and URL-decoded)."""
    out: list[str] = []
    for var, value in env.items():
        if not var.startswith("OTEL_EXPORTER_OTLP_") or not value:
            continue
        if var.endswith("HEADERS"):
            for item in value.split(","):
                secret = item.partition("=")[2].strip()
                out += [secret, unquote(secret)]
        elif var.endswith("ENDPOINT"):
            try:
                parts = urlsplit(value.strip())
            except ValueError:
                continue
            out += [p for p in (parts.username, parts.password) if p]
            out += [unquote(p) for p in (parts.username, parts.password) if p]
            own = [p for p in parts.path.split("/") if len(p) >= 4 and p not in _OTLP_PATH_SEGMENTS]
            out += [p for segment in own for p in (segment, unquote(segment))]
            for _, v in parse_qsl(parts.query, keep_blank_values=True):
                out += [v, quote(v, safe="")]
    return [s for s in out if s]


class OtelExporter:
    """Exports finished exchange rows as spans, metrics and (optionally) content logs."""

    def __init__(
        self,
        instance: str,
        content: bool = False,
        env: Mapping[str, str] | None = None,
        price: Callable[[Mapping[str, Any]], Any] | None = None,
    ) -> None:
        env = os.environ if env is None else env
        self.content = content
        # the exchange's cost when the row does not carry it: the writer prices its own copy
        # of the row on its thread; the export prices the same way on its own (never the loop)
        self._price = price
        self.signals = signals_from_env(env)
        self._columns = COLUMNS + CONTENT_COLUMNS if content else COLUMNS
        self.endpoint = _endpoint(env)
        self.submitted = 0  # exchanges handed to the export
        self.dropped = 0  # exchanges whose export the full queue refused
        self.failed_rows = 0  # rows the export thread could not turn into telemetry
        self._spans_made = 0
        self._logs_made = 0
        self._warned_at = -WARN_EVERY
        self._warned_lost = 0
        self._queue: queue.Queue[Any] = queue.Queue(QUEUE_SIZE)
        self._sdk_log = _LastMessage(collector_secrets(env))
        self._quiet_sdk()
        self._setup(instance, env)
        self._thread = threading.Thread(target=self._run, name="llm-audit-otel", daemon=True)
        self._thread.start()

    # -- the event loop's side ---------------------------------------------------------------

    def submit(self, row: Mapping[str, Any]) -> None:
        """Queue a finished row's export; never blocks, never raises."""
        try:
            self._queue.put_nowait({k: row.get(k) for k in self._columns})
            self.submitted += 1
        except queue.Full:
            self.dropped += 1
        except Exception:  # noqa: BLE001 - a hostile row must not reach the proxy's hook
            self.failed_rows += 1

    # -- the export thread ---------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                row = self._queue.get(timeout=CHECK_EVERY)
            except queue.Empty:
                self._warn_if_losing()  # failures of batches sent since the last row
                continue
            if row is _STOP:
                return
            try:
                self._export(row)
            except Exception as e:  # noqa: BLE001 - one row's trouble must not end the export
                self.failed_rows += 1
                log.warning("llm-audit: OpenTelemetry export of record %s failed: %s", row.get("id"), e)
            self._warn_if_losing()

    def _export(self, row: dict[str, Any]) -> None:
        from opentelemetry import trace

        if row.get("cost_usd") is None and self._price is not None:
            row["cost_usd"] = self._price(row)
        start, end = semconv.nanoseconds(row.get("started_at")), semconv.nanoseconds(row.get("ended_at"))
        start = start or end
        context = None
        if self._tracer is not None:
            span = self._tracer.start_span(
                semconv.span_name(row),
                kind=trace.SpanKind.CLIENT,
                attributes=semconv.span_attributes(row),
                start_time=start,
            )
            error = semconv.error_type(row)
            if error is not None:
                span.set_status(trace.Status(trace.StatusCode.ERROR, error))
            span.end(end_time=end if end and start and end >= start else start)
            self._spans_made += 1
            context = trace.set_span_in_context(span)
        if self._instruments is not None:
            self._instruments.record(row)
        if self.content and self._logger is not None:
            self._logger.emit(
                timestamp=end or start,
                context=context,
                event_name="gen_ai.client.inference.operation.details",
                attributes=semconv.metric_attributes(row)
                | {semconv.PREFIX + "exchange_id": str(row.get("id"))}
                | semconv.content(row),
            )
            self._logs_made += 1

    # -- what was lost ---------------------------------------------------------------------------

    def undelivered(self) -> int:
        """Spans and content log records that did not reach the collector: an exchange's
        the full queue refused or that could not be made, and those in a batch the
        collector did not take."""
        failed = sum(e.failed for e in (self._span_exporter, self._log_exporter) if e is not None)
        return self.dropped + self.failed_rows + failed

    def _warn_if_losing(self) -> None:
        lost = self.undelivered()
        now = time.monotonic()
        if lost > self._warned_lost and now - self._warned_at >= WARN_EVERY:
            self._warned_at, self._warned_lost = now, lost
            log.warning(
                "llm-audit: OpenTelemetry export to %s: %d spans or log records not delivered so far (%s); "
                "the audit records are not affected",
                self.endpoint,
                lost,
                self._sdk_log.last or "the export queue was full",
            )

    def summary(self) -> str:
        """Where the exports went, for the shutdown line."""
        spans = self._span_exporter.delivered if self._span_exporter else 0
        line = f"llm-audit: OpenTelemetry: {spans} spans exported to {self.endpoint}"
        if self.content:
            line += f", {self._log_exporter.delivered if self._log_exporter else 0} content log records"
        made = self._spans_made + self._logs_made
        sent = sum(e.delivered + e.failed for e in (self._span_exporter, self._log_exporter) if e is not None)
        lost = self.undelivered() + max(made - sent, 0)  # made but never sent: left at the deadline
        if lost:
            line += f"; {lost} spans or log records not delivered" + (
                f" (last error: {self._sdk_log.last})" if self._sdk_log.last else ""
            )
        return line

    def close(self, timeout: float = SHUTDOWN_SECONDS) -> None:
        """Export what is queued and shut the SDK down, within about ``timeout`` seconds.

        The SDK's shutdowns wait for exports that a collector which does not answer
        keeps retrying (the span processor's for up to 30 s); they run on a thread of
        their own, and past the deadline the OTLP exporters are shut, which ends their
        retries: what was not sent by then is counted as not delivered."""
        deadline = time.monotonic() + timeout
        try:
            self._queue.put(_STOP, timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Full:
            pass
        self._thread.join(max(deadline - time.monotonic(), 0.01))
        providers = [p for p in (self._tracer_provider, self._logger_provider, self._meter_provider) if p is not None]
        closing = threading.Thread(target=_shut_down, args=(providers, deadline), name="llm-audit-otel-shutdown")
        closing.daemon = True
        closing.start()
        closing.join(max(deadline - time.monotonic(), 0.01))
        if closing.is_alive():
            for exporter in self._otlp:
                _quietly(exporter.shutdown)
            closing.join(1.0)
        while True:  # rows the thread did not reach are not delivered
            try:
                if self._queue.get_nowait() is not _STOP:
                    self.dropped += 1
            except queue.Empty:
                break

    # -- the SDK -----------------------------------------------------------------------------------

    def _quiet_sdk(self) -> None:
        """The SDK's log lines stay out of mitmproxy's log (an error logged while mitmdump
        starts would even stop it); the last one is quoted in ours."""
        sdk = logging.getLogger("opentelemetry")
        sdk.propagate = False
        if self._sdk_log not in sdk.handlers:
            for handler in [h for h in sdk.handlers if isinstance(h, _LastMessage)]:
                sdk.removeHandler(handler)
            sdk.addHandler(self._sdk_log)

    def _setup(self, instance: str, env: Mapping[str, str]) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk._logs import LoggerProvider
            from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, LogRecordExportResult
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
            from opentelemetry.sdk.resources import OTELResourceDetector, Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult
        except ImportError as e:
            raise OtelUnavailable(
                f"llm_audit_otel=on needs the OpenTelemetry SDK and its OTLP/HTTP exporter ({e.name} is missing); "
                "install them with pip install 'llm-audit[otel]'"
            ) from None
        from importlib.metadata import PackageNotFoundError, version

        try:
            own_version = version("llm-audit")
        except PackageNotFoundError:
            own_version = "unknown"
        # ours first, the environment's OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
        resource = Resource.create(
            {"service.name": "llm-audit", "service.version": own_version, "service.instance.id": instance}
        ).merge(OTELResourceDetector().detect())
        self._tracer_provider: Any = None
        self._logger_provider: Any = None
        self._meter_provider: Any = None
        self._tracer: Any = None
        self._logger: Any = None
        self._instruments: _Instruments | None = None
        self._span_exporter: _Counting | None = None
        self._log_exporter: _Counting | None = None
        self._otlp: list[Any] = []  # the OTLP exporters, shut at once when the deadline of close() passes
        # the providers are this exporter's own, never the process's global ones: a
        # reconfigured export starts fresh, and nothing else in mitmproxy's process exports by them
        if self.signals.traces:
            spans = OTLPSpanExporter()
            self._otlp.append(spans)
            self._span_exporter = _Counting(spans, SpanExportResult.SUCCESS)
            self._tracer_provider = TracerProvider(resource=resource)
            self._tracer_provider.add_span_processor(BatchSpanProcessor(cast(Any, self._span_exporter)))
            self._tracer = self._tracer_provider.get_tracer(SCOPE, own_version)
        if self.signals.metrics:
            metrics = OTLPMetricExporter()
            self._otlp.append(metrics)
            reader = PeriodicExportingMetricReader(metrics)
            self._meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
            self._instruments = _Instruments(self._meter_provider.get_meter(SCOPE, own_version))
        if self.signals.logs and self.content:
            logs = OTLPLogExporter()
            self._otlp.append(logs)
            self._log_exporter = _Counting(logs, LogRecordExportResult.SUCCESS)
            self._logger_provider = LoggerProvider(resource=resource)
            # fewer records per request than the SDK's 512 unless OTEL_BLRP_MAX_EXPORT_BATCH_SIZE
            # says otherwise: a content record may hold 2 x 64 Ki characters, and a request
            # beyond the exporter's 64 MiB is dropped whole
            batch = int(env.get("OTEL_BLRP_MAX_EXPORT_BATCH_SIZE") or LOG_BATCH)
            self._logger_provider.add_log_record_processor(
                BatchLogRecordProcessor(cast(Any, self._log_exporter), max_export_batch_size=batch)
            )
            self._logger = self._logger_provider.get_logger(SCOPE, own_version)


class _Instruments:
    """The metrics: the GenAI client ones where the conventions name one, ours beside them."""

    def __init__(self, meter: Any) -> None:
        self.duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration",
            explicit_bucket_boundaries_advisory=semconv.DURATION_BUCKETS,
        )
        self.tokens = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used",
            explicit_bucket_boundaries_advisory=semconv.TOKEN_BUCKETS,
        )
        self.first_chunk = meter.create_histogram(
            "gen_ai.client.operation.time_to_first_chunk",
            unit="s",
            description="Time from the request to the first chunk of a streamed answer",
            explicit_bucket_boundaries_advisory=semconv.DURATION_BUCKETS,
        )
        self.exchanges = meter.create_counter(
            "llm_audit.exchanges", unit="{exchange}", description="Exchanges recorded, by status"
        )
        self.blocked = meter.create_counter(
            "llm_audit.blocked", unit="{exchange}", description="Exchanges a content filter blocked"
        )
        self.cost = meter.create_counter(
            "llm_audit.cost", unit="USD", description="Cost of the exchanges whose price is known"
        )

        self.dimensions = _Dimensions()

    def record(self, row: Mapping[str, Any]) -> None:
        attributes = self.dimensions.bound(semconv.metric_attributes(row))
        self.exchanges.add(1, attributes | {"llm_audit.status": str(row.get("status"))})
        if row.get("status") == "blocked":
            self.blocked.add(1, attributes)
        duration = semconv.seconds_between(row.get("started_at"), row.get("ended_at"))
        if duration is not None:
            self.duration.record(duration, attributes)
        if row.get("streamed"):
            first = semconv.seconds_between(row.get("started_at"), row.get("first_chunk_at"))
            if first is not None:
                self.first_chunk.record(first, attributes)
        for column, kind in (("input_tokens", "input"), ("output_tokens", "output")):
            count = semconv.token_count(row.get(column))
            if count is not None:
                self.tokens.record(count, attributes | {"gen_ai.token.type": kind})
        cost = semconv.cost(row.get("cost_usd"))
        if cost is not None:
            self.cost.add(cost, attributes)


class _Dimensions:
    """Bounds what the traffic writes into the metrics' dimensions.

    Model names, the upstream's host and its error code are the client's and the
    upstream's to choose: each new value makes a time series of every instrument, which
    the SDK keeps for the life of the export (and a backend bills). The first
    :data:`MAX_DIMENSION_VALUES` values of each are kept; the others are ``_OTHER``
    (the conventions' value for what is not named). Their combinations are bounded too
    (:data:`MAX_DIMENSION_SETS`): 50 made-up models times 45 ports filled the SDK's
    series of an instrument, and real traffic then went to its anonymous overflow
    series; past the bound, every bounded dimension of a new combination is ``_OTHER``,
    said once in the proxy's log. Spans keep the true values. Used by the export thread only."""

    BOUNDED = ("gen_ai.request.model", "gen_ai.response.model", "server.address", "server.port", "error.type")

    def __init__(self) -> None:
        self.seen: dict[str, set[Any]] = {name: set() for name in self.BOUNDED}
        self.sets: set[tuple[Any, ...]] = set()
        self.folding = False  # past MAX_DIMENSION_SETS (said once)

    def bound(self, attributes: dict[str, Any]) -> dict[str, Any]:
        for name, seen in self.seen.items():
            value = attributes.get(name)
            if value is None or value in seen:
                continue
            if len(seen) < MAX_DIMENSION_VALUES:
                seen.add(value)
            else:
                attributes[name] = "_OTHER"
        combination = tuple(attributes.get(name) for name in self.BOUNDED)
        if combination in self.sets:
            return attributes
        if len(self.sets) < MAX_DIMENSION_SETS:
            self.sets.add(combination)
            return attributes
        if not self.folding:
            self.folding = True
            log.warning(
                "llm-audit: OpenTelemetry metrics: %d combinations of model, host, port and error type seen; "
                "further ones are counted under _OTHER (the spans keep them)",
                MAX_DIMENSION_SETS,
            )
        return attributes | {name: "_OTHER" for name in self.BOUNDED if name in attributes}


def _shut_down(providers: list[Any], deadline: float) -> None:
    """Shut each provider down (their own processors and readers send what they hold)."""
    for provider in providers:
        millis = max(int((deadline - time.monotonic()) * 1000), 1)
        if "timeout_millis" in inspect.signature(provider.shutdown).parameters:
            _quietly(provider.shutdown, timeout_millis=millis)
        else:
            _quietly(provider.shutdown)


def _quietly(call: Any, *args: Any, **kwargs: Any) -> None:
    try:
        call(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - shutting down must not raise into mitmproxy's done
        log.warning("llm-audit: OpenTelemetry shutdown: %s: %s", type(e).__name__, e)


def _endpoint(env: Mapping[str, str]) -> str:
    """The collector's address for the log lines: scheme, host and port only (a URL may
    carry credentials in its user part or query)."""
    url = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or ""
    parts = urlsplit(url.strip() or "http://localhost:4318")
    host = parts.hostname or "?"
    return f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "")
