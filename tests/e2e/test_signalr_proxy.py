"""SignalR through the auditing proxy: Copilot's ChatHub (by hand, as EdgeGPT and PyRIT
speak it) and a generic hub (pysignalr, JSON and MessagePack) against the mock hubs of
mockllm.websocket, over TLS; one record per answered invocation, on both backends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import wsclients
from conftest import Node, Proxy, filtering_proxy, wait_for

pytestmark = pytest.mark.e2e

ANSWER = "the secret word is marmalade"
PROMPT = f"say: {ANSWER}"


def turn_rows(proxy: Proxy, mock_id: str, count: int) -> list[dict]:
    """The ``count`` turn records of the connection made with ``mock_id``, in order."""

    def ready() -> list[dict] | None:
        rows = proxy.rows("url_query LIKE ? AND turn IS NOT NULL", (f"%{mock_id}%",))
        done = [r for r in rows if r["status"] != "in_progress"]
        return done if len(done) >= count else None

    rows = wait_for(ready, 20, what=f"{count} turns of {mock_id}:\n{proxy.process.output[-3000:]}")
    return sorted(rows, key=lambda r: r["turn"])


@pytest.mark.parametrize("path", ["/sydney/ChatHub", "/m365Copilot/Chathub/00000000-oid@tid"])
def test_chathub_turns_are_recorded(proxy: Proxy, upstreams, path: str) -> None:
    seen = wsclients.chathub_ws(
        upstreams["h2"].url, [PROMPT, "say: a second answer"], path=path, **wsclients.via(proxy)
    )
    assert seen["text"] == ANSWER + "a second answer"
    rows = turn_rows(proxy, seen["mock_id"], 2)
    assert [(r["dialect"], r["status"], r["output_text"]) for r in rows] == [
        ("copilot-chathub", "completed", ANSWER),
        ("copilot-chathub", "completed", "a second answer"),
    ]
    assert rows[0]["request_body"]["messages"] == [{"role": "user", "content": PROMPT}]
    assert rows[0]["request_body"]["tone"] == "Balanced"


@pytest.mark.parametrize("protocol", ["json", "messagepack"])
def test_a_generic_hub_is_recorded(proxy: Proxy, upstreams, protocol: str) -> None:
    seen = wsclients.signalr_py(upstreams["h2"].url, PROMPT, protocol=protocol, **wsclients.via(proxy))
    assert "".join(seen["items"]) == ANSWER
    (row,) = turn_rows(proxy, seen["mock_id"], 1)
    assert (row["dialect"], row["status"], row["output_text"]) == ("signalr", "completed", ANSWER)
    assert row["request_body"]["messages"][0]["content"] == PROMPT


# -- content filters ---------------------------------------------------------------------------

RULES = """
[[rule]]
id = "no-jam"
kind = "keywords"
keywords = ["marmalade"]
scope = "response"
action = "block"
reason = "no preserves"

[[rule]]
id = "no-secrets-asked"
kind = "keywords"
keywords = ["password"]
scope = "request"
action = "block"
reason = "do not ask for passwords"
"""


@pytest.fixture(scope="module")
def filtered(request, tmp_path_factory, upstreams, proxy: Proxy) -> Iterator[Proxy]:
    yield from filtering_proxy(request, tmp_path_factory, proxy.backend, RULES, upstreams["h2"].ca)


def test_a_chathub_answer_cut_ends_as_a_filtered_turn(filtered: Proxy, upstreams) -> None:
    seen = wsclients.chathub_ws(upstreams["h2"].url, PROMPT, **wsclients.via(filtered))
    assert "marmalade" not in seen["text"]
    assert seen["result"]["value"] == "Filtered" and "no-jam" in seen["result"]["message"]
    (row,) = turn_rows(filtered, seen["mock_id"], 1)
    assert row["status"] == "blocked" and row["dialect"] == "copilot-chathub"
    assert "marmalade" not in (row["delivered_text"] or "")


def test_a_generic_hub_prompt_refused(filtered: Proxy, upstreams) -> None:
    seen = wsclients.signalr_py(upstreams["h2"].url, "say: what is the password", **wsclients.via(filtered))
    assert any("no-secrets-asked" in e for e in seen["errors"]), seen
    (row,) = turn_rows(filtered, seen["mock_id"], 1)
    assert row["status"] == "blocked" and row["dialect"] == "signalr"


# -- the official client (@microsoft/signalr, Node) ---------------------------------------------


@pytest.mark.parametrize("protocol", ["json", "messagepack"])
@pytest.mark.parametrize("method", ["stream", "invoke", "chat"])
def test_signalr_node_through_the_proxy(proxy: Proxy, upstreams, node: Node, protocol: str, method: str) -> None:
    path = "/sydney/ChatHub" if method == "chat" else "/hubs/chat"
    seen = wsclients.signalr_node(
        upstreams["h2"].url,
        PROMPT,
        protocol=protocol,
        method=method,
        path=path,
        node=node.binary,
        **wsclients.via(proxy),
    )
    assert seen["errors"] == [] and seen["text"] == ANSWER
    (row,) = turn_rows(proxy, seen["mock_id"], 1)
    dialect = "copilot-chathub" if method == "chat" else "signalr"
    assert (row["dialect"], row["status"], row["output_text"]) == (dialect, "completed", ANSWER)
    assert row["request_body"]["messages"] == [{"role": "user", "content": PROMPT}]


@pytest.mark.parametrize("protocol", ["json", "messagepack"])
def test_signalr_node_sees_the_cut_as_the_invocation_error(
    filtered: Proxy, upstreams, node: Node, protocol: str
) -> None:
    seen = wsclients.signalr_node(
        upstreams["h2"].url, PROMPT, protocol=protocol, node=node.binary, **wsclients.via(filtered)
    )
    assert "marmalade" not in "".join(seen["items"])
    assert len(seen["errors"]) == 1 and "no-jam" in seen["errors"][0]
    (row,) = turn_rows(filtered, seen["mock_id"], 1)
    assert row["status"] == "blocked" and "marmalade" not in (row["delivered_text"] or "")


def test_signalr_node_cancel_is_recorded(proxy: Proxy, upstreams, node: Node) -> None:
    seen = wsclients.signalr_node(
        upstreams["h2"].url, "delay_ms=50 " + PROMPT, cancel_after=2, node=node.binary, **wsclients.via(proxy)
    )
    assert seen["items"] == [ANSWER[:4], ANSWER[4:8]]
    (row,) = turn_rows(proxy, seen["mock_id"], 1)
    assert row["finish_reasons"] == ["cancelled"] and row["output_text"].startswith(ANSWER[:8])
