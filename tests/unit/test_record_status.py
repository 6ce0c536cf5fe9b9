"""The record is the only writer of its status and error: ``block()``, ``fail()`` and
``finish()`` set them, and the values stored are the strings the database has always held."""

from __future__ import annotations

import ast
from pathlib import Path

from addon.record import OUTCOME_COMPLETE, OUTCOME_UPSTREAM_ABORTED, ExchangeRecord, Status

ROOT = Path(__file__).resolve().parents[2]
SETTLED = ("status", "error_code", "error_message")


def test_the_statuses_are_the_stored_strings():
    assert [s.value for s in Status] == [
        "in_progress",
        "completed",
        "failed",
        "blocked",
        "client_aborted",
        "upstream_aborted",
    ]


def test_the_row_holds_the_plain_string():
    record = ExchangeRecord(dialect="openai-chat", http_status=200, terminal_seen=True)
    record.finish(OUTCOME_COMPLETE)
    row = record.to_row()
    assert row["status"] == "completed" and type(row["status"]) is str


def test_a_failure_the_proxy_saw_settles_as_failed_with_its_code():
    record = ExchangeRecord(dialect="openai-chat")
    record.fail("upstream_error", "Connection refused")
    record.finish(OUTCOME_UPSTREAM_ABORTED)
    assert (record.status, record.error_code, record.error_message) == (
        Status.FAILED,
        "upstream_error",
        "Connection refused",
    )


def test_a_blocked_exchange_stays_blocked_whatever_fails_after():
    record = ExchangeRecord(dialect="openai-chat", http_status=200)
    record.block("blocked by rule x")
    record.fail("response_refused", "mitmproxy refused it")
    record.finish(OUTCOME_UPSTREAM_ABORTED)
    assert record.status == Status.BLOCKED


def test_no_module_but_the_record_writes_a_record_s_status_or_error():
    """Read with ast: an assignment to ``<something>.status`` (or ``error_code``,
    ``error_message``) other than ``self.`` anywhere in the proxy's code."""
    writers = []
    for path in sorted((ROOT / "addon").rglob("*.py")):
        if path == ROOT / "addon" / "record.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AugAssign | ast.AnnAssign)
                else []
            )
            for target in targets:
                for item in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if (
                        isinstance(item, ast.Attribute)
                        and item.attr in SETTLED
                        and not (isinstance(item.value, ast.Name) and item.value.id == "self")
                    ):
                        writers.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not writers, f"only addon/record.py sets a record's status and error: {writers}"
