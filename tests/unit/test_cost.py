"""Cost (storage/cost.py): records of every HTTP dialect priced against genai-prices' own figures.

Each upstream answer below carries a rich usage (cache reads and writes, reasoning
tokens where the API reports them); it goes through the dialect as the proxy audits it
(tests/pipeline.py), and the record's cost must equal what genai-prices computes from
the same upstream JSON with its own usage extractor (``extract_usage``, the library's
reading of each provider's API), or, for APIs it has none for, from the counts as the
upstream sent them. Then: price files (matching, errors), NULL for anything unpriced,
and ``cost_of`` never raising on hostile rows.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import genai_prices
import pytest
from genai_prices.data_snapshot import DataSnapshot
from hypothesis import given, settings
from hypothesis import strategies as st
from pipeline import audit_bytes

from addon.dialects import Dialect, RequestView
from addon.dialects.anthropic import DIALECT as ANTHROPIC
from addon.dialects.bedrock import DIALECT as BEDROCK
from addon.dialects.gemini import DIALECT as GEMINI
from addon.dialects.llm_stream import DIALECT as LLM_STREAM
from addon.dialects.lmsp import DIALECT as LMSP
from addon.dialects.ollama import DIALECT as OLLAMA
from addon.dialects.openai_chat import DIALECT as OPENAI_CHAT
from addon.dialects.openai_completions import DIALECT as OPENAI_COMPLETIONS
from addon.dialects.openai_responses import DIALECT as OPENAI_RESPONSES
from mockllm.scenario import Scenario
from mockllm.streams import DIALECTS as MOCK
from storage.cost import GENAI_PRICES, UNKNOWN, Cost, PricesError, cost_of, load_prices

WHEN = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
LIBRARY = DataSnapshot(providers=genai_prices.data.providers, from_auto_update=False)


def view(path: str, query: str = "") -> RequestView:
    return RequestView("POST", path, query, {"content-type": "application/json"})


def audited(dialect: Dialect, path: str, request: dict, body: dict | bytes, provider: str | None, **kw: Any) -> dict:
    """The row the proxy would record for one non-streamed answer (times as the writer has them)."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    row = audit_bytes(
        dialect, raw, request=request, request_view=view(path), event_stream=False, provider=provider, **kw
    )
    return row | {"started_at": WHEN}


def library_price(body: dict, provider_id: str, flavor: str, model: str | None = None) -> Decimal:
    """genai-prices' own figure for an upstream answer: its extractor, its price list."""
    extracted = genai_prices.extract_usage(body, provider_id=provider_id, api_flavor=flavor)
    model_ref = model or extracted.model.id  # type: ignore[union-attr]
    return LIBRARY.calc(extracted.usage, model_ref, provider_id, None, WHEN).total_price


def dollars(value: Decimal) -> float:
    return float(value.quantize(Decimal("1e-12")))


# -- every HTTP dialect against genai-prices -----------------------------------------------------

