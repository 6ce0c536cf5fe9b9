"""Content filters on output, end to end: a stream stopped mid-way, in every dialect.

A real mitmdump with a rules file that blocks a code word in responses, the mock
upstream pacing its events, and each dialect's official SDK (httpx for llm-stream and
LMSP), over HTTP/1.1 and HTTP/2 through TLS. For each: the SDK reports its API's normal
filtered or failed outcome with the text before the word, never the word; the upstream
sees its stream cancelled long before it would have ended; the record keeps the
verdict, what the upstream sent and what the client got. Clean streams on the same
proxy pass byte for byte, also next to a blocked stream on one HTTP/2 connection.
"""

from __future__ import annotations

import base64
import ssl
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import orjson
import pytest
from conftest import BACKENDS, ROOT, Proxy, guarded_proxy, start_proxy, wait_for
from google.genai import types as genai_types
from test_sdks_proxy import MESSAGES, genai_client

pytestmark = pytest.mark.e2e

WORD = "Nightjar"
RULES = f"""
[[rule]]
id = "no-code-name"
kind = "keywords"
keywords = ["{WORD}"]
scope = "response"
action = "block"
reason = "internal code name"

[[rule]]
id = "weather-talk"
kind = "keywords"
keywords = ["weather"]
scope = "response"
action = "flag"
"""
TEXT = f"Sure. The plan you ask about is called {WORD} and it " + "goes on and on " * 20
# 60 events 50 ms apart: three seconds if nobody stops it; the word is in the first fifth
DIRTY = "events=60&delay=0.05&text=" + TEXT.replace(" ", "+")
CLEAN = "events=20&delay=0.02&text=" + "The+weather+is+fine+and+nothing+else+is+said+here"
SHOWN_AT_MOST = TEXT.index(WORD)


@pytest.fixture(scope="module", params=BACKENDS)
def guarded(request, tmp_path_factory, upstreams) -> Iterator[Proxy]:
    yield from guarded_proxy(request, tmp_path_factory, RULES, "output-filters", upstreams)


@pytest.fixture(params=["h1", "h2"])
def transport(request) -> str:
    return request.param


def http_client(proxy: Proxy, transport: str, lib: Any = httpx) -> Any:
    return lib.Client(
        proxy=proxy.url, verify=ssl.create_default_context(cafile=str(proxy.ca)), http2=transport == "h2", timeout=30
    )


def openai_sdk(up, http: httpx.Client) -> openai.OpenAI:
    """The openai SDK for the mock ``up``, over ``http`` (through the proxy)."""
    return openai.OpenAI(base_url=f"{up.url}/v1", api_key="sk-test", max_retries=0, http_client=http)


def assert_stopped(proxy: Proxy, up, mock_id: str, shown: str, finish: str) -> dict:
    """The record of a stream blocked mid-way, and the upstream told to stop; ``finish``:
    the stop reason the client received, which the record's ``finish_reasons`` repeat."""
    assert WORD not in shown and TEXT.startswith(shown) and len(shown) <= SHOWN_AT_MOST
    row = proxy.mock_row(mock_id)
    assert (row["status"], row["error_code"]) == ("blocked", "content_filtered")
    [verdict] = [v for v in row["verdicts"] if v["action"] == "block"]
    assert (verdict["rule_id"], verdict["position"], verdict["location"]) == (
        "no-code-name",
        TEXT.index(WORD),
        "output.choices[0].text",
    )
    assert WORD not in orjson.dumps(row["verdicts"]).decode() and WORD not in row["error_message"]
    assert WORD in row["output_text"], "the record keeps what the upstream sent"
    assert (row["delivered_text"] or "") == shown
    assert (row["finish_reasons"], row["client_status"]) == ([finish], None)
    # Held text the client never got: fewer characters reached it than the upstream sent.
    # (Not fewer bytes: a block found early, as the hold-back does, can leave the client's
    # ending event, which repeats what it received, longer than the rest of the upstream's stream.)
    assert 0 < row["bytes_to_client"] and len(row["delivered_text"] or "") < len(row["output_text"])
    sent = wait_for(
        lambda: (s := up.sent(mock_id)) and (s["disconnected"] or s["completed"]) and s,
        timeout=5,
        what="the upstream's stream to end",
    )
    assert sent["disconnected"] and not sent["completed"], "the upstream must be told to stop"
    assert len(sent["chunks"]) < 40
    return row


