"""The AWS event-stream framing: the reader against the AWS SDK codec vectors and our own,
split at every offset, hostile input, the size bound, and the writer read back (by our
reader and by botocore's own parser)."""

from __future__ import annotations

import struct
import uuid
import zlib
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest
from botocore.eventstream import EventStreamBuffer
from hypothesis import given, settings
from hypothesis import strategies as st

from addon.auditor import StreamAuditor
from addon.dialects.bedrock import DIALECT as BEDROCK
from addon.dialects.bedrock import BedrockRequestSummary
from addon.framing import FRAMINGS, Message, select
from addon.framing.eventstream import EVENTSTREAM_WRITER, MEDIA_TYPE, EventStreamReader, encode_message
from addon.record import ExchangeRecord

SAMPLES = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "protocol-samples" / "bedrock"
VECTORS = SAMPLES / "smithy-typescript_eventstream-codec_TestVectors.json"
FRAMING = FRAMINGS["eventstream"]


def header(name: str, kind: int, value: bytes = b"") -> bytes:
    """One header in the wire format, written by hand (independent of the module)."""
    return bytes((len(name),)) + name.encode() + bytes((kind,)) + value


def raw_message(headers: bytes, payload: bytes, *, bad_message_crc: bool = False) -> bytes:
    prelude = struct.pack(">II", 16 + len(headers) + len(payload), len(headers))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    body = prelude + headers + payload
    return body + struct.pack(">I", zlib.crc32(body) ^ (1 if bad_message_crc else 0))


def event(kind: str, payload: dict) -> bytes:
    return encode_message(
        [(":event-type", kind), (":content-type", "application/json"), (":message-type", "event")],
        orjson.dumps(payload),
    )


BODY = (
    event("messageStart", {"role": "assistant"})
    + event("contentBlockDelta", {"delta": {"text": "hé"}})
    + event("messageStop", {"stopReason": "end_turn"})
)


def read_all(data: bytes, splits: list[int], max_event_bytes: int = 1 << 20) -> tuple[list, list, EventStreamReader]:
    reader = EventStreamReader(max_event_bytes)
    frames, ends = [], []
    bounds = [0, *splits, len(data)]
    for a, b in zip(bounds, bounds[1:]):
        for frame, end in reader.feed_bounded(data[a:b]):
            frames.append(frame)
            ends.append(end)
    reader.end()
    return frames, ends, reader


# -- our own vectors ------------------------------------------------------------------------------


def test_every_header_type_is_read():
    stamp = 1_700_000_000_123
    the_uuid = uuid.uuid4()
    headers = b"".join(
        [
            header("t", 0),
            header("f", 1),
            header("b", 2, struct.pack(">b", -5)),
            header("s", 3, struct.pack(">h", -300)),
            header("i", 4, struct.pack(">i", 70000)),
            header("l", 5, struct.pack(">q", -(2**40))),
            header("ba", 6, struct.pack(">H", 3) + b"\x00\xff\x01"),
            header(":event-type", 7, struct.pack(">H", 5) + b"chunk"),
            header("ts", 8, struct.pack(">q", stamp)),
            header("u", 9, the_uuid.bytes),
        ]
    )
    [frame], [end], reader = read_all(raw_message(headers, b'{"a":1}'), [])
    assert reader.findings == [] and end == 16 + len(headers) + 7
    assert (frame.event, frame.data, frame.message_type, frame.id) == ("chunk", '{"a":1}', "event", "")
    assert dict(frame.headers) == {
        "t": True,
        "f": False,
        "b": -5,
        "s": -300,
        "i": 70000,
        "l": -(2**40),
        "ba": b"\x00\xff\x01",
        ":event-type": "chunk",
        "ts": datetime.fromtimestamp(stamp / 1000, UTC),
        "u": the_uuid,
    }


