"""cos console: serve the web console, and write its people file.

    cos console serve [--host H] [--port 8470] [--users FILE]
    cos console user add NAME --role operator|analyst|approver [--profile P ...] [--pg-role ROLE] [--password-stdin]
    cos console user list

The people file is COS_CONSOLE_USERS (default config/console-users.toml). An analyst (or approver) reads as a
PostgreSQL role (--pg-role, default NAME) that is a member of cos_analyst, granted its profiles in
analyst_grants, and that the console's own database role (cos_console, deploy/postgres) may SET ROLE to.
"cos console user add" prints these statements for the person it adds:

    CREATE ROLE alice NOLOGIN IN ROLE cos_analyst;  GRANT alice TO cos_console;
    INSERT INTO analyst_grants (role_name, profile_id) VALUES ('alice', 'acme');
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from commonos.runtime.args import CliError, command_group

if TYPE_CHECKING:
    import asyncpg

_T = TypeVar("_T")


def _serve(args: argparse.Namespace) -> int:
    overrides = {
        "COS_CONSOLE_HOST": args.host,
        "COS_CONSOLE_PORT": None if args.port is None else str(args.port),
        "COS_CONSOLE_USERS": args.users,
    }
    for name, value in overrides.items():
        if value is not None:
            os.environ[name] = value
    from commonos.console.service import main

    return main()


def _users_file(args: argparse.Namespace) -> Path:
    from commonos.console.settings import DEFAULT_USERS_FILE

    return Path(args.users or os.environ.get("COS_CONSOLE_USERS") or DEFAULT_USERS_FILE).expanduser()


def _user_add(args: argparse.Namespace) -> int:
    from commonos.console.users import Role, User, add_user, check_name, check_pg_role, hash_password
    from commonos.proto.errors import ConfigError

    try:
        check_name(args.name)
        if args.pg_role:
            check_pg_role(args.pg_role)
        elif args.role != "operator":
            check_pg_role(args.name)
    except ConfigError as exc:
        raise CliError(f"{exc}" + ("" if args.pg_role else " (give --pg-role)")) from None
    if args.no_password:
        password = None
    elif args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = getpass.getpass(f"password for {args.name}: ")
        if password != getpass.getpass("again: "):
            raise CliError("the passwords differ")
    if password is not None and len(password) < 8:
        raise CliError("a password needs at least 8 characters")
    user = User(
        name=args.name,
        role=Role(args.role),
        profiles=tuple(dict.fromkeys(args.profile or ())),
        pg_role=args.pg_role,
        password_hash=None if password is None else hash_password(password),
    )
    path = _users_file(args)
    try:
        replaced = add_user(path, user)
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    print(f"{'replaced' if replaced else 'added'} {user.name} ({user.role.value}) in {path}")
    if user.db_role is not None:
        print(database_steps(user.db_role, user.profiles))
    return 0


def database_steps(role: str, profiles: tuple[str, ...] = ()) -> str:
    """What a superuser runs once in the CommonOS database so that the console may read as `role` (row-level
    security of deploy/postgres/roles.sql): the role in cos_analyst, the console's login a member of it, and
    the profiles it sees."""
    granted = profiles or ("<profile>",)
    values = ", ".join(f"('{role}', '{p}')" for p in granted)
    return "\n".join(
        [
            f"The console reads for this person as database role {role}; once, as a superuser of the database:",
            f"  CREATE ROLE {role} NOLOGIN IN ROLE cos_analyst;   -- unless it exists",
            f"  GRANT {role} TO cos_console;   -- the console's login (not needed for a superuser: cos up)",
            f"  INSERT INTO analyst_grants (role_name, profile_id) VALUES {values};",
        ]
    )


def _user_list(args: argparse.Namespace) -> int:
    from commonos.console.users import parse_users
    from commonos.proto.errors import ConfigError

    path = _users_file(args)
    if not path.exists():
        print(f"no users file at {path} (cos console user add NAME --role operator)")
        return 0
    try:
        users = parse_users(path.read_text(encoding="utf-8"), str(path))
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    for u in users.values():
        extra = f" profiles={','.join(u.profiles)}" if u.profiles else ""
        extra += f" pg_role={u.db_role}" if u.db_role else ""
        extra += "" if u.password_hash else " (proxy sign-in only)"
        print(f"{u.name}  {u.role.value}{extra}")
    return 0


def _database_url() -> str:
    """COS_DATABASE_URL, else the running `cos up`'s: where the console keeps its API keys."""
    from commonos.runtime.cli_support import cli_settings

    url = cli_settings(nats=False).database_url
    if not url:
        raise CliError("no database: set COS_DATABASE_URL (the console's) or start `cos up`")
    return url


