"""Nothing silences or starves the recorder, end to end through a real mitmdump.

Request bodies nested 254, 1,000 and 5,000 levels deep, a spool with unreadable lines
at start, and faults injected into the writer thread of the proxy process (a test addon,
tests/e2e/addons/writer_faults.py). After each, the exchanges that follow are all
recorded, and ``llm-audit verify`` is clean or names the quarantined record.
"""

from __future__ import annotations

import subprocess
import uuid

import orjson
import pytest
from conftest import BIN, ROOT, Proxy, new_database, start_proxy, wait_for

from storage.chain import Chain, Head
from storage.prepare import prepare

pytestmark = pytest.mark.e2e


def send(proxy: Proxy, url: str, body: bytes, mock_id: str | None = None) -> str:
    """One llm-stream exchange with this request body; its mock id."""
    mock_id = mock_id or uuid.uuid4().hex
    with proxy.client() as client:
        resp = client.post(
            f"{url}/v1/llm/stream",
            content=body,
            headers={"content-type": "application/llm-request+json", "x-mock": "events=3", "x-mock-id": mock_id},
        )
    assert resp.status_code == 200, resp.text
    return mock_id


def plain(proxy: Proxy, url: str, mock_id: str | None = None) -> str:
    return send(
        proxy, url, b'{"version":"1.0","stream":true,"model":"m","messages":[{"role":"user","content":"hi"}]}', mock_id
    )


def verify(db_url: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "llm-audit"), "--db", db_url, "verify"], capture_output=True, text=True, timeout=60
    )


def deep(depth: int) -> bytes:
    return (
        b'{"version":"1.0","stream":true,"model":"m","messages":[{"role":"user","content":"hi"}],"metadata":'
        + b'{"x":' * depth
        + b"1"
        + b"}" * depth
        + b"}"
    )


@pytest.mark.parametrize("depth", [254, 1000, 5000])
def test_deeply_nested_request_bodies_are_recorded_and_later_exchanges_too(proxy, upstreams, depth):
    up = upstreams["h1"]
    deep_id = send(proxy, up.url, deep(depth))
    later = [plain(proxy, up.url) for _ in range(3)]
    row = proxy.mock_row(deep_id)
    assert row["status"] == "completed"
    body = row["request_body"]
    text = body if isinstance(body, str) else orjson.dumps(body).decode()
    assert text.count('{"x":') == depth or orjson.dumps(body).count(b'{"x":') == depth
    for mock_id in later:
        assert proxy.mock_row(mock_id)["status"] == "completed"
    check = verify(proxy.db_url)
    assert check.returncode == 0 and "TAMPERED" not in check.stdout, check


def run_dir(tmp_path, name: str):
    (tmp_path / name).mkdir(exist_ok=True)
    return tmp_path / name


def test_a_poisoned_spool_at_start_is_quarantined_and_named(request, tmp_path, upstreams, backend):
    db = new_database(request, backend, tmp_path)
    spool = tmp_path / "spool.jsonl"
    instance = "poisoned"
    chain = Chain(instance, Head())
    sealed = [chain.seal(prepare(_row(instance), postgres=True).row) for _ in range(3)]
    lines = [orjson.dumps(r) for r in sealed]
    spool.write_bytes(lines[0] + b"\n" + lines[1][:150] + b"\n" + b"not json at all\n" + lines[2] + b"\n")
    proxy = start_proxy(tmp_path, "--set", f"llm_audit_spool={spool}", "--set", f"llm_audit_instance={instance}", **db)
    try:
        proxy.process.wait_line(r"record 2 of chain poisoned is quarantined in .*quarantine-poisoned\.jsonl")
        later = [plain(proxy, upstreams["h1"].url) for _ in range(3)]
        for mock_id in later:
            assert proxy.mock_row(mock_id)["chain_seq"] > 3
        assert {r["id"] for r in proxy.rows()} >= {sealed[0]["id"], sealed[2]["id"]}
    finally:
        assert proxy.process.stop() == 0
    assert (
        "llm-audit: 5 audit records written, 0 wait in the spool, 2 quarantined, 0 held in memory"
        in proxy.process.output
    )
    assert len(proxy.sql("SELECT * FROM quarantine")) == 2
    check = verify(db["db_url"])
    assert check.returncode == 3, check  # (the torn line cannot vouch for its record: named, not passed)
    assert f"record 2 of chain {instance} is quarantined in {tmp_path / 'quarantine-poisoned.jsonl'}" in check.stdout
    assert "NOT CHECKED: its line cannot be read back as a record (torn or reduced)" in check.stdout


def _row(instance: str) -> dict:
    from datetime import UTC, datetime

    return {
        "id": uuid.uuid4().hex,
        "status": "completed",
        "dialect": "llm-stream",
        "streamed": True,
        "proxy_instance": instance,
        "started_at": datetime.now(UTC),
        "ended_at": datetime.now(UTC),
        "output_text": "spooled earlier",
        "request_headers": {"x-mock-id": uuid.uuid4().hex},
    }


def test_writer_faults_in_the_proxy_lose_nothing(request, tmp_path, upstreams, backend):
    db = new_database(request, backend, tmp_path)
    proxy = start_proxy(
        tmp_path,
        "-s",
        str(ROOT / "tests" / "e2e" / "addons" / "writer_faults.py"),
        "--set",
        "llm_audit_instance=faulty",
        **db,
    )
    up = upstreams["h1"]
    try:
        ids = [plain(proxy, up.url)]
        ids.append(plain(proxy, up.url, f"fail-{uuid.uuid4().hex}"))
        ids.append(plain(proxy, up.url))
        ids.append(plain(proxy, up.url, f"die-{uuid.uuid4().hex}"))
        proxy.process.wait_line(r"the writer thread stopped: WriterDeath: injected")
        ids += [plain(proxy, up.url) for _ in range(5)]
        proxy.process.wait_line(r"the writer thread died \(WriterDeath: injected for die-\w+\); starting a new one")
        for mock_id in ids:
            assert proxy.mock_row(mock_id)["status"] == "completed"

        def status() -> subprocess.CompletedProcess:
            return subprocess.run(
                [
                    str(BIN / "llm-audit"),
                    "status",
                    "--spool-dir",
                    str(tmp_path / "state" / "llm-audit"),
                    "--instance",
                    "faulty",
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )

        flowing = wait_for(
            lambda: (r := status()).returncode == 0 and "records flow; 9 written" in r.stdout and r,
            what="llm-audit status: records flow, 9 written",
        )
        assert flowing.stdout.count("\n") == 1
    finally:
        assert proxy.process.stop() == 0
    assert "the writer failed (RuntimeError: injected for fail-" in proxy.process.output
    assert (
        "llm-audit: 9 audit records written, 0 wait in the spool, 0 quarantined, 0 held in memory"
        in proxy.process.output
    )
    check = verify(db["db_url"])
    assert (check.returncode, check.stdout) == (0, "chain faulty: OK, records 1..9\n"), check
