"""The loop as a service: chat requests on NATS (`cos.cmd.<profile>.chat`), /metrics /healthz /readyz.

A chat request with `started` is answered twice on its reply subject: `started` (the session and turn ids)
as soon as the turn has them, then the final reply, so that a requester starting a new session learns which
session's deltas (`cos.deltas.<profile>.<session>`) and events to follow. It answers `cos.approvals.pending`
with the approvals its turns wait for and the profiles it serves (`commonos.runtime.loop_requests.ask_loops`).

At start it publishes each profile's `profile_upserted`, but a deleted profile's (it warns instead: the
profile stays deleted and its chats are refused), and warns of every profile it published before whose
folder is gone. It answers `cos.cmd.<profile>.delete.<requester>` by publishing the profile's deletion.

Life (arq-style): start, serve until SIGTERM sets the stop event, stop taking requests, let running
turns finish for `grace_s`, then interrupt the rest — each ends `interrupted` with its
`turn_finished` recorded and its requester told — and close connections.

A NATS connection closed other than by the service itself (nats-py does not reconnect after the
server answered with an error) stops the service the same way, with /healthz failing, and `serve`
returns 1, so that the orchestrator restarts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from pathlib import Path

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from commonos.loop import metrics
from commonos.loop.approvals import NatsApprover
from commonos.loop.budgets import BudgetGuard
from commonos.loop.deltas import DeltaPublisher
from commonos.loop.event_journal import LOOP_SOURCE
from commonos.loop.journal import JournalError, MessageTooLarge, SessionNotFound
from commonos.loop.locks import LockUnavailable, NatsSessionLocks, SessionBusy, default_owner
from commonos.loop.loop import BadRequest, Loop, TurnRequest, UnknownProfile
from commonos.loop.nats_journal import NatsJournal
from commonos.loop.profile_admin import DeleteReply, DeleteRequest, ProfileAdminError
from commonos.loop.profiles import Profile, ProfileError, load_profiles
from commonos.loop.providers import build_provider
from commonos.loop.providers.base import Provider
from commonos.loop.registry import NatsTurnRegistry
from commonos.loop.search import MessageSearch, NoSearch, PostgresMessageSearch
from commonos.loop.settings import LoopSettings
from commonos.loop.subjects import CHAT_QUEUE_GROUP, DELETE_REQUESTS_ALL
from commonos.proto.events import TurnStatus
from commonos.proto.identity import TurnInfo
from commonos.proto.profiles import deleted_when_by
from commonos.proto.requests import (
    APPROVALS_PENDING,
    ChatReply,
    ChatRequest,
    PendingApprovals,
    PendingQuery,
    chat_subject,
    check_approver,
)
from commonos.proto.tags import InvalidTag
from commonos.runtime import nats as cos_nats
from commonos.runtime import telemetry
from commonos.runtime.http import Health
from commonos.runtime.lifecycle import install_stop_signals, setup_logging
from commonos.runtime.publisher import EventPublisher, PublishError
from commonos.runtime.retry import sleep_or_stop
from commonos.runtime.service import service_context
from commonos.runtime.settings import ConfigError, Settings

log = logging.getLogger(__name__)

HEARTBEAT_S = 5.0
#: How long turns cancelled because the connection was lost may take to unwind before the service exits.
LOST_WAIT_S = 1.0


class LoopService:
    def __init__(
        self,
        nc: Client,
        loop: Loop,
        *,
        health: Health | None = None,
        grace_s: float = 5.0,
        handle_signals: bool = True,
        registry: NatsTurnRegistry | None = None,
        publisher: EventPublisher | None = None,
        heartbeat_s: float = 5.0,
        profiles_dir: Path | None = None,
        stop_event: asyncio.Event | None = None,
    ) -> None:
        self.nc = nc
        self.loop = loop
        #: Where the profile folders are (COS_PROFILES_DIR): a folder missing there is reported at start.
        self.profiles_dir = profiles_dir or next((p.folder.parent for p in loop.profiles.values()), Path("profiles"))
        self.health = health if health is not None else Health()
        cos_nats.watch_connection(self.health, nc)
        self.grace_s = grace_s
        self.handle_signals = handle_signals
        self.stop_event = stop_event if stop_event is not None else asyncio.Event()
        self._subs: list[Subscription] = []
        self._turns: set[asyncio.Task[None]] = set()
        self._stopping = False
        self.registry = registry
        self.publisher = publisher
        self.heartbeat_s = heartbeat_s
        #: Why the NATS connection was lost for good (the service stops and must be restarted), or None.
        self.lost: str | None = None
        self._shut_down = False

    async def connection_closed(self) -> None:
        """nats-py's `closed_cb`: unless the service closed it, the connection is gone for good."""
        if self.lost is not None or self._shut_down:
            return  # already handled, or closed by us after shutting down
        self.lost = f"NATS connection closed: {self.nc.last_error or 'by the server'}"
        log.error("loop: %s; stopping so that the service is restarted", self.lost)
        self.health.fail(self.lost)
        self.health.set_ready("nats", False, self.lost)
        self.stop_event.set()

    async def start(self) -> None:
        await self._publish_profiles()
        for profile_id in self.loop.profiles:
            sub = await self.nc.subscribe(chat_subject(profile_id), queue=CHAT_QUEUE_GROUP, cb=self._on_chat)
            self._subs.append(sub)
        self._subs.append(await self.nc.subscribe(DELETE_REQUESTS_ALL, queue=CHAT_QUEUE_GROUP, cb=self._on_delete))
        # Every loop service answers (no queue group): each knows only the approvals its own turns wait for.
        self._subs.append(await self.nc.subscribe(APPROVALS_PENDING, cb=self._on_pending))
        await self.nc.flush()
        self.health.set_ready("starting", True)
        log.info("loop serving profiles %s", ", ".join(self.loop.profiles))

    async def _publish_profiles(self) -> None:
        """Publish each profile's `profile_upserted`, but a deleted profile's (it stays deleted: its chats are
        refused); say so, and name every profile of the loop's whose folder is gone (its history stays)."""
        statuses = await self.loop.journal.profile_statuses()
        for profile in self.loop.profiles.values():
            status = statuses.get(profile.id)
            deleted = status.deleted if status is not None else None
            if deleted is not None:
                log.warning(
                    "profile %r (%s) was deleted %s: it is not published again and takes no chats "
                    "(remove its folder, or re-create it: cos profile recreate %s)",
                    profile.id,
                    profile.folder,
                    deleted_when_by(deleted),
                    profile.id,
                )
                continue
            await self.loop.journal.publish_profile(profile.id, profile.tags)
        for profile_id, status in sorted(statuses.items()):
            if profile_id in self.loop.profiles or status.deleted is not None or status.upserted_source != LOOP_SOURCE:
                continue
            log.warning(
                "profile %r: its folder %s is missing; its history stays "
                "(restore the folder, or delete the profile: cos profile delete %s)",
                profile_id,
                self.profiles_dir / profile_id,
                profile_id,
            )

    async def run(self) -> int:
        """Start, serve until the stop event (SIGTERM/SIGINT when `handle_signals`) or until the NATS
        connection is lost for good, then shut down. The exit code: 0, or 1 when the connection was lost."""
        if self.handle_signals:
            install_stop_signals(self.stop_event)
        await self.start()
        try:
            await self.serve()
        finally:
            await self.shutdown()
        return 1 if self.lost else 0

    async def serve(self) -> None:
        """Beat the liveness heartbeat, keep running turns registered and sweep dead ones, until stopped."""
        interval = min(HEARTBEAT_S, self.heartbeat_s)
        next_sweep = 0.0
        while not self.stop_event.is_set():
            if self.nc.is_closed:  # also without a closed_cb
                await self.connection_closed()
                break
            self.health.beat()
            if self.registry is not None and self.publisher is not None and time.monotonic() >= next_sweep:
                next_sweep = time.monotonic() + self.heartbeat_s
                try:
                    await self.registry.heartbeat()
                    await self.registry.sweep(self.publisher)
                except (nats.errors.Error, PublishError, TimeoutError) as exc:
                    log.warning("running turns not swept (%s); trying again", type(exc).__name__)
            await sleep_or_stop(self.stop_event, interval)

    async def shutdown(self) -> None:
        self._stopping = True
        self.health.set_ready("stopping", False, "shutting down")
        for sub in self._subs:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        self._subs.clear()
        if self._turns:
            # Without a connection nothing of a turn can be recorded any more: no grace.
            _, running = await asyncio.wait(set(self._turns), timeout=0 if self.lost else self.grace_s)
            if running:
                log.info("interrupting %d running turn(s)", len(running))
                self.loop.shutting_down = True
                for task in running:
                    task.cancel()
                if self.lost:
                    # Their ends cannot be recorded: another loop records them interrupted once stale.
                    await asyncio.wait(running, timeout=min(self.grace_s, LOST_WAIT_S))
                else:
                    await asyncio.gather(*running, return_exceptions=True)
        self._shut_down = True
        if self.nc.is_closed:
            return
        with contextlib.suppress(nats.errors.Error, TimeoutError):
            await self.nc.flush(timeout=2)

    async def _on_chat(self, msg: Msg) -> None:
        # Subscription callbacks run one after another: each turn gets its own task.
        task = asyncio.create_task(self._chat(msg))
        self._turns.add(task)
        task.add_done_callback(self._turns.discard)

    async def _chat(self, msg: Msg) -> None:
        profile_id = msg.subject.split(".")[2]
        if self._stopping:
            await self._reply(msg, ChatReply(status="unavailable", error="the loop service is stopping"))
            return
        try:
            request = msgspec.json.decode(msg.data, type=ChatRequest)
        except msgspec.DecodeError as exc:
            await self._reply(msg, ChatReply(status="rejected", error=f"bad chat request: {exc}"))
            return
        started: list[TurnInfo] = []
        notices: list[asyncio.Task[None]] = []

        def on_start(turn: TurnInfo) -> None:
            started.append(turn)
            if request.started:
                notice = ChatReply(status="started", session_id=turn.session_id, turn_id=turn.turn_id)
                notices.append(asyncio.create_task(self._reply(msg, notice)))

        try:
            result = await self.loop.run_turn(
                TurnRequest(
                    profile_id=profile_id,
                    text=request.text,
                    session_id=request.session_id,
                    tags=request.tags,
                    source=request.source,
                    parent_session_id=request.parent_session_id,
                ),
                on_start=on_start,
            )
            reply = ChatReply(
                status=result.status.value,
                session_id=result.session_id,
                turn_id=result.turn_id,
                text=result.text,
                error=result.error,
            )
        except asyncio.CancelledError:
            turn = started[0] if started else None
            await self._reply(
                msg,
                ChatReply(
                    status=TurnStatus.INTERRUPTED.value,
                    session_id=turn.session_id if turn else request.session_id,
                    turn_id=turn.turn_id if turn else None,
                    error="the loop service stopped during the turn",
                ),
            )
            raise
        except SessionBusy as exc:
            reply = ChatReply(status="busy", session_id=exc.session_id, error=str(exc))
        except (BadRequest, SessionNotFound, UnknownProfile, InvalidTag, MessageTooLarge) as exc:
            reply = ChatReply(status="rejected", session_id=request.session_id, error=str(exc))
        except (JournalError, LockUnavailable) as exc:
            reply = ChatReply(status=TurnStatus.FAILED.value, session_id=request.session_id, error=str(exc))
        if notices:  # the `started` reply goes first
            await asyncio.gather(*notices, return_exceptions=True)
        await self._reply(msg, reply)

    async def _on_pending(self, msg: Msg) -> None:
        """`cos.approvals.pending`: the approvals this service's turns wait for (of the profiles asked), and the
        profiles whose chats it answers."""
        if not msg.reply:
            return
        approver = self.loop.approver
        try:
            query = msgspec.json.decode(msg.data or b"{}", type=PendingQuery)
        except msgspec.DecodeError:
            query = PendingQuery(profile_ids=())
        waiting = approver.waiting(query.profile_ids) if isinstance(approver, NatsApprover) else PendingApprovals()
        answer = PendingApprovals(approvals=waiting.approvals, profile_ids=tuple(sorted(self.loop.profiles)))
        with contextlib.suppress(nats.errors.Error):
            await msg.respond(msgspec.json.encode(answer))

    async def _on_delete(self, msg: Msg) -> None:
        """`cos.cmd.<profile>.delete.<requester>`: publish the profile's deletion, `deleted_by` the requester."""
        _, _, profile_id, _, requester = msg.subject.split(".", 4)
        reply = DeleteReply(ok=False, error="the loop service is stopping")
        if not self._stopping:
            reply = await self._delete(profile_id, requester, msg.data)
        if msg.reply:
            with contextlib.suppress(nats.errors.Error):
                await msg.respond(msgspec.json.encode(reply))

    async def _delete(self, profile_id: str, requester: str, data: bytes) -> DeleteReply:
        try:
            msgspec.json.decode(data or b"{}", type=DeleteRequest)
        except msgspec.DecodeError as exc:
            return DeleteReply(ok=False, error=f"bad delete request: {exc}")
        try:
            event = await self.loop.delete_profile(profile_id, check_approver(requester))
        except (ProfileAdminError, ValueError) as exc:
            return DeleteReply(ok=False, error=str(exc))
        except JournalError as exc:
            return DeleteReply(ok=False, error=f"not deleted: {exc}")
        log.warning("profile %r deleted by %s (event %s)", profile_id, event.deleted_by, event.event_id)
        return DeleteReply(ok=True, event_id=event.event_id, deleted_at=event.occurred_at.isoformat())

    async def _reply(self, msg: Msg, reply: ChatReply) -> None:
        if not msg.reply:
            return
        try:
            await msg.respond(msgspec.json.encode(reply))
        except nats.errors.Error as exc:
            log.warning("chat reply not sent: %s", exc)


