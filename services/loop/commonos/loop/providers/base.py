"""The model port: one call in (system prompt, messages, tools), one assistant message and its usage out."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, cast

import msgspec

from commonos.accounting.usage import TokenUsage
from commonos.proto.deltas import DeltaKind
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


class ModelDelta(msgspec.Struct, frozen=True):
    """A piece of a model's answer while it streams: `text` (the next piece of its text) or `tool_call` (a
    tool call starts; `text` is the tool's name); `done` (the call ended; `text` its stop reason)."""

    kind: DeltaKind
    text: str = ""


#: Where a provider sends the deltas of a call as they arrive (`commonos.loop.deltas` publishes them).
DeltaCallback = Callable[[ModelDelta], Awaitable[None]]


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


class StreamingProvider(Provider, Protocol):
    """A provider that streams: `complete` also sends the answer's `text` and `tool_call` deltas to
    `on_delta` as they arrive (in order; the text deltas concatenated are the answer's text). It says so
    with `streams_deltas = True`."""

    streams_deltas: bool

    async def complete(self, request: ModelRequest, on_delta: DeltaCallback | None = None) -> ModelResponse: ...


async def complete_with_deltas(
    provider: Provider, request: ModelRequest, on_delta: DeltaCallback | None = None
) -> ModelResponse:
    """`provider.complete(request)`, its answer's deltas sent to `on_delta`, then `done` (its stop reason).

    A streaming provider sends them as they arrive; any other (the scripted provider, a test's) sends its
    whole text and its tool calls once the answer is there, so a listener sees every provider alike. A call
    that fails sends `done` with `error` and raises."""
    if on_delta is None:
        return await provider.complete(request)
    try:
        if getattr(provider, "streams_deltas", False):
            response = await cast(StreamingProvider, provider).complete(request, on_delta)
        else:
            response = await provider.complete(request)
            if response.message.text:
                await on_delta(ModelDelta(DeltaKind.TEXT, response.message.text))
            for call in response.message.tool_calls:
                await on_delta(ModelDelta(DeltaKind.TOOL_CALL, call.name))
    except ProviderError:
        await on_delta(ModelDelta(DeltaKind.DONE, "error"))
        raise
    await on_delta(ModelDelta(DeltaKind.DONE, response.stop_reason or ""))
    return response


#: The system prompt of a compaction's summary call (`commonos.loop.compaction`); the scripted provider answers
#: a call with it by its script's `summary`.
COMPACTION_SYSTEM = (
    "You compact a conversation between a user and an assistant that uses tools. Summarise the transcript "
    "you are given so that the assistant can carry on from the summary alone: the user's goals and requests, "
    "decisions taken, facts learnt (file names, values, results of tool calls), what is done and what is "
    "still open. Be concise; answer with the summary only."
)
