"""A tree whose publication fails is reported as not imported, with the reason, and left out of the totals.

The summary of a full import counts what was stored: a session that could not be published (a row
no message can hold, NATS gone, any error) is listed with `imported: false` and why, its tokens and
cost are not in the per-model lines or the totals, and the import exits 1.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path

import nats

from commonos.accounting.pricing import Pricer
from commonos.importer.cli import SOURCES, import_files
from commonos.importer.events import EVENT_SOURCE
from commonos.importer.publish import PublishCounts, publish_events
from commonos.proto.events import Event
from commonos.runtime.embedded import NatsServer
from commonos.runtime.nats import ensure_streams
from commonos.runtime.publisher import EventPublisher
from tests.importer.pipeline import acos, cos, wait_stored, writers
from tests.importer.transcripts import ClaudeWriter, append_lines, small_claude_home

TOKEN_KINDS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "cost_usd")


def _add_session_with_a_huge_model_name(home: Path, size: int) -> str:
    """A session whose one model invocation names a model of `size` characters: no part can hold that row."""
    project = home / "projects" / "-work-demo"
    path = project / "11111111-2222-3333-4444-555555555555.jsonl"
    writer = ClaudeWriter(path, session_id=path.stem, seed="huge")
    append_lines(
        path,
        [
            writer.prompt("Which model are you?"),
            writer.response(
                "msg_huge",
                [{"type": "text", "text": "This one."}],
                output_tokens=5,
                stop_reason="end_turn",
                model="m" * size,
            ),
        ],
    )
    return path.stem


def _counts(summary: dict[str, object]) -> tuple[object, ...]:
    return tuple(summary[k] for k in TOKEN_KINDS)


async def test_a_session_that_cannot_be_published_is_not_counted(
    tmp_path: Path, small_nats_server: NatsServer, database_url: str
) -> None:
    home = small_claude_home(tmp_path, sessions=1)
    huge = _add_session_with_a_huge_model_name(home, 70 * 1024)
    argv = ("import", "claude", str(home), "--format", "json", "--no-progress", "--jobs", "1", "--settle", "0")
    dry = cos(*argv, "--dry-run").json()
    assert len(dry["sessions"]) == 2 and dry["errors"] == []
    async with writers(small_nats_server.url, database_url):
        full = await acos(*argv, nats_url=small_nats_server.url)
        assert full.code == 1
        summary = full.json()
        good, bad = sorted(summary["sessions"], key=lambda s: s["vendor_session_id"] == huge)
        assert bad["vendor_session_id"] == huge
        assert bad["imported"] is False and "not published" in bad["not_imported"]
        assert "model invocation" in bad["not_imported"] and "max_payload" in bad["not_imported"]
        assert good["imported"] is True and good["not_imported"] is None
        assert summary["sessions_not_imported"] == 1
        assert len(summary["errors"]) == 1 and bad["source_path"] in summary["errors"][0]
        # The totals count what was stored: the session imported, not the one refused.
        assert _counts(summary["totals"]) == _counts(good) != _counts(dry["totals"])
        assert [m["model"] for m in summary["models"]] == ["claude-sonnet-4-20250514"]
        await wait_stored(small_nats_server.url, database_url, good["invocations"])
    report = await acos(
        "report", "cost", "--group-by", "model", "--since", "2000-01-01", "--format", "json",
        nats_url=small_nats_server.url, database_url=database_url,
    )  # fmt: skip
    stored = report.json()["total"]
    assert Decimal(stored["usd"]) == summary["totals"]["cost_usd"] and stored["calls"] == good["invocations"]

    table = await acos(*argv[:3], "--no-progress", "--jobs", "1", nats_url=small_nats_server.url)
    assert table.code == 1
    assert "NOT IMPORTED" in table.out and "1 session(s) not imported, not counted in the totals" in table.out
    assert "error:" in table.out


async def test_when_nats_goes_away_the_trees_not_published_say_so(
    tmp_path: Path, small_nats_server: NatsServer
) -> None:
    home = small_claude_home(tmp_path, sessions=3)
    nc = await nats.connect(small_nats_server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        publisher = EventPublisher(js, EVENT_SOURCE, ack_timeout_s=0.2, deadline_s=1.0)
        published: list[int] = []

        async def publish(events: Sequence[Event]) -> PublishCounts:
            counts = await publish_events(publisher, events)
            published.append(len(events))
            small_nats_server.kill()  # the server dies once the first tree is stored
            return counts

        run = await import_files(SOURCES["claude"], home, Pricer(), publish=publish, settle_s=0)
    finally:
        with contextlib.suppress(ConnectionError):  # the server is gone
            await nc.close()
    first, *rest = run.trees.values()
    assert first.imported is True and len(published) == 1
    assert [t.imported for t in rest] == [False, False]
    assert "PublishError" in (rest[0].not_imported or "")
    assert "publishing stopped after an earlier failure" in (rest[1].not_imported or "")
    assert len(run.errors) == 2
    from commonos.importer.report import summarize_import

    summary = summarize_import("claude-code", home, run.trees.values(), dry_run=False, published=run.published,
                               errors=run.errors)  # fmt: skip
    assert summary.sessions_not_imported == 2
    assert summary.totals.invocations == first.invocations and summary.totals.cost_usd == first.cost_usd
    assert json.loads(json.dumps(summary.totals.total_tokens)) == first.total_tokens
