"""The headers every response carries: the page can run no script, load nothing from
elsewhere, be framed by no one, leak no address, and stay out of every cache.

The pages need no script at all (forms, links and print CSS do everything), so the
content security policy allows none; styles come from the application's own style sheet
only (no inline styles: the SVG charts use presentation attributes). Every response is
``no-store``: the pages show prompts and answers, and a shared or disk cache must not
keep them.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
    "permissions-policy": "camera=(), microphone=(), geolocation=()",
}
_ENCODED = [(name.encode(), value.encode()) for name, value in HEADERS.items()]


class SecurityHeaders:
    """ASGI middleware: :data:`HEADERS` on every HTTP response (replacing any the route set)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in _ENCODED}
                kept = [(n, v) for n, v in message.get("headers", []) if n.lower() not in names]
                message["headers"] = kept + _ENCODED
            await send(message)

        await self.app(scope, receive, send_with_headers)
