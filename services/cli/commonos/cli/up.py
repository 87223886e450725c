"""`cos up`: the whole system on one machine, on configured servers or embedded ones.

With no COS_NATS_URL / COS_DATABASE_URL it starts its own nats-server (JetStream) and its own
PostgreSQL cluster under COS_DATA_DIR (default `.cos`), on free ports, then every service as its
own process, and stays in the foreground until Ctrl-C or SIGTERM.

Its servers are its user's: nats-server has the users and permissions of deploy/nats/auth.conf and
PostgreSQL asks for a password on every connection. The passwords are made on the first start and
kept in COS_DATA_DIR/secrets (files of the user's alone); each service logs in to NATS as its own
user, and the `cos` commands of the same user find the admin's credentials in COS_DATA_DIR/state.json.

The OTLP gateway takes OTLP/HTTP on 127.0.0.1:4318 and OTLP/gRPC on 127.0.0.1:4317 (COS_OTLP_PORT,
COS_OTLP_GRPC_PORT, or free ports when those are taken). Every port cos up chooses is chosen under a lock shared
by the cos ups of the machine's user, and kept from the others while it runs (`commonos.runtime.ports`): any
number of cos up started at the same moment each get their own ports and talk only to their own servers.

The web console listens on http://127.0.0.1:8470 (COS_CONSOLE_PORT, or a free port when 8470 is taken), with
cookies without the Secure flag only while it listens on a loopback address (COS_CONSOLE_HOST). Its people
file is COS_CONSOLE_USERS, else COS_DATA_DIR/console-users.toml; when that file does not exist, cos up writes
one with an operator `admin` whose password it makes into COS_DATA_DIR/secrets/console-admin.password.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib.util
import json
import os
import re
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

from commonos.cli.streams import ensure_all
from commonos.proto.errors import ConfigError, OperationalError
from commonos.runtime import registry
from commonos.runtime.args import CliError
from commonos.runtime.cli_support import as_text
from commonos.runtime.embedded import NatsServer, PostgresCluster, ServerStartError
from commonos.runtime.ports import PortRegistry
from commonos.runtime.postgres import apply_schemas, connect
from commonos.runtime.settings import Settings
from commonos.runtime.system import (
    Endpoints,
    clear_state,
    ensure_secret,
    private_dir,
    running_owner,
    secret_path,
    write_private,
    write_state,
)


class UpFailed(OperationalError):
    """The system could not start: one line saying what and why (`cos` prints it and exits 1)."""


#: Services `cos up` runs, each `python -m commonos.<module>`, if that module exists.
SERVICES = ("journal_writer", "billing", "loop", "otlp_gateway", "console")
DATABASE = "commonos"
#: A user's password in deploy/nats/auth.conf: `$NATS_<USER>_PASSWORD` (JOURNAL_WRITER for journal-writer).
NATS_PASSWORD_VARIABLE = re.compile(r"\$(NATS_([A-Z0-9_]+)_PASSWORD)\b")
#: The NATS user each service `cos up` starts logs in as (the `cos` commands log in as admin).
SERVICE_NATS_USERS = {
    "journal_writer": "journal-writer",
    "billing": "billing",
    "loop": "loop",
    "otlp_gateway": "otlp-gateway",
    "console": "console",
}
#: The ports of the OTLP gateway `cos up` starts: COS_OTLP_PORT, else OTLP/HTTP's 4318 when free, else any;
#: COS_OTLP_GRPC_PORT, else OTLP/gRPC's 4317 when free, else any.
OTLP_PORT = 4318
OTLP_GRPC_PORT = 4317
#: Started once the others are ready.
LATER_SERVICES = ("console",)
#: The console's port: COS_CONSOLE_PORT, else 8470 when free, else any.
CONSOLE_PORT = 8470
#: The console's first person, made by `cos up` when there is no people file: an operator.
CONSOLE_ADMIN = "admin"
#: Where the users and permissions of every NATS deployment are, in the source tree.
NATS_AUTH_CONF = Path(__file__).resolve().parents[4] / "deploy" / "nats" / "auth.conf"
#: The prices of the demo's scripted model (it has no public price), in the source tree.
DEMO_PRICES = Path(__file__).resolve().parents[4] / "config" / "demo-prices.toml"


def price_scripted_calls() -> None:
    """Bill the scripted model's calls as `make demo` does (config/demo-prices.toml) unless COS_PRICE_FILE says
    otherwise, so that a first `cos chat` on `cos up` is priced, not `unpriced`."""
    if DEMO_PRICES.is_file():
        os.environ.setdefault("COS_PRICE_FILE", str(DEMO_PRICES))


#: How often `cos up` looks whether its embedded servers still run (it stops everything when one does not).
WATCH_INTERVAL_S = 0.5

#: Our own NATS identity, set aside for the embedded server (whose users are ours).
NATS_IDENTITY = ("COS_NATS_USER", "COS_NATS_PASSWORD", "COS_NATS_PASSWORD_FILE", "COS_NATS_CREDS")


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
    #: The passwords of the embedded nats-server's users (none for a configured server).
    nats_passwords: dict[str, str] = field(default_factory=dict)
    children: dict[str, tuple[subprocess.Popen[bytes], int]] = field(default_factory=dict)
    components: list[Component] = field(default_factory=list)
    #: Where the OTLP gateway listens (OTLP/HTTP, OTLP/gRPC), once started.
    otlp_url: str | None = None
    otlp_grpc_url: str | None = None
    #: The ports this `cos up` chose, kept from the other `cos up`s of the machine until it stops.
    ports: PortRegistry = field(default_factory=PortRegistry)
    #: Where the console listens, and its people file, once started.
    console_url: str | None = None
    console_users: Path | None = None

    def start_servers(self) -> Endpoints:
        s = self.settings
        data = s.data_dir.resolve()
        owner = running_owner(s)
        if owner is not None and owner != os.getpid():
            raise UpFailed(
                f"cos up is already running in {data} (pid {owner}): stop it first, or give this one another "
                "COS_DATA_DIR"
            )
        ports_file = data / "ports.json"
        ours = not data.exists() or ports_file.exists()  # not a folder named by mistake, such as /tmp
        data.mkdir(parents=True, exist_ok=True)
        if ours:  # no one else lists or writes it; PostgreSQL's user (as root) still passes through it
            data.chmod(0o711)
        ports: dict[str, int] = json.loads(ports_file.read_text()) if ports_file.exists() else {}
        nats_url = s.nats_url
        if not nats_url:
            self.nats = self._start_nats(data / "nats", ports.get("nats"))
            nats_url = _with_login(self.nats.url, "admin", self.nats_passwords["admin"])
            self.components.append(Component("nats-server (embedded)", self.nats.url, self.nats.pid, "running"))
        else:
            self.components.append(Component("nats", nats_url, None, "configured"))
        database_url = s.database_url
        if not database_url:
            password = ensure_secret(s, "postgres")
            self.postgres = self._start_postgres(data / "postgres", ports.get("postgres"), password)
            database_url = self.postgres.dsn(DATABASE)
            self.components.append(Component("postgresql (embedded)", _redact(self.postgres.url), None, "running"))
        else:
            self.components.append(Component("postgresql", _redact(database_url), None, "configured"))
        write_private(
            ports_file,
            json.dumps(
                {
                    "nats": self.nats.port if self.nats else None,
                    "postgres": self.postgres.port if self.postgres else None,
                }
            ),
        )
        self.endpoints = Endpoints(nats_url, database_url)
        return self.endpoints

    def _start_postgres(self, folder: Path, remembered: int | None, password: str) -> PostgresCluster:
        """The embedded PostgreSQL on the port it had (when free and no other `cos up` chose it), else another;
        once more on another port when a program took it between the choice and PostgreSQL's bind."""
        cluster = PostgresCluster(folder, port=self.ports.reserve(remembered), password=password)
        try:
            return cluster.start()
        except ServerStartError as exc:
            if "already in use" not in str(exc).lower():
                raise
            cluster.port = self.ports.reserve()
            return cluster.start()

    def _start_nats(self, folder: Path, remembered: int | None) -> NatsServer:
        """nats-server with deploy/nats/auth.conf as it is, its passwords in the server's environment."""
        if not NATS_AUTH_CONF.is_file():
            raise UpFailed(
                f"{NATS_AUTH_CONF} not found: cos up runs its nats-server with the users of deploy/nats/auth.conf "
                "(run it from a source tree, or set COS_NATS_URL to a server of your own)"
            )
        private_dir(folder)
        auth = NATS_AUTH_CONF.read_text(encoding="utf-8")
        # A password for every user it names (admin, loop, journal-writer, billing, subscriber, and any added).
        variables = {m.group(1): m.group(2).lower().replace("_", "-") for m in NATS_PASSWORD_VARIABLE.finditer(auth)}
        env = {variable: ensure_secret(self.settings, f"nats-{user}") for variable, user in variables.items()}
        self.nats_passwords = {user: env[variable] for variable, user in variables.items()}
        if "admin" not in self.nats_passwords:
            raise UpFailed(f"{NATS_AUTH_CONF} has no user admin ($NATS_ADMIN_PASSWORD): cos up needs one")
        write_private(folder / "auth.conf", auth)
        config = folder / "cos-up.conf"
        limit = self.settings.nats_max_payload
        write_private(
            config,
            "# Written by cos up at every start: the users of deploy/nats/auth.conf (a copy beside this file),\n"
            "# their passwords from the server's environment (kept in COS_DATA_DIR/secrets).\n"
            'include "auth.conf"\n' + (f"max_payload: {int(limit)}\n" if limit is not None else ""),
        )
        try:
            return NatsServer(folder, port=self.ports.reserve(remembered), config_file=config, env=env).start()
        except ServerStartError:
            # The port was taken by a program that is not a cos up before the server bound it: another one.
            return NatsServer(folder, port=self.ports.reserve(), config_file=config, env=env).start()

    async def prepare(self) -> None:
        """Create the database (embedded), the streams (as the admin: no service may) and every schema."""
        assert self.endpoints is not None
        if self.postgres is not None:
            admin = await asyncpg.connect(self.postgres.url)
            try:
                if not await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", DATABASE):
                    await admin.execute(f'CREATE DATABASE "{DATABASE}"')
            finally:
                await admin.close()
        settings = self.settings
        if self.nats is not None:
            settings = dataclasses.replace(settings, nats_user=None, nats_password=None, nats_creds=None)
        await ensure_all(settings, self.endpoints.nats_url)
        conn = await connect(self.endpoints.database_url)
        try:
            await apply_schemas(conn, all_schemas())
        finally:
            await conn.close()

    def start_services(self, wait_ready_s: float = 60.0) -> None:
        """The services, each ready within `wait_ready_s`; the console once the others are (it serves what
        they write, and its start would only slow theirs on a small machine)."""
        first = [s for s in SERVICES if s not in LATER_SERVICES]
        self._start(first, wait_ready_s)
        self._start([s for s in SERVICES if s in LATER_SERVICES], wait_ready_s)

    def _start(self, services: list[str], wait_ready_s: float) -> None:
        assert self.endpoints is not None
        logs = private_dir(self.settings.data_dir.resolve() / "logs")
        started: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
        for service in services:
            module = f"commonos.{service}"
            if importlib.util.find_spec(module) is None or importlib.util.find_spec(module + ".__main__") is None:
                continue
            self.children[service] = started[service] = self._spawn(service, logs, well_known=True)
        deadline = time.monotonic() + wait_ready_s
        for service, first in started.items():
            proc, port = first
            state = _wait_ready(proc, port, deadline)
            if state.startswith("exited") and _lost_its_port(logs / f"{service}.log"):
                # The port was free when it was chosen and taken before the service bound it (by a program that is
                # not a `cos up`: those never choose a port another chose): once more, on ports nobody has.
                proc, port = self.children[service] = self._spawn(service, logs, well_known=False)
                state = _wait_ready(proc, port, deadline)
            self.components.append(Component(service.replace("_", "-"), f"http://127.0.0.1:{port}", proc.pid, state))
            if state != "ready":
                raise UpFailed(f"{service} is {state}; see {logs / (service + '.log')}")

    def _spawn(self, service: str, logs: Path, *, well_known: bool) -> tuple[subprocess.Popen[bytes], int]:
        """Start `service`, its log appended to in `logs`; the gateway and the console on their well-known ports
        when `well_known` and free (unless configured), else on free ones."""
        assert self.endpoints is not None
        if service == "console":
            port = self._port("COS_CONSOLE_PORT", CONSOLE_PORT if well_known else None)
        else:
            port = self.ports.reserve()
        env = {
            **os.environ,
            "COS_NATS_URL": self.endpoints.nats_url,
            "COS_DATABASE_URL": self.endpoints.database_url,
            "COS_HTTP_PORT": str(port),
        }
        if service == "otlp_gateway":
            otlp_port = self._port("COS_OTLP_PORT", OTLP_PORT if well_known else None)
            grpc_port = self._port("COS_OTLP_GRPC_PORT", OTLP_GRPC_PORT if well_known else None)
            env["COS_OTLP_PORT"] = str(otlp_port)
            env["COS_OTLP_GRPC_PORT"] = str(grpc_port)
            self.otlp_url = f"http://127.0.0.1:{otlp_port}"
            self.otlp_grpc_url = f"http://127.0.0.1:{grpc_port}"
        if service == "console":
            env |= self._console_env(port)
        if self.nats is not None:  # its own NATS user, its password read from its file
            user = SERVICE_NATS_USERS[service]
            env = {k: v for k, v in env.items() if k not in NATS_IDENTITY}
            env |= {
                "COS_NATS_URL": self.nats.url,
                "COS_NATS_USER": user,
                "COS_NATS_PASSWORD_FILE": str(secret_path(self.settings, f"nats-{user}")),
            }
        log = (logs / f"{service}.log").open("ab")
        module = f"commonos.{service}"
        argv = [sys.executable, "-m", module, *(["serve"] if service == "loop" else [])]
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        return proc, port

    def _port(self, variable: str, well_known: int | None) -> int:
        """The port `variable` configures, as it is; else `well_known` when it is free and no other `cos up` chose
        it; else one nobody has."""
        configured = _configured_port(variable)
        if configured is not None:
            return self.ports.reserve(configured, exact=True)
        return self.ports.reserve(well_known)

    def _console_env(self, port: int) -> dict[str, str]:
        """The console's variables: its port, its people file (made with a first operator when missing), a
        cookie key kept in COS_DATA_DIR/secrets (sign-ins survive a restart), and cookies without the Secure
        flag only while it listens on a loopback address (http://127.0.0.1 has no TLS)."""
        host = os.environ.get("COS_CONSOLE_HOST", "").strip() or "127.0.0.1"
        env = {"COS_CONSOLE_HOST": host, "COS_CONSOLE_PORT": str(port)}
        if _is_loopback(host) and not os.environ.get("COS_CONSOLE_INSECURE_COOKIES", "").strip():
            env["COS_CONSOLE_INSECURE_COOKIES"] = "1"
        if not (os.environ.get("COS_CONSOLE_SECRET") or os.environ.get("COS_CONSOLE_SECRET_FILE")):
            ensure_secret(self.settings, "console-cookies")
            env["COS_CONSOLE_SECRET_FILE"] = str(secret_path(self.settings, "console-cookies"))
        configured = os.environ.get("COS_CONSOLE_USERS", "").strip()
        users = Path(configured).expanduser() if configured else self.settings.data_dir.resolve() / "console-users.toml"
        if not users.exists():
            self._first_console_user(users)
        env["COS_CONSOLE_USERS"] = str(users.resolve())
        self.console_users = users.resolve()
        shown = "127.0.0.1" if host in {"0.0.0.0", "::", "localhost"} else f"[{host}]" if ":" in host else host
        self.console_url = f"http://{shown}:{port}"
        return env

    def _first_console_user(self, users: Path) -> None:
        """The people file with one operator, `admin`, whose password is made into COS_DATA_DIR/secrets; written
        by the console's own `cos console user add`."""
        password = ensure_secret(self.settings, "console-admin")
        argv = [sys.executable, "-m", "commonos.cli.main", "console", "user", "add", CONSOLE_ADMIN]
        argv += ["--role", "operator", "--password-stdin", "--users", str(users)]
        done = subprocess.run(argv, input=password + "\n", capture_output=True, text=True, check=False, timeout=60)
        if done.returncode != 0:
            raise UpFailed(f"could not write the console's people file {users}: {done.stderr.strip()}")

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
        self.ports.release()

    def server_gone(self) -> str | None:
        """The embedded server that is no longer running, in one line with how it ended and its log; None while
        both run (a configured server is the operator's: the services wait it out)."""
        for name, server in (("nats-server", self.nats), ("PostgreSQL", self.postgres)):
            if server is not None and (ended := server.ended()) is not None:
                return f"the embedded {name} {ended} (its log: {server.log_path})"
        return None

    def print_state(self, console: Console) -> None:
        table = Table(title="CommonOS")
        for col in ("component", "address", "pid", "state"):
            table.add_column(col)
        for c in self.components:
            table.add_row(as_text(c.name), as_text(c.address), str(c.pid or ""), as_text(c.state))
        console.print(table)
        for line in self.connect_lines():
            console.print(as_text(line), soft_wrap=True)

    def connect_lines(self) -> list[str]:
        """How to reach the servers and what to try next, whole (a table cell may be cut to the terminal)."""
        s = self.settings
        lines = []
        if self.postgres is not None:
            password = secret_path(s, "postgres")
            lines.append(
                f'PostgreSQL: PGPASSWORD="$(cat {password})" psql -h 127.0.0.1 -p {self.postgres.port} '
                f"-U postgres {DATABASE}"
            )
        elif self.endpoints is not None:
            lines.append(f"PostgreSQL: {_redact(self.endpoints.database_url)}")
        if self.nats is not None:
            lines.append(
                f"NATS: {self.nats.url} (users of deploy/nats/auth.conf; their passwords in "
                f"{secret_path(s, 'nats-admin').parent}; `cos env --user subscriber` prints a subscriber's login)"
            )
        elif self.endpoints is not None:
            lines.append(f"NATS: {_redact(self.endpoints.nats_url)}")
        if self.otlp_url is not None:
            lines.append(
                f"OpenTelemetry (OTLP/HTTP): {self.otlp_url} — a token: cos otlp token create --profile default; then "
                f"OTEL_EXPORTER_OTLP_ENDPOINT={self.otlp_url} "
                'OTEL_EXPORTER_OTLP_HEADERS="Authorization=Bearer <token>" (docs/otlp.md)'
            )
        if self.otlp_grpc_url is not None:
            lines.append(
                f"OpenTelemetry (OTLP/gRPC): {self.otlp_grpc_url} — the same token; OTEL_EXPORTER_OTLP_PROTOCOL=grpc "
                f"OTEL_EXPORTER_OTLP_ENDPOINT={self.otlp_grpc_url}"
            )
        if self.console_url is not None and self.console_users is not None:
            admin = secret_path(s, "console-admin")
            first = (
                f"sign in as {CONSOLE_ADMIN}, password in {admin}; "
                if admin.exists() and _lists(self.console_users, CONSOLE_ADMIN)
                else ""
            )
            lines.append(
                f"Console: {self.console_url}/ — {first}add a person: cos console user add NAME --role "
                f"operator|analyst|approver --users {self.console_users} (docs/console.md)"
            )
        lines.append('Next, in another shell: cos chat "hello" · cos import claude · cos report cost · cos status')
        return lines


