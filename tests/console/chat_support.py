"""A loop service of profile acme on the scripted provider (deltas on), and the journal-writer projecting what it
records, for the console's Chat and Approvals tests (tests/console/test_chat.py, test_approvals.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from nats.aio.client import Client

from commonos.console.users import Role, User, add_user, hash_password
from commonos.loop.approvals import NatsApprover
from commonos.loop.budgets import BudgetGuard
from commonos.loop.deltas import DeltaPublisher
from commonos.loop.locks import NatsSessionLocks
from commonos.loop.loop import Loop
from commonos.loop.nats_journal import NatsJournal
from commonos.loop.providers import build_provider
from commonos.loop.service import LoopService
from commonos.runtime.nats import ensure_streams
from tests.console.conftest import RunningConsole, Seeded, journal_writer
from tests.loop.helpers import write_profile

SCRIPT = """
[[conversations]]
match = "weather"

[[conversations.steps]]
tool_calls = [{ name = "list_dir", args = { path = "." } }]

[[conversations.steps]]
text = "Bring an umbrella: 18°C and light rain."

[[conversations]]
match = "wait"

[[conversations.steps]]
tool_calls = [{ name = "shell", args = { command = "echo waited" } }]

[[conversations.steps]]
text = "waited"

[[conversations]]

[[conversations.steps]]
text = "hello"
"""

CONFIG = """
tags = ["team:core"]
provider = "scripted"
model = "scripted-test"
system_prompt = "Be brief."
max_steps = 6

[provider_options]
script = "script.toml"

[approval]
timeout_s = 60
tools = { shell = "ask" }
"""


@contextlib.asynccontextmanager
async def serving(nc: Client, nats_url: str, folder: Path, dsn: str, profile_id: str) -> AsyncIterator[LoopService]:
    """A loop service of `profile_id` alone, and the journal-writer storing its events in `dsn`."""
    js = nc.jetstream()
    await ensure_streams(js)
    profile = write_profile(folder, profile_id, config=CONFIG, script=SCRIPT)
    guard = BudgetGuard(js)  # the enforced budgets, as the service has them (none until billing stores one)
    loop = Loop(
        NatsJournal(js),
        {profile.id: profile},
        {profile.id: build_provider(profile)},
        locks=NatsSessionLocks(js),
        approver=NatsApprover(nc),
        deltas=DeltaPublisher(nc).for_turn,
        budgets=guard,
    )
    service = LoopService(nc, loop, handle_signals=False, grace_s=0.1)
    async with journal_writer(nats_url, dsn):
        await guard.start(wait_s=1)
        await service.start()
        running = asyncio.create_task(service.serve())
        try:
            yield service
        finally:
            service.stop_event.set()
            await running
            await service.shutdown()
            await guard.stop()


@pytest.fixture
async def loop_service(nc: Client, nats_url: str, tmp_path: Path, console_db: Seeded) -> AsyncIterator[LoopService]:
    """The loop service of profile acme, and the journal-writer storing its events in the console's database."""
    async with serving(nc, nats_url, tmp_path / "profiles", console_db.dsn, "acme") as service:
        yield service


@pytest.fixture
async def globex_loop(nc: Client, nats_url: str, tmp_path: Path, console_db: Seeded) -> AsyncIterator[LoopService]:
    """A loop service of profile globex only: acme, first on the list, is then a profile no loop serves (as an
    imported profile is)."""
    async with serving(nc, nats_url, tmp_path / "profiles", console_db.dsn, "globex") as service:
        yield service


async def sign_in(console: RunningConsole, name: str, password: str) -> tuple[aiohttp.ClientSession, str]:
    client = await console.client()
    async with client.post("/api/login", json={"name": name, "password": password}) as r:
        assert r.status == 200, await r.text()
        return client, (await r.json())["csrf_token"]


def add_person(console: RunningConsole, name: str, role: Role, profiles: tuple[str, ...], pg_role: str) -> str:
    password = f"{name}-password"
    add_user(
        console.settings.users_file, User(name, role, profiles, pg_role=pg_role, password_hash=hash_password(password))
    )
    return password


async def fetch_value(dsn: str, sql: str, *args: Any, timeout_s: float = 20.0) -> Any:
    """The first non-null value of `sql`, polled until the journal-writer has stored it."""
    from commonos.runtime.postgres import connect

    conn = await connect(dsn)
    try:
        for _ in range(int(timeout_s / 0.05)):
            value = await conn.fetchval(sql, *args)
            if value is not None:
                return value
            await asyncio.sleep(0.05)
    finally:
        with contextlib.suppress(Exception):
            await conn.close()
    raise AssertionError(f"nothing from {sql} within {timeout_s}s")
