"""The routes of ``llm-audit serve``: login, the exchanges list, one exchange (and its
printable page), the overview, and the exports of the current selection.

Every route but the login page and the style sheet needs a session (:class:`RequireLogin`
answers a page request with a redirect to the login, anything else with 401); a form
posted, or a page fetched, by another site's page is refused (:mod:`review.origin`);
every response gets the security headers (:mod:`review.headers`) and an access-log line.
Routes are plain functions: Starlette runs them in its thread pool, so database work
never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import io
import ipaddress
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote

from jinja2 import Environment, FileSystemLoader, select_autoescape
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cli.formats import write_records
from exchange import transcript
from review import charts, exchange_page, selection
from review.auth import COOKIE, FAILURE_PAUSE, SESSION_SECONDS, Sessions, log_access
from review.chain import place
from review.headers import HEADERS, SecurityHeaders
from review.origin import SameOrigin
from review.overview import overview
from review.text import finalize, visible
from storage.database import first_line
from storage.query import FIELDS, QueryError, get_exchange, iter_exchanges
from storage.stored import Unreadable

log = logging.getLogger("llm-audit.serve")

HERE = Path(__file__).parent
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]", "::1")
OPEN_PATHS = ("/login", "/static/")  # reachable without a session
MAX_FORM = 4096  # bytes of a login form
SNIPPET = 160  # characters of the answer in the list
EXPORT_BATCH = 200  # rows per chunk of an export
OVERVIEW_SINCE = "30d"  # the overview's period unless the selection names one


def templates() -> Jinja2Templates:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        finalize=finalize,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return Jinja2Templates(env=env)


def build_app(engine: Engine, sessions: Sessions, *, loopback: bool = True, hosts: Sequence[str] = ()) -> Starlette:
    """The application over ``engine`` (opened read-only), with ``sessions``' password;
    on ``loopback``, only the loopback names and ``hosts`` are answered."""
    pages = templates()

    def render(request: Request, name: str, status: int = 200, **context: Any) -> Response:
        context = {"statuses": selection.STATUSES} | context
        context |= {"who": request.scope.get("who"), "request": request}
        return pages.TemplateResponse(request, name, context, status_code=status)

    def list_page(request: Request) -> Response:
        try:
            chosen = selection.parse(request.query_params.multi_items())
        except selection.SelectionError as e:
            return render(request, "list.html", 400, error=str(e), chosen=selection.Selection(), rows=[], more=False)
        unreadable = Unreadable()
        with engine.connect() as conn:
            try:
                rows, after = selection.page(conn, chosen, unreadable)
            except selection.SelectionError as e:  # (a page link SQLite's form on PostgreSQL)
                return render(request, "list.html", 400, error=str(e), chosen=chosen, rows=[], more=False)
        for r in rows:
            r["snippet"] = _snippet(r)
        return render(
            request, "list.html", chosen=chosen, rows=rows, more=after is not None, after=after, unreadable=unreadable
        )

    def exchange(request: Request) -> Response:
        printable = request.url.path.endswith("/print")
        unreadable = Unreadable()
        with engine.connect() as conn:
            try:
                r = get_exchange(conn, request.path_params["id"], unreadable=unreadable)
            except QueryError as e:
                return render(request, "error.html", 404, error=str(e))
            chain = place(conn, r)
        return render(
            request,
            "exchange.html",
            r=r,
            printable=printable,
            facts=exchange_page.facts(r),
            messages=exchange_page.messages(r),
            tools=exchange_page.tools(r),
            raw_request=exchange_page.raw_request(r),
            choices=transcript.choices(r),
            has_output=transcript.has_output(r),
            tool_calls=transcript.tool_calls(r),
            received=exchange_page.received(r),
            usage=transcript.usage_line(r),
            error_line=transcript.error_line(r),
            findings=exchange_page.findings(r),
            verdicts=exchange_page.verdicts(r),
            chain=chain,
            unreadable=unreadable,
        )

    def overview_page(request: Request) -> Response:
        params = request.query_params.multi_items()
        if not request.query_params.get("since"):  # the whole database takes seconds per chart on a million rows
            params.append(("since", OVERVIEW_SINCE))
        try:
            chosen = selection.parse(params)
        except selection.SelectionError as e:
            return render(request, "overview.html", 400, error=str(e), chosen=selection.Selection(), o=None)
        with engine.connect() as conn:
            o = overview(conn, chosen.filters)
        recent = o.by_day[-charts.MAX_BARS :]  # a chart has room for the newest days; the totals count all
        days = [(d["day"] or "-", d["exchanges"]) for d in recent]
        tokens = [(d["day"] or "-", (d["input_tokens"] or 0) + (d["output_tokens"] or 0)) for d in recent]
        cost = list(o.cost_by_day.items())[-charts.MAX_BARS :]
        figures = [
            charts.bar_chart("Exchanges per day", days),
            charts.bar_chart("Tokens per day (input + output)", tokens),
            charts.bar_chart("Cost per day (USD, where the price is known)", cost, "{:,.4f}"),
            charts.bar_chart("Exchanges by user", [(u["user"] or "(no user)", u["exchanges"]) for u in o.by_user]),
            charts.bar_chart("Exchanges by model", [(m["model"] or "(no model)", m["exchanges"]) for m in o.by_model]),
            charts.bar_chart("Blocked exchanges by rule", o.blocked_rules),
            charts.bar_chart("Exchanges by finding code", o.finding_codes),
        ]
        return render(request, "overview.html", chosen=chosen, o=o, figures=figures)

    def export(request: Request) -> Response:
        fmt = request.path_params["format"]
        if fmt not in ("csv", "jsonl"):
            return PlainTextResponse("export as csv or jsonl", status_code=404)
        try:
            chosen = selection.parse(request.query_params.multi_items())
        except selection.SelectionError as e:
            return PlainTextResponse(str(e), status_code=400)
        media = "text/csv; charset=utf-8" if fmt == "csv" else "application/x-ndjson"
        return StreamingResponse(
            _export_chunks(engine, chosen, fmt),
            media_type=media,
            headers={"content-disposition": f'attachment; filename="llm-audit-export.{fmt}"'},
        )

    def login_form(request: Request) -> Response:
        return render(request, "login.html", next=_safe_next(request.query_params.get("next")))

    async def login(request: Request) -> Response:
        body = await _bounded_body(request)
        try:
            form = dict(parse_qsl(body.decode("utf-8", "replace"), max_num_fields=10))
        except ValueError:  # more fields than the form has: no browser sent it
            return render(
                request, "login.html", 400, next="/exchanges", error="the login form is damaged: log in again"
            )
        target = _safe_next(form.get("next"))
        if sessions.too_many_failures():
            return render(request, "login.html", 429, next=target, error="too many failed logins: wait a minute")
        if not sessions.check_password(form.get("password", "")):
            sessions.failed()
            await asyncio.sleep(FAILURE_PAUSE)
            return render(request, "login.html", 401, next=target, error="wrong password")
        name = " ".join(form.get("name", "").split())[:64] or "reviewer"
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            COOKIE,
            sessions.start(name),
            max_age=SESSION_SECONDS,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
        return response

    def logout(request: Request) -> Response:
        sessions.end(request.cookies.get(COOKIE))
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return response

    def home(request: Request) -> Response:
        return RedirectResponse("/exchanges", status_code=303)

    async def database_error(request: Request, exc: Exception) -> Response:
        return render(request, "error.html", 503, error=f"cannot read the audit database: {first_line(exc)}")

    def internal_error(request: Request, exc: Exception) -> Response:
        """A bug's answer: one line and the safe headers (Starlette's own has neither the
        ``no-store`` nor the policy: it is sent from outside every middleware). The
        traceback goes to the server's log, never to the browser."""
        return PlainTextResponse("internal error: the server's log says more", status_code=500, headers=HEADERS)

    routes = [
        Route("/", home),
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/exchanges", list_page),
        Route("/exchanges/{id}", exchange),
        Route("/exchanges/{id}/print", exchange),
        Route("/overview", overview_page),
        Route("/export.{format}", export),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    middleware = [Middleware(SecurityHeaders), Middleware(RequireLogin, sessions=sessions), Middleware(SameOrigin)]
    if loopback:  # DNS rebinding: a page of another site must not reach a loopback server by a name
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=[*LOOPBACK_NAMES, *hosts]))
    return Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={SQLAlchemyError: database_error, Exception: internal_error},
    )


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


