"""The normalised view rules match on, and its map back to the original characters."""

import random
import unicodedata

import pytest

from addon.filters.normalize import (
    CONFUSABLE_LETTERS,
    CONFUSABLES,
    DEFAULT_IGNORABLE,
    _confusable_char,
    _nfkc_char,
    _unchanged,
    fold,
    fold_each,
    latin1_changed,
)
from addon.filters.rules import RulesError, parse_rules


def test_ascii_is_its_own_view():
    assert fold("plain text") == ("plain text", None)
    assert fold("héllo wörld, 日本") == ("héllo wörld, 日本", None)  # NFC text NFKC leaves alone


def test_invisible_characters_go_and_every_view_character_knows_its_origin():
    text = "a\u200db\u00adc\ufeffd"
    view, where = fold(text)
    assert view == "abcd"
    assert [text[i] for i in where] == list("abcd")


def test_compatibility_forms_become_the_plain_characters():
    view, where = fold(
        "Ｎｉ\u2163ﬁ\u00a0\U0001d40d\u212a"
    )  # fullwidth, Roman numeral four, ligature, NBSP, bold N, Kelvin
    assert view == "NiIVfi NK"
    assert where == [0, 1, 2, 2, 3, 3, 4, 5, 6]


def test_the_view_of_a_stream_does_not_depend_on_where_it_is_cut():
    text = "x\u200dＮ\u00adﬁ\u0456y"
    whole_view = fold(text)[0]
    for cut in range(len(text) + 1):
        assert fold(text[:cut])[0] + fold(text[cut:])[0] == whole_view


def test_every_listed_default_ignorable_code_point_is_removed_and_the_table_is_unicodes():
    for lo, hi in DEFAULT_IGNORABLE:
        for cp in {lo, hi, (lo + hi) // 2}:
            assert fold(f"a{chr(cp)}b")[0] == "ab", hex(cp)
    # the format characters (Cf) that are default-ignorable by Unicode's derivation are all listed
    listed = {cp for lo, hi in DEFAULT_IGNORABLE for cp in range(lo, hi + 1)}
    for cp in (0x200B, 0x200C, 0x200D, 0x2060, 0x2061, 0x2064, 0xFEFF, 0x180E, 0xE0001, 0xE0041):
        assert cp in listed and unicodedata.category(chr(cp)) in ("Cf", "Mn", "Cn")


def test_confusables_view_reads_lookalikes_as_latin():
    assert fold("N\u0456ghtj\u0430r", "confusables")[0] == "Nightjar"
    assert fold("N\u0456ghtj\u0430r")[0] == "N\u0456ghtj\u0430r"  # not by default
    assert all(len(k) == 1 and v.isascii() and len(v) == 1 for k, v in CONFUSABLES.items())


def test_request_hits_point_into_the_original_text():
    [rule] = parse_rules('[[rule]]\nid = "k"\nkind = "keywords"\nkeywords = ["Project Nightjar"]\naction = "block"')
    text = "Tell me about Ｐroject\u00a0Night\u200djar."
    [hit] = rule.find(text)
    assert (hit.start, hit.end) == (14, len(text) - 1) and hit.text == "Project Nightjar"


def test_keywords_in_the_rules_file_are_normalised_too():
    [rule] = parse_rules('[[rule]]\nid = "k"\nkind = "keywords"\nkeywords = ["Ｎight\u00adjar"]\naction = "block"')
    assert [h.start for h in rule.find("a nightjar")] == [2]


@pytest.mark.parametrize(
    "extra, message",
    [
        ("normalize = false\nconfusables = true", "'confusables' needs the normalised text"),
        ('normalize = "yes"', "'normalize' must be true or false"),
    ],
)
def test_bad_normalisation_options_are_refused_with_their_line(extra, message):
    with pytest.raises(RulesError) as e:
        parse_rules(f'[[rule]]\nid = "k"\nkind = "keywords"\nkeywords = ["x"]\naction = "block"\n{extra}')
    assert message in str(e.value) and e.value.line is not None


def test_a_keyword_of_only_invisible_characters_is_refused():
    with pytest.raises(RulesError, match="only invisible"):
        parse_rules('[[rule]]\nid = "k"\nkind = "keywords"\nkeywords = ["\u200d\u00ad"]\naction = "block"')


# -- the whole-text check that skips the loop changes nothing --------------------------------

ALL_CODE_POINTS = [chr(cp) for cp in range(0x80, 0x110000)]


@pytest.mark.parametrize(
    ("one", "also"), [(_nfkc_char, None), (_confusable_char, CONFUSABLE_LETTERS)], ids=["nfkc", "confusables"]
)
def test_no_code_point_the_fold_changes_passes_the_whole_text_check(one, also):
    changed = [ch for ch in ALL_CODE_POINTS if one(ch) != ch]
    assert len(changed) > 4000  # (the compatibility forms, the ignorables, the lookalikes)
    in_latin1 = latin1_changed(one)
    for ch in changed:
        for text in (ch, f"a{ch}b", f"\u00e9{ch}\u0301", f"日{ch}本", f"\u00e9{ch}"):
            assert not _unchanged(text, also, in_latin1), (hex(ord(ch)), text)


@pytest.mark.parametrize(
    ("one", "also"), [(_nfkc_char, None), (_confusable_char, CONFUSABLE_LETTERS)], ids=["nfkc", "confusables"]
)
def test_latin1_text_passes_the_whole_text_check_exactly_when_the_fold_leaves_it(one, also):
    # The check's shortcut for text of Latin-1 characters alone rests on the fold being
    # one character at a time there: every pair and a sample of longer texts prove it.
    in_latin1 = latin1_changed(one)
    latin1 = [chr(cp) for cp in range(0x100)]
    rng = random.Random(20261203)
    texts = [a + b for a in latin1 for b in latin1 if not (a + b).isascii()]
    texts += ["".join(rng.choice(latin1) for _ in range(rng.randint(3, 30))) + "\u00e9" for _ in range(5000)]
    for text in texts:
        assert _unchanged(text, also, in_latin1) == (fold_each(text, one) == (text, None)), repr(text)


@pytest.mark.parametrize("view", ["nfkc", "confusables"])
def test_fold_with_its_shortcut_is_the_fold_character_by_character(view):
    one = _nfkc_char if view == "nfkc" else _confusable_char
    rng = random.Random(20261202)
    pool = (
        "abc XYZ 123 .,;"
        "éöüßøñç"  # precomposed Latin: NFKC leaves them
        "日本語のテキスト한국어"  # CJK, kana, Hangul syllables
        "ﾃｷｽﾄＮｉ①ﬁ\u00a0\u212a\U0001d40d"  # halfwidth, fullwidth, circled, ligature, NBSP, Kelvin, bold
        "\u200b\u200d\u00ad\ufeff\U000e0041"  # default-ignorable
        "\u0301\u0308\u0344e\u1100\u1161"  # combining marks, a non-starter decomposition, conjoining jamo
        "аіоАΟ"  # lookalikes of Latin letters
    )
    texts = ["", "plain", "日本語", "héllo wörld", "\u0301", "e\u0301", "\u1100\u1161"]
    texts += ["".join(rng.choice(pool) for _ in range(rng.randint(1, 40))) for _ in range(3000)]
    for text in texts:
        assert fold(text, view) == fold_each(text, one), repr(text)
