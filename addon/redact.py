"""Keep credentials out of the database, the spool and the proxy's output.

A header or query parameter is a credential when

1. its name is one of :data:`CREDENTIAL_HEADERS` / :data:`CREDENTIAL_QUERY_PARAMS`
   (names that are credentials but do not say so, like ``cookie`` or Azure Functions'
   ``?code=``), or
2. a word of its name (split at ``-``, ``_`` and ``.``) is a credential word
   (:data:`CREDENTIAL_WORDS`: key, token, secret, password, signature, ...), or starts
   with ``auth`` or ends with ``key``, ``token``, ``secret`` or ``password``
   (``Ocp-Apim-Subscription-Key``, ``cf-aig-authorization``, ``x-functions-key``,
   ``accessToken``, Azure SAS ``sig``), or
3. its value holds something the ``secrets`` detector recognises (an OpenAI, Anthropic,
   Google, AWS, GitHub, Slack or Stripe key, a JWT, a private key), whatever the name.

Its value is replaced by a fingerprint: a short SHA-256 prefix of the secret, enough to
tell keys apart and to correlate exchanges made with the same key, useless for
recovering it. Over-matching a harmless name costs only that header's value in the
audit (its fingerprint stays); under-matching would store a key.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl, urlencode

from addon.filters.detectors import secrets_matcher

# Names whose words look like a credential's but whose values are identifiers the audit
# keeps (an idempotency key names a request; a WebSocket key is a public nonce).
NOT_CREDENTIALS = frozenset({"idempotency-key", "x-idempotency-key", "sec-websocket-key", "sec-websocket-accept"})
# Names that are credentials although no word in them says so.
CREDENTIAL_HEADERS = frozenset({"cookie", "set-cookie", "x-amz-security-token", "x-csrf-token"})
CREDENTIAL_QUERY_PARAMS = frozenset(
    {"code", "sig", "signature", "x-amz-signature", "x-amz-credential", "x-amz-security-token", "jsessionid"}
)
# A name with one of these words (or a word starting with "auth", or ending with one of
# CREDENTIAL_SUFFIXES) is a credential.
CREDENTIAL_WORDS = frozenset(
    {
        "key",
        "apikey",
        "token",
        "secret",
        "secrets",
        "password",
        "passwd",
        "pwd",
        "passphrase",
        "auth",
        "authorization",
        "authentication",
        "signature",
        "sig",
        "credential",
        "credentials",
        "bearer",
        "jwt",
        "cookie",
        "sas",
        "otp",
        "private",
    }
)
CREDENTIAL_SUFFIXES = ("key", "token", "secret", "password")
_WORD = re.compile(r"[-_.\s]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
# Headers that identify the credential used, in order of preference.
KEY_HEADERS = (
    "x-api-key",
    "api-key",
    "x-goog-api-key",
    "ocp-apim-subscription-key",
    "cf-aig-authorization",
    "x-functions-key",
    "authorization",
)
SCHEMES = ("bearer ", "basic ", "token ")
_SIGV4_KEY = re.compile(r"AWS4-HMAC-SHA256\s+Credential=([^/,\s]+)/", re.I)
_SECRETS = secrets_matcher().regex
MAX_REDACT_DEPTH = 16


def fingerprint(secret: str) -> str:
    """``sha256:`` and the first 16 hex digits of the secret's SHA-256 (scheme removed)."""
    value = secret.strip()
    if value.lower().startswith(SCHEMES):
        value = value.split(" ", 1)[1].strip()
    try:  # (the bytes mitmproxy decoded with surrogateescape, as they came)
        raw = value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # (a lone surrogate a lenient JSON reader made of an escape)
        raw = value.encode("utf-8", "surrogatepass")
    return "sha256:" + hashlib.sha256(raw).hexdigest()[:16]


def is_credential_name(name: str) -> bool:
    """Rules 1 and 2 of the module docstring, for a header or query parameter name."""
    words = [w for w in _WORD.split(_CAMEL.sub("-", name).lower()) if w]
    return any(w in CREDENTIAL_WORDS or w.startswith("auth") or w.endswith(CREDENTIAL_SUFFIXES) for w in words)


def is_credential_header(name: str) -> bool:
    lower = name.lower()
    return lower in CREDENTIAL_HEADERS or (lower not in NOT_CREDENTIALS and is_credential_name(lower))


def is_credential_param(name: str) -> bool:
    return name.lower() in CREDENTIAL_QUERY_PARAMS or is_credential_name(name)


