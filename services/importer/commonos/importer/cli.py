"""``cos import <vendor> [PATH]``: read agent transcripts, publish them as events, summarise them.

* The vendors (``claude``, ``codex``) and their subcommands come from :mod:`commonos.importer.vendors`.
* Each top-level session becomes ``transcript_imported`` events (its graph, in parts that fit a NATS
  message) and one ``model_call_completed`` per model call with usage, all with deterministic ids:
  importing again publishes nothing new (JetStream reports the duplicates) and never bills twice.
* ``--dry-run`` reads, validates and summarises without any server.
* ``--watch`` keeps going: it polls the transcripts' sizes every ``--interval`` seconds and publishes
  what a grown file adds; a call whose usage may still grow is billed once its file has been quiet for
  ``--settle`` seconds (or when the watch stops). Ctrl-C stops it.
* The summary (a table, or ``--format json``) has one line per session tree and per model: tokens by
  kind, cost (priced offline with genai-prices, as billing will), tool calls and files touched. A
  tree that could not be published is listed as not imported, with the reason, and left out of the
  totals (exit status 1); rows cut to fit a message are counted.
* Only regular files are read: a FIFO, device or socket named like a transcript is skipped with a
  warning, as is a line longer than ``MAX_LINE_BYTES``; warnings do not change the exit status.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from commonos.importer.events import EVENT_SOURCE, profile_id_for, profile_tags
from commonos.importer.pool import default_jobs
from commonos.importer.publish import PublishCounts, publish_events
from commonos.importer.render import emit
from commonos.importer.report import summarize_import
from commonos.importer.run import ImportRun, PublishFn, import_files
from commonos.importer.source import Source
from commonos.importer.vendors import SOURCES, VENDORS, labels
from commonos.importer.watch import Watcher
from commonos.proto.events import Event
from commonos.runtime.args import CliError, positive_int
from commonos.runtime.cli_support import as_text
from commonos.runtime.settings import Settings

if TYPE_CHECKING:
    from commonos.accounting.pricing import Pricer

log = logging.getLogger("commonos.importer")

__all__ = ["EVENT_SOURCE", "SOURCES", "ImportRun", "Watcher", "import_files", "nats_publisher", "register"]


@contextlib.asynccontextmanager
async def nats_publisher(
    settings: Settings, claim: tuple[str, str] | None = None, *, keep_reconnecting: bool = False
) -> AsyncIterator[tuple[PublishFn, int]]:
    """A publish function over a NATS connection, and the server's max message size; with `keep_reconnecting`
    (a watch) the connection waits out a NATS outage for as long as it lasts, else the import fails after a
    few seconds of it (`commonos.runtime.cli_support.cli_connect`).

    With `claim` (a profile and the vendor), the profile the import belongs to is published first
    (`profile_upserted`, tagged `vendor:<vendor>`), or the import refused (`CliError`) if it is deleted.
    """
    from commonos.runtime import nats as cos_nats
    from commonos.runtime.cli_support import cli_connect
    from commonos.runtime.publisher import EventPublisher

    closing = False

    async def on_disconnected() -> None:
        if not closing:
            log.warning("nats: disconnected; publishing resumes after the reconnect")

    nc = await cli_connect(settings, "cos-import", keep_reconnecting=keep_reconnecting, disconnected_cb=on_disconnected)
    try:
        js = nc.jetstream()
        await cos_nats.ensure_streams(js, settings.stream_replicas)
        publisher = EventPublisher(js, EVENT_SOURCE, nc=nc)
        if claim is not None:
            await _claim_profile(js, publisher, *claim)

        async def publish(events: Sequence[Event]) -> PublishCounts:
            return await publish_events(publisher, events)

        yield publish, int(nc.max_payload)
    finally:
        closing = True
        await nc.close()


async def _claim_profile(js: Any, publisher: Any, profile: str, vendor: str) -> None:
    """Refuse a deleted profile (its imports would be refused); publish the import's profile."""
    from commonos.proto.events import ProfileUpserted
    from commonos.proto.profiles import describe_deletion, fold_profiles
    from commonos.proto.subjects import profile_events_filter
    from commonos.proto.tags import parse_tags
    from commonos.runtime.reading import StreamReadError, read_stored

    try:
        stored = await read_stored(js, profile_events_filter(profile), last_per_subject=True)
    except StreamReadError as exc:
        raise CliError(f"cannot read profile {profile!r} from the event stream: {exc}") from exc
    status = fold_profiles(stored).get(profile)
    if status is not None and status.deleted is not None:
        raise CliError(
            f"{describe_deletion(status.deleted)}: nothing is imported into it (re-create it first: "
            f"cos profile recreate {profile})"
        )
    await publisher.publish(ProfileUpserted(profile_id=profile, tags=tuple(parse_tags(profile_tags(vendor)))))


# --- command -------------------------------------------------------------------------------------


