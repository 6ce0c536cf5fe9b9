"""A throwaway PostgreSQL server for the tests: initdb into a temporary folder, start, stop.

The server binaries (``initdb``, ``pg_ctl``, ``postgres``) are looked up in
``$LLM_AUDIT_PG_BIN`` (set by ``scripts/test``), then on ``PATH``, then in
``/usr/lib/postgresql/*/bin``. PostgreSQL refuses to run as root, so when the tests run
as root the cluster belongs to the ``postgres`` system user and every server command
runs through ``runuser -u postgres --``; otherwise it belongs to the current user.

The server listens on a free TCP port on 127.0.0.1 (and a Unix socket in its folder),
trusts every local connection, and runs with ``fsync=off``: it is for tests only. (A
commit still reaches the server's files before it returns, so even ``stop("immediate")``
loses nothing committed; only a crash of the whole machine would.) Its
superuser is always called ``postgres``, so :attr:`PgServer.url` is
``postgresql+psycopg://postgres@127.0.0.1:PORT/llm_audit`` whoever runs the tests.

``stop()`` and ``start()`` can be called any number of times; the server comes back on
the same port with the same data.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Self

import psycopg

SUPERUSER = "postgres"
SYSTEM_USER = "postgres"  # who owns the cluster when the tests run as root
HINT = (
    "install the PostgreSQL server (e.g. 'apt-get install postgresql' as root) or set "
    "LLM_AUDIT_PG_BIN to the folder holding initdb and pg_ctl"
)


class PostgresUnavailable(RuntimeError):
    """The server binaries are missing or the server would not start; one clear message."""


def find_bin_dir() -> Path:
    """The folder holding ``initdb``, ``pg_ctl`` and ``postgres``, or :class:`PostgresUnavailable`."""
    explicit = os.environ.get("LLM_AUDIT_PG_BIN")
    candidates: list[Path] = []
    if explicit:  # when set, it is the only place looked at
        candidates.append(Path(explicit))
    else:
        if found := shutil.which("initdb"):
            candidates.append(Path(found).resolve().parent)
        candidates += [
            Path(d)
            for d in sorted(
                glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: _version_key(Path(d).parent.name), reverse=True
            )
        ]
    for d in candidates:
        if all(os.access(d / name, os.X_OK) for name in ("initdb", "pg_ctl", "postgres")):
            return d
    where = f" in LLM_AUDIT_PG_BIN={explicit}" if explicit else ""
    raise PostgresUnavailable(f"PostgreSQL server binaries (initdb, pg_ctl, postgres) not found{where}; {HINT}")


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(p) for p in name.split(".") if p.isdigit())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    """One PostgreSQL cluster in a temporary folder. ``PgServer().start()`` initialises it first."""

    def __init__(self, bin_dir: Path | None = None, port: int | None = None) -> None:
        self.bin_dir = bin_dir or find_bin_dir()
        self.port = port or free_port()
        self.as_root = os.geteuid() == 0
        if self.as_root:
            try:
                self.owner = pwd.getpwnam(SYSTEM_USER)
            except KeyError:
                raise PostgresUnavailable(
                    f"running as root, but there is no '{SYSTEM_USER}' system user to own the test cluster "
                    f"(PostgreSQL refuses to run as root); {HINT}"
                ) from None
        else:
            self.owner = pwd.getpwuid(os.geteuid())
        # tempfile.mkdtemp, not pytest's tmp_path: /tmp/pytest-of-root is closed to the postgres user
        # (under $LLM_AUDIT_PG_ROOT when scripts/test set it: it stops what a killed pytest left)
        root = os.environ.get("LLM_AUDIT_PG_ROOT")
        self.base = Path(tempfile.mkdtemp(prefix="llm-audit-pg-", dir=root if root and os.path.isdir(root) else None))
        if self.as_root:
            os.chown(self.base, self.owner.pw_uid, self.owner.pw_gid)
        self.data = self.base / "data"
        self.log = self.base / "server.log"
        self.initialised = False
        self.running = False

    # -- addresses --------------------------------------------------------------------------

    def url_for(self, database: str) -> str:
        """SQLAlchemy URL of ``database`` on this server (TCP)."""
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the ``llm_audit`` database."""
        return self.url_for("llm_audit")

    @property
    def socket_dir(self) -> Path:
        return self.base

    def connect(self, database: str = "postgres", **kwargs) -> psycopg.Connection:
        """A psycopg connection (autocommit) to ``database`` over TCP."""
        return psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user=SUPERUSER,
            dbname=database,
            autocommit=True,
            connect_timeout=10,
            **kwargs,
        )

    # -- lifecycle ----------------------------------------------------------------------------

    def _run(self, args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
        """Run a server command as the cluster's owner; its own session, so Ctrl-C does not reach it."""
        if self.as_root:
            args = ["runuser", "-u", self.owner.pw_name, "--", *args]
        return subprocess.run(
            args,
            check=False,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.base,
            start_new_session=True,
        )

    def _check(self, what: str, proc: subprocess.CompletedProcess) -> None:
        if proc.returncode != 0:
            log = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
            raise PostgresUnavailable(
                f"{what} failed (exit {proc.returncode}): {proc.stdout}{proc.stderr}\n{log}".strip()
            )

    def init(self) -> None:
        """initdb into the temporary folder, then write the test settings into postgresql.conf."""
        proc = self._run(
            [
                str(self.bin_dir / "initdb"),
                "-D",
                str(self.data),
                "-U",
                SUPERUSER,
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ]
        )
        self._check("initdb", proc)
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.socket_dir}'",
            "fsync": "off",
            "full_page_writes": "off",
            "max_connections": "200",
            "log_min_messages": "warning",
            "timezone": "'UTC'",
        }
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\n# llm-audit test server\n")
            conf.writelines(f"{k} = {v}\n" for k, v in settings.items())
        self.initialised = True

    def start(self) -> PgServer:
        """Start the server (initialising the cluster the first time); waits until it accepts connections."""
        if not self.initialised:
            self.init()
        proc = self._run(
            [str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start"]
        )
        self._check(f"starting PostgreSQL on port {self.port}", proc)
        self.running = True
        if not self._has_database("llm_audit"):
            self.create_database("llm_audit")
        return self

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``mode``: smart, fast or immediate); the data and the port stay for :meth:`start`."""
        if not self.initialised:
            return
        proc = self._run([str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", "-m", mode, "stop"])
        if proc.returncode != 0 and self.is_running():
            self._check("stopping PostgreSQL", proc)
        self.running = False

    def is_running(self) -> bool:
        if not self.initialised:
            return False
        return self._run([str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "status"]).returncode == 0

    def destroy(self) -> None:
        """Stop the server (if running) and delete its folder; harmless when called again."""
        if not self.base.exists():
            return
        try:
            self.stop()
        except (PostgresUnavailable, subprocess.TimeoutExpired):
            self.stop("immediate")
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.destroy()

    # -- databases ----------------------------------------------------------------------------

    def _has_database(self, name: str) -> bool:
        with self.connect() as con:
            return con.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None

    def create_database(self, name: str | None = None) -> str:
        """Create a fresh, empty database (a unique name unless given); returns its SQLAlchemy URL."""
        name = name or f"audit_{uuid.uuid4().hex[:12]}"
        with self.connect() as con:
            con.execute(f'CREATE DATABASE "{name}"')
        return self.url_for(name)

    def drop_database(self, name: str) -> None:
        """Drop a database, closing its connections first."""
        with self.connect() as con:
            con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def disk_files(self, database: str) -> list[Path]:
        """After a CHECKPOINT, the files holding ``database``'s tables and the write-ahead log."""
        with self.connect() as con:
            con.execute("CHECKPOINT")
            oid = con.execute("SELECT oid FROM pg_database WHERE datname = %s", (database,)).fetchone()[0]
        files = [*(self.data / "base" / str(oid)).iterdir(), *(self.data / "pg_wal").iterdir()]
        return [p for p in files if p.is_file()]
