"""The OpenAI legacy Completions dialect, sans-IO: detection, extraction, blocking.

Streams go through the proxy's pipeline (StreamAuditor) in several chunkings; the record
must not depend on how the bytes were split. Fixtures are hand-written streams shaped
like OpenAI's ``gpt-3.5-turbo-instruct``, vLLM's and llama.cpp's answers.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace

import orjson
import pytest
from pipeline import audit_bytes

from addon.dialects import RequestView
from addon.dialects.openai_completions import DIALECT
from addon.dialects.registry import detect_request, detect_response
from addon.filters.api import RequestContext
from addon.filters.engine import FilterSet
from addon.filters.rules import parse_rules
from addon.framing.sse import SSEEvent, SSEParser
from addon.record import OUTCOME_COMPLETE, OUTCOME_UPSTREAM_ABORTED
from exchange.transcript import output_choices

PATH = "/v1/completions"
REQUEST = {
    "model": "gpt-3.5-turbo-instruct",
    "prompt": "Say this is a test",
    "stream": True,
    "user": "u-1",
    "stream_options": {"include_usage": True},
}
HEAD = {"id": "cmpl-abc", "object": "text_completion", "created": 1727346170, "model": "gpt-3.5-turbo-instruct"}
USAGE = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}


def chunk(*choices: dict, **extra) -> dict:
    return HEAD | {"choices": list(choices)} | extra


def choice(text: str = "", index: int = 0, finish: str | None = None, logprobs=None) -> dict:
    return {"text": text, "index": index, "logprobs": logprobs, "finish_reason": finish}


def sse(*events: dict | str) -> bytes:
    return "".join(
        f"data: {e if isinstance(e, str) else json.dumps(e, ensure_ascii=False)}\n\n" for e in events
    ).encode()


def logprobs(token: str) -> dict:
    return {"tokens": [token], "token_logprobs": [-0.1], "top_logprobs": [{token: -0.1}], "text_offset": [0]}


TEXT = sse(
    chunk(choice("\n\nThis", logprobs=logprobs("\n\nThis"))),
    chunk(choice(" is ä", logprobs=logprobs(" is ä"))),
    chunk(choice(" test.", logprobs=logprobs(" test."))),
    chunk(choice("", finish="stop")),
    chunk(usage=USAGE),
    "[DONE]",
)


def view(path: str = PATH, method: str = "POST") -> RequestView:
    return RequestView(method, path, "", {"content-type": "application/json"})


def audit(
    body: bytes,
    chunks: list[int] | None = None,
    *,
    request=REQUEST,
    event_stream: bool = True,
    status: int = 200,
    outcome: str = OUTCOME_COMPLETE,
) -> dict:
    return audit_bytes(
        DIALECT,
        body,
        chunks,
        request=request,
        request_view=view(),
        event_stream=event_stream,
        status=status,
        outcome=outcome,
    )


def codes(row: dict) -> list[str]:
    return [f["code"] for f in row["findings"]]


# -- detection --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/v1/completions",
        "/completions",
        "/openai/deployments/instruct/completions",
        "/v1/completions/",
        "/api/v1/completions",
    ],
)
def test_post_to_a_completions_path_with_a_prompt_is_detected(path):
    for prompt in ("hi", ["a", "b"], [1, 2, 3], [[1, 2], [3]], ""):
        assert detect_request(view(path), lambda prompt=prompt: {"model": "m", "prompt": prompt}) is DIALECT


@pytest.mark.parametrize(
    "path, body, other",
    [
        ("/v1/chat/completions", {"model": "m", "messages": [], "prompt": "x"}, "openai-chat"),
        ("/v1/responses", {"model": "m", "input": "x", "prompt": {"id": "pmpt_1"}}, "openai-responses"),
    ],
)
def test_chat_completions_and_responses_are_not_stolen(path, body, other):
    assert detect_request(view(path), lambda: body).name == other


def test_a_completions_path_without_a_prompt_or_not_post_is_not_detected():
    assert detect_request(view(), lambda: {"model": "m"}) is None
    assert detect_request(view(method="GET"), lambda: REQUEST) is None
    assert detect_request(view("/v1/chat/completions"), lambda: REQUEST) is None  # no messages: not chat either


def test_an_unclaimed_stream_is_claimed_by_a_text_completion_first_chunk():
    assert detect_response(SSEEvent(data=json.dumps(chunk(choice("x"))))) is DIALECT
    assert detect_response(SSEEvent(data=json.dumps({"object": "text_completion"}))) is None


def test_request_summary_reads_model_stream_user_and_flags_token_prompts():
    summary = DIALECT.summarize(REQUEST, view())
    assert (summary.model, summary.stream, summary.user_id, summary.findings) == (
        "gpt-3.5-turbo-instruct",
        True,
        "u-1",
        [],
    )
    assert [f.code for f in DIALECT.summarize({"prompt": [[101, 2023]]}, view()).findings] == ["request_token_prompt"]
    assert DIALECT.summarize(None, view()).model is None


# -- streams ------------------------------------------------------------------------------


def test_text_stream_gives_text_model_id_finish_reason_usage_and_no_logprobs_in_the_text():
    row = audit(TEXT)
    assert row["output_text"] == "\n\nThis is ä test."
    assert (row["response_model"], row["response_id"], row["finish_reasons"]) == (
        "gpt-3.5-turbo-instruct",
        "cmpl-abc",
        ["stop"],
    )
    assert (row["input_tokens"], row["output_tokens"], row["usage_source"]) == (5, 7, "provider")
    assert (row["status"], row["dialect"], row["request_model"], codes(row)) == (
        "completed",
        "openai-completions",
        "gpt-3.5-turbo-instruct",
        [],
    )


def test_the_record_is_the_same_for_every_split_and_byte_at_a_time():
    expected = audit(TEXT)
    for cut in range(len(TEXT) + 1):
        assert audit(TEXT, [cut]) == expected
    assert audit(TEXT, list(range(1, len(TEXT)))) == expected
    rng = random.Random(14)
    for _ in range(50):
        assert audit(TEXT, sorted(rng.sample(range(1, len(TEXT)), 6))) == expected


def test_several_choices_and_a_batch_of_prompts_keep_their_own_text_and_finish():
    body = sse(
        chunk(choice("A", 0)),
        chunk(choice("B", 1)),
        chunk(choice("a", 0, "stop")),
        chunk(choice("b", 1)),
        chunk(choice("", 2, "length")),
        chunk(choice("!", 1, "stop")),
        "[DONE]",
    )
    row = audit(body, request=REQUEST | {"prompt": ["x", "y", "z"]})
    assert [(c["index"], c["text"], c["finish_reason"]) for c in output_choices(row)] == [
        (0, "Aa", "stop"),
        (1, "Bb!", "stop"),
        (2, "", "length"),
    ]
    assert row["output_text"] == "Aa"


def test_an_error_chunk_after_http_200_fails_the_exchange():
    body = sse(
        chunk(choice("par")),
        {"error": {"message": "The server had an error", "type": "server_error", "code": "internal"}},
    )
    row = audit(body)
    assert (row["status"], row["error_code"], row["error_message"]) == ("failed", "internal", "The server had an error")


def test_a_stream_cut_before_done_is_upstream_aborted_with_the_partial_text():
    row = audit(TEXT[: TEXT.index(b"data", 10)], outcome=OUTCOME_UPSTREAM_ABORTED)
    assert (row["status"], row["output_text"]) == ("upstream_aborted", "\n\nThis")


def test_http_error_bodies_and_odd_chunks_never_raise():
    row = audit(
        b'{"error": {"message": "Invalid prompt", "type": "invalid_request_error", "code": null}}',
        event_stream=False,
        status=400,
    )
    assert (row["status"], row["error_code"], row["error_message"]) == (
        "failed",
        "invalid_request_error",
        "Invalid prompt",
    )
    odd = sse(
        {"choices": "x"},
        {"choices": [1, None, {"text": 5, "index": "a", "finish_reason": 3}]},
        {"usage": [1]},
        "not json",
        "[DONE]",
    )
    row = audit(odd)
    assert row["status"] == "completed" and codes(row) == ["invalid_json"]


def test_a_non_streamed_completion_gives_text_choices_and_usage():
    body = orjson.dumps(
        HEAD | {"choices": [choice("One", 0, "stop", logprobs("One")), choice("Two", 1, "length")], "usage": USAGE}
    )
    row = audit(body, event_stream=False, request=REQUEST | {"stream": False, "n": 2})
    assert [c["text"] for c in output_choices(row)] == ["One", "Two"]
    assert (row["finish_reasons"], row["output_tokens"], row["status"]) == (["stop", "length"], 7, "completed")


# -- blocking -----------------------------------------------------------------------------


def events_of(body: bytes) -> list[str]:
    return [e.data for e in SSEParser().feed(body)]


def test_a_blocked_request_is_the_openai_error_as_a_stream_or_as_http_400():
    streamed = DIALECT.blocked_response(DIALECT.summarize(REQUEST, view()), view(), "r1", "a reason", True)
    [error, done] = events_of(streamed.body)
    assert orjson.loads(error)["error"]["code"] == "content_filter" and done == "[DONE]"
    plain = DIALECT.blocked_response(DIALECT.summarize(REQUEST, view()), view(), "r1", "a reason", False)
    assert plain.status == 400 and orjson.loads(plain.body)["error"]["code"] == "content_filter"


def test_termination_finishes_each_unfinished_choice_with_content_filter_then_done():
    normalizer = DIALECT.normalizer(DIALECT.summarize(REQUEST, view()))
    for data in events_of(sse(chunk(choice("A", 0)), chunk(choice("B", 1)), chunk(choice("", 1, "stop")))):
        normalizer.on_event(SSEEvent(data=data))
    *chunks, done = events_of(normalizer.termination("r1", "why"))
    assert done == "[DONE]"
    [only] = [orjson.loads(c) for c in chunks]
    assert (only["id"], only["object"], only["model"], only["created"]) == (
        "cmpl-abc",
        "text_completion",
        "gpt-3.5-turbo-instruct",
        1727346170,
    )
    assert only["choices"] == [{"text": "", "index": 0, "logprobs": None, "finish_reason": "content_filter"}]
    for data in events_of(sse("[DONE]")):
        normalizer.on_event(SSEEvent(data=data))
    assert normalizer.termination("r1", "why") == b""


def test_the_termination_reads_back_as_a_filtered_stream():
    normalizer = DIALECT.normalizer(DIALECT.summarize(REQUEST, view()))
    head = sse(chunk(choice("A")))
    for data in events_of(head):
        normalizer.on_event(SSEEvent(data=data))
    row = audit(head + normalizer.termination("r", "x"))
    assert (row["status"], row["finish_reasons"], row["output_text"]) == ("completed", ["content_filter"], "A")


RULES = parse_rules(
    '[[rule]]\nid = "k"\nkind = "keywords"\nkeywords = ["Nightjar"]\naction = "block"\nscope = "request"'
)


@pytest.mark.parametrize(
    "body, where",
    [
        ({"prompt": "Tell me about Nightjar"}, "messages[0]"),
        ({"prompt": ["harmless", "Tell me about Night\u200djar"]}, "messages[1]"),
        ({"prompt": "def f():", "suffix": "# Nightjar"}, "messages[1]"),
    ],
)
def test_request_rules_read_every_prompt_and_the_suffix(body, where):
    [verdict] = FilterSet(RULES, failure="closed").check_request(RequestContext.from_body("openai-completions", body))
    assert (verdict.action, verdict.rule_id, verdict.location) == ("block", "k", where)


def test_a_token_id_prompt_cannot_be_read_and_the_failure_policy_decides():
    ctx = RequestContext.from_body("openai-completions", {"prompt": [[464, 5044]]})
    [closed] = FilterSet(RULES, failure="closed").check_request(ctx)
    [open_] = FilterSet(RULES, failure="open").check_request(ctx)
    assert (closed.action, closed.rule_id, open_.action) == ("block", "filter_error", "flag")
    [flagged] = FilterSet([replace(r, action="flag") for r in RULES], failure="closed").check_request(ctx)
    assert flagged.action == "flag", "only flag rules: nothing to block for"
    assert FilterSet([], failure="closed").check_request(ctx) == []


def test_choices_past_what_the_record_keeps_are_not_remembered():
    """An upstream naming a new choice index per event grew the normalizer's table of
    finished choices without end (the record keeps 128 choices); the ending still finishes
    every choice remembered."""
    from addon.dialects.openai_completions import OpenAICompletionsNormalizer
    from addon.record import MAX_CHOICES

    normalizer = OpenAICompletionsNormalizer()
    for i in range(MAX_CHOICES + 300):
        obj = chunk(choice("x", i, "stop" if i % 2 else None))
        normalizer.on_json(SSEEvent("", json.dumps(obj)), obj)
    assert len(normalizer.finished) == MAX_CHOICES
    ending = [json.loads(f.data) for f in normalizer.ending("r", "why")[:-1]]
    assert [c["choices"][0]["index"] for c in ending] == list(range(0, MAX_CHOICES, 2))
