"""Billing configuration: budgets and metric labels, from the TOML file named by ``COS_BILLING_CONFIG``.

Example::

    [[budget]]
    tag = "client:acme"          # a valid tag (key:value)
    period = "month"             # "month" or "day", calendar periods in UTC
    limit_usd = "100"            # exact decimal; a string or a number
    name = "acme-monthly"        # optional; default "<tag>/<period>"; names the alert and the metric label

    [metrics]
    tag_label_keys = ["client"]  # tag keys whose values become metric labels (none by default)
    max_tag_values = 50          # distinct values per key; later ones are counted as "other"
    max_models = 100             # distinct model names; later ones are counted as "other"
    max_providers = 20           # distinct provider names; later ones are counted as "other"

Any problem is a :class:`BillingConfigError`, a ``ConfigError`` whose message is one line naming the file,
the entry and the problem, so a service prints it and exits 2 instead of a traceback.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from pathlib import Path

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


class Period(StrEnum):
    DAY = "day"
    MONTH = "month"


@dataclass(frozen=True, slots=True)
class Budget:
    """A spending limit for the calls carrying ``tag``, per calendar ``period`` (UTC)."""

    name: str
    tag: str
    period: Period
    limit_usd: Decimal


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


_BUDGET_KEYS = frozenset({"name", "tag", "period", "limit_usd"})
_METRICS_KEYS = frozenset({"tag_label_keys", "max_tag_values", "max_models", "max_providers"})


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
    try:
        document = tomllib.loads(raw.decode("utf-8"), parse_float=Decimal)
    except UnicodeDecodeError as exc:
        raise BillingConfigError(f"{name}: not UTF-8: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise BillingConfigError(f"{name}: invalid TOML: {exc}") from None
    except RecursionError:
        raise BillingConfigError(f"{name}: invalid TOML: nested too deeply") from None
    unknown = sorted(set(document) - {"budget", "metrics"})
    if unknown:
        raise BillingConfigError(
            f"{name}: unknown top-level key(s) {', '.join(map(repr, unknown))}; expected [[budget]] and [metrics]"
        )
    tables = document.get("budget", [])
    if not isinstance(tables, list):
        raise BillingConfigError(f"{name}: 'budget' must be an array of tables ([[budget]])")
    budgets = tuple(_parse_budget(table, index, name) for index, table in enumerate(tables, start=1))
    seen_names: dict[str, int] = {}
    seen_keys: dict[tuple[str, Period], int] = {}
    for index, budget in enumerate(budgets, start=1):
        if (budget.tag, budget.period) in seen_keys:
            raise BillingConfigError(
                f"{name}: [[budget]] #{index}: tag {budget.tag!r} already has a {budget.period} budget "
                f"(#{seen_keys[budget.tag, budget.period]})"
            )
        if budget.name in seen_names:
            raise BillingConfigError(
                f"{name}: [[budget]] #{index}: name {budget.name!r} already used by #{seen_names[budget.name]}"
            )
        seen_names[budget.name] = index
        seen_keys[budget.tag, budget.period] = index
    return BillingConfig(budgets=budgets, metrics=_parse_metrics(document.get("metrics", {}), name))


def _parse_budget(table: object, index: int, file_name: str) -> Budget:
    where = f"{file_name}: [[budget]] #{index}"
    if not isinstance(table, dict):
        raise BillingConfigError(f"{where}: must be a table")
    unknown = sorted(set(table) - _BUDGET_KEYS)
    if unknown:
        raise BillingConfigError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}")
    tag = table.get("tag")
    if not isinstance(tag, str):
        raise BillingConfigError(f"{where}: 'tag' is required and must be a string such as \"client:acme\"")
    try:
        parse_tag(tag)
    except InvalidTag as exc:
        raise BillingConfigError(f"{where}: {exc}") from None
    raw_period = table.get("period", "month")
    try:
        period = Period(raw_period)
    except ValueError:
        raise BillingConfigError(f'{where}: \'period\' must be "month" or "day", got {raw_period!r}') from None
    raw_limit = table.get("limit_usd")
    if raw_limit is None:
        raise BillingConfigError(f"{where}: 'limit_usd' is required")
    try:
        if isinstance(raw_limit, bool) or not isinstance(raw_limit, int | str | Decimal):
            raise InvalidOperation
        limit = Decimal(raw_limit.strip() if isinstance(raw_limit, str) else raw_limit)
    except InvalidOperation:
        raise BillingConfigError(f"{where}: 'limit_usd' must be a decimal number, got {raw_limit!r}") from None
    if not limit.is_finite() or limit <= 0:
        raise BillingConfigError(f"{where}: 'limit_usd' must be a positive number, got {raw_limit!r}")
    budget_name = table.get("name", f"{tag}/{period}")
    if not isinstance(budget_name, str) or not budget_name.strip() or len(budget_name) > 200:
        raise BillingConfigError(f"{where}: 'name' must be a non-empty string of at most 200 characters")
    if any(ch.isspace() for ch in budget_name):
        raise BillingConfigError(f"{where}: 'name' {budget_name!r} must not contain spaces")
    return Budget(name=budget_name, tag=tag, period=period, limit_usd=limit)


def _parse_metrics(table: object, file_name: str) -> MetricsConfig:
    where = f"{file_name}: [metrics]"
    if not isinstance(table, dict):
        raise BillingConfigError(f"{where}: must be a table")
    unknown = sorted(set(table) - _METRICS_KEYS)
    if unknown:
        raise BillingConfigError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}")
    keys = table.get("tag_label_keys", [])
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise BillingConfigError(f"{where}: 'tag_label_keys' must be a list of tag keys such as [\"client\"]")
    for key in keys:
        try:
            parse_tag(f"{key}:x")
        except InvalidTag:
            raise BillingConfigError(
                f"{where}: tag key {key!r} is not valid (lower-case letters, digits, _ and -)"
            ) from None

    def limit(key: str, default: int) -> int:
        value = table.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10_000:
            raise BillingConfigError(f"{where}: '{key}' must be a whole number from 1 to 10000, got {value!r}")
        return value

    return MetricsConfig(
        tag_label_keys=tuple(dict.fromkeys(keys)),
        max_tag_values=limit("max_tag_values", 50),
        max_models=limit("max_models", 100),
        max_providers=limit("max_providers", 20),
    )
