"""The OpenAI Chat Completions dialect, sans-IO: detection, extraction and findings.

Streams go through the same pipeline the proxy uses (StreamAuditor: decoder, SSE
parser, normalizer, record) in several chunkings; the record must not depend on how the
bytes were split. The fixtures below are small hand-written streams shaped like the
recordings (OpenAI 2024 and 2026, OpenRouter, llama.cpp, Azure, Ollama); the shared
recordings, when present, are checked against their expected extraction too.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import orjson
import pytest
from pipeline import audit_bytes

from addon.dialects import RequestView
from addon.dialects.openai_chat import DIALECT
from addon.dialects.registry import detect_request, detect_response
from addon.framing.sse import SSEEvent
from addon.record import OUTCOME_COMPLETE, OUTCOME_UPSTREAM_ABORTED
from exchange.transcript import output_choices, output_tool_calls

SHARED_STREAMS = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "streams"
PATH = "/v1/chat/completions"

REQUEST = {
    "model": "gpt-4o",
    "stream": True,
    "stream_options": {"include_usage": True},
    "user": "user-12345",
    "messages": [{"role": "user", "content": "What is the weather in Vienna?"}],
    "tools": [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
    ],
}

CHUNK_ID = "chatcmpl-abc123"
MODEL = "gpt-4o-2024-08-06"


def chunk(*choices: dict, usage=..., **extra) -> dict:
    """One chat.completion.chunk object (``usage`` left out unless given, even as None)."""
    obj = {"id": CHUNK_ID, "object": "chat.completion.chunk", "created": 1727346170, "model": MODEL}
    obj["choices"] = list(choices)
    if usage is not ...:
        obj["usage"] = usage
    return obj | extra


def choice(index: int = 0, finish: str | None = None, **delta) -> dict:
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}


def call(index: int, arguments: str, id: str | None = None, name: str | None = None) -> dict:
    """A tool-call fragment: the first one of an index carries id, type and name."""
    fragment: dict = {"index": index, "function": {"arguments": arguments}}
    if id is not None:
        fragment |= {"id": id, "type": "function"}
        fragment["function"]["name"] = name
    return fragment


def sse(*events: dict | str) -> bytes:
    """``data:`` events; a str is sent as it is (``[DONE]``, broken JSON)."""
    out = []
    for e in events:
        data = e if isinstance(e, str) else json.dumps(e, ensure_ascii=False)
        out.append(f"data: {data}\n\n")
    return "".join(out).encode()


USAGE = {
    "prompt_tokens": 42,
    "completion_tokens": 9,
    "total_tokens": 51,
    "prompt_tokens_details": {"cached_tokens": 16, "audio_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 3, "audio_tokens": 0},
}

TEXT = sse(
    chunk(choice(role="assistant", content="", refusal=None)),
    chunk(choice(content="Das Wetter")),
    chunk(choice(content=" in Wien: 24°C, ")),
    chunk(choice(content="sonnig ☀️.")),
    chunk(choice(finish="stop")),
    chunk(usage=USAGE),
    "[DONE]",
)

TOOL_ARGS = '{"city": "Vienna", "unit": "c"}'
TOOL = sse(
    chunk(choice(role="assistant", content=None)),
    chunk(choice(tool_calls=[call(0, "", "call_1", "get_weather")])),
    chunk(choice(tool_calls=[call(0, '{"ci')])),
    chunk(choice(tool_calls=[call(0, 'ty": "')])),
    chunk(choice(tool_calls=[call(0, 'Vienna", "unit": "c"}')])),
    chunk(choice(finish="tool_calls")),
    chunk(usage={"prompt_tokens": 60, "completion_tokens": 18, "total_tokens": 78}),
    "[DONE]",
)


def view(path: str = PATH, method: str = "POST", headers: dict[str, str] | None = None) -> RequestView:
    return RequestView(
        method, path, "", {k.lower(): v for k, v in (headers or {"content-type": "application/json"}).items()}
    )


def audit(
    body: bytes,
    chunks: list[int] | None = None,
    *,
    request: dict | None = REQUEST,
    encoding=None,
    outcome: str = OUTCOME_COMPLETE,
    event_stream: bool = True,
    status: int = 200,
) -> dict:
    """Run ``body`` through the auditor split at ``chunks`` offsets; return the row."""
    return audit_bytes(
        DIALECT,
        body,
        chunks,
        request=request,
        request_view=view(),
        encoding=encoding,
        outcome=outcome,
        event_stream=event_stream,
        status=status,
    )


def audit_json(obj: dict | bytes, status: int = 200, request: dict | None = REQUEST) -> dict:
    body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return audit(body, event_stream=False, status=status, request=request)


def codes(row: dict) -> list[str]:
    return [f["code"] for f in row["findings"]]


def texts(row: dict, kind: str = "text") -> list[str]:
    return [c.get(kind, "") for c in output_choices(row)]


# -- detection --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/v1/chat/completions",
        "/chat/completions",
        "/openai/deployments/gpt-4o-prod/chat/completions",  # Azure (api-version in the query)
        "/api/v1/chat/completions",  # OpenRouter
        "/openai/v1/chat/completions",  # Groq
        "/v1beta/openai/chat/completions",  # Gemini's OpenAI endpoint
        "/v1/chat/completions/",
    ],
)
def test_post_to_a_chat_completions_path_with_a_messages_list_is_detected(path):
    assert detect_request(view(path), lambda: REQUEST) is DIALECT
    assert detect_request(view(path), lambda: {"model": "m", "messages": []}) is DIALECT


@pytest.mark.parametrize(
    "path, method",
    [
        ("/v1/completions", "POST"),
        ("/v1/responses", "POST"),
        ("/v1/chat/completions/chatcmpl-1", "GET"),
        ("/v1/chat/completions", "GET"),
        ("/v1/chat/completions/chatcmpl-1/messages", "POST"),
        ("/v1/messages", "POST"),
        ("/v1/chat/completionsx", "POST"),
    ],
)
def test_other_request_lines_are_not_chat_completions(path, method):
    assert not DIALECT.matches(view(path, method))


@pytest.mark.parametrize(
    "body",
    [None, [], "text", {"model": "m"}, {"model": "m", "messages": "hi"}, {"model": "m", "input": [{"role": "user"}]}],
)
def test_chat_completions_path_without_a_messages_list_is_not_detected(body):
    assert DIALECT.matches(view()) and not DIALECT.accepts_body(body, view())


def test_unclaimed_stream_is_claimed_by_a_chat_completion_chunk_first_event():
    first = SSEEvent("message", json.dumps(chunk(choice(role="assistant", content=""))), "", None)
    assert detect_response(first) is DIALECT
    for data in ('{"object":"chat.completion.chunk"}', '{"type":"message_start"}', "[DONE]", '"chat.completion.chunk"'):
        assert not DIALECT.sniff(SSEEvent("message", data, "", None)), data


def test_request_summary_reads_model_stream_user_and_declared_tools():
    s = DIALECT.summarize(REQUEST, view())
    assert (s.model, s.stream, s.user_id, s.session_id, s.request_id) == ("gpt-4o", True, "user-12345", None, None)
    assert s.declared_tools == frozenset({"get_weather", "get_time"})
    assert s.findings == []


def test_request_summary_falls_back_to_safety_identifier_and_legacy_functions():
    body = {
        "model": "gpt-5",
        "messages": [],
        "safety_identifier": "hash-of-user",
        "functions": [{"name": "legacy_fn"}, {"nameless": True}, "junk"],
        "tools": [{"type": "custom", "custom": {"name": "grammar_tool"}}, {"type": "function"}, 7],
    }
    s = DIALECT.summarize(body, view())
    assert (s.model, s.stream, s.user_id) == ("gpt-5", False, "hash-of-user")
    assert s.declared_tools == frozenset({"legacy_fn", "grammar_tool"})
    assert DIALECT.summarize(body | {"user": "alice"}, view()).user_id == "alice"


def test_request_summary_of_an_odd_body_is_empty_not_an_error():
    assert DIALECT.summarize(None, view()).model is None
    s = DIALECT.summarize({"model": 5, "stream": "yes", "user": 1, "messages": [], "tools": "all"}, view())
    assert (s.model, s.stream, s.user_id, s.declared_tools) == (None, None, None, frozenset())


def test_default_provider_is_openai_and_known_hosts_win():
    assert DIALECT.provider_for("localhost") == "openai"
    assert DIALECT.provider_for("openrouter.ai") == "openrouter"
    assert DIALECT.provider_for("myres.openai.azure.com") == "azure.ai.openai"


# -- text, usage, metadata ------------------------------------------------------------------


def test_text_stream_extracts_text_model_id_finish_reason_and_detailed_usage():
    row = audit(TEXT)
    assert row["status"] == "completed"
    assert row["output_text"] == "Das Wetter in Wien: 24°C, sonnig ☀️."
    assert (row["request_model"], row["response_model"], row["response_id"]) == ("gpt-4o", MODEL, CHUNK_ID)
    assert row["user_id"] == "user-12345"
    assert row["finish_reasons"] == ["stop"]
    assert (row["input_tokens"], row["output_tokens"]) == (42, 9)
    assert (row["cache_read_input_tokens"], row["reasoning_output_tokens"]) == (16, 3)
    assert row["cache_write_input_tokens"] is None
    assert row["usage_source"] == "provider"
    assert row["event_count"] == 7
    assert row["findings"] == []
    assert output_choices(row) == [{"index": 0, "text": "Das Wetter in Wien: 24°C, sonnig ☀️.", "finish_reason": "stop"}]


def test_record_is_the_same_for_every_two_way_split_and_byte_at_a_time():
    for body in (TEXT, TOOL):
        whole = audit(body)
        for cut in range(1, len(body)):
            assert audit(body, [cut]) == whole, cut
        assert audit(body, list(range(1, len(body)))) == whole


def test_record_is_the_same_for_random_splits_and_crlf_framing():
    for body in (TEXT, TOOL, PARALLEL):
        crlf = body.replace(b"\n", b"\r\n")
        whole = audit(crlf)
        assert whole == audit(body) | {"bytes_to_client": len(crlf), "bytes_from_upstream": len(crlf)}
        rng = random.Random(11)
        for _ in range(150):
            cuts = sorted(rng.sample(range(1, len(crlf)), rng.randint(1, 15)))
            assert audit(crlf, cuts) == whole


def test_gzip_encoded_stream_is_read_through_the_decoder():
    packed = gzip.compress(TEXT)
    row = audit(packed, list(range(1, len(packed), 5)), encoding="gzip")
    assert row["output_text"] == audit(TEXT)["output_text"]
    assert row["bytes_to_client"] == len(packed)


def test_usage_null_on_every_chunk_is_ignored_and_the_real_usage_is_kept():
    body = sse(
        chunk(choice(role="assistant", content=None), usage=None, obfuscation="ZvYJf", service_tier="default"),
        chunk(choice(content="Olá!"), usage=None, obfuscation="zu"),
        chunk(choice(finish="stop"), usage=None, obfuscation=""),
        chunk(
            usage={
                "prompt_tokens": 20,
                "completion_tokens": 2,
                "total_tokens": 22,
                "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0},
            },
            obfuscation="m",
        ),
        "[DONE]",
    )
    row = audit(body)
    assert row["output_text"] == "Olá!"
    assert (
        row["input_tokens"],
        row["output_tokens"],
        row["cache_read_input_tokens"],
        row["reasoning_output_tokens"],
    ) == (20, 2, 0, 0)
    assert row["findings"] == []


def test_usage_not_reported_is_null_never_zero():
    body = sse(chunk(choice(content="hi"), usage=None), chunk(choice(finish="stop"), usage=None), "[DONE]")
    row = audit(body)
    assert row["usage_source"] == "none"
    assert [
        row[k] for k in ("input_tokens", "output_tokens", "cache_read_input_tokens", "reasoning_output_tokens")
    ] == [None] * 4


def test_usage_without_details_leaves_the_detail_columns_null():
    row = audit(
        sse(
            chunk(choice(content="x", finish="stop")),
            chunk(usage={"prompt_tokens": 5, "completion_tokens": 1}),
            "[DONE]",
        )
    )
    assert (row["input_tokens"], row["output_tokens"]) == (5, 1)
    assert (row["cache_read_input_tokens"], row["reasoning_output_tokens"]) == (None, None)


def test_vendor_cache_fields_are_mapped_openrouter_write_deepseek_hit_groq_x_groq():
    openrouter = {
        "prompt_tokens": 100,
        "completion_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 80, "cache_write_tokens": 20},
    }
    row = audit(sse(chunk(choice(content="x", finish="stop"), usage=openrouter), "[DONE]"))
    assert (row["cache_read_input_tokens"], row["cache_write_input_tokens"]) == (80, 20)
    deepseek = {
        "prompt_tokens": 100,
        "completion_tokens": 5,
        "prompt_cache_hit_tokens": 64,
        "prompt_cache_miss_tokens": 36,
    }
    assert audit(sse(chunk(usage=deepseek), "[DONE]"))["cache_read_input_tokens"] == 64
    groq = chunk(choice(finish="stop"), x_groq={"id": "req_1", "usage": {"prompt_tokens": 7, "completion_tokens": 3}})
    row = audit(sse(groq, "[DONE]"))
    assert (row["input_tokens"], row["output_tokens"]) == (7, 3)


def test_empty_choices_chunks_do_not_crash_and_azure_filter_chunk_gives_no_empty_model():
    azure_first = {
        "choices": [],
        "created": 0,
        "id": "",
        "model": "",
        "object": "",
        "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": {}}],
    }
    body = sse(
        azure_first,
        chunk(choice(content="ok", finish=None) | {"content_filter_results": {"hate": {"filtered": False}}}),
        chunk(choice(finish="stop")),
        chunk(),
        chunk(usage={"prompt_tokens": 3, "completion_tokens": 1}),
        "[DONE]",
    )
    row = audit(body)
    assert (row["status"], row["output_text"], row["response_model"], row["response_id"]) == (
        "completed",
        "ok",
        MODEL,
        CHUNK_ID,
    )
    assert row["findings"] == []


def test_logprobs_and_unknown_fields_are_ignored():
    logprobs = {"content": [{"token": "Foo", "logprob": -0.1, "bytes": [70, 111, 111], "top_logprobs": []}]}
    body = sse(
        chunk(choice(content="Foo") | {"logprobs": logprobs}, system_fingerprint="fp_1", brand_new_field={"x": 1}),
        chunk(choice(finish="stop", audio=None, annotations=[])),
        "[DONE]",
    )
    row = audit(body)
    assert (row["output_text"], row["finish_reasons"], row["findings"]) == ("Foo", ["stop"], [])


def test_several_choices_interleaved_keep_their_own_text_and_output_text_is_choice_zero():
    body = sse(
        chunk(choice(0, role="assistant", content="")),
        chunk(choice(0, content="A")),
        chunk(choice(1, role="assistant", content="")),
        chunk(choice(1, content="B")),
        chunk(choice(2, content="C")),
        chunk(choice(0, content="a")),
        chunk(choice(2, content="c")),
        chunk(choice(1, content="b")),
        chunk(choice(2, finish="stop")),
        chunk(choice(0, finish="stop")),
        chunk(choice(1, finish="length")),
        chunk(usage={"prompt_tokens": 9, "completion_tokens": 6}),
        "[DONE]",
    )
    row = audit(body)
    assert row["output_text"] == "Aa"
    assert texts(row) == ["Aa", "Bb", "Cc"]
    assert row["finish_reasons"] == ["stop", "length", "stop"]


def test_choice_without_index_falls_back_to_its_position():
    body = sse(
        chunk({"delta": {"content": "x"}}, {"delta": {"content": "y"}}),
        chunk({"delta": {}, "finish_reason": "stop"}),
        "[DONE]",
    )
    row = audit(body)
    assert texts(row) == ["x", "y"] and row["finish_reasons"] == ["stop"]


# -- reasoning and refusals ----------------------------------------------------------------


def test_llamacpp_reasoning_content_is_reasoning_not_answer_text():
    body = sse(
        chunk(choice(role="assistant", content=None)),
        chunk(choice(reasoning_content="The user")),
        chunk(choice(reasoning_content=" wants Portuguese.")),
        chunk(choice(content="Olá")),
        chunk(choice(content="!")),
        chunk(choice(finish="stop")),
        chunk(usage={"completion_tokens": 57, "prompt_tokens": 84, "total_tokens": 141}, timings={"cache_n": 83}),
        "[DONE]",
    )
    row = audit(body)
    assert row["output_text"] == "Olá!"
    assert output_choices(row)[0]["reasoning"] == "The user wants Portuguese."
    assert row["cache_read_input_tokens"] is None  # llama.cpp timings are not usage


def test_openrouter_reasoning_field_is_reasoning_and_a_delta_with_both_names_counts_once():
    body = sse(
        chunk(choice(content="", reasoning="Think", reasoning_details=[{"type": "reasoning.text", "text": "Think"}])),
        chunk(choice(content="", reasoning_content=" hard", reasoning=" hard")),  # vLLM sends both
        chunk(choice(content="Done", reasoning=None)),
        chunk(choice(finish="stop")),
        "[DONE]",
    )
    row = audit(body)
    assert output_choices(row)[0]["reasoning"] == "Think hard"
    assert row["output_text"] == "Done"


def test_refusal_is_kept_apart_from_answer_text():
    body = sse(
        chunk(choice(role="assistant", content=None, refusal="")),
        chunk(choice(refusal="I'm sorry, ")),
        chunk(choice(refusal="I can't help with that.")),
        chunk(choice(finish="stop")),
        chunk(usage={"prompt_tokens": 79, "completion_tokens": 11}),
        "[DONE]",
    )
    row = audit(body)
    assert row["output_text"] == ""
    assert output_choices(row)[0]["refusal"] == "I'm sorry, I can't help with that."
    assert row["status"] == "completed"


def test_content_parts_list_splits_text_and_thinking():
    parts = [{"type": "thinking", "thinking": [{"type": "text", "text": "hmm"}]}, {"type": "text", "text": "Answer"}]
    row = audit(sse(chunk(choice(content=parts)), chunk(choice(finish="stop")), "[DONE]"))
    assert row["output_text"] == "Answer"
    assert output_choices(row)[0]["reasoning"] == "hmm"


# -- tool calls ------------------------------------------------------------------------------


def test_tool_call_fragments_are_joined_exactly_and_marked_complete_on_finish():
    row = audit(TOOL)
    assert row["tool_calls"] == [{"id": "call_1", "name": "get_weather", "arguments": TOOL_ARGS}]
    assert row["output"]["tool_calls"][0]["complete"] is True
    assert row["finish_reasons"] == ["tool_calls"]
    assert row["output_text"] == ""
    assert row["findings"] == []
    assert row["status"] == "completed"


PARALLEL = sse(
    chunk(choice(role="assistant", content=None)),
    chunk(choice(tool_calls=[call(0, "", "call_a", "get_weather")])),
    chunk(choice(tool_calls=[call(0, '{"city": ')])),
    chunk(choice(tool_calls=[call(1, "", "call_b", "get_time")])),
    chunk(choice(tool_calls=[call(1, '{"tz": "Europe/')])),
    chunk(choice(tool_calls=[call(0, '"Vienna"}')])),
    chunk(choice(tool_calls=[call(1, 'Vienna"}')])),
    chunk(choice(finish="tool_calls")),
    chunk(usage={"prompt_tokens": 106, "completion_tokens": 50}),
    "[DONE]",
)


def test_parallel_tool_calls_interleaved_are_keyed_by_index_not_arrival():
    row = audit(PARALLEL)
    assert row["tool_calls"] == [
        {"id": "call_a", "name": "get_weather", "arguments": '{"city": "Vienna"}'},
        {"id": "call_b", "name": "get_time", "arguments": '{"tz": "Europe/Vienna"}'},
    ]
    assert all(t["complete"] for t in row["output"]["tool_calls"])
    assert row["findings"] == []


def test_several_calls_in_one_chunk_and_calls_of_different_choices_stay_apart():
    body = sse(
        chunk(choice(0, tool_calls=[call(0, '{"city":"A"}', "c0", "get_weather"), call(1, "{}", "c1", "get_time")])),
        chunk(choice(1, tool_calls=[call(0, '{"city":', "d0", "get_weather")])),
        chunk(choice(1, tool_calls=[call(0, '"B"}')])),
        chunk(choice(0, finish="tool_calls"), choice(1, finish="tool_calls")),
        "[DONE]",
    )
    row = audit(body)
    assert row["tool_calls"] == [
        {"id": "c0", "name": "get_weather", "arguments": '{"city":"A"}'},
        {"id": "c1", "name": "get_time", "arguments": "{}"},
        {"id": "d0", "name": "get_weather", "arguments": '{"city":"B"}'},
    ]
    assert row["findings"] == []


def test_tool_call_cut_by_the_token_limit_is_kept_and_reported_truncated():
    body = sse(
        chunk(choice(tool_calls=[call(0, "", "call_1", "get_weather")])),
        chunk(choice(tool_calls=[call(0, '{"city": "Vie')])),
        chunk(choice(finish="length")),
        chunk(usage={"prompt_tokens": 60, "completion_tokens": 5}),
        "[DONE]",
    )
    row = audit(body)
    assert row["tool_calls"] == [{"id": "call_1", "name": "get_weather", "arguments": '{"city": "Vie'}]
    assert row["output"]["tool_calls"][0]["complete"] is False
    assert codes(row) == ["tool_call_truncated"]
    assert row["status"] == "completed"  # [DONE] came: the response is whole, the call is not
    assert row["finish_reasons"] == ["length"]


def test_stream_cut_mid_tool_call_keeps_arguments_and_reports_missing_end_and_truncation():
    cut = TOOL.index(b'"finish_reason": "tool_calls"')  # inside the finishing chunk
    row = audit(TOOL[:cut], outcome=OUTCOME_UPSTREAM_ABORTED)
    assert row["status"] == "upstream_aborted"
    assert row["tool_calls"] == [{"id": "call_1", "name": "get_weather", "arguments": TOOL_ARGS}]
    assert codes(row) == ["missing_stream_end", "tool_call_truncated"]


def test_clean_end_of_body_without_done_is_upstream_aborted():
    row = audit(TEXT[: TEXT.index(b"data: [DONE]")])
    assert row["status"] == "upstream_aborted"
    assert codes(row) == ["missing_stream_end"]
    assert row["output_text"] == "Das Wetter in Wien: 24°C, sonnig ☀️."
    assert row["input_tokens"] == 42


def test_text_cut_mid_stream_keeps_the_partial_text():
    cut = TEXT.index(b"sonnig")
    row = audit(TEXT[:cut], outcome=OUTCOME_UPSTREAM_ABORTED)
    assert row["status"] == "upstream_aborted"
    assert row["output_text"] == "Das Wetter in Wien: 24°C, "
    assert row["finish_reasons"] == []
    assert "missing_stream_end" in codes(row)


def test_servers_that_reuse_index_zero_for_every_call_are_told_apart_by_id():
    body = sse(
        chunk(
            choice(
                tool_calls=[
                    {
                        "id": "call_x",
                        "index": 0,
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"A"}'},
                    }
                ]
            )
        ),
        chunk(
            choice(
                tool_calls=[
                    {
                        "id": "call_y",
                        "index": 0,
                        "type": "function",
                        "function": {"name": "get_time", "arguments": "{}"},
                    }
                ]
            )
        ),
        chunk(choice(finish="tool_calls")),
        "[DONE]",
    )
    row = audit(body)
    assert [(t["id"], t["name"], t["arguments"]) for t in row["tool_calls"]] == [
        ("call_x", "get_weather", '{"city":"A"}'),
        ("call_y", "get_time", "{}"),
    ]
    assert row["findings"] == []


def test_tool_call_fragments_without_index_use_their_position_and_object_arguments_become_json():
    body = sse(
        chunk(choice(tool_calls=[{"id": "c1", "function": {"name": "get_weather", "arguments": {"city": "Wien"}}}])),
        chunk(choice(finish="stop")),
        "[DONE]",
    )
    row = audit(body)
    assert row["tool_calls"] == [{"id": "c1", "name": "get_weather", "arguments": '{"city":"Wien"}'}]
    assert row["findings"] == []


def test_legacy_function_call_stream_is_a_tool_call():
    body = sse(
        chunk(choice(role="assistant", content=None, function_call={"name": "legacy_fn", "arguments": ""})),
        chunk(choice(function_call={"arguments": '{"a":'})),
        chunk(choice(function_call={"arguments": " 1}"})),
        chunk(choice(finish="function_call")),
        "[DONE]",
    )
    row = audit(body, request=REQUEST | {"functions": [{"name": "legacy_fn"}]})
    assert row["tool_calls"] == [{"id": None, "name": "legacy_fn", "arguments": '{"a": 1}'}]
    assert row["findings"] == []


def test_a_tool_the_request_did_not_declare_is_reported():
    body = sse(chunk(choice(tool_calls=[call(0, "{}", "c1", "rm_rf")])), chunk(choice(finish="tool_calls")), "[DONE]")
    assert codes(audit(body)) == ["undeclared_tool"]
    assert codes(audit(body, request=None)) == []  # nothing known about the request: no check


# -- OpenRouter and other endings -------------------------------------------------------------


def test_openrouter_comment_and_repeated_finish_chunk_are_not_the_end_and_usage_comes_from_the_second():
    finish = {
        "index": 0,
        "delta": {"content": "", "role": "assistant"},
        "finish_reason": "stop",
        "native_finish_reason": "end_turn",
    }
    body = (
        b": OPENROUTER PROCESSING\n\n"
        + sse(
            chunk(
                {"index": 0, "delta": {"content": "Olá! 👋", "role": "assistant"}, "finish_reason": None},
                provider="Amazon Bedrock",
            ),
            chunk(finish, provider="Amazon Bedrock"),
        )
        + b": OPENROUTER PROCESSING\n\n"
        + sse(
            chunk(
                finish,
                usage={
                    "prompt_tokens": 16,
                    "completion_tokens": 18,
                    "cost": 0.0001,
                    "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                    "completion_tokens_details": {"reasoning_tokens": 0},
                },
            ),
            "[DONE]",
        )
    )
    row = audit(body)
    assert row["status"] == "completed"
    assert row["output_text"] == "Olá! 👋"
    assert row["finish_reasons"] == ["stop"]
    assert (row["input_tokens"], row["output_tokens"], row["cache_write_input_tokens"]) == (16, 18, 0)
    assert row["event_count"] == 4
    assert row["findings"] == []
    cut = body.index(b'"usage"')
    assert audit(body[:cut], outcome=OUTCOME_UPSTREAM_ABORTED)["status"] == "upstream_aborted"


def test_events_after_done_and_invalid_json_are_findings():
    row = audit(TEXT + sse(chunk(choice(content=" late"))))
    assert codes(row) == ["event_after_stream_end"]
    row = audit(sse(chunk(choice(content="a")), "{not json", "[1, 2]", chunk(choice(finish="stop")), "[DONE]"))
    assert codes(row) == ["invalid_json", "invalid_json"]
    assert row["output_text"] == "a" and row["status"] == "completed"


# -- errors ------------------------------------------------------------------------------------


def test_error_chunk_after_http_200_fails_the_exchange_with_code_and_message():
    error = {
        "error": {
            "message": "The server had an error while processing your request.",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }
    row = audit(sse(chunk(choice(content="partial")), error, "[DONE]"))
    assert (row["status"], row["error_code"], row["error_message"]) == (
        "failed",
        "server_error",
        "The server had an error while processing your request.",
    )
    assert row["output_text"] == "partial"
    row = audit(sse({"error": {"code": "rate_limit_exceeded", "type": "tokens", "message": "slow down"}}))
    assert (row["status"], row["error_code"], row["error_message"]) == ("failed", "rate_limit_exceeded", "slow down")


def test_openrouter_mid_stream_error_chunk_has_numeric_code_and_finish_reason_error():
    err = chunk(
        {"index": 0, "delta": {"content": ""}, "finish_reason": "error"},
        error={"code": 502, "message": "Provider returned error"},
    )
    row = audit(sse(chunk(choice(content="Hal")), err, "[DONE]"))
    assert (row["status"], row["error_code"], row["error_message"]) == ("failed", "502", "Provider returned error")
    assert row["finish_reasons"] == ["error"]


def test_error_as_plain_text_or_top_level_object_or_error_event():
    assert audit(sse({"error": "upstream timed out"}))["error_message"] == "upstream timed out"
    vllm = {"object": "error", "message": "context too long", "type": "BadRequestError", "param": None, "code": 400}
    row = audit(sse(vllm))
    assert (row["error_code"], row["error_message"]) == ("400", "context too long")
    row = audit(b'event: error\ndata: {"message": "overloaded", "type": "overloaded_error"}\n\n')
    assert (row["status"], row["error_code"], row["error_message"]) == ("failed", "overloaded_error", "overloaded")
    assert audit(sse(chunk(choice(content="x", finish="stop"), error=None), "[DONE]"))["status"] == "completed"


@pytest.mark.parametrize(
    "status, body, code, message",
    [
        (
            401,
            {
                "error": {
                    "message": "Incorrect API key provided.",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "invalid_api_key",
                }
            },
            "invalid_api_key",
            "Incorrect API key provided.",
        ),
        (
            429,
            {"error": {"message": "Rate limit reached", "type": "requests", "code": None}},
            "requests",
            "Rate limit reached",
        ),
        (
            400,
            [{"error": {"code": 400, "message": "bad", "status": "INVALID_ARGUMENT"}}],
            None,
            None,
        ),  # Gemini compat list
        (404, {"error": "model 'llama9' not found"}, None, "model 'llama9' not found"),  # Ollama
        (500, b"<html>Internal Server Error</html>", None, "<html>Internal Server Error</html>"),
    ],
)
def test_http_error_bodies_give_the_error(status, body, code, message):
    row = audit_json(body if isinstance(body, bytes) else orjson.dumps(body), status=status)
    assert (row["status"], row["http_status"], row["error_code"], row["error_message"]) == (
        "failed",
        status,
        code,
        message,
    )


# -- non-streamed answers --------------------------------------------------------------------------


COMPLETION = {
    "id": "chatcmpl-xyz",
    "object": "chat.completion",
    "created": 1727346170,
    "model": MODEL,
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "It is sunny.", "refusal": None, "annotations": []},
            "logprobs": None,
            "finish_reason": "stop",
        },
        {
            "index": 1,
            "message": {
                "role": "assistant",
                "content": None,
                "reasoning_content": "Use the tool.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Vienna"}'},
                    },
                    {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
                ],
            },
            "finish_reason": "tool_calls",
        },
        {"index": 2, "message": {"role": "assistant", "content": None, "refusal": "I can't."}, "finish_reason": "stop"},
    ],
    "usage": {
        "prompt_tokens": 19,
        "completion_tokens": 10,
        "total_tokens": 29,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 4},
    },
    "system_fingerprint": "fp_1",
}


def test_non_streamed_completion_gives_text_reasoning_refusal_tool_calls_usage_and_model():
    row = audit_json(COMPLETION)
    assert row["status"] == "completed"
    assert (row["response_model"], row["response_id"]) == (MODEL, "chatcmpl-xyz")
    assert row["output_text"] == "It is sunny."
    assert output_choices(row)[1]["reasoning"] == "Use the tool."
    assert output_choices(row)[2]["refusal"] == "I can't."
    assert row["tool_calls"] == [
        {"id": "call_1", "name": "get_weather", "arguments": '{"city":"Vienna"}'},
        {"id": "call_2", "name": "get_time", "arguments": "{}"},
    ]
    assert row["finish_reasons"] == ["stop", "tool_calls", "stop"]
    assert (
        row["input_tokens"],
        row["output_tokens"],
        row["cache_read_input_tokens"],
        row["reasoning_output_tokens"],
    ) == (19, 10, 0, 4)
    assert row["findings"] == []


def test_non_streamed_tool_call_cut_by_the_token_limit_is_truncated():
    body = {
        "id": "c",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "finish_reason": "length",
                "message": {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"ci'}}
                    ],
                },
            }
        ],
    }
    row = audit_json(body)
    assert row["tool_calls"] == [{"id": "call_1", "name": "get_weather", "arguments": '{"ci'}]
    assert codes(row) == ["tool_call_truncated"]


def test_non_streamed_legacy_function_call_custom_tool_and_missing_usage():
    body = {
        "id": "c",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "finish_reason": "function_call",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "function_call": {"name": "legacy_fn", "arguments": "{}"},
                    "tool_calls": [
                        {"id": "ct_1", "type": "custom", "custom": {"name": "grammar_tool", "input": "SELECT 1"}}
                    ],
                },
            }
        ],
    }
    row = audit_json(body, request=None)
    assert row["tool_calls"] == [
        {"id": "ct_1", "name": "grammar_tool", "arguments": "SELECT 1"},
        {"id": None, "name": "legacy_fn", "arguments": "{}"},
    ]
    assert row["usage_source"] == "none" and row["input_tokens"] is None


def test_non_streamed_body_that_is_not_json_or_has_odd_types_does_not_crash():
    row = audit_json(b"not json at all")
    assert codes(row) == ["response_invalid_json"] and row["status"] == "upstream_aborted"
    odd = {
        "id": 5,
        "model": ["m"],
        "choices": [
            None,
            {"index": "0", "message": "hi", "finish_reason": 3},
            {"message": {"content": 7, "tool_calls": "x"}},
        ],
        "usage": "lots",
    }
    row = audit_json(odd)
    assert row["status"] == "completed" and row["findings"] == [] and row["tool_calls"] == []


def test_error_object_in_a_200_json_body_fails_the_exchange():
    row = audit_json({"error": {"message": "Provider returned error", "code": 502}})
    assert (row["status"], row["error_code"], row["error_message"]) == ("failed", "502", "Provider returned error")


# -- robustness ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        {"choices": "nope"},
        {"choices": [None, 1, "x"]},
        {"choices": [{"index": True, "delta": "text"}]},
        {"choices": [{"index": 0, "delta": {"content": 5, "refusal": [], "reasoning": {}, "tool_calls": "x"}}]},
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [None, {"index": "a", "function": "f"}, {"function": {"arguments": 3}}]},
                }
            ]
        },
        {"choices": [{"index": 0, "delta": {"function_call": "x"}, "finish_reason": 7}]},
        {
            "usage": {
                "prompt_tokens": "12",
                "completion_tokens": True,
                "prompt_tokens_details": [],
                "completion_tokens_details": 0,
            }
        },
        {"id": {"x": 1}, "model": 7, "created": "now"},
        {"error": 42},
        {"x_groq": "no"},
    ],
)
def test_odd_chunk_shapes_never_raise(data):
    row = audit(sse(data, "[DONE]"))
    assert "audit_internal_error" not in codes(row)
    assert row["status"] in ("completed", "failed")


# -- the shared reference recordings, when present ---------------------------------------------------


def _shared_names() -> list[str]:
    if not SHARED_STREAMS.exists():
        return []
    expected = orjson.loads((SHARED_STREAMS / "expected.json").read_bytes())
    return sorted(name for name, e in expected.items() if e.get("dialect") == "openai-chat")


def _shared_request(name: str) -> dict | None:
    for source in orjson.loads((SHARED_STREAMS / "sources.json").read_bytes()):
        if source["file"] == name and source.get("request"):
            return orjson.loads(source["request"]["body"])
    return None


@pytest.mark.skipif(not SHARED_STREAMS.exists(), reason="../shared/reference/streams not present")
def test_every_shared_openai_chat_and_compat_recording_is_covered():
    files = {p.name for p in SHARED_STREAMS.glob("openai-chat-*.sse")} | {
        p.name for p in SHARED_STREAMS.glob("openai-compat-*.sse")
    }
    assert set(_shared_names()) == files and len(files) == 11


@pytest.mark.skipif(not SHARED_STREAMS.exists(), reason="../shared/reference/streams not present")
@pytest.mark.parametrize("name", _shared_names() or ["(none)"])
def test_shared_recording_matches_its_expected_extraction(name):
    expected = orjson.loads((SHARED_STREAMS / "expected.json").read_bytes())[name]
    body = (SHARED_STREAMS / name).read_bytes()
    request = _shared_request(name)
    rng = random.Random(name)
    splits = [None, list(range(1, len(body))), sorted(rng.sample(range(1, len(body)), 20))]
    rows = [audit(body, chunks, request=request) for chunks in splits]
    assert rows[1] == rows[0] and rows[2] == rows[0]
    row = rows[0]
    assert row["status"] == "completed"
    assert row["findings"] == []
    assert row["event_count"] == expected["sse_events"]
    assert (row["response_model"], row["response_id"]) == (expected["model"], expected["id"])
    choices = {c["index"]: c for c in output_choices(row)}
    assert sorted(choices) == [c["index"] for c in expected["choices"]]
    for exp in expected["choices"]:
        got = choices[exp["index"]]
        assert got["text"] == exp["text"]
        assert got["finish_reason"] == exp["finish_reason"]
        assert got.get("refusal") == exp.get("refusal")
        assert got.get("reasoning") == exp.get("reasoning_content")
    assert row["output_text"] == expected["choices"][0]["text"]
    expected_calls = [
        {"id": t["id"], "name": t["name"], "arguments": t["arguments"], "complete": True}
        for c in expected["choices"]
        for t in c.get("tool_calls", [])
    ]
    assert output_tool_calls(row) == expected_calls
    usage = expected["usage"]
    assert (row["input_tokens"], row["output_tokens"]) == (usage["input_tokens"], usage["output_tokens"])
    assert row["reasoning_output_tokens"] == usage.get("reasoning_tokens")
    assert row["cache_read_input_tokens"] == usage.get("cached_tokens")


def test_non_streamed_json_with_an_invalid_utf8_byte_keeps_its_text_and_status():
    body = orjson.dumps(
        {
            "id": "c",
            "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"content": "caf\u00e9 ok"}}],
        }
    )
    broken = body.replace("é".encode(), b"\xe9")  # Latin-1 where UTF-8 belongs
    row = audit_json(broken)
    assert row["status"] == "completed" and row["output_text"] == "caf\ufffd ok"
    assert codes(row) == ["response_invalid_utf8"] and row["finish_reasons"] == ["stop"]


def test_an_http_error_body_with_invalid_utf8_keeps_its_message():
    row = audit_json(b'{"error": {"code": "x", "message": "bad \xff input"}}', status=400)
    assert (row["status"], row["error_code"], row["error_message"]) == ("failed", "x", "bad \ufffd input")


def test_tool_call_arguments_sent_as_an_object_only_lenient_readers_take_are_recorded():
    """Some compatible servers send ``arguments`` as an object: kept as JSON text. One
    holding a lone surrogate or an integer past 64 bits (read leniently) made orjson
    raise there, and the record lost the rest of the answer."""
    call = {
        "index": 0,
        "id": "c1",
        "type": "function",
        "function": {"name": "f", "arguments": {"x": "\\ud800", "n": 2**70}},
    }
    body = (
        b'data: {"id":"a","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":'
        + json.dumps({"tool_calls": [call]}).replace('"\\\\ud800"', '"\\ud800"').encode()
        + b',"finish_reason":null}]}\n\ndata: {"id":"a","object":"chat.completion.chunk","created":1,"model":"m",'
        + b'"choices":[{"index":0,"delta":{"content":"after"},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
    )
    row = audit(body)
    assert row["output_text"] == "after"
    [tool] = output_tool_calls(row)
    assert json.loads(tool["arguments"]) == {"x": "\ud800", "n": 2**70}


def test_a_spoken_answers_transcript_is_its_text_streamed_and_whole():
    """modalities ["text", "audio"]: the answer is audio, its words the transcript; the
    record's text was empty and the filters read nothing (review 52b F2)."""
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o-audio-preview"}
    deltas = [{"role": "assistant", "audio": {"id": "a1", "transcript": "The Night"}}, {"audio": {"data": "UklGRg=="}}]
    deltas.append({"audio": {"transcript": "jar plan."}})
    events = [head | {"choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    events.append(head | {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    body = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    assert audit(body)["output_text"] == "The Nightjar plan."
    message = {"role": "assistant", "content": None, "audio": {"id": "a1", "data": "UklGRg==", "transcript": "Hello."}}
    whole = {
        "id": "c",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
    }
    assert audit_json(whole)["output_text"] == "Hello."
