"""The mock's protobuf methods (mockllm/rpc.py, protowire.py, connect.py), without a network.

The mock encodes protobuf by hand; here its messages are parsed with the classes protoc
generates from ``tests/fixtures/proto`` (the ``proto_python`` fixture), so a field number
that drifted from the schemas fails here before any client sees it.
"""

from __future__ import annotations

import asyncio
import gzip
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mockllm import connect, protowire
from mockllm.rpc import METHODS, AgentRun, GetChatMessage, StreamChat, UnifiedChat
from mockllm.scenario import Scenario


def test_protowire_round_trip() -> None:
    data = protowire.text(1, "hé") + protowire.uint(2, 300) + protowire.blob(3, protowire.text(1, "in")) + b""
    assert protowire.fields(data) == [(1, "hé".encode()), (2, 300), (3, b"\x0a\x02in")]
    assert protowire.get_text(data, 3, 1) == "in" and protowire.get(data, 2) == [300]
    assert protowire.uint(4, 0) == b"" and protowire.text(4, "") == b""
    assert protowire.varint(-1) == b"\xff" * 9 + b"\x01"  # an int64 -1: ten bytes
    with pytest.raises(ValueError):
        protowire.fields(b"\x0a\x05ab")


def test_agent_turns_parse_with_the_schema(proto_python) -> None:
    from agent.v1 import agent_pb2 as pb

    action = pb.ConversationAction(user_message_action=pb.UserMessageAction(user_message=pb.UserMessage(text="a b c")))
    first = pb.AgentClientMessage(run_request=pb.AgentRunRequest(action=action)).SerializeToString()
    later = pb.AgentClientMessage(conversation_action=action).SerializeToString()
    conversation = AgentRun(Scenario.parse("reasoning=1&events=2"))
    for request in (first, later):
        answer = conversation.answer(request)
        assert not answer.done and answer.error is None  # the stream stays open after a turn
        updates = [pb.AgentServerMessage.FromString(m).interaction_update for m in answer.messages]
        kinds = [u.WhichOneof("message") for u in updates]
        assert kinds == ["thinking_delta"] * 2 + ["heartbeat", "thinking_delta"] + ["text_delta"] * 2 + ["turn_ended"]
        assert "".join(u.text_delta.text for u in updates) == "tök0 tök1"
        assert (updates[-1].turn_ended.input_tokens, updates[-1].turn_ended.output_tokens) == (3, 5)
    heartbeat = pb.AgentClientMessage(exec_client_control_message=pb.ExecClientControlMessage(heartbeat={}))
    assert conversation.answer(heartbeat.SerializeToString()).messages == []  # no user message, no turn
    assert conversation.close().done


def test_unified_chat_waits_for_the_tool_result(proto_python) -> None:
    from aiserver.v1 import chat_pb2 as pb

    chat = pb.StreamUnifiedChatRequestWithTools(stream_unified_chat_request=pb.StreamUnifiedChatRequest())
    result = pb.StreamUnifiedChatRequestWithTools(client_side_tool_v2_result=pb.ClientSideToolV2Result())
    conversation = UnifiedChat(Scenario.parse("thinking=1&tool=ls"))
    first = [
        pb.StreamUnifiedChatResponseWithTools.FromString(m)
        for m in conversation.answer(chat.SerializeToString()).messages
    ]
    assert first[-1].client_side_tool_v2_call.name == "ls"
    assert first[3].stream_unified_chat_response.thinking.signature
    rest = conversation.answer(result.SerializeToString())
    assert (
        rest.done
        and pb.StreamUnifiedChatResponseWithTools.FromString(rest.messages[0]).stream_unified_chat_response.text
    )


def test_windsurf_and_stream_chat_parse_with_the_schema(proto_python) -> None:
    from aiserver.v1 import chat_pb2
    from exa.api_server_pb import api_server_pb2 as pb

    request = pb.GetChatMessageRequest(messages=[pb.ChatMessage(role=1, text="one two")], model_name="m")
    answer = GetChatMessage(Scenario.parse("reasoning=1&events=1")).answer(request.SerializeToString())
    last = pb.GetChatMessageResponse.FromString(answer.messages[-1])
    assert (last.finish, last.usage.prompt_tokens, last.usage.cache_read_tokens, last.usage.model) == (2, 2, 7, "m")
    assert [pb.GetChatMessageResponse.FromString(m).reasoning for m in answer.messages[:3]] == [
        "Let me",
        " think",
        " it över.",
    ]
    chat = StreamChat(Scenario.parse("error=internal&error_after=1")).answer(b"")
    assert [chat_pb2.StreamChatResponse.FromString(m).text for m in chat.messages] == ["", "", "tök0"]
    assert chat.error == ("internal", "mock error: internal")


def test_end_stream_messages() -> None:
    assert connect.end_stream(None, cursor=True) == b"\x02\x00\x00\x00\x02{}"
    framed = connect.end_stream(("permission_denied", "no"), cursor=True)
    error = orjson.loads(framed[5:])["error"]
    assert (framed[0], error["code"], error["message"]) == (2, "permission_denied", "no")
    assert error["details"][0]["type"] == "aiserver.v1.ErrorDetails"
    assert "details" not in orjson.loads(connect.end_stream(("internal", "x"), cursor=False)[5:])["error"]


class _Recorder:
    def __init__(self) -> None:
        self.request: dict[str, Any] = {}
        self.completed = self.disconnected = False

    def wrote(self, data: bytes) -> None:
        pass


def _read(chunks: list[bytes], compressed: bool) -> list[bytes]:
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def read() -> list[bytes]:
        return [m async for m in connect._Request(receive, _Recorder(), compressed).messages()]

    return asyncio.run(read())


MESSAGES = [b"", b"first", "zwëite".encode() * 50]
BODY = b"".join(
    connect.envelope(1, gzip.compress(m)) if i == 1 else connect.envelope(0, m) for i, m in enumerate(MESSAGES)
)


@given(st.lists(st.integers(0, len(BODY)), max_size=6))
def test_request_envelopes_read_the_same_whatever_the_split(cuts: list[int]) -> None:
    bounds = [0, *sorted(cuts), len(BODY)]
    chunks = [BODY[a:b] for a, b in zip(bounds, bounds[1:])]
    assert _read(chunks, compressed=True) == MESSAGES


def test_request_envelope_errors() -> None:
    with pytest.raises(ValueError, match="inside an envelope"):
        _read([BODY[:-1]], compressed=True)
    with pytest.raises(ValueError, match="without connect-content-encoding"):
        _read([BODY], compressed=False)


def test_every_method_has_a_kind() -> None:
    assert {m.kind for m in METHODS.values()} == {"unary", "server", "bidi"}
    assert all(path.count("/") == 2 for path in METHODS)
