"""The journal-writer process: a durable consumer of COS_EVENTS projecting into the core tables."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from commonos.runtime import registry, service
from commonos.runtime.consumer import Projection, partition_suffix
from commonos.runtime.lifecycle import run, setup_logging
from commonos.runtime.service import consumer_options
from commonos.runtime.settings import Settings

log = logging.getLogger("commonos.journal_writer")

DEFAULT_HTTP_PORT = 9462

__all__ = ["DEFAULT_HTTP_PORT", "consumer_options", "main", "serve", "writer_projections", "writer_schemas"]


#: The service whose registered projections (`commonos.runtime.registry`) this process runs.
SERVICE = "journal-writer"


def writer_schemas() -> list[str]:
    """The schemas of the projections registered for the journal-writer, in their registered order."""
    return registry.schemas(SERVICE)


def writer_projections(suffix: str = "", unpartitioned: bool = True) -> list[Projection]:
    """The projections registered for the journal-writer (the core, the session graph and, on one instance
    only, the Memory plugin), named for the partition `suffix` names."""
    return registry.projections(SERVICE, suffix, unpartitioned)


async def serve(
    settings: Settings,
    projections: Sequence[Projection],
    schemas: Sequence[str],
    name: str,
    stop: asyncio.Event | None = None,
) -> int:
    """Run consumers for `projections` until `stop` is set (SIGTERM/SIGINT when not given)."""
    return await service.serve(settings, name, schemas, projections, stop=stop, logger=log)


def main() -> int:
    async def _main() -> int:
        settings = Settings.from_env(http_port=DEFAULT_HTTP_PORT)
        setup_logging(settings.log_level)
        suffix = partition_suffix(settings)
        projections = writer_projections(suffix, unpartitioned=(settings.partition or 0) == 0)
        return await serve(settings, projections, writer_schemas(), "journal-writer" + suffix)

    return run(_main)
