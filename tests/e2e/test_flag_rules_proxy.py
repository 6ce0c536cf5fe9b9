"""Rules that only flag, end to end: nothing is held back, every match is recorded.

A real mitmdump whose rules all flag (none blocks) checks the output without holding it:
the stream reaches the client as the upstream sent it, and the auditor reads it in runs
of chunks (``addon.auditor.READ_RUN``), the run's text checked as one piece. The record
must still hold a verdict for every match: in every run of a long stream, and in what
came before a client walked away (the abort reads and checks the last run).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import BACKENDS, Proxy, guarded_proxy
from test_llm_stream_proxy import Exchange

pytestmark = pytest.mark.e2e

WORD = "Nightjar"
RULES = f"""
[[rule]]
id = "code-name"
kind = "keywords"
keywords = ["{WORD}"]
scope = "response"
action = "flag"

[[rule]]
id = "early"
kind = "regex"
pattern = "tok7 tok7"
action = "flag"

[[rule]]
id = "middle"
kind = "regex"
pattern = "tok150 tok150"
action = "flag"

[[rule]]
id = "late"
kind = "regex"
pattern = "tok290 tok290"
action = "flag"
"""


@pytest.fixture(scope="module", params=BACKENDS)
def flagging(request, tmp_path_factory, upstreams) -> Iterator[Proxy]:
    yield from guarded_proxy(request, tmp_path_factory, RULES, "flag-rules", upstreams)


@pytest.mark.parametrize("transport", ["h1", "h2"])
def test_a_long_stream_passes_unchanged_with_a_verdict_from_every_run(flagging, upstreams, transport):
    up = upstreams[transport]
    ex = Exchange(flagging, up, transport, "events=300&size=256&ascii=1")  # about 90 KB: several runs
    sent = up.sent(ex.id)
    assert ex.error is None and ex.body == sent["body"] and len(ex.body) > 3 * 32 * 1024
    row = flagging.row(ex.id)
    assert row["status"] == "completed" and row["delivered_text"] is None
    assert {v["rule_id"] for v in row["verdicts"]} == {"early", "middle", "late"}
    assert {v["action"] for v in row["verdicts"]} == {"flag"}


def test_a_client_that_walks_away_keeps_the_verdicts_of_what_came(flagging, upstreams):
    up = upstreams["h1"]
    text = f"The+plan+is+called+{WORD}+and+it+" + "goes+on+" * 20
    ex = Exchange(flagging, up, "h1", f"events=30&delay=0.1&text={text}", read_events=8)
    row = flagging.row(ex.id)
    assert row["status"] == "client_aborted"
    assert WORD in row["output_text"]
    assert [(v["action"], v["rule_id"]) for v in row["verdicts"]] == [("flag", "code-name")]
