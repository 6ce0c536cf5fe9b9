"""The hold-back holds only what could still become a match, and never lets a match through.

The first tests show how little is held on ordinary text; the property tests draw rules,
texts and cuts at random and check, against the rules run over the whole text, that no
character of a blocking match is released before the block and that what is released
is always the start of the text.
"""

from fixtures.filters.samples import CARDS, EMAILS, IBANS, SECRETS
from hypothesis import given, settings
from hypothesis import strategies as st

from addon.filters.api import match_hash
from addon.filters.rules import parse_rules
from addon.filters.window import StreamScanner

PROSE = (
    "The committee met on Tuesday to review the quarterly figures. Revenue grew, costs fell, and "
    "the board asked for a plan by the end of the month; nobody objected. Next, the team discussed "
    "hiring: two engineers, one designer (remote), and an analyst for the night shift. "
) * 3


def held_after_each_character(rules, text):
    scanner = StreamScanner(rules)
    released, held = "", []
    for i, ch in enumerate(text, 1):
        released += scanner.feed(ch)[0]
        assert text.startswith(released)
        held.append(text[len(released) : i])
    assert scanner.blocked is None
    return held


def test_a_keyword_rule_holds_only_a_tail_that_starts_a_keyword():
    rules = parse_rules(
        '[[rule]]\nid = "k"\nkind = "keywords"\nkeywords = ["nightjar", "Project Bluebird"]\naction = "block"'
    )
    held = held_after_each_character(rules, PROSE)
    for tail in held:
        assert tail == "" or any(k.startswith(tail.lower()) for k in ("nightjar", "project bluebird")), tail
    assert max(map(len, held)) <= len("night")  # "night shift": held while it could be "nightjar"
    assert sum(map(len, held)) / len(held) < 0.2  # almost always nothing


def test_secrets_and_pii_hold_at_most_the_last_word_of_prose():
    rules = parse_rules(
        '[[rule]]\nid = "s"\nkind = "secrets"\naction = "block"\n\n[[rule]]\nid = "p"\nkind = "pii"\naction = "block"\n'
    )
    held = held_after_each_character(rules, PROSE)
    assert all(" " not in tail for tail in held)  # never more than the word being written
    assert max(map(len, held)) <= max(map(len, PROSE.split())) + 1


def test_flag_rules_and_release_first_rules_hold_nothing():
    rules = parse_rules(
        '[[rule]]\nid = "k"\nkind = "keywords"\nkeywords = ["night"]\naction = "flag"\n\n'
        '[[rule]]\nid = "p"\nkind = "pii"\naction = "block"\nwindow = 0\n'
    )
    assert set(held_after_each_character(rules, PROSE)) == {""}


def test_an_explicit_window_still_bounds_an_unbounded_pattern():
    [rule] = parse_rules('[[rule]]\nid = "w"\nkind = "regex"\npattern = "a+b"\naction = "block"\nwindow = 10')
    held = held_after_each_character([rule], "a" * 50)
    assert max(map(len, held)) == 10


# -- random rules, texts and cuts ------------------------------------------------------------

RULE_TABLES = [
    'kind = "keywords"\nkeywords = ["ab", "abc d", "C++", "naïve"]',
    'kind = "keywords"\nkeywords = ["Nightjar"]\ncase_sensitive = true',
    "kind = \"regex\"\npattern = 'x[0-9]{2,4}y'",
    "kind = \"regex\"\npattern = '\\bfoo\\b'",
    "kind = \"regex\"\npattern = '(?i)ba+r'\nwindow = 200",  # (the window covers any match of these texts)
    "kind = \"regex\"\npattern = 'q.{0,3}z'",
    "kind = \"regex\"\npattern = '\\pL\\d\\d'",  # (RE2 syntax only: the whole window is held)
    "kind = \"regex\"\npattern = '(?:ab|a)(?:c|bc)d$'",
    'kind = "secrets"',
    'kind = "pii"',
    'kind = "pii"\ntypes = ["email"]\nconfusables = true',
    'kind = "keywords"\nkeywords = ["raw"]\nnormalize = false',
]


@st.composite
def rule_sets(draw):
    tables = draw(st.lists(st.sampled_from(range(len(RULE_TABLES))), min_size=1, max_size=4, unique=True))
    actions = draw(st.lists(st.sampled_from(["block", "flag"]), min_size=len(tables), max_size=len(tables)))
    text = "\n".join(
        f'[[rule]]\nid = "r{i}"\n{RULE_TABLES[i]}\naction = "{a}"\n' for i, a in zip(tables, actions, strict=True)
    )
    return parse_rules(text)


