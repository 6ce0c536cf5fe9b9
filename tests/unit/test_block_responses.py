"""What a content filter's block sends, per dialect, read back by our pipeline and by the SDKs.

For every dialect:

- a request blocked before it goes upstream (``Dialect.blocked_response``), streaming and
  not: our own pipeline (the auditor the proxy runs) reads the expected record, and the
  official SDK, served the exact bytes by a small local HTTP server, reports its normal
  filtered or error outcome (exception class, finish reason, failed response, ...);
- a stream cut by a filter (``Normalizer.termination``) before any text, in the middle of
  the text and in the middle of a tool call: the partial stream (the mock upstream's
  exact bytes, cut) plus the termination is a well-formed stream for our normalizer (no
  findings but what the cut implies) and the SDK reports the filter outcome with the
  text it received so far.

llm-stream and LMSP have no official SDK: their streams are checked event by event.
The Gemini JSON-array form is not spoken by google-genai (it always asks for
``alt=sse``): its elements are validated against the SDK's response model instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anthropic
import openai
import orjson
import pytest
from anthropic.types import RawMessageStreamEvent
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types
from openai.types.chat import ChatCompletionChunk
from openai.types.responses import ResponseCreatedEvent, ResponseIncompleteEvent
from pydantic import TypeAdapter

from addon.auditor import StreamAuditor, summary_into_record
from addon.dialects import (
    Dialect,
    Normalizer,
    RequestView,
    gemini,
    llm_stream,
    lmsp,
    openai_chat,
    openai_completions,
    openai_responses,
)
from addon.dialects import anthropic as anthropic_dialect
from addon.dialects.blocking import BlockedResponse
from addon.dialects.registry import REGISTRY
from addon.framing.sse import SSEEvent, SSEParser
from addon.record import OUTCOME_COMPLETE, ExchangeRecord
from mockllm.scenario import Scenario
from mockllm.streams import (
    anthropic_events,
    anthropic_message,
    gemini_json_stream,
    gemini_response,
    gemini_sse_events,
    llm_stream_events,
    lmsp_events,
    lmsp_response,
    openai_chat_chunks,
    openai_chat_completion,
    openai_completion,
    openai_completions_chunks,
    openai_response,
    openai_responses_events,
)

RULE = "no-secrets"
REASON = "a credential in the text"
MESSAGE = f"Blocked by content filter rule '{RULE}': {REASON}"
TEXT = "tök0 tök1 tök2 tök3 tök4"  # the mock's answer
MESSAGES: list[Any] = [{"role": "user", "content": "What is the weather in Vienna?"}]
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}}
CHAT_TOOLS: list[Any] = [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMETERS}}]
RESPONSES_TOOLS: list[Any] = [{"type": "function", "name": "get_weather", "parameters": PARAMETERS, "strict": False}]
ANTHROPIC_TOOLS: list[Any] = [{"name": "get_weather", "input_schema": PARAMETERS}]
GEMINI_MODEL = "gemini-2.5-flash"
GEMINI_STREAM = f"/v1beta/models/{GEMINI_MODEL}:streamGenerateContent"
GEMINI_GENERATE = f"/v1beta/models/{GEMINI_MODEL}:generateContent"


# -- a local server that answers with exactly the bytes under test ---------------------------------


class Upstream:
    """A plain HTTP/1.1 server answering every POST with the one reply set last."""

    def __init__(self) -> None:
        self.reply = BlockedResponse(200, [], b"")
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                reply = upstream.reply
                self.send_response(reply.status)
                for name, value in reply.headers:
                    self.send_header(name, value)
                self.send_header("content-length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def serve(self, reply: BlockedResponse) -> str:
        self.reply = reply
        return self.url

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    yield server
    server.close()


def stream_reply(body: bytes) -> BlockedResponse:
    return BlockedResponse(200, [("content-type", "text/event-stream")], body)


def openai_client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="sk-test", max_retries=0)


def anthropic_client(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="sk-ant-test", max_retries=0)


def genai_client(url: str) -> genai.Client:
    return genai.Client(api_key="test-key", http_options=genai_types.HttpOptions(base_url=url))


# -- the dialects under test ----------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One dialect: its request, how the mock streams the answer, and where to cut it."""

    dialect: Dialect
    view: RequestView
    request: dict[str, Any]
    stream: Callable[[dict[str, Any], Scenario], list[bytes]]
    cuts: dict[str, tuple[bytes, int, bool]]  # name -> (marker, nth event with it, cut after it)

    @property
    def name(self) -> str:
        return self.dialect.name


def view(path: str, query: str = "", content_type: str = "application/json") -> RequestView:
    return RequestView("POST", path, query, {"content-type": content_type})


