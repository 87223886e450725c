"""Holes found by attacking deploy/nats/auth.conf with its own credentials, each closed.

1. The `subscriber` reconfigured a service's durable consumer through the legacy, name-less
   `$JS.API.CONSUMER.CREATE.COS_EVENTS` (its deny list names consumers, which that subject does not
   carry): `headers_only` made every later event reach the writer without a body. Now that subject is
   refused to everyone but the admin, and a service checks its consumer's whole configuration at bind
   and recreates a consumer someone changed.
2. The service users could update the event stream (`max_msgs: 1` dropped history). Now only the admin
   may create, update, purge or delete the streams, and the services start on streams that exist.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import nats.errors
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

from commonos.proto.subjects import DLQ_STREAM, EVENTS_STREAM
from commonos.runtime.nats import ensure_streams
from commonos.runtime.settings import Settings
from tests.deploy.conftest import SecuredNats, nats_password
from tests.deploy.system import publish_as_loop, sample_events
from tests.support import InProcess, ServiceProcess, table_checksums, wait_for_position, wait_http

pytestmark = pytest.mark.slow


@contextlib.asynccontextmanager
async def journal_writer_as(url: str, dsn: str, user: str) -> AsyncIterator[InProcess]:
    """The core projection's writer in-process, logged in as `user`."""
    from commonos.journal_writer.service import serve, writer_schemas
    from commonos.journal_writer.store import JournalProjection

    settings = Settings(nats_url=url, database_url=dsn, nats_user=user, nats_password=nats_password(user))
    running = InProcess()
    running.task = asyncio.create_task(
        serve(settings, [JournalProjection("journal-writer")], writer_schemas(), "journal-writer", stop=running.stop)
    )
    try:
        yield running
    finally:
        assert await running.close() == 0


def _legacy_create(name: str) -> bytes:
    config = {
        "name": name,
        "durable_name": name,
        "ack_policy": "explicit",
        "deliver_policy": "all",
        "filter_subject": "cos.events.>",
        "headers_only": True,
    }
    return json.dumps({"stream_name": EVENTS_STREAM, "config": config}).encode()


@pytest.mark.parametrize("user", ["subscriber", "loop", "journal-writer", "billing"])
async def test_no_user_but_the_admin_may_create_consumers_without_naming_them(
    secured_nats: SecuredNats, user: str
) -> None:
    admin = (await secured_nats.connect("admin")).jetstream()
    await ensure_streams(admin)
    await admin.add_consumer(
        EVENTS_STREAM, ConsumerConfig(durable_name="journal-writer", ack_policy=AckPolicy.EXPLICIT)
    )
    client = await secured_nats.connect(user)
    for name in ("journal-writer", "billing"):
        with pytest.raises(nats.errors.TimeoutError):
            await client.request(f"$JS.API.CONSUMER.CREATE.{EVENTS_STREAM}", _legacy_create(name), timeout=0.5)
        await secured_nats.refused(user, f"$JS.API.CONSUMER.CREATE.{EVENTS_STREAM}")
    info = await admin.consumer_info(EVENTS_STREAM, "journal-writer")
    assert not info.config.headers_only
    names = [c.name for c in await admin.consumers_info(EVENTS_STREAM)]
    assert names == ["journal-writer"], "no consumer named billing was created"


@pytest.mark.parametrize("user", ["loop", "journal-writer", "billing", "subscriber"])
async def test_only_the_admin_may_change_the_streams(secured_nats: SecuredNats, user: str) -> None:
    admin = (await secured_nats.connect("admin")).jetstream()
    await ensure_streams(admin)
    await publish_as_loop(await secured_nats.connect("loop"), sample_events())
    stored = (await admin.stream_info(EVENTS_STREAM)).state.messages
    js = (await secured_nats.connect(user)).jetstream(timeout=0.5)
    for stream in (EVENTS_STREAM, DLQ_STREAM):
        with pytest.raises(nats.errors.TimeoutError):
            await js.update_stream(StreamConfig(name=stream, subjects=[f"{stream.lower()}.x"], max_msgs=1))
        await secured_nats.refused(user, f"$JS.API.STREAM.UPDATE.{stream}")
        with pytest.raises(nats.errors.TimeoutError):
            await js.purge_stream(stream)
        with pytest.raises(nats.errors.TimeoutError):
            await js.delete_msg(stream, 1)
        with pytest.raises(nats.errors.TimeoutError):
            await js.delete_stream(stream)
    assert (await admin.stream_info(EVENTS_STREAM)).state.messages == stored


