"""The OTLP/gRPC receiver: the collector's `TraceService`, `LogsService` and `MetricsService` `Export` calls
(https://opentelemetry.io/docs/specs/otlp/#otlpgrpc) on COS_OTLP_GRPC_PORT (4317), with `grpc.aio`.

Each call goes through the same receiver as OTLP/HTTP (`server.OtlpReceiver`: `authenticate`, then `export`),
so the tokens, the mapping, the partial success and the guarantees are the same:

1. the metadata `authorization: Bearer <token>` names the profile; none or an unknown one is UNAUTHENTICATED;
2. a message over COS_OTLP_MAX_BODY_BYTES, as sent or inflated (gzip, which gRPC inflates itself), is refused
   by gRPC with RESOURCE_EXHAUSTED (`grpc.max_receive_message_length`); one that cannot be decoded is
   INVALID_ARGUMENT;
3. the answer is OK only once JetStream acknowledged every event of the request. While NATS is unavailable it
   is UNAVAILABLE with a `google.rpc.RetryInfo` (COS_OTLP_RETRY_AFTER_S) in the trailing metadata, as OTLP
   specifies: in `grpc-status-details-bin` (a google.rpc.Status whose details hold it) and, for exporters that
   read it there, `google.rpc.retryinfo-bin`. Exporters retry UNAVAILABLE, and a retried request mints the same
   event ids, which JetStream drops as duplicates.

The handlers take the serialized request and decode it themselves (`decode.parse_request`): a message that
cannot be decoded is then INVALID_ARGUMENT and counted, where gRPC's own deserializer would answer INTERNAL and
log a traceback. Their method names are those of the official service definitions (the descriptors of
`opentelemetry-proto`'s `*_service_pb2`, whose `*_pb2_grpc` stubs the tests call them with).

The server does not share its port (`grpc.so_reuseport` off, where gRPC turns it on by default): a second
gateway on the same machine, another `cos up`'s, must fail to bind 4317 rather than receive half of this one's
connections.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Final

import grpc
from google.protobuf import any_pb2, duration_pb2  # type: ignore[import-untyped]
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from commonos.otlp_gateway.decode import BadRequest, parse_request
from commonos.otlp_gateway.server import REQUESTS, NotNow, OtlpReceiver, Refusal

log = logging.getLogger(__name__)

#: The service of each signal, by its full name in the official definitions.
SERVICES: Final = {
    "traces": trace_service_pb2.DESCRIPTOR.services_by_name["TraceService"].full_name,
    "logs": logs_service_pb2.DESCRIPTOR.services_by_name["LogsService"].full_name,
    "metrics": metrics_service_pb2.DESCRIPTOR.services_by_name["MetricsService"].full_name,
}
#: The trailing metadata keys of a retry's delay: the status details gRPC defines, and the RetryInfo alone.
STATUS_DETAILS_KEY: Final = "grpc-status-details-bin"
RETRY_INFO_KEY: Final = "google.rpc.retryinfo-bin"

_CODES: Final = {code.value[0]: code for code in grpc.StatusCode}

Handler = Callable[[bytes, "grpc.aio.ServicerContext[bytes, bytes]"], Awaitable[bytes]]


def authorization_of(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The `authorization` value of a call's metadata (gRPC sends keys in lower case; any case is taken)."""
    for key, value in metadata or ():
        if key.lower() == "authorization":
            return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return None


def retry_metadata(code: int, text: str, retry_after_s: float) -> tuple[tuple[str, bytes], ...]:
    """The trailing metadata of an UNAVAILABLE answer: a google.rpc.Status holding a RetryInfo, and the
    RetryInfo alone."""
    delay = duration_pb2.Duration(seconds=int(retry_after_s), nanos=int((retry_after_s % 1) * 1e9))
    info = error_details_pb2.RetryInfo(retry_delay=delay)
    detail = any_pb2.Any()
    detail.Pack(info)
    status = status_pb2.Status(code=code, message=text, details=[detail])
    return ((STATUS_DETAILS_KEY, status.SerializeToString()), (RETRY_INFO_KEY, info.SerializeToString()))


class OtlpGrpcServer:
    """The receiver over OTLP/gRPC on its own port (a `commonos.runtime.service.Listener`)."""

    def __init__(self, receiver: OtlpReceiver, host: str, port: int, shutdown_timeout_s: float = 10.0) -> None:
        self.receiver = receiver
        self.host = host
        self.port = port
        self.shutdown_timeout_s = shutdown_timeout_s
        self._server: grpc.aio.Server | None = None

    @property
    def target(self) -> str:
        """host:port, as a gRPC client names it (all addresses: 127.0.0.1)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    @property
    def url(self) -> str:
        """The endpoint an OTLP exporter is given (OTEL_EXPORTER_OTLP_ENDPOINT with the gRPC protocol)."""
        return f"http://{self.target}"

    async def start(self) -> int:
        limit = self.receiver.settings.max_body_bytes
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
                ("grpc.so_reuseport", 0),
            ]
        )
        server.add_generic_rpc_handlers(
            [
                # No (de)serializer: bytes in, bytes out.
                grpc.method_handlers_generic_handler(
                    name, {"Export": grpc.unary_unary_rpc_method_handler(self._handler(signal))}
                )
                for signal, name in SERVICES.items()
            ]
        )
        address = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        try:
            bound = server.add_insecure_port(address)
        except RuntimeError as exc:  # gRPC says "Failed to bind to address", whatever the cause
            await server.stop(None)
            raise OSError(
                errno.EADDRINUSE, f"OTLP/gRPC cannot listen on {address}: address already in use or unavailable ({exc})"
            ) from None
        await server.start()
        self._server = server
        self.port = bound
        return bound

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(self.shutdown_timeout_s)
            self._server = None

    def _handler(self, signal: str) -> Handler:
        receiver = self.receiver
        metrics = receiver.metrics

        async def export(data: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
            started = time.monotonic()

            def record(code: grpc.StatusCode) -> None:
                # Before the call ends: a client that has its answer finds it counted.
                metrics.grpc_requests.labels(signal, code.name).inc()
                metrics.grpc_request_seconds.labels(signal).observe(time.monotonic() - started)

            refusal: Refusal | NotNow
            try:
                token = receiver.authenticate(authorization_of(context.invocation_metadata()))
                try:
                    message = parse_request(REQUESTS[signal](), data, "protobuf")
                except BadRequest as exc:
                    raise Refusal(400, "bad_request", grpc.StatusCode.INVALID_ARGUMENT.value[0], str(exc)) from None
                response = bytes((await receiver.export(signal, token, message)).SerializeToString())
            except (Refusal, NotNow) as refused:
                refusal = refused
            except asyncio.CancelledError:
                record(grpc.StatusCode.CANCELLED)
                raise
            except Exception as exc:  # a bug of ours: said, logged, and not retried by the exporter as is
                log.exception("%s request (gRPC) failed", signal)
                record(grpc.StatusCode.INTERNAL)
                await context.abort(grpc.StatusCode.INTERNAL, f"the gateway failed: {type(exc).__name__}")
            else:
                record(grpc.StatusCode.OK)
                return response
            metrics.refused.labels(refusal.reason).inc()
            code = _CODES.get(refusal.grpc_code, grpc.StatusCode.UNKNOWN)
            trailing = (
                retry_metadata(refusal.grpc_code, refusal.text, receiver.settings.retry_after_s)
                if isinstance(refusal, NotNow)
                else ()
            )
            record(code)
            await context.abort(code, refusal.text, trailing_metadata=trailing)

        return export
