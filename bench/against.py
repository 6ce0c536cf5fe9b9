"""``scripts/bench --against REV``: this checkout's audit beside the audit of another
revision, the same loads through both in one run.

Why a section of its own: the machine's speed drifts by more than most changes are
worth (plain mitmdump, one stream flat out, measured 19 to 36 CPU s/GB on one day), so
two separate runs of ``scripts/bench`` cannot tell a 10% gain from noise. Here the
variants take turns, load by load (the order rotating every round), and each variant's
run is compared with the other revision's run of the same round: the median of those
paired ratios is the figure.

Five mitmdump processes, pinned to the proxy's core: ``plain`` (as in section 2), the
``audit`` and ``filters`` variants of this checkout, and the same two of ``REV``
(``audit@REV``, ``filters@REV``). ``REV`` is exported with ``git archive`` into the
section's folder (nothing in the checkout changes) and run from there with
``PYTHONPATH`` pointing at it, its SSE parser compiled there when this checkout's is
(``setup.py build_ext --inplace``; the section says when that failed and the pure
parser ran). One stream, both loads of section 2: bulk (1 KiB deltas flat out) and
paced. The filters variants run the 100 rules of :mod:`bench.rules`, or the rules file
given with ``--rules`` (a change that matters to one kind of rule set, keyword lists
alone, say, is measured on that set).
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path
from typing import Any

from addon.filters.rules import RulesError, load_rules
from bench.common import ROOT, Sizes, median, ratio
from bench.overhead import _load, _recorded, warm_up
from bench.processes import BIN, Proxy, split_cores, start_mock, start_proxy, stop_all
from bench.rules import DESCRIPTION, write_rules

OURS = ("audit", "filters")


def measure(sizes: Sizes, tmp: Path, rev: str, commit: str, rules_file: Path | None = None) -> dict[str, Any]:
    """``rev`` as the user wrote it, ``commit`` what it names (:func:`commit_of`);
    ``rules_file``: the filters variants' rules (None: :mod:`bench.rules`)."""
    tree, compiled = _export(commit, tmp / "tree", build=_compiled_here())
    proxy_cpus, other_cpus = split_cores()
    rules = write_rules(tmp) if rules_file is None else rules_file.resolve()
    mock = start_mock(tmp, other_cpus)
    proxies: dict[str, Proxy] = {}
    try:
        proxies["plain"] = start_proxy(tmp, "plain", cpus=proxy_cpus)
        for variant in OURS:
            proxies[variant] = start_proxy(tmp, variant, rules=rules, cpus=proxy_cpus)
            proxies[f"{variant}@rev"] = start_proxy(tmp, variant, rules=rules, cpus=proxy_cpus, root=tree)
        warm_up(mock, proxies)
        loads = {
            "bulk": f"events={max(1, sizes.bulk_bytes // sizes.bulk_event_bytes)}&size={sizes.bulk_event_bytes}&stamp=1",
            "paced": f"events={sizes.paced_events}&delay={sizes.paced_delay}&stamp=1",
        }
        names = list(proxies)
        runs: dict[str, dict[str, list[float | None]]] = {v: {load: [] for load in loads} for v in names}
        failed = dict.fromkeys(names, 0)
        for run in range(sizes.against_runs):
            order = names[run % len(names) :] + names[: run % len(names)]
            for load, scenario in loads.items():
                for v in order:
                    result = _load(mock, proxies[v], 1, scenario, 0.0)
                    runs[v][load].append(result["cpu_s_per_GB"])
                    failed[v] += result["failed"]
        rev_code = {v: _runs_code_from(proxies[v].pid, tree) for v in names if v.endswith("@rev")}
    finally:
        stop_all([*proxies.values(), mock])
    recorded = {v: _recorded(p) for v, p in proxies.items() if p.db_url}
    _check_ran(recorded, rev_code)
    return {
        "rev": rev,
        "commit": commit,
        "rules": DESCRIPTION if rules_file is None else str(rules_file),
        "compiled_parser": {"here": _compiled_here(), "rev": compiled},
        "rev_code_loaded": rev_code,
        "recorded": recorded,
        "failed": failed,
        "runs": runs,
        "loads": {load: _compare(runs, load) for load in ("bulk", "paced")},
    }


def _runs_code_from(pid: int, tree: Path) -> bool | None:
    """Whether the process has the revision's compiled parser mapped (proof that it runs the
    exported tree, not this checkout); None when the tree has no compiled parser to tell by."""
    if not any((tree / "addon" / "framing").glob("sse_parser*.so")):
        return None
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return None
    return str(tree / "addon" / "framing") in maps