CHAT = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": "o4-mini-2025-04-16",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    "usage": {
        "prompt_tokens": 1200,
        "completion_tokens": 300,
        "total_tokens": 1500,
        "prompt_tokens_details": {"cached_tokens": 256},
        "completion_tokens_details": {"reasoning_tokens": 192},
    },
}
COMPLETION = {
    "id": "cmpl-1",
    "object": "text_completion",
    "model": "gpt-3.5-turbo-instruct",
    "choices": [{"text": "hi", "index": 0, "finish_reason": "stop", "logprobs": None}],
    "usage": {"prompt_tokens": 700, "completion_tokens": 40, "total_tokens": 740},
}
RESPONSE = {
    "id": "resp_1",
    "object": "response",
    "model": "gpt-5-2025-08-07",
    "status": "completed",
    "output": [
        {"type": "message", "id": "msg_1", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]}
    ],
    "usage": {
        "input_tokens": 5000,
        "input_tokens_details": {"cached_tokens": 4096},
        "output_tokens": 900,
        "output_tokens_details": {"reasoning_tokens": 640},
        "total_tokens": 5900,
    },
}
MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5-20250929",
    "content": [{"type": "text", "text": "hi"}],
    "stop_reason": "end_turn",
    "usage": {
        "input_tokens": 900,
        "cache_read_input_tokens": 20000,
        "cache_creation_input_tokens": 3000,
        "output_tokens": 450,
    },
}
GEMINI_ANSWER = {
    "candidates": [{"content": {"role": "model", "parts": [{"text": "hi"}]}, "finishReason": "STOP", "index": 0}],
    "usageMetadata": {
        "promptTokenCount": 3000,
        "cachedContentTokenCount": 2048,
        "candidatesTokenCount": 250,
        "thoughtsTokenCount": 700,
        "totalTokenCount": 3950,
    },
    "modelVersion": "gemini-2.5-pro",
}
CONVERSE = {
    "output": {"message": {"role": "assistant", "content": [{"text": "hi"}]}},
    "stopReason": "end_turn",
    "usage": {
        "inputTokens": 800,
        "outputTokens": 120,
        "totalTokens": 11920,
        "cacheReadInputTokens": 10000,
        "cacheWriteInputTokens": 1000,
    },
    "metrics": {"latencyMs": 420},
}
BEDROCK_MODEL = "anthropic.claude-3-5-sonnet-20240620-v1:0"
MESSAGES_REQUEST = {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}

# dialect, path, request, answer, provider column, genai-prices provider and api flavour (the oracle)
PRICED = {
    "openai-chat": (
        OPENAI_CHAT,
        "/v1/chat/completions",
        {"model": "o4-mini", "messages": []},
        CHAT,
        "openai",
        "openai",
        "chat",
    ),
    "openai-chat on Azure": (
        OPENAI_CHAT,
        "/openai/deployments/prod-4o/chat/completions",
        {"messages": []},
        CHAT | {"model": "gpt-4o-2024-11-20"},
        "azure.ai.openai",
        "azure",
        "chat",
    ),
    "openai-chat on OpenRouter": (
        OPENAI_CHAT,
        "/api/v1/chat/completions",
        {"model": "openai/gpt-4o", "messages": []},
        CHAT | {"model": "openai/gpt-4o"},
        "openrouter",
        "openrouter",
        "chat",
    ),
    "openai-completions": (
        OPENAI_COMPLETIONS,
        "/v1/completions",
        {"model": "gpt-3.5-turbo-instruct", "prompt": "hi"},
        COMPLETION,
        "openai",
        "openai",
        "chat",
    ),
    "openai-responses": (
        OPENAI_RESPONSES,
        "/v1/responses",
        {"model": "gpt-5", "input": "hi"},
        RESPONSE,
        "openai",
        "openai",
        "responses",
    ),
    "anthropic-messages": (ANTHROPIC, "/v1/messages", MESSAGES_REQUEST, MESSAGE, "anthropic", "anthropic", "default"),
    "gemini": (
        GEMINI,
        "/v1beta/models/gemini-2.5-pro:generateContent",
        {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
        GEMINI_ANSWER,
        "gcp.gemini",
        "google",
        "default",
    ),
    "gemini on Vertex AI": (
        GEMINI,
        "/v1/projects/p/locations/us-central1/publishers/google/models/gemini-2.5-pro:generateContent",
        {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
        GEMINI_ANSWER,
        "gcp.vertex_ai",
        "google",
        "default",
    ),
}


@pytest.mark.parametrize("case", list(PRICED))
def test_a_recorded_exchange_costs_what_genai_prices_computes_from_the_upstream_answer(case):
    dialect, path, request, answer, provider, provider_id, flavor = PRICED[case]
    row = audited(dialect, path, request, answer, provider)
    expected = library_price(answer, provider_id, flavor)
    assert expected > 0
    assert cost_of(row) == Cost(dollars(expected), GENAI_PRICES)


def test_bedrock_converse_costs_what_genai_prices_computes():
    raw = json.dumps(CONVERSE).encode()
    row = audit_bytes(
        BEDROCK,
        raw,
        request={"messages": [{"role": "user", "content": [{"text": "hi"}]}]},
        request_view=RequestView("POST", f"/model/{BEDROCK_MODEL}/converse", "", {}),
        event_stream=False,
        content_type="application/json",
        provider="aws.bedrock",
    ) | {"started_at": WHEN}
    expected = library_price(CONVERSE, "aws", "default", BEDROCK_MODEL)
    assert expected > 0
    assert row["cache_read_input_tokens"] == 10000
    assert cost_of(row) == Cost(dollars(expected), GENAI_PRICES)


def test_gemini_reasoning_is_priced_as_output_as_google_bills_it():
    row = audited(*PRICED["gemini"][:5])
    assert row["output_tokens"] == 250 and row["reasoning_output_tokens"] == 700  # as the upstream reported them
    without = cost_of(row | {"reasoning_output_tokens": None})
    assert cost_of(row).usd > without.usd  # type: ignore[operator]


def test_the_price_in_force_when_the_exchange_started_is_taken():
    row = audited(*PRICED["anthropic-messages"][:5])
    assert cost_of(row).usd == cost_of(row | {"started_at": WHEN.replace(tzinfo=None)}).usd  # SQLite's naive UTC


def test_the_streams_of_the_mock_cost_what_genai_prices_computes_from_their_counts():
    request = {
        "model": "gpt-4o-mini",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "what is the weather in Graz today"}],
    }
    body = b"".join(MOCK["openai-chat"].stream(request, Scenario()))
    row = audit_bytes(OPENAI_CHAT, body, request=request, request_view=view("/v1/chat/completions"), provider="openai")
    usage = genai_prices.Usage(input_tokens=row["input_tokens"], output_tokens=row["output_tokens"])
    expected = LIBRARY.calc(usage, "gpt-4o-mini", "openai", None, WHEN).total_price
    assert row["input_tokens"] and cost_of(row | {"started_at": WHEN}) == Cost(dollars(expected), GENAI_PRICES)


