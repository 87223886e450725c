"""One ``model_calls`` row as billing builds it (`projection.build_row`) and its budgets and metrics read it."""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal

import msgspec

from commonos.accounting.usage import TokenUsage

__all__ = ["ModelCallRow"]


class ModelCallRow(msgspec.Struct, frozen=True):
    """One ``model_calls`` row: its token columns are the call's `TokenUsage` (`billing.schema.MODEL_CALLS`
    places them among the others and leaves out `service_tier`, which no column holds)."""

    event_id: uuid.UUID
    profile_id: str
    session_id: uuid.UUID
    turn_id: uuid.UUID | None
    request_id: str | None
    provider: str
    model: str
    #: The counts, `usage_estimated` and `speed` (`commonos.accounting.usage`).
    usage: TokenUsage
    latency_s: float | None
    stop_reason: str | None
    reported_cost_usd: Decimal | None
    cost_usd: Decimal | None
    cost_status: str
    price_source: str
    price_version: str
    price_detail: str
    tags: tuple[str, ...]
    created_at: datetime
