"""The OTLP/HTTP receiver: `POST /v1/traces`, `/v1/logs`, `/v1/metrics` (https://opentelemetry.io/docs/specs/otlp/).

For each request, in order:

1. the bearer token (`Authorization: Bearer <token>`) names the profile; none or an unknown one is 401 with a
   `WWW-Authenticate` challenge, before the body is read;
2. Content-Type `application/x-protobuf` or `application/json` (else 415), Content-Encoding gzip or none
   (else 415); a body over the limit, as sent or inflated, is 413; one that cannot be decoded 400 (with a
   google.rpc.Status body);
3. spans and log records are mapped to our events (`mapping.map_traces`, `mapping.map_logs`); metrics only
   update `cos_otlp_client_metric`, never events;
4. the events are published and the answer is 200 only once JetStream acknowledged every one of them.
   While NATS is unavailable (disconnected, or the acknowledgements not all there within the publish
   timeout) the answer is 503 with Retry-After: OTLP exporters retry 429/502/503/504, and a retried
   request mints the same event ids, which JetStream drops as duplicates.

A 200 carries the Export*ServiceResponse in the request's encoding, with `partial_success` (the records
refused and why) when some were refused; error responses carry a google.rpc.Status.

Before any of it, on this port and on the service's `/metrics` `/healthz` `/readyz` port: a Host header
naming none of the names the port answers (`allowed_hosts`) is 421. A web page whose own name was
rebound to 127.0.0.1 (DNS rebinding) could otherwise read a loopback gateway's unauthenticated
`/metrics` (its profiles, its clients' metrics) as the page's own origin. A request without a Host
(no browser sends one) is served. And a connection that has not sent a request's headers within
`GatewaySettings.header_timeout_s` (from its opening or its last answer; aiohttp's keep-alive timer,
which also closes idle keep-alive connections) is closed; a body not all there within `body_timeout_s`
is 408: slow clients cannot hold sockets open.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, cast

import nats.errors
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from google.protobuf.message import Message  # type: ignore[import-untyped]
from nats.aio.client import Client
from nats.js.api import PubAck
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsPartialSuccess,
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from commonos.otlp_gateway.auth import REALM, TokenIndex, TokenInfo, bearer_token
from commonos.otlp_gateway.common import CallOrdinals, Mapped, Source
from commonos.otlp_gateway.decode import (
    BadRequest,
    TooLarge,
    UnsupportedMediaType,
    decode_body,
    encode_message,
    encoding_of,
    parse_request,
    status_body,
)
from commonos.otlp_gateway.mapping import map_logs, map_traces
from commonos.otlp_gateway.metrics import GatewayMetrics
from commonos.otlp_gateway.settings import GatewaySettings
from commonos.proto.errors import DataError, OperationalError
from commonos.proto.events import EventBase, event_type
from commonos.runtime.http import AiohttpPort
from commonos.runtime.publisher import EventPublisher, EventTooLarge, PublishError

log = logging.getLogger(__name__)

MapLogs = Callable[[ExportLogsServiceRequest, Source, CallOrdinals], Awaitable[Mapped]]
MapTraces = Callable[[ExportTraceServiceRequest, Source], Mapped]

#: gRPC status codes of the google.rpc.Status bodies.
_INVALID_ARGUMENT: Final = 3
_UNAUTHENTICATED: Final = 16
_UNAVAILABLE: Final = 14
_RESOURCE_EXHAUSTED: Final = 8
_UNIMPLEMENTED: Final = 12
_INTERNAL: Final = 13

#: The request message of each signal (the same on OTLP/HTTP and OTLP/gRPC).
REQUESTS: Final[dict[str, type[Message]]] = {
    "traces": ExportTraceServiceRequest,
    "logs": ExportLogsServiceRequest,
    "metrics": ExportMetricsServiceRequest,
}

_CHUNK: Final = 64 * 1024
#: What a port listening on loopback answers to, beside its own address.
LOOPBACK_NAMES: Final = frozenset({"localhost", "127.0.0.1", "::1"})


def host_of(header: str) -> str:
    """The name of a Host header: without its port or an IPv6 address's brackets, lower case, no final dot."""
    value = header.strip().lower()
    if value.startswith("["):
        value = value[1 : value.find("]")] if "]" in value else value[1:]
    elif value.count(":") == 1:
        value = value.partition(":")[0]
    return value.rstrip(".")


