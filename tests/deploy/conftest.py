"""Fixtures for the deployment tests: a nats-server run with deploy/nats's users and permissions."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from commonos.runtime.embedded import NatsServer
from commonos.runtime.nats import inbox_prefix

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"

#: NATS user -> the environment variable auth.conf reads its password from.
NATS_USERS = {
    "loop": "NATS_LOOP_PASSWORD",
    "journal-writer": "NATS_JOURNAL_WRITER_PASSWORD",
    "billing": "NATS_BILLING_PASSWORD",
    "otlp-gateway": "NATS_OTLP_GATEWAY_PASSWORD",
    "console": "NATS_CONSOLE_PASSWORD",
    "subscriber": "NATS_SUBSCRIBER_PASSWORD",
    "admin": "NATS_ADMIN_PASSWORD",
}


def nats_password(user: str) -> str:
    return f"test-{user}-secret"


@dataclass
class SecuredNats:
    """A nats-server with the deployment's users; `connect(user)` logs in as one of them."""

    server: NatsServer
    clients: list[Client] = field(default_factory=list)
    #: Asynchronous errors each client was sent (permission violations), by user.
    errors: dict[str, list[str]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.server.url

    async def connect(self, user: str) -> Client:
        seen = self.errors.setdefault(user, [])

        async def on_error(exc: Exception) -> None:
            seen.append(str(exc))

        client = await nats.connect(
            self.url,
            user=user,
            password=nats_password(user),
            error_cb=on_error,
            max_reconnect_attempts=0,
            inbox_prefix=inbox_prefix(user),  # each user reads only its own inbox
        )
        self.clients.append(client)
        return client

    def violations(self, user: str) -> list[str]:
        return [e for e in self.errors.get(user, []) if "permissions violation" in e.lower()]

    async def refused(self, user: str, subject: str, timeout_s: float = 5.0) -> None:
        """Wait for the server's report that `user` may not publish to `subject` (or a subject it starts)."""
        wanted = f'publish to "{subject.lower()}'
        deadline = time.monotonic() + timeout_s
        while not any(wanted in v.lower() for v in self.violations(user)):
            if time.monotonic() > deadline:
                raise AssertionError(f"{user} was not refused {subject}: {self.violations(user)}")
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        for client in self.clients:
            if not client.is_closed:
                await client.close()


@pytest.fixture
def nats_passwords(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The users' passwords in the environment nats-server (and the services' settings) read them from."""
    for user, variable in NATS_USERS.items():
        monkeypatch.setenv(variable, nats_password(user))
    yield {user: nats_password(user) for user in NATS_USERS}


@pytest.fixture
async def secured_nats(tmp_path: Path, nats_passwords: dict[str, str]) -> AsyncIterator[SecuredNats]:
    """nats-server with deploy/nats/auth.conf included as it is (NatsServer adds address, port and JetStream)."""
    conf_dir = tmp_path / "nats-conf"
    conf_dir.mkdir()
    shutil.copy(DEPLOY / "nats" / "auth.conf", conf_dir / "auth.conf")
    config = conf_dir / "server.conf"
    config.write_text('include "auth.conf"\nmax_payload: 8MB\n')
    server = NatsServer(tmp_path / "nats", config_file=config).start()
    secured = SecuredNats(server)
    try:
        yield secured
    finally:
        await secured.close()
        server.kill()
