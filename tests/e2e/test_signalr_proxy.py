"""SignalR through the auditing proxy: Copilot's ChatHub (by hand, as EdgeGPT and PyRIT
speak it) and a generic hub (pysignalr, JSON and MessagePack) against the mock hubs of
mockllm.websocket, over TLS; one record per answered invocation, on both backends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import wsclients
from conftest import Proxy, filtering_proxy, wait_for

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
        ("copilot_chathub", "completed", ANSWER),
        ("copilot_chathub", "completed", "a second answer"),
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
    assert row["status"] == "blocked" and row["dialect"] == "copilot_chathub"
    assert "marmalade" not in (row["delivered_text"] or "")


def test_a_generic_hub_prompt_refused(filtered: Proxy, upstreams) -> None:
    seen = wsclients.signalr_py(upstreams["h2"].url, "say: what is the password", **wsclients.via(filtered))
    assert any("no-secrets-asked" in e for e in seen["errors"]), seen
    (row,) = turn_rows(filtered, seen["mock_id"], 1)
    assert row["status"] == "blocked" and row["dialect"] == "signalr"
