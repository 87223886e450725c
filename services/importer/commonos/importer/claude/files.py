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

    Newer Claude Code writes them to ``<session>/subagents/agent-*.jsonl``; some versions write them to
    ``<project>/subagents/`` and older ones beside the sessions, where only the ``sessionId`` inside
    tells the owner.
    """
    session_id = session_path.stem
    project = session_path.parent
    nested = readable(sorted((project / session_id / "subagents").glob("agent-*.jsonl")))
    shared = readable(sorted(project.glob("agent-*.jsonl")) + sorted((project / "subagents").glob("agent-*.jsonl")))
    return nested + [path for path in shared if first_session_id(path) == session_id]


def claude_agent_candidates(root: Path) -> list[Path]:
    """Every subagent transcript under a Claude Code folder, in each of the places they are kept."""
    projects = claude_projects_dir(root)
    patterns = ("*/agent-*.jsonl", "*/subagents/agent-*.jsonl", "*/*/subagents/agent-*.jsonl")
    # `root` may be a single project folder too.
    found = {
        path for pattern in (*patterns, "agent-*.jsonl", "subagents/agent-*.jsonl") for path in projects.glob(pattern)
    }
    return readable(sorted(found))


def claude_top_files(root: Path) -> list[Path]:
    """The files an import reads one by one: every session transcript (each reads its subagents), then every
    subagent transcript whose session transcript is not there, read as a tree of its own."""
    orphans = [path for path in claude_agent_candidates(root) if claude_owner_session_file(path) is None]
    return [*claude_session_files(root), *orphans]


def claude_owner_session_file(agent_path: Path) -> Path | None:
    """The session transcript an agent file belongs to, or None when it is not on disk.

    ``<session>/subagents/agent-*.jsonl`` belongs to ``<session>.jsonl``; one beside the sessions or under
    ``<project>/subagents/`` to the session its ``sessionId`` names in that project folder. A
    ``sessionId`` that is not a plain file name (a path, a NUL, too long for the file system) names no
    owner: an agent file never leads the importer out of its project folder.
    """
    folder = agent_path.parent
    if folder.name == "subagents":
        owner = _file_or_none(folder.parent.with_suffix(".jsonl"))
        if owner is not None:
            return owner
        folder = folder.parent
    session_id = first_session_id(agent_path)
    if session_id is None or session_id in ("", ".", "..") or "/" in session_id or "\x00" in session_id:
        return None
    return _file_or_none(folder / f"{session_id}.jsonl")


def _file_or_none(path: Path) -> Path | None:
    try:
        return path if path.is_file() else None
    except OSError:  # a name too long, for one
        return None


def owner_of(path: Path, tops: set[Path]) -> Path | None:
    """The session transcript to read again when `path` changes: an agent file's owner, or `path` itself
    when it is one of the top-level transcripts `tops`."""
    if is_claude_agent_file(path) and path not in tops:
        return claude_owner_session_file(path)
    return path if path in tops else None
