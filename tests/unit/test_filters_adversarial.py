"""Adversarial checks of the RE2 filters and the minimal hold-back: texts, rules and cuts
chosen to get part of a blocking match out before the block, to stall the check, or to
get a rules file refused (or crash) where it should load.

Each test is a problem found by review, fixed in addon/filters; the cut-everywhere helper
checks the no-leak guarantee against the rule run over the whole text.
"""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from addon.filters.api import match_hash
from addon.filters.rules import RulesError, parse_rules
from addon.filters.window import StreamScanner


def rules_of(table: str, action: str = "block"):
    return parse_rules(f'[[rule]]\nid = "r"\n{table}\naction = "{action}"\n')


def released_before_block(rules, text: str, cuts: list[int]) -> str:
    """Feed ``text`` cut at ``cuts``; assert no character of a blocking match is released
    and the stream is blocked when (and only when) the whole text has such a match."""
    blocking = sorted((h.start, r.id, match_hash(h.text)) for r in rules if r.action == "block" for h in r.find(text))
    scanner = StreamScanner(rules)
    released, prev = "", 0
    for cut in [*cuts, len(text)]:
        released += scanner.feed(text[prev:cut])[0]
        prev = cut
        assert text.startswith(released)
        if blocking:
            assert len(released) <= blocking[0][0], (text, cut, released)
    released += scanner.flush()[0]
    if blocking:
        assert len(released) <= blocking[0][0]
        assert scanner.blocked is not None
    else:
        assert released == text and scanner.blocked is None
    return released


def every_character(text: str) -> list[int]:
    return list(range(1, len(text)))


# -- case folding: RE2 is not Python's re ---------------------------------------------------


@pytest.mark.parametrize("text", ["NİGHTJAR", "nıghtjar", "NIGHTJAR", "Nightjar"])
def test_a_keyword_is_not_evaded_by_a_dotted_or_dotless_i(text):
    # Python's re (before RE2) matched i with İ and ı case-insensitively; RE2 does not.
    [rule] = rules_of('kind = "keywords"\nkeywords = ["nightjar"]')
    assert [h.text for h in rule.find(f"see {text} now")] == [text]
    released_before_block([rule], f"see {text} now", every_character(f"see {text} now"))


def test_a_keyword_with_a_dotted_i_matches_the_plain_i():
    [rule] = rules_of('kind = "keywords"\nkeywords = ["İstanbul"]')
    assert [h.text for h in rule.find("in istanbul and ISTANBUL")] == ["istanbul", "ISTANBUL"]


def test_a_case_sensitive_keyword_stays_exact():
    [rule] = rules_of('kind = "keywords"\nkeywords = ["nightjar"]\ncase_sensitive = true')
    assert list(rule.find("NİGHTJAR nıghtjar Nightjar")) == []


# -- long keyword lists ---------------------------------------------------------------------


def test_thousands_of_keywords_load_and_never_leak():
    # The prefix pattern of 5000 keywords is over prefix.MAX_PREFIX_CHARS: NoPrefix used to
    # escape parse_rules as a traceback (a rules file main loaded was refused); now the rule
    # holds its whole window, as before.
    rng = random.Random(7)
    words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(6, 14))) for _ in range(5000)]
    [rule] = rules_of('kind = "keywords"\nkeywords = [' + ", ".join(f'"{w}"' for w in words) + "]")
    text = f"some prose, then {words[1234]} and more"
    assert [h.text for h in rule.find(text)] == [words[1234]]
    released_before_block([rule], text, every_character(text))


# -- refused at load, not at first use ------------------------------------------------------


@pytest.mark.parametrize("pattern", [r"a\C", r"(?i)\C", r"x\C{2}", r"\\\C"])
def test_any_byte_is_refused_at_load(pattern):
    # RE2's \C matches one byte: a match could end inside "é", whose byte offset has no
    # character offset; the first non-ASCII text crashed the check (UnicodeDecodeError).
    with pytest.raises(RulesError, match=r"rule 'r': \\C \(any byte\) is not supported"):
        rules_of(f"kind = \"regex\"\npattern = '{pattern}'")


def test_an_escaped_backslash_before_c_is_no_any_byte():
    [rule] = rules_of("kind = \"regex\"\npattern = 'a\\\\C'")
    released_before_block([rule], "é a\\C é", every_character("é a\\C é"))


# -- random adversarial rules, texts and cuts -------------------------------------------------

