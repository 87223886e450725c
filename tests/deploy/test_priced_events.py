"""Priced calls on the stream: a subscriber that knows only the docs (deploy/examples/costs.py, under the
subscriber user) sums the `model_call_priced` events and gets `cos report cost`'s totals, by tag and in total,
after billing is SIGKILLed midway, after a reprice with billing SIGKILLed right after it, and after a replay of
billing (which republishes what it rebuilds under the same ids: the stream keeps one copy of each).

Everything runs as deployed: nats-server with deploy/nats/auth.conf, the admin creating the streams, billing
under its own NATS user (its relay process too), the loop's user publishing the calls."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from commonos.accounting.pricing import Pricer, load_price_file
from commonos.billing.metrics import BillingMetrics
from commonos.billing.projection import BillingProjection
from commonos.journal_writer.replay import replay
from commonos.proto.costs import decode_priced
from commonos.proto.events import ModelCallCompleted
from commonos.proto.ids import new_id
from commonos.proto.subjects import COSTS_STREAM
from commonos.runtime.postgres import connect
from commonos.runtime.settings import Settings
from tests.deploy.conftest import DEPLOY, SecuredNats, nats_password
from tests.deploy.system import _env, publish_as_loop
from tests.support import ServiceProcess, position, wait_for_position

EXAMPLE = DEPLOY / "examples" / "costs.py"
POSITIONS = "billing_positions"
CALLS = 1500

#: The reprice's price file: a model genai-prices does not know (unpriced until then), and an override of one it
#: knows (its calls change from `priced` to `override`).
PRICE_FILE = """
[[price]]
model = "local-llama-*"
input_mtok = "0.10"
cache_read_mtok = "0.05"
output_mtok = "0.20"

[[price]]
provider = "openai"
model = "o4-mini"
input_mtok = "2"
cache_read_mtok = "0.5"
output_mtok = "8"
"""

MODELS = (("anthropic", "claude-sonnet-4-5"), ("openai", "o4-mini"), ("ollama", "local-llama-3"))
CLIENTS = ("acme", "globex", "initech")


def make_calls(start: datetime) -> list[ModelCallCompleted]:
    calls = []
    for i in range(CALLS):
        provider, model = MODELS[i % len(MODELS)]
        tags = {f"client:{CLIENTS[(i // 3) % len(CLIENTS)]}"} | ({"team:core"} if i % 4 else set())
        calls.append(
            ModelCallCompleted(
                profile_id=("acme", "globex")[i % 2],
                session_id=new_id(),
                turn_id=new_id(),
                provider=provider,
                model=model,
                input_tokens=1000 + 37 * i,
                cache_read_tokens=(13 * i) % 5000,
                output_tokens=200 + (7 * i) % 900,
                tags=tuple(sorted(tags)),
                occurred_at=start + timedelta(seconds=i),
            )
        )
    return calls


async def cos(env: dict[str, str], *args: str) -> str:
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "commonos.cli", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, f"cos {' '.join(args)}: {done.stderr}"
    return done.stdout


async def report(database_url: str, since: datetime) -> tuple[Decimal, dict[str, Decimal]]:
    """`cos report cost`'s total and its amounts by client and by team tag."""
    env = {"COS_DATABASE_URL": database_url}
    total: Decimal | None = None
    by_tag: dict[str, Decimal] = {}
    for key in ("client", "team"):
        out = json.loads(
            await cos(
                env, "report", "cost", "--since", since.isoformat(), "--group-by", f"tag:{key}", "--format", "json"
            )
        )
        for group in out["groups"]:
            label = group["group"] if ":" in group["group"] else f"{key}:{group['group']}"
            by_tag[label] = Decimal(group["usd"] or 0)
        total = Decimal(out["total"]["usd"] or 0)
    assert total is not None
    return total, by_tag


async def subscriber_totals(secured_nats: SecuredNats) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COS_")} | {
        "COS_NATS_URL": secured_nats.url,
        "COS_NATS_USER": "subscriber",
        "COS_NATS_PASSWORD": nats_password("subscriber"),
    }
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, str(EXAMPLE), "--json", "--idle-exit", "2"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


async def wait_published(database_url: str, timeout_s: float = 90.0) -> None:
    """Until the outbox is empty: every priced call queued has been published."""
    conn = await connect(database_url)
    try:
        deadline = time.monotonic() + timeout_s
        while (queued := await conn.fetchval("SELECT count(*) FROM billing_outbox")) > 0:
            assert time.monotonic() < deadline, f"{queued} priced calls still queued after {timeout_s} s"
            await asyncio.sleep(0.1)
    finally:
        await conn.close()


async def assert_subscriber_equals_report(secured_nats: SecuredNats, database_url: str, since: datetime) -> int:
    total, by_tag = await report(database_url, since)
    seen = await subscriber_totals(secured_nats)
    assert Decimal(seen["total_usd"]) == total
    assert {t: Decimal(v) for t, v in seen["by_tag_usd"].items()} == by_tag
    assert seen["calls"] == CALLS
    events: int = seen["events"]
    return events


async def stream_messages(secured_nats: SecuredNats) -> int:
    admin = await secured_nats.connect("admin")
    info = await admin.jetstream().stream_info(COSTS_STREAM)
    return int(info.state.messages)


