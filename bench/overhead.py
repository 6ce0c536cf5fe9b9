"""Sections 2 and 3: what the audit costs a proxy, and what content filters add.

The same load goes through four mitmdump processes side by side, one variant at a
time in rotating order, every run:

* ``plain``: mitmdump streaming event streams (``bench/plain_stream.py``), no audit;
* ``callable``: the same through a stream callable that returns every chunk as it came
  (``bench/plain_stream.py`` with ``plain_stream_callable``): what mitmproxy's callable path costs by itself, the
  floor under the audit's ratio (the audit must read the bytes that way);
* ``audit``: ``mitmdump -s addon/llm_audit.py`` recording to SQLite;
* ``filters``: the same with ``llm_rules`` = 100 blocking rules of every kind (keywords,
  regex, secrets, PII: ``bench/rules.py``); compared with ``plain`` (the issue's target)
  and with ``audit`` (what the rules themselves add).

Two loads per concurrency level (1, 50, 200 streams of OpenAI Chat Completions from the
mock): *paced*, small deltas at a steady rate as a model streams them, the streams
opening at 100 a second (per-event delay, time to first chunk, CPU per GB of small
events), and *bulk*, 1 KiB deltas as fast as the pipes allow, all streams at once (CPU
per GB of bytes; its delays are queueing, not overhead). The proxy's CPU seconds are read before and
after each load (after the audit writer has flushed); the per-event delay is the time
from the mock's write (the stamp in the event) to the client's receipt. A *direct* load
(no proxy) shows the floor of that delay on this machine.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import Any

from bench.client import StreamResult, Target, build_request, stream
from bench.common import Sizes, median, percentile, ratio
from bench.processes import Mock, Proxy, split_cores, start_mock, start_proxies, stop_all
from bench.rules import write_rules
from bench.workloads import APIS, request_bytes

VARIANTS = ("plain", "callable", "audit", "filters")
API = APIS["openai-chat"]
SETTLE = 0.3  # seconds for the audit writer to flush (it batches within 50 ms)


def measure(sizes: Sizes, tmp: Path) -> dict[str, Any]:
    proxy_cpus, other_cpus = split_cores()
    rules = write_rules(tmp)
    mock = start_mock(tmp, other_cpus)
    proxies: dict[str, Proxy] = {}
    try:
        proxies = start_proxies(tmp, {v: (v, rules) for v in VARIANTS}, proxy_cpus)
        warm_up(mock, proxies)
        levels = [_level(sizes, mock, proxies, c) for c in sizes.concurrency]
    finally:
        stop_all([*proxies.values(), mock])
    recorded = {v: _recorded(p) for v, p in proxies.items() if p.db_url}
    unfinished = {v: rows for v, p in proxies.items() if p.db_url and (rows := _unfinished(p))}
    return {
        "levels": levels,
        "recorded": recorded,
        "unfinished": unfinished,
        "pinned": {"proxy": sorted(proxy_cpus), "others": sorted(other_cpus)},
        "summary": summarize(levels),
    }


def target_for(mock: Mock, proxy: Proxy | None) -> Target:
    if proxy is None:
        return Target("127.0.0.1", mock.port, mock.origin, via_proxy=False)
    return Target("127.0.0.1", proxy.port, mock.origin, via_proxy=True)


def request_for(target: Target, scenario: str) -> bytes:
    return build_request(target, API.target, API.headers | {"x-mock": scenario}, request_bytes(API))


def warm_up(mock: Mock, proxies: dict[str, Proxy]) -> None:
    """A few streams through each proxy first: imports, connections and caches settle."""
    for proxy in proxies.values():
        target = target_for(mock, proxy)
        asyncio.run(many(target, request_for(target, "events=20&stamp=1"), 4, 0.0))


async def many(target: Target, request: bytes, count: int, spread: float) -> list[StreamResult]:
    """``count`` concurrent streams, their starts spread evenly over ``spread`` seconds."""

    async def one(i: int) -> StreamResult:
        await asyncio.sleep(spread * i / count)
        return await stream(target, request)

    return await asyncio.gather(*(one(i) for i in range(count)))


def _load(mock: Mock, proxy: Proxy | None, count: int, scenario: str, spread: float) -> dict[str, Any]:
    """One load through one proxy (or directly): CPU, bytes, delays, time to first chunk."""
    target = target_for(mock, proxy)
    request = request_for(target, scenario)
    cpu_before = proxy.cpu_seconds() if proxy else 0.0
    started = time.perf_counter()
    results = asyncio.run(many(target, request, count, spread))
    wall = time.perf_counter() - started
    if proxy is not None:
        time.sleep(SETTLE)
    cpu = proxy.cpu_seconds() - cpu_before if proxy else None
    nbytes = sum(r.body_bytes for r in results)
    delays = [d / 1e6 for r in results for d in r.delays_ns]
    ttfc = [r.ttfc * 1000 for r in results if r.ttfc is not None]
    failed = [r.error or f"status {r.status}" for r in results if r.error or r.status != 200 or not r.complete]
    return {
        "streams": count,
        "failed": len(failed),
        "failures": failed[:3],
        "bytes": nbytes,
        "wall_s": wall,
        "MB_per_s": nbytes / wall / 1e6,
        "cpu_s": cpu,
        "cpu_s_per_GB": cpu / (nbytes / 1e9) if cpu is not None and nbytes else None,
        "events": len(delays),
        "delay_ms_p50": percentile(delays, 50),
        "delay_ms_p99": percentile(delays, 99),
        "ttfc_ms_p50": percentile(ttfc, 50),
        "ttfc_ms_p99": percentile(ttfc, 99),
    }


def _level(sizes: Sizes, mock: Mock, proxies: dict[str, Proxy], count: int) -> dict[str, Any]:
    """Every variant under the paced and the bulk load, ``proxy_runs`` times, rotating the order."""
    paced = f"events={sizes.paced_events}&delay={sizes.paced_delay}&stamp=1"
    bulk_events = max(1, sizes.bulk_bytes // (count * sizes.bulk_event_bytes))
    bulk = f"events={bulk_events}&size={sizes.bulk_event_bytes}&stamp=1"
    # Paced streams open at 100 a second, as clients come and go, not in one burst: a
    # burst measures mitmproxy's connection set-up queue, not the per-event delay.
    spread = max(sizes.paced_delay, count * 0.01)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {v: {"paced": [], "bulk": []} for v in VARIANTS}
    for run in range(sizes.proxy_runs):
        order = VARIANTS[run % len(VARIANTS) :] + VARIANTS[: run % len(VARIANTS)]
        for variant in order:
            runs[variant]["paced"].append(_load(mock, proxies[variant], count, paced, spread))
            runs[variant]["bulk"].append(_load(mock, proxies[variant], count, bulk, 0.0))
    direct = _load(mock, None, count, paced, spread)
    return {
        "concurrency": count,
        "paced_scenario": paced,
        "bulk_scenario": bulk,
        "direct_paced": direct,
        "variants": {v: {load: _medians(r) for load, r in loads.items()} for v, loads in runs.items()},
        "vs_plain": _paired(runs),
        "runs": runs,
    }


_MEDIAN_KEYS = ("MB_per_s", "cpu_s", "cpu_s_per_GB", "delay_ms_p50", "delay_ms_p99", "ttfc_ms_p50", "ttfc_ms_p99")


def _medians(results: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {k: median([r[k] for r in results if r[k] is not None]) for k in _MEDIAN_KEYS}
    out["bytes"] = results[0]["bytes"]
    out["failed"] = sum(r["failed"] for r in results)
    return out


def _paired(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Same-run comparisons (medians over runs): CPU ratios and delay differences.

    ``callable``, ``audit`` and ``filters`` against ``plain``, and ``filters`` against ``audit``.
    """
    out: dict[str, Any] = {}
    for variant, base in (("callable", "plain"), ("audit", "plain"), ("filters", "plain"), ("filters", "audit")):
        key = f"{variant}/{base}"
        out[key] = {}
        for load in ("paced", "bulk"):
            pairs = list(zip(runs[variant][load], runs[base][load]))
            out[key][load] = {
                "cpu_ratio": median([x for a, b in pairs if (x := ratio(a["cpu_s_per_GB"], b["cpu_s_per_GB"]))]),
                "delay_p50_added_ms": median([a["delay_ms_p50"] - b["delay_ms_p50"] for a, b in pairs]),
                "delay_p99_added_ms": median([a["delay_ms_p99"] - b["delay_ms_p99"] for a, b in pairs]),
                "ttfc_p50_added_ms": median([a["ttfc_ms_p50"] - b["ttfc_ms_p50"] for a, b in pairs]),
            }
    return out


