"""The inference API hosts people use, and the OpenTelemetry ``gen_ai.provider.name`` of each.

Detection never depends on the host (the same API runs behind gateways and local
servers); the host only names who served an exchange when it is a known one. The same
table says which hosts the proxy decrypts when it is told to decrypt inference traffic
only (:mod:`addon.hosts`, ``llm-audit hosts``).

A host pattern names a host and every subdomain of it (``api.openai.com`` also covers
the regional ``eu.api.openai.com``); ``*`` stands for any run of letters, digits,
hyphens and dots, such as a resource name or a region.
"""

from __future__ import annotations

import re

# Host pattern -> gen_ai.provider.name (custom values where OpenTelemetry has none).
HOSTS: tuple[tuple[str, str], ...] = (
    ("api.openai.com", "openai"),
    ("*.openai.azure.com", "azure.ai.openai"),
    ("*.services.ai.azure.com", "azure.ai.inference"),
    ("api.anthropic.com", "anthropic"),
    ("generativelanguage.googleapis.com", "gcp.gemini"),
    ("aiplatform.googleapis.com", "gcp.vertex_ai"),
    ("*-aiplatform.googleapis.com", "gcp.vertex_ai"),  # regional: us-east5-aiplatform...
    ("bedrock-runtime.*.amazonaws.com", "aws.bedrock"),
    ("bedrock-runtime-fips.*.amazonaws.com", "aws.bedrock"),
    ("api.mistral.ai", "mistral_ai"),
    ("api.cohere.com", "cohere"),
    ("api.cohere.ai", "cohere"),
    ("api.groq.com", "groq"),
    ("api.deepseek.com", "deepseek"),
    ("api.x.ai", "x_ai"),
    ("api.perplexity.ai", "perplexity"),
    ("openrouter.ai", "openrouter"),
    ("api.together.xyz", "together_ai"),
    ("api.together.ai", "together_ai"),
    ("cursor.sh", "cursor"),  # api2.cursor.sh, agent.api5.cursor.sh, ... (Connect, protobuf)
    ("windsurf.com", "windsurf"),  # server.self-serve.windsurf.com, eu.windsurf.com, tenants
    ("windsurf.fedstart.com", "windsurf"),
    ("codeium.com", "windsurf"),  # server.codeium.com, inference.codeium.com
)


def host_regex(pattern: str) -> str:
    """The regular expression (not anchored) for a host pattern and its subdomains."""
    name = re.escape(pattern.lower()).replace(r"\*", "[a-z0-9.-]+")
    return name if pattern.startswith("*") else rf"(?:[a-z0-9-]+\.)*{name}"


_MATCHERS = tuple((re.compile(host_regex(pattern)), provider) for pattern, provider in HOSTS)


def provider_for_host(host: str) -> str | None:
    """The provider for a known API host, or ``None``."""
    host = host.lower().rstrip(".")
    return next((provider for rx, provider in _MATCHERS if rx.fullmatch(host)), None)
