"""An ASGI application (the console's) on a port of its own, as a port of the service kit
(`commonos.runtime.service.Listener`): uvicorn, started and stopped by the kit rather than by signal handlers of
its own, and `/healthz` `/readyz` `/metrics` among the application's routes (`health_routes`).

    health = Health()
    app.router.routes.extend(health_routes(health))     # inside the app's middlewares (its Host check)
    async with service_context(settings, "cos-console", health=health, http=AsgiServer(app, host, port)) as ctx:
        ...
        await ctx.serve()

uvicorn serves HTTP/1.1 through `HeaderTimeout`: a connection that has not sent a whole request head within
`header_timeout_s` of its opening or of its previous answer is closed (uvicorn has no such limit of its own: a
client sending one header byte at a time held its socket for as long as it liked). Stopped, it takes no new
connection and gives the requests in flight `drain_timeout_s` (the kit's COS_DRAIN_TIMEOUT_S) to finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator

import uvicorn
from h11 import IDLE
from prometheus_client import REGISTRY, CollectorRegistry
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol

from commonos.runtime.http import Health, healthz_answer, local_url, metrics_answer, readyz_answer


def health_routes(health: Health, registry: CollectorRegistry = REGISTRY) -> list[Route]:
    """`/healthz` `/readyz` `/metrics` of `health`, as routes of an ASGI application (outside its OpenAPI
    document), answering as every service's HTTP port does (`commonos.runtime.http`)."""

    async def healthz(request: Request) -> Response:
        status, body = healthz_answer(health)
        return JSONResponse(body, status_code=status)

    async def readyz(request: Request) -> Response:
        status, body = await readyz_answer(health)
        return JSONResponse(body, status_code=status)

    async def metrics(request: Request) -> Response:
        body, content_type = metrics_answer(registry)
        return Response(body, headers={"Content-Type": content_type})

    return [
        Route("/healthz", healthz, methods=["GET"], include_in_schema=False),
        Route("/readyz", readyz, methods=["GET"], include_in_schema=False),
        Route("/metrics", metrics, methods=["GET"], include_in_schema=False),
    ]


class HeaderTimeout(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, closing a connection that has not sent a whole request head within
    `header_timeout_s` of its start or of its previous response."""

    header_timeout_s = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_deadline: asyncio.TimerHandle | None = None
        self._await_head()

    def _await_head(self) -> None:
        self._cancel_head_deadline()
        self._head_deadline = self.loop.call_later(self.header_timeout_s, self._head_too_slow)

    def _cancel_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_too_slow(self) -> None:
        self._head_deadline = None
        # Still no whole request head (h11 leaves IDLE once it has parsed one): close.
        if self.conn.their_state is IDLE and not self.transport.is_closing():
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not IDLE:
            self._cancel_head_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is IDLE:
            self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_deadline()
        super().connection_lost(exc)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # The kit's stop event has SIGTERM and SIGINT: uvicorn's own handlers re-raise the signal once stopped,
        # so that the process would end killed by SIGTERM instead of exiting 0.
        yield


class AsgiServer:
    """`app` on `host`:`port` (0: a free port), a `Listener` of the service kit; `start` raises OSError when the
    port cannot be had ("address already in use")."""

    def __init__(
        self,
        app: ASGIApp,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        header_timeout_s: float = 10.0,
        drain_timeout_s: float = 10.0,
        ws_max_size: int = 16 * 1024 * 1024,
    ) -> None:
        self.app = app
        self.host = host
        self.port = port
        protocol = type("HeaderTimeoutHttp", (HeaderTimeout,), {"header_timeout_s": header_timeout_s})
        self._server = _Server(
            uvicorn.Config(
                app,
                host=host,
                port=port,
                # The service's life is the kit's: the application has no lifespan of its own.
                lifespan="off",
                access_log=False,
                log_config=None,
                http=protocol,
                proxy_headers=False,  # the client address is the peer's: the application decides whom to believe
                server_header=False,
                ws_max_size=ws_max_size,
                # Requests in flight (live pages hold theirs open) are closed after this once stopping.
                timeout_graceful_shutdown=max(1, round(drain_timeout_s)),
            )
        )
        self._sockets: list[socket.socket] = []
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> int:
        config = self._server.config
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
        except OSError:
            sock.close()
            raise
        self._sockets = [sock]
        self.port = int(sock.getsockname()[1])
        if not config.loaded:
            config.load()
        self._server.lifespan = config.lifespan_class(config)
        await self._server.startup(sockets=self._sockets)
        self._task = asyncio.create_task(self._server.main_loop(), name=f"asgi-{self.port}")
        return self.port

    @property
    def url(self) -> str:
        return local_url(self.host, self.port)

    async def stop(self) -> None:
        if self._task is None:
            return
        self._server.should_exit = True
        await self._task
        self._task = None
        await self._server.shutdown(sockets=self._sockets)
        for sock in self._sockets:
            sock.close()
        self._sockets = []
