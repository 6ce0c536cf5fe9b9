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

from bench import knee as knee_section
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
        "nproc": len(cores()),  # what `nproc` prints: the cores this process may run on
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


def _row(row: str, name: str, target: str, measured: str | None, met: bool | None, **values: Any) -> dict[str, Any]:
    return {"row": row, "name": name, "target": target, "measured": measured, "met": met, "values": values}


def _levels(proxy: dict[str, Any], pair: str, load: str, key: str) -> dict[int, float]:
    return {lv["concurrency"]: lv["vs_plain"][pair][load][key] for lv in proxy.get("levels", [])}


def _has(proxy: dict[str, Any], pair: str) -> bool:
    return all(pair in lv["vs_plain"] for lv in proxy.get("levels", []))


def _ratios(values: dict[int, float]) -> str | None:
    """``2.42x / 2.02x / 1.70x at 1 / 50 / 200 streams``."""
    if not values:
        return None
    return " / ".join(f"{v:.2f}x" for v in values.values()) + f" at {' / '.join(map(str, values))} streams"


def issue20(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each row of issue 20's table beside what this run measured; ``met`` None: not measured here."""
    out: list[dict[str, Any]] = []
    proxy = results.get("proxy", {})
    ok = isinstance(proxy, dict) and "levels" in proxy
    for row, load, name, limit in (
        ("1", "bulk", "audit CPU vs plain mitmdump, flat out", 1.10),
        ("2", "paced", "audit CPU vs plain mitmdump, paced", 1.05),
    ):
        cpu = _levels(proxy, "audit/plain", load, "cpu_ratio") if ok else {}
        # The floor under the ratio: a stream callable that only returns each chunk (an
        # addon that reads the bytes cannot avoid mitmproxy's callable path). Absent
        # from runs before it was measured.
        floor = _levels(proxy, "callable/plain", load, "cpu_ratio") if ok and _has(proxy, "callable/plain") else {}
        measured = _ratios(cpu)
        if measured and floor:
            measured += f" (an identity stream callable alone: {_ratios(floor)})"
        out.append(
            _row(
                row,
                name,
                f"<= {limit:.2f}x at every level",
                measured,
                all(v <= limit for v in cpu.values()) if cpu else None,
                ratios=cpu,
                floor=floor,
            )
        )
    out += _knee_rows(results.get("knee", {}))
    p99 = _levels(proxy, "audit/plain", "paced", "delay_p99_added_ms") if ok else {}
    top = max(p99) if p99 else None
    out.append(
        _row(
            "4",
            "added p99 delay per event, paced",
            "<= 0.5 ms at 200 streams",
            f"{p99[top]:+.2f} ms at {top} streams" if top is not None else None,
            p99[top] <= 0.5 if top is not None else None,
            streams=top,
            added_ms=p99.get(top) if top is not None else None,
        )
    )
    out.append(_parser_row(results.get("parsing", {})))
    memory = results.get("memory", {})
    summary = memory.get("summary", {}) if isinstance(memory, dict) else {}
    per_byte = summary.get("big_added_per_text_byte")
    by_text = summary.get("big_added_per_text_byte_by_text", {})
    text = memory.get("audit", {}).get("big", {}).get("text_bytes") if isinstance(memory, dict) else None
    shown = None
    if per_byte is not None and text:
        texts = (("non_ascii", "non-ASCII"), ("ascii", "ASCII"))
        cases = [*texts, *((f"{key}_postgresql", f"{label} on PostgreSQL") for key, label in texts)]
        kinds = ", ".join(f"{label} {by_text[key]:.2f}x" for key, label in cases if key in by_text)
        shown = f"{per_byte:.2f}x its text ({text / 2**20:.0f} MiB{': ' + kinds if kinds else ''})"
    out.append(
        _row(
            "6",
            "peak memory, one big stream (the heaviest: non-ASCII or ASCII text, SQLite or PostgreSQL)",
            "<= 2x its text (200 MiB)",
            shown,
            per_byte <= 2 if per_byte is not None else None,
            per_text_byte=per_byte,
            per_text_byte_by_text=by_text or None,
            text_bytes=text,
        )
    )
    for row, load, limit in (("7a", "paced", 1.3), ("7b", "bulk", 3.0)):
        cpu = _levels(proxy, "filters/plain", load, "cpu_ratio") if ok else {}
        out.append(
            _row(
                row,
                f"100 filter rules vs plain mitmdump, {'paced' if load == 'paced' else 'flat out'}",
                f"<= {limit:g}x at every level",
                _ratios(cpu),
                all(v <= limit for v in cpu.values()) if cpu else None,
                ratios=cpu,
            )
        )
    out += _ttft_rows(results.get("ttft", {}))
    return out


def _knee_rows(knee: dict[str, Any]) -> list[dict[str, Any]]:
    s = knee.get("summary") if isinstance(knee, dict) else None
    where, top = "where delays grow, 20 events/s a stream", "top sustained events/s vs plain"
    same, share = "the same level as plain mitmdump", ">= 95% of plain's top rate"
    if not s:
        return [_row("3a", where, same, None, None), _row("3b", top, share, None, None)]
    limited = s["generator_limited_from_streams"]
    note = f"; the load generator is the limit from {limited} streams" if limited is not None else ""
    return [
        _row(
            "3a",
            where,
            same,
            f"audit: {knee_section.describe_knee(s, 'audit')}; plain: {knee_section.describe_knee(s, 'plain')}{note}",
            s["knee_same_as_plain"],
            audit=s["audit"]["knee_streams"],
            plain=s["plain"]["knee_streams"],
            definition=knee["definition"],
        ),
        _row(
            "3b",
            top,
            share,
            f"{s['top_vs_plain']:.0%}; audit: {knee_section.describe_top(s, 'audit')}; "
            f"plain: {knee_section.describe_top(s, 'plain')}{note}",
            s["top_met"],
            ratio=s["top_vs_plain"],
            audit=s["audit"]["top_events_per_s"],
            plain=s["plain"]["top_events_per_s"],
        ),
    ]


def _parser_row(parsing: dict[str, Any]) -> dict[str, Any]:
    classes = parsing.get("summary", {}).get("classes") if isinstance(parsing, dict) else None
    mins = {k: c["min_vs_best_peer"] for k, c in (classes or {}).items() if c["min_vs_best_peer"] is not None}
    accelerated = parsing.get("accelerator", {}).get("in_use") if isinstance(parsing, dict) else None
    how = {True: "compiled accelerator in use", False: "pure Python", None: "accelerator unknown"}
    names = {"ascii": "ASCII", "non-ascii": "non-ASCII", "event": "one event per chunk"}
    summary = parsing.get("summary", {}) if isinstance(parsing, dict) else {}
    pure = summary.get("pure_min_vs_best_peer")
    fallback = (
        f"; pure-Python fallback min {pure:.2f}x, median {summary['pure_median_vs_best_peer']:.2f}x" if pure else ""
    )
    return _row(
        "5",
        "SSE parser vs the fastest peer",
        ">= 2x on ASCII, non-ASCII, 1 event/chunk",
        ", ".join(f"{names[k]} {v:.2f}x" for k, v in mins.items()) + f" ({how[accelerated]}{fallback})"
        if mins
        else None,
        all(v >= 2 for v in mins.values()) and len(mins) == 3 if mins else None,
        min_by_class=mins,
        accelerator=accelerated,
        pure_min_vs_best_peer=pure,
    )


def _ttft_rows(ttft: dict[str, Any]) -> list[dict[str, Any]]:
    added = ttft.get("added_ms", {}) if isinstance(ttft, dict) else {}
    out = []
    for row, key, name, limit in (
        ("8a", "keyword", "TTFT added: keyword rule, 250 chars/s", 10.0),
        ("8b", "secrets+pii", "TTFT added: secrets + PII, 250 chars/s", 100.0),
    ):
        value = added.get(key)
        out.append(
            _row(
                row,
                name,
                f"<= {limit:g} ms on ordinary text",
                f"{value:+.1f} ms (TTFT without rules {ttft['ttft_ms_p50']['no rules']:.1f} ms)"
                if value is not None
                else None,
                value <= limit if value is not None else None,
                added_ms=value,
            )
        )
    return out


def issue20_lines(items: list[dict[str, Any]], machine: dict[str, Any]) -> list[str]:
    """The final table: each target of issue 20, what this run measured, met or missed."""
    rows = [
        (t["row"], {True: "met", False: "MISSED", None: "not measured"}[t["met"]], t["name"], t["target"])
        for t in items
    ]
    widths = [max(len(r[i]) for r in [("#", "", "what", "target"), *rows]) for i in range(4)]
    lines = [
        "Issue 20 targets (ratios measured in this run; load average "
        f"{load_text(machine['load_average_at_start'])} at the start, {load_text(machine['load_average_at_end'])} "
        f"at the end; nproc {machine['nproc']})",
        "  " + "  ".join(h.ljust(w) for h, w in zip(("#", "", "what", "target"), widths)) + "  measured",
    ]
    for r, t in zip(rows, items):
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) + f"  {t['measured'] or '-'}")
    return lines


def load_text(values: Any) -> str:
    """A load average triple as ``1-min / 5-min / 15-min``."""
    return " / ".join(f"{v:.2f}" for v in values)
