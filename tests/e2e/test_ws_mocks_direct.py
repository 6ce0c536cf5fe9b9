"""The WebSocket mock upstreams (mockllm.websocket) against the real clients of each protocol.

No auditing proxy here: each driver of tests/wsclients.py talks to the mock directly, over
plain HTTP/1.1 (``upstreams["h1"]``) and TLS (``upstreams["h2"]``, which serves HTTP/1.1
for the upgrade), and the last tests go through a plain mitmdump (no addon) to show every
driver's proxy and CA plumbing works: the e2e tests of the WebSocket audit run the same
drivers through the proxy with the addon.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import websockets
import wsclients
from conftest import BIN, Node, Process, Upstream

pytestmark = pytest.mark.e2e

ANSWER = "the secret word is marmalade"
PROMPT = f"say: {ANSWER}"
TRANSPORTS = ["h1", "h2"]


def target(upstreams: dict[str, Upstream], kind: str) -> tuple[str, Path | None]:
    up = upstreams[kind]
    return up.url, up.ca


def connection(up: Upstream, mock_id: str) -> tuple[dict, dict]:
    """What the mock received and sent on one WebSocket (``/_mock/requests`` and ``/_mock/sent``)."""
    with httpx.Client(verify=up._verify()) as c:
        received = c.get(f"{up.url}/_mock/requests/{mock_id}").json()
        sent = c.get(f"{up.url}/_mock/sent/{mock_id}").json()
    received["body"], sent["body"] = base64.b64decode(received["body_b64"]), base64.b64decode(sent["body_b64"])
    return received, sent


# -- OpenAI Realtime ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", TRANSPORTS)
@pytest.mark.parametrize("beta", [False, True], ids=["ga", "beta"])
@pytest.mark.parametrize("driver", [wsclients.realtime_sdk, wsclients.realtime_ws], ids=["openai-sdk", "websockets"])
def test_realtime_text(upstreams, kind, beta, driver):
    url, ca = target(upstreams, kind)
    seen = driver(url, PROMPT, ca=ca, beta=beta, model="gpt-realtime-mini")
    assert seen["text"] == ANSWER
    assert seen["model"] == "gpt-realtime-mini"
    assert seen["status"] == "completed"
    delta = "response.text.delta" if beta else "response.output_text.delta"
    assert seen["events"].count(delta) == 7  # pieces of PIECE characters
    assert ("conversation.item.created" in seen["events"]) is beta
    assert seen["events"][-1] == "response.done"
    usage = seen["usage"]
    assert usage["input_tokens"] == len(PROMPT.split()) + 1
    assert usage["output_tokens"] == usage["output_token_details"]["text_tokens"] == 7
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert usage["input_token_details"]["cached_tokens_details"]["audio_tokens"] == 0
    received, sent = connection(upstreams[kind], seen["mock_id"])
    assert received["websocket"] and received["path"] == "/v1/realtime"
    assert ANSWER.encode() in received["body"]  # the prompt's text
    assert sent["frames"][0]["text"].startswith('{"type":"session.created"')
    assert ANSWER[:4].encode() in sent["body"]


@pytest.mark.parametrize("beta", [False, True], ids=["ga", "beta"])
def test_realtime_audio_transcript(upstreams, beta):
    url, ca = target(upstreams, "h2")
    seen = wsclients.realtime_sdk(url, PROMPT, ca=ca, beta=beta, audio=True)
    assert seen["text"] == ANSWER
    prefix = "response.audio" if beta else "response.output_audio"
    assert f"{prefix}_transcript.delta" in seen["events"]
    assert seen["events"].count(f"{prefix}.delta") == 2
    assert seen["usage"]["output_token_details"]["audio_tokens"] == 14


@pytest.mark.parametrize("driver", [wsclients.realtime_sdk, wsclients.realtime_ws], ids=["openai-sdk", "websockets"])
def test_realtime_cancel(upstreams, driver):
    url, ca = target(upstreams, "h1")
    seen = driver(url, "delay_ms=40 " + PROMPT, ca=ca, cancel_after=2)
    assert seen["status"] == "cancelled"
    assert ANSWER.startswith(seen["text"]) and len(seen["text"]) < len(ANSWER)


def test_realtime_errors_and_close(upstreams):
    url, _ = target(upstreams, "h1")
    bad = {"type": "no.such.event", "event_id": "evt_bad"}
    seen = wsclients.realtime_ws(url, PROMPT, extra_events=[bad])
    assert seen["errors"] == [
        {
            "type": "invalid_request_error",
            "code": "invalid_value",
            "message": "Invalid value: 'no.such.event'. Supported values are: session.update, ...",
            "param": None,
            "event_id": "evt_bad",
        }
    ]
    assert seen["text"] == ANSWER  # the session stays usable
    failed = wsclients.realtime_ws(url, "fail_after=2 " + PROMPT)
    assert (failed["status"], failed["text"]) == ("failed", ANSWER[:8])
    assert failed["status_details"]["error"]["code"] == "mock_failure"
    closed = wsclients.realtime_ws(url, "close=1011 close_after=3 " + PROMPT)
    assert (closed["close_code"], closed["close_reason"], closed["text"]) == (1011, "mock close", ANSWER[:12])
    assert connection(upstreams["h1"], closed["mock_id"])[1]["close"] == {
        "by": "server",
        "code": 1011,
        "reason": "mock close",
    }


@pytest.mark.parametrize("driver", [wsclients.realtime_sdk, wsclients.realtime_ws], ids=["openai-sdk", "websockets"])
def test_realtime_turns_on_one_connection(upstreams, driver):
    seen = driver(upstreams["h2"].url, ["say: first answer", "say: second answer"], **wsclients.direct(upstreams["h2"]))
    assert [t["text"] for t in seen["turns"]] == ["first answer", "second answer"]
    assert [t["status"] for t in seen["turns"]] == ["completed", "completed"]
    assert seen["text"] == "first answersecond answer"
    assert seen["events"].count("session.created") == 1


@pytest.mark.parametrize("driver", [wsclients.realtime_sdk, wsclients.realtime_ws], ids=["openai-sdk", "websockets"])
def test_realtime_normal_close_mid_response(upstreams, driver):
    """A close with 1000 ends the client's loop without an exception: the driver still reports it."""
    seen = driver(upstreams["h1"].url, "close=1000 close_after=2 " + PROMPT)
    assert (seen["close_code"], seen["text"]) == (1000, ANSWER[:8])
    assert "status" not in seen


