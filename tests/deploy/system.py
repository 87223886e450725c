"""The deployed system in miniature: the loop, two partitioned journal-writers, billing and the OTLP gateway as
processes, each logged in to NATS as its own user of deploy/nats/auth.conf, and the events (and OpenTelemetry)
that exercise every metric."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import msgspec
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from commonos.billing.service import CONSUMER_NAME as BILLING_CONSUMER
from commonos.journal_writer.service import consumer_options, writer_projections
from commonos.otlp_gateway.auth import create_token, tokens_bucket
from commonos.proto import events as ev
from commonos.proto.messages import AssistantMessage, UserMessage
from commonos.proto.requests import ChatReply, ChatRequest, chat_subject
from commonos.proto.subjects import EVENTS_ALL, EVENTS_PREFIX, EVENTS_STREAM, MODEL_CALLS_FILTER
from commonos.runtime.consumer import Projection, partition_suffix
from commonos.runtime.embedded import free_port
from commonos.runtime.lanes import lane_names
from commonos.runtime.publisher import EventPublisher
from commonos.runtime.settings import Settings
from tests.deploy.conftest import REPO, SecuredNats, nats_password
from tests.factories import Clock, SessionBuilder
from tests.support import ServiceProcess, wait_for_position, wait_http

PARTITIONS = 2
LOOP_PROFILE = "ops"
#: The profile whose token the OpenTelemetry is sent with.
OTLP_PROFILE = "acme"
#: What the real Claude Code CLI exported in one session (tests/clients records it): logs and metrics, JSON.
CLAUDE_CODE_OTLP = REPO / "tests" / "fixtures" / "clients" / "claude-code-2.1.332" / "plain" / "otlp"

_CONFIG = """
tags = ["team:ops"]
provider = "scripted"
model = "scripted-e2e"
system_prompt = "Be brief."
tools = ["list_dir"]
max_steps = 4

[provider_options]
script = "script.toml"

[approval]
tools = { list_dir = "auto" }
"""

_SCRIPT = """
[[conversations]]

[[conversations.steps]]
text = "Looking."
tool_calls = [{ name = "list_dir", args = { path = "." } }]
usage = { input_tokens = 100, output_tokens = 10 }

[[conversations.steps]]
text = "Done."
usage = { input_tokens = 120, output_tokens = 12 }
"""


def writer_settings(partitions: int, partition: int) -> Settings:
    return Settings(partitions=partitions, partition=partition if partitions > 1 else None)


def instance_projections(partitions: int, partition: int) -> list[Projection]:
    """The projections one journal-writer instance runs, as its `main()` chooses them."""
    suffix = partition_suffix(writer_settings(partitions, partition))
    return writer_projections(suffix, unpartitioned=partition == 0)


def writer_consumers(partitions: int, partition: int) -> list[str]:
    """The durable consumer names one journal-writer instance uses (from the service's own code)."""
    return [d for p in instance_projections(partitions, partition) for d in lane_names(p.name, p.filter_subjects)]


def write_loop_profile(root: Path) -> Path:
    folder = root / LOOP_PROFILE
    (folder / "workspace").mkdir(parents=True)
    (folder / "config.toml").write_text(textwrap.dedent(_CONFIG))
    (folder / "script.toml").write_text(textwrap.dedent(_SCRIPT))
    return root


@dataclass
class RunningSystem:
    loop: ServiceProcess
    writers: list[ServiceProcess]
    billing: ServiceProcess
    gateway: ServiceProcess
    otlp_port: int
    #: A bearer token of OTLP_PROFILE, made before the gateway started (so it has it from the start).
    otlp_token: str = ""

    @property
    def processes(self) -> list[ServiceProcess]:
        return [self.loop, *self.writers, self.billing, self.gateway]

    @property
    def otlp_url(self) -> str:
        return f"http://127.0.0.1:{self.otlp_port}"

    def outputs(self) -> str:
        return "\n".join(f"--- {p.module} {p.http_port}\n{p.output()}" for p in self.processes)


def _env(nats_url: str, database_url: str, user: str, **extra: str) -> dict[str, str]:
    return {
        "COS_NATS_URL": nats_url,
        "COS_DATABASE_URL": database_url,
        "COS_NATS_USER": user,
        "COS_NATS_PASSWORD": nats_password(user),
        "COS_DRAIN_TIMEOUT_S": "5",
        **extra,
    }


@contextlib.asynccontextmanager
async def running_system(nats: SecuredNats, database_url: str, tmp_path: Path) -> AsyncIterator[RunningSystem]:
    """Start every service as its own process under its own NATS user; stop them (SIGTERM) afterwards."""
    profiles = write_loop_profile(tmp_path / "profiles")
    url = nats.url
    otlp_port = free_port()
    gateway_env = _env(
        url,
        database_url,
        "otlp-gateway",
        COS_OTLP_HOST="127.0.0.1",
        COS_OTLP_PORT=str(otlp_port),
        COS_OTLP_GRPC_PORT="0",
    )
    del gateway_env["COS_DATABASE_URL"]  # NATS only, as deployed
    system = RunningSystem(
        loop=ServiceProcess(
            "commonos.loop",
            _env(url, database_url, "loop", COS_PROFILES_DIR=str(profiles)),
            tmp_path / "loop.log",
            args=("serve",),
        ),
        writers=[
            ServiceProcess(
                "commonos.journal_writer",
                _env(url, database_url, "journal-writer", COS_PARTITIONS=str(PARTITIONS), COS_PARTITION=str(i)),
                tmp_path / f"journal-writer-{i}.log",
            )
            for i in range(PARTITIONS)
        ],
        billing=ServiceProcess("commonos.billing", _env(url, database_url, "billing"), tmp_path / "billing.log"),
        gateway=ServiceProcess("commonos.otlp_gateway", gateway_env, tmp_path / "otlp-gateway.log"),
        otlp_port=otlp_port,
    )
    # As compose and deploy/k8s do: the admin creates the streams, the services only use them.
    setup = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "commonos.cli", "streams", "ensure"],
        env={**os.environ, **_env(url, database_url, "admin")},
        capture_output=True,
        text=True,
        check=False,
    )
    assert setup.returncode == 0, setup.stderr
    system.otlp_token = await otlp_token(await nats.connect("admin"))
    try:
        for process in system.processes:
            process.start()
        try:
            await asyncio.gather(*(wait_http(p.url + "/readyz", timeout_s=60) for p in system.processes))
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{system.outputs()}") from None
        yield system
    finally:
        for process in system.processes:
            if process.alive:
                try:
                    process.terminate(30)
                except TimeoutError:
                    process.kill()


