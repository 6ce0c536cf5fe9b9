"""Transparent capture on Linux, for real: tools audited without any proxy setting.

A network namespace stands in for the workstation: an address in it (``203.0.113.10``,
on its loopback interface) stands in for the providers, ``/etc/netns/NAME/hosts`` (which
``ip netns exec`` mounts over ``/etc/hosts``) maps ``api.openai.com``,
``api.anthropic.com`` and ``generativelanguage.googleapis.com`` to it, and the mock
upstream serves TLS there with a certificate for those names. mitmdump with the addon
runs in transparent mode in the namespace as root, and the shipped ``scripts/transparent
up --user nobody --proxy-user root`` redirects the traffic of user ``nobody``. The clients
run as ``nobody`` with their default base URLs and no proxy variables, trusting
mitmproxy's CA only through their runtime's variable (``NODE_EXTRA_CA_CERTS``,
``SSL_CERT_FILE``): the Node ``openai``, ``@anthropic-ai/sdk`` and ``@google/genai`` SDKs
and the Python ``openai`` SDK. Every exchange must be recorded under the provider's host
name (not the intercepted address), and the mock must have answered it.

Needs root, ``ip netns`` and iptables (``scripts/test`` installs iptables when missing and
running as root); skipped with the reason otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from conftest import BIN, ROOT, Node, Process, Proxy, new_database, start_proxy, wait_for
from sqlalchemy.engine import make_url
from test_deploy import environment_file, exec_start

pytestmark = pytest.mark.e2e

PROVIDERS_ADDRESS = "203.0.113.10"  # TEST-NET-3: never a real host
PROVIDER_HOSTS = ("api.openai.com", "api.anthropic.com", "generativelanguage.googleapis.com")
PROXY_PORT = 8081  # the namespace is new: nothing else listens there
NOBODY = 65534
TRANSPARENT = ROOT / "scripts" / "transparent"


def missing_requirement() -> str | None:
    """Why this machine cannot run the test, or ``None``."""
    if os.geteuid() != 0:
        return "transparent capture needs root (network namespaces, iptables): run the tests as root, as CI does"
    for tool, fix in (
        ("ip", "iproute2"),
        ("setpriv", "util-linux"),
        ("iptables", "iptables"),
        ("ip6tables", "iptables"),
    ):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install {fix}; scripts/test installs iptables when root)"
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return f"'ip netns' is unavailable here: {done.stderr.strip()}"
    return None


def run(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    """A command that must succeed; its output is in the failure."""
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False, **kwargs)
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


@dataclass
class Namespace:
    """A network namespace with the providers' address in it and their names in its hosts file."""

    name: str

    def exec(self, *args: str) -> list[str]:
        return ["ip", "netns", "exec", self.name, *args]

    def as_nobody(self, *args: str, read_anything: bool = False) -> list[str]:
        """``args`` in the namespace as user and group ``nobody``.

        ``read_anything`` adds CAP_DAC_READ_SEARCH for an interpreter nobody cannot
        otherwise reach (pyenv's Python lives in root's 0700 home): it may read any file,
        but the traffic still belongs to uid 65534, which is what the rules match."""
        caps = ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"] if read_anything else []
        return self.exec("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *caps, *args)

    def iptables_rules(self) -> list[str]:
        """Every table, chain and rule of both families (iptables-save without its comments)."""
        return [
            line
            for family in ("iptables-save", "ip6tables-save")
            for line in run(self.exec(family)).stdout.splitlines()
            if not line.startswith("#")
        ]


def create_namespace(name: str) -> Namespace:
    etc = Path("/etc/netns") / name
    etc.mkdir(parents=True)
    (etc / "hosts").write_text(f"127.0.0.1 localhost\n::1 localhost\n{PROVIDERS_ADDRESS} {' '.join(PROVIDER_HOSTS)}\n")
    run(["ip", "netns", "add", name])
    # on the loopback interface: a dummy interface would need a kernel module some CI kernels lack
    for command in (["link", "set", "lo", "up"], ["addr", "add", f"{PROVIDERS_ADDRESS}/32", "dev", "lo"]):
        run(["ip", "-n", name, *command])
    return Namespace(name)


def delete_namespace(name: str) -> None:
    subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
    shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)


