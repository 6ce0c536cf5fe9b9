"""Nothing slips past the audit or the filters (issue 14), end to end.

A real mitmdump with a rules file blocking a code word in requests and responses, the
mock upstream over HTTP/1.1 and HTTP/2 with TLS, the official ``openai`` SDK, both
database backends. Each case got through before:

- the legacy Completions API (``client.completions.create``), streamed and not: now
  recorded (text, choices, usage, finish reasons), its prompt checked, its output cut;
- the word hidden by invisible characters or fullwidth letters, in a request and in an
  answer;
- strings outside the answer text (reasoning under both names, a tool call's name, an
  error message, an unknown content part, a Responses final text that differs from the
  deltas), sent as exact upstream bytes (the mock's ``raw``);
- (issue 20's review) an event only lenient JSON readers take, a word cut across a
  ``finish_reason``, a JSON escape in a tool call's arguments: each reached the SDK;
- a keyword with accented letters written half composed, half decomposed.
"""

from __future__ import annotations

import base64
import json
import ssl
import uuid
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest
from conftest import BACKENDS, Proxy, guarded_proxy, wait_for

from exchange.transcript import output_choices

pytestmark = pytest.mark.e2e

WORD = "Nightjar"
ACCENTED = "Việt Café"  # a second code name, with letters a text may spell several ways
RULES = f"""
[[rule]]
id = "no-code-name"
kind = "keywords"
keywords = ["{WORD}", "{ACCENTED}"]
action = "block"
reason = "internal code name"
"""
ZWJ, SHY = "\u200d", "\u00ad"
MOCK_TEXT = "tök0 tök1 tök2 tök3 tök4"  # the mock's default answer
INSTRUCT = "gpt-3.5-turbo-instruct"


@pytest.fixture(scope="module", params=BACKENDS)
def guarded(request, tmp_path_factory, upstreams) -> Iterator[Proxy]:
    yield from guarded_proxy(request, tmp_path_factory, RULES, "bypasses", upstreams)


@pytest.fixture(params=["h1", "h2"])
def transport(request) -> str:
    return request.param


def client(proxy: Proxy, up, transport: str) -> openai.OpenAI:
    http = httpx.Client(
        proxy=proxy.url, verify=ssl.create_default_context(cafile=str(proxy.ca)), http2=transport == "h2", timeout=30
    )
    return openai.OpenAI(base_url=f"{up.url}/v1", api_key="sk-test", max_retries=0, http_client=http)


def mock(scenario: str = "") -> tuple[str, dict[str, str]]:
    mock_id = uuid.uuid4().hex
    return mock_id, {"x-mock-id": mock_id, **({"x-mock": scenario} if scenario else {})}


def raw(body: bytes) -> str:
    return "raw=" + base64.urlsafe_b64encode(body).decode()


def seen_by_sdk(items: list[Any]) -> str:
    """Everything the SDK handed the application, as text."""
    return "\n".join(i.model_dump_json() for i in items)


def assert_request_blocked(proxy: Proxy, up, mock_id: str, rule_id: str = "no-code-name") -> dict:
    row = proxy.mock_row(mock_id)
    assert (row["status"], row["error_code"]) == ("blocked", "content_filtered")
    assert [v["rule_id"] for v in row["verdicts"] if v["action"] == "block"] == [rule_id]
    assert up.received(mock_id) == {}, "a blocked request never reaches the upstream"
    return row


def assert_output_blocked(proxy: Proxy, mock_id: str, location: str) -> dict:
    row = proxy.mock_row(mock_id)
    assert (row["status"], row["error_code"]) == ("blocked", "content_filtered")
    assert [(v["rule_id"], v["location"]) for v in row["verdicts"]] == [("no-code-name", location)]
    assert WORD not in orjson.dumps(row["verdicts"]).decode() and WORD not in row["error_message"]
    return row


# -- the legacy Completions API -------------------------------------------------------------


