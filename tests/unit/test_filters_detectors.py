"""The built-in detectors: every credential format and personal-data kind, and near misses."""

import re

import pytest
from fixtures.filters.samples import CARDS, EMAILS, IBANS, NOT_CARDS, NOT_EMAILS, NOT_IBANS, NOT_SECRETS, SECRETS

from addon.filters.detectors import (
    CARD,
    EMAIL,
    IBAN,
    SECRET_SHAPES,
    SECRET_TYPES,
    card_ok,
    iban_ok,
    luhn_ok,
    regex_width,
    secrets_matcher,
)

SECRETS_ALL = secrets_matcher()
SECRET_CASES = [(kind, text, part) for kind, items in SECRETS.items() for text, part in items]


def hits(matcher, text):
    return [(h.label, h.text) for h in matcher.find(text)]


@pytest.mark.parametrize(("kind", "text", "part"), SECRET_CASES, ids=[c[0] for c in SECRET_CASES])
def test_each_secret_format_is_found_with_its_kind_and_exact_span(kind, text, part):
    for context in ("{}", "key: {}\n", '{{"api_key": "{}"}}', "({})."):
        found = list(SECRETS_ALL.find(context.format(text)))
        assert [(h.label, h.text) for h in found] == [(kind, part)]
        assert context.format(text)[found[0].start : found[0].end] == part


def test_every_secret_type_has_a_sample():
    assert set(SECRETS) == set(SECRET_TYPES)


@pytest.mark.parametrize("text", NOT_SECRETS)
def test_secret_look_alikes_are_not_found(text):
    assert hits(SECRETS_ALL, f"see {text} here") == []


def test_secrets_can_be_restricted_to_some_types():
    github = secrets_matcher(("github_token",))
    text = SECRETS["github_token"][0][0] + " " + SECRETS["aws_access_key_id"][0][0]
    assert [label for label, _ in hits(github, text)] == ["github_token"]


def test_secret_patterns_are_bounded_so_a_window_covers_them():
    # (RE2 patterns read the characters around a credential: the width is of the credential)
    assert SECRETS_ALL.span == max(regex_width(re.compile(SECRET_SHAPES[t].core))[1] for t in SECRET_TYPES)
    assert all(secrets_matcher((t,)).span == regex_width(re.compile(SECRET_SHAPES[t].core))[1] for t in SECRET_TYPES)
    assert SECRETS_ALL.span <= 200


@pytest.mark.parametrize("number", CARDS)
def test_card_numbers_are_found_whole(number):
    assert hits(CARD, f"my card is {number}, thanks") == [("card", number)]


@pytest.mark.parametrize("number", NOT_CARDS)
def test_card_near_misses_are_not_found(number):
    assert hits(CARD, f"my card is {number}, thanks") == []


def test_luhn():
    assert luhn_ok("79927398713")
    assert not luhn_ok("79927398710")
    assert card_ok("4111111111111111")
    assert not card_ok("9111111111111119")  # Luhn-valid, unknown issuer


@pytest.mark.parametrize("iban", IBANS)
def test_ibans_are_found_in_any_grouping(iban):
    assert hits(IBAN, f"send it to {iban} please") == [("iban", iban)]


def test_an_iban_ends_where_its_country_says_even_before_more_capitals():
    assert hits(IBAN, "IBAN DE89 3704 0044 0532 0130 00 EUR 12") == [("iban", "DE89 3704 0044 0532 0130 00")]
    assert hits(IBAN, "IBAN NL91ABNA0417164300 ABCD") == [("iban", "NL91ABNA0417164300")]


@pytest.mark.parametrize("iban", NOT_IBANS)
def test_iban_near_misses_are_not_found(iban):
    assert hits(IBAN, f"send it to {iban} please") == []


def test_iban_checksum():
    assert iban_ok("GB82WEST12345698765432")
    assert not iban_ok("GB82WEST12345698765433")
    assert not iban_ok("GBXXWEST12345698765432")


@pytest.mark.parametrize("address", EMAILS)
def test_email_addresses_are_found_without_trailing_punctuation(address):
    assert hits(EMAIL, f"write to {address}. Or <{address}>!") == [("email", address)] * 2


@pytest.mark.parametrize("address", NOT_EMAILS)
def test_email_near_misses_are_not_found(address):
    assert hits(EMAIL, f"write to {address} today") == []


def test_every_builtin_detector_knows_how_far_it_looks_past_a_match():
    assert (CARD.lookahead, IBAN.lookahead, EMAIL.lookahead, SECRETS_ALL.lookahead) == (2, 2, 2, 1)
    assert (SECRETS_ALL.hold, CARD.hold, IBAN.hold, EMAIL.hold) == (167, 38, 44, 346)
