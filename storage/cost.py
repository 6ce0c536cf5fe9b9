"""What an exchange cost: US dollars from its provider, model and recorded usage.

The price data is `genai-prices <https://github.com/pydantic/genai-prices>`_ (Pydantic's
price list: every major provider, cache reads and writes, modality prices, tiers and
price changes over time, kept up to date in small releases). Only the snapshot bundled
with the installed release is used (:data:`SNAPSHOT`): the library's auto-update, which
would fetch prices from GitHub at run time, is never started (a security product on a
proxy makes no call home, and a price must be reproducible from a named version). A
price update is a package update (``pip install -U genai-prices``), followed by
``llm-audit cost recompute``.

A price file (:func:`load_prices`, TOML; docs/cost.md) overrides the library for
negotiated rates and self-hosted models: its first entry whose provider and model
patterns match prices the exchange.

The cost is NULL, never a guess, when the price is not known: no usage reported, a
provider the price data does not name for sure (a self-hosted server, an unknown host:
the provider is never guessed from the model name), a model it does not list, or counts
that contradict each other. Cost is derived data: it stays out of the hash chain
(:data:`storage.chain.DERIVED_COLUMNS`), and is computed again from the chained usage
when prices change.

:func:`cost_of` is the one entry point; it never raises. It runs on the writer thread
(:mod:`storage.writer`), never on the event loop: a first lookup of a model costs some
milliseconds.
"""

from __future__ import annotations

import fnmatch
import hashlib
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, NamedTuple

import genai_prices
from genai_prices.data import providers as _bundled_providers
from genai_prices.data_snapshot import DataSnapshot
from genai_prices.types import ModelPrice

GENAI_PRICES = f"genai-prices {genai_prices.__version__}"  # the cost_prices of a library price
# The bundled price list, as a snapshot of our own: genai_prices.calc_price would use a
# snapshot an UpdatePrices started anywhere in the process had fetched.
SNAPSHOT = DataSnapshot(providers=_bundled_providers, from_auto_update=False)
MODEL_CHARS_MAX = 200  # the longest name looked up (a Bedrock inference profile's ARN is some 100)
SCALE = Decimal("1e-12")  # the column's 12 decimal places (storage.schema.Money)

# gen_ai.provider.name (the provider column; addon/dialects/providers.py) -> genai-prices
# provider id. Hosts that resell models price them as the host does: Azure, Vertex AI
# (Claude on Vertex through genai-prices' fallback to Anthropic's list), Bedrock,
# OpenRouter. Not here, so NULL unless a price file prices them: ollama, lmsp, windsurf,
# microsoft (consumer Copilot: no per-token price), and exchanges with no provider.
PROVIDERS: dict[str, str] = {
    "openai": "openai",
    "azure.ai.openai": "azure",
    "azure.ai.inference": "azure",
    "anthropic": "anthropic",
    "gcp.gemini": "google",
    "gcp.vertex_ai": "google",
    "aws.bedrock": "aws",
    "mistral_ai": "mistral",
    "cohere": "cohere",
    "groq": "groq",
    "deepseek": "deepseek",
    "x_ai": "x-ai",
    "perplexity": "perplexity",
    "openrouter": "openrouter",
    "together_ai": "together",
    "cursor": "cursor",
}
# Dialects whose output_tokens leave the reasoning out (Gemini's candidatesTokenCount
# beside thoughtsTokenCount); genai-prices counts reasoning within the output.
_REASONING_APART = frozenset({"gemini", "gemini-live"})
# usage_details keys (addon.events.Usage) that genai-prices prices by modality, same names
_DETAILS = (
    "input_text_tokens",
    "input_audio_tokens",
    "input_image_tokens",
    "output_text_tokens",
    "output_audio_tokens",
)


# (provider id, model) the list does not name: a miss searches every model of the provider
# (and its fallbacks) again, some 100 us, for each record of a self-hosted model; bounded,
# as model names come from the traffic. Touched by one thread at a time (the writer's, or
# the CLI's); a lost update only costs a lookup.
_UNLISTED: set[tuple[str, str]] = set()
_UNLISTED_MAX = 4096


# the columns of a row that cost_of reads
COLUMNS = (
    "started_at",
    "dialect",
    "provider",
    "request_model",
    "response_model",
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_write_input_tokens",
    "reasoning_output_tokens",
    "usage_details",
)


class Cost(NamedTuple):
    """An exchange's ``cost_usd`` and ``cost_prices`` (both None when the price is unknown)."""

    usd: float | None
    prices: str | None


UNKNOWN = Cost(None, None)


class PricesError(ValueError):
    """A price file that cannot be used; the message is one line naming the file, line and fix."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One ``[[price]]`` of a price file: glob patterns (lower case) and its prices."""

    provider: str
    model: str
    price: ModelPrice


