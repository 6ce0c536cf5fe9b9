"""What the proxy sends in place of an answer a content filter stopped: the shared pieces.

A filter stops an exchange at one of two points, and each dialect module says what its
client receives then (sans-IO: bytes out, the proxy sends them):

- :meth:`~addon.dialects.Dialect.blocked_response`: the request is blocked before it goes
  upstream. The client gets a whole answer its SDK understands: for a streaming request
  HTTP 200 and an event stream carrying the dialect's filtered or failed outcome, for any
  other request the dialect's error JSON with HTTP 400 (the status providers use when
  they refuse a request on policy).
- :meth:`~addon.dialects.Normalizer.termination`: a stream is cut while it flows. The
  bytes appended end it in its own dialect, continuing from what the normalizer has read.

This module holds only what is the same for every dialect: the message, the frames and
the HTTP envelopes, and ids. Both kinds of answer are frames encoded by the stream's
framing writer (:mod:`addon.framing`: SSE, Gemini's JSON array), so no dialect writes
a frame's bytes itself. Decisions that hold everywhere:

- The message names the rule id and the reason, never the matched text (the proxy does
  not have it here, and filters keep it out of ``reason``).
- Every value a dialect puts in a frame it builds (an id the client or the upstream
  sent, read leniently) is encoded by :func:`addon.json_read.dumps`, which never refuses one: a lone
  surrogate escape (``"\\ud800"``, which ``JSON.parse`` and Python's ``json`` take) is
  written back as the same escape, so the client reads back the id it sent.
- Ids the proxy has to invent (a response id when none came from upstream) are random,
  so that a client storing them never sees one twice; timestamps are the current time.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from addon import json_read
from addon.framing import Frame, Message, Writer
from addon.framing.sse import SSE_WRITER

BLOCKED_STATUS = 400
FILTERED_CODE = "content_filtered"  # llm-stream draft section 5.3.6; LMSP and Responses use it too
SSE_HEADERS = (("content-type", "text/event-stream"), ("cache-control", "no-cache"))


@dataclass(frozen=True, slots=True)
class BlockedResponse:
    """A complete HTTP answer made by the proxy: status, headers (names lower-case), body.

    Framing headers (``content-length``) are the sender's: the body is final.
    """

    status: int
    headers: list[tuple[str, str]]
    body: bytes


def block_message(rule_id: str, reason: str) -> str:
    """The human-readable message of a block: the rule and why, nothing of the content."""
    reason = reason.strip()
    head = f"Blocked by content filter rule '{rule_id}'"
    return f"{head}: {reason}" if reason else head


def frame(data: Mapping[str, Any] | str, event: str = "message", *, event_id: int | None = None) -> Message:
    """One frame a dialect sends in place of upstream's (a stream it cut, a blocked
    stream), for its framing's writer to encode: ``data`` a JSON object (compact JSON,
    :func:`addon.json_read.dumps`) or a literal string (OpenAI's ``[DONE]``)."""
    text = data if isinstance(data, str) else json_read.dumps(data)
    return Message(text, event, "" if event_id is None else str(event_id))


def event_stream(
    frames: Sequence[Frame], writer: Writer = SSE_WRITER, headers: Sequence[tuple[str, str]] = SSE_HEADERS
) -> BlockedResponse:
    """A whole stream as the answer to a streaming request (HTTP 200): ``frames`` encoded
    by the stream's framing ``writer`` as the start of a body (nothing was sent before)."""
    return BlockedResponse(200, list(headers), writer.encode(frames, False))


def json_response(
    obj: Mapping[str, Any] | list[Any], status: int = BLOCKED_STATUS, content_type: str = "application/json"
) -> BlockedResponse:
    """A JSON answer: an error document (HTTP 400 by default) or a 200 body."""
    return BlockedResponse(status, [("content-type", content_type)], json_read.dumps(obj).encode())


def openai_error(message: str, code: str) -> dict[str, Any]:
    """OpenAI's error object (Chat Completions and Responses share it): a request refused."""
    return {"message": message, "type": "invalid_request_error", "param": None, "code": code}


def kept(answer: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """The named fields of a blocked answer, for the filtered answer that replaces it:
    its ids, model and usage, never a field that could carry the blocked text (an
    upstream may put text anywhere; only the fields named are known to hold none)."""
    return {name: answer[name] for name in names if name in answer}


def random_id(prefix: str) -> str:
    """A fresh id in a vendor's style, e.g. ``resp_`` + 32 hex digits."""
    return prefix + uuid.uuid4().hex


def unix_now() -> int:
    """The current time in whole seconds, as ``created`` fields carry it."""
    return int(time.time())


def unfinished(finished: Mapping[int, bool]) -> list[int]:
    """The choices a cut stream must still end, given which choices were seen and finished.

    Those not finished; when every one has finished (the proxy may have held back the
    chunk that finished them), all of them again; when none was seen, choice 0.
    """
    return [i for i, done in sorted(finished.items()) if not done] or sorted(finished) or [0]