def all_schemas() -> list[str]:
    """Core schema first, then each plugin's, as the specification orders them: the schemas of the registered
    projections (`commonos.runtime.registry`, the `commonos.projections` entry points), in their order."""
    return registry.schemas()


def _redact(url: str) -> str:
    from urllib.parse import urlparse

    p = urlparse(url)
    return url.replace(f":{p.password}@", ":***@") if p.password else url


def _with_login(url: str, user: str, password: str) -> str:
    """`nats://host:port` with a user and password, as nats-py (and the `cos` commands) take them."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{user}:{password}@{rest}"


def _configured_port(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw.isdigit() and 0 < int(raw) < 65536 else None


def _lost_its_port(log: Path) -> bool:
    """Whether a service that exited could not bind its port (its log's last lines say so)."""
    try:
        with log.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return False
    return "address already in use" in tail.lower()


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _lists(users: Path, name: str) -> bool:
    """Whether the people file names `name` (read as text: the console's parser is the console's)."""
    try:
        return f'name = "{name}"' in users.read_text(encoding="utf-8")
    except OSError:
        return False


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
        write_state(
            settings,
            endpoints,
            {n: p.pid for n, (p, _) in system.children.items()},
            {n: port for n, (_, port) in system.children.items()},
        )
    except ServerStartError as exc:
        system.stop()
        raise UpFailed(_in_one_line(exc)) from None
    except BaseException:
        system.stop()
        raise
    return system


def _in_one_line(exc: ServerStartError) -> str:
    """What failed, and the line of the server's output saying why (its message carries its output)."""
    first, *output = str(exc).splitlines()
    why = next((line for line in reversed(output) if "FATAL" in line or "ERROR" in line), "")
    return f"{first} {why.strip()}".strip()


def _up(args: argparse.Namespace) -> int:
    price_scripted_calls()
    try:
        settings = Settings.from_env()
        system = start_system(settings)
    except (CliError, ConfigError) as exc:  # a secret or setting it cannot use: cos up failed all the same
        raise UpFailed(" ".join(str(exc).splitlines())) from None
    console = Console()
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
            gone = system.server_gone()
            if gone is not None:
                # Said at once; the services then take up to COS_DRAIN_TIMEOUT_S to stop.
                print(
                    f"cos: error: {gone}; stopping everything (`cos up` starts it all again on the same data)",
                    file=sys.stderr,
                    flush=True,
                )
                return 1
            time.sleep(WATCH_INTERVAL_S)
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
