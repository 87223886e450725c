"""Approvals on real servers (nats-server, PostgreSQL, the loop service on the scripted provider, the
journal-writer): a turn's risky call waits, shows on /api/approvals for those who may decide it, is approved by
an approver through the API with its CSRF token, and the turn completes with decided_by web:<name>; another
profile's approver gets 403, an analyst sees nothing and decides nothing, no CSRF token is a 403; the page lists
it, follows the loop live (SSE) and decides with one click (htmx)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import aiohttp

from commonos.console.users import Role
from commonos.loop.service import LoopService
from tests.console.chat_support import add_person, fetch_value, loop_service, sign_in
from tests.console.conftest import RunningConsole, Seeded

__all__ = ["loop_service"]


async def pending(client: aiohttp.ClientSession, count: int = 1, timeout_s: float = 15) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for _ in range(int(timeout_s / 0.1)):
        async with client.get("/api/approvals") as r:
            assert r.status == 200, await r.text()
            rows = (await r.json())["approvals"]
        if len(rows) >= count:
            return rows
        await asyncio.sleep(0.1)
    raise AssertionError(f"{count} approvals did not show within {timeout_s}s: {rows}")


async def start_waiting_turn(console: RunningConsole) -> asyncio.Task[dict[str, Any]]:
    """A turn of acme (by the operator, over POST /api/chat) whose `shell` call waits for a decision."""
    olivia, token = await console.signed_in("olivia")

    async def run() -> dict[str, Any]:
        async with olivia.post(
            "/api/chat", json={"text": "wait for it", "profile_id": "acme"}, headers={"X-CSRF-Token": token}
        ) as r:
            assert r.status == 200, await r.text()
            result: dict[str, Any] = await r.json()
            return result

    return asyncio.create_task(run())


async def test_an_approver_approves_a_waiting_call_through_the_api(
    console: RunningConsole, console_db: Seeded, loop_service: LoopService
) -> None:
    abel, token = await console.signed_in("abel")
    async with abel.get("/api/approvals") as r:
        assert (await r.json()) == {"approvals": [], "may_decide": True}
    running = await start_waiting_turn(console)
    [waiting] = await pending(abel)
    assert (waiting["tool"], waiting["args"], waiting["profile_id"], waiting["risk"]) == (
        "shell",
        {"command": "echo waited"},
        "acme",
        "high",
    )
    approval = waiting["approval_id"]
    # The operator sees it too; an analyst sees nothing and may decide nothing.
    olivia, olivia_token = await console.signed_in("olivia")
    assert [a["approval_id"] for a in await pending(olivia)] == [approval]
    alice, alice_token = await console.signed_in("alice")
    async with alice.get("/api/approvals") as r:
        assert (await r.json()) == {"approvals": [], "may_decide": False}
    async with alice.post(f"/api/approvals/{approval}/approve", headers={"X-CSRF-Token": alice_token}) as r:
        assert r.status == 403
    # An approver of another profile: 403, and nothing listed.
    password = add_person(console, "gina", Role.APPROVER, ("globex",), console_db.analyst_role)
    gina, gina_token = await sign_in(console, "gina", password)
    async with gina.get("/api/approvals") as r:
        assert (await r.json())["approvals"] == []
    async with gina.post(f"/api/approvals/{approval}/approve", headers={"X-CSRF-Token": gina_token}) as r:
        assert r.status == 403 and "does not decide for profile 'acme'" in (await r.json())["detail"]
    # Without the CSRF token, or with another's: 403. An unknown approval: 404.
    async with abel.post(f"/api/approvals/{approval}/approve") as r:
        assert r.status == 403 and "CSRF" in (await r.json())["detail"]
    async with abel.post(f"/api/approvals/{approval}/approve", headers={"X-CSRF-Token": gina_token}) as r:
        assert r.status == 403
    async with abel.post(f"/api/approvals/{uuid.uuid4()}/approve", headers={"X-CSRF-Token": token}) as r:
        assert r.status == 404
    assert not running.done()

    async with abel.post(f"/api/approvals/{approval}/approve", headers={"X-CSRF-Token": token}) as r:
        assert r.status == 200, await r.text()
        assert await r.json() == {
            "approval_id": approval,
            "profile_id": "acme",
            "status": "approved",
            "decided_by": "web:abel",
        }
    result = await asyncio.wait_for(running, 20)
    assert (result["status"], result["text"]) == ("completed", "waited")
    [call] = result["tool_calls"]
    assert (call["name"], call["approval"]) == ("shell", "approved") and "waited" in call["result"]
    decided_by = await fetch_value(
        console_db.dsn, "SELECT decided_by FROM approvals WHERE tool_call_id = $1", uuid.UUID(approval)
    )
    assert decided_by == "web:abel"
    async with abel.get("/api/approvals") as r:
        assert (await r.json())["approvals"] == []
    # Decided already: the loop no longer waits for it.
    async with olivia.post(f"/api/approvals/{approval}/deny", headers={"X-CSRF-Token": olivia_token}) as r:
        assert r.status == 404


async def test_the_page_follows_the_loop_and_decides_with_one_click(
    console: RunningConsole, console_db: Seeded, loop_service: LoopService
) -> None:
    abel, token = await console.signed_in("abel")
    async with abel.get("/approvals") as r:
        html = await r.text()
    assert r.status == 200 and "Nothing is waiting" in html and 'sse-connect="/approvals/live"' in html
    async with abel.get("/approvals/live", timeout=aiohttp.ClientTimeout(total=30)) as live:
        assert live.status == 200
        assert (await live.content.readline()).startswith(b"event: ready")
        running = await start_waiting_turn(console)
        while not (await asyncio.wait_for(live.content.readline(), 15)).startswith(b"event: changed"):
            pass
    [waiting] = await pending(abel)
    async with abel.get("/approvals/list") as r:
        fragment = await r.text()
    assert f'hx-post="/approvals/{waiting["approval_id"]}/deny"' in fragment and "echo waited" in fragment
    async with abel.post(f"/approvals/{waiting['approval_id']}/deny") as r:
        assert r.status == 403  # htmx sends the token; without it, refused
    async with abel.post(f"/approvals/{waiting['approval_id']}/deny", headers={"X-CSRF-Token": token}) as r:
        answer = await r.text()
    assert r.status == 200 and f"denied {waiting['approval_id']} as web:abel" in answer
    result = await asyncio.wait_for(running, 20)
    [call] = result["tool_calls"]
    assert call["approval"] == "denied"
    alice, _ = await console.signed_in("alice")
    async with alice.get("/approvals") as r:
        assert "Analysts do not decide approvals" in await r.text()
    async with alice.get("/approvals/live") as r:
        assert r.status == 403
