"""The envelope framing (Connect, gRPC, gRPC-Web), sans-IO: frames, boundaries, bounds, writers.

Fixtures are built here with the test-side encoder (tests/protoenc.py); the Connect
spec's own examples are replayed when ../shared is present.
"""

from __future__ import annotations

import base64
import gzip
import json
import tracemalloc
import zlib
from itertools import accumulate
from pathlib import Path

import brotli
import pytest
from backports import zstd
from hypothesis import given, settings
from hypothesis import strategies as st
from protoenc import end_stream, env, genv

from addon.decoding import Decoder, make_decoder
from addon.dialects import RequestView
from addon.dialects.anthropic import DIALECT as ANTHROPIC
from addon.dialects.connect_rpc import DIALECT as GRPC_DIALECT
from addon.framing import envelope as envelope_module
from addon.framing import select
from addon.framing.envelope import (
    CODES,
    CONNECT_WRITER,
    GRPC_WEB_TEXT_WRITER,
    GRPC_WEB_WRITER,
    GRPC_WRITER,
    Envelope,
    EnvelopeReader,
    RpcStatus,
    code_name,
    code_number,
    connect_reader,
    grpc_reader,
    grpc_web_reader,
    grpc_web_text_reader,
    parse_header_block,
    pct_decode,
    pct_encode,
)

SHARED_CONNECT = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "protocol-samples" / "connect"
MAX = 1024 * 1024


def frames_of(reader: EnvelopeReader, body: bytes, cuts: list[int]) -> list[tuple[int, str, bytes]]:
    """Feed ``body`` cut at ``cuts``; the frames read as (flags, event, raw)."""
    out = []
    bounds = [0, *cuts, len(body)]
    for a, b in zip(bounds, bounds[1:]):
        out += [(f.flags, f.event, f.raw) for f in reader.feed(body[a:b]) if isinstance(f, Envelope)]
    reader.end()
    return out


# -- selection --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type, name",
    [
        ("application/connect+proto", "connect"),
        ("application/connect+json; charset=utf-8", "connect"),
        ("Application/Connect+Custom", "connect"),
        ("application/grpc", "grpc"),
        ("application/grpc+proto", "grpc"),
        ("application/grpc+json", "grpc"),
        ("application/grpc-web", "grpc_web"),
        ("application/grpc-web+proto", "grpc_web"),
        ("application/grpc-web+json", "grpc_web"),
        ("application/grpc-web-text", "grpc_web_text"),
        ("application/grpc-web-text+proto", "grpc_web_text"),
        ("application/proto", "whole"),  # unary Connect: one bare message
        ("application/json", "whole"),
        ("application/grpcx", "whole"),
    ],
)
def test_the_envelope_framings_are_selected_by_media_type(content_type, name):
    assert select(content_type, 200, None).name == name


# -- reading ----------------------------------------------------------------------------------

STREAM = env(b"\x0a\x05hello") + env(b"") + genv(b"\x0a\x06 world") + end_stream('{"metadata":{"a":["1"]}}')


def test_messages_keepalives_compressed_messages_and_the_end_stream_are_frames():
    reader = connect_reader(MAX, MAX, {"connect-content-encoding": "gzip"})
    assert frames_of(reader, STREAM, []) == [
        (0, "message", b"\x0a\x05hello"),
        (0, "message", b""),  # a zero-length envelope is a frame (a keepalive)
        (1, "message", b"\x0a\x06 world"),
        (2, "end_stream", b'{"metadata":{"a":["1"]}}'),
    ]
    assert reader.findings == [] and not reader.pending_event