@dataclass(frozen=True, slots=True)
class Prices:
    """A loaded price file: its entries in order, and the ``cost_prices`` it stamps."""

    entries: tuple[Entry, ...]
    label: str  # override:<first 12 hex digits of the file's SHA-256>
    path: str

    def find(self, provider: str | None, model: str) -> Entry | None:
        """The first entry matching, or None. A row without provider matches only ``*``."""
        model = model.lower()
        for entry in self.entries:
            if provider is None:
                if entry.provider != "*":
                    continue
            elif not fnmatch.fnmatchcase(provider.lower(), entry.provider):
                continue
            if fnmatch.fnmatchcase(model, entry.model):
                return entry
        return None


def cost_of(row: Mapping[str, Any], prices: Prices | None = None) -> Cost:
    """What the exchange of ``row`` (a row of ``exchanges``) cost, and by which price data.

    The model is the response model (what served it), else the request model; the price
    in force at ``started_at`` is taken (genai-prices knows price changes). ``prices``: a
    price file, tried first. Never raises: anything unpriceable is :data:`UNKNOWN`.
    """
    try:
        return _cost(row, prices)
    except Exception:  # noqa: BLE001 - hostile rows, a library surprise: the price is unknown, the record goes on
        return UNKNOWN


def _cost(row: Mapping[str, Any], prices: Prices | None) -> Cost:
    usage = _usage(row)
    if usage is None:
        return UNKNOWN
    models = _names(row.get("response_model"), row.get("request_model"))
    provider = row.get("provider") if isinstance(row.get("provider"), str) else None
    when = row.get("started_at")
    when = when if isinstance(when, datetime) else None
    if when is not None and when.tzinfo is None:
        when = when.replace(tzinfo=UTC)  # SQLite gives naive UTC times
    if prices is not None:
        for model in models:
            if (entry := prices.find(provider, model)) is not None:
                return _rounded(entry.price.calc_price(genai_prices.Usage(**usage))["total_price"], prices.label)
    provider_id = PROVIDERS.get(provider or "")
    if provider_id is None:
        return UNKNOWN
    for model in models:
        if (provider_id, model) in _UNLISTED:
            continue
        try:
            calc = SNAPSHOT.calc(genai_prices.Usage(**usage), model, provider_id, None, when)
        except LookupError:  # not in the list under this name: the next name, else unknown
            if len(_UNLISTED) >= _UNLISTED_MAX:
                _UNLISTED.clear()
            _UNLISTED.add((provider_id, model))
            continue
        return _rounded(calc.total_price, GENAI_PRICES)
    return UNKNOWN


def _names(*models: Any) -> list[str]:
    """The model names to look up, in order: each as recorded, then without the resource
    path Google's APIs put before it (``models/gemini-2.5-flash``,
    ``publishers/google/models/...``). A name longer than :data:`MODEL_CHARS_MAX` is no
    model's: not looked up (a look-up reads the name once per pattern of the list, 0.3 s
    for a client's 1 MB name, on the writer's thread)."""
    out: list[str] = []
    for model in models:
        if isinstance(model, str) and model and len(model) <= MODEL_CHARS_MAX:
            out += [model] if "models/" not in model else [model, model.rsplit("models/", 1)[1]]
    return list(dict.fromkeys(name for name in out if name))


def _usage(row: Mapping[str, Any]) -> dict[str, int] | None:
    """genai-prices' usage names for the row's counts; None when there is nothing to price
    or a count is not a count."""
    names = {
        "input_tokens": "input_tokens",
        "output_tokens": "output_tokens",
        "cache_read_input_tokens": "cache_read_tokens",
        "cache_write_input_tokens": "cache_write_tokens",
        "reasoning_output_tokens": "output_reasoning_tokens",
    }
    usage: dict[str, int] = {}
    for column, name in names.items():
        value = row.get(column)
        if value is None:
            continue
        if not _count(value):
            return None
        usage[name] = value
    details = row.get("usage_details")
    if isinstance(details, Mapping):
        for name in _DETAILS:
            value = details.get(name)
            if value is None:
                continue
            if not _count(value):
                return None
            usage[name] = value
    if "input_tokens" not in usage and "output_tokens" not in usage:
        return None
    if row.get("dialect") in _REASONING_APART and "output_reasoning_tokens" in usage:
        usage["output_tokens"] = usage.get("output_tokens", 0) + usage["output_reasoning_tokens"]
    return usage if _consistent(usage) else None


def _consistent(usage: Mapping[str, int]) -> bool:
    """Whether the parts fit in their wholes: cache reads and writes within the input,
    reasoning within the output, each modality's within its side. genai-prices refuses
    some contradictions, not all (cache reads and writes beyond the input on OpenAI's
    list price a negative uncached input into a total that looks right): counts that
    contradict each other are the upstream's error or a lie, and their price a guess."""
    inp, out = usage.get("input_tokens", 0), usage.get("output_tokens", 0)
    parts = (
        (inp, ("cache_read_tokens", "cache_write_tokens")),
        (out, ("output_reasoning_tokens",)),
        (inp, ("input_text_tokens", "input_audio_tokens", "input_image_tokens")),
        (out, ("output_text_tokens", "output_audio_tokens")),
    )
    return all(sum(usage.get(name, 0) for name in names) <= whole for whole, names in parts)


