"""The pure pricing engine of CommonBill: token usage + model + call time -> an exact USD cost.

Token convention: see :mod:`commonos.accounting.usage`. Our ``input_tokens`` excludes cache reads and writes;
genai-prices' ``input_tokens`` is the total input and it prices each cache bucket as a part of that total.
We never call ``genai_prices.calc_price`` on the hot path: we read its price data (``ModelPrice``) once per
model, price tier and price period into per-token rates, then price a call with a handful of Decimal
multiplications. The rates follow genai-prices' own rules, and a unit test checks both agree:

* a bucket without its own price is billed at its parent's price (cache read -> input, cache write ->
  input, 5m write -> cache write, reasoning -> output);
* tiered prices ("over 200k input tokens") pick the tier from the TOTAL input of the call, all four buckets;
* conditional prices take effect on the UTC date of the call (``StartDateConstraint``); time-of-day prices
  are evaluated per call;
* price variants (batch, priority, flex, fast) are chosen from ``TokenUsage.service_tier``/``speed``.

Cache writes: genai-prices has ``cache_write_mtok`` (the standard, 5 minute write) and, for Anthropic models,
``cache_write_1h_mtok``. When an Anthropic model with cache prices has no 1h price we derive it as 2x the
base input price, Anthropic's published rule (a 5 minute write is 1.25x). Other vendors have one cache-write
price, used for both buckets, which is what genai-prices itself does; a model without any cache-write price
bills writes as input.

Reasoning tokens are inside ``output_tokens`` and priced once, at the output price (or at
``output_reasoning_mtok`` for the rare model that has one). Web searches and other non-token units are not
in ``TokenUsage`` and are not priced.

Costs are ``Decimal`` quantized to 1e-10 USD with banker's rounding; no float is ever involved. The arithmetic
is wide enough that any valid call (token counts below 2^63, prices up to ``MAX_PRICE_MTOK``) is priced
exactly, with no decimal error; whether such a cost fits a row is the projection's check. A call time that is
not a UTC time (outside the years 1 to 9999 once its offset is applied) raises ``OverflowError``.

Order of decision (``Pricer.price``): operator price file -> ``override``; genai-prices -> ``priced``;
the vendor's reported cost -> ``reported``; otherwise ``unpriced`` with no cost. A cost computed from
estimated usage is ``estimated`` instead of ``override``/``priced`` (``source`` still says where the price
came from).

Operator price file (TOML, USD per million tokens; numbers or strings, read as exact Decimals)::

    [[price]]
    provider = "anthropic"         # optional; our provider name or its genai-prices id; absent = any
    model = "claude-sonnet-4-5"    # exact model id or a glob ("claude-sonnet-4*"), case-insensitive
    effective_from = 2026-01-01    # optional; a TOML date (UTC midnight) or date-time
    input_mtok = "3.00"            # required
    output_mtok = "15.00"          # required
    cache_read_mtok = "0.30"       # optional, default input_mtok
    cache_write_5m_mtok = "3.75"   # optional, default input_mtok
    cache_write_1h_mtok = "6.00"   # optional, default 2x input_mtok for provider "anthropic" when
                                   # cache_write_5m_mtok is given, else cache_write_5m_mtok

The most specific (provider, model) key that matches wins: an exact model id beats a glob, a glob with more
literal characters beats a shorter one, a named provider beats none. Within that key the entry with the
latest ``effective_from`` <= the call time applies; if all of them start later, the next key is tried, and
then genai-prices.
"""

from __future__ import annotations

import fnmatch
import hashlib
import tomllib
from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time
from decimal import ROUND_HALF_EVEN, Context, Decimal, InvalidOperation
from enum import StrEnum
from functools import cache
from pathlib import Path

import genai_prices
import msgspec
from genai_prices import data_snapshot
from genai_prices.types import ModelInfo, ModelPrice, Provider, StartDateConstraint, TieredPrices

from commonos.accounting.usage import TokenUsage
from commonos.proto.errors import ConfigError

__all__ = [
    "CostStatus",
    "PriceEntry",
    "PriceFile",
    "PriceFileError",
    "PriceResult",
    "Pricer",
    "load_price_file",
    "parse_price_file",
]

_QUANTUM = Decimal("1e-10")
#: A bound on operator prices (USD per million tokens): far above any real model, far below what would
#: overflow the exact arithmetic of a call's cost.
MAX_PRICE_MTOK = Decimal(1_000_000)
# Wide enough that no realistic call (billions of tokens at any rate) is ever rounded before quantizing.
_CTX = Context(prec=60, rounding=ROUND_HALF_EVEN)
_ZERO = Decimal(0)
_EARLIEST = datetime.min.replace(tzinfo=UTC)

