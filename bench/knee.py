"""Where delays start to grow: paced streams at 20 events/s, more and more of them (issue 20).

At each level of the sweep N streams of OpenAI Chat Completions from the mock, each an
event every 50 ms (a model's pace), go through plain mitmdump, through the audit proxy,
and directly to the mock (what the load generator itself manages: the mock and the
clients share the other core), one after the other, rotating the order at each level.
The streams open at ``sweep_open_rate`` a second, so a level of N streams has them all
open once its ramp (N / rate seconds) is over, until the first stream ends.

Per level and proxy: the median time to the first body byte (TTFB), the per-event delay
(the mock's write, stamped in the event, to the client's receipt; p95), the p95 gap
between consecutive events of one stream at the client (50 ms when nothing queues), and
the events per second delivered while all streams are open, beside those offered (N x 20)
and those the mock actually wrote in that window. Once both proxies have been saturated
(below) at two levels in a row, the sweep stops: more streams would only take time.

**Delays grow** at a level where the p95 per-event delay, the p95 gap between events or
the median TTFB exceeds ``GROWTH`` times its value at the sweep's lowest level (the same
proxy, nearly unloaded) plus ``SLACK_MS`` (so that sub-millisecond jitter on a shared machine does not count);
the *knee* is the first such level. **Delivered stops following offered** at the first
level delivering less than ``FOLLOW`` of what is offered; the *top rate* is the most
events per second a proxy delivered at any level. When the direct load's delays grow
too, the load generator (not the proxy) is the limit from there on, and the table says so.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from bench.common import Sizes, median, percentile, ratio
from bench.overhead import many, request_for, target_for, warm_up
from bench.processes import Mock, Proxy, split_cores, start_mock, start_proxies, stop_all

EVENTS_PER_S = 20
INTERVAL = 1 / EVENTS_PER_S
GROWTH = 2.0
SLACK_MS = 1.0
FOLLOW = 0.9
MARGIN = 0.25  # seconds after the ramp before the window opens: the last streams' first bytes
VARIANTS = ("plain", "audit", "direct")
DEFINITION = (
    f"delays grow: p95 per-event delay, p95 gap between events or median TTFB > {GROWTH:g} x its value "
    f"at the lowest level + {SLACK_MS:g} ms; "
    f"top rate: most events/s delivered while all streams are open (saturated: < {FOLLOW:.0%} of offered)"
)


def measure(sizes: Sizes, tmp: Path) -> dict[str, Any]:
    proxy_cpus, other_cpus = split_cores()
    mock = start_mock(tmp, other_cpus)
    proxies: dict[str, Proxy] = {}
    try:
        proxies = start_proxies(tmp, {v: (v, None) for v in VARIANTS[:2]}, proxy_cpus)
        warm_up(mock, proxies)
        levels = []
        for i, count in enumerate(sizes.sweep_streams):
            order = VARIANTS[i % len(VARIANTS) :] + VARIANTS[: i % len(VARIANTS)]
            level: dict[str, Any] = {"streams": count, "offered_events_per_s": count * EVENTS_PER_S}
            for variant in order:
                level[variant] = _load(mock, proxies.get(variant), count, sizes)
            level["audit_vs_plain"] = {
                "ttfb_p50": ratio(level["audit"]["ttfb_ms_p50"], level["plain"]["ttfb_ms_p50"]),
                "delay_p95": ratio(level["audit"]["delay_ms_p95"], level["plain"]["delay_ms_p95"]),
            }
            levels.append(level)
            if _saturated_twice(levels):
                break  # both proxies are past their top: more streams would only take time
    finally:
        stop_all([*proxies.values(), mock])
    return {"definition": DEFINITION, "levels": levels, "summary": summarize(levels)}


def _load(mock: Mock, proxy: Proxy | None, count: int, sizes: Sizes) -> dict[str, Any]:
    target = target_for(mock, proxy)
    request = request_for(target, f"events={sizes.sweep_events}&delay={INTERVAL}&stamp=1")
    ramp = count / sizes.sweep_open_rate
    started = time.time_ns()
    results = asyncio.run(many(target, request, count, ramp))
    arrivals = [t for r in results for t in r.arrivals_ns]
    writes = [t - d for r in results for t, d in zip(r.arrivals_ns, r.delays_ns)]
    lo, hi = started + int((ramp + MARGIN) * 1e9), started + int(sizes.sweep_events * INTERVAL * 1e9)
    if hi - lo < 0.2e9 and arrivals:  # too short a sweep for a window with every stream open
        lo, hi = min(arrivals), max(arrivals) + 1
    seconds = max(hi - lo, 1) / 1e9
    gaps = [(b - a) / 1e6 for r in results for a, b in zip(r.arrivals_ns, r.arrivals_ns[1:])]
    delays = [d / 1e6 for r in results for d in r.delays_ns]
    ttfb = [r.ttfc * 1000 for r in results if r.ttfc is not None]
    failed = [r.error or f"status {r.status}" for r in results if r.error or r.status != 200 or not r.complete]
    return {
        "failed": len(failed),
        "failures": failed[:3],
        "events": len(delays),
        "window_s": seconds,
        "delivered_events_per_s": sum(lo <= t < hi for t in arrivals) / seconds,
        "written_events_per_s": sum(lo <= t < hi for t in writes) / seconds,
        "ttfb_ms_p50": median(ttfb),
        "ttfb_ms_p95": percentile(ttfb, 95),
        "delay_ms_p50": percentile(delays, 50),
        "delay_ms_p95": percentile(delays, 95),
        "delay_ms_p99": percentile(delays, 99),
        "gap_ms_p95": percentile(gaps, 95),
    }


def _saturated_twice(levels: list[dict[str, Any]]) -> bool:
    """Whether plain and audit both delivered less than ``FOLLOW`` of the offered rate at the last two levels."""
    return len(levels) >= 3 and all(
        lv[v]["delivered_events_per_s"] < FOLLOW * lv["offered_events_per_s"]
        for lv in levels[-2:]
        for v in VARIANTS[:2]
    )


def _grown(m: dict[str, Any], base: dict[str, Any]) -> list[str]:
    """Which of a level's delays have grown beyond the threshold over the lowest level's."""
    out = []
    for key, name in (("delay_ms_p95", "p95 delay"), ("gap_ms_p95", "p95 gap"), ("ttfb_ms_p50", "TTFB")):
        if m[key] > GROWTH * base[key] + SLACK_MS:
            out.append(name)
    return out


def _variant_summary(levels: list[dict[str, Any]], variant: str) -> dict[str, Any]:
    base = levels[0][variant]
    knee = next(((lv["streams"], g) for lv in levels[1:] if (g := _grown(lv[variant], base))), None)
    saturated = next(
        (lv["streams"] for lv in levels if lv[variant]["delivered_events_per_s"] < FOLLOW * lv["offered_events_per_s"]),
        None,
    )
    return {
        "knee_streams": knee[0] if knee else None,
        "knee_grown": knee[1] if knee else [],
        "saturated_from_streams": saturated,
        "top_events_per_s": max(lv[variant]["delivered_events_per_s"] for lv in levels),
    }


def summarize(levels: list[dict[str, Any]]) -> dict[str, Any]:
    """Knee and top rate of each variant, and the issue's two comparisons of audit with plain."""
    out: dict[str, Any] = {v: _variant_summary(levels, v) for v in VARIANTS}
    order = [lv["streams"] for lv in levels]

    def position(streams: int | None) -> int:
        return order.index(streams) if streams is not None else len(order)

    plain, audit, direct = out["plain"], out["audit"], out["direct"]
    out["knee_same_as_plain"] = position(audit["knee_streams"]) >= position(plain["knee_streams"])
    out["top_vs_plain"] = ratio(audit["top_events_per_s"], plain["top_events_per_s"])
    # a proxy that follows every offered rate of the sweep has its top beyond it: what it
    # delivered then is what was offered, up to the window's noise, not its limit
    out["top_met"] = audit["saturated_from_streams"] is None or (out["top_vs_plain"] or 0) >= 0.95
    # where the generator itself stops keeping up, neither proxy's figure means more
    out["generator_limited_from_streams"] = min(
        (s for s in (direct["knee_streams"], direct["saturated_from_streams"]) if s is not None),
        key=position,
        default=None,
    )
    out["highest_streams"] = order[-1]
    return out


