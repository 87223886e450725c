"""The loop's own settings, beside the common ones of `commonos.runtime.settings`.

    COS_TURN_HEARTBEAT_S   a loop refreshes its running turns this often (default 5)
    COS_TURN_STALE_S       a turn silent this long is recorded interrupted by another loop (default 20)

The service's `/metrics` `/healthz` `/readyz` port is COS_HTTP_PORT (default 9461), as for every service.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from commonos.runtime.settings import env_float


@dataclass(frozen=True, kw_only=True)
class LoopSettings:
    #: A loop refreshes its running turns this often; a turn silent for `turn_stale_s` is interrupted.
    turn_heartbeat_s: float = 5.0
    turn_stale_s: float = 20.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LoopSettings:
        env = os.environ if env is None else env
        return cls(
            turn_heartbeat_s=env_float(env, "COS_TURN_HEARTBEAT_S", 5.0, 0.1, 300.0),
            turn_stale_s=env_float(env, "COS_TURN_STALE_S", 20.0, 0.5, 3600.0),
        )
