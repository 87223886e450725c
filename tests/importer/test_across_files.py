"""Accounting across every file of a Claude Code home, whatever links the files (or nothing does).

Small homes of our own, each showing one layout met in real transcripts:

* a side transcript (``agent-*.jsonl`` that no Task call spawned, an aside question, say) repeating
  responses of its session: each response counts once;
* the same response in two files, one holding only its first streaming chunk: the final, most complete
  usage is the one counted and stored, whichever file is read first;
* subagent transcripts under ``<project>/subagents/`` (not ``<project>/<session>/subagents/``): read,
  and every other ``.jsonl`` under ``projects/`` is reported with the reason it was not imported;
* the usage a subagent's Task result states: kept apart from the model calls ("subagent usage without a
  transcript"), and not counted at all when the subagent's transcript is there.
"""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from commonos.runtime.embedded import NatsServer
from tests.importer.pipeline import import_and_compare
from tests.importer.test_cli import dry_json
from tests.importer.transcripts import ClaudeWriter, append_lines

PROJECT = "-work-demo"


def _session_id(name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"across-{name}"))


def _settle(home: Path) -> None:
    """Old modification times: every file reads as finished (no response still being written)."""
    old = datetime(2025, 1, 1, tzinfo=UTC).timestamp()
    for path in home.rglob("*.jsonl"):
        os.utime(path, (old, old))


def _as_agent(lines: list[dict[str, Any]], agent_id: str) -> list[dict[str, Any]]:
    """The lines as a subagent/side transcript writes them: on the sidechain, with the agent's id."""
    return [{**line, "isSidechain": True, "agentId": agent_id} for line in lines]


def _responses(summary: dict[str, Any]) -> tuple[int, int]:
    return summary["totals"]["invocations"], summary["totals"]["output_tokens"]


