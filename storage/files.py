"""Files that hold prompts are readable by their owner only, whatever the umask.

The audit database (and the WAL and shared-memory files SQLite makes beside it, which
take the database file's mode), the spool, checkpoints and keys hold prompts, answers or
secrets. With a common umask (022) they would be created readable by every local user;
these helpers create them 0600 in folders 0700 instead, and say so when an existing
file is readable by others.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)

FILE_MODE = 0o600
DIR_MODE = 0o700


def private_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents); the folders made here are 0700."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    for made in missing:
        os.chmod(made, DIR_MODE)
    return path


def private_file(path: Path) -> bool:
    """Create ``path`` empty and 0600 unless it exists; True when it was created."""
    private_dir(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def open_private(path: Path, mode: str = "ab+"):
    """``open(path, mode)``, the file created 0600 when it is new (a spool, a log)."""
    private_file(path)
    return open(path, mode)


def warn_if_readable(path: Path, fix: str) -> bool:
    """Log a warning naming ``fix`` when ``path`` exists and others may read it; True if so."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning(
            f"llm-audit: {path} holds prompts and is readable by other users (mode {stat.S_IMODE(mode):04o}); {fix}"
        )
        return True
    return False
