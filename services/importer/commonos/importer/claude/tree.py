"""Building the graph of a whole session tree from a transcript, its subagents nested inside it."""

from __future__ import annotations

import math
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec

from commonos.importer.builder import GraphBuilder, is_count, short_title
from commonos.importer.claude.files import (
    claude_agent_files,
    claude_owner_session_file,
    claude_top_files,
    is_claude_agent_file,
)
from commonos.importer.claude.format import VENDOR
from commonos.importer.claude.records import decode_lines
from commonos.importer.claude.rows import SessionReader
from commonos.importer.claude.sessions import Stream, last_value, link_spawns, split_streams, stream_start
from commonos.importer.lines import Warn, log_warning
from commonos.importer.model import ImportedSession, shape_errors_as_transcript_errors
from commonos.proto.graph import (
    EntityType,
    InputOrigin,
    Outcome,
    Session,
    SubagentDetail,
    TokenBasis,
    TokenUsage,
    ToolResult,
    ToolStatus,
    ToolUse,
    ToolVerb,
    UsageScope,
    mint_id,
    with_subagent_detail,
)
from commonos.proto.graph.ids import vendor_session_id


def _spawn_description(builder: GraphBuilder, tool_use_id: str) -> str | None:
    tool_input: Any = msgspec.json.decode(builder.tool_uses[tool_use_id].input)
    if isinstance(tool_input, dict) and isinstance(tool_input.get("description"), str):
        return short_title(tool_input["description"])
    return None


def _settle_spawn_metadata(builder: GraphBuilder, linked_tool_uses: set[str]) -> None:
    """Say on every Task/Agent call what the tree holds of its subagent's work."""
    for tool_use_id, tool_use in list(builder.tool_uses.items()):
        if tool_use.verb != ToolVerb.SPAWN_SUBAGENT:
            continue
        result = builder.tool_results.get(tool_use_id)
        if tool_use_id in linked_tool_uses:
            detail = SubagentDetail.TRANSCRIPT
        elif result is not None and result.status == ToolStatus.OK:
            detail = SubagentDetail.REPORT
            _report_usage(builder, tool_use, result)
        else:
            detail = SubagentDetail.NONE
        builder.tool_uses[tool_use_id] = msgspec.structs.replace(
            tool_use, metadata=msgspec.Raw(with_subagent_detail(tool_use.metadata, detail))
        )


def _report_usage(builder: GraphBuilder, tool_use: ToolUse, result: ToolResult) -> None:
    """Keep the usage a report-only subagent states for its final API call; nothing else has it."""
    if result.output is None:
        return
    output: Any = msgspec.json.decode(result.output)
    usage = output.get("usage") if isinstance(output, dict) else None
    if not isinstance(usage, dict):
        return
    counts = {
        key: usage.get(key) if is_count(usage.get(key)) else None
        for key in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    }
    usage_id = mint_id("token_usage", VENDOR, tool_use.id, "subagent_report")
    agent_id = output.get("agentId")
    builder.vendor_id(EntityType.TOKEN_USAGE, usage_id, tool_use.session_id, "agent_id", agent_id)
    builder.token_usage[usage_id] = TokenUsage(
        id=usage_id,
        session_id=tool_use.session_id,
        user_input_id=tool_use.user_input_id,
        scope=UsageScope.INPUT,
        input_tokens=counts["input_tokens"],
        output_tokens=counts["output_tokens"],
        cache_read_tokens=counts["cache_read_input_tokens"],
        cache_write_tokens=counts["cache_creation_input_tokens"],
        total_tokens=sum(v for v in counts.values() if v is not None),
        api_call_count=1,
        token_basis=TokenBasis.REPORTED,
    )


