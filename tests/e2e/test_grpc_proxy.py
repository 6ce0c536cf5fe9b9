"""grpcio, the official gRPC client, through a real mitmdump with the addon.

The upstream is the mock's gRPC server (``python -m mockllm --grpc``: grpcio, HTTP/2 with
TLS, gzip per message); the client's stubs are generated from ``tests/fixtures/proto`` at
test time by grpcio-tools. The client reaches the proxy as grpcio users configure it (the
``grpc.http_proxy`` channel option: an HTTP CONNECT tunnel) and trusts the proxy's CA
through ``ssl_channel_credentials``. Each call runs direct and through the proxy with the
same result; then the audit row must say what the client saw. Full-duplex calls pass
only because the addon streams their request bodies (``addon/turns.py``).
"""

from __future__ import annotations

import queue
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import orjson
import pytest
from conftest import (
    BACKENDS,
    RPC_OUTPUT_RULE,
    RPC_REQUEST_RULES,
    Proxy,
    Upstream,
    filtering_proxy,
    new_database,
    start_proxy,
    wait_for,
)

pytestmark = pytest.mark.e2e

PROMPT = "What is the weather in Vienna?"


@pytest.fixture(scope="module", params=BACKENDS)
def proxy(request, tmp_path_factory, grpc_upstream: Upstream) -> Iterator[Proxy]:
    """A mitmdump with the addon that trusts the gRPC mock's CA, on each backend in turn."""
    tmp = tmp_path_factory.mktemp(f"grpc-proxy-{request.param}")
    p = start_proxy(tmp, upstream_ca=grpc_upstream.ca, **new_database(request, request.param, tmp))
    yield p
    p.process.stop()


