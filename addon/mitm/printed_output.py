"""Keep credentials out of what mitmdump prints.

mitmdump's ``Dumper`` addon prints every flow: with the default ``flow_detail=1`` the
request line with its URL (a Gemini ``?key=`` in full when the URL is short), from
``flow_detail=2`` on every header (``Authorization`` included). The audit stores only
fingerprints of credentials (:mod:`addon.redact`); the terminal and a service's journal
must not show more. :func:`install` wraps that addon's output so that credential query
parameters in any printed URL and credential headers are shown as their fingerprints,
by the same rules as the database. The traffic itself is never changed.

This reaches into mitmproxy's ``Dumper`` (``echo`` and ``_echo_headers``), pinned with
mitmproxy 12.3 in ``pyproject.toml``; ``tests/e2e/test_credentials_proxy.py`` proves it.
"""

from __future__ import annotations

import re
from typing import Any

from mitmproxy.utils import strutils

from addon.redact import holds_secret, is_credential_header, redact_query, redacted

_PATCHED = "_llm_audit_redacting"
# A query string in printed text: up to white space, an escape sequence or a fragment.
_QUERY = re.compile(r"\?([^\s\x1b#]+)")


def redact_printed(text: str) -> str:
    """``text`` with the credentials of every query string in it fingerprinted."""
    if "?" not in text:
        return text
    return _QUERY.sub(lambda m: "?" + redact_query(m.group(1)), text)


def install(dumper: Any) -> None:
    """Wrap one ``Dumper`` instance (idempotent: a script reload calls it again)."""
    if dumper is None or getattr(dumper, _PATCHED, False):
        return
    echo = dumper.echo
    style = dumper.style

    def redacting_echo(text: str, ident: Any = None, **kwargs: Any) -> None:
        echo(redact_printed(text), ident, **kwargs)

    def redacting_headers(headers: Any) -> None:
        for raw_name, raw_value in headers.fields:
            name, value = strutils.bytes_to_escaped_str(raw_name), strutils.bytes_to_escaped_str(raw_value)
            if is_credential_header(name) or holds_secret(value):
                value = redacted(raw_value.decode("utf-8", "surrogateescape"))
            dumper.echo(f"{style(name, fg='blue')}: {value}", ident=4)

    dumper.echo = redacting_echo
    dumper._echo_headers = redacting_headers
    setattr(dumper, _PATCHED, True)
