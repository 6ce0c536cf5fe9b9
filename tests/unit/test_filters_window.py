"""The hold-back window: however a stream is cut, no character of a blocking match leaks.

Every test compares the stream against the same rules run over the whole text at once
(``Rule.find``): the stream must block exactly when the whole text has a blocking match,
must never have released a character at or after that match's start, and must report
the same positions and hashes.
"""

import random
import unicodedata
from dataclasses import replace

import pytest
from fixtures.filters.samples import CARDS, EMAILS, IBANS, NOT_CARDS, NOT_IBANS, NOT_SECRETS, SECRETS
from hypothesis import given, settings
from hypothesis import strategies as st

from addon.filters import detectors, window
from addon.filters import rules as rules_module
from addon.filters.api import match_hash
from addon.filters.rules import parse_rules
from addon.filters.window import MAX_HITS_PER_RULE, StreamScanner

BLOCKING = parse_rules(r"""
[[rule]]
id = "creds"
kind = "secrets"
action = "block"

[[rule]]
id = "money"
kind = "pii"
types = ["card", "iban"]
action = "block"

[[rule]]
id = "hosts"
kind = "regex"
pattern = '\b[a-z0-9-]{1,20}\.corp\.example\.com\b'
action = "block"

[[rule]]
id = "codename"
kind = "keywords"
keywords = ["nightjar", "project bluebird"]
action = "block"
""")


def as_flags(rules):
    return [replace(r, action="flag") for r in rules]


def run(rules, text, cuts, watch=None, **kw):
    """Stream ``text`` cut at ``cuts``; the released text, verdicts, and (fed, released) after
    each piece, with ``watch(scanner)`` after them when given."""
    scanner = StreamScanner(rules, **kw)
    released, verdicts, progress, prev = "", [], [], 0
    for cut in [*sorted(cuts), len(text)]:
        out, found = scanner.feed(text[prev:cut])
        released += out
        verdicts += found
        prev = cut
        progress.append((cut, len(released)) if watch is None else (cut, len(released), watch(scanner)))
    out, found = scanner.flush()
    return released + out, verdicts + found, progress


def whole(rules, text):
    """What the rules find in the whole text: (rule id, position, hash), in position order."""
    return sorted(((r.id, h.start, match_hash(h.text)) for r in rules for h in r.find(text)), key=lambda v: v[1])


def check_stream(rules, text, cuts):
    expected = whole(rules, text)
    released, verdicts, _ = run(rules, text, cuts)
    assert text.startswith(released)
    if not expected:
        assert verdicts == [] and released == text
        return
    assert len(released) <= expected[0][1], f"leaked {text[expected[0][1] : len(released)]!r} at cuts {cuts}"
    blocks = [(v.rule_id, v.position, v.match_hash) for v in verdicts if v.action == "block"]
    assert len(blocks) >= 1 and set(blocks) <= set(expected), (cuts, blocks, expected)


SAMPLES = (
    [f"here: {text} ok" for items in SECRETS.values() for text, _ in items]
    + [f"card {c}, thanks" for c in CARDS]
    + [f"IBAN {i} EUR" for i in IBANS]
    + ["ssh db-7.corp.example.com now", "the Nightjar plan", "it is Project  Bluebird? no, project bluebird"]
)
NEAR_MISSES = (
    [f"here: {t} ok" for t in NOT_SECRETS]
    + [f"card {c}, thanks" for c in NOT_CARDS]
    + [f"IBAN {i} EUR" for i in NOT_IBANS]
    + ["db-7.corp.example.community", "nightjars and project bluebirds"]
)


def test_every_sample_has_exactly_one_blocking_match_and_near_misses_none():
    assert all(len(whole(BLOCKING, s)) == 1 for s in SAMPLES)
    assert all(whole(BLOCKING, s) == [] for s in NEAR_MISSES)


def test_a_match_cut_at_any_single_position_never_leaks():
    for text in SAMPLES + NEAR_MISSES:
        for cut in range(len(text) + 1):
            check_stream(BLOCKING, text, [cut])


