"""The auditor's fast path for text deltas changes no record: differential tests.

Nearly every frame of a stream is a bit of answer text; :meth:`Normalizer.read` gives it
to the record as the text alone (``text_of`` in the JSON dialects, the quick branch of
Gemini's ``on_json``, llm-stream's ``_text_of``), without a ``TextDelta``. Here every
stream is audited twice, with the fast paths and with them switched off (each frame
read the careful way, each event folded by ``ExchangeRecord.apply``), split at every
offset or at many random ones, with and without a small content cap: the rows must be
equal. The streams are the shared recordings (when ``../shared`` is there), the mock's
streams for each dialect, and inline ones written to sit on every edge of the fast
paths' conditions (a second choice, reasoning beside text, a new id, usage on a text
chunk, a first event that is a delta, ...). Each is also read in runs of raw chunks
(``READ_RUN``, the proxy's way when nothing holds the stream back) and chunk by chunk:
the rows must not tell them apart.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from pipeline import audit_bytes

from addon import auditor as auditor_module
from addon.dialects import Dialect, JsonEventNormalizer, RequestView
from addon.dialects import gemini as gemini_module
from addon.dialects.anthropic import DIALECT as ANTHROPIC
from addon.dialects.gemini import DIALECT as GEMINI
from addon.dialects.llm_stream import DIALECT as LLM_STREAM
from addon.dialects.llm_stream import LLMStreamNormalizer
from addon.dialects.lmsp import DIALECT as LMSP
from addon.dialects.openai_chat import DIALECT as OPENAI_CHAT
from addon.dialects.openai_responses import DIALECT as OPENAI_RESPONSES
from addon.framing.sse import SSEEvent
from addon.record import OUTCOME_COMPLETE, OUTCOME_UPSTREAM_ABORTED
from mockllm.scenario import Scenario
from mockllm.streams import DIALECTS as MOCK

SHARED_STREAMS = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "streams"


def _view(path: str, query: str = "", headers: dict[str, str] | None = None) -> RequestView:
    return RequestView("POST", path, query, headers or {})


# dialect, request body, request view, and the mock's name for it
APIS: dict[str, tuple[Dialect, dict[str, Any], RequestView, str]] = {
    "openai-chat": (
        OPENAI_CHAT,
        {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
        _view("/v1/chat/completions"),
        "openai-chat",
    ),
    "anthropic": (
        ANTHROPIC,
        {"model": "m", "stream": True, "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]},
        _view("/v1/messages", headers={"anthropic-version": "2023-06-01"}),
        "anthropic",
    ),
    "gemini": (
        GEMINI,
        {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
        _view("/v1beta/models/m:streamGenerateContent", "alt=sse"),
        "gemini",
    ),
    "openai-responses": (
        OPENAI_RESPONSES,
        {"model": "m", "stream": True, "input": "hi"},
        _view("/v1/responses"),
        "openai-responses",
    ),
    "lmsp": (LMSP, {"model": "m", "stream": True, "input": "hi"}, _view("/lmsp/v1/responses"), "lmsp"),
    "llm-stream": (
        LLM_STREAM,
        {"version": "1.0", "stream": True, "model": "m", "messages": [{"role": "user", "content": "hi"}]},
        _view("/v1/llm/stream", headers={"content-type": "application/llm-request+json"}),
        "llm-stream",
    ),
}


@contextmanager
def careful_way(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every fast path off: each frame read by ``on_json`` (or its handler), each event
    folded by ``ExchangeRecord.apply``."""
    with monkeypatch.context() as m:
        pending = [JsonEventNormalizer]
        while pending:
            cls = pending.pop()
            m.setattr(cls, "_fast", False)
            pending.extend(cls.__subclasses__())
        m.setattr(LLMStreamNormalizer, "_text_of", lambda self, obj: None)
        m.setattr(gemini_module, "_plain_text", lambda chunk: None)
        yield


def audit(api: str, body: bytes, cuts: list[int], outcome: str = OUTCOME_COMPLETE, cap: int | None = None) -> dict:
    """The row of ``body`` fed in pieces cut at ``cuts`` (with a content cap of ``cap`` bytes)."""
    dialect, request, view, _ = APIS[api]
    return audit_bytes(dialect, body, cuts, request=request, request_view=view, outcome=outcome, max_record_bytes=cap)


