"""The console with a read replica (COS_DATABASE_READ_URL) on a real streaming replica (tests/conftest.py
`replicated_pg`: pg_basebackup -R of a primary of the test's own), its replay paused to make it lag for certain.

* The pages read the replica: a session projected on the primary while the replica's replay is paused is not in the
  list (as the operator, and as an analyst reading under row-level security) until the replay resumes. Opened by
  its id, it is found on the primary all the same (no 404 for a session started a moment ago).
* The lag: the Operations page (and its API) and the metrics `cos_database_replica_lag_seconds` /
  `cos_database_replica_lag_bytes` say the replica is behind, paused, while it is, and 0 once it has caught up.
* Chat while the replica lags: a turn started from the console completes with its reply, and a second request
  (another socket, as after a reload) continues the session the replica does not have yet: whether it may is
  asked of the primary.
* Without a read URL, Operations says "no replica" and the gauges are NaN, not a figure.
"""

from __future__ import annotations

import asyncio
import math
import random
import uuid
from typing import Any

import aiohttp
import pytest

from commonos.loop.service import LoopService
from commonos.proto import events as ev
from commonos.runtime.settings import Settings
from tests.console.chat_support import loop_service
from tests.console.conftest import RunningConsole, Seeded, StartConsole, project
from tests.console.test_chat import socket, turn
from tests.factories import Clock, conversation
from tests.harness import Replicated

__all__ = ["loop_service"]


@pytest.fixture
def database_url(replica_database: tuple[str, str]) -> str:
    """The test's database is one of the replicated primary (console_db seeds it there)."""
    return replica_database[0]


@pytest.fixture
async def replica_url(replica_database: tuple[str, str], console_db: Seeded, replicated_pg: Replicated) -> str:
    """The replica's DSN of the test's database, once it has replayed console_db's data."""
    await replicated_pg.caught_up()
    return replica_database[1]


@pytest.fixture
async def replica_console(
    start_console: StartConsole, console_db: Seeded, nats_url: str, replica_url: str, replicated_pg: Replicated
) -> RunningConsole:
    common = Settings(nats_url=nats_url, database_url=console_db.dsn, database_read_url=replica_url)
    console = await start_console(analyst_role=console_db.analyst_role, common=common)
    # Starting, the console applies its schema on the primary, which can write (reading the catalog prunes its
    # pages once enough DDL left dead rows there): the replica has replayed that too before the test begins.
    await replicated_pg.caught_up()
    return console


async def listed(client: aiohttp.ClientSession) -> set[str]:
    async with client.get("/api/sessions") as r:
        assert r.status == 200, await r.text()
        return {s["id"] for s in (await r.json())["sessions"]}


async def operations(client: aiohttp.ClientSession) -> dict[str, Any]:
    async with client.get("/api/operations") as r:
        assert r.status == 200, await r.text()
        body: dict[str, Any] = await r.json()
        return body


async def gauges(client: aiohttp.ClientSession) -> dict[str, float]:
    async with client.get("/metrics") as r:
        assert r.status == 200
        text = await r.text()
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in {"cos_database_replica_lag_seconds", "cos_database_replica_lag_bytes"}:
            out[name] = float(value)
    return out


async def gauges_until(client: aiohttp.ClientSession, wanted: Any, timeout_s: float = 10.0) -> dict[str, float]:
    """The gauges once `wanted(gauges)` (the console measures every 2 s); the last ones otherwise."""
    found: dict[str, float] = {}
    for _ in range(int(timeout_s / 0.2)):
        found = await gauges(client)
        if wanted(found):
            break
        await asyncio.sleep(0.2)
    return found


async def test_pages_read_the_replica_and_show_its_lag(
    replica_console: RunningConsole, console_db: Seeded, replicated_pg: Replicated, nats_url: str
) -> None:
    olivia, _ = await replica_console.signed_in("olivia")
    alice, _ = await replica_console.signed_in("alice")
    seeded = {str(s) for p in ("acme", "globex") for s in console_db.sessions(p)}
    assert await listed(olivia) == seeded
    assert await listed(alice) == {str(s) for s in console_db.sessions("acme")}
    ops = await operations(olivia)
    assert ops["replica"]["configured"] is True and ops["replica"]["replay_paused"] is False
    assert (ops["replica"]["lag_seconds"], ops["replica"]["lag_bytes"]) == (0.0, 0), ops["replica"]
    caught_up = await gauges_until(olivia, lambda g: g.get("cos_database_replica_lag_bytes") == 0.0)
    assert caught_up == {"cos_database_replica_lag_seconds": 0.0, "cos_database_replica_lag_bytes": 0.0}

    await replicated_pg.pause()
    newer = conversation(random.Random(5), Clock(), "acme", ("client:acme",))
    await project(nats_url, console_db.dsn, newer)  # on the primary: the journal-writer has committed it
    [created] = [e for e in newer if isinstance(e, ev.SessionCreated)]
    new_id = str(created.session_id)

    # The list is the replica's: not there yet, for the operator or the analyst.
    assert await listed(olivia) == seeded
    assert new_id not in await listed(alice)
    # Opened by its id it is found on the primary.
    async with olivia.get(f"/api/sessions/{new_id}") as r:
        assert r.status == 200, await r.text()
        assert (await r.json())["id"] == new_id
    async with alice.get(f"/sessions/{new_id}") as r:
        assert r.status == 200, await r.text()
    # The lag, on the Operations page, its API and the metrics.
    ops = await operations(olivia)
    replica = ops["replica"]
    assert replica["replay_paused"] is True and replica["lag_bytes"] > 0 and replica["lag_seconds"] > 0, replica
    assert replica["state"].endswith("received, not yet replayed), replay paused"), replica
    async with olivia.get("/operations") as r:
        page = await r.text()
    assert "Read replica" in page and "replay paused" in page, page
    behind = await gauges_until(olivia, lambda g: g.get("cos_database_replica_lag_bytes", 0) > 0)
    assert behind["cos_database_replica_lag_bytes"] > 0 and behind["cos_database_replica_lag_seconds"] > 0, behind

    await replicated_pg.resume()
    await replicated_pg.caught_up()
    assert await listed(olivia) == seeded | {new_id}
    assert new_id in await listed(alice)
    replica = (await operations(olivia))["replica"]
    assert (replica["lag_seconds"], replica["lag_bytes"], replica["replay_paused"]) == (0.0, 0, False), replica