def test_exceptions_and_errors_are_named_by_their_own_header():
    exception = encode_message(
        [(":message-type", "exception"), (":exception-type", "throttlingException")], b'{"message":"slow"}'
    )
    error = encode_message([(":message-type", "error"), (":error-code", "Boom"), (":error-message", "bad")], b"")
    frames, _, reader = read_all(exception + error, [])
    assert [(f.message_type, f.event) for f in frames] == [("exception", "throttlingException"), ("error", "Boom")]
    assert frames[1].headers[":error-message"] == "bad" and reader.findings == []


def test_any_split_gives_the_same_frames_and_ends():
    whole, whole_ends, _ = read_all(BODY, [])
    assert [f.event for f in whole] == ["messageStart", "contentBlockDelta", "messageStop"]
    assert whole_ends[-1] == len(BODY)
    for i in range(len(BODY) + 1):
        for j in range(i, len(BODY) + 1, 7):
            frames, ends, reader = read_all(BODY, [i, j])
            assert (frames, ends) == (whole, whole_ends), (i, j)
            assert not reader.pending_event and reader.held == 0


def test_a_cut_body_is_pending_and_held():
    last = len(event("messageStop", {"stopReason": "end_turn"}))
    frames, _, reader = read_all(BODY[:-3], [])
    assert len(frames) == 2 and reader.pending_event and reader.held == last - 3


def test_a_bad_message_crc_is_a_finding_and_the_message_is_still_read():
    bad = raw_message(header(":event-type", 7, struct.pack(">H", 1) + b"x"), b"{}", bad_message_crc=True)
    frames, ends, reader = read_all(bad + BODY, [5])
    assert [f.event for f in frames] == ["x", "messageStart", "contentBlockDelta", "messageStop"]
    assert ends[-1] == len(bad) + len(BODY) and reader.unreadable is None
    assert [code for code, _ in reader.findings] == ["eventstream_crc_mismatch"]


def test_a_bad_prelude_stops_framing_and_the_rest_is_unreadable():
    broken = bytearray(BODY)
    broken[len(event("messageStart", {"role": "assistant"})) + 3] ^= 0xFF  # the second message's length
    frames, _, reader = read_all(bytes(broken), [])
    assert [f.event for f in frames] == ["messageStart"]
    assert [code for code, _ in reader.findings] == ["eventstream_crc_mismatch"] and reader.unreadable


def test_impossible_lengths_are_invalid():
    prelude = struct.pack(">II", 8, 0)
    frames, _, reader = read_all(prelude + struct.pack(">I", zlib.crc32(prelude)) + b"rest", [])
    assert frames == [] and reader.findings[0][0] == "eventstream_invalid" and reader.unreadable


def test_malformed_headers_keep_the_headers_before_them():
    headers = header(":event-type", 7, struct.pack(">H", 4) + b"ping") + header("bad", 42)
    [frame], _, reader = read_all(raw_message(headers, b"{}"), [])
    assert frame.event == "ping" and frame.data == "{}"
    assert reader.findings[0][0] == "eventstream_invalid" and "bad" in reader.findings[0][1]


def test_a_message_over_the_limit_is_skipped_without_keeping_it():
    big = event("contentBlockDelta", {"delta": {"text": "x" * 5000}})
    frames, ends, reader = read_all(big + BODY, list(range(100, len(big), 100)), max_event_bytes=1024)
    assert [f.event if f else None for f in frames] == [None, "messageStart", "contentBlockDelta", "messageStop"]
    assert ends[0] == len(big)
    assert [code for code, _ in reader.findings] == ["eventstream_message_too_long"]
    assert len(reader._buf) <= 1024  # nothing of the big message was kept


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=4))
def test_hostile_bytes_never_raise(data, splits):
    read_all(data, sorted(s for s in splits if s <= len(data)))


# -- the AWS SDK's codec vectors (shared samples) ------------------------------------------------------


