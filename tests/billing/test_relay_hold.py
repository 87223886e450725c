"""A priced call whose event is larger than the server's max_payload, on real servers: the relay holds it (with
the reason) instead of retrying it forever, the calls after it are published, and once released against a
server that takes it, it is published.

A priced event is never larger than the `model_called` event it prices, so this happens when the calls were
stored under a larger max_payload than the server the relay publishes to (NATS restarted with a smaller one, a
cluster with the default 1 MiB after a single server with 8 MiB): here, billing prices the calls with the relay
unable to publish (COS_COSTS missing), and a relay on a 64 KiB server takes the queue.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import nats
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from commonos.billing.outbox import PricedRelay, priced_message, queue_state
from commonos.proto import events as ev
from commonos.proto.cloudevents import event_headers
from commonos.proto.costs import ModelCallPriced, cost_delta, priced_event_id
from commonos.proto.events import encode_event
from commonos.proto.ids import new_id
from commonos.proto.subjects import COSTS_STREAM, EVENTS_STREAM
from commonos.runtime.embedded import NatsServer
from commonos.runtime.limits import message_bytes, with_stream_header
from commonos.runtime.nats import costs_stream_config, ensure_stream
from commonos.runtime.postgres import create_pool
from tests.billing.support import POSITIONS, billing
from tests.support import publish_all, wait_for_position


def call(at: datetime, tags: tuple[str, ...]) -> ev.ModelCallCompleted:
    return ev.ModelCallCompleted(
        profile_id="default",
        session_id=new_id(),
        turn_id=new_id(),
        provider="anthropic",
        model="claude-sonnet-4-5",
        occurred_at=at,
        tags=tags,
        input_tokens=1000,
        output_tokens=100,
    )


def priced_size(model_call: ev.ModelCallCompleted) -> int:
    """The size of the call's priced event (a price with as many digits as a stored one)."""
    cost = Decimal("0.0045000000")
    event = ModelCallPriced(
        event_id=priced_event_id(model_call.event_id, 0),
        occurred_at=model_call.occurred_at,
        call_id=model_call.event_id,
        revision=0,
        profile_id=model_call.profile_id,
        session_id=model_call.session_id,
        turn_id=model_call.turn_id,
        provider=model_call.provider,
        model=model_call.model,
        tags=model_call.tags,
        called_at=model_call.occurred_at,
        cost_usd=cost,
        previous_cost_usd=None,
        cost_delta_usd=cost_delta(cost, None),
        cost_status="priced",
        price_source="builtin",
        price_version="2026-01-01",
    )
    _, body, headers = priced_message(event)
    return message_bytes(body, with_stream_header(headers, COSTS_STREAM))


def call_size(model_call: ev.ModelCallCompleted) -> int:
    return message_bytes(encode_event(model_call), with_stream_header(event_headers(model_call), EVENTS_STREAM))


async def test_an_event_over_max_payload_is_held_and_the_rest_published(
    small_nats_server: NatsServer, nats_url: str, database_url: str
) -> None:
    limit = small_nats_server.max_payload
    assert limit is not None
    at = datetime.now(UTC) - timedelta(minutes=5)
    big = call(at, tuple(f"note:{i:06d}" + "x" * 240 for i in range(300)))
    assert priced_size(big) > limit
    small = [call(at + timedelta(seconds=i), ("client:acme",)) for i in (1, 2)]

    async with billing(nats_url, database_url):
        nc = await nats.connect(nats_url)
        try:
            js = nc.jetstream()
            await wait_for_stream(js)
            await js.delete_stream(COSTS_STREAM)
        finally:
            await nc.close()
        acks = await publish_all(nats_url, [small[0], big, small[1]])
        await wait_for_position(database_url, "billing", acks[-1].seq, timeout_s=30, table=POSITIONS)

    pool = await create_pool(database_url, min_size=1, max_size=1)
    small_nc = await nats.connect(small_nats_server.url)
    try:
        assert (await queue_state(pool))[0] == 3, "the three calls are queued"
        js = small_nc.jetstream()
        await ensure_stream(js, costs_stream_config())
        relay = PricedRelay(pool, js)
        assert await relay.relay_once() == 3
        assert (relay.published, relay.held) == (2, 1)
        assert (await queue_state(pool))[::2] == (0, 1), "nothing queued, one held"
        held = await pool.fetch("SELECT call_id, held FROM billing_outbox")
        assert await relay.relay_once() == 0, "a held row is not taken again"
        info = await js.stream_info(COSTS_STREAM)
        assert info.state.messages == 2, "the calls before and after the held one are published"
    finally:
        await small_nc.close()

    assert [r["call_id"] for r in held] == [big.event_id]
    reason = held[0]["held"]
    assert reason.startswith("its event is ") and reason.endswith(f"bytes, over the server's max_payload of {limit}")

    # Released (as the alert says) against a server that takes it, it is published like any other.
    nc = await nats.connect(nats_url)
    try:
        await pool.execute("UPDATE billing_outbox SET held = NULL WHERE held IS NOT NULL")
        js = nc.jetstream()
        await ensure_stream(js, costs_stream_config())
        relay = PricedRelay(pool, js)
        assert await relay.relay_once() == 1
        assert relay.published == 1
        assert await queue_state(pool) == (0, 0.0, 0)
        msg = await js.get_last_msg(COSTS_STREAM, f"cos.costs.{big.profile_id}.priced")
        assert msg.headers is not None and msg.headers["Nats-Msg-Id"] == str(priced_event_id(big.event_id, 0))
    finally:
        await nc.close()
        await pool.close()


async def wait_for_stream(js: JetStreamContext, timeout_s: float = 30.0) -> None:
    """Until billing has created COS_COSTS."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            await js.stream_info(COSTS_STREAM)
            return
        except NotFoundError:
            assert asyncio.get_running_loop().time() < deadline, "billing did not create COS_COSTS"
            await asyncio.sleep(0.1)
