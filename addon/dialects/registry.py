"""Which dialects llm-audit reads, in the order they are tried, and the questions asked of them:
:func:`detect_request`, :func:`detect_response`, :func:`detect_streamed_request`, :func:`detect_websocket`.

Order matters only where two could match: llm-stream's media type wins over any path, LMSP's
``/lmsp/v1/responses`` over OpenAI's ``/responses``, a known SignalR hub over ``signalr`` (any
handshake). A new dialect is one module defining ``DIALECT`` and a name in :data:`BUILTIN`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from addon.dialects import UNREADABLE, Dialect, RequestView
from addon.framing import Frame

BUILTIN = (
    "llm_stream", "lmsp", "openai_responses", "openai_chat", "openai_completions", "anthropic", "gemini", "bedrock",
    "anthropic_vertex", "ollama", "cursor", "windsurf", "connect_rpc", "openai_realtime", "gemini_live", "copilot",
    "copilot_chathub", "signalr",
)  # fmt: skip
REGISTRY: tuple[Dialect, ...] = tuple(importlib.import_module(f"addon.dialects.{name}").DIALECT for name in BUILTIN)


def detect_request(request: RequestView, body: Callable[[], Any]) -> Dialect | None:
    """The first registered dialect that recognises this request, if any.

    ``body`` parses the request body on demand, so requests no dialect matches by
    line and headers cost only the header checks. A body that is not JSON at all
    (:data:`UNREADABLE`) is claimed by the first dialect whose line and headers match.
    """
    by_line = None
    for dialect in REGISTRY:
        if dialect.matches(request):
            if dialect.accepts_body(body(), request):
                return dialect
            by_line = by_line or dialect
    # A body that cannot be read must not hide an exchange: the request line decides.
    return by_line if by_line is not None and body() is UNREADABLE else None


def detect_response(first_event: Frame) -> Dialect | None:
    """The dialect that claims an unrecognised event stream by its first event."""
    for dialect in REGISTRY:
        if dialect.sniff(first_event):
            return dialect
    return None


def detect_streamed_request(request: RequestView) -> Dialect | None:
    """The dialect of a request whose body is read as it flows (a bidirectional stream),
    decided by its line and headers alone, before any of the body is there."""
    return next((d for d in REGISTRY if d.matches(request) and d.streams_request(request)), None)


def detect_websocket(request: RequestView, first: bytes | None) -> tuple[Dialect, str] | None:
    """The dialect of a WebSocket connection and the framing of its messages: by the
    upgrade request (``first`` None), else by the client's first message."""
    return next(((d, f) for d in REGISTRY if (f := d.websocket(request, first)) is not None), None)
