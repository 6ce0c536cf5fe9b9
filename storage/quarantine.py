"""The quarantine: records that can be written nowhere as they are, kept aside and named.

Two things end up here, never dropped: a spool line that cannot be read back (torn by a
crash, corrupted, not JSON), and a row the database refuses even reduced to its minimum
while it takes other rows. Each is appended, fsync'd, to a quarantine file beside the
spool (``quarantine-INSTANCE.jsonl``), as two lines: a header (JSON: when, why, size,
SHA-256, and the record's chain columns and id as far as they can be recovered) and the raw
line itself. The writer also records each header in the ``quarantine`` table, so that
``llm-audit verify`` names a quarantined record where its chain has a gap
(:mod:`storage.verify`) instead of reporting tampering.

A sealed row's chain columns come first in its JSON (:meth:`storage.chain.Chain.seal`),
so even a line cut short usually still names its place in the chain.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

_RECOVER = {  # a field of a row's JSON, found in a line that does not parse
    "chain_id": re.compile(rb'"chain_id":"((?:[^"\\]|\\.){1,255})"'),
    "chain_seq": re.compile(rb'"chain_seq":(\d{1,19})[,}]'),
    "prev_hash": re.compile(rb'"prev_hash":"([0-9a-f]{64})"'),
    "record_hash": re.compile(rb'"record_hash":"([0-9a-f]{64})"'),
    "record_id": re.compile(rb'"id":"([0-9A-Za-z_.-]{1,64})"'),
}


@dataclass(slots=True)
class Entry:
    """One quarantined line, as the ``quarantine`` table holds it."""

    quarantined_at: datetime
    reason: str
    file: str
    size: int
    sha256: str
    chain_id: str | None = None
    chain_seq: int | None = None
    prev_hash: str | None = None
    record_hash: str | None = None
    record_id: str | None = None

    def as_row(self) -> dict[str, Any]:
        return asdict(self)


def recover(raw: bytes) -> dict[str, Any]:
    """The chain columns and id of a row's JSON line, as far as they can be read."""
    try:
        row = orjson.loads(raw)
    except orjson.JSONDecodeError:
        row = None
    if isinstance(row, dict):
        found = {
            "record_id": row.get("id"),
            **{k: row.get(k) for k in ("chain_id", "chain_seq", "prev_hash", "record_hash")},
        }
    else:
        found = {}
        for name, pattern in _RECOVER.items():
            m = pattern.search(raw[:4096])
            if m:
                found[name] = int(m.group(1)) if name == "chain_seq" else m.group(1).decode("utf-8", "replace")
    return {k: v for k, v in found.items() if _plausible(k, v)}


def _plausible(name: str, value: Any) -> bool:
    if name == "chain_seq":
        return type(value) is int and 0 < value < 2**63
    return isinstance(value, str) and 0 < len(value) <= 255


class Quarantine:
    """An append-only, fsync'd file of lines that could not be written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._known = {entry.sha256 for entry in self.entries()}

    def add(self, raw: bytes, reason: str) -> Entry | None:
        """Keep ``raw``; None when the same line is already kept. Raises OSError (e.g. a full disk)."""
        digest = hashlib.sha256(raw).hexdigest()
        if digest in self._known:
            return None
        entry = Entry(datetime.now(UTC), reason[:500], str(self.path), len(raw), digest, **recover(raw))
        header = orjson.dumps(entry.as_row(), option=orjson.OPT_UTC_Z | orjson.OPT_NAIVE_UTC)
        line = raw.replace(b"\n", b" ").rstrip(b"\r")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, header + b"\n" + line + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        self._known.add(digest)
        return entry

    def entries(self) -> Iterator[Entry]:
        """The headers of what the file holds, in order."""
        try:
            f = open(self.path, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            return
        with f:
            for line in f:
                if not line.startswith(b'{"quarantined_at":'):
                    continue
                try:
                    doc = orjson.loads(line)
                    doc["quarantined_at"] = datetime.fromisoformat(doc["quarantined_at"])
                    yield Entry(**doc)
                except (orjson.JSONDecodeError, TypeError, KeyError, ValueError):
                    continue


def kept_line(path: Path, digest: str) -> bytes | None:
    """The line a quarantine file keeps under the header of SHA-256 ``digest`` (None: it
    holds no such header); raises OSError when the file cannot be read, or is no regular
    file (the path comes from a table anyone writing the database can write: a device or
    a pipe would never end). Read a line at a time: a quarantine may be large."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file")
    with os.fdopen(fd, "rb") as f:
        found = False
        for line in f:
            if found:
                return line.removesuffix(b"\n")
            found = line.startswith(b'{"quarantined_at":') and f'"sha256":"{digest}"'.encode() in line
    return None
