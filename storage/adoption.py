"""The proof that a write-ahead row is the proxy's own.

At its next start a proxy marks the rows it left open ``interrupted`` and seals them into
its chain, and its next checkpoint signs them. Without a proof, a row an insider inserted
(``status = 'in_progress'``, the proxy's instance name) would be sealed and signed just
the same. So the writer puts ``open_mac`` on every write-ahead row it opens: the
HMAC-SHA256 of the instance, the row's id, its start time and the hash of its request
body, keyed by a secret kept beside the spool (``adoption-<instance>.key``, 0600) that
never enters the database. At the next start only the open rows whose HMAC checks out
are adopted; the others stay open, unsealed, and are reported (a warning at start
naming how many and the first id): being in no chain, no checkpoint ever signs them.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from storage.chain import content_hash, utc_text
from storage.files import private_file


def load_or_create_secret(path: Path) -> bytes:
    """The adoption secret at ``path``; a new random one when the file is new or empty."""
    if private_file(path) or not path.read_bytes():
        with open(path, "wb") as f:
            f.write(secrets.token_hex(32).encode())
            f.flush()
            os.fsync(f.fileno())
    return path.read_bytes().strip()


def open_mac(secret: bytes, instance: str, row: Mapping[str, Any]) -> str:
    """The HMAC of a write-ahead row's identity and request (see the module docstring)."""
    started = row.get("started_at")
    message = "\n".join(
        (
            instance,
            str(row.get("id")),
            utc_text(started) if isinstance(started, datetime) else "",
            content_hash(row.get("request_body")),
        )
    )
    return hmac.new(secret, message.encode(), hashlib.sha256).hexdigest()


def is_own(secret: bytes, instance: str, row: Mapping[str, Any]) -> bool:
    """Whether this proxy opened the row (its ``open_mac`` checks out)."""
    mac = row.get("open_mac")
    return isinstance(mac, str) and hmac.compare_digest(mac, open_mac(secret, instance, row))
