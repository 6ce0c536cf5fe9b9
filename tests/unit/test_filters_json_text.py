"""Tool-call arguments read as the tool reads them: JSON string escapes decoded, however cut."""

from __future__ import annotations

import json
import random

import pytest

from addon.filters.json_text import JsonEscapes

TEXTS = [
    '{"city": "Vi\\u0065nna", "note": "a \\"quote\\", a \\\\ and \\/ \\n\\t\\b\\f\\r"}',
    '{"key": "\\u0041KIA\\u0049OSFODNN7EXAMPLE", "emoji": "\\ud83d\\ude00", "lone": "\\ud800"}',
    '{"path": "C:\\\\new\\\\u0041", "x": "\\\\"}',
]


def decoded_all(text: str, cuts: list[int]) -> str:
    escapes, bounds = JsonEscapes(), [0, *cuts, len(text)]
    return "".join(escapes.feed(text[a:b]) for a, b in zip(bounds, bounds[1:]))


@pytest.mark.parametrize("text", TEXTS)
def test_every_cut_decodes_as_json_loads_reads_the_strings(text: str) -> None:
    whole = decoded_all(text, [])
    for value in json.loads(text).values():  # every string's characters, as the tool gets them
        assert f'"{value}"' in whole
    for i in range(1, len(text)):
        assert decoded_all(text, [i]) == whole
    rnd = random.Random(len(text))
    for _ in range(200):
        assert decoded_all(text, sorted(rnd.sample(range(1, len(text)), rnd.randint(1, 12)))) == whole


def test_what_is_not_an_escape_is_kept_and_a_cut_escape_is_held_no_longer_than_it_is() -> None:
    escapes = JsonEscapes()
    assert escapes.feed("a \\q \\uZZ") == "a \\q \\uZZ"
    assert escapes.feed("x\\u00") == "x" and escapes.feed("4") == "" and escapes.feed("1y") == "Ay"
    assert escapes.feed("\\") == "" and escapes.feed('"') == '"'
