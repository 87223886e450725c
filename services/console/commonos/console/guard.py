"""What every request passes before any route sees it (a pure ASGI middleware: streams pass through untouched).

1. **Host.** Only this console's names are served: loopback names (`localhost`, `*.localhost`), address
   literals (127.0.0.1, a pod's address: what a kubelet's probe or a Prometheus scrape sends), the hosts of
   COS_CONSOLE_ORIGINS and the names of COS_CONSOLE_HOSTS. Any other Host is 421: a page of another site whose
   name was rebound to this machine's address (DNS rebinding) reads nothing, not even /metrics. An HTTP/1.0
   request without a Host is served (no browser sends one).
2. **The person** is resolved once (`Auth.resolve`: the cookie, its sign-out, the proxy header), before the
   body is read, so that the body limit can depend on it.
3. **The body** is bounded before it is read: without a sign-in ANONYMOUS_BODY_BYTES (the sign-in forms),
   signed in COS_CONSOLE_MAX_BODY_BYTES. A Content-Length over the limit is 413 at once; a body sent without
   one (chunked) is 413 as soon as it passes the limit.
"""

from __future__ import annotations

import ipaddress
from typing import Final
from urllib.parse import urlsplit

from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from commonos.console.auth import Auth
from commonos.console.settings import ANONYMOUS_BODY_BYTES, ConsoleSettings

#: Paths that never need the person: the probes, the metrics and the static files.
_NO_PERSON: Final = ("/healthz", "/readyz", "/metrics", "/static/")


def allowed_hosts(settings: ConsoleSettings) -> frozenset[str]:
    names = {h.lower() for h in settings.hosts}
    for origin in settings.origins:
        host = urlsplit(origin).hostname
        if host:
            names.add(host.lower())
    return frozenset(names)


def host_name(header: str) -> str:
    """The name of a Host header, without its port and brackets, lower case."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value[1:]
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


def is_served(name: str, names: frozenset[str]) -> bool:
    if name in names or name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def body_too_large(limit: int) -> HTTPException:
    """413 (an HTTPException, which FastAPI lets through from a body's `receive`). The rest of the body is not
    read, so the connection cannot carry another request: it is closed."""
    return HTTPException(413, f"the request body is larger than {limit} bytes", headers={"Connection": "close"})


class Guard:
    def __init__(self, app: ASGIApp, settings: ConsoleSettings, auth: Auth) -> None:
        self.app = app
        self.auth = auth
        self.settings = settings
        self.names = allowed_hosts(settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), None)
        if host is not None and not is_served(host_name(host), self.names):
            await self._refuse(scope, receive, send, 421, f"this console does not answer to the name {host!r}")
            return
        connection = HTTPConnection(scope)
        path: str = scope.get("path", "")
        if path.startswith(_NO_PERSON):
            scope["cos.principal"] = None
        else:
            await self.auth.resolve(connection)
        if scope["type"] == "websocket":
            await self.app(scope, receive, send)
            return
        limit = self.settings.max_body_bytes if self.auth.principal(connection) else ANONYMOUS_BODY_BYTES
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if length is not None:
            try:
                announced = int(length)
            except ValueError:
                await self._refuse(scope, receive, send, 400, "Content-Length is not a number")
                return
            if announced > limit:
                await self._refuse(scope, receive, send, 413, body_too_large(limit).detail, close=True)
                return
        await self.app(scope, _bounded(receive, limit), send)

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, status: int, detail: str, *, close: bool = False
    ) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        # `Connection: close`: the body that was announced is not read, so the connection cannot carry another
        # request.
        headers = {"Connection": "close"} if close else None
        await JSONResponse({"detail": detail}, status_code=status, headers=headers)(scope, receive, send)


def _bounded(receive: Receive, limit: int) -> Receive:
    """`receive` that raises 413 once the body passes `limit` (FastAPI lets an HTTPException through)."""
    seen = 0

    async def bounded() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise body_too_large(limit)
        return message

    return bounded
