"""Conversation messages, stored as JSON with a `role` (seed: Messages)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Final

import msgspec

#: The JSON Schema's word on a tool call's arguments: an object whose shape each tool defines.
TOOL_ARGS: Final = (
    "The tool's arguments as the model gave them: a JSON object whose keys are the tool's own parameters "
    "(each tool has its own; any JSON values)."
)


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    name: str
    args: Annotated[dict[str, Any], msgspec.Meta(description=TOOL_ARGS)] = {}


class UserMessage(msgspec.Struct, frozen=True, kw_only=True, tag_field="role", tag="user"):
    text: str


class AssistantMessage(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="role", tag="assistant"
):
    text: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()


class ToolResultMessage(msgspec.Struct, frozen=True, kw_only=True, tag_field="role", tag="tool_result"):
    call_id: str
    content: str
    is_error: bool = False


Message = UserMessage | AssistantMessage | ToolResultMessage


def message_text(message: Message) -> str:
    """The words of a message, for titles and search."""
    match message:
        case UserMessage(text=text):
            return text
        case AssistantMessage(text=text):
            return text or ""
        case ToolResultMessage(content=content):
            return content


#: The result given to a tool call the conversation has no result for (`close_open_tool_calls`).
INTERRUPTED_RESULT: Final = "no result: the turn ended before this call ran"


def close_open_tool_calls(messages: Sequence[Message]) -> list[Message]:
    """Give every tool call without a result (a turn that ended mid-way) an error result, so the
    conversation stays valid for every vendor's API."""
    out: list[Message] = []
    open_calls: list[str] = []
    for message in messages:
        if isinstance(message, ToolResultMessage):
            if message.call_id in open_calls:
                open_calls.remove(message.call_id)
        else:
            out += [ToolResultMessage(call_id=c, content=INTERRUPTED_RESULT, is_error=True) for c in open_calls]
            open_calls = [c.id for c in message.tool_calls] if isinstance(message, AssistantMessage) else []
        out.append(message)
    out += [ToolResultMessage(call_id=c, content=INTERRUPTED_RESULT, is_error=True) for c in open_calls]
    return out
