"""Claude Code transcripts (``~/.claude/projects/<project>/<session>.jsonl``) to session graphs.

One Graph per top-level session, subagents nested inside it. Subagent work arrives three ways,
all merged into one nested session per subagent: inline ``isSidechain`` lines of the parent
file (older versions), ``agent-*.jsonl`` files (beside the sessions, under ``<project>/subagents/``
or under ``<session>/subagents/``), and ``progress`` lines of the parent that embed the subagent's
messages. A subagent is linked to the Task/Agent tool use that spawned it by the progress line's
``parentToolUseID``, by the Task result's ``agentId``, or by its first prompt being the Task's
prompt. A subagent transcript with no spawning call found (Claude Code's own "Warmup" agents)
becomes its own top-level graph, since a nested session needs a spawning tool use; so does a subagent
transcript whose session transcript is not there.

Accounting:

* Claude Code writes one API response as several lines sharing ``message.id``; each line repeats
  the usage so far, so one ModelInvocation per ``message.id`` takes the usage of its final line.
* A resumed session may rewrite earlier responses with new line uuids, the same ``message.id``
  and no ``requestId``; those lines map onto the existing invocation and never change its
  usage, and the prompts they follow map onto the existing user input.
* Entity ids are minted from vendor identity, never the session the record was found in, so a
  response seen in a parent's progress lines and again in the subagent file is one row.

Token convention: Anthropic's ``input_tokens`` already excludes cache reads and writes, so it is
stored as is; ``total_tokens`` = input + output + cache read + cache write.

The layers, one module each: `files` (where the transcripts are), `records` (a transcript's lines as
records), `format` (what Claude Code's records mean: tools, markers), `sessions` (the main session's
and each subagent's lines, and which tool use spawned which), `rows` (one session's rows of the graph)
and `tree` (the graph of a whole session tree).
"""

from __future__ import annotations

from typing import Final

from commonos.importer.claude.files import (
    claude_agent_candidates,
    claude_agent_files,
    claude_candidates,
    claude_owner_session_file,
    claude_projects_dir,
    claude_session_files,
    claude_top_files,
    is_claude_agent_file,
    owner_of,
)
from commonos.importer.claude.format import (
    BULKY_RESULT_KEYS,
    COMMAND_NAME,
    IDE_CONTEXT_PREFIXES,
    INTERRUPT_MARKER,
    REJECTED_MARKER,
    SPAWN_TOOLS,
    SYNTHETIC_MODEL,
    TOOL_VERBS,
    VENDOR,
    tool_verb,
)
from commonos.importer.claude.tree import read_claude, read_claude_file
from commonos.importer.source import Source

__all__ = [
    "BULKY_RESULT_KEYS",
    "COMMAND_NAME",
    "IDE_CONTEXT_PREFIXES",
    "INTERRUPT_MARKER",
    "REJECTED_MARKER",
    "SOURCE",
    "SPAWN_TOOLS",
    "SYNTHETIC_MODEL",
    "TOOL_VERBS",
    "VENDOR",
    "claude_agent_candidates",
    "claude_agent_files",
    "claude_candidates",
    "claude_owner_session_file",
    "claude_projects_dir",
    "claude_session_files",
    "claude_top_files",
    "is_claude_agent_file",
    "read_claude",
    "read_claude_file",
    "tool_verb",
]

#: Claude Code for `cos import claude` (listed in `commonos.importer.vendors`).
SOURCE: Final = Source(
    command="claude",
    vendor=VENDOR,
    label="Claude Code",
    default_root="~/.claude",
    top_files=claude_top_files,
    candidates=claude_candidates,
    read=read_claude_file,
    owner_of=owner_of,
    layout="projects/<project>/<session>.jsonl (with their subagents' agent-*.jsonl)",
)
