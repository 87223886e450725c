"""The SDK providers (anthropic, openai) against the fake model server of the real-client harness
(clients/fakemodel.py): a real HTTP server streaming as the vendors' APIs do, with usage it chooses."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from clients.fakemodel import FakeModel, Script, Step
from commonos.accounting.usage import TokenUsage
from commonos.loop.approvals import FixedApprover
from commonos.loop.locks import MemorySessionLocks
from commonos.loop.loop import Loop, TurnRequest
from commonos.loop.memory import MemoryJournal
from commonos.loop.profiles import ProfileError
from commonos.loop.providers import (
    AnthropicProvider,
    ModelDelta,
    ModelRequest,
    OpenAIProvider,
    ProviderError,
    ScriptedProvider,
    ToolSpec,
    build_provider,
    complete_with_deltas,
)
from commonos.loop.providers.openai import _arguments
from commonos.loop.providers.scripted import Script as ReplyScript
from commonos.proto.deltas import DeltaKind
from commonos.proto.events import ModelCallCompleted, TurnStatus
from commonos.proto.messages import AssistantMessage, Message, ToolCall, ToolResultMessage, UserMessage
from tests.loop.helpers import of_type, write_profile

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
ANSWER = "Tomorrow will be sunny in San Francisco, with a light breeze off the bay and 21 degrees."


@pytest.fixture
async def fake() -> AsyncIterator[FakeModel]:
    server = FakeModel()
    await server.start()
    server.keep_requests = True
    try:
        yield server
    finally:
        await server.stop()


def url(server: FakeModel) -> str:
    return f"http://127.0.0.1:{server.port}"


def play(server: FakeModel, *steps: Step, number: int = 7) -> None:
    server.use(Script("loop", "providers", number, list(steps)))
    server.keep_requests = True


def request() -> ModelRequest:
    return ModelRequest(model="m-1", system="Be brief.", messages=CONVERSATION, tools=(TOOL,), max_tokens=256)


class Deltas:
    """An `on_delta` that keeps what it is sent."""

    def __init__(self) -> None:
        self.got: list[ModelDelta] = []

    async def __call__(self, delta: ModelDelta) -> None:
        self.got.append(delta)

    def text(self) -> str:
        return "".join(d.text for d in self.got if d.kind is DeltaKind.TEXT)

    def kinds(self) -> list[DeltaKind]:
        return [d.kind for d in self.got]


# -- anthropic ------------------------------------------------------------------------------------------------


async def test_anthropic_streams_a_text_reply(fake: FakeModel) -> None:
    play(fake, Step([("text", ANSWER)]))
    deltas = Deltas()
    provider = AnthropicProvider(api_key="sk-test", base_url=url(fake))
    try:
        response = await provider.complete(request(), deltas)
    finally:
        await provider.close()
    [(path, headers, body)] = fake.requests
    assert path == "/v1/messages" and body["stream"] is True
    assert "sk-test" in headers.get("x-api-key", "") + headers.get("authorization", "")
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
    # the text came in pieces, in order, and they make the whole answer
    assert len(deltas.got) > 3 and set(deltas.kinds()) == {DeltaKind.TEXT}
    assert deltas.text() == response.message.text == ANSWER
    [line] = fake.log
    assert (response.provider, response.model, response.request_id, response.stop_reason) == (
        "anthropic",
        "m-1",
        line["request_id"],
        "end_turn",
    )
    assert response.request_id == "req_fake07000providers"
    assert response.latency_s is not None and response.latency_s >= 0


async def test_anthropic_tool_call(fake: FakeModel) -> None:
    play(fake, Step([("text", "Let me look it up."), ("tool", "get_weather", {"city": "SF", "days": [1, 2]})]))
    deltas = Deltas()
    provider = AnthropicProvider(api_key="k", base_url=url(fake))
    try:
        response = await provider.complete(request(), deltas)
    finally:
        await provider.close()
    assert response.message == AssistantMessage(
        text="Let me look it up.",
        tool_calls=(ToolCall(id="toolu_fake07001providers", name="get_weather", args={"city": "SF", "days": [1, 2]}),),
    )
    assert response.stop_reason == "tool_use"
    assert deltas.kinds()[-1] is DeltaKind.TOOL_CALL and deltas.got[-1].text == "get_weather"
    assert deltas.text() == "Let me look it up."


async def test_anthropic_usage_with_cache_writes_reads_and_thinking(fake: FakeModel) -> None:
    """Our buckets exactly: input excludes the cache; the writes split into 5 m and 1 h; output includes thinking."""
    thinking = "First I consider the fog, then the season, then the wind from the ocean."
    play(
        fake,
        Step(
            [("thinking", thinking), ("text", "Sunny.")],
            usage={"input": 11, "cache_read": 2048, "cache_5m": 1051, "cache_1h": 1000, "output": 50},
        ),
    )
    provider = AnthropicProvider(api_key="k", base_url=url(fake))
    try:
        response = await provider.complete(request())
    finally:
        await provider.close()
    thought = len(thinking) // 4 + 1
    [line] = fake.log
    assert line["usage"]["cache_creation_input_tokens"] == 2051 and line["usage"]["output_tokens"] == 50 + thought
    assert response.usage == TokenUsage(
        input_tokens=11,
        output_tokens=50 + thought,
        cache_read_tokens=2048,
        cache_write_5m_tokens=1051,
        cache_write_1h_tokens=1000,
        reasoning_tokens=thought,
        service_tier="standard",
    )
    assert response.message == AssistantMessage(text="Sunny.")


async def test_anthropic_rate_limit_and_overload_are_retried_by_the_sdk(fake: FakeModel) -> None:
    play(fake, Step([("text", "At last.")]))
    fake.fail_next(429, 529)
    provider = AnthropicProvider(api_key="k", base_url=url(fake), max_retries=2)
    try:
        response = await provider.complete(request())
    finally:
        await provider.close()
    assert fake.failed == [429, 529] and len(fake.requests) == 3
    assert response.message.text == "At last." and response.request_id == fake.log[0]["request_id"]


async def test_anthropic_bad_request_is_not_retried(fake: FakeModel) -> None:
    play(fake)
    fake.fail_next(400)
    deltas = Deltas()
    provider = AnthropicProvider(api_key="k", base_url=url(fake))
    try:
        with pytest.raises(ProviderError) as failure:
            await complete_with_deltas(provider, request(), deltas)
    finally:
        await provider.close()
    assert failure.value.status == 400 and not failure.value.retryable
    assert str(failure.value) == "anthropic: HTTP 400: max_tokens: too big"
    assert fake.failed == [400] and len(fake.requests) == 1 and fake.log == []
    assert deltas.got == [ModelDelta(DeltaKind.DONE, "error")]


async def test_anthropic_stalled_stream_times_out(fake: FakeModel) -> None:
    play(fake, Step([("text", "never finished")], stall=True))
    provider = AnthropicProvider(api_key="k", base_url=url(fake), timeout_s=0.5, max_retries=0)
    try:
        with pytest.raises(ProviderError) as failure:
            await provider.complete(request())
    finally:
        await provider.close()
    assert str(failure.value) == "anthropic: the stream stopped: nothing came within the timeout"
    assert failure.value.retryable and fake.stalled.is_set()


# -- openai (Chat Completions) --------------------------------------------------------------------------------


async def test_openai_streams_a_text_reply(fake: FakeModel) -> None:
    play(fake, Step([("text", ANSWER)]))
    deltas = Deltas()
    provider = OpenAIProvider(api_key="sk-oa", base_url=url(fake) + "/v1")
    try:
        response = await provider.complete(request(), deltas)
    finally:
        await provider.close()
    [(path, headers, body)] = fake.requests
    assert path == "/v1/chat/completions" and headers["authorization"] == "Bearer sk-oa"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
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
    assert len(deltas.got) > 3 and set(deltas.kinds()) == {DeltaKind.TEXT}
    assert deltas.text() == response.message.text == ANSWER
    assert (response.provider, response.request_id, response.stop_reason, response.model) == (
        "openai",
        "req_fake07000providers",
        "stop",
        "m-1",
    )


async def test_openai_tool_calls_and_usage_with_cache_and_reasoning(fake: FakeModel) -> None:
    """prompt_tokens includes the cached ones, ours excludes them; completion_tokens includes the reasoning."""
    play(
        fake,
        Step(
            [("tool", "get_weather", {"city": "SF"}), ("tool", "get_weather", {"city": "LA"})],
            usage={"input": 93, "cache_read": 1024, "output": 26, "reasoning": 20},
        ),
    )
    deltas = Deltas()
    provider = OpenAIProvider(api_key="k", base_url=url(fake) + "/v1", max_tokens_param="max_tokens")
    try:
        response = await provider.complete(request(), deltas)
    finally:
        await provider.close()
    assert fake.requests[0][2]["max_tokens"] == 256
    assert response.message == AssistantMessage(
        tool_calls=(
            ToolCall(id="call_fake07000providers", name="get_weather", args={"city": "SF"}),
            ToolCall(id="call_fake07001providers", name="get_weather", args={"city": "LA"}),
        )
    )
    assert response.stop_reason == "tool_calls"
    assert deltas.got == [
        ModelDelta(DeltaKind.TOOL_CALL, "get_weather"),
        ModelDelta(DeltaKind.TOOL_CALL, "get_weather"),
    ]
    [line] = fake.log
    assert line["usage"]["prompt_tokens"] == 93 + 1024 and line["usage"]["completion_tokens"] == 46
    assert response.usage == TokenUsage(
        input_tokens=93, output_tokens=46, cache_read_tokens=1024, reasoning_tokens=20, service_tier="default"
    )
    assert {k: v for k, v in line["expected"].items() if v} == {
        "input_tokens": 93,
        "output_tokens": 46,
        "cache_read_tokens": 1024,
        "reasoning_tokens": 20,
    }


async def test_openai_server_error_is_retried_by_the_sdk(fake: FakeModel) -> None:
    play(fake, Step([("text", "Recovered.")]))
    fake.fail_next(500)
    provider = OpenAIProvider(api_key="k", base_url=url(fake) + "/v1", max_retries=1)
    try:
        response = await provider.complete(request())
    finally:
        await provider.close()
    assert fake.failed == [500] and len(fake.requests) == 2
    assert response.message.text == "Recovered."


async def test_openai_retries_end_with_a_clear_error(fake: FakeModel) -> None:
    play(fake)
    fake.fail_next(503, 503, 503)
    provider = OpenAIProvider(api_key="k", base_url=url(fake) + "/v1", max_retries=1)
    try:
        with pytest.raises(ProviderError) as failure:
            await provider.complete(request())
    finally:
        await provider.close()
    assert str(failure.value) == "openai: HTTP 503: upstream failed with 503 (after 2 attempts)"
    assert failure.value.retryable and failure.value.status == 503
    assert fake.failed == [503, 503]


async def test_openai_bad_request_is_not_retried(fake: FakeModel) -> None:
    play(fake)
    fake.fail_next(400)
    provider = OpenAIProvider(api_key="k", base_url=url(fake) + "/v1", provider_name="vllm")
    try:
        with pytest.raises(ProviderError) as failure:
            await provider.complete(request())
    finally:
        await provider.close()
    assert str(failure.value) == "vllm: HTTP 400: max_tokens: too big"
    assert failure.value.status == 400 and not failure.value.retryable and fake.failed == [400]


async def test_openai_compatible_server_without_a_key(fake: FakeModel) -> None:
    play(fake, Step([("text", "Hi.")]))
    provider = OpenAIProvider(api_key=None, base_url=url(fake) + "/v1", provider_name="local")
    try:
        response = await provider.complete(request())
    finally:
        await provider.close()
    assert "authorization" not in fake.requests[0][1]
    assert (response.provider, response.message.text) == ("local", "Hi.")


async def test_openai_stalled_stream_times_out(fake: FakeModel) -> None:
    play(fake, Step([("text", "never finished")], stall=True))
    provider = OpenAIProvider(api_key="k", base_url=url(fake) + "/v1", timeout_s=0.5, max_retries=0)
    try:
        with pytest.raises(ProviderError) as failure:
            await provider.complete(request())
    finally:
        await provider.close()
    assert str(failure.value) == "openai: the stream stopped: nothing came within the timeout"


def test_unparsable_tool_arguments_are_kept_for_the_tool_to_refuse() -> None:
    assert _arguments('{"location": ') == {"_unparsed_arguments": '{"location": '}
    assert _arguments("[1]") == {"_unparsed_arguments": "[1]"}
    assert _arguments("  ") == {}
    assert _arguments('{"a": 1}') == {"a": 1}


# -- deltas of every provider, the loop -----------------------------------------------------------------------


@pytest.mark.parametrize("vendor", ["anthropic", "openai"])
async def test_deltas_end_with_done_and_the_stop_reason(fake: FakeModel, vendor: str) -> None:
    play(fake, Step([("text", ANSWER), ("tool", "get_weather", {"city": "SF"})]))
    deltas = Deltas()
    provider: AnthropicProvider | OpenAIProvider = (
        AnthropicProvider(api_key="k", base_url=url(fake))
        if vendor == "anthropic"
        else OpenAIProvider(api_key="k", base_url=url(fake) + "/v1")
    )
    try:
        response = await complete_with_deltas(provider, request(), deltas)
    finally:
        await provider.close()
    kinds = deltas.kinds()
    assert kinds[-2:] == [DeltaKind.TOOL_CALL, DeltaKind.DONE] and set(kinds[:-2]) == {DeltaKind.TEXT}
    assert deltas.got[-1].text == response.stop_reason == ("tool_use" if vendor == "anthropic" else "tool_calls")
    assert deltas.text() == ANSWER


async def test_a_provider_that_does_not_stream_gives_its_answer_as_deltas() -> None:
    script = {"conversations": [{"steps": [{"text": "Looking.", "tool_calls": [{"name": "shell"}]}]}]}
    scripted = ScriptedProvider(msgspec.convert(script, ReplyScript))
    deltas = Deltas()
    first = ModelRequest(model="m-1", system="", messages=(UserMessage(text="hi"),))
    response = await complete_with_deltas(scripted, first, deltas)
    assert deltas.got == [
        ModelDelta(DeltaKind.TEXT, "Looking."),
        ModelDelta(DeltaKind.TOOL_CALL, "shell"),
        ModelDelta(DeltaKind.DONE, response.stop_reason or ""),
    ]


async def test_a_loop_on_an_sdk_provider_records_the_model_call(fake: FakeModel, tmp_path: Path) -> None:
    play(fake, Step([("text", "Hello!")], usage={"input": 93, "cache_read": 1024, "output": 26, "reasoning": 20}))
    profile = write_profile(tmp_path, config='provider = "openai"\nmodel = "gpt-4o"\ntags = ["client:acme"]\n')
    provider = OpenAIProvider(api_key="k", base_url=url(fake) + "/v1")
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
        "gpt-4o",
        "req_fake07000providers",
        "stop",
    )
    assert (call.input_tokens, call.cache_read_tokens, call.output_tokens, call.reasoning_tokens) == (93, 1024, 46, 20)
    assert call.tags == ("client:acme",) and call.latency_s is not None
    assert json.loads(json.dumps(fake.requests[0][2]))["model"] == "gpt-4o"


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
