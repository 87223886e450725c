"""Run the console: its application mounted into the services' life (`commonos.runtime.service.service_context`),
until SIGTERM or SIGINT.

The console's port (COS_CONSOLE_PORT) serves its pages and, as every service's HTTP port does, `/healthz`
`/readyz` `/metrics`, from the start: NATS, the streams and PostgreSQL (its sign-outs' and API keys' schemas applied
under the schema lock) are waited for, not ready meanwhile. Ready, it is not ready again while NATS is disconnected or
the database (or the replica the pages read, COS_DATABASE_READ_URL) does not answer `SELECT 1`. Stopping, the
live pages' streams end (their responses complete), then the requests in flight are given COS_DRAIN_TIMEOUT_S to
finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

import asyncpg
from fastapi import FastAPI

from commonos.console.app import create_app
from commonos.console.db import Database
from commonos.console.keys import SCHEMA as API_KEYS_SCHEMA
from commonos.console.keys import PgApiKeys
from commonos.console.live import Live
from commonos.console.metrics import show_replica_lag
from commonos.console.settings import ConsoleSettings
from commonos.console.sign_outs import SCHEMA as SIGN_OUTS_SCHEMA
from commonos.console.sign_outs import DatabaseUnavailable, PgSignOuts
from commonos.proto.errors import ConfigError
from commonos.runtime.args import CliError
from commonos.runtime.asgi import AsgiServer
from commonos.runtime.cli_support import cli_settings
from commonos.runtime.http import Health
from commonos.runtime.lifecycle import run, setup_logging
from commonos.runtime.service import apply_schemas_when_reachable, service_context
from commonos.runtime.settings import Settings

log = logging.getLogger(__name__)

NAME = "cos-console"


@dataclass
class Running:
    """A started console, as `serve` hands it to `on_started` (tests use its application)."""

    app: FastAPI
    server: AsgiServer
    health: Health

    @property
    def url(self) -> str:
        return self.server.url


def _database_problem(pool: asyncpg.Pool) -> Callable[[], Awaitable[str | None]]:
    async def problem() -> str | None:
        try:
            async with pool.acquire() as conn:
                await conn.fetchval("SELECT 1")
        except Exception as exc:
            return str(exc) or type(exc).__name__
        return None

    return problem


#: How often the console measures its replica's lag (the metrics' cos_database_replica_lag_*).
REPLICA_LAG_INTERVAL_S: Final = 2.0


async def watch_replica_lag(db: Database, interval_s: float = REPLICA_LAG_INTERVAL_S) -> None:
    """Keep the lag gauges current until cancelled (NaN while the replica does not answer or refuses; why is
    logged once, when it changes)."""
    said: str | None = None
    while True:
        why: str | None = None
        try:
            show_replica_lag(await db.replica_lag())
        except DatabaseUnavailable:
            show_replica_lag(None)  # /readyz says why
        except (asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            why = f"{type(exc).__name__}: {exc}"
            show_replica_lag(None)
        if why is not None and why != said:
            log.warning("console: cannot measure the replica's lag: %s", why)
        said = why
        await asyncio.sleep(interval_s)


async def serve(
    settings: ConsoleSettings,
    *,
    stop: asyncio.Event | None = None,
    on_started: Callable[[Running], None] | None = None,
) -> int:
    """Serve the console until `stop` is set (SIGTERM/SIGINT when not given); its exit code (1 when the NATS
    connection was closed for good, so that it is restarted). Without COS_DATABASE_URL it serves all the same
    (pages needing the database answer 503, /readyz says so)."""
    common = settings.common
    if not common.nats_url:
        raise ConfigError("COS_NATS_URL is not set (or run everything embedded with `cos up`)")
    health = Health()
    app = create_app(settings, health=health)
    server = AsgiServer(
        app,
        settings.host,
        settings.port,
        header_timeout_s=settings.header_timeout_s,
        drain_timeout_s=common.drain_timeout_s,
        # A chat message over the WebSocket is bounded as a request body is.
        ws_max_size=settings.max_body_bytes,
    )
    if not settings.users_file.exists():
        log.warning(
            "console: no people file at %s: nobody can sign in (cos console user add NAME --role operator)",
            settings.users_file,
        )
    if settings.secret_is_random:
        log.warning("console: COS_CONSOLE_SECRET is not set: sign-ins end when the console restarts")
    db: Database | None = None
    lag_watch: asyncio.Task[None] | None = None
    try:
        async with service_context(common, NAME, stop, health=health, http=server) as ctx:
            if ctx.stop.is_set():
                return 1 if ctx.lost else 0
            if common.database_url:
                schemas = [SIGN_OUTS_SCHEMA, API_KEYS_SCHEMA]
                if not await apply_schemas_when_reachable(common.database_url, schemas, health, ctx.stop, log):
                    return 1 if ctx.lost else 0
                db = await Database.open(
                    common.database_url,
                    read_dsn=common.database_read_url,
                    max_size=settings.pool_max_size,
                    statement_timeout_ms=settings.statement_timeout_ms,
                )
                # Sign-outs are written: the primary's.
                app.state.auth.sign_outs = PgSignOuts(db.pool)
                # So are API keys (their revocations, their last use).
                app.state.auth.keys = PgApiKeys(db.pool)
                health.set_ready("database", True)
                health.ask("database", _database_problem(db.pool))
                if db.read_pool is not None:
                    health.ask("replica", _database_problem(db.read_pool))
                    lag_watch = asyncio.create_task(watch_replica_lag(db))
            else:
                health.set_ready("database", False, "no database configured")
            app.state.db = db
            app.state.live = live = Live(ctx.nc)
            app.state.nc = ctx.nc

            def started() -> None:
                log.info("console: http://%s:%d/", settings.host, server.port)
                if on_started is not None:
                    on_started(Running(app, server, health))

            await ctx.serve(ready=started, stopping=live.close)
    finally:
        if lag_watch is not None:
            lag_watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await lag_watch
        show_replica_lag(None)
        if db is not None:
            await db.close()
    return 1 if ctx.lost else 0


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


__all__ = ["Running", "main", "serve"]
