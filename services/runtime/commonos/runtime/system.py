"""Where the running system is: configured URLs, or the embedded one that `cos up` started.

`cos up` keeps the secrets of its servers in COS_DATA_DIR/secrets (a folder and files of its user's
alone, 0700 and 0600), and writes state.json (0600) with the URLs its user's commands connect with:
the NATS user `admin` and the PostgreSQL superuser, passwords included.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commonos.runtime.args import CliError
from commonos.runtime.settings import Settings

STATE_FILE = "state.json"
SECRETS_DIR = "secrets"
#: A secret is letters and digits, starting with a letter: nats-server reads a `$PASSWORD` from its
#: environment as a config value, where `1k` would be a number and `-x` something else again.
_SECRET = re.compile(r"[A-Za-z][A-Za-z0-9]{15,255}")
_SECRET_CHARS = string.ascii_letters + string.digits


@dataclass(frozen=True)
class Endpoints:
    nats_url: str
    database_url: str


def state_path(settings: Settings) -> Path:
    return settings.data_dir / STATE_FILE


def private_dir(path: Path) -> Path:
    """A folder of this user's alone (0700), made if need be."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def write_private(path: Path, text: str) -> None:
    """Replace `path` at once by a file of this user's alone (0600) holding `text`."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(text)
    tmp.replace(path)


def secret_path(settings: Settings, name: str) -> Path:
    return settings.data_dir.resolve() / SECRETS_DIR / f"{name}.password"


def ensure_secret(settings: Settings, name: str) -> str:
    """The secret `name` of this data folder: read from its file, or made (once) and kept there."""
    path = secret_path(settings, name)
    private_dir(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if path.stat().st_uid != os.geteuid():
            raise CliError(f"{path} belongs to another user: run `cos up` with a COS_DATA_DIR of your own") from None
        path.chmod(0o600)
        value = path.read_text(encoding="utf-8", errors="replace").strip()
        if not _SECRET.fullmatch(value):
            raise CliError(
                f"{path} does not hold a secret cos up can use (16 to 256 letters and digits, the first a letter): "
                "delete it and cos up makes a new one"
            ) from None
        return value
    value = secrets.choice(string.ascii_letters) + "".join(secrets.choice(_SECRET_CHARS) for _ in range(39))
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(value + "\n")
    return value


def write_state(
    settings: Settings, endpoints: Endpoints, pids: dict[str, int], http_ports: dict[str, int] | None = None
) -> None:
    """state.json, of this user's alone: its URLs carry the passwords of the servers `cos up` runs;
    `http_ports`: each service's `/healthz` `/readyz` `/metrics` port (what `cos status` asks)."""
    path = state_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(
        path,
        json.dumps(
            {
                "nats_url": endpoints.nats_url,
                "database_url": endpoints.database_url,
                "pids": pids,
                "http_ports": http_ports or {},
                "owner_pid": os.getpid(),
            },
            indent=2,
        ),
    )


def clear_state(settings: Settings) -> None:
    state_path(settings).unlink(missing_ok=True)


def alive(pid: int) -> bool:
    """Whether process `pid` exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _running_state(settings: Settings) -> dict[str, Any] | None:
    """state.json of the `cos up` running in COS_DATA_DIR, if one is."""
    path = state_path(settings)
    try:
        state: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except PermissionError:
        raise CliError(
            f"cannot read {path}: the system there is its owner's (the user who ran `cos up`); "
            "set COS_NATS_URL and COS_DATABASE_URL, or run `cos up` with a COS_DATA_DIR of your own"
        ) from None
    return state if alive(int(state.get("owner_pid", 0))) else None


def running_state(settings: Settings) -> dict[str, Any] | None:
    """state.json of the `cos up` running in COS_DATA_DIR (URLs, pids, HTTP ports), or None."""
    return _running_state(settings)


def running_owner(settings: Settings) -> int | None:
    """The pid of the `cos up` running in COS_DATA_DIR, if one is."""
    state = _running_state(settings)
    return None if state is None else int(state["owner_pid"])


def endpoints(settings: Settings) -> Endpoints:
    """URLs from COS_NATS_URL / COS_DATABASE_URL, else from a running `cos up` in COS_DATA_DIR."""
    if settings.nats_url and settings.database_url:
        return Endpoints(settings.nats_url, settings.database_url)
    path = state_path(settings)
    state = _running_state(settings)
    if state is not None:
        return Endpoints(settings.nats_url or state["nats_url"], settings.database_url or state["database_url"])
    raise CliError(
        f"no system to talk to: set COS_NATS_URL and COS_DATABASE_URL, or start one with `cos up` (looked for {path})"
    )