def splits(body: bytes, seed: int) -> list[list[int]]:
    """Whole, at every offset (every few for long bodies), and 12 random multi-cuts."""
    rng = random.Random(seed)
    n = len(body)
    out: list[list[int]] = [[]]
    out += [[i] for i in range(1, n, max(1, n // 120))]
    out += [sorted(rng.sample(range(1, n), min(n - 1, rng.randint(2, 30)))) for _ in range(12) if n > 2]
    return out


def assert_same(monkeypatch: pytest.MonkeyPatch, api: str, body: bytes) -> None:
    """The rows equal: read in runs (the proxy's way: these bodies are one run), in runs
    of 97 bytes (runs that fill mid-stream, cut anywhere), chunk by chunk, and chunk by
    chunk the careful way."""
    cases = [(cuts, outcome, None) for cuts in splits(body, len(body)) for outcome in (OUTCOME_COMPLETE,)]
    cases += [([], OUTCOME_UPSTREAM_ABORTED, None), ([], OUTCOME_COMPLETE, 40), ([7], OUTCOME_COMPLETE, 301)]
    fast = [audit(api, body, *case) for case in cases]
    with monkeypatch.context() as m:
        m.setattr(auditor_module, "READ_RUN", 97)
        runs = [audit(api, body, *case) for case in cases]
        m.setattr(auditor_module, "READ_RUN", 0)  # every chunk read as it comes
        chunked = [audit(api, body, *case) for case in cases]
        with careful_way(monkeypatch):
            careful = [audit(api, body, *case) for case in cases]
    for case, f, r, ch, c in zip(cases, fast, runs, chunked, careful):
        assert f == r == ch == c, f"{api} split {case}"
    assert fast[0]["event_count"] > 0


def sse(*events: tuple[str | None, Any], crlf: bool = False) -> bytes:
    """An event stream: ``(event name or None, data)``; data not a str is JSON."""
    nl = "\r\n" if crlf else "\n"
    out = []
    for name, data in events:
        head = f"event: {name}{nl}" if name else ""
        text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
        out.append(f"{head}data: {text}{nl}{nl}")
    return "".join(out).encode()


# -- the recordings and the mock's streams ------------------------------------------------------

PREFIXES = {
    "anthropic": "anthropic",
    "gemini": "gemini",
    "openai-chat": "openai-chat",
    "openai-compat": "openai-chat",
    "openai-responses": "openai-responses",
    "llmstream": "llm-stream",
}


def shared_streams() -> list[tuple[str, str]]:
    if not SHARED_STREAMS.exists():
        return []
    out = []
    for path in sorted(SHARED_STREAMS.glob("*.sse")):
        api = next((a for p, a in PREFIXES.items() if path.name.startswith(p)), None)
        if api is not None:
            out.append((api, path.name))
    return out


@pytest.mark.skipif(not SHARED_STREAMS.exists(), reason="../shared/reference/streams not present")
@pytest.mark.parametrize(("api", "name"), shared_streams())
def test_shared_recordings(monkeypatch: pytest.MonkeyPatch, api: str, name: str) -> None:
    assert_same(monkeypatch, api, (SHARED_STREAMS / name).read_bytes())


SCENARIOS = [
    {"events": 30},
    {"events": 20, "reasoning": True},
    {"events": 12, "tool": "get_weather"},
    {"events": 10, "tool": "f", "tools": 3},
    {"events": 8, "refusal": True},
    {"events": 9, "n": 3},
    {"events": 20, "error": "server_error", "error_after": 8},
    {"events": 20, "truncate_after": 9},
    {"events": 12, "no_end": True},
    {"events": 12, "crlf": True, "comment": True},
    {"events": 12, "usage": False},
    {"events": 12, "seq_gap": 3},
    {"events": 10, "text": "héllo wörld ✓ 😀 and more"},
    {"events": 4, "size": 700},
]


@pytest.mark.parametrize("api", sorted(APIS))
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_mock_streams(monkeypatch: pytest.MonkeyPatch, api: str, scenario: dict[str, Any]) -> None:
    dialect, request, _, mock = APIS[api]
    try:
        body = b"".join(MOCK[mock].stream(request, Scenario(**scenario)))
    except Exception:  # noqa: BLE001 - a scenario this dialect's mock has no stream for
        pytest.skip(f"the mock has no {scenario} stream for {api}")
    assert_same(monkeypatch, api, body)


# -- streams on the edges of the fast paths ------------------------------------------------------


def chat(delta: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta if delta is not None else {"content": "x"}, "finish_reason": None}
    chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [choice]}
    return chunk | fields


CHAT_EDGES = [
    (None, chat({"role": "assistant", "content": ""})),
    (None, chat({"content": "plain"})),
    (None, chat({"role": "assistant", "content": "with role"})),
    (None, chat({"content": "and reasoning", "reasoning_content": "think"})),
    (None, chat({"content": "and vllm reasoning", "reasoning": "think"})),
    (None, chat({"content": "and refusal", "refusal": "no"})),
    (None, chat({"content": "and null refusal", "refusal": None, "reasoning_content": ""})),
    (None, chat({"content": "tool list empty", "tool_calls": []})),
    (None, chat({"content": "and a call", "tool_calls": [{"index": 0, "id": "t", "function": {"name": "f"}}]})),
    (None, chat({"content": "and legacy call", "function_call": {"name": "g", "arguments": "{}"}})),
    (None, chat({"content": ["a", {"type": "text", "text": "parts"}]})),
    (None, chat({"content": "usage too"}, usage={"prompt_tokens": 3, "completion_tokens": 4})),
    (None, chat({"content": "usage null"}, usage=None)),
    (None, chat({"content": "groq"}, x_groq={"usage": {"prompt_tokens": 1}})),
    (None, chat({"content": "new id"}, id="c2")),
    (None, chat({"content": "new model"}, model="m2")),
    (None, chat({"content": "bool index"}) | {"choices": [{"index": True, "delta": {"content": "b"}}]}),
    (None, chat() | {"choices": [{"index": 1, "delta": {"content": "second choice"}}]}),
    (None, chat() | {"choices": [{"delta": {"content": "no index"}}, {"delta": {"content": "pos 1"}}]}),
    (None, chat() | {"choices": [{"index": 0, "delta": {"content": "ends"}, "finish_reason": "stop"}]}),
    ("error", chat({"content": "named error"})),
    (None, chat({"content": "err"}, error={"message": "boom"})),
    (None, chat({"content": "obj err"}, object="error")),
    (None, chat() | {"choices": [{"index": 0, "message": {"content": "whole message"}}]}),
    (None, "not json"),
    (None, "[DONE]"),
    (None, chat({"content": "after done"})),
]

ANTHROPIC_EDGES = [
    ("message_start", {"type": "message_start", "message": {"id": "msg", "model": "m", "content": []}}),
    ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}),
    ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "a"}}),
    ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": ""}}),
    ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": 5}}),
    ("content_block_delta", {"type": "content_block_delta", "delta": {"type": "thinking_delta", "thinking": "t"}}),
    ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "no type: the event name"}}),
    ("content_block_delta", {"type": 7, "delta": {"type": "text_delta", "text": "odd type"}}),
    ("content_block_delta", {"type": "content_block_delta", "delta": "not a dict"}),
    ("ping", {"type": "ping"}),
    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}}),
    ("message_stop", {"type": "message_stop"}),
    ("content_block_delta", {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "after stop"}}),
]