def _is_loopback(address: str) -> bool:
    if address.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def allowed_hosts(listen: str, configured: Sequence[str] | None) -> frozenset[str] | None:
    """The Host names a port listening on `listen` answers (None: any).

    `configured` (COS_OTLP_HOSTS) when set (``*`` among them: any); else, on a loopback address, the
    loopback names and that address; else any (on 0.0.0.0 or another interface the names it is reached
    by are the deployment's: set COS_OTLP_HOSTS to them).
    """
    if configured:
        names = {host_of(name) for name in configured}
        return None if "*" in names else frozenset(names)
    if _is_loopback(listen):
        return LOOPBACK_NAMES | {host_of(listen)}
    return None


def host_check(allowed: frozenset[str] | None, on_refused: Callable[[], None] | None = None) -> Middleware:
    """A middleware answering 421 to a request whose Host header names none of `allowed` (None: any)."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        header = request.headers.get("Host")
        if allowed is not None and header is not None and host_of(header) not in allowed:
            if on_refused is not None:
                on_refused()
            return web.Response(
                status=421,
                text=f"this server does not answer to the host {host_of(header)[:100]!r} (COS_OTLP_HOSTS)\n",
            )
        return await handler(request)

    return check


class Unavailable(OperationalError):
    """NATS cannot take the request's events now: 503 with Retry-After."""


@dataclass
class Refusal(DataError):
    """A request answered with an error status: refused as it is (4xx; over gRPC, `grpc_code`)."""

    status: int
    reason: str
    grpc_code: int
    text: str


@dataclass
class NotNow(OperationalError):
    """A request answered 503 with Retry-After (over gRPC, UNAVAILABLE with RetryInfo): the gateway cannot take
    it now, a retry may succeed."""

    text: str
    status: int = 503
    reason: str = "unavailable"
    grpc_code: int = _UNAVAILABLE


def _count_spans(request: ExportTraceServiceRequest) -> int:
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


def _count_logs(request: ExportLogsServiceRequest) -> int:
    return sum(len(sl.log_records) for rl in request.resource_logs for sl in rl.scope_logs)


