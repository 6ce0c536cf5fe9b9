"""``scripts/bench --profile DIR``: where the time goes, for when a target is missed.

* The per-exchange audit pipeline (parser, normalizer, record) of each dialect, under
  pyinstrument, on the parsing section's small-delta streams (one event per chunk):
  ``DIR/pipeline-DIALECT.txt``.
* The audit proxy under the paced load with the most streams, sampled by py-spy from
  outside (``--nonblocking``: the proxy is never paused): the raw stacks in
  ``DIR/proxy-VARIANT.txt``, and a summary of the functions with the most samples, on
  their own (self) and with what they call (inclusive), plus the share of samples
  inside the addon's hooks.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from bench import overhead, parsing
from bench.common import Sizes
from bench.processes import split_cores, start_mock, start_proxy
from bench.rules import write_rules
from bench.workloads import APIS, chunked, stream_items

PY_SPY = Path(sys.executable).parent / "py-spy"
OURS = ("(addon/", "(storage/")  # frames of the project's own code, after _frame
# Where the addon's samples fall: a sample counts for a bucket when one of its frames
# contains the marker (the tap is the per-chunk inspection; early_end wraps mitmproxy's
# own streaming state, so its bucket includes mitmproxy's work below it).
BUCKETS = {
    "stream tap (parser, normalizer, record)": "make_tap.<locals>.tap",
    "hooks (request, responseheaders, response)": "ExchangeHooks.",
    "writer thread (storage/)": "(storage/",
    "content filters (addon/filters/)": "(addon/filters/",
    "early_end wrapper (includes mitmproxy's streaming below it)": "(addon/mitm/early_end.py)",
}


def pipelines(sizes: Sizes, folder: Path) -> dict[str, Any]:
    try:
        from pyinstrument import Profiler
    except ImportError:
        return {"skipped": "pyinstrument is not installed"}
    out = {}
    for name, api in APIS.items():
        chunks = chunked(stream_items(api, events=sizes.parse_events), "event")
        run = parsing.pipeline(name)
        profiler = Profiler(interval=0.0002)
        with profiler:
            for _ in range(max(sizes.runs, 3)):
                run(chunks)
        path = folder / f"pipeline-{name}.txt"
        path.write_text(profiler.output_text(unicode=False, color=False))
        out[name] = str(path)
    return out


def proxy(sizes: Sizes, folder: Path, tmp: Path, variant: str = "audit") -> dict[str, Any]:
    py_spy = shutil.which("py-spy") or (str(PY_SPY) if PY_SPY.exists() else None)
    if py_spy is None:
        return {"skipped": "py-spy is not installed"}
    proxy_cpus, other_cpus = split_cores()
    mock = start_mock(tmp, other_cpus)
    server = start_proxy(tmp, variant, rules=write_rules(tmp), cpus=proxy_cpus)
    raw = folder / f"proxy-{variant}.txt"
    try:
        overhead.warm_up(mock, {variant: server})
        count = max(sizes.concurrency)
        duration = int(sizes.paced_events * sizes.paced_delay + 3)
        spy = subprocess.Popen(
            [
                py_spy,
                "record",
                "--pid",
                str(server.pid),
                "--format",
                "raw",
                "--rate",
                "200",
                "--nonblocking",
                "--duration",
                str(duration),
                "--output",
                str(raw),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        paced = f"events={sizes.paced_events}&delay={sizes.paced_delay}&stamp=1"
        overhead._load(mock, server, count, paced, sizes.paced_delay)
        _, err = spy.communicate(timeout=duration + 60)
    finally:
        server.stop()
        mock.stop()
    if not raw.exists():
        return {"skipped": f"py-spy recorded nothing: {err.strip()[-300:]}"}
    summary = summarize(raw.read_text())
    (folder / f"proxy-{variant}-summary.txt").write_text("\n".join(summary_lines(summary)))
    return {"raw": str(raw), **summary}


def summarize(collapsed: str, top: int = 25) -> dict[str, Any]:
    """Functions by samples, self and inclusive, from py-spy's collapsed stacks."""
    self_count: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = ours = 0
    buckets: Counter[str] = Counter()
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_frame(f) for f in stack.split(";")]
        total += n
        self_count[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
        if any(mark in f for f in frames for mark in OURS):
            ours += n
        for bucket, marker in BUCKETS.items():
            if any(marker in f for f in frames):
                buckets[bucket] += n
    share = (lambda n: n / total) if total else (lambda n: 0.0)
    return {
        "samples": total,
        "addon_share": share(ours),
        "buckets": {b: share(buckets[b]) for b in BUCKETS},
        "self": [(f, share(n)) for f, n in self_count.most_common(top)],
        "inclusive": [(f, share(n)) for f, n in inclusive.most_common(top)],
    }


def _frame(frame: str) -> str:
    """``function (path:line)`` without the line and with the path from its package on."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    for anchor in ("/site-packages/", "/work/main/", "/lib/python3"):
        if anchor in path:
            path = path.split(anchor, 1)[1]
            break
    return f"{name} ({path})"


def summary_lines(summary: dict[str, Any]) -> list[str]:
    lines = [f"{summary['samples']} samples; {summary['addon_share']:.1%} of them inside the addon (addon/, storage/)"]
    lines += [f"  {share:6.1%}  {bucket}" for bucket, share in summary["buckets"].items()]
    lines += ["", "self:"]
    lines += [f"  {share:6.1%}  {frame}" for frame, share in summary["self"]]
    lines += ["", "inclusive:"]
    lines += [f"  {share:6.1%}  {frame}" for frame, share in summary["inclusive"]]
    return lines


def run(sizes: Sizes, folder: Path, tmp: Path) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    return {"pipelines": pipelines(sizes, folder), "proxy": proxy(sizes, folder, tmp)}
