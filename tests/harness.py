"""Real servers for tests: nats-server and PostgreSQL on free ports in temporary folders.

`COS_TEST_NATS_URL` / `COS_TEST_DATABASE_URL` point the tests at servers of your own instead;
`COS_TEST_DOCKER=1` starts them with testcontainers. Fault injection (stop, start, kill) needs
servers the harness started itself; a test that asks for it elsewhere fails and says why.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from commonos.runtime.embedded import NatsServer, PostgresCluster


class FaultInjectionUnavailable(RuntimeError):
    pass


def make_temp_root(prefix: str) -> Path:
    root = Path(tempfile.mkdtemp(prefix=prefix))
    # PostgreSQL runs as an unprivileged user when the tests run as root: it must reach its folder.
    root.chmod(0o755)
    return root


@dataclass
class ExternalServer:
    url: str
    what: str

    def _refuse(self, *args: Any) -> None:
        raise FaultInjectionUnavailable(
            f"this test stops and starts its {self.what}; it cannot do that to the external server "
            f"{self.url} (unset COS_TEST_*_URL / COS_TEST_DOCKER to let the harness start its own)"
        )

    stop = kill = start = restart = _refuse


@dataclass
class PgServer:
    """The session's PostgreSQL: local (killable) or external."""

    admin_url: str
    cluster: PostgresCluster | None = None
    _container: Any = None
    databases: list[str] = field(default_factory=list)

    def dsn(self, database: str) -> str:
        base, _, _ = self.admin_url.rpartition("/")
        return f"{base}/{database}"

    def _need_cluster(self) -> PostgresCluster:
        if self.cluster is None:
            ExternalServer(self.admin_url, "PostgreSQL")._refuse()
        assert self.cluster is not None
        return self.cluster

    def stop(self) -> None:
        self._need_cluster().stop()

    def start(self) -> None:
        self._need_cluster().start()

    def kill(self) -> None:
        self._need_cluster().kill()


def start_pg(root: Path) -> PgServer:
    external = os.environ.get("COS_TEST_DATABASE_URL")
    if external:
        return PgServer(admin_url=external)
    if os.environ.get("COS_TEST_DOCKER") == "1":
        from testcontainers.postgres import PostgresContainer

        container = PostgresContainer("postgres:16-alpine", driver=None)
        container.start()
        return PgServer(admin_url=container.get_connection_url(), _container=container)
    cluster = PostgresCluster(root / "pg", durable=False).start()
    return PgServer(admin_url=cluster.url, cluster=cluster)


def stop_pg(server: PgServer) -> None:
    if server.cluster is not None:
        server.cluster.stop()
    if server._container is not None:
        server._container.stop()


#: The small max_payload every size-limit test also runs against, so the limits are exercised cheaply.
SMALL_MAX_PAYLOAD = 64 * 1024


def new_nats(root: Path, max_payload: int | None = None) -> NatsServer | ExternalServer:
    """A nats-server of the test's own; an external one (COS_TEST_NATS_URL) unless the test needs a
    particular max_payload, which only a server the harness starts can have."""
    external = os.environ.get("COS_TEST_NATS_URL")
    if external and max_payload is None:
        return ExternalServer(external, "nats-server")
    return NatsServer(root / f"nats-{uuid.uuid4().hex[:8]}", max_payload=max_payload).start()


def cleanup(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)


def reported(terminalreporter: Any, key: str) -> list[Any]:
    """The values the tests of a run recorded under user property `key` (`item.user_properties`), in the order
    their reports arrived: how a report reaches the process that prints the summary, whichever process ran
    the test (`make test` runs two, pytest-xdist)."""
    return [
        value
        for reports in terminalreporter.stats.values()
        for report in reports
        if getattr(report, "when", None) == "call"
        for name, value in getattr(report, "user_properties", ())
        if name == key
    ]
