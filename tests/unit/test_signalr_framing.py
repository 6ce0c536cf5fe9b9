"""The SignalR framings: handshake, JSON records cut on 0x1E, MessagePack records cut by
their VarInt length, across and within WebSocket messages, bounded, never raising."""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import pytest

from addon.findings import CODES
from addon.framing import FRAMINGS
from addon.framing.signalr import (
    JSON_WRITER,
    MAX_CONTAINERS,
    MSGPACK_WRITER,
    HubMessage,
    HubReader,
    handshake_framing,
    hub_message,
    varint,
)

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "protocol-samples" / "signalr"
RS = b"\x1e"
JSON_HELLO = b'{"protocol":"json","version":1}\x1e'
MSGPACK_HELLO = b'{"protocol":"messagepack","version":1}\x1e'

# The spec's examples, written out here (type, JSON object, MessagePack body hex).
EXAMPLES = [
    ({"type": 1, "invocationId": "xyz", "target": "method", "arguments": [42]}, "960180a378797aa66d6574686f64912a90"),
    ({"type": 1, "target": "method", "arguments": [42]}, "960180c0a66d6574686f64912a90"),
    ({"type": 4, "invocationId": "xyz", "target": "method", "arguments": [42]}, "960480a378797aa66d6574686f64912a90"),
    ({"type": 2, "invocationId": "xyz", "item": 42}, "940280a378797a2a"),
    ({"type": 3, "invocationId": "xyz", "error": "Error"}, "950380a378797a01a54572726f72"),
    ({"type": 3, "invocationId": "xyz"}, "940380a378797a02"),
    ({"type": 3, "invocationId": "xyz", "result": 42}, "950380a378797a032a"),
    ({"type": 5, "invocationId": "xyz"}, "930580a378797a"),
    ({"type": 6}, "9106"),
    ({"type": 7, "error": "xyz"}, "9207a378797a"),
    ({"type": 7, "error": "xyz", "allowReconnect": True}, "9307a378797ac3"),
    ({"type": 8, "sequenceId": 36}, "9208cc24"),
    ({"type": 9, "sequenceId": 19}, "9209cc13"),
    (
        {"type": 1, "headers": {"x": "y", "z": "z"}, "invocationId": "xyz", "target": "method", "arguments": [42]},
        "960182a178a179a17aa17aa378797aa66d6574686f64912a90",
    ),
]
NAMES = {1: "invocation", 2: "stream_item", 3: "completion", 4: "stream_invocation", 5: "cancel_invocation"}
NAMES |= {6: "ping", 7: "close", 8: "ack", 9: "sequence"}


def json_reader(limit: int = 1 << 20) -> HubReader:
    return FRAMINGS["signalr_json"].reader(limit, 0, {})  # type: ignore[return-value]


def msgpack_reader(limit: int = 1 << 20) -> HubReader:
    return FRAMINGS["signalr_msgpack"].reader(limit, 0, {})  # type: ignore[return-value]


def messages(reader: HubReader, data: bytes, cuts: list[int]) -> list[HubMessage]:
    """``data`` fed as WebSocket messages cut at ``cuts``."""
    bounds = [0, *cuts, len(data)]
    out = []
    for a, b in zip(bounds, bounds[1:]):
        out.extend(reader.feed(data[a:b]))
    reader.end()
    return out  # type: ignore[return-value]


def json_stream() -> bytes:
    return b"{}" + RS + b"".join(json.dumps(m).encode() + RS for m, _ in EXAMPLES)


def msgpack_stream() -> bytes:
    bodies = [bytes.fromhex(h) for _, h in EXAMPLES]
    return b"{}" + RS + b"".join(varint(len(b)) + b for b in bodies)


def test_the_json_examples_are_read_with_their_names_ids_and_fields() -> None:
    frames = messages(json_reader(), json_stream(), [])
    assert frames[0].event == "handshake" and frames[0].message == {}
    for frame, (expected, _) in zip(frames[1:], EXAMPLES, strict=True):
        assert frame.message == expected
        assert frame.event == NAMES[expected["type"]]
        assert frame.id == expected.get("invocationId", "")
        assert json.loads(frame.data) == expected and frame.raw == frame.data.encode()


