"""The console's Prometheus metrics (on its own /metrics, like every service's).

cos_console_requests_total{route,method,code}   requests answered, by route template (never by URL)
cos_console_request_seconds{route}              request received -> response started
cos_console_live_watchers                       browsers following live events (SSE, WebSocket)
cos_console_sign_ins_total{outcome}             ok | refused
cos_console_api_requests_total{auth}            JSON API requests (/api/…) by who made them: key (an API key),
                                                cookie, proxy, none (not signed in, or a key refused)
cos_database_replica_lag_seconds                how far the replica the pages read (COS_DATABASE_READ_URL) is
cos_database_replica_lag_bytes                  behind its primary: seconds since the last transaction it
                                                replayed (0 once it has replayed all it received), and WAL
                                                received not yet replayed; NaN without a replica, while it does
                                                not answer, or while it receives nothing (measured every
                                                REPLICA_LAG_INTERVAL_S by the console, and at each Operations page)
"""

from __future__ import annotations

import math
from typing import Final

from prometheus_client import Counter, Gauge, Histogram

from commonos.runtime.postgres import ReplicaLag

REQUESTS: Final = Counter("cos_console_requests_total", "Requests the console answered", ["route", "method", "code"])
REQUEST_SECONDS: Final = Histogram(
    "cos_console_request_seconds",
    "Time from a request to its response's start",
    ["route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0),
)
LIVE_WATCHERS: Final = Gauge("cos_console_live_watchers", "Browsers following live events")
SIGN_INS: Final = Counter("cos_console_sign_ins_total", "Sign-in attempts", ["outcome"])
API_REQUESTS: Final = Counter("cos_console_api_requests_total", "JSON API requests by authentication", ["auth"])
REPLICA_LAG_SECONDS: Final = Gauge(
    "cos_database_replica_lag_seconds", "Seconds the console's read replica is behind (NaN: none or unknown)"
)
REPLICA_LAG_BYTES: Final = Gauge(
    "cos_database_replica_lag_bytes", "WAL the console's read replica received, not yet replayed (NaN: unknown)"
)
REPLICA_LAG_SECONDS.set(math.nan)
REPLICA_LAG_BYTES.set(math.nan)


def show_replica_lag(lag: ReplicaLag | None) -> None:
    """The gauges of one measure (None: no replica, or it did not answer)."""
    if lag is None or not lag.standby:
        REPLICA_LAG_SECONDS.set(math.nan)
        REPLICA_LAG_BYTES.set(math.nan)
        return
    REPLICA_LAG_SECONDS.set(math.nan if lag.seconds is None else lag.seconds)
    REPLICA_LAG_BYTES.set(math.nan if lag.bytes is None else lag.bytes)
