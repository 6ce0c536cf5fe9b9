"""Section 4: the audit writer's sustained rate into SQLite and PostgreSQL, and spool replay.

Rows are the addon's own: a record built by the real pipeline from an OpenAI Chat
stream of the mock (a two-message prompt of about 2 KB, a few hundred deltas of
answer, headers, usage), turned into its open row (request side, status
``in_progress``) and its final row. Each exchange is written as the proxy writes it:
the open row, then, later, the final row completing it (``lag`` exchanges later, so the
two never share a batch and the final row is a real update). The rate is exchanges
whose final row is in the database per second, from the first submit to the last write.

Spool replay: records appended to a spool file, then a writer started on an empty
database replays them (as after an outage or a restart); timed until the spool is empty.

Crash window: submit-to-durable latency of final records under a load like 20 concurrent
streams (each opens an exchange, streams for 50 to 300 ms, then hands over its final row);
a record is durable when the transaction holding it has committed. The target is 50 ms at
p99: what a crash of the proxy can lose.

Sealing: what tamper evidence costs per record (``storage.chain.Chain.seal``: the content
hashes, the canonical serialization, SHA-256), the same final rows sealed in a loop.

Pricing: what the cost column costs the writer thread per final record
(``storage.cost.cost_of`` with genai-prices' bundled list), for a model the list prices
and for one it does not know.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

from addon.auditor import StreamAuditor, summary_into_record
from addon.record import ExchangeRecord
from addon.redact import redact_headers
from bench.common import Sizes, percentile
from bench.processes import start_postgres
from bench.workloads import APIS, stream_items
from storage.chain import Chain, Head
from storage.cost import cost_of
from storage.database import open_engine
from storage.prepare import prepare
from storage.spool import Spool
from storage.writer import AuditWriter

API = APIS["openai-chat"]
DURABLE_STREAMS = 20
DURABLE_TARGET_MS = 50.0
ANSWER_DELTAS = 300
LAG = 1000  # exchanges between an open row and its final row


def template_rows() -> tuple[dict[str, Any], dict[str, Any]]:
    """The open row and the final row of one realistic exchange."""
    dialect = API.addon_dialect()
    now = time.time()
    record = ExchangeRecord(
        dialect=dialect.name,
        provider="openai",
        started_at=now,
        server_address="api.openai.com",
        server_port=443,
        http_method="POST",
        url_path=API.path,
        url_query="",
        http_version="HTTP/1.1",
        client_address="10.1.2.3",
        proxy_instance="bench",
        api_key_fingerprint="sha256:0123456789abcdef",
        request_body=API.body,
        request_headers=redact_headers(
            [
                ("content-type", "application/json"),
                ("authorization", "Bearer sk-bench"),
                ("user-agent", "OpenAI/Python 2.1.0"),
                ("accept", "text/event-stream"),
            ]
        ),
    )
    summary = dialect.summarize(API.body, API.view())
    summary_into_record(record, summary)
    open_row = record.to_row()
    record.http_status = 200
    record.streamed = True
    record.response_headers = {"content-type": "text/event-stream", "x-request-id": "req_0123456789"}
    auditor = StreamAuditor(record, dialect.normalizer(summary), None, 8 * 1024 * 1024)
    for chunk in stream_items(API, events=ANSWER_DELTAS, size=8):
        auditor.feed(chunk, now)
    auditor.end()
    record.finish("complete", now + 3)
    return open_row, record.to_row()


def _rows(count: int) -> list[dict[str, Any]]:
    """Rows in the order the proxy submits them: open rows, each final row ``LAG`` exchanges later."""
    opened, final = template_rows()
    ids = [uuid.uuid4().hex for _ in range(count)]
    rows: list[dict[str, Any]] = []
    for i in range(count + LAG):
        if i < count:
            rows.append(dict(opened, id=ids[i]))
        if i >= LAG:
            rows.append(dict(final, id=ids[i - LAG]))
    return rows


def _writer(url: str, folder: Path) -> AuditWriter:
    engine = open_engine(url)
    writer = AuditWriter(engine, Spool(folder / f"spool-{uuid.uuid4().hex[:8]}.jsonl"), "bench")
    _wait(lambda: writer._recovered, 60)  # start-up recovery done: the writer is idle
    return writer


def _wait(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("the writer did not finish in time")
        time.sleep(0.005)


def sustained(url: str, folder: Path, count: int) -> dict[str, Any]:
    """Exchanges per second through one AuditWriter into ``url``."""
    rows = _rows(count)
    writer = _writer(url, folder)
    try:
        started = time.perf_counter()
        for row in rows:
            writer.submit(row)
        _wait(lambda: writer.written >= count, 600)
        seconds = time.perf_counter() - started
    finally:
        writer.close()
    size = len(orjson.dumps(rows[-1]))  # bytes of one final row as JSON
    return {"exchanges": count, "seconds": seconds, "exchanges_per_s": count / seconds, "row_bytes": size}


def replay(url: str, folder: Path, count: int) -> dict[str, Any]:
    """How long a writer takes to replay ``count`` spooled records into ``url`` at start."""
    _, final = template_rows()
    path = folder / f"replay-{uuid.uuid4().hex[:8]}.jsonl"
    spool = Spool(path)
    for start in range(0, count, 1000):
        spool.append([dict(final, id=uuid.uuid4().hex) for _ in range(min(1000, count - start))])
    spool.close()
    spool_bytes = path.stat().st_size
    engine = open_engine(url)
    started = time.perf_counter()
    spool = Spool(path)
    writer = AuditWriter(engine, spool, "bench")
    try:
        _wait(lambda: writer._recovered and not spool, 1800)
        seconds = time.perf_counter() - started
    finally:
        writer.close()
    return {
        "records": count,
        "seconds": seconds,
        "records_per_s": count / seconds,
        "spool_bytes_per_record": spool_bytes / count,
    }


class _TimedWriter(AuditWriter):
    """An AuditWriter that notes when each final record's transaction committed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.durable: dict[str, float] = {}  # before the thread starts
        super().__init__(*args, **kwargs)

    def _write(self, batch: list[dict[str, Any]]) -> None:
        super()._write(batch)
        now = time.perf_counter()
        for row in batch:
            if row["status"] != "in_progress":
                self.durable.setdefault(row["id"], now)


