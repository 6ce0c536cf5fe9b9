"""The reference tables of the docs, generated from the code.

Every table that restates the code (the addon's options, the finding codes, the tables,
columns and view of the database, the ``llm-audit`` commands, the modules that import
mitmproxy) sits in a Markdown page between marker comments::

    <!-- generated: findings -->
    ...
    <!-- end generated -->

Run from the checkout's root, with the project's Python::

    .venv/bin/python -m docs._generate           # rewrite the tables in README.md and docs/*.md
    .venv/bin/python -m docs._generate --check   # exit 1, naming the stale pages, if any is out of date

``tests/unit/test_docs.py`` runs the check. The text between the markers is replaced
whole; everything around it is written by hand.

Where each table comes from:

- ``options``: every ``add_option(...)`` call under ``addon/`` (read with ``ast``, so no
  addon is loaded; a default that is a name is looked up in its module);
- ``findings``: :data:`addon.findings.CODES`;
- ``table:NAME`` and ``view:exchange_view``: :mod:`storage.schema`, with each column's
  comment;
- ``cli``: the parser of the ``llm-audit`` console script, reached through its entry
  point (wherever the command's module lives) and read by argparse introspection;
- ``mitmproxy-imports``: the modules of the project's packages that import mitmproxy.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import re
import sys
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = ".venv/bin/python -m docs._generate"
PACKAGES = ("addon", "storage", "cli", "mockllm", "bench", "review")  # the project's own packages

MARKER = re.compile(r"(<!-- generated: (?P<name>[\w:.-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S)


def cell(text: str) -> str:
    """Text fit for one Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# -- options ------------------------------------------------------------------------------------


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _literal(node: ast.expr, module: str) -> Any:
    """A literal's value; a name (``DEFAULT_MAX_EVENT_BYTES``) is read from its module."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        pass
    if isinstance(node, ast.Name | ast.Attribute):
        value: Any = importlib.import_module(module)
        for part in ast.unparse(node).split("."):
            value = getattr(value, part)
        return value
    return ast.unparse(node)


def options() -> list[dict[str, Any]]:
    """Every mitmproxy option the addon adds, in the order of the source."""
    found = []
    for path in sorted((ROOT / "addon").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_option"
            ):
                continue
            module = _module_name(path)
            args = list(node.args)
            keywords = {k.arg: k.value for k in node.keywords}
            missing = ast.Constant(None)
            name, typespec, default, help_ = (
                args[i] if i < len(args) else keywords.get(key, missing)
                for i, key in enumerate(("name", "typespec", "default", "help"))
            )
            choices = keywords.get("choices")
            found.append(
                {
                    "name": _literal(name, module),
                    "type": ast.unparse(typespec),
                    "default": _literal(default, module),
                    "help": _literal(help_, module),
                    "choices": _literal(choices, module) if choices is not None else None,
                    "where": path.relative_to(ROOT).as_posix(),
                    "line": node.lineno,
                }
            )
    found.sort(key=lambda o: (o["where"], o["line"]))
    return found


def _size(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f" ({n // size} {unit})"
    return ""


def _default(value: Any) -> str:
    if value == "":
        return "empty"
    if value == []:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int):
        return f"`{value}`{_size(value)}"
    return f"`{value}`"


def options_table() -> str:
    rows = []
    for o in options():
        type_ = o["type"].replace("Sequence[str]", "list of str")
        if o["choices"]:
            type_ += ": " + " or ".join(f"`{c}`" for c in o["choices"])
        rows.append([f"`{o['name']}`", type_, _default(o["default"]), o["help"]])
    return table(["option", "type", "default", "meaning"], rows)


# -- findings -----------------------------------------------------------------------------------


def findings_table() -> str:
    from addon.findings import CODES

    return table(["code", "meaning"], [[f"`{code}`", text] for code, text in CODES.items()])


# -- the database -------------------------------------------------------------------------------


def _schema_table(name: str) -> Any:
    from storage.schema import exchange_view
    from storage.schema import metadata as tables

    if name == exchange_view.name:
        return exchange_view
    return tables.tables[name]


def _type(column: Any) -> str:
    if type(column.type).__name__ == "DateTime":
        return "time (UTC)"
    try:
        return str(column.type.compile()).lower()
    except Exception:  # noqa: BLE001 - a type without a generic SQL name (JSON variants) raises its own kinds
        return type(column.type).__name__.lower()


def columns_table(name: str) -> str:
    t = _schema_table(name)
    rows = []
    for c in t.columns:
        notes = []
        if c.primary_key:
            notes.append("primary key")
        elif not c.nullable and t.name != "exchange_view":
            notes.append("not NULL")
        type_ = "json" if "JSON" in type(c.type).__name__ or "variant" in type(c.type).__name__.lower() else _type(c)
        if type_ == "json" or "json" in repr(c.type).lower():
            type_ = "JSON (`jsonb` on PostgreSQL)"
        comment = c.comment or ("as in `exchanges`" if t.name == "exchange_view" else "")
        rows.append([f"`{c.name}`", type_ + (f", {', '.join(notes)}" if notes else ""), comment])
    text = table(["column", "type", "meaning"], rows)
    indexes = sorted(getattr(t, "indexes", ()), key=lambda i: i.name or "")
    if indexes:
        listed = "; ".join(
            f"`{i.name}` ({', '.join(f'`{c.name}`' for c in i.columns)}{', unique' if i.unique else ''})"
            for i in indexes
        )
        text += f"\nIndexes: {listed}.\n"
    return text


def tables_table() -> str:
    import storage.schema
    from storage.schema import exchange_view
    from storage.schema import metadata as tables

    # A table without a comment: what the module's docstring says of it ("One row per
    # exchange in ``exchanges``").
    docstring = " ".join((storage.schema.__doc__ or "").split())
    said = {name: what.strip().capitalize() + "." for what, name in re.findall(r"([^;.:]+?) in ``(\w+)``", docstring)}
    rows = [[f"`{t.name}`", "table", t.comment or said.get(t.name, "")] for t in tables.sorted_tables]
    rows.append([f"`{exchange_view.name}`", "view", exchange_view.comment or ""])
    return table(["name", "kind", "what it holds"], rows)


# -- the llm-audit command ----------------------------------------------------------------------


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def cli_parser() -> argparse.ArgumentParser:
    """The root parser of the ``llm-audit`` console script, found through its entry point
    and caught as its ``main`` starts parsing (so it does not matter where it is built)."""
    entries = list(metadata.entry_points(group="console_scripts", name="llm-audit"))
    if not entries:
        raise RuntimeError("the llm-audit console script is not installed: run scripts/test once (it installs it)")
    main: Callable[..., Any] = entries[0].load()
    original = argparse.ArgumentParser.parse_known_args

    def capture(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Captured(self)

    argparse.ArgumentParser.parse_known_args = capture  # type: ignore[method-assign]
    try:
        try:
            main([])
        except TypeError:  # a main() that takes no arguments reads sys.argv
            saved, sys.argv = sys.argv, ["llm-audit"]
            try:
                main()
            finally:
                sys.argv = saved
    except _Captured as captured:
        return captured.parser
    finally:
        argparse.ArgumentParser.parse_known_args = original  # type: ignore[method-assign]
    raise RuntimeError("llm-audit's main() never parsed its arguments")


def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {a.dest: a.help or "" for a in action._choices_actions}
        seen: dict[int, str] = {}
        for name, sub in action.choices.items():
            if id(sub) in seen:
                continue
            aliases = [n for n, p in action.choices.items() if p is sub and n != name]
            seen[id(sub)] = name
            label = prefix + name + (f" (alias {', '.join(aliases)})" if aliases else "")
            nested = list(_commands(sub, prefix + name + " "))
            if nested:
                yield from nested
            else:
                yield label, helps.get(name, ""), sub


def _arguments(parser: argparse.ArgumentParser) -> str:
    """The arguments a command takes; a group of them (the filters) by its title."""
    grouped = {
        id(a): g.title
        for g in parser._action_groups
        if g.title not in (None, "positional arguments", "options", "optional arguments")
        for a in g._group_actions
    }
    shown = []
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction | argparse._SubParsersAction):
            continue
        if id(a) in grouped:
            title = f"the {grouped[id(a)]} (`{'`, `'.join(max(x.option_strings, key=len) for x in parser._actions if grouped.get(id(x)) == grouped[id(a)])}`)"
            if title not in shown:
                shown.append(title)
            continue
        if a.option_strings:
            flag = max(a.option_strings, key=len)
            takes_value = a.nargs != 0
            metavar = a.metavar or (a.dest.upper() if not a.choices else "|".join(map(str, a.choices)))
            shown.append(f"`{flag}{' ' + str(metavar) if takes_value else ''}`")
        else:
            shown.append(f"`{a.metavar or a.dest}`")
    return ", ".join(shown)


def cli_table() -> str:
    rows = [[f"`llm-audit {label}`", help_, _arguments(sub)] for label, help_, sub in _commands(cli_parser())]
    return table(["command", "what it does", "arguments"], rows)


# -- modules that import mitmproxy --------------------------------------------------------------


def mitmproxy_importers() -> list[tuple[str, list[str], str]]:
    """Each module of the project's packages that imports mitmproxy: its path, what it
    imports, and the first paragraph of its docstring."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")) if (ROOT / package).is_dir() else ():
            names = set()
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names |= {a.name for a in node.names if a.name.split(".")[0] == "mitmproxy"}
                elif (
                    isinstance(node, ast.ImportFrom)
                    and node.level == 0
                    and (node.module or "").split(".")[0] == "mitmproxy"
                ):
                    names |= {f"{node.module}.{a.name}" for a in node.names}
            if names:
                summary = (ast.get_docstring(tree) or "").split("\n\n")[0]
                found.append((path.relative_to(ROOT).as_posix(), sorted(names), summary))
    return found


