"""Conversation messages, stored as JSON with a `role` (seed: Messages)."""

from __future__ import annotations

from typing import Any

import msgspec


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    name: str
    args: dict[str, Any] = {}


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