def gem(text: Any = "x", **fields: Any) -> dict[str, Any]:
    chunk = {
        "candidates": [{"content": {"parts": [{"text": text}], "role": "model"}, "index": 0}],
        "usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 1},
        "modelVersion": "m",
        "responseId": "r",
    }
    return chunk | fields


def gem_candidate(**candidate: Any) -> dict[str, Any]:
    return gem() | {"candidates": [{"content": {"parts": [{"text": "c"}]}} | candidate]}


GEMINI_EDGES = [
    (None, gem("first")),
    (None, gem("same usage")),
    (None, gem("more usage", usageMetadata={"promptTokenCount": 5, "candidatesTokenCount": 2})),
    (None, gem("no usage", usageMetadata=None)),
    (None, gem("traffic only", usageMetadata={"trafficType": "ON_DEMAND"})),
    (None, gem("bool count", usageMetadata={"promptTokenCount": True, "candidatesTokenCount": 3})),
    (None, gem("")),
    (None, gem(None)),
    (None, gem("new model", modelVersion="m2")),
    (None, gem("no id", responseId=None)),
    (None, gem("non-str model", modelVersion=3)),
    (None, gem_candidate(index=1)),
    (None, gem_candidate(index=True)),
    (None, gem_candidate(finishReason="FINISH_REASON_UNSPECIFIED")),
    (None, gem() | {"candidates": [{"content": {"parts": [{"text": "think", "thought": True}]}}]}),
    (None, gem() | {"candidates": [{"content": {"parts": [{"text": "a"}, {"text": "b"}]}}]}),
    (None, gem() | {"candidates": [{"content": {"parts": [{"functionCall": {"name": "f", "args": {}}}]}}]}),
    (None, gem() | {"candidates": [{"content": {"parts": [{"text": "1"}]}}, {"content": {"parts": [{"text": "2"}]}}]}),
    (None, gem("feedback", promptFeedback={"safetyRatings": []})),
    (None, gem("error", error={"code": 500, "message": "boom"})),
    (None, gem_candidate(finishReason="STOP")),
    (None, gem("after the finish")),
]


