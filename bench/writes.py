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

Sealing: what tamper evidence costs per record (``storage.chain.Chain.seal``: the content
hashes, the canonical serialization, SHA-256), the same final rows sealed in a loop.
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

from addon.auditor import StreamAuditor, summary_into_record
from addon.record import ExchangeRecord
from addon.redact import redact_headers
from bench.common import ROOT, Sizes
from bench.workloads import APIS, stream_items
from storage.chain import Chain, Head
from storage.database import open_engine
from storage.spool import Spool
from storage.writer import AuditWriter

API = APIS["openai-chat"]
ANSWER_DELTAS = 300
LAG = 1000  # exchanges between an open row and its final row


def template_rows() -> tuple[dict[str, Any], dict[str, Any]]:
    """The open row and the final row of one realistic exchange."""
    dialect = API.addon_dialect()
    now = time.time()
    record = ExchangeRecord(
        dialect=dialect.name, provider="openai", started_at=now, server_address="api.openai.com", server_port=443,
        http_method="POST", url_path=API.path, url_query="", http_version="HTTP/1.1", client_address="10.1.2.3",
        proxy_instance="bench", api_key_fingerprint="sha256:0123456789abcdef", request_body=API.body,
        request_headers=redact_headers([("content-type", "application/json"), ("authorization", "Bearer sk-bench"),
                                        ("user-agent", "OpenAI/Python 2.1.0"), ("accept", "text/event-stream")]),
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
    return {"records": count, "seconds": seconds, "records_per_s": count / seconds,
            "spool_bytes_per_record": spool_bytes / count}


def _postgres(folder: Path):
    """A throwaway PostgreSQL server (tests/pgserver.py), or the reason there is none."""
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from pgserver import PgServer, PostgresUnavailable
    except ImportError as e:
        return None, f"tests/pgserver.py cannot be imported: {e}"
    try:
        return PgServer().start(), None
    except PostgresUnavailable as e:
        return None, str(e).splitlines()[0]


def sealing(count: int) -> dict[str, Any]:
    """Microseconds per record to seal a realistic final row into a chain (median of 5 rounds)."""
    _, final = template_rows()
    rounds = []
    for _ in range(5):
        chain = Chain("bench", Head())
        started = time.perf_counter()
        for _ in range(count):
            chain.seal(final)
        rounds.append((time.perf_counter() - started) / count)
    return {"records": count, "us_per_record": sorted(rounds)[2] * 1e6}


def measure(sizes: Sizes, tmp: Path) -> dict[str, Any]:
    folder = tmp / "writer"
    folder.mkdir()
    out: dict[str, Any] = {
        "sealing": sealing(max(sizes.writer_exchanges // 10, 100)),
        "sqlite": sustained(f"sqlite:///{folder / 'sustained.db'}", folder, sizes.writer_exchanges),
        "sqlite_replay": replay(f"sqlite:///{folder / 'replay.db'}", folder, sizes.spool_records),
    }
    server, problem = _postgres(folder)
    if server is None:
        out["postgresql"] = out["postgresql_replay"] = {"skipped": problem}
        return out
    try:
        out["postgresql"] = sustained(server.create_database(), folder, sizes.writer_exchanges_pg)
        out["postgresql_replay"] = replay(server.create_database(), folder, sizes.spool_records)
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
            lines.append(f"  {backend:<10} sustained: {r['exchanges_per_s']:8.0f} exchanges/s "
                         f"({r['exchanges']} exchanges in {r['seconds']:.2f} s, ~{r['row_bytes'] / 1000:.1f} kB rows)")
        r = result[f"{backend}_replay"]
        if "skipped" in r:
            lines.append(f"  {backend:<10} spool replay: skipped ({r['skipped']})")
        else:
            lines.append(f"  {backend:<10} spool replay: {r['records']} records in {r['seconds']:.2f} s "
                         f"({r['records_per_s']:.0f} records/s)")
    if "sealing" in result:
        lines.append(f"  hash chain: {result['sealing']['us_per_record']:.1f} µs per record to seal "
                     f"(content hashes, canonical form, SHA-256; {result['sealing']['records']} records)")
    return lines
