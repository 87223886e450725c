"""An import: what a run found and did (`ImportRun`), and publishing each tree, recorded as imported or
not and why. `import_files` imports every transcript under a folder once; `commonos.importer.watch`
follows them as they grow."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from commonos.importer.events import TreeState, tree_events
from commonos.importer.ledger import Ledger, TreeCalls, tree_calls
from commonos.importer.model import ImportedSession
from commonos.importer.parts import GraphTooLarge
from commonos.importer.pool import read_files
from commonos.importer.publish import PublishCounts
from commonos.importer.reading import TreeOut
from commonos.importer.render import progress_bar
from commonos.importer.report import SessionSummary, account, summarize_tree
from commonos.importer.source import Source
from commonos.proto.events import Event, EventInvalid
from commonos.proto.graph import GraphInvalid
from commonos.runtime.limits import DEFAULT_MAX_PAYLOAD

if TYPE_CHECKING:  # genai-prices is imported while the files are read (see `import_files`)
    from commonos.accounting.pricing import Pricer

PublishFn = Callable[[Sequence[Event]], Awaitable[PublishCounts]]


@dataclass
class ImportRun:
    """Everything a run found and did, kept small: summaries, not graphs."""

    trees: dict[str, SessionSummary] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    published: PublishCounts = field(default_factory=PublishCounts)
    #: Set when publishing failed for a reason that is not the tree's own (NATS unreachable, say): the
    #: trees after it are not published either, and say why.
    stopped: str | None = None


def not_imported(run: ImportRun, summary: SessionSummary, reason: str) -> None:
    """Record that a tree was not (wholly) published: it leaves the totals, and the run fails."""
    summary.imported = False
    summary.not_imported = reason
    run.errors.append(f"{summary.source_path}: {reason}")


def _stops_publishing(exc: BaseException) -> bool:
    """Whether a failure to publish one tree means the next ones would fail too (it is not about the tree)."""
    from commonos.runtime.publisher import EventTooLarge

    return not isinstance(exc, EventTooLarge | GraphTooLarge | GraphInvalid | EventInvalid)


async def publish_tree(run: ImportRun, publish: PublishFn, tree: TreeOut) -> PublishCounts | None:
    """Publish one tree's events; whatever fails, the tree is recorded as not imported and why."""
    summary = tree.summary
    if tree.error is not None:
        not_imported(run, summary, tree.error)
        return None
    if run.stopped is not None:
        not_imported(run, summary, f"not published: {run.stopped}")
        return None
    try:
        counts = await publish(tree.events) if tree.events else PublishCounts()
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
        if _stops_publishing(exc):
            run.stopped = f"publishing stopped after an earlier failure ({reason})"
        not_imported(run, summary, f"not published: {reason}")
        return None
    run.published.add(counts)
    summary.imported = True
    return counts


