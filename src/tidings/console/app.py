"""The console's pages: a Starlette application rendering Jinja2 templates.

Every page but the login form needs a session (:mod:`.logins`); a request without one is
sent to the login form, and comes back where it was going afterwards. Every form carries a
CSRF token: the session's own, or before login one that must match a cookie (a forged
cross-site login is refused too). An action is a POST that is shown as a confirmation page
first and runs only when that page's form is sent; a user whose role is ``read`` is
refused with 403 and a sentence saying why. Responses forbid framing and foreign scripts
(Content-Security-Policy), and the session cookie is ``HttpOnly`` and ``SameSite=Strict``
(and ``Secure`` over TLS). Database work runs in worker threads: a slow query delays only
its own page.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from sqlalchemy.exc import SQLAlchemyError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from tidings.config import TidingsConfig
from tidings.config.console import ConsoleConfig
from tidings.console.actions import ACTIONS, Actions, OutboxEvents
from tidings.console.audit import AuditTrail
from tidings.console.browse import ListQuery, event_page, page_of_events
from tidings.console.history import History, sparkline
from tidings.console.intermediaries import read_intermediaries
from tidings.console.logins import Login, Logins
from tidings.console.overview import Overview, read_streams
from tidings.console.routes import routing_view, unroutable_matching
from tidings.console.tail import follow, open_tail
from tidings.errors import TidingsError
from tidings.events.timeutil import utcnow
from tidings.outbox.incomplete import INCOMPLETE_STATUSES, IncompleteEvents
from tidings.redaction import scrub

log = logging.getLogger(__name__)

SESSION_COOKIE = "tidings_console"
LOGIN_CSRF_COOKIE = "tidings_console_login"
#: The largest form body taken (a park reason is the longest field).
MAX_FORM_BYTES = 16 * 1024
MAX_FIELDS = 20
FORM_TYPE = "application/x-www-form-urlencoded"
MAX_REASON = 1_000
#: Live tails open at once, over every login.
MAX_TAILS = 16
_HERE = Path(__file__).parent
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@dataclass
class ConsoleState:
    """What the pages read: the configuration, the users, the outbox's incomplete events,
    the actions and the sampler's figures (:mod:`.runner` keeps the last two current)."""

    config: TidingsConfig
    settings: ConsoleConfig
    logins: Logins
    outbox: OutboxEvents
    actions: Actions
    audit: AuditTrail
    history: History
    overview: Overview | None = None
    secure_cookie: bool = False
    #: Live tails open now (at most :data:`MAX_TAILS`), and whether the console is stopping.
    tails: int = 0
    closing: bool = False
    templates: Environment = field(
        default_factory=lambda: Environment(
            loader=FileSystemLoader(_HERE / "templates"),
            autoescape=select_autoescape(default=True),
        )
    )

    @property
    def events(self) -> IncompleteEvents:
        """The outbox's incomplete events (blocking the first time: from a worker thread)."""
        return self.outbox.get()

    @property
    def target_names(self) -> set[str]:
        return set(self.config.targets)


Handler = Callable[[Request, ConsoleState, Login], Awaitable[Response]]


