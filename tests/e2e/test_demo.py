"""``scripts/demo``, the first five minutes: it runs from a fresh shell, shows every
request, the list with the blocked exchange, one exchange in full, and leaves nothing
behind (no process, no folder)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = pytest.mark.e2e


def processes_mentioning(text: str) -> list[str]:
    """Command lines of running processes that contain ``text``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            line = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in line:
            found.append(line)
    return found


def test_the_demo_shows_the_whole_thing_and_cleans_up(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLM_AUDIT_")} | {"TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [str(ROOT / "scripts" / "demo")], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    out = done.stdout
    assert done.returncode == 0, f"{out}\n{done.stderr}"

    for label in (
        "OpenAI Chat, streamed",
        "Anthropic Messages, streamed",
        "Gemini, streamed (SSE)",
        "OpenAI Responses, one JSON answer",
        "llm-stream",
    ):
        assert re.search(rf"^  {re.escape(label)}.* HTTP 200, \d+ bytes$", out, re.MULTILINE), label
    assert re.search(r"blocked by a rule +HTTP 400, \d+ bytes: Blocked by content filter rule 'code-names'", out)

    listing = out.split("== llm-audit list\n", 1)[1].split("\n== ", 1)[0]
    rows = listing.strip().splitlines()[1:]
    assert len(rows) == 6 and sum(" blocked " in row for row in rows) == 1
    assert sum(" completed " in row for row in rows) == 5

    shown = out.split("== llm-audit show ", 1)[1]
    assert "openai-chat · provider openai · streamed" in shown and "proxy       demo" in shown
    assert "tool calls\n  get_weather" in shown and '"city": "Vienna"' in shown
    assert "flag  personal-data" in shown

    work = re.search(r"database sqlite:///(\S+)/audit\.db", out).group(1)
    assert Path(work).parent == tmp_path and not Path(work).exists()
    assert processes_mentioning(work) == []