def _with_keys(work: Callable[[asyncpg.Connection], Awaitable[_T]]) -> _T:
    """Run `work` on a connection to the console's database, its API keys' table made when missing; a database
    that refuses or cannot be reached is one line."""
    import asyncpg

    from commonos.console.keys import ensure_table
    from commonos.console.sign_outs import UNAVAILABLE
    from commonos.runtime.postgres import connect

    url = _database_url()

    async def run() -> _T:
        conn = await connect(url, timeout=10)
        try:
            await ensure_table(conn)
            return await work(conn)
        finally:
            await conn.close()

    try:
        return asyncio.run(run())
    except asyncpg.InsufficientPrivilegeError as exc:
        raise CliError(f"{exc} (run it as the console's database role, cos_console, or a superuser)") from None
    except (asyncpg.PostgresError, *UNAVAILABLE) as exc:
        raise CliError(f"the console's database: {str(exc) or type(exc).__name__}") from None


def _key_create(args: argparse.Namespace) -> int:
    from commonos.console.keys import ApiKeyError, create, new_key
    from commonos.console.users import Role

    try:
        row, token = new_key(args.name, Role(args.role), args.profile or (), args.pg_role)
    except ApiKeyError as exc:
        raise CliError(str(exc)) from None

    async def work(conn: asyncpg.Connection) -> None:
        await create(conn, row)

    _with_keys(work)
    profiles = f", profiles {', '.join(row.profiles)}" if row.profiles else ""
    print(
        f"created API key {row.id} {row.name} ({row.role.value}{profiles}). It is shown this once, below; send it "
        "as `Authorization: Bearer <key>` to /api/…; `cos console key revoke "
        f"{row.id}` ends it.",
        file=sys.stderr,
    )
    if row.pg_role is not None:
        print(database_steps(row.pg_role, row.profiles).replace("this person", "this key"), file=sys.stderr)
    # Alone on standard output: `KEY=$(cos console key create ...)`.
    print(token)
    return 0


def _key_list(args: argparse.Namespace) -> int:
    from commonos.console.keys import ApiKey, list_keys

    async def work(conn: asyncpg.Connection) -> list[ApiKey]:
        return await list_keys(conn, revoked=args.all)

    keys = _with_keys(work)
    if not keys:
        print("no API keys (cos console key create --name NAME --role operator|analyst|approver)")
    for key in keys:
        row = key.row
        extra = f" profiles={','.join(row.profiles)}" if row.profiles else ""
        extra += f" pg_role={row.pg_role}" if row.pg_role else ""
        extra += f" created={row.created_at.isoformat(timespec='seconds')}"
        extra += f" last_used={row.last_used_at.isoformat(timespec='seconds')}" if row.last_used_at else " never used"
        extra += f" REVOKED {row.revoked_at.isoformat(timespec='seconds')}" if row.revoked_at else ""
        print(f"{row.id}  {row.name}  {row.role.value}{extra}")
    return 0


def _key_revoke(args: argparse.Namespace) -> int:
    from commonos.console.keys import ApiKey, ApiKeyError, revoke

    async def work(conn: asyncpg.Connection) -> ApiKey:
        return await revoke(conn, args.id)

    try:
        key = _with_keys(work)
    except ApiKeyError as exc:
        raise CliError(str(exc)) from None
    print(f"revoked API key {key.id} {key.row.name}: refused from now on, by every console of the database")
    return 0