@pytest.mark.parametrize("driver", [wsclients.realtime_sdk, wsclients.realtime_ws], ids=["openai-sdk", "websockets"])
def test_realtime_function_call(upstreams, driver):
    seen = driver(upstreams["h1"].url, "tool=lookup " + PROMPT)
    (call,) = seen["tool_calls"]
    assert (call["name"], json.loads(call["arguments"])) == ("lookup", {"text": ANSWER})
    assert call["call_id"].startswith("call_") and seen["text"] == "" and seen["status"] == "completed"
    assert "response.function_call_arguments.delta" in seen["events"]


# -- Gemini Live ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", TRANSPORTS)
@pytest.mark.parametrize("binary", [False, True], ids=["text-frames", "binary-frames"])
@pytest.mark.parametrize("snake_case", [False, True], ids=["camel", "snake"])
def test_gemini_live_ws(upstreams, kind, binary, snake_case):
    url, ca = target(upstreams, kind)
    seen = wsclients.gemini_live_ws(url, PROMPT, ca=ca, binary=binary, snake_case=snake_case)
    assert seen["text"] == ANSWER
    assert seen["events"][0] == "setupComplete"
    assert set(seen["frame_kinds"]) == {"binary" if binary else "text"}
    assert seen["usage"] == {"promptTokenCount": 7, "responseTokenCount": 7, "totalTokenCount": 14}


