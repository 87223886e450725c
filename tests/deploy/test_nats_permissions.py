"""deploy/nats/auth.conf on a real nats-server: who may publish events, consume, and change the streams."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nats.errors
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from commonos.billing.projection import BillingProjection
from commonos.billing.service import CONSUMER_NAME as BILLING_CONSUMER
from commonos.proto.cloudevents import MSG_ID
from commonos.proto.events import encode_event
from commonos.proto.subjects import DLQ_STREAM, EVENTS_STREAM, subject_for
from commonos.runtime.dlq import list_dead_letters
from commonos.runtime.lanes import lane_names
from commonos.runtime.nats import ensure_streams
from commonos.runtime.postgres import connect
from commonos.runtime.publisher import EventPublisher
from tests.deploy.conftest import DEPLOY, SecuredNats
from tests.deploy.system import (
    PARTITIONS,
    chat,
    publish_as_loop,
    publish_poison,
    running_system,
    sample_events,
    wait_until_projected,
    writer_consumers,
)


def deployed_partition_counts() -> set[int]:
    """1 (a single writer) and every COS_PARTITIONS the manifests deploy."""
    counts = {1}
    for path in (DEPLOY / "compose.yaml", *sorted((DEPLOY / "k8s").rglob("*.yaml"))):
        text = path.read_text()
        for marker in ('COS_PARTITIONS: "', 'name: COS_PARTITIONS, value: "'):
            for chunk in text.split(marker)[1:]:
                counts.add(int(chunk.split('"', 1)[0]))
    return counts


def service_consumers() -> list[tuple[str, str]]:
    """(NATS user, durable consumer name) of every consumer the services create, as their code names them."""
    pairs = [("billing", name) for name in lane_names(BILLING_CONSUMER, BillingProjection.filter_subjects)]
    for partitions in sorted(deployed_partition_counts()):
        for partition in range(partitions):
            pairs += [("journal-writer", name) for name in writer_consumers(partitions, partition)]
    return sorted(set(pairs))


async def test_the_loop_may_publish_events_and_no_other_service_may(secured_nats: SecuredNats) -> None:
    admin = (await secured_nats.connect("admin")).jetstream()
    await ensure_streams(admin)
    [event] = sample_events()[:1]

    loop = await secured_nats.connect("loop")
    ack = await EventPublisher(loop.jetstream(), "urn:commonos:loop").publish(event)
    assert (ack.stream, ack.seq) == (EVENTS_STREAM, 1)

    for user in ("billing", "journal-writer", "subscriber"):
        client = await secured_nats.connect(user)
        with pytest.raises(nats.errors.TimeoutError):
            await client.jetstream().publish(
                subject_for(event), encode_event(event), timeout=0.5, headers={MSG_ID: f"{user}-try"}
            )
        await secured_nats.refused(user, subject_for(event))

    assert (await admin.stream_info(EVENTS_STREAM)).state.messages == 1
    assert secured_nats.violations("loop") == []


async def test_the_subscriber_reads_through_its_own_consumer_but_cannot_change_the_stream(
    secured_nats: SecuredNats,
) -> None:
    admin = (await secured_nats.connect("admin")).jetstream()
    await ensure_streams(admin)
    events = sample_events()
    await publish_as_loop(await secured_nats.connect("loop"), events)

    subscriber = await secured_nats.connect("subscriber")
    js = subscriber.jetstream(timeout=0.25)
    for attempt in (
        js.delete_stream(EVENTS_STREAM),
        js.purge_stream(EVENTS_STREAM),
        js.delete_msg(EVENTS_STREAM, 1),
        js.delete_stream(DLQ_STREAM),
    ):
        with pytest.raises(nats.errors.TimeoutError):
            await attempt
    for api in ("STREAM.DELETE.COS_EVENTS", "STREAM.PURGE.COS_EVENTS", "STREAM.MSG.DELETE.COS_EVENTS"):
        await secured_nats.refused("subscriber", f"$JS.API.{api}")
    info = await admin.stream_info(EVENTS_STREAM)
    assert info.state.messages == len(events)

    # Its own durable consumer, created, read from and acknowledged with its own credentials.
    js = subscriber.jetstream(timeout=5)
    await js.add_consumer(
        EVENTS_STREAM,
        ConsumerConfig(durable_name="analytics", ack_policy=AckPolicy.EXPLICIT, filter_subject="cos.events.>"),
    )
    sub = await js.pull_subscribe_bind("analytics", stream=EVENTS_STREAM)
    msgs = await sub.fetch(len(events), timeout=5)
    assert [m.metadata.sequence.stream for m in msgs] == list(range(1, len(events) + 1))
    for msg in msgs:
        await msg.ack_sync()
    consumer = await js.consumer_info(EVENTS_STREAM, "analytics")
    assert (consumer.num_pending, consumer.num_ack_pending) == (0, 0)
    assert (await admin.stream_info(EVENTS_STREAM)).state.messages == len(events)


@pytest.mark.parametrize(("owner", "consumer"), service_consumers(), ids=str)
async def test_only_its_service_may_use_a_service_consumer(
    secured_nats: SecuredNats, owner: str, consumer: str
) -> None:
    admin = (await secured_nats.connect("admin")).jetstream()
    await ensure_streams(admin)
    await publish_as_loop(await secured_nats.connect("loop"), sample_events()[:2])

    js = (await secured_nats.connect(owner)).jetstream(timeout=5)
    await js.add_consumer(EVENTS_STREAM, ConsumerConfig(durable_name=consumer, ack_policy=AckPolicy.EXPLICIT))
    sub = await js.pull_subscribe_bind(consumer, stream=EVENTS_STREAM)
    [first] = await sub.fetch(1, timeout=5)
    await first.ack_sync()
    assert secured_nats.violations(owner) == []

    for intruder in ("loop", "subscriber"):
        client = await secured_nats.connect(intruder)
        ijs = client.jetstream(timeout=0.25)
        stolen = await ijs.pull_subscribe_bind(consumer, stream=EVENTS_STREAM)
        with pytest.raises(nats.errors.TimeoutError):
            await stolen.fetch(1, timeout=0.25)
        with pytest.raises(nats.errors.TimeoutError):
            await ijs.delete_consumer(EVENTS_STREAM, consumer)
        with pytest.raises(nats.errors.TimeoutError):
            await ijs.add_consumer(
                EVENTS_STREAM, ConsumerConfig(name=consumer, durable_name=consumer, filter_subject="cos.events.>")
            )
        await client.publish(f"$JS.ACK.{EVENTS_STREAM}.{consumer}.1.2.2.0.0", b"+ACK")
        for refused in (
            f"$JS.API.CONSUMER.MSG.NEXT.{EVENTS_STREAM}.{consumer}",
            f"$JS.API.CONSUMER.DELETE.{EVENTS_STREAM}.{consumer}",
            f"$JS.API.CONSUMER.CREATE.{EVENTS_STREAM}.{consumer}.",
            f"$JS.ACK.{EVENTS_STREAM}.{consumer}.",
        ):
            await secured_nats.refused(intruder, refused)

    info = await admin.consumer_info(EVENTS_STREAM, consumer)
    assert (info.delivered.stream_seq, info.ack_floor.stream_seq, info.num_pending) == (1, 1, 1)


async def test_the_services_run_under_their_own_users(
    secured_nats: SecuredNats, database_url: str, tmp_path: Path
) -> None:
    """The whole flow with the deployment's users: the loop serves a chat, partitioned writers and billing
    project it, a poison event is dead-lettered, and no service is ever refused anything."""
    admin_client = await secured_nats.connect("admin")
    admin = admin_client.jetstream()
    async with running_system(secured_nats, database_url, tmp_path) as system:
        loop = await secured_nats.connect("loop")
        await publish_as_loop(loop, sample_events())
        await publish_poison(loop)
        reply = await chat(admin_client, "what is here?")
        assert (reply.status, reply.text) == ("completed", "Done."), system.outputs()
        await wait_until_projected(database_url, admin)

        # The consumers the services made are the ones deploy/nats/consumers describes to operators.
        running = [name for i in range(PARTITIONS) for name in writer_consumers(PARTITIONS, i)]
        running += lane_names(BILLING_CONSUMER, BillingProjection.filter_subjects)
        for consumer in running:
            expected = json.loads((DEPLOY / "nats" / "consumers" / f"{_base(consumer)}.json").read_text())
            expected["durable_name"] = consumer
            actual = (await admin.consumer_info(EVENTS_STREAM, consumer)).config.as_dict()
            assert {k: actual.get(k) for k in expected} == expected

    logs = system.outputs().lower()
    assert "permissions violation" not in logs and "authorization violation" not in logs, system.outputs()
    # The poison event was dead-lettered by the core writer of its partition (and by no consumer of another).
    letters = await list_dead_letters(admin)
    assert {d.reason.split(":")[0] for d in letters} == {"undecodable event"}
    assert "journal-writer" in {d.consumer.split("-p")[0] for d in letters}
    assert len({d.consumer.partition("-p")[2] for d in letters}) == 1
    conn = await connect(database_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM sessions") == 3  # two published, one from the chat
        assert await conn.fetchval("SELECT count(*) FROM model_calls") == 4  # two published, two by the loop
    finally:
        await conn.close()


def _base(consumer: str) -> str:
    """`graph-writer-p1-of-2-profiles` -> `graph-writer-profiles`: the operator's JSON is the same for every
    partition."""
    return re.sub(r"-p\d+-of-\d+", "", consumer)