class Channels:
    """grpcio channels to the gRPC mock: direct (trusting the mock's CA) or through a proxy."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.target = upstream.url.removeprefix("https://")

    def open(self, via: Proxy | None) -> grpc.Channel:
        assert self.upstream.ca is not None
        ca = (via.ca if via else self.upstream.ca).read_bytes()
        options = [("grpc.http_proxy", via.url)] if via else [("grpc.enable_http_proxy", 0)]
        return grpc.secure_channel(self.target, grpc.ssl_channel_credentials(ca), options=options)

    def both(self, call: Callable[[grpc.Channel, list[tuple[str, str]]], Any], via: Proxy, scenario: str = ""):
        """``call`` direct, then through ``via``: (its result, the proxied mock id)."""
        results, mock_id = [], ""
        for route in (None, via):
            mock_id = uuid.uuid4().hex
            with self.open(route) as channel:
                results.append(call(channel, [("x-mock-id", mock_id), ("x-mock", scenario)]))
        assert results[1] == results[0]
        return results[1], mock_id


def final_rows(proxy: Proxy, mock_id: str, count: int) -> list[dict]:
    """The ``count`` final rows of the calls sent with ``x-mock-id: mock_id``, by turn
    (a record is written when its exchange or turn ends, a moment after the client saw it)."""

    def final() -> list[dict] | None:
        found = proxy.rows(header={"x-mock-id": mock_id})
        return found if len(found) == count and all(r["status"] != "in_progress" for r in found) else None

    return sorted(wait_for(final, 15, what=f"{count} final rows"), key=lambda r: r["turn"] or 0)


@pytest.fixture
def channels(grpc_upstream, proto_python) -> Channels:
    return Channels(grpc_upstream)


def echo(channel: grpc.Channel, metadata: list[tuple[str, str]]) -> tuple[str, list[str], list[str]]:
    """Unary, server stream and a half-duplex bidi (the request stream is complete up front)."""
    from echo.v1 import echo_pb2 as pb
    from echo.v1.echo_pb2_grpc import EchoServiceStub

    stub = EchoServiceStub(channel)
    say = stub.Say(pb.EchoRequest(sentence="hello there"), metadata=metadata)
    talk = [r.sentence for r in stub.Talk(pb.EchoRequest(sentence="one two three"), metadata=metadata)]
    requests = iter([pb.EchoRequest(sentence="first"), pb.EchoRequest(sentence="second")])
    chat = [r.sentence for r in stub.Chat(requests, metadata=metadata)]
    return say.sentence, talk, chat


def say_error(channel: grpc.Channel, metadata: list[tuple[str, str]]) -> tuple[str, str]:
    from echo.v1 import echo_pb2 as pb
    from echo.v1.echo_pb2_grpc import EchoServiceStub

    with pytest.raises(grpc.RpcError) as failure:
        EchoServiceStub(channel).Say(pb.EchoRequest(sentence="hello"), metadata=metadata)
    error: Any = failure.value
    return error.code().name, error.details()


def stream_chat(channel: grpc.Channel, metadata: list[tuple[str, str]]) -> str:
    from aiserver.v1 import chat_pb2 as pb
    from aiserver.v1.chat_pb2_grpc import AiServiceStub

    message = pb.ConversationMessage(text=PROMPT, type=pb.ConversationMessage.MESSAGE_TYPE_HUMAN)
    request = pb.GetChatRequest(conversation=[message], model_details=pb.ModelDetails(model_name="gpt-4o-mini"))
    return "".join(r.text for r in AiServiceStub(channel).StreamChat(request, metadata=metadata))


def agent(channel: grpc.Channel, metadata: list[tuple[str, str]]) -> list[tuple[str, int, int]]:
    """Cursor's Agent API over gRPC, full duplex: the second prompt waits for the first turn's end."""
    from agent.v1 import agent_pb2 as pb
    from agent.v1.agent_pb2_grpc import AgentServiceStub

    def action(text: str) -> Any:
        return pb.ConversationAction(user_message_action=pb.UserMessageAction(user_message=pb.UserMessage(text=text)))

    ended: queue.Queue[int] = queue.Queue()

    def requests() -> Iterator[Any]:
        run = pb.AgentRunRequest(action=action(PROMPT), model_details=pb.ModelDetails(model_name="gpt-5"))
        yield pb.AgentClientMessage(run_request=run)
        ended.get(timeout=20)
        yield pb.AgentClientMessage(conversation_action=action("And in Graz?"))
        ended.get(timeout=20)

    turns, text = [], ""
    for r in AgentServiceStub(channel).Run(requests(), metadata=metadata):
        update = r.interaction_update
        if update.HasField("text_delta"):
            text += update.text_delta.text
        elif update.HasField("turn_ended"):
            turns.append((text, update.turn_ended.input_tokens, update.turn_ended.output_tokens))
            text = ""
            ended.put(len(turns))
    return turns


def test_grpc_echo_unary_server_stream_and_bidi(channels: Channels, proxy: Proxy):
    out, mock_id = channels.both(echo, proxy)
    assert out == ("echo: hello there", ["one", "two", "three"], ["echo: first", "echo: second"])

    rows = {r["url_path"]: r for r in final_rows(proxy, mock_id, 3)}
    assert set(rows) == {f"/echo.v1.EchoService/{name}" for name in ("Say", "Talk", "Chat")}
    for name, strings in (("Say", [out[0]]), ("Talk", out[1]), ("Chat", out[2])):
        row = rows[f"/echo.v1.EchoService/{name}"]
        assert (row["dialect"], row["status"], row["http_status"]) == ("grpc", "completed", 200)
        assert all(s in orjson.dumps([row["output_text"], row["output"]]).decode() for s in strings)


def test_grpc_error_status_in_trailers(channels: Channels, proxy: Proxy):
    out, mock_id = channels.both(say_error, proxy, "error=permission_denied")
    assert out == ("PERMISSION_DENIED", "mock error: permission_denied")

    row = proxy.mock_row(mock_id)
    assert (row["dialect"], row["status"]) == ("grpc", "failed")
    assert (row["error_code"], row["error_message"]) == ("permission_denied", "mock error: permission_denied")


@pytest.mark.parametrize("scenario", ["", "size=2000&events=3"])
def test_grpc_cursor_stream_chat(channels: Channels, proxy: Proxy, scenario: str):
    """Small messages go uncompressed (grpc core sends a message plain when gzip would not
    make it smaller); 2000-byte deltas go gzip-compressed (flag 1, ``grpc-encoding: gzip``)."""
    text, mock_id = channels.both(stream_chat, proxy, scenario)
    assert text == "tök0 tök1 tök2 tök3 tök4" if not scenario else len(text.encode()) == 6000

    row = proxy.mock_row(mock_id)
    assert (row["dialect"], row["status"], row["request_model"], row["output_text"]) == (
        "cursor",
        "completed",
        "gpt-4o-mini",
        text,
    )


def test_grpc_cursor_agent_two_turns_full_duplex(channels: Channels, proxy: Proxy):
    turns, mock_id = channels.both(agent, proxy)
    assert turns == [("tök0 tök1 tök2 tök3 tök4", 6, 5), ("tök0 tök1 tök2 tök3 tök4", 3, 5)]

    rows = final_rows(proxy, mock_id, 2)
    assert [(r["output_text"], r["input_tokens"], r["output_tokens"]) for r in rows] == turns
    assert [r["turn"] for r in rows] == [0, 1] and rows[0]["connection_id"] == rows[1]["connection_id"]


# -- content filters ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def request_filtered(request, tmp_path_factory, grpc_upstream: Upstream, proxy: Proxy) -> Iterator[Proxy]:
    yield from filtering_proxy(request, tmp_path_factory, proxy.backend, RPC_REQUEST_RULES, grpc_upstream.ca)


def grpc_failure(call: Callable[[], Any]) -> tuple[str, str]:
    with pytest.raises(grpc.RpcError) as failure:
        call()
    error: Any = failure.value
    return error.code().name, error.details()


LAST_WORD_RULE = """
[[rule]]
id = "no-tok4"
kind = "keywords"
keywords = ["tök4"]
scope = "response"
action = "block"
"""
OUTPUT_BLOCKS = {
    # a word inside the answer: the status goes as trailers after the text before it
    "inside": (RPC_OUTPUT_RULE, "no-tok2", "tök2"),
    # the answer's very last word: only the body's end decides it (the word could go on),
    # so the status goes with the body's end, replacing the upstream's grpc-status 0
    "last-word": (LAST_WORD_RULE, "no-tok4", "tök4"),
}


@pytest.fixture(scope="module", params=list(OUTPUT_BLOCKS))
def output_filtered(
    request, tmp_path_factory, grpc_upstream: Upstream, proxy: Proxy
) -> Iterator[tuple[Proxy, str, str]]:
    """A proxy whose output rule blocks a word of the answer: (it, the rule, the word)."""
    rules, rule, word = OUTPUT_BLOCKS[request.param]
    for p in filtering_proxy(request, tmp_path_factory, proxy.backend, rules, grpc_upstream.ca):
        yield p, rule, word


def test_grpc_output_filter_ends_the_stream_with_status_7_in_trailers(
    channels: Channels, output_filtered: tuple[Proxy, str, str]
):
    """grpcio reports the filter's block as its normal error: PERMISSION_DENIED (7), the
    rule in the message, sent as HTTP/2 trailers."""
    proxy, rule, word = output_filtered
    mock_id = uuid.uuid4().hex
    with channels.open(proxy) as channel:
        code, message = grpc_failure(lambda: stream_chat(channel, [("x-mock-id", mock_id)]))
    assert code == "PERMISSION_DENIED" and rule in message

    row = proxy.mock_row(mock_id)
    assert (row["dialect"], row["status"]) == ("cursor", "blocked")
    assert word not in (row["delivered_text"] or "")


def test_grpc_request_filter_blocks_a_message_of_a_bidirectional_stream(channels: Channels, request_filtered: Proxy):
    """Cursor's agent over gRPC: the first turn passes, the follow-up about Graz is not
    forwarded; grpcio gets PERMISSION_DENIED."""
    mock_id = uuid.uuid4().hex
    with channels.open(request_filtered) as channel:
        code, message = grpc_failure(lambda: agent(channel, [("x-mock-id", mock_id)]))
    assert code == "PERMISSION_DENIED" and "no-graz" in message

    rows = final_rows(request_filtered, mock_id, 2)
    assert [(r["turn"], r["status"]) for r in rows] == [(0, "completed"), (1, "blocked")]


def test_grpc_request_filter_answers_before_anything_goes_upstream(channels: Channels, request_filtered: Proxy):
    """A unary call whose message a filter blocks: the upstream never sees it; grpcio gets
    PERMISSION_DENIED from the proxy's trailers-only answer."""
    from echo.v1 import echo_pb2 as pb
    from echo.v1.echo_pb2_grpc import EchoServiceStub

    mock_id = uuid.uuid4().hex
    with channels.open(request_filtered) as channel:
        stub = EchoServiceStub(channel)
        say = lambda: stub.Say(pb.EchoRequest(sentence="hello there"), metadata=[("x-mock-id", mock_id)])  # noqa: E731
        code, message = grpc_failure(say)
    assert code == "PERMISSION_DENIED" and "no-greetings" in message
    row = request_filtered.mock_row(mock_id)
    assert (row["dialect"], row["status"]) == ("grpc", "blocked")