def _recorded(proxy: Proxy) -> dict[str, int]:
    """Rows the audit proxy wrote, by status: every stream must be there, completed."""
    path = (proxy.db_url or "").removeprefix("sqlite:///")
    with closing(sqlite3.connect(path)) as con:
        return dict(con.execute("SELECT status, count(*) FROM exchanges GROUP BY status").fetchall())


def _unfinished(proxy: Proxy, limit: int = 10) -> list[dict[str, Any]]:
    """What the audit proxy recorded of streams that did not complete: the evidence of a
    failed load (the proxies' folders go with the run's temporary directory)."""
    path = (proxy.db_url or "").removeprefix("sqlite:///")
    with closing(sqlite3.connect(path)) as con:
        rows = con.execute(
            "SELECT status, error_code, error_message, event_count, length(output_text), started_at, ended_at"
            " FROM exchanges WHERE status != 'completed' ORDER BY started_at LIMIT ?",
            (limit,),
        ).fetchall()
    keys = ("status", "error_code", "error_message", "events", "text_chars", "started_at", "ended_at")
    return [dict(zip(keys, row)) for row in rows]


def summarize(levels: list[dict[str, Any]]) -> dict[str, Any]:
    """The worst case over concurrency levels of what the targets are about."""
    cpu_added = [lv["vs_plain"]["audit/plain"][load]["cpu_ratio"] - 1 for lv in levels for load in ("paced", "bulk")]
    p99_added = [lv["vs_plain"]["audit/plain"]["paced"]["delay_p99_added_ms"] for lv in levels]
    return {"audit_cpu_added_max": max(cpu_added), "audit_delay_p99_added_ms_max": max(p99_added)}


