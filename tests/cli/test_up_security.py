"""`cos up` belongs to the user who ran it: another local user (`nobody`) can read none of its files and
connect to neither of its servers, while the `cos` commands of its owner work with nothing to configure.

The other user is played by the OS user `nobody` in its own group (the tests run as root). It has no
Python with the project's packages, so it talks to NATS over a raw socket with the system's python3 and
to PostgreSQL with psql, as someone on the same machine would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import nats
import pytest

from commonos.runtime.embedded import PostgresCluster, postgres_bindir
from commonos.runtime.settings import Settings
from tests.conftest import REPO
from tests.harness import PgServer, cleanup, make_temp_root

pytestmark = pytest.mark.slow

OTHER_USER = "nobody"
SYSTEM_PYTHON = "/usr/bin/python3"
#: The NATS user of each service `cos up` starts, by its key in state.json's pids.
SERVICE_USERS = {
    "journal_writer": "journal-writer",
    "billing": "billing",
    "loop": "loop",
    "otlp_gateway": "otlp-gateway",
    "console": "console",
}
NATS_USERS = ("admin", "loop", "journal-writer", "billing", "otlp-gateway", "console", "subscriber")


def _other_user() -> pwd.struct_passwd:
    if os.geteuid() != 0:
        pytest.skip("playing another local user needs root (the tests run as root)")
    try:
        return pwd.getpwnam(OTHER_USER)
    except KeyError:
        pytest.skip(f"no OS user {OTHER_USER!r} to play another local user")


def as_other_user(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run `argv` as `nobody`, in its own group only (not root's groups)."""
    pw = _other_user()
    return subprocess.run(
        argv,
        user=pw.pw_uid,
        group=pw.pw_gid,
        extra_groups=[],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        **kwargs,
    )


