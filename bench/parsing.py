"""Section 1: SSE parsing throughput, and WHATWG correctness, against the peers.

Every decoder gets the same bytes in the same chunks (one list of ``bytes``, built once
per workload and chunking): each dialect's stream as the mock writes it (thousands of
small deltas of English prose; Gemini with CRLF framing), a stream of a few huge events,
and CRLF framing of the small-delta stream, all pure ASCII; and the same of Japanese with
emoji (non-ASCII-heavy: two to four bytes per character); each split one event per chunk
(a live stream), at 1460 bytes (TCP segments, events and characters cut anywhere) and at
16 KiB (socket reads under load). The issue's target is the minimum over each kind of
body: ASCII, non-ASCII-heavy, and one event per chunk. ``llm-audit + normalizer`` is the proxy's whole per-exchange
pipeline on those bytes (parser, the dialect's normalizer, the exchange record): what
the audit costs, next to what a client SDK's decoder costs.

Correctness: the shared WHATWG test vectors (``shared/reference/sse-vectors.json``),
fed whole and one byte at a time; a vector passes when the events (type, data, last
event id) are exactly the expected ones.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial
from typing import Any

import orjson

from addon.auditor import StreamAuditor, summary_into_record
from addon.framing import sse
from addon.framing.sse import SSEParser
from addon.record import ExchangeRecord
from bench import decoders
from bench.common import ROOT, Sizes, median, ratio, timed_medians
from bench.workloads import APIS, JAPANESE, PROSE, chunked, stream_items, text_of

VECTORS = ROOT.parent / "shared" / "reference" / "sse-vectors.json"
CHUNKINGS = ("event", "1460", "16384")
PEERS = ("httpx-sse", "httpx-sse (decoder only)", "openai")
PURE = "llm-audit (pure)"  # the pure-Python fallback, measured when the compiled parser is in use
ASCII_DELTA = 6  # characters per small delta of English (a token and its space)
JAPANESE_DELTA = 3  # characters per small delta of Japanese (a token is one to three)
CLASSES = {
    "ascii": "ASCII bodies",
    "non-ascii": "non-ASCII-heavy bodies",
    "event": "one event per chunk",
}
"""The issue's three kinds of body; a row counts in its text class and, split one event
per chunk, in ``event`` as well (the minimum over each is what the target is about)."""
ACCELERATOR_FLAGS = ("ACCELERATED", "ACCELERATOR", "COMPILED", "accelerated", "compiled")


def workloads(sizes: Sizes) -> list[tuple[str, str, list[bytes], str]]:
    """(workload name, api key, items, text class) for every stream measured.

    The text class is ``ascii`` (English prose: the body is pure ASCII) or ``non-ascii``
    (Japanese and emoji: nearly every character of the text is two to four bytes).
    """
    n = sizes.parse_events
    ascii_text = text_of(PROSE, n * ASCII_DELTA)
    out = [
        (f"{name} deltas", name, stream_items(api, events=n, text=ascii_text), "ascii") for name, api in APIS.items()
    ]
    out.append(
        (
            "llm-stream deltas, CRLF",
            "llm-stream",
            stream_items(APIS["llm-stream"], events=n, text=ascii_text, crlf=True),
            "ascii",
        )
    )
    huge = sizes.huge_events * sizes.huge_event_bytes
    out.append(
        (
            "huge events",
            "llm-stream",
            stream_items(APIS["llm-stream"], events=sizes.huge_events, text=text_of(PROSE, huge)),
            "ascii",
        )
    )
    japanese = text_of(JAPANESE, n * JAPANESE_DELTA)
    for name in ("openai-chat", "anthropic"):
        out.append((f"{name} deltas, Japanese", name, stream_items(APIS[name], events=n, text=japanese), "non-ascii"))
    out.append(
        (
            "huge events, Japanese",
            "llm-stream",
            # about as many bytes as the ASCII huge events: three bytes per character or four
            stream_items(APIS["llm-stream"], events=sizes.huge_events, text=text_of(JAPANESE, huge // 3)),
            "non-ascii",
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
    for name, api_key, items, text_class in workloads(sizes):
        body_len = sum(map(len, items))
        if text_class == "ascii" and not all(item.isascii() for item in items):
            raise RuntimeError(f"the {name} workload is meant to be ASCII")
        full = pipeline(api_key)
        for how in CHUNKINGS:
            chunks = chunked(items, how)
            row: dict[str, Any] = {
                "workload": name,
                "text": text_class,
                "chunks": how,
                "bytes": body_len,
                "chunk_count": len(chunks),
            }
            fns: dict[str, Callable[[], Any]] = {
                impl: partial(fn, chunks) for impl, fn in impls.items() if fn is not None
            }
            fns["llm-audit + normalizer"] = partial(full, chunks)
            row |= {impl: {"skipped": "not installed"} for impl, fn in impls.items() if fn is None}
            for impl, (seconds, result) in timed_medians(fns, sizes.runs).items():
                row[impl] = _rate(body_len, result if isinstance(result, int) else len(result), seconds)
            row["events"] = row["llm-audit"]["events"]
            row["best_peer"], row["vs_best_peer"] = _versus_peers(row)
            row["pure_vs_best_peer"] = _versus_peers(row, PURE)[1]
            rows.append(row)
    return {
        "rows": rows,
        "correctness": correctness(impls),
        "summary": summarize(rows),
        "accelerator": accelerator(),
    }


def accelerator() -> dict[str, Any]:
    """Whether the SSE parser runs compiled: a flag of ``addon.framing.sse`` if it has one
    (any of ``ACCELERATOR_FLAGS``), and whether the parser class comes from an extension module."""
    flag = next((name for name in ACCELERATOR_FLAGS if hasattr(sse, name)), None)
    module = sys.modules.get(getattr(SSEParser, "__module__", ""), sse)
    path = str(getattr(module, "__file__", "") or "")
    compiled = path.endswith((".so", ".pyd"))
    in_use = bool(getattr(sse, flag)) if flag else compiled
    return {"flag": flag, "in_use": in_use, "parser_module": path, "compiled_module": compiled}


def _rate(nbytes: int, events: int, seconds: float) -> dict[str, Any]:
    return {"seconds": seconds, "events": events, "MB_per_s": nbytes / seconds / 1e6, "events_per_s": events / seconds}


def _versus_peers(row: dict[str, Any], ours: str = "llm-audit") -> tuple[str | None, float | None]:
    """The fastest peer of a row and how many times faster the llm-audit parser is
    (``ours``: the parser in use, or its pure-Python fallback)."""
    peers = [(row[p]["MB_per_s"], p) for p in PEERS if "MB_per_s" in row.get(p, {})]
    if not peers or "MB_per_s" not in row.get(ours, {}):
        return None, None
    best, name = max(peers)
    return name, ratio(row[ours]["MB_per_s"], best)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and minimum of the parser's speed-up over the fastest peer, across all rows and per class."""
    ratios = [r["vs_best_peer"] for r in rows if r["vs_best_peer"] is not None]
    by_class: dict[str, Any] = {}
    for key in CLASSES:
        of = [r for r in rows if r["vs_best_peer"] is not None and key in (r["text"], r["chunks"])]
        worst = min(of, key=lambda r: r["vs_best_peer"], default=None)
        by_class[key] = {
            "rows": len(of),
            "min_vs_best_peer": worst["vs_best_peer"] if worst else None,
            "worst_row": f"{worst['workload']}, chunks {worst['chunks']}" if worst else None,
        }
    pure = [r["pure_vs_best_peer"] for r in rows if r.get("pure_vs_best_peer") is not None]
    return {
        "pure_median_vs_best_peer": median(pure) if pure else None,
        "pure_min_vs_best_peer": min(pure) if pure else None,
        "median_vs_best_peer": median(ratios) if ratios else None,
        "min_vs_best_peer": min(ratios) if ratios else None,
        "rows_at_2x": sum(1 for x in ratios if x >= 2),
        "rows": len(ratios),
        "classes": by_class,
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
    impls = ["llm-audit", PURE, *PEERS, "llm-audit + normalizer"]
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
        lines.append(
            "  min per kind of body: "
            + "; ".join(
                f"{CLASSES[k]} {c['min_vs_best_peer']:.2f}x ({c['worst_row']})"
                for k, c in s["classes"].items()
                if c["min_vs_best_peer"] is not None
            )
        )
    if s.get("pure_median_vs_best_peer") is not None:
        lines.append(
            f"pure-Python fallback vs fastest peer: median {s['pure_median_vs_best_peer']:.2f}x,"
            f" min {s['pure_min_vs_best_peer']:.2f}x"
        )
    a = result["accelerator"]
    flag = f"addon.framing.sse.{a['flag']} = {a['in_use']}" if a["flag"] else "addon.framing.sse has no flag"
    compiled = "compiled" if a["compiled_module"] else "Python"
    lines.append(f"compiled SSE accelerator: {flag}; the parser class is from {a['parser_module']} ({compiled})")
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
        PURE: "pure",
    }.get(impl, impl)
