"""The mock's protobuf RPC methods: what each answers, whatever carries it (Connect or gRPC).

Each method is a :class:`Conversation` that is fed the request messages one by one and
answers with response messages (encoded by hand with :mod:`mockllm.protowire`; the
schemas are ``tests/fixtures/proto``). The transports (:mod:`mockllm.connect`,
:mod:`mockllm.grpc_mock`) frame them, compress them and end the stream.

* ``aiserver.v1.AiService/StreamChat`` (server stream): an empty message (Cursor's
  "stream start"), the system prompt in ``filled_prompt``, then text deltas.
* ``aiserver.v1.ChatService/StreamUnifiedChatWithTools`` (bidi): thinking (text, then
  its signature), text deltas and, with ``tool=NAME``, a client-side tool call; the
  stream then waits for the client's tool result on the same request stream and
  answers it with more text before it ends.
* ``agent.v1.AgentService/Run`` (bidi, Cursor's way): every user message is a turn
  (thinking and text deltas, a heartbeat, then ``turn_ended`` with the turn's usage);
  after a turn the stream waits for the next message and never ends by itself, only
  when the client closes its side.
* ``exa.api_server_pb.ApiServerService/GetChatMessage`` (server stream, Windsurf):
  reasoning (field 9), text (field 3), then a last message with the finish (field 5 =
  2) and usage (field 7, with the served model).
* ``echo.v1.EchoService``: ``Say`` (unary), ``Talk`` (server stream: one message per
  word), ``Chat`` (bidi: one echo per message) for the generic records.

The :class:`~mockllm.scenario.Scenario` knobs mean what they mean elsewhere: ``events``
/ ``text`` (the text deltas), ``reasoning``, ``tool``, ``usage``, ``model``, ``error``
and ``error_after`` (the stream ends with that error after so many text deltas).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from . import protowire as pw
from .scenario import Scenario
from .streams import DEFAULT_MODEL, REASONING_DELTAS, SIGNATURE, TOOL_ARGUMENTS, delta_texts, error_message

Kind = Literal["unary", "server", "bidi"]

SYSTEM_PROMPT = "<|BEGIN_SYSTEM|>\nYou are a mock programmer.\n<|END_SYSTEM|>"
"""What StreamChat leaks in ``filled_prompt``, as Cursor's server does."""
TOOL_CALL_ID = "toolu_mock_1"
TOOL_RESULT_TEXT = "Done with the tool's result."
"""The answer to a unified chat's tool result (after the tool call's turn)."""
WINDSURF_FINISH_STOP = 2
CACHE_WRITE_TOKENS = 3
CACHE_READ_TOKENS = 7
"""Windsurf's usage: fixed cache token counts, so a test can tell the fields apart."""
CURSOR_ERROR_DETAIL = "aiserver.v1.ErrorDetails"


@dataclass
class Answer:
    """What one request message gets: response messages, and whether the stream then ends."""

    messages: list[bytes] = field(default_factory=list)
    done: bool = False
    error: tuple[str, str] | None = None
    """The Connect error code and message the stream ends with (``done`` implied)."""


class Conversation:
    """One call: fed each request message, answers each; :meth:`close` when the client's side ends."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.turn = 0

    def answer(self, message: bytes) -> Answer:
        raise NotImplementedError

    def close(self) -> Answer:
        """The client closed its side: end the stream (cleanly, unless a subclass knows better)."""
        return Answer(done=True)

    def deltas(self, wrap: Callable[[str], bytes]) -> tuple[list[bytes], tuple[str, str] | None]:
        """The scenario's text deltas wrapped as messages, cut short by its ``error``."""
        texts = delta_texts(self.scenario)
        if self.scenario.error is None:
            return [wrap(t) for t in texts], None
        cut = texts[: self.scenario.error_after]
        return [wrap(t) for t in cut], (self.scenario.error, error_message(self.scenario.error))

    def model(self, requested: str) -> str:
        return self.scenario.model or requested or DEFAULT_MODEL


def _words(text: str) -> int:
    return len(text.split())


# -- Cursor ---------------------------------------------------------------------------------------


class StreamChat(Conversation):
    def answer(self, message: bytes) -> Answer:
        def wrap(delta: str) -> bytes:
            return pw.text(1, delta)

        texts, error = self.deltas(wrap)
        return Answer([b"", pw.text(5, SYSTEM_PROMPT), *texts], done=True, error=error)


class UnifiedChat(Conversation):
    """Thinking, text and a tool call; the tool result (request field 2) gets the rest."""

    def answer(self, message: bytes) -> Answer:
        if self.turn > 0 or not pw.get(message, 1):  # a tool result (or anything but a new chat)
            self.turn += 1
            return Answer([self._response(pw.text(1, TOOL_RESULT_TEXT))], done=True)
        self.turn += 1
        messages: list[bytes] = []
        if self.scenario.reasoning:
            messages += [self._response(pw.blob(25, pw.text(1, piece))) for piece in REASONING_DELTAS]
            messages.append(self._response(pw.blob(25, pw.text(2, SIGNATURE))))
        texts, error = self.deltas(lambda delta: self._response(pw.text(1, delta)))
        messages += texts
        if error is not None:
            return Answer(messages, error=error)
        if self.scenario.tool is None:
            return Answer(messages, done=True)
        call = pw.text(3, TOOL_CALL_ID) + pw.text(9, self.scenario.tool) + pw.text(10, TOOL_ARGUMENTS)
        return Answer([*messages, pw.blob(1, call)])

    @staticmethod
    def _response(chat_response: bytes) -> bytes:
        return pw.blob(2, chat_response)


