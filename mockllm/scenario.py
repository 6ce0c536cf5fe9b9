"""What a single mock response should look like, as chosen by the client.

Tests steer the mock per request rather than per process, so one server can
serve a normal stream, a truncated one and a gzip one side by side. The knobs
arrive in the URL query string and/or in an ``x-mock`` request header written
in the same ``key=value&key=value`` form; the header wins on conflicts because
it is the more deliberate, per-request channel (a query may be baked into a
base URL). Unknown keys are ignored so clients of other dialects can carry
their own parameters; malformed values raise :class:`ScenarioError` so a typo
in a test fails loudly instead of silently streaming the default.

One scenario drives every dialect: each knob means the same thing everywhere
(``reasoning`` is OpenAI's reasoning and Anthropic's or Gemini's thinking, and
may be spelled ``thinking``), and a dialect ignores the knobs its protocol
has no place for.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any
from urllib.parse import parse_qsl


class ScenarioError(ValueError):
    """A known scenario parameter has a value that cannot be used."""


def _int(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    def parse(value: str) -> int:
        number = int(value)
        if number < minimum or (maximum is not None and number > maximum):
            raise ValueError(f"out of range [{minimum}, {maximum if maximum is not None else '∞'}]")
        return number

    return parse


def _seconds(value: str) -> float:
    number = float(value)
    if not number >= 0:  # also rejects NaN
        raise ValueError("must be >= 0")
    return number


def _flag(value: str) -> bool:
    """Booleans; a bare key (``x-mock: gzip&crlf``) means on."""
    lowered = value.strip().lower()
    if lowered in {"", "1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ValueError("expected 1/0, true/false, yes/no or on/off")


def _text(value: str) -> str:
    return value


CODINGS = ("gzip", "deflate", "br", "zstd")


def _coding(value: str) -> str:
    if value not in CODINGS:
        raise ValueError(f"expected one of {', '.join(CODINGS)}")
    return value


def _base64url(value: str) -> bytes:
    """Decode base64url, tolerating stripped ``=`` padding (common in URLs)."""
    try:
        return base64.b64decode(value + "=" * (-len(value) % 4), altchars=b"-_", validate=True)
    except binascii.Error as exc:
        raise ValueError(f"invalid base64url: {exc}") from None


def _param(default: Any, parse: Callable[[str], Any]) -> Any:
    return field(default=default, metadata={"parse": parse})


_ALIASES = {"thinking": "reasoning"}
"""Other spellings of a parameter: the vendors' own words for the same thing."""