class OtlpReceiver:
    """The OTLP routes and what they need: tokens, the publisher, the ordinals, the metrics.

    `map_logs` and `map_traces` default to the real mappings (`commonos.otlp_gateway.mapping`); tests may
    give others. `nc` tells whether NATS is connected (requests are refused with 503 while it is not).
    """

    def __init__(
        self,
        settings: GatewaySettings,
        tokens: TokenIndex,
        publisher: EventPublisher,
        ordinals: CallOrdinals,
        metrics: GatewayMetrics,
        *,
        nc: Client | None = None,
        map_logs: MapLogs = map_logs,
        map_traces: MapTraces = map_traces,
    ) -> None:
        self.settings = settings
        self.tokens = tokens
        self.publisher = publisher
        self.ordinals = ordinals
        self.metrics = metrics
        self.nc = nc if nc is not None else publisher.nc
        self.map_logs = map_logs
        self.map_traces = map_traces

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/traces", self.traces)
        app.router.add_post("/v1/logs", self.logs)
        app.router.add_post("/v1/metrics", self.metrics_route)

    # --- the three signals ---------------------------------------------------------------------------

    async def traces(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "traces")

    async def logs(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "logs")

    async def metrics_route(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "metrics")

    async def _handle(self, request: web.Request, signal: str) -> web.StreamResponse:
        started = time.monotonic()
        try:
            # The encoding of an error's body: the request's when it is one we know (else protobuf).
            encoding = label = encoding_of(request.headers.get("Content-Type"))
        except UnsupportedMediaType:
            encoding, label = "protobuf", "other"
        try:
            try:
                response = await self._process(request, signal)
            except (Refusal, NotNow) as refusal:
                response = self._refuse(refusal, encoding)
            except Exception as exc:  # a bug of ours: said, logged, and not retried by the exporter as is
                log.exception("%s request failed", signal)
                body, content_type = status_body(_INTERNAL, f"the gateway failed: {type(exc).__name__}", encoding)
                response = web.Response(status=500, body=body, headers={"Content-Type": content_type})
            self.metrics.requests.labels(signal, label, str(response.status)).inc()
            return response
        finally:
            self.metrics.request_seconds.labels(signal).observe(time.monotonic() - started)

    def _refuse(self, refusal: Refusal | NotNow, encoding: str) -> web.Response:
        self.metrics.refused.labels(refusal.reason).inc()
        body, content_type = status_body(refusal.grpc_code, refusal.text, encoding)
        headers = {"Content-Type": content_type}
        if refusal.status == 401:
            headers["WWW-Authenticate"] = f'Bearer realm="{REALM}"'
        if refusal.status == 503:
            headers["Retry-After"] = str(self.settings.retry_after_s)
        return web.Response(status=refusal.status, body=body, headers=headers)

    async def _process(self, request: web.Request, signal: str) -> web.Response:
        token = self.authenticate(request.headers.get("Authorization"))
        try:
            encoding = encoding_of(request.headers.get("Content-Type"))
            data = decode_body(
                await self._read_body(request), request.headers.get("Content-Encoding"), self.settings.max_body_bytes
            )
            message = parse_request(REQUESTS[signal](), data, encoding)
        except UnsupportedMediaType as exc:
            raise Refusal(415, "unsupported_media_type", _UNIMPLEMENTED, str(exc)) from None
        except TooLarge as exc:
            raise Refusal(413, "too_large", _RESOURCE_EXHAUSTED, str(exc)) from None
        except BadRequest as exc:
            raise Refusal(400, "bad_request", _INVALID_ARGUMENT, str(exc)) from None
        return self._ok(await self.export(signal, token, message), encoding)

    # --- what every transport shares (OTLP/HTTP here, OTLP/gRPC in `grpc_server`) -----------------------

    def authenticate(self, authorization: str | None) -> TokenInfo:
        """The token of an `Authorization: Bearer <token>` value (an HTTP header or gRPC metadata); NotNow
        while the tokens are not loaded yet, a Refusal (401, UNAUTHENTICATED) when none or unknown."""
        if not self.tokens.loaded.is_set():
            raise NotNow("the gateway is starting: its tokens are not loaded yet")
        token = self.tokens.lookup(bearer_token(authorization))
        if token is None:
            raise Refusal(
                401,
                "unauthenticated",
                _UNAUTHENTICATED,
                "a valid bearer token is required (Authorization: Bearer <token>; `cos otlp token create`)",
            )
        return token

    async def export(self, signal: str, token: TokenInfo, message: Message) -> Message:
        """The Export*ServiceResponse of a decoded request of `token`: its records mapped, their events
        published and every one acknowledged by JetStream (else NotNow: 503, UNAVAILABLE), the records
        refused named in its partial success. Metrics only update `cos_otlp_client_metric`."""
        source = Source(
            profile_id=token.profile_id,
            tag_attributes=self.settings.tag_attributes,
            tags=token.tags,
            tag_keys=token.tag_keys,
        )
        if isinstance(message, ExportMetricsServiceRequest):
            points = self.metrics.client.record(message, token.profile_id)
            self.metrics.records.labels(signal, "accepted").inc(points)
            return ExportMetricsServiceResponse()
        if not self._connected():
            raise NotNow("NATS is unavailable: retry later")
        try:
            if isinstance(message, ExportTraceServiceRequest):
                total = _count_spans(message)
                mapped = self.map_traces(message, source)
            else:
                assert isinstance(message, ExportLogsServiceRequest)
                total = _count_logs(message)
                mapped = await asyncio.wait_for(
                    self.map_logs(message, source, self.ordinals), self.settings.publish_timeout_s
                )
            events, messages = self._fitting(mapped)
            await self._publish(events, messages, signal)
        except (Unavailable, OperationalError, nats.errors.Error, TimeoutError) as exc:
            log.warning("%s request not stored (%s: %s): answered 503", signal, type(exc).__name__, exc)
            raise NotNow("NATS is unavailable: retry later") from None
        rejected = min(mapped.rejected, total)
        ignored = min(mapped.ignored, total - rejected)
        self.metrics.records.labels(signal, "accepted").inc(max(total - rejected - ignored, 0))
        if rejected:
            self.metrics.records.labels(signal, "rejected").inc(rejected)
        if ignored:
            self.metrics.records.labels(signal, "ignored").inc(ignored)
        response: Message
        error = "; ".join(mapped.errors)
        if signal == "traces":
            response = ExportTraceServiceResponse()
            if rejected or error:
                response.partial_success.CopyFrom(
                    ExportTracePartialSuccess(rejected_spans=rejected, error_message=error)
                )
        else:
            response = ExportLogsServiceResponse()
            if rejected or error:
                response.partial_success.CopyFrom(
                    ExportLogsPartialSuccess(rejected_log_records=rejected, error_message=error)
                )
        return response

    def _ok(self, message: Message, encoding: str) -> web.Response:
        body, content_type = encode_message(message, encoding)
        return web.Response(status=200, body=body, headers={"Content-Type": content_type})

    def _connected(self) -> bool:
        return self.nc is None or (self.nc.is_connected and not self.nc.is_closed)

    async def _read_body(self, request: web.Request) -> bytes:
        limit = self.settings.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise TooLarge(f"the body is over {limit} bytes")
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.settings.body_timeout_s):
                async for chunk in request.content.iter_chunked(_CHUNK):
                    size += len(chunk)
                    if size > limit:
                        raise TooLarge(f"the body is over {limit} bytes")
                    chunks.append(chunk)
        except TimeoutError:
            raise Refusal(
                408,
                "body_timeout",
                _INVALID_ARGUMENT,
                f"the body did not arrive within {self.settings.body_timeout_s:g} s (COS_OTLP_BODY_TIMEOUT_S)",
            ) from None
        return b"".join(chunks)

    def _fitting(self, mapped: Mapped) -> tuple[list[EventBase], list[tuple[str, bytes, dict[str, str]]]]:
        """The events that fit one NATS message, and their messages; one that cannot is refused (its record
        counted rejected)."""
        out = []
        messages = []
        for event in mapped.events:
            try:
                message = self.publisher.prepare(event)
            except EventTooLarge as exc:
                mapped.reject(f"an event of this request cannot be stored: {exc}")
                continue
            out.append(event)
            messages.append(message)
        return out, messages

    async def _publish(
        self, events: Sequence[EventBase], messages: Sequence[tuple[str, bytes, dict[str, str]]], signal: str
    ) -> None:
        if not events:
            return
        try:
            acks: list[PubAck] = await asyncio.wait_for(
                self.publisher.publish_many(events, prepared=messages), self.settings.publish_timeout_s
            )
        except (TimeoutError, PublishError) as exc:
            raise Unavailable(f"{len(events)} events not acknowledged: {exc}") from None
        if len(acks) != len(events):
            raise Unavailable(f"{len(events) - len(acks)} of {len(events)} events not acknowledged")
        now = datetime.now(UTC)
        published = Counter(event_type(event) for event, ack in zip(events, acks, strict=True) if not ack.duplicate)
        for kind, number in published.items():
            self.metrics.events_published.labels(kind).inc(number)
        lag = self.metrics.lag_seconds.labels(signal)
        for event in events:
            lag.observe(max((now - event.occurred_at).total_seconds(), 0.0))


