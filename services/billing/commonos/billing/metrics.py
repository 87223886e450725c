"""Billing metrics (Prometheus), counted once per new ``model_calls`` row, after its batch committed.

Names follow Prometheus conventions (base unit in the name, ``_total`` for counters); they mirror the
OpenTelemetry GenAI metric ``gen_ai.client.token.usage`` (``gen_ai.provider.name``, ``gen_ai.request.model``,
``gen_ai.token.type``) as counters:

* ``cos_billing_tokens_total{provider,model,token_type}``: token_type is ``input`` (uncached input),
  ``cache_read``, ``cache_write_5m``, ``cache_write_1h`` or ``output`` (reasoning included); the five are
  disjoint, so summing over token_type gives every token of the calls.
* ``cos_billing_reasoning_tokens_total{provider,model}``: the part of ``output`` that was reasoning.
* ``cos_billing_cost_usd_total{provider,model}``: the priced cost (unpriced calls add nothing).
* ``cos_billing_calls_total{provider,model,cost_status}`` and ``cos_billing_unpriced_calls_total{provider,model}``.
* ``cos_billing_tag_cost_usd_total{tag_key,tag_value}`` / ``cos_billing_tag_calls_total{tag_key,tag_value}``:
  only for the tag keys listed in the config (``[metrics] tag_label_keys``); a call counts once per tag it
  carries. Budgets: ``cos_billing_budget_{limit_usd,spent_usd,exceeded}{budget}`` (the current period) and
  ``cos_billing_budget_alerts_total{budget}``, ``cos_billing_budget_warnings_total{budget,percent}``.

No label is unbounded: providers, models and each tag key's values are capped (first come, first kept);
the rest is counted as ``other``, and ``cos_billing_label_overflow_total{label}`` says how often.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Final

from prometheus_client import Counter, Gauge

from commonos.billing.config import MetricsConfig

if TYPE_CHECKING:
    from commonos.billing.rows import ModelCallRow

OTHER: Final = "other"
_MAX_LABEL_CHARS: Final = 120

TOKENS = Counter(
    "cos_billing_tokens_total",
    "Tokens of billed model calls by provider, model and disjoint token type (output includes reasoning)",
    ["provider", "model", "token_type"],
)
REASONING_TOKENS = Counter(
    "cos_billing_reasoning_tokens_total",
    "Reasoning tokens of billed model calls (already counted in token_type=output)",
    ["provider", "model"],
)
COST = Counter("cos_billing_cost_usd_total", "Cost of billed model calls in USD", ["provider", "model"])
CALLS = Counter("cos_billing_calls_total", "Billed model calls by cost status", ["provider", "model", "cost_status"])
UNPRICED = Counter(
    "cos_billing_unpriced_calls_total",
    "Model calls stored without a cost: no price was found for them",
    ["provider", "model"],
)
TAG_COST = Counter(
    "cos_billing_tag_cost_usd_total",
    "Cost in USD by configured tag key; a call counts once per tag it carries",
    ["tag_key", "tag_value"],
)
TAG_CALLS = Counter(
    "cos_billing_tag_calls_total",
    "Model calls by configured tag key; a call counts once per tag it carries",
    ["tag_key", "tag_value"],
)
LABEL_OVERFLOW = Counter(
    "cos_billing_label_overflow_total",
    "Label values counted as 'other' because the label reached its cap of distinct values",
    ["label"],
)
BUDGET_LIMIT = Gauge("cos_billing_budget_limit_usd", "Configured budget limit in USD", ["budget"])
BUDGET_SPENT = Gauge("cos_billing_budget_spent_usd", "Spend of the budget's current period in USD", ["budget"])
BUDGET_EXCEEDED = Gauge(
    "cos_billing_budget_exceeded", "1 while the budget's current period has reached its limit", ["budget"]
)
BUDGET_ALERTS = Counter(
    "cos_billing_budget_alerts_total", "Budget alerts published (at most one per budget and period)", ["budget"]
)
BUDGET_WARNINGS = Counter(
    "cos_billing_budget_warnings_total",
    "Budget warnings published (at most one per budget, period and warn_at percent)",
    ["budget", "percent"],
)

#: token_type label -> field of ModelCallRow.usage.
TOKEN_TYPES: Final = (
    ("input", "input_tokens"),
    ("cache_read", "cache_read_tokens"),
    ("cache_write_5m", "cache_write_5m_tokens"),
    ("cache_write_1h", "cache_write_1h_tokens"),
    ("output", "output_tokens"),
)


class LabelCap:
    """Keeps the first ``limit`` distinct values of a label; every later one becomes ``other``."""

    def __init__(self, label: str, limit: int) -> None:
        self.label = label
        self.limit = limit
        self._kept: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self._kept:
            return value
        value = value[:_MAX_LABEL_CHARS]
        if value in self._kept:
            return value
        if len(self._kept) < self.limit:
            self._kept.add(value)
            return value
        LABEL_OVERFLOW.labels(self.label).inc()
        return OTHER


@dataclass(slots=True)
class _ModelTotals:
    tokens: list[int] = field(default_factory=lambda: [0] * len(TOKEN_TYPES))
    reasoning: int = 0
    cost: Decimal = Decimal(0)
    unpriced: int = 0
    by_status: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class MetricBatch:
    """What one applied batch adds to the counters, aggregated by label set."""

    models: dict[tuple[str, str], _ModelTotals] = field(default_factory=dict)
    tags: dict[tuple[str, str], tuple[Decimal, int]] = field(default_factory=dict)


class BillingMetrics:
    def __init__(self, config: MetricsConfig | None = None) -> None:
        config = config or MetricsConfig()
        self._providers = LabelCap("provider", config.max_providers)
        self._models = LabelCap("model", config.max_models)
        self._tag_keys = frozenset(config.tag_label_keys)
        self._tag_values = {key: LabelCap(f"tag:{key}", config.max_tag_values) for key in config.tag_label_keys}
        # At 0 from the start: before any call, the one label set known is the capped labels' `other`; then every
        # (provider, model) billed (`record`), so that an alert on unpriced calls tells "none" from "no data".
        UNPRICED.labels(OTHER, OTHER)
        for label in ("provider", "model", *(f"tag:{key}" for key in config.tag_label_keys)):
            LABEL_OVERFLOW.labels(label)

    def stage(self, rows: Sequence[ModelCallRow]) -> MetricBatch:
        batch = MetricBatch()
        models = batch.models
        tag_keys = self._tag_keys
        for row in rows:
            key = (self._providers(row.provider), self._models(row.model))
            totals = models.get(key)
            if totals is None:
                totals = models[key] = _ModelTotals()
            tokens, usage = totals.tokens, row.usage
            tokens[0] += usage.input_tokens
            tokens[1] += usage.cache_read_tokens
            tokens[2] += usage.cache_write_5m_tokens
            tokens[3] += usage.cache_write_1h_tokens
            tokens[4] += usage.output_tokens
            totals.reasoning += usage.reasoning_tokens
            totals.by_status[row.cost_status] = totals.by_status.get(row.cost_status, 0) + 1
            cost = row.cost_usd
            if cost is None:
                totals.unpriced += 1
            else:
                totals.cost += cost
            if tag_keys:
                for tag in row.tags:
                    tag_key, _, value = tag.partition(":")
                    if tag_key in tag_keys:
                        label = (tag_key, self._tag_values[tag_key](value))
                        usd, calls = batch.tags.get(label, (Decimal(0), 0))
                        batch.tags[label] = (usd + (cost or 0), calls + 1)
        return batch

    def record(self, batch: MetricBatch) -> None:
        for (provider, model), totals in batch.models.items():
            for (token_type, _), count in zip(TOKEN_TYPES, totals.tokens, strict=True):
                if count:
                    TOKENS.labels(provider, model, token_type).inc(count)
            if totals.reasoning:
                REASONING_TOKENS.labels(provider, model).inc(totals.reasoning)
            COST.labels(provider, model).inc(float(totals.cost))
            for status, count in totals.by_status.items():
                CALLS.labels(provider, model, status).inc(count)
            UNPRICED.labels(provider, model).inc(totals.unpriced)
        for (tag_key, value), (usd, calls) in batch.tags.items():
            TAG_COST.labels(tag_key, value).inc(float(usd))
            TAG_CALLS.labels(tag_key, value).inc(calls)
