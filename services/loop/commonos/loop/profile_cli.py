"""`cos profile list|delete|recreate`: the profiles the event stream and the profile folders know.

* `list` shows every profile with its state: `configured` (a folder in COS_PROFILES_DIR, not deleted),
  `folder missing` (published by a loop, not deleted, no folder any more), `imported` (published by an
  importer), `deleted` (who, when; a folder still there is named), with its sessions and imported
  sessions from PostgreSQL when it can be reached. Nothing here deletes anything on its own.
* `delete ID` publishes `profile_deleted`: every projection drops the profile's rows (sessions, turns,
  messages, tool calls, approvals, session graphs, memory) and refuses what arrives of it later; billing
  keeps what it was billed. On a terminal it asks first; elsewhere it needs `--yes`.
* `recreate ID` publishes `profile_upserted` for a deleted profile (tags from its folder's config, or
  `--tag`): a new profile under the same id, with nothing from before the deletion.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from commonos.loop.cli import _tag, _who
from commonos.proto.tags import InvalidProfileId, check_profile_id
from commonos.runtime.args import CliError, command_group
from commonos.runtime.cli_support import cli_connect, cli_settings
from commonos.runtime.settings import Settings

#: The states `cos profile list` shows.
CONFIGURED, FOLDER_MISSING, IMPORTED, DELETED = "configured", "folder missing", "imported", "deleted"
CLI_SOURCE = "urn:commonos:cli"


def _profile_id(raw: str) -> str:
    try:
        return check_profile_id(raw)
    except InvalidProfileId as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _folders(root: Path) -> set[str]:
    """The profile ids with a folder (holding a config.toml) under `root`."""
    from commonos.loop.profiles import CONFIG_FILE

    if not root.is_dir():
        return set()
    return {p.name for p in root.iterdir() if p.is_dir() and (p / CONFIG_FILE).is_file()}


async def _session_counts(dsn: str | None) -> tuple[dict[str, tuple[int, int]] | None, str | None]:
    """Sessions and imported sessions per profile, from PostgreSQL; None and why when it cannot say."""
    if not dsn:
        return None, "COS_DATABASE_URL is not set"
    import asyncpg

    try:
        conn = await asyncpg.connect(dsn, timeout=5)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        return None, f"PostgreSQL not reachable: {type(exc).__name__}"
    try:
        counts: dict[str, list[int]] = {}
        for column, sql in (
            (0, "SELECT profile_id, count(*) AS n FROM sessions GROUP BY profile_id"),
            (
                1,
                "SELECT profile_id, count(*) AS n FROM graph.sessions WHERE parent_session_id IS NULL "
                "AND profile_id IS NOT NULL GROUP BY profile_id",
            ),
        ):
            with contextlib.suppress(asyncpg.UndefinedTableError, asyncpg.InvalidSchemaNameError):
                for row in await conn.fetch(sql):
                    counts.setdefault(row["profile_id"], [0, 0])[column] = int(row["n"])
        return {p: (n[0], n[1]) for p, n in counts.items()}, None
    except (asyncpg.PostgresError, OSError) as exc:
        return None, f"PostgreSQL: {type(exc).__name__}: {exc}"
    finally:
        await conn.close()


async def _journal(settings: Settings, source: str | None = None) -> tuple[Any, Any]:
    from commonos.loop.nats_journal import SOURCE as JOURNAL_SOURCE
    from commonos.loop.nats_journal import NatsJournal
    from commonos.runtime import nats as cos_nats
    from commonos.runtime.publisher import EventPublisher

    nc = await cli_connect(settings, "cos-profile", quiet=True)
    js = nc.jetstream()
    await cos_nats.ensure_streams(js, settings.stream_replicas)
    publisher = EventPublisher(js, JOURNAL_SOURCE if source is None else source, nc=nc)
    return nc, NatsJournal(js, publisher)


# -- cos profile list ------------------------------------------------------------------------------


def _list(args: argparse.Namespace) -> int:
    from commonos.loop.event_journal import LOOP_SOURCE
    from commonos.runtime.lifecycle import run

    settings = cli_settings(database=False)
    root = settings.profiles_dir

    async def main() -> int:
        nc, journal = await _journal(settings)
        try:
            statuses = await journal.profile_statuses()
        finally:
            await nc.close()
        counts, why = await _session_counts(settings.database_url)
        folders = _folders(root)
        rows = []
        for profile_id in sorted(set(statuses) | folders):
            status = statuses.get(profile_id)
            deleted = status.deleted if status is not None else None
            has_folder = profile_id in folders
            if deleted is not None:
                state = DELETED
            elif has_folder:
                state = CONFIGURED
            elif status is not None and status.upserted_source == LOOP_SOURCE:
                state = FOLDER_MISSING
            else:
                state = IMPORTED
            sessions, imported = (counts or {}).get(profile_id, (0, 0))
            rows.append(
                {
                    "profile": profile_id,
                    "state": state,
                    "folder": str(root / profile_id) if has_folder or state == FOLDER_MISSING else None,
                    "folder_exists": has_folder,
                    "sessions": sessions if counts is not None else None,
                    "imported_sessions": imported if counts is not None else None,
                    "deleted_at": deleted.occurred_at.isoformat() if deleted is not None else None,
                    "deleted_by": deleted.deleted_by if deleted is not None else None,
                }
            )
        if args.format == "json":
            json.dump(rows, sys.stdout, indent=2)
            print()
        else:
            _print_table(rows)
        if why is not None and args.format != "json":
            print(f"sessions not counted: {why}", file=sys.stderr)
        return 0

    return run(main)


def _print_table(rows: list[dict[str, Any]]) -> None:
    def note(row: dict[str, Any]) -> str:
        if row["state"] == DELETED:
            text = f"deleted {row['deleted_at'][:19].replace('T', ' ')} UTC by {row['deleted_by']}"
            return text + (f"; its folder {row['folder']} is still there" if row["folder_exists"] else "")
        if row["state"] == FOLDER_MISSING:
            return f"no folder {row['folder']}"
        return ""

    def count(value: int | None) -> str:
        return "?" if value is None else str(value)

    table = [("PROFILE", "STATE", "SESSIONS", "IMPORTED", "NOTE")]
    table += [(r["profile"], r["state"], count(r["sessions"]), count(r["imported_sessions"]), note(r)) for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(4)]
    for line in table:
        print(("  ".join(cell.ljust(w) for cell, w in zip(line[:4], widths, strict=True)) + "  " + line[4]).rstrip())


# -- cos profile delete ------------------------------------------------------------------------------


def _delete(args: argparse.Namespace) -> int:
    from commonos.loop.profile_admin import ProfileAdminError, check_deleted_by, delete_profile
    from commonos.proto.profiles import describe_deletion
    from commonos.runtime.lifecycle import run

    profile_id: str = args.id
    by: str = args.by or _who()
    try:
        check_deleted_by(by)
    except ProfileAdminError as exc:
        raise CliError(f"--by: {exc}") from None
    settings = cli_settings(database=False)

    async def main() -> int:
        nc, journal = await _journal(settings, CLI_SOURCE)
        try:
            status = await journal.profile_status(profile_id)
            if status.deleted is not None:
                raise CliError(describe_deletion(status.deleted) + " already")
            if not status.known and not await journal.has_events(profile_id):
                raise CliError(f"no profile {profile_id!r} in the event stream")
            if not args.yes and not await _confirmed(profile_id, settings):
                print(f"profile {profile_id!r} not deleted", file=sys.stderr)
                return 1
            try:
                event = await delete_profile(journal, profile_id, by)
            except ProfileAdminError as exc:
                raise CliError(str(exc)) from None
        finally:
            await nc.close()
        print(f"deleted profile {profile_id!r} (event {event.event_id})")
        print(
            "every projection drops its sessions, turns, messages, tool calls, approvals, session graphs and memory, "
            "and refuses what arrives of it later; billing keeps what it was billed; the event stream keeps its history"
        )
        return 0

    return run(main)


async def _confirmed(profile_id: str, settings: Settings) -> bool:
    """Ask on the terminal; without one, `--yes` is required."""
    if not sys.stdin.isatty():
        raise CliError(f"profile {profile_id!r} not deleted: confirm with --yes (standard input is not a terminal)")
    counts, _ = await _session_counts(settings.database_url)
    sessions = ""
    if counts is not None:
        own, imported = counts.get(profile_id, (0, 0))
        sessions = f" with its {own} session(s) and {imported} imported session(s)"
    question = f"Delete profile {profile_id!r}{sessions}, and everything of them? [y/N] "
    print(question, end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline().strip().lower()
    return answer in ("y", "yes")


# -- cos profile recreate ----------------------------------------------------------------------------


def _recreate(args: argparse.Namespace) -> int:
    from commonos.loop.event_journal import LOOP_SOURCE
    from commonos.loop.profiles import CONFIG_FILE, ProfileError, load_profile
    from commonos.proto.profiles import deleted_when_by
    from commonos.runtime.lifecycle import run

    profile_id: str = args.id
    settings = cli_settings(database=False)
    folder = settings.profiles_dir / profile_id
    tags: tuple[str, ...] = tuple(args.tag)
    source = CLI_SOURCE
    if (folder / CONFIG_FILE).is_file():
        source = LOOP_SOURCE  # the loop keeps it
        if not args.tag:
            try:
                tags = load_profile(folder).tags
            except ProfileError as exc:
                raise CliError(str(exc)) from None

    async def main() -> int:
        nc, journal = await _journal(settings, source)
        try:
            status = await journal.profile_status(profile_id)
            deleted = status.deleted
            if deleted is None:
                raise CliError(f"profile {profile_id!r} is not deleted: there is nothing to re-create")
            await journal.publish_profile(profile_id, tags)
        finally:
            await nc.close()
        print(f"re-created profile {profile_id!r} (tags: {', '.join(tags) or 'none'})")
        print(f"it was deleted {deleted_when_by(deleted)}: nothing from before its deletion comes back")
        return 0

    return run(main)


def register(sub: Any) -> None:
    commands = command_group(
        sub,
        "profile",
        "list profiles and their state, delete one, re-create a deleted one",
        __doc__,
        metavar="COMMAND",
        required=False,
    )
    ls = commands.add_parser("list", help="every profile: configured, folder missing, imported or deleted")
    ls.add_argument("--format", choices=("table", "json"), default="table")
    ls.set_defaults(handler=_list)
    rm = commands.add_parser(
        "delete",
        help="delete a profile with its sessions, turns, messages, graphs and memory (billing keeps its cost)",
    )
    rm.add_argument("id", type=_profile_id, help="the profile id")
    rm.add_argument("--yes", action="store_true", help="do not ask (required when standard input is not a terminal)")
    rm.add_argument("--by", help="who deletes (default cli:<user>)")
    rm.set_defaults(handler=_delete)
    re = commands.add_parser("recreate", help="create a deleted profile again, afresh")
    re.add_argument("id", type=_profile_id, help="the profile id")
    re.add_argument(
        "--tag", type=_tag, action="append", default=[], help="its tags (default: from its folder's config.toml)"
    )
    re.set_defaults(handler=_recreate)
