"""RE2 for every rule: the same hits as the Python patterns it replaced, linear time,
and refusal of what RE2 cannot run.

The reference below is the detectors' previous implementation (Python ``re`` with
lookarounds), kept here verbatim so that the RE2 patterns, which read the characters
around a match instead, are proven to find exactly the same hits on crafted and random
text. One deliberate change: the Anthropic key's version digits were ``\\d`` (any
Unicode decimal digit) and are ``[0-9]`` now; keys are ASCII.
"""

import random
import re

import pytest
import re2
from fixtures.filters.samples import CARDS, EMAILS, IBANS, NOT_CARDS, NOT_EMAILS, NOT_IBANS, NOT_SECRETS, SECRETS
from hypothesis import given, settings
from hypothesis import strategies as st

from addon.filters import detectors
from addon.filters.detectors import CARD, EMAIL, IBAN, Subject, card_ok, iban_ok, secrets_matcher
from addon.filters.prefix import NoPrefix, prefix_pattern
from addon.filters.rules import RulesError, parse_rules

# -- the previous detectors, as the reference ---------------------------------------------

OLD_SECRETS = {
    "openai_api_key": r"\bsk-(?:(?:proj|svcacct|admin)-(?:[A-Za-z0-9_-]{74}|[A-Za-z0-9_-]{58})T3BlbkFJ"
    r"(?:[A-Za-z0-9_-]{74}|[A-Za-z0-9_-]{58})|[A-Za-z0-9]{20}T3BlbkFJ[A-Za-z0-9]{20})(?![A-Za-z0-9_-])",
    "anthropic_api_key": r"\bsk-ant-(?:api|admin)[0-9][0-9]-[A-Za-z0-9_-]{93}AA(?![A-Za-z0-9_-])",  # (was \d\d)
    "aws_access_key_id": r"\b(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[A-Z2-7]{16}\b",
    "aws_secret_access_key": r"(?i:aws_?secret_?(?:access_?)?key)[\"']?\s{0,3}[:=]\s{0,3}[\"']?"
    r"(?P<secret>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])",
    "github_token": r"\b(?:gh[pousr]_[A-Za-z0-9]{36}|github_pat_[A-Za-z0-9_]{82})(?![A-Za-z0-9_])",
    "google_api_key": r"\bAIza[A-Za-z0-9_-]{35}(?![A-Za-z0-9_-])",
    "slack_token": r"\bxox[bpas]-[0-9]{8,13}-[A-Za-z0-9-]{8,90}(?![A-Za-z0-9-])",
    "stripe_secret_key": r"\b[rs]k_live_[A-Za-z0-9]{24,99}(?![A-Za-z0-9])",
    "private_key": r"-----BEGIN (?:[A-Z0-9]{1,12} ){0,2}PRIVATE KEY(?: BLOCK)?-----",
    "jwt": r"\beyJ[A-Za-z0-9_-]{8,150}\.eyJ[A-Za-z0-9_-]{8}",
}
OLD_SECRETS_RE = re.compile("|".join(f"(?P<{n}>{p})" for n, p in OLD_SECRETS.items()))
OLD_CARD = re.compile(r"(?<![0-9])(?<![0-9][ -])[0-9](?:[ -]?[0-9]){12,18}(?![ -]?[0-9])")
OLD_IBAN = re.compile(r"(?<![A-Za-z0-9])[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?")
OLD_EMAIL = re.compile(
    r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]{1,64}@"
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.){1,4}[A-Za-z]{2,24}"
    r"(?![A-Za-z0-9-])(?!\.[A-Za-z0-9-])"
)


def old_secrets(text):
    for m in OLD_SECRETS_RE.finditer(text):
        span = m.span("secret") if m.start("secret") >= 0 else m.span()
        yield span[0], span[1], m.lastgroup


def old_cards(text):
    for m in OLD_CARD.finditer(text):
        if card_ok(re.sub(r"[ -]", "", m.group())):
            yield m.start(), m.end(), "card"


def old_ibans(text):
    for m in OLD_IBAN.finditer(text):
        candidate, n = m.group(), detectors.IBAN_LENGTHS.get(m.group()[:2])
        if n is None:
            continue
        seen = 0
        for end, ch in enumerate(candidate, 1):  # noqa: B007
            seen += ch != " "
            if seen == n:
                break
        else:
            continue
        following = text[m.start() + end : m.start() + end + 1]
        if following.isalnum() or not iban_ok(candidate[:end].replace(" ", "")):
            continue
        yield m.start(), m.start() + end, "iban"


