"""Accumulates one session tree while an adapter walks a transcript, then freezes it as a Graph.

Entities are keyed by their minted id, so seeing the same vendor record twice (a resumed
session's rewrite, a response repeated in a subagent file) lands on the same row instead of a
second one. Insertion order is kept, which gives parent-before-child order for free as long as
the adapter creates parents first.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any, TypeGuard

import msgspec

from commonos.proto.graph import (
    JSON_NULL,
    AssistantMessage,
    EntityType,
    FileTouch,
    Graph,
    InputKind,
    ModelInvocation,
    Outcome,
    Session,
    SessionAttribute,
    TokenUsage,
    ToolResult,
    ToolStatus,
    ToolUse,
    ToolVerb,
    UserInput,
    VendorID,
    mint_id,
)

_NOTHING = object()
_GIT_COMMIT = re.compile(r"\bgit\b[^\n;&|]*\bcommit\b")
TITLE_MAX_CHARS = 200


def is_count(value: object) -> TypeGuard[int]:
    """A JSON whole number (not a boolean, which Python counts as an int)."""
    return isinstance(value, int) and not isinstance(value, bool)


def parse_time(value: object) -> datetime | None:
    """Parse a vendor ISO-8601 timestamp; anything else is None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    # A timestamp without an offset is read as UTC, as the vendors write them, so all times compare.
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def raw_json(value: Any) -> msgspec.Raw:
    """Encode a decoded JSON value back to raw JSON for a JSON-valued graph field."""
    return msgspec.Raw(msgspec.json.encode(value))


def short_title(text: str) -> str | None:
    """First line of ``text``, trimmed to a title's length; None when there is no text."""
    stripped = text.strip()
    if not stripped:
        return None
    first = stripped.splitlines()[0].strip()
    return first[:TITLE_MAX_CHARS] or None


def is_git_commit(command: str) -> bool:
    """Report whether a shell command line runs ``git commit``."""
    return bool(_GIT_COMMIT.search(command))


