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


def test_a_value_with_a_lone_surrogate_is_checked_not_raised_on():
    """RE2 reads UTF-8, and lenient JSON readers make lone surrogates of ``\\ud800``: a
    Connect or SignalR JSON message carrying one stopped the audit of its stream
    (UnicodeEncodeError through rpc.clean_json)."""
    assert redact_headers([("x-note", "a\ud800b")]) == {"x-note": "a\ud800b"}
    assert redact_headers([("x-note", f"{OPENAI_KEY} \ud800")])["x-note"].startswith("[redacted sha256:")


def test_a_connect_json_message_with_a_lone_surrogate_is_recorded_with_the_rest_of_its_stream():
    import struct

    from addon.auditor import StreamAuditor, summary_into_record
    from addon.dialects import RequestView
    from addon.dialects.connect_rpc import DIALECT
    from addon.framing import select
    from addon.record import OUTCOME_COMPLETE, ExchangeRecord

    def envelope(flags: int, payload: bytes) -> bytes:
        return struct.pack(">BI", flags, len(payload)) + payload

    body = [
        envelope(0, b'{"text":"Hello ","meta":{"note":"\\ud800"}}'),
        envelope(0, b'{"text":"world"}'),
        envelope(2, b"{}"),
    ]
    view = RequestView("POST", "/acme.ai.v1.ChatService/Generate", "", {"content-type": "application/connect+json"})
    summary = DIALECT.summarize(None, view)
    record = ExchangeRecord(dialect=DIALECT.name, streamed=True, http_status=200)
    summary_into_record(record, summary)
    normalizer = DIALECT.normalizer(summary)
    framing = select("application/connect+json", 200, normalizer.framing)
    auditor = StreamAuditor(record, normalizer, None, 1 << 20, framing=framing, headers=view.headers)
    assert b"".join(auditor.feed(c) for c in body) + auditor.finish() == b"".join(body)
    auditor.end()
    record.finish(OUTCOME_COMPLETE)
    row = record.to_row()
    assert row["status"] == "completed" and row["output_text"].endswith("world")
    assert "audit_internal_error" not in [f["code"] for f in row["findings"]]
