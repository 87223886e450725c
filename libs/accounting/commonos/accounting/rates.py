"""The rate engine: per-token rates and the exact cost of one call's token usage. Pure arithmetic.

Token convention: see :mod:`commonos.accounting.usage`. Rates are USD per single token, derived from
prices in USD per million tokens ("mtok"), exact since those are decimal. A bucket without its own price is
billed at its parent's price, as genai-prices' unit hierarchy does (cache read -> input, cache write ->
input, 5m write -> cache write, reasoning -> output). When an Anthropic model with cache prices has no 1h
cache-write price it is 2x the base input price, Anthropic's published rule (a 5 minute write is 1.25x);
other vendors have one cache-write price, used for both buckets; a model without any cache-write price
bills writes as input.

Reasoning tokens are inside ``output_tokens`` and priced once, at the output price (or at its own price
for the rare model that has one).

Costs are ``Decimal`` quantized to 1e-10 USD with banker's rounding; no float is ever involved. The
arithmetic is wide enough that any valid call (token counts below 2^63, prices up to ``MAX_PRICE_MTOK``)
is priced exactly, with no decimal error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Context, Decimal

from commonos.accounting.usage import TokenUsage
from commonos.proto.vendors import MODEL_MAKERS

__all__ = ["MAX_PRICE_MTOK", "PROVIDER_IDS", "RateCard", "Rates", "is_anthropic", "quantize_usd", "rates_from_mtok"]

_QUANTUM = Decimal("1e-10")
#: A bound on operator prices (USD per million tokens): far above any real model, far below what would
#: overflow the exact arithmetic of a call's cost.
MAX_PRICE_MTOK = Decimal(1_000_000)
# Wide enough that no realistic call (billions of tokens at any rate) is ever rounded before quantizing.
_CTX = Context(prec=60, rounding=ROUND_HALF_EVEN)
_ZERO = Decimal(0)

# Our provider names -> genai-prices provider ids. None: no public prices (only an override can price it).
# A name not listed is passed to genai-prices as is ("google", "mistral", ...).
PROVIDER_IDS: Mapping[str, str | None] = {
    "anthropic": "anthropic",
    **MODEL_MAKERS,
    "openai": "openai",
    "scripted": None,
}


def is_anthropic(provider: str | None) -> bool:
    """Whether ``provider`` (our name, lower-case, or a genai-prices id) is Anthropic, whose pricing rules
    derive a missing 1h cache-write price."""
    return provider is not None and PROVIDER_IDS.get(provider, provider) == "anthropic"


def quantize_usd(amount: Decimal) -> Decimal:
    """``amount`` at the precision of every cost: 1e-10 USD, banker's rounding."""
    return amount.quantize(_QUANTUM, rounding=ROUND_HALF_EVEN, context=_CTX)


@dataclass(frozen=True, slots=True)
class Rates:
    """USD per single token (per call for ``per_request``); exact, as mtok prices are decimal."""

    input: Decimal
    output: Decimal
    cache_read: Decimal
    cache_write_5m: Decimal
    cache_write_1h: Decimal
    reasoning: Decimal
    per_request: Decimal

    def cost(self, usage: TokenUsage) -> Decimal:
        mul, add = _CTX.multiply, _CTX.add
        total = self.per_request
        if usage.input_tokens:
            total = add(total, mul(self.input, usage.input_tokens))
        if usage.output_tokens:
            if usage.reasoning_tokens and self.reasoning != self.output:
                answer = usage.output_tokens - usage.reasoning_tokens
                total = add(total, mul(self.output, answer))
                total = add(total, mul(self.reasoning, usage.reasoning_tokens))
            else:
                total = add(total, mul(self.output, usage.output_tokens))
        if usage.cache_read_tokens:
            total = add(total, mul(self.cache_read, usage.cache_read_tokens))
        if usage.cache_write_5m_tokens:
            total = add(total, mul(self.cache_write_5m, usage.cache_write_5m_tokens))
        if usage.cache_write_1h_tokens:
            total = add(total, mul(self.cache_write_1h, usage.cache_write_1h_tokens))
        # In the wide context: 2^63 tokens in each bucket at MAX_PRICE_MTOK is ~5e19 USD, 30 digits at 1e-10.
        return quantize_usd(total)


def _per_token(mtok: Decimal) -> Decimal:
    return mtok.scaleb(-6, _CTX)


def rates_from_mtok(
    *,
    input_mtok: Decimal,
    output_mtok: Decimal,
    cache_read_mtok: Decimal | None,
    cache_write_mtok: Decimal | None,
    cache_write_5m_mtok: Decimal | None,
    cache_write_1h_mtok: Decimal | None,
    reasoning_mtok: Decimal | None = None,
    requests_kcount: Decimal | None = None,
    derive_1h_from_input: bool,
) -> Rates:
    """Fill missing bucket prices from their parents, as genai-prices' unit hierarchy does."""
    cache_write = cache_write_mtok if cache_write_mtok is not None else input_mtok
    cache_write_5m = cache_write_5m_mtok if cache_write_5m_mtok is not None else cache_write
    if cache_write_1h_mtok is not None:
        cache_write_1h = cache_write_1h_mtok
    elif derive_1h_from_input and (cache_write_mtok is not None or cache_write_5m_mtok is not None):
        # Anthropic prices a 1h cache write at 2x base input (5m: 1.25x); used when a model with cache
        # prices lacks the 1h one. A model without any cache price bills writes as input, like genai-prices.
        cache_write_1h = input_mtok * 2
    else:
        cache_write_1h = cache_write_5m
    return Rates(
        input=_per_token(input_mtok),
        output=_per_token(output_mtok),
        cache_read=_per_token(cache_read_mtok if cache_read_mtok is not None else input_mtok),
        cache_write_5m=_per_token(cache_write_5m),
        cache_write_1h=_per_token(cache_write_1h),
        reasoning=_per_token(reasoning_mtok if reasoning_mtok is not None else output_mtok),
        per_request=(requests_kcount or _ZERO).scaleb(-3, _CTX),
    )


@dataclass(frozen=True, slots=True)
class RateCard:
    """Rates of one model at one time; ``tiers`` (descending start) apply when total input > start."""

    base: Rates
    tiers: tuple[tuple[int, Rates], ...] = ()

    def rates_for(self, usage: TokenUsage) -> Rates:
        if self.tiers:
            total_input = usage.total_input_tokens
            for start, rates in self.tiers:
                if total_input > start:
                    return rates
        return self.base
