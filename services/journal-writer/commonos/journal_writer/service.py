"""The journal-writer process: a durable consumer of COS_EVENTS projecting into the core tables."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from commonos.journal_writer.schema import SCHEMA
from commonos.journal_writer.store import JournalProjection
from commonos.runtime import service
from commonos.runtime.consumer import Projection, partition_suffix
from commonos.runtime.lifecycle import run, setup_logging
from commonos.runtime.service import consumer_options
from commonos.runtime.settings import Settings

log = logging.getLogger("commonos.journal_writer")

DEFAULT_HTTP_PORT = 9462

__all__ = ["DEFAULT_HTTP_PORT", "consumer_options", "main", "serve", "writer_projections", "writer_schemas"]


def writer_schemas() -> list[str]:
    """The core schema, then the plugin schemas whose projections run in this process."""
    from commonos.journal_writer.graph_schema import SCHEMA as GRAPH_SCHEMA
    from commonos.journal_writer.memory import OWNERS_SCHEMA as MEMORY_OWNERS_SCHEMA
    from commonos.memory.schema import SCHEMA as MEMORY_SCHEMA

    return [SCHEMA, MEMORY_SCHEMA, MEMORY_OWNERS_SCHEMA, GRAPH_SCHEMA]


def writer_projections(suffix: str = "", unpartitioned: bool = True) -> list[Projection]:
    """The core projection, the session graph's and, on one instance only, the Memory plugin's."""
    from commonos.journal_writer.graph_projection import GraphProjection
    from commonos.journal_writer.memory import MemoryProjection

    projections: list[Projection] = [
        JournalProjection("journal-writer" + suffix),
        GraphProjection("graph-writer" + suffix),
    ]
    if unpartitioned:
        projections.append(MemoryProjection())
    return projections


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
