"""The Cursor dialect: the IDE's and CLI's chat with ``api2.cursor.sh`` (Connect, protobuf).

Cursor publishes no schema; the field paths below are the reverse-engineered ones of
cursor.md (aiserver.proto of Dec 2024, lite.proto for 1.4.x, the Agent API's field
comments), which move between releases. So messages are walked schema-less
(:mod:`addon.dialects.protowire`) and read defensively: a message whose fields do not map
gives a ``protobuf_unmapped`` finding with the strings found in it, never an exception,
so an exchange is still recorded when Cursor moves a field.

Recognised by the path (the host may be a reverse proxy's), four APIs by era:

================================================  =================================================
method                                            read
================================================  =================================================
``aiserver.v1.AiService/StreamChat`` (``…Web``,   request ``GetChatRequest``: conversation 2 (text 1,
``StreamComposer``, ``StreamChatTryReallyHard``)   type 2: 1 HUMAN, 2 AI), model 7→1, api_key 7→2;
                                                  response text 1, filled_prompt 5
``aiserver.v1.ChatService/StreamUnifiedChat…``    request 1→ conversation 1, model 5→1, conversation
(``WithTools``, ``…SSE``, ``…Idempotent``; bidi)  23; tool results 2; response text 2→1, thinking
                                                  2→25→1, filled_prompt 2→5, tool call 1 (id 3,
                                                  name 9, raw_args 10)
``agent.v1.AgentService/Run`` (bidi), ``RunSSE``  request 1 run_request (model 3→1, conversation 5,
(gRPC-Web), ``aiserver.v1.BidiService/BidiAppend``  action 2), 2 exec results; response 1→1→1 text,
(unary: hex AgentClientMessage in field 1)        1→4→1 thinking, 1→2/7/3 tool calls, 1→14 turn end
================================================  =================================================

Usage is not in the chat streams, except the Agent API's ``turn_ended`` (1→14), whose
fields 1–4 one source reads as input, output, cache read and cache write tokens
(unverified). ``turn_ended`` also ends a turn of the long-lived Agent stream
(:class:`~addon.events.TurnEnd`). The prompt the server built (``filled_prompt``: the
full system prompt, leaked in the response) is kept as a ``server_prompt`` finding, not
as output: the model did not write it, the IDE does not show it, and a finding lets an
audit see (by its hash) when it changes without storing it in the answer's text.

Errors: Connect's EndStreamResponse error (or RunSSE's gRPC-Web trailers) with an
``aiserver.v1.ErrorDetails`` detail, read as ``ERROR_<name>: title: detail``. A content
filter's block is ``permission_denied`` with such a detail (``ERROR_CUSTOM_MESSAGE``, the
rule as title and detail), which is what the IDE renders.
"""

from __future__ import annotations

import binascii
import hashlib

from addon.dialects import Normalizer, Reading, RequestSummary, RequestView
from addon.dialects.blocking import block_message
from addon.dialects.protowire import (
    Message,
    encode_field,
    field_int,
    field_text,
    parse,
    readable,
    strings,
)
from addon.dialects.rpc import (
    READ_CHARS,
    READ_STRINGS,
    RpcDialect,
    RpcNormalizer,
    RpcSummary,
    add_message,
    add_strings,
    block_status,
    clean,
    clean_text,
    kept_strings,
    own_credential,
    payload_text,
    protocol_of,
    read_strings_message,
    rpc_name,
    strings_answer,
    unmapped,
    unmapped_strings,
    unread_finding,
)
from addon.events import Event, Finding, TextDelta, ToolCallDelta, TurnEnd, Usage
from addon.framing.envelope import RpcStatus

