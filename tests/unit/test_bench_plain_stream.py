"""The benchmark's baseline addon streams event streams, with ``stream = True`` or, with
``plain_stream_callable``, through a callable that returns every chunk as it came (the
``callable`` variant: the floor of any addon that reads the bytes)."""

from __future__ import annotations

import importlib.util

from mitmproxy.test import taddons, tflow, tutils

from bench.common import ROOT

_spec = importlib.util.spec_from_file_location("plain_stream", ROOT / "bench" / "plain_stream.py")
assert _spec is not None and _spec.loader is not None
plain_stream = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plain_stream)


def _event_stream_flow():  # type: ignore[no-untyped-def]
    return tflow.tflow(resp=tutils.tresp(headers=[(b"content-type", b"text/event-stream; charset=utf-8")]))


def test_plain_mitmdump_streams_event_streams_and_nothing_else() -> None:
    with taddons.context(plain_stream):
        flow = _event_stream_flow()
        plain_stream.responseheaders(flow)
        assert flow.response.stream is True
        other = tflow.tflow(resp=True)
        plain_stream.responseheaders(other)
        assert not other.response.stream


def test_the_callable_variant_returns_every_chunk_unchanged() -> None:
    with taddons.context(plain_stream) as tctx:
        tctx.configure(plain_stream, plain_stream_callable=True)
        flow = _event_stream_flow()
        plain_stream.responseheaders(flow)
        stream = flow.response.stream
        assert callable(stream)
        assert stream(b"data: {}\n\n") == b"data: {}\n\n" and stream(b"") == b""
