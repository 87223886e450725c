"""The loop's OpenTelemetry spans and metrics, in the GenAI semantic conventions.

With telemetry on (`commonos.runtime.telemetry`: `OTEL_EXPORTER_OTLP_ENDPOINT` set), each turn is an
`invoke_agent {profile}` span, each model call a `chat {model}` span inside it and each tool call an
`execute_tool {name}` span; a delegated child turn is an `invoke_agent` span inside its `execute_tool delegate`.
The events a turn publishes inside a span carry its `traceparent`. Our own ids ride along (`cos.session_id`,
`cos.turn_id`, and `cos.event_id`: the `model_call_completed` of a chat span, the `tool_call_recorded` of an
execute_tool span), so our OTLP gateway, receiving these spans, maps them onto the very events the loop
published and counts nothing twice. Content (messages, system instructions, tool arguments and results)
is recorded only with `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`.

Metrics: `gen_ai.client.token.usage` (histogram of tokens per call, `gen_ai.token.type` input or output;
input counts every input token, cached or not) and `gen_ai.client.operation.duration` (seconds per model call).

With telemetry off every helper returns a shared do-nothing object: no span, no attribute is built.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final

from commonos.accounting.usage import TokenUsage
from commonos.proto.identity import TurnInfo
from commonos.proto.messages import Message, ToolCall, ToolResultMessage, UserMessage
from commonos.runtime import telemetry

if TYPE_CHECKING:
    from opentelemetry.metrics import Histogram
    from opentelemetry.trace import Span

    from commonos.loop.journal import ToolCallRecord
    from commonos.loop.providers.base import ModelRequest, ModelResponse

#: The GenAI conventions' recommended bucket boundaries.
TOKEN_BUCKETS: Final = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
DURATION_BUCKETS: Final = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)


def gen_ai_input_tokens(usage: TokenUsage) -> int:
    """`gen_ai.usage.input_tokens`: every input token, cached or not (our buckets are disjoint)."""
    return usage.total_input_tokens


def gen_ai_cache_creation_tokens(usage: TokenUsage) -> int:
    return usage.cache_write_5m_tokens + usage.cache_write_1h_tokens


# -- metrics ------------------------------------------------------------------------------------------------


class _Instruments:
    def __init__(self, owner: telemetry.Telemetry | None, tokens: Histogram | None, duration: Histogram | None):
        self.owner = owner
        self.tokens = tokens
        self.duration = duration


_instruments = _Instruments(None, None, None)


def _metrics() -> _Instruments:
    global _instruments
    active = telemetry.active()
    if _instruments.owner is not active:
        meter = telemetry.meter()
        if meter is None:
            _instruments = _Instruments(active, None, None)
        else:
            _instruments = _Instruments(
                active,
                meter.create_histogram(
                    "gen_ai.client.token.usage",
                    unit="{token}",
                    description="Number of input and output tokens used",
                    explicit_bucket_boundaries_advisory=list(TOKEN_BUCKETS),
                ),
                meter.create_histogram(
                    "gen_ai.client.operation.duration",
                    unit="s",
                    description="GenAI operation duration",
                    explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS),
                ),
            )
    return _instruments


# -- content (opt-in) ---------------------------------------------------------------------------------------


def _parts(message: Message) -> dict[str, Any]:
    if isinstance(message, UserMessage):
        return {"role": "user", "parts": [{"type": "text", "content": message.text}]}
    if isinstance(message, ToolResultMessage):
        return {
            "role": "tool",
            "parts": [{"type": "tool_call_response", "id": message.call_id, "response": message.content}],
        }
    parts: list[dict[str, Any]] = []
    if message.text:
        parts.append({"type": "text", "content": message.text})
    parts += [{"type": "tool_call", "id": c.id, "name": c.name, "arguments": c.args} for c in message.tool_calls]
    return {"role": "assistant", "parts": parts}


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


# -- spans --------------------------------------------------------------------------------------------------


class _Off:
    """What every helper gives when telemetry is off: does nothing."""

    def __enter__(self) -> _Off:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def started(self, turn: TurnInfo) -> None:
        return None

    def finished(self, status: str, error: str | None) -> None:
        return None

    def completed(self, response: ModelResponse) -> None:
        return None

    def recorded(self, event_id: uuid.UUID) -> None:
        return None

    def tool_recorded(self, record: ToolCallRecord, event_id: uuid.UUID, outcome: str) -> None:
        return None


OFF: Final = _Off()


class _Turn:
    def __init__(self, span: Span) -> None:
        self.span = span

    def started(self, turn: TurnInfo) -> None:
        """The turn's identity, once its session is there."""
        span = self.span
        span.set_attribute("gen_ai.conversation.id", str(turn.session_id))
        span.set_attribute("cos.session_id", str(turn.session_id))
        span.set_attribute("cos.turn_id", str(turn.turn_id))
        span.set_attribute("cos.turn.depth", turn.depth)
        if turn.tags:
            span.set_attribute("cos.tags", list(turn.tags))

    def finished(self, status: str, error: str | None) -> None:
        self.span.set_attribute("cos.turn.status", status)
        if status != "completed":
            from opentelemetry.trace import Status, StatusCode

            self.span.set_attribute("error.type", f"turn_{status}")
            self.span.set_status(Status(StatusCode.ERROR, error or status))