CHAT, UNIFIED, AGENT, BIDI_APPEND = "chat", "unified", "agent", "bidi_append"
ERROR_DETAILS = "aiserver.v1.ErrorDetails"
ERROR_CUSTOM_MESSAGE = 29
# aiserver.v1.ErrorDetails.Error values named in cursor.md (lite.proto has more).
ERRORS = {
    1: "ERROR_BAD_API_KEY",
    2: "ERROR_NOT_LOGGED_IN",
    5: "ERROR_BAD_MODEL_NAME",
    7: "ERROR_FREE_USER_RATE_LIMIT_EXCEEDED",
    8: "ERROR_PRO_USER_RATE_LIMIT_EXCEEDED",
    9: "ERROR_FREE_USER_USAGE_LIMIT",
    10: "ERROR_PRO_USER_USAGE_LIMIT",
    12: "ERROR_AUTH_TOKEN_EXPIRED",
    20: "ERROR_MAX_TOKENS",
    21: "ERROR_USER_ABORTED_REQUEST",
    25: "ERROR_TIMEOUT",
    29: "ERROR_CUSTOM_MESSAGE",
    30: "ERROR_OUTDATED_CLIENT",
    43: "ERROR_CONVERSATION_TOO_LONG",
    50: "ERROR_RATE_LIMITED",
}
ROLES = {1: "user", 2: "assistant"}  # ConversationMessage.type: HUMAN, AI
SERVER_PROMPT_CHARS = 8192
MAX_PROMPTS = 64  # server prompts remembered as reported, per stream (the upstream names them)

# The fields each message is known to have (cursor.md): others with text are reported.
CHAT_RESPONSE = frozenset({1, 2, 3, 4, 5, 7, 10, 11, 12, 13, 16, 17, 22})
UNIFIED_RESPONSE = frozenset({1, 2, 5})  # StreamUnifiedChatResponseWithTools
UNIFIED_CHAT = frozenset({1, 5, 11, 25})  # StreamUnifiedChatResponse
AGENT_SERVER = frozenset({1, 2, 3, 4, 5, 7})  # AgentServerMessage
INTERACTION = frozenset({1, 2, 3, 4, 7, 8, 13, 14})  # InteractionUpdate
# Request fields read into the doc (their strings are not repeated as unmapped).
CHAT_REQUEST_MAPPED = frozenset({2, 7, 9, 15})
UNIFIED_REQUEST_MAPPED = frozenset({1, 5, 23})


def api_of(rpc: str | None) -> str | None:
    """Which of Cursor's chat APIs a ``service/method`` is, None if none."""
    service, _, method = (rpc or "").partition("/")
    if service == "aiserver.v1.AiService" and (method.startswith("StreamChat") or method == "StreamComposer"):
        return CHAT
    if service == "aiserver.v1.ChatService" and "StreamUnifiedChat" in method:
        return UNIFIED
    if service == "agent.v1.AgentService" and method in ("Run", "RunSSE"):
        return AGENT
    if service == "aiserver.v1.BidiService" and method == "BidiAppend":
        return BIDI_APPEND
    return None