def test_a_match_cut_at_any_two_positions_never_leaks():
    for text in SAMPLES + NEAR_MISSES:
        if len(text) > 60:
            continue  # the long credentials get single cuts, one-character pieces and random cuts
        for i in range(len(text) + 1):
            for j in range(i, len(text) + 1):
                check_stream(BLOCKING, text, [i, j])


def test_one_character_pieces_never_leak():
    for text in SAMPLES + NEAR_MISSES:
        check_stream(BLOCKING, text, range(1, len(text)))


FRAGMENTS = st.sampled_from(
    [t for items in SECRETS.values() for t, _ in items]
    + CARDS + IBANS + EMAILS + NOT_SECRETS + NOT_CARDS + NOT_IBANS
    + ["db.corp.example.com", "nightjar", "project bluebird", "4111", "DE89", "AKIA", "sk-", "eyJ", "@", "."]
    + [" ", "  ", "-", "\n", "x", "words and more words", "1234", "0", "EUR", ", "]
)  # fmt: skip


@st.composite
def cut_texts(draw):
    text = "".join(draw(st.lists(FRAGMENTS, min_size=1, max_size=12)))
    cuts = draw(st.lists(st.integers(0, len(text)), max_size=40))
    return text, cuts


@settings(max_examples=300, deadline=None)
@given(cut_texts())
def test_random_texts_cut_into_many_pieces_never_leak(case):
    text, cuts = case
    check_stream(BLOCKING, text, cuts)


@settings(max_examples=300, deadline=None)
@given(cut_texts())
def test_flag_verdicts_do_not_depend_on_where_the_stream_is_cut(case):
    text, cuts = case
    rules = as_flags(BLOCKING) + parse_rules('[[rule]]\nid = "mail"\nkind = "pii"\ntypes = ["email"]\naction = "flag"')
    released, verdicts, _ = run(rules, text, cuts)
    assert released == text
    assert sorted((v.rule_id, v.position, v.match_hash) for v in verdicts) == sorted(whole(rules, text))


def test_flag_rules_never_hold_text_back():
    text = "card 4111 1111 1111 1111 and " + SECRETS["anthropic_api_key"][0][0]
    _, verdicts, progress = run(as_flags(BLOCKING), text, range(1, len(text)))
    assert all(fed == released for fed, released in progress)
    assert [v.rule_id for v in verdicts] == ["money", "creds"]


def test_window_zero_releases_first_and_still_reports_the_block():
    rules = parse_rules('[[rule]]\nid = "c"\nkind = "pii"\ntypes = ["card"]\naction = "block"\nwindow = 0')
    text = "pay 4111 1111 1111 1111 now, and more"
    released, verdicts, progress = run(rules, text, range(1, len(text)))
    assert [(v.action, v.position) for v in verdicts] == [("block", 4)]
    blocked_at = text.index(" now") + 2  # the card is final two characters after it
    assert all(fed == released for fed, released in progress if fed < blocked_at)
    assert released == text[: len(released)] and len(released) < len(text)  # the stream stops at the block


def test_a_blocking_rule_holds_back_at_most_its_window_and_on_prose_only_what_could_start_a_match():
    # (This test asserted a hold of at least the window before the hold-back held only
    # what could still become a match: on prose, the secrets detector holds a word
    # ending such as "s" of "sk-", never the window.)
    (creds,) = BLOCKING[:1]
    scanner = StreamScanner([creds])
    assert scanner.hold == 167
    fed = released = 0
    for ch in "harmless prose " * 200:
        out, _ = scanner.feed(ch)
        fed, released = fed + 1, released + len(out)
        assert fed - released <= min(scanner.hold, 2)
    assert fed == released


def test_extra_hold_alone_holds_exactly_that_much():
    scanner = StreamScanner([], extra_hold=5)
    assert [scanner.feed(c)[0] for c in "abcdefgh"] == ["", "", "", "", "", "a", "b", "c"]
    assert scanner.flush() == ("defgh", [])


