"""Detection reads a request's path as sent, then as servers that decode it route it
(``addon.dialects.canonical_path``, ``addon.mitm.flow_record.line_views``).

uvicorn (vLLM, LiteLLM, every FastAPI server) and Go's net/http (Ollama) percent-decode a
path before routing it, and nginx merges repeated slashes and resolves dot segments: a
client that wrote ``/v1/chat/%63ompletions`` reached a chat completions endpoint while
no dialect knew the path, so the exchange went past the audit and the filters.
"""

from __future__ import annotations

import pytest
from mitmproxy.test import tutils

from addon.dialects import canonical_path
from addon.dialects.registry import detect_request, detect_websocket
from addon.mitm.flow_record import detect_by_line, line_views

CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("sent", "routed"),
    [
        ("/v1/chat/completions", "/v1/chat/completions"),
        ("/v1/chat/%63ompletions", "/v1/chat/completions"),
        ("/v1/chat%2Fcompletions", "/v1/chat/completions"),  # (uvicorn decodes %2F too)
        ("/v1/chat//completions", "/v1/chat/completions"),
        ("/v1/./chat/x/../completions", "/v1/chat/completions"),
        ("/%2e%2e/v1/chat/completions", "/v1/chat/completions"),
        ("/v1/chat/completions/", "/v1/chat/completions/"),
        ("/v1/chat/%2563ompletions", "/v1/chat/%63ompletions"),  # (decoded once, as the servers do)
        ("/a%ffb", "/a\ufffdb"),
        ("/a%ZZb", "/a%ZZb"),
        ("/v1/chat/completions;jsessionid=1", "/v1/chat/completions"),
        ("/v1;x=1/chat/completions%3Bv=2", "/v1/chat/completions"),
        ("//", "/"),
        ("/v1\\chat\\completions", "/v1/chat/completions"),  # (WHATWG URL parsers: Node, Deno, Workers)
        ("/v1/chat%5Ccompletions", "/v1/chat/completions"),
    ],
)
def test_a_path_as_servers_that_decode_it_route_it(sent: str, routed: str) -> None:
    assert canonical_path(sent) == routed


def request(path: str, method: str = "POST"):  # type: ignore[no-untyped-def]
    return tutils.treq(method=method.encode(), path=path.encode(), headers=((b"content-type", b"application/json"),))


def detected(path: str, body: object = CHAT):  # type: ignore[no-untyped-def]
    found = detect_by_line(line_views(request(path)), lambda view: detect_request(view, lambda: body))
    assert found is not None
    dialect, (view, finding) = found
    return dialect.name, view.path, finding.code if finding is not None else None


def test_a_path_no_dialect_knows_as_sent_is_read_as_servers_route_it_and_said() -> None:
    assert detected("/v1/chat/completions") == ("openai-chat", "/v1/chat/completions", None)
    assert detected("/v1/chat/%63ompletions") == ("openai-chat", "/v1/chat/completions", "request_path_obscured")
    # one dialect knows the line as sent (…/completions: the legacy API) but not its body
    assert detected("/v1/chat//completions") == ("openai-chat", "/v1/chat/completions", "request_path_obscured")
    assert detected("/V1/Chat/Completions") == ("openai-chat", "/v1/chat/completions", "request_path_obscured")
    assert detected("/v1\\chat\\completions") == ("openai-chat", "/v1/chat/completions", "request_path_obscured")
    gemini = "/v1beta/models/gemini-2.5-flash%3AstreamGenerateContent"  # (its clients encode the colon: no finding)
    assert detected(gemini, {"contents": []}) == ("gemini", gemini, None)


def test_a_bedrock_model_arn_is_read_as_sent_where_its_slashes_are_encoded() -> None:
    """AWS does not decode a path before routing it: the ARN's %2F is no separator there."""
    arn = "arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.amazon.nova-micro-v1%3A0"
    path = f"/model/{arn}/converse"
    assert detected(path, {"messages": []}) == ("bedrock", path, None)


def test_the_record_and_nobody_elses_path_keep_the_path_as_sent() -> None:
    assert [view.path for view, _ in line_views(request("/v1/models"))] == ["/v1/models"]
    views = line_views(request("/Static/a%20b.png", "GET"))
    assert [view.path for view, _ in views] == ["/Static/a%20b.png", "/Static/a b.png", "/static/a b.png"]
    assert (
        detect_by_line(line_views(request("/static/a%20b.png", "GET")), lambda view: detect_request(view, lambda: None))
        is None
    )


def test_a_websocket_upgrade_is_read_the_same_way() -> None:
    found = detect_by_line(
        line_views(request("/v1/%72ealtime?model=gpt-realtime", "GET")), lambda v: detect_websocket(v, None)
    )
    assert found is not None
    (dialect, _), (view, finding) = found
    assert (dialect.name, view.path, finding and finding.code) == (
        "openai-realtime",
        "/v1/realtime",
        "request_path_obscured",
    )


def test_a_session_id_among_a_paths_parameters_is_kept_as_its_fingerprint():
    """Java servers drop a segment's ``;`` parameters (``;jsessionid=``: a session, a
    credential): detection reads the path without them, and neither the record's path
    nor the finding keeps the id."""
    from addon.redact import redact_path, redacted

    sent = "/v1/chat/completions;jsessionid=F00DCAFE1234"
    assert redact_path(sent) == f"/v1/chat/completions;jsessionid={redacted('F00DCAFE1234')}"
    (_, _), (view, finding) = line_views(request(sent))[:2]
    assert view.path == "/v1/chat/completions" and finding is not None
    assert "F00DCAFE1234" not in finding.detail