def durable(url: str, folder: Path, seconds: float) -> dict[str, Any]:
    """Submit-to-durable latency (ms) of final records from :data:`DURABLE_STREAMS` concurrent streams."""
    opened, final = template_rows()
    writer = _TimedWriter(open_engine(url), Spool(folder / f"durable-{uuid.uuid4().hex[:8]}.jsonl"), "bench")
    _wait(lambda: writer._recovered, 60)
    submitted: dict[str, float] = {}
    until = time.perf_counter() + seconds

    def stream(seed: int) -> None:
        rng = random.Random(seed)
        while time.perf_counter() < until:
            rid = uuid.uuid4().hex
            writer.submit(dict(opened, id=rid))
            time.sleep(rng.uniform(0.05, 0.3))
            submitted[rid] = time.perf_counter()
            writer.submit(dict(final, id=rid))

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(DURABLE_STREAMS)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        _wait(lambda: len(writer.durable) >= len(submitted), 60)
    finally:
        writer.close()
    ms = [(writer.durable[rid] - at) * 1000 for rid, at in submitted.items()]
    return {
        "streams": DURABLE_STREAMS,
        "records": len(ms),
        "p50_ms": percentile(ms, 50),
        "p99_ms": percentile(ms, 99),
        "max_ms": max(ms),
        "target_ms": DURABLE_TARGET_MS,
    }


def sealing(count: int) -> dict[str, Any]:
    """Microseconds per record to seal a realistic final row into a chain, and to prepare it
    (:func:`storage.prepare.prepare`) and seal it with the content hashes the preparation
    made, as the writer does (median of 5 rounds)."""
    _, final = template_rows()

    def seal_only(chain: Chain) -> None:
        chain.seal(final)

    def prepare_and_seal(chain: Chain) -> None:
        p = prepare(final, postgres=False)
        chain.seal(p.row, p.hashes)

    out: dict[str, Any] = {"records": count}
    for name, step in (("us_per_record", seal_only), ("prepared_us_per_record", prepare_and_seal)):
        rounds = []
        for _ in range(5):
            chain = Chain("bench", Head())
            started = time.perf_counter()
            for _ in range(count):
                step(chain)
            rounds.append((time.perf_counter() - started) / count)
        out[name] = sorted(rounds)[2] * 1e6
    return out