@dataclass(frozen=True)
class Scenario:
    """Parameters of one mock response; defaults give a small, clean stream.

    Field names are the parameter names clients use.
    """

    events: int = _param(5, _int(0))
    """Number of content deltas."""
    text: str | None = _param(None, _text)
    """Explicit answer text, split into ``events`` pieces; default is ``tök0 tök1 …``."""
    size: int | None = _param(None, _int(0))
    """UTF-8 bytes of text per delta (default text only), for big events."""
    ascii: bool = _param(False, _flag)
    """The default text in ASCII (``tok0 tok1 …``, one byte a character) instead of
    ``tök0 tök1 …`` (a two-byte ``ö`` in each word)."""
    delay: float = _param(0.0, _seconds)
    """Seconds between consecutive body writes."""
    first_delay: float = _param(0.0, _seconds)
    """Seconds between the response headers and the first body write."""
    error: str | None = _param(None, _text)
    """Error code: an in-stream error event, the JSON error code when ``status >= 400``,
    or, for a request that does not stream, a ``500`` with that code."""
    error_after: int = _param(0, _int(0))
    """Deltas emitted before the error event."""
    truncate_after: int | None = _param(None, _int(0))
    """Abort the transport after this many events (or raw chunks)."""
    no_end: bool = _param(False, _flag)
    """End the body cleanly but without the stream's terminal event (``stream.end``,
    ``[DONE]``, ``message_stop``, ``response.completed``, Gemini's last chunk); Cursor's
    agent stream: end no turn with ``turn_ended``."""
    tool: str | None = _param(None, _text)
    """Name of a tool to call (arguments ``{"city":"Vienna"}``)."""
    tools: int = _param(1, _int(1))
    """Parallel calls of ``tool``; call ``i`` gets another city."""
    truncate_tool: bool = _param(False, _flag)
    """Cut the last tool call's arguments in half as if the token limit hit."""
    reasoning: bool = _param(False, _flag)
    """Reasoning / thinking before the answer (alias ``thinking``)."""
    refusal: bool = _param(False, _flag)
    """The answer is a refusal (OpenAI ``refusal`` fields, Anthropic stop reason)."""
    n: int | None = _param(None, _int(1))
    """Number of choices / candidates, overriding the request's ``n`` / ``candidateCount``."""
    status: int = _param(200, _int(200, 599))
    """HTTP status; ``>= 400`` replies with a JSON problem body instead of a stream."""
    gzip: bool = _param(False, _flag)
    """Gzip the body incrementally (sync-flushed per event); the same as ``encoding=gzip``."""
    encoding: str | None = _param(None, _coding)
    """Content-Encoding of the body, applied per write: ``gzip`` and ``deflate`` sync-flushed,
    ``br`` flushed, ``zstd`` one frame per write (so a body holds many frames)."""
    bomb: int | None = _param(None, _int(1, 4096))
    """A compression bomb: this many MiB of spaces right after the first write (in an
    event stream inside one SSE comment, ``:`` … ``\n\n``; after a JSON answer as
    trailing whitespace), compressed with ``encoding`` into a few KB. Made once per
    body off the server's event loop and kept."""
    repeat: int | None = _param(None, _int(1))
    """Write the body's second item (a text delta, in a stream) this many more times:
    very long streams, made as they are written."""
    blocks: int = _param(0, _int(0))
    """Anthropic, a request that does not stream: this many text blocks (``tök0 ``,
    ``tök1 `` …) before the answer's own: an answer costly to read."""
    crlf: bool = _param(False, _flag)
    """Use CRLF line ends in the SSE framing."""
    comment: bool = _param(False, _flag)
    """Send a ``: keep-alive`` SSE comment block before each event."""
    raw: bytes | None = _param(None, _base64url)
    """Exact body bytes (base64url) replacing the generated events."""
    chunk: int | None = _param(None, _int(1))
    """Split ``raw`` into writes of this many bytes."""
    usage: bool = _param(True, _flag)
    """Emit a usage event."""
    seq_gap: int | None = _param(None, _int(0))
    """Skip one sequence number after this many events."""
    model: str | None = _param(None, _text)
    """Served model name; default is the request's model."""
    expired: bool = _param(False, _flag)
    """LMSP task events: the whole event history has expired (``410``)."""
    retain: int | None = _param(None, _int(0))
    """LMSP task events: only the last ``retain`` events are still kept."""
    stamp: bool = _param(False, _flag)
    """Start each text delta with ``~`` and the wall-clock time of its write in
    nanoseconds (``time.time_ns()``, its 19 digits as the letters ``a`` to ``j``), for
    measuring per-event delay (``scripts/bench``); not with an ``encoding``, whose bytes
    cannot be stamped."""

    @property
    def coding(self) -> str | None:
        """The body's Content-Encoding, if any."""
        return self.encoding or ("gzip" if self.gzip else None)

    @classmethod
    def parse(cls, query: str = "", header: str | None = None) -> Scenario:
        """Build a scenario from a query string and an optional ``x-mock`` header."""
        raw: dict[str, str] = {}
        for source in (query, header or ""):
            raw.update((_ALIASES.get(key, key), value) for key, value in parse_qsl(source, keep_blank_values=True))
        values: dict[str, Any] = {}
        for spec in fields(cls):
            if spec.name in raw:
                try:
                    values[spec.name] = spec.metadata["parse"](raw[spec.name])
                except ValueError as exc:
                    raise ScenarioError(f"{spec.name}={raw[spec.name]!r}: {exc}") from None
        return cls(**values)