@contextlib.contextmanager
def _turn_span(
    profile_id: str, provider: str, model: str, turn_id: uuid.UUID, session_id: uuid.UUID | None
) -> Iterator[_Turn]:
    tracer = telemetry.tracer()
    assert tracer is not None
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": profile_id,
        "gen_ai.agent.id": profile_id,
        "gen_ai.provider.name": provider,
        "gen_ai.request.model": model,
        "cos.profile_id": profile_id,
        # From the start, also on a request refused before its turn starts: the span is ours (our gateway
        # maps nothing of it).
        "cos.turn_id": str(turn_id),
    }
    if session_id is not None:
        attributes["gen_ai.conversation.id"] = attributes["cos.session_id"] = str(session_id)
    with tracer.start_as_current_span(f"invoke_agent {profile_id}", attributes=attributes) as span:
        try:
            yield _Turn(span)
        except BaseException as exc:  # refused before it started, cancelled, or a journal that failed
            span.set_attribute("error.type", type(exc).__name__)
            raise


def invoke_agent(
    profile_id: str, provider: str, model: str, turn_id: uuid.UUID, session_id: uuid.UUID | None = None
) -> contextlib.AbstractContextManager[_Turn | _Off]:
    """The span of turn `turn_id`, from its session's creation (a new session: `session_id` None) to its end:
    `started(turn)` once the turn has its identity, `finished(status, error)` as it ends. A child turn's
    nests in its parent's `execute_tool delegate`."""
    if telemetry.active() is None:
        return OFF
    return _turn_span(profile_id, provider, model, turn_id, session_id)


class _Chat:
    def __init__(self, span: Span, provider: str, model: str) -> None:
        self.span = span
        self.started = time.monotonic()
        self.provider = provider
        self.model = model
        self.response_model: str | None = None
        self.done = False

    def _metric_attributes(self) -> dict[str, Any]:
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": self.provider,
            "gen_ai.request.model": self.model,
        }
        if self.response_model:
            attributes["gen_ai.response.model"] = self.response_model
        return attributes

    def completed(self, response: ModelResponse) -> None:
        """The call's answer: its model, id, finish reason and usage, on the span and in the metrics."""
        self.done = True
        self.provider = response.provider
        self.response_model = response.model
        usage = response.usage
        span = self.span
        span.set_attribute("gen_ai.provider.name", response.provider)
        span.set_attribute("gen_ai.response.model", response.model)
        if response.request_id:
            span.set_attribute("gen_ai.response.id", response.request_id)
        if response.stop_reason:
            span.set_attribute("gen_ai.response.finish_reasons", [response.stop_reason])
        span.set_attribute("gen_ai.usage.input_tokens", gen_ai_input_tokens(usage))
        span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
        span.set_attribute("gen_ai.usage.cache_read.input_tokens", usage.cache_read_tokens)
        span.set_attribute("gen_ai.usage.cache_creation.input_tokens", gen_ai_cache_creation_tokens(usage))
        if usage.reasoning_tokens:
            span.set_attribute("gen_ai.usage.reasoning.output_tokens", usage.reasoning_tokens)
        if usage.usage_estimated:
            span.set_attribute("cos.usage_estimated", True)
        if telemetry.capture_content():
            span.set_attribute(
                "gen_ai.output.messages",
                _json([{**_parts(response.message), "finish_reason": response.stop_reason or "stop"}]),
            )
        instruments = _metrics()
        attributes = self._metric_attributes()
        if instruments.tokens is not None:
            instruments.tokens.record(gen_ai_input_tokens(usage), {**attributes, "gen_ai.token.type": "input"})
            instruments.tokens.record(usage.output_tokens, {**attributes, "gen_ai.token.type": "output"})
        if instruments.duration is not None:
            seconds = response.latency_s if response.latency_s is not None else time.monotonic() - self.started
            instruments.duration.record(seconds, attributes)

    def recorded(self, event_id: uuid.UUID) -> None:
        """The `model_call_completed` recorded for the call."""
        self.span.set_attribute("cos.event_id", str(event_id))

    def failed(self, exc: BaseException) -> None:
        instruments = _metrics()
        if instruments.duration is not None and not self.done:
            instruments.duration.record(
                time.monotonic() - self.started, {**self._metric_attributes(), "error.type": type(exc).__name__}
            )


