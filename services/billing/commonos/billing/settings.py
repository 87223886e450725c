"""Billing's own settings, beside the common ones of `commonos.runtime.settings`.

    COS_PRICE_FILE       the operator price file (TOML; `commonos.accounting.pricing`), beside genai-prices
    COS_BILLING_CONFIG   budgets per tag and period, metric labels (TOML; `commonos.billing.config`)

The service's `/metrics` `/healthz` `/readyz` port is COS_HTTP_PORT (default 9463), as for every service.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from commonos.runtime.settings import env_path


@dataclass(frozen=True, kw_only=True)
class BillingSettings:
    price_file: Path | None = None
    billing_config: Path | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> BillingSettings:
        env = os.environ if env is None else env
        return cls(price_file=env_path(env, "COS_PRICE_FILE"), billing_config=env_path(env, "COS_BILLING_CONFIG"))
