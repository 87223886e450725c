"""Each service's own HTTP port: `/metrics` (Prometheus), `/healthz` (liveness), `/readyz`.

`HttpServer` serves them on a port of their own (COS_HTTP_PORT); an ASGI service serves them beside its pages,
on its own port (`commonos.runtime.asgi.health_routes`). Either way their answers are `healthz_answer`,
`readyz_answer` and `metrics_answer`: one shape for every service.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from importlib import metadata
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest


def _version() -> str:
    try:
        return metadata.version("commonos-events")
    except metadata.PackageNotFoundError:
        return "unknown"


#: The installed version of CommonOS, which `/healthz` states (`cos status` shows it per service).
VERSION = _version()


class Health:
    """Liveness is a heartbeat from the service's main loop; readiness is a set of named checks: those the service
    sets (`set_ready`) and those asked at each /readyz (`watch`), such as its NATS connection's."""

    def __init__(self, stale_after_s: float = 30.0) -> None:
        self.stale_after_s = stale_after_s
        self._beat = time.monotonic()
        self._not_ready: dict[str, str] = {"starting": "the service has not finished starting"}
        self._watched: dict[str, Callable[[], str | None]] = {}
        self._asked: dict[str, Callable[[], Awaitable[str | None]]] = {}
        #: Set by `fail`: the service cannot go on (say its NATS connection was closed for good).
        self.failure: str | None = None

    def beat(self) -> None:
        self._beat = time.monotonic()

    def fail(self, reason: str) -> None:
        """The service cannot recover by itself: /healthz answers 503 with `reason` from now on."""
        self.failure = reason
        self._not_ready["failed"] = reason

    def set_ready(self, check: str, ok: bool, reason: str = "") -> None:
        if ok:
            self._not_ready.pop(check, None)
        else:
            self._not_ready[check] = reason or check

    def watch(self, check: str, problem: Callable[[], str | None]) -> None:
        """Ask `problem()` at every readiness question: not ready, for its reason, while it returns one."""
        self._watched[check] = problem

    def ask(self, check: str, problem: Callable[[], Awaitable[str | None]]) -> None:
        """As `watch`, for a question that awaits an answer (the console's database, asked `SELECT 1`): asked at
        every /readyz (`readiness`), not by `ready` nor `reasons`."""
        self._asked[check] = problem

    @property
    def ready(self) -> bool:
        return not self.reasons()

    @property
    def alive(self) -> bool:
        return self.failure is None and time.monotonic() - self._beat < self.stale_after_s

    def reasons(self) -> dict[str, str]:
        reasons = dict(self._not_ready)
        for check, problem in self._watched.items():
            if check not in reasons and (reason := problem()) is not None:
                reasons[check] = reason
        return reasons

    async def readiness(self) -> dict[str, str]:
        """Why the service is not ready (nothing: it is), the checks `ask` names asked too: what /readyz says."""
        reasons = self.reasons()
        for check, problem in self._asked.items():
            if check not in reasons and (reason := await problem()) is not None:
                reasons[check] = reason
        return reasons


def healthz_answer(health: Health) -> tuple[int, dict[str, str]]:
    """/healthz: its status code and JSON body."""
    if health.alive:
        return 200, {"status": "ok", "version": VERSION}
    if health.failure is not None:
        return 503, {"status": "failed", "reason": health.failure}
    return 503, {"status": "stalled"}


async def readyz_answer(health: Health) -> tuple[int, dict[str, object]]:
    """/readyz: its status code and JSON body."""
    reasons = await health.readiness()
    if not reasons:
        return 200, {"status": "ready"}
    return 503, {"status": "not ready", "reasons": reasons}


def metrics_answer(registry: CollectorRegistry = REGISTRY) -> tuple[bytes, str]:
    """/metrics: the body and its Content-Type."""
    return generate_latest(registry), CONTENT_TYPE_LATEST


def local_url(host: str, port: int) -> str:
    """The URL a process on this machine reaches a port listening on `host` at (all addresses: 127.0.0.1)."""
    return f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"


class AiohttpPort:
    """An aiohttp application on a port (a `commonos.runtime.service.Listener`): `start` binds it and returns the
    port bound (the one asked for, or the free port the system chose for 0), `stop` lets the requests in flight
    finish (`shutdown_timeout` among the runner's options) and closes it."""

    def __init__(self, app: web.Application, host: str, port: int, **runner_options: Any) -> None:
        self.host = host
        self.port = port
        self._app = app
        self._runner_options = runner_options
        self._runner: web.AppRunner | None = None

    async def start(self) -> int:
        self._runner = web.AppRunner(self._app, access_log=None, **self._runner_options)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        addresses = self._runner.addresses
        if addresses:
            self.port = int(addresses[0][1])
        return self.port

    @property
    def url(self) -> str:
        return local_url(self.host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


class HttpServer(AiohttpPort):
    def __init__(
        self,
        health: Health,
        host: str = "127.0.0.1",
        port: int = 0,
        registry: CollectorRegistry = REGISTRY,
        extra_routes: Callable[[web.Application], None] | None = None,
        *,
        middlewares: Sequence[Middleware] = (),
        keepalive_timeout_s: float | None = None,
    ) -> None:
        self.health = health
        self.registry = registry
        app = web.Application(middlewares=middlewares)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        if extra_routes is not None:
            extra_routes(app)
        # aiohttp closes a connection that has not sent a request's headers within keepalive_timeout_s, from its
        # opening or its last answer (None: aiohttp's default, an hour).
        options = {} if keepalive_timeout_s is None else {"keepalive_timeout": keepalive_timeout_s}
        super().__init__(app, host, port, **options)

    async def _metrics(self, request: web.Request) -> web.Response:
        body, content_type = metrics_answer(self.registry)
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def _healthz(self, request: web.Request) -> web.Response:
        status, body = healthz_answer(self.health)
        return web.json_response(body, status=status)

    async def _readyz(self, request: web.Request) -> web.Response:
        status, body = await readyz_answer(self.health)
        return web.json_response(body, status=status)
