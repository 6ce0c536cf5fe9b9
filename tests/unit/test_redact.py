"""Which names and values are credentials (addon/redact.py) and what mitmdump may print of them."""

import pytest

from addon.mitm.printed_output import redact_printed
from addon.redact import api_key_fingerprint, is_credential_header, is_credential_param, redact_headers, redact_query

OPENAI_KEY = "sk-proj-" + "A1b2C3d4E5" * 7 + "Abcd" + "T3BlbkFJ" + "Z9y8X7w6V5" * 7 + "Wxyz"


@pytest.mark.parametrize(
    "name",
    [
        "Authorization",
        "Proxy-Authorization",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "Ocp-Apim-Subscription-Key",
        "cf-aig-authorization",
        "x-functions-key",
        "Cookie",
        "Set-Cookie",
        "x-openrouter-token",
        "X-Custom-Secret",
        "x-db-password",
        "x-amz-security-token",
        "X-Auth",
        "x-signature",
        "accessToken",
        "X-Access-Token",
    ],
)
def test_credential_headers(name):
    assert is_credential_header(name)


@pytest.mark.parametrize(
    "name",
    [
        "content-type",
        "accept-encoding",
        "x-request-id",
        "x-claude-code-session-id",
        "anthropic-version",
        "openai-organization",
        "user-agent",
        "x-stainless-lang",
        "keep-alive",
        "x-max-tokens",
    ],
)
def test_ordinary_headers_are_kept(name):
    assert not is_credential_header(name)


@pytest.mark.parametrize(
    "name",
    [
        "key",
        "api-key",
        "api_key",
        "apikey",
        "sig",
        "code",
        "access_token",
        "token",
        "X-Amz-Signature",
        "X-Amz-Credential",
        "subscription-key",
    ],
)
def test_credential_query_parameters(name):
    assert is_credential_param(name)


def test_a_key_under_a_harmless_name_is_found_by_the_secrets_detector():
    headers = redact_headers([("x-note", f"see {OPENAI_KEY}"), ("x-request-id", "r1")])
    assert headers["x-note"].startswith("[redacted sha256:") and headers["x-request-id"] == "r1"
    assert "T3BlbkFJ" not in redact_query(f"q=hello&other={OPENAI_KEY}")


def test_query_values_are_fingerprinted_and_others_kept():
    out = redact_query("alt=sse&api-key=S1&sig=S2&sv=2024-01-01")
    assert "S1" not in out and "S2" not in out and "alt=sse" in out and "sv=2024-01-01" in out


def test_the_fingerprint_names_the_key_whatever_header_carries_it():
    assert api_key_fingerprint({"ocp-apim-subscription-key": "abc"}, "") == api_key_fingerprint({}, "api-key=abc")


def test_printed_urls_lose_their_credentials_even_inside_escape_sequences():
    line = "127.0.0.1:5000: POST \x1b[1mhttps://h/v1/x?key=AIzaSECRET&alt=sse\x1b[22m HTTP/2.0"
    printed = redact_printed(line)
    assert "AIzaSECRET" not in printed and "alt=sse" in printed and printed.endswith("\x1b[22m HTTP/2.0")
