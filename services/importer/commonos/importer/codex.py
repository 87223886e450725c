"""Codex rollouts (``~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl``) to session graphs.

Accounting: one ModelInvocation per model API call, with the usage the API reported for it. Codex
has written calls' usage in two layouts, and a rollout may hold either:

* Up to the 0.5x releases, an ``event_msg``/``token_count`` is written *before* the reply's items
  (reasoning, messages, tool calls), and often again unchanged; ``total_token_usage`` is cumulative
  but resets when a session is resumed or enters review mode. So each *distinct* token_count (one
  whose ``info`` differs from the token_count before it) opens an invocation from its
  ``last_token_usage``, and the items after it belong to it.
* From 0.169 (seen in 0.171), a call's items come *first*, then a ``token_usage_record`` line
  (``usage`` is the call's, with a ``response_id``), then a token_count repeating the same usage;
  its usage carries ``cache_write_input_tokens`` and its ``info`` ``last_usage_includes_reasoning``.
  The first item of a call opens its invocation, and the usage closes it: the record fills the open
  invocation (or makes one when the call wrote no item), and the token_count that repeats the
  record's usage is the same call, skipped. A token_count of the new shape without a record before
  it closes the call the same way; an old-shape token_count never fills an open invocation, so old
  rollouts keep their counts.

The session's usage is the sum of the invocations, never a cumulative total. ``world_state``,
``thread_settings_applied``, ``item_completed`` and the other lines that carry nothing the graph
stores are passed over silently.

Token convention: Codex's ``input_tokens`` *includes* ``cached_input_tokens`` (and, we take it,
``cache_write_input_tokens``: the API's input is the whole prompt) and its ``output_tokens``
*includes* ``reasoning_output_tokens``. The graph's ModelInvocation stores ``input_tokens`` = Codex
input − cached input − cache write (never below 0), ``cache_read_tokens`` = cached input,
``cache_write_tokens`` = ``cache_write_input_tokens`` (0 when absent), ``output_tokens`` = Codex
output, ``reasoning_tokens`` = ``reasoning_output_tokens`` (None when absent), and
``total_tokens`` = input + output + cache read + cache write. ``last_usage_includes_reasoning`` does
not decide the split: Codex 0.171 writes ``false`` while copying the API's ``output_tokens``
(reasoning included, ``total_tokens`` = input + output) unchanged. Only when the figures themselves
show reasoning outside the output (reasoning > output, or ``total_tokens`` = input + output +
reasoning) is reasoning added to ``output_tokens``.

Ids: Codex records carry no per-item uuid, so user inputs and invocations are minted from the
session id and their ordinal among user messages / distinct token_counts; the rollout is
append-only, so those ordinals never shift when it grows. Tool calls use Codex's ``call_id``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import msgspec

from commonos.importer.builder import GraphBuilder, is_count, parse_time, raw_json, short_title
from commonos.importer.discover import readable
from commonos.importer.lines import Warn, json_object_lines, log_warning
from commonos.importer.model import ImportedSession, shape_errors_as_transcript_errors
from commonos.importer.source import Source
from commonos.proto.graph import (
    AssistantMessage,
    EntityType,
    FileTouch,
    Hunk,
    InputKind,
    InputOrigin,
    ModelInvocation,
    Outcome,
    Session,
    TokenBasis,
    ToolStatus,
    ToolUse,
    ToolVerb,
    TouchKind,
    UserInput,
    mint_id,
)
from commonos.proto.graph.ids import vendor_session_id
from commonos.proto.vendors import CODEX

#: The vendor's name in graphs, events and tags.
VENDOR: Final = CODEX

TOOL_VERBS: dict[str, ToolVerb] = {
    "shell": ToolVerb.EXECUTE,
    "exec_command": ToolVerb.EXECUTE,
    "local_shell": ToolVerb.EXECUTE,
    "container.exec": ToolVerb.EXECUTE,
    "unified_exec": ToolVerb.EXECUTE,
    "apply_patch": ToolVerb.EDIT,
    "read_file": ToolVerb.READ,
    "view_image": ToolVerb.READ,
    "grep_files": ToolVerb.SEARCH,
    "list_dir": ToolVerb.SEARCH,
}
TOOL_CALL_TYPES = frozenset({"function_call", "custom_tool_call", "local_shell_call"})
TOOL_OUTPUT_TYPES = frozenset({"function_call_output", "custom_tool_call_output"})
IDE_REQUEST_HEADING = "## My request for Codex:"
REJECTED_OUTPUTS = ("exec command rejected by user", "aborted")
_PATCH_FILE = re.compile(r"^\*\*\* (Update|Add|Delete) File: (.+)$")
_PATCH_MOVE = re.compile(r"^\*\*\* Move to: (.+)$")


def tool_verb(name: str, arguments: Any) -> ToolVerb:
    """Normalize a Codex tool name; a shell call that runs ``apply_patch`` is an edit."""
    if name in ("shell", "exec_command", "local_shell") and _shell_patch(arguments) is not None:
        return ToolVerb.EDIT
    return TOOL_VERBS.get(name, ToolVerb.OTHER)


def _shell_patch(arguments: Any) -> str | None:
    command = arguments.get("command") if isinstance(arguments, dict) else None
    if isinstance(command, list) and len(command) >= 2 and command[0] in ("apply_patch", "applypatch"):
        return str(command[1])
    return None


def parse_patch(patch: str) -> dict[str, list[Hunk]]:
    """Hunks per file of a Codex ``*** Begin Patch`` envelope.

    Codex patches locate hunks by context, not line numbers, so ``old_start``/``new_start`` are 0
    (unknown); ``old_lines`` counts context and removed lines, ``new_lines`` context and added.
    """
    files: dict[str, list[Hunk]] = {}
    current: str | None = None
    lines: list[str] = []

    def close() -> None:
        if current is not None and lines:
            old = sum(1 for x in lines if x[:1] in (" ", "-"))
            new = sum(1 for x in lines if x[:1] in (" ", "+"))
            files.setdefault(current, []).append(
                Hunk(old_start=0, old_lines=old, new_start=0, new_lines=new, lines=list(lines))
            )
        lines.clear()

    for line in patch.splitlines():
        header = _PATCH_FILE.match(line)
        moved = _PATCH_MOVE.match(line)
        if header:
            close()
            current = header.group(2).strip()
            files.setdefault(current, [])
        elif moved and current is not None:
            close()
            files[moved.group(1).strip()] = files.pop(current)
            current = moved.group(1).strip()
        elif line.startswith("@@") or line.startswith("*** "):
            close()
        elif current is not None and line[:1] in (" ", "-", "+"):
            lines.append(line)
    close()
    return files


class _RolloutReader:
    def __init__(self, path: Path, session_id: str, vendor_session: str) -> None:
        self.path = path
        self.b = GraphBuilder(VENDOR)
        self.session_id = session_id
        self.vendor_session = vendor_session
        self.current_input: str | None = None
        self.current_invocation: str | None = None
        self.last_invocation: str | None = None
        self.previous_info: bytes | None = None
        #: An invocation opened by a call's items and waiting for its usage (the 0.169+ layout).
        self.open_invocation: str | None = None
        #: The usage of the last token_usage_record, until the token_count that repeats it.
        self.recorded_usage: bytes | None = None
        self.invocation_ordinal = 0
        self.input_ordinal = 0
        self.model: str | None = None
        self.first_prompt: str | None = None
        self.has_user_events = False

    def read(self, records: list[tuple[dict[str, Any], str]]) -> None:
        self.has_user_events = any(
            r.get("type") == "event_msg" and _payload(r).get("type") == "user_message" for r, _ in records
        )
        for record, ref in records:
            payload = _payload(record)
            when = parse_time(record.get("timestamp"))
            kind = record.get("type")
            ptype = payload.get("type")
            if kind == "turn_context":
                self._turn_context(payload, when)
            elif kind == "event_msg" and ptype == "user_message":
                self._user_input(str(payload.get("message", "")), when, ref)
            elif kind == "event_msg" and ptype == "turn_aborted":
                self.b.mark_interrupted(self.current_input)
            elif kind == "event_msg" and ptype == "token_count":
                self._token_count(payload, when, ref)
            elif kind == "token_usage_record":
                self._usage_record(payload, when, ref)
            elif kind == "response_item" and ptype == "message":
                self._message(payload, when, ref)
            elif kind == "response_item" and ptype in TOOL_CALL_TYPES:
                self._tool_call(payload, when, ref)
            elif kind == "response_item" and ptype in TOOL_OUTPUT_TYPES:
                self._tool_output(payload, when, ref)

    def _turn_context(self, payload: dict[str, Any], when: datetime | None) -> None:
        for key in ("model", "cwd", "approval_policy", "effort"):
            value = payload.get(key)
            if isinstance(value, str) and value:
                self.b.attribute(self.session_id, key, value, when)
        if isinstance(payload.get("model"), str):
            self.model = payload["model"]

    def _user_input(self, text: str, when: datetime | None, ref: str) -> None:
        ordinal = self.input_ordinal
        self.input_ordinal += 1
        input_id = mint_id("user_input", VENDOR, self.vendor_session, str(ordinal))
        stripped = text.lstrip()
        kind = InputKind.SLASH_COMMAND if stripped.startswith("/") else InputKind.PROMPT
        self.b.user_inputs[input_id] = UserInput(
            id=input_id,
            session_id=self.session_id,
            ordinal=self.b.next_ordinal(self.session_id),
            text=text,
            triggered_at=when,
            interrupted=False,
            kind=kind,
            origin=InputOrigin.HUMAN,
            metadata=raw_json({}),
        )
        self.b.vendor_id(EntityType.USER_INPUT, input_id, self.session_id, "user_message", ref, ref)
        if self.first_prompt is None and text.strip():
            # The VS Code extension prefixes IDE context; the request follows this heading.
            self.first_prompt = text.split(IDE_REQUEST_HEADING, 1)[-1]
        self.current_input = input_id
        self.current_invocation = None
        self.open_invocation = None

    def _input_for(self, when: datetime | None) -> str:
        if self.current_input is not None:
            return self.current_input
        input_id = mint_id("user_input", VENDOR, self.vendor_session, "implicit")
        self.b.user_inputs[input_id] = UserInput(
            id=input_id,
            session_id=self.session_id,
            ordinal=self.b.next_ordinal(self.session_id),
            text="",
            triggered_at=when,
            interrupted=False,
            kind=InputKind.OTHER,
            origin=InputOrigin.UNKNOWN,
            metadata=raw_json({}),
        )
        self.current_input = input_id
        return input_id

    def _token_count(self, payload: dict[str, Any], when: datetime | None, ref: str) -> None:
        info = payload.get("info")
        if not isinstance(info, dict) or not isinstance(info.get("last_token_usage"), dict):
            return
        last = info["last_token_usage"]
        identity = msgspec.json.encode([info.get("total_token_usage"), last], order="sorted")
        if identity == self.previous_info:
            return
        self.previous_info = identity
        if self.recorded_usage is not None and msgspec.json.encode(last, order="sorted") == self.recorded_usage:
            self.recorded_usage = None  # the call the token_usage_record before it counted
            return
        closes = "last_usage_includes_reasoning" in info or "cache_write_input_tokens" in last
        spent = ("input_tokens", "cached_input_tokens", "cache_write_input_tokens", "output_tokens")
        if closes and not any(is_count(last.get(key)) and last[key] > 0 for key in spent):
            return  # no call: after a compaction Codex reports the new context's size with nothing spent
        self._usage(last, when, ref, "token_count", closes=closes)

    def _usage_record(self, payload: dict[str, Any], when: datetime | None, ref: str) -> None:
        usage = payload.get("usage")
        if not isinstance(usage, dict):
            return
        self.recorded_usage = msgspec.json.encode(usage, order="sorted")
        invocation_id = self._usage(usage, when, ref, "token_usage_record", closes=True)
        # The API's id of the response: the key that counts a call copied into another rollout once.
        self.b.vendor_id(
            EntityType.MODEL_INVOCATION, invocation_id, self.session_id, "response_id", payload.get("response_id"), ref
        )

    def _usage(self, usage: dict[str, Any], when: datetime | None, ref: str, kind: str, *, closes: bool) -> str:
        """One call's usage: it fills the invocation its items opened (`closes`) or opens one; its id."""

        def count(key: str) -> int:
            value = usage.get(key)
            return value if is_count(value) and value > 0 else 0

        cached = count("cached_input_tokens")
        written = count("cache_write_input_tokens")
        uncached = max(0, count("input_tokens") - cached - written)
        output = count("output_tokens")
        reasoning = count("reasoning_output_tokens") if is_count(usage.get("reasoning_output_tokens")) else None
        if reasoning and (reasoning > output or count("total_tokens") == count("input_tokens") + output + reasoning):
            output += reasoning  # the figures show reasoning reported beside the output, not in it
        opened = self.b.invocations.get(self.open_invocation) if closes and self.open_invocation else None
        if opened is not None:
            invocation_id = opened.id
        else:
            invocation_id = mint_id("model_invocation", VENDOR, self.vendor_session, str(self.invocation_ordinal))
            self.invocation_ordinal += 1
        self.b.invocations[invocation_id] = ModelInvocation(
            id=invocation_id,
            session_id=self.session_id,
            user_input_id=opened.user_input_id if opened is not None else self._input_for(when),
            parent_model_invocation_id=opened.parent_model_invocation_id
            if opened is not None
            else self.last_invocation,
            model=(opened.model if opened is not None else None) or self.model,
            input_tokens=uncached,
            output_tokens=output,
            reasoning_tokens=reasoning,
            cache_read_tokens=cached,
            cache_write_tokens=written,
            total_tokens=uncached + output + cached + written,
            token_basis=TokenBasis.REPORTED,
            started_at=opened.started_at if opened is not None else when,
        )
        self.b.vendor_id(EntityType.MODEL_INVOCATION, invocation_id, self.session_id, kind, ref, ref)
        self.open_invocation = None
        self.last_invocation = invocation_id
        # Old layout: the items after the usage are this call's. New layout: the next item opens a call.
        self.current_invocation = None if closes else invocation_id
        return invocation_id

    def _invocation_for(self, when: datetime | None, anchor: str) -> ModelInvocation:
        """The reply that produced an item: Codex writes a reply's token_count before its items."""
        if self.current_invocation is not None:
            return self.b.invocations[self.current_invocation]
        invocation_id = mint_id("model_invocation", VENDOR, self.vendor_session, "unmetered", anchor)
        if invocation_id not in self.b.invocations:
            self.b.invocations[invocation_id] = ModelInvocation(
                id=invocation_id,
                session_id=self.session_id,
                user_input_id=self._input_for(when),
                parent_model_invocation_id=self.last_invocation,
                model=self.model,
                input_tokens=0,
                output_tokens=0,
                cache_read_tokens=0,
                cache_write_tokens=0,
                total_tokens=0,
                token_basis=TokenBasis.UNKNOWN,
                started_at=when,
            )
            self.last_invocation = invocation_id
            self.open_invocation = invocation_id
        self.current_invocation = invocation_id
        return self.b.invocations[invocation_id]

    def _message(self, payload: dict[str, Any], when: datetime | None, ref: str) -> None:
        role = payload.get("role")
        content = payload.get("content")
        blocks = [c for c in content if isinstance(c, dict)] if isinstance(content, list) else []
        text = "\n".join(str(c.get("text", "")) for c in blocks if "text" in c)
        if role == "user":
            # Older rollouts have no user_message events; skip the harness's own context blocks.
            if not self.has_user_events and text and not text.lstrip().startswith(("<", "# AGENTS.md")):
                self._user_input(text, when, ref)
            return
        if role != "assistant" or not text:
            return
        owner = self._invocation_for(when, ref)
        message_id = mint_id("assistant_message", VENDOR, self.vendor_session, ref)
        self.b.messages[message_id] = AssistantMessage(
            id=message_id,
            session_id=self.session_id,
            user_input_id=owner.user_input_id,
            model_invocation_id=owner.id,
            text=text,
            timestamp=when,
        )

    def _tool_call(self, payload: dict[str, Any], when: datetime | None, ref: str) -> None:
        call_id = payload.get("call_id") or payload.get("id")
        if not isinstance(call_id, str):
            return
        tool_use_id = mint_id("tool_use", VENDOR, self.vendor_session, call_id)
        if tool_use_id in self.b.tool_uses:
            return
        name = str(payload.get("name") or ("local_shell" if payload.get("type") == "local_shell_call" else ""))
        arguments: Any
        if payload.get("type") == "local_shell_call":
            arguments = payload.get("action")
        elif payload.get("type") == "custom_tool_call":
            arguments = payload.get("input")
        else:
            try:
                arguments = msgspec.json.decode(str(payload.get("arguments", "null")))
            except msgspec.DecodeError:
                arguments = payload.get("arguments")
        owner = self._invocation_for(when, ref)
        self.b.tool_uses[tool_use_id] = ToolUse(
            id=tool_use_id,
            session_id=self.session_id,
            user_input_id=owner.user_input_id,
            model_invocation_id=owner.id,
            name=name,
            verb=tool_verb(name, arguments),
            input=raw_json(arguments),
            status=ToolStatus.NO_RESULT,
            metadata=raw_json({}),
            timestamp=when,
        )
        self.b.vendor_id(EntityType.TOOL_USE, tool_use_id, self.session_id, "call_id", call_id, ref)

    def _tool_output(self, payload: dict[str, Any], when: datetime | None, ref: str) -> None:
        call_id = payload.get("call_id")
        if not isinstance(call_id, str):
            return
        tool_use_id = mint_id("tool_use", VENDOR, self.vendor_session, call_id)
        tool_use = self.b.tool_uses.get(tool_use_id)
        if tool_use is None:
            return
        raw_output = payload.get("output")
        structured: Any = raw_output
        if isinstance(raw_output, str):
            try:
                structured = msgspec.json.decode(raw_output)
            except msgspec.DecodeError:
                structured = raw_output
        text = structured.get("output") if isinstance(structured, dict) else structured
        text = text if isinstance(text, str) else None
        metadata = structured.get("metadata") if isinstance(structured, dict) else None
        exit_code = metadata.get("exit_code") if isinstance(metadata, dict) else None
        if text is not None and text.strip().startswith(REJECTED_OUTPUTS):
            status = ToolStatus.INTERRUPTED
        elif is_count(exit_code) and exit_code != 0:
            status = ToolStatus.ERROR
        else:
            status = ToolStatus.OK
        result_id = mint_id("tool_result", VENDOR, self.vendor_session, call_id)
        self.b.result_of(tool_use, result_id, status, text, structured if isinstance(structured, dict) else None, when)
        self.b.vendor_id(EntityType.TOOL_RESULT, result_id, self.session_id, "call_id", call_id, ref)
        if status == ToolStatus.OK and tool_use.verb == ToolVerb.EDIT:
            self._patch_touches(tool_use)

    def _patch_touches(self, tool_use: ToolUse) -> None:
        arguments: Any = msgspec.json.decode(tool_use.input)
        patch = arguments if isinstance(arguments, str) else _shell_patch(arguments)
        if patch is None and isinstance(arguments, dict) and isinstance(arguments.get("input"), str):
            patch = arguments["input"]
        if patch is None:
            return
        for path, hunks in parse_patch(patch).items():
            touch_id = mint_id("file_touch", VENDOR, tool_use.id, path, TouchKind.EDIT.value)
            self.b.file_touches[touch_id] = FileTouch(
                id=touch_id,
                tool_use_id=tool_use.id,
                user_input_id=tool_use.user_input_id,
                session_id=self.session_id,
                path=path,
                kind=TouchKind.EDIT,
                hunks=hunks or None,
            )