def ids() -> tuple[str, dict[str, str]]:
    mock_id = uuid.uuid4().hex
    return mock_id, {"x-mock": DIRTY, "x-mock-id": mock_id}


def test_openai_chat_stream_finishes_with_content_filter(guarded, upstreams, transport):
    up = upstreams[transport]
    mock_id, headers = ids()
    with http_client(guarded, transport) as http:
        client = openai_sdk(up, http)
        chunks = list(
            client.chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=True, extra_headers=headers)
        )
    shown = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "content_filter"
    assert_stopped(guarded, up, mock_id, shown, "content_filter")


def test_openai_chat_stream_helper_raises_its_content_filter_error(guarded, upstreams, transport):
    up = upstreams[transport]
    mock_id, headers = ids()
    with http_client(guarded, transport) as http:
        client = openai_sdk(up, http)
        with (
            pytest.raises(openai.ContentFilterFinishReasonError) as filtered,
            client.chat.completions.stream(model="gpt-4o", messages=MESSAGES, extra_headers=headers) as stream,
        ):
            stream.get_final_completion()  # the SDK's own outcome of a content_filter finish
    final = filtered.value.completion
    assert final.choices[0].finish_reason == "content_filter"
    assert_stopped(guarded, up, mock_id, final.choices[0].message.content or "", "content_filter")


def test_openai_responses_stream_ends_incomplete_by_content_filter(guarded, upstreams, transport):
    up = upstreams[transport]
    mock_id, headers = ids()
    with http_client(guarded, transport) as http:
        client = openai_sdk(up, http)
        events = list(client.responses.create(model="gpt-5", input="hi", stream=True, extra_headers=headers))
    shown = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1]
    assert final.type == "response.incomplete" and final.response.incomplete_details.reason == "content_filter"
    assert final.response.output_text == shown, "the final response carries the output the client had"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert_stopped(guarded, up, mock_id, shown, "content_filter")


def test_openai_responses_stream_helper_ends_on_the_incomplete_response(guarded, upstreams, transport):
    up = upstreams[transport]
    mock_id, headers = ids()
    with http_client(guarded, transport) as http:
        client = openai_sdk(up, http)
        with client.responses.stream(model="gpt-5", input="hi", extra_headers=headers) as stream:
            events = list(stream)
            with pytest.raises(RuntimeError, match=r"response\.completed"):  # as for any incomplete response
                stream.get_final_response()
    final = events[-1]
    assert final.type == "response.incomplete" and final.response.incomplete_details.reason == "content_filter"
    assert_stopped(guarded, up, mock_id, final.response.output_text, "content_filter")


def test_anthropic_stream_ends_with_a_refusal(guarded, upstreams, transport):
    up = upstreams[transport]
    mock_id, headers = ids()
    shown = ""
    with http_client(guarded, transport, httpx2) as http:
        client = anthropic.Anthropic(base_url=up.url, api_key="sk-ant-test", max_retries=0, http_client=http)
        with client.messages.stream(
            model="claude-sonnet-4", max_tokens=100, messages=MESSAGES, extra_headers=headers
        ) as stream:
            for text in stream.text_stream:
                shown += text
            message = stream.get_final_message()
    assert message.stop_reason == "refusal" and "no-code-name" in message.stop_details.explanation
    assert "".join(b.text for b in message.content if b.type == "text") == shown
    assert_stopped(guarded, up, mock_id, shown, "refusal")


def test_gemini_stream_ends_with_a_safety_finish(guarded, upstreams, transport):
    up = upstreams[transport]
    mock_id, headers = ids()
    with http_client(guarded, transport) as http:
        chunks = list(
            genai_client(up.url, http, headers).models.generate_content_stream(model="gemini-2.5-flash", contents="hi")
        )
    shown = "".join(c.text or "" for c in chunks)
    assert chunks[-1].candidates[0].finish_reason == genai_types.FinishReason.SAFETY
    assert_stopped(guarded, up, mock_id, shown, "SAFETY")