# -- what has no price ---------------------------------------------------------------------------


def unpriced_rows() -> dict[str, dict]:
    """Records of the dialects whose provider has no price list: self-hosted and vendor-neutral APIs."""
    ollama = b'{"model":"llama3.1:8b","created_at":"2026-06-01T12:00:00Z","message":{"role":"assistant","content":"hi"},"done":true,"done_reason":"stop","prompt_eval_count":12,"eval_count":3}\n'
    llm_request = {"version": "1.0", "stream": True, "model": "m", "messages": [{"role": "user", "content": "hi"}]}
    lmsp_request = {"model": "qwen3:14b", "stream": True, "input": "hi"}
    return {
        "ollama": audit_bytes(
            OLLAMA,
            ollama,
            request={"model": "llama3.1:8b", "messages": []},
            request_view=view("/api/chat"),
            event_stream=False,
            provider="ollama",
        ),
        "llm-stream": audit_bytes(
            LLM_STREAM,
            b"".join(MOCK["llm-stream"].stream(llm_request, Scenario())),
            request=llm_request,
            request_view=RequestView("POST", "/v1/llm/stream", "", {"content-type": "application/llm-request+json"}),
            provider=None,
        ),
        "lmsp": audit_bytes(
            LMSP,
            b"".join(MOCK["lmsp"].stream(lmsp_request, Scenario())),
            request=lmsp_request,
            request_view=view("/lmsp/v1/responses"),
            provider="lmsp",
        ),
    }


@pytest.mark.parametrize("name", ["ollama", "llm-stream", "lmsp"])
def test_self_hosted_and_vendor_neutral_apis_cost_null_without_a_price_file(name):
    row = unpriced_rows()[name]
    assert row["input_tokens"] is not None and row["output_tokens"] is not None
    assert cost_of(row) == UNKNOWN


