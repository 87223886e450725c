"""The people who may sign in: a TOML file of `[[user]]` tables, passwords hashed with argon2id.

    [[user]]
    name = "alice"
    password_hash = "$argon2id$v=19$..."   # `cos console user add alice --role analyst --profile acme`
    role = "analyst"                       # operator | analyst | approver
    profiles = ["acme"]                    # the profiles an approver decides for (an analyst's are granted
                                           # in PostgreSQL: analyst_grants)
    pg_role = "alice"                      # the database role an analyst or approver reads as (default: name)

Operators read with the console's own database role and see everything. Everyone else reads inside a
transaction that has done `SET LOCAL ROLE <pg_role>`: PostgreSQL's row-level security (deploy/postgres/
roles.sql) decides what they see. A person signed in through the trusted proxy header must be listed here
too (without a password_hash): the file says what their role is.
"""

from __future__ import annotations

import enum
import os
import re
import tempfile
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from commonos.proto.errors import ConfigError

_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}")
#: A PostgreSQL role name the console may `SET ROLE` to (quoted when used; no odd characters at all).
_PG_ROLE: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_PROFILE: Final = re.compile(r"[a-z0-9_-]{1,64}")

_hasher = PasswordHasher()
#: Verified against when the name is unknown, so that a wrong name costs as long as a wrong password.
_DUMMY_HASH: Final = _hasher.hash("not a password anyone has")


class Role(enum.StrEnum):
    OPERATOR = "operator"
    ANALYST = "analyst"
    APPROVER = "approver"


@dataclass(frozen=True)
class User:
    name: str
    role: Role
    profiles: tuple[str, ...] = ()
    pg_role: str | None = None
    password_hash: str | None = field(default=None, repr=False)

    @property
    def db_role(self) -> str | None:
        """The database role this person reads as; None for operators (the console's own role)."""
        if self.role is Role.OPERATOR:
            return None
        return self.pg_role or self.name

    @property
    def is_operator(self) -> bool:
        return self.role is Role.OPERATOR


def hash_password(password: str) -> str:
    return _hasher.hash(password)


def verify_password(user: User | None, password: str) -> bool:
    """True when `password` is `user`'s; as slow for an unknown user or one without a password."""
    stored = user.password_hash if user is not None and user.password_hash else _DUMMY_HASH
    try:
        ok = _hasher.verify(stored, password)
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False
    return ok and user is not None and bool(user.password_hash)


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ConfigError(f"{name!r} is not a user name (letters, digits, _ . @ -, at most 128)")
    return name


def check_pg_role(name: str) -> str:
    if not _PG_ROLE.fullmatch(name):
        raise ConfigError(f"{name!r} is not a database role name the console uses (a-z, 0-9, _)")
    return name


def _user(raw: object, where: str) -> User:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: a [[user]] table is expected")
    unknown = set(raw) - {"name", "password_hash", "role", "profiles", "pg_role"}
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    name = raw.get("name")
    if not isinstance(name, str):
        raise ConfigError(f"{where}: name is missing")
    check_name(name)
    try:
        role = Role(raw.get("role", ""))
    except ValueError:
        raise ConfigError(f"{where} ({name}): role must be operator, analyst or approver") from None
    profiles = raw.get("profiles", [])
    if not isinstance(profiles, list) or not all(isinstance(p, str) and _PROFILE.fullmatch(p) for p in profiles):
        raise ConfigError(f"{where} ({name}): profiles must be a list of profile ids")
    pg_role = raw.get("pg_role")
    if pg_role is not None:
        if not isinstance(pg_role, str):
            raise ConfigError(f"{where} ({name}): pg_role must be a string")
        check_pg_role(pg_role)
    elif role is not Role.OPERATOR and not _PG_ROLE.fullmatch(name):
        raise ConfigError(f"{where} ({name}): the name is no database role name: give pg_role")
    password_hash = raw.get("password_hash")
    if password_hash is not None and not (isinstance(password_hash, str) and password_hash.startswith("$argon2")):
        raise ConfigError(f"{where} ({name}): password_hash is not an argon2 hash (cos console user add)")
    return User(name, role, tuple(profiles), pg_role, password_hash)


def parse_users(text: str, where: str = "users file") -> dict[str, User]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    unknown = set(data) - {"user"}
    if unknown:
        raise ConfigError(f"{where}: unknown table(s) {', '.join(sorted(unknown))} (only [[user]])")
    raw_users = data.get("user", [])
    if not isinstance(raw_users, list):
        raise ConfigError(f"{where}: user must be an array of tables ([[user]])")
    users: dict[str, User] = {}
    for n, raw in enumerate(raw_users, 1):
        user = _user(raw, f"{where}, user {n}")
        if user.name in users:
            raise ConfigError(f"{where}: user {user.name!r} is listed twice")
        users[user.name] = user
    return users


class Users:
    """The users file, read again whenever it changes (so `cos console user add` needs no restart)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._users: dict[str, User] = {}

    def _load(self) -> dict[str, User]:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._stamp, self._users = None, {}
            return self._users
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            self._users = parse_users(self.path.read_text(encoding="utf-8"), str(self.path))
            self._stamp = stamp
        return self._users

    def get(self, name: str) -> User | None:
        return self._load().get(name)

    def all(self) -> list[User]:
        return list(self._load().values())


def _toml_string(value: str) -> str:
    out = value.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(c if c >= " " else f"\\u{ord(c):04x}" for c in out) + '"'


def render_users(users: Sequence[User]) -> str:
    lines = [
        "# People of the CommonOS console (cos console user add). Keep this file private: it holds password hashes."
    ]
    for u in users:
        lines += ["", "[[user]]", f"name = {_toml_string(u.name)}", f"role = {_toml_string(u.role.value)}"]
        if u.password_hash:
            lines.append(f"password_hash = {_toml_string(u.password_hash)}")
        if u.profiles:
            lines.append("profiles = [" + ", ".join(_toml_string(p) for p in u.profiles) + "]")
        if u.pg_role:
            lines.append(f"pg_role = {_toml_string(u.pg_role)}")
    return "\n".join(lines) + "\n"


def add_user(path: Path, user: User) -> bool:
    """Add `user` to the file, or replace the one of that name; True when it replaced one. Written
    atomically, readable by its owner only."""
    users = parse_users(path.read_text(encoding="utf-8"), str(path)) if path.exists() else {}
    replaced = user.name in users
    users[user.name] = user
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".console-users-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(render_users(list(users.values())))
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return replaced