def old_emails(text):
    for m in OLD_EMAIL.finditer(text):
        yield m.start(), m.end(), "email"


PAIRS = [(secrets_matcher(), old_secrets), (CARD, old_cards), (IBAN, old_ibans), (EMAIL, old_emails)]


def same_hits(text):
    for matcher, old in PAIRS:
        new = [(h.start, h.end, h.label) for h in matcher.find(text)]
        assert new == list(old(text)), (matcher.label or "secrets", text)


CRAFTED = (
    [t for items in SECRETS.values() for t, _ in items]
    + CARDS + IBANS + EMAILS + NOT_SECRETS + NOT_CARDS + NOT_IBANS + NOT_EMAILS
    + [
        "a@b.com_x@c.de", "a@b.com,b@c.org;c@d.net", "x@y.co.uk.", "x@y.com.au", "a@b.co", "é@b.com",
        "1234567890123456789012345", "4111-1111-1111-1111-", "4111 1111 1111 1111 1", "14111111111111111",
        "x4111111111111111", "-4111111111111111", " 4111111111111111 ", "4111111111111111x4111111111111111",
        "DE89370400440532013000DE89370400440532013000", "aDE89370400440532013000", "DE89 3704 0044 0532 0130 00 1",
        "éAKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLEé", "_AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE_",
        "-----BEGIN RSA PRIVATE KEY-----sk-", "eyJ" * 60 + ".eyJ" + "a" * 8, "\u00a0aws_secret_key =\u3000",
    ]
)  # fmt: skip


def test_the_re2_detectors_find_what_the_python_patterns_found_on_crafted_text():
    for text in CRAFTED:
        for context in ("{}", " {} ", "x{}x", "{}{}", "{} {}", "é{}é", "({}).", "{}\n{}"):
            same_hits(context.format(text, text))


ALPHABET = st.sampled_from(
    [t for items in SECRETS.values() for t, _ in items]
    + CARDS + IBANS + EMAILS + NOT_SECRETS + NOT_CARDS + NOT_IBANS
    + ["@", ".", "-", " ", "  ", "_", "é", "Ж", "\u00a0", "\u3000", "\n", "4", "41", "1111", "DE", "89", "AKIA",
       "sk-", "eyJ", "aws_secret_key", "=", '"', "x", "ab", "com", "Z", "٣", "/", "+"]
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(ALPHABET, max_size=14))
def test_the_re2_detectors_find_what_the_python_patterns_found_on_random_text(parts):
    same_hits("".join(parts))


def test_a_secret_next_to_a_private_key_header_is_found_as_before():
    key = SECRETS["github_token"][0][0]
    same_hits(key + "-----BEGIN PRIVATE KEY-----")
    same_hits("-----BEGIN PRIVATE KEY-----" + key)


# -- offsets, and the call underneath the binding -----------------------------------------


def test_re2_positions_are_character_offsets_on_non_ascii_text():
    [rule] = parse_rules('[[rule]]\nid = "r"\nkind = "regex"\npattern = "é(b+)"\naction = "flag"')
    assert [(h.start, h.end, h.text) for h in rule.find("xxééébbb")] == [(4, 8, "ébbb")]
    [kw] = parse_rules('[[rule]]\nid = "k"\nkind = "keywords"\nkeywords = ["nightjar"]\naction = "flag"')
    assert [h.start for h in kw.find("ééé 𝐍 nightjar")] == [6]
    text = "ñ" * 3 + " mail a@b.com 🎉 4111 1111 1111 1111 "
    assert [(h.start, h.text) for h in EMAIL.find(text)] == [(9, "a@b.com")]
    assert [(h.start, h.text) for h in CARD.find(text)] == [(19, "4111 1111 1111 1111")]
    assert [h.start for h in CARD.find("\ud800 4111 1111 1111 1111")] == [2]  # a lone surrogate is one character


def test_the_direct_search_agrees_with_the_binding_search():
    regex = re2.compile(r"(?P<a>b+)|(c)")
    for text, pos in (("aabbbc", 0), ("aabbbc", 3), ("ééc", 1), ("xyz", 0)):
        data = text.encode()
        m = regex.search(data, len(text[:pos].encode()))
        found = detectors.spans(regex, data, len(text[:pos].encode()))
        assert found[0] == ((-1, -1) if m is None else m.span())
        subject = Subject(text)
        if m is not None:
            assert text[subject.char(found[0][0]) : subject.char(found[0][1])] == m.group().decode()


# -- what RE2 cannot run is refused, with one line naming the rule ------------------------


