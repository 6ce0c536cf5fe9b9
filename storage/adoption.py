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

from sqlalchemy import Connection, select, update

from storage.chain import Chain, content_hash, utc_text
from storage.files import private_file
from storage.schema import IN_PROGRESS, exchanges


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


SEALED_COLUMNS = ("status", "chain_id", "chain_seq", "prev_hash", "record_hash", "content_hashes")


def adopt_interrupted(
    conn: Connection, chain: Chain, secret: bytes, instance: str, started: datetime
) -> tuple[int, list[str]]:
    """Seal into ``chain``, as ``interrupted``, the rows ``instance`` left open before
    ``started`` whose ``open_mac`` checks out; the count sealed and the ids of the open
    rows that are not its own (left as they are)."""
    c = exchanges.c
    open_rows = (
        conn.execute(
            select(exchanges)
            .where(c.status == IN_PROGRESS, c.proxy_instance == instance, c.started_at < started)
            .order_by(c.started_at)
        )
        .mappings()
        .all()
    )
    foreign = [row["id"] for row in open_rows if not is_own(secret, instance, dict(row))]
    adopted = 0
    for row in open_rows:
        if row["id"] in foreign:
            continue
        sealed = chain.seal(dict(row) | {"status": "interrupted"})
        conn.execute(
            update(exchanges)
            .where(c.id == row["id"], c.status == IN_PROGRESS)
            .values({name: sealed[name] for name in SEALED_COLUMNS})
        )
        adopted += 1
    return adopted, foreign