class GraphBuilder:
    """Mutable accumulation of one session tree; ``finish`` returns the frozen Graph."""

    def __init__(self, vendor: str) -> None:
        self.vendor = vendor
        self.sessions: dict[str, Session] = {}
        self.attributes: dict[str, SessionAttribute] = {}
        self.user_inputs: dict[str, UserInput] = {}
        self.invocations: dict[str, ModelInvocation] = {}
        self.messages: dict[str, AssistantMessage] = {}
        self.tool_uses: dict[str, ToolUse] = {}
        self.tool_results: dict[str, ToolResult] = {}
        self.file_touches: dict[str, FileTouch] = {}
        self.token_usage: dict[str, TokenUsage] = {}
        self.vendor_ids: dict[tuple[str, str, str, str], VendorID] = {}
        #: The vendor's session and prompt ids of a user input, where its transcript names its prompt.
        self.input_prompts: dict[str, tuple[str, str]] = {}
        self._last_attribute: dict[tuple[str, str], bytes] = {}
        self._last_value: dict[tuple[str, str], object] = {}
        self._ordinals: dict[str, int] = {}

    def next_ordinal(self, session_id: str) -> int:
        ordinal = self._ordinals.get(session_id, 0)
        self._ordinals[session_id] = ordinal + 1
        return ordinal

    def vendor_id(
        self,
        our_type: EntityType,
        our_id: str,
        session_id: str,
        kind: str,
        value: str | None,
        source_ref: str | None = None,
    ) -> None:
        """Record that ``our_id`` is known to the vendor as ``value``; the first mapping wins.

        Only a string is an identifier: a transcript field of another type (a number where a uuid
        belongs) maps nothing, so the graph stays decodable.
        """
        if not value or not isinstance(value, str):
            return
        key = (str(our_type), self.vendor, kind, value)
        if key in self.vendor_ids:
            return
        self.vendor_ids[key] = VendorID(
            our_id=our_id,
            our_type=our_type,
            session_id=session_id,
            vendor=self.vendor,
            vendor_id_kind=kind,
            vendor_id=value,
            source_ref=source_ref,
        )

    def attribute_changes(self, session_id: str, key: str, value: Any) -> bool:
        """Whether `attribute` could add a row for this value (it differs from the last one seen)."""
        last = self._last_value.get((session_id, key), _NOTHING)
        return last is _NOTHING or type(last) is not type(value) or last != value

    def attribute(self, session_id: str, key: str, value: Any, valid_from: datetime | None) -> None:
        """Append a session attribute row when ``key`` takes a value different from its last one."""
        if valid_from is None:
            return
        if not self.attribute_changes(session_id, key, value):
            return  # the common case, told without encoding: a line repeats the session's attributes
        encoded = msgspec.json.encode(value)
        self._last_value[(session_id, key)] = value
        if self._last_attribute.get((session_id, key)) == encoded:
            return
        self._last_attribute[(session_id, key)] = encoded
        attribute_id = mint_id("session_attribute", session_id, key, valid_from.isoformat(), encoded.decode())
        self.attributes.setdefault(
            attribute_id,
            SessionAttribute(
                id=attribute_id,
                session_id=session_id,
                key=key,
                value=msgspec.Raw(encoded),
                valid_from=valid_from,
            ),
        )

    def result_of(
        self,
        tool_use: ToolUse,
        result_id: str,
        status: ToolStatus,
        text: str | None,
        output: Any,
        timestamp: datetime | None,
    ) -> None:
        """Attach a tool use's result (`add_result`): its text is the output of a use that succeeded and the
        error of one that did not; `output` is the structured result (JSON), if any."""
        ok = status == ToolStatus.OK
        self.add_result(
            ToolResult(
                id=result_id,
                tool_use_id=tool_use.id,
                session_id=tool_use.session_id,
                user_input_id=tool_use.user_input_id,
                status=status,
                output_text=text if ok else None,
                output=raw_json(output) if output is not None else None,
                error_text=None if ok else text,
                timestamp=timestamp,
            )
        )

    def add_result(self, result: ToolResult) -> None:
        """Attach the single result of a tool use and copy its status onto the use."""
        if result.tool_use_id in self.tool_results or result.tool_use_id not in self.tool_uses:
            return
        self.tool_results[result.tool_use_id] = result
        self.tool_uses[result.tool_use_id] = msgspec.structs.replace(
            self.tool_uses[result.tool_use_id], status=result.status
        )

    def mark_interrupted(self, user_input_id: str | None) -> None:
        if user_input_id is not None and user_input_id in self.user_inputs:
            self.user_inputs[user_input_id] = msgspec.structs.replace(self.user_inputs[user_input_id], interrupted=True)

    def outcome_of(self, session_id: str) -> Outcome:
        """Label how a session ended: commit evidence outranks interrupt evidence.

        committed: an execute tool use in the session ran ``git commit`` and returned ok.
        interrupted: the session's last user input is an interrupt or was interrupted.
        abandoned: the last input is a prompt that never got a model reply.
        unknown: anything else (the transcript does not say how it ended).
        """
        for tool_use in self.tool_uses.values():
            if (
                tool_use.session_id == session_id
                and tool_use.verb == ToolVerb.EXECUTE
                and tool_use.status == ToolStatus.OK
                and is_git_commit(_command_text(tool_use.input))
            ):
                return Outcome.COMMITTED
        inputs = [u for u in self.user_inputs.values() if u.session_id == session_id]
        if not inputs:
            return Outcome.UNKNOWN
        last = max(inputs, key=lambda u: u.ordinal)
        if last.kind == InputKind.INTERRUPT or last.interrupted:
            return Outcome.INTERRUPTED
        answered = {m.user_input_id for m in self.invocations.values()}
        if last.kind == InputKind.PROMPT and last.id not in answered:
            return Outcome.ABANDONED
        return Outcome.UNKNOWN

    def finish(self) -> Graph:
        """Freeze the accumulated rows; session outcomes and end times are settled here."""
        sessions = []
        for session in self.sessions.values():
            ended = [
                t
                for t in (
                    *(m.started_at for m in self.invocations.values() if m.session_id == session.id),
                    *(r.timestamp for r in self.tool_results.values() if r.session_id == session.id),
                    *(u.triggered_at for u in self.user_inputs.values() if u.session_id == session.id),
                )
                if t is not None
            ]
            sessions.append(
                msgspec.structs.replace(
                    session,
                    outcome=self.outcome_of(session.id),
                    ended_at=max(ended) if ended else session.ended_at,
                )
            )
        return Graph(
            sessions=sessions,
            attributes=list(self.attributes.values()),
            user_inputs=list(self.user_inputs.values()),
            model_invocations=list(self.invocations.values()),
            assistant_messages=list(self.messages.values()),
            tool_uses=list(self.tool_uses.values()),
            tool_results=list(self.tool_results.values()),
            file_touches=list(self.file_touches.values()),
            token_usage=list(self.token_usage.values()),
            vendor_ids=list(self.vendor_ids.values()),
        )


def _command_text(raw_input: msgspec.Raw) -> str:
    """The shell command a tool input carries, as one string (Claude ``command`` or Codex argv)."""
    if raw_input == JSON_NULL:
        return ""
    decoded: Any = msgspec.json.decode(raw_input)
    if not isinstance(decoded, dict):
        return ""
    command = decoded.get("command", decoded.get("cmd"))
    if isinstance(command, list):
        return " ".join(str(part) for part in command)
    return command if isinstance(command, str) else ""
