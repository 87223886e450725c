"""The tools a model may call: files and shell in the profile's workspace, search, delegation, memory.

Each tool has a risk (`shell` and `write_file` are high); whether a call runs, waits for a person, or
is refused is the loop's business (the profile's approval policy), not the tool's. So is the size of
a result: a tool returns its whole output and the loop cuts it (`fit_result`) to what a model is shown
and one message can hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import unicodedata
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

from commonos.loop.journal import Journal, MemoryChange
from commonos.loop.profiles import BUILTIN_TOOLS, Profile
from commonos.loop.providers.base import ToolSpec
from commonos.loop.search import MessageSearch, SearchUnavailable
from commonos.proto.errors import DataError
from commonos.proto.events import MemoryOp, MemoryTarget, Risk
from commonos.proto.identity import TurnInfo

#: Longest tool result a model sees (and an event keeps); the loop cuts the rest, saying so
#: (`fit_result`), and also cuts a result to what fits one message.
MAX_RESULT_CHARS: Final = 16_000
MAX_MEMORY_ENTRY_CHARS: Final = 2_000
SHELL_TIMEOUT_S: Final = 30.0
SHELL_MAX_TIMEOUT_S: Final = 300.0


class ToolFailed(DataError):
    """A tool call that could not do its job; the message goes back to the model as an error result."""


@dataclass(frozen=True)
class ToolOutput:
    content: str
    is_error: bool = False


#: Runs a delegated turn for `goal` under the parent turn and returns the helper's answer.
RunChild = Callable[[TurnInfo, str], Awaitable[str]]


@dataclass
class ToolContext:
    turn: TurnInfo
    profile: Profile
    journal: Journal
    search: MessageSearch
    delegate: RunChild
    memory_locks: dict[str, asyncio.Lock] = field(default_factory=dict)


class Tool(Protocol):
    name: str
    description: str
    parameters: dict[str, Any]
    risk: Risk

    async def run(self, ctx: ToolContext, args: Mapping[str, Any]) -> ToolOutput:
        """Do the call; raise `ToolFailed` for an error the model should see."""
        ...


def cut(text: str, limit: int = MAX_RESULT_CHARS) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[… {len(text) - limit} more characters cut]"


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def truncation_marker(shown_bytes: int, total_bytes: int) -> str:
    """What ends a cut tool result: how much of it is shown, in bytes (UTF-8)."""
    return f"\n[truncated: showing {shown_bytes} of {total_bytes} bytes]"


def fit_result(text: str, fits: Callable[[str], bool], max_chars: int = MAX_RESULT_CHARS) -> tuple[str, int | None]:
    """A tool result as it is recorded and shown to the model, and the whole result's size in bytes if it
    was cut (else None).

    `text` itself when it has at most `max_chars` characters and `fits`; otherwise its longest prefix
    (of at most `max_chars` characters) that `fits` followed by `truncation_marker`. `fits` must not
    turn false as a text grows; when not even the marker alone fits, that is what is returned.
    """
    if len(text) <= max_chars and fits(text):
        return text, None
    total = _utf8_len(text)

    def shown(n: int) -> str:
        prefix = text[:n]
        return prefix + truncation_marker(_utf8_len(prefix), total)

    lo, hi = 0, min(len(text), max_chars)
    while lo < hi:  # the largest n whose prefix fits with the marker
        mid = (lo + hi + 1) // 2
        if fits(shown(mid)):
            lo = mid
        else:
            hi = mid - 1
    return shown(lo), total


def _str_arg(args: Mapping[str, Any], name: str, default: str | None = None) -> str:
    value = args.get(name, default)
    if not isinstance(value, str):
        raise ToolFailed(f"argument {name!r} must be a string" if name in args else f"missing argument {name!r}")
    return value


def _int_arg(args: Mapping[str, Any], name: str) -> int | None:
    value = args.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ToolFailed(f"argument {name!r} must be a whole number")
    return value


def in_workspace(profile: Profile, relative: str) -> Path:
    """`relative` inside the profile's workspace; a path that leads out of it is refused."""
    root = profile.workspace.resolve()
    root.mkdir(parents=True, exist_ok=True)
    path = (root / relative).resolve()
    if path != root and root not in path.parents:
        raise ToolFailed(f"{relative!r} is outside the workspace")
    return path


def _schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


class ReadFile:
    name = "read_file"
    description = "Read a text file of the workspace."
    parameters = _schema({"path": {"type": "string", "description": "path relative to the workspace"}}, ["path"])
    risk = Risk.LOW

    async def run(self, ctx: ToolContext, args: Mapping[str, Any]) -> ToolOutput:
        path = in_workspace(ctx.profile, _str_arg(args, "path"))
        try:
            text = await asyncio.to_thread(path.read_text, errors="replace")
        except OSError as exc:
            raise ToolFailed(f"cannot read {args['path']}: {exc.strerror}") from None
        return ToolOutput(text)