def table(result: dict[str, Any]) -> list[str]:
    head = (
        f"{'streams':>7} {'load':<6} {'variant':<8} {'MB/s':>7} {'CPU s/GB':>9} {'vs plain':>8} "
        f"{'delay p50':>9} {'p99 ms':>7} {'+p99 ms':>7} {'TTFC p50':>8} {'+TTFC':>6} {'fail':>4}"
    )
    lines = [
        "2./3. Proxy overhead (medians over runs; paced = small deltas at a model's pace, bulk = 1 KiB deltas flat out)",
        head,
    ]
    for lv in result["levels"]:
        for load in ("paced", "bulk"):
            for variant in VARIANTS:
                m = lv["variants"][variant][load]
                vs = lv["vs_plain"].get(f"{variant}/plain", {}).get(load, {})
                cpu_vs = f"{vs['cpu_ratio']:.2f}x" if vs else "-"
                p99_add = f"{vs['delay_p99_added_ms']:+.2f}" if vs else "-"
                ttfc_add = f"{vs['ttfc_p50_added_ms']:+.2f}" if vs else "-"
                lines.append(
                    f"{lv['concurrency']:>7} {load:<6} {variant:<8} {m['MB_per_s']:7.1f} {m['cpu_s_per_GB']:9.1f}"
                    f" {cpu_vs:>8} {m['delay_ms_p50']:9.2f} {m['delay_ms_p99']:7.2f} {p99_add:>7}"
                    f" {m['ttfc_ms_p50']:8.2f} {ttfc_add:>6} {m['failed']:>4}"
                )
        d = lv["direct_paced"]
        lines.append(
            f"{lv['concurrency']:>7} {'paced':<6} {'direct':<8} {d['MB_per_s']:7.1f} {'-':>9} {'-':>8}"
            f" {d['delay_ms_p50']:9.2f} {d['delay_ms_p99']:7.2f} {'-':>7} {d['ttfc_ms_p50']:8.2f} {'-':>6} {d['failed']:>4}"
        )
    s = result["summary"]
    lines.append(
        f"audit vs plain, worst level: CPU {s['audit_cpu_added_max']:+.1%}, p99 per-event delay "
        f"{s['audit_delay_p99_added_ms_max']:+.2f} ms; rows recorded: {result['recorded']}"
    )
    for variant, rows in result.get("unfinished", {}).items():
        for row in rows:
            why = ": ".join(str(x) for x in (row["error_code"], row["error_message"]) if x)
            lines.append(
                f"  not completed ({variant}): {row['status']}{f' ({why})' if why else ''}"
                f" after {row['events']} events, {row['started_at']} to {row['ended_at']}"
            )
    return lines
