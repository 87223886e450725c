"""The gateway with the real mappings, end to end: the OTLP payloads the real Claude Code and Codex CLIs sent
(`make clients`), posted over HTTP as they were (OTLP JSON, logs and metrics in file order) and posted once more
(an exporter's retry); GenAI spans from the OpenTelemetry SDK's exporter. What JetStream stores is exactly what
the pure mapping gives for the same payloads (nothing lost, nothing twice, the ordinals kept in NATS KV agree
with the in-memory ones), and the journal-writer and billing bill each call once."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import nats
from google.protobuf import json_format  # type: ignore[import-untyped]
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)

from commonos.otlp_gateway.common import MemoryOrdinals, Source
from commonos.otlp_gateway.mapping import map_logs
from commonos.proto.events import ModelCallCompleted, TurnFinished, event_type
from commonos.runtime.dlq import list_dead_letters
from tests.billing.support import billing
from tests.clients.support import recorded
from tests.otlp_gateway.conftest import make_token, post, run_gateway, stored_events
from tests.support import journal_writer, wait_caught_up

JSON = "application/json"
PROFILE = "otlp-e2e"


async def _known(gateway: Any, token: str) -> None:
    deadline = time.monotonic() + 5
    while gateway.running.tokens.lookup(token) is None:
        assert time.monotonic() < deadline, "the token was not known within 5 s"
        await asyncio.sleep(0.02)


async def test_recorded_clients_through_the_gateway_once_and_billed_once(nats_url: str, database_url: str) -> None:
    scenarios = recorded()
    assert scenarios
    expected: dict[Any, Any] = {}
    async with run_gateway(nats_url, map_logs=None, map_traces=None, publish_timeout_s=10.0) as gateway:
        token = await make_token(nats_url, PROFILE)
        await _known(gateway, token)
        for attempt in range(2):
            for item in scenarios:
                ordinals = MemoryOrdinals()
                for path in sorted((item.folder / "otlp").glob("*.json")):
                    body = path.read_bytes()
                    signal = "logs" if path.stem.endswith("-logs") else "metrics"
                    answer = await post(gateway.url, signal, body, token=token, content_type=JSON)
                    assert answer.status == 200, (item.id, path.name, answer.body)
                    if signal == "logs":
                        partial = json_format.Parse(answer.body, ExportLogsServiceResponse()).partial_success
                        assert (partial.rejected_log_records, partial.error_message) == (0, ""), (item.id, path.name)
                        if attempt == 0:
                            request = json_format.Parse(body, ExportLogsServiceRequest(), ignore_unknown_fields=True)
                            mapped = await map_logs(request, Source(profile_id=PROFILE), ordinals)
                            # The first of an id is what JetStream keeps (a later one is a duplicate).
                            for event in mapped.events:
                                expected.setdefault(event.event_id, event)
        published = gateway.metric("cos_otlp_events_published_total", {"type": "model_call_completed"})
    # The turns' ends are the sweeper's, once each turn has been quiet a while (test_turns.py checks them).
    stored = [e for e in await stored_events(nats_url) if not isinstance(e, TurnFinished)]
    # Exactly the pure mapping's events, each once: the retry stored nothing new.
    assert len(stored) == len({e.event_id for e in stored}) == len(expected)
    assert {e.event_id: e for e in stored} == expected
    calls = [e for e in stored if isinstance(e, ModelCallCompleted)]
    assert calls and published == len(calls)
    assert {event_type(e) for e in stored} >= {"session_created", "model_call_completed"}

    async with journal_writer(nats_url, database_url), billing(nats_url, database_url):
        nc = await nats.connect(nats_url)
        try:
            js = nc.jetstream()
            await wait_caught_up(js, database_url, "journal-writer")
            await wait_caught_up(js, database_url, "billing", table="billing_positions")
            assert await list_dead_letters(js) == []
        finally:
            await nc.close()
    conn = await asyncpg.connect(database_url)
    try:
        row = await conn.fetchrow(
            "SELECT count(*) AS n, sum(input_tokens) AS i, sum(output_tokens) AS o, sum(cache_read_tokens) AS r "
            "FROM model_calls"
        )
    finally:
        await conn.close()
    assert row is not None
    assert (row["n"], row["i"], row["o"], row["r"]) == (
        len(calls),
        sum(c.input_tokens for c in calls),
        sum(c.output_tokens for c in calls),
        sum(c.cache_read_tokens for c in calls),
    )


async def test_genai_spans_from_the_sdk_exporter_become_model_calls(nats_url: str) -> None:
    """A GenAI `chat` span sent by the SDK's OTLP/HTTP exporter, mapped by the real GenAI mapping."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    async with run_gateway(nats_url, map_logs=None, map_traces=None) as gateway:
        token = await make_token(nats_url, PROFILE)
        await _known(gateway, token)

        def send() -> None:
            provider = TracerProvider(resource=Resource.create({"service.name": "agent", "client": "acme"}))
            exporter = OTLPSpanExporter(
                endpoint=f"{gateway.url}/v1/traces", headers={"Authorization": f"Bearer {token}"}
            )
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            tracer = provider.get_tracer("e2e")
            with (
                tracer.start_as_current_span(
                    "invoke_agent helper", attributes={"gen_ai.operation.name": "invoke_agent"}
                ),
                tracer.start_as_current_span(
                    "chat claude-sonnet-4-5",
                    attributes={
                        "gen_ai.operation.name": "chat",
                        "gen_ai.provider.name": "anthropic",
                        "gen_ai.request.model": "claude-sonnet-4-5",
                        "gen_ai.response.id": "msg_e2e_1",
                        "gen_ai.usage.input_tokens": 120,
                        "gen_ai.usage.output_tokens": 30,
                    },
                ),
            ):
                pass
            provider.shutdown()

        await asyncio.to_thread(send)
        assert (
            gateway.metric("cos_otlp_requests_total", {"signal": "traces", "encoding": "protobuf", "code": "200"}) == 2
        )
    calls = [e for e in await stored_events(nats_url) if isinstance(e, ModelCallCompleted)]
    assert [(c.model, c.input_tokens, c.output_tokens) for c in calls] == [("claude-sonnet-4-5", 120, 30)]
    assert "client:acme" in calls[0].tags
