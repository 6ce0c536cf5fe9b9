"""Signed checkpoints: the heads of the hash chains, kept outside the database.

Whoever can write the database can rebuild a hash chain, but not sign for it: a
checkpoint is a small JSON file stating, for each chain, the number and hash of its last
record at some moment, signed with an Ed25519 key that never enters the database (as
AWS CloudTrail's digest files and Certificate Transparency's signed tree heads do).
``llm-audit verify --checkpoints DIR`` then detects a chain rewritten consistently from
some point on (its record at a checkpointed number no longer has the signed hash) and a
tail removed after a checkpoint (the chain ends before a checkpointed number).

A checkpoint file::

    {"format": "llm-audit-checkpoint/1", "created_at": "2026-11-29T17:00:00.000000Z",
     "key_id": "sha256:…", "chains": {"proxy-a": {"seq": 1200, "hash": "…"}},
     "runs": {"proxy-a": {"since": 1001, "set_aside": [[1107, 1107]]}},
     "signature": "<base64 Ed25519 signature of the canonical JSON of all other fields>"}

A proxy's own checkpoints also say, in ``runs``, the first record it sealed since it
started (``since``) and the records it set aside in that time (ranges of numbers),
quarantined or held in memory while the quarantine file could not be written
(:class:`Checkpointer`): every record from ``since`` to the signed head was written or
set aside by it, so
``verify`` tells a record the ``quarantine`` table says was quarantined there, and no
checkpoint names, as deleted (the table is as writable as the records).

The key is generated on first use (PEM, mode 0600) with its public half next to it
(``.pub``): ship checkpoints and the public key to write-once storage, a git repository
or syslog; keep the private key where database administrators cannot read it.
``cryptography`` comes with mitmproxy.
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import logging
import math
import os
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from storage.chain import Head, utc_text
from storage.files import private_dir

log = logging.getLogger(__name__)

FORMAT = "llm-audit-checkpoint/1"
COMMAND_TIMEOUT = 30  # seconds a checkpoint command may take
MAX_SET_ASIDE_RANGES = 1000  # of one run, that its checkpoints list (Checkpointer)


class CheckpointError(Exception):
    """A key or checkpoint that cannot be used; the message is one line."""


def default_key_path() -> Path:
    """``$XDG_DATA_HOME/llm-audit/signing-key.pem`` (``~/.local/share/...`` by default)."""
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "llm-audit" / "signing-key.pem"


def default_checkpoint_dir() -> Path:
    return default_key_path().parent / "checkpoints"


def public_key_path(key_path: Path) -> Path:
    return key_path.with_name(key_path.name.removesuffix(".pem") + ".pub")


def load_or_create_key(path: Path) -> Ed25519PrivateKey:
    """The signing key at ``path``; a new one (and its ``.pub``) when there is none.

    A key others can read is refused, by the proxy as by the commands: whoever reads it
    can sign a checkpoint over any rewrite, so what it signs would prove nothing."""
    if path.exists():
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            raise CheckpointError(f"the signing key {path} can be read by others (mode {mode:o}): chmod 600 {path}")
        try:
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        except (ValueError, TypeError, OSError) as e:
            raise CheckpointError(f"cannot read the signing key {path}: {e}") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise CheckpointError(f"the signing key {path} is not an Ed25519 key")
        return key
    key = Ed25519PrivateKey.generate()
    private_dir(path.parent)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    fd = os.open(public_key_path(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    os.fchmod(fd, 0o644)  # (whatever the umask or a file there before: a public key others could replace is trusted)
    with os.fdopen(fd, "wb") as f:
        f.write(public)
    return key


def load_key(path: Path, directory: Path, new_folder_new_key: bool = False) -> Ed25519PrivateKey:
    """The signing key at ``path`` for a command that signs into ``directory`` (``checkpoint``,
    ``erase``, ``purge``): refused when others can read it or when ``directory`` already
    holds statements another key signed, and made only when ``new_folder_new_key`` and
    ``directory`` holds nothing signed (``checkpoint`` starting a folder). Made anew
    elsewhere, a key mistyped or left out signed a statement that ``verify`` then
    distrusted (exit 2 from then on), after a purge that cannot be undone; the proxy
    makes its key itself (:func:`load_or_create_key`)."""
    if not path.exists():
        if new_folder_new_key and not _signed_files(directory):
            return load_or_create_key(path)
        raise CheckpointError(
            f"there is no signing key at {path}; pass the key the proxy signs with (llm_audit_signing_key) "
            "with --key FILE"
        )
    key = load_or_create_key(path)
    ours = key_id(key.public_key())
    for signed in _signed_files(directory):
        try:
            theirs = orjson.loads(signed.read_bytes()).get("key_id")
        except (OSError, orjson.JSONDecodeError, AttributeError):
            continue  # (verify names a file that is no statement)
        if theirs is not None and theirs != ours:
            raise CheckpointError(
                f"{signed} is signed by key {theirs}, not by {path} ({ours}): pass the key that signs "
                f"the statements in {directory} with --key FILE, or name another folder with --dir DIR"
            )
    return key


def _signed_files(directory: Path) -> list[Path]:
    """The checkpoints and statements in ``directory`` (none when it does not exist)."""
    return sorted(directory.glob("*.json")) if directory.is_dir() else []


def load_public_key(path: Path) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except (ValueError, TypeError, OSError) as e:
        raise CheckpointError(f"cannot read the public key {path}: {e}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise CheckpointError(f"the public key {path} is not an Ed25519 key")
    return key


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "sha256:" + hashlib.sha256(raw).hexdigest()[:16]


def _signed_part(doc: dict) -> bytes:
    return orjson.dumps({k: v for k, v in doc.items() if k != "signature"}, option=orjson.OPT_SORT_KEYS)


def write_signed(directory: Path, key: Ed25519PrivateKey, prefix: str, doc: dict, now: datetime) -> Path:
    """Sign ``doc`` (adding ``created_at``, ``key_id`` and ``signature``) and write it whole
    to ``directory/<prefix>-<time>.json``; its path. Checkpoints and the signed statements
    of purges and erasures (:mod:`storage.statements`) share this format."""
    doc = dict(doc, created_at=utc_text(now), key_id=key_id(key.public_key()))
    doc["signature"] = base64.b64encode(key.sign(_signed_part(doc))).decode()
    # Folders made here 0700 and the files 0600, whatever the umask: others could delete
    # or drop files there, and an erasure statement names a user.
    private_dir(directory)
    path = directory / f"{prefix}-{now.strftime('%Y%m%dT%H%M%S%fZ')}.json"
    while path.exists():  # two in one microsecond: never overwrite signed evidence
        path = path.with_name(path.stem + "-1.json")
    tmp = path.with_suffix(".tmp")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
        f.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
        f.flush()
        os.fsync(f.fileno())
    tmp.rename(path)  # a signed file is whole or absent
    return path


def write_checkpoint(
    directory: Path,
    key: Ed25519PrivateKey,
    heads: dict[str, Head],
    now: datetime | None = None,
    unvouched: dict[str, tuple[int, int]] | None = None,
    runs: dict[str, Run] | None = None,
) -> Path:
    """Sign the heads and write them to a new file in ``directory``; its path.
    ``unvouched``: per chain, records the signer found in the database but did not write
    (see :class:`Checkpointer`); the checkpoint says so, and ``verify`` reports them.
    ``runs``: per chain, what the proxy that writes it sealed and set aside since it started."""
    now = (now or datetime.now(UTC)).astimezone(UTC)
    doc: dict[str, Any] = {
        "format": FORMAT,
        "chains": {chain: {"seq": head.seq, "hash": head.hash} for chain, head in sorted(heads.items())},
    }
    if unvouched:
        doc["unvouched"] = {chain: {"first": a, "last": b} for chain, (a, b) in sorted(unvouched.items())}
    if runs:
        doc["runs"] = {
            chain: {"since": run.since, "set_aside": [list(span) for span in run.set_aside]}
            for chain, run in sorted(runs.items())
        }
    return write_signed(directory, key, "checkpoint", doc, now)


@dataclass(frozen=True, slots=True)
class Run:
    """What a proxy's checkpoint says of its run: the first record it sealed since it
    started, and the records it set aside since (quarantined, or held in memory while the
    quarantine file could not be written), as sorted ranges of numbers (first, last)."""

    since: int
    set_aside: tuple[tuple[int, int], ...]


def add_to_ranges(ranges: list[tuple[int, int]], seq: int) -> None:
    """Put ``seq`` into ``ranges`` (sorted, disjoint, not adjacent), joining neighbours:
    a database that refuses every row sets aside one range, not a number a record."""
    i = bisect.bisect_right(ranges, (seq, math.inf))  # (after every range that starts at or before it)
    if i and ranges[i - 1][1] >= seq:
        return  # (already in)
    first, last = seq, seq
    if i and ranges[i - 1][1] == seq - 1:
        i -= 1
        first = ranges.pop(i)[0]
    if i < len(ranges) and ranges[i][0] == seq + 1:
        last = ranges.pop(i)[1]
    ranges.insert(i, (first, last))


def merged_ranges(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """``spans`` (first, last) as sorted, disjoint ranges, for :func:`in_ranges`."""
    out: list[tuple[int, int]] = []
    for first, last in sorted(spans):
        if out and first <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], last))
        else:
            out.append((first, last))
    return out


def in_ranges(ranges: Sequence[tuple[int, int]], seq: int) -> bool:
    """Whether ``seq`` is in ``ranges`` (sorted by their first number, disjoint)."""
    i = bisect.bisect_right(ranges, (seq, math.inf))
    return bool(i) and ranges[i - 1][0] <= seq <= ranges[i - 1][1]


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A checkpoint whose signature checked out."""

    path: Path
    created_at: str
    heads: dict[str, Head]
    unvouched: dict[str, tuple[int, int]]  # records its signer found in the database but did not write
    runs: dict[str, Run]  # what its signer, a proxy, sealed and set aside since it started


