"""What used to slip past the output filters, each fed through the gate at many splits.

Every string a client SDK shows a person is checked before any byte carrying it goes
out: the answer in every dialect with invisible characters between the letters of the
blocked word (or in fullwidth letters), OpenAI Chat reasoning under both of its names,
a tool call's name, the upstream's error message, content parts of an unknown type, and
a Responses final text that disagrees with its deltas. For each: the client never gets
a character of the word, the record says why, and a clean variant passes byte for byte.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from test_block_responses import CASES, Reader, codes, sse_events
from test_output_gate import (
    BLOCK_RULES,
    BLOCKING,
    WORD,
    body_of,
    byte_at_a_time,
    client_text,
    every_cut,
    gated,
    some_cuts,
)

from addon.filters.engine import FilterSet
from addon.filters.rules import parse_rules
from mockllm.scenario import Scenario

ZWJ, SHY, ZWSP = "\u200d", "\u00ad", "\u200b"
EVASIONS = {
    "zero-width joiners": ZWJ.join(WORD),
    "soft hyphens": SHY.join(WORD),
    "fullwidth": "".join(chr(ord(c) + 0xFEE0) for c in WORD),
    "mixed": f"N{ZWSP}ｉ{SHY}g{ZWJ}htj{ZWSP}{ZWSP}a{SHY}r",
}


@pytest.mark.parametrize("evasion", EVASIONS)
@pytest.mark.parametrize("name", CASES)
def test_an_evasive_word_cut_across_events_never_reaches_the_client(name: str, evasion: str) -> None:
    case = CASES[name]
    word = EVASIONS[evasion]
    scenario = replace(Scenario.parse("events=14"), text=f"Ask about the {word} plan and more text after it")
    body = body_of(case, scenario)
    full = Reader(case).feed(body).row()["output_text"]
    start = full.index(word)
    splits = [[], byte_at_a_time(body), *some_cuts(body, 3, 10)]
    if name == "openai-chat":
        splits += every_cut(body)
    for cuts in splits:
        sent, row, _ = gated(case, body, cuts, BLOCKING)
        shown = client_text(case, b"".join(sent))
        assert full.startswith(shown) and len(shown) <= start, f"leaked {shown!r} with cuts {cuts}"
        assert [(v["rule_id"], v["position"]) for v in row["verdicts"]] == [("no-code-name", start)]
        assert row["status"] == "blocked" and word in row["output_text"]


# -- OpenAI Chat: strings outside delta.content ----------------------------------------------

CHAT = CASES["openai-chat"]
HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}


def chat(*deltas: dict, error: dict | None = None, finish: str = "stop") -> bytes:
    chunks = [HEAD | {"choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    chunks += (
        [{"error": error}] if error else [HEAD | {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}]
    )
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + (b"" if error else b"data: [DONE]\n\n")


def assert_blocked_everywhere(body: bytes, location: str, secret: str = WORD) -> dict:
    """Blocked at every split (``location`` in the verdict); no byte of ``secret`` reaches the client."""
    row: dict = {}
    for cuts in [[], byte_at_a_time(body), *every_cut(body)]:
        sent, row, _ = gated(CHAT if b"chat.completion" in body else RESPONSES, body, cuts, BLOCKING)
        received = b"".join(sent)
        assert secret.encode() not in received and secret[:4].encode() not in received, cuts
        assert row["status"] == "blocked"
        assert [(v["rule_id"], v["location"]) for v in row["verdicts"]] == [("no-code-name", location)]
    return row


def test_reasoning_under_both_names_is_checked_and_recorded():
    body = chat(
        {"role": "assistant", "content": ""},
        {"reasoning_content": "I think", "reasoning": f" of {WORD}."},
        {"content": "Done."},
    )
    row = assert_blocked_everywhere(body, "output.choices[0].reasoning")  # (before the two texts are interleaved)
    assert row["output"]["choices"][0]["reasoning"] == f"I think of {WORD}."
    clean = chat({"reasoning_content": "I think", "reasoning": "I think"}, {"content": "Done."})
    sent, row, _ = gated(CHAT, clean, [], BLOCKING)
    assert b"".join(sent) == clean and row["output"]["choices"][0]["reasoning"] == "I think"


def test_a_tool_calls_name_is_checked_and_stays_the_calls_name():
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": WORD, "arguments": ""}}
    body = chat(
        {"role": "assistant", "content": None},
        {"tool_calls": [call]},
        {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]},
        finish="tool_calls",
    )
    row = assert_blocked_everywhere(body, "output.tool_calls[0.0].name")
    assert row["output_text"] == "" and row["tool_calls"][0]["name"] == WORD


def test_an_upstream_error_message_is_checked():
    body = chat({"content": "Hello"}, error={"message": f"upstream says {WORD}", "type": "server_error"})
    row = assert_blocked_everywhere(body, "output.error.message")
    assert row["error_code"] == "content_filtered", "the record says the filter stopped it"


def test_content_parts_of_an_unknown_type_are_answer_text_and_a_finding():
    body = chat({"content": [{"type": "output_text", "text": f"the {WORD} plan"}]})
    row = assert_blocked_everywhere(body, "output.choices[0].text")
    assert "unknown_content_part" in codes(row) and WORD in row["output_text"]
    clean = chat({"content": [{"type": "text", "text": "Hi"}, {"type": "image_url", "image_url": {"url": "x"}}]})
    sent, row, _ = gated(CHAT, clean, [], BLOCKING)
    assert b"".join(sent) == clean and (row["output_text"], codes(row)) == ("Hi", [])


def test_a_content_part_nested_past_the_walk_is_the_failure_policy_s():
    """An unknown content part's text nested deeper than the walk reads (6 levels) went
    to the client unread by any filter, silently: now strings_unread, and `closed` blocks."""
    nested: object = f"the {WORD} plan"
    for _ in range(8):
        nested = [nested]
    body = chat({"content": [{"type": "output_text", "text": nested}]})
    for cuts in [[], byte_at_a_time(body)]:
        sent, row, _ = gated(CHAT, body, cuts, BLOCKING)
        assert WORD.encode() not in b"".join(sent) and row["status"] == "blocked"
        assert [v["rule_id"] for v in row["verdicts"]] == ["filter_error"] and "strings_unread" in codes(row)
    sent, row, _ = gated(CHAT, body, [], FilterSet(BLOCK_RULES, failure="open"))
    assert b"".join(sent) == body and "strings_unread" in codes(row)


# -- Responses: a final text that is not what the deltas said ----------------------------------

RESPONSES = CASES["openai-responses"]


def responses(*events: tuple[str, dict]) -> bytes:
    return b"".join(
        f"event: {t}\ndata: {json.dumps({'type': t, 'sequence_number': i, **d})}\n\n".encode()
        for i, (t, d) in enumerate(events)
    )


def message(text: str) -> dict:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def response_stream(final_text: str, completed_text: str) -> bytes:
    created = {"id": "resp_1", "object": "response", "status": "in_progress", "model": "m", "output": []}
    return responses(
        ("response.created", {"response": created}),
        ("response.output_item.added", {"output_index": 0, "item": message("") | {"content": []}}),
        ("response.output_text.delta", {"item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": "Hello"}),
        ("response.output_text.delta", {"item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": " there"}),
        ("response.output_text.done", {"item_id": "msg_1", "output_index": 0, "content_index": 0, "text": final_text}),
        ("response.completed", {"response": created | {"status": "completed", "output": [message(completed_text)]}}),
    )


@pytest.mark.parametrize("where", ["output_text.done", "response.completed"])
def test_a_final_text_that_disagrees_with_the_deltas_is_checked_before_its_release(where: str):
    body = (
        response_stream(f"the {WORD} plan", "Hello there")
        if where == "output_text.done"
        else response_stream("Hello there", f"the {WORD} plan")
    )
    row = assert_blocked_everywhere(body, "output.choices[0].final_text")
    assert row["output_text"] == "Hello there", "the record keeps what a streaming client showed"
    assert "final_text_mismatch" in codes(row)
    sent = b"".join(gated(RESPONSES, body, [], BLOCKING)[0])
    events = [e.event for e in sse_events(sent)]
    assert where not in events and "response.incomplete" in events
    assert WORD.encode() not in sent, "the final response carries the output the client had, not the held text"


def test_a_final_text_that_differs_harmlessly_is_a_finding_and_passes():
    body = response_stream("Hello here", "Hello there")
    sent, row, _ = gated(RESPONSES, body, [], BLOCKING)
    assert b"".join(sent) == body
    assert (row["status"], codes(row), row["output_text"]) == ("completed", ["final_text_mismatch"], "Hello there")


def tool_stream(kind: str, deltas: list[str], final: str) -> bytes:
    """A Responses call item (``function_call``: JSON arguments; ``custom_tool_call``: free-form input)."""
    field, space = (
        ("input", "custom_tool_call_input") if kind == "custom_tool_call" else ("arguments", "function_call_arguments")
    )
    item = {"id": "c_1", "type": kind, "call_id": "call_1", "name": "apply_patch", field: ""}
    created = {"id": "resp_1", "object": "response", "status": "in_progress", "model": "m", "output": []}
    done = item | {field: final, "status": "completed"}
    return responses(
        ("response.created", {"response": created}),
        ("response.output_item.added", {"output_index": 0, "item": item}),
        *((f"response.{space}.delta", {"item_id": "c_1", "output_index": 0, "delta": d}) for d in deltas),
        (f"response.{space}.done", {"item_id": "c_1", "output_index": 0, field: final}),
        ("response.output_item.done", {"output_index": 0, "item": done}),
        ("response.completed", {"response": created | {"status": "completed", "output": [done]}}),
    )


def test_a_custom_tools_input_is_read_as_the_free_text_it_is():
    """Not JSON: no escape is decoded in it (``\\f`` in a path is two characters to the
    tool, ``\\u0061`` in code six); function arguments are JSON and are decoded."""
    unc = parse_rules('[[rule]]\nid = "share"\nkind = "keywords"\nkeywords = ["fs01\\\\finance"]\naction = "block"')
    path = "copy \\\\fs01\\finance\\q3.xlsx to the share"
    sent, row, _ = gated(
        RESPONSES, tool_stream("custom_tool_call", [path[:12], path[12:]], path), [], FilterSet(unc, failure="closed")
    )
    assert row["status"] == "blocked" and [v["rule_id"] for v in row["verdicts"]] == ["share"]
    code = f'print("{WORD[:-2]}\\u0061r")'
    body = tool_stream("custom_tool_call", [code], code)
    sent, row, _ = gated(RESPONSES, body, [], BLOCKING)
    assert b"".join(sent) == body and row["verdicts"] == []
    args = f'{{"about": "{WORD[:-2]}\\u0061r"}}'
    _, row, _ = gated(RESPONSES, tool_stream("function_call", [args], args), [], BLOCKING)
    assert row["status"] == "blocked"


def test_final_arguments_that_differ_from_the_deltas_are_checked():
    body = tool_stream("function_call", ['{"city": "Paris"}'], f'{{"city": "{WORD}"}}')
    _, row, _ = gated(RESPONSES, body, [], BLOCKING)
    assert row["status"] == "blocked" and "final_text_mismatch" in codes(row)


def test_final_arguments_that_differ_are_read_as_the_tool_reads_them():
    """The differing final arguments were checked raw: a JSON escape (``\u004e`` is N)
    hid the word from the filters, not from the tool's json.loads."""
    escaped = f'{{"city": "\\u004e{WORD[1:]}"}}'
    _, row, _ = gated(RESPONSES, tool_stream("function_call", ['{"city": "Paris"}'], escaped), [], BLOCKING)
    assert row["status"] == "blocked" and "final_text_mismatch" in codes(row)


