"""Shared fixtures: real processes (mock upstream, mitmdump with the addon) and clients.

Nothing here is mocked: the end-to-end tests start ``python -m mockllm`` (HTTP/1.1
plain, and HTTPS with HTTP/2) and ``mitmdump -s addon/llm_audit.py`` as subprocesses,
talk to them with httpx through the proxy, and read the audit database with plain SQL.
"""

from __future__ import annotations

import base64
import os
import re
import signal
import sqlite3
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SHARED = ROOT.parent / "shared"


def wait_for(predicate, timeout: float = 15.0, interval: float = 0.05, what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@dataclass
class Process:
    """A subprocess whose combined output is collected in the background."""

    proc: subprocess.Popen
    lines: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, args: list[str], **kwargs) -> Process:
        proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, **kwargs
        )
        p = cls(proc)
        threading.Thread(target=p._pump, daemon=True).start()
        return p

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_line(self, pattern: str, timeout: float = 20.0) -> re.Match:
        rx = re.compile(pattern)

        def find():
            if self.proc.poll() is not None and not any(rx.search(line) for line in self.lines):
                raise AssertionError(f"process exited ({self.proc.returncode}):\n{self.output}")
            return next((m for line in self.lines if (m := rx.search(line))), None)

        return wait_for(find, timeout, what=f"{pattern!r} in output:\n{self.output}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


# -- the mock upstream ----------------------------------------------------------------------


@dataclass
class Upstream:
    url: str
    ca: Path | None
    process: Process

    def sent(self, mock_id: str) -> dict:
        """What the mock wrote for the request with ``x-mock-id: mock_id`` ({} if unknown)."""
        return self._mock_info("sent", mock_id)

    def received(self, mock_id: str) -> dict:
        """The request the mock received with ``x-mock-id: mock_id`` ({} if unknown)."""
        return self._mock_info("requests", mock_id)

    def _mock_info(self, kind: str, mock_id: str) -> dict:
        with httpx.Client(verify=self._verify()) as c:
            resp = c.get(f"{self.url}/_mock/{kind}/{mock_id}")
        if resp.status_code == 404:
            return {}
        info = resp.json()
        info["body"] = base64.b64decode(info["body_b64"])
        return info

    def _verify(self):
        return ssl.create_default_context(cafile=str(self.ca)) if self.ca else True


def start_upstream(tmp: Path, tls: bool) -> Upstream:
    ready = tmp / f"mock-{'tls' if tls else 'plain'}.url"
    args = [str(BIN / "python"), "-m", "mockllm", "--host", "127.0.0.1", "--port", "0", "--ready-file", str(ready)]
    if tls:
        args += ["--tls", "--cert-dir", str(tmp / "mock-certs")]
    process = Process.start(args)
    wait_for(ready.exists, what=f"mock-llm to start:\n{process.output}")
    return Upstream(ready.read_text().strip(), tmp / "mock-certs" / "ca.pem" if tls else None, process)


@pytest.fixture(scope="session")
def upstreams(tmp_path_factory) -> Iterator[dict[str, Upstream]]:
    """One plain HTTP/1.1 and one HTTPS (HTTP/2 + HTTP/1.1) mock upstream for the session."""
    tmp = tmp_path_factory.mktemp("upstream")
    ups = {"h1": start_upstream(tmp, tls=False), "h2": start_upstream(tmp, tls=True)}
    yield ups
    for up in ups.values():
        up.process.stop()


# -- the proxy ------------------------------------------------------------------------------------


@dataclass
class Proxy:
    url: str
    db_path: Path
    confdir: Path
    process: Process

    @property
    def ca(self) -> Path:
        return self.confdir / "mitmproxy-ca-cert.pem"

    def client(self, http2: bool = False, **kwargs) -> httpx.Client:
        """An httpx client that goes through the proxy and trusts its CA."""
        ctx = ssl.create_default_context(cafile=str(self.ca))
        return httpx.Client(proxy=self.url, verify=ctx, http2=http2, timeout=30, **kwargs)

    def rows(self, where: str = "1=1", params: tuple = ()) -> list[dict]:
        """Rows of ``exchanges`` read with plain SQL, as a user would."""
        con = sqlite3.connect(self.db_path)
        con.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in con.execute(f"SELECT * FROM exchanges WHERE {where}", params)]
        except sqlite3.OperationalError:
            return []
        finally:
            con.close()

    def mock_row(self, mock_id: str, timeout: float = 15.0) -> dict:
        """Wait for the record of the exchange sent with ``x-mock-id: mock_id``."""
        rows = wait_for(
            lambda: self.rows("json_extract(request_headers, '$.\"x-mock-id\"') = ?", (mock_id,)),
            timeout, what=f"row for x-mock-id {mock_id}:\n{self.process.output[-3000:]}",
        )
        assert len(rows) == 1, rows
        return rows[0]

    def row(self, request_id: str, timeout: float = 15.0) -> dict:
        """Wait for the record of the exchange whose request carries ``request_id``."""
        rows = wait_for(
            lambda: self.rows("request_id = ?", (request_id,)), timeout, what=f"row for {request_id}:\n{self.process.output[-3000:]}"
        )
        assert len(rows) == 1, rows
        return rows[0]


def start_proxy(tmp: Path, *args: str, upstream_ca: Path | None = None, db_path: Path | None = None,
                launcher: list[str] | None = None, env: dict[str, str] | None = None) -> Proxy:
    """Start mitmdump with the addon (or ``launcher``, e.g. ``scripts/proxy``) on a free port.

    ``db_path=None`` records to ``tmp/audit.db``; pass the default location's path with
    ``args`` lacking ``llm_audit_db`` to test the default.
    """
    confdir = tmp / "mitm"
    if db_path is None:
        db_path = tmp / "audit.db"
        args = ("--set", f"llm_audit_db=sqlite:///{db_path}", *args)
    cmd = launcher or [str(BIN / "mitmdump"), "--listen-host", "127.0.0.1", "-s", str(ROOT / "addon" / "llm_audit.py")]
    cmd = [*cmd, "--listen-port", "0", "--set", f"confdir={confdir}", *args]
    if upstream_ca:
        cmd += ["--set", f"ssl_verify_upstream_trusted_ca={upstream_ca}"]
    process = Process.start(cmd, env=os.environ | {"PYTHONUNBUFFERED": "1"} | (env or {}))
    m = process.wait_line(r"proxy listening at .*:(\d+)", timeout=120)
    return Proxy(f"http://127.0.0.1:{m.group(1)}", db_path, confdir, process)


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, upstreams) -> Iterator[Proxy]:
    """A mitmdump with the addon, shared by a test module, recording to SQLite."""
    p = start_proxy(tmp_path_factory.mktemp("proxy"), upstream_ca=upstreams["h2"].ca)
    yield p
    p.process.stop()