def test_the_msgpack_examples_normalize_to_the_json_field_names() -> None:
    frames = messages(msgpack_reader(), msgpack_stream(), [])
    assert frames[0].event == "handshake"
    for frame, (expected, body) in zip(frames[1:], EXAMPLES, strict=True):
        assert frame.message == expected, body
        assert frame.event == NAMES[expected["type"]] and frame.data == ""
        assert frame.raw == bytes.fromhex(body)


@pytest.mark.parametrize("stream", [json_stream, msgpack_stream])
def test_every_split_gives_the_same_records(stream) -> None:
    data = stream()
    make = json_reader if stream is json_stream else msgpack_reader
    whole = messages(make(), data, [])
    for cut in range(1, len(data)):
        assert messages(make(), data, [cut]) == whole, cut
    for cut in range(1, len(data) - 7, 5):  # three messages
        assert messages(make(), data, [cut, cut + 7]) == whole, cut


def test_boundaries_are_record_ends() -> None:
    reader = json_reader()
    out = reader.feed_bounded(b'{}\x1e{"type":6}\x1e{"ty')
    assert [end for _, end in out] == [3, 14] and reader.held == 4
    out = reader.feed_bounded(b'pe":6}\x1e')
    assert [end for _, end in out] == [25] and reader.held == 0


def test_a_spec_varint_frames_two_bodies() -> None:
    reader = msgpack_reader()
    reader.feed(b"{}\x1e")
    reader.feed(bytes.fromhex("0b68656c6c6f0a776f726c64020102"))  # "Hello\nWorld", then 01 02: not MessagePack
    assert [c for c, _ in reader.findings] == ["signalr_invalid", "signalr_invalid"]
    assert reader.held == 0


def test_varint_round_trip() -> None:
    from addon.framing.signalr import _varint

    for n in (0, 1, 53, 127, 128, 5248, 2**31 - 1):
        assert _varint(varint(n)) == (n, len(varint(n)))
    assert varint(53) == b"\x35" and varint(5248) == b"\x80\x29" and varint(2**31 - 1) == bytes.fromhex("ffffffff07")


def test_handshake_framing() -> None:
    assert handshake_framing(JSON_HELLO) == "signalr_json"
    assert handshake_framing(MSGPACK_HELLO) == "signalr_msgpack"
    assert handshake_framing(JSON_HELLO + b'{"type":6}\x1e') == "signalr_json"
    for other in (
        b'{"protocol":"json","version":1}',  # no separator
        b'{"protocol":"json","version":2}\x1e',
        b'{"protocol":"json","version":true}\x1e',
        b'{"protocol":"blazorpack","version":1}\x1e',
        b'["json"]\x1e',
        b'{"event":"setOptions"}',
        b"\x1e",
        b"",
        b"not json\x1e",
    ):
        assert handshake_framing(other) is None, other


LENIENT_HELLO = b'{"protocol":"json","version":1,"x":NaN}\x1e'


def test_a_handshake_only_lenient_json_readers_take_is_claimed_and_read_with_a_finding() -> None:
    """Records are read as the peers' JSON readers take them; the handshake the same, or a
    hub that accepts it would go unrecorded."""
    assert handshake_framing(LENIENT_HELLO) == "signalr_json"
    assert handshake_framing(b'{"protocol":"messagepack","version":1,"x":"\\ud800"}\x1e') == "signalr_msgpack"
    reader = json_reader()
    frames = reader.feed(LENIENT_HELLO + b'{"type":2,"invocationId":"1","item":"hi","n":1e400}\x1e{"type":6}\x1e')
    assert [(f.event, f.message.get("item")) for f in frames] == [
        ("handshake", None),
        ("stream_item", "hi"),
        ("ping", None),
    ]
    assert [c for c, _ in reader.findings] == ["lenient_json", "lenient_json"]
    assert "lenient_json" in CODES
    strict = json_reader()
    strict.feed(JSON_HELLO + b'{"type":6}\x1e')
    assert strict.findings == []


def test_a_server_handshake_error_is_read() -> None:
    reader = json_reader()
    (frame,) = reader.feed(b'{"error":"Requested protocol \'messagepack\' is not available."}\x1e')
    assert frame.event == "handshake" and "messagepack" in frame.message["error"]


def test_malformed_json_records_are_findings() -> None:
    reader = json_reader()
    frames = reader.feed(b'{}\x1enot json\x1e[1,2]\x1e{"type":42}\x1e{"type":"1"}\x1e\x1e  \x1e{"type":6}\x1e')
    assert [f.event for f in frames] == ["handshake", "unknown", "unknown", "ping"]
    assert [c for c, _ in reader.findings] == ["signalr_invalid"] * 4


