"""deploy/examples/subscriber.py and subscriber.ts, each run as a program of its own with the subscriber user's
credentials, against a nats-server with the users and permissions `cos up` gives it (deploy/nats/auth.conf),
reading events the project's publisher (`EventPublisher`, as the loop) stores in COS_EVENTS."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import nats.js.errors
import pytest

from commonos.proto import events as ev
from commonos.proto.events import event_type
from commonos.proto.subjects import EVENTS_STREAM, subject_for
from commonos.runtime.nats import ensure_stream, ensure_streams, events_stream_config
from tests.deploy.conftest import DEPLOY, SecuredNats, nats_password
from tests.deploy.node_examples import NodeExamples, install_node_examples
from tests.deploy.system import publish_as_loop, sample_events

EXAMPLE = DEPLOY / "examples" / "subscriber.py"
AUTH_MESSAGE = "error: authorization violation: check COS_NATS_USER/COS_NATS_PASSWORD"


@dataclass
class Example:
    """One of the two examples: how to start it."""

    language: str
    argv: list[str]
    cwd: str | None = None

    def env(self, secured_nats: SecuredNats, password: str | None = None, url: str | None = None) -> dict[str, str]:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("COS_")}
        return clean | {
            "COS_NATS_URL": secured_nats.url if url is None else url,
            "COS_NATS_USER": "subscriber",
            "COS_NATS_PASSWORD": nats_password("subscriber") if password is None else password,
        }

    async def start(
        self, secured_nats: SecuredNats, *args: str, password: str | None = None, url: str | None = None
    ) -> Process:
        proc = await asyncio.create_subprocess_exec(
            *self.argv,
            *args,
            env=self.env(secured_nats, password, url),
            cwd=self.cwd,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        return Process(proc)

    async def run(
        self, secured_nats: SecuredNats, *args: str, password: str | None = None, url: str | None = None
    ) -> tuple[int, str, str]:
        process = await self.start(secured_nats, *args, password=password, url=url)
        out, err = await asyncio.wait_for(process.proc.communicate(), 60)
        assert process.proc.returncode is not None
        return process.proc.returncode, out.decode(), err.decode()


@dataclass
class Process:
    proc: asyncio.subprocess.Process

    async def lines(self, n: int, timeout_s: float = 30) -> list[str]:
        assert self.proc.stdout is not None
        out: list[str] = []
        for _ in range(n):
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout_s)
            assert line, f"the example stopped after {out}"
            out.append(line.decode().rstrip("\n"))
        return out


@pytest.fixture(scope="session")
def node_examples() -> NodeExamples:
    return install_node_examples()


@pytest.fixture(params=["python", "typescript"])
def example(request: pytest.FixtureRequest) -> Example:
    if request.param == "python":
        return Example("python", [sys.executable, str(EXAMPLE)])
    node: NodeExamples = request.getfixturevalue("node_examples")
    return Example("typescript", [str(node.tsx), "subscriber.ts"], cwd=str(node.folder))


def lines_of(events: Sequence[ev.Event], first_seq: int = 1) -> list[str]:
    """What the examples print for `events`, stored from `first_seq` on."""
    return [f"{seq} cos.{event_type(e)}.v1 {subject_for(e)} {e.event_id}" for seq, e in enumerate(events, first_seq)]


async def stored(secured_nats: SecuredNats, events: Sequence[ev.Event]) -> None:
    await ensure_streams((await secured_nats.connect("admin")).jetstream())
    await publish_as_loop(await secured_nats.connect("loop"), events)


async def test_the_example_prints_each_event_once_across_restarts(secured_nats: SecuredNats, example: Example) -> None:
    events = sample_events()
    await stored(secured_nats, events)
    expected = lines_of(events)

    code, out, err = await example.run(secured_nats, "--durable", "example", "--max", "5")
    assert (code, err) == (0, "")
    assert out.splitlines() == expected[:5]

    # Durable: the next run goes on after the last acknowledged event, and stops once idle.
    code, out, err = await example.run(secured_nats, "--durable", "example", "--idle-exit", "1.5")
    assert (code, err) == (0, "")
    assert out.splitlines() == expected[5:]

    # A filter: only the model calls of profile acme, under a consumer of its own.
    acme_calls = [line for line in expected if " cos.events.acme." in line and ".model_call_completed " in line]
    code, out, _ = await example.run(
        secured_nats, "--durable", "acme-calls", "--filter", "cos.events.acme.*.model_call_completed", "--max", "1"
    )
    assert (code, out.splitlines()) == (0, acme_calls)


async def test_a_filter_matching_nothing_ends_after_idle_exit(secured_nats: SecuredNats, example: Example) -> None:
    await stored(secured_nats, sample_events())
    began = time.monotonic()
    code, out, err = await example.run(
        secured_nats, "--durable", "nothing", "--filter", "cos.events.nobody.>", "--idle-exit", "2"
    )
    took = time.monotonic() - began
    assert (code, out, err) == (0, "", "")
    assert 2 <= took < 10, took


async def test_it_reads_a_live_stream_and_stops_within_two_seconds_on_sigterm(
    secured_nats: SecuredNats, example: Example
) -> None:
    admin = await secured_nats.connect("admin")
    await ensure_streams(admin.jetstream())
    process = await example.start(secured_nats, "--durable", "live", "--new")
    try:
        deadline = time.monotonic() + 30
        while True:  # the consumer exists: what is published from now on is live
            try:
                await admin.jetstream().consumer_info(EVENTS_STREAM, "live")
                break
            except nats.js.errors.NotFoundError:
                assert time.monotonic() < deadline, "the example made no consumer"
                await asyncio.sleep(0.05)
        events = sample_events()
        await publish_as_loop(await secured_nats.connect("loop"), events)
        assert await process.lines(len(events)) == lines_of(events)
        await asyncio.sleep(0.5)  # waiting for more, inside a fetch
        began = time.monotonic()
        process.proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(process.proc.communicate(), 10)
        took = time.monotonic() - began
    finally:
        if process.proc.returncode is None:
            process.proc.kill()
            await process.proc.wait()
    assert (process.proc.returncode, err.decode()) == (0, "")
    assert took < 2.0, f"SIGTERM took {took:.2f}s"
    print(f"{example.language}: stopped {took:.2f}s after SIGTERM")


async def test_bad_credentials_fail_fast_with_one_line(secured_nats: SecuredNats, example: Example) -> None:
    await stored(secured_nats, sample_events())
    began = time.monotonic()
    code, out, err = await example.run(secured_nats, "--durable", "x", password="not-the-password")
    took = time.monotonic() - began
    assert (code, out, err) == (1, "", AUTH_MESSAGE + "\n")
    assert took < 5.0, f"a wrong password took {took:.2f}s to report"
    print(f"{example.language}: bad credentials reported in {took:.2f}s")


async def test_another_filter_for_an_existing_durable_is_refused_unless_reset(
    secured_nats: SecuredNats, example: Example
) -> None:
    events = sample_events()
    await stored(secured_nats, events)
    expected = lines_of(events)
    turns = [line for line in expected if ".turn_finished " in line]
    code, out, _ = await example.run(
        secured_nats, "--durable", "svc", "--filter", "cos.events.*.*.turn_finished", "--max", "1"
    )
    assert (code, out.splitlines()) == (0, turns[:1])

    code, out, err = await example.run(secured_nats, "--durable", "svc", "--filter", "cos.events.acme.>", "--max", "1")
    assert (code, out) == (1, "")
    [line] = err.splitlines()
    assert line.startswith("error: consumer 'svc' exists and reads 'cos.events.*.*.turn_finished'"), line
    assert "another --durable name" in line and "--reset" in line, line

    # The same filter goes on where it was.
    code, out, _ = await example.run(
        secured_nats, "--durable", "svc", "--filter", "cos.events.*.*.turn_finished", "--max", "1"
    )
    assert (code, out.splitlines()) == (0, turns[1:2])

    # --reset: the new filter, from the start.
    acme = [line for line in expected if " cos.events.acme." in line]
    code, out, err = await example.run(
        secured_nats, "--durable", "svc", "--filter", "cos.events.acme.>", "--reset", "--idle-exit", "1.5"
    )
    assert (code, err, out.splitlines()) == (0, "", acme)


async def test_from_seq_starts_a_new_consumer_there(secured_nats: SecuredNats, example: Example) -> None:
    events = sample_events()
    await stored(secured_nats, events)
    code, out, err = await example.run(secured_nats, "--durable", "from-five", "--from-seq", "5", "--max", "3")
    assert (code, err, out.splitlines()) == (0, "", lines_of(events)[4:7])
    # Asking the same consumer for another start is refused.
    code, _, err = await example.run(secured_nats, "--durable", "from-five", "--from-seq", "2", "--max", "1")
    assert code == 1 and "started --from-seq 5" in err, err


async def test_from_time_is_the_store_time_and_occurred_after_the_event_time(
    secured_nats: SecuredNats, example: Example
) -> None:
    """Events that happened a month ago (an import) stored now: `--from-time` finds them by when they were
    stored; `--occurred-after` keeps those that happened after a moment."""
    early = sample_events()
    await stored(secured_nats, early)
    await asyncio.sleep(1.1)
    between = datetime.now(UTC)
    await asyncio.sleep(0.1)
    late = sample_events()  # occurred_at 2026-11-01T09:00, like the first ones
    await publish_as_loop(await secured_nats.connect("loop"), late)
    late_lines = lines_of(late, first_seq=len(early) + 1)

    stamp = between.isoformat().replace("+00:00", "Z")
    code, out, err = await example.run(secured_nats, "--durable", "by-time", "--from-time", stamp, "--idle-exit", "1.5")
    assert (code, err, out.splitlines()) == (0, "", late_lines)

    # By event time: from a store time before the wanted event time, filtered on occurred_at.
    cut = late[len(late) // 2].occurred_at
    wanted = [line for line, e in zip(late_lines, late, strict=True) if e.occurred_at >= cut]
    code, out, err = await example.run(
        secured_nats,
        "--durable",
        "by-event-time",
        "--from-time",
        stamp,
        "--occurred-after",
        cut.isoformat().replace("+00:00", "Z"),
        "--idle-exit",
        "1.5",
    )
    assert (code, err, out.splitlines()) == (0, "", wanted)
    assert 0 < len(wanted) < len(late)


async def test_an_unreachable_server_is_one_line_within_ten_seconds(
    secured_nats: SecuredNats, example: Example
) -> None:
    began = time.monotonic()
    code, out, err = await example.run(secured_nats, "--durable", "x", url="nats://127.0.0.1:1")  # nothing listens
    took = time.monotonic() - began
    assert (code, out) == (1, "")
    [line] = err.splitlines()
    assert line.startswith("error: cannot reach NATS at nats://127.0.0.1:1") and "COS_NATS_URL" in line, line
    assert took < 12.0, took


async def test_info_prints_the_stream_s_size_retention_and_largest_event(
    secured_nats: SecuredNats, example: Example
) -> None:
    events = sample_events()
    await stored(secured_nats, events)
    code, out, err = await example.run(secured_nats, "--info")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"stream COS_EVENTS: {len(events)} events, first sequence 1, last sequence {len(events)}",
        "retention: max_age unbounded, max_bytes unbounded",
        "largest event (headers and body): 8388608 bytes",  # the test server's max_payload: 8MB
    ]
    admin = (await secured_nats.connect("admin")).jetstream()
    await ensure_stream(admin, events_stream_config(1, max_age_s=7200, max_bytes=64 * 1024 * 1024))
    code, out, _ = await example.run(secured_nats, "--info")
    assert out.splitlines()[1] == "retention: max_age 7200s, max_bytes 67108864 bytes"
