"""A real OTLP/HTTP receiver for the tests: ``POST /v1/traces``, ``/v1/metrics``, ``/v1/logs``.

It listens on loopback, decodes each request with the official protobuf definitions
(``opentelemetry-proto``'s generated ``Export*ServiceRequest`` classes; gzip- or
deflate-encoded bodies too), keeps every raw body (so a test can search all that arrived
for a secret) and answers as a collector does: ``200`` with the empty response message.
Anything else is ``404``; a body that does not decode is ``400`` and kept in ``errors``.
"""

from __future__ import annotations

import gzip
import threading
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

SIGNALS: dict[str, tuple[Any, Any]] = {
    "/v1/traces": (ExportTraceServiceRequest, ExportTraceServiceResponse),
    "/v1/metrics": (ExportMetricsServiceRequest, ExportMetricsServiceResponse),
    "/v1/logs": (ExportLogsServiceRequest, ExportLogsServiceResponse),
}


def value(any_value: Any) -> Any:
    """An OTLP ``AnyValue`` as plain Python (strings, numbers, lists, dicts)."""
    kind = any_value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [value(v) for v in any_value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in any_value.kvlist_value.values}
    return getattr(any_value, kind)


def attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: value(kv.value) for kv in kvs}


@dataclass
class Receiver:
    """What the receiver got; :meth:`spans`, :meth:`metrics`, :meth:`logs` read it decoded."""

    server: ThreadingHTTPServer
    requests: dict[str, list[Any]] = field(default_factory=lambda: {path: [] for path in SIGNALS})
    raw: list[bytes] = field(default_factory=list)  # every body, decoded from its Content-Encoding
    headers: list[dict[str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def endpoint(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def spans(self) -> list[dict[str, Any]]:
        """Every span: its fields, ``attributes`` as a dict and its ``resource`` attributes."""
        out = []
        for request in self._copy("/v1/traces"):
            for rs in request.resource_spans:
                resource = attributes(rs.resource.attributes)
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        out.append(
                            {
                                "name": span.name,
                                "kind": span.kind,
                                "start": span.start_time_unix_nano,
                                "end": span.end_time_unix_nano,
                                "status": span.status.code,
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "attributes": attributes(span.attributes),
                                "resource": resource,
                                "scope": ss.scope.name,
                            }
                        )
        return out

    def metrics(self) -> dict[str, list[dict[str, Any]]]:
        """Every metric's data points by name, each as ``MessageToDict`` gives it with its
        ``attributes`` as a dict."""
        out: dict[str, list[dict[str, Any]]] = {}
        for request in self._copy("/v1/metrics"):
            for rm in request.resource_metrics:
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        kind = metric.WhichOneof("data")
                        for point in getattr(metric, kind).data_points:
                            d = MessageToDict(point, preserving_proto_field_name=True)
                            d["attributes"] = attributes(point.attributes)
                            d["unit"] = metric.unit
                            d["kind"] = kind
                            out.setdefault(metric.name, []).append(d)
        return out

    def latest(self, name: str) -> list[dict[str, Any]]:
        """The last data point of each series of metric ``name`` (the SDK exports cumulative
        values again and again: the last one holds the total)."""
        series: dict[str, dict[str, Any]] = {}
        for point in self.metrics().get(name, []):
            series[repr(sorted(point["attributes"].items()))] = point
        return list(series.values())

    def logs(self) -> list[dict[str, Any]]:
        out = []
        for request in self._copy("/v1/logs"):
            for rl in request.resource_logs:
                for sl in rl.scope_logs:
                    for record in sl.log_records:
                        out.append(
                            {
                                "event_name": record.event_name,
                                "trace_id": record.trace_id.hex(),
                                "span_id": record.span_id.hex(),
                                "attributes": attributes(record.attributes),
                                "body": value(record.body),
                            }
                        )
        return out

    def everything(self) -> bytes:
        """All bodies received, concatenated (for a search for secrets)."""
        with self.lock:
            return b"".join(self.raw)

    def _copy(self, path: str) -> list[Any]:
        with self.lock:
            return list(self.requests[path])

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _handler(receiver_box: list[Receiver]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet: the tests read what arrived
            pass

        def do_POST(self) -> None:
            receiver = receiver_box[0]
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            signal = SIGNALS.get(self.path)
            if signal is None:
                self._answer(404, b"")
                return
            encoding = (self.headers.get("content-encoding") or "").lower()
            try:
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                message = signal[0].FromString(body)
            except Exception as e:  # noqa: BLE001 - a test receiver reports what it could not read
                with receiver.lock:
                    receiver.errors.append(f"{self.path}: {type(e).__name__}: {e}")
                self._answer(400, b"")
                return
            with receiver.lock:
                receiver.requests[self.path].append(message)
                receiver.raw.append(body)
                receiver.headers.append({k.lower(): v for k, v in self.headers.items()})
            self._answer(200, signal[1]().SerializeToString())

        def _answer(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


def start_receiver(port: int = 0) -> Receiver:
    """Start a receiver on 127.0.0.1 (``port`` 0: a free one) serving in a daemon thread."""
    box: list[Receiver] = []
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(box))
    server.daemon_threads = True
    receiver = Receiver(server)
    box.append(receiver)
    threading.Thread(target=server.serve_forever, name="otlp-receiver", daemon=True).start()
    return receiver