TEXT_CUTS = {"before_text": ("tök0".encode(), 1, False), "mid_text": ("tök2".encode(), 1, False)}
CASES = {
    case.name: case
    for case in (
        Case(
            llm_stream.DIALECT,
            view("/v1/llm/stream", content_type="application/llm-request+json"),
            {
                "version": "1.0",
                "stream": True,
                "model": "m",
                "messages": MESSAGES,
                "metadata": {"request_id": "r-1"},
                "tools": [{"name": "get_weather", "description": "Weather.", "parameters": PARAMETERS}],
            },
            llm_stream_events,
            {**TEXT_CUTS, "mid_tool": (b"content.stop", 1, False)},  # after tool.call: its block is open
        ),
        Case(
            openai_chat.DIALECT,
            view("/v1/chat/completions"),
            {"model": "gpt-4o", "messages": MESSAGES, "stream": True, "tools": CHAT_TOOLS},
            openai_chat_chunks,
            {**TEXT_CUTS, "mid_tool": (b'"arguments"', 3, False)},  # after the first fragment
        ),
        Case(
            openai_completions.DIALECT,
            view("/v1/completions"),
            {"model": "gpt-3.5-turbo-instruct", "prompt": "Say hi", "stream": True},
            openai_completions_chunks,
            dict(TEXT_CUTS),  # no tools in this API
        ),
        Case(
            openai_responses.DIALECT,
            view("/v1/responses"),
            {"model": "gpt-5", "input": "hi", "stream": True, "tools": RESPONSES_TOOLS},
            openai_responses_events,
            {**TEXT_CUTS, "mid_tool": (b"function_call_arguments.delta", 2, False)},
        ),
        Case(
            anthropic_dialect.DIALECT,
            view("/v1/messages"),
            {
                "model": "claude-sonnet-4",
                "max_tokens": 1024,
                "messages": MESSAGES,
                "stream": True,
                "tools": ANTHROPIC_TOOLS,
            },
            anthropic_events,
            {**TEXT_CUTS, "mid_tool": (b"input_json_delta", 3, False)},  # the first fragment is ""
        ),
        Case(
            gemini.DIALECT,
            view(GEMINI_STREAM, "alt=sse"),
            {
                "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
                "tools": [{"functionDeclarations": [{"name": "get_weather"}]}],
            },
            gemini_sse_events,
            dict(TEXT_CUTS),  # Gemini sends whole function calls: see the Vertex test below
        ),
        Case(
            lmsp.DIALECT,
            view("/lmsp/v1/responses"),
            {"model": "m", "input": "hi", "stream": True, "tools": [{"type": "function", "name": "get_weather"}]},
            lmsp_events,
            {**TEXT_CUTS, "mid_tool": (b'"type":"function_call"', 1, True)},  # announced, not done
        ),
    )
}
ALL_CUTS = [(name, cut) for name, case in CASES.items() for cut in case.cuts]
PARTIAL_TEXT = {"before_text": "", "mid_text": "tök0 tök1", "mid_tool": TEXT}


def cut(items: list[bytes], marker: bytes, nth: int, after: bool) -> list[bytes]:
    """``items`` up to the ``nth`` one containing ``marker`` (excluded, or included with ``after``)."""
    hits = [i for i, item in enumerate(items) if marker in item]
    return items[: hits[nth - 1] + after]


# -- reading bytes with our own pipeline ----------------------------------------------------------


class Reader:
    """The proxy's pipeline for one response: record, normalizer, auditor."""

    def __init__(
        self,
        case: Case,
        *,
        event_stream: bool = True,
        status: int = 200,
        request_view: RequestView | None = None,
        keeps_delivered: bool = False,
    ) -> None:
        request_view = request_view or case.view
        self.record = ExchangeRecord(dialect=case.name, streamed=event_stream, http_status=status)
        summary = case.dialect.summarize(case.request, request_view)
        summary_into_record(self.record, summary)
        self.normalizer: Normalizer = case.dialect.normalizer(summary)
        self.normalizer.keeps_delivered = keeps_delivered  # as the output gate's normalizer
        self.auditor = StreamAuditor(self.record, self.normalizer, None, 8 * 1024 * 1024, event_stream=event_stream)

    def feed(self, body: bytes) -> Reader:
        self.auditor.feed(body)
        self.auditor.catch_up()  # (read now: the tests look at the normalizer mid-stream)
        return self

    def row(self) -> dict[str, Any]:
        self.auditor.end()
        self.record.finish(OUTCOME_COMPLETE)
        return self.record.to_row()


def read(case: Case, body: bytes, **kwargs: Any) -> dict[str, Any]:
    return Reader(case, **kwargs).feed(body).row()


def codes(row: dict[str, Any]) -> list[str]:
    return [f["code"] for f in row["findings"]]


def sse_events(body: bytes) -> list[SSEEvent]:
    parser = SSEParser()
    return parser.feed(body) + parser.end()


def blocked(case: Case, streaming: bool, request_view: RequestView | None = None) -> BlockedResponse:
    request_view = request_view or case.view
    summary = case.dialect.summarize(case.request, request_view)
    return case.dialect.blocked_response(summary, request_view, RULE, REASON, streaming)


# Dialects whose streams are not SSE: their blocked answers and terminations are tested
# with their own framing (and their clients) in the modules named.
TESTED_ELSEWHERE = {
    "ollama": "tests/unit/test_ollama.py",
    "cursor": "tests/unit/test_cursor.py",
    "windsurf": "tests/unit/test_windsurf.py",
    "grpc": "tests/unit/test_connect_rpc.py",
    "signalr": "tests/unit/test_signalr_dialect.py",
    "copilot-chathub": "tests/unit/test_copilot_chathub.py",
    "bedrock": "tests/unit/test_bedrock.py, tests/e2e/test_bedrock_proxy.py",
    "openai-realtime": "tests/unit/test_openai_realtime.py",  # WebSocket: endings, refusals, closes
    "gemini-live": "tests/unit/test_gemini_live.py",
    "copilot": "tests/unit/test_copilot_ws.py",
}


def test_every_registered_dialect_is_tested() -> None:
    assert {dialect.name for dialect in REGISTRY} - set(TESTED_ELSEWHERE) == set(CASES)


# -- a request blocked before it goes upstream: our record ------------------------------------------

