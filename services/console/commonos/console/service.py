"""Run the console: uvicorn serving `create_app`, until SIGTERM or SIGINT."""

from __future__ import annotations

import dataclasses
import logging
import sys

import uvicorn

from commonos.console.app import create_app
from commonos.console.settings import ConsoleSettings
from commonos.proto.errors import ConfigError
from commonos.runtime.args import CliError
from commonos.runtime.cli_support import cli_settings
from commonos.runtime.lifecycle import run, setup_logging
from commonos.runtime.settings import Settings

log = logging.getLogger(__name__)


def server(settings: ConsoleSettings) -> uvicorn.Server:
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
    return uvicorn.Server(config)


async def serve(settings: ConsoleSettings) -> int:
    srv = server(settings)
    if settings.secret_is_random:
        log.warning("console: COS_CONSOLE_SECRET is not set: sign-ins end when the console restarts")
    log.info("console: http://%s:%d/", settings.host, settings.port)
    await srv.serve()
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
