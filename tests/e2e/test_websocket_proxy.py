"""WebSocket inference through a real mitmdump with the addon (issue 19), over TLS to the
mock's WebSocket upstreams (mockllm.websocket), with the clients each protocol's users
run (tests/wsclients.py): the official openai SDK's realtime client and ``websockets``
(OpenAI Realtime), google-genai's live client (Gemini Live), ``@microsoft/signalr`` and
pysignalr (SignalR hubs, JSON and MessagePack), a plain client replaying Copilot.

Each connection gives one record per answer (its turn) and one for the connection
(``turn`` NULL), all with the same ``connection_id``; each turn's record has the text
the client saw, the model where the protocol names it, usage where it is sent. Content
filters: an output block reaches each client as its protocol's error, with no character
of the match delivered, and the connection carries on where the protocol allows; a
blocked client message never reaches the upstream.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from datetime import UTC
from typing import Any

import genai_prices
import pytest
import websockets

from storage.cost import SNAPSHOT
from tests import wsclients
from tests.conftest import BACKENDS, Proxy, filtering_proxy, wait_for

pytestmark = pytest.mark.timeout(180)

OUTPUT_RULES = """
[[rule]]
id = "no-code-name"
kind = "keywords"
keywords = ["Nightjar"]
scope = "response"
action = "block"
reason = "internal code name"

