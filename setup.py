"""The optional compiled SSE parser: ``addon/framing/sse_parser.py`` built with mypyc.

Everything else about the package is in ``pyproject.toml``; this file only adds the
extension, and makes its build optional: where mypyc or a C compiler is missing, or the
build fails for any other reason, the install goes on without it (one warning line) and
:mod:`addon.framing.sse` uses the pure-Python module, which gives the same results (the
differential tests, ``tests/unit/test_sse_compiled.py``, check that). ``LLM_AUDIT_PURE_PARSER=1``
at install skips the build.

Why mypyc rather than Cython: mypyc compiles the module as it is, from the type hints it
already has (one source for both paths, checked by the same mypy run), and measured
faster than Cython on that unannotated source; Cython would have needed a ``.pxd`` of
C types kept in step with the Python to do better.
"""

from __future__ import annotations

import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

ACCELERATED = ["addon/framing/sse_parser.py"]


def _warn(why: object) -> None:
    print(f"llm-audit: the compiled SSE parser was not built ({why}); the pure-Python one is used", file=sys.stderr)


class OptionalBuildExt(build_ext):
    """``build_ext`` that never fails the install: a failed extension is left out."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - no compiler, no headers...: install without it
            _warn(exc)

    def build_extension(self, ext) -> None:  # type: ignore[no-untyped-def]
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001 - as above, one extension at a time
            _warn(exc)


def ext_modules() -> list:  # type: ignore[type-arg]
    if os.environ.get("LLM_AUDIT_PURE_PARSER") == "1":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as exc:
        _warn(exc)
        return []
    try:
        return mypycify(ACCELERATED, opt_level="3")
    except BaseException as exc:  # noqa: BLE001 - mypyc exits (SystemExit) on a type error
        _warn(exc)
        return []


setup(ext_modules=ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