@pytest.mark.parametrize(
    ("pattern", "words"),
    [
        ("a(?=b)", "pattern not supported by RE2 (linear-time matching): invalid perl operator: (?="),
        ("(?<!x)a", "pattern not supported by RE2 (linear-time matching): invalid perl operator: (?<!"),
        (r"(a)\\1", "pattern not supported by RE2 (linear-time matching): invalid escape sequence: \\1"),
        ("(x", "bad regular expression: missing ): (x"),
    ],
)
def test_a_pattern_re2_cannot_run_is_refused_in_one_line_naming_the_rule(pattern, words):
    with pytest.raises(RulesError) as e:
        parse_rules(f'[[rule]]\nid = "look"\nkind = "regex"\npattern = "{pattern}"\naction = "block"\n', "rules.toml")
    assert str(e.value) == f"rules.toml:4: rule 'look': {words}"
    assert "\n" not in str(e.value)


def test_re2_syntax_works_and_a_pattern_python_cannot_read_holds_its_window():
    [rule] = parse_rules(r"""[[rule]]
id = "letters"
kind = "regex"
pattern = '\pL{3}\d'
action = "block"
""")
    assert [h.text for h in rule.find("ab Жxy7 ok")] == ["Жxy7"]
    m = rule.matchers[0]
    assert m.prefix is None and rule.hold(m) == 4  # no prefix pattern: its whole window, its longest match
    with pytest.raises(RulesError, match="can match empty text"):
        parse_rules(r"""[[rule]]
id = "e"
kind = "regex"
pattern = '\pL*'
action = "block"
""")


# -- catastrophic backtracking -------------------------------------------------------------


def test_catastrophic_backtracking_pattern_runs_in_linear_time():
    """``(a+)+$`` takes exponential time in a backtracking engine on 'aaa…a!'; RE2 runs
    it in linear time. No timing is asserted: that this test finishes is the point."""
    from addon.filters.window import StreamScanner

    [rule] = parse_rules('[[rule]]\nid = "evil"\nkind = "regex"\npattern = "(a+)+$"\naction = "block"\nwindow = 100')
    text = "a" * 50_000 + "!"
    assert list(rule.find(text)) == []
    scanner = StreamScanner([rule])
    released = "".join(scanner.feed(text[i : i + 7])[0] for i in range(0, len(text), 7))
    out, verdicts = scanner.flush()
    assert released + out == text and verdicts == [] and scanner.blocked is None
    scanner = StreamScanner([rule])
    scanner.feed(text)
    assert scanner.flush()[1] == []


# -- prefix patterns ------------------------------------------------------------------------

PATTERNS = [
    r"ab+c",
    r"x[0-9]{2,4}y",
    r"\bfoo\b",
    r"(?i)bar",
    r"q.{0,3}z",
    r"[a-c]{3}|d",
    r"(?:ab|a)(?:c|bc)d",
    r"k(?:l|mn)*o",
    r"[^ ]{2}!",
    r"(?i:ab)C",
]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(PATTERNS), st.text(alphabet="abcdxyzqfoklmnoAB!C 0123", max_size=30), st.integers(0, 2))
def test_every_start_of_a_match_and_its_lookahead_is_in_the_prefix_pattern(pattern, text, lookahead):
    prefix, _, _ = prefix_pattern(pattern, False, lookahead)
    full = re2.compile(rf"(?:{prefix})\z")
    for m in re2.finditer(pattern, text):
        for end in range(m.start(), min(len(text), m.end() + lookahead) + 1):
            assert full.match(text[m.start() : end]), (pattern, text[m.start() : end])


def test_syntax_python_and_re2_read_differently_gets_no_prefix():
    for pattern in (r"x{,3}", r"[[:alpha:]]x", r"\pLx", r"a\z"):
        with pytest.raises(NoPrefix):
            prefix_pattern(pattern, False, 1)


def test_subject_offsets_agree_with_counting_from_the_start_in_any_order_of_calls():
    """``Subject.char`` and ``byte`` count from the nearest known offset (the last one, the
    start or the end): the same offsets as encoding or decoding everything before them."""
    rng = random.Random(20261206)
    alphabet = ["a", " ", "é", "ñ", "€", "語", "\u200b", "🎉", "𝐍", "\ud800", "\udfff", "\n"]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 80)))
        subject = Subject(text)
        starts = [len(text[:i].encode("utf-8", "replace")) for i in range(len(text) + 1)]
        for _ in range(40):
            ch = rng.randrange(len(text) + 1)
            assert subject.char(starts[ch]) == ch
            assert subject.byte(ch) == starts[ch]
