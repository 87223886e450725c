from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import nats
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from commonos.runtime.embedded import NatsServer
from tests.harness import (
    SMALL_MAX_PAYLOAD,
    ExternalServer,
    PgServer,
    Replicated,
    cleanup,
    make_temp_root,
    new_nats,
    start_pg,
    start_replicated,
    stop_pg,
)

REPO = Path(__file__).resolve().parents[1]


def corpus_dir() -> Path:
    """Real transcripts live beside the clone (../shared/corpus), never inside the repository."""
    env = os.environ.get("COS_CORPUS_DIR")
    return Path(env) if env else REPO.parent / "shared" / "corpus"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test file runs in one test process (`--dist loadgroup`: a file is a group). The files that start a
    whole `cos up` need no group of their own: `cos up`s started at once each choose their own ports
    (`commonos.runtime.ports`)."""
    for item in items:
        path = Path(str(item.path)).resolve().relative_to(REPO).as_posix()
        item.add_marker(pytest.mark.xdist_group(path))


@pytest.fixture(scope="session")
def server_root() -> Iterator[Path]:
    root = make_temp_root("cos-test-")
    yield root
    cleanup(root)


@pytest.fixture(scope="session")
def pg_server(server_root: Path) -> Iterator[PgServer]:
    server = start_pg(server_root)
    yield server
    stop_pg(server)


@pytest.fixture
async def database_url(pg_server: PgServer) -> AsyncIterator[str]:
    """A fresh, empty database for each test."""
    name = f"test_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(pg_server.admin_url)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    yield pg_server.dsn(name)
    if pg_server.cluster is not None and not pg_server.cluster.running:
        pg_server.cluster.start()
    conn = await asyncpg.connect(pg_server.admin_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@pytest.fixture
async def nats_server(server_root: Path) -> AsyncIterator[NatsServer | ExternalServer]:
    """A nats-server of the test's own (it starts in milliseconds), or the external one, emptied."""
    server = new_nats(server_root)
    if isinstance(server, ExternalServer):
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        for name in await js.streams_info():
            if name.config.name and name.config.name.startswith("COS_"):
                await js.delete_stream(name.config.name)
        await nc.close()
    yield server
    if isinstance(server, NatsServer):
        server.kill()


@pytest.fixture
def nats_url(nats_server: NatsServer | ExternalServer) -> str:
    return nats_server.url


@pytest.fixture(params=[None, SMALL_MAX_PAYLOAD], ids=["max_payload=1MiB", "max_payload=64KiB"])
def sized_nats_server(request: pytest.FixtureRequest, server_root: Path) -> Iterator[NatsServer]:
    """A nats-server of the test's own, once with nats-server's default max_payload and once with 64 KiB:
    every size-limit test runs against both."""
    server = new_nats(server_root, max_payload=request.param or 1024 * 1024)
    assert isinstance(server, NatsServer)
    yield server
    server.kill()


@pytest.fixture
def small_nats_server(server_root: Path) -> Iterator[NatsServer]:
    """A nats-server of the test's own whose max_payload is 64 KiB."""
    server = new_nats(server_root, max_payload=SMALL_MAX_PAYLOAD)
    assert isinstance(server, NatsServer)
    yield server
    server.kill()


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Client]:
    client = await nats.connect(nats_url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    yield client
    await client.close()


@pytest.fixture
def js(nc: Client) -> JetStreamContext:
    return nc.jetstream()


@pytest.fixture
async def streams(js: JetStreamContext) -> JetStreamContext:
    """JetStream on the test's own nats-server, with CommonOS's streams."""
    from commonos.runtime.nats import ensure_streams

    await ensure_streams(js)
    return js


@pytest.fixture(params=["memory", "nats"])
def journal(request: pytest.FixtureRequest) -> Any:
    """Each Journal adapter of the loop: in memory, and on NATS (a real nats-server of the test's own)."""
    from commonos.loop.memory import MemoryJournal
    from commonos.loop.nats_journal import NatsJournal

    if request.param == "memory":
        return MemoryJournal()
    return NatsJournal(request.getfixturevalue("streams"))


@pytest.fixture(scope="session")
def replicated_pg(server_root: Path) -> Iterator[Replicated]:
    """A primary and a real streaming replica of it (pg_basebackup -R), of this test process alone: the tests
    pause its replay. Always local servers, whatever COS_TEST_DATABASE_URL says."""
    root = server_root / f"replicated-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    root.chmod(0o755)
    replicated = start_replicated(root)
    yield replicated
    replicated.stop()


@pytest.fixture
async def replica_database(replicated_pg: Replicated) -> AsyncIterator[tuple[str, str]]:
    """A fresh, empty database on the replicated primary, there on the replica too: (primary DSN, replica DSN).
    The replica's replay runs again at the end, if a test paused it."""
    await replicated_pg.streaming()
    name = f"test_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(replicated_pg.primary.url)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    await replicated_pg.caught_up()
    yield replicated_pg.dsn(name), replicated_pg.dsn(name, standby=True)
    await replicated_pg.resume()
    conn = await asyncpg.connect(replicated_pg.primary.url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()
