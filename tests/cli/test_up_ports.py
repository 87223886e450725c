"""`cos up`'s well-known ports (OTLP/HTTP's 4318, the console's 8470) are taken when free. Free when `cos up`
looked is not free when the service binds: a program that is not a `cos up` (another `cos up` never chooses a
port one chose: tests/cli/test_up_side_by_side.py) can take the port in between. The service that lost its port
is started again on a free one, instead of `cos up` failing.

Real processes against the test's own NATS: the OTLP gateway as `cos up` starts it, the port held by a real
listener, and `cos up`'s look at the port made to answer as it did a moment before the other took it."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from commonos.cli import up
from commonos.runtime import ports
from commonos.runtime.embedded import free_port
from commonos.runtime.settings import Settings
from commonos.runtime.system import Endpoints


@pytest.fixture
def otlp_port_taken(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """A listener on the port `cos up` takes for OTLP/HTTP: a free one of the test's own in place of 4318, which
    another `cos up` of the suite may hold."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        monkeypatch.setattr(up, "OTLP_PORT", held.getsockname()[1])
        yield up.OTLP_PORT


def test_a_service_that_lost_its_well_known_port_starts_on_a_free_one(
    otlp_port_taken: int, nats_url: str, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COS_OTLP_PORT", raising=False)
    monkeypatch.delenv("COS_OTLP_GRPC_PORT", raising=False)
    monkeypatch.setattr(up, "OTLP_GRPC_PORT", free_port())
    monkeypatch.setattr(ports, "port_free", lambda port, host="127.0.0.1": True)  # what it said before it was taken
    system = up.System(Settings(data_dir=tmp_path / "data", nats_url=nats_url, database_url=database_url))
    system.endpoints = Endpoints(nats_url, database_url)
    try:
        system._start(["otlp_gateway"], wait_ready_s=60)
        [gateway] = system.components
        assert gateway.state == "ready"
        assert system.otlp_url is not None
        assert not system.otlp_url.endswith(f":{otlp_port_taken}"), system.otlp_url
        log = (tmp_path / "data" / "logs" / "otlp_gateway.log").read_text()
        assert "address already in use" in log  # the first start lost the port, as the CI run's did
    finally:
        system.stop()