# Case folds, NFKC expansions and ligatures, confusables, invisible and astral characters,
# empty branches, lazy and nested repeats, anchors, negated and case-folded classes,
# windows above the span, RE2-only syntax (no prefix pattern: the whole window is held).
ADVERSARIAL_TABLES = [
    'kind = "keywords"\nkeywords = ["ﬁx", "a b", "straße", "K", "σς", "İx", "nightjar", "C++", "😀x", "x😀"]',
    'kind = "keywords"\nkeywords = ["fi", "ffi", "1/4", "式会", "mhz", "μa"]',
    'kind = "keywords"\nkeywords = ["ab"]\nconfusables = true\nwindow = 30',
    "kind = \"regex\"\npattern = '(?:a|)(?:b|bc)+d'\nwindow = 40",
    "kind = \"regex\"\npattern = 'a(?:b|c{0,3})?d?$'",
    "kind = \"regex\"\npattern = '(?m)^ab$'",
    "kind = \"regex\"\npattern = 'x.{0,3}?y'",
    "kind = \"regex\"\npattern = '(?s)x.{1,2}y'",
    "kind = \"regex\"\npattern = '[^a-c]{2}z'",
    "kind = \"regex\"\npattern = '(?i)[^k]k'",
    "kind = \"regex\"\npattern = '\\bab\\b'",
    "kind = \"regex\"\npattern = '(?:(?:ab){1,2}c?){2}'",
    "kind = \"regex\"\npattern = '😀{2}|\\x{1F600}a'",
    "kind = \"regex\"\npattern = '\\pLab'",
    "kind = \"regex\"\npattern = '[[:digit:]]{2}x|a{,2}b'",
    "kind = \"regex\"\npattern = '\\d{2,3}[ .]?\\d'",
    'kind = "pii"',
    'kind = "pii"\ntypes = ["email"]\nnormalize = false',
    'kind = "secrets"',
]
ADVERSARIAL_FRAGMENTS = st.sampled_from(
    ["a", "b", "c", "d", "x", "y", "z", "k", "K", "K", "ab", "a b", "ß", "ẞ", "SS", "ﬁ", "ﬃ", "fi", "¼", "σ",
     "ς", "Σ", "İ", "ı", "nİghtjar", "C++", "é", "e\u0301", "\u0301", "😀", "\u200b", "\u00ad", " ", "\n", "-",
     ".", "@", "1", "12 3", "4111 1111 1111 1111", "DE89 3704 0044 0532 0130 00", "a@b.co", "ｘ", "ａｂ", "а",
     "\ud800", "㍿", "﷽", "㎒", "µ", "μ", "株式", "ghp_", "AKIA", "eyJ"]
)  # fmt: skip


@st.composite
def adversarial_cases(draw):
    tables = draw(st.lists(st.sampled_from(range(len(ADVERSARIAL_TABLES))), min_size=1, max_size=3, unique=True))
    actions = draw(st.lists(st.sampled_from(["block", "block", "flag"]), min_size=len(tables), max_size=len(tables)))
    rules = parse_rules(
        "\n".join(
            f'[[rule]]\nid = "r{i}"\n{ADVERSARIAL_TABLES[i]}\naction = "{a}"\n'
            for i, a in zip(tables, actions, strict=True)
        )
    )
    text = "".join(draw(st.lists(ADVERSARIAL_FRAGMENTS, min_size=1, max_size=12)))
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=20)))
    return rules, text, cuts


@settings(max_examples=300, deadline=None)
@given(adversarial_cases())
def test_adversarial_rules_texts_and_cuts_never_release_a_blocking_match(case):
    rules, text, cuts = case
    released_before_block(rules, text, cuts)


# -- patterns without a prefix pattern still hold their longest match -------------------------


@pytest.mark.parametrize(
    ("pattern", "text"),
    [
        ("a" * 20000, "a" * 20000),  # a prefix pattern over prefix.MAX_PREFIX_CHARS
        ("[[:alpha:]]{300}", "b" * 300),  # RE2-only syntax: Python's parser cannot derive prefixes
        ("\\pL{299}x", "é" * 299 + "x"),
    ],
)
def test_a_bounded_pattern_without_prefixes_holds_its_longest_match(pattern, text):
    # Such a pattern counted as unbounded and held the default 256 characters: the start
    # of a longer match went out before the block.
    [rule] = rules_of(f"kind = \"regex\"\npattern = '{pattern}'")
    assert rule.matchers[0].prefix is None and rule.matchers[0].span == len(text)
    released_before_block([rule], "go " + text + " end", list(range(0, len(text) + 7, 50)))


# -- word edges in scripts written without spaces (review 52b F3) ---------------------------


@pytest.mark.parametrize(
    "text",
    [
        "请告诉我Nightjar项目的所有细节",
        "Nightjarについて教えて",
        "บอกฉันเกี่ยวกับNightjarหน่อย",
        "Nightjar는 무엇입니까?",
        "Nightjarʼs plan",
        "ナイトジャーNightjar",
        "Nightjarཞེས",  # Tibetan
        "Nightjarꦲꦸ",  # Javanese
        "Nightjarㄅ",  # Bopomofo
        "Nightjar〱",  # the vertical kana repeat mark
    ],
)
def test_a_keyword_right_against_letters_of_a_script_without_spaces_is_found_however_cut(text):
    [rule] = rules_of('kind = "keywords"\nkeywords = ["nightjar"]')
    assert [h.text for h in rule.find(text)] == ["Nightjar"]
    released_before_block([rule], text, every_character(text))


def test_a_keyword_of_those_scripts_is_found_among_their_letters_and_latin_words_stay_whole():
    [rule] = rules_of('kind = "keywords"\nkeywords = ["夜鹰", "cat"]')
    assert [h.text for h in rule.find("关于夜鹰队的消息")] == ["夜鹰"]
    assert [h.text for h in rule.find("concat cats 猫cat")] == ["cat"]


def test_a_credential_right_against_chinese_is_found():
    [rule] = rules_of('kind = "secrets"')
    assert [h.label for h in rule.find("密钥AKIAIOSFODNN7EXAMPLE是这个")] == ["aws_access_key_id"]


@pytest.mark.parametrize("text", ["口座DE89370400440532013000まで", "IBAN DE89370400440532013000は"])
def test_an_iban_right_before_japanese_is_found_however_cut(text):
    """The IBAN's right edge refused any letter, so one written before kana or Han passed
    where a card or an address there was found (review 52c F9)."""
    [rule] = rules_of('kind = "pii"')
    assert [h.label for h in rule.find(text)] == ["iban"]
    released_before_block([rule], text, every_character(text))