def anthropic(*events: dict) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def test_text_an_anthropic_message_start_carries_is_checked_and_recorded():
    # The SDKs' final message starts from message_start's message, content included
    start = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "stop_reason": None,
        "content": [{"type": "text", "text": f"the {WORD} plan"}],
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }
    body = anthropic(
        {"type": "message_start", "message": start},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}},
        {"type": "message_stop"},
    )
    for cuts in [[], byte_at_a_time(body), *some_cuts(body, seed=7)]:
        sent, row, _ = gated(CASES["anthropic-messages"], body, cuts, BLOCKING)
        assert WORD[:4].encode() not in b"".join(sent), cuts
        assert row["status"] == "blocked" and "message_start_content" in codes(row)
        assert WORD in row["output_text"], "the record has the text the SDKs would have shown"


def test_output_a_responses_lifecycle_event_carries_is_checked():
    # The SDKs' response snapshot is the lifecycle event's response, output included
    created = {
        "id": "resp_1",
        "object": "response",
        "status": "in_progress",
        "model": "m",
        "output": [message(f"the {WORD} plan")],
    }
    body = responses(
        ("response.created", {"response": created}),
        ("response.completed", {"response": created | {"status": "completed", "output": []}}),
    )
    row = assert_blocked_everywhere(body, "output.choices[0].text")
    assert WORD in row["output_text"]
