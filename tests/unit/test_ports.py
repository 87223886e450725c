"""The ports `cos up` chooses (`commonos.runtime.ports`): under one lock, never one a live `cos up` chose, freed when
it stops or dies. Real processes choosing at the same moment, each with the same well-known port in mind."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from commonos.proto.errors import ConfigError
from commonos.runtime.ports import PortRegistry, registry_path

CHOOSERS = 8

CHOOSE = """
import json, sys
from commonos.runtime.ports import PortRegistry
registry = PortRegistry()
print(json.dumps([registry.reserve(int(sys.argv[1])), registry.reserve()]), flush=True)
sys.stdin.read()  # alive, so its ports stay its own, until the test has them all
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_processes_choosing_at_once_never_get_the_same_port(tmp_path: Path) -> None:
    wanted = free_port()
    env = {**os.environ, "COS_PORTS_FILE": str(tmp_path / "ports.json")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHOOSE, str(wanted)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(CHOOSERS)
    ]
    try:
        chosen = []
        for proc in procs:
            assert proc.stdout is not None
            chosen.append(json.loads(proc.stdout.readline()))
    finally:
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(30)
            if proc.stdout is not None:
                proc.stdout.close()
    every = [port for pair in chosen for port in pair]
    assert len(every) == len(set(every)) == 2 * CHOOSERS, chosen
    assert sum(pair[0] == wanted for pair in chosen) == 1  # the well-known port went to one of them
    # They have all ended: their ports are free to choose again.
    assert PortRegistry(tmp_path / "ports.json").chosen() == {}


def test_a_port_another_live_cos_up_chose_is_skipped_and_released_ones_are_free(tmp_path: Path) -> None:
    path = tmp_path / "ports.json"
    wanted = free_port()
    other = PortRegistry(path, owner=os.getppid())  # a live process that is not this one
    ours = PortRegistry(path)
    assert other.reserve(wanted) == wanted
    mine = ours.reserve(wanted)
    assert mine != wanted
    assert ours.chosen() == {wanted: os.getppid(), mine: os.getpid()}
    # A port the operator configured is taken as it is.
    assert ours.reserve(wanted, exact=True) == wanted
    other.release()
    ours.release()
    assert ours.chosen() == {}


def test_the_ports_of_a_dead_cos_up_are_free_again(tmp_path: Path) -> None:
    path = tmp_path / "ports.json"
    wanted = free_port()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    path.write_text(json.dumps({str(wanted): int(dead.stdout)}))
    assert PortRegistry(path).reserve(wanted) == wanted


def test_a_port_in_use_is_not_chosen(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        assert PortRegistry(tmp_path / "ports.json").reserve(taken) != taken


def test_a_temporary_folder_of_another_user_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a folder to another user needs root (the tests run as root)")
    monkeypatch.delenv("COS_PORTS_FILE", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    theirs = tmp_path / f"commonos-{os.geteuid()}"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    with pytest.raises(ConfigError, match="belongs to another user"):
        registry_path()
