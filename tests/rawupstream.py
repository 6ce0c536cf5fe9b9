"""Upstreams that misbehave at the protocol level, for the end-to-end tests.

The mock upstream (``mockllm``) speaks well-formed HTTP through hypercorn, which will not
send what these tests need: an HTTP/2 stream reset with CANCEL by the server, a response
with both ``Content-Length`` and ``Transfer-Encoding: chunked``, a body that lingers
after its terminal event. Each server here is a real socket server on 127.0.0.1 that
writes exactly the bytes (or HTTP/2 frames, through the ``h2`` library) a test asks for,
one connection at a time, in a background thread.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions

from mockllm.certs import generate


def _read_request(conn: socket.socket) -> bytes:
    """Read one HTTP/1.1 request (headers and a Content-Length body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = conn.recv(65536)
        if not piece:
            return data
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0
    )
    while len(body) < length:
        piece = conn.recv(65536)
        if not piece:
            break
        body += piece
    return head + b"\r\n\r\n" + body


@contextmanager
def _serving(handle: Callable[[socket.socket], None]) -> Iterator[int]:
    """Accept connections on a free port of 127.0.0.1, each handled by ``handle`` in its
    own thread, until the block ends. Yields the port."""
    sock = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield sock.getsockname()[1]
    finally:
        stop.set()
        sock.close()
        thread.join(2)


@contextmanager
def h1_server(respond: Callable[[socket.socket, bytes], None]) -> Iterator[str]:
    """A plain HTTP/1.1 server; ``respond(conn, request)`` writes the answer. Yields its URL."""

    def answer(conn: socket.socket) -> None:
        with conn:
            try:
                respond(conn, _read_request(conn))
            except OSError:
                pass  # the proxy hung up: that is what some tests want

    with _serving(answer) as port:
        yield f"http://127.0.0.1:{port}"


@contextmanager
def h2_reset_server(
    tmp: Path,
    headers: list[tuple[str, str]],
    data: bytes,
    error_code: h2.errors.ErrorCodes = h2.errors.ErrorCodes.CANCEL,
) -> Iterator[tuple[str, Path]]:
    """An HTTPS HTTP/2 server that answers every stream with ``headers`` and ``data``,
    then resets the stream with ``error_code``. Yields its URL and its CA file."""
    certs = generate(tmp / "h2-reset-certs")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs.cert, certs.key)
    context.set_alpn_protocols(["h2"])
    stop = threading.Event()

    def _connection(raw: socket.socket) -> None:
        try:
            with context.wrap_socket(raw, server_side=True) as conn:
                h2conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
                h2conn.initiate_connection()
                conn.sendall(h2conn.data_to_send())
                while not stop.is_set():
                    piece = conn.recv(65536)
                    if not piece:
                        return
                    for event in h2conn.receive_data(piece):
                        if isinstance(event, h2.events.StreamEnded):
                            h2conn.send_headers(event.stream_id, [(":status", "200"), *headers])
                            h2conn.send_data(event.stream_id, data)
                            conn.sendall(h2conn.data_to_send())
                            time.sleep(0.2)  # let the data reach the client before the reset
                            h2conn.reset_stream(event.stream_id, error_code)
                    conn.sendall(h2conn.data_to_send())
        except (OSError, ssl.SSLError, h2.exceptions.ProtocolError):
            pass

    try:
        with _serving(_connection) as port:
            yield f"https://localhost:{port}", certs.ca
    finally:
        stop.set()  # ends connections still open