@pytest.fixture(scope="module")
def namespace(request) -> Namespace:
    """A fresh namespace, deleted at the end (with its ``/etc/netns`` folder) whatever happens."""
    if problem := missing_requirement():
        pytest.skip(problem)
    name = f"llm-audit-{uuid.uuid4().hex[:8]}"
    request.addfinalizer(lambda: delete_namespace(name))
    return create_namespace(name)


@dataclass
class Providers:
    """The mock upstream on the providers' address, by their names."""

    process: Process
    ca: Path

    def received(self, namespace: Namespace, mock_id: str) -> dict:
        """What the mock received with ``x-mock-id: mock_id``, asked from inside the namespace."""
        ask = (
            "import httpx, sys; r = httpx.get(sys.argv[1], verify=sys.argv[2]); "
            "print(r.text if r.status_code == 200 else '{}')"
        )
        url = f"https://{PROVIDER_HOSTS[0]}/_mock/requests/{mock_id}"
        return orjson.loads(run(namespace.exec(str(BIN / "python"), "-c", ask, url, str(self.ca))).stdout)


def start_providers(namespace: Namespace, tmp: Path) -> Providers:
    """The mock upstream on the providers' address in ``namespace``, with a certificate for their names."""
    ready, certs = tmp / "url", tmp / "certs"
    names = [arg for host in PROVIDER_HOSTS for arg in ("--cert-name", host)]
    process = Process.start(
        namespace.exec(
            str(BIN / "python"),
            "-m",
            "mockllm",
            "--tls",
            "--host",
            PROVIDERS_ADDRESS,
            "--port",
            "443",
            "--cert-dir",
            str(certs),
            *names,
            "--ready-file",
            str(ready),
        )
    )
    wait_for(ready.exists, what=f"mock-llm in the namespace:\n{process.output}")
    return Providers(process, certs / "ca.pem")


@pytest.fixture(scope="module")
def providers(namespace: Namespace, tmp_path_factory) -> Iterator[Providers]:
    up = start_providers(namespace, tmp_path_factory.mktemp("providers"))
    yield up
    up.process.stop()


@pytest.fixture(scope="module")
def redirected(namespace: Namespace) -> Iterator[str]:
    """The shipped script's rules for user ``nobody``, taken down again at the end."""
    up = run(
        namespace.exec(str(TRANSPARENT), "up", "--user", "nobody", "--proxy-user", "root", "--port", str(PROXY_PORT))
    )
    yield up.stdout
    run(namespace.exec(str(TRANSPARENT), "down"))


def database_in_namespace(db_url: str, pg) -> str:
    """The URL the proxy in the namespace records to: PostgreSQL listens on 127.0.0.1 of the
    host's namespace, out of its reach, so it takes the server's Unix socket instead."""
    if pg is None:
        return db_url
    url = make_url(db_url)
    socket_url = url.set(host=None, port=None, query={"host": str(pg.socket_dir), "port": str(url.port)})
    return socket_url.render_as_string(hide_password=False)


def start_transparent_proxy(request, backend: str, tmp: Path, namespace: Namespace, providers: Providers) -> Proxy:
    """mitmdump with the addon in transparent mode, in the namespace, as root."""
    database = new_database(request, backend, tmp)
    launcher = namespace.exec(str(BIN / "mitmdump"), "-s", str(ROOT / "addon" / "llm_audit.py"))
    return start_proxy(
        tmp,
        "--mode",
        f"transparent@127.0.0.1:{PROXY_PORT}",
        "--mode",
        f"transparent@::1:{PROXY_PORT}",
        "--set",
        f"llm_audit_db={database_in_namespace(database['db_url'], database.get('pg'))}",
        upstream_ca=providers.ca,
        launcher=launcher,
        set_db=False,
        **database,
    )


def readable_copy(path: Path) -> Path:
    """``path`` copied where ``nobody`` can read it (pytest's temporary folders are 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="llm-audit-transparent-"))
    folder.chmod(0o755)
    copy = folder / path.name
    shutil.copyfile(path, copy)
    copy.chmod(0o644)
    return copy


def client_env(**variables: str) -> dict[str, str]:
    """An environment with no proxy (nor CA) settings at all: only what a login shell needs."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp", "LANG": "C.UTF-8", **variables}


