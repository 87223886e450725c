"""The pricing of CommonBill: token usage + model + call time -> an exact USD cost, and where it came from.

Order of decision (``Pricer.price``): operator price file -> ``override``; genai-prices -> ``priced``;
the vendor's reported cost -> ``reported``; otherwise ``unpriced`` with no cost. A cost computed from
estimated usage is ``estimated`` instead of ``override``/``priced`` (``source`` still says where the price
came from).

The parts, each its own module, all re-exported here:

* :mod:`commonos.accounting.rates`: the rate engine, exact Decimal arithmetic from per-token rates (token
  convention, bucket fallbacks, rounding);
* :mod:`commonos.accounting.price_file`: the operator price file, decoded into strict Structs, and which
  of its entries applies to a call;
* :mod:`commonos.accounting.genai`: genai-prices' price data read into rates (tiers, dated prices,
  variants).

Costs are ``Decimal`` quantized to 1e-10 USD with banker's rounding; no float is ever involved; whether a
cost fits a row is the projection's check. A call time that is not a UTC time (outside the years 1 to 9999
once its offset is applied) raises ``OverflowError``.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from enum import StrEnum

import msgspec
from genai_prices import data_snapshot
from genai_prices.types import ModelInfo, Provider

from commonos.accounting.genai import (
    PriceContext,
    card_from_model_price,
    constraint_dates,
    genai_version,
    price_context,
)
from commonos.accounting.price_file import (
    OverrideGroup,
    PriceEntry,
    PriceFile,
    PriceFileError,
    load_price_file,
    override_groups,
    parse_price_file,
)
from commonos.accounting.rates import MAX_PRICE_MTOK, PROVIDER_IDS, RateCard, quantize_usd
from commonos.accounting.usage import TokenUsage

__all__ = [
    "MAX_PRICE_MTOK",
    "PROVIDER_IDS",
    "CostStatus",
    "PriceEntry",
    "PriceFile",
    "PriceFileError",
    "PriceResult",
    "Pricer",
    "load_price_file",
    "parse_price_file",
]

_MAX_CACHED_LOOKUPS = 50_000


class CostStatus(StrEnum):
    PRICED = "priced"
    OVERRIDE = "override"
    REPORTED = "reported"
    UNPRICED = "unpriced"
    ESTIMATED = "estimated"


class PriceResult(msgspec.Struct, frozen=True, kw_only=True):
    """The cost of one call and where it came from; ``cost_usd`` is None only when ``unpriced``."""

    cost_usd: Decimal | None
    status: CostStatus
    source: str  # "genai-prices", "override:<file name>", "reported" or "none"
    version: str  # genai-prices version + data hash, or the override file's sha256 prefix
    detail: str = ""  # the price entry used, or why there was none


@dataclass(slots=True)
class _Lookup:
    """Everything about one (provider, model) pair that does not depend on the call; built once."""

    override_groups: tuple[OverrideGroup, ...]
    model: ModelInfo | None
    own_model: bool  # price variants apply only to a provider's own models, as in genai-prices
    anthropic: bool
    change_dates: tuple[date, ...]
    time_of_day: bool
    detail: str  # the genai-prices "provider/model" priced, or why nothing was found
    cards: dict[tuple[PriceContext, int], RateCard | None] = field(default_factory=dict)


class Pricer:
    """Prices model calls; caches what it learns per (provider, model), so keep one per process.

    genai-prices' data is taken at construction: build a new Pricer to pick up updated prices.
    Sharing one between threads is safe: a race only builds the same cache entry twice.
    """

    def __init__(self, overrides: PriceFile | None = None) -> None:
        self._overrides = overrides
        self._snapshot = data_snapshot.get_snapshot()
        self._genai_version = genai_version(self._snapshot)
        self._override_source = f"override:{overrides.name}" if overrides is not None else ""
        self._override_version = overrides.sha256[:12] if overrides is not None else ""
        self._lookups: dict[tuple[str, str], _Lookup] = {}

    @property
    def genai_version(self) -> str:
        return self._genai_version

    def price(
        self,
        provider: str,
        model: str,
        usage: TokenUsage,
        at: datetime,
        reported_cost_usd: Decimal | None = None,
    ) -> PriceResult:
        """Price one call made at ``at`` (naive = UTC). Never raises for an unknown provider or model."""
        lookup = self._lookups.get((provider, model))
        if lookup is None:
            lookup = self._build_lookup(provider, model)
        if at.tzinfo is None:
            at = at.replace(tzinfo=UTC)

        for group in lookup.override_groups:
            entry = group.entry_at(at)
            if entry is not None:
                return PriceResult(
                    cost_usd=entry.rates.cost(usage),
                    status=CostStatus.ESTIMATED if usage.usage_estimated else CostStatus.OVERRIDE,
                    source=self._override_source,
                    version=self._override_version,
                    detail=f"[[price]] #{entry.index} {entry.model}",
                )

        detail = lookup.detail
        if lookup.model is not None:
            card = self._card(lookup, usage, at)
            if card is not None:
                return PriceResult(
                    cost_usd=card.rates_for(usage).cost(usage),
                    status=CostStatus.ESTIMATED if usage.usage_estimated else CostStatus.PRICED,
                    source="genai-prices",
                    version=self._genai_version,
                    detail=detail,
                )
            detail = f"{detail}: genai-prices has no token prices for it"

        if reported_cost_usd is not None:
            return PriceResult(
                cost_usd=quantize_usd(reported_cost_usd),
                status=CostStatus.REPORTED,
                source="reported",
                version="",
                detail=detail,
            )
        return PriceResult(
            cost_usd=None,
            status=CostStatus.UNPRICED,
            source="none",
            version=self._genai_version,
            detail=detail,
        )

    def _card(self, lookup: _Lookup, usage: TokenUsage, at: datetime) -> RateCard | None:
        assert lookup.model is not None
        context = price_context(usage) if lookup.own_model else ()
        if lookup.time_of_day:
            return self._build_card(lookup, context, at)
        # Every call in the same span between price-change dates gets the same rates.
        day = at.astimezone(UTC).date() if lookup.change_dates else date.min
        key = (context, bisect_right(lookup.change_dates, day))
        try:
            return lookup.cards[key]
        except KeyError:
            card = lookup.cards[key] = self._build_card(lookup, context, at)
            return card

    @staticmethod
    def _build_card(lookup: _Lookup, context: PriceContext, at: datetime) -> RateCard | None:
        assert lookup.model is not None
        model_price = lookup.model.get_prices(at, dict(context) if context else None)
        return card_from_model_price(model_price, anthropic=lookup.anthropic)

    def _build_lookup(self, provider: str, model: str) -> _Lookup:
        if len(self._lookups) >= _MAX_CACHED_LOOKUPS:
            # Model names come from events; a flood of distinct junk names must not grow memory forever.
            self._lookups.clear()
        name = provider.strip().lower()
        genai_id = PROVIDER_IDS.get(name, name)
        model_ref = model.strip().lower()
        groups = override_groups(self._overrides, name, genai_id, model_ref) if self._overrides is not None else ()
        genai_provider: Provider | None = None
        model_info: ModelInfo | None = None
        if genai_id is None:
            detail = f"provider {provider!r} has no public prices"
        else:
            try:
                genai_provider, model_info = self._snapshot.find_provider_model(model_ref, None, genai_id, None)
            except LookupError as exc:  # genai-prices' way of saying unknown provider or model
                detail = str(exc)
            else:
                detail = f"{genai_provider.id}/{model_info.id}"
        change_dates, time_of_day = constraint_dates(model_info) if model_info is not None else ((), False)
        lookup = _Lookup(
            override_groups=groups,
            model=model_info,
            own_model=genai_provider is not None and any(m is model_info for m in genai_provider.models),
            anthropic=genai_provider is not None and genai_provider.id == "anthropic",
            change_dates=change_dates,
            time_of_day=time_of_day,
            detail=detail,
        )
        self._lookups[(provider, model)] = lookup
        return lookup
