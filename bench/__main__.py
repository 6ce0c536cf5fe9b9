"""``python -m bench`` (``scripts/bench``): run the sections, print the tables, write the JSON.

    scripts/bench                      # the full run (about 25 minutes on two cores)
    scripts/bench --smoke              # every section with tiny sizes (CI keeps it working)
    scripts/bench --only parsing,writer --out results.json
    scripts/bench --only parsing --profile prof/   # and where the time goes (bench/profile.py)
    scripts/bench --against main~3     # this checkout's audit beside another revision's (bench/against.py)
    scripts/bench --against main~3 --rules my-rules.toml   # the filters variants with other rules

A section that fails is reported in the JSON (``{"error": ...}``) and makes the exit
status 1; one that cannot run here (no PostgreSQL, no ``scripts/synth-db`` yet) is
``{"skipped": reason}`` and does not.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import against, knee, limits, memory, overhead, parsing, profile, query, report, rules, ttft, writes
from bench.common import FULL, ROOT, SMOKE, Sizes

SECTIONS: dict[str, tuple[Callable[[Sizes, Path], dict[str, Any]], Callable[[dict[str, Any]], list[str]]]] = {
    "parsing": (lambda sizes, tmp: parsing.measure(sizes), parsing.table),
    "proxy": (overhead.measure, overhead.table),
    "knee": (knee.measure, knee.table),
    "ttft": (ttft.measure, ttft.table),
    "writer": (writes.measure, writes.table),
    "memory": (memory.measure, memory.table),
    "query": (query.measure, query.table),
    "limits": (limits.measure, limits.table),
}


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks that every section works")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench-results" / "results.json", help="the JSON file of results"
    )
    parser.add_argument("--only", default="", help=f"comma-separated sections of {', '.join(SECTIONS)}")
    parser.add_argument(
        "--against",
        metavar="REV",
        help="also compare this checkout's audit with REV's, the same loads through both in one run "
        "(alone: only that comparison)",
    )
    parser.add_argument(
        "--rules",
        type=Path,
        metavar="FILE",
        help="with --against: the filters variants run these rules (an llm_rules TOML file) instead of "
        "the 100 rules of bench/rules.py",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="also profile the audit pipelines (pyinstrument) and the audit proxy (py-spy) into DIR",
    )
    return parser.parse_args(argv)


def filters_view(proxy: dict[str, Any]) -> dict[str, Any]:
    """Section 3 out of the proxy loads: the filters variant against plain mitmdump and the plain audit."""
    if "levels" not in proxy:
        return proxy
    return {
        "rules": rules.DESCRIPTION,
        "levels": [
            {
                "concurrency": lv["concurrency"],
                "filters_vs_plain": lv["vs_plain"]["filters/plain"],
                "filters_vs_audit": lv["vs_plain"]["filters/audit"],
                "filters": lv["variants"]["filters"],
                "audit": lv["variants"]["audit"],
            }
            for lv in proxy["levels"]
        ],
    }


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    sizes = SMOKE if args.smoke else FULL
    sections = dict(SECTIONS)
    if args.against:
        try:
            commit = against.commit_of(args.against)
        except ValueError as e:
            print(f"scripts/bench: {e}", file=sys.stderr)
            return 2
        rev, rules_file = args.against, args.rules
        sections["against"] = (
            lambda sizes, tmp: against.measure(sizes, tmp, rev, commit, rules_file),
            against.table,
        )
    if args.rules is not None:
        problem = against.rules_problem(args.rules) if args.against else "--rules goes with --against REV"
        if problem:
            print(f"scripts/bench: {problem}", file=sys.stderr)
            return 2
    wanted = [s for s in args.only.split(",") if s] or ([] if args.against else list(SECTIONS))
    if args.against and "against" not in wanted:
        wanted.append("against")
    unknown = [s for s in wanted if s not in sections]
    if "against" in unknown:
        print("scripts/bench: the against section needs a revision: scripts/bench --against REV", file=sys.stderr)
        return 2
    if unknown:
        print(f"scripts/bench: unknown section {', '.join(unknown)} (known: {', '.join(SECTIONS)})", file=sys.stderr)
        return 2
    command = "scripts/bench" + "".join(f" {shlex.quote(a)}" for a in (argv if argv is not None else sys.argv[1:]))
    document: dict[str, Any] = {
        "command": command,
        "date": report.now(),
        "smoke": args.smoke,
        "machine": report.machine(),
        "sizes": sizes.__dict__,
        "results": {},
    }
    m = document["machine"]
    header = (
        f"{command}  ({document['date']}, nproc {m['cores_usable']} of {m['cores']} cores: "
        f"{m['cpu'] or 'unknown CPU'}; load average {report.load_text(m['load_average_at_start'])} at the start)"
    )
    print(header, flush=True)
    failed = False
    with tempfile.TemporaryDirectory(prefix="llm-audit-bench-") as tmp:
        for name in wanted:
            run, table = sections[name]
            folder = Path(tmp) / name
            folder.mkdir()
            started = time.perf_counter()
            try:
                result = run(sizes, folder)
            except Exception as e:  # noqa: BLE001 - one broken section must not lose the others
                traceback.print_exc()
                result = {"error": f"{type(e).__name__}: {e}"}
                failed = True
            result["section_seconds"] = time.perf_counter() - started
            document["results"][name] = result
            if name == "proxy":
                document["results"]["filters"] = filters_view(result)
            lines = [f"{name}: error: {result['error']}"] if "error" in result else table(result)
            print("\n" + "\n".join(lines), flush=True)
        if args.profile:
            folder = Path(tmp) / "profile"
            folder.mkdir()
            try:
                document["profile"] = profile.run(sizes, args.profile, folder)
            except Exception as e:  # noqa: BLE001 - the measurements above still count
                traceback.print_exc()
                document["profile"] = {"error": f"{type(e).__name__}: {e}", "proxy": {}}
                failed = True
            proxy_profile = document["profile"]["proxy"]
            if "samples" in proxy_profile:
                print("\nProfile of the audit proxy (py-spy)\n" + "\n".join(profile.summary_lines(proxy_profile)[:14]))
            print(f"profiles: {args.profile}")
    document["targets"] = report.targets(document["results"])
    document["machine"]["load_average_at_end"] = os.getloadavg()
    document["issue20_targets"] = report.issue20(document["results"])
    print("\n" + "\n".join(report.target_lines(document["targets"])))
    print("\n" + "\n".join(report.issue20_lines(document["issue20_targets"], document["machine"])))
    report.write_json(args.out, document)
    print(f"\nresults: {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