FRAGMENTS = st.sampled_from(
    [SECRETS["github_token"][0][0], SECRETS["aws_access_key_id"][0][0], CARDS[0], IBANS[0], EMAILS[0]]
    + ["ab", "abc d", "C++", "naïve", "Nightjar", "nightjar", "x12y", "x1234y", "foo", "foobar", "BAAAR", "bar",
       "q..z", "qz", "Ж12", "abcd", "abbcd", "raw", "r\u200daw", "\u200b", "a@b.co", "4111 1111", "DE89",
       " ", "  ", ".", "-", "\n", "x", "é", "1", "@", "Ｎightjar", "ab\u00adc d"]
)  # fmt: skip


@st.composite
def cases(draw):
    text = "".join(draw(st.lists(FRAGMENTS, min_size=1, max_size=10)))
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=30)))
    return text, cuts


@settings(max_examples=500, deadline=None)
@given(rule_sets(), cases())
def test_random_rules_texts_and_cuts_never_release_a_blocking_match(rules, case):
    text, cuts = case
    blocking = sorted((h.start, r.id, match_hash(h.text)) for r in rules if r.action == "block" for h in r.find(text))
    scanner = StreamScanner(rules)
    released, verdicts, prev = "", [], 0
    for cut in [*cuts, len(text)]:
        out, found = scanner.feed(text[prev:cut])
        released += out
        verdicts += found
        prev = cut
        assert text.startswith(released)
        if blocking:
            assert len(released) <= blocking[0][0], (text, cuts, released)
    out, found = scanner.flush()
    released += out
    verdicts += found
    assert text.startswith(released)
    if not blocking:
        assert released == text and scanner.blocked is None
    else:
        assert len(released) <= blocking[0][0]
        assert scanner.blocked is not None
        assert (scanner.blocked.position, scanner.blocked.rule_id, scanner.blocked.match_hash) in blocking


def test_without_the_combined_searches_the_old_fixed_hold_still_never_leaks(monkeypatch):
    # Many rules together may be too large for RE2's memory budget: then every rule runs
    # its own search on every piece and holds back its whole window, as before.
    from addon.filters import window

    monkeypatch.setattr(window, "_try_compile", lambda pattern: None)
    window._plan.cache_clear()
    window._anchored.cache_clear()
    rules = parse_rules(
        '[[rule]]\nid = "s"\nkind = "secrets"\naction = "block"\n\n'
        '[[rule]]\nid = "k"\nkind = "keywords"\nkeywords = ["nightjar"]\naction = "block"\n'
    )
    for text in ["the nightjar plan", f"key {SECRETS['github_token'][0][0]} ok", PROSE[:200]]:
        expected = sorted(h.start for r in rules for h in r.find(text))
        for cut in range(len(text) + 1):
            scanner = StreamScanner(rules)
            released = scanner.feed(text[:cut])[0] + scanner.feed(text[cut:])[0]
            released += scanner.flush()[0]
            assert text.startswith(released)
            if expected:
                assert len(released) <= expected[0] and scanner.blocked is not None
            else:
                assert released == text
    window._plan.cache_clear()
    window._anchored.cache_clear()


def test_a_word_that_only_ends_in_a_keywords_first_letters_holds_nothing():
    # "Morni": "ni" starts "nightjar", but a keyword starts at a word edge: nothing held.
    rules = parse_rules('[[rule]]\nid = "k"\nkind = "keywords"\nkeywords = ["nightjar"]\naction = "block"')
    held = held_after_each_character(rules, "Morning came, and the ni")
    assert held[: len("Morning came, and the")] == [""] * len("Morning came, and the")
    assert held[-1] in ("ni", " ni")  # a word that starts like the keyword is held, with its edge at most


KEYWORD_ALPHABET = "nightjarNIGHTJAR İı_x9- .\u200d"


@settings(max_examples=400, deadline=None)
@given(
    text=st.text(alphabet=KEYWORD_ALPHABET, max_size=40),
    cuts=st.lists(st.integers(0, 40), max_size=6),
    case_sensitive=st.booleans(),
)
def test_keyword_edges_never_let_a_keyword_through(text, cuts, case_sensitive):
    words = ["nightjar", "ni", "night jar", "İx"]
    rules = parse_rules(
        '[[rule]]\nid = "k"\nkind = "keywords"\nkeywords = ["nightjar", "ni", "night jar", "İx"]\n'
        f'action = "block"\ncase_sensitive = {str(case_sensitive).lower()}\n'
    )
    expected = sorted(h.start for r in rules for h in r.find(text))
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    scanner = StreamScanner(rules)
    released = ""
    for a, b in zip(bounds, bounds[1:]):
        released += scanner.feed(text[a:b])[0]
    released += scanner.flush()[0]
    assert text.startswith(released)
    if expected:
        assert scanner.blocked is not None and len(released) <= expected[0], (words, expected)
    else:
        assert scanner.blocked is None and released == text