async def test_chat_while_the_replica_lags(
    replica_console: RunningConsole, console_db: Seeded, replicated_pg: Replicated, loop_service: LoopService
) -> None:
    await replicated_pg.pause()
    client, token = await replica_console.signed_in("olivia")
    ws = await socket(replica_console, client, token)
    got = await turn(ws, {"text": "weather in Charleston?", "profile_id": "acme", "tags": ["client:web-test"]})
    done = got[-1]
    assert (done["type"], done["status"], done["text"]) == (
        "done",
        "completed",
        "Bring an umbrella: 18°C and light rain.",
    )
    assert [m["name"] for m in got if m["type"] == "tool_call"] == ["list_dir"]
    session = done["session_id"]
    await ws.close()

    # The session is on the primary, not on the replica.
    primary_has = await _session_exists(console_db.dsn, session)
    for _ in range(200):
        if primary_has:
            break
        await asyncio.sleep(0.05)
        primary_has = await _session_exists(console_db.dsn, session)
    assert primary_has
    assert session not in await listed(client)

    # Another socket (as after a reload) continues it: asked of the primary, not refused as "no session".
    ws = await socket(replica_console, client, token)
    again = await turn(ws, {"text": "and now?", "profile_id": "acme", "session_id": session})
    assert (again[-1]["type"], again[-1]["status"], again[-1]["session_id"]) == ("done", "completed", session), again
    await ws.close()
    async with client.post(
        "/api/chat",
        json={"text": "once more", "profile_id": "acme", "session_id": session},
        headers={"X-CSRF-Token": token},
    ) as r:
        assert r.status == 200, await r.text()
        assert (await r.json())["session_id"] == session


async def _session_exists(dsn: str, session: str) -> bool:
    from commonos.runtime.postgres import connect

    conn = await connect(dsn)
    try:
        return bool(await conn.fetchval("SELECT true FROM sessions WHERE id = $1", uuid.UUID(session)))
    finally:
        await conn.close()


async def test_without_a_replica_it_says_so(console: RunningConsole) -> None:
    olivia, _ = await console.signed_in("olivia")
    replica = (await operations(olivia))["replica"]
    assert replica == {
        "configured": False,
        "state": "no replica",
        "lag_seconds": None,
        "lag_bytes": None,
        "replay_paused": False,
    }
    async with olivia.get("/operations") as r:
        assert "No replica: the pages read the primary" in await r.text()
    found = await gauges(olivia)
    assert set(found) == {"cos_database_replica_lag_seconds", "cos_database_replica_lag_bytes"}, found
    assert all(math.isnan(v) for v in found.values()), found


async def test_a_replica_that_is_down(
    replica_console: RunningConsole, replicated_pg: Replicated, loop_service: LoopService
) -> None:
    """The pages answer 503 naming the replica, /readyz says why, Operations still answers (its positions are the
    primary's) with the problem; chat goes on; all is well again once the replica is back."""
    client, token = await replica_console.signed_in("olivia")
    replicated_pg.standby.stop()
    try:
        async with client.get("/api/sessions") as r:
            assert r.status == 503, await r.text()
            assert "the console's replica is unavailable" in await r.text()
        async with client.get("/readyz") as r:
            body = await r.json()
            assert r.status == 503 and "replica" in body["reasons"] and "database" not in body["reasons"], body
        ops = await operations(client)
        assert ops["replica"]["configured"] is True and ops["replica"]["state"].startswith("does not answer"), ops
        assert any("replica is unavailable" in p for p in ops["problems"]), ops["problems"]
        assert ops["positions"], ops
        lost = await gauges_until(client, lambda g: math.isnan(g.get("cos_database_replica_lag_seconds", 0)))
        assert math.isnan(lost["cos_database_replica_lag_seconds"]), lost
        async with client.post(
            "/api/chat", json={"text": "hello", "profile_id": "acme"}, headers={"X-CSRF-Token": token}
        ) as r:
            assert r.status == 200, await r.text()
            assert (await r.json())["status"] == "completed"
    finally:
        replicated_pg.standby.start()
        await replicated_pg.streaming()
    await replicated_pg.caught_up()
    async with client.get("/readyz") as r:
        assert r.status == 200, await r.text()
    assert await listed(client)