# dialect -> (status, error_code, finish_reasons) of the blocked streaming answer, read by a
# proxy behind this one: an error where the API refuses a request with one, else the API's
# own filtered outcome (Responses: incomplete, content_filter; Anthropic: a refusal)
BLOCKED_STREAM_RECORD = {
    "llm-stream": ("failed", "content_filtered", []),
    "openai-chat": ("failed", "content_filter", []),
    "openai-completions": ("failed", "content_filter", []),
    "openai-responses": ("completed", None, ["content_filter"]),
    "anthropic-messages": ("completed", None, ["refusal"]),
    "gemini": ("failed", "SAFETY", ["SAFETY"]),
    "lmsp": ("failed", "content_filtered", ["failed"]),
}
BLOCKED_BODY_CODE = {
    "llm-stream": "content_filtered",
    "openai-chat": "content_filter",
    "openai-completions": "content_filter",
    "openai-responses": "content_filtered",
    "anthropic-messages": "invalid_request_error",
    "gemini": "INVALID_ARGUMENT",
    "lmsp": "content_filtered",
}


@pytest.mark.parametrize("name", CASES)
def test_blocked_streaming_request_is_an_event_stream_our_pipeline_reads_as_the_block(name: str) -> None:
    case = CASES[name]
    answer = blocked(case, streaming=True)
    assert (answer.status, dict(answer.headers)["content-type"]) == (200, "text/event-stream")
    row = read(case, answer.body)
    status, code, finish_reasons = BLOCKED_STREAM_RECORD[name]
    assert (row["status"], row["error_code"], row["error_message"]) == (status, code, code and MESSAGE)
    assert (row["finish_reasons"], codes(row), row["output_text"]) == (finish_reasons, [], "")
    if name == "anthropic-messages":  # its message_start must carry usage: nothing was generated
        assert (row["input_tokens"], row["output_tokens"]) == (0, 0)
    else:
        assert row["input_tokens"] is None and row["usage_source"] == "none"  # nothing made up


@pytest.mark.parametrize("name", CASES)
def test_blocked_request_that_does_not_stream_is_the_dialects_error_json_with_400(name: str) -> None:
    case = CASES[name]
    answer = blocked(case, streaming=False)
    content_type = "application/problem+json" if name == "lmsp" else "application/json"
    assert (answer.status, dict(answer.headers)["content-type"]) == (400, content_type)
    row = read(case, answer.body, event_stream=False, status=400)
    assert (row["status"], row["error_code"], row["error_message"], codes(row)) == (
        "failed",
        BLOCKED_BODY_CODE[name],
        MESSAGE,
        [],
    )


def test_blocked_llm_stream_is_start_error_end_with_continuous_seq_and_the_request_id() -> None:
    events = sse_events(blocked(CASES["llm-stream"], streaming=True).body)
    data = [orjson.loads(e.data) for e in events]
    assert [(e.event, d["type"], d["seq"]) for e, d in zip(events, data, strict=True)] == [
        ("stream.start", "stream.start", 0),
        ("error", "error", 1),
        ("stream.end", "stream.end", 2),
    ]
    assert (data[0]["model"], data[0]["request_id"], data[2]["request_id"]) == ("m", "r-1", "r-1")
    assert (data[1]["code"], data[1]["message"]) == ("content_filtered", MESSAGE)


def test_blocked_lmsp_stream_numbers_its_events_from_1_and_fails_with_a_problem_object() -> None:
    events = sse_events(blocked(CASES["lmsp"], streaming=True).body)
    data = [orjson.loads(e.data) for e in events]
    assert [(e.id, e.event) for e in events] == [("1", "response.created"), ("2", "response.failed")]
    assert data[0]["response_id"] == data[1]["response_id"] and data[0]["response_id"].startswith("resp_")
    assert data[1]["error"] == {
        "type": "about:blank",
        "title": "Bad Request",
        "status": 400,
        "detail": MESSAGE,
        "code": "content_filtered",
    }


def test_blocked_answers_get_fresh_ids() -> None:
    first, second = (sse_events(blocked(CASES["openai-responses"], streaming=True).body) for _ in range(2))
    assert orjson.loads(first[0].data)["response"]["id"] != orjson.loads(second[0].data)["response"]["id"]


def test_blocked_gemini_stream_without_alt_sse_is_a_json_array_with_the_prompt_feedback() -> None:
    case = CASES["gemini"]
    array_view = view(GEMINI_STREAM)
    answer = blocked(case, streaming=True, request_view=array_view)
    assert (answer.status, dict(answer.headers)["content-type"]) == (200, "application/json; charset=UTF-8")
    elements = orjson.loads(answer.body)
    assert elements == [{"promptFeedback": {"blockReason": "SAFETY", "blockReasonMessage": MESSAGE}}]
    genai_types.GenerateContentResponse.model_validate(elements[0])
    row = read(case, answer.body, event_stream=False, request_view=array_view)
    assert (row["status"], row["error_code"], row["finish_reasons"], codes(row)) == ("failed", "SAFETY", ["SAFETY"], [])


# -- a request blocked before it goes upstream: the SDKs ---------------------------------------------


def test_what_the_proxy_makes_validates_against_the_sdks_models() -> None:
    """The SDKs parse leniently; their pydantic models are the strict reading of each API."""
    created, incomplete = sse_events(blocked(CASES["openai-responses"], streaming=True).body)
    ResponseCreatedEvent.model_validate_json(created.data)
    ResponseIncompleteEvent.model_validate_json(incomplete.data)  # content_filter is one of OpenAI's reasons
    for event in sse_events(blocked(CASES["anthropic-messages"], streaming=True).body):
        TypeAdapter(RawMessageStreamEvent).validate_json(event.data)  # the refusal, strictly typed
    for event in sse_events(blocked(CASES["gemini"], streaming=True).body):
        genai_types.GenerateContentResponse.model_validate_json(event.data)
    for name in ("openai-chat", "gemini"):
        _, tail, _ = cut_stream(CASES[name], "mid_text")
        data = [e.data for e in sse_events(tail) if e.data != "[DONE]"]
        model = ChatCompletionChunk if name == "openai-chat" else genai_types.GenerateContentResponse
        assert len(data) == 1 and model.model_validate_json(data[0])


