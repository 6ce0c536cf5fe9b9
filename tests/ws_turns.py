"""A WebSocket connection's server messages read as the proxy reads them, for the
WebSocket dialect unit tests: each message through the ``ws_json`` reader into the
connection's one normalizer, one record per turn (cut at each TurnEnd)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson
from hypothesis import strategies as st

from addon.dialects import Normalizer
from addon.events import Event, TurnEnd
from addon.framing import Frame, Message
from addon.framing.ws_json import reader
from addon.record import ExchangeRecord

MAX_EVENT_BYTES = 1 << 20
SAMPLES = Path(__file__).resolve().parents[1].parent / "shared" / "reference" / "protocol-samples"


def events(normalizer: Normalizer, messages: Iterable[str | bytes | dict]) -> list[Event]:
    """Every event the normalizer gives for ``messages`` (dicts are encoded as JSON)."""
    read = reader(MAX_EVENT_BYTES, MAX_EVENT_BYTES, {})
    out: list[Event] = []
    for message in messages:
        data = json.dumps(message) if isinstance(message, dict) else message  # (integers of any size)
        for frame in read.feed(data.encode() if isinstance(data, str) else data):
            out += normalizer.on_event(frame)
    return out


def turns(normalizer: Normalizer, messages: Iterable[str | bytes | dict]) -> list[ExchangeRecord]:
    """The records of the turns ``messages`` carry; a last turn without its end included."""
    records = [ExchangeRecord(dialect="test")]
    for event in events(normalizer, messages):
        records[-1].apply(event)
        if isinstance(event, TurnEnd):
            records.append(ExchangeRecord(dialect="test"))
    last = records[-1]
    if not (last.choices or last.tool_calls or last.usage or last.findings or last.error_code):
        records.pop()
    return records


def text(record: ExchangeRecord, kind: str = "text") -> str:
    choice = record.choices.get(0)
    if choice is None:
        return ""
    return "".join(choice.text if kind == "text" else choice.reasoning)


def client(data: str | dict) -> Frame:
    """A client message as the adapter hands it to ``on_client``."""
    return Message(data if isinstance(data, str) else orjson.dumps(data).decode())


def parsed(frames: list[Frame]) -> list[dict]:
    """Frames the proxy sends, each one JSON object (as the client's SDK parses them)."""
    out = [orjson.loads(f.data) for f in frames]
    assert all(isinstance(o, dict) for o in out)
    return out


def hostile_messages(name_key: str, names: Sequence[str], keys: Sequence[str]) -> st.SearchStrategy[dict[str, Any]]:
    """Messages of a protocol's kinds (``name_key`` one of ``names``) whose fields, named
    from ``keys``, hold any JSON: wrong types, huge integers, nesting where text belongs."""
    leaf = (
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=6) | st.sampled_from(names)
    )  # fmt: skip
    value = st.recursive(
        leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(keys), inner, max_size=4),
        max_leaves=12,
    )  # fmt: skip
    fields = st.dictionaries(st.sampled_from(keys), value, max_size=6)
    return st.builds(lambda name, more: {name_key: name, **more}, st.sampled_from(names), fields)
