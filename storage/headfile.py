"""The last chain head a writer committed, kept beside its spool, outside the database.

At its next start the writer compares it with the database's head (see
``AuditWriter._vouch``): records found after it were not written by this proxy as far as
it knows (an insider's consistent append while it was stopped), so its checkpoints name
them instead of signing them in. Written after each commit that moves the head, on the
writer thread.

Why two slots written in place rather than a small file replaced whole: the file is
saved after every commit, and on this machine creating, writing and renaming a file
cost 0.3 ms of CPU each time (the file system's work for a rename over a file), against
0.04 ms for a write in place and its fsync: a quarter of the writer's CPU per exchange
at a model's pace. A write in place can be torn by a crash, so the head goes into one
of two fixed slots in turn, each with its CRC-32; the newest slot that checks out is the
head. A file of the earlier format (one JSON object, replaced whole) is still read.
"""

from __future__ import annotations

import logging
import os
import zlib
from pathlib import Path

import orjson

from storage.chain import Head
from storage.files import FILE_MODE, private_dir

log = logging.getLogger(__name__)

# Bytes per slot: a JSON object padded with spaces, then a line feed. A disk sector each,
# so that a write the device tears can reach only the slot being written.
SLOT = 512


def _slot(head: Head) -> bytes:
    body = orjson.dumps({"seq": head.seq, "hash": head.hash})
    line = orjson.dumps({"seq": head.seq, "hash": head.hash, "crc": zlib.crc32(body)})
    if len(line) >= SLOT:
        raise ValueError(f"a chain head of {len(line)} bytes does not fit a slot")
    return line.ljust(SLOT - 1) + b"\n"


def _read(data: bytes, slot: bool = True) -> Head | None:
    """The head in one slot, or (``slot`` False) in a file of the earlier format, which has
    no CRC; None when a slot's CRC does not check out."""
    doc = orjson.loads(data)
    head = Head(int(doc["seq"]), str(doc["hash"]))
    if slot and doc.get("crc") != zlib.crc32(orjson.dumps({"seq": head.seq, "hash": head.hash})):
        return None
    return head


def _slots(data: bytes) -> list[Head | None]:
    """Each slot's head, None for one a crash tore (or that does not check out)."""
    heads: list[Head | None] = []
    for at in (0, SLOT):
        try:
            heads.append(_read(data[at : at + SLOT]))
        except (ValueError, KeyError, TypeError, orjson.JSONDecodeError):
            heads.append(None)
    return heads


class HeadFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._failed = False
        self._fd: int | None = None
        self._next = 0  # the slot written next: never the one holding the newest head

    def load(self) -> Head | None:
        """The head last saved; None when there is none (a first start) or it cannot be read."""
        try:
            with self.path.open("rb") as f:
                data = f.read(2 * SLOT + 1)  # (a file grown by someone else is not read whole)
            if len(data) > 2 * SLOT:
                raise ValueError(f"over {2 * SLOT} bytes: not a head file")
            if len(data) != 2 * SLOT:  # the earlier format: one JSON object
                return _read(data, slot=False)
            # a slot torn by a crash while it was written: the other holds the head before
            found = [h for h in _slots(data) if h is not None]
            if not found:
                raise ValueError("neither slot checks out")
            return max(found, key=lambda h: h.seq)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, orjson.JSONDecodeError) as e:
            log.warning(
                "llm-audit: cannot read %s (%s); the records at the end of the chain are not checked against it",
                self.path,
                e,
            )
            return None

    def save(self, head: Head) -> None:
        """Write ``head`` into the next slot (fsync'd: it must survive the crash it is for)."""
        try:
            fd = self._open()
            os.pwrite(fd, _slot(head), SLOT * self._next)
            os.fsync(fd)
            self._next = 1 - self._next
            self._failed = False
        except (OSError, ValueError) as e:
            self.close()  # opened again at the next save
            if not self._failed:
                log.warning("llm-audit: cannot write %s (%s)", self.path, e)
            self._failed = True

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def _open(self) -> int:
        """The file, open for writing in place; a file of another size (none yet, the
        earlier format) is made two slots of the head it holds first, so both check out."""
        if self._fd is None:
            private_dir(self.path.parent)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, FILE_MODE)
            try:
                if os.fstat(fd).st_size != 2 * SLOT:
                    known = self.load() if os.fstat(fd).st_size else None
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, _slot(known or Head()) * 2, 0)
                    os.fsync(fd)
                    self._next = 0
                else:  # after a restart: the slot of the older head (or a torn one) is next
                    first, second = _slots(os.pread(fd, 2 * SLOT, 0))
                    self._next = 0 if first is None or (second is not None and first.seq < second.seq) else 1
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
        return self._fd
