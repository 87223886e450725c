"""NATS connection and the JetStream streams every service relies on (created idempotently)."""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

import nats.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError, NotFoundError

from commonos.proto.errors import OperationalError
from commonos.proto.subjects import (
    ALERTS_ALL,
    ALERTS_STREAM,
    COSTS_ALL,
    COSTS_STREAM,
    DLQ_ALL,
    DLQ_STREAM,
    EVENTS_ALL,
    EVENTS_STREAM,
)
from commonos.runtime.settings import Settings

if TYPE_CHECKING:
    from commonos.runtime.http import Health

log = logging.getLogger(__name__)

#: Republishing an event inside this window is dropped by JetStream (Nats-Msg-Id).
DUPLICATE_WINDOW_S = 600.0
#: Long enough that an alert republished after a crash and a slow restart is still recognised.
ALERTS_DUPLICATE_WINDOW_S = 24 * 3600.0


class ConnectionLost(OperationalError):
    """The NATS connection was closed, not by us, and will not come back: nats-py reconnects after a
    network failure, but not after the server answered with an error (an authorization violation,
    a message over max_payload). A service then exits non-zero so that its supervisor restarts it."""


def events_stream_config(
    replicas: int = 1, max_age_s: float | None = None, max_bytes: int | None = None
) -> StreamConfig:
    """COS_EVENTS. Its retention (`max_age_s`, `max_bytes`; 0 is unbounded) is unbounded by default; left
    None, `ensure_stream` keeps what the stream has (an operator's limit is not undone by a service).
    An event gone from the stream can no longer be replayed (`cos replay`) nor read by a late consumer."""
    return StreamConfig(
        name=EVENTS_STREAM,
        subjects=[EVENTS_ALL],
        storage=StorageType.FILE,
        retention=RetentionPolicy.LIMITS,
        discard=DiscardPolicy.OLD,
        num_replicas=replicas,
        duplicate_window=DUPLICATE_WINDOW_S,
        allow_direct=True,
        max_age=max_age_s,
        max_bytes=None if max_bytes is None else (max_bytes if max_bytes > 0 else -1),
    )


def dlq_stream_config(replicas: int = 1) -> StreamConfig:
    return StreamConfig(
        name=DLQ_STREAM,
        subjects=[DLQ_ALL],
        storage=StorageType.FILE,
        retention=RetentionPolicy.LIMITS,
        num_replicas=replicas,
        duplicate_window=DUPLICATE_WINDOW_S,
    )


def _billing_stream(name: str, subjects: str, duplicate_window_s: float, replicas: int) -> StreamConfig:
    """A stream billing publishes to, kept apart from the events: limits, on file, oldest dropped when full."""
    return StreamConfig(
        name=name,
        subjects=[subjects],
        storage=StorageType.FILE,
        retention=RetentionPolicy.LIMITS,
        discard=DiscardPolicy.OLD,
        num_replicas=replicas,
        duplicate_window=duplicate_window_s,
    )


def alerts_stream_config(replicas: int = 1) -> StreamConfig:
    """Billing's budget alerts (`cos.alerts.>`)."""
    return _billing_stream(ALERTS_STREAM, ALERTS_ALL, ALERTS_DUPLICATE_WINDOW_S, replicas)


def costs_stream_config(replicas: int = 1) -> StreamConfig:
    """Billing's priced calls (`cos.costs.>`, `commonos.proto.costs`)."""
    return _billing_stream(COSTS_STREAM, COSTS_ALL, DUPLICATE_WINDOW_S, replicas)


#: The stream `cos status` writes one message to, to learn whether JetStream takes writes: it keeps that message
#: alone (nothing reads it), so it never grows.
STATUS_STREAM = "COS_STATUS"
STATUS_SUBJECT = "cos.status.write_check"


def status_stream_config(replicas: int = 1) -> StreamConfig:
    return StreamConfig(
        name=STATUS_STREAM,
        subjects=[STATUS_SUBJECT],
        storage=StorageType.FILE,
        retention=RetentionPolicy.LIMITS,
        discard=DiscardPolicy.OLD,
        max_msgs=1,
        num_replicas=replicas,
        # Set, so that `ensure_stream` finds the stream as wanted and writes nothing but the one message.
        duplicate_window=60.0,
    )


def client_of(js: JetStreamContext) -> Client | None:
    """The connection a JetStreamContext was made from, for callers handed only the context.

    nats-py keeps it private and offers no accessor, so this is the one place that reads it; code that
    has the client passes it instead (`EventPublisher(..., nc=nc)`, `dead_letter(..., nc=nc)`).
    """
    client = getattr(js, "_nc", None)
    return client if isinstance(client, Client) else None


def connection_problem(nc: Client) -> str | None:
    """Why a service cannot serve on `nc` now, or None while it is connected: the one readiness check of a NATS
    connection (`watch_connection`, and the console's /readyz)."""
    if nc.is_connected:
        return None
    if nc.is_closed:
        return f"NATS connection closed: {nc.last_error or 'by the service'}"
    last = f" (last error: {nc.last_error})" if nc.last_error else ""
    if nc.is_reconnecting:
        return f"NATS disconnected, reconnecting{last}"
    return f"not connected to NATS{last}"


