"""The OTLP gateway: OpenTelemetry (traces, logs, metrics over OTLP/HTTP) from any agent, as our events."""
