"""Calls billing cannot handle, on real servers: each is its own dead letter, the calls around it are billed.

Pure counterparts (which errors are the call's and which are billing's own) are in test_rows.py; the fuzz
target tests/fuzz/test_billing_path.py drives the same per-event path with arbitrary calls.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import nats
import pytest

from commonos.accounting.pricing import Pricer, PriceResult, load_price_file
from commonos.accounting.usage import TokenUsage
from commonos.billing.config import BillingConfig, Budget, Period
from commonos.proto import events as ev
from commonos.proto.ids import new_id
from commonos.proto.text import unescape_nul
from commonos.runtime.dlq import list_dead_letters
from commonos.runtime.postgres import connect
from tests.billing.support import POSITIONS, billing, recent_start
from tests.factories import Clock
from tests.support import InProcess, publish_all, wait_for_position

#: $1 per token: the dearest price a price file may give, so 2^63 - 1 tokens cost more than a row can hold.
PRICE_FILE = """
[[price]]
provider = "ollama"
model = "dear-*"
input_mtok = "1000000"
output_mtok = "1000000"
"""

BUDGETS = BillingConfig(budgets=(Budget("acme-day", "client:acme", Period.DAY, Decimal("1000")),))


def call(
    at: datetime, provider: str = "anthropic", model: str = "claude-sonnet-4-5", **fields: object
) -> ev.ModelCallCompleted:
    return ev.ModelCallCompleted(
        profile_id="default",
        session_id=new_id(),
        turn_id=new_id(),
        provider=provider,
        model=model,
        occurred_at=at,
        **({"tags": ("client:acme",), "input_tokens": 100, "output_tokens": 10} | fields),  # type: ignore[arg-type]
    )


MINUS_ONE = timezone(timedelta(hours=-1))
PLUS_ONE = timezone(timedelta(hours=1))


async def billed_up_to(running: InProcess, database_url: str, seq: int) -> None:
    """Wait until billing committed stream sequence ``seq``; fail at once if it stopped instead."""
    assert running.task is not None
    waiting = asyncio.ensure_future(wait_for_position(database_url, "billing", seq, timeout_s=30, table=POSITIONS))
    await asyncio.wait({waiting, running.task}, return_when=asyncio.FIRST_COMPLETED)
    if not waiting.done():
        waiting.cancel()
        raise AssertionError(f"billing stopped: {running.task.exception()!r}")
    await waiting


def poison_calls() -> list[tuple[ev.ModelCallCompleted, str]]:
    """(call, what its dead letter's reason must say: ``invariant: `` is the consumer's word for check's errors)."""
    # Issue #14: in UTC this is 10000-01-01T00:59:59, which no datetime (and so no row) can hold.
    beyond = datetime(9999, 12, 31, 23, 59, 59, tzinfo=MINUS_ONE)
    return [
        (call(beyond), "invariant: occurred_at 9999-12-31T23:59:59-01:00"),
        (call(datetime(1, 1, 1, 0, 0, 0, tzinfo=PLUS_ONE)), "invariant: occurred_at 0001-01-01T00:00:00+01:00"),
        # The first instant: PostgreSQL's driver would store it as -infinity, not as this time.
        (call(datetime(1, 1, 1, tzinfo=UTC)), "invariant: occurred_at 0001-01-01T00:00:00+00:00 is the first instant"),
        # Unpriced: pricing never looks at the time, the row would not be storable all the same.
        (call(beyond, "openai", "gpt-99-imaginary"), "invariant: occurred_at"),
        # Storable, but the day of the budget on its tag ends after the year 9999.
        (call(datetime(9999, 12, 31, 12, 0, tzinfo=UTC)), "invariant: budgets: OverflowError: the day 9999-12-31"),
        # 2^63 - 1 tokens at $1 each: no cost column holds that.
        (call(datetime.now(UTC), "ollama", "dear-model", input_tokens=2**63 - 1), "invariant: pricing: the cost"),
    ]


async def test_calls_billing_cannot_handle_are_dead_lettered_and_the_rest_billed(
    nats_url: str, database_url: str, tmp_path: Path
) -> None:
    prices = tmp_path / "prices.toml"
    prices.write_text(PRICE_FILE)
    clock = Clock(now=recent_start())
    poison = poison_calls()
    good = [call(clock.tick()) for _ in range(len(poison) + 1)]
    # U+0000, which PostgreSQL text cannot hold, in a vendor's text: billed, stored escaped (proto.text).
    good[-1] = call(clock.tick(), stop_reason="end\x00")
    interleaved: list[ev.Event] = [good[0]]
    for (bad, _), after in zip(poison, good[1:], strict=True):
        interleaved += [bad, after]
    acks = await publish_all(nats_url, interleaved)
    later = [call(clock.tick()) for _ in range(3)]

    async with billing(nats_url, database_url, BUDGETS, Pricer(load_price_file(prices)), batch_size=4) as running:
        await billed_up_to(running, database_url, acks[-1].seq)
        # Still billing: calls published after the poison ones are billed too.
        more = await publish_all(nats_url, later)
        await billed_up_to(running, database_url, more[-1].seq)
        assert running.task is not None and not running.task.done()

    conn = await connect(database_url)
    try:
        ids = {r["event_id"] for r in await conn.fetch("SELECT event_id FROM model_calls")}
        spent = await conn.fetchval("SELECT sum(spent_usd) FROM budget_spend WHERE tag = 'client:acme'")
        total = await conn.fetchval("SELECT sum(cost_usd) FROM model_calls")
        stop = await conn.fetchval("SELECT stop_reason FROM model_calls WHERE event_id = $1", good[-1].event_id)
    finally:
        await conn.close()
    assert ids == {c.event_id for c in good + later}
    assert spent == total, "the budget counts exactly the billed calls"
    assert unescape_nul(stop) == "end\x00"

    nc = await nats.connect(nats_url)
    try:
        letters = await list_dead_letters(nc.jetstream())
    finally:
        await nc.close()
    by_id = {uuid.UUID(letter.headers["ce-id"]): letter for letter in letters}
    assert set(by_id) == {bad.event_id for bad, _ in poison}
    for bad, reason in poison:
        letter = by_id[bad.event_id]
        assert letter.consumer == "billing"
        assert reason in letter.reason, letter.reason
        assert letter.data == ev.encode_event(bad)


class BrokenPricer(Pricer):
    """A pricer with a bug: billing must stop on it, not dead-letter every call."""

    def price(
        self,
        provider: str,
        model: str,
        usage: TokenUsage,
        at: datetime,
        reported_cost_usd: Decimal | None = None,
    ) -> PriceResult:
        raise KeyError("a bug in pricing")


async def test_a_bug_in_pricing_stops_billing_instead_of_dead_lettering(nats_url: str, database_url: str) -> None:
    await publish_all(nats_url, [call(datetime.now(UTC))])
    with pytest.raises(KeyError, match="a bug in pricing"):
        async with billing(nats_url, database_url, pricer=BrokenPricer()) as running:
            assert running.task is not None
            await asyncio.wait_for(asyncio.shield(running.task), timeout=30)
    nc = await nats.connect(nats_url)
    try:
        assert await list_dead_letters(nc.jetstream()) == []
    finally:
        await nc.close()
    conn = await connect(database_url)
    try:
        assert await conn.fetchval("SELECT stream_seq FROM billing_positions") is None
    finally:
        await conn.close()
