"""An import: what a run found and did (`ImportRun`), and publishing each tree, recorded as imported or
not and why. `import_files` imports every transcript under a folder once; `commonos.importer.watch`
follows them as they grow."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from commonos.accounting.pricing import Pricer
from commonos.importer.events import TreeState, tree_events
from commonos.importer.model import ImportedSession
from commonos.importer.parts import GraphTooLarge
from commonos.importer.pool import read_files
from commonos.importer.publish import PublishCounts
from commonos.importer.reading import FileRead, TreeOut
from commonos.importer.render import progress_bar
from commonos.importer.report import SessionSummary, summarize_tree
from commonos.importer.source import Source
from commonos.proto.events import Event
from commonos.proto.graph import GraphInvalid
from commonos.runtime.limits import DEFAULT_MAX_PAYLOAD

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

    return not isinstance(exc, EventTooLarge | GraphTooLarge | GraphInvalid)


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
    pricer: Pricer,
    *,
    publish: PublishFn | None,
    max_payload: int = DEFAULT_MAX_PAYLOAD,
    settle_s: float = 10.0,
    progress: bool = False,
    jobs: int = 1,
    profile: str | None = None,
) -> ImportRun:
    """Read every transcript under ``root``, summarise each tree and, with ``publish``, publish its events.

    With ``jobs`` above 1 the files are read by that many forked processes while this one publishes;
    results are taken in file order, so the summary, the errors and the order of publishing are the
    same as with one. ``settle_s``: see `read_file`. The trees are imported into ``profile`` (None: the
    vendor's profile).
    """
    run = ImportRun(warnings=source.skipped(root))
    tops = source.top_files(root)
    total = sum(size for size, _ in source.scan(root).values())
    publishing = publish is not None
    jobs = max(1, min(jobs, len(tops)))
    with progress_bar(total, progress) as advance:

        async def take(read: FileRead) -> None:
            run.errors.extend(read.errors)
            run.warnings.extend(read.warnings)
            for tree in read.trees:
                run.trees[tree.summary.session_id] = tree.summary
                if publish is not None:
                    await publish_tree(run, publish, tree)
            advance(read.bytes_read)

        reads = read_files(
            source,
            tops,
            pricer,
            publishing=publishing,
            max_payload=max_payload,
            settle_s=settle_s,
            profile=profile,
            jobs=jobs,
        )
        async with contextlib.aclosing(reads):
            async for read in reads:
                await take(read)
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
) -> PublishCounts | None:
    """Summarise and publish one tree (only what changed, with `state`).

    A PublishError other than EventTooLarge is raised for the caller to retry; the tree is recorded as
    not imported until a retry succeeds.
    """
    from commonos.runtime.publisher import PublishError

    summary = summarize_tree(pricer, imported)
    run.trees[summary.session_id] = summary
    if publish is None:
        return None
    try:
        events = tree_events(imported, max_payload=max_payload, settled_only=settled_only, state=state)
    except (GraphTooLarge, GraphInvalid) as exc:
        not_imported(run, summary, f"not published: {exc}")
        return None
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
