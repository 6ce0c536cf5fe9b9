"""A gRPC server (grpcio, HTTP/2 with TLS) answering the methods of :mod:`mockllm.rpc`.

The same conversations as the Connect server, carried the gRPC way: status in HTTP/2
trailers (``grpc-status``, ``grpc-message``), the scenario's ``error`` as that status.
Messages stay bytes (no generated classes: :mod:`mockllm.protowire` encodes them). The
answers are gzip-compressed per message (``grpc-encoding: gzip``; grpc core falls back
to identity for a client that does not accept gzip). The scenario comes in the ``x-mock``
metadata. ``python -m mockllm --grpc`` runs it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from grpc import aio

from .certs import CertPaths
from .rpc import METHODS, Answer, Conversation, Method
from .scenario import Scenario, ScenarioError

# Connect code (as the conversations give it) -> gRPC status
STATUS = {code.name.lower(): code for code in grpc.StatusCode}
STATUS["canceled"] = grpc.StatusCode.CANCELLED


def _metadata(context: aio.ServicerContext[Any, Any], key: str) -> str:
    value = dict(context.invocation_metadata() or ()).get(key, "")
    return value.decode("latin-1") if isinstance(value, bytes) else value


async def _start(context: aio.ServicerContext[Any, Any], method: Method) -> Conversation:
    try:
        scenario = Scenario.parse("", _metadata(context, "x-mock") or None)
    except ScenarioError as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    context.set_compression(grpc.Compression.Gzip)  # grpc core sends identity to a peer that does not accept it
    return method.conversation(scenario)


async def _fail(context: aio.ServicerContext[Any, Any], answer: Answer) -> None:
    if answer.error is not None:
        code, message = answer.error
        await context.abort(STATUS.get(code, grpc.StatusCode.UNKNOWN), message)


def _handler(method: Method) -> grpc.RpcMethodHandler:
    """The grpcio handler of one method, for its kind (unary, server stream, bidi)."""

    async def unary(request: bytes, context: aio.ServicerContext[Any, Any]) -> bytes:
        answer = (await _start(context, method)).answer(request)
        await _fail(context, answer)
        return answer.messages[0]

    async def server_stream(request: bytes, context: aio.ServicerContext[Any, Any]) -> AsyncIterator[bytes]:
        conversation = await _start(context, method)
        answer = conversation.answer(request)
        for data in answer.messages:
            yield data
            await asyncio.sleep(conversation.scenario.delay)
        await _fail(context, answer)

    async def bidi(requests: AsyncIterator[bytes], context: aio.ServicerContext[Any, Any]) -> AsyncIterator[bytes]:
        conversation = await _start(context, method)
        async for request in requests:
            answer = conversation.answer(request)
            for data in answer.messages:
                yield data
            await _fail(context, answer)
            if answer.done:
                return
        answer = conversation.close()
        for data in answer.messages:
            yield data
        await _fail(context, answer)

    handlers: dict[str, Callable[..., grpc.RpcMethodHandler]] = {
        "unary": lambda: grpc.unary_unary_rpc_method_handler(unary),
        "server": lambda: grpc.unary_stream_rpc_method_handler(server_stream),
        "bidi": lambda: grpc.stream_stream_rpc_method_handler(bidi),
    }
    return handlers[method.kind]()


def _services() -> list[grpc.GenericRpcHandler]:
    by_service: dict[str, dict[str, grpc.RpcMethodHandler]] = {}
    for path, method in METHODS.items():
        service, _, name = path.lstrip("/").partition("/")
        by_service.setdefault(service, {})[name] = _handler(method)
    return [grpc.method_handlers_generic_handler(service, handlers) for service, handlers in by_service.items()]


async def serve(
    host: str, port: int, certs: CertPaths, *, on_ready: Callable[[int], None], stop: asyncio.Event
) -> None:
    """Serve until ``stop`` is set; ``on_ready`` gets the port (``port`` 0 picks a free one)."""
    server = aio.server()
    server.add_generic_rpc_handlers(_services())
    credentials = grpc.ssl_server_credentials([(certs.key.read_bytes(), certs.cert.read_bytes())])
    bound = server.add_secure_port(f"{host}:{port}", credentials)
    await server.start()
    on_ready(bound)
    await stop.wait()
    await server.stop(grace=1.0)