def test_invalid_utf8_is_read_with_replacement() -> None:
    reader = json_reader()
    (_, frame) = reader.feed(b'{}\x1e{"type":2,"invocationId":"1","item":"a\xffb"}\x1e')
    assert frame.message["item"] == "a\ufffdb"


def test_an_oversize_json_record_is_skipped_to_its_separator() -> None:
    reader = json_reader(limit=64)
    big = b'{"type":2,"invocationId":"1","item":"' + b"x" * 200 + b'"}'
    frames = []
    frames += reader.feed(b"{}\x1e" + big[:50])
    frames += reader.feed(big[50:150])
    assert reader.held > 64  # still held: a gate applies the failure policy
    frames += reader.feed(big[150:] + b'\x1e{"type":6}\x1e')
    assert [f.event for f in frames] == ["handshake", "ping"]
    assert [c for c, _ in reader.findings] == ["signalr_record_too_large"]
    assert len(reader._buf) == 0 and reader.held == 0


def test_an_oversize_msgpack_record_is_skipped_by_its_length() -> None:
    reader = msgpack_reader(limit=64)
    body = msgpack.packb([2, {}, "1", "x" * 300])
    frames = reader.feed(b"{}\x1e" + varint(len(body)) + body[:100])
    frames += reader.feed(body[100:] + b"\x02\x91\x06")
    assert [f.event for f in frames] == ["handshake", "ping"]
    assert [c for c, _ in reader.findings] == ["signalr_record_too_large"]


def test_a_huge_declared_length_holds_nothing() -> None:
    reader = msgpack_reader(limit=1024)
    reader.feed(b"{}\x1e" + bytes.fromhex("ffffffff07"))
    for _ in range(50):
        reader.feed(b"\x00" * 100_000)
    assert len(reader._buf) == 0
    assert [c for c, _ in reader.findings] == ["signalr_record_too_large"]


@pytest.mark.parametrize("prefix", ["ffffffffff01", "ffffffff7f", "8080808010"])
def test_a_length_prefix_that_cannot_be_one_stops_the_reading(prefix: str) -> None:
    reader = msgpack_reader()
    reader.feed(b"{}\x1e")
    out = reader.feed_bounded(bytes.fromhex(prefix) + b"\x02\x91\x06")
    assert out[-1][0] is None and reader.held == 0
    assert reader.unreadable and [c for c, _ in reader.findings] == ["signalr_invalid"]
    assert reader.feed(b"\x02\x91\x06") == []


@pytest.mark.parametrize(
    "body",
    [
        b"\x91" * 5000 + b"\x90",  # nested arrays deeper than the unpacker's stack
        b"\xdd\x00\x01\x00\x00" + b"\x90" * 65536,  # an array of empty arrays beyond the container budget
        b"\xdf\x00\x00\x10\x00" + b"\xa1k\x80" * 4096,  # a map of maps (duplicate keys)
        b"\xdd\xff\xff\xff\xff",  # an array declaring 4 billion elements
        b"\xdb\xff\xff\xff\xff",  # a string declaring 4 GB
        b"\xc6\xff\xff\xff\xff",  # binary declaring 4 GB
        b"\x81\x91\x01\x02",  # a map keyed by an array
        b"\xc1",  # the never-used byte
        b"\x92\x06\x06\x06",  # extra data after the value
        b"\xd6\xff\x00",  # a truncated timestamp extension
        b"\xa3abc",  # a string, not an array
        b"\x93\x63\x80\xa1x",  # unknown type 99
        b"\x92\x02\x80",  # a stream item too short
        b"\x95\x03\x80\xa1x\x07\x00",  # an unknown result kind
        b"",  # an empty body
    ],
)
def test_hostile_msgpack_bodies_are_findings(body: bytes) -> None:
    reader = msgpack_reader()
    frames = reader.feed(b"{}\x1e" + varint(len(body)) + body + b"\x02\x91\x06")
    assert frames[0].event == "handshake" and frames[-1].event == "ping"
    assert all(f.event == "unknown" for f in frames[1:-1])
    assert [c for c, _ in reader.findings] == ["signalr_invalid"]


