"""OpenTelemetry ``gen_ai.provider.name`` for the API hosts people use.

Detection never depends on the host (the same API runs behind gateways and local
servers); the host only names who served an exchange when it is a known one.
"""

from __future__ import annotations

# Host suffix -> gen_ai.provider.name (custom values where OpenTelemetry has none).
HOSTS: tuple[tuple[str, str], ...] = (
    ("api.openai.com", "openai"),
    (".openai.azure.com", "azure.ai.openai"),
    (".services.ai.azure.com", "azure.ai.inference"),
    ("api.anthropic.com", "anthropic"),
    ("generativelanguage.googleapis.com", "gcp.gemini"),
    ("aiplatform.googleapis.com", "gcp.vertex_ai"),
    ("-aiplatform.googleapis.com", "gcp.vertex_ai"),  # regional: us-east5-aiplatform...
    ("bedrock-runtime.", "aws.bedrock"),
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
)


def provider_for_host(host: str) -> str | None:
    """The provider for a known API host, or ``None``."""
    host = host.lower().rstrip(".")
    for pattern, provider in HOSTS:
        if pattern.startswith((".", "-")):
            if host.endswith(pattern):
                return provider
        elif pattern.endswith("."):
            if host.startswith(pattern) or f".{pattern}" in host:
                return provider
        elif host == pattern or host.endswith("." + pattern):
            return provider
    return None