[[rule]]
id = "no-graz"
kind = "keywords"
keywords = ["Graz"]
scope = "request"
action = "block"
reason = "no questions about Graz"
"""
# What the mock says for "say: ...": a sentence whose middle is the blocked word.
LEAK = "say: The project is called Nightjar and it ships soon."


def connection_rows(proxy: Proxy, mock_id: str, turns: int, timeout: float = 20.0) -> tuple[list[dict], dict]:
    """The final turn records (by turn) and the connection record of the connection the
    client opened with ``mock_id``, once all are written."""

    def ready() -> tuple[list[dict], dict] | None:
        rows = by_mock(proxy, mock_id)
        if any(r["status"] == "in_progress" for r in rows):
            return None
        conn = [r for r in rows if r["turn"] is None]
        done = sorted((r for r in rows if r["turn"] is not None), key=lambda r: r["turn"])
        return (done, conn[0]) if len(conn) == 1 and len(done) == turns else None

    try:
        return wait_for(ready, timeout, what=f"{turns} turn rows and a connection row for {mock_id}")
    except AssertionError:
        rows = [(r["turn"], r["status"], r["output_text"], r["findings"]) for r in by_mock(proxy, mock_id)]
        raise AssertionError(f"rows: {rows}\n{proxy.process.output[-3000:]}") from None


def by_mock(proxy: Proxy, mock_id: str) -> list[dict]:
    """The rows of the connection the drivers named ``mock_id`` (an ``x-mock-id`` header of
    its upgrade, or a query parameter where the client sets no headers)."""
    return proxy.rows(f"url_query LIKE ? OR {proxy.header_sql('x-mock-id')} = ?", (f"%mock_id={mock_id}%", mock_id))


def mock_id() -> str:
    return f"ws-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module", params=BACKENDS)
def filtering(request, tmp_path_factory, upstreams) -> Iterator[Proxy]:
    yield from filtering_proxy(request, tmp_path_factory, request.param, OUTPUT_RULES, upstreams["h2"].ca)


# -- OpenAI Realtime -----------------------------------------------------------------------


@pytest.mark.parametrize("beta", [False, True], ids=["ga", "beta"])
def test_realtime_sdk_two_answers_are_two_turn_records(proxy: Proxy, upstreams, beta: bool) -> None:
    mid = mock_id()
    seen = wsclients.realtime_sdk(
        upstreams["h2"].url, ["say: Hello there.", "say: And again."], beta=beta, mock_id=mid, **wsclients.via(proxy)
    )
    assert not seen["errors"] and not seen["timed_out"], seen
    turns, conn = connection_rows(proxy, mid, 2)
    assert [t["output_text"] for t in turns] == [t["text"] for t in seen["turns"]] == ["Hello there.", "And again."]
    for row, client in zip(turns, seen["turns"]):
        assert row["dialect"] == "openai-realtime" and row["status"] == "completed"
        assert row["response_model"] == wsclients.REALTIME_MODEL or row["request_model"] == wsclients.REALTIME_MODEL
        assert row["input_tokens"] == client["usage"]["input_tokens"]
        assert row["connection_id"] == conn["connection_id"]
    assert turns[1]["request_body"]["messages"][-1]["content"] == "say: And again."
    assert conn["status"] == "completed" and conn["http_status"] == 101
    assert any(f["code"] == "websocket_closed" for f in conn["findings"])


def test_realtime_ws_audio_transcript(proxy: Proxy, upstreams) -> None:
    mid = mock_id()
    seen = wsclients.realtime_ws(
        upstreams["h2"].url, "say: Spoken words.", audio=True, mock_id=mid, **wsclients.via(proxy)
    )
    (turn,), _ = connection_rows(proxy, mid, 1)
    assert turn["output_text"] == seen["text"] == "Spoken words."
    assert turn["usage_details"]["output_audio_tokens"] == seen["usage"]["output_token_details"]["audio_tokens"]
    # audio tokens priced as audio: genai-prices' own reading of the usage the client got
    extracted = genai_prices.extract_usage(
        {"response": {"usage": seen["usage"]}}, provider_id="openai", api_flavor="realtime"
    )
    model = turn["response_model"] or turn["request_model"]
    started = turn["started_at"].replace(tzinfo=UTC) if turn["started_at"].tzinfo is None else turn["started_at"]
    expected = SNAPSHOT.calc(extracted.usage, model, "openai", None, started).total_price
    assert expected > 0 and float(turn["cost_usd"]) == pytest.approx(float(expected), abs=1e-12)


REALTIME_DRIVERS = pytest.mark.parametrize(
    "driver", [wsclients.realtime_sdk, wsclients.realtime_ws], ids=["openai-sdk", "websockets"]
)


@REALTIME_DRIVERS
def test_realtime_output_block_is_the_protocol_s_error_and_the_session_goes_on(
    filtering: Proxy, upstreams, driver
) -> None:
    mid = mock_id()
    seen = driver(upstreams["h2"].url, [LEAK, "say: All fine."], mock_id=mid, **wsclients.via(filtering))
    assert "Nightjar" not in seen["text"] and "Nightj" not in str(seen["events"])
    assert seen["errors"], seen  # the error event
    assert seen["turns"][0]["status"] in ("incomplete", "failed")
    assert seen["turns"][1]["text"] == "All fine."  # the connection carried on
    turns, conn = connection_rows(filtering, mid, 2)
    assert [t["status"] for t in turns] == ["blocked", "completed"]
    assert "Nightjar" in turns[0]["output_text"] and "Nightjar" not in (turns[0]["delivered_text"] or "")
    assert conn["status"] == "completed"


@REALTIME_DRIVERS
def test_realtime_request_block_never_reaches_the_upstream(filtering: Proxy, upstreams, driver) -> None:
    mid = mock_id()
    seen = driver(
        upstreams["h2"].url, ["How is the weather in Graz?", "say: ok."], mock_id=mid, **wsclients.via(filtering)
    )
    assert seen["errors"], seen
    received = upstreams["h2"].received(mid)
    assert "Graz" not in str(received)
    rows = wait_for(lambda: [r for r in by_mock(filtering, mid) if r["status"] == "blocked"] or None)
    assert rows[0]["turn"] == 0


def realtime_two_at_once(upstream: Any, proxy: Proxy, mid: str, first: str, beside: str) -> list[dict]:
    """A ``websockets`` client that asks for the default response ``first`` and, beside it,
    an out-of-band one ``beside`` (the mock makes them take turns, a piece each); once both
    have ended for it and the mock has sent both ends, one more response ("say: All fine.").
    Every event it received, in order."""

    def user(text: str) -> dict:
        return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}

    def ended_upstream() -> bool:
        sent = upstream.sent(mid).get("frames", [])
        return sum('"response.done"' in f.get("text", "") for f in sent) >= 2

    async def read_until_done(ws: Any, events: list[dict], responses: int) -> None:
        while sum(e["type"] == "response.done" for e in events) < responses:
            events.append(json.loads(await asyncio.wait_for(ws.recv(), 20)))

    async def talk() -> list[dict]:
        url = wsclients.ws_url(upstream.url, "/v1/realtime?model=gpt-realtime")
        headers = {"Authorization": "Bearer sk-test-realtime", "x-mock-id": mid}
        ssl = wsclients.ssl_context(url, proxy.ca)
        async with websockets.connect(url, proxy=proxy.url, ssl=ssl, additional_headers=headers) as ws:
            for event in (
                {"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}},
                {"type": "conversation.item.create", "item": user(f"say: {first} interleave=1")},
                {"type": "response.create"},
                {"type": "response.create",
                 "response": {"conversation": "none", "input": [user(f"say: {beside} interleave=1")]}},
            ):  # fmt: skip
                await ws.send(json.dumps(event))
            events: list[dict] = []
            await read_until_done(ws, events, 2)
            await asyncio.to_thread(wait_for, ended_upstream, 20, what="the mock's end of both responses")
            for event in (
                {"type": "conversation.item.create", "item": user("say: All fine.")},
                {"type": "response.create"},
            ):
                await ws.send(json.dumps(event))
            await read_until_done(ws, events, 3)
            return events

    return asyncio.run(talk())


@pytest.mark.parametrize(
    "first", ["One two three.", "One two."], ids=["across-the-other-s-deltas", "across-the-other-s-end"]
)
def test_realtime_two_responses_at_once_are_two_texts_and_both_end(filtering: Proxy, upstreams, first: str) -> None:
    """The out-of-band response writes the blocked word across the default one's deltas
    ("One two three.": "thre" between "Nigh" and "tjar"), or across its end ("One two.": its
    response.done between them): it is one word all the same, the client never gets it,
    both responses end for it once, nothing of them comes after, and the session goes on."""
    mid = mock_id()
    events = realtime_two_at_once(upstreams["h2"], filtering, mid, first, "The Nightjar sings.")
    ids = list(dict.fromkeys(e["response"]["id"] for e in events if e["type"] == "response.created"))
    assert len(ids) == 3, events

    def of(rid: str) -> list[dict]:
        return [e for e in events if rid in (e.get("response_id"), (e.get("response") or {}).get("id"))]

    said = {rid: "".join(e["delta"] for e in of(rid) if e["type"] == "response.output_text.delta") for rid in ids}
    assert "Nightj" not in json.dumps(events) and not any("tjar" in text for text in said.values()), said
    assert [e["error"]["code"] for e in events if e["type"] == "error"] == ["content_filtered"]
    for rid in ids:
        kinds = [e["type"] for e in of(rid)]
        assert kinds[0] == "response.created" and kinds.count("response.done") == 1, (rid, kinds)
        assert kinds[-1] == "response.done", (rid, kinds)  # nothing of it after its end
    dones = [e["response"] for e in events if e["type"] == "response.done"]
    assert [d["status"] for d in dones] == ["incomplete", "incomplete", "completed"]
    assert said[ids[2]] == "All fine."
    cancels = [f for f in upstreams["h2"].received(mid)["frames"] if '"response.cancel"' in f.get("text", "")]
    assert cancels  # the upstream was asked to stop what was cut
    turns, conn = connection_rows(filtering, mid, 3)
    blocked = [t for t in turns if t["status"] == "blocked"]
    assert len(blocked) == 1 and [v["rule_id"] for v in blocked[0]["verdicts"]] == ["no-code-name"]
    assert turns[2]["status"] == "completed" and turns[2]["output_text"] == "All fine."
    assert conn["status"] == "completed"


def test_a_websocket_no_dialect_claims_passes_unchanged_and_unrecorded(proxy: Proxy, upstreams) -> None:
    """A WebSocket whose upgrade and first message are no inference protocol's (a hub
    path, but no SignalR handshake) is let go: its messages pass as they are, no record."""
    from websockets.sync.client import connect

    mid = mock_id()
    url = wsclients.ws_url(upstreams["h2"].url, "/hubs/chat")
    ctx = wsclients.ssl_context(url, proxy.ca)
    with connect(url, ssl=ctx, proxy=proxy.url, additional_headers={"x-mock-id": mid}, open_timeout=20) as ws:
        ws.send('{"hello":"not a handshake"}')
        try:
            ws.recv(timeout=5)
        except Exception:  # noqa: BLE001 - the hub closes on a bad handshake; what matters is below
            pass
    frames = upstreams["h2"].received(mid)
    assert "not a handshake" in str(frames)  # it reached the upstream unchanged
    assert by_mock(proxy, mid) == [] and proxy.rows(header={"x-mock-id": mid}) == []


# -- Gemini Live -----------------------------------------------------------------------------


@pytest.mark.parametrize("audio", [False, True], ids=["text", "audio"])
def test_gemini_live_sdk_turns_with_usage(proxy: Proxy, upstreams, audio: bool) -> None:
    mid = mock_id()
    seen = wsclients.gemini_live_sdk(
        upstreams["h2"].url, ["say: Bonjour.", "say: Encore."], audio=audio, mock_id=mid, **wsclients.via(proxy)
    )
    assert not seen["errors"] and not seen["timed_out"], seen
    turns, conn = connection_rows(proxy, mid, 2)
    assert [t["output_text"] for t in turns] == ["Bonjour.", "Encore."] == [t["text"] for t in seen["turns"]]
    for row, client in zip(turns, seen["turns"]):
        assert row["dialect"] == "gemini-live" and row["status"] == "completed"
        assert row["request_model"].endswith(wsclients.GEMINI_LIVE_MODEL)
        assert row["input_tokens"] == client["usage"]["prompt_token_count"]
        assert row["output_tokens"] == client["usage"]["response_token_count"]
        assert float(row["cost_usd"]) == pytest.approx(gemini_live_price(client["usage"], row), abs=1e-12)
    assert conn["status"] == "completed"


def gemini_live_price(usage: dict, row: dict) -> float:
    """genai-prices' figure for the counts the client got, by modality (audio is priced apart)."""
    counts = {"input_tokens": usage["prompt_token_count"], "output_tokens": usage["response_token_count"]}
    for side, key in (("input", "prompt_tokens_details"), ("output", "response_tokens_details")):
        for detail in usage.get(key) or []:
            counts[f"{side}_{detail['modality'].lower()}_tokens"] = detail["token_count"]
    started = row["started_at"].replace(tzinfo=UTC) if row["started_at"].tzinfo is None else row["started_at"]
    model = wsclients.GEMINI_LIVE_MODEL
    return float(SNAPSHOT.calc(genai_prices.Usage(**counts), model, "google", None, started).total_price)