def _profile_id(raw: str) -> str:
    from commonos.proto.tags import InvalidProfileId, check_profile_id

    try:
        return check_profile_id(raw)
    except InvalidProfileId as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _load_pricer() -> Pricer:
    """Billing's offline pricer (genai-prices, a tenth of a second to import: a dry run loads it while reading)."""
    from commonos.accounting.pricing import Pricer

    return Pricer()


def run_import(args: argparse.Namespace) -> int:
    """The handler of ``cos import <vendor>`` (see `commonos.importer.vendors`)."""
    source = SOURCES[args.source]
    root = Path(args.path).expanduser()
    if not root.exists():
        raise CliError(
            f"{root} not found: no {source.label} transcripts to import there ({source.label} keeps them in "
            f"{source.default_root}/{source.layout}); give the folder: cos import {source.command} PATH"
        )
    if not args.watch and not source.candidates(root):
        raise CliError(
            f"no {source.label} transcripts under {root}: looked for {source.default_root}/{source.layout} "
            f"there; give the folder that holds them: cos import {source.command} PATH"
        )
    if args.watch and args.dry_run:
        raise CliError("--watch publishes as transcripts grow; it cannot be combined with --dry-run")
    if args.interval_s <= 0 or args.settle_s < 0:
        raise CliError("--interval must be above 0 and --settle at least 0")
    progress = not args.no_progress
    if args.dry_run:
        run = asyncio.run(
            import_files(
                source,
                root,
                _load_pricer,
                publish=None,
                settle_s=args.settle_s,
                progress=progress,
                jobs=args.jobs,
                profile=args.profile,
            )
        )
        published: PublishCounts | None = None
    else:
        from commonos.runtime.cli_support import cli_settings

        settings = cli_settings(database=False)
        run = asyncio.run(_publish_run(source, root, _load_pricer(), settings, args, progress))
        published = run.published
    summary = summarize_import(
        source.vendor,
        root,
        run.trees.values(),
        dry_run=args.dry_run,
        published=published,
        errors=run.errors,
        warnings=run.warnings,
    )
    emit(summary, args.format)
    return 1 if run.errors else 0


async def _publish_run(
    source: Source, root: Path, pricer: Pricer, settings: Settings, args: argparse.Namespace, progress: bool
) -> ImportRun:
    profile = args.profile or profile_id_for(source.vendor)
    claim = (profile, source.vendor)
    async with nats_publisher(settings, claim, keep_reconnecting=args.watch) as (publish, max_payload):
        if not args.watch:
            return await import_files(
                source,
                root,
                pricer,
                publish=publish,
                max_payload=max_payload,
                settle_s=args.settle_s,
                progress=progress,
                jobs=args.jobs,
                profile=args.profile,
            )
        from commonos.runtime.lifecycle import install_stop_signals

        stop = asyncio.Event()
        install_stop_signals(stop)
        err = Console(stderr=True, highlight=False)
        watcher = Watcher(
            source,
            root,
            pricer,
            publish,
            max_payload=max_payload,
            interval_s=args.interval_s,
            settle_s=args.settle_s,
            say=lambda line: err.print(as_text(line)),
            profile=args.profile,
        )
        err.print(as_text(f"watching {root} every {args.interval_s:g}s; Ctrl-C stops"))
        return await watcher.run_until(stop)


def register(sub: Any) -> None:
    imp = sub.add_parser(
        "import",
        help=f"import {labels()} transcripts as session graphs and billed model calls",
        description="Read agent transcripts, publish each session tree as events and summarise them.",
    )
    vendors = imp.add_subparsers(dest="import_source", metavar="SOURCE", required=True)
    for source in VENDORS:
        name, what = source.command, source.label
        p = vendors.add_parser(name, help=f"import {what} transcripts (default {source.default_root})")
        p.add_argument(
            "path",
            nargs="?",
            default=source.default_root,
            help=f"{what} folder, its projects/sessions folder, or one project folder (default {source.default_root})",
        )
        p.add_argument("--dry-run", action="store_true", help="read, validate and summarise; publish nothing")
        p.add_argument("--watch", action="store_true", help="keep following growing transcripts until Ctrl-C")
        p.add_argument(
            "--interval", dest="interval_s", type=float, default=2.0, metavar="SECONDS", help="watch poll interval"
        )
        p.add_argument(
            "--settle",
            dest="settle_s",
            type=float,
            default=10.0,
            metavar="SECONDS",
            help="bill the last call of a file written to within this many seconds only once it is quiet (default 10)",
        )
        p.add_argument(
            "--profile",
            type=_profile_id,
            default=None,
            help=f"the profile the sessions belong to (default {profile_id_for(source.vendor)}); deleting it "
            "deletes them",
        )
        p.add_argument("--format", choices=("table", "json"), default="table", help="summary format")
        p.add_argument(
            "--jobs",
            type=positive_int,
            default=default_jobs(),
            metavar="N",
            help=f"processes reading transcripts at once (default: the usable cores, here {default_jobs()})",
        )
        p.add_argument("--no-progress", action="store_true", help="no progress bar")
        p.set_defaults(handler=run_import, source=name)
