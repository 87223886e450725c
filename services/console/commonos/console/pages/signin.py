"""Sign-in and sign-out: /login, /logout (HTML forms) and /api/login, /api/logout, /api/me (JSON)."""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Annotated

from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import BaseModel, Field

from commonos.console.auth import CsrfChecked, SignedIn, get_auth, optional_principal
from commonos.console.metrics import SIGN_INS
from commonos.console.templating import render
from commonos.console.users import User, verify_password

router = APIRouter(tags=["sign-in"])

#: Failed sign-ins allowed per client address within WINDOW_S; past them the address waits (429).
MAX_FAILURES = 20
WINDOW_S = 300.0


async def check_password(request: Request, user: User | None, password: str) -> bool:
    """verify_password in a thread, never on the event loop (which must keep answering), and at most
    Auth.password_checks at once: each argon2 check takes about 50 ms of a core and 64 MiB."""
    async with get_auth(request).password_checks:
        return await asyncio.to_thread(verify_password, user, password)


class Throttle:
    """Failed sign-ins by client address (each check costs an argon2 hash: a guessing loop is also a load)."""

    def __init__(self) -> None:
        self._failures: dict[str, collections.deque[float]] = {}

    def _recent(self, address: str) -> collections.deque[float]:
        now = time.monotonic()
        q = self._failures.setdefault(address, collections.deque())
        while q and now - q[0] > WINDOW_S:
            q.popleft()
        return q

    def check(self, request: Request) -> None:
        address = request.client.host if request.client else "?"
        q = self._recent(address)
        if len(q) >= MAX_FAILURES:
            retry = max(1, int(WINDOW_S - (time.monotonic() - q[0])) + 1)
            raise HTTPException(429, "too many failed sign-ins: try again later", headers={"Retry-After": str(retry)})

    def failed(self, request: Request) -> None:
        self._recent(request.client.host if request.client else "?").append(time.monotonic())
        if len(self._failures) > 10_000:  # forget the oldest addresses rather than grow without bound
            for key in list(self._failures)[:5_000]:
                del self._failures[key]


def _throttle(request: Request) -> Throttle:
    state = request.app.state
    if not hasattr(state, "sign_in_throttle"):
        state.sign_in_throttle = Throttle()
    throttle: Throttle = state.sign_in_throttle
    return throttle


class Credentials(BaseModel):
    name: str = Field(min_length=1, max_length=128)
    password: str = Field(min_length=1, max_length=1024)


class Me(BaseModel):
    name: str
    role: str
    profiles: list[str]
    #: Send it as X-CSRF-Token on every state-changing call.
    csrf_token: str


def safe_next(target: str | None) -> str:
    """Only a path of this console (never //host or a scheme): an open redirect otherwise."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/sessions"
    return target


def _me(name: str, role: str, profiles: tuple[str, ...], csrf: str) -> Me:
    return Me(name=name, role=role, profiles=list(profiles), csrf_token=csrf)


@router.get("/login", include_in_schema=False, response_class=HTMLResponse)
async def login_page(request: Request, next: str | None = None) -> Response:
    if optional_principal(request) is not None:
        return RedirectResponse(safe_next(next), status_code=303)
    return render(request, "login.html", {"next": safe_next(next), "error": None, "name": ""})


@router.post("/login", include_in_schema=False, response_class=HTMLResponse)
async def login_form(
    request: Request,
    name: Annotated[str, Form(max_length=128)],
    password: Annotated[str, Form(max_length=1024)],
    next: Annotated[str | None, Form()] = None,
) -> Response:
    auth = get_auth(request)
    if not auth.same_origin(request):
        raise HTTPException(403, "cross-origin request refused")
    _throttle(request).check(request)
    user = auth.users.get(name)
    if not await check_password(request, user, password) or user is None:
        SIGN_INS.labels("refused").inc()
        _throttle(request).failed(request)
        return render(
            request,
            "login.html",
            {"next": safe_next(next), "error": "Wrong name or password.", "name": name},
            status_code=401,
        )
    SIGN_INS.labels("ok").inc()
    response = RedirectResponse(safe_next(next), status_code=303)
    auth.sign_in(response, user)
    return response


@router.get("/logout", include_in_schema=False, response_class=HTMLResponse)
async def logout_page(request: Request, who: SignedIn) -> Response:
    return render(request, "logout.html")


@router.post("/logout", include_in_schema=False)
async def logout_form(request: Request, who: CsrfChecked) -> Response:
    response = RedirectResponse("/login", status_code=303)
    await get_auth(request).sign_out(response, who)
    return response


@router.post(
    "/api/login",
    response_model=Me,
    responses={401: {"description": "wrong name or password"}, 429: {"description": "too many failed sign-ins"}},
)
async def api_login(request: Request, credentials: Credentials, response: Response) -> Me:
    """Sign in: sets the session cookie; the answer carries the CSRF token for later calls."""
    auth = get_auth(request)
    if not auth.same_origin(request):
        raise HTTPException(403, "cross-origin request refused")
    _throttle(request).check(request)
    user = auth.users.get(credentials.name)
    if not await check_password(request, user, credentials.password) or user is None:
        SIGN_INS.labels("refused").inc()
        _throttle(request).failed(request)
        raise HTTPException(401, "wrong name or password")
    SIGN_INS.labels("ok").inc()
    principal = auth.sign_in(response, user)
    return _me(user.name, user.role.value, user.profiles, principal.csrf_token)


@router.post("/api/logout", status_code=204, response_class=Response)
async def api_logout(request: Request, who: CsrfChecked) -> Response:
    response = Response(status_code=204)
    await get_auth(request).sign_out(response, who)
    return response


@router.get("/api/me", response_model=Me, responses={401: {"description": "not signed in"}})
async def api_me(who: SignedIn) -> Me:
    return _me(who.user.name, who.user.role.value, who.user.profiles, who.csrf_token)
