"""The Windsurf (Codeium, Devin CLI) dialect: chat through the Codeium API server.

The IDE talks to its local language server, which streams chat from the cloud with
``exa.api_server_pb.ApiServerService/GetChatMessage`` (Connect server streaming,
``application/connect+proto``, gzip messages): that is what a forward proxy sees
(windsurf.md §1–2). The language server's own loopback API,
``exa.language_server_pb.LanguageServerService/RawGetChatMessage`` (Connect JSON or
protobuf), is read too, for a proxy placed in front of it. Recognised by the path.

No schema is public; two independent reconstructions (windsurf.md §3–4) agree on:

- request ``GetChatMessageRequest``: ``1 ClientMetadata`` (``3 api_key``, ``21 user_jwt``:
  credentials, kept as fingerprints), ``3 repeated ChatMessage`` (``2`` role: 1 user,
  2 assistant, 4 tool result; ``3`` text), ``21`` model name; field 2 is the system
  prompt in one reconstruction (read when it is text), ``16`` a session id;
- response ``GetChatMessageResponse`` deltas: ``3`` text, ``9`` reasoning, ``5`` finish
  (2 = stop; other values are not calibrated and kept as numbers), ``6`` tool calls
  (``1 id``, ``2 name``, ``3 arguments_json``; best effort), ``7`` metadata (usage ``2``
  fresh input, ``3`` output, ``4`` cache write, ``5`` cache read; ``7`` the upstream
  message id, ``9`` the model that served a router selector).

Usage follows OpenTelemetry as the other dialects do: ``input_tokens`` includes the
cached tokens, which Windsurf reports apart (2 + 4 + 5). ``RawGetChatMessage``: request
``1 metadata, 2 repeated ChatMessage, 3 system_prompt_override, 5 chat_model_name``,
response ``1 RawChatMessage{5 text, 6 in_progress, 7 is_error}`` (the layout of the
request's ``ChatMessage`` is not public: its text is read from 5, else 3).

Errors are Connect end-stream errors; a content filter's block is ``permission_denied``,
the shape the server uses for its own content-policy blocks.
"""

from __future__ import annotations

import json
from typing import Any

from addon.dialects import (
    Normalizer,
    Reading,
    RequestSummary,
    RequestView,
    costly_finding,
    json_strings,
    read_json_object,
)
from addon.dialects.protowire import Message, field_int, field_text, parse, readable
from addon.dialects.rpc import (
    CONTEXT_STRINGS,
    LENIENT_MESSAGE,
    STRINGS_DEPTH,
    RpcDialect,
    RpcNormalizer,
    RpcSummary,
    add_message,
    add_strings,
    clean,
    clean_json,
    kept_text,
    own_credential,
    protocol_of,
    rpc_name,
    unmapped,
    unmapped_strings,
    unread_finding,
)
from addon.events import Event, Finding, Finish, ResponseMeta, ShownText, StreamError, TextDelta, ToolCallDelta, Usage

GET_CHAT = "exa.api_server_pb.ApiServerService/GetChatMessage"
RAW_CHAT = "exa.language_server_pb.LanguageServerService/RawGetChatMessage"
ROLES = {1: "user", 2: "assistant", 4: "tool"}
FINISHES = {2: "stop"}
RESPONSE_FIELDS = frozenset({2, 3, 5, 6, 7, 9, 28})  # 2 timestamps, 28 a token-usage block (not decoded)
RAW_RESPONSE_FIELDS = frozenset({1})
RAW_MESSAGE_FIELDS = frozenset({1, 2, 3, 4, 5, 6, 7})
GET_CHAT_MAPPED = frozenset({1, 2, 3, 16, 21})  # field 1 (metadata) holds credentials: never kept as strings
RAW_CHAT_MAPPED = frozenset({1, 2, 3, 5})


