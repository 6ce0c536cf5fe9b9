"""Keep credentials out of the database.

Credential headers (and Gemini-style ``?key=`` query parameters) are replaced by a
fingerprint: a short SHA-256 prefix of the secret, enough to tell keys apart and to
correlate exchanges made with the same key, useless for recovering it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from urllib.parse import parse_qsl, urlencode

# Header names whose values are credentials, matched as whole lower-case names...
CREDENTIAL_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "cookie",
        "set-cookie",
    }
)
# ...or by a word inside the name (x-openrouter-token, x-custom-secret, ...).
CREDENTIAL_NAME = re.compile(r"(?:^|[-_])(?:api[-_]?key|token|secret|password|auth)(?:$|[-_])", re.I)
CREDENTIAL_QUERY_PARAMS = frozenset({"key", "api_key", "apikey", "access_token", "token"})
# Headers that identify the credential used, in order of preference.
KEY_HEADERS = ("x-api-key", "api-key", "x-goog-api-key", "authorization")
SCHEMES = ("bearer ", "basic ", "token ")


def fingerprint(secret: str) -> str:
    """``sha256:`` and the first 16 hex digits of the secret's SHA-256 (scheme removed)."""
    value = secret.strip()
    if value.lower().startswith(SCHEMES):
        value = value.split(" ", 1)[1].strip()
    return "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def is_credential_header(name: str) -> bool:
    lower = name.lower()
    return lower in CREDENTIAL_HEADERS or CREDENTIAL_NAME.search(lower) is not None


def redact_headers(fields: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Headers as a dict (repeated names joined by ``, ``) with credentials fingerprinted."""
    out: dict[str, str] = {}
    for name, value in fields:
        lower = name.lower()
        if is_credential_header(lower):
            value = f"[redacted {fingerprint(value)}]"
        out[lower] = f"{out[lower]}, {value}" if lower in out else value
    return out


def redact_query(query: str) -> str:
    """The query string with credential parameters fingerprinted."""
    if not query:
        return query
    pairs = parse_qsl(query, keep_blank_values=True)
    if not any(k.lower() in CREDENTIAL_QUERY_PARAMS for k, _ in pairs):
        return query
    return urlencode([(k, f"[redacted {fingerprint(v)}]" if k.lower() in CREDENTIAL_QUERY_PARAMS else v) for k, v in pairs])


def api_key_fingerprint(headers: dict[str, str], query: str) -> str | None:
    """Fingerprint of the credential that authenticated the request, if any."""
    for name in KEY_HEADERS:
        value = headers.get(name)
        if value:
            return fingerprint(value)
    for k, v in parse_qsl(query, keep_blank_values=True):
        if k.lower() in CREDENTIAL_QUERY_PARAMS and v:
            return fingerprint(v)
    return None
