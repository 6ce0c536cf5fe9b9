"""A test addon that injects failures into the audit writer of a real mitmdump.

Loaded with a second ``-s`` by tests/e2e/test_poison_proxy.py. It replaces
``AuditWriter._store`` in the proxy process: a batch holding the record of a request
whose ``x-mock-id`` starts with ``die-`` ends the writer thread (a ``BaseException``, which
no ``except Exception`` catches); one starting with ``fail-`` raises a plain exception.
Each fault fires once per record, so the writer can recover.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from storage.writer import AuditWriter

_real_store = AuditWriter._store
_fired: set[str] = set()


class WriterDeath(BaseException):
    """Ends the writer thread."""


def _faulty_store(self, batch):
    for row in batch:
        mock_id = ((row.get("request_headers") or {}).get("x-mock-id") or "") if isinstance(row, dict) else ""
        if mock_id not in _fired and mock_id.startswith(("die-", "fail-")):
            _fired.add(mock_id)
            if mock_id.startswith("die-"):
                raise WriterDeath(f"injected for {mock_id}")
            raise RuntimeError(f"injected for {mock_id}")
    _real_store(self, batch)


AuditWriter._store = _faulty_store
addons: list = []
