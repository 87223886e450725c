"""deploy/nats/streams: the operators' stream definitions are the ones the services create."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, cast

import pytest
from nats.aio.client import Client
from nats.js.api import StreamConfig

from commonos.billing.projection import BillingProjection
from commonos.billing.service import CONSUMER_NAME as BILLING_CONSUMER
from commonos.journal_writer.service import consumer_options, writer_projections
from commonos.runtime.consumer import BatchConsumer
from commonos.runtime.http import Health
from commonos.runtime.lanes import lane_names
from commonos.runtime.nats import (
    alerts_stream_config,
    costs_stream_config,
    dlq_stream_config,
    ensure_stream,
    events_stream_config,
)
from commonos.runtime.settings import Settings
from tests.deploy.conftest import DEPLOY

STREAMS: dict[str, Callable[[int], StreamConfig]] = {
    "COS_EVENTS": events_stream_config,
    "COS_DLQ": dlq_stream_config,
    "COS_ALERTS": alerts_stream_config,
    "COS_COSTS": costs_stream_config,
}


def definition(name: str) -> dict[str, object]:
    data: dict[str, object] = json.loads((DEPLOY / "nats" / "streams" / f"{name}.json").read_text())
    return data


def test_every_stream_file_is_a_stream_of_the_code() -> None:
    assert sorted(p.stem for p in (DEPLOY / "nats" / "streams").glob("*.json")) == sorted(STREAMS)


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_the_stream_file_equals_the_code(name: str) -> None:
    data = definition(name)
    assert data["num_replicas"] == 3, "the files describe the cluster: three replicas"
    assert data == STREAMS[name](3).as_dict()


@pytest.mark.parametrize("name", sorted(STREAMS))
async def test_a_stream_created_from_the_file_is_left_alone_by_the_services(nc: Client, name: str) -> None:
    """An operator creates the stream with the file (as `nats stream add --config` does); a service starting
    afterwards finds nothing to change."""
    data = {**definition(name), "num_replicas": 1}  # one test server
    reply = await nc.request(f"$JS.API.STREAM.CREATE.{name}", json.dumps(data).encode(), timeout=5)
    created = json.loads(reply.data)
    assert "error" not in created, created
    js = nc.jetstream()
    before = await js.stream_info(name)
    await ensure_stream(js, STREAMS[name](1))
    after = await js.stream_info(name)
    assert after.config == before.config
    stored = after.config.as_dict()
    assert {k: stored.get(k) for k in data} == data


def test_the_consumer_files_are_the_writers_consumers() -> None:
    """deploy/nats/consumers: the journal-writer's consumers as its code configures them (one partition; the
    partitioned ones differ only by name). Billing's file is checked against the running service in
    test_nats_permissions."""
    files = {p.stem for p in (DEPLOY / "nats" / "consumers").glob("*.json")}
    lanes = set(lane_names(BILLING_CONSUMER, BillingProjection.filter_subjects))
    for projection in writer_projections("", unpartitioned=True):
        consumer = BatchConsumer(
            cast(Any, None), cast(Any, None), projection, Health(), consumer_options(Settings(), projection)
        )
        for lane in consumer.lanes:  # one durable consumer per filter subject
            lanes.add(lane.durable)
            assert json.loads((DEPLOY / "nats" / "consumers" / f"{lane.durable}.json").read_text()) == (
                consumer.consumer_config(lane).as_dict()
            )
    assert files == lanes