class Cursor(RpcDialect):
    name = "cursor"
    provider = "cursor"

    def matches(self, request: RequestView) -> bool:
        return request.method == "POST" and api_of(rpc_name(request.path)) is not None

    def has_turns(self, request: RequestView) -> bool:
        rpc = rpc_name(request.path) or ""
        return (
            rpc.startswith("aiserver.v1.ChatService/StreamUnifiedChatWithTools") or rpc == "agent.v1.AgentService/Run"
        )

    def normalizer(self, request: RequestSummary) -> Normalizer:
        return CursorNormalizer(request)

    # -- requests -------------------------------------------------------------------------

    def read_message(self, payload: bytes, request: RequestView, doc: Reading, findings: list[Finding]) -> None:
        api = api_of(rpc_name(request.path))
        if (protocol_of(request.headers) or ("", "proto"))[1] == "json":
            read_strings_message(payload, "json", doc, findings)  # (Connect's JSON codec: no field path is known in it)
            return
        msg = parse(payload)
        cut: list[str] = []
        self._read_request(api, msg, request, doc, findings, cut)
        if (problem := msg.cut_short()) is not None:  # (after reading: nested messages count)
            findings.append(Finding("protobuf_invalid", f"request message: {problem}"))
        if cut:  # (the record's reading is; the filters read the message's bytes whole: payload_text)
            findings.append(Finding("content_truncated", f"a request message: {'; '.join(cut)} not kept"))

    def _read_request(
        self,
        api: str | None,
        msg: Message,
        request: RequestView,
        doc: Reading,
        findings: list[Finding],
        cut: list[str],
    ) -> None:
        if api == CHAT:
            _read_chat_request(msg, doc, cut)
        elif api == UNIFIED:
            for request_msg in msg.messages(1):
                _read_chat_request(request_msg, doc, cut, unified=True)
            for result in msg.messages(2):  # ClientSideToolV2Result: its layout is not public
                add_message(doc, "tool", message_text(result, cut))
        elif api == AGENT and request.path.endswith("/RunSSE"):
            doc["request_id"] = clean_text(field_text(msg, 1))  # BidiRequestId
        elif api == AGENT:
            _read_agent_message(msg, doc, cut)
        elif api == BIDI_APPEND:
            doc["request_id"] = clean_text(field_text(msg, 2, 1))
            data = field_text(msg, 1) or ""
            try:
                inner = binascii.unhexlify(data.strip())
                _read_agent_message(parse(inner), doc, cut)
                doc.unkept.append(payload_text(inner, doc.credentials))  # (the filters read its bytes too)
            except (binascii.Error, ValueError):
                findings.append(Finding("protobuf_invalid", "BidiAppendRequest.data is not hex"))


def _read_chat_request(msg: Message, doc: Reading, cut: list[str], unified: bool = False) -> None:
    """``GetChatRequest`` (old API) or ``StreamUnifiedChatRequest``: the conversation,
    model, its API key (fingerprinted) and conversation id; the strings of the fields
    not mapped (the open file, context: :func:`~addon.dialects.rpc.add_strings`)."""
    conversation, details, conversation_id = (1, 5, 23) if unified else (2, 7, 15)
    for item in msg.messages(conversation):
        add_message(doc, ROLES.get(field_int(item, 2) or 0, "user"), field_text(item, 1))
    doc["model"] = clean_text(field_text(msg, details, 1)) or doc.get("model")
    key = field_text(msg, details, 2)
    if key:
        doc["api_key"] = own_credential(doc, 2, key)
    doc["conversation_id"] = clean_text(field_text(msg, conversation_id)) or doc.get("conversation_id")
    if not unified:
        doc["request_id"] = clean_text(field_text(msg, 9)) or doc.get("request_id")
    add_strings(doc, unmapped_strings(msg, UNIFIED_REQUEST_MAPPED if unified else CHAT_REQUEST_MAPPED))


def _read_agent_message(msg: Message, doc: Reading, cut: list[str]) -> None:
    """``AgentClientMessage``: a run request (model, conversation, the action's text as
    the user's: its layout is not public), tool results (exec), other client messages."""
    for run in msg.messages(1):
        doc["model"] = clean_text(field_text(run, 3, 1)) or doc.get("model")
        doc["conversation_id"] = clean_text(field_text(run, 5)) or doc.get("conversation_id")
        key = field_text(run, 3, 2)
        if key:
            doc["api_key"] = own_credential(doc, 2, key)
        for action in run.messages(2):
            add_message(doc, "user", message_text(action, cut))
        add_strings(doc, unmapped_strings(run, frozenset({2, 3, 5})))
    for number, role in ((2, "tool"), (4, "user"), (6, "user")):  # exec results, actions, interaction answers
        for part in msg.messages(number):
            add_message(doc, role, message_text(part, cut))
    add_strings(doc, unmapped_strings(msg, frozenset({1, 2, 4, 5, 6})))