def _payload(record: dict[str, Any]) -> dict[str, Any]:
    payload = record.get("payload")
    return payload if isinstance(payload, dict) else {}


def _session_id_from_name(path: Path) -> str:
    match = re.search(r"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$", path.stem)
    return match.group(1) if match else path.stem


def _read_codex_file(path: Path, warn: Warn, profile: str) -> ImportedSession | None:
    """Read one rollout as one top-level session graph; None when the file holds no records or is gone."""
    records, source_bytes = json_object_lines(path, warn)
    if not records:
        return None
    meta = next((_payload(r) for r, _ in records if r.get("type") == "session_meta"), {})
    vendor_session = str(meta.get("id") or _session_id_from_name(path))
    git = meta.get("git") if isinstance(meta.get("git"), dict) else {}
    assert isinstance(git, dict)
    cwd = meta.get("cwd") if isinstance(meta.get("cwd"), str) else None
    branch = git.get("branch") if isinstance(git.get("branch"), str) else None
    started = parse_time(meta.get("timestamp")) or parse_time(records[0][0].get("timestamp"))

    session_id = vendor_session_id(VENDOR, profile, vendor_session)
    reader = _RolloutReader(path, session_id, vendor_session)
    builder = reader.b
    builder.sessions[session_id] = Session(
        id=session_id,
        parent_session_id=None,
        spawned_by_tool_use_id=None,
        started_at=started,
        working_dir=cwd,
        git_branch=branch,
        outcome=Outcome.UNKNOWN,
    )
    builder.vendor_id(EntityType.SESSION, session_id, session_id, "session_id", vendor_session)
    for key in ("originator", "cli_version"):
        if isinstance(meta.get(key), str):
            builder.attribute(session_id, key, meta[key], started)
    if git:
        builder.attribute(session_id, "git", git, started)
    reader.read(records)
    title = short_title(reader.first_prompt) if reader.first_prompt else None
    builder.sessions[session_id] = msgspec.structs.replace(builder.sessions[session_id], title=title)
    project = _basename(cwd)
    return ImportedSession(
        graph=builder.finish(),
        vendor=VENDOR,
        project=project,
        branch=branch,
        source_path=path,
        source_bytes=source_bytes,
    )