@pytest.mark.parametrize(
    "path",
    [
        "/ws/google.ai.generativelanguage.v1alpha.GenerativeService.BidiGenerateContent",
        "/ws/google.ai.generativelanguage.v1alpha.GenerativeService.BidiGenerateContentConstrained",
        wsclients.VERTEX_LIVE_PATH,
    ],
)
def test_gemini_live_paths_and_audio(upstreams, path):
    url, _ = target(upstreams, "h1")
    seen = wsclients.gemini_live_ws(url, PROMPT, path=path, audio=True)
    assert seen["text"] == ANSWER  # from outputTranscription


def test_gemini_live_closes(upstreams):
    url, _ = target(upstreams, "h1")
    no_setup = wsclients.gemini_live_ws(url, PROMPT, skip_setup=True)
    assert (no_setup["close_code"], no_setup["close_reason"]) == (
        1007,
        "Invalid request: the first message must be setup.",
    )
    refused = wsclients.gemini_live_ws(url, PROMPT, model="blocked-model")
    assert refused["close_code"] == 1008 and refused["text"] == ""
    dropped = wsclients.gemini_live_ws(url, "fail_after=1 " + PROMPT)
    assert (dropped["close_code"], dropped["text"]) == (1011, ANSWER[:4])


@pytest.mark.parametrize("audio", [False, True], ids=["text", "audio"])
def test_gemini_live_sdk(upstreams, audio):
    """google-genai's live client: it always dials ``wss://``, so only the TLS upstream."""
    url, ca = target(upstreams, "h2")
    seen = wsclients.gemini_live_sdk(url, PROMPT, ca=ca, audio=audio)
    assert seen["text"] == ANSWER
    assert seen["usage"] == {"prompt_token_count": 7, "response_token_count": 7, "total_token_count": 14}
    received, _ = connection(upstreams["h2"], seen["mock_id"])
    assert received["path"] == "/ws/google.ai.generativelanguage.v1.GenerativeService.BidiGenerateContent"
    assert b'"setup"' in received["body"] and ANSWER.encode() in received["body"]


@pytest.mark.parametrize(
    "driver", [wsclients.gemini_live_sdk, wsclients.gemini_live_ws], ids=["google-genai", "websockets"]
)
def test_gemini_live_turns_on_one_connection(upstreams, driver):
    seen = driver(upstreams["h2"].url, ["say: one", "say: two"], **wsclients.direct(upstreams["h2"]))
    assert [t["text"] for t in seen["turns"]] == ["one", "two"]
    assert (
        seen["turns"][1]["usage"]["totalTokenCount" if driver is wsclients.gemini_live_ws else "total_token_count"] == 4
    )


@pytest.mark.parametrize(
    "driver", [wsclients.gemini_live_sdk, wsclients.gemini_live_ws], ids=["google-genai", "websockets"]
)
def test_gemini_live_tool_call(upstreams, driver):
    """A tool call, the client's toolResponse, then the turn's answer."""
    seen = driver(upstreams["h2"].url, "tool=lookup " + PROMPT, **wsclients.direct(upstreams["h2"]))
    (call,) = seen["tool_calls"]
    assert (call["name"], call["args"]) == ("lookup", {"text": ANSWER})
    assert seen["text"] == ANSWER


def test_gemini_live_sdk_refused(upstreams):
    url, ca = target(upstreams, "h2")
    seen = wsclients.gemini_live_sdk(url, PROMPT, ca=ca, model="blocked-model")
    assert seen["close_code"] == 1008 and seen["text"] == ""


# -- consumer Copilot -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_copilot_chat(upstreams, kind):
    url, ca = target(upstreams, kind)
    seen = wsclients.copilot_ws(url, PROMPT, ca=ca)
    assert seen["text"] == ANSWER
    events = [e for e in seen["events"] if e != "appendText"]
    assert events == [
        "connected",
        "pong",
        "received",
        "startMessage",
        "partCompleted",
        "done",
        "titleUpdate",
        "suggestedFollowups",
    ]
    received, _ = connection(upstreams[kind], seen["mock_id"])
    assert received["path"] == "/c/api/chat" and "api-version=2" in received["query"]


