"""Section 1: SSE parsing throughput, and WHATWG correctness, against the peers.

Every decoder gets the same bytes in the same chunks: each dialect's stream as the mock
writes it (thousands of small deltas; Gemini with CRLF framing), a stream of a few huge
events, and CRLF framing of the small-delta stream; each split one event per chunk (a
live stream), at 1460 bytes (TCP segments, events cut anywhere) and at 16 KiB (socket
reads under load). ``llm-audit + normalizer`` is the proxy's whole per-exchange
pipeline on those bytes (parser, the dialect's normalizer, the exchange record): what
the audit costs, next to what a client SDK's decoder costs.

Correctness: the shared WHATWG test vectors (``shared/reference/sse-vectors.json``),
fed whole and one byte at a time; a vector passes when the events (type, data, last
event id) are exactly the expected ones.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import orjson

from addon.auditor import StreamAuditor, summary_into_record
from addon.record import ExchangeRecord
from bench import decoders
from bench.common import ROOT, Sizes, median, ratio, timed_medians
from bench.workloads import APIS, chunked, stream_items

VECTORS = ROOT.parent / "shared" / "reference" / "sse-vectors.json"
CHUNKINGS = ("event", "1460", "16384")
PEERS = ("httpx-sse", "httpx-sse (decoder only)", "openai")


def workloads(sizes: Sizes) -> list[tuple[str, str, list[bytes]]]:
    """(workload name, api key, items) for every stream measured."""
    n = sizes.parse_events
    out = [(f"{name} deltas", name, stream_items(api, events=n)) for name, api in APIS.items()]
    out.append(("llm-stream deltas, CRLF", "llm-stream", stream_items(APIS["llm-stream"], events=n, crlf=True)))
    out.append(
        (
            "huge events",
            "llm-stream",
            stream_items(APIS["llm-stream"], events=sizes.huge_events, size=sizes.huge_event_bytes),
        )
    )
    return out


def pipeline(api_key: str):
    """A function running the proxy's per-exchange audit pipeline on chunks; returns the events counted."""
    api = APIS[api_key]
    dialect = api.addon_dialect()
    view = api.view()

    def run(chunks: list[bytes]) -> int:
        record = ExchangeRecord(dialect=dialect.name, streamed=True, http_status=200)
        summary = dialect.summarize(api.body, view)
        summary_into_record(record, summary)
        auditor = StreamAuditor(record, dialect.normalizer(summary), None, 8 * 1024 * 1024)
        for chunk in chunks:
            auditor.feed(chunk)
        auditor.end()
        record.finish("complete")
        if auditor.failed:
            raise RuntimeError(f"the {dialect.name} pipeline failed: {record.findings}")
        return record.event_count

    return run


def measure(sizes: Sizes) -> dict[str, Any]:
    impls = decoders.available()
    rows: list[dict[str, Any]] = []
    for name, api_key, items in workloads(sizes):
        body_len = sum(map(len, items))
        full = pipeline(api_key)
        for how in CHUNKINGS:
            chunks = chunked(items, how)
            row: dict[str, Any] = {"workload": name, "chunks": how, "bytes": body_len, "chunk_count": len(chunks)}
            fns: dict[str, Callable[[], Any]] = {
                impl: partial(fn, chunks) for impl, fn in impls.items() if fn is not None
            }
            fns["llm-audit + normalizer"] = partial(full, chunks)
            row |= {impl: {"skipped": "not installed"} for impl, fn in impls.items() if fn is None}
            for impl, (seconds, result) in timed_medians(fns, sizes.runs).items():
                row[impl] = _rate(body_len, result if isinstance(result, int) else len(result), seconds)
            row["events"] = row["llm-audit"]["events"]
            row["best_peer"], row["vs_best_peer"] = _versus_peers(row)
            rows.append(row)
    return {"rows": rows, "correctness": correctness(impls), "summary": summarize(rows)}


def _rate(nbytes: int, events: int, seconds: float) -> dict[str, Any]:
    return {"seconds": seconds, "events": events, "MB_per_s": nbytes / seconds / 1e6, "events_per_s": events / seconds}