def test_openai_chat_sdk_raises_the_block_as_api_error_in_a_stream_and_bad_request_without(upstream: Upstream) -> None:
    case = CASES["openai-chat"]
    client = openai_client(upstream.serve(blocked(case, streaming=True)))
    with pytest.raises(openai.APIError) as raised:
        for _ in client.chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=True):
            pass
    assert (raised.value.code, raised.value.type, raised.value.message) == (
        "content_filter",
        "invalid_request_error",
        MESSAGE,
    )
    with (
        pytest.raises(openai.APIError) as raised,
        client.chat.completions.stream(model="gpt-4o", messages=MESSAGES) as stream,
    ):
        stream.until_done()
    assert raised.value.code == "content_filter"

    client = openai_client(upstream.serve(blocked(case, streaming=False)))
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert (refused.value.status_code, refused.value.code, refused.value.message) == (
        400,
        "content_filter",
        f"Error code: 400 - {MESSAGE}",
    )


def test_openai_responses_sdk_sees_the_created_response_incomplete_by_content_filter(upstream: Upstream) -> None:
    case = CASES["openai-responses"]
    client = openai_client(upstream.serve(blocked(case, streaming=True)))
    events = list(client.responses.create(model="gpt-5", input="hi", stream=True))
    assert [e.type for e in events] == ["response.created", "response.incomplete"]
    assert [e.sequence_number for e in events] == [0, 1]
    final = events[1].response
    assert final.id == events[0].response.id and final.status == "incomplete" and final.output == []
    assert final.incomplete_details is not None and final.incomplete_details.reason == "content_filter"

    with client.responses.stream(model="gpt-5", input="hi") as stream:
        helper_events = list(stream)
        with pytest.raises(RuntimeError, match=r"response\.completed"):  # the SDK's answer to any incomplete response
            stream.get_final_response()
    assert helper_events[-1].type == "response.incomplete"

    client = openai_client(upstream.serve(blocked(case, streaming=False)))
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="gpt-5", input="hi")
    assert (refused.value.code, refused.value.type) == ("content_filtered", "invalid_request_error")


def refusal_explanation(message: anthropic.types.Message) -> str | None:
    details = message.stop_details
    return details.explanation if details is not None else None


def test_anthropic_sdk_sees_a_refusal_in_a_stream_and_the_400_without(upstream: Upstream) -> None:
    case = CASES["anthropic-messages"]
    body = {"type": "error", "error": {"type": "invalid_request_error", "message": MESSAGE}}
    client = anthropic_client(upstream.serve(blocked(case, streaming=True)))
    events = list(client.messages.create(model="claude", max_tokens=10, messages=MESSAGES, stream=True))
    assert [e.type for e in events] == ["message_start", "message_delta", "message_stop"]
    with client.messages.stream(model="claude", max_tokens=10, messages=MESSAGES) as stream:
        message = stream.get_final_message()
    assert (message.stop_reason, message.content, message.model) == ("refusal", [], case.request["model"])
    assert refusal_explanation(message) == MESSAGE

    client = anthropic_client(upstream.serve(blocked(case, streaming=False)))
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model="claude", max_tokens=10, messages=MESSAGES)
    assert (refused.value.status_code, refused.value.body) == (400, body)


def test_genai_sdk_sees_a_blocked_prompt_in_a_stream_and_a_client_error_without(upstream: Upstream) -> None:
    case = CASES["gemini"]
    with genai_client(upstream.serve(blocked(case, streaming=True))) as client:
        chunks = list(client.models.generate_content_stream(model=GEMINI_MODEL, contents="hi"))
    assert len(chunks) == 1 and chunks[0].candidates is None and chunks[0].text is None
    feedback = chunks[0].prompt_feedback
    assert feedback is not None
    assert (feedback.block_reason, feedback.block_reason_message) == (genai_types.BlockedReason.SAFETY, MESSAGE)

    no_stream = blocked(case, streaming=False, request_view=view(GEMINI_GENERATE))
    with genai_client(upstream.serve(no_stream)) as client, pytest.raises(genai_errors.ClientError) as refused:
        client.models.generate_content(model=GEMINI_MODEL, contents="hi")
    assert (refused.value.code, refused.value.status, refused.value.message) == (400, "INVALID_ARGUMENT", MESSAGE)


# -- a stream cut by a filter ------------------------------------------------------------------------


SCENARIO = Scenario.parse("tool=get_weather")


def cut_stream(case: Case, cut_name: str, scenario: Scenario = SCENARIO) -> tuple[bytes, bytes, dict[str, Any]]:
    """(the bytes forwarded before the cut, the termination, the record of both) for ``case``."""
    items = case.stream(case.request, scenario)
    prefix = b"".join(cut(items, *case.cuts[cut_name]))
    reader = Reader(case, keeps_delivered=True).feed(prefix)
    tail = reader.normalizer.termination(RULE, REASON)
    return prefix, tail, reader.feed(tail).row()  # the proxy's record reads what the client got


