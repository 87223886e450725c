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
import getpass
import os
import sys
from pathlib import Path
from typing import Any

from commonos.runtime.args import CliError, command_group


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


__all__ = ["register"]
