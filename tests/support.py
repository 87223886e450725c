"""Helpers for integration tests: publish, run services (in-process or as processes), compare tables."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import nats
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import PubAck

from commonos.proto.events import Event
from commonos.runtime.embedded import free_port
from commonos.runtime.nats import ensure_streams
from commonos.runtime.publisher import EventPublisher
from commonos.runtime.settings import Settings
from tests.harness import PgServer

CORE_TABLES = ("profiles", "sessions", "turns", "messages", "tool_calls", "approvals")


async def fresh_database(pg_server: PgServer) -> str:
    """Another empty database on the session's server (dropped with the server at the end)."""
    name = f"extra_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(pg_server.admin_url)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return pg_server.dsn(name)


async def publish_all(nats_url: str, events: Sequence[Event], window: int = 2000) -> list[PubAck]:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        publisher = EventPublisher(js, "urn:commonos:test")
        acks: list[PubAck] = []
        for start in range(0, len(events), 10_000):
            acks += await publisher.publish_many(events[start : start + 10_000], window=window)
        return acks
    finally:
        await nc.close()


async def table_checksums(dsn: str, tables: Sequence[str] = CORE_TABLES) -> dict[str, tuple[int, str]]:
    """Row count and an md5 over every row's text, in primary-key order, for each table."""
    conn = await asyncpg.connect(dsn)
    try:
        out: dict[str, tuple[int, str]] = {}
        for table in tables:
            row = await conn.fetchrow(
                f"SELECT count(*) AS n, coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '') AS sum "
                f"FROM {table} t"
            )
            assert row is not None
            out[table] = (int(row["n"]), str(row["sum"]))
        return out
    finally:
        await conn.close()


async def position(dsn: str, consumer: str, table: str = "projection_positions") -> int:
    conn = await asyncpg.connect(dsn)
    try:
        with contextlib.suppress(asyncpg.UndefinedTableError):
            return int(await conn.fetchval(f"SELECT stream_seq FROM {table} WHERE consumer = $1", consumer) or 0)
        return 0
    finally:
        await conn.close()


async def wait_for_position(
    dsn: str, consumer: str, seq: int, timeout_s: float = 60.0, table: str = "projection_positions"
) -> int:
    """Wait until `consumer` has committed stream sequence `seq` (never a blind sleep)."""
    deadline = time.monotonic() + timeout_s
    last = -1
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, asyncpg.PostgresError):
            last = await position(dsn, consumer, table)
            if last >= seq:
                return last
        await asyncio.sleep(0.02)
    raise AssertionError(f"{consumer} reached stream seq {last}, not {seq}, within {timeout_s}s")


async def wait_until(condition: Callable[[], bool], timeout_s: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s}s")
        await asyncio.sleep(0.02)


async def wait_caught_up(
    js: JetStreamContext, dsn: str, consumer: str, table: str = "projection_positions", timeout_s: float = 60.0
) -> int:
    """Wait until a (possibly filtered) consumer has nothing pending and its position holds what it got."""
    deadline = time.monotonic() + timeout_s
    info = None
    while True:
        with contextlib.suppress(nats.js.errors.NotFoundError):  # the writer has not created it yet
            info = await js.consumer_info("COS_EVENTS", consumer)
            seq = int(info.delivered.stream_seq or 0)
            if info.num_pending == 0 and info.num_ack_pending == 0 and await position(dsn, consumer, table) >= seq:
                return seq
        if time.monotonic() > deadline:
            raise AssertionError(f"{consumer} did not catch up within {timeout_s}s: {info}")
        await asyncio.sleep(0.02)


@dataclass
class InProcess:
    """A service's `serve()` running as a task in the test's event loop."""

    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[int] | None = None

    async def close(self) -> int:
        self.stop.set()
        assert self.task is not None
        return await asyncio.wait_for(self.task, 30)


@contextlib.asynccontextmanager
async def journal_writer(
    nats_url: str,
    dsn: str,
    name: str = "journal-writer",
    batch_size: int = 500,
    partitions: int = 1,
    partition: int = 0,
) -> AsyncIterator[InProcess]:
    from commonos.journal_writer.service import serve, writer_schemas
    from commonos.journal_writer.store import JournalProjection

    settings = Settings(
        nats_url=nats_url,
        database_url=dsn,
        http_port=0,
        batch_size=batch_size,
        partitions=partitions,
        partition=partition,
    )
    running = InProcess()
    running.task = asyncio.create_task(
        serve(settings, [JournalProjection(name)], writer_schemas(), name, stop=running.stop)
    )
    try:
        yield running
    finally:
        if not running.task.done():
            await running.close()
        elif running.task.exception() is not None:
            raise running.task.exception()  # type: ignore[misc]


@dataclass
class ServiceProcess:
    """A service as its own process (`python -m <module>`), so a test can SIGKILL it."""

    module: str
    env: dict[str, str]
    log_path: Path
    args: tuple[str, ...] = ()
    http_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ServiceProcess:
        env = {**os.environ, **self.env, "COS_HTTP_PORT": str(self.http_port)}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", self.module, *self.args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self, timeout_s: float = 30) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


async def http_status(url: str) -> int | None:
    import aiohttp

    try:
        async with aiohttp.ClientSession() as s, s.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
            return r.status
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None


async def wait_http(url: str, status: int = 200, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    last: int | None = None
    while time.monotonic() < deadline:
        last = await http_status(url)
        if last == status:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{url} answered {last}, not {status}, within {timeout_s}s")