# dialect -> (status, error_code, finish reason of the cut choice, findings per cut)
CUT_RECORD: dict[str, tuple[str, str | None, str, dict[str, list[str]]]] = {
    "llm-stream": ("failed", "content_filtered", "content_filter", {}),
    "openai-chat": ("completed", None, "content_filter", {"mid_tool": ["tool_call_truncated"]}),
    "openai-completions": ("completed", None, "content_filter", {}),
    "openai-responses": ("completed", None, "content_filter", {"mid_tool": ["tool_call_truncated"]}),
    "anthropic-messages": ("completed", None, "refusal", {"mid_tool": ["tool_call_truncated"]}),
    "gemini": ("completed", None, "SAFETY", {}),
    "lmsp": ("failed", "content_filtered", "failed", {"mid_tool": ["tool_call_truncated"]}),
}


@pytest.mark.parametrize("name, cut_name", ALL_CUTS)
def test_termination_makes_a_cut_stream_well_formed_for_our_normalizer(name: str, cut_name: str) -> None:
    _, _, row = cut_stream(CASES[name], cut_name)
    status, code, finish, findings = CUT_RECORD[name]
    assert codes(row) == list(findings.get(cut_name, []))
    assert (row["status"], row["error_code"], row["output_text"]) == (status, code, PARTIAL_TEXT[cut_name])
    if code is not None:
        assert row["error_message"] == MESSAGE
    if finish and not (name == "llm-stream" and cut_name == "before_text"):  # no block was open
        assert row["finish_reasons"] == [finish]
    if name in {"openai-chat", "openai-responses", "anthropic-messages"} and cut_name == "mid_tool":
        assert row["tool_calls"][0]["arguments"] == '{"'  # the fragment received, kept as it came


def test_llm_stream_termination_closes_the_open_block_and_continues_seq() -> None:
    prefix, tail, _ = cut_stream(CASES["llm-stream"], "mid_text")
    last_seq = orjson.loads(sse_events(prefix)[-1].data)["seq"]
    data = [orjson.loads(e.data) for e in sse_events(tail)]
    assert [(d["type"], d["seq"]) for d in data] == [
        ("content.stop", last_seq + 1),
        ("error", last_seq + 2),
        ("stream.end", last_seq + 3),
    ]
    assert (data[0]["index"], data[0]["stop_reason"]) == (0, "content_filter")
    assert (data[1]["code"], data[1]["message"], data[2]["request_id"]) == ("content_filtered", MESSAGE, "r-1")


def test_llm_stream_termination_after_an_upstream_error_sends_no_second_error() -> None:
    case = CASES["llm-stream"]
    items = case.stream(case.request, Scenario.parse("error=overloaded&error_after=2"))
    reader = Reader(case).feed(b"".join(cut(items, b"stream.end", 1, False)))
    tail = reader.normalizer.termination(RULE, REASON)
    assert [e.event for e in sse_events(tail)] == ["content.stop", "stream.end"]  # the draft allows one error
    row = reader.feed(tail).row()
    assert (codes(row), row["error_code"], row["finish_reasons"]) == ([], "overloaded", ["content_filter"])


def test_lmsp_termination_continues_the_ids_and_names_the_response() -> None:
    prefix, tail, _ = cut_stream(CASES["lmsp"], "mid_tool")
    before, after = sse_events(prefix), sse_events(tail)
    assert [e.event for e in after] == ["response.failed"]
    assert int(after[0].id) == int(before[-1].id) + 1
    failed = orjson.loads(after[0].data)
    assert failed["response_id"] == orjson.loads(before[0].data)["response_id"]
    assert (failed["status"], failed["error"]["code"], failed["error"]["detail"]) == (
        "failed",
        "content_filtered",
        MESSAGE,
    )


def test_gemini_termination_is_framed_with_crlf_and_keeps_model_and_response_id() -> None:
    prefix, tail, _ = cut_stream(CASES["gemini"], "mid_text")
    assert tail.startswith(b"data: ") and tail.endswith(b"}\r\n\r\n") and b"\n" not in tail[:-4]
    final = orjson.loads(sse_events(tail)[0].data)
    first = orjson.loads(sse_events(prefix)[0].data)
    assert (final["modelVersion"], final["responseId"]) == (first["modelVersion"], first["responseId"])
    assert final["candidates"] == [{"finishReason": "SAFETY", "finishMessage": MESSAGE, "index": 0}]


@pytest.mark.parametrize("name", CASES)
def test_termination_changes_nothing_in_the_normalizer(name: str) -> None:
    case = CASES[name]
    items = case.stream(case.request, SCENARIO)
    prefix = cut(items, *case.cuts["mid_text"])
    asked = Reader(case).feed(b"".join(prefix))
    first = asked.normalizer.termination(RULE, REASON)
    assert asked.normalizer.termination(RULE, REASON) == first
    not_asked = Reader(case).feed(b"".join(items))
    volatile = {"id", "started_at", "first_chunk_at", "ended_at"}
    assert {k: v for k, v in asked.feed(b"".join(items[len(prefix) :])).row().items() if k not in volatile} == {
        k: v for k, v in not_asked.row().items() if k not in volatile
    }


@pytest.mark.parametrize("name", CASES)
def test_termination_after_the_terminal_event_adds_nothing(name: str) -> None:
    case = CASES[name]
    reader = Reader(case).feed(b"".join(case.stream(case.request, SCENARIO)))
    reader.auditor.end()  # Gemini has no terminal event: its body ending after a finishReason is one
    assert reader.normalizer.termination(RULE, REASON) == b""


# -- a stream cut by a filter: the SDKs --------------------------------------------------------------


