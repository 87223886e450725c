"""Bearer tokens of the OTLP gateway: one or more per profile, kept hashed in the NATS KV bucket COS_OTLP_TOKENS.

A token is 256 random bits (`cos_otlp_` + 43 base64url characters), printed once by `cos otlp token create`.
The bucket keeps only its SHA-256 (hex, the key) and `{profile_id, name, created_at}` (the value). A fast
hash is right here, unlike for passwords: argon2 or bcrypt slow down guessing a *low-entropy* secret from
its hash, but nobody guesses 2^256 possibilities whatever the hash costs, and a slow hash would cost every
OTLP request (exporters send many small ones) a few milliseconds of CPU for nothing.

Every gateway replica watches the bucket: a token created is usable, and a token revoked refused, as soon as
the KV change reaches it (well within a second on one server).

A token's profile need not exist yet: the journal-writer creates a profile row for the first session of an
unknown profile (as it does for the importer's), so telemetry may arrive before anyone ran the loop with that
profile. Events of a *deleted* profile are refused by the writers as any other producer's (tombstones), so
revoke a deleted profile's tokens (`cos otlp token revoke`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KeyValue

from commonos.proto.errors import DataError
from commonos.proto.tags import InvalidTag, parse_tag, parse_tags

log = logging.getLogger(__name__)

TOKENS_BUCKET: Final = "COS_OTLP_TOKENS"
TOKEN_PREFIX: Final = "cos_otlp_"
#: The realm of the gateway's WWW-Authenticate challenge.
REALM: Final = "commonos-otlp"


class TokenError(DataError):
    """A token command that cannot be done (a name taken, no such token): one line."""


@dataclass(frozen=True)
class TokenInfo:
    """What the bucket keeps of a token: never the token itself."""

    profile_id: str
    name: str
    created_at: str
    #: SHA-256 of the token (hex): the bucket's key.
    digest: str = ""
    #: Tags every event of the token carries (`cos otlp token create --tag`); a sender's other value of one
    #: of their keys is left out.
    tags: tuple[str, ...] = ()
    #: The tag keys the token's senders may set through resource attributes (`--tag-keys`); None: any the
    #: gateway maps (COS_OTLP_TAG_ATTRIBUTES and `cos.tag.<key>`).
    tag_keys: tuple[str, ...] | None = None

    def encode(self) -> bytes:
        data: dict[str, Any] = {"profile_id": self.profile_id, "name": self.name, "created_at": self.created_at}
        if self.tags:
            data["tags"] = list(self.tags)
        if self.tag_keys is not None:
            data["tag_keys"] = list(self.tag_keys)
        return json.dumps(data).encode()

    @classmethod
    def decode(cls, digest: str, raw: bytes) -> TokenInfo:
        data = json.loads(raw)
        keys = data.get("tag_keys")
        return cls(
            str(data["profile_id"]),
            str(data["name"]),
            str(data.get("created_at", "")),
            digest,
            tuple(parse_tags(str(t) for t in data.get("tags") or ())),
            None if keys is None else tuple(check_tag_key(str(k)) for k in keys),
        )


def check_tag_key(key: str) -> str:
    """`key` when it is a tag key (the tag rules: lower-case letters, digits, ``_`` and ``-``), else InvalidTag."""
    parse_tag(f"{key}:x")
    return key


def new_token() -> str:
    """A fresh token: 256 random bits."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (scheme case-insensitive), else None."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > 512:
        return None
    return token


async def tokens_bucket(js: JetStreamContext, replicas: int = 1, *, create: bool = True) -> KeyValue:
    """The bucket, created (history 1, file storage) if this user may and `create` is set."""
    try:
        return await js.key_value(TOKENS_BUCKET)
    except nats.js.errors.BucketNotFoundError:
        if not create:
            raise
    return await js.create_key_value(
        KeyValueConfig(
            bucket=TOKENS_BUCKET,
            history=1,
            storage=StorageType.FILE,
            replicas=replicas,
            description="OTLP gateway bearer tokens: key = SHA-256 of the token, value = its profile and name",
        )
    )


