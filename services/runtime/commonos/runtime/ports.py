"""The ports `cos up` chooses, never the same one twice among the `cos up`s of a machine's user.

Two `cos up` (or a `make demo` beside a `cos up`) started at the same moment both saw 4318 and 8470 free: the
later one's service then failed to bind, or its readiness check reached the other system's service on a port
both had chosen. Every port `cos up` chooses (its nats-server's and PostgreSQL's, each service's health port,
the OTLP/HTTP, OTLP/gRPC and console ports) is now chosen under an exclusive lock (`fcntl.flock`) on a file in
the user's runtime folder, and written into that file with the pid of the `cos up` that chose it: the next
`cos up` skips every port a live one chose, bound yet or not. Its entries go when that `cos up` stops
(`release`), or when its pid is no longer alive (one killed with SIGKILL).

Why a lock and not bound sockets handed to the children: two of the ports cannot be handed a socket.
PostgreSQL binds its own, and grpcio's server takes an address, never a socket, so a lock would be needed beside
the sockets anyway; the lock covers every port the same way. It is held for the few milliseconds of reading and
writing the file, not while the children start. What it cannot stop is a program that is not a `cos up` binding
a chosen port before its service does: that service then exits with "address already in use" and `cos up`
starts it again on another port (`commonos.cli.up`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from commonos.proto.errors import ConfigError
from commonos.runtime.system import alive

#: The file's name in the user's runtime folder.
REGISTRY_FILE: Final = "commonos-ports.json"
#: Ports the system chooses for port 0, tried before giving up on finding one nobody reserved.
_ATTEMPTS: Final = 64


def registry_path() -> Path:
    """$COS_PORTS_FILE, else the user's runtime folder ($XDG_RUNTIME_DIR), else a folder of the user's own in
    the temporary folder."""
    configured = os.environ.get("COS_PORTS_FILE", "").strip()
    if configured:
        return Path(configured)
    runtime = os.environ.get("XDG_RUNTIME_DIR", "").strip()
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / REGISTRY_FILE
    folder = Path(tempfile.gettempdir()) / f"commonos-{os.geteuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    if folder.stat().st_uid != os.geteuid():
        raise ConfigError(f"{folder} belongs to another user: set XDG_RUNTIME_DIR or COS_PORTS_FILE")
    return folder / REGISTRY_FILE


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether nothing is bound to `host`:`port` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _system_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PortRegistry:
    """The ports chosen by the live `cos up`s of this user (`path`), this process's among them as `owner`."""

    def __init__(self, path: Path | None = None, owner: int | None = None) -> None:
        self.path = path if path is not None else registry_path()
        self.owner = owner if owner is not None else os.getpid()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[int, int]]:
        """The live entries (port -> pid), under the lock; what the block leaves in the dict is written back."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        with os.fdopen(fd, "r+", encoding="utf-8") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                try:
                    raw = json.loads(f.read() or "{}")
                except ValueError:
                    raw = {}
                entries = {
                    int(port): int(pid)
                    for port, pid in (raw.items() if isinstance(raw, dict) else ())
                    if str(port).isdigit() and isinstance(pid, int) and (pid == self.owner or alive(pid))
                }
                yield entries
                f.seek(0)
                f.truncate()
                f.write(json.dumps({str(port): pid for port, pid in sorted(entries.items())}))
                f.flush()
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def reserve(self, preferred: int | None = None, *, exact: bool = False) -> int:
        """A port for this `cos up`: `preferred` when it is free and no other live `cos up` chose it, else (unless
        `exact`, which takes `preferred` as it is: a port the operator configured) one the system gives that no
        other chose. Recorded as this process's until `release`."""
        with self._locked() as entries:
            if preferred is not None and (
                exact or (entries.get(preferred, self.owner) == self.owner and port_free(preferred))
            ):
                entries[preferred] = self.owner
                return preferred
            for _ in range(_ATTEMPTS):
                port = _system_port()
                if port not in entries:
                    entries[port] = self.owner
                    return port
        raise OSError(f"no free port that another cos up has not chosen ({self.path})")

    def chosen(self) -> dict[int, int]:
        """Every live entry: port -> the pid of the `cos up` that chose it."""
        with self._locked() as entries:
            return dict(entries)

    def release(self) -> None:
        """Forget this process's ports."""
        with self._locked() as entries:
            for port in [p for p, pid in entries.items() if pid == self.owner]:
                del entries[port]
