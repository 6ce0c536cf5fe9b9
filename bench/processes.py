"""Starting and watching the processes under test: the mock upstream and mitmdump.

The proxy is measured from outside: CPU seconds (all threads, so the audit writer
thread counts; from ``/proc/PID/task/*/schedstat``, in nanoseconds) and RSS (psutil
when it is installed, else ``/proc``). With two or more cores the proxy is pinned to the last core and this process
(the clients) and the mock to the others, so that the load generators compete with the
proxy as little as the machine allows.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import ROOT

try:
    import psutil
except ImportError:  # the /proc fallback below serves Linux without it
    psutil = None

BIN = Path(sys.executable).parent
PLAIN_ADDON = ROOT / "bench" / "plain_stream.py"
AUDIT_ADDON = ROOT / "addon" / "llm_audit.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float, what: str, log: Path) -> None:
    """Wait until something accepts connections on ``port``; fail with the process's log if it died."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not listen on {port} within {timeout}s") from None
            time.sleep(0.05)


def cores() -> set[int]:
    return os.sched_getaffinity(0)


def pin(pid: int, cpus: set[int]) -> None:
    """Restrict a process to ``cpus`` (best effort: not every system allows it)."""
    try:
        os.sched_setaffinity(pid, cpus)
    except OSError:
        pass


def split_cores() -> tuple[set[int], set[int]]:
    """(cores for the proxy, cores for everything else); the same set twice on one core."""
    available = sorted(cores())
    if len(available) < 2:
        return set(available), set(available)
    return {available[-1]}, set(available[:-1])


@dataclass
class Managed:
    """A subprocess started by the benchmark; :meth:`stop` ends exactly it."""

    proc: subprocess.Popen
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.pid)

    def rss(self) -> int:
        return rss_bytes(self.pid)


@dataclass
class Mock(Managed):
    port: int = 0

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Proxy(Managed):
    variant: str = ""
    port: int = 0
    db_url: str | None = None
    args: list[str] = field(default_factory=list)


def start_mock(tmp: Path, cpus: set[int] | None = None) -> Mock:
    ready = tmp / "mock.url"
    log = tmp / "mock.log"
    cmd = [str(BIN / "python"), "-m", "mockllm", "--host", "127.0.0.1", "--port", "0", "--ready-file", str(ready)]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if cpus:
        pin(proc.pid, cpus)
    deadline = time.monotonic() + 30
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"mock-llm did not start:\n{log.read_text(errors='replace')}")
        time.sleep(0.02)
    port = int(ready.read_text().strip().rsplit(":", 1)[1])
    return Mock(proc, log, port)


