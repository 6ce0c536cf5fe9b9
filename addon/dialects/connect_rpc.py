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

from addon.dialects import Normalizer, Reading, RequestSummary, RequestView
from addon.dialects.rpc import (
    RpcDialect,
    RpcNormalizer,
    protocol_of,
    read_strings_message,
    rpc_name,
    strings_answer,
)
from addon.events import Event, Finding

_CREDENTIAL_WORDS = frozenset(
    ("login", "logon", "signin", "token", "password", "passwd", "secret", "credential", "credentials", "apikey", "jwt")
)
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")


def handles_credentials(path: str) -> bool:
    """Whether a method's name says it carries credentials (``acme.auth.v1.Auth/Login``,
    ``GetUserJwt``, ``RefreshToken``, ``SignIn``): the strings of its messages are not
    kept (passwords, keys), so the generic record of every other gRPC service does not
    become a store of them. By the method's words alone: a service or routing prefix
    (``AuthoringService``, ``/oauth-gw/``) or a word that merely holds one
    (``CountTokens``) must not switch the reading, and the filters with it, off."""
    method = (rpc_name(path) or path).rpartition("/")[2]
    words = [w.lower() for w in _WORDS.findall(method)]
    pairs = [a + b for a, b in zip(words, words[1:], strict=False)]
    return any(w in _CREDENTIAL_WORDS or w.startswith("auth") for w in (*words, *pairs))


class ConnectRpc(RpcDialect):
    name = "grpc"

    def matches(self, request: RequestView) -> bool:
        return (
            request.method == "POST" and rpc_name(request.path) is not None and protocol_of(request.headers) is not None
        )

    def normalizer(self, request: RequestSummary) -> Normalizer:
        return ConnectRpcNormalizer(request)

    def reads_text(self, request: RequestView) -> bool:
        return not handles_credentials(request.path)

    def read_message(self, payload: bytes, request: RequestView, doc: Reading, findings: list[Finding]) -> None:
        if handles_credentials(request.path):
            return  # (a login, a token exchange: its strings are passwords and keys; its metadata is kept)
        read_strings_message(payload, (protocol_of(request.headers) or ("", "proto"))[1], doc, findings)


class ConnectRpcNormalizer(RpcNormalizer):
    """Each response message's strings as text; the status from the protocol's end."""

    @property
    def reads_text(self) -> bool:  # type: ignore[override]
        return not handles_credentials(self.rpc)

    def on_message(self, raw: bytes) -> list[Event]:
        return strings_answer(raw, self.codec) if self.reads_text else []


DIALECT = ConnectRpc()