async def list_tokens(kv: KeyValue) -> list[TokenInfo]:
    try:
        keys = await kv.keys()
    except nats.js.errors.NoKeysError:
        return []
    out = []
    for key in keys:
        with contextlib.suppress(nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            entry = await kv.get(key)
            if entry.value:
                out.append(TokenInfo.decode(key, entry.value))
    return sorted(out, key=lambda t: (t.profile_id, t.created_at, t.name))


async def create_token(
    kv: KeyValue,
    profile_id: str,
    name: str | None = None,
    *,
    tags: Sequence[str] = (),
    tag_keys: Sequence[str] | None = None,
) -> tuple[str, TokenInfo]:
    """A new token of `profile_id` named `name` (default `<profile>-<8 hex>`), giving its events `tags` and
    letting its senders set the tag keys `tag_keys` only (None: any): (the token, what is stored)."""
    fixed = tuple(sorted(set(parse_tags(tags))))
    keys = None if tag_keys is None else tuple(sorted({check_tag_key(k) for k in tag_keys}))
    token = new_token()
    digest = token_digest(token)
    name = name or f"{profile_id}-{digest[:8]}"
    if any(t.name == name for t in await list_tokens(kv)):
        raise TokenError(f"a token named {name!r} exists already: choose another --name (or revoke it first)")
    info = TokenInfo(profile_id, name, datetime.now(UTC).isoformat(timespec="seconds"), digest, fixed, keys)
    await kv.create(digest, info.encode())
    return token, info


async def revoke_token(kv: KeyValue, name: str) -> list[TokenInfo]:
    """Revoke every token named `name` (or whose digest starts with it, 8 characters or more)."""
    chosen = [
        t for t in await list_tokens(kv) if t.name == name or (len(name) >= 8 and t.digest.startswith(name.lower()))
    ]
    if not chosen:
        raise TokenError(f"no token named {name!r} (cos otlp token list shows them)")
    for token in chosen:
        await kv.purge(token.digest)
    return chosen


class TokenIndex:
    """Every token of the bucket, kept current by a watch: `lookup` answers from memory.

    The watch is started again after every reconnection to NATS (an ordered consumer does not survive a
    restarted server), each time from the bucket's current contents.
    """

    def __init__(self) -> None:
        self._by_digest: dict[str, TokenInfo] = {}
        #: Set once the bucket's contents were loaded (the gateway is not ready before).
        self.loaded = asyncio.Event()

    def lookup(self, token: str | None) -> TokenInfo | None:
        if token is None:
            return None
        digest = token_digest(token)
        found = self._by_digest.get(digest)
        # The dict lookup is by hash already; compare once more in constant time for good measure.
        if found is None or not hmac.compare_digest(found.digest, digest):
            return None
        return found

    def profiles(self) -> set[str]:
        """The profiles that have a token."""
        return {info.profile_id for info in list(self._by_digest.values())}

    def put(self, info: TokenInfo) -> None:
        self._by_digest[info.digest] = info

    def __len__(self) -> int:
        return len(self._by_digest)

    async def run(self, nc: Client, kv: KeyValue, stop: asyncio.Event) -> None:
        """Follow the bucket until `stop`; errors (NATS away) are waited out and the watch started again."""
        while not stop.is_set():
            reconnects = nc.stats.get("reconnects", 0)
            watcher = None
            try:
                watcher = await kv.watchall()
                fresh: dict[str, TokenInfo] = {}
                initial = True
                while not stop.is_set() and nc.stats.get("reconnects", 0) == reconnects:
                    try:
                        entry = await watcher.updates(timeout=0.5)  # type: ignore[no-untyped-call]
                    except nats.errors.TimeoutError:
                        continue
                    if entry is None:  # the bucket's contents are all here: swap them in
                        if initial:
                            self._by_digest = fresh
                            initial = False
                            self.loaded.set()
                        continue
                    target = fresh if initial else self._by_digest
                    if entry.operation in ("DEL", "PURGE") or not entry.value:
                        target.pop(entry.key, None)
                        continue
                    try:
                        target[entry.key] = TokenInfo.decode(entry.key, entry.value)
                    except (ValueError, KeyError, TypeError, InvalidTag):
                        log.warning("COS_OTLP_TOKENS: the value of %s… is not a token's; ignored", entry.key[:8])
            except (nats.errors.Error, TimeoutError, OSError) as exc:
                log.warning("the token watch stopped (%s); starting it again", type(exc).__name__)
                await asyncio.sleep(0.5)
            finally:
                if watcher is not None:
                    with contextlib.suppress(Exception):
                        await watcher.stop()  # type: ignore[no-untyped-call]
