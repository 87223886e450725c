"""Claude Code transcripts (``~/.claude/projects/<project>/<session>.jsonl``) to session graphs.

One Graph per top-level session, subagents nested inside it. Subagent work arrives three ways,
all merged into one nested session per subagent: inline ``isSidechain`` lines of the parent
file (older versions), ``agent-*.jsonl`` files (beside the sessions or under
``<session>/subagents/``), and ``progress`` lines of the parent that embed the subagent's
messages. A subagent is linked to the Task/Agent tool use that spawned it by the progress line's
``parentToolUseID``, by the Task result's ``agentId``, or by its first prompt being the Task's
prompt. A subagent transcript with no spawning call found (Claude Code's own "Warmup" agents)
becomes its own top-level graph, since a nested session needs a spawning tool use.

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
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from commonos.importer.builder import (
    GraphBuilder,
    is_count,
    parse_time,
    raw_json,
    short_title,
)
from commonos.importer.discover import (
    claude_agent_files,
    claude_owner_session_file,
    claude_session_files,
    is_claude_agent_file,
)
from commonos.importer.lines import Warn, json_object_lines, log_warning
from commonos.importer.model import (
    VENDOR_CLAUDE_CODE,
    ImportedSession,
    shape_errors_as_transcript_errors,
)
from commonos.proto.graph import (
    SPEED_STANDARD,
    AssistantMessage,
    EntityType,
    FileTouch,
    Hunk,
    InputKind,
    InputOrigin,
    ModelInvocation,
    Outcome,
    Session,
    SubagentDetail,
    TokenBasis,
    TokenUsage,
    ToolResult,
    ToolStatus,
    ToolUse,
    ToolVerb,
    TouchKind,
    UsageScope,
    UserInput,
    mint_id,
    speed_valid,
    with_subagent_detail,
)

VENDOR = VENDOR_CLAUDE_CODE

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


@dataclass
class _Line:
    record: dict[str, Any]
    source_ref: str


@dataclass
class _Stream:
    """The lines of one session: the main transcript or one subagent."""

    key: str
    lines: list[_Line] = field(default_factory=list)
    seen_refs: set[str] = field(default_factory=set)
    spawned_by: str | None = None
    agent_id: str | None = None

    def add(self, line: _Line) -> None:
        identity = str(line.record.get("uuid") or line.source_ref)
        if identity in self.seen_refs:
            return
        self.seen_refs.add(identity)
        self.lines.append(line)

    def first_prompt(self) -> str | None:
        for line in self.lines:
            if line.record.get("type") == "user":
                return _text_of(_content(line.record))
        return None


def _decode_lines(path: Path, warn: Warn) -> list[_Line]:
    """Every well-formed JSON object line; a torn last line (file still being written) is skipped.

    A file removed since it was listed has no lines, nor has one that is not a regular file (a FIFO,
    a device: `warn` is told); one that cannot be read is a `TranscriptError`. A line over
    `MAX_LINE_BYTES` is skipped and `warn` told where it is.
    """
    records, _ = json_object_lines(path, warn)
    return [_Line(record, where) for record, where in records]


def _message(record: dict[str, Any]) -> dict[str, Any]:
    message = record.get("message")
    return message if isinstance(message, dict) else {}


def _content(record: dict[str, Any]) -> list[dict[str, Any]]:
    content = _message(record).get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [block for block in content if isinstance(block, dict)]
    return []


def _text_of(blocks: list[dict[str, Any]]) -> str:
    return "\n".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")


def _result_text(block: dict[str, Any]) -> str | None:
    content = block.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(c.get("text", "")) for c in content if isinstance(c, dict) and "text" in c)
    return None


def _progress_line(line: _Line) -> tuple[str, str | None, _Line] | None:
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
    return agent_id, parent_tool if isinstance(parent_tool, str) else None, _Line(merged, line.source_ref)


def _split_streams(main_lines: list[_Line], agent_files: list[Path], warn: Warn) -> tuple[_Stream, dict[str, _Stream]]:
    """Separate the main session's lines from every subagent's, merging the three sources."""
    main = _Stream(key="")
    subagents: dict[str, _Stream] = {}
    for path in agent_files:
        lines = _decode_lines(path, warn)
        agent_id = next((str(x.record["agentId"]) for x in lines if x.record.get("agentId")), None)
        key = agent_id or path.stem.removeprefix("agent-")
        stream = subagents.setdefault(key, _Stream(key=key, agent_id=key))
        for line in lines:
            stream.add(line)
    owner_of_uuid = {uid: key for key, s in subagents.items() for uid in s.seen_refs}

    sidechain_root: dict[str, str] = {}
    for line in main_lines:
        progress = _progress_line(line)
        if progress is not None:
            agent_id, parent_tool, embedded = progress
            stream = subagents.setdefault(agent_id, _Stream(key=agent_id, agent_id=agent_id))
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
        subagents.setdefault(key, _Stream(key=key, agent_id=key if ":" not in key else None)).add(line)
    return main, subagents


@dataclass
class _SpawnCall:
    tool_use_vendor_id: str
    stream_key: str
    prompt: str | None
    result_agent_id: str | None


def _spawn_calls(streams: list[_Stream]) -> list[_SpawnCall]:
    calls: dict[str, _SpawnCall] = {}
    for stream in streams:
        for line in stream.lines:
            for block in _content(line.record):
                if block.get("type") == "tool_use" and block.get("name") in SPAWN_TOOLS:
                    tool_input = block.get("input")
                    prompt = tool_input.get("prompt") if isinstance(tool_input, dict) else None
                    calls.setdefault(
                        str(block.get("id")),
                        _SpawnCall(
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
            for block in _content(line.record):
                call = calls.get(str(block.get("tool_use_id")))
                if block.get("type") == "tool_result" and call is not None:
                    call.result_agent_id = str(result["agentId"])
    return list(calls.values())


def _link_spawns(main: _Stream, subagents: dict[str, _Stream]) -> dict[str, tuple[str, str]]:
    """Map subagent stream key to (parent stream key, spawning tool-use vendor id)."""
    calls = _spawn_calls([main, *subagents.values()])
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


class _SessionReader:
    """Turns the lines of one stream into rows of one session in a shared GraphBuilder."""

    def __init__(
        self,
        builder: GraphBuilder,
        top_key: str,
        session_id: str,
        stream_key: str,
        first_origin: InputOrigin,
    ) -> None:
        self.b = builder
        self.top = top_key
        self.session_id = session_id
        self.stream_key = stream_key
        self.first_origin = first_origin
        self.current_input: str | None = None
        self.last_invocation: str | None = None
        self.pending: list[_Line] = []
        self.request_seen: set[str] = set()
        self.summaries: dict[str, str] = {}
        self.uuids: set[str] = set()
        self.first_prompt: str | None = None

    def read(self, lines: list[_Line]) -> None:
        for line in lines:
            record = line.record
            kind = record.get("type")
            if isinstance(record.get("uuid"), str):
                self.uuids.add(record["uuid"])
            self._attributes(record)
            if kind == "summary" and isinstance(record.get("summary"), str):
                self.summaries[str(record.get("leafUuid"))] = record["summary"]
            elif kind == "user":
                self._user(line)
            elif kind == "assistant":
                self._assistant(line)
        self._flush_pending(replay_of=None)

    def title(self) -> str | None:
        summary = next((s for leaf, s in reversed(self.summaries.items()) if leaf in self.uuids), None)
        return summary or (short_title(self.first_prompt) if self.first_prompt else None)

    def _attributes(self, record: dict[str, Any]) -> None:
        when = parse_time(record.get("timestamp"))
        for key in ("cwd", "gitBranch", "version"):
            value = record.get(key)
            if isinstance(value, str) and value:
                self.b.attribute(self.session_id, key, value, when)
        model = _message(record).get("model")
        if record.get("type") == "assistant" and isinstance(model, str) and model != SYNTHETIC_MODEL:
            self.b.attribute(self.session_id, "model", model, when)

    # user lines

    def _user(self, line: _Line) -> None:
        record = line.record
        blocks = _content(record)
        for block in blocks:
            if block.get("type") == "tool_result":
                self._tool_result(line, block)
        texts = [b for b in blocks if b.get("type") == "text"]
        if not texts or record.get("isMeta"):
            return
        text = _text_of(texts)
        if text.startswith(INTERRUPT_MARKER):
            self._flush_pending(replay_of=None)
            self.b.mark_interrupted(self.current_input)
            self._new_input([line], InputKind.INTERRUPT, InputOrigin.HUMAN, text, {})
            return
        self.pending.append(line)

    def _classify(self, lines: list[_Line]) -> tuple[InputKind, InputOrigin, str, dict[str, Any]]:
        texts: list[str] = []
        context: list[str] = []
        for line in lines:
            for block in _content(line.record):
                if block.get("type") != "text":
                    continue
                text = str(block.get("text", ""))
                (context if text.startswith(IDE_CONTEXT_PREFIXES) else texts).append(text)
        text = "\n".join(texts)
        metadata: dict[str, Any] = {"ide_context": context} if context else {}
        first = lines[0].record
        if first.get("isCompactSummary"):
            return InputKind.OTHER, InputOrigin.SYSTEM, text, metadata
        if "<command-name>" in text:
            return InputKind.SLASH_COMMAND, InputOrigin.HUMAN, text, metadata
        if text.startswith(("<local-command-stdout>", "<bash-stdout>", "Caveat:")):
            return InputKind.OTHER, InputOrigin.SYSTEM, text, metadata
        if first.get("isSidechain"):
            return InputKind.PROMPT, self.first_origin, text, metadata
        return InputKind.PROMPT, InputOrigin.HUMAN, text, metadata

    def _new_input(
        self, lines: list[_Line], kind: InputKind, origin: InputOrigin, text: str, metadata: dict[str, Any]
    ) -> str:
        anchor = lines[0].record
        input_id = mint_id("user_input", VENDOR, self.top, str(anchor.get("uuid") or lines[0].source_ref))
        if input_id not in self.b.user_inputs:
            self.b.user_inputs[input_id] = UserInput(
                id=input_id,
                session_id=self.session_id,
                ordinal=self.b.next_ordinal(self.session_id),
                text=text,
                triggered_at=parse_time(anchor.get("timestamp")),
                interrupted=False,
                kind=kind,
                origin=origin,
                metadata=raw_json(metadata),
            )
            if kind in (InputKind.PROMPT, InputKind.SLASH_COMMAND) and self.first_prompt is None and text:
                command = COMMAND_NAME.search(text)
                self.first_prompt = command.group(1) if command else text
        for line in lines:
            self.b.vendor_id(
                EntityType.USER_INPUT,
                input_id,
                self.session_id,
                "uuid",
                line.record.get("uuid"),
                line.source_ref,
            )
        self.current_input = input_id
        return input_id

    def _flush_pending(self, replay_of: str | None) -> None:
        """Settle the prompt lines seen since the last reply: a new input, or a replay of one."""
        if not self.pending:
            return
        lines, self.pending = self.pending, []
        if replay_of is not None:
            for line in lines:
                self.b.vendor_id(
                    EntityType.USER_INPUT,
                    replay_of,
                    self.session_id,
                    "uuid",
                    line.record.get("uuid"),
                    line.source_ref,
                )
            self.current_input = replay_of
            return
        kind, origin, text, metadata = self._classify(lines)
        self._new_input(lines, kind, origin, text, metadata)

    def _implicit_input(self, line: _Line) -> str:
        """An input for replies that follow no recorded prompt (e.g. a transcript's first line)."""
        anchor = str(line.record.get("parentUuid") or line.record.get("uuid") or line.source_ref)
        input_id = mint_id("user_input", VENDOR, self.top, "implicit", anchor)
        if input_id not in self.b.user_inputs:
            self.b.user_inputs[input_id] = UserInput(
                id=input_id,
                session_id=self.session_id,
                ordinal=self.b.next_ordinal(self.session_id),
                text="",
                triggered_at=parse_time(line.record.get("timestamp")),
                interrupted=False,
                kind=InputKind.OTHER,
                origin=InputOrigin.UNKNOWN,
                metadata=raw_json({}),
            )
        self.current_input = input_id
        return input_id

    # assistant lines

    def _assistant(self, line: _Line) -> None:
        record = line.record
        message = _message(record)
        if message.get("model") == SYNTHETIC_MODEL:
            return
        message_id = str(message.get("id") or record.get("uuid") or line.source_ref)
        invocation_id = mint_id("model_invocation", VENDOR, self.top, message_id)
        known = self.b.invocations.get(invocation_id)
        if known is not None and known.session_id != self.session_id:
            return
        self._flush_pending(replay_of=known.user_input_id if known is not None else None)
        request_id = record.get("requestId")
        if known is None:
            user_input = self.current_input or self._implicit_input(line)
            self.b.invocations[invocation_id] = self._invocation(
                invocation_id, user_input, message, parse_time(record.get("timestamp"))
            )
            self.last_invocation = invocation_id
            self.b.vendor_id(
                EntityType.MODEL_INVOCATION,
                invocation_id,
                self.session_id,
                "message_id",
                message_id,
                line.source_ref,
            )
        elif isinstance(request_id, str) or invocation_id not in self.request_seen:
            # A later line of the same response carries the usage so far; a resumed session's
            # rewrite has no requestId once the original had one, and must not change the count.
            updated = self._invocation(invocation_id, known.user_input_id, message, known.started_at)
            self.b.invocations[invocation_id] = msgspec.structs.replace(
                updated, parent_model_invocation_id=known.parent_model_invocation_id
            )
        if isinstance(request_id, str):
            self.request_seen.add(invocation_id)
            self.b.vendor_id(
                EntityType.MODEL_INVOCATION,
                invocation_id,
                self.session_id,
                "request_id",
                request_id,
                line.source_ref,
            )
        owner = self.b.invocations[invocation_id]
        for block in _content(record):
            self._assistant_block(line, block, owner)

    def _invocation(
        self, invocation_id: str, user_input_id: str, message: dict[str, Any], started: Any
    ) -> ModelInvocation:
        usage = message.get("usage") if isinstance(message.get("usage"), dict) else {}
        assert isinstance(usage, dict)

        def count(key: str) -> int:
            value = usage.get(key)
            return value if is_count(value) and value > 0 else 0

        cache_creation = usage.get("cache_creation")
        one_hour: int | None = None
        if isinstance(cache_creation, dict) and is_count(cache_creation.get("ephemeral_1h_input_tokens")):
            one_hour = max(0, int(cache_creation["ephemeral_1h_input_tokens"]))
        speed = usage.get("speed")
        if not (isinstance(speed, str) and speed_valid(speed)):
            speed = SPEED_STANDARD if usage.get("service_tier") == "standard" else None
        input_tokens = count("input_tokens")
        output_tokens = count("output_tokens")
        cache_read = count("cache_read_input_tokens")
        cache_write = count("cache_creation_input_tokens")
        model = message.get("model")
        stop_reason = message.get("stop_reason")
        return ModelInvocation(
            id=invocation_id,
            session_id=self.session_id,
            user_input_id=user_input_id,
            parent_model_invocation_id=self.last_invocation if invocation_id != self.last_invocation else None,
            model=model if isinstance(model, str) else None,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cache_read_tokens=cache_read,
            cache_write_tokens=cache_write,
            cache_write_1h_tokens=min(one_hour, cache_write) if one_hour is not None else None,
            total_tokens=input_tokens + output_tokens + cache_read + cache_write,
            token_basis=TokenBasis.REPORTED if usage else TokenBasis.UNKNOWN,
            speed=speed,
            stop_reason=stop_reason if isinstance(stop_reason, str) else None,
            started_at=started,
        )

    def _assistant_block(self, line: _Line, block: dict[str, Any], owner: ModelInvocation) -> None:
        kind = block.get("type")
        when = parse_time(line.record.get("timestamp"))
        if kind == "tool_use" and isinstance(block.get("id"), str):
            vendor_tool_id = str(block["id"])
            tool_use_id = mint_id("tool_use", VENDOR, self.top, vendor_tool_id)
            if tool_use_id in self.b.tool_uses:
                return
            name = str(block.get("name", ""))
            self.b.tool_uses[tool_use_id] = ToolUse(
                id=tool_use_id,
                session_id=self.session_id,
                user_input_id=owner.user_input_id,
                model_invocation_id=owner.id,
                name=name,
                verb=tool_verb(name),
                input=raw_json(block.get("input")),
                status=ToolStatus.NO_RESULT,
                metadata=raw_json({}),
                timestamp=when,
            )
            self.b.vendor_id(
                EntityType.TOOL_USE,
                tool_use_id,
                self.session_id,
                "tool_use_id",
                vendor_tool_id,
                line.source_ref,
            )
            return
        # Content hash, not position: a rewrite of the response repeats the block verbatim.
        digest = hashlib.sha256(msgspec.json.encode(block)).hexdigest()[:32]
        message_id = mint_id("assistant_message", VENDOR, self.top, owner.id, digest)
        if message_id in self.b.messages:
            return
        text = block.get("text") if kind == "text" else None
        self.b.messages[message_id] = AssistantMessage(
            id=message_id,
            session_id=self.session_id,
            user_input_id=owner.user_input_id,
            model_invocation_id=owner.id,
            text=text if isinstance(text, str) else None,
            content=None if isinstance(text, str) else raw_json(block),
            timestamp=when,
        )
        self.b.vendor_id(
            EntityType.ASSISTANT_MESSAGE,
            message_id,
            self.session_id,
            "uuid",
            line.record.get("uuid"),
            line.source_ref,
        )

    # tool results

    def _tool_result(self, line: _Line, block: dict[str, Any]) -> None:
        vendor_tool_id = str(block.get("tool_use_id"))
        tool_use_id = mint_id("tool_use", VENDOR, self.top, vendor_tool_id)
        tool_use = self.b.tool_uses.get(tool_use_id)
        if tool_use is None or tool_use_id in self.b.tool_results:
            return
        structured = line.record.get("toolUseResult")
        text = _result_text(block)
        interrupted = (isinstance(structured, dict) and structured.get("interrupted") is True) or (
            block.get("is_error") is True and text is not None and (REJECTED_MARKER in text or INTERRUPT_MARKER in text)
        )
        if interrupted:
            status = ToolStatus.INTERRUPTED
        elif block.get("is_error") is True:
            status = ToolStatus.ERROR
        else:
            status = ToolStatus.OK
        output: Any = structured
        if isinstance(structured, dict):
            output = {k: v for k, v in structured.items() if k not in BULKY_RESULT_KEYS}
        result_id = mint_id("tool_result", VENDOR, self.top, vendor_tool_id)
        self.b.add_result(
            ToolResult(
                id=result_id,
                tool_use_id=tool_use_id,
                session_id=tool_use.session_id,
                user_input_id=tool_use.user_input_id,
                status=status,
                output_text=text if status == ToolStatus.OK else None,
                output=raw_json(output) if output is not None else None,
                error_text=text if status != ToolStatus.OK else None,
                timestamp=parse_time(line.record.get("timestamp")),
            )
        )
        self.b.vendor_id(
            EntityType.TOOL_RESULT,
            result_id,
            tool_use.session_id,
            "tool_use_id",
            vendor_tool_id,
            line.source_ref,
        )
        if status == ToolStatus.OK:
            self._file_touch(tool_use, structured)

    def _file_touch(self, tool_use: ToolUse, structured: Any) -> None:
        if not tool_use.verb.file_verb() or tool_use.verb == ToolVerb.SEARCH:
            return
        tool_input: Any = msgspec.json.decode(tool_use.input)
        if not isinstance(tool_input, dict):
            return
        path = tool_input.get("file_path") or tool_input.get("notebook_path")
        if not isinstance(path, str) or not path:
            return
        start: int | None = None
        end: int | None = None
        hunks: list[Hunk] | None = None
        if tool_use.verb == ToolVerb.READ:
            kind = TouchKind.READ
            read = structured.get("file") if isinstance(structured, dict) else None
            if isinstance(read, dict) and is_count(read.get("startLine")):
                start = read["startLine"]
                lines_read = read.get("numLines")
                end = start + lines_read - 1 if is_count(lines_read) and lines_read > 0 else None
            elif is_count(tool_input.get("offset")):
                start = tool_input["offset"]
                limit = tool_input.get("limit")
                end = start + limit - 1 if is_count(limit) and limit > 0 else None
        else:
            kind = TouchKind.EDIT
            patch = structured.get("structuredPatch") if isinstance(structured, dict) else None
            if isinstance(patch, list):
                hunks = [
                    Hunk(
                        old_start=int(h.get("oldStart", 0)),
                        old_lines=int(h.get("oldLines", 0)),
                        new_start=int(h.get("newStart", 0)),
                        new_lines=int(h.get("newLines", 0)),
                        lines=[str(x) for x in h.get("lines", [])] or None,
                    )
                    for h in patch
                    if isinstance(h, dict)
                ] or None
        touch_id = mint_id("file_touch", VENDOR, self.top, tool_use.id, path, kind.value)
        self.b.file_touches.setdefault(
            touch_id,
            FileTouch(
                id=touch_id,
                tool_use_id=tool_use.id,
                user_input_id=tool_use.user_input_id,
                session_id=tool_use.session_id,
                path=path,
                kind=kind,
                start_line=start,
                end_line=end,
                hunks=hunks,
            ),
        )


def _stream_start(stream: _Stream) -> Any:
    return next((t for t in (parse_time(x.record.get("timestamp")) for x in stream.lines) if t), None)


def _last_value(stream: _Stream, key: str) -> str | None:
    value = next(
        (x.record[key] for x in reversed(stream.lines) if isinstance(x.record.get(key), str) and x.record[key]),
        None,
    )
    return str(value) if value is not None else None


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
    root_stream: _Stream,
    root_session_id: str,
    children: dict[str, list[tuple[str, str]]],
    subagents: dict[str, _Stream],
    root_origin: InputOrigin,
) -> None:
    """Read a stream and, breadth first, every subagent it spawned, parents before children."""
    queue: list[tuple[_Stream, str, InputOrigin]] = [(root_stream, root_session_id, root_origin)]
    while queue:
        stream, session_id, origin = queue.pop(0)
        reader = _SessionReader(builder, top_key, session_id, stream.key, origin)
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
                started_at=_stream_start(child),
                title=_spawn_description(builder, tool_use_id),
                working_dir=_last_value(child, "cwd"),
                git_branch=_last_value(child, "gitBranch"),
                outcome=Outcome.UNKNOWN,
            )
            builder.vendor_id(EntityType.SESSION, child_id, child_id, "agent_id", child.agent_id)
            queue.append((child, child_id, InputOrigin.AGENT))