def test_nothing_is_released_after_a_block():
    scanner = StreamScanner(BLOCKING)
    scanner.feed("the nightjar ")
    scanner.feed("x" * 500)
    assert scanner.blocked is not None and scanner.blocked.rule_id == "codename"
    assert scanner.feed("more") == ("", []) and scanner.flush() == ("", [])


def test_a_flush_ends_a_block_positions_go_on_and_no_match_spans_two_blocks():
    scanner = StreamScanner(BLOCKING)
    released, _ = scanner.feed("4111 1111 ")
    released2, verdicts = scanner.flush()
    assert released + released2 == "4111 1111 " and verdicts == []
    fed, _ = scanner.feed("1111 1111 ok ")  # (released at once: nothing there can still become a match)
    out, verdicts = scanner.flush()
    assert verdicts == [] and fed + out == "1111 1111 ok "
    scanner.feed("and nightjar")
    _, verdicts = scanner.flush()
    assert [(v.rule_id, v.position) for v in verdicts] == [("codename", 27)]


def test_verdicts_carry_location_position_and_hash_never_the_text():
    key = SECRETS["github_token"][0][0]
    scanner = StreamScanner(BLOCKING, location="output.choices[0].text")
    scanner.feed("token " + key[:10])
    scanner.feed(key[10:] + " done")
    (verdict,) = [v for v in scanner.flush()[1]] or [scanner.blocked]
    assert (verdict.filter, verdict.rule_id, verdict.position, verdict.location) == (
        "rules",
        "creds",
        6,
        "output.choices[0].text",
    )
    assert verdict.match_hash == match_hash(key) and key not in repr(verdict)
    assert verdict.reason == "a credential (github_token)"


def test_a_flag_rule_reports_a_bounded_number_of_hits_per_stream():
    rules = parse_rules('[[rule]]\nid = "mail"\nkind = "pii"\ntypes = ["email"]\naction = "flag"')
    text = "".join(f"user{i}@example.com " for i in range(100))
    released, verdicts, _ = run(rules, text, range(0, len(text), 7))
    assert released == text and len(verdicts) == MAX_HITS_PER_RULE


def test_cost_is_linear_two_megabytes_in_one_character_pieces(monkeypatch):
    searched = [0]
    search = detectors.spans

    def counting(regex, data, pos):
        searched[0] += len(data) - pos
        return search(regex, data, pos)

    monkeypatch.setattr(detectors, "spans", counting)
    scanner = StreamScanner(BLOCKING[:2])
    text = ("some ordinary text 12345, nothing to see; " * 50_000)[:2_000_000]
    released = sum(len(scanner.feed(ch)[0]) for ch in text) + len(scanner.flush()[0])
    assert released == len(text)
    # Every search looks at the text from where a match may still be in progress: on
    # this text a few characters (a number, a word) per piece, never the whole stream.
    assert searched[0] < 40 * len(text)


def test_the_buffer_stays_small_when_no_rule_checks_any_more():
    rules = parse_rules('[[rule]]\nid = "mail"\nkind = "pii"\ntypes = ["email"]\naction = "flag"')
    scanner = StreamScanner(rules)
    for i in range(MAX_HITS_PER_RULE):
        scanner.feed(f"user{i}@example.com ")
    for _ in range(10_000):
        scanner.feed("plain text ")
    assert all(len(view.buf) <= view.trim_at for view in scanner._views) and not scanner._pending


# -- evasion by invisible and lookalike characters ----------------------------------------

ZWJ, SHY, ZWSP, WJ = "\u200d", "\u00ad", "\u200b", "\u2060"


def interleave(word: str, invisible: str) -> str:
    """``word`` with ``invisible`` between every two letters."""
    return invisible.join(word)


