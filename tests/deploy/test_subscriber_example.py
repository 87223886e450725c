"""deploy/examples/subscriber.py, run as a separate program with the subscriber user's credentials."""

from __future__ import annotations

import asyncio
import os
import sys

from commonos.proto.events import event_type
from commonos.proto.subjects import subject_for
from commonos.runtime.nats import ensure_streams
from tests.deploy.conftest import DEPLOY, SecuredNats, nats_password
from tests.deploy.system import publish_as_loop, sample_events

EXAMPLE = DEPLOY / "examples" / "subscriber.py"


async def run_example(secured_nats: SecuredNats, *args: str) -> tuple[int, str, str]:
    env = {
        **os.environ,
        "COS_NATS_URL": secured_nats.url,
        "COS_NATS_USER": "subscriber",
        "COS_NATS_PASSWORD": nats_password("subscriber"),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(EXAMPLE), *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_the_example_prints_each_event_once_across_restarts(secured_nats: SecuredNats) -> None:
    await ensure_streams((await secured_nats.connect("admin")).jetstream())
    events = sample_events()
    await publish_as_loop(await secured_nats.connect("loop"), events)
    expected = [f"{seq} cos.{event_type(e)}.v1 {subject_for(e)} {e.event_id}" for seq, e in enumerate(events, start=1)]

    code, out, err = await run_example(secured_nats, "--durable", "example", "--count", "5")
    assert (code, err) == (0, "")
    assert out.splitlines() == expected[:5]

    # Durable: the next run goes on after the last acknowledged event.
    code, out, err = await run_example(secured_nats, "--durable", "example", "--count", str(len(events) - 5))
    assert (code, err) == (0, "")
    assert out.splitlines() == expected[5:]

    # A filter: only the model calls of profile acme, under a consumer of its own.
    acme_calls = [
        line for line, e in zip(expected, events, strict=True) if subject_for(e).startswith("cos.events.acme.")
    ]
    acme_calls = [line for line in acme_calls if ".model_call_completed " in line]
    code, out, _ = await run_example(
        secured_nats, "--durable", "acme-calls", "--filter", "cos.events.acme.*.model_call_completed", "--count", "1"
    )
    assert (code, out.splitlines()) == (0, acme_calls)
