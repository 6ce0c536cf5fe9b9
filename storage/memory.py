"""Handing freed heap memory back to the system, after a huge text has been copied.

glibc keeps the pages of freed blocks below its mmap threshold (which it raises, up to
32 MiB, as big blocks come and go): a 200 MB stream, joined and written, would leave the
proxy that much larger for good, and while one huge text is built from another the
freed pieces would count twice toward the peak. ``malloc_trim`` returns them.

Here, in the storage layer, because both the proxy's record (:mod:`addon.record`, which
joins a long answer) and the writer (:mod:`storage.writer`, which copies it into the
database) call it, and the addon may import storage but not the other way round.
"""

from __future__ import annotations

import ctypes

__all__ = ["release_freed_memory"]


def release_freed_memory() -> None:
    """Return the heap's free pages to the system (glibc's ``malloc_trim``; a no-op where
    there is no glibc)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
