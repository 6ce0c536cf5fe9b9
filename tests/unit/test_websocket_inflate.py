"""wsproto's permessage-deflate, as addon.mitm.early_end bounds it: a compressed message
inflates within the decode budget HTTP bodies have (addon.auditor.DECODE_BUDGET), and
past it the peer's connection is closed with 1009 (message too big). Two real wsproto
connections, a client and a server, with the extension negotiated between them."""

from __future__ import annotations

import zlib

import pytest
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, BytesMessage, CloseConnection, Message, Request, TextMessage
from wsproto.extensions import PerMessageDeflate

from addon.mitm import early_end

early_end.install_websocket_inflate_bound()
MIB = 1 << 20


def pair() -> tuple[WSConnection, WSConnection]:
    """A client and a server that agreed on permessage-deflate."""
    client, server = WSConnection(ConnectionType.CLIENT), WSConnection(ConnectionType.SERVER)
    server.receive_data(client.send(Request(host="x", target="/", extensions=[PerMessageDeflate()])))
    list(server.events())
    client.receive_data(server.send(AcceptConnection(extensions=[PerMessageDeflate()])))
    list(client.events())
    return client, server


def compressed_frame(size: int) -> bytes:
    """A server's binary frame of ``size`` zeros, compressed (as no encoder would send a
    bomb: by hand, never whole in memory)."""
    encoder = zlib.compressobj(9, zlib.DEFLATED, -15)
    payload = b"".join(encoder.compress(bytes(min(MIB, size - at))) for at in range(0, size, MIB))
    payload = (payload + encoder.flush(zlib.Z_SYNC_FLUSH))[:-4]
    size = len(payload)
    if size < 126:
        length = bytes([size])
    else:
        length = bytes([126]) + size.to_bytes(2, "big") if size < 1 << 16 else bytes([127]) + size.to_bytes(8, "big")
    return bytes([0xC2]) + length + payload  # FIN, RSV1 (compressed), binary; a server's: not masked


def received(client: WSConnection, data: bytes, piece: int = 65536) -> list:
    """The client's events for ``data`` fed a piece at a time, up to a close."""
    events: list = []
    for at in range(0, len(data), piece):
        client.receive_data(data[at : at + piece])
        events += list(client.events())
        if any(isinstance(e, CloseConnection) for e in events):
            break
    return events


def test_a_message_that_inflates_past_the_budget_closes_the_connection_with_1009() -> None:
    client, _ = pair()
    events = received(client, compressed_frame(1024 * MIB))  # 1 GiB of zeros in about 1 MB
    assert [type(e) for e in events] == [CloseConnection] and events[0].code == 1009
    assert sum(len(e.data) for e in events if isinstance(e, Message)) == 0  # nothing inflated past the budget


@pytest.mark.parametrize("size", [0, 1, 5 * MIB, 16 * MIB])
def test_a_message_within_the_budget_inflates_as_before(size: int) -> None:
    """16 MiB of zeros (1000 times its compressed size) is still within the budget: only
    past 16 MiB does the ratio count."""
    client, _ = pair()
    events = received(client, compressed_frame(size))
    assert not [e for e in events if isinstance(e, CloseConnection)]
    assert b"".join(e.data for e in events if isinstance(e, BytesMessage)) == bytes(size)


def test_every_message_has_a_budget_of_its_own_and_text_is_unchanged() -> None:
    """Three times a text and 12 MiB of zeros, compressed by wsproto with the window kept
    between messages: 36 MiB in all, past the floor, each message within its own budget."""
    client, server = pair()
    text = "héllo wörld " * 10_000
    for _ in range(3):
        data = b"".join([server.send(TextMessage(data=text)), server.send(BytesMessage(data=bytes(12 * MIB)))])
        events = received(client, data)
        assert "".join(e.data for e in events if isinstance(e, TextMessage)) == text
        assert sum(len(e.data) for e in events if isinstance(e, BytesMessage)) == 12 * MIB
