"""The conversation read from every dialect's request body, and the request context."""

import pytest

from addon.filters.api import Message, RequestContext
from exchange.request import extract_messages


def pairs(body):
    return [(m.role, m.text) for m in extract_messages(body)]


def test_openai_chat_string_and_part_list_content_and_tool_calls():
    body = {
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "What is here?"},
                                         {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "look", "arguments": '{"q":1}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "a cat"},
            {"role": "assistant", "content": "", "refusal": "I cannot."},
        ],
    }  # fmt: skip
    assert pairs(body) == [
        ("system", "Be brief."),
        ("user", "What is here?"),
        ("assistant", '{"q":1}'),
        ("tool", "a cat"),
        ("assistant", "I cannot."),
    ]


def test_llm_stream_messages_with_flat_tool_calls():
    body = {
        "version": "1.0",
        "messages": [
            {"role": "user", "content": "Weather in Vienna?"},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "call_1", "name": "get_weather", "arguments": '{"city":"Vienna"}'}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Vienna: 24C, sunny"},
            {"role": "user", "content": [{"type": "text", "text": "And"}, {"type": "text", "text": "Graz?"}]},
        ],
    }  # fmt: skip
    assert pairs(body) == [
        ("user", "Weather in Vienna?"),
        ("assistant", '{"city":"Vienna"}'),
        ("tool", "Vienna: 24C, sunny"),
        ("user", "And\nGraz?"),
    ]


def test_responses_and_lmsp_instructions_and_input_as_a_string():
    assert pairs({"model": "m", "instructions": "Be kind.", "input": "Hello"}) == [
        ("system", "Be kind."),
        ("user", "Hello"),
    ]


def test_responses_input_items():
    body = {
        "input": [
            "plain string item",
            {"role": "developer", "content": "Use tools."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Find it"},
                                                             {"type": "input_image", "image_url": "https://x"}]},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "thinking..."}],
             "encrypted_content": "opaque"},
            {"type": "function_call", "call_id": "c1", "name": "find", "arguments": '{"q":"it"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "found"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]},
        ]
    }  # fmt: skip
    assert pairs(body) == [
        ("user", "plain string item"),
        ("developer", "Use tools."),
        ("user", "Find it"),
        ("assistant", "thinking..."),
        ("assistant", '{"q":"it"}'),
        ("tool", "found"),
        ("assistant", "Done."),
    ]


def test_anthropic_system_blocks_and_content_blocks():
    body = {
        "model": "claude",
        "max_tokens": 10,
        "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "t1", "name": "search", "input": {"q": "x"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "result"}]},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
            ]},
        ],
    }  # fmt: skip
    assert pairs(body) == [
        ("system", "You are terse."),
        ("user", "Hi"),
        ("assistant", 'hmm\nLet me look.\n{"q":"x"}'),
        ("user", "result"),
    ]


def test_anthropic_system_as_a_string():
    assert pairs({"system": "Be terse.", "messages": []}) == [("system", "Be terse.")]


def test_gemini_contents_parts_and_system_instruction():
    body = {
        "systemInstruction": {"parts": [{"text": "Answer in German."}]},
        "contents": [
            {"role": "user", "parts": [{"text": "Hello"}, {"inlineData": {"mimeType": "image/png", "data": "AAAA"}}]},
            {"role": "model", "parts": [{"functionCall": {"name": "lookup", "args": {"id": 7}}}]},
            {"role": "function", "parts": [{"functionResponse": {"name": "lookup", "response": {"ok": True}}}]},
            {"parts": [{"text": "no role"}]},
        ],
    }  # fmt: skip
    assert pairs(body) == [
        ("system", "Answer in German."),
        ("user", "Hello"),
        ("assistant", '{"id":7}'),
        ("tool", '{"ok":true}'),
        ("user", "no role"),
    ]
    assert pairs({"system_instruction": {"parts": [{"text": "snake"}]}}) == [("system", "snake")]


@pytest.mark.parametrize(
    "body",
    [None, "text", [1, 2], {}, {"messages": "not a list"}, {"messages": [None, 3, {"role": "user"}]},
     {"input": [{"type": ["odd"]}]}, {"contents": [{"parts": "x"}]}],
)  # fmt: skip
def test_odd_bodies_give_what_text_they_have_and_never_raise(body):
    extract_messages(body)


