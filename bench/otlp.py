"""The OTLP gateway phase of `make bench`: GenAI spans from the real OpenTelemetry SDK exporter, through the
gateway, to priced rows in PostgreSQL, against publishing the same events directly, in the same run.

Each run has a nats-server of its own (the main stream's million events are not in the way) and a fresh
database with billing running and ready before the clock starts:

* **direct** (the baseline): the events the gateway makes of those spans (the same mapping, in process)
  published with the services' publisher, PubAck for each; the clock stops when billing has written every
  model call's row;
* **gateway**: ``python -m bench.otlp_send`` makes the spans with the SDK's tracer, and the SDK's OTLP/HTTP
  exporter (protobuf) sends them, 512 a request, to ``python -m commonos.otlp_gateway``; same stop;
* **gateway over gRPC**: the same, the SDK's OTLP/gRPC exporter sending to the gateway's gRPC port.
  ``exporters`` agents do so at once, each its share of the turns (a gateway serves many agents; one
  exporter alone sends its next batch only once the gateway has answered the last). The clock starts
  when every sender has made its spans and says it is ready, as the baseline's starts with its events
  made: neither counts the agent's own work or a Python interpreter's start.

Spans per second count every span sent (the ``invoke_agent`` of each turn and its ``chat`` spans); the
ratio is each gateway's over direct, medians of alternating runs (5 by default: one pair's ratio moves a lot on a
small machine, where every process of both pipelines competes for the cores). The gateway's peak RSS is read from /proc.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from bench.otlp_send import spans
from bench.services import BenchError, ServiceRun
from commonos.otlp_gateway.common import Source
from commonos.otlp_gateway.genai import map_spans
from commonos.proto.events import EventBase
from commonos.runtime.embedded import NatsServer, PostgresCluster, free_port
from commonos.runtime.nats import connect as nats_connect
from commonos.runtime.nats import ensure_streams
from commonos.runtime.publisher import EventPublisher
from commonos.runtime.settings import Settings

PROFILE = "bench"


@dataclass
class OtlpResult:
    spans: int
    calls: int
    direct_s: list[float] = field(default_factory=list)
    gateway_s: list[float] = field(default_factory=list)
    gateway_peak_rss_kb: list[int] = field(default_factory=list)
    grpc_s: list[float] = field(default_factory=list)
    grpc_peak_rss_kb: list[int] = field(default_factory=list)

    @property
    def direct_spans_per_s(self) -> float:
        return self.spans / statistics.median(self.direct_s)

    @property
    def gateway_spans_per_s(self) -> float:
        return self.spans / statistics.median(self.gateway_s)

    @property
    def grpc_spans_per_s(self) -> float:
        return self.spans / statistics.median(self.grpc_s)


def mapped_events(turns: int, calls: int) -> list[EventBase]:
    """The events the gateway publishes for the spans `bench.otlp_send` sends (in its export batches' order)."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(encode_spans(spans(turns, calls)).SerializeToString())
    mapped = map_spans(request, Source(profile_id=PROFILE))
    if mapped.rejected:
        raise BenchError(f"the bench's own spans were refused: {mapped.errors[:3]}")
    return list(mapped.events)


async def _rows(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM model_calls"))
    except asyncpg.UndefinedTableError:
        return 0
    finally:
        await conn.close()


async def _wait_rows(dsn: str, want: int, billing: ServiceRun, timeout_s: float = 300.0) -> float:
    """Until billing has written `want` rows; returns when (monotonic)."""
    deadline = time.monotonic() + timeout_s
    conn = await asyncpg.connect(dsn)
    try:
        while True:
            billing.check_alive()
            rows = int(await conn.fetchval("SELECT count(*) FROM model_calls"))
            if rows >= want:
                if rows > want:
                    raise BenchError(f"billing wrote {rows} rows for {want} model calls")
                return time.monotonic()
            if time.monotonic() > deadline:
                raise BenchError(f"billing wrote {rows} of {want} rows within {timeout_s:.0f} s")
            await asyncio.sleep(0.02)
    finally:
        await conn.close()


class OtlpPhase:
    def __init__(
        self,
        root: Path,
        logs: Path,
        pg: PostgresCluster,
        say: Callable[[str], None],
        turns: int,
        calls: int,
        exporters: int = 2,
    ) -> None:
        self.root, self.logs, self.pg, self.say = root, logs, pg, say
        self.turns, self.calls, self.exporters = turns, calls, exporters

    async def _fresh_db(self, name: str) -> str:
        admin = await asyncpg.connect(self.pg.url)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            await admin.execute(f'CREATE DATABASE "{name}"')
        finally:
            await admin.close()
        return self.pg.dsn(name)

    async def _drop_db(self, name: str) -> None:
        admin = await asyncpg.connect(self.pg.url)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()

    async def _system(self, name: str) -> tuple[NatsServer, str, ServiceRun]:
        """A fresh nats-server with the streams, a fresh database, and billing ready on them."""
        nats = NatsServer(self.root / f"nats-{name}")
        nats.start()
        nc = await nats_connect(Settings(nats_url=nats.url), "cos-bench-otlp")
        try:
            await ensure_streams(nc.jetstream())
        finally:
            await nc.close()
        dsn = await self._fresh_db(name)
        billing = ServiceRun(
            f"billing-{name}",
            "commonos.billing",
            {"COS_NATS_URL": nats.url, "COS_DATABASE_URL": dsn},
            self.logs / f"{name}-billing.log",
        )
        billing.start()
        await billing.wait_ready()
        return nats, dsn, billing

    async def direct(self, run: int, events: Sequence[EventBase]) -> float:
        name = f"otlp_direct_{run}"
        nats, dsn, billing = await self._system(name)
        try:
            nc = await nats_connect(Settings(nats_url=nats.url), "cos-bench-direct")
            try:
                publisher = EventPublisher(nc.jetstream(), "urn:commonos:bench", nc=nc)
                started = time.monotonic()
                await publisher.publish_many(events)
                done = await _wait_rows(dsn, self.turns * self.calls, billing)
            finally:
                await nc.close()
        finally:
            await billing.stop()
            nats.stop()
            await self._drop_db(name)
        return done - started

    async def gateway(self, run: int, transport: str = "http") -> tuple[float, int]:
        """One run of the SDK's exporters sending to a gateway over `transport` (http: OTLP/HTTP protobuf; grpc)."""
        name = f"otlp_gateway_{transport}_{run}"
        nats, dsn, billing = await self._system(name)
        env = {"COS_NATS_URL": nats.url}
        port, grpc_port = free_port(), free_port()
        gateway = ServiceRun(
            f"gateway-{name}",
            "commonos.otlp_gateway",
            {**env, "COS_OTLP_PORT": str(port), "COS_OTLP_GRPC_PORT": str(grpc_port)},
            self.logs / f"{name}-gateway.log",
        )
        endpoint, encoding = (
            (f"http://127.0.0.1:{grpc_port}", "grpc")
            if transport == "grpc"
            else (f"http://127.0.0.1:{port}", "protobuf")
        )
        try:
            made = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "commonos.cli.main",
                "otlp",
                "token",
                "create",
                "--profile",
                PROFILE,
                env={**os.environ, **env},
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await made.communicate()
            if made.returncode != 0:
                raise BenchError(f"cos otlp token create exited {made.returncode}: {err.decode()[-500:]}")
            token = out.decode().split()[0]
            gateway.start()
            await gateway.wait_ready()
            shares = [self.turns // self.exporters] * self.exporters
            shares[-1] += self.turns - sum(shares)
            firsts = [sum(shares[:i]) for i in range(self.exporters)]
            senders = [
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "bench.otlp_send",
                    "--endpoint",
                    endpoint,
                    "--encoding",
                    encoding,
                    "--token",
                    token,
                    "--turns",
                    str(share),
                    "--first-turn",
                    str(first),
                    "--calls",
                    str(self.calls),
                    "--wait",
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                )
                for share, first in zip(shares, firsts, strict=True)
            ]
            for sender in senders:  # each has made its spans and built its exporter
                assert sender.stdout is not None
                ready = await sender.stdout.readline()
                if not ready.strip():
                    _, sender_err = await sender.communicate()
                    raise BenchError(f"a span sender exited {sender.returncode}: {sender_err.decode()[-800:]}")
            started = time.monotonic()
            for sender in senders:
                assert sender.stdin is not None
                sender.stdin.write(b"go\n")
                await sender.stdin.drain()
            for sender in senders:
                sent, sender_err = await sender.communicate()
                if sender.returncode != 0:
                    raise BenchError(f"a span sender exited {sender.returncode}: {sender_err.decode()[-800:]}")
                if not json.loads(sent.decode().strip().splitlines()[-1])["flushed"]:
                    raise BenchError("the SDK exporter did not get every batch accepted")
            done = await _wait_rows(dsn, self.turns * self.calls, billing)
            gateway.check_alive()
            peak = gateway.peak_rss_kb() or 0
        finally:
            await gateway.stop()
            await billing.stop()
            nats.stop()
            await self._drop_db(name)
        return done - started, peak

    async def run(self, runs: int, fits: Callable[[float], bool]) -> OtlpResult:
        events = mapped_events(self.turns, self.calls)
        result = OtlpResult(spans=self.turns * (self.calls + 1), calls=self.turns * self.calls)
        self.say(
            f"otlp: {result.spans:,} spans ({result.calls:,} model calls) -> {len(events):,} events per run; "
            f"{self.exporters} exporter process(es)"
        )
        for run in range(runs):
            if run and not fits(max(result.direct_s) + max(result.gateway_s) + max(result.grpc_s) + 10):
                break
            direct_s = await self.direct(run, events)
            result.direct_s.append(direct_s)
            gateway_s, peak_kb = await self.gateway(run, "http")
            result.gateway_s.append(gateway_s)
            result.gateway_peak_rss_kb.append(peak_kb)
            grpc_s, grpc_peak_kb = await self.gateway(run, "grpc")
            result.grpc_s.append(grpc_s)
            result.grpc_peak_rss_kb.append(grpc_peak_kb)
            self.say(
                f"otlp run {run + 1}: direct {result.spans / direct_s:,.0f} spans/s ({direct_s:.2f} s), "
                f"gateway {result.spans / gateway_s:,.0f} spans/s ({gateway_s:.2f} s), "
                f"gateway over gRPC {result.spans / grpc_s:,.0f} spans/s ({grpc_s:.2f} s), "
                f"gateway peak RSS {peak_kb / 1024:.0f} MB (gRPC {grpc_peak_kb / 1024:.0f} MB)"
            )
        return result