@pytest.mark.parametrize(
    "change",
    [
        {"response_model": "no-such-model-anywhere", "request_model": "nor-this"},
        {"provider": None},  # an unknown host: the provider is never guessed from the model
        {"provider": "windsurf", "dialect": "windsurf"},  # subscription products: no per-token price
        {"provider": "microsoft", "dialect": "copilot"},
        {"provider": "microsoft", "dialect": "copilot-chathub"},
        {"provider": "lmsp", "dialect": "lmsp"},
        {"input_tokens": None, "output_tokens": None},  # no usage reported
        {"cache_read_input_tokens": 10**6},  # more cached than sent: counts that contradict
        {
            "cache_read_input_tokens": 60,
            "cache_write_input_tokens": 60,
            "input_tokens": 100,
        },  # (genai-prices priced it)
        {"reasoning_output_tokens": 10**6},
        {"usage_details": {"output_audio_tokens": 10**6}},
        {"input_tokens": 2**62, "output_tokens": 2**62},  # beyond numeric(20, 12): unknown, the row still written
        {"request_model": "gpt-4o" + " " * 300, "response_model": None},  # no model's name (and a look-up's cost)
        {"input_tokens": -1},
        {"input_tokens": True},
        {"usage_details": {"input_audio_tokens": "many"}},
    ],
)
def test_an_exchange_whose_price_is_unknown_costs_null_never_a_guess(change):
    row = audited(*PRICED["openai-chat"][:5])
    assert cost_of(row).usd is not None
    assert cost_of(row | change) == UNKNOWN


def test_the_request_model_prices_it_when_the_response_model_is_not_listed():
    row = audited(*PRICED["openai-chat"][:5])
    renamed = row | {"response_model": "o4-mini-custom-snapshot", "request_model": "o4-mini-2025-04-16"}
    assert cost_of(renamed) == cost_of(row)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(list(audited(*PRICED["openai-chat"][:5]))), st.from_type(object) | st.none()))
def test_cost_of_never_raises(change):
    row = audited(*PRICED["openai-chat"][:5])
    result = cost_of(row | change)
    assert result == UNKNOWN or (isinstance(result.usd, float) and result.prices == GENAI_PRICES)


# -- price files ---------------------------------------------------------------------------------

PRICE_FILE = """\
# negotiated rates and the self-hosted models: US dollars per million tokens
[[price]]
provider = "openai"
model = "o4-mini*"
input = 1.0
output = 4.0
cache_read = 0.25

[[price]]
provider = "ollama"
model = "*"
input = 0
output = 0

[[price]]
model = "example-model*"   # no provider: any, also none (vendor-neutral llm-stream)
input = 0.5
output = 1.5
"""


def price_file(tmp_path: Path, text: str = PRICE_FILE) -> Path:
    path = tmp_path / "prices.toml"
    path.write_text(text)
    return path


def test_a_price_file_prices_before_genai_prices_and_names_itself(tmp_path):
    prices = load_prices(price_file(tmp_path))
    row = audited(*PRICED["openai-chat"][:5])
    # 1200 in (256 cached), 300 out (reasoning within it, priced as output)
    expected = (944 * 1.0 + 256 * 0.25 + 300 * 4.0) / 1e6
    cost = cost_of(row, prices)
    assert cost.usd == pytest.approx(expected, abs=1e-15)
    assert cost.prices == prices.label and prices.label.startswith("override:") and len(prices.label) == 21
    other = audited(*PRICED["anthropic-messages"][:5])
    assert cost_of(other, prices) == cost_of(other)  # no entry matches: genai-prices prices it


def test_a_price_file_prices_self_hosted_and_vendor_neutral_models(tmp_path):
    prices = load_prices(price_file(tmp_path))
    rows = unpriced_rows()
    assert cost_of(rows["ollama"], prices) == Cost(0.0, prices.label)
    llm = rows["llm-stream"] | {"response_model": "example-model-2026"}
    assert cost_of(llm, prices).usd == pytest.approx((llm["input_tokens"] * 0.5 + llm["output_tokens"] * 1.5) / 1e6)
    assert cost_of(rows["lmsp"], prices) == UNKNOWN  # none of its entries names lmsp