def test_legacy_completions_streamed_and_not_are_recorded_with_the_official_sdk(guarded, upstreams, transport):
    up = upstreams[transport]
    c = client(guarded, up, transport)
    mock_id, headers = mock()
    chunks = list(
        c.completions.create(
            model=INSTRUCT,
            prompt="Say this is a test",
            stream=True,
            max_tokens=20,
            stream_options={"include_usage": True},
            extra_headers=headers,
        )
    )
    text = "".join(ch.text for chunk in chunks for ch in chunk.choices)
    assert text == MOCK_TEXT and chunks[-1].usage is not None
    row = guarded.mock_row(mock_id)
    assert (row["dialect"], row["status"], row["output_text"], row["finish_reasons"]) == (
        "openai-completions",
        "completed",
        MOCK_TEXT,
        ["stop"],
    )
    assert (row["request_model"], row["response_model"], row["output_tokens"]) == (
        INSTRUCT,
        INSTRUCT,
        chunks[-1].usage.completion_tokens,
    )

    mock_id, headers = mock()
    completion = c.completions.create(model=INSTRUCT, prompt=["one", "two"], n=2, logprobs=1, extra_headers=headers)
    assert [ch.text for ch in completion.choices] == [MOCK_TEXT] * 4
    row = guarded.mock_row(mock_id)
    assert (row["dialect"], row["streamed"], row["status"]) == ("openai-completions", False, "completed")
    assert [ch["text"] for ch in output_choices(row)] == [MOCK_TEXT] * 4, "logprobs never doubled the text"
    assert row["input_tokens"] == completion.usage.prompt_tokens


def test_legacy_completions_output_is_cut_with_content_filter(guarded, upstreams, transport):
    up = upstreams[transport]
    text = f"Sure, the plan is called {WORD} and " + "it goes on " * 20
    mock_id, headers = mock("events=40&delay=0.02&text=" + text.replace(" ", "+"))
    chunks = list(
        client(guarded, up, transport).completions.create(
            model=INSTRUCT, prompt="What is the plan?", stream=True, extra_headers=headers
        )
    )
    shown = "".join(ch.text for chunk in chunks for ch in chunk.choices)
    assert WORD[:3] not in shown and text.startswith(shown)
    assert chunks[-1].choices[0].finish_reason == "content_filter"
    row = assert_output_blocked(guarded, mock_id, "output.choices[0].text")
    assert row["delivered_text"] == shown and WORD in row["output_text"]
    sent = wait_for(
        lambda: (s := up.sent(mock_id)) and (s["disconnected"] or s["completed"]) and s,
        timeout=5,
        what="the upstream's stream to end",
    )
    assert sent["disconnected"] and not sent["completed"]


@pytest.mark.parametrize(
    "prompt", [f"Tell me about {WORD}", ["fine", f"about {ZWJ.join(WORD)}"], "about ＮＩＧＨＴＪＡＲ"]
)
def test_legacy_completions_prompts_are_checked_streamed_and_not(guarded, upstreams, prompt):
    up = upstreams["h1"]
    c = client(guarded, up, "h1")
    mock_id, headers = mock()
    with pytest.raises(openai.APIError) as raised:
        for _ in c.completions.create(model=INSTRUCT, prompt=prompt, stream=True, extra_headers=headers):
            pass
    assert raised.value.code == "content_filter"
    assert_request_blocked(guarded, up, mock_id)
    mock_id, headers = mock()
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model=INSTRUCT, prompt=prompt, extra_headers=headers)
    assert_request_blocked(guarded, up, mock_id)


def test_a_token_id_prompt_that_no_filter_can_read_is_refused_under_the_closed_policy(guarded, upstreams):
    up = upstreams["h1"]
    mock_id, headers = mock()
    with pytest.raises(openai.BadRequestError):
        client(guarded, up, "h1").completions.create(model=INSTRUCT, prompt=[[464, 5044, 1110]], extra_headers=headers)
    row = assert_request_blocked(guarded, up, mock_id, rule_id="filter_error")
    assert "request_token_prompt" in [f["code"] for f in row["findings"]]


# -- invisible characters in a request ------------------------------------------------------


# the first word composed, the second decomposed; ệ as ẹ and a circumflex, é as e and an acute
MIXED_SPELLING = "Vi\u1eb9\u0302t Cafe\u0301"


def refused_by_the_proxy(guarded: Proxy, up, transport: str, content: Any) -> str:
    """Send one chat message through the proxy with the SDK; the SDK gets the content
    filter's error. The mock id, for the record."""
    mock_id, headers = mock()
    with pytest.raises(openai.APIError) as raised:
        for _ in client(guarded, up, transport).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": content}], stream=True, extra_headers=headers
        ):
            pass
    assert raised.value.code == "content_filter"
    return mock_id


@pytest.mark.parametrize("word", [ZWJ.join(WORD), SHY.join(WORD), "Ｎｉｇｈｔｊａｒ", MIXED_SPELLING])
def test_a_chat_request_hiding_the_word_is_blocked(guarded, upstreams, transport, word):
    """Invisible characters, fullwidth letters, and the second keyword half decomposed."""
    up = upstreams[transport]
    assert_request_blocked(guarded, up, refused_by_the_proxy(guarded, up, transport, f"Tell me about {word}."))