def trusted(keys: Ed25519PublicKey | Sequence[Ed25519PublicKey]) -> dict[str, Ed25519PublicKey]:
    """The trusted public keys by key id (one key, or several: a key may be rotated)."""
    return {key_id(k): k for k in ([keys] if isinstance(keys, Ed25519PublicKey) else keys)}


def read_signed(
    directory: Path, prefix: str, fmt: str, keys: Ed25519PublicKey | Sequence[Ed25519PublicKey]
) -> list[tuple[Path, dict]]:
    """Every ``<prefix>-*.json`` in ``directory`` whose signature one of ``keys`` checks,
    oldest first; a file that is not one raises :class:`CheckpointError` naming it (a file
    an insider replaced must stop the check, not be skipped)."""
    if not directory.is_dir():
        raise CheckpointError(f"no checkpoint directory {directory}")
    by_id = trusted(keys)
    out = []
    for path in sorted(directory.glob(f"{prefix}-*.json")):
        try:
            doc = orjson.loads(path.read_bytes())
            signature = base64.b64decode(doc["signature"], validate=True)
            if doc.get("format") != fmt:
                raise ValueError(f"format {doc.get('format')!r}")
            public = by_id.get(doc.get("key_id"))
            if public is None:
                raise CheckpointError(
                    f"{path}: signed by key {doc.get('key_id')}, which is not a trusted key (name it with --public-key)"
                )
            public.verify(signature, _signed_part(doc))
            str(doc["created_at"])
        except InvalidSignature:
            raise CheckpointError(f"{path}: the signature does not match (forged, altered, or another key)") from None
        except (ValueError, KeyError, TypeError, AttributeError, orjson.JSONDecodeError) as e:
            raise CheckpointError(f"{path}: not a valid {prefix} file ({e})") from None
        out.append((path, doc))
    return sorted(out, key=lambda item: item[1]["created_at"])