def _count(value: Any) -> bool:
    return type(value) is int and 0 <= value < 2**63


def _rounded(total: Decimal, label: str) -> Cost:
    """The cost as stored: 12 decimal places, as a float (storage.schema.Money says why)."""
    usd = float(total.quantize(SCALE))
    return Cost(usd, label) if math.isfinite(usd) and 0 <= usd < 1e8 else UNKNOWN


# -- price files ----------------------------------------------------------------------------------

# an entry's price keys -> genai-prices' (US dollars per million tokens)
PRICE_KEYS = {
    "input": "input_mtok",
    "output": "output_mtok",
    "cache_read": "cache_read_mtok",
    "cache_write": "cache_write_mtok",
    "reasoning": "output_reasoning_mtok",
    "input_audio": "input_audio_mtok",
    "output_audio": "output_audio_mtok",
}
_TOML_AT = re.compile(r"\s*\(at line (\d+), column \d+\)")
_ENTRY_HEADER = re.compile(r"^[ \t]*\[\[[ \t]*(?:\"price\"|'price'|price)[ \t]*\]\]", re.MULTILINE)


def load_prices(path: str | Path) -> Prices:
    """Read a price file (docs/cost.md); :class:`PricesError` with one line if it is unusable."""
    path = Path(path).expanduser()
    try:
        data = path.read_bytes()
    except OSError as e:
        raise PricesError(f"{path}: cannot read the price file ({e.strerror}); name an existing file") from None
    try:
        text = data.decode()
        doc = tomllib.loads(text)
    except UnicodeDecodeError:
        raise PricesError(f"{path}: not UTF-8 text; save the price file as UTF-8 TOML") from None
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise PricesError(f"{path}: nested too deeply to be a price file; write flat [[price]] tables") from None
    except tomllib.TOMLDecodeError as e:
        at = _TOML_AT.search(str(e))  # Python 3.12's error has the line only in its text
        where = f"{path}:{at.group(1)}" if at else str(path)
        raise PricesError(f"{where}: not valid TOML: {_TOML_AT.sub('', str(e)).strip()}; fix that line") from None
    lines = [text.count("\n", 0, m.start()) + 1 for m in _ENTRY_HEADER.finditer(text)]
    unknown = sorted(set(doc) - {"price"})
    if unknown:
        raise PricesError(f"{path}: unknown table or key {unknown[0]!r}; write each price as a [[price]] table")
    raw = doc.get("price", [])
    if not isinstance(raw, list) or not raw:
        raise PricesError(f"{path}: no [[price]] entries; add one (provider, model, input and output per million)")
    entries = tuple(_entry(path, lines[i] if i < len(lines) else None, i + 1, item) for i, item in enumerate(raw))
    label = f"override:{hashlib.sha256(data).hexdigest()[:12]}"
    return Prices(entries, label, str(path))


def _entry(path: Path, line: int | None, number: int, item: Any) -> Entry:
    where = f"{path}:{line}" if line is not None else f"{path}"
    what = f"price entry {number}"
    if not isinstance(item, dict):
        raise PricesError(f"{where}: {what} is not a table; write it as [[price]] with keys under it")
    allowed = {"provider", "model", *PRICE_KEYS}
    extra = sorted(set(item) - allowed)
    if extra:
        raise PricesError(f"{where}: {what}: unknown key {extra[0]!r}; use {', '.join(sorted(allowed))}")
    patterns = {}
    for key, default in (("provider", "*"), ("model", None)):
        value = item.get(key, default)
        if not isinstance(value, str) or not value:
            raise PricesError(f'{where}: {what}: {key} must be a pattern in quotes (e.g. {key} = "*")')
        patterns[key] = value.lower()
    amounts: dict[str, Decimal] = {}
    for key, price_key in PRICE_KEYS.items():
        if key not in item:
            if key in ("input", "output"):
                raise PricesError(
                    f"{where}: {what}: {key} is missing; give US dollars per million tokens ({key} = 2.5)"
                )
            continue
        value = item[key]
        try:
            amount = Decimal(str(value)) if type(value) in (int, float) else None
        except InvalidOperation:
            amount = None
        if amount is None or not amount.is_finite() or amount < 0:
            raise PricesError(
                f"{where}: {what}: {key} = {value!r} is not a price; give a number >= 0 (dollars per million tokens)"
            )
        amounts[price_key] = amount
    return Entry(patterns["provider"], patterns["model"], ModelPrice(**amounts))
