"""What each client sees when a content filter stops its answer: the dialect x SDK table.

A real mitmdump with a rule that blocks a code word in responses, the mock upstream
(TLS, HTTP/2) sending an answer with the word in it, and each Node client as its users
run it (``tests/node/filtered.mjs``: the official SDKs' helpers and the Vercel AI SDK's
providers, through the preload ``scripts/node-preload`` installs), streamed and not. Each
must report its API's own filtered outcome, with the text before the word (streams) or
none (held answers), and never throw: a thrown TypeError is a broken client. The table
is docs/filtered-outcomes.md; the Python SDKs' rows are tested in
test_output_filters_proxy.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from conftest import BACKENDS, Node, Proxy, guarded_proxy
from test_output_filters_proxy import DIRTY, RULES, TEXT, WORD

pytestmark = pytest.mark.e2e

WHOLE = "text=" + TEXT.replace(" ", "+")  # an answer held whole: no pacing needed
VERCEL = "content-filter"
INCOMPLETE = ["incomplete", "content_filter"]

# client -> (the outcome it reports, the finish_reasons the record states)
TABLE = {
    "openai-chat": ("content_filter", ["content_filter"]),
    "openai-responses": (INCOMPLETE, ["content_filter"]),
    "anthropic": ("refusal", ["refusal"]),
    "genai": ("SAFETY", ["SAFETY"]),
    "vercel-openai": (VERCEL, ["content_filter"]),
    "vercel-openai-chat": (VERCEL, ["content_filter"]),
    "vercel-anthropic": (VERCEL, ["refusal"]),
    "vercel-google": (VERCEL, ["SAFETY"]),
}


@pytest.fixture(scope="module", params=BACKENDS)
def guarded(request, tmp_path_factory, upstreams) -> Iterator[Proxy]:
    yield from guarded_proxy(request, tmp_path_factory, RULES, "filtered-outcomes", upstreams)


def run(node: Node, guarded: Proxy, upstreams, preload: str, client: str, scenario: str) -> tuple[dict, dict]:
    """The client's report and the exchange's record."""
    mock_id = uuid.uuid4().hex
    env = {
        "HTTPS_PROXY": guarded.url,
        "NODE_EXTRA_CA_CERTS": str(guarded.ca),
        "NODE_OPTIONS": preload,
        "PATH": "/usr/bin:/bin",
    }
    seen = node.run(
        "filtered.mjs",
        {"client": client, "baseURL": upstreams["h2"].url, "headers": {"x-mock": scenario, "x-mock-id": mock_id}},
        env=env,
    )
    return seen, guarded.mock_row(mock_id)


@pytest.mark.parametrize("client", TABLE)
def test_a_stopped_stream_is_the_apis_filtered_outcome_with_the_text_before_the_word(
    node, guarded, upstreams, preload, client
):
    seen, row = run(node, guarded, upstreams, preload, f"{client}-stream", DIRTY)
    outcome, finish_reasons = TABLE[client]
    assert "error" not in seen, seen
    assert seen["outcome"] == outcome
    assert WORD not in seen["text"] and TEXT.startswith(seen["text"]) and seen["text"]
    assert (row["status"], row["finish_reasons"], row["delivered_text"]) == ("blocked", finish_reasons, seen["text"])


@pytest.mark.parametrize("client", TABLE)
def test_a_held_answer_is_the_apis_filtered_outcome_with_no_text(node, guarded, upstreams, preload, client):
    seen, row = run(node, guarded, upstreams, preload, client, WHOLE)
    outcome, finish_reasons = TABLE[client]
    assert "error" not in seen, seen
    assert (seen["outcome"], seen["text"]) == (outcome, "")
    assert (row["status"], row["finish_reasons"], row["delivered_text"], row["client_status"]) == (
        "blocked",
        finish_reasons,
        "",
        None,
    )
    assert WORD in row["output_text"], "the record keeps what the upstream sent"