def chat_sdk(url: str, cut_name: str) -> None:
    client = openai_client(url)
    text, arguments, last = "", "", None
    for chunk in client.chat.completions.create(model="gpt-4o", messages=MESSAGES, tools=CHAT_TOOLS, stream=True):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                arguments += call.function.arguments or "" if call.function else ""
            last = choice
    assert last is not None and (text, last.finish_reason) == (PARTIAL_TEXT[cut_name], "content_filter")
    assert arguments == ('{"' if cut_name == "mid_tool" else "")
    assert last.model_extra == {  # Azure's shape: which rule filtered the choice
        "content_filter_results": {"custom_blocklists": {"filtered": True, "details": [{"filtered": True, "id": RULE}]}}
    }

    # the stream helper hands out the text, then refuses to parse the filtered completion
    with (
        pytest.raises(openai.ContentFilterFinishReasonError) as filtered,
        client.chat.completions.stream(model="gpt-4o", messages=MESSAGES, tools=CHAT_TOOLS) as stream,
    ):
        deltas = [event.delta for event in stream if event.type == "content.delta"]
        stream.get_final_completion()
    assert "".join(deltas) == PARTIAL_TEXT[cut_name]
    completion = filtered.value.completion
    assert completion is not None and completion.choices[0].finish_reason == "content_filter"
    assert (completion.choices[0].message.content or "") == PARTIAL_TEXT[cut_name]


def completions_sdk(url: str, cut_name: str) -> None:
    client = openai_client(url)
    chunks = list(client.completions.create(model="gpt-3.5-turbo-instruct", prompt="Say hi", stream=True))
    text = "".join(c.text for chunk in chunks for c in chunk.choices)
    assert (text, chunks[-1].choices[0].finish_reason) == (PARTIAL_TEXT[cut_name], "content_filter")


def test_openai_completions_sdk_raises_the_block_as_api_error_in_a_stream_and_bad_request_without(
    upstream: Upstream,
) -> None:
    case = CASES["openai-completions"]
    client = openai_client(upstream.serve(blocked(case, streaming=True)))
    with pytest.raises(openai.APIError) as raised:
        for _ in client.completions.create(model="gpt-3.5-turbo-instruct", prompt="hi", stream=True):
            pass
    assert (raised.value.code, raised.value.message) == ("content_filter", MESSAGE)
    client = openai_client(upstream.serve(blocked(case, streaming=False)))
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="gpt-3.5-turbo-instruct", prompt="hi")
    assert (refused.value.status_code, refused.value.code) == (400, "content_filter")


def responses_sdk(url: str, cut_name: str) -> None:
    client = openai_client(url)
    events = list(client.responses.create(model="gpt-5", input="hi", tools=RESPONSES_TOOLS, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1]
    assert final.type == "response.incomplete" and final.response.id == events[0].response.id
    details = final.response.incomplete_details
    assert details is not None and details.reason == "content_filter"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == PARTIAL_TEXT[cut_name]
    assert final.response.output_text == PARTIAL_TEXT[cut_name]  # the output is carried

    with client.responses.stream(model="gpt-5", input="hi", tools=RESPONSES_TOOLS) as stream:
        last = list(stream)[-1]
        with pytest.raises(RuntimeError, match=r"response\.completed"):  # as for every incomplete response
            stream.get_final_response()
    assert last.type == "response.incomplete"
    output = last.response.output
    messages = [item for item in output if item.type == "message"]
    texts = [part.text for item in messages for part in item.content]
    assert "".join(texts) == PARTIAL_TEXT[cut_name]  # the helper keeps what was streamed
    calls = [item.arguments for item in output if item.type == "function_call"]
    assert calls == (['{"'] if cut_name == "mid_tool" else [])


def anthropic_sdk(url: str, cut_name: str) -> None:
    client = anthropic_client(url)
    received: list[str] = []
    with client.messages.stream(
        model="claude-sonnet-4", max_tokens=1024, messages=MESSAGES, tools=ANTHROPIC_TOOLS
    ) as stream:
        for text in stream.text_stream:
            received.append(text)
        message = stream.get_final_message()
    assert "".join(received) == PARTIAL_TEXT[cut_name]
    assert (message.stop_reason, refusal_explanation(message)) == ("refusal", MESSAGE)
    texts = [block.text for block in message.content if block.type == "text"]
    assert "".join(texts) == PARTIAL_TEXT[cut_name]


def gemini_sdk(url: str, cut_name: str) -> None:
    with genai_client(url) as client:
        chunks = list(client.models.generate_content_stream(model=GEMINI_MODEL, contents="hi"))
    assert "".join(chunk.text or "" for chunk in chunks) == PARTIAL_TEXT[cut_name]
    last = chunks[-1].candidates
    assert last is not None and last[0].finish_reason == genai_types.FinishReason.SAFETY


def llm_stream_client(body: bytes, cut_name: str) -> None:
    """A client of the draft: seq from 0 without gaps, stream.end last, the error before it."""
    data = [orjson.loads(e.data) for e in sse_events(body)]
    assert [d["seq"] for d in data] == list(range(len(data)))
    assert (data[0]["type"], data[-1]["type"], data[-2]["type"], data[-2]["code"]) == (
        "stream.start",
        "stream.end",
        "error",
        "content_filtered",
    )
    text = "".join(d["delta"]["text"] for d in data if d["type"] == "content.delta")
    stops = [d["stop_reason"] for d in data if d["type"] == "content.stop"]
    assert (text, stops) == (PARTIAL_TEXT[cut_name], [] if cut_name == "before_text" else ["content_filter"])


def lmsp_client(body: bytes, cut_name: str) -> None:
    """A client of LMSP 1.0: ids strictly increasing from 1, one response, a final failed event."""
    events = sse_events(body)
    data = [orjson.loads(e.data) for e in events]
    assert [int(e.id) for e in events] == list(range(1, len(events) + 1))
    assert len({d["response_id"] for d in data}) == 1
    assert (events[-1].event, data[-1]["error"]["code"]) == ("response.failed", "content_filtered")
    text = "".join(d["delta"] for e, d in zip(events, data, strict=True) if e.event == "response.output_text.delta")
    assert text == PARTIAL_TEXT[cut_name]


SDK_CHECKS: dict[str, Callable[[str, str], None]] = {
    "openai-chat": chat_sdk,
    "openai-completions": completions_sdk,
    "openai-responses": responses_sdk,
    "anthropic-messages": anthropic_sdk,
    "gemini": gemini_sdk,
}
CLIENT_CHECKS: dict[str, Callable[[bytes, str], None]] = {"llm-stream": llm_stream_client, "lmsp": lmsp_client}


@pytest.mark.parametrize("name, cut_name", ALL_CUTS)
def test_the_sdk_reports_the_filter_outcome_with_the_text_received_so_far(
    upstream: Upstream, name: str, cut_name: str
) -> None:
    prefix, tail, _ = cut_stream(CASES[name], cut_name)
    if name in SDK_CHECKS:
        SDK_CHECKS[name](upstream.serve(stream_reply(prefix + tail)), cut_name)
    else:
        CLIENT_CHECKS[name](prefix + tail, cut_name)


def test_openai_chat_termination_finishes_every_unfinished_choice(upstream: Upstream) -> None:
    case = CASES["openai-chat"]
    prefix, tail, row = cut_stream(case, "mid_text", Scenario.parse("n=2"))
    assert codes(row) == [] and row["finish_reasons"] == ["content_filter", "content_filter"]
    client = openai_client(upstream.serve(stream_reply(prefix + tail)))
    texts, finishes = {0: "", 1: ""}, {}
    for chunk in client.chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=True, n=2):
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            finishes[choice.index] = choice.finish_reason or finishes.get(choice.index)
    assert finishes == {0: "content_filter", 1: "content_filter"}
    assert texts[0] == "tök0 tök1" and texts[1] == "tök0 tök1"