def clean_env(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COS_", "PG", "NATS_"))}
    return env | {"COS_DATA_DIR": str(data_dir), "COLUMNS": "200"}


def cos(data_dir: Path, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "commonos.cli.main", *args],
        cwd=REPO,
        env=clean_env(data_dir),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


@dataclass
class RunningUp:
    root: Path
    data: Path
    proc: subprocess.Popen[bytes]

    @property
    def state(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads((self.data / "state.json").read_text())
        return result

    @property
    def ports(self) -> dict[str, int]:
        result: dict[str, int] = json.loads((self.data / "ports.json").read_text())
        return result

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def start_up(root: Path, timeout_s: float = 120) -> RunningUp:
    data = root / "data"
    output = root / "cos-up.out"
    with output.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "commonos.cli.main", "up"],
            cwd=REPO,
            env=clean_env(data),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    running = RunningUp(root, data, proc)
    deadline = time.monotonic() + timeout_s
    while not (data / "state.json").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            running.stop()
            said = output.read_text(errors="replace")[-4000:]
            raise AssertionError(f"cos up did not come up (exit {proc.returncode}):\n{said}")
        time.sleep(0.2)
    return running


@contextlib.contextmanager
def up_running(prefix: str) -> Iterator[RunningUp]:
    """A `cos up` of its own in a new temporary folder, stopped and removed at the end."""
    root = make_temp_root(prefix)
    running = start_up(root)
    try:
        yield running
    finally:
        running.stop()
        cleanup(root)


@pytest.fixture(scope="module")
def cos_up() -> Iterator[RunningUp]:
    _other_user()
    with up_running("cos-up-security-") as running:
        yield running


# -- what another user can read -------------------------------------------------------------------

READ_EVERY_FILE = """
import json, sys
readable = []
for path in sys.argv[1:]:
    try:
        with open(path, "rb") as f:
            f.read(1)
        readable.append(path)
    except OSError:
        pass
print(json.dumps(readable))
"""


def test_another_user_can_read_no_file_of_cos_up(cos_up: RunningUp) -> None:
    files = [str(Path(d) / f) for d, _, names in os.walk(cos_up.data) for f in names]
    assert any(f.endswith("state.json") for f in files) and any("/secrets/" in f for f in files)
    done = as_other_user([SYSTEM_PYTHON, "-c", READ_EVERY_FILE, *files])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
    listing = as_other_user(["ls", str(cos_up.data)])
    assert listing.returncode != 0 and "Permission denied" in listing.stderr


def test_secrets_are_files_of_the_owner_alone(cos_up: RunningUp) -> None:
    secrets = cos_up.data / "secrets"
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o700
    names = sorted(p.name for p in secrets.iterdir())
    in_auth_conf = re.findall(r"\$NATS_([A-Z_]+)_PASSWORD", (REPO / "deploy" / "nats" / "auth.conf").read_text())
    assert set(NATS_USERS) <= {u.lower().replace("_", "-") for u in in_auth_conf}
    expected = {"postgres.password", *(f"nats-{u.lower().replace('_', '-')}.password" for u in in_auth_conf)}
    # The console's cookie key and its first operator's password (cos up wrote its people file).
    expected |= {"console-cookies.password", "console-admin.password"}
    assert names == sorted(expected)
    passwords = set()
    for path in [*secrets.iterdir(), cos_up.data / "state.json"]:
        st = path.stat()
        assert stat.S_IMODE(st.st_mode) == 0o600, path
        assert st.st_uid == os.geteuid(), path
        if path.suffix == ".password":
            passwords.add(path.read_text().strip())
    assert len(passwords) == len(names), "every user has a secret of its own"
    assert all(len(p) >= 32 for p in passwords)


def test_the_postgresql_data_folder_is_its_server_users_alone(cos_up: RunningUp) -> None:
    for folder in (cos_up.data / "postgres", cos_up.data / "postgres" / "pgdata"):
        assert stat.S_IMODE(folder.stat().st_mode) & 0o077 == 0, folder
    for folder in (cos_up.data / "nats", cos_up.data / "logs", cos_up.data / "secrets"):
        assert stat.S_IMODE(folder.stat().st_mode) & 0o077 == 0, folder


# -- connecting as another user -------------------------------------------------------------------

NATS_CONNECT = """
import json, socket, sys
port = int(sys.argv[1])
replies = []
for creds in json.loads(sys.argv[2]):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        f = s.makefile("rb")
        f.readline()  # INFO
        connect = {"verbose": False, "pedantic": False, "protocol": 1, **creds}
        s.sendall(b"CONNECT " + json.dumps(connect).encode() + b"\\r\\nPING\\r\\n")
        replies.append(f.readline().decode().strip())
print(json.dumps(replies))
"""


def test_another_user_cannot_connect_to_nats(cos_up: RunningUp) -> None:
    attempts: list[dict[str, str]] = [{}, *({"user": u, "pass": ""} for u in NATS_USERS)]
    attempts += [{"user": u, "pass": u} for u in NATS_USERS]
    done = as_other_user([SYSTEM_PYTHON, "-c", NATS_CONNECT, str(cos_up.ports["nats"]), json.dumps(attempts)])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["-ERR 'Authorization Violation'"] * len(attempts)


def _psql(conninfo: str, password: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", **({"PGPASSWORD": password} if password is not None else {})}
    return as_other_user(
        [str(postgres_bindir() / "psql"), "-w", "-X", "-At", "-c", "SELECT current_user", conninfo], env=env
    )


def test_another_user_cannot_connect_to_postgresql(cos_up: RunningUp) -> None:
    port = cos_up.ports["postgres"]
    no_password = _psql(f"host=127.0.0.1 port={port} user=postgres dbname=postgres")
    assert (no_password.returncode, no_password.stdout) == (2, "")
    assert "fe_sendauth: no password supplied" in no_password.stderr
    for guess in ("postgres", "", "trust"):
        wrong = _psql(f"host=127.0.0.1 port={port} user=postgres dbname=commonos", guess)
        assert (wrong.returncode, wrong.stdout) == (2, ""), guess
        assert "password authentication failed" in wrong.stderr or "no password supplied" in wrong.stderr
    socket_dir = cos_up.data / "postgres" / "sock"
    local = _psql(f"host={socket_dir} port={port} user=postgres dbname=postgres")
    assert (local.returncode, local.stdout) == (2, "")


def test_postgresql_rejects_a_local_socket_connection_without_the_password(cos_up: RunningUp) -> None:
    """Root (its owner) can reach the socket; the server still asks for the password there."""
    port = cos_up.ports["postgres"]
    conninfo = f"host={cos_up.data / 'postgres' / 'sock'} port={port} user=postgres dbname=postgres"
    done = subprocess.run(
        [str(postgres_bindir() / "psql"), "-w", "-X", "-At", "-c", "SELECT 1", conninfo],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert "fe_sendauth: no password supplied" in done.stderr
    hba = (cos_up.data / "postgres" / "pgdata" / "pg_hba.conf").read_text()
    rules = [line.split() for line in hba.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert rules and all(rule[-1] == "scram-sha-256" for rule in rules), rules


# -- the PostgreSQL server's own groups -----------------------------------------------------------


def _ids(pid: int) -> tuple[list[int], list[int], list[int]]:
    """(uids, gids, supplementary groups) of a process, from /proc/<pid>/status."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = [int(v) for v in value.split()] if key in ("Uid", "Gid", "Groups") else []
    return fields["Uid"], fields["Gid"], fields["Groups"]


def _postgres_processes(pgdata: Path) -> list[int]:
    postmaster = int((pgdata / "postmaster.pid").read_text().splitlines()[0])
    children = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            ppid = next(line for line in status.read_text().splitlines() if line.startswith("PPid:"))
        except (OSError, StopIteration):
            continue
        if int(ppid.split()[1]) == postmaster:
            children.append(int(status.parent.name))
    return [postmaster, *children]


def assert_not_in_group_root(pgdata: Path) -> None:
    pids = _postgres_processes(pgdata)
    assert len(pids) > 1, "the postmaster and its background processes"
    user = pwd.getpwuid(pgdata.stat().st_uid)
    for pid in pids:
        uids, gids, groups = _ids(pid)
        assert set(uids) == {user.pw_uid}, pid
        assert set(gids) == {user.pw_gid}, (pid, gids)
        assert 0 not in groups, (pid, groups)


def test_postgresql_of_cos_up_is_not_in_group_root(cos_up: RunningUp) -> None:
    pgdata = cos_up.data / "postgres" / "pgdata"
    assert_not_in_group_root(pgdata)
    if os.geteuid() == 0:
        assert pgdata.stat().st_uid != 0

    async def run_id() -> str:
        conn = await asyncpg.connect(cos_up.state["database_url"])
        try:
            await conn.execute("CREATE TEMP TABLE out (line text); COPY out FROM PROGRAM 'id'")
            return str(await conn.fetchval("SELECT line FROM out"))
        finally:
            await conn.close()

    ran = asyncio.run(run_id())
    assert "gid=0(" not in ran and "(root)" not in ran, ran


def test_the_test_suites_postgresql_is_not_in_group_root(pg_server: PgServer) -> None:
    if pg_server.cluster is None:
        pytest.skip("the tests use an external PostgreSQL (COS_TEST_DATABASE_URL / COS_TEST_DOCKER)")
    assert_not_in_group_root(pg_server.cluster.pgdata)


# -- the owner --------------------------------------------------------------------------------------


def test_the_owners_commands_work_with_nothing_configured(cos_up: RunningUp) -> None:
    chat = cos(cos_up.data, "chat", "--profile", "default", "hello")
    assert chat.returncode == 0, chat.stderr
    assert chat.stdout.splitlines()[0] == (
        "Hello! Ask me whether you need an umbrella to see tools, approvals and delegation."
    )
    dlq = cos(cos_up.data, "dlq", "list")
    assert dlq.returncode == 0, dlq.stderr
    assert dlq.stdout.splitlines()[0].strip() == "dead letters (0)"
    report = cos(cos_up.data, "report", "cost")
    assert report.returncode == 0, report.stderr
    month = datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    assert report.stdout.splitlines()[0] == (
        f"Cost by model, {month.isoformat()} .. now (calls' own times, until exclusive)"
    )
    streams = cos(cos_up.data, "streams", "ensure")
    assert streams.returncode == 0, streams.stderr
    assert streams.stdout.splitlines()[0].startswith("COS_EVENTS: 1 replica(s), ")
    assert "Traceback" not in chat.stderr + dlq.stderr + report.stderr + streams.stderr


def test_each_service_has_its_own_nats_user(cos_up: RunningUp) -> None:
    pids = cos_up.state["pids"]
    assert set(pids) == set(SERVICE_USERS)
    for service, user in SERVICE_USERS.items():
        environ = Path(f"/proc/{pids[service]}/environ").read_bytes().split(b"\0")
        env = dict(e.decode().partition("=")[::2] for e in environ if e)
        assert env["COS_NATS_USER"] == user, service
        assert env["COS_NATS_PASSWORD_FILE"] == str(cos_up.data.resolve() / "secrets" / f"nats-{user}.password")
        assert "COS_NATS_PASSWORD" not in env and "@" not in env["COS_NATS_URL"], service


def test_the_subscriber_credentials_have_the_subscribers_permissions(cos_up: RunningUp) -> None:
    """The users are deploy/nats/auth.conf's: a subscriber reads the events and publishes none."""
    password = (cos_up.data / "secrets" / "nats-subscriber.password").read_text().strip()
    url = f"nats://127.0.0.1:{cos_up.ports['nats']}"

    async def check() -> list[str]:
        errors: list[str] = []
        refused = asyncio.Event()

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc))
            refused.set()

        nc = await nats.connect(
            url, user="subscriber", password=password, inbox_prefix="_INBOX_subscriber", error_cb=on_error
        )
        try:
            info = await nc.jetstream().stream_info("COS_EVENTS")
            assert info.config.name == "COS_EVENTS"
            await nc.publish("cos.events.default.x.turn_started", b"{}")
            await nc.flush()
            await asyncio.wait_for(refused.wait(), 5)
        finally:
            await nc.close()
        return errors

    errors = asyncio.run(check())
    assert any('permissions violation for publish to "cos.events.default.x.turn_started"' in e.lower() for e in errors)


def test_a_second_cos_up_on_the_same_folder_says_so_in_one_line(cos_up: RunningUp) -> None:
    again = cos(cos_up.data, "up", "--check")
    assert again.returncode == 1
    assert again.stderr.splitlines() == [
        f"cos: error: cos up is already running in {cos_up.data.resolve()} (pid {cos_up.proc.pid}): "
        "stop it first, or give this one another COS_DATA_DIR"
    ]
    assert cos(cos_up.data, "dlq", "list").returncode == 0, "the first one still serves"


def test_a_server_that_cannot_start_is_one_line() -> None:
    """As root, PostgreSQL runs as its own user, which must be able to enter the data folder."""
    _other_user()
    root = make_temp_root("cos-up-closed-")
    try:
        root.chmod(0o700)
        done = cos(root / "data", "up", "--check")
        assert done.returncode == 1
        user = PostgresCluster(root / "unused").user
        assert done.stderr.splitlines() == [
            f"cos: error: PostgreSQL runs as user {user!r}, which cannot enter {root} (no o+x): choose a data "
            "folder it can reach (COS_DATA_DIR) or `chmod o+x` that folder"
        ]
    finally:
        cleanup(root)


def test_every_user_auth_conf_names_gets_a_password(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user added to deploy/nats/auth.conf (its `$NATS_<USER>_PASSWORD`) does not stop `cos up`: it
    gets a password of its own like the others."""
    from commonos.cli import up

    conf = tmp_path / "auth.conf"
    extra = "    {\n      user: approver-acme\n      password: $NATS_APPROVER_ACME_PASSWORD\n    }\n"
    text = up.NATS_AUTH_CONF.read_text()
    head, sep, tail = text.partition("  users: [\n")
    assert sep, "auth.conf lists its users in `users: [`"
    conf.write_text(head + sep + extra + tail)
    monkeypatch.setattr(up, "NATS_AUTH_CONF", conf)
    settings = Settings.from_env({"COS_DATA_DIR": str(tmp_path / "cos"), "COS_DATABASE_URL": database_url})
    system = up.System(settings)
    system.start_servers()
    try:
        password = (tmp_path / "cos" / "secrets" / "nats-approver-acme.password").read_text().strip()
        assert system.nats is not None

        async def login() -> bool:
            nc = await nats.connect(system.nats.url, user="approver-acme", password=password)
            try:
                return bool(nc.is_connected)
            finally:
                await nc.close()

        assert asyncio.run(login())
    finally:
        system.stop()


# -- restarts and a data folder made before ---------------------------------------------------------


def test_cos_up_again_keeps_its_secrets() -> None:
    _other_user()
    root = make_temp_root("cos-up-again-")
    try:
        first = cos(root / "data", "up", "--check")
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
        secrets = {p.name: p.read_text() for p in (root / "data" / "secrets").iterdir()}
        again = cos(root / "data", "up", "--check")
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        assert {p.name: p.read_text() for p in (root / "data" / "secrets").iterdir()} == secrets
        assert "Traceback" not in first.stderr + again.stderr
    finally:
        cleanup(root)


def test_a_data_folder_of_an_open_cos_up_is_closed_and_keeps_its_data() -> None:
    """A PostgreSQL cluster made by an earlier `cos up` (no password, trust) gets the password and
    loses trust, and keeps its databases."""
    _other_user()
    root = make_temp_root("cos-up-legacy-")
    try:
        legacy = PostgresCluster(root / "data" / "postgres").start()
        psql = [str(postgres_bindir() / "psql"), "-X", "-q", "-c"]
        try:
            subprocess.run([*psql, "CREATE DATABASE commonos", legacy.url], check=True, capture_output=True)
            subprocess.run(
                [*psql, "CREATE TABLE kept (x int)", legacy.dsn("commonos")], check=True, capture_output=True
            )
        finally:
            legacy.stop()
        running = start_up(root)
        try:
            port = running.ports["postgres"]
            refused = _psql(f"host=127.0.0.1 port={port} user=postgres dbname=commonos")
            assert (refused.returncode, refused.stdout) == (2, "")
            assert "fe_sendauth: no password supplied" in refused.stderr

            async def kept() -> bool:
                conn = await asyncpg.connect(running.state["database_url"])
                try:
                    return bool(await conn.fetchval("SELECT to_regclass('public.kept') IS NOT NULL"))
                finally:
                    await conn.close()

            assert asyncio.run(kept())
        finally:
            running.stop()
    finally:
        cleanup(root)


def test_psql_and_python3_exist_for_the_other_user() -> None:
    """The checks above run these as `nobody`; they must be there, or they would prove nothing."""
    assert Path(SYSTEM_PYTHON).exists()
    assert (postgres_bindir() / "psql").exists()
    assert shutil.which("ls")


def test_cos_security_check_reads_the_identities_of_cos_up(cos_up: RunningUp) -> None:
    """With nothing configured, `cos security check` beside a `cos up` checks every user it generated."""
    done = cos(cos_up.data, "security", "check", "--format", "json")
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    assert set(results) == {"loop", "journal-writer", "billing", "otlp-gateway", "console", "subscriber", "admin"}
    assert all(results["admin"].values())
    assert results["loop"]["publish an event"] and not results["subscriber"]["publish an event"]
    assert not results["loop"]["change COS_EVENTS (STREAM.UPDATE)"]