def read_checkpoints(directory: Path, keys: Ed25519PublicKey | Sequence[Ed25519PublicKey]) -> list[Checkpoint]:
    """Every checkpoint in ``directory``, oldest first (see :func:`read_signed`). None at
    all is an error: a check against nothing must not pass for one against checkpoints."""
    out = []
    for path, doc in read_signed(directory, "checkpoint", FORMAT, keys):
        try:
            heads = {chain: Head(int(h["seq"]), str(h["hash"])) for chain, h in doc["chains"].items()}
            unvouched = {chain: (int(u["first"]), int(u["last"])) for chain, u in doc.get("unvouched", {}).items()}
            runs = {
                chain: Run(int(r["since"]), tuple((int(a), int(b)) for a, b in r["set_aside"]))
                for chain, r in doc.get("runs", {}).items()
            }
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"{path}: not a valid checkpoint ({e})") from None
        out.append(Checkpoint(path, doc["created_at"], heads, unvouched, runs))
    if not out:
        raise CheckpointError(
            f"no checkpoints in {directory}: there is nothing to compare the chains with "
            "(name the folder the proxy writes them to)"
        )
    return out


class Checkpointer:
    """The proxy's own checkpoints: its chain's head every ``every`` records or ``seconds``.

    Called by the writer thread with the head of what the database has committed, so a
    checkpoint never names a record that is only in the spool. ``unvouched``: records the
    writer found at the end of its chain in the database at start, after the last head
    it wrote itself (an insider's consistent append, or records committed just before a
    crash): every checkpoint of this run names them, so none signs them in silently.
    ``since`` (the first record the writer seals in this run) and the records it sets
    aside (:meth:`set_aside`: quarantined, or held in memory while the quarantine file
    cannot be written) go in every checkpoint of the run (``runs``): the writer sets a
    record aside before it commits any later one, so a checkpoint of a head past a record
    of this run names it if it was not written. Past :data:`MAX_SET_ASIDE_RANGES` ranges
    (a database that refuses every other row) the run's checkpoints carry no ``runs``
    any more: the earlier ones still vouch for what they covered, and ``verify`` accuses
    none of the later records.
    """

    def __init__(
        self,
        directory: Path,
        key: Ed25519PrivateKey,
        chain_id: str,
        *,
        every: int,
        seconds: float,
        clock=time.monotonic,
        command: Sequence[str] = (),
    ) -> None:
        self.directory, self.key, self.chain_id = directory, key, chain_id
        self.every, self.seconds, self._clock = every, seconds, clock
        self.command = tuple(command)  # run with each checkpoint's path: a copy out of the administrators' reach
        self._signed = Head()  # the head of the last checkpoint
        self.unvouched: tuple[int, int] | None = None
        self.since: int | None = None  # the first record the writer seals in this run (None: runs not said)
        self._set_aside: list[tuple[int, int]] = []  # records of the chain set aside in this run
        self._at = clock()

    def set_aside(self, seq: int) -> None:
        """The writer set record ``seq`` of the chain aside (quarantined or held)."""
        add_to_ranges(self._set_aside, seq)
        if self.since is not None and len(self._set_aside) > MAX_SET_ASIDE_RANGES:
            self.since = None
            log.warning(
                "llm-audit: more than %d ranges of records set aside in this run: its checkpoints no longer "
                "say which (verify checks their quarantine rows against the quarantine file alone)",
                MAX_SET_ASIDE_RANGES,
            )

    def committed(self, head: Head, *, final: bool = False) -> Path | None:
        """The database now holds the chain up to ``head``: write a checkpoint if one is due
        (``final``: whenever anything is new, at shutdown)."""
        new = head.seq - self._signed.seq
        if new <= 0:
            return None
        due = final or (self.every and new >= self.every) or (self.seconds and self._clock() - self._at >= self.seconds)
        if not due:
            return None
        path = write_checkpoint(
            self.directory,
            self.key,
            {self.chain_id: head},
            unvouched={self.chain_id: self.unvouched} if self.unvouched else None,
            runs={self.chain_id: Run(self.since, tuple(self._set_aside))} if self.since is not None else None,
        )
        self._signed, self._at = head, self._clock()
        if self.command:
            self._hand_over(path)
        return path

    def _hand_over(self, path: Path) -> None:
        """Run the checkpoint command with the new file (``logger -t llm-audit -f`` sends it
        to syslog, ``scp`` or an object store's client to a write-once place). On the
        writer thread, never the proxy's event loop; a failure is logged, the checkpoint
        stays in its folder."""
        try:
            done = subprocess.run([*self.command, str(path)], capture_output=True, timeout=COMMAND_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as e:
            log.warning("llm-audit: the checkpoint command failed for %s: %s", path, e)
            return
        if done.returncode != 0:
            detail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
            log.warning("llm-audit: the checkpoint command exited %d for %s: %s", done.returncode, path, detail[0])
