"""A gateway that cannot listen on its OTLP port exits, and says why.

Seen in a CI run: `cos up` started a gateway whose OTLP port another process had just taken; the gateway never
exited, so `cos up` waited its 60 s and failed with "not ready" instead of starting it again on a free port.
Its token watch had been cancelled at the moment an update arrived, and Python 3.11's `asyncio.wait_for`
drops a cancellation in that case: the watch went on, and the gateway awaited it for ever. How often that
happens depends on timing; eight gateways started together make it happen (most of them hung before the fix).

Real gateway processes against the test's own nats-server; the port held by a real listener."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from commonos.runtime.embedded import free_port

GATEWAYS = 8
EXIT_WITHIN_S = 20.0


@pytest.fixture
def port_taken() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def test_a_gateway_whose_otlp_port_is_taken_exits_however_its_start_lines_up(
    port_taken: int, nats_url: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COS_")}
    env |= {"COS_NATS_URL": nats_url, "COS_OTLP_PORT": str(port_taken), "COS_OTLP_GRPC_PORT": "0"}
    logs = [tmp_path / f"gateway-{i}.log" for i in range(GATEWAYS)]
    procs = []
    for log in logs:
        with log.open("wb") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "commonos.otlp_gateway"],
                    env=env | {"COS_HTTP_PORT": str(free_port())},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            )
    deadline = time.monotonic() + EXIT_WITHIN_S
    try:
        codes: list[int | None] = []
        for proc in procs:
            try:
                codes.append(proc.wait(max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    hung = [i for i, code in enumerate(codes) if code is None]
    assert not hung, f"{len(hung)} of {GATEWAYS} gateways still running after {EXIT_WITHIN_S} s: {codes}"
    assert all(code != 0 for code in codes), codes
    for log in logs:
        assert "address already in use" in log.read_text().lower(), log.read_text()[-2000:]
