"""A lean HTTP/1.1 streaming client for load generation (asyncio streams, no HTTP library).

The proxy under test shares two cores with the mock and the clients, so the client
must cost little per chunk: it writes one request, reads the response head, and then
only scans the body bytes for the mock's write stamps (``~`` + the 19 digits of
``time.time_ns()`` as letters ``a`` to ``j``, see the ``stamp`` scenario of ``mockllm``) and notes when each
arrived, or for one given ``mark`` (the first text of an answer without stamps). Through a proxy it sends the absolute URL (plain-HTTP proxying), directly the
path. ``Connection: close`` makes the end of the body the end of the connection.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from mockllm.streams import STAMP_MARK, STAMP_PATTERN, stamp_time

STAMP_LEN = len(STAMP_MARK)
READ_SIZE = 256 * 1024


@dataclass(frozen=True)
class Target:
    """Where the client connects, and the origin the request is for."""

    host: str
    port: int
    origin: str  # http://127.0.0.1:PORT of the mock
    via_proxy: bool

    def request_target(self, path: str) -> str:
        return self.origin + path if self.via_proxy else path


@dataclass
class StreamResult:
    status: int = 0
    body_bytes: int = 0
    complete: bool = False  # the chunked body ended with its terminator
    ttfc: float | None = None  # seconds from sending the request to the first body byte
    delays_ns: list[int] = field(default_factory=list)  # per stamped event: receipt - write
    arrivals_ns: list[int] = field(default_factory=list)  # per stamped event: receipt (time.time_ns())
    mark_at: float | None = None  # seconds from sending the request to the arrival of ``mark``
    error: str | None = None


def build_request(target: Target, path: str, headers: dict[str, str], body: bytes) -> bytes:
    host = target.origin.removeprefix("http://")
    lines = [
        f"POST {target.request_target(path)} HTTP/1.1",
        f"Host: {host}",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def stream(
    target: Target,
    request: bytes,
    *,
    timeout: float = 300.0,
    hold: asyncio.Event | None = None,
    on_first_byte: asyncio.Event | None = None,
    mark: bytes | None = None,
) -> StreamResult:
    """Send ``request`` and read the streamed answer to its end (or until ``hold`` is set).

    ``hold``: an idle-stream client stops reading once it has seen the first body
    bytes and waits for ``hold`` before closing (``on_first_byte`` is set then).
    ``mark``: the client notes when these bytes first arrive in the body (``mark_at``)
    and then closes the connection: what it measures is over.
    """
    result = StreamResult()
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(target.host, target.port)
            try:
                sent_at = time.perf_counter()
                writer.write(request)
                await _read(reader, result, sent_at, hold, on_first_byte, mark)
            finally:
                writer.close()
                try:
                    await writer.wait_closed()
                except OSError:
                    pass
    except (OSError, TimeoutError, ValueError) as e:
        # (how far it got says where a stream stalled: before the head, or mid-body)
        got = f"status {result.status}, {result.body_bytes} body bytes" if result.status else "no response head"
        result.error = f"{type(e).__name__}: {e} ({got})"
    return result


async def _read(
    reader: asyncio.StreamReader,
    result: StreamResult,
    sent_at: float,
    hold: asyncio.Event | None,
    on_first_byte: asyncio.Event | None,
    mark: bytes | None,
) -> None:
    head = b""
    while b"\r\n\r\n" not in head:
        data = await reader.read(READ_SIZE)
        if not data:
            raise ValueError(f"connection closed in the response head: {head[:200]!r}")
        head += data
    head, _, body = head.partition(b"\r\n\r\n")
    result.status = int(head.split(b" ", 2)[1])
    carry = b""
    tail = b""
    delays, arrivals = result.delays_ns, result.arrivals_ns
    seen = b""  # the last bytes before this read, where ``mark`` may have begun
    while True:
        if body:
            now = time.time_ns()
            if result.ttfc is None:
                result.ttfc = time.perf_counter() - sent_at
                if hold is not None:
                    if on_first_byte is not None:
                        on_first_byte.set()
                    await hold.wait()
                    return
            result.body_bytes += len(body)
            scan = carry + body if carry else body
            end = 0
            for m in STAMP_PATTERN.finditer(scan):
                delays.append(now - stamp_time(m[1]))
                arrivals.append(now)
                end = m.end()
            carry = scan[max(end, len(scan) - STAMP_LEN) :]
            tail = (tail + body)[-16:]
            if mark is not None:
                if mark in seen + body:
                    result.mark_at = time.perf_counter() - sent_at
                    return
                seen = (seen + body)[-len(mark) :]
        body = await reader.read(READ_SIZE)
        if not body:
            break
    result.complete = tail.endswith(b"0\r\n\r\n")
