"""`cos status` is unhealthy, saying why, while JetStream refuses writes: its store at the server's limit
(`jetstream { max_file_store }`), or COS_EVENTS at its own limit with `discard: new`. Real nats-servers of the
test's own, filled until they refuse an event."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.js.errors
import pytest
from nats.js.api import DiscardPolicy

from commonos.proto.subjects import EVENTS_STREAM
from commonos.runtime.embedded import NatsServer
from commonos.runtime.nats import ensure_streams, events_stream_config


def cos_status(nats_url: str, database_url: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COS_")}
    env |= {"COS_NATS_URL": nats_url, "COS_DATABASE_URL": database_url, "COS_DATA_DIR": str(tmp_path / "none")}
    return subprocess.run(
        [sys.executable, "-m", "commonos.cli.main", "status"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        stdin=subprocess.DEVNULL,
    )


async def fill(nats_url: str, subject: str = "cos.events.p.s.filler") -> str:
    """Publish 1 KiB messages on COS_EVENTS until JetStream refuses one; its error."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        for _ in range(10_000):
            try:
                await js.publish(subject, b"x" * 1024, timeout=2)
            except nats.js.errors.APIError as exc:
                return str(exc)
        raise AssertionError("JetStream took 10 MiB without refusing")
    finally:
        await nc.close()


@pytest.fixture
def small_store(server_root: Path) -> Iterator[NatsServer]:
    """A nats-server whose JetStream may keep 256 KiB on disk, its streams made."""
    folder = server_root / f"nats-small-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    config = folder / "small.conf"
    config.write_text("jetstream { max_file_store: 262144 }\n")
    server = NatsServer(folder, config_file=config).start()
    yield server
    server.kill()


async def test_status_is_unhealthy_while_the_store_is_full(
    small_store: NatsServer, database_url: str, tmp_path: Path
) -> None:
    nc = await nats.connect(small_store.url)
    await ensure_streams(nc.jetstream())
    await nc.close()
    assert cos_status(small_store.url, database_url, tmp_path).returncode == 0
    refused = await fill(small_store.url)
    assert "insufficient resources" in refused, refused

    done = cos_status(small_store.url, database_url, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    problems = [line for line in done.stdout.splitlines() if line.startswith("problem: ")]
    assert problems == ["problem: JetStream refuses writes: insufficient resources"], done.stdout


async def test_status_is_unhealthy_while_the_events_stream_is_full(
    nats_url: str, database_url: str, tmp_path: Path
) -> None:
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await ensure_streams(js)
    config = events_stream_config(max_bytes=64 * 1024)
    config.discard = DiscardPolicy.NEW
    await js.update_stream(config)
    await nc.close()
    refused = await fill(nats_url)
    assert "maximum bytes exceeded" in refused, refused

    done = cos_status(nats_url, database_url, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    problems = [line for line in done.stdout.splitlines() if line.startswith("problem: ")]
    assert len(problems) == 1 and problems[0].startswith(f"problem: {EVENTS_STREAM} is full ("), done.stdout
    assert problems[0].endswith(
        "bytes of its max_bytes 65,536, discard new): JetStream refuses new messages until an operator raises the limit"
    ), problems