def build_app(state: ConsoleState) -> Starlette:
    """The console's application over ``state``."""

    def page(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            login = state.logins.find(request.cookies.get(SESSION_COOKIE))
            if login is None:
                target = request.url.path
                if request.url.query:
                    target += "?" + request.url.query
                return _secured(RedirectResponse(f"/login?{urlencode({'next': target})}", 303))
            try:
                return _secured(await handler(request, state, login))
            except TidingsError as exc:
                return _secured(_render(state, request, login, "error.html", 400, error=str(exc)))
            except SQLAlchemyError as exc:
                why = scrub(str(exc).strip().splitlines()[0])[:300]
                log.warning("console: the outbox database failed", extra={"error": why})
                error = f"the outbox database cannot be read now: {why}"
                return _secured(_render(state, request, login, "error.html", 503, error=error))

        return endpoint

    async def login_form(request: Request) -> Response:
        return _login_page(state, request, "")

    async def login(request: Request) -> Response:
        form = await _form(request)
        if form is None:
            return _login_page(state, request, "not a login form, or too large", 413)
        given, cookie = str(form.get("csrf", "")), request.cookies.get(LOGIN_CSRF_COOKIE, "")
        if not cookie or not secrets.compare_digest(given.encode(), cookie.encode()):
            return _login_page(state, request, "the form expired: log in again", 403)
        user, password = str(form.get("user", "")), str(form.get("password", ""))
        address = request.client.host if request.client else None
        throttle = state.logins.throttle
        if throttle is not None and (left := throttle.blocked(address)) is not None:
            error = f"too many failed logins from this address: try again in {left:.0f} s"
            return _login_page(state, request, error, 429)
        login = await run_in_threadpool(state.logins.check, user, password)
        if login is None:
            if throttle is not None:
                throttle.failed(address)
            log.warning("console: failed login", extra={"user": user[:64], "address": address})
            return _login_page(state, request, "wrong user name or password", 401)
        log.info("console: login", extra={"user": user, "role": login.role})
        response = RedirectResponse(_local(str(form.get("next", "/"))), 303)
        response.set_cookie(
            SESSION_COOKIE,
            login.token,
            httponly=True,
            samesite="strict",
            secure=state.secure_cookie,
            path="/",
        )
        response.delete_cookie(LOGIN_CSRF_COOKIE, path="/login")
        return _secured(response)

    async def logout(request: Request) -> Response:
        form = await _form(request)
        login = state.logins.find(request.cookies.get(SESSION_COOKIE))
        if login is not None and form is not None and login.csrf_matches(form.get("csrf")):
            state.logins.end(login.token)
        response = RedirectResponse("/login", 303)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return _secured(response)

    routes = [
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/", page(overview_page), methods=["GET"]),
        Route("/events", page(events_page), methods=["GET"]),
        Route("/events/{event_id}", page(one_event_page), methods=["GET"]),
        Route("/act", page(act), methods=["POST"]),
        Route("/audit", page(audit_page), methods=["GET"]),
        Route("/routes", page(routes_page), methods=["GET"]),
        Route("/streams", page(streams_page), methods=["GET"]),
        Route("/intermediaries", page(intermediaries_page), methods=["GET"]),
        Route("/tail", page(tail_page), methods=["GET"]),
        Route("/tail/stream", page(tail_stream), methods=["GET"]),
        Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
    ]
    return Starlette(routes=routes)


async def overview_page(request: Request, state: ConsoleState, login: Login) -> Response:
    history = state.history
    plots = [
        sparkline(history.throughput(), "relayed", "events/s"),
        sparkline(history.series("lag_events"), "relay lag", "events"),
        sparkline(history.series("open_events"), "open", "events"),
        sparkline(history.series("failed"), "FAILED", "events"),
    ]
    overview = state.overview
    blocking = [] if overview is None else overview.blocking
    return _render(
        state,
        request,
        login,
        "overview.html",
        overview=overview,
        plots=plots,
        blocking=blocking,
        statuses=sorted(INCOMPLETE_STATUSES),
    )


async def events_page(request: Request, state: ConsoleState, login: Login) -> Response:
    query = ListQuery.of(request.query_params)
    size = state.settings.page_size
    found, more = await run_in_threadpool(
        lambda: page_of_events(state.events, query, size, state.target_names)
    )
    next_link = None
    if more and found:
        next_link = "/events?" + urlencode(query.params(after=str(found[-1].seq)))
    return _render(
        state,
        request,
        login,
        "events.html",
        query=query,
        found=found,
        next_link=next_link,
        first_link="/events?" + urlencode(query.params(after="")),
        statuses=sorted(INCOMPLETE_STATUSES),
        targets=sorted(state.target_names),
        now=utcnow(),
    )


async def one_event_page(request: Request, state: ConsoleState, login: Login) -> Response:
    event_id = request.path_params["event_id"]
    event = await run_in_threadpool(lambda: event_page(state.events, event_id))
    if event is None:
        return _render(
            state, request, login, "error.html", 404, error=f"no event {event_id} in the outbox"
        )
    trail = await run_in_threadpool(state.audit.newest, 50, about=event_id)
    return _render(state, request, login, "event.html", event=event, trail=trail)


async def act(request: Request, state: ConsoleState, login: Login) -> Response:
    """An action: refused unless the form is the session's and the user an operator; shown
    for confirmation unless confirmed; then run, audited, and its outcome shown."""
    form = await _form(request)
    if form is None:
        error = "not a form of these pages, or too large"
        return _render(state, request, login, "error.html", 413, error=error)
    if not login.csrf_matches(form.get("csrf")):
        return _render(
            state,
            request,
            login,
            "error.html",
            403,
            error="the form did not come from this session's page (reload it and try again)",
        )
    if not login.may_act:
        log.warning("console: action refused to a read-only user", extra={"user": login.user})
        return _render(
            state,
            request,
            login,
            "error.html",
            403,
            error=f"user {login.user} has the read role: only operators may act on events",
        )
    action = str(form.get("action", ""))
    subject = str(form.get("subject", "")).strip()
    reason = str(form.get("reason", "")).strip()
    target = str(form.get("target", "")).strip()
    if action not in ACTIONS:
        raise TidingsError(f"unknown action {action!r} (actions: {', '.join(ACTIONS)})")
    if len(subject) > 256 or len(reason) > MAX_REASON:
        raise TidingsError(f"the event (256) or the reason ({MAX_REASON}) is too long")
    if action == "park" and not reason:
        raise TidingsError("a park needs a reason (say why this event is set aside)")
    if form.get("confirmed") != "yes":
        matching = None
        if action == "route":
            matching = await run_in_threadpool(lambda: unroutable_matching(state.events, subject))
        return _render(
            state,
            request,
            login,
            "confirm.html",
            action=action,
            subject=subject,
            reason=reason,
            target=target,
            matching=matching,
            says=ACTIONS[action],
        )
    outcome = await run_in_threadpool(
        state.actions.run, login.user, action, subject, reason, target
    )
    log.info(
        "console: action",
        extra={
            "user": login.user,
            "action": action,
            "subject": subject,
            "changed": outcome.changed,
        },
    )
    back = {
        "redrive": "/events?status=UNROUTABLE",
        "route": "/routes",
        "unregister": "/streams",
    }.get(action, f"/events/{subject}")
    redrive = subject if action == "route" else None
    return _render(state, request, login, "done.html", outcome=outcome, back=back, redrive=redrive)


async def routes_page(request: Request, state: ConsoleState, login: Login) -> Response:
    view = await run_in_threadpool(lambda: routing_view(state.config, state.events))
    return _render(
        state, request, login, "routes.html", view=view, targets=sorted(state.target_names)
    )


async def streams_page(request: Request, state: ConsoleState, login: Login) -> Response:
    problems: list[str] = []
    streams = await run_in_threadpool(read_streams, state.config, problems)
    retention = {
        (name, s.name): s.retention.enabled
        for name, server in state.config.servers.items()
        for s in server.streams
    }
    return _render(
        state,
        request,
        login,
        "streams.html",
        streams=streams,
        problems=problems,
        retention=retention,
    )


async def intermediaries_page(request: Request, state: ConsoleState, login: Login) -> Response:
    views = await run_in_threadpool(read_intermediaries, state.config)
    return _render(state, request, login, "intermediaries.html", views=views)


async def tail_page(request: Request, state: ConsoleState, login: Login) -> Response:
    sources = ["outbox", *(f"server:{name}" for name in sorted(state.config.servers))]
    return _render(state, request, login, "tail.html", sources=sources)


async def tail_stream(request: Request, state: ConsoleState, login: Login) -> Response:
    """Server-sent events: each event of the chosen source committed from now on that
    matches the type filter, as one JSON ``data:`` line; ``problem`` events say why the
    source cannot be read (it is tried again), ``end`` that the login ended. The tail
    opens its source inside the stream, so a request that never starts it holds nothing."""
    source = request.query_params.get("source", "outbox")
    pattern = request.query_params.get("types", "")
    if len(source) > 128 or len(pattern) > 256:
        raise TidingsError("the source (128) or the type filter (256) is too long")
    if state.tails >= MAX_TAILS:
        error = f"{MAX_TAILS} live tails are open: close one first"
        return _render(state, request, login, "error.html", 503, error=error)
    tail = open_tail(state.config, state.outbox.engine, source, pattern)  # opens nothing

    def alive() -> bool:
        return not state.closing and state.logins.find(login.token) is not None

    async def events() -> AsyncIterator[str]:
        state.tails += 1
        try:
            async for message in follow(tail, source, alive):
                yield message
        finally:
            state.tails -= 1

    return StreamingResponse(events(), media_type="text/event-stream")


async def audit_page(request: Request, state: ConsoleState, login: Login) -> Response:
    entries = await run_in_threadpool(state.audit.newest, 200)
    return _render(state, request, login, "audit.html", entries=entries)


def _render(
    state: ConsoleState,
    request: Request,
    login: Login | None,
    template: str,
    status: int = 200,
    **context: Any,
) -> HTMLResponse:
    body = state.templates.get_template(template).render(
        login=login,
        path=request.url.path,
        ago=_ago,
        now_s=time.time(),
        refresh_s=max(2, round(state.settings.sample_every.total_seconds())),
        **context,
    )
    return HTMLResponse(body, status_code=status)


def _login_page(state: ConsoleState, request: Request, error: str, status: int = 200) -> Response:
    token = secrets.token_urlsafe(32)
    next_page = _local(request.query_params.get("next", "/"))
    if request.method == "POST":
        next_page = "/"
    response = _render(
        state, request, None, "login.html", status, error=error, csrf=token, next=next_page
    )
    response.set_cookie(
        LOGIN_CSRF_COOKIE,
        token,
        httponly=True,
        samesite="strict",
        secure=state.secure_cookie,
        path="/login",
    )
    return _secured(response)


async def _form(request: Request) -> dict[str, str] | None:
    """The request's URL-encoded form (the only kind the pages send), None when it is larger
    than :data:`MAX_FORM_BYTES` or not a form. Parsed here with the standard library: no
    multipart parser is needed for forms without files."""
    if request.headers.get("content-type", "").split(";")[0].strip() != FORM_TYPE:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return None
    try:
        pairs = parse_qsl(body.decode(), keep_blank_values=True, max_num_fields=MAX_FIELDS)
    except (UnicodeDecodeError, ValueError):
        return None
    return dict(pairs)


def _local(target: str) -> str:
    """``target`` if it is a path of this console, else ``/`` (no open redirect)."""
    if target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/"


def _secured(response: Response) -> Response:
    response.headers.update(_HEADERS)
    return response


def _ago(moment: datetime | float | None) -> str:
    """How long ago ``moment`` was, spoken briefly."""
    if moment is None:
        return "-"
    now = utcnow()
    seconds = (now - moment).total_seconds() if isinstance(moment, datetime) else moment
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"
