"""`cos status`: what is running and how it is doing, in one look.

The servers (NATS and PostgreSQL: where, and whether they answer; the read replica, COS_DATABASE_READ_URL, and how
far it is behind its primary, or "no replica"), each service `cos up` started (its
process, `/healthz`, `/readyz` and version), each consumer of the events stream (where it is and how far
behind), the dead letters waiting, and when the last event was stored. It exits 1 when anything is
unhealthy: a server that does not answer, a service not ready, a dead letter waiting, so that a script
(or a person) can act on it; `--format json` gives the same for scripts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlparse

from commonos.runtime.args import CliError
from commonos.runtime.cli_support import as_text, cli_connect, cli_settings, shown
from commonos.runtime.settings import Settings
from commonos.runtime.system import alive, running_state


@dataclass
class Service:
    name: str
    pid: int | None
    url: str | None
    running: bool
    health: str
    ready: str
    version: str | None = None

    @property
    def ok(self) -> bool:
        return self.running and self.health == "ok" and self.ready == "ready"


@dataclass
class Consumer:
    name: str
    filter: str
    delivered_seq: int
    acknowledged_seq: int
    #: Events not yet delivered to it, and delivered but not yet acknowledged: how far behind it is.
    pending: int
    unacknowledged: int


@dataclass
class Status:
    data_dir: str
    cos_up_pid: int | None
    nats_url: str
    nats: str = "not checked"
    postgres_url: str = ""
    postgres: str = "not checked"
    #: The read replica (COS_DATABASE_READ_URL), or None; `replica` says how far behind it is, or "no replica".
    replica_url: str | None = None
    replica: str = "no replica"
    #: Seconds since the last transaction it replayed (0 once it has replayed all it received); None: unknown.
    replica_lag_seconds: float | None = None
    #: WAL received, not yet replayed; None: unknown.
    replica_lag_bytes: int | None = None
    replica_paused: bool = False
    services: list[Service] = field(default_factory=list)
    consumers: list[Consumer] = field(default_factory=list)
    events: int | None = None
    last_event_stored_at: str | None = None
    dead_letters: int | None = None
    #: Whether JetStream stores a message now (`_write_check`).
    jetstream_writes: str = "not checked"
    problems: list[str] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not self.problems


#: How long `cos status` waits for JetStream to store its one message.
WRITE_CHECK_TIMEOUT_S = 2.0
#: Its body: larger than an event usually is, so that it needs new room on disk (a few bytes would fit in what the
#: last page of a block file has left, on a disk that has no room for an event).
WRITE_CHECK_BODY = b" " * 16 * 1024


def _hide_password(url: str) -> str:
    parsed = urlparse(url)
    return url.replace(f":{parsed.password}@", ":***@") if parsed.password else url


def _get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read() or b"{}")
        except ValueError:
            return exc.code, {}
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return 0, {"status": f"no answer ({getattr(exc, 'reason', exc)})"}


def _services(state: dict[str, Any] | None) -> list[Service]:
    if state is None:
        return []
    out = []
    ports: dict[str, int] = state.get("http_ports") or {}
    for name, pid in sorted((state.get("pids") or {}).items()):
        port = ports.get(name)
        url = f"http://127.0.0.1:{port}" if port else None
        running = alive(int(pid))
        health, ready, version = "unknown", "unknown", None
        if url is not None and running:
            code, body = _get(f"{url}/healthz")
            health = "ok" if code == 200 else str(body.get("reason") or body.get("status") or code)
            version = body.get("version")
            code, body = _get(f"{url}/readyz")
            ready = "ready" if code == 200 else "; ".join(body.get("reasons") or [str(body.get("status") or code)])
        out.append(Service(name, int(pid), url, running, health if running else "not running", ready, version))
    return out


async def _nats(settings: Settings, status: Status) -> None:
    import nats.errors

    from commonos.proto.subjects import DLQ_STREAM, EVENTS_STREAM

    try:
        nc = await cli_connect(settings, "cos-status", quiet=True)
    except CliError as exc:
        status.nats = "no answer"
        status.problems.append(str(exc))
        return
    try:
        js = nc.jetstream()
        status.nats = "ok"
        try:
            info = await js.stream_info(EVENTS_STREAM)
            status.events = info.state.messages
            if info.state.messages:
                last = await js.get_msg(EVENTS_STREAM, info.state.last_seq)
                status.last_event_stored_at = last.time.isoformat() if last.time is not None else None
            for consumer in await js.consumers_info(EVENTS_STREAM):
                config = consumer.config
                filters = config.filter_subjects or ([config.filter_subject] if config.filter_subject else [])
                status.consumers.append(
                    Consumer(
                        name=consumer.name,
                        filter=", ".join(filters) or ">",
                        delivered_seq=consumer.delivered.stream_seq if consumer.delivered else 0,
                        acknowledged_seq=consumer.ack_floor.stream_seq if consumer.ack_floor else 0,
                        pending=consumer.num_pending or 0,
                        unacknowledged=consumer.num_ack_pending or 0,
                    )
                )
            dlq = await js.stream_info(DLQ_STREAM)
            status.dead_letters = dlq.state.messages
            for stream in (info, dlq):
                if (full := _full(stream)) is not None:
                    status.problems.append(full)
            status.jetstream_writes = await _write_check(js, settings.stream_replicas)
            if status.jetstream_writes != "ok" and not status.jetstream_writes.startswith("not checked"):
                status.problems.append(status.jetstream_writes)
            if dlq.state.messages:
                status.problems.append(
                    f"{dlq.state.messages} dead letter(s) waiting (cos dlq list; cos dlq replay once fixed)"
                )
        except nats.errors.Error as exc:
            status.problems.append(f"the streams cannot be read: {type(exc).__name__}: {exc}")
    finally:
        await nc.close()


#: A stream that discards new messages is taken as full when less room than this is left in it.
FULL_WITHIN_BYTES = 8 * 1024


def _full(info: Any) -> str | None:
    """Why a stream refuses new messages because of its own limits (`discard: new`), or None."""
    from nats.js.api import DiscardPolicy

    config, state = info.config, info.state
    if config.sealed:
        return f"{config.name} is sealed: JetStream refuses new messages on it"
    if config.discard != DiscardPolicy.NEW:
        return None  # at its limits it drops its oldest messages and takes the new ones
    what = None
    if config.max_bytes and config.max_bytes > 0 and state.bytes > config.max_bytes - FULL_WITHIN_BYTES:
        what = f"{state.bytes:,} bytes of its max_bytes {config.max_bytes:,}"
    elif config.max_msgs and config.max_msgs > 0 and state.messages >= config.max_msgs:
        what = f"{state.messages:,} messages of its max_msgs {config.max_msgs:,}"
    if what is None:
        return None
    return (
        f"{config.name} is full ({what}, discard new): JetStream refuses new messages until an operator raises the "
        "limit"
    )


async def _write_check(js: Any, replicas: int) -> str:
    """Whether JetStream stores a message now: one small message to its own stream (STATUS_STREAM, which keeps one,
    made on first use). "ok", "JetStream refuses writes: <why>", or "not checked: <why>"."""
    import nats.errors
    import nats.js.errors

    from commonos.runtime import nats as cos_nats

    try:
        await cos_nats.ensure_stream(js, cos_nats.status_stream_config(replicas))
    except (cos_nats.StreamUnavailable, nats.errors.TimeoutError):
        return f"not checked: this NATS user may not use {cos_nats.STATUS_STREAM}"
    except nats.js.errors.APIError as exc:
        return f"JetStream refuses writes: {exc.description or exc}"
    try:
        await js.publish(
            cos_nats.STATUS_SUBJECT, WRITE_CHECK_BODY, timeout=WRITE_CHECK_TIMEOUT_S, stream=cos_nats.STATUS_STREAM
        )
    except nats.js.errors.APIError as exc:
        return f"JetStream refuses writes: {exc.description or exc}"
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
        return (
            f"JetStream did not store a message within {WRITE_CHECK_TIMEOUT_S:.0f} s ({type(exc).__name__}): its store "
            "may be full or failing (see the nats-server's log)"
        )
    return "ok"


async def _postgres(settings: Settings, status: Status) -> None:
    import asyncpg

    try:
        conn = await asyncpg.connect(settings.database_url, timeout=3)
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        status.postgres = f"no answer ({type(exc).__name__}: {exc})"
        status.problems.append(f"PostgreSQL does not answer at {status.postgres_url}")
        return
    try:
        await conn.fetchval("SELECT 1")
        status.postgres = "ok"
    finally:
        await conn.close()


async def _replica(settings: Settings, status: Status) -> None:
    import asyncpg

    from commonos.runtime.postgres import replica_lag

    if not settings.database_read_url:
        return
    try:
        conn = await asyncpg.connect(settings.database_read_url, timeout=3)
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        status.replica = f"no answer ({type(exc).__name__}: {exc})"
        status.problems.append(f"the read replica does not answer at {status.replica_url} (COS_DATABASE_READ_URL)")
        return
    try:
        lag = await replica_lag(conn)
    finally:
        await conn.close()
    status.replica = str(lag)
    status.replica_lag_seconds, status.replica_lag_bytes, status.replica_paused = lag.seconds, lag.bytes, lag.paused
    if not lag.standby:
        status.problems.append(
            f"COS_DATABASE_READ_URL ({status.replica_url}) is not a standby: the readers read another primary"
        )


def collect(settings: Settings) -> Status:
    """The status of the system `settings` name (the `cos up` of COS_DATA_DIR, or COS_NATS_URL/COS_DATABASE_URL)."""
    state = running_state(settings)
    settings = cli_settings(settings)
    assert settings.nats_url is not None and settings.database_url is not None
    status = Status(
        data_dir=str(settings.data_dir.resolve()),
        cos_up_pid=int(state["owner_pid"]) if state else None,
        nats_url=_hide_password(settings.nats_url),
        postgres_url=_hide_password(settings.database_url),
        replica_url=_hide_password(settings.database_read_url) if settings.database_read_url else None,
    )

    async def servers() -> None:
        await asyncio.gather(_nats(settings, status), _postgres(settings, status), _replica(settings, status))

    asyncio.run(servers())
    status.services = _services(state)
    for service in status.services:
        if not service.ok:
            status.problems.append(f"{service.name}: {service.health if service.health != 'ok' else service.ready}")
    for consumer in status.consumers:
        if consumer.pending + consumer.unacknowledged > 10_000:
            status.problems.append(f"consumer {consumer.name} is {consumer.pending:,} events behind")
    return status


def _print(status: Status) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    where = f"cos up (pid {status.cos_up_pid}) in {status.data_dir}" if status.cos_up_pid else "configured servers"
    console.print(as_text(f"CommonOS: {'healthy' if status.healthy else 'UNHEALTHY'} - {where}"))
    console.print(as_text(f"NATS: {status.nats_url}: {status.nats}"))
    if status.nats == "ok":
        console.print(as_text(f"JetStream writes: {status.jetstream_writes}"))
    console.print(as_text(f"PostgreSQL: {status.postgres_url}: {status.postgres}"))
    if status.replica_url:
        console.print(as_text(f"PostgreSQL read replica: {status.replica_url}: {status.replica}"))
    else:
        console.print(as_text("PostgreSQL read replica: no replica (COS_DATABASE_READ_URL is not set)"))
    if status.services:
        table = Table(title="services")
        for column in ("service", "pid", "address", "health", "ready", "version"):
            table.add_column(column)
        for s in status.services:
            table.add_row(*(as_text(x) for x in (s.name, s.pid or "", s.url or "", s.health, s.ready, s.version or "")))
        console.print(table)
    if status.consumers:
        table = Table(title="consumers of COS_EVENTS")
        for column in ("consumer", "filter", "acknowledged up to", "behind", "unacknowledged"):
            table.add_column(column, justify="left" if column in ("consumer", "filter") else "right")
        for c in status.consumers:
            table.add_row(
                as_text(c.name), as_text(c.filter), f"{c.acknowledged_seq:,}", f"{c.pending:,}", f"{c.unacknowledged:,}"
            )
        console.print(table)
    if status.events is not None:
        console.print(
            f"events stored: {status.events:,}; last stored at {status.last_event_stored_at or 'never'}; "
            f"dead letters waiting: {status.dead_letters if status.dead_letters is not None else '?'}",
            markup=False,
        )
    for problem in status.problems:
        console.print(as_text(f"problem: {problem}"))


def _status(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    try:
        status = collect(settings)
    except CliError as exc:  # no system to talk to: that is the status
        if args.format == "json":
            print(json.dumps({"healthy": False, "problems": [str(exc)]}))
        else:
            print(shown(f"CommonOS: not running - {exc}"))
        return 1
    if args.format == "json":
        body = asdict(status)
        body["healthy"] = status.healthy
        for service, raw in zip(status.services, body["services"], strict=True):
            raw["ok"] = service.ok
        print(json.dumps(body, indent=2, default=lambda v: v.isoformat() if isinstance(v, datetime) else str(v)))
    else:
        _print(status)
    return 0 if status.healthy else 1


def register(sub: Any) -> None:
    p = sub.add_parser(
        "status",
        help=(
            "what is running, where, how far behind each consumer and the read replica are, dead letters (exit 1 "
            "when unhealthy)"
        ),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--format", choices=("table", "json"), default="table", help="output format")
    p.set_defaults(handler=_status)