def _read_claude_file(path: Path, warn: Warn) -> list[ImportedSession]:
    """Read one session transcript with its subagents; an agent file reads its owner session.

    Returns the session's graph first, then one graph per subagent transcript whose spawning
    call could not be found. An agent file whose session transcript is missing yields nothing.
    """
    session_path: Path | None = path
    if is_claude_agent_file(path):
        session_path = claude_owner_session_file(path)
    if session_path is None:
        return []
    agent_files = claude_agent_files(session_path)
    main_lines = _decode_lines(session_path, warn)
    main, subagents = _split_streams(main_lines, agent_files, warn)
    vendor_session = next(
        (str(x.record["sessionId"]) for x in main.lines if isinstance(x.record.get("sessionId"), str)),
        session_path.stem,
    )
    links = _link_spawns(main, subagents)
    children: dict[str, list[tuple[str, str]]] = {}
    for child_key, (parent_key, vendor_tool_id) in links.items():
        children.setdefault(parent_key, []).append((child_key, vendor_tool_id))
    source_bytes = sum(p.stat().st_size for p in [session_path, *agent_files] if p.is_file())
    project = session_path.parent.name

    builder = GraphBuilder(VENDOR)
    session_id = mint_id("session", VENDOR, vendor_session)
    builder.sessions[session_id] = Session(
        id=session_id,
        parent_session_id=None,
        spawned_by_tool_use_id=None,
        started_at=_stream_start(main),
        working_dir=_last_value(main, "cwd"),
        git_branch=_last_value(main, "gitBranch"),
        outcome=Outcome.UNKNOWN,
    )
    builder.vendor_id(EntityType.SESSION, session_id, session_id, "session_id", vendor_session)
    _read_tree(builder, vendor_session, main, session_id, children, subagents, InputOrigin.HUMAN)
    linked = {s.spawned_by_tool_use_id for s in builder.sessions.values() if s.spawned_by_tool_use_id}
    _settle_spawn_metadata(builder, {t for t in linked if t is not None})
    imported = [_imported(builder, project, session_path, source_bytes)]

    nested_keys = {k for k in subagents if mint_id("session", VENDOR, vendor_session, k) in builder.sessions}
    for key, stream in subagents.items():
        if key in nested_keys or key in links:
            continue
        orphan = GraphBuilder(VENDOR)
        orphan_id = mint_id("session", VENDOR, vendor_session, key)
        orphan.sessions[orphan_id] = Session(
            id=orphan_id,
            parent_session_id=None,
            spawned_by_tool_use_id=None,
            started_at=_stream_start(stream),
            working_dir=_last_value(stream, "cwd"),
            git_branch=_last_value(stream, "gitBranch"),
            outcome=Outcome.UNKNOWN,
        )
        orphan.vendor_id(EntityType.SESSION, orphan_id, orphan_id, "agent_id", stream.agent_id or key)
        orphan.attribute(orphan_id, "sessionId", vendor_session, _stream_start(stream))
        _read_tree(orphan, vendor_session, stream, orphan_id, children, subagents, InputOrigin.SYSTEM)
        linked = {s.spawned_by_tool_use_id for s in orphan.sessions.values() if s.spawned_by_tool_use_id}
        _settle_spawn_metadata(orphan, {t for t in linked if t is not None})
        imported.append(_imported(orphan, project, session_path, source_bytes))
    return imported


def _imported(builder: GraphBuilder, project: str, source: Path, source_bytes: int) -> ImportedSession:
    graph = builder.finish()
    root = graph.root()
    return ImportedSession(
        graph=graph,
        vendor=VENDOR,
        project=project,
        branch=root.git_branch if root is not None else None,
        source_path=source,
        source_bytes=source_bytes,
    )


def read_claude(root: Path) -> Iterator[ImportedSession]:
    """Every session tree under a ``~/.claude``-style folder, one Graph per top-level session."""
    for session_path in claude_session_files(root):
        yield from read_claude_file(session_path)


def read_claude_file(path: Path, warn: Warn | None = None) -> list[ImportedSession]:
    """Read one transcript (see `_read_claude_file`); content of an unexpected shape is a `TranscriptError`.

    `warn` hears of what was skipped (a line over `MAX_LINE_BYTES`, a file that is not a regular
    file); without it, such warnings are logged.
    """
    with shape_errors_as_transcript_errors(path):
        return _read_claude_file(path, warn or log_warning)