def test_any_split_gives_the_same_frames_and_boundaries_after_each_envelope():
    whole = frames_of(connect_reader(MAX, MAX, {"connect-content-encoding": "gzip"}), STREAM, [])
    ends, at = [], 0
    for part in (env(b"\x0a\x05hello"), env(b""), genv(b"\x0a\x06 world"), end_stream('{"metadata":{"a":["1"]}}')):
        at += len(part)
        ends.append(at)
    for cut in range(len(STREAM) + 1):
        reader = connect_reader(MAX, MAX, {"connect-content-encoding": "gzip"})
        bounded = reader.feed_bounded(STREAM[:cut]) + reader.feed_bounded(STREAM[cut:])
        assert [end for _, end in bounded] == ends, cut
        assert [(f.flags, f.event, f.raw) for f, _ in bounded if isinstance(f, Envelope)] == whole
        assert reader.held == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_random_splits_give_the_same_frames(cuts):
    reader = connect_reader(MAX, MAX, {"connect-content-encoding": "gzip"})
    expected = frames_of(connect_reader(MAX, MAX, {"connect-content-encoding": "gzip"}), STREAM, [])
    assert frames_of(reader, STREAM, sorted(cuts)) == expected


def test_held_counts_the_bytes_of_an_envelope_not_yet_complete():
    reader = connect_reader(MAX, MAX, {})
    assert reader.feed_bounded(env(b"abc") + env(b"defgh")[:4]) == [(Envelope(b"abc"), 8)]
    assert reader.held == 4 and reader.pending_event


def test_a_compressed_end_stream_0x03_is_decompressed():
    body = genv('{"error":{"code":"unavailable","message":"overloaded"}}', flags=2)
    assert body[0] == 3
    reader = connect_reader(MAX, MAX, {"connect-content-encoding": "gzip"})
    assert frames_of(reader, body, []) == [
        (3, "end_stream", b'{"error":{"code":"unavailable","message":"overloaded"}}')
    ]


@pytest.mark.parametrize(
    "encoding, compress",
    [
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("br", brotli.compress),
        ("identity", None),
    ],
)
def test_grpc_messages_are_decompressed_with_grpc_encoding(encoding, compress):
    payload = b"\x0a\x04text" * 50
    body = env(compress(payload), 1) if compress else env(payload)
    reader = grpc_reader(MAX, MAX, {"grpc-encoding": encoding})
    assert frames_of(reader, body, [3]) == [(1 if compress else 0, "message", payload)]
    assert reader.findings == []


def test_grpc_has_no_end_stream_flag_and_grpc_web_has_a_trailer_frame():
    assert frames_of(grpc_reader(MAX, MAX, {}), env(b"x", 0x02), [])[0][1] == "message"
    trailers = b"grpc-status:0\r\ngrpc-message:\r\n"
    body = env(b"\x0a\x01a") + env(trailers, 0x80)
    assert frames_of(grpc_web_reader(MAX, MAX, {}), body, [6]) == [
        (0, "message", b"\x0a\x01a"),
        (0x80, "trailers", trailers),
    ]
    compressed = genv(trailers, flags=0x80)
    assert frames_of(grpc_web_reader(MAX, MAX, {"grpc-encoding": "gzip"}), compressed, []) == [
        (0x81, "trailers", trailers)
    ]


def test_reserved_flag_bits_are_a_finding_and_the_envelope_a_message():
    reader = connect_reader(MAX, MAX, {})
    assert frames_of(reader, env(b"a", 0x10) + env(b"b", 0x10), []) == [
        (0x10, "message", b"a"),
        (0x10, "message", b"b"),
    ]
    assert [code for code, _ in reader.findings] == ["envelope_reserved_flags"]  # once


@pytest.mark.parametrize(
    "headers, payload, why",
    [
        ({}, gzip.compress(b"x"), "compressed flag without an encoding"),
        ({"connect-content-encoding": "identity"}, gzip.compress(b"x"), "compressed flag without an encoding"),
        ({"connect-content-encoding": "snappy"}, b"x", "unsupported message encoding 'snappy'"),
        ({"connect-content-encoding": "gzip"}, b"not gzip at all", "gzip"),
    ],
)
def test_a_message_that_cannot_be_decompressed_is_skipped_with_a_finding(headers, payload, why):
    body = env(payload, 1) + env(b"after")
    for cut in range(len(body) + 1):  # (decompressed as it comes: the failure is reported once, at its end)
        reader = connect_reader(MAX, MAX, headers)
        bounded = reader.feed_bounded(body[:cut]) + reader.feed_bounded(body[cut:])
        assert [(f.raw if f else None, end) for f, end in bounded] == [(None, 5 + len(payload)), (b"after", len(body))]
        assert [code for code, _ in reader.findings] == ["envelope_decompress_failed"] and why in reader.findings[0][1]
        assert reader.unreadable is not None  # a gate holding the stream applies the failure policy