def test_the_container_budget_is_what_a_real_message_needs() -> None:
    body = msgpack.packb([2, {}, "1", [{"a": [i]} for i in range(MAX_CONTAINERS // 3)]])
    reader = msgpack_reader()
    frames = reader.feed(b"{}\x1e" + varint(len(body)) + body)
    assert frames[1].event == "stream_item" and not reader.findings


def test_binary_values_stay_bytes() -> None:
    body = msgpack.packb([2, {}, "1", {"audio": b"\x00\x01", "text": "hi"}], use_bin_type=True)
    reader = msgpack_reader()
    (_, frame) = reader.feed(b"{}\x1e" + varint(len(body)) + body)
    assert frame.message["item"] == {"audio": b"\x00\x01", "text": "hi"}


def test_the_connection_ending_inside_a_record_is_a_finding() -> None:
    reader = json_reader()
    reader.feed(b'{}\x1e{"type":')
    assert reader.pending_event
    reader.end()
    assert [c for c, _ in reader.findings] == ["signalr_invalid"]


def test_writers_round_trip_through_the_readers() -> None:
    frames = [hub_message(m) for m, _ in EXAMPLES]
    (text,) = JSON_WRITER.encode_messages(frames)
    assert JSON_WRITER.text and text.endswith(RS) and text.count(RS) == len(frames)
    reader = json_reader()
    reader.feed(b"{}\x1e")
    assert [f.message for f in reader.feed(text)] == [m for m, _ in EXAMPLES]
    (binary,) = MSGPACK_WRITER.encode_messages(frames)
    assert not MSGPACK_WRITER.text
    reader = msgpack_reader()
    reader.feed(b"{}\x1e")
    assert [f.message for f in reader.feed(binary)] == [m for m, _ in EXAMPLES]
    assert MSGPACK_WRITER.encode_messages([hub_message({"type": 6})]) == [b"\x02\x91\x06"]
    assert JSON_WRITER.encode_messages([]) == [] and MSGPACK_WRITER.encode_messages([]) == []


def test_hub_message_names_the_frame() -> None:
    frame = hub_message({"type": 3, "invocationId": "7", "error": "no"})
    assert (frame.event, frame.id, frame.data) == ("completion", "7", '{"type":3,"invocationId":"7","error":"no"}')


def test_finding_codes_are_registered() -> None:
    assert {"signalr_invalid", "signalr_record_too_large"} <= CODES.keys()


@pytest.mark.skipif(not SHARED.exists(), reason="shared protocol samples not present")
def test_shared_spec_examples() -> None:
    doc = json.loads((SHARED / "aspnetcore_HubProtocol-spec-examples.json").read_text())
    reader = json_reader()
    reader.feed(b"{}\x1e")
    for example in doc["json_examples"]:
        frames = reader.feed(json.dumps(example["json"]).encode() + RS)
        assert len(frames) == 1 and frames[0].message == example["json"], example["name"]
    assert [c for c, _ in reader.findings] == ["signalr_invalid", "signalr_invalid"]  # the two handshakes: no type
    reader = msgpack_reader()
    reader.feed(b"{}\x1e")
    for example in doc["messagepack_examples_body_hex"]:
        body = bytes.fromhex(example["hex"])
        (frame,) = reader.feed(varint(len(body)) + body)
        assert frame.event != "unknown", example["name"]
    assert not reader.findings


@pytest.mark.parametrize("binary", [False, True])
def test_random_bytes_never_raise_and_stay_bounded(binary: bool) -> None:
    import random

    rng = random.Random(11)
    for _ in range(300):
        reader = msgpack_reader(limit=512) if binary else json_reader(limit=512)
        reader.feed(b"{}\x1e")
        for _ in range(rng.randint(1, 6)):
            chunk = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 300)))
            if not binary and rng.random() < 0.5:
                chunk = chunk.replace(b"\x1e", b"") + b"\x1e"
            out = reader.feed_bounded(chunk)
            assert all(end <= reader._offset for _, end in out)
            assert len(reader._buf) <= 512 + 5
        reader.end()
        assert all(code in CODES for code, _ in reader.findings)


@pytest.mark.parametrize("encoding", ["json", "messagepack"])
def test_a_message_of_a_million_empty_records_is_not_read_record_by_record(encoding: str) -> None:
    """Lone 0x1E (JSON) or zero lengths (MessagePack) are records of nothing: a message of
    a million of them is cut off after MAX_RECORDS_PER_MESSAGE, with a finding, and the
    reader reads the next message's records again."""
    from addon.framing.signalr import MAX_RECORDS_PER_MESSAGE

    reader = json_reader() if encoding == "json" else msgpack_reader()
    reader.feed(JSON_HELLO if encoding == "json" else MSGPACK_HELLO)
    flood = (RS if encoding == "json" else b"\x00") * 1_000_000
    bounded = reader.feed_bounded(flood)
    assert len(bounded) <= MAX_RECORDS_PER_MESSAGE + 1 and bounded[-1] == (
        None,
        len(flood) + len(JSON_HELLO if encoding == "json" else MSGPACK_HELLO),
    )
    assert any("records in one message" in detail for _, detail in reader.findings)
    ping = b'{"type":6}' + RS if encoding == "json" else b"\x02\x91\x06"
    assert [f.event for f in reader.feed(ping)] == ["ping"]


def test_a_frame_for_an_id_only_lenient_readers_take_is_written_as_the_same_id() -> None:
    """An invocation id sent as a lone surrogate escape (the JSON reader takes it, as the
    peers' JSON.parse does) is written back as that escape: the client reads back its own
    id (orjson refused to write it, and the refusal of a blocked request raised)."""
    frame = hub_message({"type": 3, "invocationId": "\ud800", "error": "no"})
    assert (frame.event, frame.id) == ("completion", "\ud800")
    assert frame.data == '{"type":3,"invocationId":"\\ud800","error":"no"}'
    (text,) = JSON_WRITER.encode_messages([frame, hub_message({"type": 5, "invocationId": "\udfff x"})])
    reader = json_reader()
    reader.feed(b"{}\x1e")
    assert [f.id for f in reader.feed(text)] == ["\ud800", "\udfff x"]
    big = hub_message({"type": 2, "invocationId": "1", "item": 2**70})  # (a lenient reader's integer)
    assert json.loads(big.data)["item"] == 2**70


def test_a_msgpack_id_is_never_a_lone_surrogate_and_any_msgpack_message_makes_a_frame() -> None:
    """MessagePack strings are read strictly as UTF-8 (a surrogate's bytes are a malformed
    record), so the ids the MessagePack writer writes back are valid text; and a frame
    for a message with MessagePack's values (bytes, integer keys) is made all the same
    (its JSON text, which only a JSON connection sends, is a best effort)."""
    body = b"\x93\x05\x80\xa3\xed\xa0\x80"  # [5, {}, <the UTF-8 bytes of U+D800>]
    reader = msgpack_reader()
    assert [f.event for f in reader.feed(b"{}\x1e" + varint(len(body)) + body)] == ["handshake"]
    assert [c for c, _ in reader.findings] == ["signalr_invalid"]
    message = {"type": 2, "invocationId": "1", "item": {"audio": b"\x00\x01", 7: "x"}}
    frame = hub_message(message)
    assert frame.message == message and frame.id == "1"
    (binary,) = MSGPACK_WRITER.encode_messages([frame])
    reader = msgpack_reader()
    reader.feed(b"{}\x1e")
    assert [f.message for f in reader.feed(binary)] == [message]


@pytest.mark.parametrize(
    "first",
    [
        b"\xef\xbb\xbf" + JSON_HELLO,  # a UTF-8 BOM
        '{"protocol":"json","version":1}'.encode("utf-16-le") + RS,
        '{"protocol":"json","version":1}'.encode("utf-16") + RS,
        '{"protocol":"json","version":1}'.encode("utf-32-le") + RS,
        JSON_HELLO,
        LENIENT_HELLO,
        b'{"protocol":"json","version":1,"\\ud800":"\\udfff"}\x1e',
        b'{"protocol":"json","version":1,"x":"\xff"}\x1e',  # (invalid UTF-8: read with replacement)
    ],
    ids=["bom", "utf-16-le", "utf-16", "utf-32-le", "plain", "nan", "surrogates", "invalid-utf8"],
)
def test_a_handshake_is_claimed_exactly_when_the_reader_reads_it(first: bytes) -> None:
    """The detection reads the handshake as the reader does (UTF-8 text, leniently):
    ``json.loads`` of the bytes took a BOM, UTF-16 and UTF-32, which the reader rejects,
    so a connection was claimed whose every record then went unread."""
    reader = json_reader()
    read = [f.event for f in reader.feed(first)] == ["handshake"]
    assert (handshake_framing(first) == "signalr_json") is read
