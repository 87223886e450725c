"""OTLP requests -> our events: the dispatch to one module per source (pure: no I/O).

One module per source maps its records: :mod:`~commonos.otlp_gateway.genai` (spans following the
OpenTelemetry GenAI semantic conventions), :mod:`~commonos.otlp_gateway.claude_code` (Claude Code's log
events) and :mod:`~commonos.otlp_gateway.codex` (Codex's log events). Metrics are never mapped to
events: the log events and spans carry the same usage, and billing both would count it twice.

Every event id is deterministic (derived from the source's own identifiers), so an exporter's retry of
a request publishes the same ids again, and JetStream and the consumers drop them as duplicates.

Logs (`map_logs`): each log record is routed by its event name (its ``event.name`` attribute, else
the record's ``event_name``: Codex fills that one with its source location): ``codex.*`` to
:mod:`~commonos.otlp_gateway.codex`; a record of Claude Code (its scope
``com.anthropic.claude_code.*``, its resource's ``service.name`` ``claude-code``, or an event name
``claude_code.*``) to :mod:`~commonos.otlp_gateway.claude_code`. Any other record is accepted and
ignored (counted in `Mapped.ignored`), never an error. A resource whose attributes give an invalid
tag (:mod:`~commonos.otlp_gateway.attributes`) has its vendor records refused with the reason; its
other records are ignored as usual.

Claude Code and Codex log no end of a turn: what each request saw of a session's turns is added to the
`CallOrdinals` store, and the gateway's sweeper ends them (:mod:`~commonos.otlp_gateway.turns`).

What every source module shares (`Source`, `Mapped`, `Emitter` and the ids) is
:mod:`~commonos.otlp_gateway.common`, which imports none of them: the dispatch imports the source modules,
they import the common module.
"""

from __future__ import annotations

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from commonos.otlp_gateway import claude_code, codex, genai
from commonos.otlp_gateway.attributes import attributes, text
from commonos.otlp_gateway.common import CallOrdinals, Emitter, Mapped, Record, Source
from commonos.proto.tags import InvalidTag
from commonos.proto.vendors import CLAUDE_CODE, CODEX

# --- dispatch -------------------------------------------------------------------------------------


def _vendor(record: Record, scope_name: str, service_name: str | None) -> str | None:
    if record.name.startswith("codex."):
        return CODEX
    if (
        scope_name.startswith("com.anthropic.claude_code")
        or service_name == CLAUDE_CODE
        or record.name.startswith("claude_code.")
    ) and record.name:
        return CLAUDE_CODE
    return None


def vendor_tags(tags: tuple[str, ...], vendor: str) -> tuple[str, ...]:
    """A resource's tags and ``vendor:<vendor>``, each once."""
    return tuple(dict.fromkeys((*tags, f"vendor:{vendor}")))


async def map_logs(request: ExportLogsServiceRequest, source: Source, ordinals: CallOrdinals) -> Mapped:
    """The events of an OTLP logs request: Claude Code's and Codex's records mapped, any other ignored."""
    mapped = Mapped()
    emitter = Emitter(source, mapped)
    for resource_logs in request.resource_logs:
        resource = attributes(resource_logs.resource.attributes)
        service_name = text(resource.get("service.name"))
        by_vendor: dict[str, list[Record]] = {}
        for scope in resource_logs.scope_logs:
            for raw in scope.log_records:
                record = Record.of(raw)
                vendor = _vendor(record, scope.scope.name, service_name)
                if vendor is None:
                    mapped.ignored += 1
                else:
                    by_vendor.setdefault(vendor, []).append(record)
        if not by_vendor:
            continue
        try:
            tags, left_out = source.tags_of(resource)
        except InvalidTag as exc:
            mapped.reject(f"resource of {', '.join(sorted(by_vendor))}: {exc}", sum(map(len, by_vendor.values())))
            continue
        if left_out is not None:
            mapped.warn(left_out)
        if CLAUDE_CODE in by_vendor:
            claude_code.map_records(by_vendor[CLAUDE_CODE], vendor_tags(tags, CLAUDE_CODE), emitter)
        if CODEX in by_vendor:
            await codex.map_records(by_vendor[CODEX], vendor_tags(tags, CODEX), emitter, ordinals)
    # What the request saw of each session's turns, kept before it is answered: the sweeper ends them.
    for seen in emitter.turns_seen():
        await ordinals.note_turns(seen)
    return mapped


def map_traces(request: ExportTraceServiceRequest, source: Source) -> Mapped:
    """The events of an OTLP traces request: :func:`commonos.otlp_gateway.genai.map_spans`."""
    return genai.map_spans(request, source)
