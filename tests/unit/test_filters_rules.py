"""The rules file: what a valid one gives, and every kind of error with its line."""

from pathlib import Path

import pytest

from addon.filters.detectors import CARD, EMAIL, IBAN
from addon.filters.rules import DEFAULT_REGEX_SPAN, RulesError, load_rules, parse_rules

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "filters" / "rules.toml"


def rule(body: str):
    (only,) = parse_rules("[[rule]]\n" + body)
    return only


def error(text: str) -> RulesError:
    with pytest.raises(RulesError) as e:
        parse_rules(text, "rules.toml")
    return e.value


def test_the_documented_example_loads():
    rules = load_rules(FIXTURE)
    assert [(r.id, r.kind, r.action, r.scope) for r in rules] == [
        ("internal-hosts", "regex", "block", "both"),
        ("code-names", "keywords", "flag", "both"),
        ("credentials", "secrets", "block", "both"),
        ("personal-data", "pii", "flag", "response"),
    ]
    hosts, names, creds, pii = rules
    assert hosts.reason == "internal host name" and hosts.window == 80
    assert [h.text for h in hosts.find("see DB1.corp.example.com now")] == ["DB1.corp.example.com"]
    assert [h.text for h in names.find("bluebird and project nightjar")] == ["bluebird", "project nightjar"]
    assert pii.matchers == (EMAIL, CARD, IBAN)
    assert not pii.on_request and pii.on_response and creds.on_request and creds.on_response


def test_holds_default_to_the_longest_match_and_flag_rules_hold_nothing():
    hosts, names, creds, pii = load_rules(FIXTURE)
    assert hosts.hold(hosts.matchers[0]) == 80  # the explicit window
    assert creds.hold(creds.matchers[0]) == 167
    assert names.hold(names.matchers[0]) == 0 and pii.hold(CARD) == 0  # flag rules
    blocking_pii = rule('id = "p"\nkind = "pii"\naction = "block"')
    assert [blocking_pii.hold(m) for m in blocking_pii.matchers] == [346, 38, 44]
    assert rule('id = "k"\nkind = "keywords"\nkeywords = ["ab", "abcdef"]\naction = "block"').matchers[0].hold == 6


def test_regex_span_is_the_patterns_bound_or_the_default_or_the_window():
    assert rule('id = "r"\nkind = "regex"\npattern = "x\\\\d{2,5}"\naction = "block"').matchers[0].span == 6
    unbounded = 'id = "r"\nkind = "regex"\npattern = "x\\\\d+"\naction = "block"\n'
    assert rule(unbounded).matchers[0].span == DEFAULT_REGEX_SPAN
    assert rule(unbounded + "window = 1000").matchers[0].span == 1000
    assert rule(unbounded + "window = 0").matchers[0].span == DEFAULT_REGEX_SPAN


def test_keywords_match_whole_words_case_insensitively_by_default():
    kw = rule('id = "k"\nkind = "keywords"\nkeywords = ["cat", "C++", "top secret"]\naction = "flag"')
    text = "Cat, concat, cats, c++ and TOP SECRET; C++11"
    assert [h.text for h in kw.find(text)] == ["Cat", "c++", "TOP SECRET"]
    strict = rule('id = "k"\nkind = "keywords"\nkeywords = ["Cat"]\ncase_sensitive = true\naction = "flag"')
    assert [h.text for h in strict.find("cat Cat CAT")] == ["Cat"]


def test_an_empty_file_has_no_rules():
    assert parse_rules("# nothing yet\n") == []


def test_toml_syntax_errors_carry_their_line():
    e = error('[[rule]]\nid = "a"\nkind = \n')
    assert (e.line, e.path) == (3, "rules.toml")
    assert str(e).startswith("rules.toml:3: TOML syntax error: ")