def _read_tree(
    builder: GraphBuilder,
    top_key: str,
    root_stream: Stream,
    root_session_id: str,
    children: dict[str, list[tuple[str, str]]],
    subagents: dict[str, Stream],
    root_origin: InputOrigin,
) -> None:
    """Read a stream and, breadth first, every subagent it spawned, parents before children."""
    queue: list[tuple[Stream, str, InputOrigin]] = [(root_stream, root_session_id, root_origin)]
    while queue:
        stream, session_id, origin = queue.pop(0)
        reader = SessionReader(builder, top_key, session_id, stream.key, origin)
        reader.read(stream.lines)
        session = builder.sessions[session_id]
        if session.title is None:
            builder.sessions[session_id] = msgspec.structs.replace(session, title=reader.title())
        for child_key, vendor_tool_id in children.get(stream.key, []):
            child = subagents[child_key]
            tool_use_id = mint_id("tool_use", VENDOR, top_key, vendor_tool_id)
            if tool_use_id not in builder.tool_uses:
                continue
            child_id = mint_id("session", VENDOR, top_key, child_key)
            builder.sessions[child_id] = Session(
                id=child_id,
                parent_session_id=session_id,
                spawned_by_tool_use_id=tool_use_id,
                started_at=stream_start(child),
                title=_spawn_description(builder, tool_use_id),
                working_dir=last_value(child, "cwd"),
                git_branch=last_value(child, "gitBranch"),
                outcome=Outcome.UNKNOWN,
            )
            builder.vendor_id(EntityType.SESSION, child_id, child_id, "agent_id", child.agent_id)
            queue.append((child, child_id, InputOrigin.AGENT))


def _read_claude_file(path: Path, warn: Warn, profile: str) -> list[ImportedSession]:
    """Read one session transcript with its subagents; an agent file reads its owner session.

    Returns the session's graph first, then one graph per subagent transcript whose spawning call could
    not be found. An agent file whose session transcript is missing is read on its own: each of its
    subagents becomes a graph of its own.
    """
    session_path: Path | None = path
    if is_claude_agent_file(path):
        session_path = claude_owner_session_file(path)
    agent_files = claude_agent_files(session_path) if session_path is not None else [path]
    main_lines = decode_lines(session_path, warn) if session_path is not None else []
    main, subagents = split_streams(main_lines, agent_files, warn)
    vendor_session = next(
        (
            str(x.record["sessionId"])
            for x in (*main.lines, *(line for s in subagents.values() for line in s.lines))
            if isinstance(x.record.get("sessionId"), str)
        ),
        (session_path or path).stem,
    )
    links = link_spawns(main, subagents)
    children: dict[str, list[tuple[str, str]]] = {}
    for child_key, (parent_key, vendor_tool_id) in links.items():
        children.setdefault(parent_key, []).append((child_key, vendor_tool_id))
    files = tuple(p for p in ([session_path] if session_path is not None else []) + agent_files)
    source_bytes = sum(p.stat().st_size for p in files if p.is_file())
    anchor = session_path or path
    project = _project_of(anchor, vendor_session)
    imported = []

    if session_path is not None:
        builder = GraphBuilder(VENDOR)
        session_id = vendor_session_id(VENDOR, profile, vendor_session)
        builder.sessions[session_id] = Session(
            id=session_id,
            parent_session_id=None,
            spawned_by_tool_use_id=None,
            started_at=stream_start(main),
            working_dir=last_value(main, "cwd"),
            git_branch=last_value(main, "gitBranch"),
            outcome=Outcome.UNKNOWN,
        )
        builder.vendor_id(EntityType.SESSION, session_id, session_id, "session_id", vendor_session)
        _read_tree(builder, vendor_session, main, session_id, children, subagents, InputOrigin.HUMAN)
        linked = {s.spawned_by_tool_use_id for s in builder.sessions.values() if s.spawned_by_tool_use_id}
        _settle_spawn_metadata(builder, {t for t in linked if t is not None})
        imported.append(
            _imported(builder, project, anchor, source_bytes, files, _vendor_cost(main), _vendor_tokens(main))
        )
        nested_keys = {k for k in subagents if mint_id("session", VENDOR, vendor_session, k) in builder.sessions}
    else:
        nested_keys = set()

    for key, stream in subagents.items():
        if key in nested_keys or key in links:
            continue
        orphan = GraphBuilder(VENDOR)
        orphan_id = mint_id("session", VENDOR, vendor_session, key)
        orphan.sessions[orphan_id] = Session(
            id=orphan_id,
            parent_session_id=None,
            spawned_by_tool_use_id=None,
            started_at=stream_start(stream),
            working_dir=last_value(stream, "cwd"),
            git_branch=last_value(stream, "gitBranch"),
            outcome=Outcome.UNKNOWN,
        )
        orphan.vendor_id(EntityType.SESSION, orphan_id, orphan_id, "agent_id", stream.agent_id or key)
        orphan.attribute(orphan_id, "sessionId", vendor_session, stream_start(stream))
        _read_tree(orphan, vendor_session, stream, orphan_id, children, subagents, InputOrigin.SYSTEM)
        linked = {s.spawned_by_tool_use_id for s in orphan.sessions.values() if s.spawned_by_tool_use_id}
        _settle_spawn_metadata(orphan, {t for t in linked if t is not None})
        imported.append(_imported(orphan, project, anchor, source_bytes, files))
    return imported


