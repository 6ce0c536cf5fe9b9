"""Deployment, as the README's guide tells people to run it: a workstation proxy each
runtime trusts by its environment variables, a team proxy that attributes exchanges to
its authenticated users, decrypting only the inference API hosts, a gateway in reverse
mode, and the systemd service.

Real processes throughout (``mitmdump``, ``scripts/proxy``, the mock upstream, and the
clients as subprocesses with only the environment the guide gives them); rows are read
with plain SQL, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import ssl
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import bcrypt
import httpx
import openai
import orjson
import pytest
from conftest import BIN, ROOT, Process, Proxy, Upstream, new_database, start_proxy

pytestmark = pytest.mark.e2e

CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Weather in Vienna?"}]}
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


def localhost_url(upstream: Upstream) -> str:
    """The mock's URL by name (its certificate covers ``localhost`` and ``127.0.0.1``)."""
    return upstream.url.replace("127.0.0.1", "localhost")


def client_env(**variables: str) -> dict[str, str]:
    """The test's environment without any proxy settings of its own, plus ``variables``."""
    env = {k: v for k, v in os.environ.items() if k.lower() not in PROXY_VARIABLES and not k.endswith("_CA_BUNDLE")}
    env.pop("SSL_CERT_FILE", None)
    env.pop("NODE_EXTRA_CA_CERTS", None)
    return env | variables


