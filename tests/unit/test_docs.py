"""The docs document what the code defines, and their links lead somewhere.

The reference tables (options, findings, tables and columns, ``llm-audit`` commands, the
modules that import mitmproxy) are generated from the code by ``docs/_generate.py``;
these tests fail when a page's tables are stale, when a code or column is missing from
its page, and when a relative link or anchor in README.md or docs/*.md leads nowhere.
"""

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from addon.findings import CODES
from docs import _generate
from storage.schema import exchange_view, metadata

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
LINK = re.compile(r"(?<!!)\[(?:[^\]\\]|\\.)*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def _prose(text: str) -> str:
    """The page without fenced code blocks (whose brackets are no links)."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for match in HEADING.finditer(_prose(page.read_text())):
        base = slug(match.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    found |= set(re.findall(r"<a (?:name|id)=\"([^\"]+)\"", page.read_text()))
    return found


def relative_links(page: Path) -> list[str]:
    prose = CODE_SPAN.sub("", _prose(page.read_text()))
    return [t for t in LINK.findall(prose) if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / unquote(path)).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT)}")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with the anchor #{anchor} in {dest.relative_to(ROOT)}")
    assert broken == [], f"broken links in {page.relative_to(ROOT)}"


def test_the_link_checker_knows_githubs_anchors():
    assert slug("The mock upstream (`scripts/mock-llm`)") == "the-mock-upstream-scriptsmock-llm"
    assert slug("PostgreSQL, schema migrations and retention") == "postgresql-schema-migrations-and-retention"
    assert slug("Inside mitmproxy's UIs") == "inside-mitmproxys-uis"
    assert slug("Gateway: reverse mode in front of one provider") == "gateway-reverse-mode-in-front-of-one-provider"


def test_the_generated_tables_are_up_to_date():
    stale = [p.relative_to(ROOT).as_posix() for p in _generate.stale_pages()]
    assert stale == [], f"the generated tables of {', '.join(stale)} are stale: run {_generate.COMMAND}"


def test_every_generated_block_has_a_generator():
    for page in PAGES:
        for match in _generate.MARKER.finditer(page.read_text()):
            _generate.generate(match.group("name"))  # raises KeyError for an unknown name


FINDINGS = (ROOT / "docs" / "findings.md").read_text()
DATABASE = (ROOT / "docs" / "database.md").read_text()
OPTIONS = (ROOT / "docs" / "options.md").read_text()


def test_every_finding_code_is_documented_in_the_findings_page():
    assert "<!-- generated: findings -->" in FINDINGS
    missing = [code for code in CODES if f"`{code}`" not in FINDINGS]
    assert missing == []


@pytest.mark.parametrize("table", [*metadata.sorted_tables, exchange_view], ids=lambda t: t.name)
def test_every_table_view_and_column_is_documented_in_the_database_page(table):
    kind = "view" if table is exchange_view else "table"
    assert f"<!-- generated: {kind}:{table.name} -->" in DATABASE
    missing = [c.name for c in table.columns if f"`{c.name}`" not in DATABASE]
    assert f"`{table.name}`" in DATABASE and missing == []


def test_every_option_is_documented_in_the_options_page():
    names = [o["name"] for o in _generate.options()]
    assert "llm_audit_db" in names  # the options were found at all
    assert [n for n in names if f"`{n}`" not in OPTIONS] == []


def test_the_cli_table_names_every_command():
    assert "<!-- generated: cli -->" in DATABASE
    commands = [label for label, _, _ in _generate._commands(_generate.cli_parser())]
    assert {"list (alias search)", "show", "stats", "export", "verify", "db upgrade"} <= set(commands)


def test_the_readme_is_an_entry_point_that_opens_with_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 300
    first_block = readme.split("```sh\n", 1)[1].split("```", 1)[0]
    assert first_block.splitlines() == [  # CI (.ci/run) runs the second; keep them as they are
        "scripts/proxy    # run mitmdump with the addon on 127.0.0.1:8080, recording to SQLite",
        "scripts/test     # run the whole test suite",
    ]