def test_copilot_turns_and_close(upstreams):
    seen = wsclients.copilot_ws(upstreams["h1"].url, ["say: one", "say: two"])
    assert [t["text"] for t in seen["turns"]] == ["one", "two"]
    closed = wsclients.copilot_ws(upstreams["h1"].url, "close=1000 close_after=1 " + PROMPT)
    assert (closed["close_code"], closed["text"]) == (1000, ANSWER[:4])


def test_copilot_error(upstreams):
    seen = wsclients.copilot_ws(upstreams["h1"].url, "fail_after=2 " + PROMPT)
    assert seen["text"] == ANSWER[:8] and seen["errors"][0]["event"] == "error"


# -- SignalR --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", TRANSPORTS)
@pytest.mark.parametrize("path", ["/sydney/ChatHub", "/m365Copilot/Chathub/00000000-oid@tid"])
def test_chathub_replayed(upstreams, kind, path):
    url, ca = target(upstreams, kind)
    seen = wsclients.chathub_ws(url, PROMPT, ca=ca, path=path)
    assert seen["text"] == seen["final"] == ANSWER
    assert seen["result"] == {"value": "Success", "message": ANSWER, "serviceVersion": "mock"}
    assert seen["events"][:3] == ["handshake:{}", 6, 1]  # ack, a ping, the throttling update
    assert seen["events"][-2:] == [2, 3]
    m365 = path.startswith("/m365")
    assert (seen["deltas"], seen["last_update"]) == ((ANSWER, True) if m365 else ("", False))
    _, sent = connection(upstreams[kind], seen["mock_id"])
    assert sent["frames"][-1]["text"].endswith(
        '}\x1e{"type":3,"invocationId":"0"}\x1e'
    )  # item and completion in one frame


def test_chathub_turns_on_one_connection(upstreams):
    seen = wsclients.chathub_ws(upstreams["h1"].url, ["say: one", "say: two"])
    assert [t["text"] for t in seen["turns"]] == ["one", "two"]
    assert [t["result"]["message"] for t in seen["turns"]] == ["one", "two"]


def test_chathub_throttled_and_failed(upstreams):
    seen = wsclients.chathub_ws(upstreams["h1"].url, "please throttle this")
    assert seen["result"]["value"] == "Throttled" and seen["text"] == "" and seen["final"] is None
    failed = wsclients.chathub_ws(upstreams["h1"].url, "fail_after=2 " + PROMPT)
    assert failed["errors"] == ["An unexpected error occurred invoking 'chat' on the server."]
    assert failed["text"] == ANSWER[:8] and failed["result"] is None


@pytest.mark.parametrize("kind", TRANSPORTS)
@pytest.mark.parametrize("protocol", ["json", "messagepack"])
@pytest.mark.parametrize("method", ["stream", "invoke"])
def test_pysignalr(upstreams, kind, protocol, method):
    url, ca = target(upstreams, kind)
    seen = wsclients.signalr_py(url, PROMPT, ca=ca, protocol=protocol, method=method)
    assert seen["errors"] == []
    assert seen["text"] == ANSWER
    if method == "stream":
        assert seen["items"] == [ANSWER[i : i + 4] for i in range(0, len(ANSWER), 4)]
    else:
        assert seen["result"] == ANSWER
    received, sent = connection(upstreams[kind], seen["mock_id"])
    first = received["frames"][0]  # pysignalr sends the MessagePack handshake as a binary frame
    handshake = first.get("text") or base64.b64decode(first["b64"]).decode()
    assert json.loads(handshake.rstrip("\x1e")) == {"protocol": protocol, "version": 1}
    assert {f["opcode"] for f in sent["frames"][1:]} == {"binary" if protocol == "messagepack" else "text"}