class ListDir:
    name = "list_dir"
    description = "List a folder of the workspace (folders end with /)."
    parameters = _schema({"path": {"type": "string", "description": "folder relative to the workspace"}}, [])
    risk = Risk.LOW

    async def run(self, ctx: ToolContext, args: Mapping[str, Any]) -> ToolOutput:
        path = in_workspace(ctx.profile, _str_arg(args, "path", "."))
        try:
            names = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
        except OSError as exc:
            raise ToolFailed(f"cannot list {args.get('path', '.')}: {exc.strerror}") from None
        return ToolOutput("\n".join(names) if names else "(empty)")


class WriteFile:
    name = "write_file"
    description = "Write (or overwrite) a text file of the workspace."
    parameters = _schema({"path": {"type": "string"}, "content": {"type": "string"}}, ["path", "content"])
    risk = Risk.HIGH

    async def run(self, ctx: ToolContext, args: Mapping[str, Any]) -> ToolOutput:
        path = in_workspace(ctx.profile, _str_arg(args, "path"))
        content = _str_arg(args, "content")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(path.write_text, content)
        except OSError as exc:
            raise ToolFailed(f"cannot write {args['path']}: {exc.strerror}") from None
        return ToolOutput(f"wrote {len(content.encode())} bytes to {args['path']}")


class Shell:
    name = "shell"
    description = "Run a shell command in the workspace; returns its exit code and output."
    parameters = _schema(
        {"command": {"type": "string"}, "timeout_s": {"type": "number", "description": "at most 300"}},
        ["command"],
    )
    risk = Risk.HIGH

    async def run(self, ctx: ToolContext, args: Mapping[str, Any]) -> ToolOutput:
        command = _str_arg(args, "command")
        timeout = args.get("timeout_s", SHELL_TIMEOUT_S)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ToolFailed("argument 'timeout_s' must be a positive number")
        proc = await asyncio.create_subprocess_shell(
            command,
            cwd=in_workspace(ctx.profile, "."),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), min(float(timeout), SHELL_MAX_TIMEOUT_S))
        except BaseException as exc:
            # Timed out, or the turn was cancelled: the command and its children go too.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            if isinstance(exc, TimeoutError):
                raise ToolFailed(f"command timed out after {timeout}s") from None
            raise
        text = out.decode("utf-8", "replace")
        code = proc.returncode
        return ToolOutput(f"exit code {code}\n{text}", is_error=code != 0)