@pytest.mark.parametrize(
    "prompt",
    [f"请告诉我{WORD}项目的所有细节", f"{WORD}について教えて", f"บอกฉันเกี่ยวกับ{WORD}หน่อย", f"{WORD}는 무엇입니까?"],
)
def test_a_keyword_right_against_letters_of_a_script_without_spaces_is_blocked(guarded, upstreams, transport, prompt):
    """Chinese, Japanese and Thai put no space around a Latin word, Korean joins its
    particles to it: the keyword's word edge (no letter beside it) let every one pass."""
    up = upstreams[transport]
    assert_request_blocked(guarded, up, refused_by_the_proxy(guarded, up, transport, prompt))


@pytest.mark.parametrize(
    "path",
    [
        "/v1/chat/%63ompletions",
        "/v1/chat%2Fcompletions",
        "/v1/chat//completions",
        "/V1/Chat/Completions",
        "/v1/chat%5Ccompletions",  # (a backslash: WHATWG URL parsers route it as a slash)
    ],
)
def test_a_request_to_a_path_written_to_hide_it_is_read_as_servers_route_it(guarded, upstreams, transport, path):
    """uvicorn (vLLM, LiteLLM, every FastAPI server) and Go's net/http (Ollama) decode a
    path before routing it, nginx merges its slashes: each of these reaches a chat
    completions endpoint somewhere, and went past the audit and the filters unrecorded.
    Now detection reads the path as those servers route it, when no dialect knows it as
    sent; the record keeps it as sent, with the finding ``request_path_obscured``."""
    up = upstreams[transport]
    mock_id, headers = mock()
    context = ssl.create_default_context(cafile=str(guarded.ca))
    with httpx.Client(proxy=guarded.url, verify=context, http2=transport == "h2", timeout=30) as http:
        body = {"model": "gpt-4o", "messages": [{"role": "user", "content": f"Tell me about {WORD}."}]}
        answer = http.post(f"{up.url}{path}", json=body, headers=headers | {"authorization": "Bearer sk-test"})
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "content_filter"
    row = assert_request_blocked(guarded, up, mock_id)
    assert (row["dialect"], row["url_path"]) == ("openai-chat", path)
    assert [f["code"] for f in row["findings"]] == ["request_path_obscured"]


def test_a_request_whose_text_is_nested_deeper_than_the_reader_goes_is_blocked(guarded, upstreams, transport):
    """The word nine lists deep in a message's content: the reader stopped at eight, and
    the request filters passed it unread; the closed policy then blocked what it could not
    read, and now every string beside the conversation is read: the word blocks it."""
    content: Any = WORD
    for _ in range(9):
        content = [content]
    row = guarded.mock_row(refused_by_the_proxy(guarded, upstreams[transport], transport, content))
    assert (row["status"], row["error_code"]) == ("blocked", "content_filtered")
    assert [v["rule_id"] for v in row["verdicts"]] == ["no-code-name"]  # (read beside the conversation)


def test_an_answer_with_a_keyword_spelled_half_decomposed_is_cut(guarded, upstreams, transport):
    """Cut between each letter and its mark: the SDK gets only the text before the word."""
    up = upstreams[transport]
    pieces = ["at the Vi\u1eb9", "\u0302t Cafe", "\u0301 now"]
    mock_id, headers = mock(raw(chat(*({"content": p} for p in pieces))))
    chunks = list(
        client(guarded, up, transport).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}], stream=True, extra_headers=headers
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text in ("", "at", "at ", "at the", "at the ")
    assert chunks[-1].choices[0].finish_reason == "content_filter"
    assert_output_blocked(guarded, mock_id, "output.choices[0].text")


# -- strings outside the answer text, as exact upstream bytes -------------------------------

HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o"}