def make_app(receiver: OtlpReceiver, **kwargs: Any) -> web.Application:
    settings = receiver.settings

    def refused() -> None:
        receiver.metrics.refused.labels("host").inc()

    kwargs.setdefault("middlewares", [host_check(allowed_hosts(settings.host, settings.hosts), refused)])
    app = web.Application(**kwargs)
    receiver.add_routes(app)
    return app


#: What every HTTP/2 connection opens with (RFC 9113 3.4), a gRPC client's included.
HTTP2_PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#: How much of an HTTP/2 connection is read looking for its first request's HEADERS frame.
_HTTP2_READ_LIMIT: Final = 64 * 1024
#: How long a refused HTTP/2 connection is kept open for the client to read the answer and close it first.
_HTTP2_LINGER_S: Final = 2.0


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def _hpack_string(text: str) -> bytes:
    """An HPACK string literal (not Huffman-coded): its length as a 7-bit prefix integer, then its bytes."""
    raw = text.encode("ascii")
    size = len(raw)
    if size < 127:
        return bytes([size]) + raw
    out = bytearray([127])
    size -= 127
    while size >= 128:
        out.append(size % 128 + 128)
        size //= 128
    out.append(size)
    return bytes(out) + raw


_SETTINGS: Final = 0x4
_HEADERS: Final = 0x1
_GOAWAY: Final = 0x7
_ACK: Final = 0x1
_END_STREAM: Final = 0x1
_END_HEADERS: Final = 0x4


