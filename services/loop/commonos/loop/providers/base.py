"""The model port: one call in (system prompt, messages, tools), one assistant message and its usage out."""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from commonos.accounting.usage import TokenUsage
from commonos.proto.errors import OperationalError
from commonos.proto.messages import AssistantMessage, Message


class ProviderError(OperationalError):
    """A model call that failed for good (after retries where retrying made sense)."""

    def __init__(self, provider: str, message: str, *, status: int | None = None, retryable: bool = False) -> None:
        super().__init__(f"{provider}: {message}")
        self.provider = provider
        self.detail = message
        self.status = status
        self.retryable = retryable


class ToolSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A tool as the model sees it: name, what it does, and its arguments as JSON Schema."""

    name: str
    description: str
    parameters: dict[str, Any]


class ModelRequest(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    system: str
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    max_tokens: int = 4096


class ModelResponse(msgspec.Struct, frozen=True, kw_only=True):
    """The assistant's answer and the call's facts, tokens in our convention (commonos.accounting.usage)."""

    message: AssistantMessage
    usage: TokenUsage
    provider: str
    model: str
    request_id: str | None = None
    stop_reason: str | None = None
    latency_s: float | None = None


class Provider(Protocol):
    """A model vendor behind one method."""

    name: str

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Make one model call and return the assistant message with its usage; `ProviderError` if it
        fails for good."""
        ...

    async def close(self) -> None:
        """Release connections (at service shutdown)."""
        ...


#: The system prompt of a compaction's summary call (`commonos.loop.compaction`); the scripted provider answers
#: a call with it by its script's `summary`.
COMPACTION_SYSTEM = (
    "You compact a conversation between a user and an assistant that uses tools. Summarise the transcript "
    "you are given so that the assistant can carry on from the summary alone: the user's goals and requests, "
    "decisions taken, facts learnt (file names, values, results of tool calls), what is done and what is "
    "still open. Be concise; answer with the summary only."
)
