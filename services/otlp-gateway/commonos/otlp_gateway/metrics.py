"""The gateway's Prometheus metrics (names fixed: the Grafana dashboard uses them), and the clients' own
OTLP metrics exposed as `cos_otlp_client_metric` (never as events: the log records and spans carry the same
usage, and billing both would count it twice).

    cos_otlp_requests_total{signal,encoding,code}   OTLP/HTTP: signal traces|logs|metrics|other, encoding
                                                    protobuf|json|other|grpc (a gRPC client on the HTTP port)
    cos_otlp_grpc_requests_total{signal,code}       OTLP/gRPC: code OK, UNAUTHENTICATED, INVALID_ARGUMENT,
                                                    UNAVAILABLE, INTERNAL (RESOURCE_EXHAUSTED is gRPC's own)
    cos_otlp_refused_total{reason}                  unauthenticated|bad_request|too_large|body_timeout|host|
                                                    unsupported_media_type|unavailable|grpc_on_http_port
                                                    (both transports)
    cos_otlp_records_total{signal,outcome}          spans, log records, metric points: accepted|rejected|ignored
    cos_otlp_events_published_total{type}           our events stored by JetStream (duplicates of a retry not counted)
    cos_otlp_request_seconds{signal}                request received -> response (OTLP/HTTP)
    cos_otlp_grpc_request_seconds{signal}           the same, OTLP/gRPC
    cos_otlp_lag_seconds{signal}                    the record's own time -> its events acknowledged by JetStream
    cos_otlp_client_metric{metric,profile,type,model,decision,tool_name,source}
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Final

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality, NumberDataPoint
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

#: The attributes of a client's data point kept as labels: few values each (never session or user ids).
CLIENT_METRIC_LABELS: Final = ("type", "model", "decision", "tool_name", "source")
#: The metrics Claude Code documents (and sends): exposed at 0 for every profile with a token until its first
#: point, their other labels empty.
KNOWN_CLIENT_METRICS: Final = (
    "claude_code.session.count",
    "claude_code.token.usage",
    "claude_code.cost.usage",
    "claude_code.lines_of_code.count",
    "claude_code.commit.count",
    "claude_code.pull_request.count",
    "claude_code.code_edit_tool.decision",
    "claude_code.active_time.total",
)
#: Series (and, for cumulative sums, the client streams behind them) kept at most; the oldest go first.
MAX_STREAMS: Final = 20_000

_LAG_BUCKETS: Final = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


def _label(value: AnyValue) -> str:
    kind = value.WhichOneof("value")
    if kind is None:
        return ""
    if kind in ("array_value", "kvlist_value", "bytes_value"):
        return ""
    return str(getattr(value, kind))


def _stream_key(attributes: Iterable[KeyValue]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((kv.key, _label(kv.value)) for kv in attributes))


def _point_value(point: NumberDataPoint) -> float:
    return float(point.as_double) if point.WhichOneof("value") == "as_double" else float(point.as_int)


class ClientMetrics(Collector):
    """The latest state of every client metric, summed over the clients' streams per label set.

    A cumulative Sum's stream (its resource and all its attributes) is remembered at its latest value, a
    delta Sum's is added up; a Gauge keeps its latest point per label set. Histograms give `<name>_count`
    and `<name>_sum` as sums.
    """

    def __init__(self, profiles: Callable[[], Iterable[str]] | None = None) -> None:
        #: The profiles known to send (those with a token): each known metric of theirs is 0 until its first point.
        self.profiles = profiles
        self._lock = threading.Lock()
        #: (labels, stream) -> value, for sums; the exposed value of a label set is their total.
        self._sums: OrderedDict[tuple[tuple[str, ...], tuple[tuple[str, str], ...]], float] = OrderedDict()
        self._gauges: OrderedDict[tuple[str, ...], float] = OrderedDict()

    def _labels(self, metric: str, profile: str, attributes: Iterable[KeyValue]) -> tuple[str, ...]:
        found = {kv.key.replace(".", "_"): _label(kv.value) for kv in attributes}
        return (metric, profile, *(found.get(name, "") for name in CLIENT_METRIC_LABELS))

    def _sum(
        self, labels: tuple[str, ...], stream: tuple[tuple[str, str], ...], value: float, cumulative: bool
    ) -> None:
        key = (labels, stream)
        if cumulative:
            self._sums[key] = value
        else:
            self._sums[key] = self._sums.get(key, 0.0) + value
        self._sums.move_to_end(key)
        while len(self._sums) > MAX_STREAMS:
            self._sums.popitem(last=False)

    def record(self, request: ExportMetricsServiceRequest, profile: str) -> int:
        """Take the points of `request`; how many data points it held."""
        points = 0
        with self._lock:
            for resource_metrics in request.resource_metrics:
                resource = _stream_key(resource_metrics.resource.attributes)
                for scope_metrics in resource_metrics.scope_metrics:
                    for metric in scope_metrics.metrics:
                        kind = metric.WhichOneof("data")
                        if kind == "sum":
                            cumulative = (
                                metric.sum.aggregation_temporality
                                != AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
                            )
                            for point in metric.sum.data_points:
                                points += 1
                                labels = self._labels(metric.name, profile, point.attributes)
                                stream = resource + _stream_key(point.attributes)
                                self._sum(labels, stream, _point_value(point), cumulative)
                        elif kind == "gauge":
                            for point in metric.gauge.data_points:
                                points += 1
                                labels = self._labels(metric.name, profile, point.attributes)
                                self._gauges[labels] = _point_value(point)
                                self._gauges.move_to_end(labels)
                                while len(self._gauges) > MAX_STREAMS:
                                    self._gauges.popitem(last=False)
                        elif kind == "histogram":
                            cumulative = (
                                metric.histogram.aggregation_temporality
                                != AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
                            )
                            for hpoint in metric.histogram.data_points:
                                points += 1
                                stream = resource + _stream_key(hpoint.attributes)
                                for suffix, value in (("_count", float(hpoint.count)), ("_sum", hpoint.sum)):
                                    labels = self._labels(metric.name + suffix, profile, hpoint.attributes)
                                    self._sum(labels, stream, value, cumulative)
                        elif kind == "exponential_histogram":
                            points += len(metric.exponential_histogram.data_points)
                        elif kind == "summary":
                            points += len(metric.summary.data_points)
        return points

    def values(self) -> dict[tuple[str, ...], float]:
        with self._lock:
            out: dict[tuple[str, ...], float] = dict(self._gauges)
            for (labels, _), value in self._sums.items():
                out[labels] = out.get(labels, 0.0) + value
        return out

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "cos_otlp_client_metric",
            "The clients' own OTLP metrics (sums, gauges, histograms' _count/_sum), by profile; never billed",
            labels=["metric", "profile", *CLIENT_METRIC_LABELS],
        )
        values = self.values()
        for labels, value in values.items():
            family.add_metric(list(labels), value)
        seen = {labels[:2] for labels in values}
        empty = [""] * len(CLIENT_METRIC_LABELS)
        for profile in sorted(set(self.profiles() if self.profiles is not None else ())):
            for metric in KNOWN_CLIENT_METRICS:
                if (metric, profile) not in seen:
                    family.add_metric([metric, profile, *empty], 0.0)
        yield family


#: The label values known from the start, whose series are exposed at 0 before their first request (a dashboard
#: or an alert then tells "none" from "not scraped").
SIGNALS: Final = ("traces", "logs", "metrics")
REFUSAL_REASONS: Final = (
    "unauthenticated",
    "bad_request",
    "too_large",
    "body_timeout",
    "unsupported_media_type",
    "unavailable",
    "host",
    "grpc_on_http_port",
)
RECORD_OUTCOMES: Final = ("accepted", "rejected", "ignored")
#: The event types the mappings publish.
PUBLISHED_TYPES: Final = (
    "session_created",
    "turn_started",
    "turn_finished",
    "tool_call_recorded",
    "approval_decided",
    "model_call_completed",
)
#: The gRPC codes the gateway answers with itself.
GRPC_CODES: Final = ("OK", "UNAUTHENTICATED", "INVALID_ARGUMENT", "UNAVAILABLE", "INTERNAL")


class GatewayMetrics:
    def __init__(
        self, registry: CollectorRegistry = REGISTRY, *, profiles: Callable[[], Iterable[str]] | None = None
    ) -> None:
        self.registry = registry
        self.requests = Counter(
            "cos_otlp_requests",
            "OTLP/HTTP requests by signal, encoding and HTTP status",
            ["signal", "encoding", "code"],
            registry=registry,
        )
        self.grpc_requests = Counter(
            "cos_otlp_grpc_requests",
            "OTLP/gRPC requests by signal and gRPC status code",
            ["signal", "code"],
            registry=registry,
        )
        self.refused = Counter(
            "cos_otlp_refused", "OTLP requests refused (HTTP and gRPC), by reason", ["reason"], registry=registry
        )
        self.records = Counter(
            "cos_otlp_records",
            "Spans, log records and metric points received, by outcome (accepted, rejected, ignored)",
            ["signal", "outcome"],
            registry=registry,
        )
        self.events_published = Counter(
            "cos_otlp_events_published",
            "Events the gateway published and JetStream stored (a retry's duplicates not counted)",
            ["type"],
            registry=registry,
        )
        self.request_seconds = Histogram(
            "cos_otlp_request_seconds", "OTLP/HTTP request received -> response", ["signal"], registry=registry
        )
        self.grpc_request_seconds = Histogram(
            "cos_otlp_grpc_request_seconds", "OTLP/gRPC request received -> response", ["signal"], registry=registry
        )
        self.lag_seconds = Histogram(
            "cos_otlp_lag_seconds",
            "A record's own time -> its events acknowledged by JetStream",
            ["signal"],
            buckets=_LAG_BUCKETS,
            registry=registry,
        )
        for signal in SIGNALS:
            self.requests.labels(signal, "protobuf", "200")
            self.request_seconds.labels(signal)
            self.grpc_request_seconds.labels(signal)
            self.lag_seconds.labels(signal)
            for code in GRPC_CODES:
                self.grpc_requests.labels(signal, code)
            for outcome in RECORD_OUTCOMES:
                self.records.labels(signal, outcome)
        for reason in REFUSAL_REASONS:
            self.refused.labels(reason)
        for kind in PUBLISHED_TYPES:
            self.events_published.labels(kind)
        self.client = ClientMetrics(profiles)
        registry.register(self.client)