def run_client(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert done.returncode == 0, f"{args[0]} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def issuer(certificate: dict) -> str:
    return dict(pair[0] for pair in certificate["issuer"])["commonName"]


def tunnel_certificate(proxy_url: str, host: str, port: int, cafile: Path) -> dict:
    """The certificate a client sees for ``host:port`` through the proxy's CONNECT
    tunnel, verified against ``cafile`` alone (the handshake fails for another CA's)."""
    proxy = urlsplit(proxy_url)
    with socket.create_connection((proxy.hostname, proxy.port), timeout=10) as sock:
        sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(1)  # byte by byte: the TLS handshake that follows is not ours to read
        assert head.startswith(b"HTTP/1.1 200"), head
        with ssl.create_default_context(cafile=str(cafile)).wrap_socket(sock, server_hostname=host) as tls:
            return tls.getpeercert()


# -- workstation ---------------------------------------------------------------------------------

NODE_CLIENT = r"""
// Node's own fetch ignores HTTPS_PROXY unless NODE_USE_ENV_PROXY=1 (Node 22.21+, 24+): tunnel by hand, as proxy agents do.
const http = require("http"), tls = require("tls");
const proxy = new URL(process.env.HTTPS_PROXY), target = new URL(process.argv[1]);
const [body, mockId] = [process.argv[2], process.argv[3]];
http.request({host: proxy.hostname, port: proxy.port, method: "CONNECT", path: target.host})
  .on("connect", (res, socket) => {
    const s = tls.connect({socket, servername: target.hostname}, () => s.write(
      `POST ${target.pathname} HTTP/1.1\r\nhost: ${target.host}\r\ncontent-type: application/json\r\n` +
      `x-mock-id: ${mockId}\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`));
    s.on("data", (d) => process.stdout.write(d));
    s.on("error", (e) => { console.error(e.message); process.exit(1); });
  }).end();
"""

PYTHON_OPENAI_CLIENT = """
import sys, openai
client = openai.OpenAI(base_url=sys.argv[1], api_key="sk-test", max_retries=0)
answer = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Weather in Vienna?"}],
                                        extra_headers={"x-mock-id": sys.argv[2]})
print(answer.choices[0].message.content)
"""

PYTHON_REQUESTS_CLIENT = """
import sys, requests
answer = requests.post(sys.argv[1] + "/chat/completions", headers={"x-mock-id": sys.argv[2]}, timeout=30,
                       json={"model": "gpt-4o", "messages": [{"role": "user", "content": "Weather in Vienna?"}]})
answer.raise_for_status()
print(answer.json()["choices"][0]["message"]["content"])
"""


@pytest.mark.parametrize("runtime", ["python-sdk", "python-requests", "curl", "node"])
def test_workstation_clients_go_through_the_proxy_by_their_environment(runtime, proxy: Proxy, upstreams):
    """Each runtime, given only the variables the guide names, reaches an HTTPS endpoint
    through the proxy, trusts mitmproxy's CA and is audited."""
    base_url, mock_id = f"{localhost_url(upstreams['h2'])}/v1", uuid.uuid4().hex
    body = orjson.dumps(CHAT).decode()
    ca = str(proxy.ca)
    if runtime == "python-sdk":  # httpx: the OpenAI, Anthropic and Google SDKs, most Python tools
        out = run_client(
            [sys.executable, "-c", PYTHON_OPENAI_CLIENT, base_url, mock_id],
            client_env(HTTPS_PROXY=proxy.url, SSL_CERT_FILE=ca),
        )
    elif runtime == "python-requests":
        out = run_client(
            [sys.executable, "-c", PYTHON_REQUESTS_CLIENT, base_url, mock_id],
            client_env(HTTPS_PROXY=proxy.url, REQUESTS_CA_BUNDLE=ca),
        )
    elif runtime == "curl":
        if not shutil.which("curl"):
            pytest.skip("curl is not installed")
        out = run_client(
            [
                "curl",
                "-sSf",
                f"{base_url}/chat/completions",
                "-H",
                "content-type: application/json",
                "-H",
                f"x-mock-id: {mock_id}",
                "-d",
                body,
            ],
            client_env(HTTPS_PROXY=proxy.url, CURL_CA_BUNDLE=ca),
        )
    else:
        if not shutil.which("node"):
            pytest.skip("node is not installed")
        out = run_client(
            ["node", "-e", NODE_CLIENT, f"{base_url}/chat/completions", body, mock_id],
            client_env(HTTPS_PROXY=proxy.url, NODE_EXTRA_CA_CERTS=ca),
        )
    row = proxy.mock_row(mock_id)
    assert (row["dialect"], row["status"], row["server_address"]) == ("openai-chat", "completed", "localhost")
    assert row["output_text"] and row["output_text"] in out


# -- decrypting only inference traffic ------------------------------------------------------------


def test_llm_hosts_only_decrypts_the_inference_hosts_and_passes_any_other_through(
    request, backend, tmp_path, upstreams
):
    """``scripts/proxy --llm-hosts-only`` with a user's hosts file naming ``localhost``:
    the mock by that name is decrypted and audited; the same server by its address is
    another host, so the client gets the server's own certificate and nothing is recorded,
    although the request is an inference request."""
    hosts = tmp_path / "hosts"
    hosts.write_text("# inference endpoints of our own\nlocalhost\n")
    upstream = upstreams["h2"]
    p = start_proxy(
        tmp_path,
        "--llm-hosts-only",
        upstream_ca=upstream.ca,
        launcher=[str(ROOT / "scripts" / "proxy")],
        env={"LLM_AUDIT_EXTRA_HOSTS": str(hosts)},
        **new_database(request, backend, tmp_path),
    )
    try:
        port = urlsplit(upstream.url).port
        assert issuer(tunnel_certificate(p.url, "localhost", port, p.ca)) == "mitmproxy"
        assert issuer(tunnel_certificate(p.url, "127.0.0.1", port, upstream.ca)) == "mock-llm test CA"

        passed_through = uuid.uuid4().hex
        verify_upstream = ssl.create_default_context(cafile=str(upstream.ca))  # not the proxy's CA
        with httpx.Client(proxy=p.url, verify=verify_upstream, timeout=30) as client:
            answer = client.post(
                f"{upstream.url}/v1/chat/completions", json=CHAT, headers={"x-mock-id": passed_through}
            )
        assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"]

        audited = uuid.uuid4().hex
        with p.client() as client:
            answer = client.post(
                f"{localhost_url(upstream)}/v1/chat/completions", json=CHAT, headers={"x-mock-id": audited}
            )
        row = p.mock_row(audited)  # records are written in order: the first would be there by now
        assert (row["server_address"], row["status"]) == ("localhost", "completed")
        assert row["output_text"] == answer.json()["choices"][0]["message"]["content"]
        assert p.rows(header={"x-mock-id": passed_through}) == []
        assert len(p.rows()) == 1
    finally:
        p.process.stop()


# -- team proxy ----------------------------------------------------------------------------------


def test_team_proxy_attributes_exchanges_to_the_authenticated_user(request, backend, tmp_path, upstreams):
    """With ``proxyauth`` (an htpasswd file of two users), each exchange names its proxy
    user in ``user_id`` unless the request's own metadata names one, plus the client
    address and the site (``llm_audit_instance``); without credentials nothing passes."""
    htpasswd = tmp_path / "htpasswd"
    htpasswd.write_text(
        "".join(
            f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()}\n"
            for user, password in (("alice", "alice-pw"), ("bob", "bob-pw"))
        )
    )
    p = start_proxy(
        tmp_path,
        "--set",
        f"proxyauth=@{htpasswd}",
        "--set",
        "llm_audit_instance=vienna-office",
        upstream_ca=upstreams["h2"].ca,
        **new_database(request, backend, tmp_path),
    )
    try:
        ca = ssl.create_default_context(cafile=str(p.ca))
        port = urlsplit(p.url).port
        ids = {name: uuid.uuid4().hex for name in ("anonymous", "alice", "bob", "carol")}

        with httpx.Client(proxy=p.url, timeout=30) as anonymous:
            refused = anonymous.post(
                f"{upstreams['h1'].url}/v1/chat/completions", json=CHAT, headers={"x-mock-id": ids["anonymous"]}
            )
        assert refused.status_code == 407
        with httpx.Client(proxy=f"http://alice:alice-pw@127.0.0.1:{port}", verify=ca, timeout=30) as alice:
            alice.post(
                f"{upstreams['h2'].url}/v1/chat/completions",
                json=CHAT,  # HTTPS: a CONNECT tunnel
                headers={"x-mock-id": ids["alice"]},
            ).raise_for_status()
        with httpx.Client(proxy=f"http://bob:bob-pw@127.0.0.1:{port}", timeout=30) as bob:
            bob.post(
                f"{upstreams['h1'].url}/v1/chat/completions",
                json=CHAT,  # plain HTTP
                headers={"x-mock-id": ids["bob"]},
            ).raise_for_status()
            bob.post(
                f"{upstreams['h1'].url}/v1/llm/stream",
                headers={"x-mock-id": ids["carol"]},
                json={
                    "version": "1.0",
                    "stream": True,
                    "model": "demo",
                    "messages": CHAT["messages"],
                    "metadata": {"user_id": "carol"},
                },
            ).raise_for_status()

        for name in ("alice", "bob", "carol"):
            row = p.mock_row(ids[name])
            assert (row["user_id"], row["client_address"]) == (name, "127.0.0.1")
            assert row["proxy_instance"] == "vienna-office"
            assert "proxy-authorization" not in row["request_headers"]  # mitmproxy took it off
        assert p.rows(header={"x-mock-id": ids["anonymous"]}) == []
    finally:
        p.process.stop()


