"""User filter files: loading, reloading on change, and one-line errors with path and line."""

import os
import textwrap
from pathlib import Path

import pytest

from addon.filters.api import BLOCK, RequestContext
from addon.filters.engine import FilterSet
from addon.filters.loader import RELOAD_INTERVAL, FilterFiles

EXAMPLE = Path(__file__).resolve().parents[1] / "fixtures" / "filters" / "example_filter.py"


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def write(path: Path, source: str, bump: int = 0) -> Path:
    """Write a filter file; ``bump`` moves its mtime on so a change is seen at any clock resolution."""
    path.write_text(textwrap.dedent(source))
    if bump:
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + bump * 1_000_000_000))
    return path


def ctx(text: str) -> RequestContext:
    return RequestContext.from_body("llm-stream", {"messages": [{"role": "user", "content": text}]})


def test_the_documented_example_filter_loads_and_works():
    files = FilterFiles([EXAMPLE])
    assert files.load() == []
    (f,) = files.filters
    assert (f.name, f.window) == ("no-passwords", 64)
    fs = FilterSet(filters=files.filters, failure="open")
    assert [v.rule_id for v in fs.check_request(ctx("my Password is x"))] == ["password-in-prompt"]
    guard = fs.output_guard()
    text = "Sure. password: hunter2 and more"
    released = "".join(guard.feed(c).text for c in text)
    assert guard.blocked is not None and guard.blocked.rule_id == "password-in-answer"
    assert guard.blocked.position == text.index("password:") and "password" not in released


def test_module_level_functions_make_one_filter_named_after_the_file(tmp_path):
    path = write(
        tmp_path / "shout.py",
        """
        from addon.filters.api import FLAG, Verdict

        window = 3

        def check_output(piece):
            if "!!!" in piece.recent(3 + len(piece.text)):
                return Verdict(FLAG, "shouting")
        """,
    )
    files = FilterFiles([path])
    assert files.load() == []
    (f,) = files.filters
    assert (f.name, f.window) == ("shout", 3)
    assert f.check_request(ctx("hi")) is None
    guard = FilterSet(filters=files.filters, failure="open").output_guard()
    verdicts = [v for c in "no!!!" for v in guard.feed(c).verdicts]
    assert [(v.rule_id, v.filter) for v in verdicts] == [("shouting", "shout")]


def test_filters_of_several_files_keep_the_files_order(tmp_path):
    a = write(tmp_path / "a.py", "def check_request(ctx): return None\n")
    b = write(tmp_path / "b.py", "name = 'bee'\ndef check_output(piece): return None\n")
    files = FilterFiles([b, a])
    files.load()
    assert [f.name for f in files.filters] == ["bee", "a"]


def test_a_changed_file_is_reloaded_at_the_next_look_after_a_second(tmp_path):
    clock = FakeClock()
    path = write(
        tmp_path / "f.py", "from addon.filters.api import *\ndef check_request(ctx): return Verdict(FLAG, 'v1')\n"
    )
    files = FilterFiles([path], clock=clock)
    assert files.reload_if_changed() == (True, [])  # the first look loads
    assert files.filters[0].check_request(ctx("x")).rule_id == "v1"

    clock.now += RELOAD_INTERVAL
    assert files.reload_if_changed() == (False, [])  # unchanged

    write(path, "from addon.filters.api import *\ndef check_request(ctx): return Verdict(BLOCK, 'v2')\n", bump=5)
    clock.now += RELOAD_INTERVAL / 2
    assert files.reload_if_changed() == (False, [])  # too soon to look
    assert files.filters[0].check_request(ctx("x")).rule_id == "v1"
    clock.now += RELOAD_INTERVAL / 2
    assert files.reload_if_changed() == (True, [])
    verdict = files.filters[0].check_request(ctx("x"))
    assert (verdict.rule_id, verdict.action) == ("v2", BLOCK)


def test_a_broken_change_is_reported_once_and_the_last_good_version_stays(tmp_path):
    clock = FakeClock()
    path = write(tmp_path / "f.py", "def check_request(ctx): return None\n")
    files = FilterFiles([path], clock=clock)
    files.reload_if_changed()
    good = files.filters

    write(path, "def check_request(ctx):\n    return None\n\ndef oops(:\n", bump=5)
    clock.now += RELOAD_INTERVAL
    changed, errors = files.reload_if_changed()
    assert not changed and files.filters == good
    (error,) = errors
    assert error.startswith(f"{path}:4: SyntaxError: ") and error.endswith(" (the previous version stays active)")

    clock.now += RELOAD_INTERVAL
    assert files.reload_if_changed() == (False, [])  # not reported again until the file changes


def test_an_error_while_running_the_module_names_its_line(tmp_path):
    path = write(tmp_path / "f.py", "import os\n\nlimit = 1 / 0\n")
    assert FilterFiles([path]).load() == [f"{path}:3: ZeroDivisionError: division by zero"]


def test_an_error_in_an_imported_helper_names_the_filter_files_line(tmp_path):
    path = write(tmp_path / "f.py", "import json\n\njson.loads('{')\n")
    (error,) = FilterFiles([path]).load()
    assert error.startswith(f"{path}:3: JSONDecodeError: ")


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("x = 1\n", "defines neither `filters` nor check_request/check_output"),
        ("filters = 'nope'\n", "`filters` must be a list, not str"),
        ("filters = [object()]\n", "filters[0]: `name` must be a non-empty string"),
        ("name = ''\ndef check_request(ctx): pass\n", "the module: `name` must be a non-empty string"),
        ("window = -1\ndef check_request(ctx): pass\n", "the module: `window` must be an integer >= 0"),
        ("window = True\ndef check_request(ctx): pass\n", "the module: `window` must be an integer >= 0"),
        (
            "class F:\n    name = 'f'\n    window = 0\n    def check_request(self, ctx): pass\nfilters = [F()]\n",
            "filters[0]: `check_output` must be callable",
        ),
    ],
)
def test_files_that_are_not_filters_are_refused_with_the_reason(tmp_path, source, problem):
    path = write(tmp_path / "f.py", source)
    files = FilterFiles([path])
    assert files.load() == [f"{path}: {problem}"]
    assert files.filters == []


def test_a_missing_file_is_reported_and_picked_up_once_it_exists(tmp_path):
    clock = FakeClock()
    path = tmp_path / "later.py"
    files = FilterFiles([path], clock=clock)
    changed, errors = files.reload_if_changed()
    assert not changed and errors == [f"{path}: cannot read the filter file: No such file or directory"]
    clock.now += RELOAD_INTERVAL
    assert files.reload_if_changed() == (False, [])  # reported once
    write(path, "def check_request(ctx): return None\n")
    clock.now += RELOAD_INTERVAL
    assert files.reload_if_changed() == (True, []) and len(files.filters) == 1


def test_a_filter_module_can_define_dataclasses(tmp_path):
    path = write(
        tmp_path / "dc.py",
        """
        from dataclasses import dataclass
        from addon.filters.api import BaseFilter

        @dataclass
        class Limit(BaseFilter):
            size: int = 3

        filters = [Limit()]
        """,
    )
    files = FilterFiles([path])
    assert files.load() == [] and files.filters[0].name == "Limit"
