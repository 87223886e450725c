"""Every labelled counter and gauge an alert watches is on `/metrics` at 0 from the service's start, with its known
label sets, before its first event: a dashboard then shows 0, and an alert tells "none" from "not scraped".

Each service is its own fresh process (nothing counted yet) on real servers; its `/metrics` is read as Prometheus
reads it, once it is ready and before anything was sent to it."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from commonos.runtime.embedded import NatsServer
from tests.conftest import REPO
from tests.otlp_gateway.conftest import make_token
from tests.support import ServiceProcess, wait_http

pytestmark = pytest.mark.slow

BUDGETS = """
[[budget]]
name = "acme-monthly"
tag = "client:acme"
limit_usd = 100
warn_at = [50, 80]

[[budget]]
name = "site-daily"
tag = "project:site"
limit_usd = "5.50"
period = "day"
"""


async def samples(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Every sample of `/metrics`: name -> (sorted labels) -> value."""
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        assert r.status == 200
        text = await r.text()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def at_zero(found: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str, **labels: str) -> None:
    series = found.get(name)
    assert series is not None, f"{name} is not on /metrics"
    key = tuple(sorted(labels.items()))
    assert key in series, f"{name}{labels} is not on /metrics; it has {sorted(series)}"
    assert series[key] == 0.0, (name, labels, series[key])


async def test_every_watched_series_is_there_at_zero_before_its_first_event(
    nats_server: NatsServer, database_url: str, tmp_path: Path
) -> None:
    budgets = tmp_path / "billing.toml"
    budgets.write_text(BUDGETS)
    env = {
        "COS_NATS_URL": nats_server.url,
        "COS_DATABASE_URL": database_url,
        "COS_PROFILES_DIR": str(REPO / "profiles"),
        "COS_BILLING_CONFIG": str(budgets),
        "COS_OTLP_PORT": "0",
        "COS_OTLP_GRPC_PORT": "0",
    }
    await make_token(nats_server.url, "zero-profile")  # the gateway's client metrics are per profile with a token
    services = {
        "journal-writer": ServiceProcess("commonos.journal_writer", env, tmp_path / "journal-writer.log"),
        "billing": ServiceProcess("commonos.billing", env, tmp_path / "billing.log"),
        "loop": ServiceProcess("commonos.loop", env, tmp_path / "loop.log", args=("serve",)),
        "otlp-gateway": ServiceProcess("commonos.otlp_gateway", env, tmp_path / "otlp-gateway.log"),
    }
    for service in services.values():
        service.start()
    try:
        for name, service in services.items():
            try:
                await wait_http(service.url + "/readyz", 200, timeout_s=90)
            except AssertionError:
                raise AssertionError(f"{name} not ready:\n{service.output()}") from None
        writer = await samples(services["journal-writer"].url)
        at_zero(writer, "cos_consumer_database_retries_total", consumer="journal-writer")
        at_zero(writer, "cos_consumer_redeliveries_skipped_total", consumer="journal-writer")

        bill = await samples(services["billing"].url)
        at_zero(bill, "cos_consumer_database_retries_total", consumer="billing")
        at_zero(bill, "cos_consumer_redeliveries_skipped_total", consumer="billing")
        at_zero(bill, "cos_billing_unpriced_calls_total", provider="other", model="other")
        at_zero(bill, "cos_billing_priced_queued")
        at_zero(bill, "cos_billing_priced_oldest_seconds")
        at_zero(bill, "cos_billing_priced_held")
        at_zero(bill, "cos_billing_relay_restarts_total")
        for budget in ("acme-monthly", "site-daily"):
            at_zero(bill, "cos_billing_budget_spent_usd", budget=budget)
            at_zero(bill, "cos_billing_budget_exceeded", budget=budget)
            at_zero(bill, "cos_billing_budget_alerts_total", budget=budget)
        for percent in ("50", "80"):
            at_zero(bill, "cos_billing_budget_warnings_total", budget="acme-monthly", percent=percent)
        assert bill["cos_billing_budget_limit_usd"][(("budget", "acme-monthly"),)] == 100.0

        loop = await samples(services["loop"].url)
        at_zero(loop, "cos_loop_model_call_errors_total", gen_ai_system="scripted")
        for status in ("completed", "failed", "cancelled", "interrupted"):
            at_zero(loop, "cos_loop_turns_total", status=status)

        gateway = await samples(services["otlp-gateway"].url)
        for metric in ("claude_code.token.usage", "claude_code.cost.usage", "claude_code.session.count"):
            at_zero(
                gateway,
                "cos_otlp_client_metric",
                metric=metric,
                profile="zero-profile",
                type="",
                model="",
                decision="",
                tool_name="",
                source="",
            )
        for reason in ("unauthenticated", "unavailable", "bad_request", "grpc_on_http_port"):
            at_zero(gateway, "cos_otlp_refused_total", reason=reason)
        for signal in ("traces", "logs", "metrics"):
            at_zero(gateway, "cos_otlp_grpc_requests_total", signal=signal, code="UNAVAILABLE")
            at_zero(gateway, "cos_otlp_records_total", signal=signal, outcome="rejected")
        at_zero(gateway, "cos_otlp_events_published_total", type="model_call_completed")
    finally:
        for service in services.values():
            if service.alive:
                service.terminate()
