"""The LMSP 1.0 dialect, sans-IO: detection, Responses-style extraction, event ids,
resumption of task event streams without counting replayed events twice.

LMSP has no public recordings: the fixtures are the specification's examples
(``tests/fixtures/responses/``, see the README there) and streams built inline.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import orjson
import pytest
from pipeline import audit_bytes

from addon.dialects import RequestView
from addon.dialects.lmsp import DIALECT, LMSP, TaskProgress, event_id
from addon.dialects.registry import detect_request, detect_response
from addon.framing.sse import SSEEvent
from addon.record import OUTCOME_CLIENT_ABORTED, OUTCOME_COMPLETE, OUTCOME_UPSTREAM_ABORTED

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "responses"
SPEC_STREAM = (FIXTURES / "lmsp-spec-stream.sse").read_bytes()
SPEC_SYNC = (FIXTURES / "lmsp-spec-sync-response.json").read_bytes()
SPEC_CALL = (FIXTURES / "lmsp-spec-function-call-response.json").read_bytes()
CALL_STREAM = (FIXTURES / "lmsp-function-call-stream.sse").read_bytes()
SPEC_TEXT = "A local model service is a resident interface layer."
RESP_ID = "resp_01J8M6Q4W2T7N5R3V9X1Z8B0DF"
MSG_ID = "msg_01J8M6Q4W5C8H2K9P3S7Y1A6ZE"

REQUEST = {
    "model": "qwen3:14b-q4_k_m",
    "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Describe it."}]}],
    "stream": True,
    "tools": [{"type": "function", "name": "get_weather", "description": "Weather.", "parameters": {"type": "object"}}],
}


def view(
    method: str = "POST", path: str = "/lmsp/v1/responses", query: str = "", headers: dict | None = None
) -> RequestView:
    return RequestView(method, path, query, {k.lower(): v for k, v in (headers or {}).items()})


def events_view(task_id: str, query: str = "", headers: dict | None = None) -> RequestView:
    return view("GET", f"/lmsp/v1/tasks/{task_id}/events", query, headers)


def ev(id_: int | str | None, name: str, **data) -> bytes:
    """One LMSP event: ``id``, ``event`` and a JSON data object (no ``type`` inside)."""
    head = "" if id_ is None else f"id: {id_}\n"
    return f"{head}event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def delta(id_: int, text: str) -> bytes:
    return ev(id_, "response.output_text.delta", response_id=RESP_ID, item_id=MSG_ID, delta=text)


# -- the pipeline ----------------------------------------------------------------------------------


def run(
    body: bytes,
    chunks: list[int] | None = None,
    *,
    dialect: LMSP = DIALECT,
    request: dict | None = REQUEST,
    request_view: RequestView | None = None,
    outcome: str = OUTCOME_COMPLETE,
    status: int = 200,
    event_stream: bool = True,
) -> dict:
    """Feed ``body`` split at ``chunks`` through the auditor with ``dialect``; return the row."""
    return audit_bytes(
        dialect,
        body,
        chunks,
        request=request,
        request_view=request_view or view(),
        outcome=outcome,
        status=status,
        event_stream=event_stream,
        provider=dialect.provider_for("models.example.net"),
    )


def run_body(body: bytes, status: int = 200, **kwargs) -> dict:
    return run(body, event_stream=False, status=status, **kwargs)


def codes(row: dict) -> list[str]:
    return [f["code"] for f in row["findings"]]


# -- detection --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method, path",
    [
        ("POST", "/lmsp/v1/responses"),
        ("POST", "/gateway/tenant-a/lmsp/v1/responses"),
        ("GET", "/lmsp/v1/responses/resp_01J8M6Q4W2T7N5R3V9X1Z8B0DF"),
        ("GET", "/lmsp/v1/tasks/task_01J8/events"),
        ("GET", "/prefix/lmsp/v1/tasks/task_01J8/events/"),
    ],
)
def test_lmsp_endpoints_are_detected_by_their_path(method, path):
    assert detect_request(view(method, path), lambda: REQUEST if method == "POST" else None) is DIALECT


@pytest.mark.parametrize(
    "method, path",
    [
        ("GET", "/lmsp/v1/tasks/task_1"),
        ("POST", "/lmsp/v1/tasks"),
        ("GET", "/lmsp/v1/models"),
        ("GET", "/lmsp/v1/responses"),
        ("GET", "/lmsp/v1/responses/resp_1/extra"),
        ("DELETE", "/lmsp/v1/responses/resp_1"),
        ("POST", "/v1/responses"),
        ("POST", "/lmsp/v2/responses"),
    ],
)
def test_other_requests_are_not_lmsp(method, path):
    assert not DIALECT.matches(view(method, path))


def test_lmsp_path_is_not_claimed_by_openai_responses_whatever_the_order():
    from addon.dialects.openai_responses import DIALECT as OPENAI

    assert not OPENAI.matches(view("POST", "/lmsp/v1/responses"))
    assert detect_request(view("POST", "/lmsp/v1/responses"), lambda: REQUEST) is DIALECT


def test_unclaimed_stream_is_claimed_by_an_lmsp_response_created_first_event():
    first = SSEEvent("response.created", json.dumps({"response_id": RESP_ID, "status": "in_progress"}), "1", None)
    assert detect_response(first) is DIALECT
    nested = SSEEvent("response.created", '{"type":"response.created","response":{"id":"resp_1"}}', "", None)
    assert not DIALECT.sniff(nested)


def test_request_summary_model_stream_tools_and_task_id():
    summary = DIALECT.summarize(REQUEST, view())
    assert (summary.model, summary.stream, summary.task_id) == ("qwen3:14b-q4_k_m", True, None)
    assert summary.declared_tools == frozenset({"get_weather"})
    task = DIALECT.summarize(None, events_view("task_7", "after=2"))
    assert (task.task_id, task.stream, task.resume_after) == ("task_7", True, 2)
    assert DIALECT.summarize(None, view("GET", "/lmsp/v1/responses/resp_1")).task_id is None


@pytest.mark.parametrize(
    "query, headers, expected",
    [
        ("", {}, None),
        ("", {"Last-Event-ID": "4"}, 4),
        ("after=2", {}, 2),
        ("after=2", {"Last-Event-ID": "4"}, 2),  # after wins
        ("after=0", {}, 0),
    ],
)
def test_resume_point_is_after_else_last_event_id(query, headers, expected):
    summary = DIALECT.summarize(None, events_view("t", query, headers))
    assert summary.resume_after == expected and summary.findings == []


def test_resume_point_that_is_not_an_event_id_is_a_request_finding():
    summary = DIALECT.summarize(None, events_view("t", "after=abc"))
    assert summary.resume_after is None and [f.code for f in summary.findings] == ["request_invalid_field"]


def test_event_id_parsing():
    assert [event_id(v) for v in ("1", "42", "0", "-1", "1.5", "", " 3", "٣", "9" * 19)] == [1, 42] + [None] * 7


# -- the spec's examples --------------------------------------------------------------------------------


def test_spec_stream_gives_text_response_id_usage_and_completed():
    row = run(SPEC_STREAM)
    assert row["status"] == "completed"
    assert row["output_text"] == SPEC_TEXT  # output_item.done repeats it: not appended again
    assert row["response_id"] == RESP_ID
    assert (row["input_tokens"], row["output_tokens"]) == (28, 12)
    assert row["finish_reasons"] == ["completed"]
    assert (row["event_count"], row["findings"], row["dialect"], row["provider"]) == (6, [], "lmsp", "lmsp")


def test_spec_sync_response_object():
    row = run_body(SPEC_SYNC, request=REQUEST | {"stream": False})
    assert row["status"] == "completed"
    assert row["output_text"].startswith("A local model service is a resident interface layer that discovers")
    assert (row["response_id"], row["response_model"]) == (RESP_ID, "qwen3:14b-q4_k_m")
    assert (row["input_tokens"], row["output_tokens"], row["finish_reasons"]) == (28, 31, ["completed"])
    assert row["findings"] == []


def test_spec_function_call_response_and_its_stream():
    expected = [{"id": "call_01J8M7B3N9T2V5X8Z1C4D7F0HM", "name": "get_weather", "arguments": '{"city":"Hangzhou"}'}]
    for row in (run_body(SPEC_CALL), run(CALL_STREAM)):
        assert row["tool_calls"] == expected
        assert row["output"]["tool_calls"][0]["complete"] is True
        assert (row["input_tokens"], row["output_tokens"]) == (74, 18)
        assert row["findings"] == [] and row["status"] == "completed"


def test_a_call_to_an_undeclared_tool_is_reported():
    row = run(CALL_STREAM, request=REQUEST | {"tools": []})
    assert codes(row) == ["undeclared_tool"]


def test_reasoning_summary_item_is_reasoning_not_answer_text():
    reasoning = {"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "Think first."}]}
    body = b"".join(
        [
            ev(1, "response.created", response_id=RESP_ID, status="in_progress"),
            ev(2, "response.output_item.added", response_id=RESP_ID, output_index=0, item=reasoning | {"summary": []}),
            ev(3, "response.output_item.done", response_id=RESP_ID, output_index=0, item=reasoning),
            ev(
                4,
                "response.completed",
                response_id=RESP_ID,
                status="completed",
                usage={"input_tokens": 1, "output_tokens": 2},
            ),
        ]
    )
    row = run(body)
    assert row["output"]["choices"][0]["reasoning"] == "Think first." and row["output_text"] == ""


# -- final events and errors --------------------------------------------------------------------------------


def start(n: int = 2) -> bytes:
    return ev(1, "response.created", response_id=RESP_ID, status="in_progress") + b"".join(
        delta(i, f"t{i} ") for i in range(2, n + 1)
    )


def test_response_incomplete_gives_its_reason_and_usage():
    body = start(3) + ev(
        4,
        "response.incomplete",
        response_id=RESP_ID,
        status="incomplete",
        incomplete_details={"reason": "max_output_tokens"},
        usage={"input_tokens": 5, "output_tokens": 2},
    )
    row = run(body)
    assert (row["status"], row["finish_reasons"], row["output_tokens"]) == ("completed", ["max_output_tokens"], 2)


def test_response_cancelled_is_a_final_event():
    row = run(start() + ev(3, "response.cancelled", response_id=RESP_ID, status="cancelled"))
    assert (row["status"], row["finish_reasons"], row["findings"]) == ("completed", ["cancelled"], [])


def test_response_failed_carries_a_problem_object():
    problem = {
        "type": "https://lmsp.example/errors/model_crashed",
        "title": "Model crashed",
        "status": 500,
        "detail": "The runtime stopped.",
        "code": "model_crashed",
    }
    row = run(start() + ev(3, "response.failed", response_id=RESP_ID, status="failed", error=problem))
    assert (row["status"], row["error_code"], row["error_message"]) == (
        "failed",
        "model_crashed",
        "The runtime stopped.",
    )
    assert row["findings"] == []


def test_error_event_is_final_and_fails_the_exchange():
    problem = {"type": "about:blank", "title": "Service overloaded", "status": 503, "code": "overloaded"}
    row = run(start() + ev(3, "error", error=problem))
    assert (row["status"], row["error_code"], row["error_message"]) == ("failed", "overloaded", "Service overloaded")
    assert row["output_text"] == "t2 " and row["findings"] == []


def test_problem_without_code_takes_the_last_segment_of_its_type():
    row = run(start() + ev(3, "error", error={"type": "https://lmsp.example/errors/quota_exceeded", "title": "Quota"}))
    assert row["error_code"] == "quota_exceeded"


@pytest.mark.parametrize(
    "status, body, code",
    [
        (
            410,
            {
                "type": "https://madeforagent.com/lmsp/errors/event_history_expired",
                "title": "Gone",
                "status": 410,
                "detail": "Events before 2 are no longer kept.",
                "code": "event_history_expired",
            },
            "event_history_expired",
        ),
        (
            410,
            {"type": "https://madeforagent.com/lmsp/errors/event_history_expired", "title": "Gone", "status": 410},
            "event_history_expired",
        ),
        (
            404,
            {"type": "about:blank", "title": "Not found", "status": 404, "code": "response_not_found"},
            "response_not_found",
        ),
        (
            400,
            {"error": {"type": "about:blank", "title": "Bad", "status": 400, "code": "unsupported_capability"}},
            "unsupported_capability",
        ),
    ],
)
def test_http_problem_documents_give_the_code(status, body, code):
    row = run_body(orjson.dumps(body), status, request=None, request_view=events_view("gone-task", "after=2"))
    assert (row["status"], row["error_code"], row["task_id"]) == ("failed", code, "gone-task")
    assert row["error_message"]


def test_http_error_body_that_is_not_json():
    row = run_body(b"Bad Gateway", 502)
    assert (row["status"], row["error_message"]) == ("failed", "Bad Gateway")


def test_stream_cut_mid_way_keeps_partial_text():
    cut = SPEC_STREAM.index(b"id: 5")
    row = run(SPEC_STREAM[: cut + 3], outcome=OUTCOME_UPSTREAM_ABORTED)
    assert (row["status"], row["output_text"]) == ("upstream_aborted", SPEC_TEXT)
    assert "missing_stream_end" in codes(row)


def test_unknown_events_are_ignored_and_events_after_the_final_one_reported():
    body = SPEC_STREAM.replace(
        b"id: 5\n", ev(5, "response.audio.delta", response_id=RESP_ID, delta="AAAA") + b"id: 6\n"
    )
    body = body.replace(b"id: 6\nevent: response.completed", b"id: 7\nevent: response.completed")
    assert run(body)["findings"] == []
    assert "event_after_stream_end" in codes(run(SPEC_STREAM + delta(7, "late")))


# -- event ids --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, expected",
    [
        (
            ev(None, "response.created", response_id=RESP_ID) + ev(None, "response.completed", response_id=RESP_ID),
            "event_id_invalid",
        ),
        (start() + ev("x3", "response.completed", response_id=RESP_ID), "event_id_invalid"),
        (start() + ev("3.0", "response.completed", response_id=RESP_ID), "event_id_invalid"),
        (ev(0, "response.created", response_id=RESP_ID), "event_id_invalid"),
        (ev(2, "response.created", response_id=RESP_ID), "event_id_invalid"),  # a fresh stream starts at 1
        (start(3) + delta(3, "again"), "event_id_not_increasing"),
        (start(3) + delta(2, "back"), "event_id_not_increasing"),
        (
            start(2) + ev(None, "response.completed", response_id=RESP_ID),
            "event_id_not_increasing",
        ),  # persists: 2 again
    ],
)
def test_event_id_problems_are_reported(body, expected):
    assert expected in codes(run(body))


def test_event_ids_may_skip_numbers():
    body = start(2) + delta(5, "x") + ev(9, "response.completed", response_id=RESP_ID, status="completed")
    assert run(body)["findings"] == []


def test_event_id_findings_are_lmsp_only():
    from addon.dialects import RequestSummary
    from addon.dialects.openai_responses import DIALECT as OPENAI

    normalizer = OPENAI.normalizer(RequestSummary())
    data = '{"type":"response.created","sequence_number":0,"response":{"id":"resp_1"}}'
    out = normalizer.on_event(SSEEvent("response.created", data, "", None))
    assert not [e for e in out if getattr(e, "code", "").startswith("event_id")]


# -- resumption ----------------------------------------------------------------------------------------------------


def test_task_events_request_sets_the_task_id():
    row = run(SPEC_STREAM, dialect=LMSP(), request=None, request_view=events_view("task_A"))
    assert (row["task_id"], row["output_text"], row["findings"]) == ("task_A", SPEC_TEXT, [])


def _spec_events() -> list[bytes]:
    return [b + b"\n\n" for b in SPEC_STREAM.split(b"\n\n") if b]


def test_resumed_task_stream_does_not_count_replayed_events_twice():
    """Exchange 1 audits ids 1-4 and drops; the client resumes after 2: 3 and 4 come again."""
    dialect = LMSP()
    events = _spec_events()
    first = run(
        b"".join(events[:4]),
        dialect=dialect,
        request=None,
        request_view=events_view("task_1"),
        outcome=OUTCOME_CLIENT_ABORTED,
    )
    second = run(
        b"".join(events[2:]),
        dialect=dialect,
        request=None,
        request_view=events_view("task_1", headers={"Last-Event-ID": "2"}),
    )
    assert first["output_text"] == SPEC_TEXT and first["status"] == "client_aborted"
    assert second["output_text"] == ""  # 3 and 4 were audited by the first exchange; 5 repeats them whole
    assert (second["input_tokens"], second["output_tokens"]) == (28, 12)  # usage counted once, here
    assert first["input_tokens"] is None
    assert (second["status"], second["response_id"], second["finish_reasons"]) == ("completed", RESP_ID, ["completed"])
    assert (first["task_id"], second["task_id"]) == ("task_1", "task_1")
    assert second["findings"] == [] and first["findings"] == [
        {"code": "missing_stream_end", "detail": "the stream ended without its terminal event"}
    ]
    assert (second["event_count"], second["replayed_events"]) == (2, 2)  # ids 3 and 4 were audited before


def test_resumed_stream_counts_the_new_part_of_a_half_audited_item():
    """Exchange 1 audited ids 1-3 only; the client had 2: 3 is replayed, 4 is new."""
    dialect = LMSP()
    events = _spec_events()
    first = run(
        b"".join(events[:3]),
        dialect=dialect,
        request=None,
        request_view=events_view("task_2"),
        outcome=OUTCOME_CLIENT_ABORTED,
    )
    second = run(b"".join(events[2:]), dialect=dialect, request=None, request_view=events_view("task_2", "after=2"))
    assert first["output_text"] + second["output_text"] == SPEC_TEXT
    assert second["output_text"] == "service is a resident interface layer."


def test_resumed_stream_takes_a_function_call_whose_done_event_is_new():
    dialect = LMSP()
    events = [b + b"\n\n" for b in CALL_STREAM.split(b"\n\n") if b]
    first = run(
        b"".join(events[:2]),
        dialect=dialect,
        request=None,
        request_view=events_view("task_3"),
        outcome=OUTCOME_UPSTREAM_ABORTED,
    )
    second = run(b"".join(events[2:]), dialect=dialect, request=None, request_view=events_view("task_3", "after=2"))
    assert first["tool_calls"] == [{"id": "call_01J8M7B3N9T2V5X8Z1C4D7F0HM", "name": "get_weather", "arguments": ""}]
    assert "tool_call_truncated" in codes(first)  # the first exchange never saw it whole
    assert second["tool_calls"] == [
        {"id": "call_01J8M7B3N9T2V5X8Z1C4D7F0HM", "name": "get_weather", "arguments": '{"city":"Hangzhou"}'}
    ]
    assert second["findings"] == []


def test_a_stream_replayed_entirely_records_no_content_but_its_own_ending():
    dialect = LMSP()
    run(SPEC_STREAM, dialect=dialect, request=None, request_view=events_view("task_4"))
    again = run(SPEC_STREAM, dialect=dialect, request=None, request_view=events_view("task_4"))
    assert (again["output_text"], again["input_tokens"], again["tool_calls"]) == ("", None, [])
    assert (again["status"], again["response_id"], again["findings"]) == ("completed", RESP_ID, [])


def test_other_tasks_and_post_streams_are_not_skipped():
    dialect = LMSP()
    run(SPEC_STREAM, dialect=dialect, request=None, request_view=events_view("task_5"))
    assert (
        run(SPEC_STREAM, dialect=dialect, request=None, request_view=events_view("task_6"))["output_text"] == SPEC_TEXT
    )
    assert run(SPEC_STREAM, dialect=dialect)["output_text"] == SPEC_TEXT
    assert run(SPEC_STREAM, dialect=dialect)["output_text"] == SPEC_TEXT  # POST streams cannot be resumed


def test_replay_of_events_the_client_already_had_is_reported():
    events = _spec_events()
    row = run(b"".join(events[1:]), dialect=LMSP(), request=None, request_view=events_view("task_7", "after=2"))
    assert ("event_id_not_increasing", "id 2 replayed although the client asked for events after 2") in [
        (f["code"], f["detail"]) for f in row["findings"]
    ]


def test_resumed_stream_may_start_after_one():
    events = _spec_events()
    row = run(b"".join(events[3:]), dialect=LMSP(), request=None, request_view=events_view("task_8", "after=3"))
    # delta 4 is new here; the message was opened earlier, so its done event fills nothing in
    assert row["findings"] == [] and row["output_text"] == "service is a resident interface layer."


def test_resumed_stream_whose_beginning_was_never_audited_fills_in_from_done_events():
    # The proxy never saw ids 1-4 (restarted, or the task was forgotten): the item's
    # done event is the only place its text can be recorded from.
    events = _spec_events()
    row = run(b"".join(events[4:]), dialect=LMSP(), request=None, request_view=events_view("task_9", "after=4"))
    assert (row["output_text"], row["input_tokens"], row["findings"]) == (SPEC_TEXT, 28, [])


def test_task_memory_is_bounded_least_recently_used_first():
    progress = TaskProgress(size=3)
    for task in ("a", "b", "c"):
        progress.advance(task, 5)
    progress.advance("a", 6)  # a is used again
    progress.advance("d", 1)
    assert len(progress) == 3 and progress.get("b") is None
    assert (progress.get("a"), progress.get("c"), progress.get("d")) == (6, 5, 1)
    progress.advance("a", 2)  # never lowers
    assert progress.get("a") == 6


def test_a_forgotten_task_is_counted_again():
    dialect = LMSP(task_memory=1)
    run(SPEC_STREAM, dialect=dialect, request=None, request_view=events_view("old"))
    run(SPEC_STREAM, dialect=dialect, request=None, request_view=events_view("new"))
    assert run(SPEC_STREAM, dialect=dialect, request=None, request_view=events_view("old"))["output_text"] == SPEC_TEXT


# -- splits --------------------------------------------------------------------------------------------------------


def test_record_is_the_same_for_every_two_way_split_and_byte_at_a_time():
    whole = run(SPEC_STREAM)
    for cut in range(1, len(SPEC_STREAM)):
        assert run(SPEC_STREAM, [cut]) == whole, cut
    assert run(SPEC_STREAM, list(range(1, len(SPEC_STREAM)))) == whole


def test_resumption_is_the_same_for_random_splits_and_crlf():
    events = [e.replace(b"\n", b"\r\n") for e in _spec_events()]
    one, two = b"".join(events[:3]), b"".join(events[2:])

    def scenario(rng: random.Random | None) -> tuple[dict, dict]:
        dialect = LMSP()
        cuts = (
            (lambda body: sorted(rng.sample(range(1, len(body)), min(len(body) - 1, rng.randint(1, 15)))))
            if rng
            else (lambda body: None)
        )
        a = run(
            one, cuts(one), dialect=dialect, request=None, request_view=events_view("t"), outcome=OUTCOME_CLIENT_ABORTED
        )
        b = run(two, cuts(two), dialect=dialect, request=None, request_view=events_view("t", "after=2"))
        return a, b

    whole = scenario(None)
    assert whole[0]["output_text"] + whole[1]["output_text"] == SPEC_TEXT
    rng = random.Random(5)
    for _ in range(100):
        assert scenario(rng) == whole
