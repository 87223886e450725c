"""The retention of COS_EVENTS: unbounded unless COS_EVENTS_MAX_AGE / COS_EVENTS_MAX_BYTES say otherwise, set by the
admin's `cos streams ensure` (and `cos up`) on a real server, and never undone by a service that does not set them."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from commonos.proto.subjects import EVENTS_STREAM
from commonos.runtime.nats import ensure_streams
from commonos.runtime.settings import ConfigError, Settings
from tests.deploy.conftest import SecuredNats, nats_password


@pytest.mark.parametrize(
    ("age", "size", "expected"),
    [
        ("", "", (None, None)),
        ("0", "0", (0.0, 0)),
        ("3600", "1048576", (3600.0, 1024 * 1024)),
        ("90d", "500G", (90 * 86400.0, 500 * 1024**3)),
        ("36h", "2TiB", (36 * 3600.0, 2 * 1024**4)),
        ("15m", "64MB", (900.0, 64 * 1024**2)),
    ],
)
def test_the_settings_read_durations_and_sizes(age: str, size: str, expected: tuple[object, object]) -> None:
    s = Settings.from_env({"COS_EVENTS_MAX_AGE": age, "COS_EVENTS_MAX_BYTES": size})
    assert (s.events_max_age_s, s.events_max_bytes) == expected


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("COS_EVENTS_MAX_AGE", "5m", "shorter than 600s"),
        ("COS_EVENTS_MAX_AGE", "a week", "is not a duration"),
        ("COS_EVENTS_MAX_BYTES", "1000", "smaller than 1048576 bytes"),
        ("COS_EVENTS_MAX_BYTES", "-1", "is not a size"),
    ],
)
def test_a_bad_limit_is_one_line_naming_the_variable(name: str, value: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({name: value})
    assert str(caught.value).startswith(f"{name}={value!r}") and says in str(caught.value)


def ensure_as_admin(secured_nats: SecuredNats, **limits: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COS_")}
    env |= {"COS_NATS_URL": secured_nats.url, "COS_NATS_USER": "admin", "COS_NATS_PASSWORD": nats_password("admin")}
    done = subprocess.run(
        [sys.executable, "-m", "commonos.cli", "streams", "ensure"],
        env=env | limits,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


async def limits(secured_nats: SecuredNats) -> tuple[float, int]:
    info = await (await secured_nats.connect("admin")).jetstream().stream_info(EVENTS_STREAM)
    return info.config.max_age or 0.0, info.config.max_bytes or 0


async def test_a_configured_limit_reaches_the_stream_and_services_leave_it(secured_nats: SecuredNats) -> None:
    await asyncio.to_thread(ensure_as_admin, secured_nats)
    assert await limits(secured_nats) == (0.0, -1), "unbounded by default"

    await asyncio.to_thread(ensure_as_admin, secured_nats, COS_EVENTS_MAX_AGE="2h", COS_EVENTS_MAX_BYTES="64M")
    assert await limits(secured_nats) == (7200.0, 64 * 1024 * 1024)

    # A service (no limits of its own, no right to change a stream) and an admin run without them leave it.
    await ensure_streams((await secured_nats.connect("loop")).jetstream())
    await asyncio.to_thread(ensure_as_admin, secured_nats)
    assert await limits(secured_nats) == (7200.0, 64 * 1024 * 1024)
    assert secured_nats.violations("loop") == [], "the service had nothing to change"

    # 0 lifts a limit again.
    await asyncio.to_thread(ensure_as_admin, secured_nats, COS_EVENTS_MAX_AGE="0", COS_EVENTS_MAX_BYTES="0")
    assert await limits(secured_nats) == (0.0, -1)