@pytest.mark.slow
async def test_a_subscriber_sums_the_priced_calls_to_the_reports_totals(
    secured_nats: SecuredNats, database_url: str, tmp_path: Path
) -> None:
    since = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=2)
    calls = make_calls(since + timedelta(minutes=1))
    admin_env = _env(secured_nats.url, database_url, "admin")
    await cos(admin_env, "streams", "ensure")
    loop = await secured_nats.connect("loop")
    # Half the calls first: billing is SIGKILLed once they are billed, before the rest is even published.
    half = await publish_as_loop(loop, calls[: CALLS // 2])

    billing = ServiceProcess("commonos.billing", _env(secured_nats.url, database_url, "billing"), tmp_path / "b.log")
    try:
        # SIGKILLed midway through the calls: what it committed is queued, the rest comes again.
        billing.start()
        await wait_for_position(database_url, "billing", half, timeout_s=120, table=POSITIONS)
        billing.kill()
        killed_at = await position(database_url, "billing", POSITIONS)
        last = await publish_as_loop(loop, calls[CALLS // 2 :])
        billing.start()
        await wait_for_position(database_url, "billing", last, timeout_s=120, table=POSITIONS)
        await wait_published(database_url)
        first = await assert_subscriber_equals_report(secured_nats, database_url, since)
        assert first == CALLS  # one event per call, none twice

        # A reprice with a price file: each changed call's correction is queued with it; billing SIGKILLed at
        # once (its relay may be mid-batch), then started again to publish the rest.
        (tmp_path / "prices.toml").write_text(PRICE_FILE)
        out = await cos(
            {"COS_DATABASE_URL": database_url},
            "billing",
            "reprice",
            "--since",
            since.isoformat(),
            "--price-file",
            str(tmp_path / "prices.toml"),
        )
        changed = 2 * CALLS // 3
        assert f"{CALLS} rows examined, {changed} changed" in out, out
        billing.kill()
        billing.start()
        await wait_published(database_url)
        assert await assert_subscriber_equals_report(secured_nats, database_url, since) == CALLS + changed
        stored = await stream_messages(secured_nats)
        assert stored == CALLS + changed

        # A replay of billing (tables emptied and rebuilt from the stream, with the same prices) queues every
        # call again under its revision-0 id: JetStream drops them all, a subscriber sees nothing new.
        billing.terminate()
        settings = Settings(
            nats_url=secured_nats.url,
            database_url=database_url,
            nats_user="admin",
            nats_password=nats_password("admin"),
        )
        pricer = Pricer(load_price_file(tmp_path / "prices.toml"))
        await replay(settings, truncate=True, projections=[BillingProjection(pricer, BillingMetrics())])
        billing.start()
        await wait_published(database_url)
        assert await stream_messages(secured_nats) == stored
        assert await assert_subscriber_equals_report(secured_nats, database_url, since) == CALLS + changed
    finally:
        if billing.alive:
            billing.kill()
    print(f"\npriced calls: {CALLS} calls, {changed} repriced; billing SIGKILLed at seq {killed_at} of {last}")


async def test_each_priced_event_matches_its_row(secured_nats: SecuredNats, database_url: str, tmp_path: Path) -> None:
    """Every event's fields are its call's row (cost, status, source, version, tags, profile, times), and its
    headers are the CloudEvents ones with `Nats-Msg-Id` = `ce-id` = `event_id`."""
    since = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
    calls = make_calls(since)[:60]
    await cos(_env(secured_nats.url, database_url, "admin"), "streams", "ensure")
    last = await publish_as_loop(await secured_nats.connect("loop"), calls)
    billing = ServiceProcess("commonos.billing", _env(secured_nats.url, database_url, "billing"), tmp_path / "b.log")
    billing.start()
    try:
        await wait_for_position(database_url, "billing", last, timeout_s=60, table=POSITIONS)
        await wait_published(database_url)
    finally:
        billing.terminate()
    admin = await secured_nats.connect("admin")
    sub = await admin.jetstream().subscribe("cos.costs.>", ordered_consumer=True, stream=COSTS_STREAM)
    conn = await connect(database_url)
    try:
        rows = {r["event_id"]: r for r in await conn.fetch("SELECT * FROM model_calls")}
        seen = 0
        while seen < len(calls):
            msg = await sub.next_msg(timeout=5)
            event = decode_priced(msg.data)
            row = rows[event.call_id]
            assert msg.subject == f"cos.costs.{row['profile_id']}.priced"
            headers = msg.headers or {}
            assert headers["Nats-Msg-Id"] == headers["ce-id"] == str(event.event_id)
            assert headers["ce-type"] == "cos.model_call_priced.v1"
            assert headers["ce-subject"] == str(event.call_id)
            assert (event.revision, event.previous_cost_usd) == (0, None)
            assert event.cost_usd == row["cost_usd"]
            assert event.cost_delta_usd == (row["cost_usd"] or Decimal(0))
            assert (event.cost_status, event.price_source, event.price_version) == (
                row["cost_status"],
                row["price_source"],
                row["price_version"],
            )
            assert (event.profile_id, event.session_id, event.turn_id) == (
                row["profile_id"],
                row["session_id"],
                row["turn_id"],
            )
            assert (event.provider, event.model, list(event.tags)) == (row["provider"], row["model"], row["tags"])
            assert event.called_at == row["created_at"]
            seen += 1
    finally:
        await conn.close()
