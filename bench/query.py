"""Section 6: ``llm-audit list`` with indexed filters and ``stats --by day`` on a big database.

The database comes from ``scripts/synth-db`` (synthetic exchanges, one million in the
full run); each command is run as a user runs it, ``.venv/bin/llm-audit --db URL ...``,
and timed whole (median of runs), next to ``llm-audit --help`` as the floor that
Python's start-up sets. The filters used are those ``llm-audit list --help`` offers
among the indexed columns (time range, user, model, status).

Until ``scripts/synth-db`` and the ``list`` / ``stats`` commands exist this section is
skipped with the reason.
"""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from bench.common import ROOT, Sizes, median, skipped

SYNTH = ROOT / "scripts" / "synth-db"
CLI = Path(sys.executable).parent / "llm-audit"


def _run(args: list[str], timeout: float = 3600) -> subprocess.CompletedProcess:
    return subprocess.run(
        args, check=False, cwd=ROOT, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def _help(args: list[str]) -> str:
    try:
        done = _run([*args, "--help"], timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout + done.stderr


def missing() -> str | None:
    """Why the section cannot run here, or None."""
    if not SYNTH.exists():
        return "scripts/synth-db does not exist yet"
    top = _help([str(CLI)])
    absent = [c for c in ("list", "stats") if not re.search(rf"^\s+{c}\b", top, re.MULTILINE)]
    if absent:
        return f"llm-audit has no {' / '.join(absent)} command yet"
    return None


def _option(help_text: str, *names: str) -> str | None:
    """The first of ``names`` that a --help text offers."""
    return next((n for n in names if re.search(rf"(?<![\w-]){re.escape(n)}\b", help_text)), None)


def generate(url: str, rows: int) -> tuple[float, str | None]:
    """Run scripts/synth-db for ``rows`` exchanges into ``url``; (seconds, problem)."""
    text = _help([str(SYNTH)])
    count = _option(text, "--rows", "--count", "--exchanges", "-n")
    db = _option(text, "--db", "--url")
    if count is None or db is None:
        return 0.0, f"cannot tell how to call scripts/synth-db from its --help:\n{text[:500]}"
    started = time.perf_counter()
    done = _run([str(SYNTH), db, url, count, str(rows)])
    if done.returncode != 0:
        return 0.0, f"scripts/synth-db failed ({done.returncode}): {(done.stderr or done.stdout)[-500:]}"
    return time.perf_counter() - started, None


def _sample_values(path: Path) -> dict[str, str]:
    """A user, a model and a week of the generated data, to filter on."""
    with sqlite3.connect(path) as con:
        user = con.execute("SELECT user_id FROM exchanges WHERE user_id IS NOT NULL LIMIT 1").fetchone()
        model = con.execute("SELECT request_model FROM exchanges WHERE request_model IS NOT NULL LIMIT 1").fetchone()
        newest = con.execute("SELECT max(started_at) FROM exchanges").fetchone()[0]
    end = datetime.fromisoformat(str(newest)[:19]) if newest else datetime.now()
    return {
        "user": user[0] if user else "",
        "model": model[0] if model else "",
        "since": (end - timedelta(days=7)).date().isoformat(),
        "until": end.date().isoformat(),
    }


def commands(values: dict[str, str]) -> dict[str, list[str]]:
    """The timed commands, built from the options ``list --help`` offers."""
    text = _help([str(CLI), "list"])
    opts = {
        key: _option(text, *names)
        for key, names in {
            "user": ("--user",),
            "model": ("--model",),
            "status": ("--status",),
            "since": ("--since",),
            "until": ("--until",),
            "limit": ("--limit", "-n"),
        }.items()
    }
    limit = [opts["limit"], "50"] if opts["limit"] else []
    out = {"list (newest)": ["list", *limit]}
    if opts["user"] and opts["since"]:
        out["list --user --since"] = ["list", opts["user"], values["user"], opts["since"], values["since"], *limit]
    if opts["model"] and opts["status"]:
        out["list --model --status"] = ["list", opts["model"], values["model"], opts["status"], "completed", *limit]
    if opts["since"] and opts["until"]:
        out["list --since --until"] = ["list", opts["since"], values["since"], opts["until"], values["until"], *limit]
    out["stats --by day"] = ["stats", "--by", "day"]
    return out


def measure(sizes: Sizes, tmp: Path) -> dict[str, Any]:
    problem = missing()
    if problem:
        return skipped(problem)
    path = tmp / "query.db"
    url = f"sqlite:///{path}"
    seconds, problem = generate(url, sizes.query_rows)
    if problem:
        return skipped(problem)
    floor = _timed([str(CLI), "--help"], sizes.runs)
    results: dict[str, Any] = {}
    for name, args in commands(_sample_values(path)).items():
        results[name] = _timed([str(CLI), "--db", url, *args], sizes.runs)
    return {"rows": sizes.query_rows, "generate_s": seconds, "startup_floor": floor, "commands": results}


def _timed(args: list[str], runs: int) -> dict[str, Any]:
    times, done = [], None
    for _ in range(max(runs, 1)):
        started = time.perf_counter()
        done = _run(args, timeout=600)
        times.append(time.perf_counter() - started)
    assert done is not None
    return {
        "args": args[1:],
        "seconds": median(times),
        "exit": done.returncode,
        "output_lines": len(done.stdout.splitlines()),
        "error": done.stderr.strip()[-300:] if done.returncode else None,
    }


def table(result: dict[str, Any]) -> list[str]:
    lines = ["6. Query (llm-audit on a synthetic database; median wall time per command)"]
    if "skipped" in result:
        return [*lines, f"  skipped: {result['skipped']}"]
    lines.append(
        f"  {result['rows']} exchanges generated in {result['generate_s']:.1f} s; "
        f"'llm-audit --help' alone takes {result['startup_floor']['seconds'] * 1000:.0f} ms"
    )
    for name, r in result["commands"].items():
        status = "" if r["exit"] == 0 else f"  (exit {r['exit']}: {r['error']})"
        lines.append(f"  {name:<24} {r['seconds'] * 1000:8.0f} ms  {r['output_lines']} lines{status}")
    return lines