def test_gemini_termination_of_a_streamed_vertex_function_call(upstream: Upstream) -> None:
    """Vertex streams function-call arguments (willContinue): a cut leaves the call truncated."""
    case = CASES["gemini"]
    chunks = [
        {"candidates": [{"content": {"role": "model", "parts": [{"text": "Let me look."}]}, "index": 0}]},
        {
            "candidates": [
                {
                    "content": {
                        "role": "model",
                        "parts": [{"functionCall": {"name": "get_weather", "id": "fc-1", "willContinue": True}}],
                    },
                    "index": 0,
                }
            ]
        },
        {
            "candidates": [
                {
                    "content": {
                        "role": "model",
                        "parts": [
                            {
                                "functionCall": {
                                    "partialArgs": [{"jsonPath": "$.city", "stringValue": "Vi", "willContinue": True}],
                                    "willContinue": True,
                                }
                            }
                        ],
                    },
                    "index": 0,
                }
            ]
        },
    ]
    prefix = b"".join(b"data: " + orjson.dumps(c) + b"\r\n\r\n" for c in chunks)
    reader = Reader(case, keeps_delivered=True).feed(prefix)
    tail = reader.normalizer.termination(RULE, REASON)
    row = reader.feed(tail).row()
    assert (row["status"], row["finish_reasons"], codes(row)) == ("completed", ["SAFETY"], ["tool_call_truncated"])
    assert row["tool_calls"] == [{"id": "fc-1", "name": "get_weather", "arguments": '{"city":"Vi"}'}]
    with genai_client(upstream.serve(stream_reply(prefix + tail))) as client:
        received = list(client.models.generate_content_stream(model=GEMINI_MODEL, contents="hi"))
    assert received[0].text == "Let me look."
    assert received[-1].candidates is not None
    assert received[-1].candidates[0].finish_reason == genai_types.FinishReason.SAFETY


@pytest.mark.parametrize("cut_name", ["before_text", "mid_text"])
def test_gemini_termination_continues_or_makes_the_json_array(cut_name: str) -> None:
    """Without alt=sse the stream is one JSON array; the normalizer reads it whole."""
    case = CASES["gemini"]
    array_view = view(GEMINI_STREAM)
    items = gemini_json_stream(case.request, SCENARIO)
    prefix = b"".join(cut(items, *case.cuts[cut_name]))
    reader = Reader(case, event_stream=False, request_view=array_view)
    reader.normalizer.on_body(prefix, 200)  # the elements the client received, read
    tail = reader.normalizer.termination(RULE, REASON)
    assert tail.startswith(b"[" if cut_name == "before_text" else b",") and tail.endswith(b"]")
    elements = orjson.loads(prefix + tail)
    for element in elements:
        genai_types.GenerateContentResponse.model_validate(element)
    assert elements[-1]["candidates"] == [{"finishReason": "SAFETY", "finishMessage": MESSAGE, "index": 0}]
    row = read(case, prefix + tail, event_stream=False, request_view=array_view)
    assert (row["status"], row["output_text"], row["finish_reasons"], codes(row)) == (
        "completed",
        PARTIAL_TEXT[cut_name],
        ["SAFETY"],
        [],
    )


# -- a held, non-streamed answer replaced ------------------------------------------------------------

# dialect -> the mock's whole answer, and (finish_reasons, status) our pipeline reads in the replacement
WHOLE = {
    "openai-chat": (openai_chat_completion, ["content_filter"], "completed"),
    "openai-completions": (openai_completion, ["content_filter"], "completed"),
    "openai-responses": (openai_response, ["content_filter"], "completed"),
    "anthropic-messages": (anthropic_message, ["refusal"], "completed"),
    "gemini": (gemini_response, ["SAFETY"], "completed"),
}


