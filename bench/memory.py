"""Section 5: the proxy's memory (RSS) with many idle streams, and while one huge stream passes.

For each variant (plain mitmdump, the audit addon) a fresh proxy is started and warmed
up; then

* ``idle``: N streams are opened through it and held after their first event (the mock
  waits ten minutes before the next): RSS with them open, minus RSS before, per stream;
* ``big`` and ``big_ascii``: one stream of about 200 MB of answer text passes (the
  mock's ``tök0 tök1 …``, a two-byte ``ö`` in each word; then all ASCII, the heavier
  case: a Python string of ASCII text takes one byte a character, as its UTF-8 does, so
  every copy of it weighs its full size against the text); RSS is sampled every
  20 ms until its audit row is written (the idle streams' rows are written first, so it is
  the next row to complete), and once more :data:`AFTER_WAIT` seconds later ("after":
  what stays; half a second after the row, the proxy was still handing back a
  gigabyte it had freed). What the audit must keep is that text (it is the record), so
  the growth is compared with the text's size. The record keeps all of it (the record
  cap is raised above it); the row keeps its first 128 MiB, the writer's limit for one
  value (``storage.prepare.MAX_VALUE_BYTES``, a ``stored_reduced`` finding), so the
  peak covers both the cut and the write.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any, Self

from sqlalchemy import create_engine, text

from bench.client import Target, build_request, stream
from bench.common import Sizes
from bench.processes import Mock, Proxy, split_cores, start_mock, start_postgres, start_proxy
from bench.workloads import APIS, request_bytes

API = APIS["openai-chat"]
BIG_EVENT_TEXT = 16 * 1024  # text bytes per delta of the big stream
IDLE_WAIT = 600  # seconds the mock waits before an idle stream's next event
ON_POSTGRESQL = "audit_postgresql"  # the audit writing to PostgreSQL: the big streams only
AFTER_WAIT = 3.0  # seconds after the big row is written before "after": what stays, not what is being freed


class Sampler:
    """Samples a process's RSS in a thread; keeps the peak."""

    def __init__(self, proxy: Proxy, interval: float = 0.02) -> None:
        self.proxy, self.interval = proxy, interval
        self.peak = proxy.rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.peak = max(self.peak, self.proxy.rss())
            except (OSError, ValueError):
                return


def _target(mock: Mock, proxy: Proxy) -> Target:
    return Target("127.0.0.1", proxy.port, mock.origin, via_proxy=True)


async def _hold_idle(target: Target, count: int, proxy: Proxy) -> tuple[int, int]:
    """Open ``count`` streams, wait until each has its first event, read RSS, close them all."""
    request = build_request(
        target, API.target, API.headers | {"x-mock": f"events=2&delay={IDLE_WAIT}"}, request_bytes(API)
    )
    hold = asyncio.Event()
    arrived = [asyncio.Event() for _ in range(count)]

    async def one(i: int):
        await asyncio.sleep(2.0 * i / count)  # no connection storm
        return await stream(target, request, hold=hold, on_first_byte=arrived[i], timeout=IDLE_WAIT)

    tasks = [asyncio.create_task(one(i)) for i in range(count)]
    try:
        async with asyncio.timeout(120):
            await asyncio.gather(*(e.wait() for e in arrived))
        await asyncio.sleep(1.0)  # let the proxy settle with all of them open
        rss = proxy.rss()
    finally:
        hold.set()
        results = await asyncio.gather(*tasks)
    return rss, sum(1 for r in results if r.ttfc is not None)


def _count(proxy: Proxy, where: str) -> int:
    """Rows of the proxy's audit database matching ``where`` (0 without one)."""
    if not proxy.db_url:
        return 0
    engine = create_engine(proxy.db_url)
    try:
        with engine.connect() as conn:
            return conn.execute(text(f"SELECT count(*) FROM exchanges WHERE {where}")).scalar_one()
    finally:
        engine.dispose()


def _rows_completed(proxy: Proxy) -> int:
    return _count(proxy, "status != 'in_progress'")


def _settle(proxy: Proxy, timeout: float = 300) -> None:
    """Wait until the proxy has written every exchange's final row (the idle streams'
    too), so that the big stream's row is the next one to complete."""
    deadline = time.monotonic() + timeout
    while _count(proxy, "status = 'in_progress'") and time.monotonic() < deadline:
        time.sleep(0.1)