class AgentRun(Conversation):
    """One turn per user message, each ended by ``turn_ended``; the stream stays open."""

    def answer(self, message: bytes) -> Answer:
        prompt = pw.get_text(message, 1, 2, 1, 1, 1) or pw.get_text(message, 4, 1, 1, 1)
        if not prompt:
            return Answer()  # not a user message (a heartbeat, an exec reply): no turn
        self.turn += 1
        messages: list[bytes] = []
        output = 0
        if self.scenario.reasoning:
            messages += [self._update(4, pw.text(1, piece)) for piece in REASONING_DELTAS]
            output += len(REASONING_DELTAS)
        texts, error = self.deltas(lambda delta: self._update(1, pw.text(1, delta)))
        messages += texts
        messages.insert(len(messages) // 2, self._update(13, b""))  # a heartbeat amid the deltas
        if error is not None:
            return Answer(messages, error=error)
        output += len(texts)
        if self.scenario.no_end:  # the turn's end marker never comes (a release that moved it)
            return Answer(messages)
        usage = pw.uint(1, _words(prompt)) + pw.uint(2, output) if self.scenario.usage else b""
        return Answer([*messages, self._update(14, usage)])

    @staticmethod
    def _update(number: int, update: bytes) -> bytes:
        return pw.blob(1, pw.blob(number, update))


# -- Windsurf -------------------------------------------------------------------------------------


class GetChatMessage(Conversation):
    def answer(self, message: bytes) -> Answer:
        requested = pw.get_text(message, 21)
        prompt = " ".join(v.decode(errors="replace") for v in pw.get(message, 3, 3) if isinstance(v, bytes))
        messages: list[bytes] = []
        if self.scenario.reasoning:
            messages += [pw.text(9, piece) for piece in REASONING_DELTAS]
        texts, error = self.deltas(lambda delta: pw.text(3, delta))
        messages += texts
        if error is not None:
            return Answer(messages, error=error)
        usage = b""
        if self.scenario.usage:
            counts = (_words(prompt), len(texts), CACHE_WRITE_TOKENS, CACHE_READ_TOKENS)
            tokens = b"".join(pw.uint(number, count) for number, count in zip((2, 3, 4, 5), counts, strict=True))
            usage = pw.blob(7, tokens + pw.text(9, self.model(requested)))
        return Answer([*messages, pw.uint(5, WINDSURF_FINISH_STOP) + usage], done=True)


# -- the generic echo service ---------------------------------------------------------------------


def _echo(sentence: str, index: int = 0) -> bytes:
    return pw.text(1, sentence) + pw.uint(2, index)


class Say(Conversation):
    def answer(self, message: bytes) -> Answer:
        if self.scenario.error is not None:
            return Answer(error=(self.scenario.error, error_message(self.scenario.error)))
        return Answer([_echo(f"echo: {pw.get_text(message, 1)}")], done=True)


class Talk(Conversation):
    def answer(self, message: bytes) -> Answer:
        words = pw.get_text(message, 1).split()
        if self.scenario.error is not None:
            words = words[: self.scenario.error_after]
            return Answer([_echo(w, i) for i, w in enumerate(words)], error=(self.scenario.error, "mock error"))
        return Answer([_echo(w, i) for i, w in enumerate(words)], done=True)


class Chat(Conversation):
    def answer(self, message: bytes) -> Answer:
        self.turn += 1
        return Answer([_echo(f"echo: {pw.get_text(message, 1)}", self.turn - 1)])


@dataclass(frozen=True)
class Method:
    kind: Kind
    conversation: type[Conversation]
    cursor: bool = False
    """Cursor's own errors carry an ``aiserver.v1.ErrorDetails`` detail."""


METHODS: dict[str, Method] = {
    "/aiserver.v1.AiService/StreamChat": Method("server", StreamChat, cursor=True),
    "/aiserver.v1.ChatService/StreamUnifiedChatWithTools": Method("bidi", UnifiedChat, cursor=True),
    "/agent.v1.AgentService/Run": Method("bidi", AgentRun, cursor=True),
    "/exa.api_server_pb.ApiServerService/GetChatMessage": Method("server", GetChatMessage),
    "/echo.v1.EchoService/Say": Method("unary", Say),
    "/echo.v1.EchoService/Talk": Method("server", Talk),
    "/echo.v1.EchoService/Chat": Method("bidi", Chat),
}
"""Every method the mock answers, by HTTP path."""


def cursor_error_details(code: str, message: str) -> bytes:
    """An ``aiserver.v1.ErrorDetails`` (1 error enum: 29 ERROR_CUSTOM_MESSAGE, 2 details
    {1 title, 2 detail}, 3 is_expected), as Cursor puts in a Connect error's details."""
    return pw.uint(1, 29) + pw.blob(2, pw.text(1, code) + pw.text(2, message)) + pw.uint(3, 1)
