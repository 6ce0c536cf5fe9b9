"""The spool: a local append-only file that keeps records the database cannot take now.

One JSON object per line (orjson), appended in groups and fsync'd with each group, so
a record handed to the spool survives a crash of the proxy. The writer replays the
spool in order when the database is back (also after a restart) and then empties it;
replays are idempotent because rows are upserted by id.

An exclusive ``flock`` on the file keeps two proxies from sharing one spool.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from storage.files import open_private

# Row fields stored as ISO 8601 strings in the spool and turned back into datetimes.
TIME_FIELDS = ("started_at", "first_chunk_at", "ended_at")


def default_spool_path(instance: str) -> Path:
    """``$XDG_STATE_HOME/llm-audit/spool-INSTANCE.jsonl`` (``~/.local/state/...`` by default)."""
    return default_state_dir() / f"spool-{safe_name(instance)}.jsonl"


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/llm-audit`` (``~/.local/state/llm-audit`` by default): spools, status files."""
    state_home = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state_home) / "llm-audit"


def safe_name(instance: str) -> str:
    """An instance name as it can appear in a file name."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in instance) or "proxy"


class SpoolLocked(Exception):
    """Another process holds this spool file."""


class Spool:
    """An append-only, fsync'd file of rows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = open_private(path, "ab+")  # held open for the proxy's lifetime; 0600: it holds prompts
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.close()
            raise SpoolLocked(
                f"{path} is in use by another llm-audit proxy; give each proxy its own llm_audit_spool"
            ) from None
        self._end_torn_line()
        self.records = sum(1 for _ in self._lines())

    def _end_torn_line(self) -> None:
        """A line a crash cut short gets its newline, so the next append starts a line of its own."""
        size = self.size
        if size:
            with open(self.path, "rb") as f:
                f.seek(size - 1)
                torn = f.read(1) != b"\n"
            if torn:
                self._file.write(b"\n")
                self._file.flush()
                os.fsync(self._file.fileno())

    @property
    def size(self) -> int:
        """Bytes in the spool."""
        return os.fstat(self._file.fileno()).st_size

    def __bool__(self) -> bool:
        return self.records > 0

    def append(self, rows: list[dict[str, Any]]) -> None:
        """Append rows and fsync; raises OSError (e.g. a full disk) with nothing half-counted."""
        data = b"".join(orjson.dumps(row) + b"\n" for row in rows)
        self._file.seek(0, os.SEEK_END)
        start = self._file.tell()
        try:
            self._file.write(data)
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError:
            self._file.truncate(start)  # never leave a torn line behind
            raise
        self.records += len(rows)

    def read(self, batch_size: int, unreadable: Callable[[bytes, str], None]) -> Iterator[list[dict[str, Any]]]:
        """The spooled rows in order, in batches. A line that cannot be read back (torn by a
        crash, corrupted) is handed to ``unreadable`` with the reason, never skipped silently."""
        batch: list[dict[str, Any]] = []
        for line in self._lines():
            try:
                row = row_of_line(line)
            except (ValueError, TypeError, AttributeError) as e:  # orjson.JSONDecodeError is a ValueError
                unreadable(line.rstrip(b"\r\n"), f"unreadable spool line ({str(e).splitlines()[0][:200]})")
                continue
            batch.append(row)
            if len(batch) >= batch_size:
                yield batch
                batch = []
        if batch:
            yield batch

    def clear(self) -> None:
        """Empty the spool once everything in it is in the database."""
        self._file.truncate(0)
        self._file.flush()
        os.fsync(self._file.fileno())
        self.records = 0

    def close(self) -> None:
        self._file.close()

    def _lines(self) -> Iterator[bytes]:
        """The file's non-empty lines (a last line without its newline is torn)."""
        self._file.flush()
        with open(self.path, "rb") as f:
            for line in f:
                if line.strip():
                    yield line


def row_of_line(line: bytes) -> dict[str, Any]:
    """One spooled row, its times turned back into datetimes; raises ValueError or TypeError."""
    row = orjson.loads(line)
    if not isinstance(row, dict) or not isinstance(row.get("id"), str):
        raise ValueError("not a row")
    for name in TIME_FIELDS:
        if row.get(name):
            row[name] = datetime.fromisoformat(row[name])
    return row
