"""mitmproxy's Fragmentizer, as addon.mitm.early_end patches it: a text message the proxy
sends in frames reassembles to the same bytes however its characters fall on the cuts."""

from __future__ import annotations

import wsproto.events
from hypothesis import given
from hypothesis import strategies as st
from mitmproxy.proxy.layers.websocket import Fragmentizer

from addon.mitm import early_end

early_end.install_websocket_fragments()


def sent(content: bytes, fragments: list[bytes], text: bool = True) -> list[wsproto.events.Message]:
    return list(Fragmentizer(fragments, text)(content))


def joined(frames: list[wsproto.events.Message]) -> bytes:
    return b"".join(f.data.encode() if isinstance(f.data, str) else f.data for f in frames)


@given(st.text(min_size=0, max_size=3000), st.integers(1, 64))
def test_a_text_message_in_frames_is_the_same_text(text: str, size: int) -> None:
    content = text.encode()
    frames = list(_with_size(size)(content))
    assert joined(frames) == content
    assert [f.message_finished for f in frames] == [False] * (len(frames) - 1) + [True]


def test_an_injected_japanese_answer_is_cut_between_characters() -> None:
    content = ("日本語" * 3000).encode()  # 27000 bytes: 4000-byte cuts fall inside characters
    frames = sent(content, [])
    assert joined(frames) == content and "\ufffd" not in "".join(f.data for f in frames)
    assert max(len(f.data.encode()) for f in frames) <= Fragmentizer.FRAGMENT_SIZE


def test_binary_and_unchanged_messages_are_cut_as_before() -> None:
    assert [len(f.data) for f in sent(bytes(9000), [], text=False)] == [4000, 4000, 1000]
    assert [len(f.data) for f in sent(b"abcdef", [b"ab", b"cdef"])] == [2, 4]
    assert [f.data for f in sent(b"", [])] == [""]


def _with_size(size: int) -> Fragmentizer:
    fragmentizer = Fragmentizer([], True)
    fragmentizer.FRAGMENT_SIZE = size
    return fragmentizer