def _check_ran(recorded: dict[str, dict[str, int]], rev_code: dict[str, bool | None]) -> None:
    """Fail the section when a proxy of ours recorded nothing, or an unfinished stream, or
    a revision's proxy did not run the revision's code: its figures would compare nothing
    (an addon that fails to load leaves mitmdump running as a plain buffering proxy)."""
    for variant in (*OURS, *(f"{v}@rev" for v in OURS)):
        statuses = recorded.get(variant, {})
        if not statuses or set(statuses) != {"completed"}:
            raise RuntimeError(f"{variant} recorded {statuses or 'nothing'}: see its mitmdump.log")
    wrong = [v for v, loaded in rev_code.items() if loaded is False]
    if wrong:
        raise RuntimeError(f"{', '.join(wrong)} did not run the exported revision's code")


def _compare(runs: dict[str, dict[str, list[float | None]]], load: str) -> dict[str, Any]:
    """Per variant: median CPU s/GB and ratio to plain; per pair: the median paired ratio
    (a run that moved no bytes has no CPU per GB: it is left out)."""
    cpu = {v: median([x for x in r[load] if x is not None]) for v, r in runs.items()}
    plain = runs["plain"][load]
    out: dict[str, Any] = {
        "cpu_s_per_GB": cpu,
        "vs_plain": {v: median([x for a, b in zip(r[load], plain) if (x := ratio(a, b))]) for v, r in runs.items()},
    }
    rounds = {v: [x for a, b in zip(runs[v][load], runs[f"{v}@rev"][load]) if (x := ratio(a, b))] for v in OURS}
    out["here_vs_rev_rounds"] = rounds
    out["here_vs_rev"] = {v: median(r) for v, r in rounds.items()}
    return out


def rules_problem(path: Path) -> str | None:
    """Why ``path`` cannot be the filters variants' rules (one line naming the fix), or None.

    Checked before anything starts: a proxy refused by its rules would only say so in its log.
    """
    try:
        load_rules(path)  # (the proxy's own loader: unreadable, not UTF-8, not TOML, a bad rule)
    except RulesError as e:
        return f"--rules: {e}; give an llm_rules TOML file"
    return None


def commit_of(rev: str) -> str:
    """The commit ``rev`` names; ValueError (one line, naming the fix) when none."""
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError as e:
        raise ValueError(f"--against needs git to export {rev} ({e}); install git or leave --against out") from e
    if done.returncode != 0:
        raise ValueError(
            f"--against {rev}: not a commit of this repository; give a commit, branch or tag (git log --oneline)"
        )
    return done.stdout.strip()


def _export(commit: str, tree: Path, *, build: bool) -> tuple[Path, bool]:
    """The revision's files in ``tree`` (``git archive``), its parser compiled when ``build``."""
    exported = subprocess.run(["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=False)
    if exported.returncode != 0:
        raise RuntimeError(f"git archive {commit} failed: {exported.stderr.decode(errors='replace').strip()}")
    archive = exported.stdout
    tree.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tree, filter="data")
    if not build:
        return tree, False
    done = subprocess.run(
        [str(BIN / "python"), "setup.py", "-q", "build_ext", "--inplace"],
        cwd=tree,
        capture_output=True,
        text=True,
        check=False,
    )
    compiled = done.returncode == 0 and any((tree / "addon" / "framing").glob("sse_parser*.so"))
    if not compiled:
        print(f"--against: the revision's SSE parser was not compiled; its pure parser runs\n{done.stderr[-600:]}")
    return tree, compiled


def _compiled_here() -> bool:
    from addon.framing import sse

    return bool(sse.COMPILED)


def table(result: dict[str, Any]) -> list[str]:
    rev, rounds = result["rev"], len(result["runs"]["plain"]["bulk"])
    compiled = result["compiled_parser"]
    names = {v: v.replace("@rev", f"@{rev}") for v in result["runs"]}
    width = max(len("variant"), *map(len, names.values()))
    lines = [
        f"Against {rev} ({result['commit'][:9]}): one stream, every variant in turn, {rounds} round(s); "
        f"compiled parser here {compiled['here']}, at {rev} {compiled['rev']}",
        f"filters: {result.get('rules', DESCRIPTION)}",
        f"{'load':<6} {'variant':<{width}} {'CPU s/GB':>9} {'vs plain':>8} {'here/rev':>9}  per round",
    ]
    for load, cmp in result["loads"].items():
        for v, cpu in cmp["cpu_s_per_GB"].items():
            mine, each = cmp["here_vs_rev"].get(v), cmp.get("here_vs_rev_rounds", {}).get(v)
            spread = (
                f"  {min(each):.2f} to {max(each):.2f}, {sum(x < 1 for x in each)} of {len(each)} below 1"
                if each
                else ""
            )
            lines.append(
                f"{load:<6} {names[v]:<{width}} {cpu:9.1f} {cmp['vs_plain'][v]:7.2f}x"
                f" {f'{mine:.3f}x' if mine is not None else '':>9}{spread}"
            )
    return lines