def sample_events(clock: Clock | None = None) -> list[ev.Event]:
    """Two sessions of two profiles: every core event type, a priced and an unpriced model call."""
    clock = clock or Clock()
    out: list[ev.Event] = [
        ev.ProfileUpserted(profile_id=profile, tags=("team:core",), occurred_at=clock.tick())
        for profile in ("acme", "globex")
    ]
    for profile, model, provider in (("acme", "claude-sonnet-4-5", "anthropic"), ("globex", "mystery-1", "acme-ai")):
        s = SessionBuilder(profile, clock, ("client:" + profile,)).create(title="hello")
        turn = s.start_turn(snapshot={"system_prompt": "Be brief."})
        s.message(turn, UserMessage(text="What is the weather?"))
        s.model_call(turn, model=model, provider=provider)
        s.tool_call(
            turn, "c1", "shell", {"command": "date"}, "Mon", risk=ev.Risk.HIGH, approval=ev.ApprovalStatus.APPROVED
        )
        s.message(turn, AssistantMessage(text="Rain."))
        s.finish(turn)
        out += s.events
    return out


async def publish_as_loop(loop_client: Client, events: Sequence[ev.Event]) -> int:
    """Publish as the loop would; returns the last stream sequence."""
    publisher = EventPublisher(loop_client.jetstream(), "urn:commonos:loop")
    acks = await publisher.publish_many(events)
    return max(a.seq for a in acks)


async def publish_poison(loop_client: Client) -> int:
    """An event that cannot be decoded, on a well-formed subject: the journal-writers dead-letter it."""
    js = loop_client.jetstream()
    ack = await js.publish(f"{EVENTS_PREFIX}.acme.{uuid.uuid4()}.message_appended", b"{not json", timeout=5)
    return int(ack.seq)


def _attributes(**values: str | int) -> list[KeyValue]:
    out = []
    for key, value in values.items():
        any_value = AnyValue(int_value=value) if isinstance(value, int) else AnyValue(string_value=value)
        out.append(KeyValue(key=key.replace("__", "."), value=any_value))
    return out


