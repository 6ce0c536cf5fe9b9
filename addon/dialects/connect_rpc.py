"""Any other Connect or gRPC call (dialect ``grpc``): a trace of services nobody mapped.

An AI service the proxy has no dialect for may still speak Connect or gRPC; its
exchanges are recorded rather than passed unseen. One dialect serves Connect (streaming
and unary), gRPC and gRPC-Web, named ``grpc`` after the family; the record's
``request_body`` says which protocol (``protocol``: ``connect``, ``connect_unary``,
``grpc``, ``grpc_web``, ``grpc_web_text``) and which method (``rpc``: ``pkg.Service/Method``).

Recognised by a POST to a ``/pkg.Service/Method`` path with a Connect or gRPC content
type (``application/connect+*``, ``application/grpc*``), or ``application/proto`` /
``application/json`` with ``Connect-Protocol-Version``; an ordinary JSON API has none of
these. Without a schema nothing can be mapped, so what is read is what any message
shows: the request's message count and size, and the UTF-8 strings found in its
messages (protobuf: length-delimited values that read as text, nested messages searched;
JSON: string values), kept as one ``user`` message so the request filters check them;
in the response, the strings of each message as text (the output filters check them;
the record's event count and byte counts are the response's message count and size),
and the status: Connect's end-stream error or the gRPC status, :class:`StreamError` with
the code name and message, or success. Strings are bounded per message and
credentials the secrets detector knows are fingerprinted.
"""

from __future__ import annotations

import re
from typing import Any

from addon.dialects import Normalizer, RequestSummary, RequestView, json_strings, read_json_object
from addon.dialects.protowire import parse, strings
from addon.dialects.rpc import (
    LENIENT_MESSAGE,
    UNMAPPED_CHARS,
    UNMAPPED_STRINGS,
    RpcDialect,
    RpcNormalizer,
    add_message,
    clean,
    clean_json,
    protocol_of,
    rpc_name,
)
from addon.events import Event, Finding, TextDelta


def message_strings(payload: bytes, codec: str) -> tuple[list[str], bool]:
    """The strings of one message (bounded), credentials fingerprinted; and whether its
    JSON is JSON only to lenient readers (:func:`addon.json_read.loads`: Python's
    ``json.loads`` takes ``NaN``, JavaScript's ``JSON.parse`` a lone surrogate escape; a
    peer acts on such a message, so the audit reads it too, and says so)."""
    if codec != "json":
        return [clean(s[:UNMAPPED_CHARS]) for s in strings(parse(payload), UNMAPPED_STRINGS, UNMAPPED_CHARS)], False
    doc, lenient = read_json_object(payload)  # (keys named like credentials fingerprinted first: "apiKey", "token")
    found = json_strings(clean_json(doc), limit=UNMAPPED_STRINGS)
    return [clean(s[:UNMAPPED_CHARS]) for s in found], lenient


_CREDENTIAL_WORDS = re.compile(
    r"auth|login|logon|signin|sign_in|token|password|passwd|secret|credential|apikey|api_key"
)


def handles_credentials(rpc: str) -> bool:
    """Whether a method's name says it carries credentials (``acme.auth.v1.Auth/Login``,
    ``GetUserJwt``): the strings of its messages are not kept (passwords, keys), so the
    generic record of every other gRPC service does not become a store of them."""
    return _CREDENTIAL_WORDS.search(rpc.lower().replace("-", "_")) is not None or "jwt" in rpc.lower()


class ConnectRpc(RpcDialect):
    name = "grpc"

    def matches(self, request: RequestView) -> bool:
        return (
            request.method == "POST" and rpc_name(request.path) is not None and protocol_of(request.headers) is not None
        )

    def normalizer(self, request: RequestSummary) -> Normalizer:
        return ConnectRpcNormalizer(request)

    def read_message(self, payload: bytes, request: RequestView, doc: dict[str, Any], findings: list[Finding]) -> None:
        codec = (protocol_of(request.headers) or ("", "proto"))[1]
        if handles_credentials(request.path):
            return  # (a login, a token exchange: its strings are passwords and keys; its metadata is kept)
        found, lenient = message_strings(payload, codec)
        if lenient:
            findings.append(Finding("request_lenient_json", "a Connect JSON request message: read as servers read it"))
        add_message(doc, "user", "\n".join(found))


class ConnectRpcNormalizer(RpcNormalizer):
    """Each response message's strings as text; the status from the protocol's end."""

    def on_message(self, raw: bytes) -> list[Event]:
        if handles_credentials(self.rpc):
            return []
        found, lenient = message_strings(raw, self.codec)
        out: list[Event] = [LENIENT_MESSAGE] if lenient else []
        return [*out, TextDelta("\n".join(found))] if found else out


DIALECT = ConnectRpc()