def mitmproxy_imports_table() -> str:
    rows = [
        [f"`{path}`", summary, ", ".join(f"`{n}`" for n in names)] for path, names, summary in mitmproxy_importers()
    ]
    return table(["module", "what it is (its docstring)", "what it imports from mitmproxy"], rows)


# -- the pages ----------------------------------------------------------------------------------


@functools.cache
def generate(name: str) -> str:
    if name == "options":
        return options_table()
    if name == "findings":
        return findings_table()
    if name == "tables":
        return tables_table()
    if name.startswith(("table:", "view:")):
        return columns_table(name.split(":", 1)[1])
    if name == "cli":
        return cli_table()
    if name == "mitmproxy-imports":
        return mitmproxy_imports_table()
    raise KeyError(f"no generator for the marker 'generated: {name}'")


def render(text: str) -> str:
    """``text`` with every generated block regenerated."""
    return MARKER.sub(lambda m: m.group(1) + generate(m.group("name")) + m.group(4), text)


def stale_pages() -> list[Path]:
    return [page for page in PAGES if render(page.read_text()) != page.read_text()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m docs._generate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report pages whose tables are out of date")
    args = parser.parse_args(argv)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    stale = stale_pages()
    if args.check:
        for page in stale:
            print(f"{page.relative_to(ROOT)}: generated tables are out of date; run {COMMAND}", file=sys.stderr)
        return 1 if stale else 0
    for page in stale:
        page.write_text(render(page.read_text()))
        print(f"rewrote {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
