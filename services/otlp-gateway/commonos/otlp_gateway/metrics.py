"""The gateway's Prometheus metrics (names fixed: the Grafana dashboard uses them), and the clients' own
OTLP metrics exposed as `cos_otlp_client_metric` (never as events: the log records and spans carry the same
usage, and billing both would count it twice).

    cos_otlp_requests_total{signal,encoding,code}   signal traces|logs|metrics, encoding protobuf|json|other
    cos_otlp_refused_total{reason}                  unauthenticated|bad_request|too_large|
                                                    unsupported_media_type|unavailable
    cos_otlp_records_total{signal,outcome}          spans, log records, metric points: accepted|rejected|ignored
    cos_otlp_events_published_total{type}           our events stored by JetStream (duplicates of a retry not counted)
    cos_otlp_request_seconds{signal}                request received -> response
    cos_otlp_lag_seconds{signal}                    the record's own time -> its events acknowledged by JetStream
    cos_otlp_client_metric{metric,profile,type,model,decision,tool_name,source}
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import Final

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality, NumberDataPoint
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

#: The attributes of a client's data point kept as labels: few values each (never session or user ids).
CLIENT_METRIC_LABELS: Final = ("type", "model", "decision", "tool_name", "source")
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

    def __init__(self) -> None:
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
        for labels, value in self.values().items():
            family.add_metric(list(labels), value)
        yield family


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry
        self.requests = Counter(
            "cos_otlp_requests",
            "OTLP requests by signal, encoding and HTTP status",
            ["signal", "encoding", "code"],
            registry=registry,
        )
        self.refused = Counter("cos_otlp_refused", "OTLP requests refused, by reason", ["reason"], registry=registry)
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
            "cos_otlp_request_seconds", "OTLP request received -> response", ["signal"], registry=registry
        )
        self.lag_seconds = Histogram(
            "cos_otlp_lag_seconds",
            "A record's own time -> its events acknowledged by JetStream",
            ["signal"],
            buckets=_LAG_BUCKETS,
            registry=registry,
        )
        self.client = ClientMetrics()
        registry.register(self.client)
