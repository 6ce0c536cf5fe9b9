"""Microsoft Copilot's SignalR ChatHub (dialect ``copilot_chathub``): Bing Chat's
"Sydney" (``/sydney/ChatHub``) and Microsoft 365 Copilot (``/m365Copilot/Chathub/...``,
on ``substrate.office.com`` or ``substrate.svc.cloud.microsoft``).

Both speak the SignalR JSON hub protocol (:mod:`addon.framing.signalr`), claimed by the
path once the handshake names the encoding. Their payloads (see
``docs/dialects.md``):

- the prompt is a client StreamInvocation ``chat`` (``arguments[0].message.text``; its
  ``tone``, ``optionsSets``, ``conversationId`` and earlier messages are kept in the
  request reading); client ``Metrics`` invocations are telemetry, no turn;
- the answer comes as server ``update`` invocations whose bot messages without a
  ``messageType`` (``contentOrigin`` ``DeepLeo``, or ``Apology`` for a retraction) carry
  the **cumulative** answer: a snapshot that extends the text so far gives its new
  suffix, one that does not (rewritten, retracted) replaces it
  (:class:`~addon.events.TextSnapshot`), so the record ends with the last snapshot and
  never a concatenation. M365's ``writeAtCursor`` deltas repeat the snapshots: they are
  read only while a turn has no snapshot. Side messages (``InternalSearchQuery``,
  ``Progress``, ...) and suggested responses are shown text, not the answer;
- the turn's final StreamItem carries ``item.result``: a ``value`` other than
  ``Success`` is the error (:class:`StreamError` with that code and ``result.message``);
  its final text (``result.message`` on success, else the last bot message) is shown text
  where it differs from the streamed one, the answer where nothing streamed; the empty
  Completion ends the turn. A conversation at its user-message limit is a
  ``copilot_throttled`` finding.

A cut answer or a refused prompt ends as these clients read a failed turn: a final item
whose ``result.value`` is ``Filtered`` (message: the rule and reason), then the
Completion; the hub is sent a CancelInvocation. No model is named on the wire (the tone
or options pick one); the record's model stays empty rather than hold a guess.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from addon.dialects import Normalizer, RequestSummary, RequestView, str_field
from addon.dialects.blocking import block_message
from addon.dialects.hub import HubDialect, HubNormalizer, strings_of, user_doc
from addon.dialects.rpc import clean_json, clean_text, kept_text
from addon.events import Event, Finding, ResponseMeta, ShownText, StreamError, TextDelta, TextSnapshot
from addon.framing import Frame
from addon.framing.signalr import HubMessage, handshake_framing, hub_message

_ANSWER_ORIGINS = (None, "DeepLeo", "Apology")  # a bot message's contentOrigin when it is the answer
FILTERED = "Filtered"  # the result value a block's final item carries
#: The most characters of a turn's cursor deltas kept to compare snapshots and the final
#: text with (the record keeps its own bounded copy): a turn that never ends holds no more.
MAX_TEXT = 8 * 1024 * 1024


def _first_argument(message: dict[str, Any]) -> dict[str, Any] | None:
    args = message.get("arguments")
    return args[0] if isinstance(args, list) and args and isinstance(args[0], dict) else None


def _is_answer(m: dict[str, Any]) -> bool:
    """A bot message that is the answer (not a search query, progress note, loader)."""
    return m.get("author") == "bot" and m.get("messageType") is None and m.get("contentOrigin") in _ANSWER_ORIGINS


class ChatHubNormalizer(HubNormalizer):
    """One ChatHub connection: the turns of ``chat`` invocations."""

    reads_keys = False  # (its payloads' keys are Copilot's schema)

    def __init__(self) -> None:
        super().__init__()
        self.text = ""  # the turn's answer as the record has it
        self.snapshots = False  # a cumulative snapshot arrived in this turn
        self.answer_id: str | None = None
        self.throttled = False

    def _open(self, invocation: str) -> None:
        super()._open(invocation)
        self.text, self.snapshots, self.answer_id, self.throttled = "", False, None, False

    # -- client ---------------------------------------------------------------------------

    def on_invoke(self, frame: HubMessage) -> dict[str, Any]:
        message = frame.message
        target = message.get("target")
        if target == "Metrics":
            return {}  # telemetry: timestamps, no prompt
        arg = _first_argument(message)
        if target != "chat" or arg is None:
            return super().on_invoke(frame)
        prompt = arg.get("message")
        text = str_field(prompt, "text") if isinstance(prompt, dict) else None
        if text is None:
            return super().on_invoke(frame)  # the prompt moved: every string is read instead
        doc = user_doc(
            text,
            target,
            tone=clean_text(str_field(arg, "tone")),
            optionsSets=clean_json(arg["optionsSets"]) if isinstance(arg.get("optionsSets"), list) else None,
            conversationId=clean_text(str_field(arg, "conversationId")),
        )
        earlier = arg.get("previousMessages")
        if isinstance(earlier, list):
            doc["messages"][:0] = [
                {
                    "role": "assistant" if m.get("author") == "bot" else "user",
                    "content": kept_text(doc, strings_of(m["text"])),
                }
                for m in earlier
                if isinstance(m, dict) and isinstance(m.get("text"), str)
            ]
        return doc

    # -- server ---------------------------------------------------------------------------

    def on_server(self, frame: HubMessage) -> list[Event]:
        message = frame.message
        if frame.event == "invocation" and message.get("target") == "update":
            arg = _first_argument(message)  # (none after a block ended the turn: the hub's last words)
            return self._update(arg) if arg is not None and self.active is not None else []
        if frame.event == "stream_item" and frame.id and frame.id == self.active:
            item = message.get("item")
            return self._final(item) if isinstance(item, dict) else []
        return super().on_server(frame)

    def _update(self, arg: dict[str, Any]) -> list[Event]:
        """One ``update``: snapshots of the answer, deltas at the cursor, side messages."""
        out: list[Event] = self._throttling(arg.get("throttling"))
        messages = arg.get("messages")
        for m in messages if isinstance(messages, list) else []:
            if not isinstance(m, dict) or not isinstance(m.get("text"), str):
                continue
            if _is_answer(m):
                if self.answer_id is None and isinstance(m.get("messageId"), str):
                    self.answer_id = m["messageId"]
                    out.append(ResponseMeta(response_id=self.answer_id))
                out.extend(self._snapshot(m["text"]))
            elif m["text"]:
                out.append(ShownText(m["text"], kind="side_message"))
            out.extend(_suggestions(m))
        delta = arg.get("writeAtCursor")
        if isinstance(delta, str) and delta and not self.snapshots:
            if len(self.text) < MAX_TEXT:
                self.text += delta
            out.append(TextDelta(delta))
        return out

    def _snapshot(self, text: str) -> list[Event]:
        """The cumulative answer so far: its new suffix, or the whole when it rewrote."""
        self.snapshots = True
        previous, self.text = self.text, text
        if text.startswith(previous):
            return [TextDelta(text[len(previous) :])] if len(text) > len(previous) else []
        return [TextSnapshot(text)]

    def _final(self, item: dict[str, Any]) -> list[Event]:
        """The turn's last StreamItem: its outcome and final text."""
        out: list[Event] = self._throttling(item.get("throttling"))
        result = item.get("result")
        result = result if isinstance(result, dict) else {}
        value, detail = str_field(result, "value"), str_field(result, "message")
        if value is not None and value != "Success":
            self.failed = True
            return [*out, StreamError(value, detail)]
        messages = item.get("messages")
        answers = [m for m in messages if isinstance(m, dict) and _is_answer(m)] if isinstance(messages, list) else []
        final = detail if detail is not None else str_field(answers[-1], "text") if answers else None
        if final and final != self.text:
            out.append(TextDelta(final) if not self.text else ShownText(final, kind="final_text"))
            self.text = self.text or final
        for m in answers[-1:]:
            out.extend(_suggestions(m))
            out.extend(ShownText(t, kind="card") for t in _card_texts(m) if t not in (self.text, final))
        return out

    def _throttling(self, value: Any) -> list[Event]:
        """A finding, once a turn, when the conversation reached its message limit."""
        if self.throttled or not isinstance(value, dict):
            return []
        used, most = value.get("numUserMessagesInConversation"), value.get("maxNumUserMessagesInConversation")
        if isinstance(used, int) and isinstance(most, int) and used >= most:
            self.throttled = True
            return [Finding("copilot_throttled", f"{used} of {most} user messages in the conversation")]
        return []

    # -- blocks ---------------------------------------------------------------------------

    def ending(self, rule_id: str, reason: str) -> list[Frame]:
        return filtered_turn(self.active, block_message(rule_id, reason)) if self.active is not None else []

    def refusal(self, frame: Frame, rule_id: str, reason: str) -> list[Frame]:
        return filtered_turn(frame.id, block_message(rule_id, reason)) if frame.id else []


