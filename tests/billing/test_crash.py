"""10,000 model calls, each delivered at least twice, billing SIGKILLed twice midway: exactly-once rows and cost.

The expected total is computed here from the vendors' published per-million-token prices (and the test's own
price file for the override model), never with the Pricer: each call's cost is quantized to 1e-10 USD as a
stored cost is, then summed.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest

from commonos.proto.events import ModelCallCompleted
from commonos.proto.ids import new_id
from tests.billing.support import POSITIONS, publish_copies, recent_start, stored_alerts, usd
from tests.factories import Clock
from tests.support import ServiceProcess, position, wait_for_position


@dataclass(frozen=True)
class Prices:
    """USD per million tokens: input, cache read, 5m cache write, 1h cache write, output (reasoning inside)."""

    input: str
    cache_read: str
    cache_write_5m: str
    cache_write_1h: str
    output: str


#: (provider, model) -> published prices (None: no price anywhere, the row is unpriced).
MODELS: dict[tuple[str, str], Prices | None] = {
    # Anthropic: Claude Sonnet 4.5 (up to 200k input), Claude Haiku 4.5.
    ("anthropic", "claude-sonnet-4-5"): Prices("3", "0.30", "3.75", "6", "15"),
    ("claude-code", "claude-haiku-4-5"): Prices("1", "0.10", "1.25", "2", "5"),
    # OpenAI: o4-mini ($0.275 cached input); Codex gpt-5-codex priced as GPT-5 ($0.125 cached input).
    ("openai", "o4-mini"): Prices("1.10", "0.275", "1.10", "1.10", "4.40"),
    ("codex", "gpt-5-codex"): Prices("1.25", "0.125", "1.25", "1.25", "10"),
    # The test's price file.
    ("ollama", "local-llama-3"): Prices("0.10", "0.05", "0.10", "0.10", "0.20"),
    ("openai", "gpt-99-imaginary"): None,
}

PRICE_FILE = """
[[price]]
model = "local-llama-*"
input_mtok = "0.10"
cache_read_mtok = "0.05"
output_mtok = "0.20"
"""

BILLING_CONFIG = """
[[budget]]
name = "acme-month"
tag = "client:acme"
period = "month"
limit_usd = "{limit}"

