"""No credential reaches the database, its WAL, the spool, the checkpoints or the proxy's output.

A real mitmdump records exchanges that carry credentials in every header and query
parameter the issue names (and keys recognised by the ``secrets`` detector under names
that say nothing); while the SQLite database is locked the records go to the spool.
Then every file the proxy wrote, and everything it printed (at ``flow_detail`` 1 and 3),
is searched for the secret bytes.
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from pathlib import Path

import orjson
import pytest
from conftest import start_proxy, wait_for

pytestmark = pytest.mark.e2e

OPENAI_KEY = "sk-proj-" + "A1b2C3d4E5" * 7 + "Abcd" + "T3BlbkFJ" + "Z9y8X7w6V5" * 7 + "Wxyz"
HEADERS = (
    "ocp-apim-subscription-key",
    "cf-aig-authorization",
    "x-functions-key",
    "authorization",
    "x-api-key",
    "x-goog-api-key",
    "api-key",
    "x-amz-security-token",
    "cookie",
)
PARAMS = ("api-key", "sig", "key", "code", "access_token")


def secrets_for(tag: str) -> dict[str, str]:
    """One distinct secret per header and parameter name, findable by grep."""
    return {name: f"SeCrEt{tag}{i:02d}{uuid.uuid4().hex}" for i, name in enumerate((*HEADERS, *PARAMS))}


def send(proxy, url: str, secrets: dict[str, str]) -> str:
    mock_id = uuid.uuid4().hex
    headers = {name: secrets[name] for name in HEADERS}
    headers["authorization"] = f"Bearer {secrets['authorization']}"
    headers |= {
        "x-innocent-name": f"prefix {OPENAI_KEY} suffix",
        "content-type": "application/llm-request+json",
        "x-mock-id": mock_id,
    }
    query = "&".join(f"{name}={secrets[name]}" for name in PARAMS)
    body = {"version": "1.0", "stream": True, "model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with proxy.client() as client:
        assert (
            client.post(f"{url}/v1/llm/stream?{query}", content=orjson.dumps(body), headers=headers).status_code == 200
        )
    return mock_id


def assert_nothing_leaks(tmp_path: Path, secrets: dict[str, str], must_hold: list[Path]) -> list[Path]:
    """No file the proxy wrote holds a secret; returns the files searched."""
    written = [p for p in tmp_path.rglob("*") if p.is_file() and "mitm" not in p.parts]
    assert set(must_hold) <= set(written), written
    for path in written:
        data = path.read_bytes()
        leaked = [name for name, secret in secrets.items() if secret.encode() in data]
        assert leaked == [] and OPENAI_KEY.encode() not in data, (path, leaked)
    return written


@pytest.mark.parametrize("flow_detail", ["1", "3"])
def test_no_credential_is_stored_spooled_signed_or_printed(tmp_path, upstreams, flow_detail):
    db = tmp_path / "audit.db"
    spool = tmp_path / "spool.jsonl"
    proxy = start_proxy(
        tmp_path,
        "--set",
        f"flow_detail={flow_detail}",
        "--set",
        f"llm_audit_spool={spool}",
        "--set",
        "llm_audit_checkpoint_every=1",
    )
    url = upstreams["h1"].url
    stored, spooled = secrets_for("db"), secrets_for("spool")
    try:
        first = send(proxy, url, stored)
        row = proxy.mock_row(first)
        assert row["api_key_fingerprint"].startswith("sha256:")
        for name in HEADERS:
            assert row["request_headers"][name].startswith("[redacted sha256:"), name
        assert row["request_headers"]["x-innocent-name"].startswith("[redacted sha256:")
        assert "key=" in row["url_query"] and "SeCrEt" not in row["url_query"]

        lock = sqlite3.connect(db, isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")  # the writer cannot write: records go to the spool
        try:
            second = send(proxy, url, spooled)
            wait_for(
                lambda: spool.exists() and second.encode() in spool.read_bytes(), timeout=90, what="the record spooled"
            )
            spool_bytes = spool.read_bytes()
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        proxy.mock_row(second, timeout=90)  # replayed once the database is free again
        assert_nothing_leaks(tmp_path, {**stored, **spooled}, must_hold=[db, Path(f"{db}-wal")])  # WAL and all
    finally:
        proxy.process.stop()
    assert "SeCrEt" not in spool_bytes.decode("utf-8", "replace") and OPENAI_KEY.encode() not in spool_bytes
    written = assert_nothing_leaks(tmp_path, {**stored, **spooled}, must_hold=[db])
    assert any(p.name.startswith("checkpoint") for p in written), written
    output = proxy.process.output
    assert "/v1/llm/stream" in output  # the flow lines are there...
    assert "SeCrEt" not in output and OPENAI_KEY not in output  # ...without a credential


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_prompt_files_are_private_whatever_the_umask(tmp_path, upstreams):
    """With umask 022 the database, its WAL and SHM, the spool and their folders are
    created owner-only; an existing database others can read is warned about."""
    old = os.umask(0o022)
    try:
        proxy = start_proxy(tmp_path, set_db=False, db_url=f"sqlite:///{tmp_path / 'data' / 'llm-audit' / 'audit.db'}")
        try:
            proxy.mock_row(send(proxy, upstreams["h1"].url, secrets_for("modes")))
            db = proxy.db_path
            files = [db, Path(f"{db}-wal"), Path(f"{db}-shm"), *(tmp_path / "state" / "llm-audit").glob("spool-*")]
            assert len(files) == 4 and {p: mode(p) for p in files} == dict.fromkeys(files, 0o600)
            folders = [db.parent, db.parent.parent, tmp_path / "state" / "llm-audit"]
            assert {p: mode(p) for p in folders} == dict.fromkeys(folders, 0o700)
        finally:
            proxy.process.stop()
        os.chmod(db, 0o644)
        again = start_proxy(tmp_path / "data", set_db=True, db_url=f"sqlite:///{db}")
        try:
            again.process.wait_line(
                r"audit\.db holds prompts and is readable by other users \(mode 0644\); "
                r"restrict it with: chmod 600 "
            )
        finally:
            again.process.stop()
    finally:
        os.umask(old)
