"""The common event model every dialect normalizes into.

A dialect normalizer turns its protocol's SSE events (or a whole JSON body) into these
small events; the exchange record accumulates them and, later, content filters inspect
them. Keeping one model is what lets one audit pipeline serve every inference API
(llm-stream draft section 7.1: translation into one event model).

The classes are frozen dataclasses with ``__slots__``: they are created for every SSE
event on the proxy's event loop, so they must be cheap (see :func:`_quick_init`).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields


@dataclass(frozen=True, slots=True)
class ResponseMeta:
    """Identity of the response: the model that served it and the ids it carries."""

    model: str | None = None
    response_id: str | None = None
    request_id: str | None = None
    created: int | None = None


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of generated text.

    ``choice`` is the alternative answer (OpenAI ``choices[i]``, Gemini candidates,
    llm-stream content block index); ``kind`` separates the answer text from reasoning
    and refusals, which the audit keeps apart.

    ``sent`` is the text as the client got it when the record keeps it otherwise (a
    credential in a field nobody mapped, kept as its fingerprint: :func:`~addon.dialects.rpc.kept_strings`),
    else None. The output filters read ``sent``: they must see the answer as sent, in
    its stream, or a word begun in one piece and ended in a piece holding a key went
    past them (each piece alone holds neither half whole).
    """

    text: str
    choice: int = 0
    kind: str = "text"  # "text" | "reasoning" | "refusal"
    sent: str | None = field(default=None, repr=False)  # (it may hold a key: not in a log line)

    @property
    def as_sent(self) -> str:
        """What the client got of this piece: what the output filters read."""
        return self.text if self.sent is None else self.sent


@dataclass(frozen=True, slots=True)
class ShownText:
    """Text a client may show a person that is not part of the record's output.

    A Responses stream's final text that disagrees with its deltas, say: the record keeps
    the deltas (what a streaming client showed), while a client reading the final event
    shows this. The record ignores it; the output filters check it (``kind`` names it in
    their verdicts' location) like any other text.
    """

    text: str
    choice: int = 0
    kind: str = "final_text"


@dataclass(frozen=True, slots=True)
class TextSnapshot:
    """The whole text of one choice so far, replacing what was read before.

    For protocols whose answers are cumulative snapshots (Copilot's ChatHub ``update``
    messages) when a snapshot does not extend the previous one (the answer rewritten or
    retracted): the record then ends with the last snapshot, never a concatenation, and
    the output filters check it whole.
    """

    text: str
    choice: int = 0
    kind: str = "text"


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A fragment of a tool call, assembled by ``key``.

    Vendors stream tool calls in pieces keyed differently (OpenAI Chat by ``index``,
    Responses by item id, Anthropic by content block); the normalizer picks the key and
    the record joins ``arguments`` fragments in arrival order. ``complete`` marks the
    fragment after which the call is known to be whole.
    """

    key: str
    arguments: str = ""
    id: str | None = None
    name: str | None = None
    choice: int = 0
    complete: bool = False
    free_form: bool = False  # the arguments are free text (a Responses custom tool's input), not JSON
    sent: str | None = field(default=None, repr=False)  # the arguments as sent, when the record keeps others

    @property
    def arguments_sent(self) -> str:
        """What the client got of these arguments: what the output filters read."""
        return self.arguments if self.sent is None else self.sent


@dataclass(frozen=True, slots=True)
class Finish:
    """A stop reason for one choice (several may arrive; the last one wins)."""

    reason: str
    choice: int = 0


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts as the provider reported them; ``None`` means not reported.

    Fields that are ``None`` leave earlier values untouched, so dialects that spread
    usage over several events (Anthropic) can emit each part as it arrives.
    """

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cache_write_input_tokens: int | None = None
    reasoning_output_tokens: int | None = None
    # Per modality, where the provider splits them (OpenAI Realtime, Gemini Live): parts
    # of input_tokens and output_tokens, never added to them.
    input_text_tokens: int | None = None
    input_audio_tokens: int | None = None
    input_image_tokens: int | None = None
    output_text_tokens: int | None = None
    output_audio_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class StreamError:
    """An error the upstream reported inside the response."""

    code: str | None
    message: str | None


@dataclass(frozen=True, slots=True)
class PromptText:
    """What the user said, as the upstream transcribed it (a voice prompt over a
    WebSocket): the request side of the turn, though it arrives from the server.
    ``piece``: one piece of a transcript that arrives in pieces (Gemini Live), joined to
    the piece before it."""

    text: str
    piece: bool = False


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """The dialect's terminal event arrived: the response is complete."""


@dataclass(frozen=True, slots=True)
class TurnEnd:
    """One turn of a long-lived stream is over (Cursor's ``turn_ended``), though the
    stream goes on: what was read so far is one exchange's record, and what follows
    belongs to the next turn's. Streams that end with their answer never emit it.

    ``going_on``: on a stream that carries several answers at once, each on a choice of
    its own (OpenAI Realtime's responses in progress side by side), the choices of those
    that did not end here. Only the answer that ended is whole: the others' text so far
    is still one text with what follows, for the output filters (the default, none, is
    the end of everything the turn carried)."""

    going_on: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Replayed:
    """This SSE event repeats one an earlier exchange already audited (a resumed stream).

    The record counts it as replayed instead of as a new event.
    """


@dataclass(frozen=True, slots=True)
class Finding:
    """A conformance or input problem, recorded with the exchange.

    ``code`` is one of the stable codes in :mod:`addon.findings`.
    """

    code: str
    detail: str = ""


Event = (
    ResponseMeta
    | TextDelta
    | ShownText
    | TextSnapshot
    | ToolCallDelta
    | Finish
    | Usage
    | StreamError
    | PromptText
    | StreamEnd
    | TurnEnd
    | Replayed
    | Finding
)


def _quick_init(cls: type) -> None:
    """Give a frozen slotted event class an ``__init__`` that fills its slots through
    their descriptors.

    The generated one goes through ``object.__setattr__`` once per field (that is how
    frozen is enforced), which made a ``Usage`` (ten fields, one per Gemini chunk) cost
    about six times an unfrozen one. This one has the same signature and defaults and
    gives the same object (equal, hashed, immutable afterwards), built the way the SSE
    parser builds its events.
    """
    names = [f.name for f in fields(cls)]
    if not names:
        return
    params, body = [], []
    env: dict[str, object] = {}
    for f in fields(cls):
        if f.default is MISSING:
            params.append(f.name)
        else:
            env[f"_d_{f.name}"] = f.default
            params.append(f"{f.name}=_d_{f.name}")
        env[f"_s_{f.name}"] = cls.__dict__[f.name].__set__
        body.append(f"    _s_{f.name}(self, {f.name})")
    source = f"def __init__(self, {', '.join(params)}):\n" + "\n".join(body) + "\n"
    exec(source, env)  # noqa: S102 - built from the class's own field names, as dataclasses does
    init = env["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"  # type: ignore[attr-defined]
    init.__doc__ = cls.__init__.__doc__  # type: ignore[misc]
    cls.__init__ = init  # type: ignore[misc]


for _cls in (
    ResponseMeta,
    TextDelta,
    ShownText,
    TextSnapshot,
    ToolCallDelta,
    Finish,
    Usage,
    StreamError,
    PromptText,
    Finding,
):
    _quick_init(_cls)
