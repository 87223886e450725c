"""The console's Prometheus metrics (on its own /metrics, like every service's).

cos_console_requests_total{route,method,code}   requests answered, by route template (never by URL)
cos_console_request_seconds{route}              request received -> response started
cos_console_live_watchers                       browsers following live events (SSE, WebSocket)
cos_console_sign_ins_total{outcome}             ok | refused
"""

from __future__ import annotations

from typing import Final

from prometheus_client import Counter, Gauge, Histogram

REQUESTS: Final = Counter("cos_console_requests_total", "Requests the console answered", ["route", "method", "code"])
REQUEST_SECONDS: Final = Histogram(
    "cos_console_request_seconds",
    "Time from a request to its response's start",
    ["route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0),
)
LIVE_WATCHERS: Final = Gauge("cos_console_live_watchers", "Browsers following live events")
SIGN_INS: Final = Counter("cos_console_sign_ins_total", "Sign-in attempts", ["outcome"])
