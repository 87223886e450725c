"""The loop process killed in the middle of a turn: the turn is recorded as interrupted, by another loop."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import nats
import pytest

from commonos.runtime.postgres import connect
from tests.support import ServiceProcess, journal_writer, wait_http

pytestmark = pytest.mark.slow

CONFIG = """
tags = ["area:chaos"]
provider = "scripted"
model = "scripted-chaos"
system_prompt = "Run the slow command."
tools = ["shell"]
max_steps = 4
workspace = "workspace"

[provider_options]
script = "script.toml"

[approval]
timeout_s = 5
tools = { shell = "auto" }
"""

SCRIPT = """
[[conversations]]

[[conversations.steps]]
text = "Running it."
tool_calls = [{ name = "shell", args = { command = "sleep 120" } }]
usage = { input_tokens = 10, output_tokens = 5 }

[[conversations.steps]]
text = "Done."
usage = { input_tokens = 10, output_tokens = 5 }
"""


def profiles(tmp_path: Path) -> Path:
    root = tmp_path / "profiles"
    (root / "slow" / "workspace").mkdir(parents=True)
    (root / "slow" / "config.toml").write_text(CONFIG)
    (root / "slow" / "script.toml").write_text(SCRIPT)
    return root


async def turn_status(dsn: str) -> list[tuple[str, str | None]]:
    conn = await connect(dsn)
    try:
        return [(r["status"], r["error"]) for r in await conn.fetch("SELECT status, error FROM turns")]
    except Exception:
        return []
    finally:
        await conn.close()


async def test_a_turn_whose_loop_died_is_recorded_as_interrupted(
    nats_url: str, database_url: str, tmp_path: Path, chaos_report: Callable[..., None]
) -> None:
    env = {
        "COS_NATS_URL": nats_url,
        "COS_DATABASE_URL": database_url,
        "COS_PROFILES_DIR": str(profiles(tmp_path)),
        "COS_TURN_HEARTBEAT_S": "0.5",
        "COS_TURN_STALE_S": "3",
    }
    first = ServiceProcess("commonos.loop", env, tmp_path / "loop-1.log", args=("serve",)).start()
    async with journal_writer(nats_url, database_url):
        try:
            await wait_http(first.url + "/readyz", 200)
            nc = await nats.connect(nats_url)
            try:
                inbox = nc.new_inbox()
                await nc.publish("cos.cmd.slow.chat", json.dumps({"text": "run it"}).encode(), reply=inbox)
                # The turn has started and is stuck in its tool call.
                rows: list[tuple[str, str | None]] = []

                async def running() -> bool:
                    nonlocal rows
                    rows = await turn_status(database_url)
                    return rows == [("running", None)]

                for _ in range(300):
                    if await running():
                        break
                    await asyncio.sleep(0.05)
                assert rows == [("running", None)], first.output()
            finally:
                await nc.close()
            first.kill()
        finally:
            if first.alive:
                first.kill()

        second = ServiceProcess("commonos.loop", env, tmp_path / "loop-2.log", args=("serve",)).start()
        try:
            await wait_http(second.url + "/readyz", 200)
            final: list[tuple[str, str | None]] = []

            async def swept() -> bool:
                nonlocal final
                final = await turn_status(database_url)
                return bool(final) and final[0][0] != "running"

            started = asyncio.get_running_loop().time()
            deadline = started + 30
            while not await swept():
                assert asyncio.get_running_loop().time() < deadline, second.output()
                await asyncio.sleep(0.1)
            [(status, error)] = final
            assert status == "interrupted"
            assert error is not None and "stopped" in error
            chaos_report(
                published=None,
                stored=None,
                projected=1,
                lost=0,
                duplicated=0,
                dead_lettered=0,
                recovery_s=asyncio.get_running_loop().time() - started,
            )
        finally:
            assert second.terminate() == 0