def test_reasoning_and_cache_writes_priced_apart_when_the_file_says_so(tmp_path):
    prices = load_prices(
        price_file(
            tmp_path,
            '[[price]]\nprovider = "anthropic"\nmodel = "claude-*"\ninput = 3\noutput = 15\n'
            "cache_read = 0.3\ncache_write = 3.75\nreasoning = 10\n",
        )
    )
    row = audited(*PRICED["anthropic-messages"][:5]) | {"reasoning_output_tokens": 100}
    expected = (900 * 3 + 20000 * 0.3 + 3000 * 3.75 + 350 * 15 + 100 * 10) / 1e6
    assert cost_of(row, prices).usd == pytest.approx(expected, abs=1e-15)


@pytest.mark.parametrize(
    ("text", "line", "says"),
    [
        ("[[price]]\nmodel = 'x'\ninput = 1\noutput = \n", 4, "not valid TOML"),
        ("[[price]]\nmodel = 'x'\ninput = 1\n", 1, "output is missing"),
        (
            "[[price]]\nmodel = 'a'\ninput = 1\noutput = 1\n\n[[price]]\nmodel = 'b'\ninput = -1\noutput = 1\n",
            6,
            "input = -1 is not a price",
        ),
        ("[[price]]\nmodel = 'x'\ninput = 1\noutput = 1\ncached = 1\n", 1, "unknown key 'cached'"),
        ("[[price]]\ninput = 1\noutput = 1\n", 1, "model must be a pattern"),
        ("[[price]]\nmodel = 'x'\ninput = '1'\noutput = 1\n", 1, "is not a price"),
        ("[prices]\nmodel = 'x'\n", None, "unknown table or key 'prices'"),
        ("# nothing yet\n", None, "no [[price]] entries"),
        ("x = " + "[" * 100_000 + "]" * 100_000 + "\n", None, "nested too deeply"),  # tomllib's RecursionError
        ("[[price]]\nmodel = 'x'\ninput = inf\noutput = 1\n", 1, "input = inf is not a price"),
        ("[[price]]\nmodel = 'x'\ninput = 1\noutput = nan\n", 1, "output = nan is not a price"),
    ],
)
def test_a_bad_price_file_is_one_line_naming_the_file_line_and_fix(tmp_path, text, line, says):
    path = price_file(tmp_path, text)
    with pytest.raises(PricesError) as e:
        load_prices(path)
    message = str(e.value)
    assert "\n" not in message and says in message
    assert message.startswith(f"{path}:{line}:" if line is not None else f"{path}:")


def test_a_missing_price_file_is_one_line(tmp_path):
    with pytest.raises(PricesError, match=r"cannot read the price file .*; name an existing file"):
        load_prices(tmp_path / "nope.toml")


def test_the_provider_table_of_the_docs_is_the_code_s():
    from storage.cost import PROVIDERS

    text = (Path(__file__).resolve().parents[2] / "docs" / "cost.md").read_text()
    rows = dict(
        (cells[0].strip("` "), cells[1].split("(")[0].strip("` "))
        for line in text.splitlines()
        if line.startswith("| `") and len(cells := line.strip("|").split("|")) == 2
    )
    rows.pop("provider")  # the header
    assert rows == PROVIDERS


def test_google_s_models_prefix_is_looked_up_without_it():
    row = audited(*PRICED["gemini"][:5])
    assert cost_of(row | {"response_model": None, "request_model": "models/gemini-2.5-pro"}) == cost_of(row)


def test_claude_on_vertex_ai_is_priced_at_google_s_list_which_falls_back_to_anthropic_s():
    from addon.dialects.anthropic_vertex import DIALECT as ANTHROPIC_VERTEX

    model = "claude-sonnet-4-5@20250929"
    path = f"/v1/projects/p/locations/us-east5/publishers/anthropic/models/{model}:rawPredict"
    request = {"anthropic_version": "vertex-2023-10-16", "max_tokens": 100, "messages": []}
    row = audited(ANTHROPIC_VERTEX, path, request, MESSAGE | {"model": model}, "gcp.vertex_ai")
    usage = genai_prices.extract_usage(MESSAGE, provider_id="anthropic").usage
    expected = LIBRARY.calc(usage, model, "google", None, WHEN).total_price
    assert expected > 0 and cost_of(row) == Cost(dollars(expected), GENAI_PRICES)


