"""`python -m commonos.console` (what `cos console serve` runs) as its own process: configured by COS_* variables,
ready once PostgreSQL and NATS answer, serving pages, and stopping on SIGTERM even with a live page open."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp

from commonos.runtime.embedded import free_port
from tests.console.conftest import PASSWORDS, Seeded, users_toml
from tests.support import ServiceProcess, wait_http


async def test_the_console_runs_as_a_process(tmp_path: Path, nats_url: str, console_db: Seeded) -> None:
    users = tmp_path / "people.toml"
    users.write_text(users_toml(console_db.analyst_role))
    port = free_port()
    service = ServiceProcess(
        "commonos.console",
        {
            "COS_NATS_URL": nats_url,
            "COS_DATABASE_URL": console_db.dsn,
            "COS_CONSOLE_PORT": str(port),
            "COS_CONSOLE_USERS": str(users),
            "COS_CONSOLE_SECRET": "a-secret-of-the-test-0123456789",
            "COS_CONSOLE_INSECURE_COOKIES": "1",
        },
        tmp_path / "console.log",
    ).start()
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_http(url + "/readyz", timeout_s=60)
        async with aiohttp.ClientSession(base_url=url, cookie_jar=aiohttp.CookieJar(unsafe=True)) as client:
            async with client.post("/api/login", json={"name": "alice", "password": PASSWORDS["alice"]}) as r:
                assert r.status == 200
            async with client.get("/api/sessions") as r:
                assert {s["profile_id"] for s in (await r.json())["sessions"]} == {"acme"}
            [session_id, *_] = console_db.sessions("acme")
            async with client.get(f"/sessions/{session_id}/live") as live:
                assert live.status == 200
                assert (await live.content.readline()).startswith(b"event: ready")
                started = time.monotonic()
                code = await asyncio.to_thread(service.terminate, 30)
                assert code == 0, service.output()
                assert time.monotonic() - started < 15
    finally:
        if service.alive:
            service.kill()
    assert "Traceback" not in service.output() and " ERROR " not in service.output(), service.output()