def _basename(cwd: str | None) -> str | None:
    """Last component of a POSIX or Windows working directory."""
    if not cwd:
        return None
    return re.split(r"[\\/]", cwd.rstrip("\\/"))[-1] or None


def read_codex(root: Path) -> Iterator[ImportedSession]:
    """Every rollout under a ``~/.codex``-style folder, one Graph per rollout."""
    for path in codex_rollout_files(root):
        imported = read_codex_file(path)
        if imported is not None:
            yield imported


def read_codex_file(path: Path, warn: Warn | None = None, profile: str | None = None) -> ImportedSession | None:
    """Read one transcript (see `_read_codex_file`) as `profile`'s (None: the vendor's default profile,
    ``codex``); content of an unexpected shape is a `TranscriptError`.

    `warn` hears of what was skipped (a line over `MAX_LINE_BYTES`, a file that is not a regular
    file); without it, such warnings are logged. The profile is part of the session's id
    (`vendor_session_id`), as the OTLP gateway mints it for the same conversation's telemetry.
    """
    with shape_errors_as_transcript_errors(path):
        return _read_codex_file(path, warn or log_warning, profile or VENDOR)


def read_codex_trees(path: Path, warn: Warn | None = None, profile: str | None = None) -> list[ImportedSession]:
    """`read_codex_file` as a `Source` reads: the rollout's one tree, or none."""
    imported = read_codex_file(path, warn, profile)
    return [imported] if imported is not None else []


# --- where rollouts are ---------------------------------------------------------------------------


def codex_candidates(root: Path) -> list[Path]:
    """Every name under a Codex folder that looks like a rollout, whatever kind of file it is."""
    sessions = root / "sessions" if (root / "sessions").is_dir() else root
    return sorted(sessions.rglob("rollout-*.jsonl"))


def codex_rollout_files(root: Path) -> Iterator[Path]:
    """Every Codex rollout under ``~/.codex`` (or its ``sessions`` folder, or any folder below)."""
    yield from readable(codex_candidates(root))


#: Codex for `cos import codex` (listed in `commonos.importer.vendors`).
SOURCE: Final = Source(
    command="codex",
    vendor=VENDOR,
    label="Codex",
    default_root="~/.codex",
    top_files=lambda root: list(codex_rollout_files(root)),
    candidates=codex_candidates,
    read=read_codex_trees,
    layout="sessions/YYYY/MM/DD/rollout-*.jsonl",
)