[metrics]
tag_label_keys = ["client"]
"""

TOTAL = 10_000


def make_calls(rng: random.Random) -> list[ModelCallCompleted]:
    clock = Clock(now=recent_start())
    models = list(MODELS)
    calls = []
    for _ in range(TOTAL):
        provider, model = rng.choice(models)
        anthropic = provider in ("anthropic", "claude-code")
        output = rng.randint(1, 4000)
        calls.append(
            ModelCallCompleted(
                profile_id=rng.choice(["default", "ops"]),
                session_id=new_id(),
                turn_id=new_id(),
                provider=provider,
                model=model,
                input_tokens=rng.randint(0, 20_000),
                cache_read_tokens=rng.randint(0, 100_000),
                cache_write_5m_tokens=rng.randint(0, 10_000) if anthropic else 0,
                cache_write_1h_tokens=rng.randint(0, 5000) if anthropic else 0,
                output_tokens=output,
                reasoning_tokens=0 if anthropic else rng.randint(0, output),
                tags=tuple(sorted({f"client:{rng.choice(['acme', 'globex', 'initech'])}", "team:core"})),
                occurred_at=clock.tick(1),
            )
        )
    return calls


def expected_cost(call: ModelCallCompleted) -> Decimal | None:
    prices = MODELS[call.provider, call.model]
    if prices is None:
        return None
    return usd(
        (call.input_tokens, prices.input),
        (call.cache_read_tokens, prices.cache_read),
        (call.cache_write_5m_tokens, prices.cache_write_5m),
        (call.cache_write_1h_tokens, prices.cache_write_1h),
        (call.output_tokens, prices.output),
    )


async def wait_past(dsn: str, seq: int) -> int:
    await wait_for_position(dsn, "billing", seq, timeout_s=120, table=POSITIONS)
    return await position(dsn, "billing", POSITIONS)


@pytest.mark.slow
async def test_ten_thousand_calls_delivered_twice_with_two_sigkills(
    nats_url: str, database_url: str, tmp_path: Path
) -> None:
    calls = make_calls(random.Random(11))
    costs = [expected_cost(c) for c in calls]
    expected_total = sum((c for c in costs if c is not None), Decimal(0))
    acme_total = sum(
        (c for c, e in zip(costs, calls, strict=True) if c is not None and "client:acme" in e.tags), Decimal(0)
    )
    (tmp_path / "prices.toml").write_text(PRICE_FILE)
    # The budget is crossed about half way through acme's calls.
    (tmp_path / "billing.toml").write_text(BILLING_CONFIG.format(limit=(acme_total / 2).quantize(Decimal("0.01"))))

    # Each event twice in the stream (distinct Nats-Msg-Id): the second copies in another order.
    first = await publish_copies(nats_url, calls, copy=1)
    shuffled = calls[:]
    random.Random(5).shuffle(shuffled)
    second = await publish_copies(nats_url, shuffled, copy=2)
    last = max(a.seq for a in first + second)
    assert last == 2 * TOTAL

    env = {
        "COS_NATS_URL": nats_url,
        "COS_DATABASE_URL": database_url,
        "COS_PRICE_FILE": str(tmp_path / "prices.toml"),
        "COS_BILLING_CONFIG": str(tmp_path / "billing.toml"),
    }
    service = ServiceProcess("commonos.billing", env, tmp_path / "billing.log")
    kills = []
    started = time.perf_counter()
    try:
        for stop_at in (last // 4, (last * 3) // 5):
            service.start()
            reached = await wait_past(database_url, stop_at)
            service.kill()
            kills.append(reached)
            assert reached < last, f"the SIGKILL at {reached} was not midway (stream ends at {last})"
        service.start()
        resumed_at = time.perf_counter()
        from_seq = await position(database_url, "billing", POSITIONS)
        await wait_past(database_url, last)
        final_leg_s = time.perf_counter() - resumed_at
        assert service.terminate() == 0
    finally:
        if service.alive:
            service.kill()
    elapsed = time.perf_counter() - started
    print(
        f"\nbilling: {last} deliveries of {TOTAL} calls, SIGKILLed at stream seq {kills}; "
        f"total {elapsed:.1f}s; last leg {last - from_seq} deliveries in {final_leg_s:.2f}s "
        f"(process start included): {(last - from_seq) / final_leg_s:,.0f} deliveries/s"
    )

    from commonos.runtime.postgres import connect

    conn = await connect(database_url)
    try:
        stored = await conn.fetchrow(
            "SELECT count(*) AS n, count(DISTINCT event_id) AS ids, sum(cost_usd) AS usd, "
            "count(*) FILTER (WHERE cost_usd IS NULL) AS unpriced FROM model_calls"
        )
        assert (stored["n"], stored["ids"]) == (TOTAL, TOTAL)
        assert stored["usd"] == expected_total
        assert stored["unpriced"] == sum(1 for c in costs if c is None)
        by_event = {
            r["event_id"]: r["cost_usd"] for r in await conn.fetch("SELECT event_id, cost_usd FROM model_calls")
        }
        assert by_event == {c.event_id: cost for c, cost in zip(calls, costs, strict=True)}
        spent = await conn.fetchval("SELECT sum(spent_usd) FROM budget_spend WHERE tag = 'client:acme'")
        assert spent == acme_total
        assert await conn.fetchval("SELECT count(*) FROM budget_alerts") == 1
    finally:
        await conn.close()
    alerts = await stored_alerts(nats_url)
    assert [a["budget"] for a in alerts] == ["acme-month"]
