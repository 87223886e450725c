"""Any number of `cos up` started at the same moment on one machine each get their own ports and talk only to their
own servers: every port `cos up` chooses is chosen under a lock shared by the machine's `cos up`s and kept from the
others while it runs (`commonos.runtime.ports`).

Three real `cos up`, started within the same second, each in its own folder: all become ready, their ports are all
different, each console signs in with its own admin password (and refuses the others'), and each gateway bills
what it is sent into its own database only."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import asyncpg
import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from commonos.runtime.ports import PortRegistry
from tests.cli.test_first_run import console_sessions
from tests.cli.test_up_security import RunningUp, clean_env, cos
from tests.conftest import REPO
from tests.harness import cleanup, make_temp_root

pytestmark = pytest.mark.slow

SYSTEMS = 3
#: Three whole systems starting at once on a 2-core machine: each becomes ready within this.
READY_WITHIN_S = 300.0


def said(up: RunningUp) -> list[str]:
    return (up.root / "cos-up.out").read_text(errors="replace").splitlines()


@pytest.fixture
def three_ups() -> Iterator[list[RunningUp]]:
    roots = [make_temp_root(f"cos-up-side-{i}-") for i in range(SYSTEMS)]
    ups: list[RunningUp] = []
    try:
        for root in roots:  # one after the other at once: all within the same second
            data = root / "data"
            with (root / "cos-up.out").open("wb") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "commonos.cli.main", "up"],
                    cwd=REPO,
                    env=clean_env(data),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            ups.append(RunningUp(root, data, proc))
        deadline = time.monotonic() + READY_WITHIN_S
        for up in ups:
            while not any(line.startswith("Running. Ctrl-C") for line in said(up)):
                if up.proc.poll() is not None or time.monotonic() > deadline:
                    output = "\n".join(said(up))[-4000:]
                    raise AssertionError(f"cos up in {up.root} did not come up (exit {up.proc.poll()}):\n{output}")
                time.sleep(0.5)
        yield ups
    finally:
        for up in ups:
            up.stop()
        for root in roots:
            cleanup(root)


def line(up: RunningUp, prefix: str) -> str:
    return next(text for text in said(up) if text.startswith(prefix))


def chat_span(response_id: str, input_tokens: int) -> ExportTraceServiceRequest:
    """One GenAI `chat` span, as an SDK sends it."""
    attributes = {
        "gen_ai.operation.name": AnyValue(string_value="chat"),
        "gen_ai.provider.name": AnyValue(string_value="anthropic"),
        "gen_ai.request.model": AnyValue(string_value="claude-sonnet-4-5"),
        "gen_ai.response.id": AnyValue(string_value=response_id),
        "gen_ai.usage.input_tokens": AnyValue(int_value=input_tokens),
        "gen_ai.usage.output_tokens": AnyValue(int_value=1),
    }
    now = time.time_ns()
    span = Span(
        trace_id=os.urandom(16),
        span_id=os.urandom(8),
        name="chat claude-sonnet-4-5",
        start_time_unix_nano=now - 1_000_000,
        end_time_unix_nano=now,
        attributes=[KeyValue(key=k, value=v) for k, v in attributes.items()],
    )
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[span])])])


def post_span(otlp_url: str, request: ExportTraceServiceRequest, token: str) -> int:
    """POST /v1/traces (protobuf) to an OTLP/HTTP endpoint; the answer's status."""
    sent = urllib.request.Request(
        f"{otlp_url}/v1/traces",
        data=request.SerializeToString(),
        headers={"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {token}"},
    )
    with urllib.request.urlopen(sent, timeout=30) as answer:
        return int(answer.status)


async def billed_requests(database_url: str, want: int, timeout_s: float = 60) -> set[str]:
    """The request ids of its database's model_calls, once there are `want` (or after `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        conn = await asyncpg.connect(database_url)
        try:
            rows = await conn.fetch("SELECT request_id FROM model_calls")
        finally:
            await conn.close()
        if len(rows) >= want or time.monotonic() > deadline:
            return {r["request_id"] for r in rows}
        await asyncio.sleep(0.5)


async def test_three_cos_up_started_at_once_each_have_their_own_ports_and_servers(three_ups: list[RunningUp]) -> None:
    ports = [json.loads((up.data / "ports.json").read_text()) for up in three_ups]
    urls = []
    for up in three_ups:
        otlp = line(up, "OpenTelemetry (OTLP/HTTP): ").split()[2]
        grpc_url = line(up, "OpenTelemetry (OTLP/gRPC): ").split()[2]
        console = line(up, "Console: ").split()[1].rstrip("/")
        urls.append((otlp, grpc_url, console))
    every_port = [int(url.rsplit(":", 1)[1]) for trio in urls for url in trio]
    every_port += [p for chosen in ports for p in chosen.values()]
    # Each service's health port (the console's is its own port, above).
    every_port += [int(p) for up in three_ups for name, p in up.state["http_ports"].items() if name != "console"]
    assert len(every_port) == len(set(every_port)), (urls, ports)
    # While they run, the ports they chose are theirs in the machine's registry.
    chosen = PortRegistry().chosen()
    for up, trio in zip(three_ups, urls, strict=True):
        for url in trio:
            assert chosen[int(url.rsplit(":", 1)[1])] == up.proc.pid

    passwords = [(up.data / "secrets" / "console-admin.password").read_text().strip() for up in three_ups]
    assert len(set(passwords)) == SYSTEMS
    for i, (up, (otlp, grpc_url, console)) in enumerate(zip(three_ups, urls, strict=True)):
        # Its console: its own admin password signs in, another's does not.
        assert console_sessions(console, "admin", passwords[i])["sessions"] == []
        with pytest.raises(urllib.error.HTTPError) as refused:
            console_sessions(console, "admin", passwords[(i + 1) % SYSTEMS])
        assert refused.value.code == 401
        refused.value.close()  # its answer's socket
        # Its gateway: a call sent to it over each transport is billed into its own database.
        made = cos(up.data, "otlp", "token", "create", "--profile", f"side-{i}")
        assert made.returncode == 0, made.stderr
        token = made.stdout.strip()
        assert await asyncio.to_thread(post_span, otlp, chat_span(f"msg_side_http_{i}", 100 + i), token) == 200
        async with grpc.aio.insecure_channel(grpc_url.removeprefix("http://")) as channel:
            stub = trace_service_pb2_grpc.TraceServiceStub(channel)  # type: ignore[no-untyped-call]
            answered = await stub.Export(
                chat_span(f"msg_side_grpc_{i}", 200 + i), metadata=(("authorization", f"Bearer {token}"),), timeout=30
            )
            assert not answered.HasField("partial_success")
    for i, up in enumerate(three_ups):
        billed = await billed_requests(up.state["database_url"], 2)
        assert billed == {f"msg_side_http_{i}", f"msg_side_grpc_{i}"}, up.root
