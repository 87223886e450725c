"""Each service's /readyz says not ready, naming NATS, while its NATS connection is down, and ready again once it
is back: the journal-writer, billing, the loop and the OTLP gateway, each its own process, on a nats-server that
is SIGKILLed and started again on its port."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp

from commonos.runtime.embedded import NatsServer
from tests.support import ServiceProcess, wait_http

REPO = Path(__file__).resolve().parents[2]
#: How soon a service must say that its NATS is gone.
NOTICED_WITHIN_S = 5.0


async def readyz(url: str) -> tuple[int | None, str]:
    try:
        async with aiohttp.ClientSession() as s, s.get(url + "/readyz", timeout=aiohttp.ClientTimeout(total=2)) as r:
            return r.status, await r.text()
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None, ""


async def not_ready_naming_nats(url: str, timeout_s: float) -> float:
    """Seconds until `url`'s /readyz answers 503 with a reason naming NATS."""
    started = time.monotonic()
    last: tuple[int | None, str] = (None, "")
    while time.monotonic() - started < timeout_s:
        last = await readyz(url)
        if last[0] == 503 and "NATS" in " ".join(json.loads(last[1]).get("reasons", {}).values()):
            return time.monotonic() - started
        await asyncio.sleep(0.1)
    raise AssertionError(f"{url}/readyz still answers {last} {timeout_s:.0f} s after NATS was killed")


async def test_every_service_is_not_ready_while_nats_is_down(
    nats_server: NatsServer, database_url: str, tmp_path: Path
) -> None:
    env = {
        "COS_NATS_URL": nats_server.url,
        "COS_DATABASE_URL": database_url,
        "COS_PROFILES_DIR": str(REPO / "profiles"),
        "COS_OTLP_PORT": "0",
        "COS_OTLP_GRPC_PORT": "0",
    }
    services = {
        "journal-writer": ServiceProcess("commonos.journal_writer", env, tmp_path / "journal-writer.log"),
        "billing": ServiceProcess("commonos.billing", env, tmp_path / "billing.log"),
        "loop": ServiceProcess("commonos.loop", env, tmp_path / "loop.log", args=("serve",)),
        "otlp-gateway": ServiceProcess("commonos.otlp_gateway", env, tmp_path / "otlp-gateway.log"),
    }
    for service in services.values():
        service.start()
    try:
        for service in services.values():
            await wait_http(service.url + "/readyz", 200, timeout_s=60)

        nats_server.kill()
        waited = await asyncio.gather(
            *(not_ready_naming_nats(s.url, NOTICED_WITHIN_S) for s in services.values()), return_exceptions=True
        )
        failed = [f"{name}: {w}" for name, w in zip(services, waited, strict=True) if isinstance(w, BaseException)]
        assert not failed, "\n".join(failed)
        assert all(s.alive for s in services.values()), "a service exited when NATS went away"

        nats_server.start()  # on the same port: each connection comes back by itself
        for name, service in services.items():
            await wait_http(service.url + "/readyz", 200, timeout_s=20)
            assert service.alive, name
    finally:
        for service in services.values():
            if service.alive:
                service.terminate()
