"""`cos streams ensure`: create or bring up to date the streams CommonOS keeps its history in.

Only an admin may change a stream (deploy/nats/auth.conf); the services start on the streams that
exist. Run this once as the admin before the services start, and again after an upgrade or to raise
the replicas (`COS_STREAM_REPLICAS`). `cos up` runs it itself.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from typing import Any

from nats.js.api import StreamConfig

from commonos.runtime.args import CliError, command_group
from commonos.runtime.cli_support import cli_connect, cli_settings
from commonos.runtime.settings import Settings


def stream_configs(replicas: int, settings: Settings | None = None) -> list[StreamConfig]:
    """Every stream of the system: the events (with COS_EVENTS_MAX_AGE / _MAX_BYTES when set), the dead
    letters, billing's budget alerts and priced calls."""
    from commonos.runtime.nats import (
        alerts_stream_config,
        costs_stream_config,
        dlq_stream_config,
        events_stream_config,
    )

    s = settings or Settings()
    events = events_stream_config(replicas, s.events_max_age_s, s.events_max_bytes)
    return [events, dlq_stream_config(replicas), alerts_stream_config(replicas), costs_stream_config(replicas)]


async def ensure_all(settings: Settings, nats_url: str) -> list[tuple[str, int, int]]:
    """Create or update every stream; (name, replicas, messages) of each afterwards."""
    from commonos.runtime import nats as cos_nats

    nc = await cli_connect(dataclasses.replace(settings, nats_url=nats_url), "cos-streams")
    try:
        js = nc.jetstream()
        out = []
        for config in stream_configs(settings.stream_replicas, settings):
            await cos_nats.ensure_stream(js, config)
            info = await js.stream_info(config.name or "")
            out.append((config.name or "", info.config.num_replicas or 1, info.state.messages))
        return out
    finally:
        await nc.close()


def _nats_url(settings: Settings) -> str:
    try:
        url = cli_settings(settings, database=False).nats_url
    except CliError:
        raise CliError("no NATS server to talk to: set COS_NATS_URL (or start one with `cos up`)") from None
    assert url is not None  # cli_settings raises CliError when there is none
    return url


def _ensure(args: argparse.Namespace) -> int:
    import nats.errors

    from commonos.runtime.nats import StreamUnavailable

    settings = Settings.from_env()
    try:
        rows = asyncio.run(ensure_all(settings, _nats_url(settings)))
    except StreamUnavailable as exc:
        raise CliError(f"{exc} (COS_NATS_USER must be an admin)") from None
    except nats.errors.TimeoutError as exc:
        stream = getattr(exc, "stream", None) or "a stream"
        raise CliError(
            f"no answer from JetStream about {stream}: COS_NATS_USER may not read it (it must be an admin), "
            "or JetStream is unavailable"
        ) from None
    for name, replicas, messages in rows:
        print(f"{name}: {replicas} replica(s), {messages} messages")
    return 0


def register(sub: Any) -> None:
    streams_sub = command_group(sub, "streams", "the JetStream streams (an admin's task)", __doc__)
    ensure = streams_sub.add_parser(
        "ensure",
        help="create or update COS_EVENTS, COS_DLQ, COS_ALERTS and COS_COSTS (COS_STREAM_REPLICAS replicas)",
        description=__doc__,
    )
    ensure.set_defaults(handler=_ensure)
