"""The Claude Code transcript format: its vendor name, its tools' verbs, the markers its lines carry."""

from __future__ import annotations

import re
from typing import Final

from commonos.proto.graph import ToolVerb
from commonos.proto.vendors import CLAUDE_CODE

#: The vendor's name in graphs, events and tags.
VENDOR: Final = CLAUDE_CODE

TOOL_VERBS: dict[str, ToolVerb] = {
    "Read": ToolVerb.READ,
    "Edit": ToolVerb.EDIT,
    "MultiEdit": ToolVerb.EDIT,
    "Write": ToolVerb.EDIT,
    "NotebookEdit": ToolVerb.EDIT,
    "Grep": ToolVerb.SEARCH,
    "Glob": ToolVerb.SEARCH,
    "LS": ToolVerb.SEARCH,
    "Bash": ToolVerb.EXECUTE,
    "Task": ToolVerb.SPAWN_SUBAGENT,
    "Agent": ToolVerb.SPAWN_SUBAGENT,
}
SPAWN_TOOLS = frozenset({"Task", "Agent"})
INTERRUPT_MARKER = "[Request interrupted by user"
REJECTED_MARKER = "The user doesn't want to proceed with this tool use"
IDE_CONTEXT_PREFIXES = ("<ide_selection>", "<ide_opened_file>", "<ide_diagnostics>")
SYNTHETIC_MODEL = "<synthetic>"
COMMAND_NAME = re.compile(r"<command-name>([^<]*)</command-name>")
# Bulky copies of whole files that a tool result repeats; the touch and hunks keep what matters.
BULKY_RESULT_KEYS = frozenset({"originalFile", "originalFileContents"})


def tool_verb(name: str) -> ToolVerb:
    """Normalize a Claude Code tool name; MCP and unknown tools are ``other``."""
    return TOOL_VERBS.get(name, ToolVerb.OTHER)
