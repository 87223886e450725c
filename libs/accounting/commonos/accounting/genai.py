"""The genai-prices adapter: its price data read into the rate engine's rate cards.

genai-prices' ``input_tokens`` is the total input and it prices each cache bucket as a part of that total;
ours excludes cache reads and writes (:mod:`commonos.accounting.usage`). We never call
``genai_prices.calc_price`` on the hot path: we read its price data (``ModelPrice``) once per model, price
tier and price period into per-token rates (:mod:`commonos.accounting.rates`), following genai-prices'
own rules (a unit test checks both agree):

* tiered prices ("over 200k input tokens") pick the tier from the TOTAL input of the call, all four buckets;
* conditional prices take effect on the UTC date of the call (``StartDateConstraint``); time-of-day prices
  are evaluated per call;
* price variants (batch, priority, flex, fast) are chosen from ``TokenUsage.service_tier``/``speed``.

Cache writes: genai-prices has ``cache_write_mtok`` (the standard, 5 minute write) and, for Anthropic
models, ``cache_write_1h_mtok``; the rate engine derives a missing 1h price. Web searches and other
non-token units are not in ``TokenUsage`` and are not priced.
"""

from __future__ import annotations

import hashlib
from datetime import date
from decimal import Decimal
from functools import cache
from pathlib import Path

import genai_prices
from genai_prices import data_snapshot
from genai_prices.types import ModelInfo, ModelPrice, StartDateConstraint, TieredPrices

from commonos.accounting.rates import RateCard, Rates, rates_from_mtok
from commonos.accounting.usage import TokenUsage

__all__ = ["PriceContext", "card_from_model_price", "constraint_dates", "genai_version", "price_context"]

_ZERO = Decimal(0)

_GENAI_PRICE_KEYS = (
    "input_mtok",
    "output_mtok",
    "cache_read_mtok",
    "cache_write_mtok",
    "cache_write_5m_mtok",
    "cache_write_1h_mtok",
    "output_reasoning_mtok",
    "requests_kcount",
)


def _price_at_level(value: Decimal | TieredPrices | None, level: int | None) -> Decimal | None:
    """The price that applies when total input exceeds ``level`` (None: below every tier)."""
    if not isinstance(value, TieredPrices):
        return value
    price: Decimal = value.base
    if level is not None:
        for tier in value.tiers:  # ascending, sorted by genai-prices
            if tier.start <= level:
                price = tier.price
    return price


def card_from_model_price(model_price: ModelPrice, *, anthropic: bool) -> RateCard | None:
    """The rates of genai-prices' ``model_price``; None when it has no token prices."""
    raw: dict[str, Decimal | TieredPrices | None] = {key: getattr(model_price, key, None) for key in _GENAI_PRICE_KEYS}
    if raw["input_mtok"] is None and raw["output_mtok"] is None:
        return None  # priced per second, per image, ...: not something token usage can price

    def rates(level: int | None) -> Rates:
        price = {key: _price_at_level(value, level) for key, value in raw.items()}
        return rates_from_mtok(
            input_mtok=price["input_mtok"] or _ZERO,
            output_mtok=price["output_mtok"] or _ZERO,
            cache_read_mtok=price["cache_read_mtok"],
            cache_write_mtok=price["cache_write_mtok"],
            cache_write_5m_mtok=price["cache_write_5m_mtok"],
            cache_write_1h_mtok=price["cache_write_1h_mtok"],
            reasoning_mtok=price["output_reasoning_mtok"],
            requests_kcount=price["requests_kcount"],
            derive_1h_from_input=anthropic,
        )

    starts = sorted(
        {tier.start for value in raw.values() if isinstance(value, TieredPrices) for tier in value.tiers},
        reverse=True,
    )
    return RateCard(base=rates(None), tiers=tuple((start, rates(start)) for start in starts))


@cache
def _bundled_data_hash() -> str:
    """A short hash of genai-prices' bundled price data: the package version alone may be patched."""
    data_file = Path(genai_prices.__file__).with_name("data.py")
    try:
        return hashlib.sha256(data_file.read_bytes()).hexdigest()[:12]
    except OSError:
        return "unknown"


def genai_version(snapshot: data_snapshot.DataSnapshot) -> str:
    """The version of the price data in ``snapshot``, as stored with every cost it priced."""
    if snapshot.from_auto_update:
        return f"genai-prices {genai_prices.__version__}+auto.{snapshot.timestamp:%Y%m%dT%H%M%S}"
    return f"genai-prices {genai_prices.__version__}+data.{_bundled_data_hash()}"


def constraint_dates(model: ModelInfo) -> tuple[tuple[date, ...], bool]:
    """The UTC dates on which this model's prices change, and whether any price depends on time of day."""
    constraints = [price.constraint for price in model.prices] if isinstance(model.prices, list) else []
    constraints += [variant.constraint for variant in model.price_variants or ()]
    dates = sorted({c.start_date for c in constraints if isinstance(c, StartDateConstraint)})
    time_of_day = any(c is not None and not isinstance(c, StartDateConstraint) for c in constraints)
    return tuple(dates), time_of_day


PriceContext = tuple[tuple[str, str], ...]


def price_context(usage: TokenUsage) -> PriceContext:
    """genai-prices variant keys from the vendor's tier words: batch is a 'processing', the rest tiers."""
    if usage.service_tier is None and usage.speed is None:
        return ()
    context: list[tuple[str, str]] = []
    if usage.service_tier == "batch":
        context.append(("processing", "batch"))
    elif usage.service_tier is not None:
        context.append(("service_tier", usage.service_tier))
    if usage.speed is not None:
        context.append(("speed", usage.speed))
    return tuple(context)
