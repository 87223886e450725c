"""`common.CallOrdinals` in the NATS KV bucket COS_OTLP_STATE, shared by every gateway replica.

One key per (vendor, session): `<vendor>.<SHA-256 of the session key, 32 hex>`; its value the fingerprints of
the session's calls in the order they were first seen (each as 16 hex of its SHA-256, a JSON list). A new
fingerprint is appended by compare-and-set on the key's revision, retried when another replica wrote first,
so replicas agree on every ordinal and a retried request (the same fingerprints) gets the same ones. The
session's turns (`begin_turn`, `turn_at`) are kept the same way under `<key>.turns`: `[turn key, start]`
pairs in the order they were begun, the latest MAX_TURNS of them.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any, Final

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KeyValue

from commonos.proto.errors import OperationalError

STATE_BUCKET: Final = "COS_OTLP_STATE"
#: Compare-and-set attempts before giving up (the request then fails with 503 and is retried).
MAX_ATTEMPTS: Final = 50
#: The latest turns of a session kept (a record older than all of them belongs to no known turn).
MAX_TURNS: Final = 100


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
                description="OTLP gateway: the calls of each Codex conversation, in order (their ordinals)",
            )
        )


def state_key(vendor: str, session_key: str) -> str:
    safe_vendor = "".join(c if c.isalnum() or c in "-_" else "_" for c in vendor) or "_"
    return f"{safe_vendor}.{hashlib.sha256(session_key.encode()).hexdigest()[:32]}"


def _short(fingerprint: str) -> str:
    return hashlib.sha256(fingerprint.encode()).hexdigest()[:16]


class KvOrdinals:
    """Ordinals and turns kept in COS_OTLP_STATE.

    The calls of a session only grow, so what this replica read of them is cached; its turns are read
    afresh at every `turn_at` (another replica may have begun a later one).
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
        data = json.dumps(value, separators=(",", ":")).encode()
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

    async def begin_turn(self, vendor: str, session_key: str, turn_key: str, started: datetime) -> None:
        key = state_key(vendor, session_key) + ".turns"
        for _ in range(MAX_ATTEMPTS):
            turns, revision = await self._read(key)
            if any(t[0] == turn_key for t in turns):
                return
            proposed = [*turns, [turn_key, started.isoformat()]][-self.max_turns :]
            if await self._write(key, proposed, revision):
                return
        raise OrdinalConflict(f"{vendor} session {session_key}: turn not recorded after {MAX_ATTEMPTS} attempts")

    async def turn_at(self, vendor: str, session_key: str, at: datetime) -> str | None:
        turns, _ = await self._read(state_key(vendor, session_key) + ".turns")
        # Insertion order breaks ties: of turns started at the same moment, the one begun last.
        started = [
            (moment, place, str(turn_key))
            for place, (turn_key, raw) in enumerate(turns)
            if (moment := datetime.fromisoformat(raw)) <= at
        ]
        return max(started)[2] if started else None