EVASIONS = [
    f"the {interleave('Nightjar', ZWJ)} plan",
    f"the {interleave('Nightjar', SHY)} plan",
    f"the {interleave('nightjar', ZWSP + WJ)} plan",
    "the Ｎｉｇｈｔｊａｒ plan",  # fullwidth
    f"the {interleave('Ｎｉｇｈｔｊａｒ', ZWJ)} plan",
    "the ﬁxed Nigh\ufe0ftjar plan",  # a ligature before (two view characters from one), a variation selector inside
    f"{ZWJ * 40}Night{SHY * 300}jar",  # more invisible characters than the window
    f"it is Project\u00a0{interleave('Bluebird', ZWJ)}",  # a no-break space between the words
    f"ssh db-7.corp.{interleave('example', SHY)}.com now",
]


def test_every_evasion_has_one_blocking_match_in_the_original_text():
    for text in EVASIONS:
        [(rule_id, position, _)] = whole(BLOCKING, text)
        assert text[position] in "NnＮPsd", (text, position)


def test_an_evasion_cut_at_any_single_position_never_leaks():
    for text in EVASIONS:
        for cut in range(len(text) + 1):
            check_stream(BLOCKING, text, [cut])


def test_an_evasion_cut_at_any_two_positions_never_leaks():
    for text in EVASIONS:
        if len(text) > 60:
            continue
        for i in range(len(text) + 1):
            for j in range(i, len(text) + 1):
                check_stream(BLOCKING, text, [i, j])


def test_an_evasion_in_one_character_pieces_never_leaks():
    for text in EVASIONS:
        check_stream(BLOCKING, text, range(1, len(text)))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(["a ", "Night", "jar", ZWJ, SHY, "Ｎ", "ｊａｒ", " x", "\u00a0", "ﬁ"]), max_size=20),
    st.lists(st.integers(0, 200), max_size=8),
)
def test_random_text_with_invisible_characters_never_leaks(parts, cuts):
    text = "".join(parts)
    check_stream(BLOCKING, text, [c for c in cuts if c <= len(text)])


def test_invisible_characters_do_not_count_towards_the_window():
    # A thousand invisible characters inside the word: the window still covers the match.
    text = "the Night" + ZWJ * 1000 + "jar plan"
    released, verdicts, _ = run(BLOCKING, text, range(1, len(text)))
    assert [v.position for v in verdicts if v.action == "block"] == [4] and "the ".startswith(released)


def test_normalize_false_matches_the_raw_text_only():
    [raw] = parse_rules(
        '[[rule]]\nid = "k"\nkind = "keywords"\nkeywords = ["nightjar"]\naction = "block"\nnormalize = false'
    )
    assert whole([raw], f"{interleave('Nightjar', ZWJ)}") == []
    assert [p for _, p, _ in whole([raw], "a Nightjar")] == [2]


CONFUSABLE = parse_rules(
    '[[rule]]\nid = "k"\nkind = "keywords"\nkeywords = ["nightjar"]\naction = "block"\nconfusables = true'
)


def test_confusable_letters_match_only_when_opted_in():
    text = "the N\u0456ghtj\u0430r plan"  # Cyrillic і and а
    assert whole(BLOCKING, text) == []
    assert [p for _, p, _ in whole(CONFUSABLE, text)] == [4]
    for cut in range(len(text) + 1):
        check_stream(CONFUSABLE, text, [cut])
    check_stream(CONFUSABLE, text, range(1, len(text)))


KEYWORDS_ONLY = parse_rules(r"""
[[rule]]
id = "codename"
kind = "keywords"
keywords = ["nightjar", "project bluebird"]
action = "block"
""")


@settings(max_examples=200, deadline=None)
@given(cut_texts(), st.sampled_from(["", "é", "語", "🎉"]))
def test_the_one_search_check_settles_where_the_long_way_does(case, letter):
    """A view whose rules all block is checked with one search (``_View._settled``); when
    that search finds nothing at all, no gate and nothing in progress, the piece is settled
    there too. Piece by piece: the same release, verdicts and state of the view (where the
    next check starts, the hold, what is safe) as the long way (the gates searched again,
    then the reach of matches in progress). Keyword rules alone reach that branch on most
    pieces; the other kinds never do (their prefix patterns match even at the very end),
    and are the control."""
    text, cuts = case
    text = text.replace("a", letter or "a")
    for rules in (KEYWORDS_ONLY, BLOCKING):
        fast = run(rules, text, cuts, watch=_view_states)
        settled = window._View._settled
        window._View._settled = lambda *args: False  # the long way every time
        try:
            slow = run(rules, text, cuts, watch=_view_states)
        finally:
            window._View._settled = settled
        assert fast == slow, (text, cuts)