SEMANTIC_ERRORS = [
    # (file text, line, words in the reason)
    ('[[rule]]\nid = "a"\nkind = "regex"\npattern = "x"\nacton = "block"\n', 5, "unknown key 'acton'"),
    ('[[rule]]\nid = "a"\nkind = "regex"\npattern = "(x"\naction = "block"\n', 4, "bad regular expression"),
    ('[[rule]]\nid = "a"\nkind = "regex"\npattern = "x*"\naction = "block"\n', 4, "can match empty text"),
    ('[[rule]]\nid = "a"\nkind = "regex"\npattern = "x"\n', 1, "missing 'action'"),
    ('[[rule]]\nkind = "regex"\npattern = "x"\naction = "flag"\n', 1, "missing 'id'"),
    ('[[rule]]\nid = "a"\nkind = "regex"\naction = "flag"\n', 1, "missing 'pattern'"),
    ('[[rule]]\nid = "a"\nkind = "keywords"\naction = "flag"\n', 1, "missing 'keywords'"),
    ('[[rule]]\nid = "a"\nkind = "keywords"\nkeywords = []\naction = "flag"\n', 4, "non-empty list"),
    ('[[rule]]\nid = "a"\nkind = "keywords"\nkeywords = ["x", " "]\naction = "flag"\n', 4, "non-empty list"),
    ('[[rule]]\nid = "a"\nkind = "magic"\naction = "flag"\n', 3, "'kind' must be one of"),
    ('[[rule]]\nid = "a"\nkind = "secrets"\naction = "deny"\n', 4, "'action' must be one of block, flag"),
    ('[[rule]]\nid = "a"\nkind = "secrets"\naction = "flag"\nscope = "all"\n', 5, "'scope' must be one of"),
    ('[[rule]]\nid = "a"\nkind = "secrets"\naction = "flag"\nwindow = -1\n', 5, "between 0 and"),
    ('[[rule]]\nid = "a"\nkind = "secrets"\naction = "flag"\nwindow = true\n', 5, "must be an integer"),
    ('[[rule]]\nid = "a"\nkind = "secrets"\naction = "flag"\nwindow = "80"\n', 5, "must be an integer"),
    ('[[rule]]\nid = "a"\nkind = "pii"\ntypes = ["email", "ssn"]\naction = "flag"\n', 4, "unknown types 'ssn'"),
    ('[[rule]]\nid = "a"\nkind = "secrets"\ntypes = ["aws"]\naction = "flag"\n', 4, "unknown types 'aws'"),
    ('[[rule]]\nid = "a"\nkind = "regex"\npattern = 5\naction = "flag"\n', 4, "'pattern' must be a string"),
    ('[[rule]]\nid = ""\nkind = "secrets"\naction = "flag"\n', 2, "'id' must not be empty"),
    (
        '[[rule]]\nid = "a"\nkind = "pii"\naction = "flag"\n[[rule]]\nid = "a"\nkind = "pii"\naction = "flag"\n',
        6,
        "duplicate",
    ),
    ('[[rule]]\nid = "a"\nkind = "secrets"\naction = "flag"\ncase_sensitive = true\n', 5, "unknown key"),
    ('title = "x"\n[[rule]]\nid = "a"\nkind = "secrets"\naction = "flag"\n', 1, "unknown top-level key 'title'"),
    ("rule = 3\n", 1, "array of [[rule]] tables"),
]


@pytest.mark.parametrize(("text", "line", "words"), SEMANTIC_ERRORS)
def test_each_error_names_the_line_and_the_reason(text, line, words):
    e = error(text)
    assert e.line == line, str(e)
    assert words in e.reason
    assert str(e).startswith(f"rules.toml:{line}: ")


def test_errors_name_the_rule_by_id_or_by_number():
    assert "rule 'b': " in str(error('[[rule]]\nid = "b"\nkind = "x"\naction = "flag"\n'))
    assert "rule #2: " in str(error('[[rule]]\nid = "a"\nkind = "pii"\naction = "flag"\n[[rule]]\nkind = "x"\n'))


def test_the_second_rules_error_points_into_the_second_rule():
    text = '[[rule]]\nid = "a"\nkind = "pii"\naction = "flag"\n\n[[rule]]\nid = "b"\nkind = "pii"\naction = "stop"\n'
    assert error(text).line == 9


def test_an_inline_rule_array_is_checked_without_a_line():
    e = error('rule = [{id = "a", kind = "pii", action = "stop"}]\n')
    assert e.line is None and str(e).startswith("rules.toml: rule 'a': ")


def test_a_file_that_is_not_utf8_is_refused_with_its_line(tmp_path):
    path = tmp_path / "rules.toml"
    path.write_bytes(b'[[rule]]\nid = "a"\nreason = "caf\xe9"\n')
    with pytest.raises(RulesError) as e:
        load_rules(path)
    assert e.value.line == 3 and "not UTF-8" in e.value.reason


def test_a_missing_file_is_refused(tmp_path):
    with pytest.raises(RulesError, match=r"rules\.toml: cannot read the rules file"):
        load_rules(tmp_path / "rules.toml")
