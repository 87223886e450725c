"""deploy/nats/cluster.conf as three real nodes: streams at three replicas keep taking events with a node down.

The file is used as it is; only what must differ on one machine is overridden on the command line (address,
client, route and monitoring ports, the route list with 127.0.0.1 instead of nats-<i>.nats, the store folder
and the server name).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client

from commonos.proto.subjects import EVENTS_STREAM
from commonos.runtime.embedded import NatsServer, free_port
from commonos.runtime.nats import StreamUnavailable, ensure_streams, inbox_prefix
from commonos.runtime.publisher import EventPublisher
from tests.deploy.conftest import DEPLOY, nats_password
from tests.deploy.system import sample_events

pytestmark = pytest.mark.slow


@pytest.fixture
async def cluster(
    tmp_path: Path, nats_passwords: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[list[NatsServer]]:
    monkeypatch.setenv("NATS_SERVER_NAME", "overridden-below")
    route_ports = [free_port() for _ in range(3)]
    routes = ",".join(f"nats://127.0.0.1:{p}" for p in route_ports)
    nodes = [
        NatsServer(
            tmp_path / f"nats-{i}",
            config_file=DEPLOY / "nats" / "cluster.conf",
            extra_args=[
                "--server_name",
                f"nats-{i}",
                "--cluster",
                f"nats://127.0.0.1:{route_ports[i]}",
                "--routes",
                routes,
                "--http_port",
                str(free_port()),
            ],
            name=f"nats-{i}",
        )
        for i in range(3)
    ]
    try:
        for node in nodes:
            node.start()
        yield nodes
    finally:
        for node in nodes:
            node.kill()


async def connect(nodes: list[NatsServer], user: str) -> Client:
    return await nats.connect(
        [n.url for n in nodes if n.running],
        user=user,
        password=nats_password(user),
        max_reconnect_attempts=-1,
        inbox_prefix=inbox_prefix(user),
    )


async def when_jetstream_is_up(client: Client, replicas: int, timeout_s: float = 60.0) -> None:
    """The cluster elects its JetStream meta leader a moment after the nodes listen."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await ensure_streams(client.jetstream(timeout=2), replicas)
            return
        except (
            StreamUnavailable,
            nats.errors.TimeoutError,
            nats.errors.NoRespondersError,
            nats.js.errors.ServiceUnavailableError,
        ):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_three_nodes_keep_the_stream_with_one_down(cluster: list[NatsServer]) -> None:
    admin = await connect(cluster, "admin")
    try:
        await when_jetstream_is_up(admin, replicas=3)  # what `cos streams ensure` does with COS_STREAM_REPLICAS=3
    finally:
        await admin.close()
    loop = await connect(cluster, "loop")
    try:
        await when_jetstream_is_up(loop, replicas=3)  # what every service does at start: the streams are there
        js = loop.jetstream(timeout=10)
        info = await js.stream_info(EVENTS_STREAM)
        assert info.config.num_replicas == 3
        assert info.cluster is not None and len(info.cluster.replicas or []) == 2

        events = sample_events()
        publisher = EventPublisher(js, "urn:commonos:loop")
        for event in events[:5]:
            await publisher.publish(event)

        leader = next(n for n in cluster if n.name == info.cluster.leader)
        leader.kill()
        for event in events[5:]:
            await publisher.publish(event)
        assert (await js.stream_info(EVENTS_STREAM)).state.messages == len(events)
    finally:
        await loop.close()