def message_text(msg: Message, cut: list[str]) -> str:
    """The text of a message whose layout is not public (a tool result, an action): its
    strings, one per line, to :data:`~addon.dialects.rpc.READ_STRINGS` of them (``cut``
    gets what the record leaves out; the filters read it all in the message's bytes)."""
    # (verbatim, as every dialect keeps a prompt: a key pasted into it is the request
    # filters' to find, which a fingerprint in its place would hide from them)
    return "\n".join(strings(msg, READ_STRINGS, READ_CHARS, cut=cut))


def error_details(value: bytes) -> str | None:
    """``aiserver.v1.ErrorDetails{1 error, 2 details{1 title, 2 detail}}`` as text."""
    msg = parse(value)
    number = field_int(msg, 1)
    parts = [
        ERRORS.get(number, f"ERROR_{number}") if number is not None else None,
        field_text(msg, 2, 1),
        field_text(msg, 2, 2),
    ]
    found = [p for p in parts if p]
    return ": ".join(found) if found else None


def block_details(rule_id: str, reason: str) -> bytes:
    """The ``ErrorDetails`` of a content filter's block: ``ERROR_CUSTOM_MESSAGE``, the rule
    as title, the block message as detail, expected (not a server failure)."""
    custom = encode_field(1, "Blocked by content filter") + encode_field(2, block_message(rule_id, reason))
    return encode_field(1, ERROR_CUSTOM_MESSAGE) + encode_field(2, custom) + encode_field(3, 1)