def test_pysignalr_error(upstreams):
    seen = wsclients.signalr_py(upstreams["h1"].url, "fail_after=1 " + PROMPT)
    assert seen["items"] == [ANSWER[:4]] and seen["errors"] == ["An unexpected error occurred invoking the mock."]


@pytest.mark.parametrize("kind", TRANSPORTS)
@pytest.mark.parametrize("protocol", ["json", "messagepack"])
@pytest.mark.parametrize("method", ["stream", "invoke", "chat"])
def test_signalr_node(upstreams, node: Node, kind, protocol, method):
    url, ca = target(upstreams, kind)
    path = "/sydney/ChatHub" if method == "chat" else "/hubs/chat"
    seen = wsclients.signalr_node(url, PROMPT, ca=ca, protocol=protocol, method=method, path=path, node=node.binary)
    assert seen["errors"] == []
    assert seen["text"] == ANSWER
    if method == "chat":
        assert seen["result"]["value"] == "Success"
        assert len(seen["updates"]) == 1 + 7  # throttling, then one cumulative snapshot per piece
    elif method == "invoke":
        assert seen["result"] == ANSWER


def test_signalr_node_cancel_and_errors(upstreams, node: Node):
    url = upstreams["h1"].url
    cancelled = wsclients.signalr_node(url, "delay_ms=50 " + PROMPT, cancel_after=2, node=node.binary)
    assert cancelled["items"] == [ANSWER[:4], ANSWER[4:8]]
    received, sent = connection(upstreams["h1"], cancelled["mock_id"])
    assert any('"type":5' in f.get("text", "") for f in received["frames"])  # CancelInvocation
    assert sent["frames"][-1]["text"].startswith('{"type":3')  # the mock still completes
    failed = wsclients.signalr_node(url, "fail_after=1 " + PROMPT, protocol="messagepack", node=node.binary)
    assert failed["items"] == [ANSWER[:4]] and failed["errors"] == ["An unexpected error occurred invoking the mock."]
    unknown = wsclients.signalr_node(url, PROMPT, path="/sydney/ChatHub", method="invoke", node=node.binary)
    assert unknown["errors"] == ["Unknown hub method 'Ask'"]
    negotiated = wsclients.signalr_node(url, PROMPT, skip_negotiation=False, node=node.binary)
    assert negotiated["text"] == ANSWER


def test_drivers_give_up_with_what_they_saw(upstreams, node: Node):
    """A conversation that outlasts ``timeout`` (here: slow pieces) returns the partial text, ``timed_out``."""
    slow = "delay_ms=1500 " + PROMPT
    url = upstreams["h1"].url
    for seen in (
        wsclients.realtime_ws(url, slow, timeout=1),
        wsclients.gemini_live_ws(url, slow, timeout=1),
        wsclients.copilot_ws(url, slow, timeout=1),
        wsclients.chathub_ws(url, slow, timeout=1),
        wsclients.signalr_py(url, slow, timeout=1),
        wsclients.signalr_node(url, slow, timeout=1, node=node.binary),
    ):
        assert seen["timed_out"] is True and seen["text"] == ANSWER[:4], seen
    assert wsclients.realtime_ws(url, PROMPT)["timed_out"] is False


