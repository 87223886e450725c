"""API keys: a service calls the JSON API with `Authorization: Bearer cosk_…` instead of signing in.

    cos console key create --name billing-bot --role analyst --profile acme   # prints the key, once
    cos console key list
    cos console key revoke 3f9c0a1b2d4e

* **Stored hashed.** The table `console_api_keys` keeps, per key, its id, name, role, profiles, database role
  and the SHA-256 of the key, never the key. A key is `cosk_` and 256 random bits (43 characters of base64url):
  nobody can find it from its hash, however fast the hash is, so a slow password hash (argon2: 50 ms and
  64 MiB, as for the people's passwords, whose entropy is low) would only make every API request slow. Not a
  keyed hash (an HMAC with COS_CONSOLE_SECRET) either: keys are made by the command line, which does not have
  the console's secret, and must outlive a change of it.
* **Refused at once when revoked.** Every request with a key looks its hash up on the primary (a unique index),
  the way a sign-out is looked up (sign_outs.py): `cos console key revoke` is refused by every running console
  of the database from its next request. When the database cannot answer, the request is 503, never served.
* **Scoped as a person of its role.** An operator key reads everything; an analyst or approver key reads as its
  database role (`--pg-role`, default its name in lower case with `_` for other characters) under the
  row-level security of deploy/postgres/roles.sql (that role's grants in `analyst_grants` decide its profiles;
  `key create` prints the statements, as `cos console user add` does); an approver key decides the approvals
  of its `--profile`s. In the console it is the person `key:<name>` (approvals it decides: `web:key:<name>`).
* **No CSRF token.** A browser never adds an `Authorization` header by itself, so another site's page cannot
  make it send a key: a bearer request needs no CSRF token and no Origin check (cookies keep both).
* **The JSON API only** (`/api/…`, not the chat's WebSocket): elsewhere the header is ignored.

The console makes the table when it starts (`API_KEYS.ddl()`, with its sign-outs, under the schema lock), and so
does `cos console key` when it is not there yet; the console's role owns it (deploy/postgres/roles.sql).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol

import asyncpg
import msgspec

from commonos.console.sign_outs import ACQUIRE_TIMEOUT_S, UNAVAILABLE, unavailable
from commonos.console.users import Role, User, check_name, check_pg_role
from commonos.proto.errors import ConfigError
from commonos.proto.requests import APPROVER
from commonos.runtime.postgres import Conn, apply_schemas
from commonos.runtime.tables import CONSOLE, Table, one_of

#: Every key starts with it, so that a leaked one is recognised (secret scanners, logs).
KEY_PREFIX: Final = "cosk_"
#: The key: the prefix and 32 random bytes in base64url (43 characters, no padding).
KEY_SHAPE: Final = re.compile(r"cosk_[A-Za-z0-9_-]{43}")
_KEY_ID: Final = re.compile(r"[0-9a-f]{12}")
#: A key's last use is written at most this often (a read per request, a write per key a minute).
LAST_USED_EVERY_S: Final = 60.0


class ApiKeyRow(msgspec.Struct, frozen=True, kw_only=True):
    """A row of `console_api_keys`."""

    id: str
    name: str
    role: Role
    profiles: tuple[str, ...]
    #: The database role an analyst or approver key reads as; None for an operator key.
    pg_role: str | None
    #: The SHA-256 of the key, in hex.
    token_hash: str
    created_at: dt.datetime
    revoked_at: dt.datetime | None = None
    last_used_at: dt.datetime | None = None


API_KEYS: Final = Table(
    "console_api_keys",
    ApiKeyRow,
    owner=CONSOLE,
    details={"role": one_of("role", Role)},
    indexes={"console_api_keys_token_hash": "UNIQUE (token_hash)"},
    rebuilt=False,
    doc="The console's API keys (commonos.console.keys): the SHA-256 of each key, never the key.",
)

SCHEMA: Final = API_KEYS.ddl()

_COLUMNS: Final = "id, name, role, profiles, pg_role, token_hash, created_at, revoked_at, last_used_at"


class ApiKeyError(ConfigError):
    """A key that cannot be made or revoked as asked (the command line says why)."""


@dataclass(frozen=True)
class ApiKey:
    """A key as the console knows it (never the key itself)."""

    row: ApiKeyRow

    @property
    def id(self) -> str:
        return self.row.id

    @property
    def user(self) -> User:
        """The person the key acts as: `key:<name>`, its role, profiles and database role."""
        return User(f"key:{self.row.name}", self.row.role, self.row.profiles, self.row.pg_role)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def default_pg_role(name: str) -> str:
    """A key's database role when none is given: its name in lower case, other characters as `_`."""
    role = re.sub(r"[^a-z0-9_]", "_", name.lower())
    return role if re.match(r"[a-z_]", role) else f"key_{role}"