def _versus_peers(row: dict[str, Any]) -> tuple[str | None, float | None]:
    """The fastest peer of a row and how many times faster the llm-audit parser is."""
    peers = [(row[p]["MB_per_s"], p) for p in PEERS if "MB_per_s" in row.get(p, {})]
    if not peers:
        return None, None
    best, name = max(peers)
    return name, ratio(row["llm-audit"]["MB_per_s"], best)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and minimum of the parser's speed-up over the fastest peer, across all rows."""
    ratios = [r["vs_best_peer"] for r in rows if r["vs_best_peer"] is not None]
    return {
        "median_vs_best_peer": median(ratios) if ratios else None,
        "min_vs_best_peer": min(ratios) if ratios else None,
        "rows_at_2x": sum(1 for x in ratios if x >= 2),
        "rows": len(ratios),
    }


def correctness(impls: dict[str, Any]) -> dict[str, Any]:
    """WHATWG vectors passed by each decoder, whole and byte at a time."""
    if not VECTORS.exists():
        return {"skipped": f"{VECTORS} not found"}
    vectors = orjson.loads(VECTORS.read_bytes())
    out: dict[str, Any] = {"vectors": len(vectors)}
    for impl, fn in impls.items():
        if fn is None:
            out[impl] = {"skipped": "not installed"}
            continue
        passed, failed = 0, []
        for vector in vectors:
            data = bytes.fromhex(vector["input_hex"]) if "input_hex" in vector else vector["input"].encode()
            ok = all(
                _events_match(fn, chunks, vector["expected"])
                for chunks in ([data], [data[i : i + 1] for i in range(len(data))])
            )
            if ok:
                passed += 1
            else:
                failed.append(vector["name"])
        out[impl] = {"passed": passed, "failed": failed}
    return out


def _events_match(fn, chunks: list[bytes], expected: list[dict[str, str]]) -> bool:
    try:
        got = [decoders.as_whatwg(e) for e in fn(chunks)]
    except Exception:  # noqa: BLE001 - a decoder that raises on a vector fails it
        return False
    return got == [{"event": e["event"], "data": e["data"], "id": e["id"]} for e in expected]


def table(result: dict[str, Any]) -> list[str]:
    """Text lines: MB/s per decoder per workload and chunking, and the correctness counts."""
    impls = ["llm-audit", *PEERS, "llm-audit + normalizer"]
    head = (
        f"{'workload':<26} {'chunks':>6} {'events':>7} " + " ".join(f"{_short(i):>11}" for i in impls) + "   ours/best"
    )
    lines = ["1. Parsing (MB/s; median of runs)", head]
    for row in result["rows"]:
        cells = " ".join(f"{row[i]['MB_per_s']:11.1f}" if "MB_per_s" in row.get(i, {}) else f"{'-':>11}" for i in impls)
        vs = f"{row['vs_best_peer']:.2f}x" if row["vs_best_peer"] is not None else "-"
        lines.append(f"{row['workload']:<26} {row['chunks']:>6} {row['events'] or 0:>7} {cells}   {vs:>8}")
    s = result["summary"]
    if s["median_vs_best_peer"] is not None:
        lines.append(
            f"parser vs fastest peer: median {s['median_vs_best_peer']:.2f}x, min {s['min_vs_best_peer']:.2f}x,"
            f" {s['rows_at_2x']}/{s['rows']} rows at >= 2x"
        )
    c = result["correctness"]
    if "skipped" in c:
        lines.append(f"WHATWG vectors: skipped ({c['skipped']})")
    else:
        parts = [
            f"{_short(i)} {c[i]['passed']}/{c['vectors']}" for i in c if isinstance(c[i], dict) and "passed" in c[i]
        ]
        lines.append("WHATWG vectors passed (whole and byte by byte): " + ", ".join(parts))
    return lines


def _short(impl: str) -> str:
    return {
        "httpx-sse (decoder only)": "httpx-sse*",
        "llm-audit + normalizer": "ours+norm",
        "llm-audit": "llm-audit",
    }.get(impl, impl)
