"""Request bodies that only a lenient reader accepts are audited and filtered all the same.

The Python servers that host many models read requests with ``json.loads`` (NaN,
Infinity, 1e400, lone surrogate escapes, a byte order mark); the mock upstream reads them
the same way. Through a real mitmdump with blocking request and output rules, on both
backends: such a request is blocked when it should be, its answer is filtered, and every
exchange is recorded; a body no reader understands is recorded and, with request
filters, follows ``llm_filter_failure``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import orjson
import pytest
from conftest import BACKENDS, ROOT, Proxy, guarded_proxy, new_database, start_proxy

pytestmark = pytest.mark.e2e

RULES = ROOT / "tests" / "fixtures" / "bypass_rules.toml"
LENIENT = {
    "nan": b'"temperature": NaN',
    "infinity": b'"temperature": Infinity',
    "huge number": b'"temperature": 1e400',
    "lone surrogate": b'"user": "\\ud800"',
}


def chat_body(prompt: str, extra: bytes, stream: bool, bom: bool = False) -> bytes:
    body = b'{"model": "m", "stream": %s, %s, "messages": [{"role": "user", "content": %s}]}' % (
        b"true" if stream else b"false",
        extra,
        orjson.dumps(prompt),
    )
    return (b"\xef\xbb\xbf" if bom else b"") + body


@pytest.fixture(scope="module", params=BACKENDS)
def guarded(request, tmp_path_factory) -> Iterator[Proxy]:
    yield from guarded_proxy(request, tmp_path_factory, RULES, "lenient")


def post(proxy: Proxy, url: str, body: bytes, scenario: str = "events=3") -> tuple[str, object]:
    mock_id = uuid.uuid4().hex
    with proxy.client() as client:
        resp = client.post(
            f"{url}/v1/chat/completions",
            content=body,
            headers={"content-type": "application/json", "x-mock-id": mock_id, "x-mock": scenario},
        )
    return mock_id, resp


CASES = [*LENIENT.items(), ("byte order mark", b'"temperature": 0.5')]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("name, extra", CASES, ids=[c[0] for c in CASES])
def test_a_lenient_request_with_a_blocked_keyword_never_reaches_the_upstream(guarded, upstreams, name, extra, stream):
    mock_id, resp = post(
        guarded,
        upstreams["h1"].url,
        chat_body("Tell me about Project Nightjar", extra, stream, bom=name == "byte order mark"),
    )
    assert resp.status_code == (200 if stream else 400)
    row = guarded.mock_row(mock_id)
    assert (row["status"], row["dialect"]) == ("blocked", "openai-chat")
    assert "request_lenient_json" in [f["code"] for f in row["findings"]]
    assert upstreams["h1"].received(mock_id) == {}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("name, extra", CASES, ids=[c[0] for c in CASES])
def test_a_lenient_request_is_recorded_and_its_answer_filtered(guarded, upstreams, name, extra, stream):
    body = chat_body("hello", extra, stream, bom=name == "byte order mark")
    mock_id, resp = post(guarded, upstreams["h1"].url, body, "text=one forbidden-word two&events=3")
    assert b"forbidden-word" not in resp.content
    row = guarded.mock_row(mock_id)
    assert (row["status"], row["request_model"]) == ("blocked", "m")
    assert [v["rule_id"] for v in row["verdicts"]] == ["no-forbidden-answer"]
    mock_id, resp = post(guarded, upstreams["h1"].url, body, "text=all fine&events=2")
    row = guarded.mock_row(mock_id)
    assert (row["status"], row["output_text"]) == ("completed", "all fine")


def test_a_body_no_reader_understands_is_recorded_and_blocked_when_filters_check_requests(guarded, upstreams):
    mock_id, resp = post(guarded, upstreams["h1"].url, b'{"model": "m", "messages": [{"Project Nightjar')
    assert resp.status_code == 400
    row = guarded.mock_row(mock_id)
    assert (row["status"], row["dialect"]) == ("blocked", "openai-chat")
    assert [f["code"] for f in row["findings"]] == ["request_invalid_json"]
    assert [(v["action"], v["rule_id"]) for v in row["verdicts"]] == [
        ("block", "filter_error"),
        ("block", "no-project-nightjar"),
    ]
    assert row["request_body"].startswith('{"model": "m"')
    assert upstreams["h1"].received(mock_id) == {}


def test_a_body_no_reader_understands_is_recorded_without_filters(request, tmp_path, upstreams, backend):
    proxy = start_proxy(tmp_path, **new_database(request, backend, tmp_path))
    try:
        mock_id, resp = post(proxy, upstreams["h1"].url, b"not json at all")
        row = proxy.mock_row(mock_id)
        assert (row["dialect"], row["request_body"]) == ("openai-chat", "not json at all")
        assert "request_invalid_json" in [f["code"] for f in row["findings"]]
        assert upstreams["h1"].received(mock_id) != {}  # forwarded unchanged
    finally:
        proxy.process.stop()
