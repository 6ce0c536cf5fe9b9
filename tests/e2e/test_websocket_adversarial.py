"""WebSocket auditing under hostile or unlucky traffic, through a real mitmdump (issue 19's
review): what the proxy injects must reach the peer byte for byte, and the proxy must
recognise it when it passes the hooks again."""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import socket
import zlib
from collections.abc import Iterator

import psutil
import pytest

from tests import wsclients
from tests.conftest import BACKENDS, Proxy, filtering_proxy, wait_for
from tests.e2e.test_websocket_proxy import OUTPUT_RULES, by_mock, connection_rows, mock_id
from tests.rawupstream import h1_server

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module", params=BACKENDS)
def filtering(request, tmp_path_factory, upstreams) -> Iterator[Proxy]:
    yield from filtering_proxy(request, tmp_path_factory, request.param, OUTPUT_RULES, upstreams["h2"].ca)


def test_a_long_non_ascii_answer_held_by_the_filters_arrives_intact(filtering: Proxy, upstreams) -> None:
    """Held messages go on as injected ones, which mitmproxy cuts into 4000-byte frames:
    a cut inside a UTF-8 character must not turn it into U+FFFD (the client would see
    other text, and the proxy would not know its own message and send it round again)."""
    answer = "日本語の答え、" * 700  # ~14700 bytes: its done events span several frames
    mid = mock_id()
    seen = wsclients.realtime_ws(upstreams["h2"].url, f"say: {answer}", mock_id=mid, **wsclients.via(filtering))
    assert not seen["timed_out"] and not seen["errors"], (seen["events"][-5:], len(seen["text"]))
    assert seen["text"] == answer
    assert seen["turns"][0]["status"] == "completed"
    (turn,), conn = connection_rows(filtering, mid, 1)
    assert turn["output_text"] == answer and turn["status"] == "completed"


@functools.cache
def deflate_bomb() -> bytes:
    """A binary WebSocket frame from a server, compressed (permessage-deflate): 1 GiB of
    zeros in about 1 MB."""
    encoder = zlib.compressobj(9, zlib.DEFLATED, -15)
    payload = b"".join(encoder.compress(bytes(1 << 20)) for _ in range(1024)) + encoder.flush(zlib.Z_SYNC_FLUSH)
    payload = payload[:-4]  # (a message's deflate data ends without the sync flush's 00 00 ff ff)
    return bytes([0xC2, 127]) + len(payload).to_bytes(8, "big") + payload  # FIN, RSV1 (compressed), binary


def test_a_deflate_bomb_closes_the_connection_and_the_proxy_memory_stays_bounded(filtering: Proxy) -> None:
    """mitmproxy inflated a compressed WebSocket message whole (wsproto's permessage-deflate):
    1 MB from the server became 1 GiB in the proxy before any hook saw it. Now a message
    is inflated within the decode budget HTTP bodies have, and past it the connection is
    closed with 1009 (message too big); the connection is recorded and the proxy goes on."""
    frame = deflate_bomb()

    def respond(conn: socket.socket, request: bytes) -> None:
        key = next(
            line.split(b":", 1)[1].strip()
            for line in request.split(b"\r\n")
            if line.lower().startswith(b"sec-websocket-key:")
        )
        accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
        conn.sendall(
            b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n"
            b"sec-websocket-accept: " + accept + b"\r\nsec-websocket-extensions: permessage-deflate\r\n\r\n"
        )
        with contextlib.suppress(OSError):
            conn.sendall(frame)
            conn.settimeout(30)
            while conn.recv(65536):  # until the proxy closes
                pass

    mid = mock_id()
    proc = psutil.Process(filtering.process.proc.pid)
    before = proc.memory_info().rss
    with (
        h1_server(respond) as url,
        socket.create_connection(("127.0.0.1", int(filtering.url.rsplit(":", 1)[1])), timeout=30) as client,
    ):
        host = url.removeprefix("http://")
        client.sendall(
            f"GET {url}/v1/realtime?model=gpt-realtime HTTP/1.1\r\nhost: {host}\r\nupgrade: websocket\r\n"
            f"connection: upgrade\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            f"sec-websocket-extensions: permessage-deflate\r\nx-mock-id: {mid}\r\n\r\n".encode()
        )
        seen = b""
        with contextlib.suppress(OSError):
            while piece := client.recv(65536):
                seen += piece
    peak = proc.memory_info().rss
    assert b" 101 " in seen.split(b"\r\n", 1)[0]
    print(f"deflate bomb: proxy RSS {before >> 20} MiB before, {peak >> 20} MiB after")
    assert peak - before < 200 << 20
    rows = wait_for(
        lambda: [r for r in by_mock(filtering, mid) if r["status"] != "in_progress"] or None, 20, what="the row"
    )
    assert any("1009" in f["detail"] for r in rows for f in r["findings"] if f["code"] == "websocket_closed"), rows
