"""Reading a Claude Code transcript's lines as records, and the parts of a record the importer reads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commonos.importer.lines import Warn, json_object_lines


@dataclass
class Line:
    record: dict[str, Any]
    source_ref: str


def decode_lines(path: Path, warn: Warn) -> list[Line]:
    """Every well-formed JSON object line; a torn last line (file still being written) is skipped.

    A file removed since it was listed has no lines, nor has one that is not a regular file (a FIFO,
    a device: `warn` is told); one that cannot be read is a `TranscriptError`. A line over
    `MAX_LINE_BYTES` is skipped and `warn` told where it is.
    """
    records, _ = json_object_lines(path, warn)
    return [Line(record, where) for record, where in records]


def message_of(record: dict[str, Any]) -> dict[str, Any]:
    message = record.get("message")
    return message if isinstance(message, dict) else {}


def content_of(record: dict[str, Any]) -> list[dict[str, Any]]:
    content = message_of(record).get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [block for block in content if isinstance(block, dict)]
    return []


def text_of(blocks: list[dict[str, Any]]) -> str:
    return "\n".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")


def result_text(block: dict[str, Any]) -> str | None:
    content = block.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(c.get("text", "")) for c in content if isinstance(c, dict) and "text" in c)
    return None


def progress_line(line: Line) -> tuple[str, str | None, Line] | None:
    """(agent id, spawning tool-use vendor id, embedded line) of an ``agent_progress`` line."""
    record = line.record
    data = record.get("data")
    if record.get("type") != "progress" or not isinstance(data, dict):
        return None
    if data.get("type") != "agent_progress":
        return None
    embedded = data.get("message")
    agent_id = data.get("agentId")
    if not isinstance(embedded, dict) or not isinstance(agent_id, str):
        return None
    if not isinstance(embedded.get("message"), dict):
        embedded = {"type": embedded.get("role"), "message": embedded}
    merged = {
        "sessionId": record.get("sessionId"),
        "cwd": record.get("cwd"),
        "timestamp": record.get("timestamp"),
        **embedded,
        "isSidechain": True,
        "agentId": agent_id,
    }
    parent_tool = record.get("parentToolUseID")
    return agent_id, parent_tool if isinstance(parent_tool, str) else None, Line(merged, line.source_ref)
