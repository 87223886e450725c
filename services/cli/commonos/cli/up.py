"""`cos up`: the whole system on one machine, on configured servers or embedded ones.

With no COS_NATS_URL / COS_DATABASE_URL it starts its own nats-server (JetStream) and its own
PostgreSQL cluster under COS_DATA_DIR (default `.cos`), on free ports, then every service as its
own process, and stays in the foreground until Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
from rich.console import Console
from rich.table import Table

from commonos.cli.args import CliError
from commonos.cli.streams import ensure_all
from commonos.cli.system import Endpoints, clear_state, write_state
from commonos.runtime.embedded import NatsServer, PostgresCluster, free_port
from commonos.runtime.postgres import apply_schemas, connect
from commonos.runtime.settings import Settings

#: Services `cos up` runs, each `python -m commonos.<module>`, if that module exists.
SERVICES = ("journal_writer", "billing", "loop")
DATABASE = "commonos"


@dataclass
class Component:
    name: str
    address: str
    pid: int | None
    state: str


@dataclass
class System:
    settings: Settings
    nats: NatsServer | None = None
    postgres: PostgresCluster | None = None
    endpoints: Endpoints | None = None
    children: dict[str, tuple[subprocess.Popen[bytes], int]] = field(default_factory=dict)
    components: list[Component] = field(default_factory=list)

    def start_servers(self) -> Endpoints:
        s = self.settings
        data = s.data_dir.resolve()
        ports_file = data / "ports.json"
        ports: dict[str, int] = json.loads(ports_file.read_text()) if ports_file.exists() else {}
        nats_url = s.nats_url
        if not nats_url:
            limit = s.nats_max_payload
            self.nats = NatsServer(data / "nats", port=ports.get("nats"), max_payload=limit)
            try:
                self.nats.start()
            except Exception:
                # The remembered port may be taken now: take a new one.
                self.nats = NatsServer(data / "nats", max_payload=limit).start()
            nats_url = self.nats.url
            self.components.append(Component("nats-server (embedded)", nats_url, self.nats._pid(), "running"))
        else:
            self.components.append(Component("nats", nats_url, None, "configured"))
        database_url = s.database_url
        if not database_url:
            port = ports.get("postgres") or free_port()
            self.postgres = PostgresCluster(data / "postgres", port=port).start()
            database_url = self.postgres.dsn(DATABASE)
            self.components.append(Component("postgresql (embedded)", self.postgres.url, None, "running"))
        else:
            self.components.append(Component("postgresql", _redact(database_url), None, "configured"))
        data.mkdir(parents=True, exist_ok=True)
        ports_file.write_text(
            json.dumps(
                {
                    "nats": self.nats.port if self.nats else None,
                    "postgres": self.postgres.port if self.postgres else None,
                }
            )
        )
        self.endpoints = Endpoints(nats_url, database_url)
        return self.endpoints

    async def prepare(self) -> None:
        """Create the database (embedded), the streams and every schema."""
        assert self.endpoints is not None
        if self.postgres is not None:
            admin = await asyncpg.connect(self.postgres.url)
            try:
                if not await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", DATABASE):
                    await admin.execute(f'CREATE DATABASE "{DATABASE}"')
            finally:
                await admin.close()
        await ensure_all(self.settings, self.endpoints.nats_url)
        conn = await connect(self.endpoints.database_url)
        try:
            await apply_schemas(conn, all_schemas())
        finally:
            await conn.close()

    def start_services(self, wait_ready_s: float = 30.0) -> None:
        assert self.endpoints is not None
        logs = self.settings.data_dir.resolve() / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for service in SERVICES:
            module = f"commonos.{service}"
            if importlib.util.find_spec(module) is None or importlib.util.find_spec(module + ".__main__") is None:
                continue
            port = free_port()
            env = {
                **os.environ,
                "COS_NATS_URL": self.endpoints.nats_url,
                "COS_DATABASE_URL": self.endpoints.database_url,
                "COS_HTTP_PORT": str(port),
            }
            log = (logs / f"{service}.log").open("ab")
            argv = [sys.executable, "-m", module, *(["serve"] if service == "loop" else [])]
            proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            log.close()
            self.children[service] = (proc, port)
        deadline = time.monotonic() + wait_ready_s
        for service, (proc, port) in self.children.items():
            state = _wait_ready(proc, port, deadline)
            self.components.append(Component(service.replace("_", "-"), f"http://127.0.0.1:{port}", proc.pid, state))
            if state != "ready":
                raise CliError(f"{service} is {state}; see {logs / (service + '.log')}")

    def stop(self) -> None:
        for proc, _ in self.children.values():
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        for proc, _ in self.children.values():
            try:
                proc.wait(self.settings.drain_timeout_s + 5)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self.postgres is not None:
            self.postgres.stop()
        if self.nats is not None:
            self.nats.stop()

    def print_state(self, console: Console) -> None:
        table = Table(title="CommonOS")
        for col in ("component", "address", "pid", "state"):
            table.add_column(col)
        for c in self.components:
            table.add_row(c.name, c.address, str(c.pid or ""), c.state)
        console.print(table)


def all_schemas() -> list[str]:
    """Core schema first, then each plugin's, as the specification orders them."""
    scripts: list[str] = []
    for module_name in (
        "commonos.journal_writer.schema",
        "commonos.loop.memory_schema",
        "commonos.billing.schema",
        "commonos.journal_writer.graph_schema",
    ):
        if importlib.util.find_spec(module_name) is None:
            continue
        module = importlib.import_module(module_name)
        scripts.append(module.SCHEMA)
    return scripts


def _redact(url: str) -> str:
    from urllib.parse import urlparse

    p = urlparse(url)
    return url.replace(f":{p.password}@", ":***@") if p.password else url


def _wait_ready(proc: subprocess.Popen[bytes], port: int, deadline: float) -> str:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"exited ({proc.returncode})"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as resp:
                if resp.status == 200:
                    return "ready"
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    return "not ready"


def start_system(settings: Settings) -> System:
    system = System(settings)
    try:
        endpoints = system.start_servers()
        asyncio.run(system.prepare())
        system.start_services()
        write_state(settings, endpoints, {n: p.pid for n, (p, _) in system.children.items()})
    except BaseException:
        system.stop()
        raise
    return system


def _up(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    console = Console()
    system = start_system(settings)
    try:
        system.print_state(console)
        if args.check:
            return 0
        console.print("Running. Ctrl-C (or SIGTERM) stops everything.")
        stop = False

        def _on_signal(signum: int, frame: Any) -> None:
            nonlocal stop
            stop = True

        signal.signal(signal.SIGTERM, _on_signal)
        signal.signal(signal.SIGINT, _on_signal)
        while not stop:
            signal.pause()
    finally:
        clear_state(settings)
        system.stop()
    return 0


def register(sub: Any) -> None:
    up = sub.add_parser(
        "up",
        help="run the whole system (embedded NATS and PostgreSQL when no URLs are set)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    up.add_argument("--check", action="store_true", help="start everything, print its state, then stop")
    up.set_defaults(handler=_up)


__all__ = ["Path", "System", "all_schemas", "register", "start_system"]