def resp(kind: str, **fields: Any) -> tuple[str, dict[str, Any]]:
    return kind, {"type": kind, **fields}


def text_delta(seq: int | None, delta: Any = "x", **fields: Any) -> tuple[str, dict[str, Any]]:
    extra: dict[str, Any] = {"item_id": "msg_1", "content_index": 0, "delta": delta}
    if seq is not None:
        extra["sequence_number"] = seq
    return resp("response.output_text.delta", **(extra | fields))


RESPONSE = {"id": "resp_1", "object": "response", "model": "m", "status": "in_progress", "output": []}
RESPONSES_EDGES = [
    text_delta(3, "a first delta: a resumed stream"),
    resp("response.created", sequence_number=4, response=RESPONSE),
    resp("response.output_item.added", sequence_number=5, output_index=0, item={"id": "msg_1", "type": "message"}),
    text_delta(6, "plain"),
    text_delta(None, "no sequence number"),
    text_delta(8, ""),
    text_delta(9, 5),
    text_delta(10, "with a response", response=RESPONSE),
    text_delta(11, "second part", content_index=1),
    resp("response.output_text.delta", sequence_number=12, output_index=0, delta="by output index"),
    ("response.output_text.delta", {"sequence_number": 13, "item_id": "msg_1", "delta": "no type"}),
    resp("response.refusal.delta", sequence_number=14, item_id="msg_1", delta="refused"),
    resp("response.output_text.done", sequence_number=15, item_id="msg_1", content_index=0, text="different"),
    resp("response.completed", sequence_number=16, response=RESPONSE | {"status": "completed"}),
    text_delta(17, "after completed"),
    (None, "[DONE]"),
]

LMSP_ID = "resp_L"


def lmsp(n: int | str | None, name: str, **data: Any) -> bytes:
    head = "" if n is None else f"id: {n}\n"
    return f"{head}event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def lmsp_delta(n: int | str | None, text: Any, **data: Any) -> bytes:
    return lmsp(n, "response.output_text.delta", **({"response_id": LMSP_ID, "item_id": "m1", "delta": text} | data))


LMSP_STREAMS = [
    # a stream whose first event is a delta: it names the response (on_json's ResponseMeta)
    lmsp_delta(3, "resumed")
    + lmsp_delta(4, " on")
    + lmsp_delta(4, " repeated id")
    + lmsp_delta(None, " no id")
    + lmsp_delta("x", " bad id")
    + lmsp_delta(9, " gap")
    + lmsp_delta(10, "", item_id="m2")
    + lmsp(11, "message", type="response.output_text.delta", response_id=LMSP_ID, item_id="m1", delta=" typed")
    + lmsp(12, "response.completed", response_id=LMSP_ID, status="completed"),
    lmsp(1, "response.created", response_id=LMSP_ID, status="in_progress")
    + lmsp(2, "response.output_item.added", response_id=LMSP_ID, output_index=0, item={"id": "m1", "type": "message"})
    + lmsp_delta(3, "plain")
    + lmsp_delta(4, " text")
    + lmsp(5, "response.completed", response_id=LMSP_ID, status="completed")
    + lmsp_delta(6, " after the end"),
]


def llm(seq: Any, kind: str, **fields: Any) -> tuple[str, dict[str, Any]]:
    return kind, {"v": "1.0", "seq": seq, "type": kind, **fields}


LLM_STREAM_EDGES = [
    llm(0, "stream.start", model="m"),
    llm(1, "content.delta", index=0, role="assistant", delta={"text": "plain"}),
    llm(2, "content.delta", delta={"text": " no index"}),
    llm(3, "content.delta", index=1, delta={"text": "block 1"}),
    llm(4, "content.delta", index=0, delta={"text": ""}),
    llm(5, "content.delta", index=0, delta={"text": 3}),
    llm(6, "content.delta", index=0),
    llm(8, "content.delta", index=0, delta={"text": " after a gap"}),
    ("content.delta", {"seq": 9, "type": "content.delta", "index": 0, "delta": {"text": " no v"}}),
    ("other", {"v": "1.0", "seq": 10, "type": "content.delta", "index": 0, "delta": {"text": " wrong name"}}),
    llm(11, "content.delta", index=False, delta={"text": " bool index"}),
    llm(12, "content.stop", index=0, stop_reason="end_turn"),
    llm(13, "stream.end"),
    llm(14, "content.delta", index=0, delta={"text": " after the end"}),
]

