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

from addon.dialects import Normalizer, Reading, RequestSummary, RequestView, json_strings, read_json_object
from addon.dialects.protowire import parse, strings
from addon.dialects.rpc import (
    LENIENT_MESSAGE,
    READ_CHARS,
    READ_STRINGS,
    STRINGS_DEPTH,
    RpcDialect,
    RpcNormalizer,
    add_message,
    clean_json,
    kept_strings,
    kept_text,
    protocol_of,
    rpc_name,
    unread_finding,
)
from addon.events import Event, Finding, ShownText, TextDelta


def message_strings(payload: bytes, codec: str, cut: list[str] | None = None) -> tuple[list[str], bool]:
    """The strings of one message (bounded), as sent but for the values of keys named
    like credentials (the client's own: fingerprinted); and whether its JSON is JSON only
    to lenient readers (:func:`addon.json_read.loads`: Python's ``json.loads`` takes
    ``NaN``, JavaScript's ``JSON.parse`` a lone surrogate escape; a peer acts on such a
    message, so the audit reads it too, and says so). The filters read these; the record
    keeps them with credentials fingerprinted (:func:`~addon.dialects.rpc.kept_text`,
    :func:`~addon.dialects.rpc.kept_strings`).

    ``cut`` gets what the bounds left out (strings past the first
    :data:`~addon.dialects.rpc.READ_STRINGS`, characters of a string past
    :data:`~addon.dialects.rpc.READ_CHARS`, JSON nested deeper than 32 levels, a protobuf
    message nested past :func:`~addon.dialects.protowire.strings`' bounds): no filter
    reads that text, so the reader says so (:func:`~addon.dialects.rpc.unread_finding`)
    and the failure policy decides. The bounds are far above an ordinary prompt or answer
    (a long one is one string), so that only a message built to hide text meets them."""
    if codec != "json":
        return strings(parse(payload), READ_STRINGS, READ_CHARS, cut=cut), False
    doc, lenient = read_json_object(payload)  # (keys named like credentials fingerprinted first: "apiKey", "token")
    found = json_strings(clean_json(doc, max_depth=STRINGS_DEPTH, texts=False), limit=READ_STRINGS, cut=cut)
    if cut is not None and any(len(s) > READ_CHARS for s in found):
        cut.append(f"characters of a string past the first {READ_CHARS}")
    return [s[:READ_CHARS] for s in found], lenient


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

    def read_message(self, payload: bytes, request: RequestView, doc: Reading, findings: list[Finding]) -> None:
        codec = (protocol_of(request.headers) or ("", "proto"))[1]
        if handles_credentials(request.path):
            return  # (a login, a token exchange: its strings are passwords and keys; its metadata is kept)
        cut: list[str] = []
        found, lenient = message_strings(payload, codec, cut)
        if lenient:
            findings.append(Finding("request_lenient_json", "a Connect JSON request message: read as servers read it"))
        if cut:  # (the message is not read whole: turns.UNREAD_MESSAGE, the failure policy decides)
            findings.append(unread_finding(cut, "a request message"))
        add_message(doc, "user", kept_text(doc, found))


class ConnectRpcNormalizer(RpcNormalizer):
    """Each response message's strings as text; the status from the protocol's end."""

    def on_message(self, raw: bytes) -> list[Event]:
        if handles_credentials(self.rpc):
            return []
        cut: list[str] = []
        found, lenient = message_strings(raw, self.codec, cut)
        out: list[Event] = [LENIENT_MESSAGE] if lenient else []
        if cut:
            out.append(unread_finding(cut, "a response message"))
        if not found:
            return out
        kept, sent = kept_strings(found)
        return [*out, TextDelta(kept), *([ShownText(sent, kind="unmapped")] if sent is not None else [])]


DIALECT = ConnectRpc()
