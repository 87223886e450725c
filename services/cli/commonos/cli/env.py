"""`cos env`: how to connect to the running system's NATS as one of its users, as shell `export` lines.

    eval "$(cos env --user subscriber)"
    python deploy/examples/subscriber.py --durable my-service --idle-exit 5

It reads the system `cos up` runs in COS_DATA_DIR (default `.cos`): the nats-server's address from
state.json and the user's password from COS_DATA_DIR/secrets (made by `cos up` for every user of
deploy/nats/auth.conf). It prints COS_NATS_URL (without credentials), COS_NATS_USER and COS_NATS_PASSWORD
(or, with --password-file, COS_NATS_PASSWORD_FILE). With no system running it says so in one line and
exits 1. On compose and Kubernetes the passwords are the operator's (deploy/SUBSCRIBERS.md says where).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from commonos.runtime.args import CliError
from commonos.runtime.settings import Settings
from commonos.runtime.system import SECRETS_DIR, running_owner, secret_path, state_path


def nats_address(url: str) -> str:
    """Every server of a NATS URL list, without the user and password `cos up` puts in its own."""
    out = []
    for part in url.split(","):
        parts = urlsplit(part.strip())
        host = parts.hostname or ""
        netloc = f"[{host}]" if ":" in host else host
        if parts.port is not None:
            netloc += f":{parts.port}"
        out.append(urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment)))
    return ",".join(out)


def users_of(settings: Settings) -> list[str]:
    """The NATS users `cos up` made a password for (the users of deploy/nats/auth.conf)."""
    folder = settings.data_dir.resolve() / SECRETS_DIR
    try:
        names = sorted(p.name for p in folder.iterdir())
    except OSError:
        return []
    return [n.removeprefix("nats-").removesuffix(".password") for n in names if n.startswith("nats-")]


def env_lines(settings: Settings, user: str, *, password_file: bool = False) -> list[str]:
    """The `export` lines for `user`; a `CliError` saying why when there are none to give."""
    data = settings.data_dir.resolve()
    if running_owner(settings) is None:
        raise CliError(f"no system is running in {data} (start one with `cos up`, or set COS_DATA_DIR to its folder)")
    state: dict[str, Any] = json.loads(state_path(settings).read_text())
    url = nats_address(str(state["nats_url"]))
    path = secret_path(settings, f"nats-{user}")
    lines = [f"export COS_NATS_URL={shlex.quote(url)}", f"export COS_NATS_USER={shlex.quote(user)}"]
    try:
        password = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        known = users_of(settings)
        if not known:
            raise CliError(
                f"the system in {data} runs on a NATS server of its own configuration ({url}), whose passwords "
                "are its operator's: ask them for the user's password"
            ) from None
        raise CliError(f"no NATS user {user!r} in {data} (its users: {', '.join(known)})") from None
    if password_file:
        lines.append(f"export COS_NATS_PASSWORD_FILE={shlex.quote(str(Path(path)))}")
        lines.append("unset COS_NATS_PASSWORD")
    else:
        lines.append(f"export COS_NATS_PASSWORD={shlex.quote(password)}")
        lines.append("unset COS_NATS_PASSWORD_FILE")
    return lines


def _env(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    try:
        lines = env_lines(settings, args.user, password_file=args.password_file)
    except CliError as exc:
        print(f"cos: error: {exc}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


def register(sub: Any) -> None:
    env = sub.add_parser(
        "env",
        help='print how to connect to the running system\'s NATS (eval "$(cos env --user subscriber)")',
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    env.add_argument("--user", default="subscriber", help="the NATS user (default: subscriber)")
    env.add_argument(
        "--password-file",
        action="store_true",
        help="point COS_NATS_PASSWORD_FILE at the password's file instead of printing the password",
    )
    env.set_defaults(handler=_env)
