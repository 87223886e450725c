"""Real servers for tests: nats-server and PostgreSQL on free ports in temporary folders.

`COS_TEST_NATS_URL` / `COS_TEST_DATABASE_URL` point the tests at servers of your own instead;
`COS_TEST_DOCKER=1` starts them with testcontainers. Fault injection (stop, start, kill) needs
servers the harness started itself; a test that asks for it elsewhere fails and says why.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from commonos.runtime.embedded import NatsServer, PostgresCluster, ServerStartError, postgres_bindir


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


@dataclass
class Replicated:
    """A primary and a real streaming replica of it (`start_replicated`), both local and killable."""

    primary: PostgresCluster
    standby: PostgresCluster

    def dsn(self, database: str, *, standby: bool = False) -> str:
        return (self.standby if standby else self.primary).dsn(database)

    async def on_standby(self, sql: str) -> Any:
        conn = await asyncpg.connect(self.standby.url)
        try:
            return await conn.fetchval(sql)
        finally:
            await conn.close()

    async def pause(self) -> None:
        """Stop the standby replaying what it receives (it goes on receiving): it lags from now on."""
        await self.on_standby("SELECT pg_wal_replay_pause()")
        for _ in range(200):
            if await self.on_standby("SELECT pg_get_wal_replay_pause_state()") == "paused":
                return
            await asyncio.sleep(0.025)
        raise AssertionError("the standby's replay did not pause within 5 s")

    async def resume(self) -> None:
        await self.on_standby("SELECT pg_wal_replay_resume()")

    async def caught_up(self, timeout_s: float = 30.0) -> None:
        """Wait until the standby has replayed everything the primary has written until now."""
        conn = await asyncpg.connect(self.primary.url)
        try:
            target = await conn.fetchval("SELECT pg_current_wal_lsn()")
        finally:
            await conn.close()
        standby = await asyncpg.connect(self.standby.url)
        try:
            for _ in range(int(timeout_s / 0.025)):
                if await standby.fetchval("SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", target):
                    return
                await asyncio.sleep(0.025)
        finally:
            await standby.close()
        raise AssertionError(f"the standby did not replay up to {target} within {timeout_s:.0f} s")

    async def streaming(self, timeout_s: float = 30.0) -> None:
        """Wait until the standby's WAL receiver streams from the primary."""
        for _ in range(int(timeout_s / 0.05)):
            if await self.on_standby("SELECT status FROM pg_stat_wal_receiver") == "streaming":
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"the standby is not streaming from the primary after {timeout_s:.0f} s")

    def stop(self) -> None:
        self.standby.stop()
        self.primary.stop()


def start_replicated(root: Path) -> Replicated:
    """A primary (wal_level=replica, PostgreSQL 15's default, said explicitly) and a hot standby made from it by
    `pg_basebackup -R`, each on a free port (await `streaming()` before relying on it). A missing binary is a
    ServerStartError saying so."""
    primary = PostgresCluster(root / "primary", durable=False, settings={"wal_level": "replica"}).start()
    try:
        basebackup = postgres_bindir() / "pg_basebackup"
        if not basebackup.exists():
            raise ServerStartError(
                f"no pg_basebackup beside initdb in {basebackup.parent}: the replica tests need PostgreSQL's "
                "client binaries (Debian's postgresql package has them)"
            )
        standby = PostgresCluster(root / "standby", durable=False, settings={"hot_standby": "on"})
        standby.data_dir.mkdir(parents=True)
        run_as: dict[str, Any] = {}
        if standby.user is not None:
            pw = pwd.getpwnam(standby.user)
            os.chown(standby.data_dir, pw.pw_uid, pw.pw_gid)
            run_as = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
        standby.data_dir.chmod(0o700)
        argv = [str(basebackup), "-D", str(standby.pgdata), "-R", "-X", "stream", "-c", "fast", "--no-sync"]
        argv += ["-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres"]
        done = subprocess.run(
            argv, capture_output=True, text=True, cwd=standby.data_dir, check=False, timeout=120, **run_as
        )
        if done.returncode != 0:
            raise ServerStartError(f"pg_basebackup failed (exit {done.returncode}):\n{done.stderr}{done.stdout}")
        standby.start()
    except BaseException:
        primary.stop()
        raise
    return Replicated(primary, standby)


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
