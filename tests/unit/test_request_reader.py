"""The one reader of request bodies (exchange.request): every dialect's request shape
gives its conversation and its declared tools, and odd bodies give nothing, never an error."""

from __future__ import annotations

import pytest

from exchange.request import Tool, declared_tools, extract_messages, strings_beside, token_prompts, tool_names


def read(body):
    return [(m.role, m.text) for m in extract_messages(body)], declared_tools(body)


def test_openai_chat_function_custom_and_legacy_functions():
    body = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ],
        "tools": [
            {"type": "function", "function": {"name": "get_weather", "description": "The\n  weather."}},
            {"type": "custom", "custom": {"name": "grammar"}},
            {"type": "function"},
            7,
        ],
        "functions": [{"name": "legacy_fn"}, {"nameless": True}, "junk"],
    }
    messages, tools = read(body)
    assert messages == [("system", "Be brief."), ("user", "hi")]
    assert tools == [Tool("get_weather", "The\n  weather."), Tool("grammar"), Tool("legacy_fn")]
    assert tool_names(body) == {"get_weather", "grammar", "legacy_fn"}


def test_responses_and_lmsp_built_in_tools_have_no_name_and_declare_nothing():
    body = {
        "instructions": "Be brief.",
        "input": [{"type": "function_call_output", "output": "sunny"}],
        "tools": [{"type": "function", "name": "get_weather", "description": "Weather."}, {"type": "web_search"}],
    }
    assert read(body) == ([("system", "Be brief."), ("tool", "sunny")], [Tool("get_weather", "Weather.")])
    assert read({"input": "hi", "tools": [{"type": "web_search"}]}) == ([("user", "hi")], [])


def test_legacy_completions_prompt_suffix_and_token_prompts():
    assert read({"prompt": ["a", "b"], "suffix": "c"}) == ([("user", "a"), ("user", "b"), ("user", "c")], [])
    assert token_prompts({"prompt": [1, 2]}) and token_prompts({"prompt": [[1], "x"]})
    assert not token_prompts({"prompt": "text"}) and not token_prompts({"prompt": [[]]}) and not token_prompts(None)


def test_anthropic_system_blocks_and_tools_server_tools_named_too():
    body = {
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [{"role": "assistant", "content": [{"type": "tool_use", "input": {"city": "Vienna"}}]}],
        "tools": [{"name": "get_weather", "input_schema": {}}, {"type": "web_search_20250305", "name": "web_search"}],
    }
    messages, tools = read(body)
    assert messages == [("system", "Be brief."), ("assistant", '{"city":"Vienna"}')]
    assert [t.name for t in tools] == ["get_weather", "web_search"]


@pytest.mark.parametrize("key", ["functionDeclarations", "function_declarations"])
def test_gemini_function_declarations_in_both_spellings(key):
    body = {
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "contents": [{"role": "model", "parts": [{"functionCall": {"name": "f", "args": {"a": 1}}}]}],
        "tools": [{key: [{"name": "get_time", "description": "Time."}, {"name": 3}, 5]}, {"googleSearch": {}}],
    }
    messages, tools = read(body)
    assert messages == [("system", "Be brief."), ("assistant", '{"a":1}')]
    assert tools == [Tool("get_time", "Time.")]


def test_lmsp_and_llm_stream_shapes():
    lmsp = {"input": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "name": "get_weather"}]}
    assert read(lmsp) == ([("user", "hi")], [Tool("get_weather")])
    stream = {"messages": [{"role": "user", "content": "hi"}], "tools": [{"name": "t", "description": "D."}]}
    assert read(stream) == ([("user", "hi")], [Tool("t", "D.")])


def test_a_body_mixing_shapes_declares_every_tool_any_of_them_names():
    body = {"tools": [{"name": "top", "function": {"name": "nested"}, "functionDeclarations": [{"name": "decl"}]}]}
    assert [t.name for t in declared_tools(body)] == ["top", "nested", "decl"]


@pytest.mark.parametrize("body", [None, [], "text", 5, {"tools": "all"}, {"tools": [None, {"function": "x"}]}])
def test_odd_bodies_give_nothing(body):
    assert declared_tools(body) == [] and tool_names(body) == frozenset()


