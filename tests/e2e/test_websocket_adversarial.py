"""WebSocket auditing under hostile or unlucky traffic, through a real mitmdump (issue 19's
review): what the proxy injects must reach the peer byte for byte, and the proxy must
recognise it when it passes the hooks again."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests import wsclients
from tests.conftest import BACKENDS, Proxy, filtering_proxy
from tests.e2e.test_websocket_proxy import OUTPUT_RULES, connection_rows, mock_id

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module", params=BACKENDS)
def filtering(request, tmp_path_factory, upstreams) -> Iterator[Proxy]:
    yield from filtering_proxy(request, tmp_path_factory, request.param, OUTPUT_RULES, upstreams["h2"].ca)


def test_a_long_non_ascii_answer_held_by_the_filters_arrives_intact(filtering: Proxy, upstreams) -> None:
    """Held messages go on as injected ones, which mitmproxy cuts into 4000-byte frames:
    a cut inside a UTF-8 character must not turn it into U+FFFD (the client would see
    other text, and the proxy would not know its own message and send it round again)."""
    answer = "日本語の答え、" * 700  # ~14700 bytes: its done events span several frames
    mid = mock_id()
    seen = wsclients.realtime_ws(upstreams["h2"].url, f"say: {answer}", mock_id=mid, **wsclients.via(filtering))
    assert not seen["timed_out"] and not seen["errors"], (seen["events"][-5:], len(seen["text"]))
    assert seen["text"] == answer
    assert seen["turns"][0]["status"] == "completed"
    (turn,), conn = connection_rows(filtering, mid, 1)
    assert turn["output_text"] == answer and turn["status"] == "completed"