def _home_with_aside(tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    """A session of two responses, and an aside file repeating both (same message ids) before one of its own."""
    home = tmp_path / "claude"
    project = home / "projects" / PROJECT
    project.mkdir(parents=True)
    sid = _session_id("aside")
    main = project / f"{sid}.jsonl"
    writer = ClaudeWriter(main, session_id=sid, seed="aside-main")
    exchange = writer.exchange("Describe the project")
    append_lines(main, exchange)
    aside = ClaudeWriter(main, session_id=sid, seed="aside-side")
    own = [aside.prompt("By the way, what is a jsonl file?")]
    own.append(
        aside.response(
            "msg_aside_own", [{"type": "text", "text": "One JSON per line."}], output_tokens=31, stop_reason="end_turn"
        )
    )
    append_lines(project / "agent-aside1.jsonl", _as_agent([*exchange, *own], "aside1"))
    _settle(home)
    return home, exchange


def test_responses_repeated_in_an_unlinked_side_file_count_once(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    home, _ = _home_with_aside(tmp_path)
    summary = dry_json(capsys, "claude", home)
    # The session's two responses (57 and 9 output tokens) and the aside's own one (31): not 5 calls.
    assert _responses(summary) == (3, 57 + 9 + 31)
    assert sum(s["invocations"] for s in summary["sessions"]) == 3, "each response is counted in one session"


def test_a_response_repeated_in_another_session_file_counts_once(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A forked session (`--fork-session`) copies the history into a new session file: other session id,
    same message ids."""
    home = tmp_path / "claude"
    project = home / "projects" / PROJECT
    project.mkdir(parents=True)
    first = project / f"{_session_id('fork-a')}.jsonl"
    exchange = ClaudeWriter(first, session_id=_session_id("fork-a"), seed="fork").exchange("Describe it")
    append_lines(first, exchange)
    forked_id = _session_id("fork-b")
    forked = [{**line, "sessionId": forked_id} for line in exchange]
    append_lines(project / f"{forked_id}.jsonl", forked)
    _settle(home)
    summary = dry_json(capsys, "claude", home)
    assert len(summary["sessions"]) == 2
    assert _responses(summary) == (2, 57 + 9)


def _home_with_early_chunk_first(tmp_path: Path) -> Path:
    """Response R: its first streaming chunk alone in the session file (read first), complete in a side file."""
    home = tmp_path / "claude"
    project = home / "projects" / PROJECT
    project.mkdir(parents=True)
    sid = _session_id("chunks")
    main = project / f"{sid}.jsonl"
    writer = ClaudeWriter(main, session_id=sid, seed="chunks")
    prompt = writer.prompt("Write the plan")
    early = writer.response("msg_chunks_R", [{"type": "text", "text": "Plan:"}], output_tokens=5, stop_reason=None)
    later = writer.prompt("Thanks, and now?")
    after = writer.response(
        "msg_chunks_S", [{"type": "text", "text": "Next."}], output_tokens=7, stop_reason="end_turn"
    )
    append_lines(main, [prompt, early, later, after])
    complete = {
        **early,
        "uuid": str(uuid.uuid5(uuid.NAMESPACE_URL, "chunks-final")),
        "message": {
            **early["message"],
            "stop_reason": "end_turn",
            "usage": {**early["message"]["usage"], "output_tokens": 800},
        },
    }
    append_lines(project / "agent-side.jsonl", _as_agent([prompt, early, complete], "side"))
    _settle(home)
    return home


def test_the_copy_kept_is_the_most_complete_one(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    summary = dry_json(capsys, "claude", _home_with_early_chunk_first(tmp_path))
    assert _responses(summary) == (2, 800 + 7)


async def test_stored_calls_are_the_most_complete_copies(
    sized_nats_server: NatsServer, database_url: str, tmp_path: Path
) -> None:
    """Imported for real (graph-writer, billing, PostgreSQL): billing stores R once with its final usage, and
    `cos report cost` equals the dry run (import_and_compare)."""
    home = _home_with_early_chunk_first(tmp_path)
    await import_and_compare([(home, "claude")], sized_nats_server.url, database_url)
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT output_tokens FROM model_calls ORDER BY output_tokens")
        stored = await conn.fetch("SELECT output_tokens FROM graph.model_invocations ORDER BY output_tokens")
    finally:
        await conn.close()
    assert [r["output_tokens"] for r in rows] == [7, 800]
    assert {r["output_tokens"] for r in stored} == {7, 800}, "no stored invocation keeps the early chunk's count"


async def test_an_aside_file_imported_for_real_bills_each_response_once(
    sized_nats_server: NatsServer, database_url: str, tmp_path: Path
) -> None:
    home, _ = _home_with_aside(tmp_path)
    fulls = await import_and_compare([(home, "claude")], sized_nats_server.url, database_url)
    assert fulls[0]["totals"]["invocations"] == 3


def _task_session(project: Path, sid: str, agent_id: str) -> tuple[list[dict[str, Any]], str]:
    """A session whose response calls the Task tool; the result states the subagent's id and usage."""
    path = project / f"{sid}.jsonl"
    writer = ClaudeWriter(path, session_id=sid, seed=f"task-{sid}")
    prompt = "Find the failing test"
    task = {
        "type": "tool_use",
        "id": f"toolu_task_{agent_id}",
        "name": "Task",
        "input": {"description": "Search", "prompt": prompt, "subagent_type": "general-purpose"},
    }
    call = writer.response(f"msg_task_{agent_id}", [task], output_tokens=40, stop_reason="tool_use")
    result = writer.tool_result(f"toolu_task_{agent_id}", "Found it in test_x.py")
    result["toolUseResult"] = {
        "status": "completed",
        "prompt": prompt,
        "agentId": agent_id,
        "content": [{"type": "text", "text": "Found it in test_x.py"}],
        "totalTokens": 1234,
        "usage": {
            "input_tokens": 200,
            "output_tokens": 34,
            "cache_read_input_tokens": 1000,
            "cache_creation_input_tokens": 0,
        },
    }
    final = writer.response(
        f"msg_final_{agent_id}", [{"type": "text", "text": "It is test_x."}], output_tokens=6, stop_reason="end_turn"
    )
    append_lines(path, [writer.prompt("Which test fails?"), call, result, final])
    return [call, final], prompt


def test_usage_stated_by_a_subagent_result_is_not_a_model_call(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    home = tmp_path / "claude"
    project = home / "projects" / PROJECT
    project.mkdir(parents=True)
    _task_session(project, _session_id("task-alone"), "a1")
    _settle(home)
    summary = dry_json(capsys, "claude", home)
    assert _responses(summary) == (2, 40 + 6)
    assert all(m["model"] != "unknown" for m in summary["models"]), summary["models"]
    apart = summary["subagent_usage_without_transcript"]
    assert (apart["reports"], apart["input_tokens"], apart["output_tokens"], apart["cache_read_tokens"]) == (
        1,
        200,
        34,
        1000,
    )
    assert summary["sessions"][0]["subagent_usage_without_transcript"]["output_tokens"] == 34


def test_subagent_transcripts_under_the_project_subagents_folder_are_read(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    home = tmp_path / "claude"
    project = home / "projects" / PROJECT
    (project / "subagents").mkdir(parents=True)
    sid = _session_id("project-subagents")
    _, prompt = _task_session(project, sid, "b2")
    agent = ClaudeWriter(project / "subagents" / "agent-b2.jsonl", session_id=sid, seed="agent-b2")
    lines = [
        agent.prompt(prompt),
        agent.response(
            "msg_agent_b2", [{"type": "text", "text": "test_x.py fails"}], output_tokens=34, stop_reason="end_turn"
        ),
    ]
    append_lines(project / "subagents" / "agent-b2.jsonl", _as_agent(lines, "b2"))
    (project / "notes").mkdir()
    append_lines(project / "notes" / "scratch.jsonl", [{"note": "not a transcript"}])
    _settle(home)
    summary = dry_json(capsys, "claude", home)
    assert len(summary["sessions"]) == 1 and summary["sessions"][0]["nested_sessions"] == 1
    # The Task call, the final answer, and the subagent's own response; its result's usage is not added again.
    assert _responses(summary) == (3, 40 + 6 + 34)
    assert summary["subagent_usage_without_transcript"]["reports"] == 0
    scratch = [w for w in summary["warnings"] if "scratch.jsonl" in w]
    assert len(scratch) == 1 and "not imported" in scratch[0], summary["warnings"]


def test_an_agent_file_whose_session_is_missing_is_imported_on_its_own(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    home = tmp_path / "claude"
    project = home / "projects" / PROJECT
    (project / "subagents").mkdir(parents=True)
    sid = _session_id("gone")
    path = project / "subagents" / "agent-c3.jsonl"
    agent = ClaudeWriter(path, session_id=sid, seed="agent-c3")
    lines = [
        agent.prompt("Look around"),
        agent.response("msg_agent_c3", [{"type": "text", "text": "Done"}], output_tokens=12, stop_reason="end_turn"),
    ]
    append_lines(path, _as_agent(lines, "c3"))
    _settle(home)
    summary = dry_json(capsys, "claude", home)
    assert _responses(summary) == (1, 12)
    assert summary["warnings"] == []
