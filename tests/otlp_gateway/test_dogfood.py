"""Dogfood: the loop's own OpenTelemetry, exported to our own OTLP gateway, is received and changes nothing.

The loop publishes its events itself; its spans carry our ids (`cos.turn_id`), and the gateway maps them to
nothing, so every session, turn, tool call and model call is stored once, exactly as without the gateway.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from nats.js import JetStreamContext

from commonos.loop.loop import TurnRequest
from commonos.loop.profiles import Profile
from commonos.proto import events as ev
from commonos.runtime import telemetry
from commonos.runtime.postgres import connect
from tests.billing.support import billing
from tests.loop.helpers import write_profile
from tests.loop.test_telemetry import CONFIG, SCRIPT, make_loop, stored_messages
from tests.otlp_gateway.conftest import make_token, run_gateway
from tests.support import journal_writer, wait_caught_up

OTEL_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_METRICS_EXPORTER",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    telemetry.CAPTURE_CONTENT_ENV,
)


async def test_the_loops_spans_sent_to_our_gateway_are_received_and_change_nothing(
    monkeypatch: pytest.MonkeyPatch,
    streams: JetStreamContext,
    nats_url: str,
    database_url: str,
    tmp_path: Path,
) -> None:
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    profile: Profile = write_profile(tmp_path / "profiles", config=CONFIG, script=SCRIPT)
    token = await make_token(nats_url, profile=profile.id)
    async with run_gateway(nats_url, map_logs=None, map_traces=None) as gateway:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", gateway.url)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"Authorization=Bearer {token}")
        monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "client=acme")
        tel = telemetry.setup("commonos-loop")
        assert tel is not None
        try:
            result = await make_loop(streams, profile).run_turn(TurnRequest(profile_id=profile.id, text="plan it"))
        finally:
            await tel.aclose()  # flushes: every span is exported to the gateway now
        assert result.status is ev.TurnStatus.COMPLETED
        # Every span of the turn reached the gateway, was accepted and mapped to nothing.
        spans = {"outcome": "ignored", "signal": "traces"}
        assert gateway.metric("cos_otlp_records_total", spans) == 8  # 2 invoke_agent, 4 chat, 2 execute_tool
        assert gateway.metric("cos_otlp_records_total", {"outcome": "rejected", "signal": "traces"}) == 0
        assert gateway.metric("cos_otlp_requests_total", {"signal": "traces", "encoding": "protobuf", "code": "200"})
        assert gateway.metric("cos_otlp_refused_total", {"reason": "unauthenticated"}) == 0

    events = [e for e, _ in await stored_messages(streams)]
    calls = [e for e in events if isinstance(e, ev.ModelCallCompleted)]
    assert len(calls) == 4 and len({c.event_id for c in calls}) == 4
    assert len([e for e in events if isinstance(e, ev.SessionCreated)]) == 2  # the turn's and its delegate's
    assert len([e for e in events if isinstance(e, ev.ToolCallRecorded)]) == 2

    # Projected and billed: once each, with the loop's own figures.
    async with journal_writer(nats_url, database_url), billing(nats_url, database_url):
        await wait_caught_up(streams, database_url, "journal-writer")
        await wait_caught_up(streams, database_url, "billing", table="billing_positions")
    conn = await connect(database_url)
    try:
        rows = await conn.fetch("SELECT event_id, input_tokens, output_tokens FROM model_calls")
        assert {(r["event_id"], r["input_tokens"], r["output_tokens"]) for r in rows} == {
            (c.event_id, c.input_tokens, c.output_tokens) for c in calls
        }
        assert await conn.fetchval("SELECT count(*) FROM sessions") == 2
        assert await conn.fetchval("SELECT count(*) FROM tool_calls") == 2
    finally:
        await conn.close()
