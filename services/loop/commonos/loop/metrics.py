"""Prometheus metrics of the loop. Labels are bounded: status, tool and profile-configured model names."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

TURNS = Counter("cos_loop_turns_total", "Turns finished, by status", ["status"])
TURN_SECONDS = Histogram(
    "cos_loop_turn_duration_seconds", "Wall time of a turn", buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)
)
TURNS_RUNNING = Gauge("cos_loop_turns_in_progress", "Turns running now")
SESSION_BUSY = Counter("cos_loop_session_busy_total", "Turns refused because their session was busy")
TOOL_CALLS = Counter("cos_loop_tool_calls_total", "Tool calls, by tool and outcome", ["tool", "outcome"])
APPROVALS = Counter("cos_loop_approvals_total", "Approval decisions, by status and decider kind", ["status", "by"])
MODEL_SECONDS = Histogram(
    "gen_ai_client_operation_duration_seconds",
    "Duration of a model call (OpenTelemetry GenAI)",
    ["gen_ai_system", "gen_ai_request_model"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128),
)
MODEL_TOKENS = Histogram(
    "gen_ai_client_token_usage",
    "Tokens of a model call by type (OpenTelemetry GenAI)",
    ["gen_ai_system", "gen_ai_token_type"],
    buckets=(1, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576),
)
MODEL_ERRORS = Counter("cos_loop_model_call_errors_total", "Model calls that failed for good", ["gen_ai_system"])
MODEL_CALLS_REFUSED = Counter(
    "cos_loop_model_calls_refused_total", "Model calls refused because an enforced budget was exhausted", ["budget"]
)