def new_key(name: str, role: Role, profiles: Sequence[str] = (), pg_role: str | None = None) -> tuple[ApiKeyRow, str]:
    """A new key's row and the key (to be shown once): ApiKeyError for a name or role that cannot be used."""
    try:
        check_name(name)
        pg_role = None if role is Role.OPERATOR else check_pg_role(pg_role or default_pg_role(name))
    except ConfigError as exc:
        raise ApiKeyError(str(exc)) from None
    if role is Role.APPROVER and not profiles:
        raise ApiKeyError("an approver key decides for the profiles it is given: give --profile")
    if role is Role.APPROVER and not APPROVER.fullmatch(f"web:key:{name}"):
        raise ApiKeyError(f"{name!r} cannot name an approver (no '.'): give the key another name")
    token = new_token()
    row = ApiKeyRow(
        id=secrets.token_hex(6),
        name=name,
        role=role,
        profiles=tuple(dict.fromkeys(profiles)),
        pg_role=pg_role,
        token_hash=token_hash(token),
        created_at=dt.datetime.now(dt.UTC),
    )
    return row, token


# --- what `cos console key` does, on a connection of its own ----------------------------------------------


async def ensure_table(conn: asyncpg.Connection) -> None:
    """Make the table when no console has made it yet (and only then: the command's database role may not be
    allowed to create tables)."""
    if await conn.fetchval("SELECT to_regclass('public.console_api_keys') IS NULL"):
        await apply_schemas(conn, [SCHEMA])


async def create(conn: Conn, row: ApiKeyRow) -> None:
    await conn.execute(API_KEYS.insert_one(), *API_KEYS.row_args(row))


async def list_keys(conn: Conn, *, revoked: bool = False) -> list[ApiKey]:
    where = "" if revoked else " WHERE revoked_at IS NULL"
    rows = await conn.fetch(f"SELECT {_COLUMNS} FROM console_api_keys{where} ORDER BY created_at, id")
    return [ApiKey(_row(r)) for r in rows]


async def revoke(conn: Conn, key_id: str) -> ApiKey:
    """Revoke the key `key_id` (refused from the next request on); ApiKeyError when there is none, or it was
    revoked already."""
    if not _KEY_ID.fullmatch(key_id):
        raise ApiKeyError(f"{key_id!r} is not a key id (12 hex digits: cos console key list)")
    found = await conn.fetchrow(
        f"UPDATE console_api_keys SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL RETURNING {_COLUMNS}",
        key_id,
    )
    if found is not None:
        return ApiKey(_row(found))
    if await conn.fetchval("SELECT true FROM console_api_keys WHERE id = $1", key_id):
        raise ApiKeyError(f"key {key_id} was revoked already")
    raise ApiKeyError(f"no key {key_id} (cos console key list)")


def _row(record: asyncpg.Record) -> ApiKeyRow:
    return ApiKeyRow(
        id=record["id"],
        name=record["name"],
        role=Role(record["role"]),
        profiles=tuple(record["profiles"]),
        pg_role=record["pg_role"],
        token_hash=record["token_hash"],
        created_at=record["created_at"],
        revoked_at=record["revoked_at"],
        last_used_at=record["last_used_at"],
    )


# --- what the console asks, on every request with a key ----------------------------------------------------


class ApiKeys(Protocol):
    async def find(self, token: str) -> ApiKey | None:
        """The key `token` is, unless it is unknown or revoked; DatabaseUnavailable when that cannot be said."""
        ...


class NoApiKeys:
    """A console without a database knows no key."""

    async def find(self, token: str) -> ApiKey | None:
        return None


class PgApiKeys:
    """The keys of the database, asked on the primary (where `cos console key revoke` writes)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def find(self, token: str) -> ApiKey | None:
        if not KEY_SHAPE.fullmatch(token):
            return None  # not worth a query
        try:
            async with self.pool.acquire(timeout=ACQUIRE_TIMEOUT_S) as conn:
                record = await conn.fetchrow(
                    f"SELECT {_COLUMNS} FROM console_api_keys WHERE token_hash = $1 AND revoked_at IS NULL",
                    token_hash(token),
                )
                if record is None:
                    return None
                key = ApiKey(_row(record))
                used = key.row.last_used_at
                if used is None or (dt.datetime.now(dt.UTC) - used).total_seconds() > LAST_USED_EVERY_S:
                    await conn.execute("UPDATE console_api_keys SET last_used_at = now() WHERE id = $1", key.id)
        except UNAVAILABLE as exc:
            raise unavailable(exc) from None
        return key