class Windsurf(RpcDialect):
    name = "windsurf"
    provider = "windsurf"

    def matches(self, request: RequestView) -> bool:
        return request.method == "POST" and rpc_name(request.path) in (GET_CHAT, RAW_CHAT)

    def normalizer(self, request: RequestSummary) -> Normalizer:
        return WindsurfNormalizer(request)

    def read_message(self, payload: bytes, request: RequestView, doc: Reading, findings: list[Finding]) -> None:
        codec = (protocol_of(request.headers) or ("", "proto"))[1]
        cut: list[str] = []
        if codec == "json":
            _read_json_request(payload, doc, findings, cut)
        else:
            msg = parse(payload)
            self._read_proto_request(msg, request, doc)
            if (problem := msg.cut_short()) is not None:  # (after reading: nested messages count)
                findings.append(Finding("protobuf_invalid", f"request message: {problem}"))
        if cut:  # (the message is not read whole: turns.UNREAD_MESSAGE, the failure policy decides)
            findings.append(unread_finding(cut, "a request message"))

    def _read_proto_request(self, msg: Message, request: RequestView, doc: Reading) -> None:
        for metadata in msg.messages(1):
            for number, name in ((3, "api_key"), (21, "user_jwt")):
                value = field_text(metadata, number)
                if value:
                    doc[name] = own_credential(doc, number, value)
            doc["client"] = _readable(metadata, 1) or doc.get("client")
        if rpc_name(request.path) == RAW_CHAT:
            add_message(doc, "system", field_text(msg, 3))
            for item in msg.messages(2):
                text = _readable(item, 5) or _readable(item, 3)
                add_message(doc, ROLES.get(field_int(item, 2) or 0, "user"), text)
            doc["model"] = field_text(msg, 5) or doc.get("model")
            add_strings(doc, unmapped_strings(msg, RAW_CHAT_MAPPED))
            return
        add_message(doc, "system", _readable(msg, 2))
        for item in msg.messages(3):
            add_message(doc, ROLES.get(field_int(item, 2) or 0, "user"), field_text(item, 3))
        doc["model"] = field_text(msg, 21) or doc.get("model")
        doc["conversation_id"] = field_text(msg, 16) or doc.get("conversation_id")
        add_strings(doc, unmapped_strings(msg, GET_CHAT_MAPPED))


def _readable(msg: Message, number: int) -> str | None:
    """Field ``number`` when it is text (not a nested message): its last value, as
    protobuf parsers keep a singular field sent twice (the filters read every value in
    the message's bytes, :func:`~addon.dialects.rpc.payload_text`)."""
    return next((t for v in reversed(msg.values(number)) if isinstance(v, bytes) and (t := readable(v))), None)


#: The keys of a JSON request the reading maps; the strings of the others (and of a chat
#: message's other keys) are read as a protobuf request's unmapped fields are
#: (``metadata`` holds the client's credentials: kept, not read).
JSON_MAPPED = frozenset({"systemPromptOverride", "chatMessages", "messages", "chatModelName", "model", "metadata"})


def _read_json_request(payload: bytes, doc: Reading, findings: list[Finding], cut: list[str]) -> None:
    """A Connect JSON request to the language server: proto3 JSON names (camelCase)."""
    if (costly := costly_finding(payload, "the request message", "request_too_large")) is not None:
        findings.append(costly)
        return
    body, lenient = read_json_object(payload)
    if body is None:
        findings.append(Finding("request_invalid_json", "the request message is not one JSON object"))
        return
    if lenient:  # (read as the language server reads it, and said)
        findings.append(Finding("request_lenient_json", "a Connect JSON request message: read as servers read it"))
    body = clean_json(body, max_depth=STRINGS_DEPTH, texts=False)  # (the client's own credentials fingerprinted)
    system = body.get("systemPromptOverride")
    add_message(doc, "system", kept_text(doc, [system]) if isinstance(system, str) else None)
    others: list[Any] = [{k: v for k, v in body.items() if k not in JSON_MAPPED}]
    items = body.get("chatMessages") or body.get("messages") or []
    others += [value for key, value in body.items() if key in ("chatMessages", "messages") and value is not items]
    for item in items if isinstance(items, list) else [items]:
        if not isinstance(item, dict):
            others.append(item)
            continue
        key = next((k for k in ("text", "content", "prompt") if isinstance(item.get(k), str)), None)
        source = item.get("source", item.get("role"))
        role = source.lower().removeprefix("chat_message_source_") if isinstance(source, str) else "user"
        kept = kept_text(doc, [item[key]]) if key is not None else None
        add_message(doc, role if role in ("user", "assistant", "system", "tool") else "user", kept)
        others.append({k: v for k, v in item.items() if k != key})
    model = body.get("chatModelName") or body.get("model")
    doc["model"] = clean(model) if isinstance(model, str) else doc.get("model")
    metadata = body.get("metadata")
    if isinstance(metadata, dict):
        doc["metadata"] = clean_json(metadata)
    add_strings(doc, json_strings(others, limit=CONTEXT_STRINGS, cut=cut))  # (what no key above maps)