def test_a_gemini_json_array_stream_is_cut_mid_stream_and_ends_with_a_safety_element(guarded, upstreams, transport):
    """Without alt=sse the stream is one JSON array: read element by element as it flows,
    cut at the element carrying the word, and closed with a SAFETY element and ``]``."""
    up = upstreams[transport]
    mock_id, headers = ids()
    with http_client(guarded, transport) as http:
        resp = http.post(
            f"{up.url}/v1beta/models/gemini-2.5-flash:streamGenerateContent",
            headers=headers | {"x-goog-api-key": "gemini-test-key"},
            json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
        )
    assert resp.status_code == 200
    elements = orjson.loads(resp.content)  # a valid JSON array, however it was cut
    final = elements[-1]["candidates"][0]
    assert (final["finishReason"], final["finishMessage"]) == (
        "SAFETY",
        "Blocked by content filter rule 'no-code-name': internal code name",
    )
    shown = "".join(
        p.get("text", "")
        for e in elements[:-1]
        for c in e.get("candidates", [])
        for p in c.get("content", {}).get("parts", [])
    )
    assert_stopped(guarded, up, mock_id, shown, "SAFETY")


def sse(body: bytes) -> list[tuple[str, dict]]:
    blocks = [b for b in body.replace(b"\r\n", b"\n").split(b"\n\n") if b.strip()]
    out = []
    for block in blocks:
        fields = dict(line.split(b": ", 1) for line in block.split(b"\n") if b": " in line)
        out.append((fields.get(b"event", b"message").decode(), orjson.loads(fields[b"data"])))
    return out


def test_llm_stream_closes_the_block_errors_and_ends_with_seq_continuing(guarded, upstreams, transport):
    up = upstreams[transport]
    mock_id, headers = ids()
    with http_client(guarded, transport) as http:
        body = http.post(
            f"{up.url}/v1/llm/stream",
            content=b'{"version":"1.0","stream":true,"model":"m","messages":[]}',
            headers=headers | {"content-type": "application/llm-request+json"},
        ).content
    events = sse(body)
    assert [d["seq"] for _, d in events] == list(range(len(events)))
    assert [kind for kind, _ in events[-3:]] == ["content.stop", "error", "stream.end"]
    assert (events[-3][1]["stop_reason"], events[-2][1]["code"]) == ("content_filter", "content_filtered")
    shown = "".join(d["delta"]["text"] for kind, d in events if kind == "content.delta")
    assert_stopped(guarded, up, mock_id, shown, "content_filter")


def test_lmsp_stream_ends_with_response_failed(guarded, upstreams, transport):
    up = upstreams[transport]
    mock_id, headers = ids()
    with http_client(guarded, transport) as http:
        body = http.post(
            f"{up.url}/lmsp/v1/responses", json={"model": "m", "input": "hi", "stream": True}, headers=headers
        ).content
    events = sse(body)
    assert events[-1][0] == "response.failed" and events[-1][1]["error"]["code"] == "content_filtered"
    shown = "".join(d["delta"] for kind, d in events if kind == "response.output_text.delta")
    [item] = events[-1][1]["output"]  # the output the client had, its open message marked incomplete
    assert (item["status"], "".join(p["text"] for p in item["content"])) == ("incomplete", shown)
    assert_stopped(guarded, up, mock_id, shown, "failed")


def assert_replaced(proxy: Proxy, mock_id: str, finish: str | None, client_status: int | None = None) -> dict:
    """The record of a held answer replaced: the upstream's text kept, the client's outcome stated."""
    row = proxy.mock_row(mock_id)
    assert (row["status"], row["http_status"], row["streamed"]) == ("blocked", 200, False)
    assert (row["client_status"], row["delivered_text"]) == (client_status, "")
    assert row["finish_reasons"] == ([finish] if finish else [])
    assert WORD in row["output_text"] and row["bytes_to_client"] < row["bytes_from_upstream"]
    [view] = proxy.sql("SELECT client_text, client_status FROM exchange_view WHERE id = ?", (row["id"],))
    assert view == {"client_text": "", "client_status": client_status or 200}, "what the client got"
    return row


