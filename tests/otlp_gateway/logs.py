"""Small OTLP log requests for the mapping's tests: records built from Python values, and the recorded ones."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from google.protobuf import json_format  # type: ignore[import-untyped]
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from commonos.otlp_gateway.common import CallOrdinals, Mapped, MemoryOrdinals, Source
from commonos.otlp_gateway.mapping import map_logs

T0 = datetime(2026, 12, 1, 20, 0, 0, tzinfo=UTC)
CLAUDE_RESOURCE: dict[str, Any] = {"service.name": "claude-code", "service.version": "2.1.332"}
CLAUDE_SCOPE = "com.anthropic.claude_code.events"
CODEX_RESOURCE: dict[str, Any] = {"service.name": "codex_exec", "service.version": "0.171.0"}
CODEX_SCOPE = "codex_otel.log_only"


def any_value(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, bytes):
        return AnyValue(bytes_value=value)
    if isinstance(value, list):
        out = AnyValue()
        out.array_value.values.extend(any_value(v) for v in value)
        return out
    if isinstance(value, dict):
        out = AnyValue()
        out.kvlist_value.values.extend(kvs(value))
        return out
    return AnyValue(string_value=str(value))


def kvs(values: dict[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=k, value=any_value(v)) for k, v in values.items()]


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def record(name: str, attrs: dict[str, Any], seconds: float = 0.0, *, nanos: bool = True) -> LogRecord:
    """A log record of event `name` at T0 + `seconds` (in ``event.timestamp``, and ``time_unix_nano`` if `nanos`)."""
    moment = at(seconds)
    out = LogRecord(body=AnyValue(string_value=name))
    if nanos:
        out.time_unix_nano = int(moment.timestamp() * 1_000_000_000)
    out.attributes.extend(kvs({"event.name": name, "event.timestamp": iso(moment), **attrs}))
    return out


def request(*resources: tuple[dict[str, Any], str, list[LogRecord]]) -> ExportLogsServiceRequest:
    """A request of resources, each (resource attributes, scope name, records)."""
    out = ExportLogsServiceRequest()
    for attrs, scope, records in resources:
        resource_logs = ResourceLogs(resource=Resource(attributes=kvs(attrs)))
        resource_logs.scope_logs.append(ScopeLogs(scope=InstrumentationScope(name=scope), log_records=records))
        out.resource_logs.append(resource_logs)
    return out


def claude(*records: LogRecord, resource: dict[str, Any] | None = None) -> ExportLogsServiceRequest:
    return request(({**CLAUDE_RESOURCE, **(resource or {})}, CLAUDE_SCOPE, list(records)))


def codex(*records: LogRecord, resource: dict[str, Any] | None = None) -> ExportLogsServiceRequest:
    return request(({**CODEX_RESOURCE, **(resource or {})}, CODEX_SCOPE, list(records)))


SOURCE = Source(profile_id="otlp-test")


async def mapped(
    req: ExportLogsServiceRequest, ordinals: CallOrdinals | None = None, source: Source = SOURCE
) -> Mapped:
    return await map_logs(req, source, ordinals if ordinals is not None else MemoryOrdinals())


def recorded_logs(folder: Path) -> list[tuple[str, ExportLogsServiceRequest]]:
    """A recorded scenario's OTLP logs payloads (``otlp/NNN-logs.json``), in file order, parsed."""
    return [
        (path.name, json_format.Parse(path.read_text(), ExportLogsServiceRequest()))
        for path in sorted((folder / "otlp").glob("*-logs.json"))
    ]