WORD_RULE = """
[[rule]]
id = "no-nightjar"
kind = "keywords"
keywords = ["Nightjar"]
scope = "response"
action = "block"
"""
AWS_KEY = "AKIA" + "IOSFODNN7EXAMPLE"  # (an access key id the secrets detector knows)


@pytest.fixture(scope="module")
def word_filtered(request, tmp_path_factory, grpc_upstream: Upstream, proxy: Proxy) -> Iterator[Proxy]:
    yield from filtering_proxy(request, tmp_path_factory, proxy.backend, WORD_RULE, grpc_upstream.ca)


def test_grpc_a_word_ended_in_a_message_holding_a_key_is_blocked(channels: Channels, word_filtered: Proxy):
    """A service nobody mapped answers "Night", then "jar:" and a key: the record keeps
    that message as the key's fingerprint, and the output filters read it as sent, in the
    answer's stream. Before, they read the fingerprint there, and "Nightjar" reached the
    client past the rule (with no secrets rule loaded to stop the key itself)."""
    from echo.v1 import echo_pb2 as pb
    from echo.v1.echo_pb2_grpc import EchoServiceStub

    mock_id, got = uuid.uuid4().hex, []
    with channels.open(word_filtered) as channel:
        stub = EchoServiceStub(channel)
        talk = stub.Talk(pb.EchoRequest(sentence=f"Night jar:{AWS_KEY}"), metadata=[("x-mock-id", mock_id)])
        code, message = grpc_failure(lambda: got.extend(r.sentence for r in talk))
    assert code == "PERMISSION_DENIED" and "no-nightjar" in message
    assert not any("jar" in s for s in got)
    row = word_filtered.mock_row(mock_id)
    assert (row["dialect"], row["status"]) == ("grpc", "blocked")
    assert AWS_KEY.encode() not in orjson.dumps(row)  # (kept as its fingerprint, the request's and the answer's)


