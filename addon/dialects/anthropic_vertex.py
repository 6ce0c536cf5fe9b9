"""Anthropic Messages on Google Vertex AI: the Anthropic dialect behind another path.

Vertex serves Claude at
``POST /v1/projects/{p}/locations/{l}/publishers/anthropic/models/{model}:streamRawPredict``
(and ``:rawPredict`` for an answer that does not stream). The body is a Messages request
without ``model`` (the path names it) and with ``anthropic_version: "vertex-…"``; the
answer is Anthropic's own, an SSE stream or a message object. So everything but
recognition and the model is :class:`~addon.dialects.messages.AnthropicMessages`, whose
normalizer, termination and blocked answers it uses unchanged; the provider is
``gcp.vertex_ai`` on any host. The Gemini dialect claims only ``:generateContent`` and
``:streamGenerateContent``, so these paths are this dialect's alone.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

from addon.dialects import RequestSummary, RequestView
from addon.dialects.messages import AnthropicMessages

_PATH = re.compile(r"/publishers/anthropic/models/([^/:]+):(streamRawPredict|rawPredict)$")
COUNT_TOKENS = "count-tokens"  # ``…/models/count-tokens:rawPredict`` counts tokens: no answer


def _method_and_model(path: str) -> tuple[str, str]:
    """``("streamRawPredict", "claude-sonnet-4@20250514")``, else ``("", "")`` (the colon
    may be percent-encoded)."""
    match = _PATH.search(unquote(path) if "%" in path else path)
    if match is None or match[1] == COUNT_TOKENS:
        return "", ""
    return match[2], match[1]


class AnthropicVertex(AnthropicMessages):
    provider = "gcp.vertex_ai"

    def matches(self, request: RequestView) -> bool:
        return request.method.upper() == "POST" and bool(_method_and_model(request.path)[0])

    def accepts_body(self, body: Any, request: RequestView) -> bool:
        return True  # the path is decisive; a body Anthropic would refuse is still audited

    def sniff(self, first_event: Any) -> bool:
        return False  # an unclaimed stream is the Anthropic dialect's to claim

    def summarize(self, body: Any, request: RequestView) -> RequestSummary:
        summary = super().summarize(body, request)
        method, model = _method_and_model(request.path)
        summary.model = model
        summary.stream = method == "streamRawPredict"
        return summary


DIALECT = AnthropicVertex()
