"""The layers stay layers: ``storage`` knows nothing of the proxy, only the adapter
package (``addon/mitm/``) knows mitmproxy, and no module of the project imports itself
round a cycle.

``storage`` is the bottom layer (the proxy writes through it, the ``llm-audit`` command
reads through it), so it must import nothing from ``addon``: that is checked by importing
every storage module in a fresh interpreter. Cycles are found in the graph of module-level
imports read with :mod:`ast` from every file of the project's packages; an import inside a
function or under ``if TYPE_CHECKING`` runs later or never, so it is no edge (and is how a
cycle would be hidden: keep those rare). Imports of mitmproxy are read the same way, but
every one counts, wherever it is in the file.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from addon.dialects.registry import BUILTIN

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("addon", "storage", "exchange", "cli", "mockllm", "bench", "review")
# The packages whose modules must not import mitmproxy, and the one that may (the adapter).
NO_MITMPROXY = ("addon", "exchange", "storage", "cli", "review")
ADAPTER = "addon.mitm"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_files() -> dict[str, Path]:
    """Every module of the project's packages, by dotted name."""
    return {module_name(path): path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))}


def _module_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements that run when the module is imported, through ``if``/``try`` blocks
    (but not ``if TYPE_CHECKING:``)."""
    for node in body:
        if isinstance(node, ast.If):
            if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                yield from _module_level(node.body)
            yield from _module_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _module_level(block)
        else:
            yield node


def imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project's modules ``name`` imports when it is imported."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in _module_level(ast.parse(path.read_text(encoding="utf-8")).body):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:  # ``from package import module`` imports the module
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {module for module in found if module in modules and module != name}


def import_graph() -> dict[str, set[str]]:
    modules = project_files()
    return {name: imports(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (its modules in import order, the first repeated), else None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_importing_any_storage_module_imports_nothing_of_the_proxy():
    storage = sorted(
        name
        for name in project_files()
        if name.split(".")[0] == "storage" and not name.startswith("storage.migrations.")
    )  # alembic runs those itself
    script = (
        f"import importlib, sys\nfor name in {storage!r}:\n    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m == 'addon' or m.startswith(('addon.', 'cli.', 'mitmproxy'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]", f"importing storage imported {done.stdout.strip()}"


def test_no_storage_file_imports_the_proxy_or_the_command_even_inside_a_function():
    for name, path in project_files().items():
        if name.split(".")[0] != "storage":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not [t for t in targets if t.split(".")[0] in ("addon", "cli")], f"{name} imports {targets}"


def test_no_import_cycles_among_the_project_s_modules():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_names_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("dialect", BUILTIN)
def test_importing_one_dialect_imports_no_other_dialect(dialect):
    """A dialect is one module: it needs the shared base, never another dialect (the
    Responses dialects share addon.dialects.responses, which registers none)."""
    script = (
        f"import importlib, sys\nimportlib.import_module('addon.dialects.{dialect}')\n"
        "print(sorted(m.rsplit('.', 1)[1] for m in sys.modules if m.startswith('addon.dialects.')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    others = set(ast.literal_eval(done.stdout.strip())) & (set(BUILTIN) - {dialect})
    assert not others, f"importing addon.dialects.{dialect} imported {sorted(others)}"


def test_the_registry_reads_in_one_screen():
    assert len((ROOT / "addon" / "dialects" / "registry.py").read_text().splitlines()) <= 60


def mitmproxy_imports(path: Path) -> list[str]:
    """Every ``import mitmproxy...`` / ``from mitmproxy... import`` in the file, at any
    depth (inside functions and ``if TYPE_CHECKING`` too: the rule is about knowing
    mitmproxy, not about import time)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0] == "mitmproxy"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "mitmproxy":
            found.append(node.module or "")
    return found


def test_only_the_adapter_package_imports_mitmproxy():
    offenders = {
        name: imported
        for name, path in project_files().items()
        if name.split(".")[0] in NO_MITMPROXY
        and name != ADAPTER
        and not name.startswith(ADAPTER + ".")
        and (imported := mitmproxy_imports(path))
    }
    assert not offenders, f"only {ADAPTER} may import mitmproxy: {offenders}"


def test_the_adapter_package_is_where_mitmproxy_is_imported():
    """The rule above cannot pass by the adapter moving away: its addons import mitmproxy."""
    adapter = {
        name for name, path in project_files().items() if name.startswith(ADAPTER + ".") and mitmproxy_imports(path)
    }
    assert {f"{ADAPTER}.hooks", f"{ADAPTER}.store", f"{ADAPTER}.content_filters"} <= adapter


def test_the_mitmproxy_import_finder_sees_every_form(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "import mitmproxy\nfrom mitmproxy.http import HTTPFlow\nimport mitmproxyish\n"
        "def f():\n    from mitmproxy import ctx\n"
        "if TYPE_CHECKING:\n    import mitmproxy.addonmanager as am\nfrom . import mitmproxy as local\n"
    )
    assert sorted(mitmproxy_imports(source)) == ["mitmproxy", "mitmproxy", "mitmproxy.addonmanager", "mitmproxy.http"]
