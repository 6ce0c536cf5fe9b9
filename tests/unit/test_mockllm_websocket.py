"""mockllm.websocket's pure parts: the prompt's knobs, and the SignalR MessagePack framing."""

from __future__ import annotations

import msgpack
import pytest

from mockllm.websocket import DEFAULT_ANSWER, Plan, _from_msgpack, _to_msgpack, _unpack, _varint, _varint_split


def test_plan_reads_the_answer_and_the_knobs():
    plan = Plan.parse("please delay_ms=25 fail_after=3 say: the answer close=1011 close_after=2")
    assert plan == Plan(text="the answer", delay=0.025, fail_after=3, close=1011, close_after=2)
    assert plan.pieces() == ["the ", "answ", "er"]
    assert Plan.parse("hello") == Plan(text=DEFAULT_ANSWER)
    assert Plan.parse("hello", {"delay_ms": ["40"]}).delay == 0.04


@pytest.mark.parametrize(
    ("n", "encoded"), [(0, b"\x00"), (53, b"\x35"), (5248, b"\x80\x29"), (2**31 - 1, b"\xff\xff\xff\xff\x07")]
)
def test_varint_is_the_spec_s(n, encoded):
    assert _varint(n) == encoded


def test_varint_split_gives_the_same_bodies_at_every_split():
    """The spec's two-frame example, fed in two pieces cut at every offset."""
    wire = bytes.fromhex("0B68656C6C6F0A776F726C64020102")
    for cut in range(len(wire) + 1):
        first, rest = _varint_split(wire[:cut])
        second, left = _varint_split(rest + wire[cut:])
        assert first + second == [b"hello\nworld", b"\x01\x02"] and left == b""


@pytest.mark.parametrize(
    ("message", "spec_hex"),
    [
        ({"type": 2, "invocationId": "xyz", "item": 42}, "940280a378797a2a"),
        ({"type": 3, "invocationId": "xyz", "error": "Error"}, "950380a378797a01a54572726f72"),
        ({"type": 3, "invocationId": "xyz"}, "940380a378797a02"),
        ({"type": 3, "invocationId": "xyz", "result": 42}, "950380a378797a032a"),
        ({"type": 6}, "9106"),
    ],
)
def test_server_messages_encode_as_the_spec_s_bytes(message, spec_hex):
    assert msgpack.packb(_to_msgpack(message), use_bin_type=True).hex() == spec_hex


def test_client_messages_decode_from_the_spec_s_bytes():
    stream = _from_msgpack(_unpack(bytes.fromhex("960480a378797aa66d6574686f64912a90")))
    assert stream == {"type": 4, "invocationId": "xyz", "target": "method", "arguments": [42]}
    assert _from_msgpack(_unpack(bytes.fromhex("930580a378797a"))) == {"type": 5, "invocationId": "xyz"}
    assert _from_msgpack(_unpack(b"\xc1")) == {}  # not MessagePack: ignored, never raised
