"""Tamper evidence end to end: a real mitmdump seals what it records and signs checkpoints.

The proxy writes a checkpoint every two records and one at shutdown, with a key it
creates on first use; ``llm-audit verify`` with those checkpoints and the key's public
half checks the log, on both backends, and names a tail removed afterwards.
"""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest
from conftest import BIN, ROOT, mitmdump_at_start, new_database, start_proxy
from sqlalchemy import create_engine, text

pytestmark = pytest.mark.e2e


def verify(db_url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "llm-audit"), "--db", db_url, "verify", *args], capture_output=True, text=True, timeout=60
    )


def test_the_proxy_seals_and_signs_and_verify_catches_a_removed_tail(request, tmp_path, upstreams, backend):
    db = new_database(request, backend, tmp_path)
    elsewhere = tmp_path / "write-once"  # where llm_audit_checkpoint_command copies each checkpoint
    elsewhere.mkdir()
    proxy = start_proxy(
        tmp_path,
        "--set",
        "llm_audit_instance=sealer",
        "--set",
        "llm_audit_checkpoint_every=2",
        "--set",
        f"llm_audit_checkpoint_command=cp -t '{elsewhere}'",
        **db,
    )
    try:
        with proxy.client() as client:
            for _ in range(5):
                client.post(
                    f"{upstreams['h1'].url}/v1/llm/stream",
                    content=b'{"version":"1.0","model":"m"}',
                    headers={
                        "content-type": "application/llm-request+json",
                        "x-mock-id": uuid.uuid4().hex,
                        "accept": 'text/event-stream; profile="llm-stream-1.0"',
                    },
                )
    finally:
        assert proxy.process.stop() == 0
    key_dir = tmp_path / "data" / "llm-audit"  # the proxy's $XDG_DATA_HOME (see conftest.start_proxy)
    signed = ["--checkpoints", str(key_dir / "checkpoints"), "--public-key", str(key_dir / "signing-key.pub")]
    assert "checkpoint" in proxy.process.output and (key_dir / "signing-key.pem").stat().st_mode & 0o077 == 0
    written = sorted((key_dir / "checkpoints").glob("checkpoint-*.json"))
    assert written and [p.read_bytes() for p in written] == [p.read_bytes() for p in sorted(elsewhere.iterdir())]

    ok = verify(db["db_url"], *signed)
    assert ok.returncode == 0 and ok.stdout.startswith("chain sealer: OK, records 1..5"), ok

    engine = create_engine(db["db_url"])
    with engine.begin() as conn:  # covering the tracks, as an administrator could
        conn.execute(text("DELETE FROM exchanges WHERE chain_seq = 5"))
        conn.execute(text("UPDATE chains SET head_seq = 4"))
    engine.dispose()
    assert verify(db["db_url"]).returncode == 0  # the chain alone cannot tell
    cut = verify(db["db_url"], *signed)
    assert cut.returncode == 1 and "truncated" in cut.stdout and "records after 4 were removed" in cut.stdout, cut


def test_a_second_proxy_with_an_instance_name_in_use_is_refused_with_one_line(request, tmp_path, backend):
    """Two proxies (each with its own spool, as on two hosts) and one instance name on one
    database would fork the chain: the second is refused at start, naming the fix."""
    db = new_database(request, backend, tmp_path)
    first = start_proxy(tmp_path / "first", "--set", "llm_audit_instance=twin", **db)
    try:
        second = tmp_path / "second"
        proc = subprocess.run(
            [
                str(BIN / "mitmdump"),
                "--listen-host",
                "127.0.0.1",
                "--listen-port",
                "0",
                "--set",
                f"confdir={second / 'mitm'}",
                "-s",
                str(ROOT / "addon" / "llm_audit.py"),
                "--set",
                f"llm_audit_db={db['db_url']}",
                "--set",
                "llm_audit_instance=twin",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=os.environ | {"XDG_STATE_HOME": str(second / "state"), "XDG_DATA_HOME": str(second / "data")},
        )
    finally:
        assert first.process.stop() == 0
    out = proc.stdout + proc.stderr
    lines = [line for line in out.splitlines() if "records into this database as instance 'twin'" in line]
    assert proc.returncode != 0 and len(lines) == 1 and "--set llm_audit_instance=NAME" in lines[0], out
    assert "Traceback" not in out


def test_a_signing_key_others_can_read_stops_the_proxy_at_start_with_one_line(tmp_path):
    """Whoever reads the key can sign a checkpoint over any rewrite: the proxy, like the
    commands, refuses it, with one error line naming the fix (mitmproxy exits on an error
    at start, as it does for a key it cannot read)."""
    from storage.checkpoint import load_or_create_key

    key = tmp_path / "signing-key.pem"
    load_or_create_key(key)
    key.chmod(0o644)
    proc = mitmdump_at_start(tmp_path, f"llm_audit_signing_key={key}")
    out = proc.stdout + proc.stderr
    lines = [line for line in out.splitlines() if "can be read by others" in line]
    assert proc.returncode != 0 and len(lines) == 1 and f"chmod 600 {key}" in lines[0], out
    assert "Traceback" not in out
