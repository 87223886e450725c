"""One turn per session at a time, across processes.

`NatsSessionLocks` keeps a key per running session in the KV bucket `cos_turn_locks` (key = session
id). Taking it is a create-only write: a second taker gets `SessionBusy`. The holder refreshes the key
with a revision check while the turn runs; the bucket's TTL frees the key of a process that died.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from typing import Final, Protocol

import msgspec
import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KeyValue

from commonos.proto.errors import OperationalError
from commonos.runtime.retry import sleep_or_stop

log = logging.getLogger(__name__)

LOCK_BUCKET: Final = "cos_turn_locks"


class SessionBusy(OperationalError):
    """Another turn of this session is running (here or in another process)."""

    def __init__(self, session_id: uuid.UUID, holder: str | None = None) -> None:
        who = f" (held by {holder})" if holder else ""
        super().__init__(f"session {session_id} is busy: another turn is running{who}")
        self.session_id = session_id
        self.holder = holder


class LockUnavailable(OperationalError):
    """The lock store could not be reached, so the turn cannot be started safely."""


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class SessionLease(Protocol):
    @property
    def lost(self) -> bool:
        """True once another holder may have the session (the lease could not be kept)."""
        ...

    async def release(self) -> None:
        """Give the session back; safe to call twice."""
        ...


class SessionLocks(Protocol):
    async def acquire(self, session_id: uuid.UUID, owner: str) -> SessionLease:
        """Take the session for one turn, or raise `SessionBusy` naming the holder."""
        ...


class _Holder(msgspec.Struct, frozen=True):
    owner: str
    turn_lock_id: uuid.UUID


class _MemoryLease:
    def __init__(self, locks: MemorySessionLocks, session_id: uuid.UUID) -> None:
        self._locks = locks
        self._session_id = session_id

    @property
    def lost(self) -> bool:
        return False

    async def release(self) -> None:
        self._locks.held.pop(self._session_id, None)


class MemorySessionLocks:
    """Locks of one process (tests)."""

    def __init__(self) -> None:
        self.held: dict[uuid.UUID, str] = {}

    async def acquire(self, session_id: uuid.UUID, owner: str) -> SessionLease:
        if session_id in self.held:
            raise SessionBusy(session_id, self.held[session_id])
        self.held[session_id] = owner
        return _MemoryLease(self, session_id)


class _NatsLease:
    def __init__(self, kv: KeyValue, key: str, value: bytes, revision: int, refresh_s: float) -> None:
        self._kv = kv
        self._key = key
        self._value = value
        self._revision = revision
        self._refresh_s = refresh_s
        self._lost = False
        self._released = asyncio.Event()
        self._task = asyncio.create_task(self._keep(), name=f"lease-{key}")

    @property
    def lost(self) -> bool:
        return self._lost

    async def _keep(self) -> None:
        while not self._released.is_set():
            if await sleep_or_stop(self._released, self._refresh_s):
                return
            try:
                self._revision = await self._kv.update(self._key, self._value, last=self._revision)
            except nats.js.errors.KeyWrongLastSequenceError:
                # Our entry is gone: it expired while NATS was away, or someone else holds it now.
                try:
                    self._revision = await self._kv.create(self._key, self._value)
                    log.warning("lock %s expired and was taken again", self._key)
                except nats.js.errors.KeyWrongLastSequenceError:
                    log.error("lock %s was lost to another holder", self._key)
                    self._lost = True
                    return
                except (nats.errors.Error, TimeoutError) as exc:
                    log.warning("lock %s not refreshed (%s); retrying", self._key, type(exc).__name__)
            except (nats.errors.Error, TimeoutError) as exc:
                log.warning("lock %s not refreshed (%s); retrying", self._key, type(exc).__name__)

    async def release(self) -> None:
        if self._released.is_set():
            return
        self._released.set()
        await self._task
        if self._lost:
            return
        try:
            await self._kv.delete(self._key, last=self._revision)
        except (nats.errors.Error, TimeoutError) as exc:
            # Left to expire with the bucket's TTL.
            log.warning("lock %s not released (%s); it expires by itself", self._key, type(exc).__name__)


class NatsSessionLocks:
    """Session locks in a JetStream KV bucket (file storage, entries expire after `ttl_s`)."""

    def __init__(
        self, js: JetStreamContext, *, bucket: str = LOCK_BUCKET, ttl_s: float = 30.0, replicas: int = 1
    ) -> None:
        self.js = js
        self.bucket = bucket
        self.ttl_s = ttl_s
        self.replicas = replicas
        self._kv: KeyValue | None = None

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            try:
                self._kv = await self.js.key_value(self.bucket)
            except nats.js.errors.BucketNotFoundError:
                self._kv = await self.js.create_key_value(
                    KeyValueConfig(
                        bucket=self.bucket,
                        history=1,
                        ttl=self.ttl_s,
                        storage=StorageType.FILE,
                        replicas=self.replicas,
                    )
                )
        return self._kv

    async def acquire(self, session_id: uuid.UUID, owner: str) -> SessionLease:
        key = str(session_id)
        value = msgspec.json.encode(_Holder(owner, uuid.uuid4()))
        try:
            kv = await self._bucket()
            revision = await kv.create(key, value)
        except nats.js.errors.KeyWrongLastSequenceError:
            raise SessionBusy(session_id, await self._holder(key)) from None
        except (nats.errors.Error, TimeoutError) as exc:
            raise LockUnavailable(f"cannot take the lock of session {session_id}: {type(exc).__name__}") from exc
        return _NatsLease(kv, key, value, revision, refresh_s=self.ttl_s / 3)

    async def _holder(self, key: str) -> str | None:
        try:
            entry = await (await self._bucket()).get(key)
            return msgspec.json.decode(entry.value or b"", type=_Holder).owner
        except (nats.errors.Error, msgspec.DecodeError, TimeoutError):
            return None
