"""Prometheus end to end: a real Prometheus scrapes the running services; every query of every Grafana panel
returns data and every alert rule evaluates.

The services run as processes under their own NATS users (tests/deploy/system.py); the events include a chat
served by the loop (turns, tool calls, model latency), a priced and an unpriced model call, and an event that
cannot be decoded (dead letters); the OTLP gateway receives GenAI spans, the logs and metrics the real Claude
Code CLI exported, and a request without a token.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from commonos.runtime.embedded import free_port
from tests.deploy.conftest import DEPLOY, SecuredNats
from tests.deploy.system import (
    OTLP_PROFILE,
    RunningSystem,
    chat,
    claude_code_metric_total,
    publish_as_loop,
    publish_poison,
    running_system,
    sample_events,
    send_otlp,
    wait_until_projected,
)
from tests.support import wait_http

pytestmark = pytest.mark.slow

#: What Grafana puts in for its built-in variables, at the test's 1 s scrape interval.
GRAFANA_VARIABLES = {"$__rate_interval": "15s", "$__interval": "5s", "$__range": "5m"}


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of the dashboard, Grafana's variables filled in."""
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "commonos.json").read_text())
    queries = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, f"{panel['title']}: unknown variable in {expr}"
            queries.append((panel["title"], expr))
    return queries


def alert_rules() -> list[tuple[str, str]]:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    return [(rule["alert"], rule["expr"]) for group in rules["groups"] for rule in group["rules"]]


