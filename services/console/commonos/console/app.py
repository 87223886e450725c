"""The console's application: `create_app(settings) -> FastAPI`.

Routes come from the page modules in `commonos.console.pages` (every module there exposing `router`, an
APIRouter, is included, in the order of the modules' names): each page serves its HTML at `/<page>` and the same
data as JSON at `/api/<page>`, with a pydantic response model, so that /api/openapi.json describes it. Besides
them: /static (the CSS and the vendored htmx), /healthz, /readyz and /metrics (unauthenticated, answered as every
service's are: `commonos.runtime.asgi.health_routes`).

The application has no lifespan of its own: its life is the service kit's (`commonos.console.service`), which
gives it its database (`app.state.db`) and NATS connection (`app.state.nc`, `app.state.live`).
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
import time
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from commonos.console import pages
from commonos.console.auth import Auth, NotSignedIn
from commonos.console.guard import Guard
from commonos.console.live import Live
from commonos.console.metrics import REQUEST_SECONDS, REQUESTS
from commonos.console.settings import ConsoleSettings
from commonos.console.sign_outs import DatabaseUnavailable
from commonos.console.templating import STATIC_DIR, render
from commonos.console.users import Users
from commonos.runtime.asgi import health_routes
from commonos.runtime.http import VERSION, Health

log = logging.getLogger(__name__)

#: Sent with every response. Scripts and styles come only from the console itself (no inline script).
SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
]
#: Sent with every response but the static files: what a page or the API answered is a person's data, kept by
#: no cache (not the browser's: after a sign-out, Back must not show it from there; not a proxy's). The static
#: files are the same for everyone and carry the version in their URLs: caching them is fine.
NO_STORE = [(b"cache-control", b"no-store, max-age=0"), (b"pragma", b"no-cache")]


def is_api(request: Request) -> bool:
    return request.url.path == "/api" or request.url.path.startswith("/api/")


class Instrumented:
    """Pure ASGI middleware (streaming and SSE pass through untouched): the security headers, `Cache-Control:
    no-store` (but for the static files) and the metrics."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        code = 500
        # Static files and the public JSON Schemas (pages/schemas.py) say their own caching; nothing else is stored.
        cacheable = str(scope.get("path", "")).startswith(("/static/", "/schemas/"))

        async def send_wrapped(message: Message) -> None:
            nonlocal code
            if message["type"] == "http.response.start":
                code = int(message["status"])
                headers = [*message.get("headers", []), *SECURITY_HEADERS]
                if not cacheable:
                    # Replaces what a response said of caching (an SSE stream's no-cache): nothing is stored.
                    headers = [(k, v) for k, v in headers if k.lower() not in (b"cache-control", b"pragma")]
                    headers += NO_STORE
                message["headers"] = headers
                route = scope.get("route")
                template = getattr(route, "path", None) or "unmatched"
                REQUEST_SECONDS.labels(template).observe(time.perf_counter() - started)
                REQUESTS.labels(template, scope["method"], str(code)).inc()
            await send(message)

        if _has_nul(scope):
            # PostgreSQL's text cannot hold NUL: refused here for every page, as a validation error.
            refusal = JSONResponse({"detail": "a NUL character is not accepted in a URL"}, status_code=422)
            await refusal(scope, receive, send_wrapped)
            return
        await self.app(scope, receive, send_wrapped)


def _has_nul(scope: Scope) -> bool:
    query = bytes(scope.get("query_string", b"")).lower()
    raw_path = bytes(scope.get("raw_path") or b"").lower()
    return b"%00" in query or b"\x00" in query or b"%00" in raw_path or "\x00" in str(scope.get("path", ""))


def page_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(pages.__path__, pages.__name__ + "."))


def create_app(settings: ConsoleSettings, *, users: Users | None = None, health: Health | None = None) -> FastAPI:
    """The console, its /healthz /readyz /metrics those of `health`. Until the service gives it its database and
    NATS connection (`commonos.console.service.serve`), pages needing them answer 503."""

    app = FastAPI(
        title="CommonOS console",
        version=VERSION,
        description="Sessions, live turns, chat, approvals and cost by tag. Every page is also a JSON endpoint "
        "under /api; sign in with POST /api/login (a cookie), send X-CSRF-Token on every state-changing call.",
        openapi_url="/api/openapi.json",
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.users = users if users is not None else Users(settings.users_file)
    app.state.auth = Auth(settings, app.state.users)
    app.state.db = None
    app.state.live = Live(None)
    app.state.nc = None

    @app.exception_handler(NotSignedIn)
    async def not_signed_in(request: Request, exc: NotSignedIn) -> Response:
        if is_api(request):
            return JSONResponse({"detail": "not signed in"}, status_code=401)
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse("/login?next=" + quote(target, safe=""), status_code=303)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if is_api(request) or request.url.path.startswith("/static/"):
            return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)
        titles = {400: "Bad request", 401: "Not signed in", 403: "Forbidden", 404: "Not found", 503: "Unavailable"}
        return render(
            request,
            "error.html",
            {"status": exc.status_code, "title": titles.get(exc.status_code, "Error"), "detail": exc.detail},
            status_code=exc.status_code,
            headers=exc.headers,
        )

    @app.exception_handler(DatabaseUnavailable)
    async def database_unavailable(request: Request, exc: DatabaseUnavailable) -> Response:
        return await http_error(request, StarletteHTTPException(503, str(exc), headers={"Retry-After": "5"}))

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> Response:
        if is_api(request):
            return JSONResponse({"detail": jsonable_errors(exc)}, status_code=422)
        detail = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:])}: {e['msg']}" for e in exc.errors())
        return render(request, "error.html", {"status": 422, "title": "Bad request", "detail": detail}, 422)

    app.router.routes.extend(health_routes(health if health is not None else Health()))

    @app.get("/", include_in_schema=False)
    async def home() -> Response:
        return RedirectResponse("/sessions", status_code=303)

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    for name in page_modules():
        module = importlib.import_module(name)
        router = getattr(module, "router", None)
        if router is not None:
            app.include_router(router)
    # Instrumented outermost: the guard's refusals carry the security headers and are counted.
    app.add_middleware(Guard, settings=settings, auth=app.state.auth)
    app.add_middleware(Instrumented)
    return app


def jsonable_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    return [
        {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
        for e in exc.errors()
    ]
