"""Running turns, so that a turn whose loop process died is recorded as interrupted, not left open.

While a turn runs, its loop process keeps an entry in the KV bucket `cos_running_turns` (key = turn
id) and refreshes its heartbeat. Every loop service sweeps the bucket at start and then
periodically: an entry whose heartbeat is older than `stale_after_s` belongs to a process that
died (SIGKILL, a lost machine), so the sweeper publishes `turn_finished` with status `interrupted`
for it and removes the entry. The event id derives from the turn id, so two sweepers racing for the
same turn store one event; and the projection keeps the first end recorded for a turn.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from typing import Final, Protocol

import msgspec
import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KeyValue

from commonos.proto.events import TurnFinished, TurnStatus
from commonos.proto.identity import TurnInfo
from commonos.proto.ids import INTERRUPTED_NAMESPACE
from commonos.runtime.publisher import EventPublisher

log = logging.getLogger(__name__)

RUNNING_BUCKET: Final = "cos_running_turns"


class RunningTurn(msgspec.Struct, frozen=True, kw_only=True):
    profile_id: str
    session_id: uuid.UUID
    turn_id: uuid.UUID
    owner: str
    heartbeat_at: float


class TurnRegistry(Protocol):
    async def started(self, turn: TurnInfo) -> None:
        """Note that `turn` runs here (before any of its work)."""

    async def finished(self, turn: TurnInfo) -> None:
        """Note that `turn` ended and its end was recorded."""


class NoRegistry:
    """For loops whose process cannot die apart from their journal (tests on memory adapters)."""

    async def started(self, turn: TurnInfo) -> None:
        return None

    async def finished(self, turn: TurnInfo) -> None:
        return None


def interrupted_event_id(turn_id: uuid.UUID) -> uuid.UUID:
    return uuid.uuid5(INTERRUPTED_NAMESPACE, str(turn_id))


class NatsTurnRegistry:
    def __init__(
        self,
        js: JetStreamContext,
        owner: str,
        *,
        stale_after_s: float = 20.0,
        replicas: int = 1,
        bucket: str = RUNNING_BUCKET,
    ) -> None:
        self.js = js
        self.owner = owner
        self.stale_after_s = stale_after_s
        self.replicas = replicas
        self.bucket = bucket
        self._kv: KeyValue | None = None
        self._mine: dict[str, RunningTurn] = {}

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            try:
                self._kv = await self.js.key_value(self.bucket)
            except nats.js.errors.BucketNotFoundError:
                self._kv = await self.js.create_key_value(
                    KeyValueConfig(bucket=self.bucket, history=1, storage=StorageType.FILE, replicas=self.replicas)
                )
        return self._kv

    async def started(self, turn: TurnInfo) -> None:
        entry = RunningTurn(
            profile_id=turn.profile_id,
            session_id=turn.session_id,
            turn_id=turn.turn_id,
            owner=self.owner,
            heartbeat_at=time.time(),
        )
        key = str(turn.turn_id)
        self._mine[key] = entry
        try:
            await (await self._bucket()).put(key, msgspec.json.encode(entry))
        except (nats.errors.Error, TimeoutError) as exc:
            log.warning("turn %s not registered as running (%s)", key, type(exc).__name__)

    async def finished(self, turn: TurnInfo) -> None:
        key = str(turn.turn_id)
        self._mine.pop(key, None)
        try:
            await (await self._bucket()).delete(key)
        except (nats.errors.Error, TimeoutError) as exc:
            log.warning("turn %s not unregistered (%s); a sweeper will find it finished", key, type(exc).__name__)

    async def heartbeat(self) -> None:
        """Refresh the heartbeat of every turn running here."""
        kv = await self._bucket()
        now = time.time()
        for key, entry in list(self._mine.items()):
            fresh = msgspec.structs.replace(entry, heartbeat_at=now)
            self._mine[key] = fresh
            try:
                await kv.put(key, msgspec.json.encode(fresh))
            except (nats.errors.Error, TimeoutError) as exc:
                log.warning("heartbeat of turn %s not stored (%s)", key, type(exc).__name__)

    async def sweep(self, publisher: EventPublisher) -> list[uuid.UUID]:
        """Record every turn with a stale heartbeat as interrupted; returns their ids."""
        kv = await self._bucket()
        try:
            keys = await kv.keys()
        except nats.js.errors.NoKeysError:
            return []
        now = time.time()
        swept: list[uuid.UUID] = []
        for key in keys:
            if key in self._mine:
                continue
            try:
                kv_entry = await kv.get(key)
                entry = msgspec.json.decode(kv_entry.value or b"", type=RunningTurn)
            except nats.js.errors.KeyNotFoundError:
                continue
            except msgspec.DecodeError:
                log.warning("running-turn entry %s is not readable; removing it", key)
                await kv.delete(key)
                continue
            silent_s = now - entry.heartbeat_at
            if silent_s < self.stale_after_s:
                continue
            await publisher.publish(
                TurnFinished(
                    event_id=interrupted_event_id(entry.turn_id),
                    profile_id=entry.profile_id,
                    session_id=entry.session_id,
                    turn_id=entry.turn_id,
                    status=TurnStatus.INTERRUPTED,
                    error=f"the loop process running it ({entry.owner}) stopped: no heartbeat for {silent_s:.0f}s",
                )
            )
            # Another sweeper may have removed it first: the event above is idempotent either way.
            with contextlib.suppress(nats.js.errors.KeyWrongLastSequenceError):
                await kv.delete(key, last=kv_entry.revision)
            log.warning(
                "turn %s of session %s recorded as interrupted: its loop process (%s) stopped",
                entry.turn_id,
                entry.session_id,
                entry.owner,
            )
            swept.append(entry.turn_id)
        return swept
