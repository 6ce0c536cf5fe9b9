"""Section 7: limits per exchange. Compression bombs must not starve other flows, and a
very long stream must not grow the proxy.

One audit proxy (pinned to its core, the mock on the other) is measured:

* ``bombs``: a gzip, br and zstd bomb (256 MiB and 1 GiB of spaces in one SSE comment,
  a few KB on the wire; ``mockllm``'s ``bomb`` scenario) streams through the proxy while a
  probe sends small 3-event streams through the same proxy one after another; each
  probe's time from request to the end of its body is its wait. Reported: the probes'
  max and p99 against their median on an idle proxy, the bomb's own time, and the
  proxy's peak RSS (sampled every 20 ms);
* ``long``: one uncompressed stream of about 300 MB of answer text (64 KiB deltas,
  ``repeat``), with the default record cap: the proxy's peak RSS.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from bench.client import Target, build_request, stream
from bench.common import Sizes, median, percentile
from bench.memory import Sampler
from bench.processes import Mock, Proxy, split_cores, start_mock, start_proxy
from bench.workloads import APIS, request_bytes

API = APIS["openai-chat"]
CODINGS = ("gzip", "br", "zstd")
LONG_DELTA = 64 * 1024
MIB = 1024 * 1024
TARGET_WAIT_MS = 100
TARGET_RSS_MIB = 300


def _request(target: Target, scenario: str, json: bool = False) -> bytes:
    body = orjson.dumps(API.body | {"stream": False}) if json else request_bytes(API)
    return build_request(target, API.target, API.headers | {"x-mock": scenario}, body)


async def _probe_until(target: Target, done: Callable[[], bool]) -> list[float]:
    """Probe streams one after another until ``done()``; their times in seconds."""
    request = _request(target, "events=3")
    waits: list[float] = []
    while not done() or not waits:
        started = time.perf_counter()
        result = await stream(target, request, timeout=120)
        if result.error is None:
            waits.append(time.perf_counter() - started)
        await asyncio.sleep(0.005)
    return waits


async def _under_load(target: Target, scenario: str, json: bool) -> tuple[float, int, list[float]]:
    """One request of ``scenario`` with probes running beside it."""
    done = asyncio.Event()
    probes = asyncio.create_task(_probe_until(target, done.is_set))
    await asyncio.sleep(0.2)  # the probe is running before the load starts
    started = time.perf_counter()
    result = await stream(target, _request(target, scenario, json), timeout=1800)
    seconds = time.perf_counter() - started
    await asyncio.sleep(0.5)  # the audit's slices after the body ended
    done.set()
    return seconds, result.body_bytes, await probes


def _bomb(target: Target, proxy: Proxy, coding: str, mib: int, json: bool) -> dict[str, Any]:
    with Sampler(proxy) as sampler:
        seconds, body, waits = asyncio.run(_under_load(target, f"encoding={coding}&bomb={mib}", json))
    return {
        "coding": coding,
        "mib": mib,
        "body": "json" if json else "sse",
        "seconds": seconds,
        "wire_bytes": body,
        "probes": len(waits),
        "probe_max_ms": max(waits) * 1000,
        "probe_p99_ms": percentile(waits, 99) * 1000,
        "rss_peak": sampler.peak,
    }


def _long(target: Target, proxy: Proxy, nbytes: int) -> dict[str, Any]:
    repeat = max(1, nbytes // LONG_DELTA)
    before = proxy.rss()
    with Sampler(proxy) as sampler:
        started = time.perf_counter()
        result = asyncio.run(
            stream(target, _request(target, f"events=2&size={LONG_DELTA}&repeat={repeat}"), timeout=1800)
        )
        seconds = time.perf_counter() - started
        time.sleep(1.0)
    return {
        "text_bytes": (repeat + 2) * LONG_DELTA,
        "body_bytes": result.body_bytes,
        "seconds": seconds,
        "complete": result.complete,
        "rss_before": before,
        "rss_peak": sampler.peak,
    }


def measure(sizes: Sizes, tmp: Path) -> dict[str, Any]:
    proxy_cpus, other_cpus = split_cores()
    mock = start_mock(tmp, other_cpus)
    try:
        proxy = start_proxy(tmp, "audit", cpus=proxy_cpus)
        try:
            return _measure(sizes, mock, proxy)
        finally:
            proxy.stop()
    finally:
        mock.stop()


def _measure(sizes: Sizes, mock: Mock, proxy: Proxy) -> dict[str, Any]:
    target = Target("127.0.0.1", proxy.port, mock.origin, via_proxy=True)
    loads = [(coding, mib, False) for mib in sizes.bomb_mib for coding in CODINGS] + [
        ("gzip", max(sizes.bomb_mib), True)
    ]
    direct = Target("127.0.0.1", mock.port, mock.origin, via_proxy=False)
    for coding, mib, json in loads:  # the mock makes each bomb once: not while it is measured
        asyncio.run(stream(direct, _request(direct, f"encoding={coding}&bomb={mib}", json), timeout=600))
    idle = []
    for _ in range(2):  # the first second warms the proxy up
        deadline = time.perf_counter() + 1.0
        idle = asyncio.run(_probe_until(target, functools.partial(_past, deadline)))
    bombs = [_bomb(target, proxy, coding, mib, json) for coding, mib, json in loads]
    return {
        "idle_probe_ms": median(idle) * 1000,
        "bombs": bombs,
        "long": _long(target, proxy, sizes.long_stream_bytes),
        "summary": {
            "probe_max_ms": max(b["probe_max_ms"] for b in bombs),
            "bomb_rss_peak": max(b["rss_peak"] for b in bombs),
        },
    }


def _past(deadline: float) -> bool:
    return time.perf_counter() >= deadline


def table(result: dict[str, Any]) -> list[str]:
    lines = [
        "7. Limits per exchange (one audit proxy; a probe of 3-event streams beside each load)",
        f"  probe on an idle proxy: median {result['idle_probe_ms']:.1f} ms",
        "  load              wire KB  load s  probes  probe max ms  p99 ms  target  proxy RSS peak MiB  target",
    ]
    for b in result["bombs"]:
        name = f"{b['coding']} {b['mib']} MiB {b['body']}"
        lines.append(
            f"  {name:<17} {b['wire_bytes'] / 1024:>7.1f} {b['seconds']:>7.2f} {b['probes']:>7} "
            f"{b['probe_max_ms']:>13.1f} {b['probe_p99_ms']:>7.1f}  <= {TARGET_WAIT_MS:<4} "
            f"{b['rss_peak'] / MIB:>18.0f}  < {TARGET_RSS_MIB}"
        )
    long = result["long"]
    lines.append(
        f"  one {long['text_bytes'] / MIB:.0f} MiB stream (default cap): {long['seconds']:.1f} s, proxy RSS "
        f"{long['rss_before'] / MIB:.0f} -> peak {long['rss_peak'] / MIB:.0f} MiB (target < {TARGET_RSS_MIB})"
    )
    return lines