# Our provider names -> genai-prices provider ids. None: no public prices (only an override can price it).
# A name not listed is passed to genai-prices as is ("google", "mistral", ...).
PROVIDER_IDS: Mapping[str, str | None] = {
    "anthropic": "anthropic",
    "claude-code": "anthropic",
    "openai": "openai",
    "codex": "openai",
    "scripted": None,
}

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


class PriceFileError(ConfigError):
    """An operator price file that cannot be used; one line naming the file, the entry and the problem."""


# --- rates -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Rates:
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
        return total.quantize(_QUANTUM, rounding=ROUND_HALF_EVEN, context=_CTX)


def _per_token(mtok: Decimal) -> Decimal:
    return mtok.scaleb(-6, _CTX)


def _rates_from_mtok(
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
) -> _Rates:
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
    return _Rates(
        input=_per_token(input_mtok),
        output=_per_token(output_mtok),
        cache_read=_per_token(cache_read_mtok if cache_read_mtok is not None else input_mtok),
        cache_write_5m=_per_token(cache_write_5m),
        cache_write_1h=_per_token(cache_write_1h),
        reasoning=_per_token(reasoning_mtok if reasoning_mtok is not None else output_mtok),
        per_request=(requests_kcount or _ZERO).scaleb(-3, _CTX),
    )


@dataclass(frozen=True, slots=True)
class _RateCard:
    """Rates of one model at one time; ``tiers`` (descending start) apply when total input > start."""

    base: _Rates
    tiers: tuple[tuple[int, _Rates], ...] = ()

    def rates_for(self, usage: TokenUsage) -> _Rates:
        if self.tiers:
            total_input = usage.total_input_tokens
            for start, rates in self.tiers:
                if total_input > start:
                    return rates
        return self.base


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


