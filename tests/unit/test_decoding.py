"""The bounded decoders: every coding, several members and frames, any split of the
bytes, bounded output per read, bombs stopped at the budget."""

from __future__ import annotations

import gzip
import zlib

import brotli
import pytest
from backports import zstd
from hypothesis import given, settings
from hypothesis import strategies as st

from addon.decoding import DecodeBudget, DecodeError, make_decoder

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


def decode_all(encoding: str, pieces: list[bytes], limit: int = 4096) -> bytes:
    decoder = make_decoder(encoding)
    out = []
    for piece in pieces:
        decoder.feed(piece)
        while data := decoder.read(limit):
            assert len(data) <= limit
            out.append(data)
    assert decoder.drained()
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
        while decoder.read(4096):
            pass


def test_gzip_zero_padding_after_the_last_member_is_ignored() -> None:
    assert decode_all("gzip", [gzip.compress(b"ok") + bytes(8)]) == b"ok"
