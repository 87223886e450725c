"""Fuzz targets of the importer's adapters: Claude Code and Codex transcript files.

A transcript is someone else's file, written by a tool that changes between versions: a reader
skips what it cannot use, and a field of a shape it cannot map makes the file a `TranscriptError`
naming it (the importer reports that file and goes on); it never raises anything else. The graph it
returns is then either valid or rejected by `validate` with `GraphInvalid`, and it encodes for
publishing.
"""

from __future__ import annotations

import tempfile
from datetime import timedelta
from pathlib import Path

from hypothesis import event, given, settings

from commonos.importer.claude import read_claude_file
from commonos.importer.codex import read_codex_file
from commonos.importer.model import ImportedSession, TranscriptError
from commonos.proto import graph as g
from tests.fuzz import strategies as fz
from tests.fuzz.checks import check_graph_round_trip_and_validity

FILE_DEADLINE = timedelta(seconds=1)


def check_graph(graph: g.Graph) -> None:
    for what, rows in (
        ("tool results", graph.tool_results),
        ("file touches", graph.file_touches),
        ("nested sessions", graph.sessions[1:]),
        ("token usage", graph.token_usage),
    ):
        if rows:
            event(f"has {what}")
    check_graph_round_trip_and_validity(graph)


@settings(deadline=FILE_DEADLINE)
@given(fz.claude_trees())
def test_read_claude_file_yields_checkable_graphs_or_raises_transcript_error(tree: fz.ClaudeTree) -> None:
    with tempfile.TemporaryDirectory(prefix="cos-fuzz-claude-") as tmp:
        project = Path(tmp) / "projects" / "-repo"
        project.mkdir(parents=True)
        session = project / "s0.jsonl"
        session.write_bytes(tree.session)
        agent_dir = project / "s0" / "subagents" if tree.nested else project
        agent_dir.mkdir(parents=True, exist_ok=True)
        for name, data in tree.agents.items():
            (agent_dir / f"{name}.jsonl").write_bytes(data)
        target = agent_dir / f"{tree.read_agent}.jsonl" if tree.read_agent else session
        try:
            imported = read_claude_file(target)
        except TranscriptError as exc:
            assert exc.path == target or str(exc.path).startswith(str(project))
            event("TranscriptError")
            return
    event(f"{len(imported)} graph(s)")
    for item in imported:
        check_graph(item.graph)


@settings(deadline=FILE_DEADLINE)
@given(fz.rollouts)
def test_read_codex_file_yields_a_checkable_graph_or_raises_transcript_error(rollout: bytes) -> None:
    with tempfile.TemporaryDirectory(prefix="cos-fuzz-codex-") as tmp:
        path = Path(tmp) / "rollout-2026-01-01T00-00-00-0199a6f0-0000-7000-8000-000000000001.jsonl"
        path.write_bytes(rollout)
        imported: ImportedSession | None
        try:
            imported = read_codex_file(path)
        except TranscriptError as exc:
            assert exc.path == path
            event("TranscriptError")
            return
    if imported is None:
        event("no records")
        return
    check_graph(imported.graph)