class SessionSearch:
    name = "session_search"
    description = "Full-text search over this profile's past messages (web-search syntax)."
    parameters = _schema(
        {"query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1, "maximum": 20}}, ["query"]
    )
    risk = Risk.LOW

    async def run(self, ctx: ToolContext, args: Mapping[str, Any]) -> ToolOutput:
        query = _str_arg(args, "query")
        limit = max(1, min(_int_arg(args, "limit") or 5, 20))
        try:
            hits = await ctx.search.search(ctx.profile.id, query, limit, exclude_session=ctx.turn.session_id)
        except SearchUnavailable as exc:
            raise ToolFailed(str(exc)) from None
        if not hits:
            return ToolOutput("no matching messages")
        return ToolOutput("\n".join(f"[session {h.session_id} #{h.seq} {h.role}] {cut(h.text, 500)}" for h in hits))


class DelegateTool:
    name = "delegate"
    description = "Give a goal to a helper agent (same profile, a new session) and get its answer."
    parameters = _schema({"goal": {"type": "string", "description": "what the helper should do"}}, ["goal"])
    risk = Risk.LOW

    async def run(self, ctx: ToolContext, args: Mapping[str, Any]) -> ToolOutput:
        goal = _str_arg(args, "goal").strip()
        if not goal:
            raise ToolFailed("the goal is empty")
        if ctx.turn.depth + 1 > ctx.profile.max_delegation_depth:
            raise ToolFailed(f"delegation is limited to depth {ctx.profile.max_delegation_depth}")
        return ToolOutput(await ctx.delegate(ctx.turn, goal))


def memory_key(text: str) -> str:
    """What makes two memory entries the same: their text without case, Unicode compatibility forms, runs of
    white space or a closing full stop (`Lives in Charleston` is `lives in  charleston.`)."""
    folded = " ".join(unicodedata.normalize("NFKC", text).casefold().split())
    return folded.rstrip(" .!;")


class MemoryTool:
    """Adds, replaces and removes a profile's memory entries (`memory_changed`).

    An entry is kept once per profile and target: adding what an entry already says (`memory_key`) records
    nothing and answers where it is; replacing an entry by what another already says is refused. So nothing
    reaches the stream that the projection (`commonos.journal_writer.memory`) or a replay would have to drop,
    and both keep folding every event as it is. Changes are one at a time per profile in this process (as for
    positions)."""

    name = "memory"
    description = (
        "Keep notes across sessions. target 'memory' (your notes) or 'user' (about the user); "
        "action 'add' (at position, default the end; what an entry already says is not added twice), "
        "'replace' or 'remove' (the entry at position, or the one containing `match`)."
    )
    parameters = _schema(
        {
            "action": {"type": "string", "enum": ["add", "replace", "remove"]},
            "target": {"type": "string", "enum": ["memory", "user"]},
            "content": {"type": "string"},
            "position": {"type": "integer", "minimum": 0},
            "match": {"type": "string"},
        },
        ["action"],
    )
    risk = Risk.LOW

    async def run(self, ctx: ToolContext, args: Mapping[str, Any]) -> ToolOutput:
        try:
            op = MemoryOp(_str_arg(args, "action"))
            target = MemoryTarget(_str_arg(args, "target", "memory"))
        except ValueError as exc:
            raise ToolFailed(str(exc)) from None
        lock = ctx.memory_locks.setdefault(ctx.profile.id, asyncio.Lock())
        async with lock:  # one change at a time per profile in this process: positions stay right
            entries = list((await ctx.journal.load_memory(ctx.profile.id)).of(target))
            position = _int_arg(args, "position")
            content: str | None = None
            if op is MemoryOp.ADD or op is MemoryOp.REPLACE:
                content = _str_arg(args, "content").strip()
                if not content:
                    raise ToolFailed("content is empty")
                if len(content) > MAX_MEMORY_ENTRY_CHARS:
                    raise ToolFailed(f"an entry holds at most {MAX_MEMORY_ENTRY_CHARS} characters")
            if op is MemoryOp.ADD:
                same = self._same(entries, content or "")
                if same is not None:
                    return ToolOutput(
                        f"{target.value} entry {same} already says this: nothing added; now:\n{_listing(entries)}"
                    )
                position = len(entries) if position is None else min(position, len(entries))
            else:
                position = self._find(entries, position, args.get("match"))
                same = self._same(entries, content) if content is not None else None
                if same is not None and same != position:
                    raise ToolFailed(f"{target.value} entry {same} already says this: remove entry {position} instead")
            await ctx.journal.record_memory_change(
                ctx.turn, MemoryChange(target=target, op=op, position=position, content=content)
            )
        if op is MemoryOp.ADD:
            entries.insert(position, content or "")
        elif op is MemoryOp.REPLACE:
            entries[position] = content or ""
        else:
            del entries[position]
        done = {MemoryOp.ADD: "added", MemoryOp.REPLACE: "replaced", MemoryOp.REMOVE: "removed"}[op]
        return ToolOutput(f"{target.value} entry {done} at position {position}; now:\n{_listing(entries)}")

    @staticmethod
    def _same(entries: list[str], content: str) -> int | None:
        """The position of the entry that already says `content`, or None."""
        key = memory_key(content)
        return next((i for i, e in enumerate(entries) if memory_key(e) == key), None)

    @staticmethod
    def _find(entries: list[str], position: int | None, match: Any) -> int:
        if position is not None:
            if not 0 <= position < len(entries):
                raise ToolFailed(f"no entry at position {position} ({len(entries)} entries)")
            return position
        if not isinstance(match, str) or not match:
            raise ToolFailed("give the entry's position or a `match` text")
        found = [i for i, e in enumerate(entries) if match.lower() in e.lower()]
        if len(found) != 1:
            raise ToolFailed(f"{len(found)} entries contain {match!r}; give the position")
        return found[0]


def _listing(entries: list[str]) -> str:
    return "\n".join(f"{i}. {e}" for i, e in enumerate(entries)) or "(empty)"


def builtin_tools() -> dict[str, Tool]:
    tools: list[Tool] = [ReadFile(), ListDir(), WriteFile(), Shell(), SessionSearch(), DelegateTool(), MemoryTool()]
    registry = {t.name: t for t in tools}
    assert tuple(registry) == BUILTIN_TOOLS, "profiles.BUILTIN_TOOLS must name exactly these tools"
    return registry


def tool_specs(tools: Mapping[str, Tool], names: tuple[str, ...]) -> tuple[ToolSpec, ...]:
    return tuple(
        ToolSpec(name=tools[n].name, description=tools[n].description, parameters=tools[n].parameters)
        for n in names
        if n in tools
    )


__all__ = [
    "RunChild",
    "Tool",
    "ToolContext",
    "ToolFailed",
    "ToolOutput",
    "builtin_tools",
    "cut",
    "fit_result",
    "in_workspace",
    "tool_specs",
    "truncation_marker",
]