def test_gemini_live_output_block_closes_with_1008(filtering: Proxy, upstreams) -> None:
    mid = mock_id()
    seen = wsclients.gemini_live_ws(upstreams["h2"].url, LEAK, mock_id=mid, **wsclients.via(filtering))
    assert "Nightjar" not in seen["text"] and seen["close_code"] == 1008, seen
    assert "internal code name" in (seen["close_reason"] or "")
    (turn,), conn = connection_rows(filtering, mid, 1)
    assert turn["status"] == "blocked" and "Nightjar" not in (turn["delivered_text"] or "")
    assert any("by the proxy" in f["detail"] for f in conn["findings"] if f["code"] == "websocket_closed")


# -- consumer Copilot -------------------------------------------------------------------------


def test_copilot_turns(proxy: Proxy, upstreams) -> None:
    mid = mock_id()
    seen = wsclients.copilot_ws(
        upstreams["h2"].url, ["say: One answer.", "say: Two answers."], mock_id=mid, **wsclients.via(proxy)
    )
    turns, conn = connection_rows(proxy, mid, 2)
    assert [t["output_text"] for t in turns] == ["One answer.", "Two answers."] == [t["text"] for t in seen["turns"]]
    assert {t["dialect"] for t in turns} == {"copilot"} and {t["status"] for t in turns} == {"completed"}
    assert turns[0]["request_body"]["messages"][-1]["content"] == "say: One answer."