def _card_from_model_price(model_price: ModelPrice, *, anthropic: bool) -> _RateCard | None:
    raw: dict[str, Decimal | TieredPrices | None] = {key: getattr(model_price, key, None) for key in _GENAI_PRICE_KEYS}
    if raw["input_mtok"] is None and raw["output_mtok"] is None:
        return None  # priced per second, per image, ...: not something token usage can price

    def rates(level: int | None) -> _Rates:
        price = {key: _price_at_level(value, level) for key, value in raw.items()}
        return _rates_from_mtok(
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
    return _RateCard(base=rates(None), tiers=tuple((start, rates(start)) for start in starts))


# --- operator price file ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PriceEntry:
    """One ``[[price]]`` entry of an operator price file (prices in USD per million tokens)."""

    index: int  # 1-based position in the file, for messages
    provider: str | None
    model: str  # lower-cased exact id or glob
    effective_from: datetime  # aware; the beginning of time when the file gives none
    input_mtok: Decimal
    output_mtok: Decimal
    cache_read_mtok: Decimal | None
    cache_write_5m_mtok: Decimal | None
    cache_write_1h_mtok: Decimal | None
    rates: _Rates = field(repr=False, compare=False)

    @property
    def is_glob(self) -> bool:
        return any(ch in self.model for ch in "*?[")


@dataclass(frozen=True, slots=True)
class PriceFile:
    """A loaded operator price file; build it with :func:`load_price_file`."""

    name: str
    sha256: str
    entries: tuple[PriceEntry, ...]


_ENTRY_KEYS = frozenset(
    {
        "provider",
        "model",
        "effective_from",
        "input_mtok",
        "output_mtok",
        "cache_read_mtok",
        "cache_write_5m_mtok",
        "cache_write_1h_mtok",
    }
)


def load_price_file(path: str | Path) -> PriceFile:
    """Read and validate an operator price file; any problem raises :class:`PriceFileError`."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise PriceFileError(f"{path}: cannot read price file: {exc.strerror or exc}") from exc
    return parse_price_file(raw, name=str(path))


def parse_price_file(raw: bytes, *, name: str) -> PriceFile:
    """Validate the bytes of a price file; ``name`` is used in messages and in ``source``."""
    try:
        # parse_float=Decimal keeps 0.3 as exactly 0.3, never a binary float.
        document = tomllib.loads(raw.decode("utf-8"), parse_float=Decimal)
    except UnicodeDecodeError as exc:
        raise PriceFileError(f"{name}: not UTF-8: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise PriceFileError(f"{name}: invalid TOML: {exc}") from exc
    except RecursionError:
        raise PriceFileError(f"{name}: invalid TOML: nested too deeply") from None
    unknown = sorted(set(document) - {"price"})
    if unknown:
        raise PriceFileError(
            f"{name}: unknown top-level key(s) {', '.join(map(repr, unknown))}; expected [[price]] tables"
        )
    tables = document.get("price", [])
    if not isinstance(tables, list):
        raise PriceFileError(f"{name}: 'price' must be an array of tables ([[price]])")
    entries = tuple(_parse_entry(table, index, name) for index, table in enumerate(tables, start=1))
    seen: dict[tuple[str | None, str, datetime], int] = {}
    for entry in entries:
        key = (entry.provider, entry.model, entry.effective_from)
        if key in seen:
            raise PriceFileError(
                f"{name}: [[price]] #{entry.index}: same provider, model and effective_from as #{seen[key]}"
            )
        seen[key] = entry.index
    return PriceFile(name=Path(name).name, sha256=hashlib.sha256(raw).hexdigest(), entries=entries)


def _parse_entry(table: object, index: int, file_name: str) -> PriceEntry:
    where = f"{file_name}: [[price]] #{index}"
    if not isinstance(table, dict):
        raise PriceFileError(f"{where}: must be a table")
    model = table.get("model")
    if isinstance(model, str) and model.strip():
        where = f"{where} (model {model!r})"
    else:
        raise PriceFileError(f"{where}: 'model' is required and must be a non-empty string")
    unknown = sorted(set(table) - _ENTRY_KEYS)
    if unknown:
        raise PriceFileError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}")
    provider = table.get("provider")
    if provider is not None and not (isinstance(provider, str) and provider.strip()):
        raise PriceFileError(f"{where}: 'provider' must be a non-empty string")
    provider = provider.strip().lower() if provider is not None else None

    def price(key: str, *, required: bool) -> Decimal | None:
        value = table.get(key)
        if value is None:
            if required:
                raise PriceFileError(f"{where}: '{key}' is required")
            return None
        try:
            if isinstance(value, bool) or not isinstance(value, int | str | Decimal):
                raise InvalidOperation
            amount = Decimal(value.strip() if isinstance(value, str) else value)
        except InvalidOperation:
            raise PriceFileError(f"{where}: '{key}' must be a decimal number, got {value!r}") from None
        if not amount.is_finite() or amount < 0:
            raise PriceFileError(f"{where}: '{key}' must be a finite non-negative number, got {value!r}")
        if amount > MAX_PRICE_MTOK:
            raise PriceFileError(
                f"{where}: '{key}' = {value!r} USD per million tokens is beyond any real price "
                f"(at most {MAX_PRICE_MTOK})"
            )
        return amount

    input_mtok = price("input_mtok", required=True)
    output_mtok = price("output_mtok", required=True)
    assert input_mtok is not None and output_mtok is not None  # required=True raised otherwise
    cache_read = price("cache_read_mtok", required=False)
    cache_write_5m = price("cache_write_5m_mtok", required=False)
    cache_write_1h = price("cache_write_1h_mtok", required=False)
    anthropic = provider is not None and PROVIDER_IDS.get(provider, provider) == "anthropic"
    return PriceEntry(
        index=index,
        provider=provider,
        model=model.strip().lower(),
        effective_from=_parse_effective_from(table.get("effective_from"), where),
        input_mtok=input_mtok,
        output_mtok=output_mtok,
        cache_read_mtok=cache_read,
        cache_write_5m_mtok=cache_write_5m,
        cache_write_1h_mtok=cache_write_1h,
        rates=_rates_from_mtok(
            input_mtok=input_mtok,
            output_mtok=output_mtok,
            cache_read_mtok=cache_read,
            cache_write_mtok=None,
            cache_write_5m_mtok=cache_write_5m,
            cache_write_1h_mtok=cache_write_1h,
            derive_1h_from_input=anthropic,
        ),
    )


def _parse_effective_from(value: object, where: str) -> datetime:
    if value is None:
        return _EARLIEST
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip())
        except ValueError:
            raise PriceFileError(f"{where}: 'effective_from' is not an ISO date or date-time: {value!r}") from None
    if isinstance(value, datetime):
        # A date-time without offset is UTC, like genai-prices' naive timestamps.
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    if isinstance(value, date):
        return datetime.combine(value, time(0), tzinfo=UTC)
    raise PriceFileError(f"{where}: 'effective_from' must be a date or date-time, got {value!r}")


@dataclass(frozen=True, slots=True)
class _OverrideGroup:
    """All entries of one (provider, model) key, by ``effective_from``."""

    starts: tuple[datetime, ...]
    entries: tuple[PriceEntry, ...]

    def entry_at(self, at: datetime) -> PriceEntry | None:
        position = bisect_right(self.starts, at)
        return self.entries[position - 1] if position else None


def _override_groups(
    price_file: PriceFile, provider: str, genai_id: str | None, model: str
) -> tuple[_OverrideGroup, ...]:
    """The groups of entries matching this provider and model, most specific first."""
    by_key: dict[tuple[str | None, str], list[PriceEntry]] = {}
    for entry in price_file.entries:
        if entry.provider is not None and entry.provider not in (provider, genai_id):
            continue
        if entry.model != model and not (entry.is_glob and fnmatch.fnmatchcase(model, entry.model)):
            continue
        by_key.setdefault((entry.provider, entry.model), []).append(entry)

    def specificity(key: tuple[str | None, str]) -> tuple[bool, int, bool]:
        key_provider, pattern = key
        literal = sum(ch not in "*?[]" for ch in pattern)
        return (pattern == model, literal, key_provider is not None)

    groups = []
    for key in sorted(by_key, key=specificity, reverse=True):
        entries = sorted(by_key[key], key=lambda entry: entry.effective_from)
        groups.append(_OverrideGroup(tuple(e.effective_from for e in entries), tuple(entries)))
    return tuple(groups)


# --- genai-prices ----------------------------------------------------------------------------------------


@cache
def _bundled_data_hash() -> str:
    """A short hash of genai-prices' bundled price data: the package version alone may be patched."""
    data_file = Path(genai_prices.__file__).with_name("data.py")
    try:
        return hashlib.sha256(data_file.read_bytes()).hexdigest()[:12]
    except OSError:
        return "unknown"


def _genai_version(snapshot: data_snapshot.DataSnapshot) -> str:
    if snapshot.from_auto_update:
        return f"genai-prices {genai_prices.__version__}+auto.{snapshot.timestamp:%Y%m%dT%H%M%S}"
    return f"genai-prices {genai_prices.__version__}+data.{_bundled_data_hash()}"


def _constraint_dates(model: ModelInfo) -> tuple[tuple[date, ...], bool]:
    """The UTC dates on which this model's prices change, and whether any price depends on time of day."""
    constraints = [price.constraint for price in model.prices] if isinstance(model.prices, list) else []
    constraints += [variant.constraint for variant in model.price_variants or ()]
    dates = sorted({c.start_date for c in constraints if isinstance(c, StartDateConstraint)})
    time_of_day = any(c is not None and not isinstance(c, StartDateConstraint) for c in constraints)
    return tuple(dates), time_of_day


_PriceContext = tuple[tuple[str, str], ...]


def _price_context(usage: TokenUsage) -> _PriceContext:
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


@dataclass(slots=True)
class _Lookup:
    """Everything about one (provider, model) pair that does not depend on the call; built once."""

    override_groups: tuple[_OverrideGroup, ...]
    model: ModelInfo | None
    own_model: bool  # price variants apply only to a provider's own models, as in genai-prices
    anthropic: bool
    change_dates: tuple[date, ...]
    time_of_day: bool
    detail: str  # the genai-prices "provider/model" priced, or why nothing was found
    cards: dict[tuple[_PriceContext, int], _RateCard | None] = field(default_factory=dict)


class Pricer:
    """Prices model calls; caches what it learns per (provider, model), so keep one per process.

    genai-prices' data is taken at construction: build a new Pricer to pick up updated prices.
    Sharing one between threads is safe: a race only builds the same cache entry twice.
    """

    def __init__(self, overrides: PriceFile | None = None) -> None:
        self._overrides = overrides
        self._snapshot = data_snapshot.get_snapshot()
        self._genai_version = _genai_version(self._snapshot)
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
                cost_usd=reported_cost_usd.quantize(_QUANTUM, rounding=ROUND_HALF_EVEN, context=_CTX),
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

    def _card(self, lookup: _Lookup, usage: TokenUsage, at: datetime) -> _RateCard | None:
        assert lookup.model is not None
        context = _price_context(usage) if lookup.own_model else ()
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
    def _build_card(lookup: _Lookup, context: _PriceContext, at: datetime) -> _RateCard | None:
        assert lookup.model is not None
        model_price = lookup.model.get_prices(at, dict(context) if context else None)
        return _card_from_model_price(model_price, anthropic=lookup.anthropic)

    def _build_lookup(self, provider: str, model: str) -> _Lookup:
        if len(self._lookups) >= _MAX_CACHED_LOOKUPS:
            # Model names come from events; a flood of distinct junk names must not grow memory forever.
            self._lookups.clear()
        name = provider.strip().lower()
        genai_id = PROVIDER_IDS.get(name, name)
        model_ref = model.strip().lower()
        groups = _override_groups(self._overrides, name, genai_id, model_ref) if self._overrides is not None else ()
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
        change_dates, time_of_day = _constraint_dates(model_info) if model_info is not None else ((), False)
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