@pytest.mark.skipif(not VECTORS.exists(), reason="../shared protocol samples not present")
def test_the_aws_codec_vectors():
    vectors = orjson.loads(VECTORS.read_bytes())["vectors"]
    for name, vector in vectors.items():
        data = bytes.fromhex(vector["encoded_hex"])
        for split in range(len(data) + 1):
            frames, ends, reader = read_all(data, [split])
            if vector["expectation"] == "success":
                assert len(frames) == 1 and ends == [len(data)] and reader.findings == [], name
            else:
                assert reader.findings and reader.findings[0][0] == "eventstream_crc_mismatch", name
    [frame], _, _ = read_all(bytes.fromhex(vectors["all_headers"]["encoded_hex"]), [])
    assert frame.data == "{'foo':'bar'}"
    assert frame.headers["event-type"] == 40972 and frame.headers["content-type"] == "application/json"
    assert frame.headers["byte buf"] == b"I'm a little teapot!" and frame.headers["int64"] == 42424242
    assert frame.headers["uuid"] == uuid.UUID("01020304-05060708-090a0b0c-0d0e0f10".replace("-", ""))


# -- the writer -----------------------------------------------------------------------------------------


def test_the_writer_encodes_exceptions_that_botocore_reads():
    data = EVENTSTREAM_WRITER.encode([Message('{"message":"Blocked"}', "validationException")], True)
    [frame], _, reader = read_all(data, [])
    assert (frame.message_type, frame.event, frame.data) == (
        "exception",
        "validationException",
        '{"message":"Blocked"}',
    )
    assert reader.findings == []
    buffer = EventStreamBuffer()
    buffer.add_data(data)
    [message] = list(buffer)  # botocore checks both CRCs and raises on a bad one
    assert message.headers[":exception-type"] == "validationException"
    assert message.headers[":content-type"] == "application/json"
    assert orjson.loads(message.payload) == {"message": "Blocked"}


def test_the_media_type_selects_the_framing():
    assert select(MEDIA_TYPE, 200, None) is FRAMING and FRAMING.streamed
    assert select("application/json", 200, "eventstream").name == "whole"  # a Converse answer, an error


# -- through the auditor: bytes pass unchanged, findings recorded -----------------------------------------


def _auditor() -> tuple[StreamAuditor, ExchangeRecord]:
    record = ExchangeRecord(dialect="bedrock", streamed=True, http_status=200)
    summary = BedrockRequestSummary(model="m", stream=True, operation="converse-stream")
    return StreamAuditor(record, BEDROCK.normalizer(summary), None, 1 << 20, framing=FRAMING), record


def test_bytes_with_a_bad_crc_pass_unchanged_and_the_record_has_the_finding():
    bad = raw_message(header(":event-type", 7, struct.pack(">H", 1) + b"x"), b"{}", bad_message_crc=True)
    auditor, record = _auditor()
    body = bad + BODY
    out = b"".join(auditor.feed(body[i : i + 9]) for i in range(0, len(body), 9))
    auditor.end()
    assert out == body
    assert [f["code"] for f in record.findings] == ["eventstream_crc_mismatch", "missing_stream_end"]
    assert record.output_text == "hé"


def test_a_body_cut_inside_a_message_is_reported():
    auditor, record = _auditor()
    auditor.feed(BODY[:-5])
    auditor.end()
    assert "eventstream_incomplete" in [f["code"] for f in record.findings]


RECORDED = sorted(SAMPLES.glob("*.eventstream.bin")) if SAMPLES.exists() else []


@pytest.mark.skipif(not RECORDED, reason="../shared protocol samples not present")
@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_the_recorded_bodies_split_at_every_offset(path):
    body = path.read_bytes()
    decoded = [
        orjson.loads(line)
        for line in path.with_name(path.stem.removesuffix(".eventstream") + ".decoded.jsonl")
        .read_text()
        .splitlines()[1:]
    ]
    whole, ends, reader = read_all(body, [])
    assert reader.findings == [] and len(whole) == len(decoded)
    assert [(f.event, f.data) for f in whole] == [(d["headers"][":event-type"], d["payload"]) for d in decoded]
    assert ends == [d["offset"] + d["total_length"] for d in decoded]
    for split in range(1, len(body)):
        assert read_all(body, [split])[:2] == (whole, ends), split
