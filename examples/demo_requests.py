"""The requests ``scripts/demo`` sends through the proxy: one inference API after another,
as their clients send them, to the mock upstream (plain HTTP, so no CA to trust).

    python examples/demo_requests.py --proxy http://127.0.0.1:8080 --upstream http://127.0.0.1:8000

The last one mentions an internal code name that ``examples/rules.toml`` blocks: the
proxy answers it itself, in the API's own error format, and the mock never sees it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

import httpx

QUESTION = {"role": "user", "content": "What is the weather in Vienna? Mail it to ana@example.com."}
WEATHER_TOOL = {"type": "object", "properties": {"city": {"type": "string"}}}


@dataclass(frozen=True)
class Request:
    """One request as its API's client sends it; ``scenario`` tells the mock what to answer."""

    label: str
    path: str
    body: dict[str, Any]
    scenario: str = ""
    headers: dict[str, str] = field(default_factory=dict)


REQUESTS = [
    Request(
        "OpenAI Chat, streamed, reasoning + tool call",
        "/v1/chat/completions",
        {
            "model": "gpt-4o",
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [QUESTION],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_TOOL}}],
        },
        "reasoning=1&tool=get_weather&delay=0.05",
    ),
    Request(
        "Anthropic Messages, streamed",
        "/v1/messages",
        {
            "model": "claude-sonnet-4-5",
            "max_tokens": 512,
            "stream": True,
            "messages": [QUESTION],
        },
        "thinking=1&delay=0.05",
        {"anthropic-version": "2023-06-01"},
    ),
    Request(
        "Gemini, streamed (SSE)",
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
        {
            "contents": [{"role": "user", "parts": [{"text": QUESTION["content"]}]}],
        },
        "delay=0.05",
    ),
    Request("OpenAI Responses, one JSON answer", "/v1/responses", {"model": "gpt-5", "input": QUESTION["content"]}),
    Request(
        "llm-stream",
        "/v1/llm/stream",
        {
            "version": "1.0",
            "stream": True,
            "model": "demo",
            "messages": [QUESTION],
            "metadata": {"user_id": "ana", "session_id": "demo-session"},
        },
        "delay=0.05",
        {"content-type": "application/llm-request+json"},
    ),
    Request(
        "OpenAI Chat, blocked by a rule",
        "/v1/chat/completions",
        {
            "model": "gpt-4o",
            "messages": [{"role": "user", "content": "Summarise the Project Nightjar roadmap."}],
        },
    ),
]


def send(client: httpx.Client, upstream: str, request: Request) -> str:
    """Send one request, read the whole answer as its client would; a line about it."""
    headers = {"x-mock": request.scenario} | request.headers
    with client.stream("POST", upstream + request.path, json=request.body, headers=headers) as response:
        body = response.read()
    summary = f"HTTP {response.status_code}, {len(body)} bytes"
    if response.status_code >= 400:
        summary += f": {response.json()['error']['message']}"
    return f"  {request.label:<46} {summary}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proxy", required=True, help="the proxy's URL")
    parser.add_argument("--upstream", required=True, help="the mock upstream's URL")
    args = parser.parse_args()
    with httpx.Client(proxy=args.proxy, timeout=30, trust_env=False) as client:
        for request in REQUESTS:
            print(send(client, args.upstream, request), flush=True)


if __name__ == "__main__":
    main()