def _card_texts(m: dict[str, Any]) -> list[str]:
    """The texts of a message's adaptive cards: the markdown copy (with citation links) the
    client may render instead of ``text``; read once, on the final item, since every
    ``update`` repeats it whole."""
    cards = m.get("adaptiveCards")
    if not isinstance(cards, list):
        return []
    return [
        block["text"]
        for card in cards
        if isinstance(card, dict) and isinstance(card.get("body"), list)
        for block in card["body"]
        if isinstance(block, dict) and isinstance(block.get("text"), str) and block["text"]
    ]


def _suggestions(m: dict[str, Any]) -> list[Event]:
    """A message's suggested responses: buttons the client shows."""
    suggested = m.get("suggestedResponses")
    if not isinstance(suggested, list):
        return []
    return [ShownText(s["text"], kind="suggestion") for s in suggested if isinstance(s, dict) and str_field(s, "text")]


def filtered_turn(invocation: str, message: str) -> list[Frame]:
    """A failed turn as Copilot's clients read one: a final item whose result is not
    ``Success``, then the empty Completion."""
    item = {"result": {"value": FILTERED, "message": message}}
    return [
        hub_message({"type": 2, "invocationId": invocation, "item": item}),
        hub_message({"type": 3, "invocationId": invocation}),
    ]


def is_chathub(path: str) -> bool:
    """Sydney's and M365 Copilot's ChatHub paths (any case: the clients differ)."""
    lower = path.lower()
    return lower.startswith("/sydney/chathub") or lower.startswith("/m365copilot/chathub")


class CopilotChatHub(HubDialect):
    name = "copilot-chathub"
    provider = "microsoft"

    def websocket(self, request: RequestView, first: bytes | None) -> str | None:
        if first is None or not is_chathub(request.path):
            return None  # (the encoding is known only from the handshake)
        return handshake_framing(first)

    def summarize(self, body: Any, request: RequestView) -> RequestSummary:
        """M365 names the conversation and request in the query (never the token)."""
        query = parse_qs(request.query)
        conversation = query.get("ConversationId") or query.get("X-SessionId")
        request_id = query.get("ClientRequestId")
        return RequestSummary(
            stream=True,
            session_id=conversation[0] if conversation else None,
            request_id=request_id[0] if request_id else None,
        )

    def normalizer(self, request: RequestSummary) -> Normalizer:
        return ChatHubNormalizer()


DIALECT = CopilotChatHub()