def test_cursor_s_own_models_are_priced_and_the_others_are_unknown():
    row = audited(*PRICED["openai-chat"][:5]) | {"dialect": "cursor", "provider": "cursor"}
    listed = row | {"response_model": "composer-2.5", "request_model": None}
    usage = genai_prices.Usage(input_tokens=1200, output_tokens=300, cache_read_tokens=256, output_reasoning_tokens=192)
    expected = LIBRARY.calc(usage, "composer-2.5", "cursor", None, WHEN).total_price
    assert cost_of(listed) == Cost(dollars(expected), GENAI_PRICES)
    assert cost_of(row | {"response_model": "claude-4-sonnet", "request_model": None}) == UNKNOWN


def test_a_model_the_list_does_not_name_stays_unknown_when_looked_up_again():
    row = audited(*PRICED["openai-chat"][:5]) | {"response_model": "house-llm", "request_model": "house-llm"}
    assert cost_of(row) == cost_of(row) == UNKNOWN
    assert cost_of(row | {"response_model": "o4-mini-2025-04-16"}).usd is not None


def test_the_proxy_option_loads_the_file_and_a_bad_one_at_run_time_keeps_the_prices_in_force(
    tmp_path, caplog, monkeypatch
):
    from mitmproxy.test import taddons

    from addon.mitm.store import AuditStore

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # its own spool and keys
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    good, bad = price_file(tmp_path), tmp_path / "bad.toml"
    bad.write_text('[[price]]\nmodel = "x"\noutput = 1\n')
    store = AuditStore()
    with taddons.context(store, loadcore=False) as tctx:
        tctx.configure(store, llm_audit_prices=str(good), llm_audit_db=f"sqlite:///{tmp_path / 'audit.db'}")
        assert store.prices is not None and store.writer is not None and store.writer.prices is store.prices
        in_force = store.prices
        store.serving = True
        tctx.configure(store, llm_audit_prices=str(bad))
        assert store.prices is in_force and store.writer.prices is in_force
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert errors == [
            f"llm-audit: {bad}:1: price entry 1: input is missing; give US dollars per million tokens (input = 2.5); the previous prices stay in force"
        ]
        tctx.configure(store, llm_audit_prices="")
        assert store.prices is None and store.writer.prices is None
        store.done()


def test_a_client_s_huge_model_name_costs_the_writer_no_time(tmp_path):
    """A look-up reads the name once per pattern of the list: a 1 MB name took 0.3 s of the
    writer's thread per record (more on OpenRouter's list), and as long in a price file."""
    import time

    row = audited(*PRICED["openai-chat"][:5]) | {"response_model": None, "request_model": "x" * 10**6}
    prices = load_prices(price_file(tmp_path))
    started = time.perf_counter()
    for provider in ("openai", "openrouter"):
        assert cost_of(row | {"provider": provider}) == UNKNOWN
        assert cost_of(row | {"provider": provider}, prices) == UNKNOWN
    assert time.perf_counter() - started < 0.05


def test_counts_that_are_no_token_counts_are_not_recorded_and_say_so():
    """The upstream's bytes: a negative count took from every sum, two of 2**62 overflowed
    exchange_view.total_tokens on PostgreSQL (no SELECT of the view over that row)."""
    dialect, path, request, body, provider = PRICED["openai-chat"][:5]
    hostile = body | {"usage": {"prompt_tokens": -5, "completion_tokens": 2**62, "total_tokens": 1}}
    row = audited(dialect, path, request, hostile, provider)
    assert (row["input_tokens"], row["output_tokens"]) == (None, None)
    details = [f["detail"] for f in row["findings"] if f["code"] == "usage_invalid"]
    assert details == [
        "input_tokens = -5 is not a token count; not recorded",
        f"output_tokens = {2**62} is not a token count; not recorded",
    ]
    assert cost_of(row) == UNKNOWN
    fine = audited(dialect, path, request, body | {"usage": {"prompt_tokens": 2**53, "completion_tokens": 0}}, provider)
    assert fine["input_tokens"] == 2**53 and not [f for f in fine["findings"] if f["code"] == "usage_invalid"]