def test_odd_frames_get_the_protocol_s_answer_not_a_crash(upstreams):
    """Garbage in: Realtime answers ``error`` and stays usable, Gemini closes 1007, a hub without
    a handshake closes 1002, Copilot ignores it; odd field types are tolerated."""
    base = upstreams["h1"].url

    async def talk(path: str, frames: list[str | bytes], answers: int) -> tuple[list, int | None]:
        got: list = []
        async with websockets.connect(wsclients.ws_url(base, path), proxy=None) as ws:
            for frame in frames:
                await ws.send(frame)
            try:
                for _ in range(answers):
                    got.append(await asyncio.wait_for(ws.recv(), 5))
            except websockets.ConnectionClosed as exc:
                return got, exc.rcvd.code if exc.rcvd else 1006
        return got, None

    odd = [
        "not json",
        b"\xff\x00",
        '{"type": "session.update", "session": 5}',
        '{"type": "conversation.item.create", "item": []}',
    ]
    got, code = asyncio.run(talk("/v1/realtime?model=m", odd, 4))
    kinds = [json.loads(g)["type"] for g in got]
    assert kinds == ["session.created", "error", "error", "session.updated"] and code is None
    assert asyncio.run(talk(wsclients.GEMINI_LIVE_PATH, ["{}"], 1)) == ([], 1007)
    assert asyncio.run(talk(wsclients.GEMINI_LIVE_PATH, ['{"setup": {}}', "[1]"], 2))[1] == 1007
    assert asyncio.run(talk("/hubs/chat", ['{"type":1}\x1e'], 1)) == ([], 1002)
    hub = [
        '{"protocol":"json","version":1}\x1e',
        '{"type":4,"invocationId":"1","target":"Generate","arguments":[7]}\x1e',
    ]
    got, _ = asyncio.run(talk("/hubs/chat", hub, 3))
    assert json.loads(got[2].rstrip("\x1e"))["error"] == "Failed to invoke 'Generate': expected one string argument."
    got, _ = asyncio.run(talk("/c/api/chat", ["garbage", '{"event": "send", "content": "x"}'], 22))
    events = [json.loads(g)["event"] for g in got]  # (read to the end: a client that stops reading
    assert events[:3] == ["connected", "received", "startMessage"]  # stalls its own close handshake)
    assert events[-1] == "suggestedFollowups"


SAMPLES = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "protocol-samples"


def _sample_lines(name: str) -> list[dict]:
    """The one-line JSON frames of a sample file (lines its author elided with "..." are left out)."""
    frames = []
    for line in (SAMPLES / name).read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(ValueError):
            frames.append(json.loads(line))
    return [f for f in frames if isinstance(f, dict)]


def _sent_json(up: Upstream, mock_id: str) -> list[dict]:
    frames = connection(up, mock_id)[1]["frames"]
    texts = [f.get("text") or base64.b64decode(f["b64"]).decode() for f in frames]
    return [json.loads(r) for t in texts for r in t.split("\x1e") if r.strip()]


@pytest.mark.skipif(not SAMPLES.exists(), reason="../shared/reference/protocol-samples not present")
def test_the_mock_s_frames_carry_the_captured_frames_fields(upstreams):
    """Every field of the captured frames (shared samples) is in the mock's frame of that kind."""
    up = upstreams["h1"]
    realtime = _sent_json(up, wsclients.realtime_ws(up.url, PROMPT)["mock_id"])
    captured = {e["type"]: e for e in _sample_lines("openai-realtime/unresolved-repo_ga-gpt-realtime-ws-frames.jsonl")}
    mock = {e["type"]: e for e in realtime}
    delta = set(captured["response.output_audio_transcript.delta"]) - {"obfuscation"}  # padding, not content
    assert delta <= set(mock["response.output_text.delta"])
    for kind in ("response.created", "response.output_item.added", "response.content_part.added"):
        assert set(captured[kind]) <= set(mock[kind]), kind
    usage = _sample_lines("openai-realtime/unresolved-repo_beta-gpt-4o-realtime-preview-response-done.json")[0]
    assert set(usage["response"]["usage"]) == set(mock["response.done"]["response"]["usage"])
    copilot = _sent_json(up, wsclients.copilot_ws(up.url, PROMPT)["mock_id"])
    flow = {e["event"]: e for e in _sample_lines("copilot/unresolved-repo_copilot-v2-cdp-observed-flow.txt")}
    for event in copilot:
        if event["event"] in flow:
            assert set(flow[event["event"]]) <= set(event), event["event"]
    sydney = _sent_json(up, wsclients.chathub_ws(up.url, PROMPT)["mock_id"])
    frames = _sample_lines("copilot/hncboy-ai-beehive_sydney-chathub-frames.txt")
    captured_bot = next(f for f in frames if f["type"] == 1 and "messages" in f["arguments"][0])["arguments"][0]
    mock_bot = next(f for f in sydney if f.get("type") == 1 and "messages" in f["arguments"][0])["arguments"][0]
    wanted = set(captured_bot["messages"][0]) - {"timestamp", "feedback", "privacy"}  # no meaning for an auditor
    assert wanted <= set(mock_bot["messages"][0]) and set(captured_bot) <= set(mock_bot)