@contextlib.contextmanager
def _chat_span(turn: TurnInfo, provider: str, request: ModelRequest) -> Iterator[_Chat]:
    tracer = telemetry.tracer()
    assert tracer is not None
    from opentelemetry.trace import SpanKind

    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        "gen_ai.request.model": request.model,
        "gen_ai.request.max_tokens": request.max_tokens,
        "gen_ai.conversation.id": str(turn.session_id),
        "cos.session_id": str(turn.session_id),
        "cos.turn_id": str(turn.turn_id),
    }
    if telemetry.capture_content():
        attributes["gen_ai.input.messages"] = _json([_parts(m) for m in request.messages])
        if request.system:
            attributes["gen_ai.system_instructions"] = _json([{"type": "text", "content": request.system}])
    with tracer.start_as_current_span(f"chat {request.model}", kind=SpanKind.CLIENT, attributes=attributes) as span:
        chat = _Chat(span, provider, request.model)
        try:
            yield chat
        except BaseException as exc:
            span.set_attribute("error.type", type(exc).__name__)
            chat.failed(exc)
            raise


def chat(turn: TurnInfo, provider: str, request: ModelRequest) -> contextlib.AbstractContextManager[_Chat | _Off]:
    """The span of one model call: `completed(response)` once answered, `recorded(event_id)` once recorded."""
    if telemetry.active() is None:
        return OFF
    return _chat_span(turn, provider, request)


class _Tool:
    def __init__(self, span: Span) -> None:
        self.span = span

    def tool_recorded(self, record: ToolCallRecord, event_id: uuid.UUID, outcome: str) -> None:
        """The `tool_call_recorded` of the call (run, refused or unknown)."""
        span = self.span
        span.set_attribute("cos.event_id", str(event_id))
        span.set_attribute("cos.tool_call_id", str(record.tool_call_id))
        span.set_attribute("cos.tool.outcome", outcome)
        if record.approval is not None:
            span.set_attribute("cos.tool.approval", record.approval.value)
        if telemetry.capture_content() and record.result is not None:
            span.set_attribute("gen_ai.tool.call.result", record.result)
        if record.is_error:
            from opentelemetry.trace import Status, StatusCode

            span.set_attribute("error.type", "tool_error" if outcome in ("ok", "error") else f"tool_{outcome}")
            span.set_status(Status(StatusCode.ERROR, (record.result or outcome)[:200]))


@contextlib.contextmanager
def _tool_span(turn: TurnInfo, call: ToolCall) -> Iterator[_Tool]:
    tracer = telemetry.tracer()
    assert tracer is not None
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": call.name,
        "gen_ai.tool.call.id": call.id,
        "gen_ai.tool.type": "function",
        "gen_ai.conversation.id": str(turn.session_id),
        "cos.session_id": str(turn.session_id),
        "cos.turn_id": str(turn.turn_id),
    }
    if telemetry.capture_content():
        attributes["gen_ai.tool.call.arguments"] = _json(call.args)
    with tracer.start_as_current_span(f"execute_tool {call.name}", attributes=attributes) as span:
        try:
            yield _Tool(span)
        except BaseException as exc:
            span.set_attribute("error.type", type(exc).__name__)
            raise


def execute_tool(turn: TurnInfo, call: ToolCall) -> contextlib.AbstractContextManager[_Tool | _Off]:
    """The span of one tool call, from its approval to its recorded result."""
    if telemetry.active() is None:
        return OFF
    return _tool_span(turn, call)


#: What `invoke_agent`, `chat` and `execute_tool` give (the do-nothing `OFF` when telemetry is off).
TurnSpan = _Turn | _Off
ChatSpan = _Chat | _Off
ToolSpan = _Tool | _Off