def test_a_held_chat_answer_is_replaced_by_a_content_filter_finish(guarded, upstreams):
    up = upstreams["h1"]
    mock_id, headers = ids()
    with http_client(guarded, "h1") as http:
        client = openai_sdk(up, http)
        answer = client.chat.completions.create(model="gpt-4o", messages=MESSAGES, extra_headers=headers)
    assert (answer.choices[0].finish_reason, answer.choices[0].message.content) == ("content_filter", None)
    assert answer.usage is not None and answer.usage.total_tokens > 0, "the usage the upstream reported"
    assert_replaced(guarded, mock_id, "content_filter")


def test_a_filtered_answer_that_cannot_be_made_is_the_dialects_error_never_the_held_answer(tmp_path, upstreams):
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES)
    fault = ROOT / "tests" / "e2e" / "addons" / "filtered_body_fault.py"
    proxy = start_proxy(tmp_path, "-s", str(fault), "--set", f"llm_rules={rules}")
    try:
        up = upstreams["h1"]
        mock_id, headers = ids()
        with http_client(proxy, "h1") as http:
            client = openai_sdk(up, http)
            with pytest.raises(openai.BadRequestError) as refused:
                client.chat.completions.create(model="gpt-4o", messages=MESSAGES, extra_headers=headers)
        assert refused.value.code == "content_filter" and WORD not in str(refused.value.body)
        row = assert_replaced(proxy, mock_id, None, client_status=400)
        assert [f["code"] for f in row["findings"]] == ["audit_internal_error"]
    finally:
        proxy.process.stop()


def test_a_held_responses_answer_is_replaced_by_an_incomplete_response(guarded, upstreams):
    up = upstreams["h1"]
    mock_id, headers = ids()
    with http_client(guarded, "h1") as http:
        client = openai_sdk(up, http)
        answer = client.responses.create(model="gpt-5", input="hi", extra_headers=headers)
    assert (answer.status, answer.incomplete_details.reason, answer.output_text) == ("incomplete", "content_filter", "")
    assert_replaced(guarded, mock_id, "content_filter")


def test_a_held_anthropic_message_is_replaced_by_a_refusal(guarded, upstreams):
    up = upstreams["h1"]
    mock_id, headers = ids()
    with http_client(guarded, "h1", httpx2) as http:
        client = anthropic.Anthropic(base_url=up.url, api_key="sk-ant-test", max_retries=0, http_client=http)
        message = client.messages.create(
            model="claude-sonnet-4", max_tokens=100, messages=MESSAGES, extra_headers=headers
        )
    assert (message.stop_reason, message.content) == ("refusal", [])
    assert_replaced(guarded, mock_id, "refusal")


def test_a_held_answer_costly_to_read_is_checked_while_other_streams_flow(guarded, upstreams):
    """An Anthropic message of 300,000 tiny text blocks before the one with the word (11
    MB): reading it and checking it block by block took seconds of the event loop, and
    every stream through the proxy stood still meanwhile. Now it is read and
    checked by the rules in the reader thread: it is still replaced by a refusal, and a
    paced stream going at the same time keeps flowing."""
    up = upstreams["h1"]
    mock_id = uuid.uuid4().hex
    headers = {"x-mock": "blocks=300000&text=" + TEXT.replace(" ", "+"), "x-mock-id": mock_id}

    def ask() -> anthropic.types.Message:
        with http_client(guarded, "h1", httpx2) as http:
            client = anthropic.Anthropic(base_url=up.url, api_key="sk-ant-test", max_retries=0, http_client=http)
            return client.messages.create(
                model="claude-sonnet-4", max_tokens=400_000, messages=MESSAGES, extra_headers=headers, timeout=60
            )

    message, gaps = guarded.while_a_stream_flows(
        upstreams["h2"], ask
    )  # (another mock: its making of the answer stalls it)
    print(f"held 300,000-block answer: the paced stream's longest pause {max(gaps) * 1000:.0f} ms")
    assert isinstance(message, anthropic.types.Message) and (message.stop_reason, message.content) == ("refusal", [])
    assert_replaced(guarded, mock_id, "refusal")
    assert max(gaps) < 1.0  # a sanity bound (the pause was the whole reading and check, seconds)


