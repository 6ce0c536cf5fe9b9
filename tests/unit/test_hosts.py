"""The inference API hosts: the ``--allow-hosts`` expression, user additions, ``llm-audit hosts``.

The expression is checked the way mitmproxy uses it (``addons/next_layer.py``: searched,
ignoring case, in ``host:port`` strings); that mitmproxy then decrypts exactly these
hosts is proven end to end in ``tests/e2e/test_deploy.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from addon.dialects.providers import HOSTS, provider_for_host
from addon.hosts import HostsError, allow_hosts_expression, known_hosts, read_extra_hosts, server_name
from cli.main import main

# One host of each pattern in the table, '*' filled in as a resource name or region would be.
EXAMPLES = [(pattern.replace("*", "us-east-1"), provider) for pattern, provider in HOSTS]
ISSUE_HOSTS = [  # the providers the README promises, by a real host of each
    "api.openai.com", "myresource.openai.azure.com", "api.anthropic.com", "generativelanguage.googleapis.com",
    "us-central1-aiplatform.googleapis.com", "aiplatform.googleapis.com", "bedrock-runtime.eu-west-1.amazonaws.com",
    "api.mistral.ai", "api.cohere.com", "api.groq.com", "openrouter.ai", "api.together.xyz", "api.deepseek.com",
    "api.x.ai", "api.perplexity.ai",
]  # fmt: skip
NOT_INFERENCE = [
    "www.mybank.example", "api.openai.com.evil.example", "evilapi.openai.com", "notopenrouter.ai",
    "bedrock-runtime.evil.example", "openai.azure.com", "s3.us-east-1.amazonaws.com", "googleapis.com",
    "localhost", "127.0.0.1",
]  # fmt: skip


def allowed(expression: str, host_port: str) -> bool:
    """Whether mitmproxy would decrypt a connection to ``host_port`` (next_layer's test)."""
    return re.search(expression, host_port, re.IGNORECASE) is not None


@pytest.mark.parametrize(("host", "provider"), EXAMPLES)
def test_every_known_host_is_decrypted_and_names_its_provider(host, provider):
    expression = allow_hosts_expression([])
    assert allowed(expression, f"{host}:443") and allowed(expression, f"{host.upper()}:8443")
    assert provider_for_host(host) == provider


@pytest.mark.parametrize("host", ISSUE_HOSTS)
def test_the_providers_people_use_are_covered(host):
    assert allowed(allow_hosts_expression([]), f"{host}:443")
    assert allowed(allow_hosts_expression([]), f"eu.{host}:443")  # regional subdomains (eu.api.openai.com)


@pytest.mark.parametrize("host", NOT_INFERENCE)
def test_other_hosts_pass_through(host):
    assert not allowed(allow_hosts_expression([]), f"{host}:443")
    assert provider_for_host(host) is None


def test_user_additions_from_a_file(tmp_path: Path):
    hosts = tmp_path / "hosts"
    hosts.write_text(
        "# our own inference endpoints\n"
        "\n"
        "llm-gateway.corp.example   # the gateway\n"
        "*.Inference.Corp.Example\n"
        "10.0.0.5:8443\n"
    )
    extra = read_extra_hosts(hosts)
    assert extra == ["llm-gateway.corp.example", "*.inference.corp.example", "10.0.0.5:8443"]
    expression = allow_hosts_expression(extra)
    for host_port in (
        "llm-gateway.corp.example:443",
        "eu.llm-gateway.corp.example:443",
        "gpu-1.inference.corp.example:8000",
        "10.0.0.5:8443",
        "api.openai.com:443",
    ):
        assert allowed(expression, host_port), host_port
    for host_port in ("10.0.0.5:443", "inference.corp.example:443", "corp.example:443", "10.0.0.50:8443"):
        assert not allowed(expression, host_port), host_port


@pytest.mark.parametrize(
    "line",
    [
        "https://llm.example",
        "llm.example/v1",
        "*",
        "llm example",
        "-llm.example",
        "llm.example:port",
        "llm.example:65536",
        "[::1]:8443",
    ],
)
def test_a_line_that_is_not_a_host_is_refused_with_its_line_number(tmp_path: Path, line):
    hosts = tmp_path / "hosts"
    hosts.write_text(f"ok.example\n{line}\n")
    with pytest.raises(HostsError, match=rf"^{re.escape(str(hosts))}:2: .* is not a host pattern"):
        read_extra_hosts(hosts)


def test_cli_prints_the_expression(capsys):
    assert main(["hosts"]) == 0
    assert capsys.readouterr().out == allow_hosts_expression([]) + "\n"


def test_cli_lists_the_hosts_with_the_additions_of_the_environment(tmp_path: Path, monkeypatch, capsys):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost\n")
    monkeypatch.setenv("LLM_AUDIT_EXTRA_HOSTS", str(hosts))
    assert main(["hosts", "--list"]) == 0
    assert capsys.readouterr().out.splitlines() == [*known_hosts(), "localhost"]
    assert main(["hosts"]) == 0
    assert capsys.readouterr().out == allow_hosts_expression(["localhost"]) + "\n"


def test_cli_errors_are_one_line_with_status_2(tmp_path: Path, capsys):
    assert main(["hosts", "--extra", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("llm-audit: cannot read the hosts file") and "No such file" in err


@pytest.mark.parametrize(
    ("host", "sni", "host_header", "expected"),
    [
        ("api.openai.com", "other.example", "other.example", "api.openai.com"),  # regular mode: the request's own
        ("203.0.113.10", "api.openai.com", "203.0.113.10:443", "api.openai.com"),  # transparent, TLS: the SNI
        ("203.0.113.10", None, "API.Anthropic.com.:443", "api.anthropic.com"),  # no SNI: the Host header
        ("2001:db8::10", None, "[2001:db8::10]:443", "2001:db8::10"),  # the client named no host
        ("2001:db8::10", "", "generativelanguage.googleapis.com", "generativelanguage.googleapis.com"),
        ("10.0.0.5", None, None, "10.0.0.5"),
    ],
)
def test_server_name_is_the_name_the_client_asked_for_not_the_intercepted_address(host, sni, host_header, expected):
    """Transparent capture intercepts an address: the record names the host (and provider) the client meant."""
    assert server_name(host, sni, host_header) == expected
