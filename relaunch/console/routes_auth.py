"""Sign in (paste a token) and out, and the live event stream."""

from __future__ import annotations

from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse

from relaunch.console.auth import SESSION_COOKIE, SESSION_MAX_AGE_S, ConsoleRole
from relaunch.console.live import stream
from relaunch.console.web import console, nonce, render, require, require_post

LOGIN_NONCE_COOKIE = "relaunch_login"
# A sign-in form is a token, a nonce and a path: a few hundred bytes. Anything much larger is
# refused before a byte of it is parsed (an anonymous client must not make the console decode
# megabytes).
LOGIN_BODY_LIMIT = 16 * 1024
_LOGIN_FIELDS_LIMIT = 16


class _TooLarge(Exception):
    pass


async def _login_fields(request: Request) -> dict[str, str]:
    """The sign-in form's fields, read at most LOGIN_BODY_LIMIT bytes into the body;
    _TooLarge past that (whatever Content-Length claims) or past a few fields."""
    declared = request.headers.get("content-length", "")
    if declared and (not declared.isdigit() or int(declared) > LOGIN_BODY_LIMIT):
        raise _TooLarge
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > LOGIN_BODY_LIMIT:
            raise _TooLarge
    try:
        pairs = parse_qsl(
            body.decode("utf-8", errors="replace"),
            keep_blank_values=True,
            max_num_fields=_LOGIN_FIELDS_LIMIT,
        )
    except ValueError as exc:  # more fields than a sign-in form has
        raise _TooLarge from exc
    return dict(pairs)


def secure_cookies(request: Request) -> bool:
    """Whether cookies get ``Secure``: served over HTTPS here, or behind a TLS proxy the
    configuration names (``console.behind_tls``)."""
    return console(request).config.console.behind_tls or request.url.scheme == "https"


def safe_next(target: str | None) -> str:
    """Only a path on this site (no //host, no scheme) may be where sign-in returns to."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def _login_form(request: Request, status: int = 200, error: str | None = None) -> Response:
    token = nonce()
    response = render(
        request,
        "login.html",
        None,
        status=status,
        login_csrf=token,
        next=safe_next(request.query_params.get("next")),
        error=error,
    )
    response.set_cookie(
        LOGIN_NONCE_COOKIE,
        token,
        max_age=600,
        path="/login",
        httponly=True,
        samesite="strict",
        secure=secure_cookies(request),
    )
    return response


async def login_page(request: Request) -> Response:
    return _login_form(request)


async def login(request: Request) -> Response:
    c = console(request)
    try:
        fields = await _login_fields(request)
    except _TooLarge:
        return _login_form(request, 413, "the sign-in request is too large")
    if not c.sessions.login_csrf_ok(request.cookies.get(LOGIN_NONCE_COOKIE), fields.get("csrf")):
        return _login_form(request, 403, "the sign-in form expired: paste your token again")
    user = c.tokens.authenticate(fields.get("token", ""))
    if user is None:
        return _login_form(request, 401, "unknown token")
    response = RedirectResponse(safe_next(fields.get("next")), status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        c.sessions.dump(user),
        max_age=SESSION_MAX_AGE_S,
        path="/",
        httponly=True,
        samesite="strict",
        secure=secure_cookies(request),
    )
    response.delete_cookie(LOGIN_NONCE_COOKIE, path="/login")
    return response


async def logout(request: Request) -> Response:
    await require_post(request, ConsoleRole.VIEWER)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


async def events(request: Request) -> Response:
    auth = require(request)
    c = console(request)
    queue = await c.live.subscribe()
    user = auth.user
    return StreamingResponse(
        stream(c.live, queue, user.sees if user.clusters is not None else None),
        media_type="text/event-stream",
        headers={"cache-control": "no-store", "x-accel-buffering": "no"},
    )
