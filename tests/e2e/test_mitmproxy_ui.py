"""Inference exchanges inside mitmproxy's own UIs, with real processes.

- Flows saved by ``mitmdump -w`` carry, for each streamed exchange, exactly the bytes
  the client received (compressed as sent, cut where a content filter cut it), the
  flow list comment and the blocked marker, and render with the "LLM stream" view.
- mitmweb in headless Chromium (Debian's ``chromium``, the system browser: nothing is
  downloaded) shows the transcript of a captured stream and the comment in its flow list.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest
from conftest import BIN, ROOT, Process, Proxy, new_database, start_proxy, wait_for
from mitmproxy import contentviews, io
from mitmproxy.test import taddons

from addon.mitm import contentview

pytestmark = pytest.mark.e2e

RULES = """\
[[rule]]
id = "no-nightjar"
kind = "keywords"
keywords = ["Project Nightjar"]
scope = "response"
action = "block"
reason = "internal code name"
"""
CHAT = {
    "model": "gpt-4o",
    "stream": True,
    "stream_options": {"include_usage": True},
    "messages": [{"role": "user", "content": "Weather in Vienna?"}],
}
ANTHROPIC = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 256,
    "stream": True,
    "messages": [{"role": "user", "content": "Weather in Vienna?"}],
}
VIEW_BYTES = 20_000


def received(
    client: httpx.Client, url: str, body: dict, scenario: str, mock_id: str, headers: dict[str, str] | None = None
) -> bytes:
    """The response body bytes as they reached the client (still content-encoded)."""
    headers = {"x-mock": scenario, "x-mock-id": mock_id} | (headers or {})
    with client.stream("POST", url, json=body, headers=headers) as response:
        return b"".join(response.iter_raw())


def saved_flows(path: Path) -> dict[str, object]:
    """The flows ``mitmdump -w`` saved, by their request's ``x-mock-id``."""
    with path.open("rb") as f:
        return {flow.request.headers.get("x-mock-id"): flow for flow in io.FlowReader(f).stream()}


def view(flow, message) -> contentviews.ContentviewResult:
    with taddons.context():
        contentview.register()
        return contentviews.prettify_message(message, flow)


def test_saved_flows_without_filters_hold_the_body_and_comment(request, backend, tmp_path, upstreams):
    """Without content filters the auditor reads a stream in runs (``READ_RUN``); the last
    run is read in the ``response`` hook, before ``-w`` saves the flow, so the saved flow
    still has what the client received and the record's comment."""
    flows_file = tmp_path / "flows.mitm"
    p = start_proxy(tmp_path, "-w", str(flows_file), **new_database(request, backend, tmp_path))
    ids = {name: uuid.uuid4().hex for name in ("small", "runs")}
    try:
        with p.client() as client:
            url = f"{upstreams['h1'].url}/v1/chat/completions"
            got = {
                "small": received(client, url, CHAT, "events=6", ids["small"]),
                "runs": received(client, url, CHAT, "events=40&size=2000", ids["runs"]),  # over 32 KiB
            }
        rows = {name: p.mock_row(mock_id) for name, mock_id in ids.items()}
    finally:
        assert p.process.stop() == 0
    flows = saved_flows(flows_file)
    for name, mock_id in ids.items():
        flow, row = flows[mock_id], rows[name]
        assert flow.response.raw_content == got[name], name
        assert flow.comment == f"gpt-4o · {row['input_tokens']}→{row['output_tokens']} tok · completed", name
        assert row["output_text"] and row["status"] == "completed", name
    assert len(got["runs"]) > 2 * 32 * 1024  # read in several runs, the last in the hook