def _project_of(anchor: Path, vendor_session: str) -> str:
    """The project folder's name: the folder of a session transcript; for a subagent transcript read on its
    own, the folder above ``subagents/`` and above its session's folder."""
    folder = anchor.parent
    if is_claude_agent_file(anchor) and folder.name == "subagents":
        folder = folder.parent
        if folder.name == vendor_session:
            folder = folder.parent
    return folder.name


def _vendor_cost(main: Stream) -> Decimal | None:
    """The session's cost by Claude Code's own reckoning: its last ``cost-state`` line (each holds the total so
    far, across resumed runs), or None."""
    for line in reversed(main.lines):
        record = line.record
        cost = record.get("totalCostUSD")
        if record.get("type") == "cost-state" and isinstance(cost, int | float) and not isinstance(cost, bool):
            return Decimal(repr(cost)) if math.isfinite(cost) and cost >= 0 else None
    return None


#: Claude Code's ``cost-state`` ``modelUsage`` counters, and the kind of token each is.
_COST_STATE_TOKENS = {
    "inputTokens": "input_tokens",
    "outputTokens": "output_tokens",
    "cacheReadInputTokens": "cache_read_tokens",
    "cacheCreationInputTokens": "cache_write_tokens",
}


def _vendor_tokens(main: Stream) -> dict[str, int] | None:
    """The session's tokens by Claude Code's own count, from its ``cost-state`` lines, or None.

    Each line holds the totals so far over every model; a total that goes down starts a new count (a run
    that did not carry the totals over), so the session's tokens are the sum of each count's last totals.
    """
    done = dict.fromkeys(_COST_STATE_TOKENS.values(), 0)
    current: dict[str, int] | None = None
    for line in main.lines:
        record = line.record
        usage = record.get("modelUsage")
        if record.get("type") != "cost-state" or not isinstance(usage, dict):
            continue
        totals = dict.fromkeys(_COST_STATE_TOKENS.values(), 0)
        for counters in usage.values():
            if isinstance(counters, dict):
                for key, kind in _COST_STATE_TOKENS.items():
                    value = counters.get(key)
                    totals[kind] += value if is_count(value) and value > 0 else 0
        if current is not None and any(totals[k] < current[k] for k in totals):
            done = {k: done[k] + current[k] for k in done}
        current = totals
    if current is None:
        return None
    return {k: done[k] + current[k] for k in done}


def _imported(
    builder: GraphBuilder,
    project: str,
    source: Path,
    source_bytes: int,
    files: tuple[Path, ...],
    vendor_cost: Decimal | None = None,
    vendor_tokens: dict[str, int] | None = None,
) -> ImportedSession:
    graph = builder.finish()
    root = graph.root()
    return ImportedSession(
        graph=graph,
        vendor=VENDOR,
        project=project,
        branch=root.git_branch if root is not None else None,
        source_path=source,
        source_bytes=source_bytes,
        source_files=files,
        vendor_cost_usd=vendor_cost,
        vendor_tokens=vendor_tokens,
        input_prompts=dict(builder.input_prompts),
    )


def read_claude(root: Path) -> Iterator[ImportedSession]:
    """Every session tree under a ``~/.claude``-style folder, one Graph per top-level session."""
    for path in claude_top_files(root):
        yield from read_claude_file(path)


def read_claude_file(path: Path, warn: Warn | None = None, profile: str | None = None) -> list[ImportedSession]:
    """Read one transcript (see `_read_claude_file`) as `profile`'s (None: the vendor's default profile,
    ``claude-code``); content of an unexpected shape is a `TranscriptError`.

    `warn` hears of what was skipped (a line over `MAX_LINE_BYTES`, a file that is not a regular
    file); without it, such warnings are logged. The profile is part of the root session's id
    (`vendor_session_id`), as the OTLP gateway mints it for the same session's telemetry.
    """
    with shape_errors_as_transcript_errors(path):
        return _read_claude_file(path, warn or log_warning, profile or VENDOR)
