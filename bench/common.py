"""Settings, statistics and small helpers shared by every section."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Sizes:
    """How big each section's workload is: the full run, or the smoke run CI keeps working."""

    runs: int  # repetitions of each timed measurement (medians are reported)
    parse_events: int  # events per parsing workload
    huge_event_bytes: int  # text bytes of each of the few huge events
    huge_events: int
    proxy_runs: int  # repetitions of each proxy load (each proxy variant in turn, every run)
    concurrency: tuple[int, ...]  # concurrent streams through the proxy
    paced_events: int  # events per paced stream
    paced_delay: float  # seconds between a paced stream's events
    bulk_bytes: int  # bytes per concurrency level in the unpaced (bulk) phase
    bulk_event_bytes: int  # text bytes per event in the bulk phase
    writer_exchanges: int  # exchanges written into SQLite
    writer_exchanges_pg: int  # exchanges written into PostgreSQL
    spool_records: int  # records replayed from the spool
    durable_seconds: float  # how long the submit-to-durable latency load runs
    idle_streams: int  # idle open streams for the memory section
    big_stream_bytes: int  # the one big stream of the memory section
    query_rows: int  # exchanges in the database the query section reads
    bomb_mib: tuple[int, ...]  # decoded sizes of the limits section's compression bombs
    long_stream_bytes: int  # the limits section's very long stream
    sweep_streams: tuple[int, ...]  # the knee section's levels of concurrent paced streams (lowest = baseline)
    sweep_events: int  # events per stream in the knee section (20 a second)
    sweep_open_rate: float  # streams opened per second in the knee section
    ttft_chars: int  # characters of prose per stream in the TTFT section (250 a second)
    ttft_rounds: int  # rounds of the TTFT section (every variant in turn, each round)
    ttft_streams: int  # concurrent streams per variant and round
    against_runs: int  # rounds of --against (every variant in turn, each round)


FULL = Sizes(
    runs=7,
    parse_events=20_000,
    huge_event_bytes=2 * 1024 * 1024,
    huge_events=4,
    proxy_runs=3,
    concurrency=(1, 50, 200),
    paced_events=150,
    paced_delay=0.05,
    bulk_bytes=16 * 1024 * 1024,
    bulk_event_bytes=1024,
    writer_exchanges=50_000,
    writer_exchanges_pg=20_000,
    spool_records=100_000,
    durable_seconds=30.0,
    idle_streams=1000,
    big_stream_bytes=200 * 1024 * 1024,
    query_rows=1_000_000,
    bomb_mib=(256, 1024),
    long_stream_bytes=300 * 1024 * 1024,
    sweep_streams=(5, 25, 50, 75, 100, 150, 200, 300, 400),
    sweep_events=100,
    sweep_open_rate=150.0,
    ttft_chars=1500,
    ttft_rounds=5,
    ttft_streams=3,
    against_runs=9,
)

SMOKE = Sizes(
    runs=1,
    parse_events=300,
    huge_event_bytes=64 * 1024,
    huge_events=2,
    proxy_runs=1,
    concurrency=(1, 4),
    paced_events=4,
    paced_delay=0.01,
    bulk_bytes=256 * 1024,
    bulk_event_bytes=1024,
    writer_exchanges=300,
    writer_exchanges_pg=100,
    spool_records=500,
    durable_seconds=2.0,
    idle_streams=20,
    big_stream_bytes=2 * 1024 * 1024,
    query_rows=2_000,
    bomb_mib=(32,),
    long_stream_bytes=4 * 1024 * 1024,
    sweep_streams=(2, 6),
    sweep_events=12,
    sweep_open_rate=100.0,
    ttft_chars=200,
    ttft_rounds=1,
    ttft_streams=2,
    against_runs=1,
)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0..100), nearest rank: what p% of the values do not exceed."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(p / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def timed_medians(fns: dict[str, Callable[[], Any]], runs: int) -> dict[str, tuple[float, Any]]:
    """Median wall time of each function over ``runs`` rounds, and its last result.

    The functions take turns within each round (after one warm-up round), so that a
    machine that gets busier or quieter during the measurement affects them alike: on a
    shared machine, ratios measured this way are what can be trusted. Each call is
    timed with the garbage collector off, after a collection, as ``timeit`` does: else
    a full collection of every decoder's kept results lands on whichever call crosses
    the threshold (in one run the same compiled parser measured 3x slower on one body
    than on the next).
    """
    results = {name: fn() for name, fn in fns.items()}
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            results[name] = None  # (the last result of this function is not kept alive during its run)
            gc.collect()
            gc.disable()  # as timeit does: a collection of the others' results would land on whoever runs then
            try:
                start = time.perf_counter()
                results[name] = fn()
                times[name].append(time.perf_counter() - start)
            finally:
                gc.enable()
    return {name: (median(times[name]), results[name]) for name in fns}


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b``, or None when either is missing or ``b`` is zero."""
    if a is None or b is None or b == 0:
        return None
    return a / b


def skipped(reason: str) -> dict[str, Any]:
    """The result of a section (or row) that could not run here, and why."""
    return {"skipped": reason}
