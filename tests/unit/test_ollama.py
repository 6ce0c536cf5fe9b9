"""The Ollama dialect (addon.dialects.ollama) over the NDJSON framing: detection (and what it
leaves to openai-chat), the record of chat and generate streams and answers for any split of
the bytes, errors, hostile lines, and what a content filter sends (read back by our pipeline
and by the official client's response models)."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ollama import ChatResponse, GenerateResponse
from pipeline import audit_bytes

from addon.auditor import StreamAuditor, summary_into_record
from addon.dialects import RequestSummary, RequestView
from addon.dialects.ollama import DIALECT, OllamaNormalizer
from addon.dialects.registry import detect_request
from addon.filters.engine import FilterSet
from addon.filters.rules import parse_rules
from addon.framing import select
from addon.framing.ndjson import NDJSONReader
from addon.mitm.content_filters import check_request
from addon.output_gate import OutputGate
from addon.record import OUTCOME_COMPLETE, OUTCOME_UPSTREAM_ABORTED, ExchangeRecord
from mockllm.ollama import chat_body, chat_lines, generate_body, generate_lines
from mockllm.scenario import Scenario

RULE, REASON = "no-secrets", "a credential in the text"
MESSAGE = f"Blocked by content filter rule '{RULE}': {REASON}"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
CHAT = {"model": "qwen3", "messages": [{"role": "user", "content": "Weather in Vienna?"}], "tools": TOOLS}
GENERATE = {"model": "qwen3", "system": "Be brief.", "prompt": "Why is the sky blue?"}
TEXT = "tök0 tök1 tök2 tök3 tök4"
REASONING = "Let me think it över."


def view(path: str = "/api/chat") -> RequestView:
    return RequestView("POST", path, "", {"content-type": "application/json"})


def audit(body: bytes, chunks: list[int] | None = None, *, request: dict[str, Any] = CHAT, **kw: Any) -> dict:
    path = "/api/generate" if "prompt" in request else "/api/chat"
    return audit_bytes(DIALECT, body, chunks, request=request, request_view=view(path), event_stream=False, **kw)


def codes(row: dict) -> list[str]:
    return [f["code"] for f in row["findings"]]


def lines(request: dict[str, Any] = CHAT, **scenario: Any) -> bytes:
    build = generate_lines if "prompt" in request else chat_lines
    return b"".join(build(request, Scenario(**scenario)))


CHAT_STREAM = lines(reasoning=True, tool="get_weather")

# -- detection ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/api/chat", "/api/generate", "/ollama/api/chat", "/api/chat/"])
def test_native_paths_with_a_model_are_ollama(path: str):
    assert detect_request(view(path), lambda: {"model": "m", "messages": []}) is DIALECT


def test_openai_compatible_chat_stays_openai_chat_and_other_api_chat_routes_are_not_claimed():
    found = detect_request(view("/v1/chat/completions"), lambda: CHAT)
    assert found is not None and found.name == "openai-chat"
    assert detect_request(view("/api/chat"), lambda: {"message": "hi"}) is None  # some web app's chat
    assert detect_request(RequestView("GET", "/api/chat", "", {}), lambda: CHAT) is None
    assert detect_request(view("/api/chatter"), lambda: CHAT) is None


def test_summary_streams_unless_stream_false():
    assert DIALECT.summarize(CHAT, view()).stream is True
    summary = DIALECT.summarize({**GENERATE, "stream": False}, view("/api/generate"))
    assert (summary.stream, summary.model, summary.declared_tools) == (False, "qwen3", frozenset())
    assert DIALECT.summarize(CHAT, view()).declared_tools == {"get_weather"}
    assert DIALECT.normalizer(DIALECT.summarize(CHAT, view())).framing == "ndjson"
    assert DIALECT.normalizer(DIALECT.summarize({**CHAT, "stream": False}, view())).framing == "whole"


# -- the record ---------------------------------------------------------------------------------


def test_chat_stream_text_thinking_tool_call_model_usage_done_reason():
    row = audit(CHAT_STREAM)
    assert row["status"] == "completed" and row["findings"] == []
    assert row["output_text"] == TEXT and row["output"]["choices"][0]["reasoning"] == REASONING
    assert (row["response_model"], row["request_model"], row["finish_reasons"]) == ("qwen3", "qwen3", ["stop"])
    assert (row["input_tokens"], row["output_tokens"]) == (3, 14)
    [call] = row["tool_calls"]
    assert (call["name"], orjson.loads(call["arguments"])) == ("get_weather", {"city": "Vienna"})
    assert call["id"].startswith("call_")
    assert row["event_count"] == CHAT_STREAM.count(b"\n")


def test_record_is_the_same_for_every_two_way_split_and_byte_at_a_time():
    whole = audit(CHAT_STREAM)
    for cut in range(1, len(CHAT_STREAM)):
        assert audit(CHAT_STREAM, [cut]) == whole, cut
    assert audit(CHAT_STREAM, list(range(1, len(CHAT_STREAM)))) == whole


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, len(CHAT_STREAM) - 1), max_size=15).map(sorted))
def test_record_is_the_same_for_random_splits(cuts: list[int]):
    assert audit(CHAT_STREAM, cuts) == audit(CHAT_STREAM)


def test_crlf_and_blank_lines_give_the_same_record():
    crlf = CHAT_STREAM.replace(b"\n", b"\r\n\n")
    row = audit(crlf)
    sizes = {"bytes_to_client": len(crlf), "bytes_from_upstream": len(crlf)}
    assert row == audit(CHAT_STREAM) | sizes
    rng = random.Random(5)
    for _ in range(50):
        assert audit(crlf, sorted(rng.sample(range(1, len(crlf)), 6))) == row


def test_generate_stream_response_and_thinking():
    body = lines(GENERATE, reasoning=True)
    row = audit(body, request=GENERATE)
    assert (row["output_text"], row["output"]["choices"][0]["reasoning"]) == (TEXT, REASONING)
    assert (row["status"], row["finish_reasons"], row["output_tokens"]) == ("completed", ["stop"], 8)
    assert row["input_tokens"] == 7  # the mock counts words: "Be brief." and the prompt
    assert row["findings"] == []


@pytest.mark.parametrize("request_body", [CHAT, GENERATE], ids=["chat", "generate"])
def test_non_streamed_answer_is_the_same_record_as_the_stream(request_body: dict[str, Any]):
    build = chat_body if request_body is CHAT else generate_body
    answer = orjson.dumps(build(request_body, Scenario(reasoning=True)))
    row = audit(answer, request={**request_body, "stream": False})
    assert (row["output_text"], row["output"]["choices"][0]["reasoning"]) == (TEXT, REASONING)
    assert (row["status"], row["finish_reasons"], row["response_model"]) == ("completed", ["stop"], "qwen3")
    assert row["findings"] == [] and row["output_tokens"] == 8


def test_an_error_line_ends_the_stream_as_an_error():
    row = audit(lines(error="overloaded", error_after=2))
    assert (row["status"], row["error_message"], row["output_text"]) == (
        "failed",
        "mock error: overloaded",
        "tök0 tök1",
    )
    assert row["findings"] == []


def test_an_http_error_body_is_the_error():
    row = audit(b'{"error":"model \\"nope\\" not found, try pulling it first"}', status=404)
    assert (row["status"], row["error_message"]) == ("failed", 'model "nope" not found, try pulling it first')


def test_invalid_lines_are_findings_and_the_rest_is_read():
    body = CHAT_STREAM.replace(b"\n", b"\nnot json\n[1]\n", 1)
    row = audit(body)
    assert codes(row) == ["invalid_json", "invalid_json"]
    assert row["output_text"] == TEXT and row["status"] == "completed"


def test_a_last_line_without_lf_is_read_with_a_finding():
    row = audit(CHAT_STREAM[:-1])
    assert codes(row) == ["ndjson_unterminated_line"]
    assert (row["status"], row["output_text"], row["finish_reasons"]) == ("completed", TEXT, ["stop"])


def test_a_stream_without_its_done_line_or_cut_off():
    assert codes(audit(lines(no_end=True))) == ["missing_stream_end"]
    row = audit(CHAT_STREAM[:200], outcome=OUTCOME_UPSTREAM_ABORTED)
    assert row["status"] == "upstream_aborted" and "missing_stream_end" in codes(row)


def test_an_oversize_line_is_skipped_with_a_finding():
    big = orjson.dumps({"model": "qwen3", "message": {"role": "assistant", "content": "x" * 2000}, "done": False})
    body = big + b"\n" + CHAT_STREAM
    record = ExchangeRecord(dialect="ollama", streamed=True, http_status=200)
    summary = DIALECT.summarize(CHAT, view())
    summary_into_record(record, summary)
    auditor = StreamAuditor(record, DIALECT.normalizer(summary), None, 1000, event_stream=False)
    for i in range(0, len(body), 300):
        auditor.feed(body[i : i + 300])
    auditor.end()
    record.finish(OUTCOME_COMPLETE)
    row = record.to_row()
    assert codes(row) == ["ndjson_line_too_long"] and row["output_text"] == TEXT


# -- content filters ----------------------------------------------------------------------------


def ndjson(body: bytes) -> list[dict[str, Any]]:
    reader = NDJSONReader(1 << 20)
    return [orjson.loads(f.data) for f in reader.feed(body) + reader.end()]


@pytest.mark.parametrize("request_body", [CHAT, GENERATE], ids=["chat", "generate"])
@pytest.mark.parametrize("cut", [0, 2, 4])
def test_termination_is_a_last_ndjson_line_with_done_and_the_filter_reason(request_body: dict[str, Any], cut: int):
    streamed = lines(request_body, reasoning=True)
    kept = b"".join(streamed.splitlines(keepends=True)[:cut])
    normalizer = DIALECT.normalizer(DIALECT.summarize(request_body, view()))
    assert isinstance(normalizer, OllamaNormalizer)
    for frame in NDJSONReader(1 << 20).feed(kept):
        normalizer.on_event(frame)
    ending = normalizer.termination(RULE, REASON)
    assert ending.endswith(b"\n") and ending.count(b"\n") == 1
    [last] = ndjson(ending)
    assert (last["done"], last["done_reason"], last["model"]) == (True, "content_filter", "qwen3")
    model = ChatResponse if request_body is CHAT else GenerateResponse
    parsed = model(**last)  # what the official client builds of it
    assert parsed.done and parsed.done_reason == "content_filter"
    row = audit(kept + ending, request=request_body)
    assert row["findings"] == [] and row["status"] == "completed" and row["finish_reasons"] == ["content_filter"]
    whole = normalizer
    for frame in NDJSONReader(1 << 20).feed(streamed):
        whole.on_event(frame)
    assert whole.termination(RULE, REASON) == b""  # the done line was read: nothing to add


def test_blocked_streaming_request_is_one_done_line_and_otherwise_the_ollama_error_shape():
    for request_body, path, model in ((CHAT, "/api/chat", ChatResponse), (GENERATE, "/api/generate", GenerateResponse)):
        summary = DIALECT.summarize(request_body, view(path))
        answer = DIALECT.blocked_response(summary, view(path), RULE, REASON, streaming=True)
        assert (answer.status, dict(answer.headers)["content-type"]) == (200, "application/x-ndjson")
        [last] = ndjson(answer.body)
        assert model(**last).done_reason == "content_filter" and last["model"] == "qwen3"
        row = audit(answer.body, request=request_body)
        assert (row["status"], row["finish_reasons"], row["findings"]) == ("completed", ["content_filter"], [])
    refused = DIALECT.blocked_response(DIALECT.summarize(CHAT, view()), view(), RULE, REASON, streaming=False)
    assert (refused.status, orjson.loads(refused.body)) == (400, {"error": MESSAGE})


def test_a_held_answer_is_replaced_by_the_answer_emptied_with_its_model_and_counts():
    answer = chat_body(CHAT, Scenario(reasoning=True, tool="get_weather"))
    normalizer = DIALECT.normalizer(DIALECT.summarize({**CHAT, "stream": False}, view()))
    normalizer.on_body(orjson.dumps(answer), 200)
    filtered = normalizer.filtered_body(RULE, REASON)
    assert filtered is not None and filtered.status == 200
    body = orjson.loads(filtered.body)
    assert body["message"] == {"role": "assistant", "content": ""} and body["done_reason"] == "content_filter"
    assert (body["model"], body["eval_count"], body["prompt_eval_count"]) == ("qwen3", 14, 3)
    assert ChatResponse(**body).message.content == ""
    errored = DIALECT.normalizer(DIALECT.summarize({**CHAT, "stream": False}, view()))
    errored.on_body(b'{"error":"boom"}', 200)
    assert errored.filtered_body(RULE, REASON) is None


# -- the output gate over NDJSON ----------------------------------------------------------------

WORD = "Nightjar"
GATE_RULES = parse_rules(f"""
[[rule]]
id = "no-code-name"
kind = "keywords"
keywords = ["{WORD}"]
scope = "response"
action = "block"
reason = "internal code name"
""")


def gated(body: bytes, cuts: list[int]) -> tuple[bytes, dict]:
    """``body`` through an auditor with a holding gate, cut at ``cuts``: (what the client got, the row)."""
    filters = FilterSet(GATE_RULES, [], failure="closed")
    summary = DIALECT.summarize(CHAT, view())
    record = ExchangeRecord(dialect="ollama", streamed=True, http_status=200)
    summary_into_record(record, summary)
    gate = OutputGate(filters.output_guard(), DIALECT.normalizer(summary), holds=True, split_raw=True, failure="closed")
    framing = select("application/x-ndjson", 200, "ndjson")
    auditor = StreamAuditor(record, DIALECT.normalizer(summary), None, 1 << 20, gate=gate, framing=framing)
    bounds = [0, *cuts, len(body)]
    sent = [auditor.feed(body[a:b]) for a, b in zip(bounds, bounds[1:]) if b > a and not auditor.stopped]
    sent.append(auditor.finish())
    auditor.end()
    record.finish(OUTCOME_COMPLETE)
    return b"".join(sent), record.to_row()


def test_a_clean_stream_passes_the_gate_byte_for_byte_at_any_split():
    rng = random.Random(3)
    for cuts in [
        [],
        list(range(1, len(CHAT_STREAM))),
        *(sorted(rng.sample(range(1, len(CHAT_STREAM)), 5)) for _ in range(20)),
    ]:
        client, row = gated(CHAT_STREAM, cuts)
        assert client == CHAT_STREAM and (row["status"], row["verdicts"]) == ("completed", [])


def test_a_blocked_word_never_reaches_the_client_and_the_stream_ends_with_a_done_line():
    text = f"Ask about the {WORD} plan and more text after it"
    body = lines(events=10, text=text)
    rng = random.Random(4)
    for cuts in [[], list(range(1, len(body))), *(sorted(rng.sample(range(1, len(body)), 6)) for _ in range(20))]:
        client, row = gated(body, cuts)
        assert WORD.encode() not in client
        *received, ending = client.splitlines(keepends=True)
        assert body.startswith(b"".join(received)), "whole upstream lines, up to a line end"
        parts = ndjson(client)
        assert (parts[-1]["done"], parts[-1]["done_reason"]) == (True, "content_filter") and ending.endswith(b"\n")
        assert row["status"] == "blocked" and row["finish_reasons"] == ["content_filter"]
        shown = "".join(p["message"]["content"] for p in parts)
        assert text.startswith(shown) and (row["delivered_text"] or "") == shown


def test_fields_are_read_as_go_reads_them_in_any_case_the_last_one_standing():
    """Ollama's Go JSON decoder takes ``MODEL`` for ``model``, and of several the last:
    read exactly, ``MODEL`` was no request of Ollama's (no record, no filter), and the
    record kept a model the server did not run (review 52b F1)."""
    assert detect_request(view(), lambda: {"MODEL": "llama3.2", "messages": []}) is DIALECT
    assert DIALECT.summarize({"model": "llama3.2:1b", "Model": "llama3.1:405b"}, view()).model == "llama3.1:405b"
    assert DIALECT.summarize({"Model": "a", "model": "b", "ſtream": False}, view()).stream is False
    # the prompt under a key of another case is read too (beside the conversation)
    record = ExchangeRecord(request_body={"model": "m", "Messages": [{"role": "user", "content": f"the {WORD} plan"}]})
    rules = parse_rules(f'[[rule]]\nid = "k"\nkind = "keywords"\nkeywords = ["{WORD}"]\naction = "block"\n')
    verdict = check_request(FilterSet(rules, [], failure="closed"), record, DIALECT, RequestSummary())
    assert verdict is not None and verdict.action == "block"
