"""`common.CallOrdinals` and `common.TurnStore` in the NATS KV bucket COS_OTLP_STATE, shared by every replica.

Ordinals: one key per (vendor, session key): `<vendor>.<SHA-256 of the session key, 32 hex>`; its value the
fingerprints seen under it in the order they were first seen (each as 16 hex of its SHA-256, a JSON list). A
new fingerprint is appended by compare-and-set on the key's revision, retried when another replica wrote
first, so replicas agree on every ordinal and a retried request (the same fingerprints) gets the same ones.

Turns: one key per session, `turns.<32 hex>` (`common.turns_key`), its value the session's `SessionTurns`
(JSON). A request's turns are merged in by compare-and-set, retried when another replica wrote first (the
merge is commutative, so the result does not depend on who wins); the sweeper reads every `turns.*` key and
replaces or deletes one only at the revision it read.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any, Final

import msgspec
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KeyValue

from commonos.otlp_gateway.common import turns_key
from commonos.otlp_gateway.turns import MAX_TURNS, SessionTurns, decode, encode, merge
from commonos.proto.errors import OperationalError

log = logging.getLogger("commonos.otlp_gateway.ordinals")

STATE_BUCKET: Final = "COS_OTLP_STATE"
#: Compare-and-set attempts before giving up (the request then fails with 503 and is retried).
MAX_ATTEMPTS: Final = 50
#: The prefix of the sessions' turns keys.
TURNS_PREFIX: Final = "turns."
#: How long the server keeps the consumer of a read of every session's turns once it is unused (seconds).
WATCH_IDLE_S: Final = 10.0


class OrdinalConflict(OperationalError):
    """Too many replicas appending to the same session at once: the exporter's retry will do it."""


async def state_bucket(js: JetStreamContext, replicas: int = 1) -> KeyValue:
    try:
        return await js.key_value(STATE_BUCKET)
    except nats.js.errors.BucketNotFoundError:
        return await js.create_key_value(
            KeyValueConfig(
                bucket=STATE_BUCKET,
                history=1,
                storage=StorageType.FILE,
                replicas=replicas,
                description="OTLP gateway: Codex calls of the same usage (their ordinals), and each session's turns",
            )
        )


def state_key(vendor: str, session_key: str) -> str:
    safe_vendor = "".join(c if c.isalnum() or c in "-_" else "_" for c in vendor) or "_"
    return f"{safe_vendor}.{hashlib.sha256(session_key.encode()).hexdigest()[:32]}"


def _short(fingerprint: str) -> str:
    return hashlib.sha256(fingerprint.encode()).hexdigest()[:16]


class KvOrdinals:
    """Ordinals and turns kept in COS_OTLP_STATE.

    The fingerprints under a key only grow, so what this replica read of them is cached; a session's turns
    are read afresh each time (another replica may have added to them).
    """

    def __init__(self, kv: KeyValue, max_turns: int = MAX_TURNS) -> None:
        self.kv = kv
        self.max_turns = max_turns
        self._cache: dict[str, list[str]] = {}

    async def _read(self, key: str) -> tuple[list[Any], int | None]:
        try:
            entry = await self.kv.get(key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return [], None
        if not entry.value:
            return [], entry.revision
        return list(json.loads(entry.value)), entry.revision

    async def _write(self, key: str, value: list[Any], revision: int | None) -> bool:
        """Compare-and-set; False when another replica wrote first."""
        return await self._write_raw(key, json.dumps(value, separators=(",", ":")).encode(), revision)

    async def _write_raw(self, key: str, data: bytes, revision: int | None) -> bool:
        try:
            if revision is None:
                await self.kv.create(key, data)
            else:
                await self.kv.update(key, data, last=revision)
        except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.KeyDeletedError):
            return False
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code in (10071, 10164):  # wrong last sequence
                return False
            raise
        return True

    async def ordinal(self, vendor: str, session_key: str, fingerprint: str) -> int:
        key = state_key(vendor, session_key)
        short = _short(fingerprint)
        cached = self._cache.get(key)
        if cached is not None and short in cached:
            return cached.index(short)
        for _ in range(MAX_ATTEMPTS):
            seen, revision = await self._read(key)
            if short in seen:
                self._cache[key] = seen
                return seen.index(short)
            proposed = [*seen, short]
            if await self._write(key, proposed, revision):
                self._cache[key] = proposed
                return len(seen)
        raise OrdinalConflict(f"{vendor} session {session_key}: no ordinal after {MAX_ATTEMPTS} attempts")

    async def _read_turns(self, key: str) -> tuple[SessionTurns | None, int | None]:
        try:
            entry = await self.kv.get(key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None, None
        return (decode(entry.value) if entry.value else None), entry.revision

    async def turns_of(self, vendor: str, profile_id: str, session_key: str) -> SessionTurns | None:
        return (await self._read_turns(turns_key(vendor, profile_id, session_key)))[0]

    async def note_turns(self, seen: SessionTurns) -> None:
        key = turns_key(seen.vendor, seen.profile_id, seen.session_key)
        for _ in range(MAX_ATTEMPTS):
            stored, revision = await self._read_turns(key)
            merged = merge(stored, seen, self.max_turns)
            if merged == stored:
                return
            if await self._write_raw(key, encode(merged), revision):
                return
        raise OrdinalConflict(
            f"{seen.vendor} session {seen.session_key}: turns not recorded after {MAX_ATTEMPTS} attempts"
        )

    async def sessions(self) -> list[tuple[str, SessionTurns, int]]:
        # A consumer of its own each time, which the server removes once unused for WATCH_IDLE_S.
        watcher = await self.kv.watch(f"{TURNS_PREFIX}>", ignore_deletes=True, inactive_threshold=WATCH_IDLE_S)
        out: list[tuple[str, SessionTurns, int]] = []
        try:
            async for entry in watcher:
                if entry is None:
                    break
                if not entry.value:
                    continue
                try:
                    out.append((entry.key, decode(entry.value), entry.revision))
                except msgspec.DecodeError as exc:  # not ours to end: left alone, said once a sweep
                    log.warning("%s %s: not a session's turns (%s); skipped", STATE_BUCKET, entry.key, exc)
        finally:
            await watcher.stop()  # type: ignore[no-untyped-call]
        return out

    async def replace(self, key: str, state: SessionTurns, revision: int) -> int | None:
        try:
            return await self.kv.update(key, encode(state), last=revision)
        except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.KeyDeletedError):
            return None
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code in (10071, 10164):  # wrong last sequence
                return None
            raise

    async def forget(self, key: str, revision: int) -> bool:
        try:
            await self.kv.delete(key, last=revision)
        except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.KeyDeletedError):
            return False
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code in (10071, 10164):
                return False
            raise
        return True
