"""Billing configuration: budgets and metric labels, from the TOML file named by ``COS_BILLING_CONFIG``.

Example::

    [[budget]]
    tag = "client:acme"          # a valid tag (key:value)
    period = "month"             # "month" or "day", calendar periods in UTC
    limit_usd = "100"            # exact decimal; a string or a number
    name = "acme-monthly"        # optional; default "<tag>/<period>"; names the alert and the metric label
    warn_at = [50, 80]           # optional; whole percents of the limit (1..99, no duplicates), each publishing
                                 # one budget_warning alert per period when the spend reaches it; default none
    enforce = false              # true: the loop refuses model calls of the tag once the limit is reached

    [metrics]
    tag_label_keys = ["client"]  # tag keys whose values become metric labels (none by default)
    max_tag_values = 50          # distinct values per key; later ones are counted as "other"
    max_models = 100             # distinct model names; later ones are counted as "other"
    max_providers = 20           # distinct provider names; later ones are counted as "other"

The file is decoded into strict Structs: an unknown key is an error. Any problem is a
:class:`BillingConfigError`, a ``ConfigError`` whose message is one line naming the file, the key
(``budget[1].limit_usd``, positions from 0) and the problem, so a service prints it and exits 2 instead of a
traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import msgspec

from commonos.proto.alerts import Period
from commonos.proto.config_files import decode_toml, key_path
from commonos.proto.tags import InvalidTag, parse_tag
from commonos.runtime.settings import ConfigError

__all__ = [
    "BillingConfig",
    "BillingConfigError",
    "Budget",
    "MetricsConfig",
    "Period",
    "load_billing_config",
    "parse_billing_config",
]


class BillingConfigError(ConfigError):
    """A billing configuration file that cannot be used; the message is one line."""


@dataclass(frozen=True, slots=True)
class Budget:
    """A spending limit for the calls carrying ``tag``, per calendar ``period`` (UTC)."""

    name: str
    tag: str
    period: Period
    limit_usd: Decimal
    #: Percents of the limit (each 1..99, ascending) that publish a ``budget_warning`` once per period.
    warn_at: tuple[int, ...] = ()
    #: The loop refuses model calls of this budget's tag once the period's limit is reached
    #: (`commonos.billing.enforcement`).
    enforce: bool = False


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    tag_label_keys: tuple[str, ...] = ()
    max_tag_values: int = 50
    max_models: int = 100
    max_providers: int = 20


@dataclass(frozen=True, slots=True)
class BillingConfig:
    budgets: tuple[Budget, ...] = ()
    metrics: MetricsConfig = field(default_factory=MetricsConfig)


class _BudgetTable(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One ``[[budget]]`` as written in the file."""

    tag: str
    limit_usd: Decimal  # a TOML number (read exactly) or a decimal string
    period: Period = Period.MONTH
    name: str | None = None
    warn_at: list[int] = []
    enforce: bool = False


class _MetricsTable(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    tag_label_keys: list[str] = []
    max_tag_values: int = 50
    max_models: int = 100
    max_providers: int = 20


class _BillingFile(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    budget: list[_BudgetTable] = []
    metrics: _MetricsTable = msgspec.field(default_factory=_MetricsTable)


def load_billing_config(path: str | Path | None) -> BillingConfig:
    """Read the file at ``path``; no path means no budgets and default metric limits."""
    if path is None:
        return BillingConfig()
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise BillingConfigError(f"{path}: cannot read billing config: {exc.strerror or exc}") from None
    return parse_billing_config(raw, name=str(path))


def parse_billing_config(raw: bytes, *, name: str) -> BillingConfig:
    """Validate the bytes of a billing config; ``name`` (the file) starts every message."""

    def error(problem: str) -> BillingConfigError:
        return BillingConfigError(f"{name}: {problem}")

    document = decode_toml(raw, _BillingFile, error=error, decimals=True)
    budgets = tuple(_budget(table, index, error) for index, table in enumerate(document.budget))
    seen_names: dict[str, int] = {}
    seen_keys: dict[tuple[str, Period], int] = {}
    for index, budget in enumerate(budgets):
        where = key_path("budget", index)
        if (budget.tag, budget.period) in seen_keys:
            first = key_path("budget", seen_keys[budget.tag, budget.period])
            raise error(f"{where}: tag {budget.tag!r} already has a {budget.period} budget ({first})")
        if budget.name in seen_names:
            raise error(f"{where}.name: {budget.name!r} already used by {key_path('budget', seen_names[budget.name])}")
        seen_names[budget.name] = index
        seen_keys[budget.tag, budget.period] = index
    return BillingConfig(budgets=budgets, metrics=_metrics(document.metrics, error))


def _budget(table: _BudgetTable, index: int, error: Callable[[str], BillingConfigError]) -> Budget:
    def where(key: str) -> str:
        return key_path("budget", index, key)

    try:
        parse_tag(table.tag)
    except InvalidTag as exc:
        raise error(f"{where('tag')}: {exc}") from None
    if not table.limit_usd.is_finite() or table.limit_usd <= 0:
        raise error(f"{where('limit_usd')}: must be a positive number, got {table.limit_usd}")
    budget_name = table.name if table.name is not None else f"{table.tag}/{table.period}"
    if not budget_name.strip() or len(budget_name) > 200:
        raise error(f"{where('name')}: must be a non-empty string of at most 200 characters")
    if any(ch.isspace() for ch in budget_name):
        raise error(f"{where('name')}: {budget_name!r} must not contain spaces")
    for percent in table.warn_at:
        if not 1 <= percent <= 99:
            raise error(f"{where('warn_at')}: each percent must be a whole number from 1 to 99, got {percent}")
    if len(set(table.warn_at)) != len(table.warn_at):
        duplicate = next(p for p in table.warn_at if table.warn_at.count(p) > 1)
        raise error(f"{where('warn_at')}: {duplicate} appears more than once")
    return Budget(
        name=budget_name,
        tag=table.tag,
        period=table.period,
        limit_usd=table.limit_usd,
        warn_at=tuple(sorted(table.warn_at)),
        enforce=table.enforce,
    )


def _metrics(table: _MetricsTable, error: Callable[[str], BillingConfigError]) -> MetricsConfig:
    for key in table.tag_label_keys:
        try:
            parse_tag(f"{key}:x")
        except InvalidTag:
            raise error(
                f"metrics.tag_label_keys: tag key {key!r} is not valid (lower-case letters, digits, _ and -)"
            ) from None
    for key in ("max_tag_values", "max_models", "max_providers"):
        value = getattr(table, key)
        if not 1 <= value <= 10_000:
            raise error(f"metrics.{key}: must be a whole number from 1 to 10000, got {value}")
    return MetricsConfig(
        tag_label_keys=tuple(dict.fromkeys(table.tag_label_keys)),
        max_tag_values=table.max_tag_values,
        max_models=table.max_models,
        max_providers=table.max_providers,
    )
