"""The writer's status file: whether records flow, for ``llm-audit status`` and monitoring.

The writer thread keeps a small JSON file beside its spool (``status-INSTANCE.json``, mode
0600, replaced atomically, at most about once a second and only when something changed):
its pid and instance, when it started, how many records it wrote, how many wait in the
spool or in memory, how many it quarantined, when it last wrote and the last error, and
whether the writer thread is alive. A reader needs no database access to see that a
proxy has stopped recording.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from storage.spool import safe_name

log = logging.getLogger(__name__)

MIN_INTERVAL = 1.0  # seconds between two writes of the file
HEARTBEAT = 600.0  # seconds between two "recording" log lines while records come
FLOWING, STUCK, NOT_RUNNING = 0, 1, 3  # the exit statuses of ``llm-audit status``


class StatusError(Exception):
    """No status file can be read; the message is one line."""


def status_path(folder: Path, instance: str) -> Path:
    """``FOLDER/status-INSTANCE.json``: where the writer of ``instance`` keeps its status."""
    return folder / f"status-{safe_name(instance)}.json"


class StatusFile:
    """Writes a status document, atomically and not too often."""

    def __init__(self, path: Path, min_interval: float = MIN_INTERVAL) -> None:
        self.path = path
        self.min_interval = min_interval
        self._last: dict[str, Any] | None = None
        self._at = 0.0

    def update(self, doc: dict[str, Any], force: bool = False) -> bool:
        """Write ``doc`` (plus the time) when it changed and the last write is old enough;
        True when written. Raises OSError."""
        now = time.monotonic()
        if not force and (doc == self._last or now - self._at < self.min_interval):
            return False
        data = orjson.dumps(doc | {"updated": datetime.now(UTC)}, option=orjson.OPT_INDENT_2 | orjson.OPT_UTC_Z)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data + b"\n")
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        self._last, self._at = dict(doc), now
        return True


class WriterStatus:
    """What the writer thread reports: its status file (a file it cannot write is logged
    once, not at every update) and, every :data:`HEARTBEAT` seconds while records come, a
    "recording" log line."""

    def __init__(self, path: Path) -> None:
        self.file = StatusFile(path)
        self._failed = False
        self._beat = (time.monotonic(), 0)  # the last heartbeat: when, and the records written then

    def update(self, doc: dict[str, Any], force: bool = False) -> None:
        """Keep the file current with ``doc`` (its ``written``, ``spooled`` and
        ``quarantined`` counts also make the heartbeat line)."""
        try:
            self.file.update(doc, force=force)
            self._failed = False
        except OSError as e:
            if not self._failed:
                log.warning("llm-audit: cannot write the status file %s (%s)", self.file.path, e)
            self._failed = True
        at, written = self._beat
        now = time.monotonic()
        if now - at >= HEARTBEAT and doc["written"] > written:
            log.info(
                "llm-audit: recording: %d records written in the last %.0f minutes (%d in all), %d in the spool, "
                "%d quarantined",
                doc["written"] - written,
                (now - at) / 60,
                doc["written"],
                doc["spooled"],
                doc["quarantined"],
            )
            self._beat = (now, doc["written"])


#: A status file is a few hundred bytes; more is not one (and a device or a pipe is read no further).
MAX_STATUS_BYTES = 1 << 20


def read_status(path: Path) -> dict[str, Any]:
    """The status document at ``path``; raises OSError or ValueError (not a status file:
    not a regular file, over :data:`MAX_STATUS_BYTES`, not the document)."""
    if not stat.S_ISREG(os.stat(path).st_mode):  # (before opening: a pipe's open would wait for a writer)
        raise ValueError("not a regular file")
    with open(path, "rb") as f:
        data = f.read(MAX_STATUS_BYTES + 1)
    if len(data) > MAX_STATUS_BYTES:
        raise ValueError(f"over {MAX_STATUS_BYTES} bytes")
    doc = orjson.loads(data)
    if not isinstance(doc, dict) or "pid" not in doc or "writer_alive" not in doc:
        raise ValueError("not an llm-audit status file")
    return doc


def pid_alive(pid: int, started: str | None = None) -> bool:
    """Whether a process with this id exists (ours or another user's), and, given what
    :func:`process_start` said of the proxy (``started``), whether it is that process:
    a proxy killed outright leaves its status file saying it runs, and a later process
    given its pid made ``status`` answer "records flow" for a proxy long gone. Not 0 or
    less: ``kill`` takes those for process groups, which always exist."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    except (OverflowError, ValueError):
        return False
    now = process_start(pid) if started is not None else None
    return now is None or now == started  # (no /proc to tell by: the pid alone)


def process_start(pid: int) -> str | None:
    """When process ``pid`` started, as Linux tells it: this boot's id and the start time
    in clock ticks (``/proc/PID/stat``, field 22), which no later process with the same
    pid shares; None where ``/proc`` does not tell."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_bytes()
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        fields = stat_line[stat_line.rindex(b")") + 2 :].split()  # (the name may hold spaces and parentheses)
        return f"{boot}:{int(fields[19])}"
    except (OSError, ValueError, IndexError):
        return None


def verdict(doc: dict[str, Any], running: bool) -> tuple[int, str]:
    """(exit status, one line) for a status document; ``running``: its pid is alive.

    Records flow when the proxy runs, its writer thread is alive and nothing waits in the
    spool or in memory; they are stuck when the thread is dead or records wait (the
    database does not take them); the proxy is not running when it stopped or its
    process is gone.
    """
    who = f"proxy {doc.get('instance')} (pid {doc.get('pid')})"
    counts = (
        f"{doc.get('written', 0)} written, {doc.get('spooled', 0)} in the spool, "
        f"{doc.get('quarantined', 0)} quarantined, {doc.get('held', 0)} held in memory; "
        f"last write {doc.get('last_write') or 'none yet'}"
    )
    error = f" (last error: {doc['last_error']})" if doc.get("last_error") else ""
    if doc.get("stopped"):
        return NOT_RUNNING, f"{who}: not running (stopped at {doc.get('updated')}); {counts}"
    if not running:
        return NOT_RUNNING, f"{who}: not running (the process is gone; last update {doc.get('updated')}); {counts}"
    if not doc.get("writer_alive"):
        return STUCK, f"{who}: records are stuck: the writer thread is not running{error}; {counts}"
    if doc.get("spooled") or doc.get("held"):
        waiting = (doc.get("spooled") or 0) + (doc.get("held") or 0)
        return STUCK, f"{who}: records are stuck: {waiting} wait for the database{error}; {counts}"
    return FLOWING, f"{who}: records flow; {counts}"