DEFAULT_HTTP_PORT = 9461


async def open_search(settings: Settings) -> MessageSearch:
    """session_search's: it only reads, so it reads the read replica when there is one (COS_DATABASE_READ_URL),
    else COS_DATABASE_URL; without a database, none."""
    url = settings.read_database_url
    if not url:
        return NoSearch()
    return await PostgresMessageSearch.connect(url)


async def serve(settings: Settings, *, handle_signals: bool = True, own: LoopSettings | None = None) -> int:
    """`python -m commonos.loop serve`: load and check every profile, connect, serve until SIGTERM (the loop's
    own settings `own`, by default from COS_TURN_*)."""
    setup_logging(settings.log_level)
    own = own if own is not None else LoopSettings.from_env()
    try:
        profiles = load_profiles(settings.profiles_dir)
        providers = {p.id: build_provider(p) for p in profiles.values()}
    except ProfileError as exc:
        raise ConfigError(str(exc)) from None
    # At 0 from the start: each profile's provider before its first failure, each way a turn can end.
    for provider in providers.values():
        metrics.MODEL_ERRORS.labels(provider.name)
    for status in TurnStatus:
        if status is not TurnStatus.RUNNING:
            metrics.TURNS.labels(status.value)
    if not settings.nats_url:
        raise ConfigError("COS_NATS_URL is not set (or run everything with `cos up`)")
    # OpenTelemetry when OTEL_EXPORTER_OTLP_ENDPOINT asks for it (service.name commonos-loop), flushed at the end.
    async with telemetry.serving("commonos-loop"):
        return await _serve(settings, own, profiles, providers, handle_signals)


