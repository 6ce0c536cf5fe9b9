"""Keeping every record: concurrency, open records, crashes and database outages.

Real mitmdump processes, a real PostgreSQL server that is stopped and started under
load, ``kill -9`` of the proxy, and SQLite files; the rows are read with plain SQL.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import httpx
import orjson
import pytest
from conftest import BIN, Proxy, Upstream, mitmdump_at_start, new_database, start_proxy, wait_for

from storage.checkpoint import load_or_create_key
from storage.database import open_engine
from storage.schema import exchanges

pytestmark = pytest.mark.e2e


def run_dir(tmp_path, name: str):
    (tmp_path / name).mkdir(exist_ok=True)
    return tmp_path / name


def stream(proxy: Proxy, up: Upstream, scenario: str = "events=3", mock_id: str | None = None) -> tuple[str, bytes]:
    """One llm-stream exchange through the proxy: (mock id, body the client received)."""
    mock_id = mock_id or uuid.uuid4().hex
    body = {"version": "1.0", "stream": True, "model": "mock-model", "messages": [{"role": "user", "content": "hi"}]}
    with proxy.client() as client:
        resp = client.post(
            f"{up.url}/v1/llm/stream",
            content=orjson.dumps(body),
            headers={"content-type": "application/llm-request+json", "x-mock": scenario, "x-mock-id": mock_id},
        )
    return mock_id, resp.content


def statuses(proxy: Proxy, ids: list[str]) -> dict[str, list[str]]:
    """Every row per mock id (a list, to catch duplicates)."""
    out: dict[str, list[str]] = {i: [] for i in ids}
    for row in proxy.rows():
        mock_id = row["request_headers"].get("x-mock-id")
        if mock_id in out:
            out[mock_id].append(row["status"])
    return out


def test_many_concurrent_streams_each_get_exactly_one_complete_row(request, tmp_path, upstreams, backend):
    proxy = start_proxy(tmp_path, **new_database(request, backend, tmp_path))
    try:
        with ThreadPoolExecutor(max_workers=25) as pool:
            ids = [m for m, _ in pool.map(lambda _: stream(proxy, upstreams["h1"], "events=10&delay=0.02"), range(60))]
        wait_for(
            lambda: all(s == ["completed"] for s in statuses(proxy, ids).values()), timeout=30, what="60 completed rows"
        )
        assert len(proxy.rows()) == 60
    finally:
        proxy.process.stop()


def test_two_proxies_write_to_one_postgresql_without_conflicts(request, tmp_path, upstreams, postgres):
    url = postgres.create_database()
    proxies = [
        start_proxy(run_dir(tmp_path, name), "--set", f"llm_audit_instance={name}", db_url=url, pg=postgres)
        for name in ("proxy-a", "proxy-b")
    ]
    try:
        with ThreadPoolExecutor(max_workers=20) as pool:
            ids = [
                m
                for m, _ in pool.map(
                    lambda i: stream(proxies[i % 2], upstreams["h1"], "events=5&delay=0.02"), range(40)
                )
            ]
        wait_for(
            lambda: all(s == ["completed"] for s in statuses(proxies[0], ids).values()),
            timeout=30,
            what="40 completed rows",
        )
        by_instance = {r["proxy_instance"] for r in proxies[0].rows()}
        assert by_instance == {"proxy-a", "proxy-b"}
    finally:
        for p in proxies:
            p.process.stop()


def test_open_record_is_durable_while_the_stream_runs(proxy, upstreams):
    mock_id = uuid.uuid4().hex
    runner = threading.Thread(target=stream, args=(proxy, upstreams["h1"], "events=30&delay=0.1", mock_id))
    runner.start()
    try:
        started = time.monotonic()
        open_row = proxy.mock_row(mock_id, finished=False, timeout=5)
        assert time.monotonic() - started < 2.0
        assert open_row["status"] == "in_progress"
        assert open_row["request_model"] == "mock-model" and open_row["request_body"]["model"] == "mock-model"
        assert open_row["ended_at"] is None
    finally:
        runner.join()
    assert proxy.mock_row(mock_id)["status"] == "completed"


def test_kill_9_marks_open_rows_interrupted_and_keeps_finished_ones(request, tmp_path, upstreams, backend):
    db = new_database(request, backend, tmp_path)
    options = ("--set", "llm_audit_instance=crashy", "--set", f"llm_audit_spool={tmp_path / 'spool.jsonl'}")
    proxy = start_proxy(run_dir(tmp_path, "run1"), *options, **db)
    finished = [stream(proxy, upstreams["h1"], "events=3")[0] for _ in range(5)]
    live = uuid.uuid4().hex

    def doomed():
        with contextlib.suppress(httpx.HTTPError):  # the proxy is killed under this stream
            stream(proxy, upstreams["h1"], "events=100&delay=0.1", live)

    threading.Thread(target=doomed, daemon=True).start()
    proxy.mock_row(live, finished=False, timeout=5)
    time.sleep(1.1)  # the bound: exchanges that ended more than a second before the crash
    proxy.process.stop(signal.SIGKILL)

    restarted = start_proxy(run_dir(tmp_path, "run2"), *options, **db)
    try:
        wait_for(
            lambda: restarted.mock_row(live, finished=False)["status"] == "interrupted",
            timeout=15,
            what="the live row marked interrupted",
        )
        row = restarted.mock_row(live, finished=False)
        assert row["request_model"] == "mock-model" and row["proxy_instance"] == "crashy"
        assert all(s == ["completed"] for s in statuses(restarted, finished).values())
        wait_for(
            lambda: "marked 1 exchanges left open by an earlier run as interrupted" in restarted.process.output,
            what="the interrupted rows logged",
        )
        # the crash broke nothing in the hash chain: the interrupted record is sealed after the finished ones
        assert row["chain_seq"] == 6
        check = subprocess.run(
            [str(BIN / "llm-audit"), "--db", db["db_url"], "verify"], capture_output=True, text=True, timeout=60
        )
        assert (check.returncode, check.stdout) == (0, "chain crashy: OK, records 1..6\n"), check
    finally:
        restarted.process.stop()


def test_postgresql_outage_is_bridged_by_the_spool(tmp_path, upstreams, postgres):
    url = postgres.create_database()
    proxy = start_proxy(tmp_path, "--set", f"llm_audit_spool={tmp_path / 'spool.jsonl'}", db_url=url, pg=postgres)
    up = upstreams["h1"]
    results: list[tuple[str, bytes]] = []
    stop = threading.Event()

    def traffic():
        while not stop.is_set():
            results.append(stream(proxy, up, "events=5&delay=0.05"))

    runner = threading.Thread(target=traffic)
    runner.start()
    try:
        wait_for(lambda: len(results) >= 3, what="traffic before the outage")
        postgres.stop()
        during = len(results)
        wait_for(lambda: len(results) >= during + 8, timeout=30, what="traffic during the outage")
        wait_for(lambda: "spooling to" in proxy.process.output, what="the proxy to spool")
        postgres.start()
        time.sleep(0.5)
    finally:
        stop.set()
        runner.join()
    ids = [mock_id for mock_id, _ in results]
    wait_for(
        lambda: all(s == ["completed"] for s in statuses(proxy, ids).values()),
        timeout=30,
        what=f"{len(ids)} completed rows after the outage",
    )
    for mock_id, body in results:  # the clients never noticed
        assert body == up.sent(mock_id)["body"]
    assert "replayed" in proxy.process.output
    proxy.process.stop()


def test_spool_left_at_shutdown_is_replayed_at_the_next_start(tmp_path, upstreams, postgres):
    url = postgres.create_database()
    options = ("--set", f"llm_audit_spool={tmp_path / 'spool.jsonl'}")
    proxy = start_proxy(run_dir(tmp_path, "run1"), *options, db_url=url, pg=postgres)
    stream(proxy, upstreams["h1"])
    postgres.stop()
    try:
        ids = [stream(proxy, upstreams["h1"])[0] for _ in range(3)]
        assert proxy.process.stop() == 0
        assert "wait in the spool" in proxy.process.output
    finally:
        postgres.start()
    restarted = start_proxy(run_dir(tmp_path, "run2"), *options, db_url=url, pg=postgres)
    try:
        wait_for(
            lambda: all(s == ["completed"] for s in statuses(restarted, ids).values()),
            timeout=20,
            what="spooled rows replayed",
        )
        # the spool is emptied once the whole replay is committed, just after its rows show
        wait_for(lambda: (tmp_path / "spool.jsonl").stat().st_size == 0, timeout=10, what="the spool emptied")
        assert (tmp_path / "spool.jsonl").stat().st_size == 0
    finally:
        restarted.process.stop()


def test_automatic_retention_purges_old_exchanges_daily(request, tmp_path, upstreams, backend):
    db = new_database(request, backend, tmp_path)
    engine = open_engine(db["db_url"])
    now = datetime.now(UTC)
    with engine.begin() as conn:
        for rid, age in (("old", 200), ("young", 100)):
            conn.execute(
                exchanges.insert().values(
                    id=rid,
                    status="completed",
                    dialect="llm-stream",
                    streamed=True,
                    proxy_instance="elsewhere",
                    started_at=now - timedelta(days=age),
                    ended_at=now - timedelta(days=age),
                )
            )
    engine.dispose()
    proxy = start_proxy(tmp_path, "--set", "llm_audit_retention_days=183", "--set", "llm_audit_instance=keeper", **db)
    try:
        wait_for(lambda: {r["id"] for r in proxy.rows()} == {"young"}, timeout=30, what="the old exchange purged")
        log_rows = proxy.sql("SELECT actor, older_than, deleted_count FROM purge_log")
        assert log_rows == [{"actor": "proxy keeper", "older_than": "183d", "deleted_count": 1}]
        wait_for(lambda: "retention purged 1 exchanges" in proxy.process.output, what="the purge logged")
    finally:
        proxy.process.stop()


def test_retention_without_a_usable_signing_key_does_not_run_unsigned(tmp_path):
    """Unsigned, each daily purge read as tampering to verify --checkpoints, forever."""
    key = tmp_path / "key.pem"
    load_or_create_key(key)
    key.chmod(0o644)
    proc = mitmdump_at_start(tmp_path, f"llm_audit_signing_key={key}", "llm_audit_retention_days=183")
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out and "can be read by others (mode 644)" in out
    assert "automatic retention is off: it signs each purge with the checkpoint key" in out


@pytest.mark.parametrize("days", [36_501, 10**9])
def test_retention_past_any_date_is_refused_at_start(tmp_path, days):
    proc = mitmdump_at_start(tmp_path, f"llm_audit_retention_days={days}")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out
    assert f"llm_audit_retention_days={days} is past any date; set it to at most 36500" in out


def test_retention_below_six_months_is_refused_at_start(tmp_path):
    proc = mitmdump_at_start(tmp_path, "llm_audit_retention_days=30")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out
    assert [
        line for line in out.splitlines() if "llm_audit_retention_days=30 would keep logs less than six months" in line
    ]
