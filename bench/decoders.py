"""The SSE decoders compared, each behind one function: chunks in, events out.

* ``llm-audit``: :class:`addon.framing.sse.SSEParser`, fed chunk by chunk as the proxy does.
* ``httpx-sse``: its public API, ``EventSource(response).iter_sse()`` over an
  ``httpx.Response`` whose stream yields the chunks: what an application using it runs.
* ``httpx-sse (decoder only)``: the same line and event decoders without httpx around
  them (incremental UTF-8, ``SSELineDecoder``, ``SSEDecoder``): the peer at its fastest.
* ``llm-audit (pure)``: the pure-Python parser module, loaded from its source under
  another name, when the parser in use is the compiled copy: the fallback, measured too.
* ``openai``: the decoder inside the ``openai`` SDK (``openai._streaming.SSEDecoder``,
  whose ``iter_bytes`` its ``Stream`` runs on the response bytes).

A peer that is not installed is reported as skipped, never as a failure.
"""

from __future__ import annotations

import codecs
import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from addon.framing import sse
from addon.framing.sse import SSEParser

Decode = Callable[[list[bytes]], list[tuple[str, str, str]]]


def _feeding(parser_class: Any) -> Callable[[list[bytes]], list[Any]]:
    """A decoder that feeds the chunks to a new ``parser_class`` parser, as the proxy does."""

    def decode(chunks: list[bytes]) -> list[Any]:
        parser = parser_class()
        events: list[Any] = []
        for chunk in chunks:
            events += parser.feed(chunk)
        events += parser.end()
        return events

    return decode


ours = _feeding(SSEParser)


def _pure() -> Callable[[list[bytes]], list[Any]] | None:
    """The pure-Python parser beside the compiled one (None when the pure one is in use)."""
    if not sse.COMPILED:
        return None
    source = Path(sse.__file__).with_name("sse_parser.py")
    spec = importlib.util.spec_from_file_location("_bench_sse_parser_pure", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return _feeding(module.SSEParser)


def _httpx_sse_api() -> Callable[[list[bytes]], list[Any]] | None:
    try:
        import httpx
        from httpx_sse import EventSource
    except ImportError:
        return None

    class Chunks(httpx.SyncByteStream):
        def __init__(self, chunks: list[bytes]) -> None:
            self.chunks = chunks

        def __iter__(self) -> Iterator[bytes]:
            return iter(self.chunks)

    headers = {"content-type": "text/event-stream"}

    def decode(chunks: list[bytes]) -> list[Any]:
        response = httpx.Response(200, headers=headers, stream=Chunks(chunks))
        return list(EventSource(response).iter_sse())

    return decode


def _httpx_sse_core() -> Callable[[list[bytes]], list[Any]] | None:
    try:
        from httpx_sse._decoders import SSEDecoder, SSELineDecoder
    except ImportError:
        return None

    def decode(chunks: list[bytes]) -> list[Any]:
        text = codecs.getincrementaldecoder("utf-8")("replace")  # what httpx's TextDecoder does
        lines, sse = SSELineDecoder(), SSEDecoder()
        events = []
        for chunk in chunks:
            for line in lines.decode(text.decode(chunk)):
                event = sse.decode(line.rstrip("\n"))
                if event is not None:
                    events.append(event)
        rest = text.decode(b"", True)  # a character cut off by the end of the body
        for line in [*(lines.decode(rest) if rest else []), *lines.flush()]:
            event = sse.decode(line)
            if event is not None:
                events.append(event)
        return events

    return decode


def _openai() -> Callable[[list[bytes]], list[Any]] | None:
    try:
        from openai._streaming import SSEDecoder
    except ImportError:
        return None

    def decode(chunks: list[bytes]) -> list[Any]:
        return list(SSEDecoder().iter_bytes(iter(chunks)))

    return decode


def available() -> dict[str, Callable[[list[bytes]], list[Any]] | None]:
    """Every decoder by name; None for a peer that is not installed."""
    return {
        "llm-audit": ours,
        "llm-audit (pure)": _pure(),
        "httpx-sse": _httpx_sse_api(),
        "httpx-sse (decoder only)": _httpx_sse_core(),
        "openai": _openai(),
    }


def as_whatwg(event: Any) -> dict[str, str]:
    """An event as a WHATWG ``MessageEvent`` shows it (type defaulting to "message", id "")."""
    return {
        "event": getattr(event, "event", None) or "message",
        "data": event.data,
        "id": getattr(event, "id", None) or "",
    }
