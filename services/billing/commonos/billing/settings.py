"""Billing's own settings, beside the common ones of `commonos.runtime.settings`.

    COS_PRICE_FILE             the operator price file (TOML; `commonos.accounting.pricing`), beside genai-prices
    COS_BILLING_CONFIG         budgets per tag and period, metric labels (TOML; `commonos.billing.config`)
    COS_BILLING_PRICED_EVENTS  `on` (default): every priced call, and every reprice that changes one, is published
                               as a `model_call_priced` event on `COS_COSTS` (`commonos.billing.outbox`); `off`:
                               nothing is queued or published

The service's `/metrics` `/healthz` `/readyz` port is COS_HTTP_PORT (default 9463), as for every service.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from commonos.runtime.errors import ConfigError
from commonos.runtime.settings import env_path

_ON = frozenset({"", "on", "1", "true", "yes"})
_OFF = frozenset({"off", "0", "false", "no"})


def priced_events_enabled(env: Mapping[str, str] | None = None) -> bool:
    """COS_BILLING_PRICED_EVENTS: on (the default) or off; anything else is a ConfigError."""
    env = os.environ if env is None else env
    value = env.get("COS_BILLING_PRICED_EVENTS", "").strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ConfigError(f"COS_BILLING_PRICED_EVENTS={value!r} is neither on nor off")


@dataclass(frozen=True, kw_only=True)
class BillingSettings:
    price_file: Path | None = None
    billing_config: Path | None = None
    priced_events: bool = True

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> BillingSettings:
        env = os.environ if env is None else env
        return cls(
            price_file=env_path(env, "COS_PRICE_FILE"),
            billing_config=env_path(env, "COS_BILLING_CONFIG"),
            priced_events=priced_events_enabled(env),
        )