def _view_states(scanner):
    """Each view's ``scan_from``, ``hold_from`` and ``safe``."""
    return [(v.scan_from, v.hold_from, v.safe) for v in scanner._views]


ACCENTED = parse_rules('[[rule]]\nid = "names"\nkind = "keywords"\nkeywords = ["Café", "한국"]\naction = "block"')


@pytest.mark.parametrize(
    "text",
    [
        "at the Cafe\u0301 now",
        "at the Café now",
        "in \u1112\u1161\u11ab\u1100\u116e\u11a8 now",
        "in 한국 now",
        "CAFE\u0301!",
    ],
)
def test_a_keyword_is_matched_composed_and_decomposed_wherever_the_stream_is_cut(text: str) -> None:
    """The view maps one character at a time, so ``e`` and a combining U+0301 after it
    stay two characters: the decomposed spelling of a keyword (which looks the same) went
    through. Each cut, between a letter and its mark too: blocked, nothing of it released."""
    start = next(i for i in range(len(text)) if text[i : i + 1].lower() in "c\u1112한")
    for cuts in [[], *([i] for i in range(1, len(text)))]:
        released, verdicts, _ = run(ACCENTED, text, cuts)
        assert [v.rule_id for v in verdicts] == ["names"] and len(released) <= start, cuts


MIXED = parse_rules('[[rule]]\nid = "names"\nkind = "keywords"\nkeywords = ["Café Việt", "한국"]\naction = "block"')


@pytest.mark.parametrize(
    "text",
    [
        "at the Café Vie\u0323\u0302t now",  # the first word composed, the second decomposed
        "at the Cafe\u0301 Vi\u1eb9\u0302t now",  # the ệ in part: ẹ and the circumflex
        "at the Cafe\u0301 Vi\u00ea\u0323t now",  # ... ê and the dot below
        "at the Cafe\u0301 Vie\u0302\u0323t now",  # the marks out of their canonical order
        "in \ud55c\u1100\u116e\u11a8 now",  # 한 composed, 국 in conjoining jamo
        "in \ud558\u11ab\uad6d now",  # 하 and a final ᆫ, then 국
    ],
)
def test_a_keyword_spelled_half_composed_half_decomposed_is_blocked_wherever_the_stream_is_cut(text: str) -> None:
    """Each letter of a keyword matches every spelling that looks the same: a word with
    some letters composed and others decomposed went through, the keyword matching only
    its whole composed and whole decomposed spellings."""
    start = next(i for i in range(len(text)) if text[i : i + 1].lower() in "c\ud55c\ud558")
    for cuts in [[], *([i] for i in range(1, len(text)))]:
        released, verdicts, _ = run(MIXED, text, cuts)
        assert [v.rule_id for v in verdicts] == ["names"] and len(released) <= start, cuts


MARKED = parse_rules(
    '[[rule]]\nid = "marked"\nkind = "keywords"\naction = "block"\n'
    'keywords = ["\u1eb9\u0301d\u00e1", "\u0645\u062d\u0645\u0651\u064e\u062f", "q\u0301\u0323x"]'
)