def watch_connection(health: Health, nc: Client) -> None:
    """`health` not ready (check "nats", the reason from `connection_problem`) whenever `nc` is not connected,
    asked at each /readyz: how every service's readiness follows its NATS connection."""
    health.watch("nats", lambda: connection_problem(nc))


def inbox_prefix(user: str) -> str:
    """The private inbox of a NATS user: `_INBOX_<user>` (deploy/nats/auth.conf lets each user read only its own)."""
    return "_INBOX_" + re.sub(r"[^A-Za-z0-9_-]", "_", user)


async def connect(settings: Settings, name: str, *, client: Client | None = None, **overrides: Any) -> Client:
    """Connect with unlimited reconnects: a NATS restart is an outage to wait out, not a crash. nats-py tries
    again by itself until NATS answers, so this returns only once connected (`client`, when given, is the one
    connecting: its `last_error` says meanwhile why it is not there yet)."""
    if not settings.nats_url:
        raise ValueError("no NATS URL configured")

    async def on_error(exc: Exception) -> None:
        log.warning("nats: %s", exc)

    async def on_disconnected() -> None:
        log.info("nats: disconnected")

    async def on_reconnected() -> None:
        log.info("nats: reconnected")

    options: dict[str, Any] = {
        "servers": [u.strip() for u in settings.nats_url.split(",")],
        "name": name,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.5,
        "connect_timeout": 5,
        "allow_reconnect": True,
        "error_cb": on_error,
        "disconnected_cb": on_disconnected,
        "reconnected_cb": on_reconnected,
    }
    if settings.nats_creds:
        options["user_credentials"] = str(settings.nats_creds)
    if settings.nats_user:
        options["user"] = settings.nats_user
        options["password"] = settings.nats_password or ""
        # Replies (JetStream API answers, chat replies) come to an inbox only this user may read.
        options["inbox_prefix"] = inbox_prefix(settings.nats_user)
    if settings.nats_tls_ca or settings.nats_tls_cert:
        import ssl

        ctx = ssl.create_default_context(cafile=str(settings.nats_tls_ca) if settings.nats_tls_ca else None)
        if settings.nats_tls_cert:
            ctx.load_cert_chain(
                str(settings.nats_tls_cert), str(settings.nats_tls_key) if settings.nats_tls_key else None
            )
        options["tls"] = ctx
    options.update(overrides)
    nc = client if client is not None else Client()
    await nc.connect(**options)
    return nc


class StreamUnavailable(OperationalError):
    """A stream this service needs does not exist, and its NATS user may not create it (only an admin may)."""


async def ensure_stream(js: JetStreamContext, config: StreamConfig) -> None:
    """Create the stream, or bring it to `config`; safe to run from every service at start.

    The stream's state is read first, and nothing is changed when it is as wanted, so a service whose
    NATS user may only read the streams (as deploy/nats/auth.conf has it: only an admin changes a
    stream) starts on streams an operator created (`cos streams ensure`). Replicas are never lowered: a
    service started with the single-node default against a stream run at three replicas leaves it.
    """
    name = config.name or ""
    try:
        existing = (await js.stream_info(name)).config
    except NotFoundError:
        existing = None
    if existing is None:
        try:
            await js.add_stream(config)
        except nats.errors.TimeoutError:
            raise StreamUnavailable(
                f"stream {name} does not exist and this NATS user may not create it: "
                "create it as an admin (`cos streams ensure`)"
            ) from None
        except BadRequestError as exc:
            if exc.err_code != 10058:  # created meanwhile by another service, with another configuration
                raise
        return
    config.num_replicas = max(config.num_replicas or 1, existing.num_replicas or 1)
    # Limits left unset keep the stream's own (an operator's retention is not undone by a service).
    if config.max_age is None:
        config.max_age = existing.max_age
    if config.max_bytes is None:
        config.max_bytes = existing.max_bytes
    if (
        existing.num_replicas == config.num_replicas
        and existing.subjects == config.subjects
        and existing.duplicate_window == config.duplicate_window
        and (existing.max_age or 0) == (config.max_age or 0)
        and _bytes_limit(existing.max_bytes) == _bytes_limit(config.max_bytes)
    ):
        return
    try:
        await js.update_stream(config)
    except nats.errors.TimeoutError:
        log.warning(
            "stream %s differs from this service's settings (replicas, subjects, duplicate window or limits) and "
            "this NATS user may not change it; going on with it as it is (an admin can: `cos streams ensure`)",
            name,
        )


def _bytes_limit(value: int | None) -> int:
    return -1 if value is None or value <= 0 else value


async def ensure_streams(js: JetStreamContext, replicas: int = 1) -> None:
    await ensure_stream(js, events_stream_config(replicas))
    await ensure_stream(js, dlq_stream_config(replicas))
