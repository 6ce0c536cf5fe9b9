"""addon/mitm/early_end.py, the private-API early end of a streamed response, per protocol.

A real mitmdump with a small test addon (tests/e2e/addons/stop_at_marker.py) that ends
any event stream at the first event holding "STOP": the client must get the events
before it, the injected event and a clean end, within a second, while the upstream is
told to stop and other streams carry on.
"""

from __future__ import annotations

import ssl
import threading
import time
import uuid

import httpx
import pytest
from conftest import ROOT, Proxy, start_proxy, wait_for

pytestmark = pytest.mark.e2e

INJECTED = b'event: error\ndata: {"type":"error","code":"content_filtered"}\n\n'
# 20 paced events of 4 characters each (the mock splits the text evenly); the 4th is the marker
SCENARIO = "events=20&delay=0.25&text=" + "".join(
    ["aaaa", "bbbb", "cccc", "STOP", *(c * 4 for c in "defghijklmnopqrs")]
)


@pytest.fixture(scope="module")
def stopper(tmp_path_factory, upstreams) -> Proxy:
    p = start_proxy(
        tmp_path_factory.mktemp("early-end"),
        "-s",
        str(ROOT / "tests" / "e2e" / "addons" / "stop_at_marker.py"),
        upstream_ca=upstreams["h2"].ca,
    )
    yield p
    p.process.stop()


def client(proxy: Proxy, http2: bool) -> httpx.Client:
    return httpx.Client(
        proxy=proxy.url, verify=ssl.create_default_context(cafile=str(proxy.ca)), http2=http2, timeout=30
    )


def post(c: httpx.Client, url: str, scenario: str, mock_id: str) -> tuple[bytes, float, str]:
    start = time.monotonic()
    resp = c.post(
        f"{url}/v1/llm/stream",
        headers={"content-type": "application/llm-request+json", "x-mock": scenario, "x-mock-id": mock_id},
        content=b'{"version":"1.0","stream":true,"model":"m","messages":[]}',
    )
    return resp.content, time.monotonic() - start, resp.http_version


@pytest.mark.parametrize("transport", ["h1", "h2"])
def test_stream_ends_cleanly_at_the_marker_and_the_upstream_stops(stopper, upstreams, transport):
    up = upstreams["h2" if transport == "h2" else "h1"]
    mock_id = uuid.uuid4().hex
    with client(stopper, http2=transport == "h2") as c:
        body, elapsed, version = post(c, up.url, SCENARIO, mock_id)
        # the connection is still good for the next request
        again, _, _ = post(c, up.url, "events=2", uuid.uuid4().hex)
    assert version == ("HTTP/2" if transport == "h2" else "HTTP/1.1")
    assert body.endswith(INJECTED) and b"STOP" not in body and b'"text":"cccc"' in body
    assert elapsed < 0.25 * 4 + 1.0, "the client's stream must end within a second of the block"
    assert again.endswith(b'"type":"stream.end"}\n\n'), "the next request on the same connection is whole"
    sent = wait_for(
        lambda: (s := up.sent(mock_id)) and (s.get("disconnected") or s.get("aborted")) and s,
        timeout=5,
        what="the upstream to see the stream cancelled",
    )
    assert not sent["completed"] and len(sent["chunks"]) < 10


def test_other_streams_on_the_same_http2_connection_carry_on(stopper, upstreams):
    up = upstreams["h2"]
    results: dict[str, bytes] = {}
    with client(stopper, http2=True) as c:

        def run(name: str, scenario: str) -> None:
            results[name] = post(c, up.url, scenario, uuid.uuid4().hex + name)[0]

        threads = [
            threading.Thread(target=run, args=("blocked", SCENARIO)),
            threading.Thread(target=run, args=("other", "events=12&delay=0.2")),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert results["blocked"].endswith(INJECTED)
    assert results["other"].count(b"\n\n") == 1 + 12 + 1 + 1 + 1  # start, deltas, stop, usage, end
