"""Form posts from other sites refused: the login and the logout take requests from the
application's own pages only.

The session cookie is ``SameSite=Strict``, but that does not protect the login form,
which needs no cookie: any page the reviewer opens could post wrong passwords to
``http://127.0.0.1:8765/login`` (a form or a ``fetch`` in ``no-cors`` mode needs no
permission), ten a minute, and so keep every reviewer locked out, or guess the password
and tell a success by how fast the answer comes. Nor does it cover another site on the
same host (``http://localhost:3000`` is the *same site* as ``http://localhost:8765``:
ports do not count), which could log the reviewer out.

Browsers say where a request comes from: ``Sec-Fetch-Site`` (``same-origin`` for this
application's own pages, ``none`` when the user typed the address) and, in older ones,
``Origin``. A request with neither did not come from a page in a browser (``curl``, a
script) and cannot be forged by one, so it passes. This is the check Go's
``net/http.CrossOriginProtection`` makes; Starlette has none, and a token per form would
need a session before the login.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
OWN = ("same-origin", "none")  # the Sec-Fetch-Site values of this application's own pages and typed addresses


class SameOrigin:
    """ASGI middleware: a request that changes something (not GET, HEAD or OPTIONS) sent by
    a page of another origin is answered 403 before it reaches a route."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in SAFE_METHODS and not from_own_page(Headers(scope=scope)):
            response = PlainTextResponse("refused: this form may only be sent from the review pages", status_code=403)
            await response(scope, receive, send)
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
