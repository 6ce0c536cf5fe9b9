"""Cost through the real proxy: mitmdump with the addon, the mock upstream, SQLite and PostgreSQL.

Each exchange's recorded ``cost_usd`` must be genai-prices' own figure for the answer the
upstream sent (its usage extractor run on the bytes the mock wrote, its price list); a
price file given with ``llm_audit_prices`` prices what the library cannot (a
vendor-neutral llm-stream model); a bad price file stops the proxy at start with one
line naming the file and line; the chains verify.
"""

from __future__ import annotations

import subprocess
import uuid
from datetime import UTC, datetime
from decimal import Decimal

import genai_prices
import orjson
import pytest
from conftest import BIN, Proxy, Upstream, mitmdump_at_start, new_database, start_proxy

from storage.cost import GENAI_PRICES, SNAPSHOT

pytestmark = pytest.mark.e2e

PRICES = """\
[[price]]
model = "house-model*"   # a self-hosted model behind a vendor-neutral API
input = 0.5
output = 2.0
"""

# path, request, genai-prices provider and api flavour (the oracle)
CASES = {
    "openai-chat": (
        "/v1/chat/completions",
        {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "what is the weather in Graz today"}]},
        "openai",
        "chat",
    ),
    "openai-responses": (
        "/v1/responses",
        {"model": "gpt-5-mini", "input": "tell me about Graz please"},
        "openai",
        "responses",
    ),
    "anthropic-messages": (
        "/v1/messages",
        {"model": "claude-sonnet-4-5", "max_tokens": 200, "messages": [{"role": "user", "content": "hello there"}]},
        "anthropic",
        "default",
    ),
    "gemini": (
        "/v1beta/models/gemini-2.5-flash:generateContent",
        {"contents": [{"role": "user", "parts": [{"text": "how warm is it in Graz"}]}]},
        "google",
        "default",
    ),
}


def send(proxy: Proxy, up: Upstream, path: str, body: dict, headers: dict[str, str] | None = None) -> str:
    mock_id = uuid.uuid4().hex
    with proxy.client() as client:
        resp = client.post(
            f"{up.url}{path}",
            content=orjson.dumps(body),
            headers={"content-type": "application/json", "x-mock": "events=4&reasoning", "x-mock-id": mock_id}
            | (headers or {}),
        )
    assert resp.status_code == 200, resp.text
    return mock_id


def library_figure(sent: bytes, provider_id: str, flavor: str, started: datetime) -> float:
    extracted = genai_prices.extract_usage(orjson.loads(sent), provider_id=provider_id, api_flavor=flavor)
    model = extracted.model.id if extracted.model is not None else None
    assert model is not None
    total = SNAPSHOT.calc(extracted.usage, model, provider_id, None, started).total_price
    return float(total.quantize(Decimal("1e-12")))


def started_at(row: dict) -> datetime:
    value = row["started_at"]
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def test_recorded_costs_are_genai_prices_figures_for_what_the_upstream_sent(request, tmp_path, upstreams, backend):
    up = upstreams["h1"]
    prices = tmp_path / "prices.toml"
    prices.write_text(PRICES)
    proxy = start_proxy(tmp_path, "--set", f"llm_audit_prices={prices}", **new_database(request, backend, tmp_path))
    try:
        for name, (path, body, provider_id, flavor) in CASES.items():
            mock_id = send(proxy, up, path, body)
            row = proxy.mock_row(mock_id)
            expected = library_figure(up.sent(mock_id)["body"], provider_id, flavor, started_at(row))
            assert expected > 0, name
            assert (float(row["cost_usd"]), row["cost_prices"]) == (pytest.approx(expected, abs=1e-12), GENAI_PRICES), (
                name
            )

        llm = {
            "version": "1.0",
            "stream": True,
            "model": "house-model-7b",
            "messages": [{"role": "user", "content": "hi"}],
        }
        mock_id = send(proxy, up, "/v1/llm/stream", llm, {"content-type": "application/llm-request+json"})
        row = proxy.mock_row(mock_id)
        assert row["provider"] is None and row["input_tokens"] and row["output_tokens"]
        assert float(row["cost_usd"]) == pytest.approx((row["input_tokens"] * 0.5 + row["output_tokens"] * 2.0) / 1e6)
        assert row["cost_prices"].startswith("override:")

        unknown = send(proxy, up, "/v1/chat/completions", {"model": "no-such-model-1", "messages": []})
        assert proxy.mock_row(unknown)["cost_usd"] is None
    finally:
        proxy.process.stop()
    out = subprocess.run([str(BIN / "llm-audit"), "--db", proxy.db_url, "verify"], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_bad_price_file_stops_the_proxy_at_start_in_one_line(tmp_path):
    prices = tmp_path / "prices.toml"
    prices.write_text('[[price]]\nmodel = "x"\ninput = 1\noutput = "cheap"\n')
    proc = mitmdump_at_start(
        tmp_path,
        f"llm_audit_prices={prices}",
        env={"XDG_STATE_HOME": str(tmp_path / "state"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out
    lines = [line for line in out.splitlines() if f"{prices}:1:" in line and "llm-audit:" in line]
    assert len(lines) == 1 and "output = 'cheap' is not a price" in lines[0], out