def describe_knee(summary: dict[str, Any], variant: str) -> str:
    s = summary[variant]
    if s["knee_streams"] is None:
        return f"not within the sweep (up to {summary['highest_streams']} streams)"
    return f"from {s['knee_streams']} streams ({', '.join(s['knee_grown'])})"


def describe_top(summary: dict[str, Any], variant: str) -> str:
    s = summary[variant]
    how = (
        f"saturated from {s['saturated_from_streams']} streams"
        if s["saturated_from_streams"] is not None
        else f"not saturated up to {summary['highest_streams']} streams"
    )
    return f"{s['top_events_per_s']:,.0f} events/s ({how})"


def table(result: dict[str, Any]) -> list[str]:
    head = (
        f"{'streams':>7} {'offered/s':>9} {'variant':<7} {'TTFB p50':>8} {'delay95':>7} {'delay99':>7}"
        f" {'gap p95':>7} {'written/s':>9} {'deliv./s':>9} {'TTFB x':>6} {'p95 x':>6} {'fail':>4}"
    )
    lines = [
        f"Where delays start to grow (paced streams, {EVENTS_PER_S} events/s each; ms; delay = the mock's write"
        " to the client's receipt, gap = between a stream's events at the client; x = audit / plain)",
        head,
    ]
    for lv in result["levels"]:
        for variant in VARIANTS:
            m = lv[variant]
            vs = lv["audit_vs_plain"] if variant == "audit" else {}
            ttfb_x = f"{vs['ttfb_p50']:.2f}" if vs.get("ttfb_p50") is not None else "-"
            p95_x = f"{vs['delay_p95']:.2f}" if vs.get("delay_p95") is not None else "-"
            lines.append(
                f"{lv['streams']:>7} {lv['offered_events_per_s']:>9,} {variant:<7} {m['ttfb_ms_p50']:8.2f}"
                f" {m['delay_ms_p95']:7.2f} {m['delay_ms_p99']:7.2f} {m['gap_ms_p95']:7.1f}"
                f" {m['written_events_per_s']:9,.0f} {m['delivered_events_per_s']:9,.0f} {ttfb_x:>6} {p95_x:>6}"
                f" {m['failed']:>4}"
            )
    s = result["summary"]
    lines.append(f"({result['definition']})")
    for variant in VARIANTS:
        lines.append(f"  {variant:<6} delays grow: {describe_knee(s, variant)}; top: {describe_top(s, variant)}")
    if s["generator_limited_from_streams"] is not None:
        lines.append(
            f"  the load generator itself is the limit from {s['generator_limited_from_streams']} streams (direct)"
        )
    return lines