@pytest.mark.parametrize(
    "text",
    [
        "x \u1eb9\u0301d\u00e1 y",  # Yoruba ẹ́: ẹ and an acute
        "x \u00e9\u0323d\u00e1 y",  # ... é and a dot below (no character composes both marks)
        "x e\u0301\u0323da\u0301 y",  # ... e and both marks out of their canonical order
        "x \u0645\u062d\u0645\u0651\u064e\u062f y",  # Arabic shadda then fatha, as the keyword is written
        "x \u0645\u062d\u0645\u064e\u0651\u062f y",  # ... fatha then shadda (canonical order)
        "a q\u0301\u0323x b",  # marks on a letter that composes with neither, as written
        "a q\u0323\u0301x b",  # ... in canonical order
    ],
)
def test_a_letter_s_marks_in_any_order_and_the_keyword_as_written_are_blocked(text: str) -> None:
    """A letter is a character and the combining marks on it: marks that compose with no
    character were each a letter of their own, in canonical order only, so a keyword
    typed with its marks in another order missed the very text it was typed as."""
    start = text.index(" ") + 1
    for cuts in [[], *([i] for i in range(1, len(text)))]:
        released, verdicts, _ = run(MARKED, text, cuts)
        assert [v.rule_id for v in verdicts] == ["marked"] and len(released) <= start, cuts
    assert [h.start for h in MARKED[0].find(text)] == [start]


def test_every_spelling_of_a_keyword_shares_one_match_hash() -> None:
    """The hash is of the composed match, so a report groups a word's spellings."""
    hashes = {run(MIXED, text, [])[1][0].match_hash for text in ("in 한국", "in \u1112\u1161\u11ab\u1100\u116e\u11a8")}
    assert len(hashes) == 1


def test_a_decomposed_letter_is_not_another_letter() -> None:
    """Spellings are of the same letter only: ``Cafe`` with a grave accent is no ``Café``."""
    released, verdicts, _ = run(MIXED, "the Cafe\u0300 Việt.", [])
    assert verdicts == [] and released == "the Cafe\u0300 Việt."


def test_a_list_too_large_for_every_spelling_is_matched_whole_composed_and_decomposed(monkeypatch, caplog) -> None:
    """Every spelling of every letter makes a pattern several times larger: a list that
    RE2 would refuse so ("pattern too large") loads with its whole NFC and NFD spellings
    and says so, as lists loaded before; an ASCII list has no other spelling, no warning."""
    monkeypatch.setattr(rules_module, "MAX_KEYWORD_PATTERN", 10)
    [ascii_rule] = parse_rules('[[rule]]\nid = "a"\nkind = "keywords"\nkeywords = ["Nightjar plan"]\naction = "block"')
    assert not caplog.records
    rules = parse_rules('[[rule]]\nid = "v"\nkind = "keywords"\nkeywords = ["Việt Café"]\naction = "block"')
    assert [r.getMessage() for r in caplog.records] == [
        "rule 'v': too many keywords to match every spelling of their letters; each is matched as written, "
        "composed (NFC) and decomposed (NFD)"
    ]
    for text in ("in Việt Café.", unicodedata.normalize("NFD", "in Việt Café.")):
        assert [v.rule_id for v in run(rules, text, [3])[1]] == ["v"]
    assert run(rules, "in Vie\u0323\u0302t Café.", [])[1] == []
    assert [h.text for h in ascii_rule.find("the nightjar plan")] == ["nightjar plan"]


def test_a_list_whose_every_spelling_re2_refuses_is_matched_whole(monkeypatch, caplog) -> None:
    """A pattern under the bound that RE2 still refuses ("pattern too large"): 30,000
    words of letters with a mark each, refused with every spelling, load with their whole
    spellings (as they loaded before every spelling was)."""
    monkeypatch.setattr(rules_module, "MAX_KEYWORD_PATTERN", 10**9)
    rng = random.Random(1)
    words = sorted({"".join(rng.choice("\u1ecb\u00ed\u00ec\u1ec9\u0129") for _ in range(8)) for _ in range(30_500)})
    toml = (
        '[[rule]]\nid = "big"\nkind = "keywords"\naction = "block"\nkeywords = ['
        + ", ".join(f'"{w}"' for w in words)
        + "]"
    )
    [rule] = parse_rules(toml)
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["rule 'big'"]
    text = f"x {unicodedata.normalize('NFD', words[7])} y"
    assert [h.text for h in rule.find(text)] == [unicodedata.normalize("NFD", words[7])]
