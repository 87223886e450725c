"""Where Claude Code keeps its transcripts (``~/.claude/projects/<project>/<session>.jsonl``), and which
session an agent (subagent) file belongs to."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec

from commonos.importer.discover import readable
from commonos.importer.lines import NotRegularFile, iter_lines, open_regular

_AGENT_PREFIX = "agent-"


def claude_candidates(root: Path) -> list[Path]:
    """Every name under a Claude Code folder that looks like a transcript, whatever kind of file it is."""
    return sorted(claude_projects_dir(root).rglob("*.jsonl"))


def claude_projects_dir(root: Path) -> Path:
    """Accept ``~/.claude``, its ``projects`` folder, or a single project folder."""
    return root / "projects" if (root / "projects").is_dir() else root


def claude_session_files(root: Path) -> Iterator[Path]:
    """Every top-level Claude Code session transcript (``<project>/<session>.jsonl``) under root."""
    projects = claude_projects_dir(root)
    candidates = sorted(projects.glob("*/*.jsonl")) + sorted(projects.glob("*.jsonl"))
    for path in readable(candidates):
        if not path.name.startswith(_AGENT_PREFIX):
            yield path


def is_claude_agent_file(path: Path) -> bool:
    return path.name.startswith(_AGENT_PREFIX) and path.suffix == ".jsonl"


def first_session_id(path: Path) -> str | None:
    """The ``sessionId`` of the first line of a transcript that carries one (None for a file that is not
    a regular file; a line over the line cap is passed over, the reader reports it)."""
    try:
        with open_regular(path) as handle:
            for _number, line in iter_lines(handle, path, lambda _warning: None):
                try:
                    decoded = msgspec.json.decode(line)
                except msgspec.DecodeError:
                    continue
                if isinstance(decoded, dict) and isinstance(decoded.get("sessionId"), str):
                    return str(decoded["sessionId"])
    except (OSError, NotRegularFile):
        return None
    return None


def claude_agent_files(session_path: Path) -> list[Path]:
    """Subagent transcripts of one session.

    Newer Claude Code writes them to ``<session>/subagents/agent-*.jsonl``; older versions wrote
    ``agent-*.jsonl`` beside the sessions, where only the ``sessionId`` inside tells the owner.
    """
    session_id = session_path.stem
    nested = readable(sorted((session_path.parent / session_id / "subagents").glob("agent-*.jsonl")))
    beside = [
        path
        for path in readable(sorted(session_path.parent.glob("agent-*.jsonl")))
        if first_session_id(path) == session_id
    ]
    return nested + beside


def claude_owner_session_file(agent_path: Path) -> Path | None:
    """The session transcript an agent file belongs to, or None when it is not on disk.

    A ``sessionId`` that is not a plain file name (a path, a NUL, too long for the file system) names
    no owner: an agent file never leads the importer out of its project folder.
    """
    if agent_path.parent.name == "subagents":
        return _file_or_none(agent_path.parent.parent.with_suffix(".jsonl"))
    session_id = first_session_id(agent_path)
    if session_id is None or session_id in ("", ".", "..") or "/" in session_id or "\x00" in session_id:
        return None
    return _file_or_none(agent_path.parent / f"{session_id}.jsonl")


def _file_or_none(path: Path) -> Path | None:
    try:
        return path if path.is_file() else None
    except OSError:  # a name too long, for one
        return None


def owner_of(path: Path, tops: set[Path]) -> Path | None:
    """The session transcript to read again when `path` changes: an agent file's owner, or `path` itself
    when it is one of the top-level transcripts `tops`."""
    if is_claude_agent_file(path):
        return claude_owner_session_file(path)
    return path if path in tops else None