def start_proxy(
    tmp: Path,
    variant: str,
    *,
    rules: Path | None = None,
    cpus: set[int] | None = None,
    extra: list[str] | None = None,
    root: Path | None = None,
    db_url: str | None = None,
) -> Proxy:
    """mitmdump in one of four variants, on a free port, output quiet.

    ``plain``: streaming turned on for event streams, nothing else (what anyone
    running mitmproxy in front of SSE must do); ``callable``: the same through a stream
    callable that returns each chunk unchanged (the floor of any addon that reads the
    bytes); ``audit``: ``-s addon/llm_audit.py`` recording to an SQLite file;
    ``filters``: the same with ``llm_rules``. ``root``: the audit's code from another
    tree (an exported revision, ``bench/against.py``) instead of this checkout's.
    ``db_url``: the audit's database instead of a new SQLite file (a PostgreSQL one).
    """
    folder = tmp / f"proxy-{variant}-{time.monotonic_ns()}"
    folder.mkdir(parents=True)
    port = free_port()
    args = ["--listen-host", "127.0.0.1", "--listen-port", str(port), "-q", "--set", f"confdir={folder / 'mitm'}"]
    if variant in ("plain", "callable"):
        db_url = None
    if variant == "plain":
        args += ["-s", str(PLAIN_ADDON)]
    elif variant == "callable":
        args += ["-s", str(PLAIN_ADDON), "--set", "plain_stream_callable=true"]
    else:
        db_url = db_url or f"sqlite:///{folder / 'audit.db'}"
        addon = AUDIT_ADDON if root is None else root / "addon" / "llm_audit.py"
        args += ["-s", str(addon), "--set", f"llm_audit_db={db_url}"]
        if variant == "filters":
            if rules is None:
                raise ValueError("the filters variant needs a rules file")
            args += ["--set", f"llm_rules={rules}"]
    args += extra or []
    log = folder / "mitmdump.log"
    # its own state and data folders: the benchmark never writes spools, signing keys or
    # checkpoints into the user's own
    env = os.environ | {
        "XDG_STATE_HOME": str(folder / "state"),
        "XDG_DATA_HOME": str(folder / "data"),
        "PYTHONUNBUFFERED": "1",
    }
    if root is not None:  # (ahead of the editable install, whose finder comes after sys.path)
        env["PYTHONPATH"] = str(root)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(BIN / "mitmdump"), *args],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    if cpus:
        pin(proc.pid, cpus)
    proxy = Proxy(proc, log, variant, port, db_url, args)
    try:
        wait_for_port(port, proc, 120, f"mitmdump ({variant})", log)
    except BaseException:
        proxy.stop()
        raise
    return proxy


def cpu_seconds(pid: int) -> float:
    """CPU seconds of a process so far (all its threads).

    Linux's per-thread ``schedstat`` counts nanoseconds on the CPU; the tick-based
    user + system times (psutil, ``/proc/PID/stat``) move in 10 ms steps, too coarse
    for short loads, so they are only the fallback.
    """
    try:
        total = 0
        for task in Path(f"/proc/{pid}/task").iterdir():
            total += int((task / "schedstat").read_text().split()[0])
        return total / 1e9
    except (OSError, ValueError, IndexError):
        pass
    if psutil is not None:
        times = psutil.Process(pid).cpu_times()
        return times.user + times.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime


def rss_bytes(pid: int) -> int:
    """Resident set size of a process now."""
    if psutil is not None:
        return psutil.Process(pid).memory_info().rss
    pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def start_proxies(
    tmp: Path, specs: dict[str, tuple[str, Path | None]], cpus: set[int] | None = None
) -> dict[str, Proxy]:
    """Several proxies (name: (variant, rules)) started at once: mitmdump takes seconds to
    start, mostly importing, and the benchmark waits for them all. If one fails, those
    started are stopped again."""
    with ThreadPoolExecutor(len(specs) or 1) as pool:
        futures = {name: pool.submit(start_proxy, tmp, v, rules=r, cpus=cpus) for name, (v, r) in specs.items()}
        wait(futures.values())
    started = [f for f in futures.values() if f.exception() is None]
    if len(started) < len(futures):
        for f in started:
            f.result().stop()
    return {name: f.result() for name, f in futures.items()}  # raises the first failure, if any


def stop_all(processes: list[Managed]) -> None:
    """SIGTERM to every process first, then wait for each: their shutdowns (an audit
    proxy writes everything queued before it exits) run side by side."""
    for p in processes:
        if p.proc.poll() is None:
            p.proc.send_signal(signal.SIGTERM)
    for p in processes:
        p.stop()


def start_postgres() -> tuple[Any, str | None]:
    """A throwaway PostgreSQL server (``tests/pgserver.py``; ``destroy()`` it), or None and
    the reason there is none."""
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from pgserver import PgServer, PostgresUnavailable  # type: ignore[import-not-found]  # tests/, put on sys.path above
    except ImportError as e:
        return None, f"tests/pgserver.py cannot be imported: {e}"
    try:
        return PgServer().start(), None
    except PostgresUnavailable as e:
        return None, str(e).splitlines()[0]
