"""User filter files: loaded like mitmproxy scripts, and reloaded when they change.

A filter file is a Python module (see :mod:`addon.filters.api`) exposing either
``filters = [...]`` or top-level ``check_request`` / ``check_output`` functions. The
proxy calls :meth:`FilterFiles.reload_if_changed` often (on each request, say); it costs
one ``os.stat`` per file at most once a second. A file that fails to load, or that
changes into one that fails, is reported as one line with its path and line; the last
version that loaded stays active, so a typo saved in an editor never drops a filter
that was working.

The source is compiled from the file's bytes on every load, without ``__pycache__``:
bytecode caches are validated by a one-second modification time and could hand back
the previous version after a quick edit.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
import traceback
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from addon.filters.api import Filter, OutputPiece, RequestContext, Verdict

RELOAD_INTERVAL = 1.0  # seconds between two looks at the files


class FilterLoadError(Exception):
    """A filter file that cannot be used; the message is one line with path and line."""


class ModuleFilter:
    """A filter made of a module's top-level functions (either may be missing)."""

    def __init__(self, module: types.ModuleType, default_name: str) -> None:
        name, window = getattr(module, "name", default_name), getattr(module, "window", 0)
        self.name: str = name
        self.window: int = window
        self._request: Callable[[RequestContext], Verdict | None] | None = getattr(module, "check_request", None)
        self._output: Callable[[OutputPiece], Verdict | None] | None = getattr(module, "check_output", None)

    def check_request(self, ctx: RequestContext) -> Verdict | None:
        return self._request(ctx) if self._request else None

    def check_output(self, piece: OutputPiece) -> Verdict | None:
        return self._output(piece) if self._output else None


@dataclass(slots=True)
class _Source:
    path: Path
    stamp: tuple[int, int] | None = None  # (mtime_ns, size) of the version last tried
    filters: list[Filter] = field(default_factory=list)
    loaded: bool = False  # some version has loaded


class FilterFiles:
    """The user filters of the files given, kept up to date with the files."""

    def __init__(
        self,
        paths: Sequence[str | os.PathLike[str]],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sources = [_Source(Path(p)) for p in paths]
        self._clock = clock
        self._last_look: float | None = None

    @property
    def filters(self) -> list[Filter]:
        """The filters of every file, in the order the files were given."""
        return [f for s in self._sources for f in s.filters]

    def load(self) -> list[str]:
        """Load every file now; the error lines of those that failed."""
        self._last_look = self._clock()
        return [e for s in self._sources if (e := self._refresh(s, force=True))]

    def reload_if_changed(self) -> tuple[bool, list[str]]:
        """Reload the files that changed since the last look, at most once a second.

        Returns whether the filters changed and the error lines of files that failed
        (each failure is reported once, not at every look). The first call loads all.
        """
        now = self._clock()
        if self._last_look is not None and now - self._last_look < RELOAD_INTERVAL:
            return False, []
        force = self._last_look is None
        self._last_look = now
        before = [id(f) for f in self.filters]
        errors = [e for s in self._sources if (e := self._refresh(s, force))]
        return [id(f) for f in self.filters] != before, errors

    def _refresh(self, source: _Source, force: bool) -> str | None:
        """Reload ``source`` if its file changed (or ``force``); an error line or ``None``."""
        try:
            st = source.path.stat()
        except OSError as e:
            if source.stamp is None and not force:
                return None  # already reported
            source.stamp = None
            return _line(source, f"{source.path}: cannot read the filter file: {e.strerror}")
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == source.stamp and not force:
            return None
        source.stamp = stamp
        try:
            source.filters = load_filter_file(source.path)
        except FilterLoadError as e:
            return _line(source, str(e))
        source.loaded = True
        return None


def _line(source: _Source, message: str) -> str:
    return f"{message} (the previous version stays active)" if source.loaded else message


def load_filter_file(path: Path) -> list[Filter]:
    """Import a filter file and return its filters; :class:`FilterLoadError` if unusable."""
    name = f"llm_audit_filter_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
    module = types.ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module  # some code (dataclasses, pickle) looks its module up
    try:
        code = compile(path.read_bytes(), str(path), "exec")
        exec(code, module.__dict__)  # noqa: S102 - running the user's filter file is the point
    except Exception as e:  # noqa: BLE001 - any error in user code is reported, not raised
        del sys.modules[name]
        raise FilterLoadError(_describe(e, path)) from None
    return _filters_of(module, path)


def _filters_of(module: types.ModuleType, path: Path) -> list[Filter]:
    listed = getattr(module, "filters", None)
    if listed is None:
        if not (hasattr(module, "check_request") or hasattr(module, "check_output")):
            raise FilterLoadError(f"{path}: defines neither `filters` nor check_request/check_output")
        filters: list[Filter] = [ModuleFilter(module, path.stem)]
    elif isinstance(listed, list | tuple):
        filters = list(listed)
    else:
        raise FilterLoadError(f"{path}: `filters` must be a list, not {type(listed).__name__}")
    for i, f in enumerate(filters):
        what = "the module" if isinstance(f, ModuleFilter) else f"filters[{i}]"
        problem = _problem(f)
        if problem:
            raise FilterLoadError(f"{path}: {what}: {problem}")
    return filters


def _problem(f: object) -> str | None:
    """What keeps ``f`` from being a filter, if anything."""
    name, window = getattr(f, "name", None), getattr(f, "window", None)
    if not isinstance(name, str) or not name:
        return "`name` must be a non-empty string"
    if not isinstance(window, int) or isinstance(window, bool) or window < 0:
        return "`window` must be an integer >= 0"
    for method in ("check_request", "check_output"):
        if not callable(getattr(f, method, None)):
            return f"`{method}` must be callable"
    return None


def _describe(e: Exception, path: Path) -> str:
    """``path:line: Error: message`` on one line, the line being the deepest in the file."""
    line = e.lineno if isinstance(e, SyntaxError) and e.filename == str(path) else None
    for frame in traceback.extract_tb(e.__traceback__):
        if frame.filename == str(path):
            line = frame.lineno
    message = " ".join(f"{type(e).__name__}: {e}".split())
    return f"{path}:{line}: {message}" if line else f"{path}: {message}"