def pricing(count: int) -> dict[str, Any]:
    """Microseconds per final record to price it, as the writer does (median of 5 rounds):
    the template row as OpenAI's gpt-4o (priced), and as the mock's own model (unknown)."""
    _, final = template_rows()
    out: dict[str, Any] = {"records": count}
    for name, model in (("priced_us_per_record", "gpt-4o"), ("unknown_us_per_record", final["request_model"])):
        row = final | {"provider": "openai", "request_model": model, "response_model": model}
        rounds = []
        for _ in range(5):
            started = time.perf_counter()
            for _ in range(count):
                cost_of(row)
            rounds.append((time.perf_counter() - started) / count)
        out[name] = sorted(rounds)[2] * 1e6
    out["priced_usd"] = cost_of(final | {"provider": "openai", "response_model": "gpt-4o"}).usd
    return out


def measure(sizes: Sizes, tmp: Path) -> dict[str, Any]:
    folder = tmp / "writer"
    folder.mkdir()
    out: dict[str, Any] = {
        "sealing": sealing(max(sizes.writer_exchanges // 10, 100)),
        "pricing": pricing(max(sizes.writer_exchanges // 10, 100)),
        "sqlite": sustained(f"sqlite:///{folder / 'sustained.db'}", folder, sizes.writer_exchanges),
        "sqlite_replay": replay(f"sqlite:///{folder / 'replay.db'}", folder, sizes.spool_records),
        "sqlite_durable": durable(f"sqlite:///{folder / 'durable.db'}", folder, sizes.durable_seconds),
    }
    server, problem = start_postgres()
    if server is None:
        out["postgresql"] = out["postgresql_replay"] = out["postgresql_durable"] = {"skipped": problem}
        return out
    try:
        out["postgresql"] = sustained(server.create_database(), folder, sizes.writer_exchanges_pg)
        out["postgresql_replay"] = replay(server.create_database(), folder, sizes.spool_records)
        out["postgresql_durable"] = durable(server.create_database(), folder, sizes.durable_seconds)
    finally:
        server.destroy()
    return out


def table(result: dict[str, Any]) -> list[str]:
    lines = ["4. Writer (one AuditWriter; open row + final row per exchange)"]
    for backend in ("sqlite", "postgresql"):
        r = result[backend]
        if "skipped" in r:
            lines.append(f"  {backend:<10} sustained: skipped ({r['skipped']})")
        else:
            lines.append(
                f"  {backend:<10} sustained: {r['exchanges_per_s']:8.0f} exchanges/s "
                f"({r['exchanges']} exchanges in {r['seconds']:.2f} s, ~{r['row_bytes'] / 1000:.1f} kB rows)"
            )
        r = result[f"{backend}_replay"]
        if "skipped" in r:
            lines.append(f"  {backend:<10} spool replay: skipped ({r['skipped']})")
        else:
            lines.append(
                f"  {backend:<10} spool replay: {r['records']} records in {r['seconds']:.2f} s "
                f"({r['records_per_s']:.0f} records/s)"
            )
        r = result.get(f"{backend}_durable", {"skipped": "not measured"})
        if "skipped" in r:
            lines.append(f"  {backend:<10} submit to durable: skipped ({r['skipped']})")
        else:
            lines.append(
                f"  {backend:<10} submit to durable: p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms "
                f"(target p99 <= {r['target_ms']:.0f} ms; max {r['max_ms']:.1f} ms; {r['streams']} "
                f"concurrent streams, {r['records']} final records)"
            )
    if "sealing" in result:
        lines.append(
            f"  hash chain: {result['sealing']['us_per_record']:.1f} µs per record to seal "
            f"(content hashes, canonical form, SHA-256; {result['sealing']['records']} records); "
            f"prepared and sealed as the writer does: {result['sealing']['prepared_us_per_record']:.1f} µs"
        )
    if "pricing" in result:
        r = result["pricing"]
        lines.append(
            f"  pricing: {r['priced_us_per_record']:.1f} µs per record for a priced model (gpt-4o), "
            f"{r['unknown_us_per_record']:.1f} µs for an unknown one ({r['records']} records)"
        )
    return lines
