"""`cos env`: the running `cos up`'s NATS address and a user's password as `export` lines, which connect as that
user with its permissions; one line and exit 1 when no system is running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.test_up_security import RunningUp, clean_env, cos, up_running
from tests.conftest import REPO

#: Connects with COS_NATS_* as the example subscriber does and reads COS_EVENTS' state; publishing is refused.
PROBE = """
import asyncio, os, nats
async def main():
    errors = []
    async def on_error(e): errors.append(str(e))
    password = os.environ.get("COS_NATS_PASSWORD") or open(os.environ["COS_NATS_PASSWORD_FILE"]).read().strip()
    user = os.environ["COS_NATS_USER"]
    nc = await nats.connect(os.environ["COS_NATS_URL"], user=user, password=password,
                            inbox_prefix="_INBOX_" + user, error_cb=on_error, max_reconnect_attempts=0)
    info = await nc.jetstream().stream_info("COS_EVENTS")
    await nc.publish("cos.events.x.00000000-0000-0000-0000-000000000000.profile_upserted", b"{}")
    await nc.flush()
    await asyncio.sleep(0.3)
    print(info.config.name, any("permissions violation" in e.lower() for e in errors))
    await nc.close()
asyncio.run(main())
"""


@pytest.fixture(scope="module")
def cos_up() -> Iterator[RunningUp]:
    with up_running("cos-env-") as running:
        yield running


def in_shell(data_dir: Path, script: str) -> subprocess.CompletedProcess[str]:
    env = clean_env(data_dir) | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_no_system_is_one_line_and_exit_1(tmp_path: Path) -> None:
    done = cos(tmp_path / "nothing-here", "env", "--user", "subscriber")
    assert (done.returncode, done.stdout) == (1, "")
    [line] = done.stderr.splitlines()
    assert line.startswith("cos: error: no system is running in ") and "cos up" in line, line


def test_a_stale_state_file_is_no_system(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "state.json").write_text(json.dumps({"nats_url": "nats://127.0.0.1:1", "owner_pid": 2**22 + 1}))
    done = cos(data, "env")
    assert done.returncode == 1 and "no system is running" in done.stderr, done.stderr


def test_it_prints_the_subscriber_s_connection(cos_up: RunningUp) -> None:
    done = cos(cos_up.data, "env", "--user", "subscriber")
    assert done.returncode == 0, done.stderr
    password = (cos_up.data / "secrets" / "nats-subscriber.password").read_text().strip()
    assert done.stdout.splitlines() == [
        f"export COS_NATS_URL=nats://127.0.0.1:{cos_up.ports['nats']}",
        "export COS_NATS_USER=subscriber",
        f"export COS_NATS_PASSWORD={password}",
        "unset COS_NATS_PASSWORD_FILE",
    ]
    assert "admin" not in done.stdout, "the URL carries no admin login"


@pytest.mark.parametrize("flags", ["", "--password-file"])
def test_eval_connects_as_that_user_with_its_permissions(cos_up: RunningUp, flags: str) -> None:
    done = in_shell(cos_up.data, f"eval \"$(cos env --user subscriber {flags})\"\npython -c '{PROBE}'")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["COS_EVENTS", "True"], "read the stream, refused a publish"


def test_an_unknown_user_names_the_users(cos_up: RunningUp) -> None:
    done = cos(cos_up.data, "env", "--user", "nobody-here")
    assert (done.returncode, done.stdout) == (1, "")
    [line] = done.stderr.splitlines()
    assert "no NATS user 'nobody-here'" in line and "subscriber" in line and "admin" in line, line
