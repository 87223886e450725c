"""OpenAI Chat Completions (`POST {base_url}/chat/completions`), or any compatible server, streamed, through the
official `openai` SDK."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

import httpx2
import openai
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletionChunk

from commonos.accounting.usage import UsageError, from_openai_usage
from commonos.loop.providers.base import DeltaCallback, ModelDelta, ModelRequest, ModelResponse, ProviderError
from commonos.loop.providers.sdk import connection_error, status_error, stream_broken
from commonos.proto.deltas import DeltaKind
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


def _arguments(raw: str) -> dict[str, Any]:
    try:
        parsed = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError:
        # The tool then answers that its arguments are missing: the model sees the problem and retries.
        return {"_unparsed_arguments": raw}
    return parsed if isinstance(parsed, dict) else {"_unparsed_arguments": raw}


@dataclass
class _Call:
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass
class _Answer:
    """A streamed completion put together from its chunks (the first choice; others are not asked for)."""

    texts: list[str] = field(default_factory=list)
    calls: dict[int, _Call] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: CompletionUsage | None = None
    model: str | None = None
    id: str | None = None
    service_tier: str | None = None

    def message(self) -> AssistantMessage:
        calls = tuple(
            ToolCall(id=c.id, name=c.name, args=_arguments(c.arguments)) for _, c in sorted(self.calls.items())
        )
        return AssistantMessage(text="".join(self.texts) or None, tool_calls=calls)


def _error_message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])
    if isinstance(body, str) and body:
        return body
    return f"HTTP {exc.status_code}"


class OpenAIProvider:
    """`openai.AsyncOpenAI` on Chat Completions: its retries (`max_retries`), its timeout (`timeout_s`, for
    connecting and for each read of the stream), its typed usage (asked for with `stream_options.include_usage`;
    a server that sends none gives an estimate of nothing, `usage_estimated`); the answer streamed, its text to
    `on_delta` as it comes."""

    name = NAME
    streams_deltas = True

    def __init__(
        self,
        *,
        api_key: str | None,
        base_url: str = DEFAULT_BASE_URL,
        timeout_s: float = 120.0,
        max_retries: int = 4,
        max_tokens_param: str = "max_completion_tokens",
        provider_name: str = NAME,
    ) -> None:
        self.max_tokens_param = max_tokens_param
        self.name = provider_name
        self.max_retries = max_retries
        self.keyless = not api_key
        self.client = openai.AsyncOpenAI(
            # A compatible server may need no key: then no Authorization header at all (`_params`).
            api_key=api_key or "no-key",
            base_url=base_url.rstrip("/"),
            timeout=timeout_s,
            max_retries=max_retries,
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

    def _params(self, request: ModelRequest) -> dict[str, Any]:
        params: dict[str, Any] = {
            "model": request.model,
            "messages": to_openai_messages(request.system, request.messages),
            self.max_tokens_param: request.max_tokens,
            "stream_options": {"include_usage": True},
        }
        if self.keyless:
            params["extra_headers"] = {"Authorization": openai.omit}
        if request.tools:
            params["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in request.tools
            ]
        return params

    async def complete(self, request: ModelRequest, on_delta: DeltaCallback | None = None) -> ModelResponse:
        started = time.monotonic()
        answer = _Answer()
        request_id: str | None = None
        streaming = False
        try:
            stream = await self.client.chat.completions.create(**self._params(request), stream=True)
            request_id = stream.response.headers.get("x-request-id")
            streaming = True
            async with stream:
                async for chunk in stream:
                    await self._take(answer, chunk, on_delta)
        except openai.APIStatusError as exc:
            raise status_error(self.name, exc.status_code, _error_message(exc), self.max_retries) from exc
        except openai.APIConnectionError as exc:
            timed_out = isinstance(exc, openai.APITimeoutError)
            if streaming:
                raise stream_broken(self.name, exc.__cause__ or exc, timed_out=timed_out) from exc
            raise connection_error(self.name, timed_out=timed_out, max_retries=self.max_retries) from exc
        except httpx2.HTTPError as exc:  # raised as it is while the stream is read
            raise stream_broken(self.name, exc, timed_out=isinstance(exc, httpx2.TimeoutException)) from exc
        try:
            usage = from_openai_usage(
                answer.usage.to_dict() if answer.usage is not None else {},
                service_tier=answer.service_tier,
                estimated=answer.usage is None,
            )
        except UsageError as exc:
            raise ProviderError(self.name, f"bad usage in the response: {exc}") from exc
        return ModelResponse(
            message=answer.message(),
            usage=usage,
            provider=self.name,
            model=answer.model or request.model,
            request_id=request_id or answer.id,
            stop_reason=answer.finish_reason,
            latency_s=time.monotonic() - started,
        )

    @staticmethod
    async def _take(answer: _Answer, chunk: ChatCompletionChunk, on_delta: DeltaCallback | None) -> None:
        answer.id = answer.id or chunk.id
        answer.model = chunk.model or answer.model
        answer.service_tier = chunk.service_tier or answer.service_tier
        if chunk.usage is not None:
            answer.usage = chunk.usage
        for choice in chunk.choices:
            if choice.index != 0:
                continue
            delta = choice.delta
            if delta.content:
                answer.texts.append(delta.content)
                if on_delta is not None:
                    await on_delta(ModelDelta(DeltaKind.TEXT, delta.content))
            for part in delta.tool_calls or ():
                if part.type not in (None, "function"):
                    continue
                call = answer.calls.setdefault(part.index, _Call())
                function = part.function
                if part.id:
                    call.id = part.id
                if function is not None and function.name and not call.name:
                    call.name = function.name
                    if on_delta is not None:
                        await on_delta(ModelDelta(DeltaKind.TOOL_CALL, function.name))
                if function is not None and function.arguments:
                    call.arguments += function.arguments
            if choice.finish_reason:
                answer.finish_reason = choice.finish_reason

    async def close(self) -> None:
        await self.client.close()