PYTHON_CLIENT = """
import json, sys, openai
client = openai.OpenAI(api_key="sk-test", max_retries=0)  # the default base URL: https://api.openai.com/v1
answer = client.responses.create(model="gpt-4.1-mini", input="Weather in Vienna?",
                                 extra_headers={"x-mock-id": sys.argv[1]})
print(json.dumps({"text": answer.output_text, "model": answer.model, "base_url": str(client.base_url)}))
"""


def python_client(namespace: Namespace, mock_id: str, ca: Path) -> dict:
    """The Python ``openai`` SDK as ``nobody``, trusting the CA by ``SSL_CERT_FILE`` only: what it got."""
    done = run(
        namespace.as_nobody(str(BIN / "python"), "-c", PYTHON_CLIENT, mock_id, read_anything=True),
        env=client_env(SSL_CERT_FILE=str(ca)),
        cwd="/",
    )
    return orjson.loads(done.stdout.strip().splitlines()[-1])


def assert_recorded(
    proxy: Proxy,
    providers: Providers,
    namespace: Namespace,
    mock_id: str,
    host: str,
    dialect: str,
    model: str,
    seen: dict,
) -> None:
    """The exchange's row names the provider's host, its dialect, the models and the text
    the client got, and the local user; the mock answered that very request."""
    row = proxy.mock_row(mock_id)
    assert (row["server_address"], row["server_port"], row["dialect"], row["status"]) == (
        host,
        443,
        dialect,
        "completed",
    )
    assert row["request_model"] == model
    assert row["response_model"] == seen["model"] and seen["model"]  # what the SDK reported
    assert row["user_id"] == "nobody"  # the owner of the client's socket
    assert row["output_text"] == seen["text"] and seen["text"]
    received = dict(providers.received(namespace, mock_id).get("headers", []))
    assert received.get("host", "").split(":")[0] == host, received


def test_tools_with_no_proxy_settings_are_audited_by_transparent_capture(
    request, backend: str, tmp_path: Path, namespace: Namespace, providers: Providers, redirected: str, node: Node
):
    """The Node SDKs and the Python SDK, as user ``nobody``, with their default base URLs:
    every exchange reaches the mock through the proxy and is recorded as the provider's."""
    assert "redirected to port 8081" in redirected
    proxy = start_transparent_proxy(request, backend, tmp_path, namespace, providers)
    ca = readable_copy(proxy.ca)
    try:
        ids = {sdk: uuid.uuid4().hex for sdk in ("openai", "anthropic", "gemini", "python")}
        seen = node.run(
            "transparent.mjs", {"ids": ids}, env=client_env(NODE_EXTRA_CA_CERTS=str(ca)), prefix=namespace.as_nobody()
        )
        seen["python"] = python_client(namespace, ids["python"], ca)
        assert seen["python"]["base_url"] == "https://api.openai.com/v1/"

        assert_recorded(
            proxy, providers, namespace, ids["openai"], "api.openai.com", "openai-chat", "gpt-4o", seen["openai"]
        )
        assert_recorded(
            proxy,
            providers,
            namespace,
            ids["anthropic"],
            "api.anthropic.com",
            "anthropic-messages",
            "claude-sonnet-4-5",
            seen["anthropic"],
        )
        assert_recorded(
            proxy,
            providers,
            namespace,
            ids["gemini"],
            "generativelanguage.googleapis.com",
            "gemini",
            "gemini-2.5-flash",
            seen["gemini"],
        )
        assert_recorded(
            proxy,
            providers,
            namespace,
            ids["python"],
            "api.openai.com",
            "openai-responses",
            "gpt-4.1-mini",
            seen["python"],
        )
        providers_of = {r["server_address"]: r["provider"] for r in proxy.rows()}
        assert providers_of == {
            "api.openai.com": "openai",
            "api.anthropic.com": "anthropic",
            "generativelanguage.googleapis.com": "gcp.gemini",
        }
        assert len(proxy.rows()) == 4
    finally:
        proxy.process.stop()
        shutil.rmtree(ca.parent, ignore_errors=True)


UDP_PROBE = """
import socket, sys
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    s.settimeout(5)
    s.connect((sys.argv[1], 443))
    try:
        s.send(b"quic?")
        print(s.recv(100).decode())
    except (PermissionError, ConnectionRefusedError):  # REJECT in OUTPUT fails the send itself (EPERM)
        print("refused")
"""

