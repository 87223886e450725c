"""A full import stores everything its dry run counts, however large the session (issue #13).

Every test runs the real pipeline (nats-server, the graph-writer, billing, PostgreSQL) against a
server with nats-server's default max_payload (1 MiB) and one with 64 KiB, and compares the graph
tables with the adapter's graph and `cos report cost --group-by model` with `cos import --dry-run`.
"""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import pytest

from commonos.importer.claude import read_claude_file
from commonos.importer.cut import text_marker
from commonos.importer.events import message_size, tree_events
from commonos.importer.parts import part_budget
from commonos.runtime.embedded import NatsServer
from commonos.runtime.limits import DEFAULT_MAX_PAYLOAD
from tests.importer.pipeline import graph_counts, import_and_compare, table_counts
from tests.importer.transcripts import ClaudeWriter, append_lines, long_claude_session


async def test_a_thousand_exchange_session_is_stored_whole(
    tmp_path: Path, sized_nats_server: NatsServer, database_url: str
) -> None:
    # From ~1,000 exchanges the sessions, inputs and invocations alone exceed 1 MiB: such a session used to
    # be refused (exit 1) while the summary still counted its cost.
    home = tmp_path / "claude"
    path = long_claude_session(home / "projects" / "-work-demo", 1_000, subagent_every=97)
    (graph,) = [t.graph for t in read_claude_file(path)]
    assert len(graph.sessions) > 1 and len(graph.model_invocations) > 2_000
    (summary,) = await import_and_compare([(home, "claude")], sized_nats_server.url, database_url)
    assert len(summary["sessions"]) == 1
    assert await table_counts(database_url) == graph_counts([graph])


@pytest.mark.slow  # about 30 s per server
async def test_ten_thousand_exchanges(tmp_path: Path, sized_nats_server: NatsServer, database_url: str) -> None:
    home = tmp_path / "claude"
    path = long_claude_session(home / "projects" / "-work-demo", 10_000, subagent_every=1_000)
    (graph,) = [t.graph for t in read_claude_file(path)]
    (summary,) = await import_and_compare([(home, "claude")], sized_nats_server.url, database_url)
    assert summary["published"]["graph_parts"] > 1 and summary["rows_cut"] == 0
    assert await table_counts(database_url) == graph_counts([graph])


async def test_a_100_mb_transcript_with_5_mb_rows(
    tmp_path: Path, sized_nats_server: NatsServer, database_url: str
) -> None:
    home = tmp_path / "claude"
    path = long_claude_session(
        home / "projects" / "-work-demo",
        4_000,
        subagent_every=500,
        result_bytes=20_000,
        big_result_bytes=5_000_000,
        big_prompt_bytes=5_000_000,
    )
    assert path.stat().st_size > 100_000_000
    (graph,) = [t.graph for t in read_claude_file(path)]
    (summary,) = await import_and_compare([(home, "claude")], sized_nats_server.url, database_url)
    # The 5 MB prompt and the 5 MB tool result are each larger than any message: both are cut, with a marker.
    assert summary["rows_cut"] == summary["sessions"][0]["rows_cut"] == 2
    assert await table_counts(database_url) == graph_counts([graph])
    big_prompt = next(u.text for u in graph.user_inputs if u.text.startswith("Step 2000:"))
    big_result = next(r.output_text or "" for r in graph.tool_results if len(r.output_text or "") > 1_000_000)
    conn = await asyncpg.connect(database_url)
    try:
        stored_prompt = await conn.fetchval("SELECT text FROM graph.user_inputs WHERE text LIKE 'Step 2000:%'")
        stored_result = await conn.fetchval(
            "SELECT output_text FROM graph.tool_results WHERE output_text LIKE '%cos_import_cut%'"
        )
        tokens = await conn.fetchval("SELECT sum(total_tokens) FROM graph.model_invocations")
    finally:
        await conn.close()
    for original, stored in ((big_prompt, stored_prompt), (big_result, stored_result)):
        marker = text_marker(len(original.encode()))
        assert stored.endswith(marker) and original.startswith(stored.removesuffix(marker))
        assert len(stored.encode()) < part_budget(sized_nats_server.max_payload or DEFAULT_MAX_PAYLOAD)
    assert f"[cos_import_cut: {5_000_000} bytes in all" in stored_result
    # Cutting never touches a token count.
    assert tokens == sum(m.total_tokens for m in graph.model_invocations)


def _session_of_message_size(home: Path, target: int) -> Path:
    """A one-exchange session whose graph, as one event with its headers, is exactly `target` bytes."""
    project = home / "projects" / "-work-demo"
    project.mkdir(parents=True)
    path = project / f"{uuid.uuid5(uuid.NAMESPACE_URL, str(home))}.jsonl"

    def write(padding: int) -> int:
        path.unlink(missing_ok=True)
        writer = ClaudeWriter(path, session_id=path.stem, seed=str(home))
        append_lines(path, writer.exchange("Exactly this big\n" + "p" * padding))
        (imported,) = read_claude_file(path)
        (event,) = tree_events(imported, max_payload=target).parts
        return message_size(event)

    padding = 0
    size = write(padding)
    while size != target:
        padding += target - size
        size = write(padding)
    old = datetime(2025, 1, 1, tzinfo=UTC).timestamp()
    os.utime(path, (old, old))
    return path


async def test_a_graph_of_exactly_max_payload_is_one_message_and_one_byte_more_is_split(
    tmp_path: Path, small_nats_server: NatsServer, database_url: str
) -> None:
    # Headers count: a graph whose body alone fits but whose headers take it over the limit is split too.
    limit = small_nats_server.max_payload or DEFAULT_MAX_PAYLOAD
    exact = tmp_path / "exact" / "claude"
    over = tmp_path / "over" / "claude"
    (graph,) = [t.graph for t in read_claude_file(_session_of_message_size(exact, limit))]
    (over_graph,) = [t.graph for t in read_claude_file(_session_of_message_size(over, limit + 1))]
    sources = [(exact, "claude"), (over, "claude")]
    exact_summary, over_summary = await import_and_compare(sources, small_nats_server.url, database_url)
    assert exact_summary["published"]["graph_parts"] == 1
    assert over_summary["published"]["graph_parts"] > 1
    assert await table_counts(database_url) == graph_counts([graph, over_graph])
