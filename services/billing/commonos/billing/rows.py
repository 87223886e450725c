"""One ``model_calls`` row as billing builds it (`projection.build_row`) and its budgets and metrics read it."""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from typing import NamedTuple

__all__ = ["ModelCallRow"]


class ModelCallRow(NamedTuple):
    """One ``model_calls`` row, in column order."""

    event_id: uuid.UUID
    profile_id: str
    session_id: uuid.UUID
    turn_id: uuid.UUID | None
    request_id: str | None
    provider: str
    model: str
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_5m_tokens: int
    cache_write_1h_tokens: int
    reasoning_tokens: int
    speed: str | None
    latency_s: float | None
    stop_reason: str | None
    usage_estimated: bool
    reported_cost_usd: Decimal | None
    cost_usd: Decimal | None
    cost_status: str
    price_source: str
    price_version: str
    price_detail: str
    tags: tuple[str, ...]
    created_at: datetime
