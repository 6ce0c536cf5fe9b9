"""The bounded decoders: every coding, several members and frames, any split of the
bytes, bounded output and work per read, bombs stopped at the budget, the text decoded
before bad data kept."""

from __future__ import annotations

import gzip
import random
import zlib

import brotli
import pytest
from backports import zstd
from hypothesis import given, settings
from hypothesis import strategies as st

from addon import decoding
from addon.decoding import MAX_EMPTY_MEMBERS, READ_STEPS, DecodeBudget, DecodeError, Decoder, make_decoder

PLAIN = b"".join(b'data: {"n": %d, "text": "t\xc3\xb6k %d"}\n\n' % (i, i) for i in range(3000))


def _deflate_raw(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


ENCODED = {
    "gzip": gzip.compress(PLAIN),
    "gzip-members": gzip.compress(PLAIN[:7000]) + gzip.compress(PLAIN[7000:50000]) + gzip.compress(PLAIN[50000:]),
    "deflate": zlib.compress(PLAIN),
    "deflate-raw": _deflate_raw(PLAIN),
    "br": brotli.compress(PLAIN),
    "zstd": zstd.compress(PLAIN),
    "zstd-frames": zstd.compress(PLAIN[:5000]) + zstd.compress(PLAIN[5000:]) + zstd.compress(b""),
    "gzip, br": brotli.compress(gzip.compress(PLAIN)),
}
HEADER = {"gzip-members": "gzip", "deflate-raw": "deflate", "zstd-frames": "zstd"}


def read_out(decoder: Decoder, limit: int, out: list[bytes]) -> None:
    """Read all that ``decoder`` can decode now, as a caller does (a read that decodes
    nothing may leave work: reading goes on while the decoder is not drained)."""
    while (data := decoder.read(limit)) or not decoder.drained():
        assert len(data) <= limit
        out.append(data)


def decode_all(encoding: str, pieces: list[bytes], limit: int = 4096) -> bytes:
    decoder = make_decoder(encoding)
    out: list[bytes] = []
    for piece in pieces:
        decoder.feed(piece)
        read_out(decoder, limit, out)
    return b"".join(out)


@pytest.mark.parametrize("name", ENCODED)
def test_every_coding_decodes_whole(name: str) -> None:
    assert decode_all(HEADER.get(name, name), [ENCODED[name]]) == PLAIN


@settings(max_examples=25, deadline=None)
@given(
    name=st.sampled_from(sorted(ENCODED)),
    cuts=st.lists(st.integers(min_value=0, max_value=200_000), max_size=12),
    limit=st.integers(min_value=1, max_value=70_000),
)
def test_any_split_and_any_limit_give_the_same_output(name: str, cuts: list[int], limit: int) -> None:
    data = ENCODED[name]
    bounds = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    pieces = [data[a:b] for a, b in zip(bounds, bounds[1:])]
    assert decode_all(HEADER.get(name, name), pieces, limit) == PLAIN


def test_byte_by_byte() -> None:
    for name in ("gzip-members", "zstd-frames", "br", "deflate-raw"):
        data = ENCODED[name]
        assert decode_all(HEADER.get(name, name), [data[i : i + 1] for i in range(len(data))]) == PLAIN


def test_identity_and_unknown() -> None:
    assert decode_all("identity", [PLAIN[:10], PLAIN[10:]], 1 << 20) == PLAIN
    assert make_decoder("compress") is None
    assert make_decoder("gzip, compress") is None


@pytest.mark.parametrize("coding", ["gzip", "br", "zstd", "deflate"])
def test_bomb_reads_are_bounded_and_the_budget_stops_it(coding: str) -> None:
    """A 256 MiB run of zeros is read a slice at a time; the budget stops it early."""
    encoded = _bomb(coding, 256)
    decoder = make_decoder(coding)
    decoder.feed(encoded)
    budget = DecodeBudget(max_decoded=1 << 30, ratio=100, floor=8 << 20)
    reason = None
    while reason is None and (data := decoder.read(65536)):
        assert len(data) <= 65536
        reason = budget.exceeded(decoder.decoded, decoder.taken)
    assert reason is not None and "ratio" in reason
    assert decoder.decoded < (8 << 20) + 65536 * 2


def test_budget_total_maximum() -> None:
    budget = DecodeBudget(max_decoded=1000, ratio=100, floor=10_000)
    assert budget.exceeded(999, 1) is None
    assert "decoded size" in budget.exceeded(1001, 1000)


def _bomb(coding: str, mib: int) -> bytes:
    zeros = bytes(1 << 20)
    if coding == "br":
        c = brotli.Compressor(quality=5)
        return b"".join(c.process(zeros) for _ in range(mib)) + c.finish()
    if coding == "zstd":
        c = zstd.ZstdCompressor()
        return b"".join(c.compress(zeros) for _ in range(mib)) + c.flush()
    c = zlib.compressobj(wbits=31 if coding == "gzip" else zlib.MAX_WBITS)
    return b"".join(c.compress(zeros) for _ in range(mib)) + c.flush()


@pytest.mark.parametrize(
    "coding,data",
    [
        ("gzip", b"\x1f\x8b\x08\x00garbage-garbage"),
        ("br", b"\xff\xff\xff\xff garbage"),
        ("zstd", b"\x28\xb5\x2f\xfd garbage garbage"),
        ("gzip", gzip.compress(b"ok") + b"trailing"),
    ],
)
def test_bad_input_raises_decode_error(coding: str, data: bytes) -> None:
    decoder = make_decoder(coding)
    decoder.feed(data)
    with pytest.raises(DecodeError):
        read_out(decoder, 4096, [])


def test_gzip_zero_padding_after_the_last_member_is_ignored() -> None:
    assert decode_all("gzip", [gzip.compress(b"ok") + bytes(8)]) == b"ok"


def test_gzip_zero_padding_followed_by_anything_is_garbage_however_split() -> None:
    body = gzip.compress(b"ok") + bytes(4) + gzip.compress(b"more")
    for cut in range(len(body) + 1):
        decoder = make_decoder("gzip")
        out: list[bytes] = []
        with pytest.raises(DecodeError, match="trailing garbage"):
            for piece in (body[:cut], body[cut:]):
                decoder.feed(piece)
                read_out(decoder, 4096, out)
        assert b"".join(out) == b"ok"


# -- work per read: bodies of empty members and frames ---------------------------------------

EMPTY = {"gzip": gzip.compress(b"", mtime=0), "zstd": zstd.compress(b"")}
PACK = {"gzip": lambda data: gzip.compress(data, mtime=0), "zstd": zstd.compress}


@pytest.fixture
def many_empty_members(monkeypatch) -> None:
    """Bodies of thousands of empty members are refused (MAX_EMPTY_MEMBERS): lifted, for
    the tests of how a read walks through them."""
    monkeypatch.setattr(decoding, "MAX_EMPTY_MEMBERS", 10**6)


@pytest.mark.parametrize("coding", sorted(EMPTY))
def test_a_read_over_empty_members_does_bounded_work_and_returns_without_output(
    coding: str, many_empty_members
) -> None:
    """Thousands of members that decode to nothing: each read consumes at most
    READ_STEPS of them (it used to walk the whole backlog in one call), returns b"" while
    work is left, and reading on gives the text after them."""
    empty = EMPTY[coding]
    body = empty * 3000 + PACK[coding](b"data: x\n\n")
    decoder = make_decoder(coding)
    decoder.feed(body)
    out: list[bytes] = []
    empty_reads = 0
    while True:
        before = decoder.taken
        data = decoder.read(16 * 1024)
        if not data and decoder.drained():
            break
        if not data:
            empty_reads += 1
            assert decoder.taken - before <= READ_STEPS * len(empty)
        out.append(data)
    assert b"".join(out) == b"data: x\n\n"
    assert empty_reads >= 3000 // READ_STEPS


@pytest.mark.parametrize("coding", sorted(EMPTY))
def test_reads_move_through_the_queue_and_each_member_costs_a_few_steps(coding: str, many_empty_members) -> None:
    """What follows a member's end stays where it is in the queue (it was inserted back
    at the front, moving the whole backlog once per member: quadratic), and a member
    costs at most two steps: the work is linear in the input."""
    members = 2000
    body = EMPTY[coding] * members + PACK[coding](PLAIN)
    decoder = make_decoder(coding)
    decoder.feed(body)
    queue = decoder.stages[0]._in
    out: list[bytes] = []
    while (data := decoder.read(16 * 1024)) or not decoder.drained():
        assert decoder.stages[0]._in is queue and len(queue) == len(body)
        out.append(data)
    assert b"".join(out) == PLAIN
    assert len(out) <= 2 * members // READ_STEPS + 2 * len(PLAIN) // (16 * 1024) + 4


@pytest.mark.parametrize("coding", sorted(EMPTY))
def test_empty_members_decode_the_same_whole_and_split_at_every_byte(coding: str) -> None:
    empty = EMPTY[coding]
    body = empty * 30 + PACK[coding](b"hello") + empty * 30 + PACK[coding](b" world") + empty * 3
    assert decode_all(coding, [body]) == b"hello world"
    for cut in range(len(body) + 1):
        assert decode_all(coding, [body[:cut], body[cut:]]) == b"hello world", cut
    assert decode_all(coding, [body[i : i + 1] for i in range(len(body))], limit=3) == b"hello world"


@pytest.mark.parametrize("coding", sorted(EMPTY))
def test_more_empty_members_than_an_encoder_makes_end_the_reading(coding: str) -> None:
    """Each empty member costs a new decompressor (a zstd one 10 to 15 us for 9 bytes):
    past MAX_EMPTY_MEMBERS the body is not read further, whatever the output between."""
    empty = EMPTY[coding]
    groups = MAX_EMPTY_MEMBERS // 10 - 1
    body = (empty * 10 + PACK[coding](b"x")) * groups + empty * 10 + PACK[coding](b"y")  # (at most the limit)
    assert decode_all(coding, [body]) == b"x" * groups + b"y"
    with pytest.raises(DecodeError, match=f"over {MAX_EMPTY_MEMBERS} .* that decode to nothing"):
        decode_all(coding, [body + empty * 10 + PACK[coding](b"z")])


def test_what_a_zstd_frame_hands_back_past_its_end_survives_a_feed_in_between() -> None:
    """A zstd decompressor that fills its limit keeps the rest of its step's input and,
    at the frame's end, hands back what follows it: the queue keeps those bytes through a
    feed (it drops only older ones), and the offset moves back over them."""
    noise = random.Random(0).randbytes(40_000)
    body = zstd.compress(noise) + zstd.compress(b"a" * 100_000) + zstd.compress(b"end")
    decoder = make_decoder("zstd")
    decoder.feed(body)
    out: list[bytes] = []
    while sum(map(len, out)) < len(noise) + 4096:  # (inside the second frame, its limit filled)
        out.append(decoder.read(4096))
    decoder.feed(zstd.compress(b"!"))
    read_out(decoder, 4096, out)
    assert b"".join(out) == noise + b"a" * 100_000 + b"end!"


def test_a_deflate_body_of_one_byte_waits_for_more_and_is_drained() -> None:
    """Both bytes tell which deflate it is: with one, the decoder waits (drained), so a
    caller reading while it is not drained does not spin."""
    decoder = make_decoder("deflate")
    decoder.feed(zlib.compress(b"ok")[:1])
    assert decoder.read(4096) == b"" and decoder.drained()
    decoder.feed(zlib.compress(b"ok")[1:])
    assert decoder.read(4096) == b"ok"


@settings(max_examples=150, deadline=None)
@given(coding=st.sampled_from(["gzip", "deflate", "br", "zstd", "gzip, br"]), data=st.binary(max_size=400))
def test_reading_on_while_not_drained_always_ends(coding: str, data: bytes) -> None:
    """On any bytes (valid heads, then anything), reading on while the decoder is not
    drained ends: drained, or a DecodeError."""
    head = {"gzip": EMPTY["gzip"][:10], "zstd": EMPTY["zstd"][:4]}.get(coding, b"")
    decoder = make_decoder(coding)
    decoder.feed(head + data)
    for _ in range(10_000):
        try:
            if not decoder.read(64) and decoder.drained():
                return
        except DecodeError:
            return
    raise AssertionError("still not drained after 10000 reads")


# -- the text before bad data, and legal splits ----------------------------------------------


@pytest.mark.parametrize(
    "coding, pack, why",
    [
        ("gzip", lambda data: gzip.compress(data, mtime=0), "trailing garbage"),
        ("deflate", zlib.compress, "data after the end of the stream"),
        ("zstd", zstd.compress, "zstd"),
    ],
)
@pytest.mark.parametrize("garbage", [b"\n", b"trailing garbage"])
def test_the_text_decoded_before_trailing_garbage_is_kept(coding: str, pack, why: str, garbage: bytes) -> None:
    """A whole answer in one member and a stray byte after it (a client reads the
    answer): the decoder returns all of the answer, then raises."""
    decoder = make_decoder(coding)
    decoder.feed(pack(PLAIN[:20_000]) + garbage)
    out: list[bytes] = []
    with pytest.raises(DecodeError, match=why):
        read_out(decoder, 16 * 1024, out)
    assert b"".join(out) == PLAIN[:20_000]


def test_a_split_one_byte_into_the_next_members_magic_changes_nothing() -> None:
    first, second = gzip.compress(PLAIN[:3000], mtime=0), gzip.compress(PLAIN[3000:6000], mtime=0)
    body = first + second
    assert decode_all("gzip", [body[: len(first) + 1], body[len(first) + 1 :]]) == PLAIN[:6000]


@pytest.mark.parametrize("coding", ["gzip", "zstd"])
def test_a_body_of_several_members_decodes_the_same_split_anywhere(coding: str) -> None:
    """Every cut (one and two of them) of members of text, an empty one and trailing
    zero padding (gzip) gives the whole body's output."""
    parts = [b"data: one\n\n", b"", b"data: two\n\n", b"data: three\n\n"]
    body = b"".join(PACK[coding](part) for part in parts) + (bytes(3) if coding == "gzip" else b"")
    expected = b"".join(parts)
    for cut in range(len(body) + 1):
        assert decode_all(coding, [body[:cut], body[cut:]], limit=5) == expected, cut
        for second in range(cut, len(body) + 1, 7):
            assert decode_all(coding, [body[:cut], body[cut:second], body[second:]]) == expected, (cut, second)
