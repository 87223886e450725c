"""`cos profile list|delete|recreate`, run as `cos` is run: a subprocess, one line for every error, no traceback."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from commonos.loop.nats_journal import NatsJournal
from commonos.loop.profile_admin import delete_profile
from commonos.proto.events import ProfileDeleted, ProfileUpserted, SessionCreated
from commonos.proto.identity import NewSession
from commonos.proto.subjects import EVENTS_ALL
from commonos.runtime.nats import ensure_streams
from commonos.runtime.publisher import EventPublisher
from tests.loop.helpers import of_type, write_profile
from tests.support import journal_writer, wait_caught_up

COS = str(Path(sys.executable).with_name("cos"))
WHEN = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


def cos(*args: str, env: dict[str, str], stdin: str = "") -> tuple[int, str, str]:
    done = subprocess.run(
        [COS, *args], check=False, env={**os.environ, **env}, input=stdin, capture_output=True, text=True, timeout=60
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stdout, done.stderr


def cos_on_a_terminal(*args: str, env: dict[str, str], answer: str) -> tuple[int, str, str]:
    """`cos` with a terminal as its standard input, on which `answer` is typed."""
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(
            [COS, *args],
            stdin=follower,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, **env},
            text=True,
        )
        os.write(leader, answer.encode())
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(leader)
        os.close(follower)
    assert "Traceback" not in err, err
    return proc.returncode, out, err


@pytest.fixture
def profiles(tmp_path: Path) -> Path:
    root = tmp_path / "profiles"
    for name in ("demo", "other"):
        write_profile(root, name)
    return root


def _env(nats_url: str, profiles: Path, database_url: str = "postgresql://127.0.0.1:1/none") -> dict[str, str]:
    return {
        "COS_NATS_URL": nats_url,
        "COS_DATABASE_URL": database_url,
        "COS_PROFILES_DIR": str(profiles),
        "COS_DATA_DIR": str(profiles.parent / ".cos"),
    }


@pytest.mark.parametrize("command", [("list",), ("delete", "demo", "--yes"), ("recreate", "demo")])
def test_an_unreachable_nats_is_one_line(command: tuple[str, ...], profiles: Path) -> None:
    assert cos("profile", *command, env=_env("nats://127.0.0.1:1", profiles)) == (
        2,
        "",
        "cos: error: cannot reach NATS at nats://127.0.0.1:1 (COS_NATS_URL): no answer after 3 attempts\n",
    )


async def test_cos_profile_delete_asks_refuses_and_publishes_the_deletion(
    js: JetStreamContext, nats_url: str, profiles: Path
) -> None:
    await ensure_streams(js)
    journal = NatsJournal(js)
    for name in ("demo", "other"):
        await journal.publish_profile(name, ())
    env = _env(nats_url, profiles)

    assert cos("profile", "delete", "demo", env=env) == (
        2,
        "",
        "cos: error: profile 'demo' not deleted: confirm with --yes (standard input is not a terminal)\n",
    )
    code, out, err = cos("profile", "delete", "Bad.Id", "--yes", env=env)
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert err.startswith("cos profile delete: error: argument id: invalid profile id 'Bad.Id'"), err
    assert cos("profile", "delete", "ghost", "--yes", env=env) == (
        2,
        "",
        "cos: error: no profile 'ghost' in the event stream\n",
    )
    code, out, err = cos("profile", "delete", "demo", "--by", "cli:\x01" * 100, "--yes", env=env)
    assert (code, err) == (2, "cos: error: --by: who deletes must be 1 to 256 characters, got 500\n")

    code, out, err = cos_on_a_terminal("profile", "delete", "other", env=env, answer="n\n")
    assert (code, out) == (1, "") and err.endswith("[y/N] profile 'other' not deleted\n"), err
    assert err.startswith("Delete profile 'other', and everything of them? [y/N]"), err  # PostgreSQL unreachable
    assert not of_type(await journal.events([EVENTS_ALL]), ProfileDeleted)

    code, out, err = cos("profile", "delete", "demo", "--yes", "--by", "cli:alice", env=env)
    [deletion] = of_type(await journal.events([EVENTS_ALL]), ProfileDeleted)
    assert (code, err) == (0, "")
    assert out.splitlines()[0] == f"deleted profile 'demo' (event {deletion.event_id})"
    assert (deletion.profile_id, deletion.deleted_by) == ("demo", "cli:alice")

    code, out, err = cos_on_a_terminal("profile", "delete", "other", env=env, answer="yes\n")
    assert code == 0 and out.startswith("deleted profile 'other' (event "), (code, out, err)

    code, out, err = cos("profile", "delete", "demo", "--yes", env=env)
    assert (code, out) == (2, "") and re.fullmatch(
        rf"cos: error: profile 'demo' was deleted at {WHEN} by cli:alice already\n", err
    ), err


async def test_a_deleted_profile_takes_no_local_chat_until_cos_profile_recreate(
    js: JetStreamContext, nats_url: str, profiles: Path
) -> None:
    await ensure_streams(js)
    journal = NatsJournal(js)
    await journal.publish_profile("demo", ())
    await delete_profile(journal, "demo", "cli:alice")
    env = _env(nats_url, profiles)

    code, out, err = cos("chat", "--local", "--profile", "demo", "hi", env=env)
    assert (code, out) == (2, "") and re.fullmatch(
        rf"cos: error: profile 'demo' was deleted at {WHEN} by cli:alice: it takes no chats\n", err
    ), err
    assert len(of_type(await journal.events([EVENTS_ALL]), ProfileUpserted)) == 1  # not re-created by the chat

    assert cos("profile", "recreate", "other", env=env) == (
        2,
        "",
        "cos: error: profile 'other' is not deleted: there is nothing to re-create\n",
    )
    code, out, err = cos("profile", "recreate", "demo", env=env)
    assert (code, err) == (0, "") and out.splitlines()[0] == "re-created profile 'demo' (tags: team:core, area:work)"
    assert re.fullmatch(
        rf"it was deleted at {WHEN} by cli:alice: nothing from before its deletion comes back", out.splitlines()[1]
    )
    assert (await journal.profile_status("demo")).deleted is None

    code, out, err = cos("chat", "--local", "--profile", "demo", "hi", env=env)
    assert (code, out) == (0, "hello\n"), err


async def test_cos_profile_list_shows_each_profile_with_its_state_and_sessions(
    js: JetStreamContext, nats_url: str, database_url: str, profiles: Path
) -> None:
    await ensure_streams(js)
    journal = NatsJournal(js)
    write_profile(profiles, "fresh")  # a folder no loop has published yet
    for name in ("demo", "other", "gone"):
        await journal.publish_profile(name, ())
    await EventPublisher(js, "urn:commonos:importer").publish(ProfileUpserted(profile_id="claude-code"))
    for _ in range(2):
        await journal.create_session(NewSession(profile_id="demo", source="cli"))
    await journal.create_session(NewSession(profile_id="other", source="cli"))
    await delete_profile(journal, "other", "cli:alice")
    async with journal_writer(nats_url, database_url):
        await wait_caught_up(js, database_url, "journal-writer")
    assert len(of_type(await journal.events([EVENTS_ALL]), SessionCreated)) == 3

    code, out, err = cos("profile", "list", "--format", "json", env=_env(nats_url, profiles, database_url))
    assert (code, err) == (0, "")
    rows = {r["profile"]: r for r in json.loads(out)}
    assert {p: (r["state"], r["sessions"], r["imported_sessions"], r["folder_exists"]) for p, r in rows.items()} == {
        "claude-code": ("imported", 0, 0, False),
        "demo": ("configured", 2, 0, True),
        "fresh": ("configured", 0, 0, True),
        "gone": ("folder missing", 0, 0, False),
        "other": ("deleted", 0, 0, True),
    }
    assert rows["gone"]["folder"] == str(profiles / "gone") and rows["other"]["deleted_by"] == "cli:alice"

    code, out, err = cos("profile", "list", env=_env(nats_url, profiles, database_url))
    lines = out.splitlines()
    assert (code, err, len(lines)) == (0, "", 6)
    assert lines[0] == "PROFILE      STATE           SESSIONS  IMPORTED  NOTE"
    assert lines[1] == "claude-code  imported        0         0"
    assert lines[2] == "demo         configured      2         0"
    assert lines[4] == f"gone         folder missing  0         0         no folder {profiles / 'gone'}"
    assert re.fullmatch(
        rf"other        deleted         0         0         deleted {WHEN} by cli:alice; its folder "
        rf"{re.escape(str(profiles / 'other'))} is still there",
        lines[5],
    ), lines[5]

    code, out, err = cos("profile", "list", env=_env(nats_url, profiles))  # PostgreSQL unreachable
    assert code == 0 and out.splitlines()[2] == "demo         configured      ?         ?"
    assert err == "sessions not counted: PostgreSQL not reachable: ConnectionRefusedError\n"
