"""Time to first token added by blocking filters, at a brisk model's pace (issue 20).

The mock streams ordinary English prose (nothing any rule matches) as OpenAI Chat
Completions deltas of 5 characters every 20 ms: 250 characters a second. The same
request goes through three audit proxies: without rules, with one blocking keyword rule,
and with the secrets and PII detectors (all types, blocking), in turn, rotating the
order every round, ``ttft_streams`` streams at once. A stream's time to first token is
from sending the request to the arrival of its first delta's text; the client closes it
then (what comes after does not matter here). What a rule set adds is the difference of
the medians of one round, paired with the no-rules proxy's, and then the median over
rounds. Holding back ``w`` characters costs ``w / 250`` seconds, so the figure says how
much text a rule set makes the proxy keep before the client sees any.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from bench.client import Target, build_request, stream
from bench.common import Sizes, median
from bench.processes import Proxy, split_cores, start_mock, start_proxies, stop_all
from bench.rules import TTFT_RULES, write_ttft_rules
from bench.workloads import APIS, PROSE, request_bytes, text_of

API = APIS["openai-chat"]
CHARS_PER_EVENT = 5
INTERVAL = 0.02  # seconds between deltas: 5 characters / 20 ms = 250 characters/s
VARIANTS = ("no rules", *TTFT_RULES)
TARGETS_MS = {"keyword": 10.0, "secrets+pii": 100.0}


def prose(chars: int) -> str:
    """``chars`` characters of plain English (a multiple of the delta size)."""
    return text_of(PROSE, chars - chars % CHARS_PER_EVENT)


def measure(sizes: Sizes, tmp: Path) -> dict[str, Any]:
    proxy_cpus, other_cpus = split_cores()
    rule_files = write_ttft_rules(tmp)
    mock = start_mock(tmp, other_cpus)
    text = prose(sizes.ttft_chars)
    scenario = urlencode({"text": text, "events": len(text) // CHARS_PER_EVENT, "delay": INTERVAL})
    mark = text[:CHARS_PER_EVENT].encode()
    proxies: dict[str, Proxy] = {}
    try:
        specs = {v: ("filters" if v in rule_files else "audit", rule_files.get(v)) for v in VARIANTS}
        proxies = start_proxies(tmp, specs, proxy_cpus)
        for proxy in proxies.values():  # warm-up: one stream through each
            _round(mock.origin, proxy, scenario, mark, 1)
        rounds: dict[str, list[list[float]]] = {v: [] for v in VARIANTS}
        first_bytes: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for i in range(sizes.ttft_rounds):
            for variant in VARIANTS[i % len(VARIANTS) :] + VARIANTS[: i % len(VARIANTS)]:
                ttft, first = _round(mock.origin, proxies[variant], scenario, mark, sizes.ttft_streams)
                rounds[variant].append(ttft)
                first_bytes[variant] += first
    finally:
        stop_all([*proxies.values(), mock])
    recorded = {v: _statuses(p) for v, p in proxies.items()}
    blocked = {v: r["blocked"] for v, r in recorded.items() if r.get("blocked")}
    if blocked:
        raise RuntimeError(f"the prose was blocked ({blocked}): a rule matches it, so the figures mean nothing")
    out: dict[str, Any] = {
        "pace": f"{CHARS_PER_EVENT} characters every {INTERVAL * 1000:.0f} ms ({CHARS_PER_EVENT / INTERVAL:.0f}/s)",
        "chars": len(text),
        "rules": TTFT_RULES,
        "recorded": recorded,
        "ttft_ms_p50": {v: median([t for r in rs for t in r]) for v, rs in rounds.items()},
        # the first body byte (the role chunk, before any text): what the rules add before the text
        "first_byte_ms_p50": {v: median(t) for v, t in first_bytes.items()},
        "rounds": rounds,
    }
    out["added_ms"] = {
        v: median([median(a) - median(b) for a, b in zip(rounds[v], rounds["no rules"])]) for v in TARGETS_MS
    }
    return out


def _round(origin: str, proxy: Proxy, scenario: str, mark: bytes, count: int) -> tuple[list[float], list[float]]:
    """TTFT and time to the first body byte, in ms, of ``count`` streams at once through ``proxy``."""
    target = Target("127.0.0.1", proxy.port, origin, via_proxy=True)
    request = build_request(target, API.target, API.headers | {"x-mock": scenario}, request_bytes(API))

    async def run() -> tuple[list[float], list[float]]:
        results = await asyncio.gather(*(stream(target, request, timeout=120, mark=mark) for _ in range(count)))
        missing = [r.error or f"status {r.status}" for r in results if r.mark_at is None]
        if missing:
            raise RuntimeError(f"no first token through the {proxy.variant} proxy: {missing[:3]}")
        ttft = [r.mark_at * 1000 for r in results if r.mark_at is not None]
        return ttft, [r.ttfc * 1000 for r in results if r.ttfc is not None]

    return asyncio.run(run())


def _statuses(proxy: Proxy) -> dict[str, int]:
    path = (proxy.db_url or "").removeprefix("sqlite:///")
    with sqlite3.connect(path) as con:
        return dict(con.execute("SELECT status, count(*) FROM exchanges GROUP BY status").fetchall())


def table(result: dict[str, Any]) -> list[str]:
    lines = [
        f"Time to first token through the audit proxy ({result['pace']}, prose nothing matches; median ms)",
        f"{'rules':<12} {'1st byte':>9} {'TTFT p50':>9} {'added':>8}",
    ]
    for variant, ttft in result["ttft_ms_p50"].items():
        added = result["added_ms"].get(variant)
        first = result["first_byte_ms_p50"][variant]
        lines.append(f"{variant:<12} {first:9.1f} {ttft:9.1f} {f'{added:+.1f}' if added is not None else '-':>8}")
    lines.append(f"rows recorded: {result['recorded']}")
    return lines
