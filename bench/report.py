"""The run's header, the verdict on each target, and the JSON file."""

from __future__ import annotations

import os
import platform
import sys
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import orjson

from bench.processes import cores


def machine() -> dict[str, Any]:
    """What the numbers depend on: cores, CPU, load, versions."""
    cpu = ""
    try:
        cpu = next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            "",
        )
    except OSError:
        pass
    return {
        "cores": os.cpu_count(),
        "cores_usable": len(cores()),
        "cpu": cpu,
        "load_average_at_start": os.getloadavg(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": {name: _version(name) for name in ("mitmproxy", "orjson", "SQLAlchemy", "httpx-sse", "openai")},
    }


def _version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of the issue, what was measured, and whether it is met (None: not measured)."""
    out: list[dict[str, Any]] = []

    def add(name: str, target: str, measured: str | None, met: bool | None) -> None:
        out.append({"name": name, "target": target, "measured": measured, "met": met})

    parsing = results.get("parsing", {})
    s = parsing.get("summary") if isinstance(parsing, dict) else None
    if s and s.get("min_vs_best_peer") is not None:
        add(
            "parser throughput",
            ">= 2x the fastest peer (httpx-sse, openai), every workload and chunking",
            f"median {s['median_vs_best_peer']:.2f}x, min {s['min_vs_best_peer']:.2f}x, "
            f"{s['rows_at_2x']}/{s['rows']} rows at >= 2x",
            s["min_vs_best_peer"] >= 2,
        )
        c = parsing["correctness"]
        if "vectors" in c:
            ours = c["llm-audit"]["passed"]
            add("parser correctness", "all WHATWG vectors", f"{ours}/{c['vectors']}", ours == c["vectors"])
    proxy = results.get("proxy", {})
    if isinstance(proxy, dict) and "summary" in proxy:
        cpu = proxy["summary"]["audit_cpu_added_max"]
        add("proxy CPU", "audit adds <= 10% CPU over plain mitmdump", f"+{cpu:.0%} (worst level and load)", cpu <= 0.10)
        delay = proxy["summary"]["audit_delay_p99_added_ms_max"]
        add("per-event delay", "audit adds <= 1 ms p99 (paced streams)", f"{delay:+.2f} ms (worst level)", delay <= 1.0)
    writer = results.get("writer", {})
    if isinstance(writer, dict) and "exchanges_per_s" in writer.get("sqlite", {}):
        rate = writer["sqlite"]["exchanges_per_s"]
        add("writer", ">= 5,000 exchanges/s into SQLite", f"{rate:,.0f}/s", rate >= 5000)
    for backend in ("sqlite", "postgresql"):
        r = writer.get(f"{backend}_durable", {}) if isinstance(writer, dict) else {}
        if "p99_ms" in r:
            add(
                f"crash window ({backend})",
                f"a final record durable within {r['target_ms']:.0f} ms at p99 ({r['streams']} streams)",
                f"p99 {r['p99_ms']:.1f} ms",
                r["p99_ms"] <= r["target_ms"],
            )
    memory = results.get("memory", {})
    if isinstance(memory, dict) and "summary" in memory:
        per_byte = memory["summary"]["big_added_per_text_byte"]
        add(
            "memory",
            "bounded by the text the audit keeps (<= 2 bytes of RSS per text byte at peak: "
            "the text, and once more while its row is written)",
            f"{per_byte:.2f} bytes per text byte",
            per_byte <= 2,
        )
    limits = results.get("limits", {})
    if isinstance(limits, dict) and "summary" in limits:
        wait = limits["summary"]["probe_max_ms"]
        add(
            "bombs: other flows",
            "no other flow waits more than 100 ms while gzip/br/zstd bombs pass",
            f"slowest probe {wait:.0f} ms",
            wait <= 100,
        )
        rss = limits["summary"]["bomb_rss_peak"] / (1024 * 1024)
        add("bombs: proxy memory", "proxy RSS under 300 MB while bombs pass", f"peak {rss:.0f} MiB", rss < 300)
        long_rss = limits["long"]["rss_peak"] / (1024 * 1024)
        add(
            "long stream: proxy memory",
            "proxy RSS under 300 MB during a 300 MB stream (default record cap)",
            f"peak {long_rss:.0f} MiB",
            long_rss < 300,
        )
    return out


def target_lines(items: list[dict[str, Any]]) -> list[str]:
    lines = ["Targets"]
    for t in items:
        verdict = {True: "met", False: "MISSED", None: "not measured"}[t["met"]]
        lines.append(f"  {verdict:<7} {t['name']}: {t['measured']} (target: {t['target']})")
    return lines


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
