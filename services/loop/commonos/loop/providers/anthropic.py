"""Anthropic Messages API (`POST /v1/messages`) over HTTP."""

from __future__ import annotations

import os
from typing import Any

from commonos.accounting.usage import UsageError, from_anthropic_usage
from commonos.loop.providers.base import ModelRequest, ModelResponse, ProviderError
from commonos.loop.providers.http import JsonClient
from commonos.proto.messages import AssistantMessage, Message, ToolCall, ToolResultMessage, UserMessage

NAME = "anthropic"
DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"


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


def from_anthropic_response(body: dict[str, Any]) -> tuple[AssistantMessage, str | None]:
    texts: list[str] = []
    calls: list[ToolCall] = []
    for block in body.get("content") or []:
        if block.get("type") == "text":
            texts.append(block.get("text", ""))
        elif block.get("type") == "tool_use":
            args = block.get("input")
            calls.append(ToolCall(id=block["id"], name=block["name"], args=args if isinstance(args, dict) else {}))
    text = "".join(texts) or None
    return AssistantMessage(text=text, tool_calls=tuple(calls)), body.get("stop_reason")


class AnthropicProvider:
    name = NAME

    def __init__(
        self,
        *,
        api_key: str,
        base_url: str = DEFAULT_BASE_URL,
        timeout_s: float = 120.0,
        max_retries: int = 4,
        backoff_base_s: float = 0.5,
    ) -> None:
        self.api_key = api_key
        self.url = base_url.rstrip("/") + "/v1/messages"
        self.http = JsonClient(NAME, timeout_s=timeout_s, max_retries=max_retries, backoff_base_s=backoff_base_s)

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

    async def complete(self, request: ModelRequest) -> ModelResponse:
        body: dict[str, Any] = {
            "model": request.model,
            "max_tokens": request.max_tokens,
            "messages": to_anthropic_messages(request.messages),
        }
        if request.system:
            body["system"] = request.system
        if request.tools:
            body["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in request.tools
            ]
        headers = {"x-api-key": self.api_key, "anthropic-version": API_VERSION}
        reply = await self.http.post(self.url, headers, body)
        message, stop_reason = from_anthropic_response(reply.body)
        try:
            usage = from_anthropic_usage(reply.body.get("usage") or {}, estimated="usage" not in reply.body)
        except UsageError as exc:
            raise ProviderError(NAME, f"bad usage in the response: {exc}") from exc
        return ModelResponse(
            message=message,
            usage=usage,
            provider=NAME,
            model=str(reply.body.get("model") or request.model),
            request_id=reply.headers.get("request-id") or reply.body.get("id"),
            stop_reason=stop_reason,
            latency_s=reply.latency_s,
        )

    async def close(self) -> None:
        await self.http.close()
