"""The Operations page, operators only: the consumers the real journal-writer and billing left on COS_EVENTS with
their lag, the projections' positions, dead letters billing really refused (and one with a hostile reason, shown as
text) a page at a time, the replay commands; 403 for analysts and approvers. And the console's NATS user of
deploy/nats/auth.conf may make exactly the JetStream calls the page makes."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import aiohttp
import nats
import pytest

from commonos.console.pages.operations import ConsumerView, lanes_of, read_nats
from commonos.proto import events as ev
from commonos.proto.subjects import DLQ_STREAM, EVENTS_STREAM
from commonos.runtime.dlq import CONSUMER, DEAD_AT, ORIGINAL_SUBJECT, REASON, STREAM_SEQ
from commonos.runtime.nats import ensure_streams
from tests.billing.support import billing
from tests.console.conftest import RunningConsole, Seeded
from tests.deploy.conftest import SecuredNats, nats_password, nats_passwords, secured_nats
from tests.support import publish_all

__all__ = ["nats_passwords", "secured_nats"]  # fixtures of tests/deploy, used here

HOSTILE_REASON = "<script>alert('dlq')</script> bad & worse"


async def dead_letter_count(nats_url: str) -> int:
    nc = await nats.connect(nats_url)
    try:
        return int((await nc.jetstream().stream_info(DLQ_STREAM)).state.messages)
    finally:
        await nc.close()


async def publish_dead_letter(nats_url: str, reason: str, seq: int = 999) -> None:
    """A dead letter as a consumer writes it (headers of commonos.runtime.dlq)."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        headers = {
            REASON: reason,
            CONSUMER: "journal-writer",
            ORIGINAL_SUBJECT: f"cos.events.acme.{uuid.uuid4()}.message_appended",
            STREAM_SEQ: str(seq),
            DEAD_AT: datetime.now(UTC).isoformat(),
        }
        await js.publish("cos.dlq.acme.x.message_appended", b"{}", stream=DLQ_STREAM, headers=headers)
    finally:
        await nc.close()


@pytest.fixture
async def dead_letters(console_db: Seeded, nats_url: str) -> int:
    """Three model calls of globex naming acme's session: billing dead-letters each (profile_mismatch)."""
    [acme_session, *_] = console_db.sessions("acme")
    calls = [
        ev.ModelCallCompleted(
            profile_id="globex",
            session_id=acme_session,
            provider="anthropic",
            model="claude-sonnet-4-5",
            input_tokens=10,
            output_tokens=1,
            occurred_at=datetime.now(UTC),
        )
        for _ in range(3)
    ]
    await publish_all(nats_url, calls)
    async with billing(nats_url, console_db.dsn):
        deadline = time.monotonic() + 60
        while await dead_letter_count(nats_url) < 3:
            assert time.monotonic() < deadline, "billing did not dead-letter the calls"
            await asyncio.sleep(0.05)
    await publish_dead_letter(nats_url, HOSTILE_REASON)
    return 4


async def get_json(client: aiohttp.ClientSession, url: str) -> Any:
    async with client.get(url) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def test_consumers_positions_dead_letters_and_replay(
    console: RunningConsole, console_db: Seeded, dead_letters: int
) -> None:
    client, _ = await console.signed_in("olivia")
    ops = await get_json(client, "/api/operations")
    assert ops["problems"] == []
    assert ops["events"]["name"] == EVENTS_STREAM and ops["events"]["last_seq"] > 0
    consumers = {c["name"]: c for c in ops["consumers"]}
    assert {"journal-writer", "billing", "graph-writer"} <= set(consumers)
    # The journal-writer stopped before the three refused calls were published: they wait for it.
    assert consumers["journal-writer"]["num_pending"] == consumers["journal-writer"]["lag"] == 3
    assert consumers["billing"]["ack_floor_stream_seq"] == ops["events"]["last_seq"]
    assert all(c["lag"] == c["num_pending"] + c["num_ack_pending"] for c in ops["consumers"])
    positions = {(p["table"], p["consumer"]): p for p in ops["positions"]}
    assert ("projection_positions", "journal-writer") in positions and ("billing_positions", "billing") in positions
    journal = positions["projection_positions", "journal-writer"]
    assert journal["behind"] == ops["events"]["last_seq"] - journal["stream_seq"]
    # What is still to apply is the lag of its own consumers: the three calls wait for the journal-writer; billing
    # has applied all it reads, whatever came after its position.
    assert journal["pending"] >= 3 and positions["billing_positions", "billing"]["pending"] == 0

    letters = ops["dead_letters"]
    assert letters["total"] == dead_letters and letters["next_after"] is None
    refused = [d for d in letters["letters"] if d["consumer"].startswith("billing")]
    assert len(refused) == 3 and all("profile_mismatch" in d["reason"] for d in refused)
    assert all(d["subject"].endswith(".model_call_completed") and d["stream_seq"] for d in refused)
    assert [d["replay_command"] for d in letters["letters"]] == [
        f"cos dlq replay {d['dlq_seq']}" for d in letters["letters"]
    ]
    assert letters["letters"][-1]["reason"] == HOSTILE_REASON
    assert ops["replay"]["all_dead_letters"] == "cos dlq replay --all" and "cos replay" in ops["replay"]["rebuild"]

    # Pages of two, oldest first, each dead letter once.
    first = (await get_json(client, "/api/operations?limit=2"))["dead_letters"]
    assert len(first["letters"]) == 2 and first["next_after"] == first["letters"][-1]["dlq_seq"]
    second = (await get_json(client, f"/api/operations?limit=2&after={first['next_after']}"))["dead_letters"]
    assert second["next_after"] is None
    assert [d["dlq_seq"] for d in first["letters"] + second["letters"]] == [d["dlq_seq"] for d in letters["letters"]]

    async with client.get("/operations?limit=2") as r:
        assert r.status == 200
        html = await r.text()
    assert "journal-writer" in html and "profile_mismatch" in html
    assert f"cos dlq replay {first['letters'][0]['dlq_seq']} {first['letters'][1]['dlq_seq']}" in html
    assert f"/operations?after={first['next_after']}&amp;limit=2" in html
    assert "only the admin NATS identity" in html and "cos replay --truncate" in html
    assert "<form" not in html.split("<main>", 1)[1]  # nothing to post: replay is a command
    async with client.get(f"/operations?after={first['next_after']}") as r:
        page = await r.text()
    assert "<script>alert" not in page and "&lt;script&gt;alert(&#39;dlq&#39;)&lt;/script&gt; bad &amp; worse" in page


