"""What every `cos` command that talks to the system does first: find it, and connect to its NATS.

The URLs come from COS_NATS_URL / COS_DATABASE_URL, else from the `cos up` running in COS_DATA_DIR
(`commonos.runtime.system.endpoints`); a command that cannot reach NATS fails with one line, never a
traceback, and without repeating the URL (the one `cos up` writes carries a password).

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

__all__ = ["as_text", "cli_connect", "cli_jetstream", "cli_settings", "shown"]

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


async def cli_connect(settings: Settings, name: str, *, quiet: bool = False, **overrides: Any) -> Client:
    """A command's NATS connection (`commonos.runtime.nats.connect`), silent about the disconnect its own
    close causes; with `quiet`, silent about connection errors too (the command reports what fails).

    Raises `CliError` when NATS cannot be reached.
    """
    import nats.errors

    from commonos.runtime import nats as cos_nats

    options: dict[str, Any] = {"disconnected_cb": _quiet}
    if quiet:
        options["error_cb"] = _quiet
    options.update(overrides)
    try:
        return await cos_nats.connect(settings, name, **options)
    except (nats.errors.Error, OSError, TimeoutError) as exc:
        raise CliError(f"cannot reach NATS (COS_NATS_URL): {exc}") from None


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