def chat(*deltas: dict, error: dict | None = None, finish: str = "stop") -> bytes:
    chunks = [HEAD | {"choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    chunks += (
        [{"error": error}] if error else [HEAD | {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}]
    )
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + (b"" if error else b"data: [DONE]\n\n")


CALL = {"index": 0, "id": "call_1", "type": "function", "function": {"name": WORD, "arguments": ""}}
CHAT_BYPASSES = {
    "evasive answer": (
        chat({"content": "the Ni"}, {"content": f"g{ZWJ}h{SHY}t"}, {"content": "jar plan"}),
        "output.choices[0].text",
    ),
    "reasoning under both names": (
        # (the word whole in one field: blocked before the two different texts count as interleaved)
        chat({"reasoning_content": "I think", "reasoning": f"of {WORD}."}, {"content": "Done."}),
        "output.choices[0].reasoning",
    ),
    "tool name": (
        chat({"role": "assistant", "content": None}, {"tool_calls": [CALL]}, finish="tool_calls"),
        "output.tool_calls[0.0].name",
    ),
    "error message": (
        chat({"content": "Hi"}, error={"message": f"about {WORD}", "type": "server_error"}),
        "output.error.message",
    ),
    "unknown content part": (
        chat({"content": [{"type": "output_text", "text": f"the {WORD} plan"}]}),
        "output.choices[0].text",
    ),
    # (issue 20's review) JSON only lenient readers take: the SDK's json.loads reads NaN
    "event only lenient readers take": (
        chat({"content": f"the {WORD} plan", "x": float("nan")}),
        "output.choices[0].text",
    ),
    # a spoken answer (modalities ["text", "audio"]): its words are the transcript
    "an audio answer's transcript": (
        chat(
            {"role": "assistant", "audio": {"id": "a1", "transcript": "The Night"}},
            {"audio": {"transcript": "jar plan"}},
        ),
        "output.choices[0].text",
    ),
    # no space around a Latin word in Chinese (the keyword's word edge once needed one)
    "a word right against Chinese": (
        chat({"content": "代号是Night"}, {"content": "jar项目。"}),
        "output.choices[0].text",
    ),
    # the SDK joins a choice's deltas after a finish_reason
    "a finish_reason between the halves": (
        chat({"content": "the Nigh"}, finish="stop").replace(b"data: [DONE]\n\n", b"") + chat({"content": "tjar plan"}),
        "output.choices[0].text",
    ),
    # the tool reads json.loads of its arguments: \u004e is N
    "a JSON escape in a tool call's arguments": (
        chat(
            {"role": "assistant", "content": None},
            {"tool_calls": [CALL | {"function": {"name": "f", "arguments": '{"about": "\\u004eightjar"}'}}]},
            finish="tool_calls",
        ),
        "output.tool_calls[0.0].arguments",
    ),
}


@pytest.mark.parametrize("case", CHAT_BYPASSES)
def test_chat_strings_outside_the_answer_are_checked(guarded, upstreams, transport, case):
    body, location = CHAT_BYPASSES[case]
    up = upstreams[transport]
    mock_id, headers = mock(raw(body))
    chunks = list(
        client(guarded, up, transport).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}], stream=True, extra_headers=headers
        )
    )
    assert WORD not in seen_by_sdk(chunks) and "Nigh" not in seen_by_sdk(chunks)
    assert chunks[-1].choices[0].finish_reason == "content_filter"
    assert_output_blocked(guarded, mock_id, location)


