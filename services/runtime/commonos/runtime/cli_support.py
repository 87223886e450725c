"""What every `cos` command that talks to the system does first: find it, and connect to its NATS and PostgreSQL.

The URLs come from COS_NATS_URL / COS_DATABASE_URL, else from the `cos up` running in COS_DATA_DIR
(`commonos.runtime.system.endpoints`). A command does not wait for a server that is gone: it tries
`CONNECT_ATTEMPTS` times, each attempt waiting at most `CONNECT_TIMEOUT_S` for an answer, then fails with one
line naming the server and its address without the password (the URL `cos up` writes carries one), never a
traceback. Once connected, a NATS connection that drops is given `RECONNECT_ATTEMPTS` more tries (a server
restarting) before the command fails; only a command that keeps running (`cos import --watch`) waits for ever.

What a command prints that it did not write (a title, a path, a model name, a reason, a server's answer)
goes through `shown` (plain text) or `as_text` (for rich): printed as written, rich markup in it never read as
markup, and the terminal control characters in it shown as escapes (`\\x1b`) instead of sent to the terminal.

Importing this module loads neither nats-py, asyncpg nor rich: a command that does not talk to NATS stays quick.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Final

from commonos.runtime.args import CliError
from commonos.runtime.settings import Settings
from commonos.runtime.system import endpoints

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.js import JetStreamContext
    from rich.text import Text

__all__ = ["as_text", "cli_connect", "cli_database", "cli_jetstream", "cli_settings", "server_address", "shown"]

#: How long one attempt of a command to reach a server waits for its answer, in seconds.
CONNECT_TIMEOUT_S = 2
#: How many times a command tries to reach NATS before it says that NATS cannot be reached (half a second apart:
#: a server that refuses connections is given up on in about a second, one that does not answer in about 7).
CONNECT_ATTEMPTS = 3
#: How many times a command's NATS connection that dropped tries to come back before the command fails.
RECONNECT_ATTEMPTS = 10

#: What a terminal acts on instead of showing: C0 controls but newline and tab, DEL and C1 controls.
_CONTROL: Final = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def shown(value: object) -> str:
    """`value` as text a terminal shows as it is: each control character but newline and tab (ESC, BEL, CR,
    backspace, DEL, the C1 controls) written as its escape (`\\x1b`), so none moves the cursor, clears the
    screen, sets the window title or makes a link."""
    return _CONTROL.sub(lambda found: f"\\x{ord(found.group()):02x}", str(value))


def as_text(value: object, style: str = "") -> Text:
    """`value` for rich (a table cell or title, `console.print`): `shown`, and never read as markup, emoji
    codes or highlighted: `[/x]` prints as `[/x]`. Text we write ourselves may use markup; text we did not,
    never does."""
    from rich.text import Text

    return Text(shown(value), style=style)


def cli_settings(
    settings: Settings | None = None, *, nats: bool = True, database: bool = True, http_port: int = 0
) -> Settings:
    """`settings` (default: from COS_*) with the URLs of the system to talk to.

    The URLs the command needs (`nats`, `database`) come from COS_NATS_URL / COS_DATABASE_URL, else from
    the `cos up` running in COS_DATA_DIR: a `CliError` when neither has one. Once the running system is
    looked up, a URL the command does not need is filled in from it too.
    """
    if settings is None:
        settings = Settings.from_env(http_port=http_port)
    if (not nats or settings.nats_url) and (not database or settings.database_url):
        return settings
    found = endpoints(settings)
    return dataclasses.replace(
        settings,
        nats_url=settings.nats_url or found.nats_url,
        database_url=settings.database_url or found.database_url,
    )


async def _quiet(*args: Any) -> None:
    return None


def server_address(url: str) -> str:
    """Where a server is, without the login: `nats://127.0.0.1:4222` for `nats://admin:secret@127.0.0.1:4222`
    (each of a comma-separated list)."""
    from urllib.parse import urlsplit

    shown = []
    for one in url.split(","):
        parts = urlsplit(one.strip())
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        try:
            port = f":{parts.port}" if parts.port is not None else ""
        except ValueError:
            port = ""
        shown.append(f"{parts.scheme}://{host}{port}" if parts.scheme else host + port)
    return ",".join(shown)


async def cli_connect(
    settings: Settings, name: str, *, quiet: bool = False, keep_reconnecting: bool = False, **overrides: Any
) -> Client:
    """A command's NATS connection (`commonos.runtime.nats.connect` with a command's limits: `CONNECT_ATTEMPTS`
    tries of `CONNECT_TIMEOUT_S`, then `RECONNECT_ATTEMPTS` after a drop, for ever with `keep_reconnecting`),
    silent about the attempts that fail before it connects and about the disconnect its own close causes;
    with `quiet`, silent about connection errors later too (the command reports what fails).

    Raises `CliError`, naming NATS and its address, when NATS cannot be reached.
    """
    import logging

    import nats.errors

    from commonos.runtime import nats as cos_nats

    connected = False

    async def on_error(exc: Exception) -> None:
        if connected and not quiet:
            logging.getLogger(cos_nats.__name__).warning("nats: %s", exc)

    options: dict[str, Any] = {
        "disconnected_cb": _quiet,
        "error_cb": on_error,
        "connect_timeout": CONNECT_TIMEOUT_S,
        # nats-py counts the attempts after the first; 0 would be without end, as -1 is.
        "max_reconnect_attempts": CONNECT_ATTEMPTS - 1,
    }
    options.update(overrides)
    assert settings.nats_url is not None
    try:
        nc = await cos_nats.connect(settings, name, **options)
    except (nats.errors.Error, OSError, TimeoutError) as exc:
        if isinstance(exc, nats.errors.NoServersError):
            why = f"no answer after {CONNECT_ATTEMPTS} attempts"
        elif isinstance(exc, TimeoutError | nats.errors.TimeoutError):
            why = "no answer"
        else:
            why = str(exc) or type(exc).__name__
        raise CliError(f"cannot reach NATS at {server_address(settings.nats_url)} (COS_NATS_URL): {why}") from None
    connected = True
    # Read at each reconnect (a successful connect starts the count again).
    nc.options["max_reconnect_attempts"] = -1 if keep_reconnecting else RECONNECT_ATTEMPTS
    return nc


@contextlib.asynccontextmanager
async def cli_database(dsn: str, variable: str = "COS_DATABASE_URL") -> AsyncIterator[Any]:
    """A command's PostgreSQL connection (`commonos.runtime.postgres.connect`), closed after; `CliError`, naming
    PostgreSQL, its address and the `variable` it came from, when it does not answer within `CONNECT_TIMEOUT_S` or
    refuses the login."""
    import asyncpg

    from commonos.runtime.postgres import connect

    try:
        conn = await connect(dsn, timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
        raise CliError(f"cannot reach PostgreSQL at {server_address(dsn)} ({variable}): {why}") from None
    try:
        yield conn
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def cli_jetstream(
    settings: Settings, name: str, *, ensure_streams: bool = True, **overrides: Any
) -> AsyncIterator[tuple[Client, JetStreamContext]]:
    """`cli_connect`, its JetStream context with the streams ensured (unless told not to), closed after."""
    from commonos.runtime import nats as cos_nats

    nc = await cli_connect(settings, name, **overrides)
    try:
        js = nc.jetstream()
        if ensure_streams:
            await cos_nats.ensure_streams(js, settings.stream_replicas)
        yield nc, js
    finally:
        await nc.close()