async def _serve(
    settings: Settings,
    own: LoopSettings,
    profiles: Mapping[str, Profile],
    providers: Mapping[str, Provider],
    handle_signals: bool,
) -> int:
    """`serve` once the profiles are loaded: the services' life (`commonos.runtime.service.service_context`:
    /metrics /healthz /readyz, NATS, the streams waited for), the loop served in it until stopped."""
    search: MessageSearch = NoSearch()
    guard: BudgetGuard | None = None
    stop = None if handle_signals else asyncio.Event()
    try:
        async with service_context(settings, "cos-loop", stop) as ctx:
            js = ctx.js
            search = await open_search(settings)
            guard = BudgetGuard(js)
            await guard.start()
            registry = NatsTurnRegistry(
                js, default_owner(), stale_after_s=own.turn_stale_s, replicas=settings.stream_replicas
            )
            loop = Loop(
                NatsJournal(
                    js, EventPublisher(js, LOOP_SOURCE, nc=ctx.nc), max_message_bytes=settings.max_message_bytes
                ),
                profiles,
                providers,
                locks=NatsSessionLocks(js, replicas=settings.stream_replicas),
                approver=NatsApprover(ctx.nc),
                search=search,
                registry=registry,
                deltas=DeltaPublisher(ctx.nc).for_turn,
                budgets=guard,
            )
            service = LoopService(
                ctx.nc,
                loop,
                health=ctx.health,
                grace_s=settings.drain_timeout_s / 2,
                handle_signals=False,
                registry=registry,
                publisher=EventPublisher(js, "urn:commonos:loop", nc=ctx.nc),
                heartbeat_s=own.turn_heartbeat_s,
                profiles_dir=settings.profiles_dir,
                stop_event=ctx.stop,
            )
            ctx.on_lost.append(service.connection_closed)
            code = 0 if ctx.stop.is_set() else await service.run()
    finally:
        if guard is not None:
            await guard.stop()
        for provider in providers.values():
            await provider.close()
        if isinstance(search, PostgresMessageSearch):
            await search.close()
    return 1 if code or ctx.lost else 0