def responses_stream(final_text: str) -> bytes:
    created = {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "status": "in_progress",
        "model": "gpt-5",
        "output": [],
    }
    item = {"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
    ref = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    done_item = item | {
        "status": "completed",
        "content": [{"type": "output_text", "text": final_text, "annotations": []}],
    }
    events = [
        ("response.created", {"response": created}),
        ("response.output_item.added", {"output_index": 0, "item": item}),
        ("response.output_text.delta", ref | {"delta": "Hello", "logprobs": []}),
        ("response.output_text.delta", ref | {"delta": " there", "logprobs": []}),
        ("response.output_text.done", ref | {"text": final_text, "logprobs": []}),
        ("response.output_item.done", {"output_index": 0, "item": done_item}),
        ("response.completed", {"response": created | {"status": "completed", "output": [done_item]}}),
    ]
    return b"".join(
        f"event: {t}\ndata: {json.dumps({'type': t, 'sequence_number': i, **d})}\n\n".encode()
        for i, (t, d) in enumerate(events)
    )


def test_a_responses_final_text_that_differs_from_its_deltas_is_checked(guarded, upstreams, transport):
    up = upstreams[transport]
    mock_id, headers = mock(raw(responses_stream(f"the {WORD} plan")))
    events = list(
        client(guarded, up, transport).responses.create(model="gpt-5", input="hi", stream=True, extra_headers=headers)
    )
    assert WORD not in seen_by_sdk(events)
    assert (
        events[-1].type == "response.incomplete" and events[-1].response.incomplete_details.reason == "content_filter"
    )
    shown = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert events[-1].response.output_text == shown, "the final response carries what the client had"
    assert [item.id for item in events[-1].response.output] == ["msg_1"]
    row = assert_output_blocked(guarded, mock_id, "output.choices[0].final_text")
    assert row["output_text"] == "Hello there"
    assert "final_text_mismatch" in [f["code"] for f in row["findings"]]


# -- a compressed request ------------------------------------------------------------------------


def post_gzip(proxy: Proxy, up, transport: str, sent: bytes) -> tuple[httpx.Response, str]:
    """POST a gzip-encoded chat body through the proxy; the response and the mock id."""
    mock_id, headers = mock()
    headers |= {"content-type": "application/json", "content-encoding": "gzip"}
    verify = ssl.create_default_context(cafile=str(proxy.ca))
    with httpx.Client(proxy=proxy.url, verify=verify, http2=transport == "h2", timeout=60) as c:
        return c.post(f"{up.url}/v1/chat/completions", content=sent, headers=headers), mock_id


def gzipped(body: bytes, spaces: int = 0) -> bytes:
    """``body`` then ``spaces`` spaces (JSON whitespace), gzip-encoded a MiB at a time."""
    encoder = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts = [encoder.compress(body)] + [encoder.compress(b" " * (1 << 20)) for _ in range(spaces >> 20)]
    return b"".join(parts) + encoder.flush()


def test_a_compressed_request_is_checked_and_a_bomb_is_refused(guarded, upstreams, transport):
    """The word in a gzip-encoded body is blocked; a body that decodes past the decode
    budget (64 MiB of spaces after it) cannot be read, so the closed policy refuses it.
    Before, mitmproxy decoded any body whole in the proxy's memory and the bomb passed."""
    up = upstreams[transport]
    chat = orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": f"about {WORD}"}]})
    resp, mock_id = post_gzip(guarded, up, transport, gzipped(chat))
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "content_filter"
    assert_request_blocked(guarded, up, mock_id)
    innocent = orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hello"}]})
    resp, mock_id = post_gzip(guarded, up, transport, gzipped(innocent, 64 << 20))
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "content_filter"
    row = assert_request_blocked(guarded, up, mock_id, rule_id="filter_error")
    assert "request_too_large" in row["verdicts"][0]["reason"] and row["request_body"] is None
    assert [f["code"] for f in row["findings"]] == ["request_too_large"]


def test_a_request_costly_to_read_is_checked_while_other_streams_flow(guarded, upstreams):
    """300,000 tiny messages and the word in the last: reading and checking it took the
    event loop some seconds, and every stream through the proxy stood still meanwhile.
    Now it is read in a worker thread: it is still refused, and a paced stream going at
    the same time keeps flowing."""
    up = upstreams["h1"]
    messages = [{"role": "user", "content": "ab"}] * 300_000 + [{"role": "user", "content": f"about {WORD}"}]
    body = orjson.dumps({"model": "gpt-4o", "messages": messages})
    mock_id, headers = mock()

    def post() -> httpx.Response:
        with guarded.client(timeout=120) as c:
            return c.post(
                f"{up.url}/v1/chat/completions", content=body, headers={**headers, "content-type": "application/json"}
            )

    resp, gaps = guarded.while_a_stream_flows(up, post)
    print(f"{len(body) / 1e6:.1f} MB request: the paced stream's longest pause {max(gaps) * 1000:.0f} ms")
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "content_filter"
    assert_request_blocked(guarded, up, mock_id)
    assert max(gaps) < 1.0  # a sanity bound (the pause was the whole reading, seconds)


@pytest.mark.parametrize(
    "extra",
    [
        {"tools": [{"type": "function", "function": {"name": "f", "description": f"Look up the {WORD} files"}}]},
        {"documents": [{"title": "plan", "text": f"The {WORD} plan"}]},  # (vLLM renders them into the prompt)
    ],
    ids=["tool description", "vllm documents"],
)
def test_text_the_model_reads_outside_the_conversation_is_checked(guarded, upstreams, transport, extra):
    """A request's text is read wherever the API puts it, not only in the fields a list
    of keys names: a tool's description or a RAG document passed a blocking rule."""
    up = upstreams[transport]
    mock_id, headers = mock()
    context = ssl.create_default_context(cafile=str(guarded.ca))
    with httpx.Client(proxy=guarded.url, verify=context, http2=transport == "h2", timeout=30) as http:
        body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], **extra}
        answer = http.post(f"{up.url}/v1/chat/completions", json=body, headers=headers | {"authorization": "Bearer x"})
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "content_filter"
    assert_request_blocked(guarded, up, mock_id)