class WindsurfNormalizer(RpcNormalizer):
    """Reads ``GetChatMessage`` (or ``RawGetChatMessage``) deltas into common events."""

    maps_json = True  # (its JSON answers are read by field names: deltaMessage.text)

    def __init__(self, summary: RequestSummary) -> None:
        super().__init__(summary)
        self.raw_api = (summary.rpc if isinstance(summary, RpcSummary) else "") == RAW_CHAT
        self.calls = 0
        self.open_calls: dict[str, bool] = {}  # tool call keys not yet complete
        self.meta: tuple[str | None, str | None] = (None, None)

    def on_message(self, raw: bytes) -> list[Event]:
        if self.codec == "json":
            return self._json_message(raw)
        msg = parse(raw)
        if self.raw_api:
            out = unmapped("RawGetChatMessageResponse", msg, RAW_RESPONSE_FIELDS)
            for delta in msg.messages(1):
                out += unmapped("RawChatMessage", delta, RAW_MESSAGE_FIELDS)
                self._raw_delta(field_text(delta, 5), bool(field_int(delta, 6)), bool(field_int(delta, 7)), out)
            return out
        out = unmapped("GetChatMessageResponse", msg, RESPONSE_FIELDS)
        for value in msg.values(3):
            if isinstance(value, bytes) and value:
                out.append(TextDelta(value.decode("utf-8", "replace")))
        for value in msg.values(9):
            if isinstance(value, bytes) and value:
                out.append(TextDelta(value.decode("utf-8", "replace"), 0, "reasoning"))
        for call in msg.messages(6):
            self._tool_call(call, out)
        for metadata in msg.messages(7):
            self._metadata(metadata, out)
        finish = field_int(msg, 5)
        if finish is not None:
            self._close_calls(out)
            out.append(Finish(FINISHES.get(finish, str(finish))))
        return out

    def _tool_call(self, call: Message, out: list[Event]) -> None:
        """``ChatToolCall`` delta: ``1 id``, ``2 name``, ``3 arguments_json`` (fragments;
        one without an id continues the call opened last)."""
        call_id = field_text(call, 1)
        key = call_id or (list(self.open_calls)[-1] if self.open_calls else self._key())
        self.open_calls[key] = True
        out.append(ToolCallDelta(key, field_text(call, 3) or "", call_id, field_text(call, 2)))

    def _close_calls(self, out: list[Event]) -> None:
        """A finish ends the calls still open: their arguments are whole."""
        for key in self.open_calls:
            out.append(ToolCallDelta(key, complete=True))
        self.open_calls.clear()

    def _metadata(self, metadata: Message, out: list[Event]) -> None:
        """Usage (2 fresh input, 3 output, 4 cache write, 5 cache read), the served model (9)
        and the upstream message id (7)."""
        fresh, output, written, read = (field_int(metadata, n) for n in (2, 3, 4, 5))
        if any(v is not None for v in (fresh, output, written, read)):
            total = (
                None
                if fresh is None and written is None and read is None
                else (fresh or 0) + (written or 0) + (read or 0)
            )
            out.append(Usage(total, output, read, written))
        meta = (field_text(metadata, 9), field_text(metadata, 7))
        if meta != (None, None) and meta != self.meta:
            self.meta = meta
            out.append(ResponseMeta(model=meta[0], response_id=meta[1]))

    def _raw_delta(self, text: str | None, in_progress: bool, is_error: bool, out: list[Event]) -> None:
        if is_error:
            out.append(StreamError("error", clean(text) if text else None))
            if text and clean(text) is not text:  # (the record keeps a key's fingerprint; the filters read it as sent)
                out.append(ShownText(text, kind="error"))
        elif text:
            out.append(TextDelta(text))
        if not in_progress and not is_error:
            out.append(Finish("stop"))

    def _json_message(self, raw: bytes) -> list[Event]:
        """``RawGetChatMessageResponse`` in Connect's JSON codec: ``deltaMessage``."""
        if (costly := costly_finding(raw, "a response message")) is not None:
            return [costly]
        doc, lenient = read_json_object(raw)
        if doc is None:
            return [Finding("response_invalid_json", "a response message is not one JSON object")]
        out: list[Event] = [LENIENT_MESSAGE] if lenient else []
        delta = doc.get("deltaMessage")
        if not isinstance(delta, dict):
            found = json.dumps(clean_json(doc))[:400]  # (ASCII: a lone surrogate escaped, which orjson refuses)
            return [*out, Finding("protobuf_unmapped", f"RawGetChatMessageResponse (JSON): no deltaMessage: {found}")]
        text = delta.get("text")
        self._raw_delta(
            text if isinstance(text, str) else None, delta.get("inProgress") is True, delta.get("isError") is True, out
        )
        return out

    def _key(self) -> str:
        self.calls += 1
        return f"call{self.calls}"


DIALECT = Windsurf()
