"""Imported sessions belong to a profile: `cos import --profile` (default per vendor), whose `profile_upserted` the
import publishes, so that deleting that profile reaches the imported work (billing keeps what it cost)."""

from __future__ import annotations

import re
from pathlib import Path

import asyncpg
import nats
import pytest

from commonos.loop.nats_journal import NatsJournal
from commonos.proto.events import ModelCallCompleted, ProfileUpserted, TranscriptImported
from commonos.proto.subjects import EVENTS_ALL
from commonos.runtime.nats import ensure_streams
from tests.importer.pipeline import acos, wait_stored, writers
from tests.importer.transcripts import small_claude_home

pytestmark = pytest.mark.slow


async def _events(nats_url: str) -> list[object]:
    nc = await nats.connect(nats_url)
    try:
        await ensure_streams(nc.jetstream())
        return list(await NatsJournal(nc.jetstream()).events([EVENTS_ALL]))
    finally:
        await nc.close()


async def test_an_import_belongs_to_the_profile_it_names_and_publishes_it(tmp_path: Path, nats_url: str) -> None:
    home = small_claude_home(tmp_path, sessions=2)
    done = await acos(
        "import", "claude", str(home), "--profile", "work", "--no-progress", "--jobs", "1", nats_url=nats_url
    )
    assert done.code == 0, done.err
    events = await _events(nats_url)
    [profile] = [e for e in events if isinstance(e, ProfileUpserted)]
    assert (profile.profile_id, profile.tags) == ("work", ("vendor:claude-code",))
    imported = [e for e in events if isinstance(e, TranscriptImported | ModelCallCompleted)]
    assert imported and {e.profile_id for e in imported} == {"work"}

    default = small_claude_home(tmp_path / "again", sessions=1)
    assert (await acos("import", "claude", str(default), "--no-progress", nats_url=nats_url)).code == 0
    upserted = [e.profile_id for e in await _events(nats_url) if isinstance(e, ProfileUpserted)]
    assert upserted == ["work", "claude-code"]


async def test_a_bad_or_deleted_profile_is_refused_in_one_line(tmp_path: Path, nats_url: str) -> None:
    home = small_claude_home(tmp_path, sessions=1)
    bad = await acos("import", "claude", str(home), "--profile", "Bad.Id", nats_url=nats_url)
    assert (bad.code, bad.out) == (2, "") and bad.err.count("\n") == 1
    assert bad.err.startswith("cos import claude: error: argument --profile: invalid profile id 'Bad.Id'"), bad.err

    dry = await acos("import", "claude", str(home), "--profile", "work", "--dry-run", "--format", "json")
    assert dry.code == 0, dry.err  # no server needed

    assert (await acos("import", "claude", str(home), "--profile", "work", nats_url=nats_url)).code == 0
    deleted = await acos("profile", "delete", "work", "--yes", "--by", "cli:alice", nats_url=nats_url)
    assert deleted.code == 0, deleted.err
    again = await acos("import", "claude", str(home), "--profile", "work", nats_url=nats_url)
    assert (again.code, again.out) == (2, "") and "Traceback" not in again.err
    assert re.fullmatch(
        r"cos: error: profile 'work' was deleted at \S+ \S+ UTC by cli:alice: nothing is imported into it "
        r"\(re-create it first: cos profile recreate work\)\n",
        again.err,
    ), again.err


async def test_deleting_the_import_profile_drops_the_imported_sessions_and_billing_keeps_their_cost(
    tmp_path: Path, nats_url: str, database_url: str
) -> None:
    home = small_claude_home(tmp_path, sessions=2)
    async with writers(nats_url, database_url):
        done = await acos("import", "claude", str(home), "--no-progress", "--format", "json", nats_url=nats_url)
        assert done.code == 0, done.err
        calls = int(done.json()["totals"]["invocations"])
        await wait_stored(nats_url, database_url, calls)
        conn = await asyncpg.connect(database_url)
        try:
            assert await conn.fetchval("SELECT count(*) FROM graph.sessions WHERE profile_id = 'claude-code'") == 2
            cost = await conn.fetchval("SELECT sum(cost_usd) FROM model_calls WHERE profile_id = 'claude-code'")

            deleted = await acos("profile", "delete", "claude-code", "--yes", nats_url=nats_url)
            assert deleted.code == 0, deleted.err
            await wait_stored(nats_url, database_url, calls)
            assert await conn.fetchval("SELECT count(*) FROM graph.sessions") == 0
            assert await conn.fetchval("SELECT count(*) FROM graph.user_inputs") == 0
            assert await conn.fetchval("SELECT sum(cost_usd) FROM model_calls WHERE profile_id = 'claude-code'") == cost
        finally:
            await conn.close()
