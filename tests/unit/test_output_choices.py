"""A row's choices with their texts: choice 0's text is stored once, as ``output_text``."""

from __future__ import annotations

from addon.events import Finish, StreamEnd, TextDelta, ToolCallDelta
from addon.record import OUTCOME_COMPLETE, ExchangeRecord
from exchange import transcript
from exchange.transcript import output_choices, output_tool_calls


def record() -> ExchangeRecord:
    r = ExchangeRecord(dialect="openai-chat")
    for text, choice in (("Par", 0), ("Lon", 1), ("is", 0), ("don", 1)):
        r.apply(TextDelta(text, choice=choice))
    r.apply(TextDelta("think", kind="reasoning"))
    r.apply(ToolCallDelta(key="a", id="c1", name="write", arguments='{"file": "'))
    r.apply(ToolCallDelta(key="a", arguments='x"}', complete=True))
    r.apply(ToolCallDelta(key="b", id="c2", name="read", arguments="{}"))
    r.apply(Finish("stop"))
    r.apply(StreamEnd())
    r.finish(OUTCOME_COMPLETE)
    return r


def test_the_row_stores_choice_zero_text_once_and_reads_back_every_choice_whole():
    row = record().to_row()
    assert row["output_text"] == "Paris" and [set(c) for c in row["output"]["choices"]][0] == {
        "index",
        "reasoning",
        "finish_reason",
    }
    assert [(c["index"], c["text"]) for c in output_choices(row)] == [(0, "Paris"), (1, "London")]
    assert output_choices(row)[0]["reasoning"] == "think"
    assert [(c.index, c.text) for c in transcript.choices(row)] == [(0, "Paris"), (1, "London")]


def test_the_row_stores_tool_call_arguments_once_and_reads_them_back():
    row = record().to_row()
    assert row["output"]["tool_calls"] == [
        {"id": "c1", "name": "write", "complete": True},
        {"id": "c2", "name": "read", "complete": False},
    ]
    assert [(c["id"], c["arguments"], c["complete"]) for c in output_tool_calls(row)] == [
        ("c1", '{"file": "x"}', True),
        ("c2", "{}", False),
    ]
    assert [(c.name, c.arguments, c.complete) for c in transcript.tool_calls(row)][1] == ("read", "{}", False)


def test_rows_written_before_keep_their_own_text():
    row = {"output_text": "Paris", "output": {"choices": [{"index": 0, "text": "Paris"}, {"index": 1, "text": "x"}]}}
    assert [c["text"] for c in output_choices(row)] == ["Paris", "x"]


def test_rows_written_before_keep_their_own_arguments():
    row = {"output": {"tool_calls": [{"id": "c1", "arguments": "{}", "complete": True}]}, "tool_calls": []}
    assert output_tool_calls(row) == [{"id": "c1", "arguments": "{}", "complete": True}]


def test_hostile_rows_are_read_without_error_or_invention():
    assert output_choices({"output": "text"}) == [] and output_choices({"output": {"choices": "no"}}) == []
    row = {"output_text": 7, "output": {"choices": [None, "x", {"index": False}, {"index": 0}, {"index": "0"}]}}
    assert output_choices(row) == [{"index": False}, {"index": 0, "text": ""}, {"index": "0"}]
    calls = {"output": {"tool_calls": [{"id": "a"}, {"id": "b"}]}, "tool_calls": [{"arguments": "x"}]}
    assert output_tool_calls(calls) == [{"id": "a", "arguments": None}, {"id": "b", "arguments": None}]
    assert output_tool_calls(
        {"output": {"tool_calls": [None, {"id": "a"}]}, "tool_calls": [{"arguments": "x"}, 5]}
    ) == [{"id": "a", "arguments": None}]