def test_a_held_answer_over_the_record_cap_is_the_failure_policy_s(tmp_path, upstreams):
    """A whole answer over ``llm_audit_max_record_bytes`` is not read, so not checked: a
    word past the cap went to the client past the blocking rules. Now the failure policy
    decides (closed: refused with the verdict ``filter_error``; the answer unread, the
    API's filtered answer cannot be made from it, so the client gets the dialect's error)."""
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES)
    proxy = start_proxy(tmp_path, "--set", f"llm_rules={rules}", "--set", "llm_audit_max_record_bytes=1048576")
    try:
        up = upstreams["h1"]
        mock_id = uuid.uuid4().hex
        headers = {"x-mock": "blocks=40000&text=" + TEXT.replace(" ", "+"), "x-mock-id": mock_id}
        with http_client(proxy, "h1", httpx2) as http:
            client = anthropic.Anthropic(base_url=up.url, api_key="sk-ant-test", max_retries=0, http_client=http)
            with pytest.raises(anthropic.BadRequestError) as refused:
                client.messages.create(
                    model="claude-sonnet-4", max_tokens=100_000, messages=MESSAGES, extra_headers=headers, timeout=60
                )
        assert "filter_error" in str(refused.value) and WORD not in str(refused.value.body)
        assert up.sent(mock_id)["size"] > 1048576
        row = proxy.mock_row(mock_id)
        assert (row["status"], row["client_status"], row["delivered_text"]) == ("blocked", 400, "")
        assert [v["rule_id"] for v in row["verdicts"]] == ["filter_error"]
        assert "body_too_large" in [f["code"] for f in row["findings"]]
    finally:
        proxy.process.stop()


def test_a_held_gemini_answer_is_replaced_by_a_safety_finish(guarded, upstreams):
    up = upstreams["h1"]
    mock_id, headers = ids()
    with http_client(guarded, "h1") as http:
        answer = genai_client(up.url, http, headers).models.generate_content(model="gemini-2.5-flash", contents="hi")
    assert answer.candidates[0].finish_reason == genai_types.FinishReason.SAFETY and not answer.text
    assert_replaced(guarded, mock_id, "SAFETY")


def test_a_held_lmsp_answer_is_replaced_by_the_problem_document_and_the_record_says_400(guarded, upstreams):
    up = upstreams["h1"]
    mock_id, headers = ids()
    with http_client(guarded, "h1") as http:
        resp = http.post(f"{up.url}/lmsp/v1/responses", json={"model": "m", "input": "hi"}, headers=headers)
    assert (resp.status_code, resp.json()["code"]) == (400, "content_filtered") and WORD not in resp.text
    assert_replaced(guarded, mock_id, None, client_status=400)


