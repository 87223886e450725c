"""Commands of the journal-writer: run it, rebuild from the stream, inspect and replay dead letters."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from commonos.accounting.csv_cells import csv_table
from commonos.runtime.args import CliError, command_group, positive_int
from commonos.runtime.cli_support import as_text, cli_jetstream, cli_settings
from commonos.runtime.settings import Settings


def _serve(args: argparse.Namespace) -> int:
    from commonos.journal_writer.service import main

    return main()


def _replay(args: argparse.Namespace) -> int:
    from commonos.journal_writer.replay import ReplayError, replay

    settings = cli_settings()
    console = Console(stderr=True)
    with Progress(
        TextColumn("replaying"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("events"),
        TimeRemainingColumn(),
        console=console,
        # On a terminal only: elsewhere it is drawn once, at the end, above an error or the result.
        disable=args.quiet or not console.is_terminal,
    ) as progress:
        task = progress.add_task("replay", total=None)

        def on_progress(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        try:
            result = asyncio.run(
                replay(settings, truncate=args.truncate, batch_size=args.batch_size, on_progress=on_progress)
            )
        except ReplayError as exc:
            raise CliError(str(exc)) from None
    print(
        f"replayed {result.applied} deliveries into empty tables (each projection counts its own; "
        f"{result.skipped} skipped as dead letters), "
        f"up to stream seq {result.last_seq}, in {result.seconds:.1f} s ({result.rate:,.0f} events/s)"
    )
    return 0


async def _dlq_list(settings: Settings, limit: int | None) -> list[Any]:
    from commonos.runtime.dlq import list_dead_letters

    async with cli_jetstream(settings, "cos-dlq") as (_, js):
        return await list_dead_letters(js, limit)


def _dlq_list_cmd(args: argparse.Namespace) -> int:
    letters = asyncio.run(_dlq_list(cli_settings(), args.limit))
    if args.format == "json":
        json.dump(
            [
                {
                    "dlq_seq": d.dlq_seq,
                    "subject": d.subject,
                    "reason": d.reason,
                    "consumer": d.consumer,
                    "stream_seq": d.stream_seq,
                    "dead_at": d.dead_at,
                    "bytes": d.body_bytes,
                    # The body was too large to keep with the reason: it is read from COS_EVENTS by stream_seq.
                    "body": ("missing from COS_EVENTS" if d.original_missing else "in COS_EVENTS")
                    if d.body_omitted
                    else "kept",
                }
                for d in letters
            ],
            sys.stdout,
            indent=2,
        )
        print()
        return 0
    if args.format == "csv":
        # A reason or subject is text we did not write: no cell of it may run in a spreadsheet.
        header = ("dlq_seq", "subject", "consumer", "stream_seq", "dead_at", "reason")
        rows = ((d.dlq_seq, d.subject, d.consumer, d.stream_seq, str(d.dead_at), d.reason) for d in letters)
        sys.stdout.write(csv_table(header, rows))
        return 0
    table = Table(title=f"dead letters ({len(letters)})")
    for col in ("seq", "subject", "consumer", "stream seq", "bytes", "dead at", "reason"):
        table.add_column(col, overflow="fold")
    for d in letters:
        size = f"{d.body_bytes} (by reference)" if d.body_omitted else str(d.body_bytes)
        if d.original_missing:
            size += ", original gone"
        table.add_row(
            str(d.dlq_seq),
            *(as_text(x) for x in (d.subject, d.consumer)),
            str(d.stream_seq or ""),
            size,
            *(as_text(x) for x in (d.dead_at[:19], d.reason)),
        )
    Console().print(table)
    return 0


async def _dlq_replay(settings: Settings, seqs: list[int], replay_all: bool) -> tuple[int, list[int]]:
    from commonos.runtime.dlq import DeadLetterError, list_dead_letters, replay_dead_letter
    from commonos.runtime.limits import MessageTooLarge

    async with cli_jetstream(settings, "cos-dlq", ensure_streams=False) as (nc, js):
        letters = await list_dead_letters(js)
        by_seq = {d.dlq_seq: d for d in letters}
        missing = [s for s in seqs if s not in by_seq]
        chosen = letters if replay_all else [by_seq[s] for s in seqs if s in by_seq]
        sent = 0
        for letter in chosen:
            try:
                await replay_dead_letter(js, letter, nc=nc)
            except (DeadLetterError, MessageTooLarge) as exc:
                raise CliError(f"{exc} ({sent} dead letters sent back before this one)") from None
            sent += 1
        return sent, missing


def _dlq_replay_cmd(args: argparse.Namespace) -> int:
    if not args.all and not args.seq:
        raise CliError("name dead letters by their seq (see `cos dlq list`) or pass --all")
    sent, missing = asyncio.run(_dlq_replay(cli_settings(), args.seq, args.all))
    print(f"sent {sent} dead letters back to the event stream")
    if missing:
        raise CliError(f"no dead letter with seq {', '.join(map(str, missing))}")
    return 0


def register(sub: Any) -> None:
    jw = sub.add_parser("journal-writer", help="run the journal-writer (projects events into PostgreSQL)")
    jw.set_defaults(handler=_serve)

    rp = sub.add_parser(
        "replay",
        help="rebuild the core tables from the event stream",
        description="Rebuild the core tables from COS_EVENTS into empty tables. Stop the live "
        "journal-writer first, or point COS_DATABASE_URL at another database.",
    )
    rp.add_argument(
        "--truncate",
        action="store_true",
        help="empty the tables first (tables of an older, unpartitioned layout are made anew partitioned)",
    )
    rp.add_argument("--batch-size", type=positive_int, default=1000, metavar="N", help="events per transaction (1000)")
    rp.add_argument("--quiet", action="store_true", help="no progress bar")
    rp.set_defaults(handler=_replay)

    dsub = command_group(sub, "dlq", "dead letters: events that could not be projected")
    ls = dsub.add_parser("list", help="list dead letters with their reasons")
    ls.add_argument("--limit", type=int, default=None, metavar="N")
    ls.add_argument("--format", choices=("table", "json", "csv"), default="table")
    ls.set_defaults(handler=_dlq_list_cmd)
    rr = dsub.add_parser("replay", help="send dead letters back to the event stream (after a fix)")
    rr.add_argument("seq", nargs="*", type=int, help="dead-letter seqs to replay")
    rr.add_argument("--all", action="store_true", help="replay every dead letter")
    rr.set_defaults(handler=_dlq_replay_cmd)