# -- gateway ---------------------------------------------------------------------------------------


def start_gateway(tmp: Path, upstream: Upstream, db_url: str, pg=None) -> Proxy:
    """``mitmdump --mode reverse:UPSTREAM`` with the addon, on a free port."""
    confdir = tmp / "mitm"
    cmd = [
        str(BIN / "mitmdump"),
        "--mode",
        f"reverse:{upstream.url}",
        "--listen-host",
        "127.0.0.1",
        "--listen-port",
        "0",
        "-s",
        str(ROOT / "addon" / "llm_audit.py"),
        "--set",
        f"confdir={confdir}",
        "--set",
        f"llm_audit_db={db_url}",
        "--set",
        f"ssl_verify_upstream_trusted_ca={upstream.ca}",
    ]
    env = os.environ | {"PYTHONUNBUFFERED": "1", "XDG_STATE_HOME": str(tmp / "state")}
    process = Process.start(cmd, env=env)
    m = process.wait_line(r"reverse proxy to \S+ listening at [\d.]+:(\d+)", timeout=120)
    return Proxy(f"http://127.0.0.1:{m.group(1)}", db_url, confdir, process, pg)


def test_gateway_in_reverse_mode_for_clients_that_only_take_a_base_url(request, backend, tmp_path, upstreams):
    """The SDK's base URL is the gateway (plain HTTP, no CA to trust); the gateway talks
    HTTPS to the one provider behind it, as ``--mode reverse:https://api.openai.com``."""
    upstream = upstreams["h2"]
    gateway = start_gateway(tmp_path, upstream, **new_database(request, backend, tmp_path))
    try:
        mock_id = uuid.uuid4().hex
        with httpx.Client(trust_env=False, timeout=30) as http:
            client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="sk-test", max_retries=0, http_client=http)
            with client.chat.completions.stream(
                model="gpt-4o",
                messages=CHAT["messages"],
                stream_options={"include_usage": True},
                extra_headers={"x-mock-id": mock_id},
            ) as stream:
                text = "".join(e.delta for e in stream if e.type == "content.delta")
                final = stream.get_final_completion()
        row = gateway.mock_row(mock_id)
        assert (row["dialect"], row["status"], row["streamed"]) == ("openai-chat", "completed", True)
        assert (row["server_address"], row["server_port"]) == ("127.0.0.1", urlsplit(upstream.url).port)
        assert row["output_text"] == text and text
        assert row["output_tokens"] == final.usage.completion_tokens
    finally:
        gateway.process.stop()