async def test_operators_only(console: RunningConsole, console_db: Seeded) -> None:
    for name in ("alice", "abel"):
        client, _ = await console.signed_in(name)
        for url in ("/api/operations", "/operations"):
            async with client.get(url) as r:
                assert r.status == 403, (name, url)
        async with client.get("/sessions") as r:
            assert 'href="/operations"' not in await r.text()
    anonymous = await console.client()
    async with anonymous.get("/api/operations") as r:
        assert r.status == 401
    async with anonymous.get("/operations", allow_redirects=False) as r:
        assert r.status == 303 and r.headers["Location"].startswith("/login")
    operator, _ = await console.signed_in("olivia")
    async with operator.get("/sessions") as r:
        assert 'href="/operations"' in await r.text()


async def test_the_console_nats_user_may_read_what_the_page_reads(secured_nats: SecuredNats) -> None:
    admin = await nats.connect(secured_nats.url, user="admin", password=nats_password("admin"))
    try:
        js = admin.jetstream()
        await ensure_streams(js)
        await js.publish(
            "cos.dlq.unrouted", b"{}", stream=DLQ_STREAM, headers={REASON: "undecodable", CONSUMER: "billing"}
        )
    finally:
        await admin.close()
    console = await secured_nats.connect("console")
    found, problems = await read_nats(console, 0, 10)
    assert problems == [] and secured_nats.violations("console") == []
    assert found["events"].config.name == EVENTS_STREAM and found["consumers"] == []
    assert [d.reason for d in found["letters"].letters] == ["undecodable"]
    # Still no right to replay: publishing an event or deleting a dead letter is refused.
    await console.publish("cos.events.acme.x.session_created", b"{}")
    await secured_nats.refused("console", "cos.events.acme.x.session_created")
    await console.publish("$JS.API.STREAM.MSG.DELETE.COS_DLQ", b'{"seq": 1}')
    await secured_nats.refused("console", "$JS.API.STREAM.MSG.DELETE.COS_DLQ")


def test_a_position_is_applied_by_its_lanes_not_another_partitions() -> None:
    def consumer(name: str, lag: int) -> ConsumerView:
        return ConsumerView(
            name=name,
            filter_subjects=[],
            num_pending=lag,
            num_ack_pending=0,
            num_redelivered=0,
            delivered_stream_seq=0,
            ack_floor_stream_seq=0,
            last_active=None,
            lag=lag,
        )

    consumers = [
        consumer("graph-writer", 0),
        consumer("graph-writer-profiles", 2),
        consumer("graph-writer-p1-of-2", 5),
        consumer("graph-writer-p1-of-2-profiles", 7),
        consumer("graph", 11),
    ]
    assert [c.name for c in lanes_of("graph-writer", consumers)] == ["graph-writer", "graph-writer-profiles"]
    assert [c.name for c in lanes_of("graph-writer-p1-of-2", consumers)] == [
        "graph-writer-p1-of-2",
        "graph-writer-p1-of-2-profiles",
    ]
    assert lanes_of("billing", consumers) == []
