"""OpenAI Chat Completions (`POST {base_url}/chat/completions`), or any compatible server."""

from __future__ import annotations

import json
import os
from typing import Any

from commonos.accounting.usage import UsageError, from_openai_usage
from commonos.loop.providers.base import ModelRequest, ModelResponse, ProviderError
from commonos.loop.providers.http import JsonClient
from commonos.proto.messages import AssistantMessage, Message, ToolCall, ToolResultMessage, UserMessage

NAME = "openai"
DEFAULT_BASE_URL = "https://api.openai.com/v1"


def to_openai_messages(system: str, messages: tuple[Message, ...]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for message in messages:
        match message:
            case UserMessage(text=text):
                out.append({"role": "user", "content": text})
            case ToolResultMessage(call_id=call_id, content=content, is_error=is_error):
                # Chat Completions has no error flag on a tool message: say it in the content.
                out.append(
                    {"role": "tool", "tool_call_id": call_id, "content": f"ERROR: {content}" if is_error else content}
                )
            case AssistantMessage(text=text, tool_calls=calls):
                item: dict[str, Any] = {"role": "assistant", "content": text}
                if calls:
                    item["tool_calls"] = [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": json.dumps(c.args)},
                        }
                        for c in calls
                    ]
                out.append(item)
    return out


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        parsed = json.loads(raw) if isinstance(raw, str) and raw.strip() else {}
    except json.JSONDecodeError:
        # The tool then answers that its arguments are missing: the model sees the problem and retries.
        return {"_unparsed_arguments": raw}
    return parsed if isinstance(parsed, dict) else {"_unparsed_arguments": raw}


def from_openai_response(body: dict[str, Any]) -> tuple[AssistantMessage, str | None]:
    choices = body.get("choices") or []
    if not choices:
        raise ProviderError(NAME, "the response has no choices")
    choice = choices[0]
    msg = choice.get("message") or {}
    calls = tuple(
        ToolCall(id=c["id"], name=c["function"]["name"], args=_arguments(c["function"].get("arguments")))
        for c in msg.get("tool_calls") or []
        if c.get("type", "function") == "function"
    )
    content = msg.get("content")
    return AssistantMessage(text=content or None, tool_calls=calls), choice.get("finish_reason")


class OpenAIProvider:
    name = NAME

    def __init__(
        self,
        *,
        api_key: str | None,
        base_url: str = DEFAULT_BASE_URL,
        timeout_s: float = 120.0,
        max_retries: int = 4,
        backoff_base_s: float = 0.5,
        max_tokens_param: str = "max_completion_tokens",
        provider_name: str = NAME,
    ) -> None:
        self.api_key = api_key
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.max_tokens_param = max_tokens_param
        self.name = provider_name
        self.http = JsonClient(
            provider_name, timeout_s=timeout_s, max_retries=max_retries, backoff_base_s=backoff_base_s
        )

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> OpenAIProvider:
        key_env = str(options.get("api_key_env", "OPENAI_API_KEY"))
        base_url = str(options.get("base_url", DEFAULT_BASE_URL))
        api_key = os.environ.get(key_env)
        if not api_key and base_url == DEFAULT_BASE_URL:
            raise ValueError(f"the openai provider needs an API key in ${key_env}")
        return cls(
            api_key=api_key,
            base_url=base_url,
            timeout_s=float(options.get("timeout_s", 120.0)),
            max_retries=int(options.get("max_retries", 4)),
            max_tokens_param=str(options.get("max_tokens_param", "max_completion_tokens")),
            provider_name=str(options.get("provider_name", NAME)),
        )

    async def complete(self, request: ModelRequest) -> ModelResponse:
        body: dict[str, Any] = {
            "model": request.model,
            "messages": to_openai_messages(request.system, request.messages),
            self.max_tokens_param: request.max_tokens,
        }
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in request.tools
            ]
        headers = {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        reply = await self.http.post(self.url, headers, body)
        message, stop_reason = from_openai_response(reply.body)
        try:
            usage = from_openai_usage(
                reply.body.get("usage") or {},
                service_tier=reply.body.get("service_tier"),
                estimated="usage" not in reply.body,
            )
        except UsageError as exc:
            raise ProviderError(self.name, f"bad usage in the response: {exc}") from exc
        return ModelResponse(
            message=message,
            usage=usage,
            provider=self.name,
            model=str(reply.body.get("model") or request.model),
            request_id=reply.headers.get("x-request-id") or reply.body.get("id"),
            stop_reason=stop_reason,
            latency_s=reply.latency_s,
        )

    async def close(self) -> None:
        await self.http.close()
