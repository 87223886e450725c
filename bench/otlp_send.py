"""Send GenAI spans through the real OpenTelemetry SDK and its OTLP exporter, as an instrumented agent does.

    python -m bench.otlp_send --endpoint http://127.0.0.1:4318 --token TOKEN --turns 2000 --calls 10
    python -m bench.otlp_send --endpoint http://127.0.0.1:4317 --encoding grpc --token TOKEN

Each turn is an ``invoke_agent`` span (its own ``gen_ai.conversation.id``) around ``--calls`` ``chat`` spans
with GenAI usage attributes, made with the SDK's tracer. The SDK's OTLP/HTTP exporter (protobuf or JSON), or its
OTLP/gRPC exporter (``--encoding grpc``), sends them in batches of ``--batch``, one request after the other (as
the SDK's BatchSpanProcessor does), and retries what the receiver refuses with 429/503 (UNAVAILABLE over gRPC).

With ``--wait``, the spans are made first and the exporter built, then the sender prints ``{"ready": true}``
and sends only once a line arrives on its standard input: the bench starts its clock then, so that the
interpreter's start and the agent's own work (making the spans) are not counted, as making the baseline's
events is not. Prints one JSON line at the end: the spans sent, the model calls among them, the seconds
from the first request to the last answer, and whether every batch was accepted.

`spans()` builds the same spans in memory for the bench's baseline (the same events published directly).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

#: What the resource says: `client` becomes the tag `client:acme` on every call.
RESOURCE_ATTRIBUTES = {"service.name": "bench-agent", "client": "acme", "project": "bench"}
MODEL = "claude-sonnet-4-5"


def emit(provider: TracerProvider, turns: int, calls: int, first: int = 0) -> None:
    tracer = provider.get_tracer("bench.agent")
    for turn in range(first, first + turns):
        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": "bench",
            "gen_ai.conversation.id": f"bench-conversation-{turn}",
        }
        with tracer.start_as_current_span("invoke_agent bench", attributes=attributes):
            for call in range(calls):
                with tracer.start_as_current_span(f"chat {MODEL}") as span:
                    span.set_attributes(
                        {
                            "gen_ai.operation.name": "chat",
                            "gen_ai.provider.name": "anthropic",
                            "gen_ai.request.model": MODEL,
                            "gen_ai.response.model": MODEL,
                            "gen_ai.response.id": f"msg_bench_{turn}_{call}",
                            "gen_ai.response.finish_reasons": ("end_turn",),
                            # The conventions' input count includes the cached tokens.
                            "gen_ai.usage.input_tokens": 1_200 + call,
                            "gen_ai.usage.cache_read.input_tokens": 1_000,
                            "gen_ai.usage.cache_creation.input_tokens": 100,
                            "gen_ai.usage.output_tokens": 40 + call,
                        }
                    )


def spans(turns: int, calls: int, first: int = 0) -> Sequence[ReadableSpan]:
    """The spans `emit` makes, kept in memory, in the order they ended (as an SDK exports them)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create(RESOURCE_ATTRIBUTES))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    emit(provider, turns, calls, first)
    provider.shutdown()
    return exporter.get_finished_spans()


def _exporter(endpoint: str, token: str, encoding: str) -> SpanExporter:
    headers = {"Authorization": f"Bearer {token}"}
    if encoding == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        # gRPC metadata keys are lower case.
        return GrpcExporter(
            endpoint=endpoint, insecure=True, headers={"authorization": headers["Authorization"]}, timeout=30
        )
    if encoding == "json":
        from opentelemetry.exporter.otlp.json.http.trace_exporter import OTLPSpanExporter as JsonExporter

        return JsonExporter(endpoint=f"{endpoint}/v1/traces", headers=headers, timeout=30)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces", headers=headers, timeout=30)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.otlp_send", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--endpoint", required=True, help="the gateway's base URL (http://host:4318; OTLP/gRPC: http://host:4317)"
    )
    parser.add_argument("--token", required=True, help="a bearer token of the gateway (cos otlp token create)")
    parser.add_argument("--turns", type=int, default=2_000)
    parser.add_argument("--calls", type=int, default=10, help="chat spans per turn")
    parser.add_argument("--first-turn", type=int, default=0, help="number of the first turn (agents in parallel)")
    parser.add_argument("--encoding", choices=("protobuf", "json", "grpc"), default="protobuf")
    parser.add_argument("--batch", type=int, default=512, help="spans per export request")
    parser.add_argument("--wait", action="store_true", help="make the spans, say ready, send on a line of stdin")
    args = parser.parse_args(argv)
    made = spans(args.turns, args.calls, args.first_turn)
    batches = [made[i : i + args.batch] for i in range(0, len(made), args.batch)]
    exporter = _exporter(args.endpoint, args.token, args.encoding)
    if args.wait:
        print(json.dumps({"ready": True}), flush=True)
        sys.stdin.readline()
    started = time.monotonic()
    # One request after the other, as the SDK's BatchSpanProcessor sends them; the exporter retries 429/503.
    flushed = all(exporter.export(batch) is SpanExportResult.SUCCESS for batch in batches)
    seconds = time.monotonic() - started
    exporter.shutdown()
    print(json.dumps({"spans": len(made), "calls": args.turns * args.calls, "seconds": seconds, "flushed": flushed}))
    return 0 if flushed else 1


if __name__ == "__main__":
    sys.exit(main())
