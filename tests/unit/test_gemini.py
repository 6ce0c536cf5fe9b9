"""The Gemini dialect, sans-IO: detection, extraction, endings, whole bodies.

Streams are fed through the same pipeline the proxy uses (StreamAuditor: decoder, SSE
parser or kept body, normalizer, record) in several chunkings; the record must not
depend on how the bytes were split. The fixtures are written here, shaped like the
recorded AI Studio and Vertex streams (CRLF framing, spaced JSON, thoughtSignature).
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
from addon.dialects.gemini import DIALECT
from addon.dialects.registry import detect_request
from addon.record import OUTCOME_COMPLETE, OUTCOME_UPSTREAM_ABORTED
from exchange.transcript import output_choices

SHARED_STREAMS = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "streams"

STUDIO_STREAM = "/v1beta/models/gemini-2.5-flash:streamGenerateContent"
STUDIO_GENERATE = "/v1beta/models/gemini-2.5-flash:generateContent"
VERTEX_STREAM = "/v1/projects/p-1/locations/us-east5/publishers/google/models/gemini-2.5-pro:streamGenerateContent"

REQUEST = {
    "contents": [{"role": "user", "parts": [{"text": "What is the weather in Vienna?"}]}],
    "tools": [
        {"functionDeclarations": [{"name": "get_weather", "parameters": {"type": "OBJECT"}}]},
        {"function_declarations": [{"name": "get_time"}]},
        {"googleSearch": {}},
    ],
}


def chunk(
    *candidates: dict,
    usage: dict | None = None,
    model: str = "gemini-2.5-flash-001",
    response_id: str = "resp-1",
    **extra,
) -> dict:
    obj: dict = {"candidates": list(candidates)} if candidates else {}
    if usage is not None:
        obj["usageMetadata"] = usage
    if model:
        obj["modelVersion"] = model
    if response_id:
        obj["responseId"] = response_id
    return obj | extra


def cand(*parts: dict, finish: str | None = None, index: int | None = None) -> dict:
    c: dict = {"content": {"role": "model", "parts": list(parts)}}
    if finish:
        c["finishReason"] = finish
    if index is not None:
        c["index"] = index
    return c


def usage(prompt: int | None = None, candidates: int | None = None, thoughts: int | None = None, **extra) -> dict:
    u = {"promptTokenCount": prompt, "candidatesTokenCount": candidates, "thoughtsTokenCount": thoughts} | extra
    return {k: v for k, v in u.items() if v is not None}


def sse(*chunks: dict) -> bytes:
    """Chunks framed as Gemini frames them: ``data: …`` ended by CRLF CRLF, spaced JSON."""
    return b"".join(b"data: " + json.dumps(c, ensure_ascii=False).encode() + b"\r\n\r\n" for c in chunks)


def array(*chunks: dict) -> bytes:
    """Chunks as streamGenerateContent without alt=sse sends them: one JSON array."""
    return ("[" + ",\r\n".join(json.dumps(c, indent=2, ensure_ascii=False) for c in chunks) + "]").encode()


def audit(
    body: bytes,
    chunks: list[int] | None = None,
    *,
    path: str = STUDIO_STREAM,
    request: dict | None = REQUEST,
    event_stream: bool = True,
    status: int = 200,
    encoding: str | None = None,
    outcome: str = OUTCOME_COMPLETE,
) -> dict:
    """Run ``body`` through the auditor split at ``chunks`` offsets; return the row."""
    req = view(path)
    return audit_bytes(
        DIALECT,
        body,
        chunks,
        request=request,
        request_view=req,
        encoding=encoding,
        outcome=outcome,
        event_stream=event_stream,
        status=status,
    )


def codes(row: dict) -> list[str]:
    return [f["code"] for f in row["findings"]]


def choice(row: dict, index: int) -> dict:
    return next(c for c in output_choices(row) if c["index"] == index)


def view(path: str, method: str = "POST", query: str = "alt=sse") -> RequestView:
    return RequestView(method, path, query, {"content-type": "application/json"})


TEXT = sse(
    chunk(cand({"text": "Das Wetter"}), usage=usage(12, 2)),
    chunk(cand({"text": " in Wien: 24°C, "}), usage=usage(12, 7)),
    chunk(cand({"text": "sonnig ☀️."}, finish="STOP", index=0), usage=usage(12, 9, 30)),
)
TEXT_ANSWER = "Das Wetter in Wien: 24°C, sonnig ☀️."


# -- detection --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, query, model, stream",
    [
        (STUDIO_STREAM, "alt=sse", "gemini-2.5-flash", True),
        (STUDIO_STREAM, "", "gemini-2.5-flash", True),
        (STUDIO_GENERATE, "key=[redacted]", "gemini-2.5-flash", False),
        (VERTEX_STREAM, "alt=sse", "gemini-2.5-pro", True),
        (
            "/v1beta1/projects/p/locations/global/publishers/google/models/gemini-3-pro-preview:generateContent",
            "",
            "gemini-3-pro-preview",
            False,
        ),
        ("/v1beta/tunedModels/my-tuned-model:generateContent", "", "my-tuned-model", False),
        ("/gemini/v1beta/models/gemini-2.0-flash%3AstreamGenerateContent", "alt=sse", "gemini-2.0-flash", True),
    ],
)
def test_generate_content_paths_are_detected_and_the_model_comes_from_the_path(path, query, model, stream):
    req = view(path, query=query)
    assert detect_request(req, lambda: REQUEST) is DIALECT
    summary = DIALECT.summarize(REQUEST, req)
    assert (summary.model, summary.stream, summary.user_id) == (model, stream, None)


@pytest.mark.parametrize(
    "method, path",
    [
        ("GET", STUDIO_STREAM),
        ("POST", "/v1beta/models/gemini-2.5-flash:countTokens"),
        ("POST", "/v1beta/models/text-embedding-004:embedContent"),
        ("POST", "/v1beta/models/gemini-2.5-flash:streamGenerateContentX"),
        ("POST", "/v1beta/openai/chat/completions"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/generateContent"),
        ("POST", "/v1/llm/stream"),
    ],
)
def test_other_requests_are_not_gemini(method, path):
    assert not DIALECT.matches(view(path, method))


def test_a_json_body_that_is_not_an_object_is_not_gemini_but_a_missing_body_is():
    assert detect_request(view(STUDIO_STREAM), lambda: [1, 2]) is None
    assert detect_request(view(STUDIO_STREAM), lambda: None) is DIALECT


def test_declared_tools_come_from_function_declarations_in_both_spellings():
    assert DIALECT.summarize(REQUEST, view(STUDIO_STREAM)).declared_tools == {"get_weather", "get_time"}
    assert DIALECT.summarize({"contents": []}, view(STUDIO_STREAM)).declared_tools == frozenset()
    odd = {"tools": [None, {"functionDeclarations": "x"}, {"functionDeclarations": [{"name": 3}, 5]}]}
    assert DIALECT.summarize(odd, view(STUDIO_STREAM)).declared_tools == frozenset()
    assert DIALECT.summarize(None, view(VERTEX_STREAM)).model == "gemini-2.5-pro"


def test_provider_is_gemini_by_default_and_vertex_on_the_vertex_host():
    assert DIALECT.provider_for("generativelanguage.googleapis.com") == "gcp.gemini"
    assert DIALECT.provider_for("us-east5-aiplatform.googleapis.com") == "gcp.vertex_ai"
    assert DIALECT.provider_for("litellm.internal") == "gcp.gemini"


# -- text, metadata, usage --------------------------------------------------------------------


def test_text_stream_extracts_text_model_id_usage_and_finish_reason():
    row = audit(TEXT)
    assert row["status"] == "completed"
    assert row["output_text"] == TEXT_ANSWER
    assert (row["request_model"], row["response_model"]) == ("gemini-2.5-flash", "gemini-2.5-flash-001")
    assert row["response_id"] == "resp-1"
    assert (row["input_tokens"], row["output_tokens"], row["reasoning_output_tokens"]) == (12, 9, 30)
    assert row["cache_read_input_tokens"] is None and row["cache_write_input_tokens"] is None
    assert row["finish_reasons"] == ["STOP"]
    assert row["user_id"] is None
    assert row["event_count"] == 3
    assert row["findings"] == []


def test_record_is_the_same_for_every_two_way_split_and_byte_at_a_time():
    whole = audit(TEXT)
    for cut in range(1, len(TEXT)):
        assert audit(TEXT, [cut]) == whole, cut
    assert audit(TEXT, list(range(1, len(TEXT)))) == whole


def test_record_is_the_same_for_random_splits_and_lf_framing():
    body = TEXT + sse(chunk(cand({"functionCall": {"name": "get_time", "args": {"tz": "Europe/Vienna"}}})))
    whole = audit(body)
    assert audit(body.replace(b"\r\n", b"\n")) == whole | {
        "bytes_to_client": len(body) - body.count(b"\r"),
        "bytes_from_upstream": len(body) - body.count(b"\r"),
    }
    rng = random.Random(11)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(body)), rng.randint(1, 12)))
        assert audit(body, cuts) == whole


def test_thought_parts_are_reasoning_not_answer_text_and_signatures_are_ignored():
    body = sse(
        chunk(cand({"text": "**Planning**\n\nThe user wants", "thought": True}), usage=usage(54, None, 62)),
        chunk(cand({"text": " the weather.", "thought": True})),
        chunk(
            cand(
                {"text": "It is sunny.", "thoughtSignature": "CiQBvj72+xCK"},
                {"text": "", "thoughtSignature": "Ep"},
                finish="STOP",
            ),
            usage=usage(54, 4, 62),
        ),
    )
    row = audit(body)
    assert row["output_text"] == "It is sunny."
    assert choice(row, 0)["reasoning"] == "**Planning**\n\nThe user wants the weather."
    assert row["reasoning_output_tokens"] == 62 and row["output_tokens"] == 4
    assert row["findings"] == []


def test_several_candidates_keep_their_own_text_and_output_text_is_candidate_zero():
    body = sse(
        chunk(cand({"text": "Eins "}), cand({"text": "One "}, index=1)),
        chunk(cand({"text": "zwei"}, finish="STOP"), cand({"text": "two"}, index=1, finish="MAX_TOKENS")),
    )
    row = audit(body)
    assert row["output_text"] == "Eins zwei"
    assert [(c["index"], c["text"], c["finish_reason"]) for c in output_choices(row)] == [
        (0, "Eins zwei", "STOP"),
        (1, "One two", "MAX_TOKENS"),
    ]


def test_an_upstream_naming_a_new_candidate_per_chunk_grows_no_table_past_the_choices_kept():
    """Candidates past MAX_CHOICES (the record keeps no more) are not remembered, nor is a
    call still streaming for one; the record counts their events (record_limit)."""
    from addon.dialects.gemini import GeminiNormalizer
    from addon.record import MAX_CHOICES, ExchangeRecord

    normalizer, record = GeminiNormalizer(), ExchangeRecord(dialect=DIALECT.name)
    streaming = {"functionCall": {"name": "f", "willContinue": True}}
    for i in range(MAX_CHOICES + 300):
        for event in normalizer.on_json(None, chunk(cand({"text": "t"}, streaming, index=i))):  # type: ignore[arg-type]
            record.apply(event)
    assert (len(normalizer.candidates), len(normalizer.open_calls)) == (MAX_CHOICES, MAX_CHOICES)
    assert any(f["code"] == "record_limit" for f in record.to_row()["findings"])
    assert len(normalizer.ending("r", "x")[0].data) < 20_000  # a SAFETY finish per candidate kept


def test_candidate_index_defaults_to_its_position_when_omitted():
    body = sse(chunk(cand({"text": "a"}, finish="STOP"), cand({"text": "b"}, finish="STOP")))
    assert [c["text"] for c in output_choices(audit(body))] == ["a", "b"]


def test_usage_is_cumulative_and_the_last_report_wins():
    body = sse(
        chunk(cand({"text": "a"}), usage=usage(100, 1, 5, cachedContentTokenCount=80)),
        chunk(
            cand({"text": "b"}, finish="STOP"), usage=usage(100, 2, 5, cachedContentTokenCount=80, totalTokenCount=107)
        ),
    )
    row = audit(body)
    assert (row["input_tokens"], row["output_tokens"], row["reasoning_output_tokens"]) == (100, 2, 5)
    assert row["cache_read_input_tokens"] == 80
    assert row["usage_source"] == "provider"


def test_vertex_traffic_type_only_usage_does_not_wipe_counts():
    body = sse(
        chunk(cand({"text": "Olá!"}), usage={"trafficType": "ON_DEMAND"}, createTime="2026-03-12T18:05:56.457623Z"),
        chunk(cand({"text": " Tchau."}, finish="STOP"), usage=usage(9, 9, 36, trafficType="ON_DEMAND")),
        chunk(usage={"trafficType": "ON_DEMAND"}),
    )
    row = audit(body, path=VERTEX_STREAM)
    assert (row["input_tokens"], row["output_tokens"], row["reasoning_output_tokens"]) == (9, 9, 36)
    assert row["output_text"] == "Olá! Tchau."
    assert row["findings"] == [] and row["status"] == "completed"


def test_usage_absent_is_null_never_zero():
    row = audit(sse(chunk(cand({"text": "x"}, finish="STOP"))))
    assert (row["input_tokens"], row["output_tokens"], row["reasoning_output_tokens"]) == (None, None, None)
    assert row["usage_source"] == "none"


def test_a_usage_only_chunk_after_the_finish_reason_is_fine():
    body = sse(chunk(cand({"text": "done"}, finish="STOP")), chunk(usage=usage(5, 1)))
    row = audit(body)
    assert row["status"] == "completed" and row["findings"] == []
    assert (row["input_tokens"], row["output_tokens"]) == (5, 1)


def test_max_tokens_finish_keeps_the_partial_answer():
    row = audit(sse(chunk(cand({"text": '{"'}, finish="MAX_TOKENS"), usage=usage(79, 1))))
    assert (row["status"], row["output_text"], row["finish_reasons"]) == ("completed", '{"', ["MAX_TOKENS"])


def test_safety_finish_is_recorded_with_the_text_before_it():
    body = sse(
        chunk(cand({"text": "Here is how"})),
        chunk({"finishReason": "SAFETY", "index": 0, "safetyRatings": [{"category": "HARM", "blocked": True}]}),
    )
    row = audit(body)
    assert (row["output_text"], row["finish_reasons"], row["status"]) == ("Here is how", ["SAFETY"], "completed")


def test_unknown_fields_and_part_types_are_ignored():
    body = sse(
        chunk(
            cand(
                {"executableCode": {"code": "print(1)"}},
                {"inlineData": {"mimeType": "image/png", "data": "aW1n"}},
                {"text": "ok"},
            ),
            groundingMetadata={},
            newField=[1],
        ),
        chunk(cand({"text": "!"}, finish="STOP")),
    )
    row = audit(body)
    assert (row["output_text"], row["findings"]) == ("ok!", [])


@pytest.mark.parametrize(
    "data",
    [
        b'{"candidates": "x", "usageMetadata": [], "modelVersion": 5, "promptFeedback": 1}',
        b'{"candidates": [null, 3, {"content": "x"}, {"content": {"parts": {"text": "x"}}}]}',
        b'{"candidates": [{"index": "1", "content": {"parts": [null, {"text": 5}, {"functionCall": "f"}]}}]}',
        b'{"candidates": [{"finishReason": 3}], "usageMetadata": {"promptTokenCount": "7", "candidatesTokenCount": true}}',
        b'{"error": null, "candidates": [{"content": {"parts": [{"functionCall": {"name": 1, "args": 2}}]}}]}',
    ],
)
def test_odd_types_never_raise(data):
    row = audit(b"data: " + data + b"\r\n\r\n")
    assert "audit_internal_error" not in codes(row)
    assert row["input_tokens"] is None


def test_invalid_json_chunk_is_a_finding_and_the_stream_goes_on():
    body = sse(chunk(cand({"text": "a"}))) + b"data: {not json\r\n\r\n" + sse(chunk(cand({"text": "b"}, finish="STOP")))
    row = audit(body)
    assert row["output_text"] == "ab"
    assert codes(row) == ["invalid_json"]


def test_gzip_encoded_stream_is_read_through_the_decoder():
    packed = gzip.compress(TEXT)
    row = audit(packed, list(range(1, len(packed), 7)), encoding="gzip")
    assert row["output_text"] == TEXT_ANSWER and row["status"] == "completed"


# -- function calls ---------------------------------------------------------------------------


def test_function_call_is_one_complete_call_with_compact_json_arguments():
    body = sse(
        chunk(
            cand(
                {
                    "functionCall": {"name": "get_weather", "args": {"city": "Wien", "days": [1, 2]}},
                    "thoughtSignature": "CiQBvj72",
                },
                finish="STOP",
            )
        )
    )
    row = audit(body)
    assert row["tool_calls"] == [{"id": None, "name": "get_weather", "arguments": '{"city":"Wien","days":[1,2]}'}]
    assert row["output"]["tool_calls"][0]["complete"] is True
    assert row["findings"] == [] and row["output_text"] == ""


def test_function_call_id_is_kept_when_present_and_missing_args_give_an_empty_string():
    body = sse(chunk(cand({"functionCall": {"id": "fc-1", "name": "get_time"}}, finish="STOP")))
    assert audit(body)["tool_calls"] == [{"id": "fc-1", "name": "get_time", "arguments": ""}]


def test_parallel_function_calls_in_one_chunk_are_separate_calls_in_order():
    body = sse(
        chunk(
            cand(
                {"functionCall": {"name": "add", "args": {"b": 3, "a": 2}}, "thoughtSignature": "Clo"},
                {"functionCall": {"name": "multiply", "args": {"a": 2, "b": 3}}},
                {"functionCall": {"name": "add", "args": {"a": 2, "b": 3}}},
                finish="STOP",
            )
        )
    )
    row = audit(body)
    assert [(t["name"], t["arguments"]) for t in row["tool_calls"]] == [
        ("add", '{"b":3,"a":2}'),
        ("multiply", '{"a":2,"b":3}'),
        ("add", '{"a":2,"b":3}'),
    ]
    assert all(t["complete"] for t in row["output"]["tool_calls"]) and row["findings"] == []


def test_function_calls_of_the_same_name_in_separate_chunks_stay_separate():
    body = sse(
        chunk(cand({"text": "Checking both."}, {"functionCall": {"name": "get_weather", "args": {"city": "Wien"}}})),
        chunk(cand({"functionCall": {"name": "get_weather", "args": {"city": "Graz"}}}, finish="STOP")),
    )
    row = audit(body)
    assert row["output_text"] == "Checking both."
    assert [t["arguments"] for t in row["tool_calls"]] == ['{"city":"Wien"}', '{"city":"Graz"}']


def streamed_call(last: dict | None = None) -> list[dict]:
    """Vertex streamFunctionCallArguments: name first, then partialArgs, strings in pieces."""
    return [
        chunk(cand({"functionCall": {"name": "get_weather", "id": "fc-7", "willContinue": True}})),
        chunk(
            cand(
                {
                    "functionCall": {
                        "partialArgs": [{"jsonPath": "$.city", "stringValue": "Wi", "willContinue": True}],
                        "willContinue": True,
                    }
                }
            )
        ),
        chunk(
            cand(
                {
                    "functionCall": {
                        "partialArgs": [
                            {"jsonPath": "$.city", "stringValue": "en"},
                            {"jsonPath": "$.days[0]", "numberValue": 1},
                            {"jsonPath": "$.opts['metric units']", "boolValue": True},
                        ],
                        "willContinue": True,
                    }
                }
            )
        ),
        *([last] if last else []),
    ]


def test_streamed_function_call_arguments_are_assembled_into_one_call():
    end = chunk(
        cand(
            {
                "functionCall": {
                    "name": "get_weather",
                    "partialArgs": [{"jsonPath": "$.note", "nullValue": "NULL_VALUE"}],
                    "willContinue": False,
                }
            },
            finish="STOP",
        )
    )
    row = audit(sse(*streamed_call(end), chunk(cand({"functionCall": {}}))))
    assert row["tool_calls"] == [
        {
            "id": "fc-7",
            "name": "get_weather",
            "arguments": '{"city":"Wien","days":[1],"opts":{"metric units":true},"note":null}',
        }
    ]
    assert row["output"]["tool_calls"][0]["complete"] is True
    assert row["findings"] == [] and row["status"] == "completed"


def test_streamed_function_call_cut_by_the_token_limit_is_kept_incomplete():
    row = audit(sse(*streamed_call(chunk(cand(finish="MAX_TOKENS")))))
    assert row["tool_calls"] == [
        {"id": "fc-7", "name": "get_weather", "arguments": '{"city":"Wien","days":[1],"opts":{"metric units":true}}'}
    ]
    assert row["output"]["tool_calls"][0]["complete"] is False
    assert row["finish_reasons"] == ["MAX_TOKENS"]
    assert codes(row) == ["tool_call_truncated"]


def test_streamed_function_call_cut_by_the_end_of_the_stream_is_kept_incomplete():
    row = audit(sse(*streamed_call()), outcome=OUTCOME_UPSTREAM_ABORTED)
    assert row["tool_calls"][0]["name"] == "get_weather"
    assert json.loads(row["tool_calls"][0]["arguments"])["city"] == "Wien"
    assert sorted(codes(row)) == ["missing_stream_end", "tool_call_truncated"]
    assert row["status"] == "upstream_aborted"


def test_a_whole_call_of_another_function_closes_a_streaming_one_as_truncated():
    body = sse(*streamed_call(chunk(cand({"functionCall": {"name": "get_time", "args": {}}}, finish="STOP"))))
    row = audit(body)
    assert [(t["name"], t["complete"]) for t in row["output"]["tool_calls"]] == [
        ("get_weather", False),
        ("get_time", True),
    ]


# -- errors and endings -------------------------------------------------------------------------


def test_blocked_prompt_is_a_finish_and_an_error():
    body = sse(
        {
            "promptFeedback": {"blockReason": "PROHIBITED_CONTENT", "safetyRatings": []},
            "usageMetadata": usage(8),
            "modelVersion": "gemini-2.5-flash",
            "responseId": "r",
        }
    )
    row = audit(body)
    assert row["status"] == "failed"
    assert row["finish_reasons"] == ["PROHIBITED_CONTENT"]
    assert row["error_code"] == "PROHIBITED_CONTENT" and "blocked" in row["error_message"]
    assert row["input_tokens"] == 8 and row["findings"] == []


def test_blocked_prompt_message_is_taken_when_given():
    body = sse({"promptFeedback": {"blockReason": "SAFETY", "blockReasonMessage": "Unsafe prompt."}})
    assert audit(body)["error_message"] == "Unsafe prompt."


def test_error_object_mid_stream_fails_the_exchange_with_the_status_name():
    body = sse(
        chunk(cand({"text": "partial"})),
        {"error": {"code": 500, "message": "Internal error encountered.", "status": "INTERNAL"}},
    )
    row = audit(body)
    assert (row["status"], row["error_code"], row["error_message"]) == (
        "failed",
        "INTERNAL",
        "Internal error encountered.",
    )
    assert row["output_text"] == "partial"


def test_stream_cut_by_upstream_keeps_partial_text_and_reports_missing_stream_end():
    cut = TEXT.index(b"data: ", 10) + 30
    row = audit(TEXT[:cut], outcome=OUTCOME_UPSTREAM_ABORTED)
    assert row["status"] == "upstream_aborted"
    assert row["output_text"] == "Das Wetter"
    assert "missing_stream_end" in codes(row)


def test_clean_end_of_body_without_a_finish_reason_is_upstream_aborted():
    row = audit(sse(chunk(cand({"text": "no end"}), usage=usage(3, 2))))
    assert row["status"] == "upstream_aborted"
    assert codes(row) == ["missing_stream_end"]


def test_http_error_body_gives_the_status_name_and_message():
    body = b'{"error": {"code": 429, "message": "Resource has been exhausted.", "status": "RESOURCE_EXHAUSTED"}}'
    row = audit(body, event_stream=False, status=429)
    assert (row["status"], row["error_code"], row["error_message"]) == (
        "failed",
        "RESOURCE_EXHAUSTED",
        "Resource has been exhausted.",
    )


@pytest.mark.parametrize(
    "body, code, message",
    [
        (
            b'[{"error": {"code": 400, "message": "API key not valid.", "status": "INVALID_ARGUMENT"}}]',
            "INVALID_ARGUMENT",
            "API key not valid.",
        ),
        (b'{"error": {"code": 503, "message": "The model is overloaded."}}', "503", "The model is overloaded."),
        (b"<html>Bad Gateway</html>", None, "<html>Bad Gateway</html>"),
        (b'{"error": "plain text"}', None, "plain text"),
    ],
)
def test_http_error_bodies_of_other_shapes(body, code, message):
    row = audit(body, event_stream=False, status=400)
    assert (row["status"], row["error_code"], row["error_message"]) == ("failed", code, message)


# -- whole bodies: generateContent and the JSON array stream ------------------------------------


GENERATED = chunk(
    cand(
        {"text": "Thinking about Vienna.", "thought": True},
        {"text": "Calling the tool."},
        {"functionCall": {"name": "get_weather", "args": {"city": "Wien"}}},
        finish="STOP",
        index=0,
    ),
    usage=usage(20, 11, 40, cachedContentTokenCount=16),
)


def test_generate_content_json_answer_is_complete():
    body = json.dumps(GENERATED, indent=2).encode()
    row = audit(body, path=STUDIO_GENERATE, event_stream=False)
    assert row["status"] == "completed" and row["findings"] == []
    assert row["output_text"] == "Calling the tool."
    assert choice(row, 0)["reasoning"] == "Thinking about Vienna."
    assert row["tool_calls"] == [{"id": None, "name": "get_weather", "arguments": '{"city":"Wien"}'}]
    assert (
        row["input_tokens"],
        row["output_tokens"],
        row["reasoning_output_tokens"],
        row["cache_read_input_tokens"],
    ) == (20, 11, 40, 16)
    assert (row["response_model"], row["response_id"], row["finish_reasons"]) == (
        "gemini-2.5-flash-001",
        "resp-1",
        ["STOP"],
    )


def test_response_that_is_not_json_is_a_finding():
    row = audit(b"<html>oops</html>", path=STUDIO_GENERATE, event_stream=False)
    assert codes(row) == ["response_invalid_json"] and row["status"] == "upstream_aborted"


ARRAY_CHUNKS = [
    chunk(cand({"text": "Das Wetter"}), usage=usage(12, 2)),
    chunk(cand({"text": " in Wien: 24°C, "}), usage=usage(12, 7)),
    chunk(cand({"text": "sonnig ☀️."}, finish="STOP", index=0), usage=usage(12, 9, 30)),
]


def test_json_array_stream_gives_the_same_record_as_the_event_stream():
    body = array(*ARRAY_CHUNKS)
    row = audit(body, list(range(1, len(body), 5)), event_stream=False)
    expected = audit(sse(*ARRAY_CHUNKS))
    for key in (
        "status",
        "output_text",
        "output",
        "tool_calls",
        "finish_reasons",
        "input_tokens",
        "output_tokens",
        "reasoning_output_tokens",
        "response_model",
        "response_id",
        "findings",
    ):
        assert row[key] == expected[key], key
    assert row["status"] == "completed"


def test_json_array_without_a_finish_reason_reports_missing_stream_end():
    row = audit(array(*ARRAY_CHUNKS[:2]), event_stream=False)
    assert row["output_text"] == "Das Wetter in Wien: 24°C, "
    assert (row["status"], codes(row)) == ("upstream_aborted", ["missing_stream_end"])


def test_cut_json_array_keeps_every_element_before_the_cut():
    body = array(*ARRAY_CHUNKS)
    ends = [i for i in range(len(body)) if body.startswith(b",\r\n", i)] + [len(body) - 1]  # after each element
    texts = [c["candidates"][0]["content"]["parts"][0]["text"] for c in ARRAY_CHUNKS]
    for cut in range(1, len(body)):
        row = audit(body[:cut], event_stream=False, outcome=OUTCOME_UPSTREAM_ABORTED)
        whole = sum(1 for e in ends if e <= cut)
        assert row["output_text"] == "".join(texts[:whole]), cut
        assert (row["status"], codes(row)) == ("upstream_aborted", ["missing_stream_end"]), cut


def test_cut_json_array_after_the_final_element_is_still_not_complete():
    body = array(*ARRAY_CHUNKS)
    row = audit(body[:-1], event_stream=False, outcome=OUTCOME_UPSTREAM_ABORTED)
    assert row["output_text"] == TEXT_ANSWER and row["finish_reasons"] == ["STOP"]
    assert codes(row) == ["missing_stream_end"]


def test_json_array_with_a_streamed_call_cut_off_keeps_it_incomplete():
    body = array(*streamed_call())
    row = audit(body[: body.rindex(b"}") - 3], event_stream=False, outcome=OUTCOME_UPSTREAM_ABORTED)
    assert row["tool_calls"][0]["name"] == "get_weather"
    assert sorted(codes(row)) == ["missing_stream_end", "tool_call_truncated"]


def test_cut_json_array_with_numbers_beyond_64_bits_still_encodes_the_arguments():
    call = b'{"candidates": [{"content": {"parts": [{"functionCall": {"name": "f", "args": {"n": 123456789012345678901234567890}}}]}}]}'
    row = audit(b"[" + call + b",\n{", event_stream=False, outcome=OUTCOME_UPSTREAM_ABORTED)
    assert row["tool_calls"] == [{"id": None, "name": "f", "arguments": '{"n":123456789012345678901234567890}'}]
    assert codes(row) == ["missing_stream_end"]


def test_json_array_elements_that_are_not_objects_are_findings():
    body = b"[1, " + json.dumps(ARRAY_CHUNKS[2]).encode() + b"]"
    row = audit(body, event_stream=False)
    assert codes(row) == ["response_invalid_json"] and row["output_text"] == "sonnig ☀️."


def test_json_array_error_element_fails_the_exchange():
    body = array(ARRAY_CHUNKS[0], {"error": {"code": 503, "message": "Overloaded.", "status": "UNAVAILABLE"}})
    row = audit(body, event_stream=False)
    assert (row["status"], row["error_code"], row["output_text"]) == ("failed", "UNAVAILABLE", "Das Wetter")


def test_gzip_encoded_json_array_is_read_through_the_decoder():
    packed = gzip.compress(array(*ARRAY_CHUNKS))
    row = audit(packed, list(range(1, len(packed), 9)), event_stream=False, encoding="gzip")
    assert row["output_text"] == TEXT_ANSWER and row["status"] == "completed"


# -- the shared reference recordings, when present -----------------------------------------------


def _shared(name: str) -> tuple[dict, bytes, str, dict | None]:
    expected = orjson.loads((SHARED_STREAMS / "expected.json").read_bytes())[name]
    source = next(s for s in orjson.loads((SHARED_STREAMS / "sources.json").read_bytes()) if s["file"] == name)
    url = source["request"]["url"]
    path = url.split("googleapis.com", 1)[1].partition("?")[0]
    request = orjson.loads(source["request"]["body"])
    return expected, (SHARED_STREAMS / name).read_bytes(), path, request


def _check_shared(row: dict, expected: dict) -> None:
    assert row["status"] == "completed"
    assert row["findings"] == []
    assert row["output_text"] == expected["text"]
    assert choice(row, 0).get("reasoning", "") == expected["thought_text"]
    assert row["response_model"] == expected["model_version"]
    assert row["response_id"] == expected["response_id"]
    assert expected["finish_reason"] in row["finish_reasons"]
    calls = [(t["id"], t["name"], orjson.loads(t["arguments"])) for t in row["tool_calls"]]
    assert calls == [(t["id"], t["name"], t["args"]) for t in expected["tool_calls"]]
    usage_ = expected["usage"]
    assert (row["input_tokens"], row["output_tokens"], row["reasoning_output_tokens"]) == (
        usage_["input_tokens"],
        usage_["output_tokens"],
        usage_["thoughts_tokens"],
    )


SHARED_NAMES = sorted(p.name for p in SHARED_STREAMS.glob("gemini-*.sse")) if SHARED_STREAMS.exists() else []


@pytest.mark.skipif(not SHARED_STREAMS.exists(), reason="../shared/reference/streams not present")
def test_all_seven_shared_gemini_recordings_are_covered():
    expected = orjson.loads((SHARED_STREAMS / "expected.json").read_bytes())
    assert sorted(k for k in expected if k.startswith("gemini-")) == SHARED_NAMES and len(SHARED_NAMES) == 7


@pytest.mark.skipif(not SHARED_STREAMS.exists(), reason="../shared/reference/streams not present")
@pytest.mark.parametrize("name", SHARED_NAMES)
def test_shared_gemini_recordings_match_their_expected_extraction(name):
    expected, body, path, request = _shared(name)
    for chunks in (None, list(range(1, len(body)))):
        row = audit(body, chunks, path=path, request=request)
        _check_shared(row, expected)
        assert row["event_count"] == expected["sse_events"]
        assert row["request_model"] == path.rpartition(":")[0].rpartition("/")[2]


@pytest.mark.skipif(not SHARED_STREAMS.exists(), reason="../shared/reference/streams not present")
@pytest.mark.parametrize("name", SHARED_NAMES)
def test_shared_gemini_recordings_as_a_json_array_give_the_same_extraction(name):
    expected, body, path, request = _shared(name)
    chunks = [orjson.loads(line[len(b"data: ") :]) for line in body.split(b"\r\n") if line.startswith(b"data: ")]
    row = audit(
        b"[" + b",\n".join(orjson.dumps(c) for c in chunks) + b"]", path=path, request=request, event_stream=False
    )
    _check_shared(row, expected)


@pytest.mark.skipif(not SHARED_STREAMS.exists(), reason="../shared/reference/streams not present")
def test_shared_recording_model_in_the_url_differs_from_model_version():
    expected, body, path, request = _shared("gemini-text.sse")
    row = audit(body, path=path, request=request)
    assert (row["request_model"], row["response_model"]) == ("gemini-3-pro-preview", "gemini-3.1-pro-preview")
