"""Redaction: keep our texts and the transcripts' structure, replace every text the CLI authored.

The CLIs write text of their own into their transcripts (system prompts, tool descriptions,
reminders, environment context); that text is the vendors'. A string is kept when it is one of our
scenario texts, or when it cannot be prose (short, one line, at most two spaces: ids, timestamps,
paths, type names, model names); every other string becomes `PLACEHOLDER`. Numbers, booleans,
nulls, keys and order are untouched, so the importer reads the redacted file as it reads the
original. Absolute temporary paths are rewritten to fixed fake ones first, so regenerating gives
stable diffs.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from typing import Any

PLACEHOLDER = "<redacted>"
#: The fake home and working directory every recorded path is rewritten to.
FAKE_HOME = "/home/user"
FAKE_CWD = "/home/user/project"
#: Claude Code keeps subagent output files in /tmp/claude-<uid>/.
FAKE_CLI_TMP = "/claude-tmp"
#: Above this length a string must be one of ours (or the placeholder); tests/clients checks it.
LONG = 100

#: Phrases the CLIs' own prompts use; a fixture holding one is not redacted.
VENDOR_PHRASES = (
    "You are Claude Code",
    "You are Codex",
    "You are a coding agent",
    "Anthropic's official CLI",
    "Claude Agent SDK",
    "system-reminder",
    "<environment_context>",
    "<permissions instructions>",
    "IMPORTANT: Assist with",
)


def prose(value: str) -> bool:
    """Whether a string could be authored text rather than an identifier-like value."""
    return len(value) > LONG or "\n" in value or value.count(" ") >= 3


def redact_value(value: Any, ours: set[str]) -> Any:
    """`value` with every string that is not ours and could be prose replaced by the placeholder."""
    if isinstance(value, str):
        if value in ours or value.strip() in ours or not prose(value):
            return value
        return PLACEHOLDER
    if isinstance(value, list):
        return [redact_value(v, ours) for v in value]
    if isinstance(value, dict):
        return {k: redact_value(v, ours) for k, v in value.items()}
    return value


def path_rewrites(home: str, cwd: str) -> list[tuple[str, str]]:
    """(temporary, fake) pairs, the longest first: the paths and Claude Code's dash-named project dirs."""
    pairs = {cwd: FAKE_CWD, home: FAKE_HOME, f"/tmp/claude-{os.getuid()}": FAKE_CLI_TMP}
    pairs[re.sub(r"[^A-Za-z0-9]", "-", cwd)] = re.sub(r"[^A-Za-z0-9]", "-", FAKE_CWD)
    return sorted(pairs.items(), key=lambda kv: -len(kv[0]))


def rewrite_paths(text: str, rewrites: Iterable[tuple[str, str]]) -> str:
    for old, new in rewrites:
        text = text.replace(old, new)
    return text


def redact_jsonl(text: str, ours: set[str], rewrites: list[tuple[str, str]]) -> str:
    """A JSON-lines transcript, paths rewritten and redacted line by line (a line that is not JSON is dropped)."""
    out = []
    for line in rewrite_paths(text, rewrites).splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        out.append(json.dumps(redact_value(record, ours), ensure_ascii=False, separators=(",", ":")))
    return "".join(f"{line}\n" for line in out)


def strings(value: Any) -> Iterable[str]:
    """Every string value (not key) in a JSON value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from strings(v)


def unredacted(record: Any, ours: set[str]) -> list[str]:
    """The strings of a record that redaction should have replaced: long ones that are not ours, and
    any holding a known vendor phrase. Empty for a properly redacted record."""
    found = []
    for value in strings(record):
        if value == PLACEHOLDER or value in ours or value.strip() in ours:
            continue
        if len(value) > LONG or any(phrase in value for phrase in VENDOR_PHRASES):
            found.append(value)
    return found
