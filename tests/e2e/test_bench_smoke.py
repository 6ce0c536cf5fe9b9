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
SECTIONS = ("parsing", "proxy", "filters", "knee", "ttft", "writer", "memory", "query", "limits")
ISSUE20_ROWS = ["1", "2", "3a", "3b", "4", "5", "6", "7a", "7b", "8a", "8b"]


def bench(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``scripts/bench`` with ``args``, as a user runs it (its output captured)."""
    return subprocess.run(
        [sys.executable, "-m", "bench", *args],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_bench_smoke_writes_every_section(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    done = bench("--smoke", "--out", str(out), timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    document = orjson.loads(out.read_bytes())
    machine = document["machine"]
    assert document["smoke"] is True and machine["cores"] >= 1 and machine["nproc"] >= 1
    assert len(machine["load_average_at_start"]) == len(machine["load_average_at_end"]) == 3
    results = document["results"]
    for section in SECTIONS:
        assert section in results, section
        assert "error" not in results[section], (section, results[section])
    assert results["parsing"]["rows"] and results["proxy"]["levels"]
    for level in results["proxy"]["levels"]:
        for variant in level["variants"].values():
            assert variant["paced"]["failed"] == 0 and variant["bulk"]["failed"] == 0
    assert set(results["proxy"]["recorded"]["audit"]) == {"completed"}  # every stream recorded, complete
    assert results["proxy"]["unfinished"] == {}  # (what a failed load's rows said, when one fails)
    # the floor under rows 1 and 2: an identity stream callable, measured in the same runs
    assert all("callable/plain" in level["vs_plain"] for level in results["proxy"]["levels"])
    assert results["writer"]["sqlite"]["exchanges_per_s"] > 0
    assert results["memory"]["audit"]["idle"]["opened"] == results["memory"]["audit"]["idle"]["streams"]
    assert {t["name"] for t in document["targets"]} >= {"parser throughput", "proxy CPU", "writer"}
    assert "Targets" in done.stdout
    # every row of issue 20's table, measured in this run, beside its target
    issue20 = document["issue20_targets"]
    assert [t["row"] for t in issue20] == ISSUE20_ROWS
    for t in issue20:
        assert t["target"] and t["measured"] and t["met"] in (True, False), t
    assert all(t["values"]["floor"] and "stream callable alone" in t["measured"] for t in issue20[:2])
    assert set(results["knee"]["levels"][0]) >= {"plain", "audit", "direct"}
    assert all(lv[v]["failed"] == 0 for lv in results["knee"]["levels"] for v in ("plain", "audit", "direct"))
    assert "blocked" not in str(results["ttft"]["recorded"])  # the prose passes every rule
    assert set(results["parsing"]["summary"]["classes"]) == {"ascii", "non-ascii", "event"}
    assert "Issue 20 targets" in done.stdout.split("\nTargets\n")[-1]  # the last table


@pytest.mark.e2e
@pytest.mark.timeout(400)
def test_bench_against_runs_another_revision_beside_this_one(tmp_path: Path) -> None:
    """``--against REV`` exports REV, compiles its parser when this checkout's is compiled,
    and runs its audit beside this one's; alone it runs only that comparison. ``--rules``
    gives the filters variants a rules file of one's own (here a keyword list)."""
    out = tmp_path / "results.json"
    rules = tmp_path / "keywords.toml"
    rules.write_text('[[rule]]\nid = "names"\nkind = "keywords"\nkeywords = ["Nightjar"]\naction = "block"\n')
    done = bench("--smoke", "--against", "HEAD", "--rules", str(rules), "--out", str(out), timeout=380)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = orjson.loads(out.read_bytes())["results"]
    assert list(results) == ["against"]
    result = results["against"]
    assert result["rev"] == "HEAD" and len(result["commit"]) == 40
    assert result["compiled_parser"]["rev"] == result["compiled_parser"]["here"]
    # the revision's proxies ran the exported tree's code (its compiled parser is mapped),
    # not this checkout's, and every proxy recorded every stream, complete
    loaded = set(result["rev_code_loaded"].values())
    assert loaded == ({True} if result["compiled_parser"]["here"] else {None})
    assert set(result["failed"].values()) == {0}
    assert all(set(statuses) == {"completed"} for statuses in result["recorded"].values())
    assert set(result["recorded"]) == {"audit", "audit@rev", "filters", "filters@rev"}
    for load in ("bulk", "paced"):
        compared = result["loads"][load]
        assert set(compared["cpu_s_per_GB"]) == {"plain", "audit", "audit@rev", "filters", "filters@rev"}
        assert set(compared["here_vs_rev"]) == {"audit", "filters"}
        assert {v: len(r) for v, r in compared["here_vs_rev_rounds"].items()} == {"audit": 1, "filters": 1}
    assert "Against HEAD" in done.stdout and "of 1 below 1" in done.stdout
    assert result["rules"] == str(rules) and f"filters: {rules}" in done.stdout


@pytest.mark.e2e
def test_bench_against_refuses_what_is_not_a_commit() -> None:
    done = bench("--against", "no-such-revision-here", timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "scripts/bench: --against no-such-revision-here: not a commit of this repository; "
        "give a commit, branch or tag (git log --oneline)"
    ]


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--rules", "x.toml"], "scripts/bench: --rules goes with --against REV"),
        (
            ["--against", "HEAD", "--rules", "{bad}"],
            "scripts/bench: --rules: {bad}:1: TOML syntax error: Expected '=' after a key in a key/value pair"
            " (column 5); give an llm_rules TOML file",
        ),
        (
            ["--against", "HEAD", "--rules", "/no/such/rules.toml"],
            "scripts/bench: --rules: /no/such/rules.toml: cannot read the rules file: No such file or directory;"
            " give an llm_rules TOML file",
        ),
    ],
)
def test_bench_rules_names_the_fix_before_anything_starts(args: list[str], says: str, tmp_path: Path) -> None:
    bad = tmp_path / "rules.toml"
    bad.write_text("not toml\n")
    args, says = [a.replace("{bad}", str(bad)) for a in args], says.replace("{bad}", str(bad))
    done = bench(*args, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [says]
