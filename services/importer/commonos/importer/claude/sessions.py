"""Assembling sessions from records: the main session's lines apart from each subagent's, and which
tool use spawned which subagent."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from commonos.importer.builder import parse_time
from commonos.importer.claude.format import SPAWN_TOOLS
from commonos.importer.claude.records import Line, content_of, decode_lines, progress_line, text_of
from commonos.importer.lines import Warn


@dataclass
class Stream:
    """The lines of one session: the main transcript or one subagent."""

    key: str
    lines: list[Line] = field(default_factory=list)
    seen_refs: set[str] = field(default_factory=set)
    spawned_by: str | None = None
    agent_id: str | None = None

    def add(self, line: Line) -> None:
        identity = str(line.record.get("uuid") or line.source_ref)
        if identity in self.seen_refs:
            return
        self.seen_refs.add(identity)
        self.lines.append(line)

    def first_prompt(self) -> str | None:
        for line in self.lines:
            if line.record.get("type") == "user":
                return text_of(content_of(line.record))
        return None


def split_streams(main_lines: list[Line], agent_files: list[Path], warn: Warn) -> tuple[Stream, dict[str, Stream]]:
    """Separate the main session's lines from every subagent's, merging the three sources."""
    main = Stream(key="")
    subagents: dict[str, Stream] = {}
    for path in agent_files:
        lines = decode_lines(path, warn)
        agent_id = next((str(x.record["agentId"]) for x in lines if x.record.get("agentId")), None)
        key = agent_id or path.stem.removeprefix("agent-")
        stream = subagents.setdefault(key, Stream(key=key, agent_id=key))
        for line in lines:
            stream.add(line)
    owner_of_uuid = {uid: key for key, s in subagents.items() for uid in s.seen_refs}

    sidechain_root: dict[str, str] = {}
    for line in main_lines:
        progress = progress_line(line)
        if progress is not None:
            agent_id, parent_tool, embedded = progress
            stream = subagents.setdefault(agent_id, Stream(key=agent_id, agent_id=agent_id))
            stream.spawned_by = stream.spawned_by or parent_tool
            stream.add(embedded)
            continue
        record = line.record
        if not record.get("isSidechain"):
            main.add(line)
            continue
        uid = str(record.get("uuid") or line.source_ref)
        parent = record.get("parentUuid")
        if isinstance(record.get("agentId"), str):
            key = str(record["agentId"])
        elif uid in owner_of_uuid:
            key = owner_of_uuid[uid]
        elif isinstance(parent, str) and parent in sidechain_root:
            key = sidechain_root[parent]
        else:
            key = f"sidechain:{uid}"
        sidechain_root[uid] = key
        subagents.setdefault(key, Stream(key=key, agent_id=key if ":" not in key else None)).add(line)
    return main, subagents


@dataclass
class SpawnCall:
    tool_use_vendor_id: str
    stream_key: str
    prompt: str | None
    result_agent_id: str | None


def spawn_calls(streams: list[Stream]) -> list[SpawnCall]:
    calls: dict[str, SpawnCall] = {}
    for stream in streams:
        for line in stream.lines:
            for block in content_of(line.record):
                if block.get("type") == "tool_use" and block.get("name") in SPAWN_TOOLS:
                    tool_input = block.get("input")
                    prompt = tool_input.get("prompt") if isinstance(tool_input, dict) else None
                    calls.setdefault(
                        str(block.get("id")),
                        SpawnCall(
                            str(block.get("id")),
                            stream.key,
                            prompt if isinstance(prompt, str) else None,
                            None,
                        ),
                    )
    for stream in streams:
        for line in stream.lines:
            result = line.record.get("toolUseResult")
            if not isinstance(result, dict) or not isinstance(result.get("agentId"), str):
                continue
            for block in content_of(line.record):
                call = calls.get(str(block.get("tool_use_id")))
                if block.get("type") == "tool_result" and call is not None:
                    call.result_agent_id = str(result["agentId"])
    return list(calls.values())


def link_spawns(main: Stream, subagents: dict[str, Stream]) -> dict[str, tuple[str, str]]:
    """Map subagent stream key to (parent stream key, spawning tool-use vendor id)."""
    calls = spawn_calls([main, *subagents.values()])
    by_id = {c.tool_use_vendor_id: c for c in calls}
    claimed: set[str] = set()
    links: dict[str, tuple[str, str]] = {}
    for key, stream in subagents.items():
        call = by_id.get(stream.spawned_by or "")
        if call is None:
            call = next((c for c in calls if c.result_agent_id == stream.agent_id and stream.agent_id), None)
        if call is not None and call.stream_key != key:
            links[key] = (call.stream_key, call.tool_use_vendor_id)
            claimed.add(call.tool_use_vendor_id)
    for key, stream in subagents.items():
        if key in links:
            continue
        prompt = stream.first_prompt()
        call = next(
            (c for c in calls if c.tool_use_vendor_id not in claimed and c.prompt is not None and c.prompt == prompt),
            None,
        )
        if call is not None and call.stream_key != key:
            links[key] = (call.stream_key, call.tool_use_vendor_id)
            claimed.add(call.tool_use_vendor_id)
    return links


def stream_start(stream: Stream) -> Any:
    return next((t for t in (parse_time(x.record.get("timestamp")) for x in stream.lines) if t), None)


def last_value(stream: Stream, key: str) -> str | None:
    value = next(
        (x.record[key] for x in reversed(stream.lines) if isinstance(x.record.get(key), str) and x.record[key]),
        None,
    )
    return str(value) if value is not None else None
