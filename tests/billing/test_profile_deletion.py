"""Billing and a deleted profile: what was billed stays (an accounting record), a model call of the profile
after its deletion is a `profile_deleted` dead letter, and billing bills it again once the profile is
re-created."""

from __future__ import annotations

import asyncpg
import nats
import pytest

from commonos.proto import events as ev
from commonos.runtime.dlq import list_dead_letters
from tests.billing.support import POSITIONS, billing
from tests.factories import Clock, SessionBuilder
from tests.support import publish_all, wait_for_position

pytestmark = pytest.mark.slow


async def test_a_deleted_profiles_calls_stay_billed_and_its_later_calls_are_refused(
    nats_url: str, database_url: str
) -> None:
    clock = Clock()
    acme, globex = SessionBuilder("acme", clock).create(), SessionBuilder("globex", clock).create()
    for s in (acme, globex):
        s.model_call(s.start_turn())
    deletion = ev.ProfileDeleted(profile_id="acme", deleted_by="cli:alice", occurred_at=clock.tick())
    late = SessionBuilder("acme", clock).create()
    late.model_call(late.start_turn())  # a loop that did not know yet
    acme.model_call(acme.start_turn())
    globex.model_call(globex.start_turn())
    recreated = ev.ProfileUpserted(profile_id="acme", occurred_at=clock.tick())
    again = SessionBuilder("acme", clock).create()
    again.model_call(again.start_turn())
    before = [*acme.events[:3], *globex.events[:3]]
    after = [*late.events, *acme.events[3:], *globex.events[3:]]
    acks = await publish_all(nats_url, [*before, deletion, *after, recreated, *again.events])
    async with billing(nats_url, database_url):
        await wait_for_position(database_url, "billing", acks[-1].seq, table=POSITIONS)

    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT profile_id, session_id FROM model_calls ORDER BY created_at")
        [tombstone] = await conn.fetch("SELECT * FROM billing_profile_deletions")
    finally:
        await conn.close()
    assert [(r["profile_id"], r["session_id"]) for r in rows] == [
        ("acme", acme.session_id),  # billed before the deletion: kept
        ("globex", globex.session_id),
        ("globex", globex.session_id),
        ("acme", again.session_id),  # after the re-creation
    ]
    assert (tombstone["profile_id"], tombstone["event_id"], tombstone["recreated_at"]) == (
        "acme",
        deletion.event_id,
        recreated.occurred_at,
    )
    nc = await nats.connect(nats_url)
    try:
        letters = await list_dead_letters(nc.jetstream())
    finally:
        await nc.close()
    assert sorted((d.consumer, d.subject) for d in letters) == sorted(
        [
            ("billing", f"cos.events.acme.{late.session_id}.model_call_completed"),
            ("billing", f"cos.events.acme.{acme.session_id}.model_call_completed"),
        ]
    )
    assert all(d.reason.startswith("profile_deleted: model_call_completed of profile 'acme'") for d in letters)
