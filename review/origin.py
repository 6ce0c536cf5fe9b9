"""Requests from other sites' pages refused: forms are taken from the application's own
pages only, and its pages and exports are fetched by them, or opened as a page.

The session cookie is ``SameSite=Strict``, but that does not protect the login form,
which needs no cookie: any page the reviewer opens could post wrong passwords to
``http://127.0.0.1:8765/login`` (a form or a ``fetch`` in ``no-cors`` mode needs no
permission), ten a minute, and so keep every reviewer locked out, or guess the password
and tell a success by how fast the answer comes. Nor does it cover another site on the
same host (``http://localhost:3000`` is the *same site* as ``http://localhost:8765``:
ports do not count), which gets the cookie: it could log the reviewer out, or time
``/exchanges?contains=...`` fetched as an image to learn whether a text was ever sent.

Browsers say where a request comes from: ``Sec-Fetch-Site`` (``same-origin`` for this
application's own pages, ``none`` when the user typed the address) and, in older ones,
``Origin``. A request with neither did not come from a page in a browser (``curl``, a
script) and cannot be forged by one, so it passes. For what changes something (not GET,
HEAD or OPTIONS) this is the check Go's ``net/http.CrossOriginProtection`` makes; for
reads, the "resource isolation" policy of Fetch Metadata: another site may link to a
page (a top-level navigation, which the strict cookie leaves logged out), nothing more.
Starlette has neither, and a token per form would need a session before the login.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
OWN = ("same-origin", "none")  # the Sec-Fetch-Site values of this application's own pages and typed addresses


class SameOrigin:
    """ASGI middleware: a request from a page of another origin is answered 403 before it
    reaches a route, unless it is a read that opens a page."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            if scope["method"] not in SAFE_METHODS and not from_own_page(headers):
                refused = "refused: this form may only be sent from the review pages"
            elif not (from_own_page(headers) or opens_a_page(headers)):
                refused = "refused: another site's page may link to the review pages, not fetch them"
            else:
                refused = ""
            if refused:
                await PlainTextResponse(refused, status_code=403)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def from_own_page(headers: Headers) -> bool:
    """Whether a browser says the request comes from this origin (or no browser sent it)."""
    site = headers.get("sec-fetch-site")
    if site is not None:
        return site in OWN
    origin = headers.get("origin")
    if origin is None:
        return True
    return urlsplit(origin).netloc == headers.get("host", "") != ""


def opens_a_page(headers: Headers) -> bool:
    """Whether a browser says the request opens a page in a tab or window (a link followed)."""
    return headers.get("sec-fetch-mode") == "navigate" and headers.get("sec-fetch-dest") == "document"
