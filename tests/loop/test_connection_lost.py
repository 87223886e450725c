"""A loop whose NATS connection is closed by the server (nats-py does not reconnect after a server -ERR)
stops, says so on /healthz and /readyz, and exits non-zero so that the orchestrator restarts it."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import aiohttp
import msgspec
import nats
import nats.errors
from nats.aio.client import Client

from commonos.loop.approvals import NatsApprover
from commonos.loop.locks import NatsSessionLocks
from commonos.loop.loop import Loop
from commonos.loop.nats_journal import NatsJournal
from commonos.loop.providers import build_provider
from commonos.loop.service import LoopService
from commonos.proto.events import TurnStarted
from commonos.proto.requests import ChatRequest, chat_subject
from commonos.proto.subjects import EVENTS_ALL
from commonos.runtime.embedded import NatsServer, free_port
from commonos.runtime.http import Health, HttpServer
from commonos.runtime.nats import ensure_streams
from tests.loop.helpers import of_type, write_profile


async def get(url: str) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        return resp.status, await resp.json()


async def close_from_the_server(nc: Client) -> None:
    """Make nats-server close `nc`: a message whose body fits max_payload (all nats-py checks) but whose
    headers take it over."""
    await nc.publish("cos.test.oversized", b"x" * (nc.max_payload - 16), headers={"Pad": "p" * 64})
    await nc.flush(timeout=2)


async def test_a_connection_closed_by_the_server_stops_the_service_with_healthz_failing(
    small_nats_server: NatsServer, tmp_path: Path
) -> None:
    profile = write_profile(tmp_path / "profiles")
    services: list[LoopService] = []

    async def on_closed() -> None:
        for s in services:
            await s.connection_closed()

    nc = await nats.connect(small_nats_server.url, closed_cb=on_closed, max_reconnect_attempts=-1)
    js = nc.jetstream()
    await ensure_streams(js)
    loop = Loop(
        NatsJournal(js),
        {profile.id: profile},
        {profile.id: build_provider(profile)},
        locks=NatsSessionLocks(js),
        approver=NatsApprover(nc),
    )
    health = Health()
    http = HttpServer(health)
    port = await http.start()
    service = LoopService(nc, loop, health=health, handle_signals=False, grace_s=0.1, heartbeat_s=0.2)
    services.append(service)
    running = asyncio.create_task(service.run())
    try:
        deadline = time.monotonic() + 10
        while (await get(f"http://127.0.0.1:{port}/readyz"))[0] != 200:
            assert time.monotonic() < deadline, "the service never got ready"
            await asyncio.sleep(0.05)
        assert (await get(f"http://127.0.0.1:{port}/healthz"))[0] == 200

        with_nothing_wrong = asyncio.create_task(close_from_the_server(nc))
        code = await asyncio.wait_for(running, 10)
        await asyncio.gather(with_nothing_wrong, return_exceptions=True)

        assert code == 1 and nc.is_closed
        assert service.lost is not None and service.lost.startswith("NATS connection closed: ")
        assert "maximum payload" in service.lost.lower()
        status, body = await get(f"http://127.0.0.1:{port}/healthz")
        assert (status, body) == (503, {"status": "failed", "reason": service.lost})
        status, body = await get(f"http://127.0.0.1:{port}/readyz")
        assert status == 503
        reasons = body["reasons"]
        assert isinstance(reasons, dict) and reasons["nats"] == service.lost
    finally:
        if not running.done():
            service.stop_event.set()
            await running
        await http.stop()


def write_users(config: Path, loop_password: str) -> None:
    config.write_text(
        "authorization { users = [ "
        f"{{user: loop, password: {loop_password}}}, {{user: client, password: client}} ] }}\n"
    )


def rotate_password(config: Path, server: NatsServer, loop_password: str) -> None:
    write_users(config, loop_password)
    pid = server.pid
    assert pid is not None
    os.kill(pid, signal.SIGHUP)  # reload: the connections that no longer authorize are closed with an error


async def test_the_loop_process_exits_non_zero_when_its_connection_is_closed_mid_turn(
    server_root: Path, tmp_path: Path
) -> None:
    config = tmp_path / "auth.conf"
    write_users(config, "one")
    server = NatsServer(server_root / "nats-loop-auth", config_file=config).start()
    profile = write_profile(tmp_path / "profiles", timeout_s=60)
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "commonos.loop",
        "serve",
        env={
            **os.environ,
            "COS_NATS_URL": server.url,
            "COS_NATS_USER": "loop",
            "COS_NATS_PASSWORD": "one",
            "COS_PROFILES_DIR": str(profile.folder.parent),
            "COS_HTTP_PORT": str(port),
            "COS_DRAIN_TIMEOUT_S": "10",
        },
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    client = await nats.connect(server.url, user="client", password="client")
    try:
        async with asyncio.timeout(30):
            while b"loop serving profiles demo" not in await proc.stderr.readline():
                assert proc.returncode is None
        # a turn waiting for an approval that will not come while the connection goes
        waiting = asyncio.create_task(
            client.request(chat_subject("demo"), msgspec.json.encode(ChatRequest(text="wait")), timeout=60)
        )
        deadline = time.monotonic() + 10
        while not of_type(await NatsJournal(client.jetstream()).events([EVENTS_ALL]), TurnStarted):
            assert time.monotonic() < deadline, "the turn never started"
            await asyncio.sleep(0.05)

        closed_at = time.monotonic()
        await asyncio.to_thread(rotate_password, config, server, "two")
        code = await asyncio.wait_for(proc.wait(), 30)
        took = time.monotonic() - closed_at
        rest = (await proc.stderr.read()).decode()
        assert code == 1, rest
        assert "NATS connection closed" in rest and "stopping so that the service is restarted" in rest
        # it does not wait out the publisher's 30 s deadline nor the drain timeout for the turn it cannot record
        assert took < 4, f"took {took:.1f}s to exit"
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await client.close()
        server.kill()