def _big(mock: Mock, proxy: Proxy, nbytes: int, ascii: bool) -> dict[str, Any]:
    events = max(1, nbytes // BIG_EVENT_TEXT)
    target = _target(mock, proxy)
    scenario = f"events={events}&size={BIG_EVENT_TEXT}" + ("&ascii=1" if ascii else "")
    request = build_request(target, API.target, API.headers | {"x-mock": scenario}, request_bytes(API))
    _settle(proxy)
    rows_before = _rows_completed(proxy)
    before = proxy.rss()
    with Sampler(proxy) as sampler:
        started = time.perf_counter()
        result = asyncio.run(stream(target, request, timeout=1800))
        seconds = time.perf_counter() - started
        deadline = time.monotonic() + 300
        while proxy.db_url and _rows_completed(proxy) <= rows_before and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
    time.sleep(AFTER_WAIT)  # the flow's end and the writer's hand-back of freed memory
    after = proxy.rss()
    text = events * BIG_EVENT_TEXT
    return {
        "text_bytes": text,
        "body_bytes": result.body_bytes,
        "seconds": seconds,
        "complete": result.complete,
        "rss_before": before,
        "rss_peak": sampler.peak,
        "rss_after": after,
        "peak_growth": sampler.peak - before,
        "peak_growth_per_text_byte": (sampler.peak - before) / text,
        "retained_after": after - before,
    }


async def _warm_up(target: Target, request: bytes) -> None:
    await asyncio.gather(*(stream(target, request, timeout=60) for _ in range(8)))


def _variant(
    sizes: Sizes, tmp: Path, mock: Mock, variant: str, cpus: set[int], db_url: str | None = None
) -> dict[str, Any]:
    # The audit keeps the whole big stream (its record cap raised above it), so the peak is
    # measured against text the audit really holds and writes, not the default 32 MiB cap.
    keep_all = ["--set", f"llm_audit_max_record_bytes={2 * sizes.big_stream_bytes}"] if variant == "audit" else []
    proxy = start_proxy(tmp, variant, cpus=cpus, extra=keep_all, db_url=db_url)
    try:
        if db_url is not None:  # the big streams only, into another database
            target = _target(mock, proxy)
            warm = build_request(target, API.target, API.headers | {"x-mock": "events=20"}, request_bytes(API))
            asyncio.run(_warm_up(target, warm))
            time.sleep(0.5)
            big = _big(mock, proxy, sizes.big_stream_bytes, ascii=False)
            return {"big": big, "big_ascii": _big(mock, proxy, sizes.big_stream_bytes, ascii=True)}
        target = _target(mock, proxy)
        warm = build_request(target, API.target, API.headers | {"x-mock": "events=20"}, request_bytes(API))
        asyncio.run(_warm_up(target, warm))
        time.sleep(0.5)
        before = proxy.rss()
        rss_open, opened = asyncio.run(_hold_idle(target, sizes.idle_streams, proxy))
        idle = {
            "streams": sizes.idle_streams,
            "opened": opened,
            "rss_before": before,
            "rss_open": rss_open,
            "per_stream": (rss_open - before) / sizes.idle_streams,
        }
        time.sleep(1.0)
        big = _big(mock, proxy, sizes.big_stream_bytes, ascii=False)
        return {"idle": idle, "big": big, "big_ascii": _big(mock, proxy, sizes.big_stream_bytes, ascii=True)}
    finally:
        proxy.stop()


def measure(sizes: Sizes, tmp: Path) -> dict[str, Any]:
    proxy_cpus, other_cpus = split_cores()
    mock = start_mock(tmp, other_cpus)
    try:
        out = {v: _variant(sizes, tmp, mock, v, proxy_cpus) for v in ("plain", "audit")}
        server, problem = start_postgres()
        if server is None:
            out[ON_POSTGRESQL] = {"skipped": problem}
        else:
            try:
                out[ON_POSTGRESQL] = _variant(sizes, tmp, mock, "audit", proxy_cpus, server.create_database())
            finally:
                server.destroy()
    finally:
        mock.stop()
    plain, audit = out["plain"], out["audit"]
    added: dict[str, float] = {}  # per text (and backend): peak RSS the audit adds, per byte of text
    for variant, _, suffix in _BACKENDS[1:]:
        for key, kind, _ in _TEXTS:
            if (big := out[variant].get(key)) is not None:
                added[kind + suffix] = (big["peak_growth"] - plain[key]["peak_growth"]) / big["text_bytes"]
    out["summary"] = {
        "idle_added_per_stream": audit["idle"]["per_stream"] - plain["idle"]["per_stream"],
        "big_added_per_text_byte": max(added.values()),  # the heaviest case's
        "big_added_per_text_byte_by_text": added,
    }
    return out


_TEXTS = (("big", "non_ascii", "non-ASCII"), ("big_ascii", "ascii", "ASCII"))  # result key, summary key, label
_BACKENDS = (("plain", "plain", ""), ("audit", "audit", ""), (ON_POSTGRESQL, "audit/pg", "_postgresql"))


def table(result: dict[str, Any]) -> list[str]:
    mb = 1024 * 1024
    lines = ["5. Memory (proxy RSS; audit/pg: the audit writing to PostgreSQL)"]
    for variant, name, _ in _BACKENDS:
        run = result.get(variant, {})
        if "skipped" in run:
            lines.append(f"  {name:<8} skipped: {run['skipped']}")
        if (i := run.get("idle")) is not None:
            lines.append(
                f"  {name:<8} {i['opened']}/{i['streams']} idle streams: {i['rss_before'] / mb:.0f} -> "
                f"{i['rss_open'] / mb:.0f} MiB ({i['per_stream'] / 1024:.1f} KiB/stream)"
            )
        for key, _, label in _TEXTS:
            if (b := run.get(key)) is None:
                continue  # a run recorded before this stream was measured
            lines.append(
                f"  {name:<8} one {b['text_bytes'] / mb:.0f} MiB stream of {label} text: peak "
                f"+{b['peak_growth'] / mb:.0f} MiB ({b['peak_growth_per_text_byte']:.2f} x text), "
                f"{b['retained_after'] / mb:+.0f} MiB after, {b['body_bytes'] / mb / b['seconds']:.1f} MiB/s"
            )
    s = result["summary"]
    by_text = s.get("big_added_per_text_byte_by_text", {"non_ascii": s["big_added_per_text_byte"]})
    at_peak = ", ".join(
        f"{by_text[k + suffix]:.2f} ({label}{', PostgreSQL' if suffix else ''})"
        for _, _, suffix in _BACKENDS[1:]
        for _, k, label in _TEXTS
        if k + suffix in by_text
    )
    lines.append(
        f"  audit adds {s['idle_added_per_stream'] / 1024:.1f} KiB per idle stream and "
        f"{at_peak} bytes per byte of streamed text at peak"
    )
    return lines