EDGES = {
    "openai-chat": sse(*CHAT_EDGES),
    "anthropic": sse(*ANTHROPIC_EDGES),
    "gemini": sse(*GEMINI_EDGES, crlf=True),
    "openai-responses": sse(*RESPONSES_EDGES),
    "llm-stream": sse(*LLM_STREAM_EDGES),
}


@pytest.mark.parametrize("api", sorted(EDGES))
def test_edges(monkeypatch: pytest.MonkeyPatch, api: str) -> None:
    body = EDGES[api]
    assert_same(monkeypatch, api, body)
    # and each prefix of it, event by event (a stream cut after any event)
    for end in range(body.find(b"\n\n"), len(body), 1):
        if body[end - 1 : end + 1] == b"\n\n" or body[end - 3 : end + 1] == b"\r\n\r\n":
            prefix = body[: end + 1]
            fast = audit(api, prefix, [])
            with careful_way(monkeypatch):
                assert fast == audit(api, prefix, [])


@pytest.mark.parametrize("index", range(len(LMSP_STREAMS)))
def test_lmsp_edges(monkeypatch: pytest.MonkeyPatch, index: int) -> None:
    assert_same(monkeypatch, "lmsp", LMSP_STREAMS[index])


# -- the fast path is taken where it should be ---------------------------------------------------

PLAIN_DELTAS = {
    "openai-chat": [("", chat({"role": "assistant", "content": ""})), ("", chat({"content": "hi"}))],
    "anthropic": [
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
        )
    ],
    "gemini": [("", gem("first")), ("", gem("hi"))],
    "openai-responses": [("response.created", RESPONSES_EDGES[1][1]), text_delta(7, "hi")],
    "lmsp": [
        ("response.created", {"response_id": LMSP_ID, "status": "in_progress"}),
        ("response.output_text.delta", {"response_id": LMSP_ID, "item_id": "m1", "delta": "hi"}),
    ],
    "llm-stream": [LLM_STREAM_EDGES[0], llm(1, "content.delta", index=0, role="assistant", delta={"text": "hi"})],
}


@pytest.mark.parametrize("api", sorted(PLAIN_DELTAS))
def test_plain_delta_is_text_alone(api: str) -> None:
    """A plain text delta after the stream's first event comes back as its text (Gemini:
    one TextDelta, with the usage when its counts changed)."""
    dialect, request, view, _ = APIS[api]
    normalizer = dialect.normalizer(dialect.summarize(request, view))
    frames = [
        SSEEvent(name or "message", json.dumps(data), str(n + 1)) for n, (name, data) in enumerate(PLAIN_DELTAS[api])
    ]
    for frame in frames[:-1]:
        normalizer.read(frame)
    got = normalizer.read(frames[-1])
    if api == "gemini":
        assert [type(e).__name__ for e in got] == ["TextDelta"]
    else:
        assert got == "hi"
    assert normalizer.on_event(frames[-1]) != []  # (on_event still gives the events)


def test_a_failure_mid_run_keeps_what_the_reader_found_before_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader reads a whole run before its events are dispatched: when the dialect
    then fails on one of them, the reader's findings from earlier in the run still reach
    the record, as they do when the chunks are read one by one."""
    dialect, request, view, _ = APIS["openai-chat"]
    cls = type(dialect.normalizer(dialect.summarize(request, view)))
    real = cls.read

    def read(self, event):
        if "boom" in getattr(event, "data", ""):
            raise RuntimeError("boom")
        return real(self, event)

    monkeypatch.setattr(cls, "read", read)
    first = sse((None, chat({"content": "a"}))).replace(b'"a"', b'"a\xff"')
    body = first + sse((None, chat({"content": "boom"})), (None, chat({"content": "c"})), (None, "[DONE]"))
    rows = []
    for run_bytes in (0, 32 * 1024):
        monkeypatch.setattr(auditor_module, "READ_RUN", run_bytes)
        rows.append(audit("openai-chat", body, [len(first)]))
    codes = [[f["code"] for f in row["findings"]] for row in rows]
    assert codes[0] == codes[1] == ["sse_invalid_utf8", "audit_internal_error"]
