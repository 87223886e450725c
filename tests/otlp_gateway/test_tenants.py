"""Two profiles sending the same vendor ids through one gateway, on real servers (nats-server, PostgreSQL, the
journal-writer and billing): neither suppresses, shadows or dead-letters the other's records, whichever comes
first, and each is told nothing was refused."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import nats
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from commonos.runtime.dlq import list_dead_letters
from tests.billing.support import billing
from tests.otlp_gateway.conftest import make_token, post, run_gateway, stored_events
from tests.otlp_gateway.logs import claude, codex, kvs, record
from tests.support import journal_writer, wait_caught_up

PB = "application/x-protobuf"
SESSION = "5e551011-0000-4000-8000-000000000001"
CONVERSATION = "01a23336-3758-7411-aba1-000000000002"


def api_request(request_id: str, input_tokens: int, seconds: float) -> Any:
    attrs = {
        "session.id": SESSION,
        "prompt.id": "p1",
        "model": "claude-sonnet-4-5",
        "input_tokens": input_tokens,
        "output_tokens": 1,
        "request_id": request_id,
    }
    return record("api_request", attrs, seconds)


def response_completed(input_tokens: int, seconds: float) -> Any:
    attrs = {
        "conversation.id": CONVERSATION,
        "model": "gpt-5-codex",
        "event.kind": "response.completed",
        "input_token_count": str(input_tokens),
        "output_token_count": "1",
    }
    return record("codex.sse_event", attrs, seconds, nanos=False)


def chat_span(input_tokens: int) -> ExportTraceServiceRequest:
    span = Span(
        trace_id=b"\x07" * 16,
        span_id=b"\x01" * 8,
        name="chat",
        start_time_unix_nano=1_790_000_000_000_000_000,
        end_time_unix_nano=1_790_000_001_000_000_000,
        attributes=kvs(
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.conversation.id": "conversation-1",
                "gen_ai.provider.name": "anthropic",
                "gen_ai.request.model": "claude-sonnet-4-5",
                "gen_ai.response.id": "msg_shared_1",
                "gen_ai.usage.input_tokens": input_tokens,
                "gen_ai.usage.output_tokens": 1,
            }
        ),
    )
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[span])])])


async def _known(gateway: Any, *tokens: str) -> None:
    deadline = time.monotonic() + 5
    while any(gateway.running.tokens.lookup(t) is None for t in tokens):
        assert time.monotonic() < deadline, "the tokens were not known within 5 s"
        await asyncio.sleep(0.02)


async def test_one_profile_cannot_shadow_anothers_calls(nats_url: str, database_url: str) -> None:
    """Issue #29 (3): beta's `req_1` of session S made acme's `req_1` of S a duplicate and its `req_2` a
    `profile_mismatch` dead letter, answered 200. The same holds for Codex's conversation ordinals and a GenAI
    response id. Each profile's calls are now its own."""
    async with run_gateway(nats_url, map_logs=None, map_traces=None) as gateway:
        beta, acme = await make_token(nats_url, "beta"), await make_token(nats_url, "acme")
        await _known(gateway, beta, acme)
        sent: list[tuple[str, Any, str, bytes]] = [
            ("logs", ExportLogsServiceResponse, beta, claude(api_request("req_1", 1, 1.0)).SerializeToString()),
            ("logs", ExportLogsServiceResponse, beta, codex(response_completed(2, 1.0)).SerializeToString()),
            ("traces", ExportTraceServiceResponse, beta, chat_span(3).SerializeToString()),
            (
                "logs",
                ExportLogsServiceResponse,
                acme,
                claude(api_request("req_1", 1000, 2.0), api_request("req_2", 2000, 3.0)).SerializeToString(),
            ),
            (
                "logs",
                ExportLogsServiceResponse,
                acme,
                codex(response_completed(3000, 2.0), response_completed(4000, 3.0)).SerializeToString(),
            ),
            ("traces", ExportTraceServiceResponse, acme, chat_span(5000).SerializeToString()),
        ]
        for signal, response, token, body in sent:
            answer = await post(gateway.url, signal, body, token=token, content_type=PB)
            assert answer.status == 200, answer.body
            assert not response.FromString(answer.body).HasField("partial_success"), answer.body

    async with journal_writer(nats_url, database_url), billing(nats_url, database_url):
        nc = await nats.connect(nats_url)
        try:
            js = nc.jetstream()
            await wait_caught_up(js, database_url, "journal-writer")
            await wait_caught_up(js, database_url, "billing", table="billing_positions")
            letters = await list_dead_letters(js)
        finally:
            await nc.close()
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT profile_id, provider, input_tokens FROM model_calls")
        sessions = await conn.fetch("SELECT profile_id, source FROM sessions")
    finally:
        await conn.close()
    assert letters == []
    assert sorted((r["profile_id"], r["provider"], r["input_tokens"]) for r in rows) == [
        ("acme", "anthropic", 1000),
        ("acme", "anthropic", 2000),
        ("acme", "anthropic", 5000),
        ("acme", "openai", 3000),
        ("acme", "openai", 4000),
        ("beta", "anthropic", 1),
        ("beta", "anthropic", 3),
        ("beta", "openai", 2),
    ]
    assert sorted((r["profile_id"], r["source"]) for r in sessions) == [
        ("acme", "claude-code"),
        ("acme", "codex"),
        ("acme", "otel"),
        ("beta", "claude-code"),
        ("beta", "codex"),
        ("beta", "otel"),
    ]


