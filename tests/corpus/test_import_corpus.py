"""Claude Code and Codex adapters against real transcripts and small hand-written fixtures.

Corpus tests read ``../shared/corpus`` beside the clone (or ``$COS_CORPUS_DIR``) and skip, saying
so, where it is absent; fixture tests always run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from commonos.accounting.pricing import Pricer
from commonos.importer.claude import read_claude, read_claude_file
from commonos.importer.codex import parse_patch, read_codex, read_codex_file
from commonos.importer.model import ImportedSession
from commonos.importer.report import summarize_import, summarize_tree, summary_json
from commonos.proto.graph import (
    SUBAGENT_DETAIL_KEY,
    Graph,
    InputKind,
    InputOrigin,
    Outcome,
    ToolStatus,
    ToolVerb,
    decode_graph,
    encode_graph,
    validate,
)
from tests.importer.transcripts import CORPUS, needs_corpus

CLAUDE_PROJECTS = CORPUS / "claude" / "projects"
CODEX_SESSIONS = CORPUS / "codex" / "sessions"


def _tokens(graph: Graph, session_id: str | None = None) -> tuple[int, int, int, int, int]:
    rows = [m for m in graph.model_invocations if session_id is None or m.session_id == session_id]
    return (
        len(rows),
        sum(m.input_tokens for m in rows),
        sum(m.output_tokens for m in rows),
        sum(m.cache_read_tokens for m in rows),
        sum(m.cache_write_tokens for m in rows),
    )


def _by_vendor_session(imported: list[ImportedSession]) -> dict[str, ImportedSession]:
    found: dict[str, ImportedSession] = {}
    for item in imported:
        row = next(v for v in item.graph.vendor_ids if v.our_type == "session")
        found[row.vendor_id] = item
    return found


def _ids(graph: Graph) -> dict[str, set[str]]:
    return {
        "sessions": {s.id for s in graph.sessions},
        "user_inputs": {u.id for u in graph.user_inputs},
        "model_invocations": {m.id for m in graph.model_invocations},
        "assistant_messages": {m.id for m in graph.assistant_messages},
        "tool_uses": {t.id for t in graph.tool_uses},
        "tool_results": {r.id for r in graph.tool_results},
        "file_touches": {f.id for f in graph.file_touches},
    }


# --- Claude Code, corpus -------------------------------------------------------------------

# Expected per-session totals: (invocations, input, output, cache_read, cache_write).
# Derived independently of the adapter with jq over each file:
#   select(.type=="assistant" and .message.model!="<synthetic>") | group_by(.message.id)
#   | per group, the usage of the LAST line that has a requestId (or the last line if none has)
#   | sum input_tokens, output_tokens, cache_read_input_tokens, cache_creation_input_tokens.
# Inline sidechain (subagent) lines are included: they are this tree's own API calls.
CLAUDE_EXPECTED = {
    "354b2588-2a5c-43d7-b678-e95a4a87bd2a": (182, 1620, 11758, 14288562, 1672994),
    "b6076239-b6a8-42a2-8a61-9d0390bdcf3b": (28, 28541, 4583, 779938, 95895),
    "e77c7d1f-1b41-4e24-880a-08a2bad9ad7b": (60, 268, 9676, 3525470, 313366),
    "0890bead-0ab3-4ee9-98f8-585fd289cc1f": (39, 826, 6436, 1903822, 125267),
    "d3ad4cdc-5657-435d-98fa-0035d53e383d": (62, 114, 16769, 3754072, 174552),
    "fed8ce56-bc79-401f-a83e-af084253362f": (4, 88, 278, 44544, 16000),
    "5c0375b4-57a5-4f26-b12d-d022ee4e51b7": (20, 129, 3629, 324259, 47747),
    "fe5e1c67-53e7-4862-81ae-d0e013e3270b": (170, 818, 51933, 3647854, 137976),
}
# agent-ae7f6bd.jsonl ("Warmup", no spawning Task in 0890bead) is its own tree: 2 responses.
CLAUDE_WARMUP_EXPECTED = (2, 4, 98, 10979, 11242)


@pytest.fixture(scope="module")
def claude_corpus() -> list[ImportedSession]:
    return list(read_claude(CORPUS / "claude"))


@needs_corpus
def test_every_claude_transcript_validates_and_round_trips(claude_corpus: list[ImportedSession]) -> None:
    assert len(claude_corpus) == len(CLAUDE_EXPECTED) + 1
    for item in claude_corpus:
        validate(item.graph)
        assert decode_graph(encode_graph(item.graph)) == item.graph
        assert item.vendor == "claude-code" and item.source_bytes > 0


@needs_corpus
def test_claude_token_totals_per_session(claude_corpus: list[ImportedSession]) -> None:
    found = _by_vendor_session(claude_corpus)
    for vendor_session, expected in CLAUDE_EXPECTED.items():
        assert _tokens(found[vendor_session].graph) == expected, vendor_session
    assert _tokens(found["ae7f6bd"].graph) == CLAUDE_WARMUP_EXPECTED


@needs_corpus
def test_one_invocation_per_message_id_from_its_final_line() -> None:
    # d3ad4cdc: msg_01JfdZ565EHaXrLGdMWMJUG2 is written as two lines whose usage says 1, then
    # 286 output tokens; the invocation must carry 286 once, not 287.
    path = CLAUDE_PROJECTS / "-Users-chip-dev-ai-music" / "d3ad4cdc-5657-435d-98fa-0035d53e383d.jsonl"
    graph = read_claude_file(path)[0].graph
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assistant = [x for x in lines if x["type"] == "assistant"]
    assert len(assistant) == 73 and len(graph.model_invocations) == 62
    invocation = next(
        m
        for m in graph.model_invocations
        if any(v.vendor_id == "msg_01JfdZ565EHaXrLGdMWMJUG2" and v.our_id == m.id for v in graph.vendor_ids)
    )
    assert invocation.output_tokens == 286 and invocation.cache_read_tokens == 54176
    assert len([a for a in graph.assistant_messages if a.model_invocation_id == invocation.id]) >= 1
    naive_output = sum(x["message"]["usage"]["output_tokens"] for x in assistant)
    assert naive_output > _tokens(graph)[2] == 16769


@needs_corpus
def test_resumed_rewrite_is_not_counted_again() -> None:
    # 354b2588 holds 64 message ids rewritten later in the file with new uuids and no requestId
    # (e.g. msg_01Rtjcr8V1K3EYtADHWMYtbe at lines 3-5 and again at 107-109).
    path = CLAUDE_PROJECTS / "-Users-bholt-dev-evergreen" / "354b2588-2a5c-43d7-b678-e95a4a87bd2a.jsonl"
    graph = read_claude_file(path)[0].graph
    rewritten = [
        json.loads(x)
        for x in path.read_text().splitlines()
        if '"type":"assistant"' in x.replace(" ", "") and '"requestId"' not in x
    ]
    assert rewritten, "corpus changed: no rewritten responses"
    assert len(graph.model_invocations) == 182
    # The replayed prompts map onto the original inputs rather than new ones.
    prompts = [u for u in graph.user_inputs if u.text.startswith("Help me think through something.")]
    assert len(prompts) == 1
    # The rewritten tool calls are the same calls: one row and one result each.
    assert len(graph.tool_uses) == len({t.id for t in graph.tool_uses}) == len(graph.tool_results)


@needs_corpus
def test_inline_sidechains_become_nested_sessions_spawned_by_their_task(
    claude_corpus: list[ImportedSession],
) -> None:
    graph = _by_vendor_session(claude_corpus)["fe5e1c67-53e7-4862-81ae-d0e013e3270b"].graph
    root = graph.root()
    assert root is not None
    nested = [s for s in graph.sessions if not s.top_level()]
    tasks = {t.id: t for t in graph.tool_uses if t.verb == ToolVerb.SPAWN_SUBAGENT}
    assert len(nested) == 5 == len(tasks)
    for session in nested:
        assert session.parent_session_id == root.id
        assert session.spawned_by_tool_use_id in tasks
        first = min((u for u in graph.user_inputs if u.session_id == session.id), key=lambda u: u.ordinal)
        assert first.origin == InputOrigin.AGENT
    for task in tasks.values():
        assert json.loads(bytes(task.metadata))[SUBAGENT_DETAIL_KEY] == "transcript"
    # The parent's own calls exclude the subagents': 170 in all, the rest under nested sessions.
    assert _tokens(graph)[0] == 170 and _tokens(graph, root.id)[0] < 170


@needs_corpus
def test_claude_mapping_details(claude_corpus: list[ImportedSession]) -> None:
    found = _by_vendor_session(claude_corpus)
    pushed = found["fed8ce56-bc79-401f-a83e-af084253362f"]
    assert pushed.graph.sessions[0].outcome == Outcome.COMMITTED
    assert pushed.project == "-Users-chip-dev-ai-music"
    assert any(u.kind == InputKind.INTERRUPT for u in pushed.graph.user_inputs)
    assert any(r.status == ToolStatus.INTERRUPTED for r in pushed.graph.tool_results)
    orchestrated = found["5c0375b4-57a5-4f26-b12d-d022ee4e51b7"].graph
    assert orchestrated.user_inputs[0].kind == InputKind.SLASH_COMMAND
    # The Task whose input lacked a prompt failed: no transcript, so its detail is "none".
    details = sorted(
        json.loads(bytes(t.metadata))[SUBAGENT_DETAIL_KEY] for t in orchestrated.tool_uses if t.name == "Task"
    )
    assert details == ["none", "transcript", "transcript"]
    evergreen = found["354b2588-2a5c-43d7-b678-e95a4a87bd2a"].graph
    edits = [f for f in evergreen.file_touches if f.kind == "edit"]
    assert edits and any(f.hunks for f in edits)
    reads = [f for f in evergreen.file_touches if f.kind == "read"]
    assert reads and all(f.start_line is not None for f in reads)
    assert {a.key for a in evergreen.attributes} >= {"cwd", "gitBranch", "version", "model"}
    assert any(m.cache_write_1h_tokens == 0 for m in evergreen.model_invocations)
    assert {m.speed for m in evergreen.model_invocations} == {"standard"}


@needs_corpus
def test_claude_incremental_reread_keeps_every_earlier_id(tmp_path: Path) -> None:
    source = CLAUDE_PROJECTS / "-Users-bholt-dev-evergreen" / "354b2588-2a5c-43d7-b678-e95a4a87bd2a.jsonl"
    lines = source.read_text().splitlines(keepends=True)
    project = tmp_path / "projects" / "p"
    project.mkdir(parents=True)
    target = project / source.name
    target.write_text("".join(lines[:300]))
    before = read_claude_file(target)[0].graph
    target.write_text("".join(lines))
    after = read_claude_file(target)[0].graph
    validate(before)
    for kind, ids in _ids(before).items():
        assert ids <= _ids(after)[kind], kind
    assert len(after.model_invocations) > len(before.model_invocations)
    # Earlier user inputs keep their ordinals as well as their ids.
    assert {(u.id, u.ordinal) for u in before.user_inputs} <= {(u.id, u.ordinal) for u in after.user_inputs}


# --- Claude Code, fixtures -----------------------------------------------------------------

SESSION = "11111111-2222-3333-4444-555555555555"


def _usage(output: int, *, one_hour: int | None = None, speed: str | None = None) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "input_tokens": 10,
        "cache_read_input_tokens": 100,
        "cache_creation_input_tokens": 20,
        "output_tokens": output,
    }
    if one_hour is not None:
        usage["cache_creation"] = {
            "ephemeral_1h_input_tokens": one_hour,
            "ephemeral_5m_input_tokens": 20 - one_hour,
        }
    if speed is not None:
        usage["speed"] = speed
    return usage


def _assistant(uuid: str, mid: str, block: dict[str, Any], usage: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "type": "assistant",
        "uuid": uuid,
        "sessionId": SESSION,
        "timestamp": "2025-01-01T00:00:01Z",
        "message": {
            "id": mid,
            "model": "claude-test",
            "role": "assistant",
            "content": [block],
            "usage": usage,
        },
        **extra,
    }


def _user(uuid: str, content: Any, **extra: Any) -> dict[str, Any]:
    return {
        "type": "user",
        "uuid": uuid,
        "sessionId": SESSION,
        "timestamp": "2025-01-01T00:00:00Z",
        "cwd": "/w",
        "message": {"role": "user", "content": content},
        **extra,
    }


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_fixture_split_response_and_resumed_rewrite(tmp_path: Path) -> None:
    records = [
        _user("u1", "fix it"),
        _assistant("a1", "msg_A", {"type": "text", "text": "looking"}, _usage(1, one_hour=5), requestId="req_A"),
        _assistant(
            "a2",
            "msg_A",
            {"type": "tool_use", "id": "toolu_1", "name": "Edit", "input": {"file_path": "/w/x.py"}},
            _usage(40, one_hour=5, speed="fast"),
            requestId="req_A",
        ),
        _user(
            "u2",
            [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}],
            toolUseResult={
                "structuredPatch": [
                    {"oldStart": 3, "oldLines": 1, "newStart": 3, "newLines": 2, "lines": ["-a", "+b", "+c"]}
                ]
            },
        ),
        # A resumed session rewrites the prompt and the response: new uuids, no requestId.
        _user("u1-again", "fix it"),
        _assistant("a1-again", "msg_A", {"type": "text", "text": "looking"}, _usage(999)),
        _user("u3", [{"type": "text", "text": "[Request interrupted by user]"}]),
    ]
    path = _write(tmp_path / "projects" / "p" / f"{SESSION}.jsonl", records)
    (imported,) = read_claude_file(path)
    graph = imported.graph
    validate(graph)
    (invocation,) = graph.model_invocations
    assert (invocation.input_tokens, invocation.output_tokens, invocation.cache_read_tokens) == (10, 40, 100)
    assert invocation.cache_write_tokens == 20 and invocation.cache_write_1h_tokens == 5
    assert invocation.total_tokens == 170 and invocation.speed == "fast"
    assert len(graph.assistant_messages) == 1
    prompts = [u for u in graph.user_inputs if u.kind == InputKind.PROMPT]
    assert len(prompts) == 1 and prompts[0].interrupted
    (touch,) = graph.file_touches
    assert touch.path == "/w/x.py" and touch.hunks is not None and touch.hunks[0].new_lines == 2
    assert graph.sessions[0].outcome == Outcome.INTERRUPTED
    # The summary `cos import` prints counts the response once, from its final line.
    summary = summarize_import(imported.vendor, tmp_path, [summarize_tree(Pricer(), imported)], dry_run=True)
    (model,) = summary.models
    assert (model.model, model.invocations, model.output_tokens) == ("claude-test", 1, 40)
    assert json.loads(summary_json(summary))["models"][0]["model"] == "claude-test"


def test_fixture_progress_and_subagent_file_counted_once(tmp_path: Path) -> None:
    task = {
        "type": "tool_use",
        "id": "toolu_task",
        "name": "Task",
        "input": {"prompt": "dig", "description": "Dig"},
    }
    sub_prompt = _user("s1", "dig", isSidechain=True, agentId="abc")
    sub_reply = _assistant(
        "s2",
        "msg_SUB",
        {"type": "text", "text": "found"},
        _usage(7),
        requestId="req_S",
        isSidechain=True,
        agentId="abc",
    )
    progress = {
        "type": "progress",
        "uuid": "p1",
        "sessionId": SESSION,
        "parentToolUseID": "toolu_task",
        "timestamp": "2025-01-01T00:00:02Z",
        "data": {"type": "agent_progress", "agentId": "abc", "prompt": "dig", "message": sub_reply},
    }
    records = [
        _user("u1", "go"),
        _assistant("a1", "msg_MAIN", task, _usage(3), requestId="req_M"),
        progress,
        _user(
            "u2",
            [{"type": "tool_result", "tool_use_id": "toolu_task", "content": "found"}],
            toolUseResult={"agentId": "abc", "usage": _usage(7)},
        ),
    ]
    main = _write(tmp_path / "projects" / "p" / f"{SESSION}.jsonl", records)
    _write(tmp_path / "projects" / "p" / SESSION / "subagents" / "agent-abc.jsonl", [sub_prompt, sub_reply])
    (imported,) = read_claude_file(main)
    graph = imported.graph
    validate(graph)
    assert len(graph.model_invocations) == 2
    root, child = graph.sessions
    assert child.parent_session_id == root.id and child.title == "Dig"
    spawn = next(t for t in graph.tool_uses if t.name == "Task")
    assert child.spawned_by_tool_use_id == spawn.id
    assert json.loads(bytes(spawn.metadata))[SUBAGENT_DETAIL_KEY] == "transcript"
    assert _tokens(graph, child.id) == (1, 10, 7, 100, 20)
    assert not graph.token_usage
    # Reading the agent file resolves to its owner session: the same tree.
    assert read_claude_file(main.parent / SESSION / "subagents" / "agent-abc.jsonl")[0].graph == graph


def test_fixture_task_without_transcript_keeps_its_report(tmp_path: Path) -> None:
    task = {"type": "tool_use", "id": "toolu_t", "name": "Agent", "input": {"prompt": "elsewhere"}}
    records = [
        _user("u1", "go"),
        _assistant("a1", "msg_M", task, _usage(3), requestId="r"),
        _user(
            "u2",
            [{"type": "tool_result", "tool_use_id": "toolu_t", "content": "report"}],
            toolUseResult={"usage": _usage(9)},
        ),
    ]
    graph = read_claude_file(_write(tmp_path / "p" / f"{SESSION}.jsonl", records))[0].graph
    validate(graph)
    (spawn,) = graph.tool_uses
    assert json.loads(bytes(spawn.metadata))[SUBAGENT_DETAIL_KEY] == "report"
    (usage,) = graph.token_usage
    assert usage.output_tokens == 9 and usage.api_call_count == 1


# --- Codex, corpus -------------------------------------------------------------------------

# Expected per rollout: (invocations, input excl. cache, output incl. reasoning, cache_read, 0).
# Derived independently from the cumulative counters, not from last_token_usage: with jq, take
# total_token_usage of every token_count, keep each value that differs from the one before
# (distinct events), and read the final value of every run between resets (a drop in
# total_tokens). Summed over runs: input = input_tokens - cached_input_tokens,
# cache_read = cached_input_tokens, output = output_tokens. 019a7ae6 resets once
# (2,993,540 then 685,149 total tokens), so a naive "last cumulative total" would miss most of it.
CODEX_EXPECTED = {
    "019985ca-7ef7-7580-a921-c20ac619f40b": (27, 340250 - 278272, 10409, 278272, 0),
    "01998661-4e27-7361-8e06-bfcb0e30048d": (0, 0, 0, 0, 0),
    "01999469-65fd-7fa2-ab93-d24bb4c714cb": (24, 223108 - 196480, 3928, 196480, 0),
    "019a7ae6-1945-7c63-98f2-210adb922af9": (
        102,
        (2962187 - 2710144) + (671406 - 537856),
        31353 + 13743,
        2710144 + 537856,
        0,
    ),
    "019a7fa9-a846-7393-8d7a-9997d08b0096": (80, 2679324 - 2548352, 38183, 2548352, 0),
    "019a802a-aab1-7c31-9831-d2510c7a74a2": (43, 1064529 - 1019264, 25658, 1019264, 0),
}


@needs_corpus
def test_every_codex_rollout_validates_with_expected_tokens() -> None:
    found = _by_vendor_session(list(read_codex(CORPUS / "codex")))
    assert set(found) == set(CODEX_EXPECTED)
    for vendor_session, expected in CODEX_EXPECTED.items():
        graph = found[vendor_session].graph
        validate(graph)
        assert decode_graph(encode_graph(graph)) == graph
        assert _tokens(graph) == expected, vendor_session
        for m in graph.model_invocations:
            assert m.total_tokens == m.input_tokens + m.output_tokens + m.cache_read_tokens


@needs_corpus
def test_codex_tools_inputs_and_patches() -> None:
    path = next(CODEX_SESSIONS.rglob("*019a7ae6-1945-7c63-98f2-210adb922af9.jsonl"))
    imported = read_codex_file(path)
    assert imported is not None and imported.project == "MoonMind"
    graph = imported.graph
    assert {t.verb for t in graph.tool_uses} >= {ToolVerb.EXECUTE, ToolVerb.EDIT, ToolVerb.OTHER}
    edits = [t for t in graph.tool_uses if t.name == "apply_patch"]
    assert len(edits) == 13 and len(graph.file_touches) >= 13
    assert all(f.hunks for f in graph.file_touches)
    assert {a.key for a in graph.attributes} >= {"model", "cwd", "cli_version"}
    rejected = read_codex_file(next(CODEX_SESSIONS.rglob("*019985ca-7ef7-7580-a921-c20ac619f40b.jsonl")))
    assert rejected is not None
    assert any(r.status == ToolStatus.INTERRUPTED for r in rejected.graph.tool_results)
    assert any(u.interrupted for u in rejected.graph.user_inputs)


@needs_corpus
def test_codex_incremental_reread_keeps_every_earlier_id(tmp_path: Path) -> None:
    source = next(CODEX_SESSIONS.rglob("*019a7ae6-1945-7c63-98f2-210adb922af9.jsonl"))
    lines = source.read_text().splitlines(keepends=True)
    target = tmp_path / source.name
    target.write_text("".join(lines[:400]))
    before = read_codex_file(target)
    shutil.copyfile(source, target)
    after = read_codex_file(target)
    assert before is not None and after is not None
    for kind, ids in _ids(before.graph).items():
        assert ids <= _ids(after.graph)[kind], kind
    assert after.source_bytes > before.source_bytes


# --- Codex, fixtures -----------------------------------------------------------------------


def _token_count(total: int, last_in: int, cached: int, out: int) -> dict[str, Any]:
    last = {
        "input_tokens": last_in,
        "cached_input_tokens": cached,
        "output_tokens": out,
        "total_tokens": last_in + out,
    }
    return {
        "type": "event_msg",
        "timestamp": "2025-01-01T00:00:01Z",
        "payload": {
            "type": "token_count",
            "info": {"total_token_usage": {"total_tokens": total}, "last_token_usage": last},
        },
    }


def test_codex_fixture_repeats_resets_and_conversion(tmp_path: Path) -> None:
    patch = "*** Begin Patch\n*** Update File: a.py\n@@\n-x\n+y\n+z\n*** End Patch"
    records = [
        {
            "type": "session_meta",
            "timestamp": "2025-01-01T00:00:00Z",
            "payload": {"id": "S", "cwd": "/r/proj"},
        },
        {
            "type": "turn_context",
            "timestamp": "2025-01-01T00:00:00Z",
            "payload": {"model": "gpt-x", "cwd": "/r/proj"},
        },
        {
            "type": "event_msg",
            "timestamp": "2025-01-01T00:00:00Z",
            "payload": {"type": "user_message", "message": "hi"},
        },
        _token_count(110, 100, 60, 10),
        {
            "type": "response_item",
            "payload": {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": patch},
        },
        {
            "type": "response_item",
            "payload": {
                "type": "custom_tool_call_output",
                "call_id": "c1",
                "output": json.dumps({"output": "ok", "metadata": {"exit_code": 0}}),
            },
        },
        _token_count(110, 100, 60, 10),  # repeated event: same call
        _token_count(30, 25, 5, 5),  # total reset (resume): a new call all the same
    ]
    path = _write(tmp_path / "rollout-2025-01-01T00-00-00-S.jsonl", records)
    imported = read_codex_file(path)
    assert imported is not None and imported.project == "proj"
    graph = imported.graph
    validate(graph)
    assert _tokens(graph) == (2, 40 + 20, 15, 65, 0)
    assert graph.model_invocations[0].model == "gpt-x"
    (touch,) = graph.file_touches
    assert touch.path == "a.py" and touch.hunks is not None
    assert (touch.hunks[0].old_lines, touch.hunks[0].new_lines) == (1, 2)


def test_parse_patch_handles_add_and_move() -> None:
    patch = (
        "*** Begin Patch\n*** Add File: n.txt\n+1\n+2\n"
        "*** Update File: o.py\n*** Move to: m.py\n@@\n ctx\n-a\n+b\n*** End Patch"
    )
    files = parse_patch(patch)
    assert set(files) == {"n.txt", "m.py"}
    assert files["n.txt"][0].new_lines == 2 and files["m.py"][0].old_lines == 2
