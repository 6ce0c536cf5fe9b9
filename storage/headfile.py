"""The last chain head a writer committed, kept beside its spool, outside the database.

At its next start the writer compares it with the database's head (see
``AuditWriter._vouch``): records found after it were not written by this proxy as far as
it knows (an insider's consistent append while it was stopped), so its checkpoints name
them instead of signing them in. Written after each commit that moves the head (one
small file, replaced whole), on the writer thread.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import orjson

from storage.chain import Head
from storage.files import private_dir

log = logging.getLogger(__name__)


class HeadFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._failed = False

    def load(self) -> Head | None:
        """The head last saved; None when there is none (a first start) or it cannot be read."""
        try:
            doc = orjson.loads(self.path.read_bytes())
            return Head(int(doc["seq"]), str(doc["hash"]))
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
        """Replace the file with ``head`` (fsync'd: it must survive the crash it is for)."""
        tmp = self.path.with_suffix(".tmp")
        try:
            private_dir(self.path.parent)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(orjson.dumps({"seq": head.seq, "hash": head.hash}))
                f.flush()
                os.fsync(f.fileno())
            tmp.replace(self.path)
            self._failed = False
        except OSError as e:
            if not self._failed:
                log.warning("llm-audit: cannot write %s (%s)", self.path, e)
            self._failed = True
