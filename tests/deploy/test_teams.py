"""Two teams, each a user made from deploy/nats/team-user.conf.template beside deploy/nats/auth.conf: neither
reads the other's replies nor touches the other's consumers (issue: subscribers were not isolated)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig

from commonos.proto.subjects import EVENTS_STREAM
from commonos.runtime.embedded import NatsServer
from commonos.runtime.nats import ensure_streams, inbox_prefix
from tests.deploy.conftest import DEPLOY, NATS_USERS, nats_password
from tests.deploy.system import publish_as_loop, sample_events

TEAMS = ("team-a", "team-b")


def with_teams(auth: str, template: str, teams: tuple[str, ...]) -> str:
    """auth.conf with one entry per team, as deploy/nats/team-user.conf.template says to add them."""
    entries = "".join(
        template.replace("$NATS_TEAM_PASSWORD", "@PASSWORD@")
        .replace("TEAM", t)
        .replace("@PASSWORD@", f"$NATS_{t.upper().replace('-', '_')}_PASSWORD")
        for t in teams
    )
    head, _, tail = auth.rpartition("  ]\n}")
    assert tail.strip() == "", "auth.conf ends with its users list"
    return head + entries + "  ]\n}" + tail


@pytest.fixture
async def teams_nats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[NatsServer]:
    for user, variable in NATS_USERS.items():
        monkeypatch.setenv(variable, nats_password(user))
    for team in TEAMS:
        monkeypatch.setenv(f"NATS_{team.upper().replace('-', '_')}_PASSWORD", nats_password(team))
    conf = tmp_path / "conf"
    conf.mkdir()
    template = (DEPLOY / "nats" / "team-user.conf.template").read_text()
    (conf / "auth.conf").write_text(with_teams((DEPLOY / "nats" / "auth.conf").read_text(), template, TEAMS))
    (conf / "server.conf").write_text('include "auth.conf"\n')
    server = NatsServer(tmp_path / "nats", config_file=conf / "server.conf").start()
    yield server
    server.kill()


async def login(server: NatsServer, user: str, errors: list[str]) -> Client:
    async def on_error(exc: Exception) -> None:
        errors.append(str(exc).lower())

    return await nats.connect(
        server.url,
        user=user,
        password=nats_password(user),
        inbox_prefix=inbox_prefix(user),
        error_cb=on_error,
        max_reconnect_attempts=0,
    )


async def test_one_team_cannot_read_anothers_replies_nor_touch_its_consumers(teams_nats: NatsServer) -> None:
    errors: dict[str, list[str]] = {t: [] for t in (*TEAMS, "admin", "loop")}
    admin = await login(teams_nats, "admin", errors["admin"])
    loop = await login(teams_nats, "loop", errors["loop"])
    a = await login(teams_nats, "team-a", errors["team-a"])
    b = await login(teams_nats, "team-b", errors["team-b"])
    try:
        await ensure_streams(admin.jetstream())
        await publish_as_loop(loop, sample_events()[:3])
        # Each team reads through its own durable consumer.
        for client, team in ((a, "team-a"), (b, "team-b")):
            js = client.jetstream(timeout=5)
            await js.add_consumer(EVENTS_STREAM, ConsumerConfig(durable_name=team, ack_policy=AckPolicy.EXPLICIT))
            sub = await js.pull_subscribe_bind(team, stream=EVENTS_STREAM)
            [first] = await sub.fetch(1, timeout=5)
            await first.ack_sync()
        assert errors["team-a"] == errors["team-b"] == []

        # Team B may not delete, read through or reconfigure team A's consumer ...
        jb = b.jetstream(timeout=0.5)
        with pytest.raises(nats.errors.TimeoutError):
            await jb.delete_consumer(EVENTS_STREAM, "team-a")
        stolen = await jb.pull_subscribe_bind("team-a", stream=EVENTS_STREAM)
        with pytest.raises(nats.errors.TimeoutError):
            await stolen.fetch(1, timeout=0.5)
        # ... nor listen to team A's inbox (every reply to A), nor to every inbox.
        for subject in ("_INBOX_team-a.>", "_INBOX.>"):
            await b.subscribe(subject)
            await b.flush()
        await b.flush()
        assert any('subscription to "_inbox_team-a.>"' in e for e in errors["team-b"]), errors["team-b"]
        assert any('subscription to "_inbox.>"' in e for e in errors["team-b"]), errors["team-b"]
        assert any("$js.api.consumer.delete.cos_events.team-a" in e for e in errors["team-b"]), errors["team-b"]

        info = await admin.jetstream().consumer_info(EVENTS_STREAM, "team-a")
        assert (info.delivered.stream_seq, info.ack_floor.stream_seq) == (1, 1), "untouched by team B"
    finally:
        for client in (a, b, loop, admin):
            await client.close()