# -- the service ---------------------------------------------------------------------------------

UNIT = ROOT / "scripts" / "llm-audit.service"
ENV_FILE = ROOT / "scripts" / "llm-audit.env"


def service_files(tmp: Path) -> tuple[Path, Path]:
    """The unit and environment file as installed from this checkout: the unit's
    ``/opt/llm-audit`` is this checkout, its ``/var/lib/llm-audit`` and ``/etc/llm-audit``
    are folders in ``tmp``."""
    state, etc = tmp / "var-lib-llm-audit", tmp / "etc-llm-audit"
    state.mkdir()
    etc.mkdir()
    replacements = {"/opt/llm-audit": str(ROOT), "/var/lib/llm-audit": str(state), "/etc/llm-audit": str(etc)}
    installed = []
    for source, target in ((UNIT, tmp / "llm-audit.service"), (ENV_FILE, etc / "llm-audit.env")):
        text = source.read_text()
        for old, new in replacements.items():
            text = text.replace(old, new)
        target.write_text(text)
        installed.append(target)
    return installed[0], installed[1]


def test_the_systemd_unit_verifies(tmp_path):
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed (the systemd package)")
    unit, _ = service_files(tmp_path)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def environment_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines (no quoting is used in ours), as systemd reads them."""
    lines = [line.strip() for line in path.read_text().splitlines()]
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def exec_start(unit: Path, env: dict[str, str], key: str = "ExecStart") -> list[str]:
    """The unit's ExecStart (or ``key``: ExecStartPre, ...) as systemd runs it: ``${VAR}``
    one word, ``$VAR`` split at spaces; a leading ``+`` (full privileges) dropped."""
    line = next(line for line in unit.read_text().splitlines() if line.startswith(f"{key}="))
    words = []
    for word in shlex.split(line.removeprefix(f"{key}=").removeprefix("+")):
        if word.startswith("$") and not word.startswith("${"):
            words += env[word[1:]].split()
            continue
        for name, value in env.items():
            word = word.replace(f"${{{name}}}", value)
        words.append(word)
    return words


def test_the_service_records_to_the_database_and_spool_of_its_environment_file(tmp_path, upstreams):
    """ExecStart run with the environment file as systemd would (only the port changed, to
    a free one): the database and the spool are where the file says."""
    unit, env_file = service_files(tmp_path)
    env = environment_file(env_file)
    env["LLM_AUDIT_ARGS"] = env["LLM_AUDIT_ARGS"].replace("--listen-port 8080", "--listen-port 0")
    process = Process.start(exec_start(unit, env), env=os.environ | {"PYTHONUNBUFFERED": "1"} | env)
    try:
        port = process.wait_line(r"proxy listening at .*:(\d+)", timeout=120).group(1)
        mock_id = uuid.uuid4().hex
        with httpx.Client(proxy=f"http://127.0.0.1:{port}", timeout=30) as client:  # plain HTTP is always seen
            client.post(
                f"{upstreams['h1'].url}/v1/chat/completions", json=CHAT, headers={"x-mock-id": mock_id}
            ).raise_for_status()
        tls = upstreams["h2"]  # --llm-hosts-only: a host that is no inference API passes through
        certificate = tunnel_certificate(f"http://127.0.0.1:{port}", "127.0.0.1", urlsplit(tls.url).port, tls.ca)
        assert issuer(certificate) == "mock-llm test CA"
        assert process.stop() == 0
        proxy = Proxy("", env["LLM_AUDIT_DB"], Path(env["LLM_AUDIT_CONFDIR"]), process)
        assert proxy.db_path.parent == tmp_path / "var-lib-llm-audit"
        assert proxy.mock_row(mock_id)["status"] == "completed"
        assert Path(env["LLM_AUDIT_SPOOL"]).exists()
        assert (Path(env["LLM_AUDIT_CONFDIR"]) / "mitmproxy-ca-cert.pem").exists()
    finally:
        process.stop()