def filtered(name: str) -> tuple[BlockedResponse | None, dict[str, Any]]:
    """(the replacement of the mock's whole answer, the answer), as the proxy makes it."""
    case = CASES[name]
    request = case.request | {"stream": False}
    answer = (
        WHOLE[name][0](request, Scenario.parse(""))
        if name in WHOLE
        else (lmsp_response(request, Scenario.parse("")) if name == "lmsp" else {"version": "1.0"})
    )
    answer["note"] = TEXT  # a field no reader knows, carrying the text: it must not reach the client
    reader = Reader(case, event_stream=False).feed(orjson.dumps(answer))
    reader.auditor.end()
    return reader.normalizer.filtered_body(RULE, REASON), answer


@pytest.mark.parametrize("name", CASES)
def test_a_held_answer_is_replaced_by_the_apis_filtered_answer_with_its_id_and_usage(name: str) -> None:
    replacement, answer = filtered(name)
    if name not in WHOLE:  # llm-stream and LMSP define no filtered answer: the proxy sends their error
        assert replacement is None
        return
    assert replacement is not None and replacement.status == 200
    row = read(CASES[name], replacement.body, event_stream=False)
    _, finish_reasons, status = WHOLE[name]
    assert (row["status"], row["finish_reasons"], row["output_text"], row["tool_calls"]) == (
        status,
        finish_reasons,
        "",
        [],
    )
    replaced = orjson.loads(replacement.body)
    for key in ("id", "model", "usage", "usageMetadata", "responseId", "modelVersion"):
        assert replaced.get(key) == answer.get(key), key  # the answer's own ids and billed usage
    assert TEXT.encode() not in replacement.body and "tök" not in replacement.body.decode()


@pytest.mark.parametrize("name", WHOLE)
def test_a_whole_answer_only_lenient_readers_take_is_read_as_the_sdks_read_it(name: str) -> None:
    """The SDKs' ``json.loads`` takes NaN where orjson does not: read as not JSON, the
    answer's text was neither recorded nor checked (a held answer went out unchecked)."""
    case = CASES[name]
    answer = orjson.dumps(WHOLE[name][0](case.request | {"stream": False}, Scenario.parse("")))
    row = read(case, answer[:-1] + b',"zz":NaN}', event_stream=False)
    assert row["output_text"] and row["output_text"] == read(case, answer, event_stream=False)["output_text"]
    assert codes(row) == ["lenient_json"]


def test_the_sdks_read_a_replaced_answer_as_their_apis_filtered_answer(upstream: Upstream) -> None:
    client = openai_client(upstream.serve(filtered("openai-chat")[0]))
    chat = client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert (chat.choices[0].finish_reason, chat.choices[0].message.content) == ("content_filter", None)
    client = openai_client(upstream.serve(filtered("openai-completions")[0]))
    completion = client.completions.create(model="gpt-3.5-turbo-instruct", prompt="hi")
    assert (completion.choices[0].finish_reason, completion.choices[0].text) == ("content_filter", "")
    client = openai_client(upstream.serve(filtered("openai-responses")[0]))
    response = client.responses.create(model="gpt-5", input="hi")
    assert (response.status, response.incomplete_details.reason, response.output_text) == (
        "incomplete",
        "content_filter",
        "",
    )
    message = anthropic_client(upstream.serve(filtered("anthropic-messages")[0])).messages.create(
        model="claude", max_tokens=10, messages=MESSAGES
    )
    assert (message.stop_reason, message.content, refusal_explanation(message)) == ("refusal", [], MESSAGE)
    with genai_client(upstream.serve(filtered("gemini")[0])) as gclient:
        answer = gclient.models.generate_content(model=GEMINI_MODEL, contents="hi")
    assert answer.candidates is not None and answer.candidates[0].finish_reason == genai_types.FinishReason.SAFETY
    assert not answer.text  # (finishMessage, which names the rule, reaches Vertex clients only)


# -- values only a lenient reader takes ---------------------------------------------------------


def test_frames_and_bodies_write_what_only_lenient_readers_take() -> None:
    """A lone surrogate (an id sent as ``"\\ud800"``) and an integer beyond 64 bits are
    read (as the SDKs read them), so the frames and bodies the proxy builds with them are
    written too, the same value back (orjson refuses both: the block path raised)."""
    import json

    from addon.dialects.blocking import frame, json_response
    from addon.json_read import dumps

    value = {"id": "chatcmpl-\ud800", "n": 2**70, "text": "é"}
    assert json.loads(dumps(value)) == value and dumps(value).isascii()
    assert dumps({"id": "x", "text": "é"}) == '{"id":"x","text":"é"}'  # (the common case: orjson)
    assert json.loads(frame(value, "chunk").data) == value
    assert json.loads(json_response({"error": value}).body) == {"error": value}


def test_a_stream_whose_ids_only_lenient_readers_take_is_cut_with_those_ids() -> None:
    """The upstream's completion id is a lone surrogate escape: the cut stream's last
    chunk carries it back (the termination raised, and the stream was not ended)."""
    import json

    from addon.dialects import RequestSummary

    normalizer = openai_chat.DIALECT.normalizer(RequestSummary(model="gpt-4o", stream=True))
    chunk = '{"id":"chatcmpl-\\ud800","object":"chat.completion.chunk","created":1,"model":"gpt-4o",'
    chunk += '"choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}'
    for event in SSEParser().feed(f"data: {chunk}\n\n".encode()):
        normalizer.on_event(event)
    tail = normalizer.termination("r", "x").decode()
    chunks = [json.loads(line[6:]) for line in tail.splitlines() if line.startswith("data: {")]
    assert chunks and {c["id"] for c in chunks} == {"chatcmpl-\ud800"}
