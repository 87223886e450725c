"""`cos up` runs only while its embedded servers do: when its nats-server or PostgreSQL dies (SIGKILL), it says so
within 5 s in one line naming the server, stops every service and exits 1."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from commonos.runtime.system import alive
from tests.cli.test_up_security import RunningUp, up_running

pytestmark = pytest.mark.slow

NOTICED_WITHIN_S = 5.0


@pytest.fixture
def up() -> Iterator[RunningUp]:
    with up_running("cos-up-servers-") as running:
        yield running


def nats_server_pid(up: RunningUp) -> int:
    """The nats-server `cos up` started: the one whose store is in its data folder."""
    store = str((up.data / "nats").resolve())
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"nats-server") and any(store.encode() in a for a in argv):
                return int(entry.name)
    raise AssertionError(f"no nats-server with its store in {store}")


def postmaster_pid(up: RunningUp) -> int:
    return int((up.data / "postgres" / "pgdata" / "postmaster.pid").read_text().splitlines()[0])


@pytest.mark.parametrize("server", ["nats-server", "PostgreSQL"])
def test_cos_up_stops_and_names_its_server_that_died(up: RunningUp, server: str) -> None:
    services = dict(up.state["pids"])
    output = up.root / "cos-up.out"
    os.kill(nats_server_pid(up) if server == "nats-server" else postmaster_pid(up), signal.SIGKILL)
    killed = time.monotonic()
    said: list[str] = []
    while not (said := [line for line in output.read_text().splitlines() if line.startswith("cos: error:")]):
        assert time.monotonic() - killed < NOTICED_WITHIN_S, f"cos up said nothing:\n{output.read_text()[-2000:]}"
        time.sleep(0.1)
    assert len(said) == 1 and f"the embedded {server} killed by signal 9" in said[0], said
    assert up.proc.wait(60) == 1
    assert not (up.data / "state.json").exists()
    assert not [name for name, pid in services.items() if alive(int(pid))], "services left running"
