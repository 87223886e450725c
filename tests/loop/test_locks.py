"""Session locks in the NATS KV bucket: create-only, refreshed while held, freed by TTL after a crash."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.aio.client import Client

from commonos.loop.locks import NatsSessionLocks, SessionBusy
from commonos.proto.ids import new_id


async def test_one_holder_at_a_time(nc: Client) -> None:
    locks = NatsSessionLocks(nc.jetstream())
    session = new_id()
    lease = await locks.acquire(session, "host-a:1")
    with pytest.raises(SessionBusy) as busy:
        await NatsSessionLocks(nc.jetstream()).acquire(session, "host-b:2")
    assert busy.value.holder == "host-a:1" and busy.value.session_id == session
    # another session is independent
    other = await locks.acquire(new_id(), "host-b:2")
    await other.release()
    await lease.release()
    await lease.release()  # twice is fine
    again = await locks.acquire(session, "host-b:2")
    assert not again.lost
    await again.release()


async def test_a_held_lock_outlives_its_ttl_and_a_dead_holders_lock_expires(nc: Client, nats_url: str) -> None:
    ttl_s = 1.0
    session = new_id()
    held = await NatsSessionLocks(nc.jetstream(), ttl_s=ttl_s).acquire(session, "alive")
    await asyncio.sleep(ttl_s * 1.6)  # longer than the TTL: only refreshes keep it
    with pytest.raises(SessionBusy):
        await NatsSessionLocks(nc.jetstream(), ttl_s=ttl_s).acquire(session, "other")
    assert not held.lost
    await held.release()

    # a holder whose process died (its connection gone) stops refreshing: the key expires
    dying = await nats.connect(nats_url, max_reconnect_attempts=0)
    orphan_session = new_id()
    orphan = await NatsSessionLocks(dying.jetstream(), ttl_s=ttl_s).acquire(orphan_session, "dead")
    await dying.close()
    await asyncio.sleep(ttl_s * 2.5)  # the TTL, and the server's expiry pass
    taken = await NatsSessionLocks(nc.jetstream(), ttl_s=ttl_s).acquire(orphan_session, "heir")
    await taken.release()
    await orphan.release()