class CursorNormalizer(RpcNormalizer):
    """Reads a Cursor response stream (any of its APIs) into common events."""

    def __init__(self, summary: RequestSummary) -> None:
        super().__init__(summary)
        rpc = summary.rpc if isinstance(summary, RpcSummary) else ""
        self.api = api_of(rpc)
        self.calls = 0  # tool calls seen, for keys of calls without an id
        self.agent_call: str | None = None  # the Agent API's tool call in progress
        self.prompts: set[str] = set()  # hashes of the server prompts reported

    def on_message(self, raw: bytes) -> list[Event]:
        if self.codec == "json":
            return strings_answer(raw, "json")  # (Connect's JSON codec: no field path is known in it)
        msg = parse(raw)
        out: list[Event] = []
        if self.api == CHAT:
            out += unmapped("StreamChatResponse", msg, CHAT_RESPONSE)
            self._chat(msg, out)
        elif self.api == UNIFIED:
            out += unmapped("StreamUnifiedChatResponseWithTools", msg, UNIFIED_RESPONSE)
            for chat in msg.messages(2):
                out += unmapped("StreamUnifiedChatResponse", chat, UNIFIED_CHAT)
                self._chat(chat, out)
                for thinking in chat.messages(25):
                    out += _text(field_text(thinking, 1), "reasoning")
            for call in msg.messages(1):
                self._unified_call(call, out)
        elif self.api == AGENT:
            out += unmapped("AgentServerMessage", msg, AGENT_SERVER)
            for update in msg.messages(1):
                self._interaction(update, out)
            for execution in msg.messages(2):  # the server asks the client to run a tool
                self._exec(execution, out)
        else:  # BidiAppend's answer: nothing of the conversation
            out += unmapped("BidiAppendResponse", msg, frozenset())
        return out

    def describe_details(self, details: list[tuple[str, bytes]]) -> str | None:
        found = [error_details(value) for kind, value in details if kind == ERROR_DETAILS]
        return "; ".join(f for f in found if f) or None

    def status_frame(self, rule_id: str, reason: str) -> RpcStatus:
        message = block_message(rule_id, reason)
        debug = {
            "error": ERRORS[ERROR_CUSTOM_MESSAGE],
            "details": {"title": "Blocked by content filter", "detail": message, "isRetryable": False},
            "isExpected": True,
        }
        return block_status(rule_id, reason, ((ERROR_DETAILS, block_details(rule_id, reason), debug),))

    # -- the messages ----------------------------------------------------------------------

    def _chat(self, msg: Message, out: list[Event]) -> None:
        """Text (field 1) and the server's prompt (field 5) of a chat response."""
        out += _text(field_text(msg, 1), "text")
        prompt = field_text(msg, 5)
        if prompt:
            digest = hashlib.sha256(prompt.encode()).hexdigest()
            if digest not in self.prompts:
                if len(self.prompts) < MAX_PROMPTS:  # (past them each is a finding again: the record counts those)
                    self.prompts.add(digest)
                size = len(prompt.encode())
                detail = f"{size} bytes, sha256 {digest}: {clean(prompt)[:SERVER_PROMPT_CHARS]}"
                out.append(Finding("server_prompt", detail))

    def _unified_call(self, call: Message, out: list[Event]) -> None:
        """``ClientSideToolV2Call``: id 3, name 9 (else the tool enum 1), raw_args 10;
        streamed (14) until its last message (15)."""
        call_id = field_text(call, 3)
        name = field_text(call, 9) or (f"tool_{field_int(call, 1)}" if field_int(call, 1) is not None else None)
        streaming = bool(field_int(call, 14))
        complete = not streaming or bool(field_int(call, 15))
        out.append(ToolCallDelta(call_id or self._key(), field_text(call, 10) or "", call_id, name, 0, complete))

    def _interaction(self, update: Message, out: list[Event]) -> None:
        """``InteractionUpdate``: text 1→1, thinking 4→1, tool calls 2/7/3, turn end 14."""
        out += unmapped("InteractionUpdate", update, INTERACTION)
        for delta in update.messages(1):
            out += _text(field_text(delta, 1), "text")
        for delta in update.messages(4):
            out += _text(field_text(delta, 1), "reasoning")
        for started in update.messages(2):  # layouts not public: the id is taken as field 1
            self.agent_call = _readable_text(started, 1) or self._key()
            out.append(ToolCallDelta(self.agent_call, "", _readable_text(started, 1)))
        for partial in update.messages(7):
            key = _readable_text(partial, 1) or self.agent_call or self._key()
            args, sent = kept_strings(self._strings(partial, frozenset({1}), out), "")
            out.append(ToolCallDelta(key, args, sent=sent))
        for completed in update.messages(3):
            key = _readable_text(completed, 1) or self.agent_call or self._key()
            out.append(ToolCallDelta(key, complete=True))
            self.agent_call = None
        for ended in update.messages(14):
            usage = Usage(
                input_tokens=field_int(ended, 1),
                output_tokens=field_int(ended, 2),
                cache_read_input_tokens=field_int(ended, 3),
                cache_write_input_tokens=field_int(ended, 4),
            )
            if usage != Usage():
                out.append(usage)
            out.append(TurnEnd())

    def _exec(self, execution: Message, out: list[Event]) -> None:
        """``exec_server_message``: a tool the client is to run; its layout is not public,
        so its strings are the call's arguments (what it runs: commands, paths)."""
        found = self._strings(execution, frozenset(), out)
        if found:
            args, sent = kept_strings(found)
            out.append(ToolCallDelta(self._key("exec"), args, None, "exec", 0, True, sent=sent))

    @staticmethod
    def _strings(msg: Message, skip: frozenset[int], out: list[Event]) -> list[str]:
        """The strings of an answer's message whose layout is not public, as sent (the
        record keeps them with credentials fingerprinted: :func:`kept_strings`); what the
        bounds left out is told (``strings_unread``: the failure policy decides)."""
        cut: list[str] = []
        found = strings(msg, READ_STRINGS, READ_CHARS, skip=skip, cut=cut)
        if cut:
            out.append(unread_finding(cut, "a tool call's message"))
        return found

    def _key(self, prefix: str = "call") -> str:
        self.calls += 1
        return f"{prefix}{self.calls}"


def _text(value: str | None, kind: str) -> list[Event]:
    return [TextDelta(value, 0, kind)] if value else []


def _readable_text(msg: Message, number: int) -> str | None:
    """Field ``number`` when it is text (an id), not a nested message."""
    return next((t for v in msg.values(number) if isinstance(v, bytes) and (t := readable(v))), None)


DIALECT = Cursor()
