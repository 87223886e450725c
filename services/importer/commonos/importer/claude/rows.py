"""Building the graph's rows of one session from its lines (`SessionReader`)."""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from commonos.importer.builder import GraphBuilder, is_count, parse_time, raw_json, short_title
from commonos.importer.claude.format import (
    BULKY_RESULT_KEYS,
    COMMAND_NAME,
    IDE_CONTEXT_PREFIXES,
    INTERRUPT_MARKER,
    REJECTED_MARKER,
    SYNTHETIC_MODEL,
    VENDOR,
    tool_verb,
)
from commonos.importer.claude.records import Line, content_of, message_of, result_text, text_of
from commonos.proto.graph import (
    SPEED_STANDARD,
    AssistantMessage,
    EntityType,
    FileTouch,
    Hunk,
    InputKind,
    InputOrigin,
    ModelInvocation,
    TokenBasis,
    ToolStatus,
    ToolUse,
    ToolVerb,
    TouchKind,
    UserInput,
    mint_id,
    speed_valid,
)


class SessionReader:
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
        self.pending: list[Line] = []
        self.request_seen: set[str] = set()
        self.summaries: dict[str, str] = {}
        self.uuids: set[str] = set()
        self.first_prompt: str | None = None

    def read(self, lines: list[Line]) -> None:
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
        changed = [
            (key, value)
            for key in ("cwd", "gitBranch", "version")
            if isinstance(value := record.get(key), str)
            and value
            and self.b.attribute_changes(self.session_id, key, value)
        ]
        model = message_of(record).get("model")
        if (
            record.get("type") == "assistant"
            and isinstance(model, str)
            and model != SYNTHETIC_MODEL
            and self.b.attribute_changes(self.session_id, "model", model)
        ):
            changed.append(("model", model))
        if changed:
            when = parse_time(record.get("timestamp"))
            for key, value in changed:
                self.b.attribute(self.session_id, key, value, when)

    # user lines

    def _user(self, line: Line) -> None:
        record = line.record
        blocks = content_of(record)
        for block in blocks:
            if block.get("type") == "tool_result":
                self._tool_result(line, block)
        texts = [b for b in blocks if b.get("type") == "text"]
        if not texts or record.get("isMeta"):
            return
        text = text_of(texts)
        if text.startswith(INTERRUPT_MARKER):
            self._flush_pending(replay_of=None)
            self.b.mark_interrupted(self.current_input)
            self._new_input([line], InputKind.INTERRUPT, InputOrigin.HUMAN, text, {})
            return
        self.pending.append(line)

    def _classify(self, lines: list[Line]) -> tuple[InputKind, InputOrigin, str, dict[str, Any]]:
        texts: list[str] = []
        context: list[str] = []
        for line in lines:
            for block in content_of(line.record):
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
        self, lines: list[Line], kind: InputKind, origin: InputOrigin, text: str, metadata: dict[str, Any]
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
            # The prompt Claude Code's telemetry names too (``prompt.id``): its calls' turn. Of an input of
            # several lines (a compaction's summary, then the prompt), the last line's prompt is the one answered.
            for line in reversed(lines):
                prompt_id, vendor_session = line.record.get("promptId"), line.record.get("sessionId")
                if isinstance(prompt_id, str) and prompt_id and isinstance(vendor_session, str) and vendor_session:
                    self.b.input_prompts[input_id] = (vendor_session, prompt_id)
                    break
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

    def _implicit_input(self, line: Line) -> str:
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

    def _assistant(self, line: Line) -> None:
        record = line.record
        message = message_of(record)
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
        for block in content_of(record):
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

    def _assistant_block(self, line: Line, block: dict[str, Any], owner: ModelInvocation) -> None:
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

    def _tool_result(self, line: Line, block: dict[str, Any]) -> None:
        vendor_tool_id = str(block.get("tool_use_id"))
        tool_use_id = mint_id("tool_use", VENDOR, self.top, vendor_tool_id)
        tool_use = self.b.tool_uses.get(tool_use_id)
        if tool_use is None or tool_use_id in self.b.tool_results:
            return
        structured = line.record.get("toolUseResult")
        text = result_text(block)
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
        self.b.result_of(tool_use, result_id, status, text, output, parse_time(line.record.get("timestamp")))
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
