"""The HTTP providers against a local server answering exactly as the vendors' APIs document."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from commonos.loop.approvals import FixedApprover
from commonos.loop.locks import MemorySessionLocks
from commonos.loop.loop import Loop, TurnRequest
from commonos.loop.memory import MemoryJournal
from commonos.loop.profiles import ProfileError
from commonos.loop.providers import (
    AnthropicProvider,
    ModelRequest,
    OpenAIProvider,
    ProviderError,
    ToolSpec,
    build_provider,
)
from commonos.proto.events import ModelCallCompleted, TurnStatus
from commonos.proto.messages import AssistantMessage, Message, ToolCall, ToolResultMessage, UserMessage
from tests.loop.helpers import of_type, write_profile

# https://docs.anthropic.com/en/api/messages (response example, with prompt caching)
ANTHROPIC_RESPONSE: dict[str, Any] = {
    "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
    "type": "message",
    "role": "assistant",
    "content": [
        {"type": "text", "text": "I'll check the weather."},
        {
            "type": "tool_use",
            "id": "toolu_01A09q90qw90lq917835lq9",
            "name": "get_weather",
            "input": {"location": "San Francisco, CA"},
        },
    ],
    "model": "claude-sonnet-4-5-20250929",
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 2095,
        "cache_creation_input_tokens": 2051,
        "cache_read_input_tokens": 1200,
        "cache_creation": {"ephemeral_5m_input_tokens": 1051, "ephemeral_1h_input_tokens": 1000},
        "output_tokens": 503,
        "service_tier": "standard",
    },
}

# https://platform.openai.com/docs/api-reference/chat/object
OPENAI_RESPONSE: dict[str, Any] = {
    "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
    "object": "chat.completion",
    "created": 1741570283,
    "model": "gpt-4o-2024-08-06",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_abc123",
                        "type": "function",
                        "function": {"name": "get_current_weather", "arguments": '{"location": "Boston, MA"}'},
                    }
                ],
                "refusal": None,
                "annotations": [],
            },
            "logprobs": None,
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {
        "prompt_tokens": 1117,
        "completion_tokens": 46,
        "total_tokens": 1163,
        "prompt_tokens_details": {"cached_tokens": 1024, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 20,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    },
    "service_tier": "default",
    "system_fingerprint": "fp_fc9f1d7035",
}

CONVERSATION: tuple[Message, ...] = (
    UserMessage(text="Weather in SF?"),
    AssistantMessage(text="Checking.", tool_calls=(ToolCall(id="c1", name="get_weather", args={"city": "SF"}),)),
    ToolResultMessage(call_id="c1", content="18C", is_error=False),
    UserMessage(text="And tomorrow?"),
)
TOOL = ToolSpec(
    name="get_weather",
    description="weather of a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    hang: bool = False


class FakeApi:
    """Answers each POST with the next queued reply (the last one repeats); records the requests."""

    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self.requests: list[tuple[dict[str, str], Any]] = []
        self.release = asyncio.Event()
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((dict(request.headers), await request.json()))
        reply = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
        if reply.hang:
            await self.release.wait()
        return web.json_response(reply.body, status=reply.status, headers=reply.headers)


@pytest.fixture
async def api() -> AsyncIterator[FakeApi]:
    fake = FakeApi()
    app = web.Application()
    app.router.add_post("/{tail:.*}", fake.handle)
    runner = web.AppRunner(app, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    fake.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield fake
    fake.release.set()
    await runner.cleanup()


def request() -> ModelRequest:
    return ModelRequest(model="m-1", system="Be brief.", messages=CONVERSATION, tools=(TOOL,), max_tokens=256)


async def test_anthropic_request_and_response(api: FakeApi) -> None:
    api.replies = [Reply(body=ANTHROPIC_RESPONSE, headers={"request-id": "req_018EeWyXxfu5pfWkrYcMdjWG"})]
    provider = AnthropicProvider(api_key="sk-test", base_url=api.url)
    try:
        response = await provider.complete(request())
    finally:
        await provider.close()
    headers, body = api.requests[0]
    assert headers["x-api-key"] == "sk-test" and headers["anthropic-version"] == "2023-06-01"
    assert body["model"] == "m-1" and body["max_tokens"] == 256 and body["system"] == "Be brief."
    assert body["tools"] == [
        {"name": "get_weather", "description": "weather of a city", "input_schema": TOOL.parameters}
    ]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Weather in SF?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "c1", "name": "get_weather", "input": {"city": "SF"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": "18C", "is_error": False},
                {"type": "text", "text": "And tomorrow?"},
            ],
        },
    ]
    assert response.message == AssistantMessage(
        text="I'll check the weather.",
        tool_calls=(
            ToolCall(id="toolu_01A09q90qw90lq917835lq9", name="get_weather", args={"location": "San Francisco, CA"}),
        ),
    )
    assert (response.provider, response.model, response.request_id, response.stop_reason) == (
        "anthropic",
        "claude-sonnet-4-5-20250929",
        "req_018EeWyXxfu5pfWkrYcMdjWG",
        "tool_use",
    )
    u = response.usage
    # Anthropic's input_tokens already excludes the cache; the writes split into 5m and 1h
    assert (u.input_tokens, u.cache_read_tokens, u.cache_write_5m_tokens, u.cache_write_1h_tokens) == (
        2095,
        1200,
        1051,
        1000,
    )
    assert u.output_tokens == 503 and u.service_tier == "standard"
    assert response.latency_s is not None and response.latency_s >= 0


async def test_openai_request_and_response(api: FakeApi) -> None:
    api.replies = [Reply(body=OPENAI_RESPONSE, headers={"x-request-id": "req_abc"})]
    provider = OpenAIProvider(api_key="sk-oa", base_url=api.url + "/v1")
    try:
        response = await provider.complete(request())
    finally:
        await provider.close()
    headers, body = api.requests[0]
    assert headers["Authorization"] == "Bearer sk-oa"
    assert body["max_completion_tokens"] == 256
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": "weather of a city", "parameters": TOOL.parameters},
        }
    ]
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in SF?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "SF"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "18C"},
        {"role": "user", "content": "And tomorrow?"},
    ]
    assert response.message == AssistantMessage(
        tool_calls=(ToolCall(id="call_abc123", name="get_current_weather", args={"location": "Boston, MA"}),)
    )
    assert (response.request_id, response.stop_reason, response.model) == ("req_abc", "tool_calls", "gpt-4o-2024-08-06")
    u = response.usage
    # prompt_tokens includes the cached ones; ours excludes them. Output includes reasoning.
    assert (u.input_tokens, u.cache_read_tokens, u.output_tokens, u.reasoning_tokens) == (93, 1024, 46, 20)


async def test_openai_text_answer_and_unparsable_arguments(api: FakeApi) -> None:
    body = copy.deepcopy(OPENAI_RESPONSE)
    body["choices"][0]["message"]["content"] = "Sunny."
    body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = '{"location": '
    api.replies = [Reply(body=body)]
    provider = OpenAIProvider(api_key=None, base_url=api.url)
    try:
        response = await provider.complete(request())
    finally:
        await provider.close()
    assert "Authorization" not in api.requests[0][0]
    assert response.message.text == "Sunny."
    assert response.message.tool_calls[0].args == {"_unparsed_arguments": '{"location": '}
    assert response.request_id == OPENAI_RESPONSE["id"]


async def test_retries_on_429_and_overload_then_succeeds(api: FakeApi) -> None:
    api.replies = [
        Reply(
            429, {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}, {"retry-after": "0"}
        ),
        Reply(529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        Reply(body=ANTHROPIC_RESPONSE),
    ]
    provider = AnthropicProvider(api_key="k", base_url=api.url, backoff_base_s=0.01)
    try:
        response = await provider.complete(request())
    finally:
        await provider.close()
    assert len(api.requests) == 3
    assert response.request_id == ANTHROPIC_RESPONSE["id"]


async def test_a_client_error_is_not_retried(api: FakeApi) -> None:
    api.replies = [
        Reply(400, {"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: too big"}})
    ]
    provider = AnthropicProvider(api_key="k", base_url=api.url, backoff_base_s=0.01)
    try:
        with pytest.raises(ProviderError) as failure:
            await provider.complete(request())
    finally:
        await provider.close()
    assert failure.value.status == 400 and not failure.value.retryable
    assert str(failure.value) == "anthropic: HTTP 400: max_tokens: too big"
    assert len(api.requests) == 1


async def test_retries_end_with_a_clear_error(api: FakeApi) -> None:
    api.replies = [Reply(503, {"error": {"message": "upstream down"}})]
    provider = OpenAIProvider(api_key="k", base_url=api.url, max_retries=2, backoff_base_s=0.01)
    try:
        with pytest.raises(ProviderError) as failure:
            await provider.complete(request())
    finally:
        await provider.close()
    assert str(failure.value) == "openai: HTTP 503: upstream down (after 3 attempts)"
    assert len(api.requests) == 3


async def test_a_hanging_server_times_out(api: FakeApi) -> None:
    api.replies = [Reply(body=OPENAI_RESPONSE, hang=True)]
    provider = OpenAIProvider(api_key="k", base_url=api.url, timeout_s=0.2, max_retries=1, backoff_base_s=0.01)
    try:
        with pytest.raises(ProviderError) as failure:
            await provider.complete(request())
    finally:
        await provider.close()
    assert str(failure.value) == "openai: request timed out (after 2 attempts)"


async def test_a_loop_on_an_http_provider_records_the_model_call(api: FakeApi, tmp_path: Path) -> None:
    answer = copy.deepcopy(OPENAI_RESPONSE)
    answer["choices"][0]["message"] = {"role": "assistant", "content": "Hello!"}
    answer["choices"][0]["finish_reason"] = "stop"
    api.replies = [Reply(body=answer, headers={"x-request-id": "req_1"})]
    profile = write_profile(tmp_path, config='provider = "openai"\nmodel = "gpt-4o"\ntags = ["client:acme"]\n')
    provider = OpenAIProvider(api_key="k", base_url=api.url)
    journal = MemoryJournal()
    loop = Loop(
        journal,
        {profile.id: profile},
        {profile.id: provider},
        locks=MemorySessionLocks(),
        approver=FixedApprover(None),
    )
    try:
        result = await loop.run_turn(TurnRequest(profile_id=profile.id, text="hi"))
    finally:
        await provider.close()
    assert (result.status, result.text) == (TurnStatus.COMPLETED, "Hello!")
    [call] = of_type(journal.events, ModelCallCompleted)
    assert (call.provider, call.model, call.request_id, call.stop_reason) == (
        "openai",
        "gpt-4o-2024-08-06",
        "req_1",
        "stop",
    )
    assert (call.input_tokens, call.cache_read_tokens, call.output_tokens, call.reasoning_tokens) == (93, 1024, 46, 20)
    assert call.tags == ("client:acme",) and call.latency_s is not None
    assert json.loads(json.dumps(api.requests[0][1]))["model"] == "gpt-4o"


def test_a_provider_without_its_key_is_a_profile_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    profile = write_profile(tmp_path, config='provider = "anthropic"\nmodel = "claude-x"\n')
    with pytest.raises(ProfileError) as failure:
        build_provider(profile)
    assert (
        str(failure.value)
        == f"{profile.config_path}: provider anthropic: the anthropic provider needs an API key in $ANTHROPIC_API_KEY"
    )


def test_every_provider_a_profile_may_name_can_be_built() -> None:
    """The providers profiles accept (each with its options Struct) are the ones build_provider knows."""
    from commonos.loop.profiles import PROVIDERS
    from commonos.loop.providers import BUILDERS

    assert set(BUILDERS) == set(PROVIDERS)
