"""The SSE parser's former home, kept for ``addon/contentview.py`` until the CLI
refactor (issue 17) moves that module: the parser lives in :mod:`addon.framing.sse`."""

from addon.framing.sse import DEFAULT_MAX_EVENT_BYTES, SSEEvent, SSEParser

__all__ = ["DEFAULT_MAX_EVENT_BYTES", "SSEEvent", "SSEParser"]
