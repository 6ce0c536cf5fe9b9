"""Signed statements of erasures and purges: the evidence that a record was erased, or a
chain's start moved, by someone holding the signing key.

An erasure replaces a record's content and a purge removes a chain's first records; in
the database alone both look exactly like an insider's edits (``erased_at`` set, or
``chains.start_seq`` moved). So ``llm-audit erase`` and ``llm-audit purge`` sign what
they do, in the checkpoint format (:func:`storage.checkpoint.write_signed`), into the
checkpoint folder, before they commit (a statement of an erasure that then failed names
records that are not erased: harmless; an erasure without its statement would be
indistinguishable from tampering)::

    {"format": "llm-audit-erasure/1", "user_id": "alice", "created_at": "…", "key_id": "…",
     "records": {"proxy-a": [[12, "<record_hash>"], …]}, "signature": "…"}
    {"format": "llm-audit-purge/1", "cutoff": "2026-05-01T00:00:00.000000Z", "created_at": "…",
     "key_id": "…", "chains": {"proxy-a": {"seq": 501, "prev_hash": "…"}}, "signature": "…"}

``verify --checkpoints`` reads them (:func:`read_statements`) and accepts an erased record
only when a statement names its number and hash, and a chain start above 1 only when a
purge statement moved it there with a cut-off at least :data:`MIN_RETENTION` before the
statement was signed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from storage.chain import utc_text
from storage.checkpoint import CheckpointError, load_key, read_signed, write_signed

#: The least a purge may keep (the EU AI Act's six months): a purge statement signed
#: with a cut-off closer to its own time is reported by ``verify`` (a ``--force`` purge).
MIN_RETENTION = timedelta(days=183)

ERASURE_FORMAT = "llm-audit-erasure/1"
PURGE_FORMAT = "llm-audit-purge/1"


@dataclass(frozen=True, slots=True)
class Signer:
    """Where statements go and the key that signs them."""

    directory: Path
    key: Ed25519PrivateKey

    @classmethod
    def load(cls, directory: Path, key_path: Path) -> Signer:
        """The signer of ``directory`` with the key at ``key_path`` (:func:`~storage.checkpoint.load_key`)."""
        return cls(directory, load_key(key_path, directory))

    def erasure(self, user_id: str, records: Sequence[tuple[str, int, str]], now: datetime) -> Path:
        """Sign the erasure of ``records`` (chain id, number, record hash)."""
        by_chain: dict[str, list[list]] = {}
        for chain_id, seq, digest in records:
            by_chain.setdefault(chain_id, []).append([seq, digest])
        doc = {"format": ERASURE_FORMAT, "user_id": user_id, "records": by_chain}
        return self._write("erasure", doc, now)

    def purge(self, cutoff: datetime, starts: dict[str, dict[str, object]], now: datetime) -> Path:
        """Sign a purge: its cut-off and where each chain now begins."""
        doc = {"format": PURGE_FORMAT, "cutoff": utc_text(cutoff), "chains": starts}
        return self._write("purge", doc, now)

    def _write(self, prefix: str, doc: dict, now: datetime) -> Path:
        try:
            return write_signed(self.directory, self.key, prefix, doc, now)
        except OSError as e:
            raise CheckpointError(
                f"cannot write the signed {prefix} statement in {self.directory} ({e.strerror}); "
                "nothing was changed: name a writable folder with --dir DIR"
            ) from None


@dataclass(frozen=True, slots=True)
class SignedStart:
    """A chain start a signed purge statement set."""

    seq: int
    prev_hash: str
    cutoff: str
    created_at: str
    file: str


@dataclass(slots=True)
class Statements:
    """The signed erasures and purges of a checkpoint folder."""

    # chain -> number -> (record hash, the user id the erasure was of)
    erased: dict[str, dict[int, tuple[str, str]]] = field(default_factory=dict)
    starts: dict[str, list[SignedStart]] = field(default_factory=dict)  # chain -> starts, oldest first


def read_statements(directory: Path, keys: Ed25519PublicKey | Sequence[Ed25519PublicKey]) -> Statements:
    """Every erasure and purge statement in ``directory`` a trusted key signed; a file
    that is not one stops the check (:class:`CheckpointError`), as for checkpoints."""
    out = Statements()
    for path, doc in read_signed(directory, "erasure", ERASURE_FORMAT, keys):
        try:
            user_id = str(doc["user_id"])
            for chain_id, records in doc["records"].items():
                out.erased.setdefault(chain_id, {}).update(
                    {int(seq): (str(digest), user_id) for seq, digest in records}
                )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"{path}: not a valid erasure statement ({e})") from None
    for path, doc in read_signed(directory, "purge", PURGE_FORMAT, keys):
        try:
            datetime.fromisoformat(str(doc["cutoff"]))  # compared with the floor by verify
            for chain_id, start in doc["chains"].items():
                out.starts.setdefault(chain_id, []).append(
                    SignedStart(
                        int(start["seq"]), str(start["prev_hash"]), str(doc["cutoff"]), doc["created_at"], path.name
                    )
                )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"{path}: not a valid purge statement ({e})") from None
    return out