def test_copilot_output_block_is_an_error_event(filtering: Proxy, upstreams) -> None:
    mid = mock_id()
    seen = wsclients.copilot_ws(upstreams["h2"].url, [LEAK, "say: Next."], mock_id=mid, **wsclients.via(filtering))
    assert "Nightjar" not in seen["text"] and "error" in seen["events"], seen
    assert seen["turns"][-1]["text"] == "Next."
    turns, _ = connection_rows(filtering, mid, 2)
    assert [t["status"] for t in turns] == ["blocked", "completed"]


def test_stats_count_the_answers_not_the_connection(proxy: Proxy, upstreams) -> None:
    """``llm-audit stats`` counts a connection's answers; its own record is no exchange."""
    import subprocess

    import orjson

    from tests.conftest import BIN

    mid = mock_id()
    wsclients.copilot_ws(upstreams["h2"].url, ["say: a.", "say: b.", "say: c."], mock_id=mid, **wsclients.via(proxy))
    turns, conn = connection_rows(proxy, mid, 3)
    proc = subprocess.run(
        [str(BIN / "llm-audit"), "--db", proxy.db_url, "stats", "--dialect", "copilot", "--format", "jsonl"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    (totals,) = [orjson.loads(line) for line in proc.stdout.splitlines()]
    copilot = [r for r in proxy.rows("dialect = ?", ("copilot",)) if r["turn"] is not None]
    assert totals["exchanges"] == len(copilot) >= 3

    def show(record_id: str) -> str:
        cmd = [str(BIN / "llm-audit"), "--db", proxy.db_url, "show", record_id]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        assert (done.returncode, done.stderr) == (0, ""), done
        return done.stdout

    assert f"{conn['connection_id']} · turn 1" in show(turns[1]["id"])
    assert "the connection itself" in show(conn["id"]) and "websocket_closed" in show(conn["id"])


def test_a_long_connection_keeps_a_bounded_copy_for_mitmproxy_s_views(tmp_path_factory, upstreams) -> None:
    """mitmproxy keeps a WebSocket flow's messages for its views: the addon keeps only the
    latest up to llm_audit_view_bytes, and the audit records every turn all the same."""
    from tests.conftest import start_proxy

    tmp = tmp_path_factory.mktemp("ws-view-bytes")
    p = start_proxy(
        tmp,
        "--set",
        "llm_audit_view_bytes=2048",
        "--set",
        f"save_stream_file={tmp / 'flows'}",
        upstream_ca=upstreams["h2"].ca,
    )
    try:
        mid = mock_id()
        texts = [f"say: {'long answer ' * 40}{n}." for n in range(6)]
        seen = wsclients.copilot_ws(upstreams["h2"].url, texts, mock_id=mid, **wsclients.via(p))
        turns, _ = connection_rows(p, mid, 6)
        assert [t["output_text"] for t in turns] == [t["text"] for t in seen["turns"]]
    finally:
        p.process.stop()
    from mitmproxy import io

    with open(tmp / "flows", "rb") as f:
        (flow,) = [fl for fl in io.FlowReader(f).stream() if getattr(fl, "websocket", None) is not None]
    assert sum(len(m.content) for m in flow.websocket.messages) <= 2048 + 4096


def test_gemini_live_request_block_closes_with_1008_before_the_upstream_hears_it(filtering: Proxy, upstreams) -> None:
    mid = mock_id()
    seen = wsclients.gemini_live_ws(
        upstreams["h2"].url, "How is the weather in Graz?", mock_id=mid, **wsclients.via(filtering)
    )
    assert seen["close_code"] == 1008 and "no questions about Graz" in (seen["close_reason"] or ""), seen
    assert "Graz" not in str(upstreams["h2"].received(mid))
    (turn,), _ = connection_rows(filtering, mid, 1)
    assert turn["status"] == "blocked"


def test_copilot_request_block_is_an_error_event(filtering: Proxy, upstreams) -> None:
    mid = mock_id()
    seen = wsclients.copilot_ws(
        upstreams["h2"].url, ["How is the weather in Graz?", "say: Next."], mock_id=mid, **wsclients.via(filtering)
    )
    assert seen["errors"] and seen["turns"][-1]["text"] == "Next.", seen
    assert "Graz" not in str(upstreams["h2"].received(mid))
    turns, _ = connection_rows(filtering, mid, 2)
    assert [t["status"] for t in turns] == ["blocked", "completed"]


def test_a_proxy_that_stops_during_an_answer_records_the_partial_turn(tmp_path_factory, upstreams) -> None:
    """SIGTERM while an answer streams: the turn is recorded with what it had, cut on the
    client's side, and the connection's record is final; both say the proxy stopped."""
    import threading
    import time

    from tests.conftest import start_proxy

    tmp = tmp_path_factory.mktemp("ws-shutdown")
    p = start_proxy(tmp, upstream_ca=upstreams["h2"].ca)
    mid = mock_id()
    text = "say: " + " ".join(f"word{n}" for n in range(200)) + " delay_ms=30"
    done: dict = {}
    client = threading.Thread(
        target=lambda: done.update(
            wsclients.realtime_ws(upstreams["h2"].url, text, mock_id=mid, timeout=30, **wsclients.via(p))
        )
    )
    client.start()
    try:
        wait_for(lambda: any(r["turn"] == 0 for r in by_mock(p, mid)), 20, what="the turn's write-ahead row")
        time.sleep(0.5)  # some of the answer has streamed
    finally:
        assert p.process.stop() == 0
    client.join(40)
    rows = {r["turn"]: r for r in by_mock(p, mid)}
    turn, conn = rows[0], rows[None]
    assert turn["status"] == "client_aborted" and turn["output_text"].startswith("word0 word1")
    assert {"proxy_shutdown"} <= {f["code"] for f in turn["findings"]}
    assert conn["status"] == "completed" and "proxy_shutdown" in {f["code"] for f in conn["findings"]}