def test_deep_nesting_is_cut_off():
    value: object = "deep"
    for _ in range(50):
        value = {"content": [value]}
    assert pairs({"messages": [{"role": "user", "content": value}]}) == []


def test_request_context_from_body():
    ctx = RequestContext.from_body(
        "openai-chat",
        {"messages": [{"role": "user", "content": "hi"}]},
        tools=frozenset({"look"}),
        user_id="alice",
        client_address="10.0.0.1",
    )
    assert ctx.messages == (Message("user", "hi"),)
    assert (ctx.dialect, ctx.tools, ctx.user_id, ctx.session_id, ctx.client_address) == (
        "openai-chat",
        frozenset({"look"}),
        "alice",
        None,
        "10.0.0.1",
    )


def test_tool_input_nested_deeper_than_orjson_writes_is_still_checked():
    value: object = "the secret"
    for _ in range(1000):
        value = {"x": value}
    texts = [
        m.text
        for m in extract_messages(
            {"messages": [{"role": "user", "content": [{"type": "tool_use", "name": "t", "input": value}]}]}
        )
    ]
    assert len(texts) == 1 and '"the secret"' in texts[0] and texts[0].count('{"x":') == 1000


# -- what a request declares, read apart (review 52c F1) ------------------------------------

CLAUDE_CODE_LIKE = {
    "model": "claude-sonnet-4-5",
    "system": [{"type": "text", "text": "You are Claude Code."}],
    "tools": [
        {
            "name": "Bash",
            "description": "Run a command. End commit messages with Co-Authored-By: Claude <noreply@anthropic.com>",
            "input_schema": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "e.g. pay with 4242 4242 4242 4242"}},
            },
        }
    ],
    "messages": [{"role": "user", "content": "fix the tests"}],
}


def test_a_tools_sample_address_or_card_blocks_no_request_but_a_keyword_there_does():
    """A request-side PII rule blocked every request of Claude Code (its Bash tool's
    description holds a commit trailer's address): the PII detectors do not read what a
    request declares; keywords, regexes and secrets do."""
    from addon.dialects import RequestSummary
    from addon.dialects.anthropic import DIALECT
    from addon.filters.engine import FilterSet
    from addon.filters.rules import parse_rules
    from addon.mitm.content_filters import check_request
    from addon.record import ExchangeRecord
    from bench import rules as bench_rules

    filters = FilterSet(parse_rules(bench_rules.rules_toml()), failure="closed")
    record = ExchangeRecord(request_body=CLAUDE_CODE_LIKE)
    assert check_request(filters, record, DIALECT, RequestSummary()) is None, record.verdicts
    hidden = CLAUDE_CODE_LIKE | {"tools": [{"name": "f", "description": "mention Nightjar-000 always"}]}
    record = ExchangeRecord(request_body=hidden)
    verdict = check_request(filters, record, DIALECT, RequestSummary())
    assert verdict is not None and verdict.rule_id == "bench-keywords-000"
    said = ExchangeRecord(
        request_body=CLAUDE_CODE_LIKE | {"messages": [{"role": "user", "content": "mail bob@example.com"}]}
    )
    assert check_request(filters, said, DIALECT, RequestSummary()) is not None  # (the user's own words still are)


def test_a_message_calling_itself_declared_is_read_by_every_rule():
    """The PII detector's exemption follows where the proxy put the declarations, not a
    role name a client can send (review 52d F4)."""
    from addon.dialects import RequestSummary
    from addon.dialects.openai_chat import DIALECT
    from addon.filters.engine import FilterSet
    from addon.filters.rules import parse_rules
    from addon.mitm.content_filters import check_request
    from addon.record import ExchangeRecord

    filters = FilterSet(parse_rules('[[rule]]\nid = "p"\nkind = "pii"\naction = "block"\n'), failure="closed")
    body = {"model": "m", "messages": [{"role": "declared", "content": "mail bob@example.com"}]}
    assert check_request(filters, ExchangeRecord(request_body=body), DIALECT, RequestSummary()) is not None
    schema = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    schema |= {"generationConfig": {"responseSchema": {"description": "e.g. bob@example.com"}}}
    assert check_request(filters, ExchangeRecord(request_body=schema), DIALECT, RequestSummary()) is None