def test_unknown_path_refused(upstreams):
    with pytest.raises(websockets.InvalidStatus) as refused:
        wsclients.realtime_ws(upstreams["h1"].url + "/elsewhere", PROMPT)
    assert refused.value.response.status_code == 403


# -- through a plain mitmdump (no addon): the drivers' proxy and CA options ------------------


@pytest.fixture(scope="module")
def mitm(tmp_path_factory, upstreams) -> Iterator[SimpleNamespace]:
    """A mitmdump without the addon, shaped like conftest's ``Proxy`` for ``wsclients.via``."""
    tmp = tmp_path_factory.mktemp("plain-mitm")
    cmd = [str(BIN / "mitmdump"), "--listen-host", "127.0.0.1", "--listen-port", "0", "--set", f"confdir={tmp}"]
    cmd += ["--set", f"ssl_verify_upstream_trusted_ca={upstreams['h2'].ca}"]
    process = Process.start(cmd)
    port = process.wait_line(r"(?i)proxy listening at .*:(\d+)", timeout=120).group(1)
    yield SimpleNamespace(url=f"http://127.0.0.1:{port}", ca=tmp / "mitmproxy-ca-cert.pem")
    process.stop()


DRIVERS = {
    "realtime-sdk": lambda url, **kw: wsclients.realtime_sdk(url, PROMPT, **kw),
    "realtime-sdk-beta": lambda url, **kw: wsclients.realtime_sdk(url, PROMPT, beta=True, **kw),
    "realtime-ws": lambda url, **kw: wsclients.realtime_ws(url, PROMPT, **kw),
    "gemini-live-sdk": lambda url, **kw: wsclients.gemini_live_sdk(url, PROMPT, **kw),
    "gemini-live-ws": lambda url, **kw: wsclients.gemini_live_ws(url, PROMPT, binary=True, **kw),
    "copilot": lambda url, **kw: wsclients.copilot_ws(url, PROMPT, **kw),
    "chathub": lambda url, **kw: wsclients.chathub_ws(url, PROMPT, path="/m365Copilot/Chathub/x", **kw),
    "pysignalr": lambda url, **kw: wsclients.signalr_py(url, PROMPT, protocol="messagepack", **kw),
}


@pytest.mark.parametrize("name", DRIVERS)
def test_through_plain_mitmdump(upstreams, mitm, name):
    seen = DRIVERS[name](upstreams["h2"].url, **wsclients.via(mitm))
    assert seen["text"] == ANSWER
    assert connection(upstreams["h2"], seen["mock_id"])[0]["frames"]  # it did reach the mock


@pytest.mark.parametrize("driver", [wsclients.realtime_sdk, wsclients.gemini_live_sdk], ids=["openai", "google-genai"])
def test_sdks_through_plain_mitmdump_from_the_environment(upstreams, mitm, driver):
    """Code as users write it, with only HTTPS_PROXY and SSL_CERT_FILE set."""
    seen = driver(upstreams["h2"].url, PROMPT, **wsclients.via(mitm), from_env=True)
    assert seen["text"] == ANSWER and seen["errors"] == []


@pytest.mark.parametrize("protocol", ["json", "messagepack"])
def test_signalr_node_through_plain_mitmdump(upstreams, mitm, node: Node, protocol):
    seen = wsclients.signalr_node(
        upstreams["h2"].url, PROMPT, **wsclients.via(mitm), protocol=protocol, node=node.binary
    )
    assert seen["text"] == ANSWER and seen["errors"] == []