def _register_keys(console_sub: Any) -> None:
    key_sub = command_group(
        console_sub, "key", "API keys for the JSON API: create, list, revoke (docs/console.md)", metavar="ACTION"
    )
    create = key_sub.add_parser(
        "create",
        help="make an API key and print it (once)",
        description="Make an API key for the JSON API (`Authorization: Bearer <key>`), acting as a person of ROLE "
        "would: an analyst or approver key reads as its database role (--pg-role, default: NAME in lower case with "
        "_ for other characters) under row-level security. Only its SHA-256 is stored; the key is printed on "
        "standard output, this once.",
    )
    create.add_argument("--name", required=True, help="what the key is for (billing-bot)")
    create.add_argument("--role", required=True, choices=("operator", "analyst", "approver"))
    create.add_argument(
        "--profile",
        action="append",
        type=_profile,
        help="a profile of the key (repeat for more): an approver key decides for them; an analyst key's are "
        "granted to its database role (the statements are printed)",
    )
    create.add_argument("--pg-role", help="the database role an analyst or approver key reads as")
    create.set_defaults(handler=_key_create)
    lst = key_sub.add_parser("list", help="the keys (never the keys themselves): id, name, role, last use")
    lst.add_argument("--all", action="store_true", help="revoked keys too")
    lst.set_defaults(handler=_key_list)
    rev = key_sub.add_parser("revoke", help="end a key at once, for every console of the database")
    rev.add_argument("id", help="the key's id (cos console key list)")
    rev.set_defaults(handler=_key_revoke)


def _openapi(args: argparse.Namespace) -> int:
    from commonos.console.openapi import export

    print(f"wrote {export(args.path)}")
    return 0


def _register_openapi(console_sub: Any) -> None:
    from commonos.console.openapi import EXPORTED

    doc = console_sub.add_parser(
        "openapi",
        help=f"write the JSON API's OpenAPI document (default: {EXPORTED}; `make schema`)",
        description="Write the OpenAPI document a console serves at /api/openapi.json, without starting one.",
    )
    doc.add_argument("path", nargs="?", type=Path, default=EXPORTED)
    doc.set_defaults(handler=_openapi)


def _profile(raw: str) -> str:
    from commonos.proto.tags import InvalidProfileId, check_profile_id

    try:
        return check_profile_id(raw)
    except InvalidProfileId as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(sub: Any) -> None:
    # The module's docstring is `cos console --help`'s text as printed: plain text, no reStructuredText.
    console_sub = command_group(
        sub,
        "console",
        "the web console: sessions, live turns, chat, approvals, costs (serve), its people (user)",
        __doc__,
    )
    serve = console_sub.add_parser(
        "serve",
        help="run the web console in the foreground",
        description="Serve the console and its JSON API (/api, /api/openapi.json) with /metrics and /healthz. "
        "Options override their COS_CONSOLE_* variables.",
    )
    serve.add_argument("--host", help="address to listen on (COS_CONSOLE_HOST, default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (COS_CONSOLE_PORT, default 8470)")
    serve.add_argument("--users", help="the people file (COS_CONSOLE_USERS, default config/console-users.toml)")
    serve.set_defaults(handler=_serve)

    user_sub = command_group(console_sub, "user", "add or list the people who may sign in", metavar="ACTION")
    add = user_sub.add_parser(
        "add",
        help="add a person (or replace one of that name), asking for the password",
        description="Write NAME into the people file with an argon2id hash of the password (asked twice, or one "
        "line of standard input with --password-stdin).",
    )
    add.add_argument("name")
    add.add_argument("--role", required=True, choices=("operator", "analyst", "approver"))
    add.add_argument(
        "--profile", action="append", type=_profile, help="a profile an approver decides for (repeat for more)"
    )
    add.add_argument("--pg-role", help="the database role an analyst or approver reads as (default: NAME)")
    add.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    add.add_argument(
        "--no-password", action="store_true", help="no password: signs in only through the trusted proxy header"
    )
    add.add_argument("--users", help="the people file (COS_CONSOLE_USERS, default config/console-users.toml)")
    add.set_defaults(handler=_user_add)
    lst = user_sub.add_parser("list", help="the people in the file (never their hashes)")
    lst.add_argument("--users", help="the people file (COS_CONSOLE_USERS, default config/console-users.toml)")
    lst.set_defaults(handler=_user_list)
    _register_keys(console_sub)
    _register_openapi(console_sub)


__all__ = ["register"]