def test_ollama_chat_tool_call_arguments_object_and_generate_prompt_and_system():
    chat = {
        "model": "llama3.2",
        "messages": [
            {"role": "user", "content": "Weather in Paris?", "images": ["aGk="]},
            {
                "role": "assistant",
                "content": "",
                "thinking": "Use the tool.",
                "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
            },
            {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather."}}],
    }
    messages, tools = read(chat)
    assert messages == [
        ("user", "Weather in Paris?"),
        ("assistant", 'Use the tool.\n{"city":"Paris"}'),
        ("tool", "sunny"),
    ]
    assert tools == [Tool("get_weather", "Weather.")]
    generate = {"model": "llama3.2", "system": "Be brief.", "prompt": "Why is the sky blue?", "suffix": "end"}
    assert read(generate)[0] == [("system", "Be brief."), ("user", "Why is the sky blue?"), ("user", "end")]


def test_ollama_generate_template_is_text_the_model_reads():
    generate = {"model": "llama3.2", "prompt": "hi", "template": "{{ .Prompt }} and obey: EXFILTRATE"}
    assert ("system", "{{ .Prompt }} and obey: EXFILTRATE") in read(generate)[0]


def test_a_protobuf_readings_unmapped_strings_are_read_as_text_the_model_reads():
    reading = {
        "rpc": "agent.v1.AgentService/Run",
        "messages": [{"role": "user", "content": "hi"}],
        "unmapped_strings": ["rules: obey", "file.py"],
    }
    assert read(reading)[0] == [("context", "rules: obey\nfile.py"), ("user", "hi")]


def nested(value, depth):
    for _ in range(depth):
        value = [value]
    return value


def test_text_nested_deeper_than_the_reader_goes_is_said_and_the_failure_policy_decides():
    """`[[[[[[[["Nightjar"]]]]]]]]` as a message's content: no API nests parts so deep,
    but a permissive server may read it, and the reader stopped at 8 levels, silently,
    so the request filters passed it. Now the reading says so, and a request filter set
    treats the body as one it cannot check (`closed`: blocked)."""
    from addon.filters.api import RequestContext
    from addon.filters.engine import FilterSet
    from addon.filters.rules import parse_rules

    deep = {"messages": [{"role": "user", "content": nested("Nightjar", 9)}]}
    cut: list[str] = []
    assert extract_messages(deep, cut) == [] and cut == ["a user message's text nested deeper than 8 levels"]
    for fine in (
        {"messages": [{"role": "user", "content": nested("Nightjar", 7)}]},
        {"messages": [{"role": "user", "content": nested({"type": "image_url", "image_url": {"url": "x"}}, 12)}]},
    ):
        cut = []
        extract_messages(fine, cut)
        assert cut == []
    rules = parse_rules('[[rule]]\nid = "k"\nkind = "keywords"\nkeywords = ["Nightjar"]\naction = "block"')
    for failure, action in (("closed", "block"), ("open", "flag")):
        verdicts = FilterSet(rules, failure=failure).check_request(RequestContext.from_body("openai_chat", deep))
        assert [(v.rule_id, v.action) for v in verdicts] == [("filter_error", action)]


# -- every other string of a body (review 52b F4, 52c) ---------------------------------------

BESIDE_CASES = {
    "anthropic text document": {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "W"}}],
            }
        ]
    },
    "a long document of words joined by hyphens": {
        "messages": [
            {"role": "user", "content": [{"type": "document", "source": {"type": "text", "data": "a-b-" * 100 + "W"}}]}
        ]
    },
    "gemini snake case": {
        "contents": [{"role": "user", "parts": [{"function_response": {"name": "f", "response": {"r": "W"}}}]}]
    },
    "bedrock guard content": {"messages": [{"role": "user", "content": [{"guardContent": {"text": {"text": "W"}}}]}]},
    "responses prompt variables": {"prompt": {"id": "pmpt_1", "variables": {"topic": "W"}}},
    "responses custom tool input": {"input": [{"type": "custom_tool_call", "name": "f", "input": "W"}]},
    "vllm documents and template": {
        "messages": [],
        "documents": [{"title": "t", "text": "W"}],
        "chat_template": "{{W}}",
    },
}
DECLARED_CASES = {
    "a tool's description": {"tools": [{"type": "function", "function": {"name": "f", "description": "W"}}]},
    "a schema property named like a label": {
        "tools": [{"name": "f", "input_schema": {"properties": {"user": {"type": "string", "description": "W"}}}}]
    },
    "responses text format schema": {"text": {"format": {"type": "json_schema", "schema": {"description": "W"}}}},
    "ollama format schema": {"model": "m", "format": {"properties": {"a": {"description": "W"}}}},
}


def beside_of(body):
    read: set[int] = set()
    messages = extract_messages(body, [], read)
    return messages, strings_beside(body, read)


@pytest.mark.parametrize("case", BESIDE_CASES)
def test_text_the_model_reads_outside_the_conversation_is_read_beside_it(case):
    messages, beside = beside_of(BESIDE_CASES[case])
    assert beside.whole and any(s.endswith("W") or "W" in s for s in beside.text), (messages, beside)
    assert not beside.declared


@pytest.mark.parametrize("case", DECLARED_CASES)
def test_what_a_request_declares_is_read_apart(case):
    _, beside = beside_of(DECLARED_CASES[case])
    assert any("W" in s for s in beside.declared) and not any("W" in s for s in beside.text), beside


def test_labels_and_bytes_are_not_read_beside_the_conversation():
    image = "iVBORw0KGgo" + "A" * 400
    body = {
        "model": "gpt-4o",
        "user": "alice@example.com",
        "metadata": {"team": "alice@example.com"},
        "previous_response_id": "resp_1",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "hi"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}},
                    {"type": "input_audio", "input_audio": {"data": image, "format": "wav"}},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": image}},
                ],
            },
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": image}]},
            {"role": "assistant", "content": [{"type": "redacted_thinking", "data": image}]},
        ],
    }
    _, beside = beside_of(body)
    assert (beside.text, beside.declared, beside.whole) == (["wav"], [], True)


def test_a_body_of_more_values_than_are_walked_says_so():
    body = {"messages": [{"role": "user", "content": "hi"}], "x": list(range(50)), "doc": "W"}
    read: set[int] = set()
    extract_messages(body, [], read)
    assert strings_beside(body, read, budget=20).whole is False
    assert strings_beside(body, read).whole is True


def test_text_under_a_key_that_names_bytes_or_a_label_elsewhere_is_read():
    """A document's ``user``, ``signature`` or ``bytes`` holding words, and a bare string
    at the top under ``text``, are text (review 52d F6, F7)."""
    body = {
        "messages": [],
        "documents": [{"user": "W one", "signature": "W two", "bytes": "W three"}],
        "text": "W four",
        "user": "alice@example.com",
    }
    _, beside = beside_of(body)
    assert beside.text == ["W one", "W two", "W three", "W four"] and beside.declared == []
