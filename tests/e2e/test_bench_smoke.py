"""``scripts/bench --smoke``: every benchmark section runs, in miniature, and lands in the JSON.

Benchmarks are not tests: no figure is checked here, only that the script keeps working
(the proxies, the mock, the writer and the queries it drives all change under it).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("parsing", "proxy", "filters", "writer", "memory", "query", "limits")


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_bench_smoke_writes_every_section(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--out", str(out)],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    document = orjson.loads(out.read_bytes())
    assert document["smoke"] is True and document["machine"]["cores"] >= 1
    results = document["results"]
    for section in SECTIONS:
        assert section in results, section
        assert "error" not in results[section], (section, results[section])
    assert results["parsing"]["rows"] and results["proxy"]["levels"]
    for level in results["proxy"]["levels"]:
        for variant in level["variants"].values():
            assert variant["paced"]["failed"] == 0 and variant["bulk"]["failed"] == 0
    assert set(results["proxy"]["recorded"]["audit"]) == {"completed"}  # every stream recorded, complete
    assert results["writer"]["sqlite"]["exchanges_per_s"] > 0
    assert results["memory"]["audit"]["idle"]["opened"] == results["memory"]["audit"]["idle"]["streams"]
    assert {t["name"] for t in document["targets"]} >= {"parser throughput", "proxy CPU", "writer"}
    assert "Targets" in done.stdout