def genai_spans() -> ExportTraceServiceRequest:
    """An agent's `chat` span with the GenAI semantic conventions (input tokens include the cached ones)."""
    end = time.time_ns()
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.extend(_attributes(service__name="e2e-agent", client="acme"))
    span = resource_spans.scope_spans.add().spans.add()
    span.trace_id = uuid.uuid4().bytes
    span.span_id = uuid.uuid4().bytes[:8]
    span.name = "chat claude-sonnet-4-5"
    span.kind = Span.SPAN_KIND_CLIENT
    span.start_time_unix_nano = end - 800_000_000
    span.end_time_unix_nano = end
    span.attributes.extend(
        _attributes(
            gen_ai__operation__name="chat",
            gen_ai__provider__name="anthropic",
            gen_ai__system="anthropic",
            gen_ai__request__model="claude-sonnet-4-5",
            gen_ai__response__model="claude-sonnet-4-5",
            gen_ai__response__id=f"msg_{uuid.uuid4().hex}",
            gen_ai__conversation__id=str(uuid.uuid4()),
            gen_ai__usage__input_tokens=150,
            gen_ai__usage__cache_read__input_tokens=100,
            gen_ai__usage__output_tokens=20,
        )
    )
    return request


async def otlp_token(admin: Client, profile: str = OTLP_PROFILE) -> str:
    """A bearer token of `profile`, made as an operator would (`cos otlp token create`, as admin). A gateway
    running already knows it once the KV change reached it; one started afterwards, from the start."""
    token, _ = await create_token(await tokens_bucket(admin.jetstream(), 1), profile, "e2e")
    return token


async def send_otlp(system: RunningSystem) -> dict[str, int]:
    """GenAI spans (protobuf), Claude Code's logs and metrics (JSON, as it recorded them), and one request
    without a token: the HTTP status of each, by name."""
    bearer = {"Authorization": f"Bearer {system.otlp_token}"}
    sends = {
        "traces": ("/v1/traces", genai_spans().SerializeToString(), "application/x-protobuf", bearer),
        "logs": ("/v1/logs", (CLAUDE_CODE_OTLP / "000-logs.json").read_bytes(), "application/json", bearer),
        "metrics": ("/v1/metrics", (CLAUDE_CODE_OTLP / "001-metrics.json").read_bytes(), "application/json", bearer),
        "no token": ("/v1/traces", genai_spans().SerializeToString(), "application/x-protobuf", {}),
    }
    statuses = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        for name, (path, body, content_type, headers) in sends.items():
            async with http.post(
                system.otlp_url + path, data=body, headers={"Content-Type": content_type, **headers}
            ) as resp:
                await resp.read()
                statuses[name] = resp.status
    return statuses


def claude_code_metric_total(metric: str) -> float:
    """The sum of every data point of `metric` in the recorded metrics (Claude Code sends deltas)."""
    total = 0.0
    for path in sorted(CLAUDE_CODE_OTLP.glob("*-metrics.json")):
        for resource in json.loads(path.read_text())["resourceMetrics"]:
            for scope in resource["scopeMetrics"]:
                for m in scope["metrics"]:
                    if m["name"] == metric:
                        for point in m["sum"]["dataPoints"]:
                            total += float(point.get("asDouble", point.get("asInt", 0)))
    return total


async def chat(client: Client, text: str) -> ChatReply:
    reply = await client.request(chat_subject(LOOP_PROFILE), msgspec.json.encode(ChatRequest(text=text)), timeout=30)
    return msgspec.json.decode(reply.data, type=ChatReply)


async def last_seq(js: JetStreamContext, filter_subject: str = EVENTS_ALL) -> int:
    """Stream sequence of the last event on `filter_subject` now in COS_EVENTS."""
    sub = await js.pull_subscribe(
        filter_subject,
        stream=EVENTS_STREAM,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.LAST, ack_policy=AckPolicy.NONE, inactive_threshold=10),
    )
    try:
        if (await sub.consumer_info()).num_pending == 0:
            return 0
        [msg] = await sub.fetch(1, timeout=5)
        return int(msg.metadata.sequence.stream)
    finally:
        await sub.unsubscribe()


async def wait_until_projected(database_url: str, admin_js: JetStreamContext) -> None:
    """Every consumer of every writer partition, and billing, has committed the last event it reads."""
    waits = []
    for i in range(PARTITIONS):
        for p in instance_projections(PARTITIONS, i):
            options = consumer_options(writer_settings(PARTITIONS, i), p)
            target = max([await last_seq(admin_js, f) for f in options.filter_subjects])
            if target:
                waits.append(wait_for_position(database_url, p.name, target, table=p.position_table))
    model_calls = await last_seq(admin_js, MODEL_CALLS_FILTER)
    waits.append(wait_for_position(database_url, BILLING_CONSUMER, model_calls, table="billing_positions"))
    await asyncio.gather(*waits)
