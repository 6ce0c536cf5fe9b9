"""``llm-audit serve`` as a person uses it: the real server process, and a real browser.

- The console script refuses to start without a password, or with a password file
  others can read, in one line; it serves the pages on a real socket, and logs each
  access (who, which page) but never what the page showed.
- Headless Chromium (Debian's ``chromium``, found as ``test_mitmproxy_ui`` finds it),
  driven over its DevTools protocol, logs in through the form, opens the list, filters
  it through the form, opens an exchange from the list and takes a screenshot; what a
  person sees is read from the page (``document.body.innerText``).
"""

from __future__ import annotations

import base64
import itertools
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from conftest import BIN, Process, wait_for
from review_data import HOSTILE, fill
from test_mitmproxy_ui import chromium, free_port
from websockets.sync.client import connect

pytestmark = pytest.mark.e2e

PASSWORD = "a long enough test password"


@pytest.fixture(scope="module")
def db_url(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("review-e2e")
    url = f"sqlite:///{folder / 'audit.db'}"
    fill(url, folder)
    return url


def environ(**more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LLM_AUDIT_DB", "LLM_AUDIT_SERVE_PASSWORD")}
    return env | {"PYTHONUNBUFFERED": "1"} | more


@pytest.fixture(scope="module")
def server(db_url) -> Iterator[tuple[str, Process]]:
    port = free_port()
    process = Process.start(
        [str(BIN / "llm-audit"), "--db", db_url, "serve", "--listen", f"127.0.0.1:{port}"],
        env=environ(LLM_AUDIT_SERVE_PASSWORD=PASSWORD),
    )
    try:
        process.wait_line(rf"at http://127\.0\.0\.1:{port}/", timeout=60)
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: _answers(base), timeout=30, what="the review server")
        yield base, process
    finally:
        process.stop()


def _answers(base: str) -> bool:
    try:
        return httpx.get(f"{base}/login", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def test_serve_refuses_to_start_without_a_password_or_with_a_readable_file(db_url, tmp_path):
    done = subprocess.run(
        [str(BIN / "llm-audit"), "--db", db_url, "serve"], capture_output=True, text=True, timeout=60, env=environ()
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "no password: set LLM_AUDIT_SERVE_PASSWORD" in done.stderr
    readable = tmp_path / "password"
    readable.write_text(PASSWORD + "\n")
    readable.chmod(0o640)
    done = subprocess.run(
        [str(BIN / "llm-audit"), "--db", db_url, "serve", "--password-file", str(readable)],
        capture_output=True,
        text=True,
        timeout=60,
        env=environ(),
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert f"chmod 600 {readable}" in done.stderr


def test_the_server_listens_on_loopback_by_default():
    done = subprocess.run([str(BIN / "llm-audit"), "serve", "--help"], capture_output=True, text=True, timeout=60)
    assert "default: 127.0.0.1:8765, loopback only" in " ".join(done.stdout.split())


def test_pages_over_a_real_socket_and_the_access_log(server):
    base, process = server
    with httpx.Client(base_url=base) as client:
        assert client.get("/exchanges/alice-1").status_code == 303
        login = client.post("/login", data={"name": "rita", "password": PASSWORD, "next": "/exchanges/alice-1"})
        assert login.status_code == 303
        page = client.get("/exchanges/alice-1?contains=secret-search")
        assert page.status_code == 200 and "Paris is the capital." in page.text
        assert page.headers["cache-control"] == "no-store" and "server" not in page.headers
    line = wait_for(
        lambda: next((x for x in process.lines if "GET /exchanges/alice-1 200" in x), None), what="the access line"
    )
    assert "127.0.0.1 rita GET /exchanges/alice-1 200" in line
    assert any("127.0.0.1 - GET /exchanges/alice-1 303" in x for x in process.lines)  # before logging in
    assert "Paris" not in process.output and "secret-search" not in process.output and PASSWORD not in process.output


def test_it_answers_on_the_loopback_address_it_listens_on(db_url):
    port = free_port()
    process = Process.start(
        [str(BIN / "llm-audit"), "--db", db_url, "serve", "--listen", f"127.0.0.2:{port}"],
        env=environ(LLM_AUDIT_SERVE_PASSWORD=PASSWORD),
    )
    try:
        process.wait_line(rf"at http://127\.0\.0\.2:{port}/", timeout=60)
        base = f"http://127.0.0.2:{port}"
        wait_for(lambda: _answers(base), timeout=30, what="the review server on 127.0.0.2")
        assert httpx.get(f"{base}/login", headers={"host": "evil.example"}).status_code == 400
    finally:
        process.stop()


# -- a real browser ---------------------------------------------------------------------------------


class DevTools:
    """A headless Chromium page driven over the DevTools protocol (one WebSocket, one page)."""

    def __init__(self, browser: str, profile: Path) -> None:
        port = free_port()
        args = [
            browser,
            "--headless",
            "--disable-gpu",
            f"--user-data-dir={profile}",
            f"--remote-debugging-port={port}",
            "--window-size=1280,1000",
            "about:blank",
        ]
        if os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        targets = wait_for(lambda: self._pages(port), timeout=60, interval=0.2, what="Chromium's DevTools")
        self._connection = connect(targets[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=30)
        self.ws = self._connection.__enter__()
        self._ids = itertools.count(1)

    @staticmethod
    def _pages(port: int) -> list[dict[str, Any]] | None:
        try:
            found = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=2).json()
        except (httpx.TransportError, ValueError):
            return None
        return [t for t in found if t.get("type") == "page"] or None

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        id = next(self._ids)
        self.ws.send(orjson.dumps({"id": id, "method": method, "params": params}).decode())
        while True:
            message = orjson.loads(self.ws.recv(timeout=60))
            if message.get("id") == id:
                assert "error" not in message, message
                return message.get("result", {})

    def evaluate(self, expression: str) -> Any:
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def loaded(self, path: str) -> str:
        """The page's visible text once the document at ``path`` (its query string: a part of
        the page's) has loaded."""
        pathname, _, query = path.partition("?")

        def ready() -> str | None:
            state = self.evaluate("[location.pathname, location.search, document.readyState]")
            if state and state[0] == pathname and query in state[1] and state[2] == "complete":
                return self.evaluate("document.body.innerText")
            return None

        return wait_for(ready, timeout=30, interval=0.1, what=f"the page {path}")

    def close(self) -> None:
        self._connection.__exit__(None, None, None)
        self.process.terminate()
        self.process.wait(20)


def test_a_reviewer_logs_in_filters_opens_an_exchange_and_sees_it(server, tmp_path):
    browser = chromium()
    if browser is None:
        pytest.skip("chromium is not installed (scripts/test installs it with apt-get when it runs as root)")
    base, _ = server
    page = DevTools(browser, tmp_path / "chromium")
    try:
        page.call("Page.enable")
        page.call("Page.navigate", url=f"{base}/exchanges")
        text = page.loaded("/login")  # no session: the login form
        assert "Log in" in text and "Password" in text and "Paris" not in text
        page.evaluate(
            "document.querySelector('input[name=name]').value = 'rita';"
            f"document.querySelector('input[name=password]').value = {orjson.dumps(PASSWORD).decode()};"
            "document.querySelector('form.login').submit()"
        )
        text = page.loaded("/exchanges")
        assert "rita" in text and "evil-1" in text and "alice-1" in text

        page.evaluate(
            "document.querySelector('input[name=user]').value = 'alice';document.querySelector('form.filters').submit()"
        )
        text = page.loaded("/exchanges?&user=alice&")  # the form sends its empty fields too
        rows = page.evaluate("[...document.querySelectorAll('table.exchanges a.id')].map(a => a.textContent)")
        assert rows == ["alice-2", "alice-1"]
        assert "bob-1" not in text and "Overloaded" in text

        page.evaluate("[...document.querySelectorAll('a.id')].find(a => a.textContent == 'alice-1').click()")
        text = page.loaded("/exchanges/alice-1")
        for seen in (
            "What is the Capital of France?",
            "Paris is the capital.",
            "France: Paris.",
            '"city": "Paris"',
            "input 100 · output 20 · total 120",
            "Verifies: the record matches its hashes",
        ):
            assert seen in text, seen
        shot = base64.b64decode(page.call("Page.captureScreenshot", format="png")["data"])
        (tmp_path / "exchange.png").write_bytes(shot)
        assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 10_000

        page.call("Page.navigate", url=f"{base}/exchanges/evil-1")
        text = page.loaded("/exchanges/evil-1")
        assert '<script>alert("pwned")</script><img src=x onerror=alert(1)>' in text  # shown, not run
        assert "\\x1b[31mred\\x1b[0m evil\\u202etxt.exe" in text and "\u202e" not in text
        assert page.evaluate("document.querySelectorAll('main script, main img').length") == 0
        assert page.evaluate("[...document.links].some(a => a.href.startsWith('javascript'))") is False
        assert HOSTILE.startswith("<script>")
    finally:
        page.close()


def test_the_cookie_is_not_readable_by_a_script(server, tmp_path):
    base, _ = server
    with httpx.Client(base_url=base) as client:
        cookie = client.post("/login", data={"password": PASSWORD}).headers["set-cookie"]
    assert re.search(r"(?i)httponly", cookie) and re.search(r"(?i)samesite=strict", cookie)
