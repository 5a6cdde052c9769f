"""Sign in (paste a token) and out, and the live event stream."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse

from relaunch.console.auth import SESSION_COOKIE, SESSION_MAX_AGE_S, Role
from relaunch.console.live import stream
from relaunch.console.web import console, nonce, render, require, require_post

LOGIN_NONCE_COOKIE = "relaunch_login"


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
        LOGIN_NONCE_COOKIE, token, max_age=600, path="/login", httponly=True, samesite="strict"
    )
    return response


async def login_page(request: Request) -> Response:
    return _login_form(request)


async def login(request: Request) -> Response:
    c = console(request)
    form = await request.form()
    fields = {k: v for k, v in form.items() if isinstance(v, str)}
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
        secure=request.url.scheme == "https",
    )
    response.delete_cookie(LOGIN_NONCE_COOKIE, path="/login")
    return response


async def logout(request: Request) -> Response:
    await require_post(request, Role.VIEWER)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


async def events(request: Request) -> Response:
    require(request)
    c = console(request)
    queue = await c.live.subscribe()
    return StreamingResponse(
        stream(c.live, queue),
        media_type="text/event-stream",
        headers={"cache-control": "no-store", "x-accel-buffering": "no"},
    )
