"""A turn refused by an enforced budget, in the console (real servers: nats-server, PostgreSQL, the loop service
with its budget guard, the journal-writer): the chat's final message and the session's turn carry the reason."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from nats.aio.client import Client

from commonos.billing.enforcement import budgets_bucket_config
from commonos.loop.service import LoopService
from commonos.proto.budget_state import BudgetState, budget_key, encode_state
from tests.console.chat_support import fetch_value, loop_service
from tests.console.conftest import RunningConsole, Seeded
from tests.console.test_chat import socket, turn
from tests.support import wait_until

__all__ = ["loop_service"]

TAG = "client:web-budget"


async def test_the_console_says_why_a_turn_was_refused(
    console: RunningConsole, console_db: Seeded, loop_service: LoopService, nc: Client
) -> None:
    kv = await nc.jetstream().create_key_value(budgets_bucket_config(1))
    now = datetime.now(UTC)
    start = now.replace(hour=0, minute=0, second=0, microsecond=0)
    state = BudgetState(
        budget="web-daily",
        tag=TAG,
        period="day",
        period_start=start,
        period_end=start + timedelta(days=1),
        limit_usd=Decimal(3),
        spent_usd=Decimal("3.25"),
        exhausted=True,
        updated_at=now,
    )
    await kv.put(budget_key(state.budget), encode_state(state))
    guard = loop_service.loop.budgets
    assert guard is not None
    await wait_until(lambda: bool(guard.enforced_keys([TAG])), timeout_s=10, what="the guard seeing the budget")

    client, token = await console.signed_in("olivia")
    ws = await socket(console, client, token)
    got = await turn(ws, {"text": "weather in Charleston?", "profile_id": "acme", "tags": [TAG]})
    done = got[-1]
    reason = "budget 'web-daily' (tag client:web-budget) is exhausted: spent 3.25 USD of its 3 USD limit for the day"
    assert done["type"] == "done" and done["status"] == "failed" and reason in done["error"], done

    await fetch_value(console_db.dsn, "SELECT error FROM turns WHERE id = $1", done["turn_id"])
    async with client.get(f"/api/sessions/{done['session_id']}") as r:
        assert r.status == 200, await r.text()
        [shown] = (await r.json())["turns"]
    assert shown["status"] == "failed" and reason in shown["error"]
    async with client.get(f"/sessions/{done['session_id']}") as r:
        page = await r.text()
    assert "is exhausted: spent 3.25 USD of its 3 USD limit for the day" in page