@contextlib.asynccontextmanager
async def prometheus(system: RunningSystem, tmp_path: Path) -> AsyncIterator[str]:
    """Debian's prometheus, scraping the system every second with deploy/prometheus/alerts.yml loaded."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is not installed: apt-get install -y prometheus"
    folder = tmp_path / "prometheus"
    folder.mkdir()
    shutil.copy(DEPLOY / "prometheus" / "alerts.yml", folder / "alerts.yml")
    jobs = {
        "loop": [system.loop],
        "journal-writer": system.writers,
        "billing": [system.billing],
        "otlp-gateway": [system.gateway],
    }
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["alerts.yml"],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{p.http_port}" for p in processes]}]}
            for job, processes in jobs.items()
        ],
    }
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    with (folder / "prometheus.log").open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            binary,
            f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            await wait_http(url + "/-/ready", timeout_s=60)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{(folder / 'prometheus.log').read_text()[-3000:]}") from None
        yield url
    finally:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def query(http: aiohttp.ClientSession, url: str, expr: str) -> dict[str, Any]:
    async with http.get(url + "/api/v1/query", params={"query": expr}) as resp:
        body: dict[str, Any] = await resp.json()
    return body


async def values(http: aiohttp.ClientSession, url: str, expr: str) -> dict[str, float]:
    """The instant vector of `expr`, keyed by its labels (`k=v,…`)."""
    body = await query(http, url, expr)
    assert body["status"] == "success", body
    return {
        ",".join(f"{k}={v}" for k, v in sorted(r["metric"].items())): float(r["value"][1])
        for r in body["data"]["result"]
    }


async def test_every_panel_has_data_and_every_alert_evaluates(
    secured_nats: SecuredNats, database_url: str, tmp_path: Path
) -> None:
    async with running_system(secured_nats, database_url, tmp_path) as system, prometheus(system, tmp_path) as url:
        admin = await secured_nats.connect("admin")
        loop = await secured_nats.connect("loop")
        await publish_as_loop(loop, sample_events())
        await publish_poison(loop)
        reply = await chat(admin, "what is in the workspace?")
        assert reply.status == "completed", system.outputs()
        statuses = await send_otlp(system)
        assert statuses == {"traces": 200, "logs": 200, "metrics": 200, "no token": 401}, system.outputs()
        await wait_until_projected(database_url, admin.jetstream())

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            # Panels: every query returns at least one series once the services' metrics have been scraped.
            pending = panel_queries()
            deadline = time.monotonic() + 60
            while pending and time.monotonic() < deadline:
                results = [await query(http, url, expr) for _, expr in pending]
                for (title, expr), body in zip(pending, results, strict=True):
                    assert body["status"] == "success", f"{title}: {expr}: {body}"
                pending = [q for q, body in zip(pending, results, strict=True) if not body["data"]["result"]]
                if pending:
                    await asyncio.sleep(0.5)
            assert not pending, "panels without data:\n" + "\n".join(f"{t}: {e}" for t, e in pending)

            # Alert rules: each expression parses and evaluates, by the API and in Prometheus's own rule engine.
            for name, expr in alert_rules():
                body = await query(http, url, expr)
                assert body["status"] == "success", f"{name}: {body}"
            evaluated: dict[str, str] = {}
            deadline = time.monotonic() + 30
            while len(evaluated) < len(alert_rules()) and time.monotonic() < deadline:
                async with http.get(url + "/api/v1/rules") as resp:
                    groups = (await resp.json())["data"]["groups"]
                evaluated = {
                    rule["name"]: rule["health"]
                    for group in groups
                    for rule in group["rules"]
                    if not rule["lastEvaluation"].startswith("0001-")
                }
                await asyncio.sleep(0.5)
            assert evaluated == {name: "ok" for name, _ in alert_rules()}

            # The panels show what happened.
            dead = await values(http, url, "sum by (consumer) (cos_consumer_dead_letters_total)")
            # the poison event, once by each consumer of its partition that reads its subject
            assert set(dead.values()) == {1.0}
            assert "journal-writer" in {key.removeprefix("consumer=").split("-p")[0] for key in dead}
            cost = await values(http, url, "sum by (model) (cos_billing_cost_usd_total)")
            assert cost["model=claude-sonnet-4-5"] > 0 and cost["model=mystery-1"] == 0
            unpriced = await values(http, url, "sum by (model) (cos_billing_unpriced_calls_total)")
            assert unpriced["model=mystery-1"] == 1 and unpriced["model=scripted-e2e"] == 2
            # Every known label set is there from the start, at 0 until its first event.
            turns = await values(http, url, "sum by (status) (cos_loop_turns_total)")
            assert turns == {
                "status=completed": 1.0,
                "status=failed": 0,
                "status=cancelled": 0,
                "status=interrupted": 0,
            }
            tools = await values(http, url, "sum by (tool) (cos_loop_tool_calls_total)")
            assert tools == {"tool=list_dir": 1.0}
            up = await values(http, url, 'up{job=~"loop|journal-writer|billing|otlp-gateway"}')
            assert len(up) == 5 and set(up.values()) == {1.0}
            refused = await values(http, url, "sum by (reason) (cos_otlp_refused_total)")
            assert {k: v for k, v in refused.items() if v} == {"reason=unauthenticated": 1.0}
            assert refused["reason=unavailable"] == 0
            requests = await values(http, url, "sum by (signal, code) (cos_otlp_requests_total)")
            assert {k: v for k, v in requests.items() if v} == {
                "code=200,signal=logs": 1.0,
                "code=200,signal=metrics": 1.0,
                "code=200,signal=traces": 1.0,
                "code=401,signal=traces": 1.0,
            }
            records = await values(http, url, "sum by (signal, outcome) (cos_otlp_records_total)")
            assert records["outcome=accepted,signal=traces"] == 1  # the chat span: a model call
            assert records["outcome=accepted,signal=logs"] > 0 and records["outcome=accepted,signal=metrics"] > 0
            published = await values(http, url, "sum(cos_otlp_events_published_total)")
            assert published[""] > 0
            # The client's own cost, exposed exactly as it reported it, under the token's profile.
            reported = await values(
                http, url, 'sum by (profile) (cos_otlp_client_metric{metric="claude_code.cost.usage"})'
            )
            reported_usd = claude_code_metric_total("claude_code.cost.usage")
            assert reported_usd > 0 and reported == {f"profile={OTLP_PROFILE}": pytest.approx(reported_usd)}
