"""Where the running system is: configured URLs, or the embedded one that `cos up` started."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from commonos.cli.args import CliError
from commonos.runtime.settings import Settings

STATE_FILE = "state.json"


@dataclass(frozen=True)
class Endpoints:
    nats_url: str
    database_url: str


def state_path(settings: Settings) -> Path:
    return settings.data_dir / STATE_FILE


def write_state(settings: Settings, endpoints: Endpoints, pids: dict[str, int]) -> None:
    path = state_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps(
            {
                "nats_url": endpoints.nats_url,
                "database_url": endpoints.database_url,
                "pids": pids,
                "owner_pid": os.getpid(),
            },
            indent=2,
        )
    )
    tmp.replace(path)


def clear_state(settings: Settings) -> None:
    state_path(settings).unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def endpoints(settings: Settings) -> Endpoints:
    """URLs from COS_NATS_URL / COS_DATABASE_URL, else from a running `cos up` in COS_DATA_DIR."""
    if settings.nats_url and settings.database_url:
        return Endpoints(settings.nats_url, settings.database_url)
    path = state_path(settings)
    if path.exists():
        state = json.loads(path.read_text())
        if _alive(int(state.get("owner_pid", 0))):
            return Endpoints(settings.nats_url or state["nats_url"], settings.database_url or state["database_url"])
    raise CliError(
        f"no system to talk to: set COS_NATS_URL and COS_DATABASE_URL, or start one with `cos up` (looked for {path})"
    )
