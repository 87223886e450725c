"""Run the console: uvicorn serving `create_app`, until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import sys
from collections.abc import Iterator

import uvicorn
from h11 import IDLE
from uvicorn.protocols.http.h11_impl import H11Protocol

from commonos.console.app import create_app
from commonos.console.settings import ConsoleSettings
from commonos.proto.errors import ConfigError
from commonos.runtime.args import CliError
from commonos.runtime.cli_support import cli_settings
from commonos.runtime.lifecycle import install_stop_signals, run, setup_logging
from commonos.runtime.settings import Settings

log = logging.getLogger(__name__)


class ConsoleServer(uvicorn.Server):
    """uvicorn, stopped by `stop()` rather than by signal handlers of its own (which re-raise the signal
    once stopped, so that the process would end killed by SIGTERM instead of exiting 0)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def stop(self) -> None:
        """End the live streams (their responses complete), then shut down as uvicorn does."""
        app = self.config.app
        live = getattr(getattr(app, "state", None), "live", None)
        if live is not None:
            live.close()
        self.should_exit = True


class HeaderTimeout(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, closing a connection that has not sent a whole request head within
    `header_timeout_s` of its start or of its previous response (uvicorn has no such limit: a client sending
    one header byte at a time held its socket for as long as it liked)."""

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


def server(settings: ConsoleSettings, *, timeout_graceful_shutdown: int = 5) -> ConsoleServer:
    """The console's uvicorn, its app made from `settings` (`server.config.app`)."""
    protocol = type("ConsoleHttp", (HeaderTimeout,), {"header_timeout_s": settings.header_timeout_s})
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        lifespan="on",
        access_log=False,
        log_config=None,
        http=protocol,
        proxy_headers=False,  # the client address is the peer's: COS_CONSOLE_TRUSTED_PROXIES decides
        server_header=False,
        # A chat message over the WebSocket is bounded as a request body is.
        ws_max_size=settings.max_body_bytes,
        # Live pages hold their connections open: on SIGTERM they are closed after this.
        timeout_graceful_shutdown=timeout_graceful_shutdown,
    )
    return ConsoleServer(config)


async def serve(settings: ConsoleSettings) -> int:
    srv = server(settings)
    stop = asyncio.Event()
    install_stop_signals(stop)
    stopper = asyncio.create_task(stop.wait())
    stopper.add_done_callback(lambda _: srv.stop())
    if not settings.users_file.exists():
        log.warning(
            "console: no people file at %s: nobody can sign in (cos console user add NAME --role operator)",
            settings.users_file,
        )
    if settings.secret_is_random:
        log.warning("console: COS_CONSOLE_SECRET is not set: sign-ins end when the console restarts")
    log.info("console: http://%s:%d/", settings.host, settings.port)
    try:
        await srv.serve()
    finally:
        stopper.cancel()
    return 0 if srv.started else 1


def main() -> int:
    try:
        common = Settings.from_env()
        setup_logging(common.log_level)
        # The URLs from COS_NATS_URL / COS_DATABASE_URL, else those of the `cos up` running in COS_DATA_DIR.
        common = cli_settings(common)
        settings = dataclasses.replace(ConsoleSettings.from_env(common=common), common=common)
    except (ConfigError, CliError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return run(lambda: serve(settings))


__all__ = ["main", "serve", "server"]