def grpc_refusal(stream: int, message: str) -> bytes:
    """The server's answer to a gRPC call on stream `stream` of an HTTP/2 connection: the call ended at once
    with UNIMPLEMENTED and `message` (a trailers-only response: HEADERS with END_STREAM), then GOAWAY."""
    fields = {"content-type": "application/grpc", "grpc-status": "12", "grpc-message": message}
    # 0x88: the static table's `:status: 200`; then each field a literal without indexing (0x00), name and value.
    block = b"\x88" + b"".join(b"\x00" + _hpack_string(k) + _hpack_string(v) for k, v in fields.items())
    return _frame(_HEADERS, _END_HEADERS | _END_STREAM, stream, block) + _frame(
        _GOAWAY,
        0,
        0,
        stream.to_bytes(4, "big") + (0).to_bytes(4, "big"),  # NO_ERROR
    )


class Http2Refusing(asyncio.Protocol):
    """aiohttp's protocol for one connection (`inner`), unless the connection opens with HTTP/2's preface: a gRPC
    client aimed at the OTLP/HTTP port. That one is answered in HTTP/2, its first call ended with UNIMPLEMENTED
    and a message naming the gRPC port (`grpc_refusal`), `on_refused()` called (the metrics count it), and the
    connection closed: the client says why, and the log gets one line instead of aiohttp's traceback of a
    request line it cannot parse (its 400 in HTTP/1.1, which gRPC clients report as "Trying to connect an http1.x
    server")."""

    def __init__(self, inner: asyncio.Protocol, message: str, on_refused: Callable[[], None]) -> None:
        self.inner = inner
        self.message = message
        self.on_refused = on_refused
        self._seen = b""
        #: None while the first bytes could still be the preface; then whether they were.
        self._http2: bool | None = None
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is not an asyncio.Transport subclass, but has its methods).
        self._transport = cast(asyncio.Transport, transport)
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._http2 is False:
            self.inner.data_received(data)
            return
        if self._http2 is True:
            if self._transport is not None:  # else answered already: what follows is dropped
                self._seen += data
                self._answer()
            return
        self._seen += data
        n = min(len(self._seen), len(HTTP2_PREFACE))
        if self._seen[:n] != HTTP2_PREFACE[:n]:
            self._http2 = False
            seen, self._seen = self._seen, b""
            self.inner.data_received(seen)
        elif len(self._seen) >= len(HTTP2_PREFACE):
            self._http2 = True
            self._seen = self._seen[len(HTTP2_PREFACE) :]
            self.on_refused()
            log.warning("an HTTP/2 (gRPC) client on the OTLP/HTTP port: answered UNIMPLEMENTED, naming the gRPC port")
            if self._transport is not None:
                self._transport.write(_frame(_SETTINGS, 0, 0))  # the server's preface: its SETTINGS, all defaults
            self._answer()

    def _answer(self) -> None:
        """The client's frames as they come: its SETTINGS acknowledged, and once its first HEADERS frame is in,
        the refusal on that stream (on stream 1 when none came within `_HTTP2_READ_LIMIT` bytes)."""
        if self._transport is None:
            return
        stream = None
        while len(self._seen) >= 9:
            size = int.from_bytes(self._seen[:3], "big")
            if len(self._seen) < 9 + size and len(self._seen) < _HTTP2_READ_LIMIT:
                return  # the rest of the frame is to come
            kind, flags = self._seen[3], self._seen[4]
            if kind == _SETTINGS and not flags & _ACK:
                self._transport.write(_frame(_SETTINGS, _ACK, 0))
            elif kind == _HEADERS:
                stream = int.from_bytes(self._seen[5:9], "big") & 0x7FFFFFFF
                break
            self._seen = self._seen[9 + size :]
        if stream is None and len(self._seen) < _HTTP2_READ_LIMIT:
            return
        transport, self._transport = self._transport, None
        self._seen = b""
        transport.write(grpc_refusal(stream or 1, self.message))
        # Closed once the client had time to read the answer (it closes first, on GOAWAY): closing with its
        # bytes unread would reset the connection, and the answer could be lost.
        asyncio.get_running_loop().call_later(_HTTP2_LINGER_S, transport.close)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class OtlpServer(AiohttpPort):
    """The receiver on its own port (COS_OTLP_PORT). Request bodies are not inflated by aiohttp: the
    receiver does it, within the body limit. A gRPC client's connection is answered by `Http2Refusing`."""

    def __init__(
        self,
        receiver: OtlpReceiver,
        host: str,
        port: int,
        shutdown_timeout_s: float = 10.0,
        *,
        grpc_port: Callable[[], int] | None = None,
    ) -> None:
        self.receiver = receiver
        #: The port of the gateway's OTLP/gRPC receiver, once it listens (named to a gRPC client on this port).
        self.grpc_port = grpc_port
        self._listening: asyncio.Server | None = None
        super().__init__(
            make_app(receiver),
            host,
            port,
            auto_decompress=False,
            shutdown_timeout=shutdown_timeout_s,
            keepalive_timeout=receiver.settings.header_timeout_s,
        )

    def _http2_refused(self) -> None:
        self.receiver.metrics.requests.labels("other", "grpc", "400").inc()
        self.receiver.metrics.refused.labels("grpc_on_http_port").inc()

    @property
    def http2_message(self) -> str:
        where = f"port {self.grpc_port()}" if self.grpc_port is not None else "its gRPC port"
        return (
            f"this port takes OTLP/HTTP (POST /v1/traces, /v1/logs, /v1/metrics); send OTLP/gRPC to the gateway's "
            f"{where} (COS_OTLP_GRPC_PORT)"
        )

    async def start(self) -> int:
        runner = web.AppRunner(self._app, access_log=None, **self._runner_options)
        await runner.setup()
        self._runner = runner
        factory = runner.server
        assert factory is not None
        loop = asyncio.get_running_loop()
        self._listening = await loop.create_server(
            lambda: Http2Refusing(factory(), self.http2_message, self._http2_refused), self.host, self.port
        )
        self.port = int(self._listening.sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        if self._listening is not None:
            self._listening.close()
            self._listening = None
        await super().stop()