def test_an_envelope_over_the_limit_is_skipped_as_it_arrives_in_bounded_memory():
    limit = 64 * 1024
    big = env(b"x" * (50 * limit))
    reader = connect_reader(limit, limit, {})
    tracemalloc.start()
    try:
        bounded = []
        for i in range(0, len(big), 4096):
            bounded += reader.feed_bounded(big[i : i + 4096])
        bounded += reader.feed_bounded(env(b"next"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * limit  # never the envelope's 3.2 MB
    assert bounded == [(None, len(big)), (Envelope(b"next"), len(big) + 9)]
    assert [code for code, _ in reader.findings] == ["envelope_too_large"]


def test_a_gzip_bomb_costs_at_most_the_limit():
    limit = 256 * 1024
    bomb = gzip.compress(b"\0" * (64 * 1024 * 1024), 9)  # 64 MiB of zeros in ~64 KB
    assert len(bomb) < limit
    reader = connect_reader(limit, limit, {"connect-content-encoding": "gzip"})
    tracemalloc.start()
    try:
        frames = frames_of(reader, env(bomb, 1) + env(b"after"), [])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert frames == [(0, "message", b"after")]
    assert reader.findings[0][0] == "envelope_too_large" and "decompresses to over" in reader.findings[0][1]
    assert peak < 8 * limit


EMPTY_MEMBER = {"gzip": (gzip.compress(b"", mtime=0), gzip.compress), "zstd": (zstd.compress(b""), zstd.compress)}


@pytest.mark.parametrize("coding", sorted(EMPTY_MEMBER))
def test_a_compressed_message_is_decompressed_as_its_bytes_come(coding, monkeypatch):
    """A message of many empty gzip members (zstd frames) before its text is decoded feed
    by feed, each feed's work in proportion to it, not in one call at the message's end
    (1 MiB of them took seconds there)."""
    empty, pack = EMPTY_MEMBER[coding]
    body = env(empty * 60 + pack(b"\x0a\x02hi"), 1)  # (more than MAX_EMPTY_MEMBERS are refused)
    decoders: list[Decoder] = []

    def spy(encoding: str) -> Decoder | None:
        decoder = make_decoder(encoding)
        assert decoder is not None
        decoders.append(decoder)
        return decoder

    monkeypatch.setattr(envelope_module, "make_decoder", spy)
    reader = grpc_reader(MAX, MAX, {"grpc-encoding": coding})
    frames = []
    for at in range(0, len(body), 256):
        frames += reader.feed(body[at : at + 256])
        assert len(decoders) == 1 and decoders[0].fed == min(at + 256, len(body)) - 5 and decoders[0].drained()
    assert [f.raw for f in frames] == [b"\x0a\x02hi"] and reader.findings == []


@pytest.mark.parametrize("coding", sorted(EMPTY_MEMBER))
def test_a_message_of_empty_members_gives_the_same_frame_split_anywhere(coding):
    empty, pack = EMPTY_MEMBER[coding]
    body = env(empty * 20 + pack(b"\x0a\x02hi") + empty * 2, 1) + env(b"after")
    for cut in range(len(body) + 1):
        frames = frames_of(grpc_reader(MAX, MAX, {"grpc-encoding": coding}), body, [cut])
        assert frames == [(1, "message", b"\x0a\x02hi"), (0, "message", b"after")], cut


def test_a_body_ending_inside_an_envelope_is_pending():
    for cut in (1, 4, 5, 7):
        reader = connect_reader(MAX, MAX, {})
        reader.feed(env(b"abcdef")[:cut])
        assert reader.end() == [] and reader.pending_event


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.sampled_from(["connect", "grpc", "grpc_web"]))
def test_the_reader_never_raises_on_any_bytes(data, kind):
    factory = {"connect": connect_reader, "grpc": grpc_reader, "grpc_web": grpc_web_reader}[kind]
    reader = factory(128, 128, {"connect-content-encoding": "gzip", "grpc-encoding": "gzip"})
    reader.feed_bounded(data)
    reader.end()


# -- statuses and writers ---------------------------------------------------------------------


def test_the_status_codes_map_both_ways_in_one_table():
    assert len(CODES) == 17 and code_name(7) == "permission_denied" and code_name(1) == "canceled"
    assert all(code_number(code_name(n)) == n for n in range(17))
    assert code_name(99) == "unknown" and code_number("no_such_code") == 2


def test_grpc_message_percent_encoding_round_trips():
    message = "Blocked by rule 'r1': 100% sicher — nein\r\n"
    encoded = pct_encode(message)
    assert encoded.isascii() and "%25" in encoded and "\r" not in encoded
    assert pct_decode(encoded) == message
    assert parse_header_block("grpc-status: 7\r\nGrpc-Message:a%20b\nbad line\r\n") == {
        "grpc-status": "7",
        "grpc-message": "a%20b",
    }


STATUS = RpcStatus(
    "permission_denied", "Blocked: rule 'r1' ✋", (("x.v1.Detail", b"\x08\x01", {"k": "v"}),), b"\x08\x07"
)


def test_the_connect_writer_encodes_an_end_stream_response_that_reads_back():
    body = CONNECT_WRITER.encode([STATUS], True)
    frames = frames_of(connect_reader(MAX, MAX, {}), body, [])
    assert [(flags, event) for flags, event, _ in frames] == [(2, "end_stream")]
    doc = json.loads(frames[0][2])
    assert doc == {
        "error": {
            "code": "permission_denied",
            "message": "Blocked: rule 'r1' ✋",
            "details": [{"type": "x.v1.Detail", "value": "CAE", "debug": {"k": "v"}}],
        }
    }
    assert CONNECT_WRITER.trailers([STATUS]) == []


def test_the_grpc_web_writer_encodes_a_trailer_frame_that_reads_back():
    body = GRPC_WEB_WRITER.encode([STATUS], True)
    frames = frames_of(grpc_web_reader(MAX, MAX, {}), body, [])
    assert [(flags, event) for flags, event, _ in frames] == [(0x80, "trailers")]
    block = parse_header_block(frames[0][2].decode())
    assert block["grpc-status"] == "7" and pct_decode(block["grpc-message"]) == STATUS.message
    assert block["grpc-status-details-bin"] == "CAc"  # unpadded base64 of the status message


def test_the_grpc_writer_puts_the_status_in_trailers_only():
    assert GRPC_WRITER.encode([STATUS], True) == b""
    assert GRPC_WRITER.trailers([STATUS]) == [
        ("grpc-status", "7"),
        ("grpc-message", pct_encode(STATUS.message)),
        ("grpc-status-details-bin", "CAc"),
    ]
    assert GRPC_WRITER.trailers([]) == []


def test_termination_trailers_come_from_the_writer_of_the_framing():
    grpc_view = RequestView("POST", "/a.v1.S/M", "", {"content-type": "application/grpc"})
    connect_view = RequestView("POST", "/a.v1.S/M", "", {"content-type": "application/connect+proto"})
    grpc = GRPC_DIALECT.normalizer(GRPC_DIALECT.summarize(None, grpc_view))
    trailers = grpc.termination_trailers("r1", "why")
    assert trailers[0] == ("grpc-status", "7") and "r1" in pct_decode(trailers[1][1])
    assert grpc.termination("r1", "why") == b""
    connect = GRPC_DIALECT.normalizer(GRPC_DIALECT.summarize(None, connect_view))
    assert connect.termination_trailers("r1", "why") == []
    sse = ANTHROPIC.normalizer(ANTHROPIC.summarize({"model": "m"}, connect_view))
    assert sse.termination_trailers("r1", "why") == []


# -- the Connect spec's examples (shared) -------------------------------------------------------


@pytest.mark.skipif(not SHARED_CONNECT.exists(), reason="../shared/reference/protocol-samples not present")
def test_the_connect_spec_streaming_examples_read_as_the_spec_says():
    doc = json.loads((SHARED_CONNECT / "connectrpc-protocol-spec-streaming-examples.json").read_text())
    ok = b"".join(bytes.fromhex(h) for h in doc["client_streaming_success"]["response_envelopes_hex"])
    frames = frames_of(connect_reader(MAX, MAX, {}), ok, [])
    assert [(e, json.loads(raw)) for _, e, raw in frames] == [
        ("message", {"greeting": "Hello, Buf and Connect!"}),
        ("end_stream", {}),
    ]
    requests = b"".join(bytes.fromhex(h) for h in doc["client_streaming_success"]["request_envelopes_hex"])
    assert [json.loads(raw) for _, _, raw in frames_of(connect_reader(MAX, MAX, {}), requests, [])] == [
        {"name": "Buf"},
        {"name": "Connect"},
    ]
    failed = bytes.fromhex(doc["server_streaming_failure"]["response_envelopes_hex"][0])
    [(flags, event, raw)] = frames_of(connect_reader(MAX, MAX, {}), failed, [])
    assert (flags, event, json.loads(raw)) == (
        2,
        "end_stream",
        {"error": {"code": "unavailable", "message": "overloaded"}},
    )


# -- gRPC-Web in base64 (application/grpc-web-text) ----------------------------------------------

PARTS = [env(b"\x0a\x05hello"), env(b"\x0a\x01x"), env(b"grpc-status:0\r\n", 0x80)]
TEXT = b"".join(base64.b64encode(p) for p in PARTS)  # each message alone: padding mid-stream


def test_grpc_web_text_is_decoded_quartet_by_quartet_at_every_split():
    expected = [
        (0, "message", b"\x0a\x05hello"),
        (0, "message", b"\x0a\x01x"),
        (0x80, "trailers", b"grpc-status:0\r\n"),
    ]
    ends = list(accumulate(len(base64.b64encode(p)) for p in PARTS))
    for cut in range(len(TEXT) + 1):
        reader = grpc_web_text_reader(MAX, MAX, {})
        bounded = reader.feed_bounded(TEXT[:cut]) + reader.feed_bounded(TEXT[cut:])
        assert [(f.flags, f.event, f.raw) for f, _ in bounded if isinstance(f, Envelope)] == expected, cut
        assert [end for _, end in bounded] == ends, cut
        assert reader.held == 0 and not reader.pending_event


def test_grpc_web_text_boundaries_never_pass_the_end_of_a_frame():
    text = base64.b64encode(b"".join(PARTS))  # one encoding: frames end inside quartets
    text = text[:8] + b"\r\n" + text[8:]  # and whitespace between quartets
    reader = grpc_web_text_reader(MAX, MAX, {})
    bounded = reader.feed_bounded(text)
    decoded_ends = list(accumulate(len(p) for p in PARTS))
    assert len(bounded) == 3 and bounded[-1][1] == len(text)  # the last frame ends the text
    for (_, end), decoded_end in zip(bounded, decoded_ends):
        assert len(base64.b64decode(text[:end])) <= decoded_end  # released bytes: read frames only


def test_grpc_web_text_that_is_not_base64_is_unreadable():
    reader = grpc_web_text_reader(MAX, MAX, {})
    assert reader.feed(b"AAAA!!!!AAAA") == []
    assert reader.unreadable is not None and reader.findings[0][0] == "envelope_decompress_failed"


def test_the_grpc_web_text_writer_encodes_base64_that_reads_back():
    body = GRPC_WEB_TEXT_WRITER.encode([STATUS], True)
    [frame] = grpc_web_text_reader(MAX, MAX, {}).feed(TEXT[: -len(base64.b64encode(PARTS[2]))] + body)[-1:]
    assert frame.event == "trailers" and parse_header_block(frame.data)["grpc-status"] == "7"