# -- a turn whose end marker never comes ---------------------------------------------------------


@pytest.fixture(scope="module")
def idle_ending(request, tmp_path_factory, grpc_upstream: Upstream, proxy: Proxy) -> Iterator[Proxy]:
    """A mitmdump that ends a turn nothing arrived for in one second, with a rule that
    flags the answer's last word (only the end of the text decides it: it could go on)."""
    tmp = tmp_path_factory.mktemp(f"grpc-idle-{proxy.backend}")
    database = new_database(request, proxy.backend, tmp)
    rules = tmp / "rules.toml"
    rules.write_text('[[rule]]\nid = "last-word"\nkind = "keywords"\nkeywords = ["tök4"]\naction = "flag"\n')
    p = start_proxy(
        tmp,
        "--set",
        "llm_audit_turn_idle_seconds=1",
        "--set",
        f"llm_rules={rules}",
        upstream_ca=grpc_upstream.ca,
        **database,
    )
    yield p
    p.process.stop()


def test_a_turn_without_its_end_marker_is_recorded_after_the_idle_timeout(channels: Channels, idle_ending: Proxy):
    """Cursor's agent stream whose ``turn_ended`` never comes (a release moved the field):
    the turn's record is written, complete with the finding ``turn_idle_timeout``, while
    the stream is still open; the turn's text is checked to its end first, so the flag on
    its last word is in the turn's record."""
    from agent.v1 import agent_pb2 as pb
    from agent.v1.agent_pb2_grpc import AgentServiceStub

    mock_id, hang_up = uuid.uuid4().hex, queue.Queue[None]()

    def requests() -> Iterator[Any]:
        action = pb.ConversationAction(
            user_message_action=pb.UserMessageAction(user_message=pb.UserMessage(text=PROMPT))
        )
        yield pb.AgentClientMessage(
            run_request=pb.AgentRunRequest(action=action, model_details=pb.ModelDetails(model_name="gpt-5"))
        )
        hang_up.get(timeout=30)

    with channels.open(idle_ending) as channel:
        call = AgentServiceStub(channel).Run(requests(), metadata=[("x-mock-id", mock_id), ("x-mock", "no_end")])
        text = ""
        for r in call:
            text += r.interaction_update.text_delta.text
            if text == "tök0 tök1 tök2 tök3 tök4":
                break
        row = idle_ending.mock_row(mock_id, timeout=10)  # written while the stream is open
        hang_up.put(None)
        call.cancel()
    assert (row["dialect"], row["status"], row["turn"], row["output_text"]) == ("cursor", "completed", 0, text)
    assert [f["code"] for f in row["findings"]] == ["turn_idle_timeout"]
    assert [(v["rule_id"], v["action"]) for v in row["verdicts"]] == [("last-word", "flag")]
