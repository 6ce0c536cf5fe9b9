"""Realistic request bodies and response streams, built by the mock's own pure builders.

The bytes are exactly what ``scripts/mock-llm`` sends for each dialect (and what the
recorded vendor streams look like): thousands of small deltas, Gemini's CRLF framing,
OpenAI's ``[DONE]``; plus a few huge events. :func:`chunked` splits a body the ways a
network delivers it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from addon.dialects import Dialect, RequestView
from addon.dialects.registry import detect_request
from mockllm.scenario import Scenario
from mockllm.streams import DIALECTS

# A prompt of the size a chat client sends: a system prompt and a question of about a
# kilobyte each (plain English, nothing a content filter would match).
SYSTEM_PROMPT = (
    "You are a careful assistant for a software team. Answer precisely, cite the files you "
    "rely on, prefer short code examples, and say when you are not sure. " * 6
).strip()
USER_PROMPT = (
    "Here is the function that parses our configuration file and the error we see when the "
    "file has a trailing comma. Explain what goes wrong and propose a fix with a test. " * 6
).strip()
MESSAGES = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": USER_PROMPT}]

# Answer text: plain English (ASCII), and Japanese with emoji (non-ASCII-heavy: nearly
# every character two to four bytes of UTF-8). Nothing a content filter would match.
PROSE = (
    "Morning light came slowly over the hills, and the garden woke in its usual order. "
    "First the blackbirds, then the bees, and at last the old gardener with his tea, who "
    "walked along the beds to see what the night had done. The beans had climbed another "
    "hand along their poles, the lettuces were fat and cool, and the roses by the wall "
    "had opened three new flowers since the evening before. He made a note to water the "
    "young trees before the afternoon grew hot, to tie up the tomatoes that leaned too far, "
    "and to ask his neighbour whether she wanted any of the early plums this year. "
)
JAPANESE = (
    "今朝は少し寒かったけれど、駅まで歩くと体が温まりました。☕ 会議では新しい計画について"
    "話し合い、皆で次の手順を決めました。🚀 午後は資料をまとめて、夕方には友達と晩ご飯を"
    "食べに行きました。🍜 明日も良い一日になりますように。✨😊 "
)


def text_of(paragraph: str, chars: int) -> str:
    """``chars`` characters of ``paragraph``, repeated."""
    return (paragraph * (chars // len(paragraph) + 1))[:chars]


@dataclass(frozen=True)
class Api:
    """How one dialect is asked for a stream: path, headers and body (as a client sends them)."""

    mock_dialect: str  # the key of mockllm.streams.DIALECTS
    path: str
    query: str
    headers: dict[str, str]
    body: dict[str, Any]

    def view(self) -> RequestView:
        return RequestView("POST", self.path, self.query, {k.lower(): v for k, v in self.headers.items()})

    def addon_dialect(self) -> Dialect:
        """The addon's dialect for this request, found the way the proxy finds it."""
        dialect = detect_request(self.view(), lambda: self.body)
        if dialect is None:
            raise RuntimeError(f"no addon dialect recognises the {self.mock_dialect} request")
        return dialect

    @property
    def target(self) -> str:
        return self.path + (f"?{self.query}" if self.query else "")


JSON = {"content-type": "application/json"}
APIS: dict[str, Api] = {
    "llm-stream": Api(
        "llm-stream",
        "/v1/llm/stream",
        "",
        {"content-type": "application/llm-request+json"},
        {"version": "1.0", "stream": True, "model": "bench-model", "messages": MESSAGES},
    ),
    "openai-chat": Api(
        "openai-chat",
        "/v1/chat/completions",
        "",
        JSON,
        {"model": "gpt-bench", "stream": True, "stream_options": {"include_usage": True}, "messages": MESSAGES},
    ),
    "openai-responses": Api(
        "openai-responses",
        "/v1/responses",
        "",
        JSON,
        {"model": "gpt-bench", "stream": True, "instructions": SYSTEM_PROMPT, "input": USER_PROMPT},
    ),
    "anthropic": Api(
        "anthropic",
        "/v1/messages",
        "",
        JSON | {"anthropic-version": "2023-06-01"},
        {
            "model": "claude-bench",
            "stream": True,
            "max_tokens": 10_000_000,
            "system": SYSTEM_PROMPT,
            "messages": MESSAGES[1:],
        },
    ),
    "gemini": Api(
        "gemini",
        "/v1beta/models/gemini-bench:streamGenerateContent",
        "alt=sse",
        JSON,
        {
            "systemInstruction": {"parts": [{"text": SYSTEM_PROMPT}]},
            "contents": [{"role": "user", "parts": [{"text": USER_PROMPT}]}],
        },
    ),
    "lmsp": Api(
        "lmsp",
        "/lmsp/v1/responses",
        "",
        JSON,
        {"model": "lmsp-bench", "stream": True, "instructions": SYSTEM_PROMPT, "input": USER_PROMPT},
    ),
}


def stream_items(api: Api, **scenario: Any) -> list[bytes]:
    """The framed events the mock writes for this request and scenario, one item per write."""
    return DIALECTS[api.mock_dialect].stream(api.body, Scenario(**scenario))


def request_bytes(api: Api) -> bytes:
    return orjson.dumps(api.body)


def chunked(items: list[bytes], how: str) -> list[bytes]:
    """The body split as it arrives: ``event`` (one write per chunk, a live stream),
    or ``N`` bytes per chunk (``1460``: a TCP segment, events cut anywhere; ``16384``:
    a socket read under load)."""
    if how == "event":
        return list(items)
    size = int(how)
    body = b"".join(items)
    return [body[i : i + size] for i in range(0, len(body), size)]