def holds_secret(value: str) -> bool:
    """Rule 3: the value carries a credential the ``secrets`` detector knows.

    RE2 reads UTF-8, which a lone surrogate has none of (lenient JSON readers make them
    from ``\\ud800``, mitmproxy from undecodable header bytes): such a character is read
    as U+FFFD, which is part of no credential."""
    try:
        return _SECRETS.search(value) is not None
    except UnicodeEncodeError:
        return _SECRETS.search(value.encode("utf-8", "replace").decode()) is not None


def redacted(value: str) -> str:
    return f"[redacted {fingerprint(value)}]"


def subprotocol_credentials(value: str) -> list[tuple[str, str]]:
    """The credentials a ``Sec-WebSocket-Protocol`` offer carries, as (subprotocol, secret).

    Browsers cannot set an ``Authorization`` header on a WebSocket, so APIs take the key
    as a subprotocol named ``<name>.<secret>`` (OpenAI Realtime's
    ``openai-insecure-api-key.<key>``): a subprotocol whose name part is a credential name.
    """
    out = []
    for item in value.split(","):
        name, dot, secret = item.strip().partition(".")
        if dot and secret and is_credential_name(name):
            out.append((item.strip(), secret))
    return out


def _redact_subprotocols(value: str) -> str:
    found = dict(subprotocol_credentials(value))
    if not found:
        return value
    items = [item.strip() for item in value.split(",")]
    return ", ".join(f"{i.partition('.')[0]}.{redacted(found[i])}" if i in found else i for i in items)


def redact_headers(fields: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Headers as a dict (repeated names joined by ``, ``) with credentials fingerprinted."""
    out: dict[str, str] = {}
    for name, value in fields:
        lower = name.lower()
        if lower == "sec-websocket-protocol":
            value = _redact_subprotocols(value)
        if is_credential_header(lower) or holds_secret(value):
            value = redacted(value)
        out[lower] = f"{out[lower]}, {value}" if lower in out else value
    return out


def redact_query(query: str) -> str:
    """The query string with credential parameters fingerprinted."""
    if not query:
        return query
    pairs = parse_qsl(query, keep_blank_values=True)
    marks = [is_credential_param(k) or holds_secret(v) for k, v in pairs]
    if not any(marks):
        return query
    return urlencode([(k, redacted(v) if mark else v) for (k, v), mark in zip(pairs, marks)])


def redact_path(path: str) -> str:
    """A URL path with the credentials among its segments' ``;`` parameters fingerprinted
    (Java servers' ``;jsessionid=``), as a query's are."""
    if ";" not in path:
        return path
    return _PATH_PARAM.sub(
        lambda m: m[1] + (redacted(m[3]) if is_credential_param(m[2]) or holds_secret(m[3]) else m[3]), path
    )


_PATH_PARAM = re.compile(r"(;([^=;/]*)=)([^;/]*)")


def redact_url(url: str) -> str:
    """A URL with the credentials in its query fingerprinted (for what the proxy prints)."""
    base, sep, rest = url.partition("?")
    if not sep:
        return url
    query, hash_sep, fragment = rest.partition("#")
    return f"{base}?{redact_query(query)}{hash_sep}{fragment}"


def api_key_fingerprint(headers: dict[str, str], query: str) -> str | None:
    """Fingerprint of the credential that authenticated the request, if any.

    A SigV4 ``Authorization`` (AWS) is signed anew for every request: its access key id
    is what stays the same, so that is what is fingerprinted.
    """
    for name in KEY_HEADERS:
        value = headers.get(name)
        if value:
            sigv4 = _SIGV4_KEY.match(value)
            return fingerprint(sigv4[1] if sigv4 else value)
    for _, secret in subprotocol_credentials(headers.get("sec-websocket-protocol", "")):
        return fingerprint(secret)
    for k, v in parse_qsl(query, keep_blank_values=True):
        if v and is_credential_param(k):
            return fingerprint(v)
    return None


def redact_values(value: Any, depth: int = 0) -> Any:
    """A JSON value (tool definitions a client sent) with credentials fingerprinted: a
    string under a credential name, or one holding a known secret, whatever its key
    (an MCP tool's ``authorization`` and ``headers``). Nesting past 16 levels is dropped."""
    if isinstance(value, dict):
        if depth >= MAX_REDACT_DEPTH:
            return {}
        return {
            k: redacted(v) if isinstance(v, str) and is_credential_name(str(k)) else redact_values(v, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact_values(v, depth + 1) for v in value] if depth < MAX_REDACT_DEPTH else []
    if isinstance(value, str) and holds_secret(value):
        return redacted(value)
    return value