async def test_a_token_gives_only_the_tags_its_profile_allows(nats_url: str) -> None:
    """Issue #29 (8): any token could tag its calls `client:<anyone>` (and so fill another client's costs and
    budgets). A token made with `--tag client:acme --tag-keys project` gives every event `client:acme`, lets
    its senders set `project` only, and says in the partial success which tags it left out; the records are
    stored all the same. A token made without either is as before."""
    resource = {"client": "other", "project": "site", "team": "x", "cos.tag.cost-center": "cc42"}
    async with run_gateway(nats_url, map_logs=None, map_traces=None) as gateway:
        pinned = await make_token(nats_url, "acme", tags=("client:acme",), tag_keys=("project",))
        free = await make_token(nats_url, "beta")
        await _known(gateway, pinned, free)
        logs = claude(api_request("req_tags", 1, 1.0), resource=resource).SerializeToString()
        answer = await post(gateway.url, "logs", logs, token=pinned, content_type=PB)
        assert answer.status == 200, answer.body
        partial = ExportLogsServiceResponse.FromString(answer.body).partial_success
        assert partial.rejected_log_records == 0
        for left_out in ("client:other", "team:x", "cost-center:cc42"):
            assert left_out in partial.error_message, partial.error_message
        traces = chat_span(7)
        traces.resource_spans[0].resource.attributes.extend(kvs(resource))
        answer = await post(gateway.url, "traces", traces.SerializeToString(), token=pinned, content_type=PB)
        partial_spans = ExportTraceServiceResponse.FromString(answer.body).partial_success
        assert partial_spans.rejected_spans == 0 and "client:other" in partial_spans.error_message
        answer = await post(gateway.url, "logs", logs, token=free, content_type=PB)
        assert not ExportLogsServiceResponse.FromString(answer.body).HasField("partial_success")
    calls = {(e.profile_id, e.request_id): e.tags for e in await stored_events(nats_url) if hasattr(e, "request_id")}
    assert calls == {
        ("acme", "req_tags"): ("client:acme", "project:site", "vendor:claude-code"),
        ("acme", "msg_shared_1"): ("client:acme", "project:site"),
        ("beta", "req_tags"): ("client:other", "cost-center:cc42", "project:site", "team:x", "vendor:claude-code"),
    }