def test_saved_flows_hold_what_the_client_received_with_comment_and_marker(request, backend, tmp_path, upstreams):
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES)
    flows_file = tmp_path / "flows.mitm"
    p = start_proxy(
        tmp_path,
        "-w",
        str(flows_file),
        "--set",
        f"llm_rules={rules}",
        "--set",
        f"llm_audit_view_bytes={VIEW_BYTES}",
        upstream_ca=upstreams["h2"].ca,
        **new_database(request, backend, tmp_path),
    )
    ids = {name: uuid.uuid4().hex for name in ("h2", "gzip", "blocked", "big", "not-llm")}
    h1, h2 = upstreams["h1"].url, upstreams["h2"].url
    try:
        with p.client(http2=True) as client:
            got = {"h2": received(client, f"{h2}/v1/chat/completions", CHAT, "reasoning=1&tool=get_weather", ids["h2"])}
        with p.client() as client:
            got["gzip"] = received(
                client,
                f"{h1}/v1/messages",
                ANTHROPIC,
                "gzip=1&events=8",
                ids["gzip"],
                {"anthropic-version": "2023-06-01"},
            )
            got["blocked"] = received(
                client,
                f"{h1}/v1/chat/completions",
                CHAT,
                "text=The plan is called Project Nightjar, keep it quiet&events=10",
                ids["blocked"],
            )
            got["big"] = received(client, f"{h1}/v1/chat/completions", CHAT, "events=10&size=4000", ids["big"])
            got["not-llm"] = received(
                client,
                f"{h1}/v1/chat/completions",
                {"stream": True},  # no messages
                "raw=ZGF0YTogaGVsbG8KCg",
                ids["not-llm"],
            )  # "data: hello\n\n", no dialect's
        rows = {name: p.mock_row(mock_id) for name, mock_id in ids.items() if name != "not-llm"}
    finally:
        assert p.process.stop() == 0
    flows = saved_flows(flows_file)

    for name in ("h2", "gzip", "blocked"):
        flow, row = flows[ids[name]], rows[name]
        assert flow.response.raw_content == got[name], name  # exactly what was sent, not a byte more
        assert flow.metadata["llm_audit"]["id"] == row["id"]
        assert flow.comment.startswith(f"{row['request_model']} · ")
        result = view(flow, flow.response)
        assert result.view_name == "LLM stream"
        assert result.text.startswith(f"{row['dialect']} response · {row['status']}")
        if name != "blocked":
            assert row["output_text"] and row["output_text"] in result.text
    assert got["gzip"][:2] == b"\x1f\x8b" and flows[ids["gzip"]].response.headers["content-encoding"] == "gzip"

    h2_flow, h2_row = flows[ids["h2"]], rows["h2"]
    assert h2_flow.comment == f"gpt-4o · {h2_row['input_tokens']}→{h2_row['output_tokens']} tok · completed"
    assert h2_flow.marked == ""

    blocked, blocked_row = flows[ids["blocked"]], rows["blocked"]
    assert blocked_row["status"] == "blocked" and b"Nightjar" not in got["blocked"]
    assert blocked.marked == ":no_entry:" and blocked.comment.endswith("blocked by no-nightjar")
    assert "block  no-nightjar  internal code name" in view(blocked, blocked.response).text

    big = flows[ids["big"]]
    assert len(got["big"]) > VIEW_BYTES and big.response.raw_content is None  # over llm_audit_view_bytes
    assert big.comment.endswith("· completed")
    not_llm = flows[ids["not-llm"]]
    assert got["not-llm"] == b"data: hello\n\n"
    assert not_llm.response.raw_content is None and not_llm.comment == "" and "llm_audit" not in not_llm.metadata


# -- mitmweb in a real browser ----------------------------------------------------------------------


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def page_text(browser: str, url: str, profile: Path) -> str:
    """The page's text after its scripts ran (headless Chromium, ``--dump-dom``)."""
    args = [
        browser,
        "--headless",
        "--disable-gpu",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=10000",
        "--dump-dom",
        url,
    ]
    if os.geteuid() == 0:
        args.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
    done = subprocess.run(args, capture_output=True, text=True, timeout=90, check=False)
    text = re.sub(r"<[^>]+>", " ", done.stdout)
    return re.sub(r"\s+", " ", text.replace("&nbsp;", " "))


def test_mitmweb_in_headless_chromium_shows_the_transcript_of_a_stream(tmp_path, upstreams):
    browser = chromium()
    if browser is None:
        pytest.skip("chromium is not installed (scripts/test installs it with apt-get when it runs as root)")
    password, web_port = uuid.uuid4().hex, free_port()
    db_url = f"sqlite:///{tmp_path / 'audit.db'}"
    process = Process.start(
        [
            str(BIN / "mitmweb"),
            "--listen-host",
            "127.0.0.1",
            "--listen-port",
            "0",
            "-s",
            str(ROOT / "addon" / "llm_audit.py"),
            "--set",
            f"confdir={tmp_path / 'mitm'}",
            "--set",
            f"llm_audit_db={db_url}",
            "--set",
            "web_open_browser=false",
            "--set",
            f"web_port={web_port}",
            "--set",
            f"web_password={password}",
        ],
        env=os.environ | {"PYTHONUNBUFFERED": "1", "XDG_STATE_HOME": str(tmp_path / "state")},
    )
    try:
        proxy_port = process.wait_line(r"HTTP\(S\) proxy listening at .*:(\d+)", timeout=120).group(1)
        process.wait_line(r"Web server listening at")
        proxy = Proxy(f"http://127.0.0.1:{proxy_port}", db_url, tmp_path / "mitm", process)
        mock_id = uuid.uuid4().hex
        with proxy.client() as client:
            received(
                client, f"{upstreams['h1'].url}/v1/chat/completions", CHAT, "reasoning=1&tool=get_weather", mock_id
            )
        row = proxy.mock_row(mock_id)

        api = httpx.Client(base_url=f"http://127.0.0.1:{web_port}", headers={"authorization": f"Bearer {password}"})
        with api:
            flow_id = wait_for(
                lambda: next((f["id"] for f in api.get("/flows").json() if f["comment"]), None),
                what="the flow in mitmweb",
            )
        url = f"http://127.0.0.1:{web_port}/?token={password}#/flows/{flow_id}/response"
        text = wait_for(
            lambda: (t := page_text(browser, url, tmp_path / "chromium")) and row["output_text"] in t and t,
            timeout=120,
            interval=1,
            what="the transcript in mitmweb's page",
        )
        assert "LLM stream" in text  # the view mitmweb chose for the response
        assert "openai-chat response · completed" in text
        assert re.search(r"reasoning \S", text) and '"city": "Vienna"' in text
        assert f"gpt-4o · {row['input_tokens']}→{row['output_tokens']} tok · completed" in text  # Comment column
    finally:
        process.stop()
