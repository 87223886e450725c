"""Run the console: uvicorn serving `create_app`, until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import sys
from collections.abc import Iterator

import uvicorn

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


def server(settings: ConsoleSettings) -> ConsoleServer:
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        lifespan="on",
        access_log=False,
        log_config=None,
        proxy_headers=False,  # the client address is the peer's: COS_CONSOLE_TRUSTED_PROXIES decides
        server_header=False,
        # Live pages hold their connections open: on SIGTERM they are closed after this.
        timeout_graceful_shutdown=5,
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