async def test_a_writer_repairs_a_consumer_someone_reconfigured(
    secured_nats: SecuredNats, database_url: str, tmp_path: Path
) -> None:
    """Even the admin's change (say `headers_only`) must not make the writer dead-letter bodiless events:
    at bind the writer compares its consumer's whole configuration and recreates it from its position."""
    admin = (await secured_nats.connect("admin")).jetstream()
    await ensure_streams(admin)
    events = sample_events()
    loop = await secured_nats.connect("loop")
    first = await publish_as_loop(loop, events[:3])
    async with journal_writer_as(secured_nats.url, database_url, "journal-writer"):
        await wait_for_position(database_url, "journal-writer", first)
    info = await admin.consumer_info(EVENTS_STREAM, "journal-writer")
    tampered = info.config
    tampered.headers_only = True
    await admin.add_consumer(EVENTS_STREAM, tampered)  # an update of the existing consumer
    assert (await admin.consumer_info(EVENTS_STREAM, "journal-writer")).config.headers_only
    last = await publish_as_loop(loop, events[3:])
    async with journal_writer_as(secured_nats.url, database_url, "journal-writer"):
        await wait_for_position(database_url, "journal-writer", last)
    assert not (await admin.consumer_info(EVENTS_STREAM, "journal-writer")).config.headers_only
    assert (await admin.stream_info(DLQ_STREAM)).state.messages == 0, "no event reached the writer bodiless"
    assert (await table_checksums(database_url))["sessions"][0] > 0


async def test_a_service_waits_for_the_streams_an_admin_creates(
    secured_nats: SecuredNats, database_url: str, tmp_path: Path
) -> None:
    """A writer may not create the streams: until `cos streams ensure` has run as admin it waits, not ready,
    saying why; then it starts by itself."""
    env = {
        "COS_NATS_URL": secured_nats.url,
        "COS_DATABASE_URL": database_url,
        "COS_NATS_USER": "journal-writer",
        "COS_NATS_PASSWORD": nats_password("journal-writer"),
    }
    writer = ServiceProcess("commonos.journal_writer", env, tmp_path / "writer.log").start()
    try:
        await wait_http(writer.url + "/readyz", 503, timeout_s=30)
        deadline = asyncio.get_running_loop().time() + 30
        while "cos streams ensure" not in await _text(writer.url + "/readyz"):
            assert asyncio.get_running_loop().time() < deadline, writer.output()
            await asyncio.sleep(0.2)
        assert writer.alive
        setup = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "commonos.cli", "streams", "ensure"],
            env={**os.environ, **env, "COS_NATS_USER": "admin", "COS_NATS_PASSWORD": nats_password("admin")},
            capture_output=True,
            text=True,
            check=False,
        )
        assert setup.returncode == 0, setup.stderr
        assert setup.stdout.splitlines() == [
            "COS_EVENTS: 1 replica(s), 0 messages",
            "COS_DLQ: 1 replica(s), 0 messages",
            "COS_ALERTS: 1 replica(s), 0 messages",
            "COS_COSTS: 1 replica(s), 0 messages",
        ]
        await wait_http(writer.url + "/readyz", 200, timeout_s=30)
    finally:
        writer.terminate()
    denied = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "commonos.cli", "streams", "ensure"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )
    assert denied.returncode == 2 and "Traceback" not in denied.stderr
    # The server's own word (a permissions violation, logged as it arrives), then the command's one-line error.
    assert denied.stderr.splitlines()[-1].startswith("cos: error: no answer from JetStream"), denied.stderr


async def _text(url: str) -> str:
    import aiohttp

    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return await r.text()