async def import_files(
    source: Source,
    root: Path,
    pricer: Pricer | Callable[[], Pricer],
    *,
    publish: PublishFn | None,
    max_payload: int = DEFAULT_MAX_PAYLOAD,
    settle_s: float = 10.0,
    progress: bool = False,
    jobs: int = 1,
    profile: str | None = None,
) -> ImportRun:
    """Read every transcript under ``root``, summarise each tree and, with ``publish``, publish its events.

    The files are read into a `Ledger` first, so that a call repeated in several files is counted once,
    with its most complete usage; a publishing import then reads them again and publishes each tree
    with the ledger's verdicts. Every transcript file under ``root`` that no read took in is named in a
    warning, with why. With ``jobs`` above 1 the files are read by that many forked processes while this
    one publishes; results are taken in file order, so the summary, the errors and the order of
    publishing are the same as with one. ``settle_s``: see `read_file`. The trees are imported into
    ``profile`` (None: the vendor's profile). ``pricer`` may be a function that makes one: it is then
    called in a thread while the files are read (genai-prices takes a while to load), once the reader
    processes are forked.
    """
    run = ImportRun(warnings=source.skipped(root))
    tops = source.top_files(root)
    total = sum(size for size, _ in source.scan(root).values())
    jobs = max(1, min(jobs, len(tops)))
    ledger = Ledger()
    calls: dict[str, TreeCalls] = {}
    files: set[Path] = set()
    with progress_bar(total if publish is None else 2 * total, progress) as advance:
        loading: asyncio.Future[Pricer] | None = None
        reads = read_files(
            source, tops, ledger=None, max_payload=max_payload, settle_s=settle_s, profile=profile, jobs=jobs
        )
        async with contextlib.aclosing(reads):
            async for read in reads:
                if loading is None and callable(pricer):  # the readers are forked by now
                    loading = asyncio.ensure_future(asyncio.to_thread(pricer))
                run.errors.extend(read.errors)
                run.warnings.extend(read.warnings)
                files |= read.files
                for tree in read.trees:
                    run.trees[tree.summary.session_id] = tree.summary
                    calls[tree.summary.session_id] = tree.calls
                    ledger.add(tree.calls)
                    if tree.error is not None:
                        not_imported(run, tree.summary, tree.error)
                advance(read.bytes_read)
        run.warnings.extend(source.unread_warning(path) for path in source.all_files(root) if path not in files)
        if callable(pricer):
            pricer = await loading if loading is not None else pricer()
        for session_id, summary in run.trees.items():
            account(summary, calls[session_id], ledger, pricer)
        if publish is None:
            return run
        reads = read_files(
            source, tops, ledger=ledger, max_payload=max_payload, settle_s=settle_s, profile=profile, jobs=jobs
        )
        async with contextlib.aclosing(reads):
            async for read in reads:
                for tree in read.trees:
                    summary = run.trees.setdefault(tree.summary.session_id, tree.summary)
                    summary.rows_cut = tree.summary.rows_cut
                    tree.summary = summary
                    if summary.imported is False:  # its graph is invalid: said in the first pass
                        continue
                    await publish_tree(run, publish, tree)
                advance(read.bytes_read)
    return run


async def import_tree(
    run: ImportRun,
    imported: ImportedSession,
    pricer: Pricer,
    publish: PublishFn | None,
    max_payload: int,
    *,
    state: TreeState | None,
    settled_only: bool,
    ledger: Ledger | None = None,
) -> PublishCounts | None:
    """Summarise and publish one tree (only what changed, with `state`), its calls counted as `ledger` says
    (None: the tree alone), which hears of the tree first.

    A PublishError other than EventTooLarge is raised for the caller to retry; the tree is recorded as
    not imported until a retry succeeds.
    """
    from commonos.runtime.publisher import PublishError

    ledger = ledger or Ledger()
    ledger.add(tree_calls(imported))
    summary = summarize_tree(pricer, imported, ledger)
    run.trees[summary.session_id] = summary
    if publish is None:
        return None
    imported, billed_elsewhere = ledger.settle(imported)
    try:
        events = tree_events(imported, max_payload=max_payload, settled_only=settled_only, state=state)
    except (GraphTooLarge, GraphInvalid, EventInvalid) as exc:
        not_imported(run, summary, f"not published: {exc}")
        return None
    events.calls = [c for c in events.calls if events.invocation_of[c.event_id] not in billed_elsewhere]
    summary.rows_cut = events.cut_rows
    try:
        counts = await publish(events.events) if events.events else PublishCounts()
    except Exception as exc:
        reason = f"not published: {type(exc).__name__}: {exc}"
        if _stops_publishing(exc) and isinstance(exc, PublishError):
            summary.imported, summary.not_imported = False, f"{reason} (will retry)"
            raise
        not_imported(run, summary, reason)
        return None
    run.published.add(counts)
    summary.imported = True
    if state is not None:
        state.remember(events)
    return counts