class RequireLogin:
    """ASGI middleware: a session for every path but :data:`OPEN_PATHS`, and the access log.

    Who is logged in is put in the scope (``who``); the access log gets the client, who,
    the method, the path (never the query string: it may hold a search text) and the status.
    """

    def __init__(self, app: ASGIApp, sessions: Sessions) -> None:
        self.app, self.sessions = app, sessions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        path = scope["path"]
        who = self.sessions.who(request.cookies.get(COOKIE))
        scope["who"] = who
        client = request.client.host if request.client else "-"
        status = 500

        async def send_logged(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            if who is None and not path.startswith(OPEN_PATHS):
                if scope["method"] in ("GET", "HEAD") and not path.startswith("/export."):
                    target = path + (f"?{scope['query_string'].decode('latin-1')}" if scope["query_string"] else "")
                    response: Response = RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)
                else:
                    response = PlainTextResponse("log in first", status_code=401)
                await response(scope, receive, send_logged)
            else:
                await self.app(scope, receive, send_logged)
        finally:
            log_access(client, who, scope["method"], path, status)


def _safe_next(target: str | None) -> str:
    """Where to go after logging in: a path of this site only (never ``//other.site``)."""
    if target and target.startswith("/") and not target.startswith(("//", "/\\")):
        return target
    return "/exchanges"


async def _bounded_body(request: Request) -> bytes:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM:
            break
    return body[:MAX_FORM]


def _snippet(row: dict[str, Any]) -> str:
    text = " ".join((row.get("client_text") or "").split())
    if not text and (row.get("error_code") or row.get("error_message")):
        text = f"[{row.get('error_code') or 'error'}] {' '.join((row.get('error_message') or '').split())}"
    return text[:SNIPPET] + ("…" if len(text) > SNIPPET else "")


def _export_chunks(engine: Engine, chosen: selection.Selection, fmt: str) -> Iterator[str]:
    """The selection as ``llm-audit export`` writes it (oldest first, the CLI's cells), in chunks.
    Values llm-audit did not write are empty there, as in the CLI's, and said in the log."""
    unreadable = Unreadable()
    try:
        with engine.connect() as conn:
            rows = iter_exchanges(conn, chosen.filters, unreadable=unreadable)
            header = True
            while True:
                batch = [row for _, row in zip(range(EXPORT_BATCH), rows)]
                if not batch and not header:
                    return
                out = io.StringIO()
                write_records(batch, fmt, FIELDS, out)
                text = out.getvalue()
                if fmt == "csv" and not header:
                    text = text.split("\n", 1)[1]  # the header once, at the top
                header = False
                if text:
                    yield text
                if not batch:
                    return
    finally:
        if unreadable:
            log.warning(
                "export: %d records hold values llm-audit did not write, exported as empty (first: %s); "
                "run llm-audit verify",
                unreadable.count,
                visible(unreadable.named[0]),
            )
