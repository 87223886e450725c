"""Anthropic Messages API (`POST /v1/messages`), streamed, through the official `anthropic` SDK."""

from __future__ import annotations

import os
import time
from typing import Any

import anthropic
import httpx2
from anthropic.types import Message as AnthropicMessage

from commonos.accounting.usage import UsageError, from_anthropic_usage
from commonos.loop.providers.base import DeltaCallback, ModelDelta, ModelRequest, ModelResponse, ProviderError
from commonos.loop.providers.sdk import connection_error, status_error, stream_broken
from commonos.proto.deltas import DeltaKind
from commonos.proto.messages import AssistantMessage, Message, ToolCall, ToolResultMessage, UserMessage

NAME = "anthropic"
DEFAULT_BASE_URL = "https://api.anthropic.com"


def to_anthropic_messages(messages: tuple[Message, ...]) -> list[dict[str, Any]]:
    """Our messages as Anthropic turns: tool results are user content blocks; same-role runs merge."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role: str
        blocks: list[dict[str, Any]]
        match message:
            case UserMessage(text=text):
                role, blocks = "user", [{"type": "text", "text": text}]
            case ToolResultMessage(call_id=call_id, content=content, is_error=is_error):
                role = "user"
                blocks = [{"type": "tool_result", "tool_use_id": call_id, "content": content, "is_error": is_error}]
            case AssistantMessage(text=text, tool_calls=calls):
                role = "assistant"
                blocks = [{"type": "text", "text": text}] if text else []
                blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.args} for c in calls]
                if not blocks:
                    continue
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    return out


def from_anthropic_message(message: AnthropicMessage) -> AssistantMessage:
    """The assistant's text blocks (joined) and tool calls; thinking blocks are not part of our message."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    for block in message.content:
        if block.type == "text":
            texts.append(block.text)
        elif block.type == "tool_use":
            args = block.input
            calls.append(ToolCall(id=block.id, name=block.name, args=args if isinstance(args, dict) else {}))
    return AssistantMessage(text="".join(texts) or None, tool_calls=tuple(calls))


class AnthropicProvider:
    """`anthropic.AsyncAnthropic`: its retries (`max_retries`), its timeout (`timeout_s`, for connecting and for
    each read of the stream), its typed usage; the answer streamed, its text to `on_delta` as it comes."""

    name = NAME
    streams_deltas = True

    def __init__(
        self,
        *,
        api_key: str,
        base_url: str = DEFAULT_BASE_URL,
        timeout_s: float = 120.0,
        max_retries: int = 4,
    ) -> None:
        self.max_retries = max_retries
        self.client = anthropic.AsyncAnthropic(
            api_key=api_key,
            base_url=base_url.rstrip("/"),
            timeout=timeout_s,
            max_retries=max_retries,
            # The loop traces its model calls itself (commonos.loop.tracing).
            open_telemetry=False,
        )

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> AnthropicProvider:
        key_env = str(options.get("api_key_env", "ANTHROPIC_API_KEY"))
        api_key = os.environ.get(key_env)
        if not api_key:
            raise ValueError(f"the anthropic provider needs an API key in ${key_env}")
        return cls(
            api_key=api_key,
            base_url=str(options.get("base_url", DEFAULT_BASE_URL)),
            timeout_s=float(options.get("timeout_s", 120.0)),
            max_retries=int(options.get("max_retries", 4)),
        )

    def _params(self, request: ModelRequest) -> dict[str, Any]:
        params: dict[str, Any] = {
            "model": request.model,
            "max_tokens": request.max_tokens,
            "messages": to_anthropic_messages(request.messages),
        }
        if request.system:
            params["system"] = request.system
        if request.tools:
            params["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in request.tools
            ]
        return params

    async def complete(self, request: ModelRequest, on_delta: DeltaCallback | None = None) -> ModelResponse:
        started = time.monotonic()
        streaming = False
        try:
            async with self.client.messages.stream(**self._params(request)) as stream:
                streaming = True
                async for event in stream:
                    if on_delta is None:
                        continue
                    if event.type == "text" and event.text:
                        await on_delta(ModelDelta(DeltaKind.TEXT, event.text))
                    elif event.type == "content_block_start" and event.content_block.type == "tool_use":
                        await on_delta(ModelDelta(DeltaKind.TOOL_CALL, event.content_block.name))
                message = await stream.get_final_message()
                request_id = stream.request_id
        except anthropic.APIStatusError as exc:
            raise status_error(NAME, exc.status_code, exc.api_message or exc.message, self.max_retries) from exc
        except anthropic.APIConnectionError as exc:
            timed_out = isinstance(exc, anthropic.APITimeoutError)
            if streaming:
                raise stream_broken(NAME, exc.__cause__ or exc, timed_out=timed_out) from exc
            raise connection_error(NAME, timed_out=timed_out, max_retries=self.max_retries) from exc
        except httpx2.HTTPError as exc:  # raised as it is while the stream is read
            raise stream_broken(NAME, exc, timed_out=isinstance(exc, httpx2.TimeoutException)) from exc
        except ValueError as exc:  # a tool call's arguments that are not JSON
            raise ProviderError(NAME, f"bad response: {exc}") from exc
        try:
            usage = from_anthropic_usage(message.usage.to_dict())
        except UsageError as exc:
            raise ProviderError(NAME, f"bad usage in the response: {exc}") from exc
        return ModelResponse(
            message=from_anthropic_message(message),
            usage=usage,
            provider=NAME,
            model=message.model or request.model,
            request_id=request_id or message.id,
            stop_reason=message.stop_reason,
            latency_s=time.monotonic() - started,
        )

    async def close(self) -> None:
        await self.client.close()