def test_a_clean_stream_passes_byte_for_byte_next_to_a_blocked_one_on_one_connection(guarded, upstreams):
    up = upstreams["h2"]
    results: dict[str, tuple[bytes, str]] = {}

    def run(client: httpx.Client, name: str, scenario: str) -> None:
        mock_id = uuid.uuid4().hex
        resp = client.post(
            f"{up.url}/v1/llm/stream",
            content=b'{"version":"1.0","stream":true,"model":"m"}',
            headers={"content-type": "application/llm-request+json", "x-mock": scenario, "x-mock-id": mock_id},
        )
        results[name] = (resp.content, mock_id)

    with http_client(guarded, "h2") as http:
        threads = [
            threading.Thread(target=run, args=(http, name, scenario))
            for name, scenario in (("blocked", DIRTY), ("clean", CLEAN.replace("delay=0.02", "delay=0.1")))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    clean, clean_id = results["clean"]
    assert clean == base64.b64decode(up.sent(clean_id)["body_b64"]), "byte for byte"
    row = guarded.mock_row(clean_id)
    assert row["status"] == "completed" and row["delivered_text"] is None
    assert [(v["action"], v["rule_id"]) for v in row["verdicts"]] == [("flag", "weather-talk")]
    assert guarded.mock_row(results["blocked"][1])["status"] == "blocked"


def test_a_word_cut_across_network_chunks_of_every_size_never_leaks(guarded, upstreams):
    up = upstreams["h1"]
    with httpx.Client(timeout=30) as direct:  # the upstream's own bytes, not through the proxy
        body = direct.post(
            f"{up.url}/v1/llm/stream",
            content=b'{"version":"1.0","stream":true,"model":"m"}',
            headers={
                "content-type": "application/llm-request+json",
                "x-mock": "events=40&text=" + TEXT.replace(" ", "+"),
            },
        ).content
    # sent raw in writes of 1, 3 and 7 bytes
    upstream_body = base64.urlsafe_b64encode(body).decode()
    for size in (1, 3, 7):
        mock_id = uuid.uuid4().hex
        with http_client(guarded, "h1") as http:
            got = http.post(
                f"{up.url}/v1/llm/stream",
                content=b'{"version":"1.0","stream":true,"model":"m"}',
                headers={
                    "content-type": "application/llm-request+json",
                    "x-mock-id": mock_id,
                    "x-mock": f"raw={upstream_body}&chunk={size}",
                },
            ).content
        shown = "".join(d["delta"]["text"] for kind, d in sse(got) if kind == "content.delta")
        assert WORD[:2] not in shown.removeprefix("Sure. The plan you ask about is called ")
        assert len(shown) <= SHOWN_AT_MOST and guarded.mock_row(mock_id)["status"] == "blocked"


FAILING_OUTPUT_FILTER = """
def check_output(piece):
    if piece.end > 30:
        raise RuntimeError("this output filter is broken")
"""


@pytest.mark.parametrize("policy", ["closed", "open"])
def test_a_failing_output_filter_stops_or_passes_the_stream_by_policy(tmp_path, upstreams, policy):
    up = upstreams["h1"]
    filter_file = tmp_path / "filters.py"
    filter_file.write_text(FAILING_OUTPUT_FILTER)
    proxy = start_proxy(tmp_path, "--set", f"llm_filters={filter_file}", "--set", f"llm_filter_failure={policy}")
    try:
        mock_id = uuid.uuid4().hex
        with http_client(proxy, "h1") as http:
            client = openai_sdk(up, http)
            chunks = list(
                client.chat.completions.create(
                    model="gpt-4o",
                    messages=MESSAGES,
                    stream=True,
                    extra_headers={"x-mock": "events=20&text=" + TEXT.replace(" ", "+"), "x-mock-id": mock_id},
                )
            )
        shown = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        row = proxy.mock_row(mock_id)
        assert [(v["rule_id"], v["action"]) for v in row["verdicts"]] == [
            ("filter_error", "block" if policy == "closed" else "flag")
        ]
        if policy == "closed":
            assert row["status"] == "blocked" and chunks[-1].choices[0].finish_reason == "content_filter"
            assert len(shown) <= 30
        else:
            assert (row["status"], shown) == ("completed", TEXT)
    finally:
        proxy.process.stop()


def test_a_blocked_tool_call_argument_stops_the_stream(tmp_path, upstreams):
    rules = tmp_path / "rules.toml"
    rules.write_text(
        '[[rule]]\nid = "no-vienna"\nkind = "keywords"\nkeywords = ["Vienna"]\nscope = "response"\naction = "block"\n'
    )
    proxy = start_proxy(tmp_path, "--set", f"llm_rules={rules}")
    try:
        up, mock_id = upstreams["h1"], uuid.uuid4().hex
        with http_client(proxy, "h1") as http:
            client = openai_sdk(up, http)
            chunks = list(
                client.chat.completions.create(
                    model="gpt-4o",
                    messages=MESSAGES,
                    stream=True,
                    extra_headers={"x-mock": "tool=get_weather&delay=0.02", "x-mock-id": mock_id},
                )
            )
        arguments = "".join(
            call.function.arguments or "" for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or []
        )
        assert "Vie" not in arguments and chunks[-1].choices[0].finish_reason == "content_filter"
        row = proxy.mock_row(mock_id)
        assert row["status"] == "blocked" and row["verdicts"][0]["location"].startswith("output.tool_calls[")
    finally:
        proxy.process.stop()