UDP_ECHO = """
import socket, sys
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    s.bind((sys.argv[1], 443))
    print("listening", flush=True)
    while True:
        data, peer = s.recvfrom(100)
        s.sendto(b"echo " + data, peer)
"""


def test_udp_443_of_the_selected_user_is_rejected_so_http3_cannot_bypass_the_proxy(
    namespace: Namespace, redirected: str
):
    """A QUIC server on the providers' address answers the proxy's user, and refuses
    ``nobody``: its clients fall back to TCP, which is redirected."""
    echo = Process.start(namespace.exec(str(BIN / "python"), "-c", UDP_ECHO, PROVIDERS_ADDRESS))
    try:
        echo.wait_line("listening")
        probe = [str(BIN / "python"), "-c", UDP_PROBE, PROVIDERS_ADDRESS]
        assert run(namespace.exec(*probe)).stdout.strip() == "echo quic?"
        assert run(namespace.as_nobody(*probe, read_anything=True), cwd="/").stdout.strip() == "refused"
    finally:
        echo.stop()


@pytest.fixture
def bare_namespace(request) -> Namespace:
    """A namespace of its own, with rules of the administrator's in both families and tables."""
    if problem := missing_requirement():
        pytest.skip(problem)
    name = f"llm-audit-{uuid.uuid4().hex[:8]}"
    request.addfinalizer(lambda: delete_namespace(name))
    ns = create_namespace(name)
    for family in ("iptables", "ip6tables"):
        run(ns.exec(family, "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "--dport", "25", "-j", "RETURN"))
        run(ns.exec(family, "-t", "filter", "-A", "OUTPUT", "-p", "udp", "--dport", "53", "-j", "ACCEPT"))
    return ns


def test_down_removes_exactly_what_up_added_and_up_replaces_itself(bare_namespace: Namespace):
    """``up`` twice (another selection the second time) leaves one set of rules, ``down``
    leaves the administrator's own rules as they were, and ``status`` tells which."""
    ns, script = bare_namespace, str(TRANSPARENT)
    before = ns.iptables_rules()
    status = subprocess.run(ns.exec(script, "status"), capture_output=True, text=True, check=False)
    assert (status.returncode, status.stdout.strip()) == (3, "scripts/transparent: down")

    run(ns.exec(script, "up", "--user", "nobody", "--proxy-user", "root"))
    run(ns.exec(script, "up", "--user", "nobody", "--group", "nogroup", "--proxy-user", "root", "--ports", "443"))
    rules = ns.iptables_rules()
    assert sum("REDIRECT --to-ports 8081" in line for line in rules) == 4  # 2 selections, IPv4 and IPv6
    assert sum("-j REJECT" in line for line in rules) == 4
    assert sum(line.startswith("-A OUTPUT") and "LLM_AUDIT" in line for line in rules) == 4  # one jump a table
    assert not any("--dports 80,443" in line for line in rules)  # the first selection is gone
    status = run(ns.exec(script, "status")).stdout
    assert "--gid-owner 65534 --suppl-groups" in status and status.rstrip().endswith("scripts/transparent: up")

    run(ns.exec(script, "down"))
    assert ns.iptables_rules() == before
    run(ns.exec(script, "down"))  # nothing left to remove: still fine
    assert ns.iptables_rules() == before


@pytest.mark.parametrize(
    ("args", "user", "message"),
    [
        (
            ["up", "--user", "no-such-user-x", "--proxy-user", "root"],
            None,
            "unknown user 'no-such-user-x': check the name",
        ),
        (["up", "--user", "nobody"], None, "unknown proxy user 'llm-audit': create it"),
        (["up", "--proxy-user", "root"], None, "name whose traffic to redirect: --user NAME, --group NAME or --cgroup"),
        (["up", "--cgroup", "no-such.slice", "--proxy-user", "root"], None, "no cgroup v2 path '/no-such.slice'"),
        (["down"], NOBODY, "must run as root: sudo scripts/transparent down"),
    ],
)
def test_errors_are_one_line_naming_the_fix(bare_namespace: Namespace, args: list[str], user: int | None, message: str):
    before = bare_namespace.iptables_rules()
    command = [str(TRANSPARENT), *args]
    if user is not None:
        command = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *command]
    done = subprocess.run(bare_namespace.exec(*command), capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"scripts/transparent: {message}"), done.stderr
    assert bare_namespace.iptables_rules() == before


def test_errors_name_the_missing_iptables(tmp_path: Path):
    """Where iptables is not installed (a PATH with nothing but ``id``), the script says what to install."""
    if os.geteuid() != 0:
        pytest.skip("the check for iptables comes after the one for root")
    (tmp_path / "id").symlink_to(shutil.which("id"))
    done = subprocess.run(
        [shutil.which("bash"), str(TRANSPARENT), "status"],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": str(tmp_path)},
    )
    assert done.returncode == 2
    assert done.stderr.startswith("scripts/transparent: iptables not found: install it"), done.stderr


# -- the service -------------------------------------------------------------------------------

UNIT = ROOT / "scripts" / "llm-audit-transparent.service"


def installed(source: Path, target: Path, tmp: Path, *replacements: tuple[str, str]) -> Path:
    """``source`` as installed from this checkout: ``/opt/llm-audit`` is the checkout, its
    ``/var/lib/llm-audit`` and ``/etc/llm-audit`` are folders in ``tmp``."""
    text = source.read_text()
    for old, new in (
        ("/opt/llm-audit", str(ROOT)),
        ("/var/lib/llm-audit", str(tmp / "state")),
        ("/etc/llm-audit", str(tmp / "etc")),
        *replacements,
    ):
        text = text.replace(old, new)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return target


def test_the_transparent_unit_verifies(tmp_path: Path):
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed (the systemd package)")
    unit = installed(UNIT, tmp_path / UNIT.name, tmp_path)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_the_units_commands_apply_the_rules_run_the_proxy_and_remove_the_rules(
    bare_namespace: Namespace, tmp_path: Path
):
    """ExecStartPre, ExecStart and ExecStopPost run in turn with the two environment files,
    as systemd would (in a namespace of their own; the service's user is root here, and the
    selection ``nobody``): the rules come and go with the proxy, which records a tool that
    has no proxy settings into the database of ``llm-audit.env``."""
    ns = bare_namespace
    providers = start_providers(ns, tmp_path / "providers")
    unit = installed(UNIT, tmp_path / UNIT.name, tmp_path, ("--proxy-user llm-audit", "--proxy-user root"))
    env = environment_file(installed(ROOT / "scripts" / "llm-audit.env", tmp_path / "etc" / "llm-audit.env", tmp_path))
    env |= environment_file(
        installed(
            ROOT / "scripts" / "llm-audit-transparent.env",
            tmp_path / "etc" / "transparent.env",
            tmp_path,
            ("--group ai-tools", "--user nobody"),
        )
    )
    env["LLM_AUDIT_ARGS"] += f" --set ssl_verify_upstream_trusted_ca={providers.ca}"  # the mock's CA, not the world's
    (tmp_path / "state").mkdir()
    environment = os.environ | {"PYTHONUNBUFFERED": "1"} | env
    proxy = None
    try:
        run(ns.exec(*exec_start(unit, env, "ExecStartPre")), env=environment)
        assert run(ns.exec(str(TRANSPARENT), "status")).stdout.rstrip().endswith("scripts/transparent: up")
        process = Process.start(ns.exec(*exec_start(unit, env)), env=environment)
        proxy = Proxy("", env["LLM_AUDIT_DB"], Path(env["LLM_AUDIT_CONFDIR"]), process)
        process.wait_line(r"Transparent Proxy listening at \[::1\]:8081", timeout=120)
        ca = readable_copy(proxy.ca)
        mock_id = uuid.uuid4().hex
        seen = python_client(ns, mock_id, ca)
        shutil.rmtree(ca.parent)
        row = proxy.mock_row(mock_id)
        assert (row["server_address"], row["user_id"], row["output_text"]) == ("api.openai.com", "nobody", seen["text"])
        assert process.stop() == 0
    finally:
        if proxy is not None:
            proxy.process.stop()
        providers.process.stop()
        run(ns.exec(*exec_start(unit, env, "ExecStopPost")), env=environment)
    status = subprocess.run(ns.exec(str(TRANSPARENT), "status"), capture_output=True, text=True, check=False)
    assert status.returncode == 3, status.stdout
