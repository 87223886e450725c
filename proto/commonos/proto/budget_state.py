"""The state of an enforced budget, as billing stores it for the loop (JetStream key-value bucket ``COS_BUDGETS``).

Billing is the only writer: one key per budget with ``enforce = true`` (:func:`budget_key`), whose value is a
:class:`BudgetState` in JSON (amounts as exact decimal strings). The loop only reads it.
"""

from __future__ import annotations

import base64
from datetime import datetime
from decimal import Decimal
from typing import Final

import msgspec

__all__ = ["BUDGETS_BUCKET", "BUDGETS_STREAM", "BudgetState", "budget_key", "decode_state", "encode_state"]

BUDGETS_BUCKET: Final = "COS_BUDGETS"
#: The stream JetStream keeps the bucket in.
BUDGETS_STREAM: Final = f"KV_{BUDGETS_BUCKET}"


class BudgetState(msgspec.Struct, frozen=True, kw_only=True):
    """An enforced budget's current period: its spend as billing last committed it."""

    budget: str
    tag: str
    period: str
    period_start: datetime
    period_end: datetime
    limit_usd: Decimal
    spent_usd: Decimal
    exhausted: bool
    updated_at: datetime


def budget_key(name: str) -> str:
    """The bucket key of budget ``name``: KV keys allow only ``[-/_=.A-Za-z0-9]``, so the name is encoded
    (URL-safe base64 without padding, ``b.`` prefixed so that the key never starts with a dot)."""
    return "b." + base64.urlsafe_b64encode(name.encode()).decode().rstrip("=")


_encoder: Final = msgspec.json.Encoder(decimal_format="string")


def encode_state(state: BudgetState) -> bytes:
    return _encoder.encode(state)


def decode_state(raw: bytes) -> BudgetState:
    """Raises ``msgspec.ValidationError`` / ``DecodeError`` for a value that is no budget state."""
    return msgspec.json.decode(raw, type=BudgetState)
