"""A test addon for addon/mitm/early_end.py: ends any event stream at the first chunk holding b"STOP".

It forwards what precedes the marker, then an injected ``error`` event, and ends the
response early through the private-API module under test. Loaded with ``-s`` into a
real mitmdump by tests/e2e/test_early_end.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from mitmproxy import http

from addon.mitm import early_end

MARKER = b"STOP"
INJECTED = b'event: error\ndata: {"type":"error","code":"content_filtered"}\n\n'

early_end.install()


class StopAtMarker:
    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if not flow.response.headers.get("content-type", "").startswith("text/event-stream"):
            return
        state = {"stopped": False}

        def tap(chunk: bytes):
            if state["stopped"] or not chunk:
                return []
            at = chunk.find(MARKER)
            if at < 0:
                return chunk
            state["stopped"] = True
            early_end.end_after_this_chunk(flow)
            return [chunk[: chunk.rfind(b"\n\n", 0, at) + 2], INJECTED] if b"\n\n" in chunk[:at] else [INJECTED]

        flow.response.stream = tap


addons = [StopAtMarker()]
