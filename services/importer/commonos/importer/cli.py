"""``cos import claude|codex [PATH]``: read agent transcripts, publish them as events, summarise them.

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
import collections
import contextlib
import dataclasses
import logging
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol

import msgspec
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from commonos.accounting.pricing import Pricer
from commonos.importer.claude import (
    claude_candidates,
    claude_owner_session_file,
    claude_session_files,
    is_claude_agent_file,
    read_claude_file,
)
from commonos.importer.codex import read_codex_file
from commonos.importer.discover import codex_candidates, codex_rollout_files, readable, skipped_files
from commonos.importer.events import EVENT_SOURCE, TreeState, profile_id_for, profile_tags, tree_events
from commonos.importer.lines import Warn, skipped_warning
from commonos.importer.model import VENDOR_CLAUDE_CODE, VENDOR_CODEX, ImportedSession, TranscriptError
from commonos.importer.parts import GraphTooLarge
from commonos.importer.publish import PublishCounts, publish_events
from commonos.importer.report import ImportSummary, SessionSummary, summarize_import, summarize_tree, summary_json
from commonos.proto.events import Event
from commonos.proto.graph import GraphInvalid, validate
from commonos.runtime.args import CliError, positive_int
from commonos.runtime.limits import DEFAULT_MAX_PAYLOAD
from commonos.runtime.settings import Settings

log = logging.getLogger("commonos.importer")

__all__ = ["EVENT_SOURCE", "SOURCES", "ImportRun", "Watcher", "import_files", "nats_publisher", "register"]

Fingerprint = dict[Path, tuple[int, int]]


class Reader(Protocol):
    """Reads one top-level transcript into its session trees; `warn` hears of input it skipped."""

    def __call__(self, path: Path, warn: Warn | None = None) -> list[ImportedSession]: ...


# --- where transcripts are -----------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """One vendor's transcript layout: which files to read, and which file a changed file belongs to."""

    command: str
    vendor: str
    default_root: str
    top_files: Callable[[Path], list[Path]]
    #: Every name that looks like a transcript, whatever kind of file it is.
    candidates: Callable[[Path], list[Path]]
    read: Reader
    owner_of: Callable[[Path, set[Path]], Path | None]

    def all_files(self, root: Path) -> list[Path]:
        """Every transcript file under ``root`` (regular files only)."""
        return readable(self.candidates(root))

    def skipped(self, root: Path) -> list[str]:
        """A warning for each FIFO, device or socket under ``root`` named like a transcript: never read."""
        return [skipped_warning(path, kind) for path, kind in skipped_files(self.candidates(root))]

    def scan(self, root: Path) -> Fingerprint:
        """Size and modification time of every transcript file under ``root``."""
        found: Fingerprint = {}
        for path in self.all_files(root):
            with contextlib.suppress(OSError):
                stat = path.stat()
                found[path] = (stat.st_size, stat.st_mtime_ns)
        return found


def _claude_owner(path: Path, tops: set[Path]) -> Path | None:
    if is_claude_agent_file(path):
        return claude_owner_session_file(path)
    return path if path in tops else None


def _read_codex(path: Path, warn: Warn | None = None) -> list[ImportedSession]:
    imported = read_codex_file(path, warn)
    return [imported] if imported is not None else []


SOURCES: dict[str, Source] = {
    "claude": Source(
        command="claude",
        vendor=VENDOR_CLAUDE_CODE,
        default_root="~/.claude",
        top_files=lambda root: list(claude_session_files(root)),
        candidates=claude_candidates,
        read=read_claude_file,
        owner_of=_claude_owner,
    ),
    "codex": Source(
        command="codex",
        vendor=VENDOR_CODEX,
        default_root="~/.codex",
        top_files=lambda root: list(codex_rollout_files(root)),
        candidates=codex_candidates,
        read=_read_codex,
        owner_of=lambda path, tops: path,
    ),
}


# --- reading -------------------------------------------------------------------------------------


@dataclass
class TreeRead:
    """One tree read from disk and checked, or the reason it cannot be imported."""

    imported: ImportedSession | None
    error: str | None = None


def read_trees(source: Source, path: Path, warn: Warn, profile: str | None = None) -> list[TreeRead]:
    """Every tree a top-level transcript holds, each validated (an invalid one carries its error), as
    `profile`'s (None: the vendor's profile).

    `warn` hears of input skipped on the way (lines over the cap, files that are not regular files).
    """
    out = []
    try:
        read = source.read(path, warn)
        if profile is not None:
            read = [msgspec.structs.replace(imported, profile_id=profile) for imported in read]
    except TranscriptError as exc:  # names the file
        return [TreeRead(None, str(exc))]
    except Exception as exc:  # one unreadable file must not stop an import of thousands
        return [TreeRead(None, f"{path}: cannot be read: {type(exc).__name__}: {exc}")]
    for imported in read:
        try:
            validate(imported.graph)
        except GraphInvalid as exc:
            out.append(TreeRead(None, f"{imported.source_path}: invalid graph: {exc}"))
            continue
        out.append(TreeRead(imported))
    return out


@contextlib.contextmanager
def _progress(total_bytes: int, enabled: bool) -> Iterator[Callable[[int], None]]:
    console = Console(stderr=True)
    with Progress(
        TextColumn("importing"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not enabled or not console.is_terminal,
        transient=True,
    ) as progress:
        task = progress.add_task("import", total=total_bytes)
        yield lambda done: progress.advance(task, done)
        progress.update(task, completed=total_bytes)


def _bytes_of(path: Path, trees: Sequence[TreeRead]) -> int:
    read = [t.imported.source_bytes for t in trees if t.imported is not None]
    with contextlib.suppress(OSError):
        read.append(path.stat().st_size)
    return max(read, default=0)


# --- one-shot import -----------------------------------------------------------------------------

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


@dataclass
class TreeOut:
    """One tree of a file: its summary and its events, or why it cannot be published."""

    summary: SessionSummary
    events: list[Event] = field(default_factory=list)
    error: str | None = None


@dataclass
class FileRead:
    """What one top-level transcript gave: a summary and events per tree, errors and warnings."""

    trees: list[TreeOut] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    bytes_read: int = 0


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


def read_file(
    source: Source,
    path: Path,
    pricer: Pricer,
    *,
    publishing: bool,
    max_payload: int,
    settle_s: float,
    profile: str | None = None,
) -> FileRead:
    """Read, validate and summarise one top-level file; with ``publishing``, build each tree's events too.

    A file written to within ``settle_s`` seconds may end in a response still being written: the calls
    whose usage may still grow are left for a later import (see ``settled_invocations``).
    """
    out = FileRead()
    settled_only = time.time() - _mtime(path) < settle_s
    trees = read_trees(source, path, out.warnings.append, profile)
    for tree in trees:
        if tree.imported is None:
            out.errors.append(tree.error or f"{path}: unreadable")
            continue
        item = TreeOut(summarize_tree(pricer, tree.imported))
        out.trees.append(item)
        if not publishing:
            continue
        try:
            events = tree_events(tree.imported, max_payload=max_payload, settled_only=settled_only)
        except (GraphTooLarge, GraphInvalid) as exc:
            item.error = f"not published: {exc}"
            continue
        item.events = events.events
        item.summary.rows_cut = events.cut_rows
    out.bytes_read = _bytes_of(path, trees)
    return out


def default_jobs() -> int:
    """Reader processes for an import: one per usable core where processes can be forked, else none."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# Set in each reader process by `_start_reader`: the process is forked, so nothing here is pickled.
_reader: tuple[Source, Pricer, bool, int, float, str | None] | None = None


def _start_reader(
    source: Source, pricer: Pricer, publishing: bool, max_payload: int, settle_s: float, profile: str | None
) -> None:
    global _reader
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _reader = (source, pricer, publishing, max_payload, settle_s, profile)


def _read_in_reader(path: Path) -> FileRead:
    assert _reader is not None, "not a reader process"
    source, pricer, publishing, max_payload, settle_s, profile = _reader
    return read_file(
        source, path, pricer, publishing=publishing, max_payload=max_payload, settle_s=settle_s, profile=profile
    )


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
    with _progress(total, progress) as advance:

        async def take(read: FileRead) -> None:
            run.errors.extend(read.errors)
            run.warnings.extend(read.warnings)
            for tree in read.trees:
                run.trees[tree.summary.session_id] = tree.summary
                if publish is not None:
                    await publish_tree(run, publish, tree)
            advance(read.bytes_read)

        if jobs == 1:
            for path in tops:
                read = read_file(
                    source,
                    path,
                    pricer,
                    publishing=publishing,
                    max_payload=max_payload,
                    settle_s=settle_s,
                    profile=profile,
                )
                await take(read)
            return run
        pool = ProcessPoolExecutor(
            jobs,
            mp_context=multiprocessing.get_context("fork"),
            initializer=_start_reader,
            initargs=(source, pricer, publishing, max_payload, settle_s, profile),
        )
        try:
            waiting = iter(tops)
            reading: collections.deque[asyncio.Future[FileRead]] = collections.deque()

            def read_next() -> None:
                path = next(waiting, None)
                if path is not None:
                    reading.append(asyncio.wrap_future(pool.submit(_read_in_reader, path)))

            for _ in range(2 * jobs):  # enough to keep every reader busy, few enough to bound memory
                read_next()
            while reading:
                read = await reading.popleft()
                read_next()
                await take(read)
        except BrokenProcessPool as exc:
            raise CliError(f"a reader process died ({exc}); try again with --jobs 1") from None
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    return run


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


async def _import_tree(
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


@contextlib.asynccontextmanager
async def nats_publisher(
    settings: Settings, claim: tuple[str, str] | None = None
) -> AsyncIterator[tuple[PublishFn, int]]:
    """A publish function over a NATS connection, and the server's max message size.

    With `claim` (a profile and the vendor), the profile the import belongs to is published first
    (`profile_upserted`, tagged `vendor:<vendor>`), or the import refused (`CliError`) if it is deleted.
    """
    from commonos.runtime import nats as cos_nats
    from commonos.runtime.publisher import EventPublisher

    closing = False

    async def on_disconnected() -> None:
        if not closing:
            log.warning("nats: disconnected; publishing resumes after the reconnect")

    nc = await cos_nats.connect(settings, "cos-import", disconnected_cb=on_disconnected)
    try:
        js = nc.jetstream()
        await cos_nats.ensure_streams(js, settings.stream_replicas)
        publisher = EventPublisher(js, EVENT_SOURCE)
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


# --- watching ------------------------------------------------------------------------------------


@dataclass
class Watcher:
    """Follows growing transcripts: re-reads a file when it changes and publishes what is new."""

    source: Source
    root: Path
    pricer: Pricer
    publish: PublishFn
    max_payload: int = DEFAULT_MAX_PAYLOAD
    interval_s: float = 2.0
    settle_s: float = 10.0
    say: Callable[[str], None] = lambda line: None
    #: The profile the trees are imported into (None: the vendor's).
    profile: str | None = None
    run: ImportRun = field(default_factory=ImportRun)
    states: dict[str, TreeState] = field(default_factory=dict)
    #: Top-level files with calls not billed yet, by when they last changed (monotonic seconds).
    unsettled: dict[Path, float] = field(default_factory=dict)
    retry: set[Path] = field(default_factory=set)
    fingerprint: Fingerprint = field(default_factory=dict)
    #: Warnings already given, so that a FIFO left in the folder is reported once, not every poll.
    warned: set[str] = field(default_factory=set)

    def warn(self, warning: str) -> None:
        if warning not in self.warned:
            self.warned.add(warning)
            self.run.warnings.append(warning)
            self.say(f"warning: {warning}")

    async def start(self) -> None:
        """Import everything once; files changed within the settle time keep their last calls for later."""
        for warning in self.source.skipped(self.root):
            self.warn(warning)
        self.fingerprint = self.source.scan(self.root)
        now_wall, now = time.time(), time.monotonic()
        for path in self.source.top_files(self.root):
            recent = now_wall - _mtime(path) < self.settle_s
            await self.process(path, settled_only=recent)
            if recent:
                self.unsettled[path] = now

    async def poll(self) -> None:
        """One look at the files: publish what changed, and bill calls of files that went quiet."""
        for warning in self.source.skipped(self.root):
            self.warn(warning)
        current = self.source.scan(self.root)
        changed = {p for p in current if current[p] != self.fingerprint.get(p)}
        self.fingerprint = current
        tops = set(self.source.top_files(self.root))
        owners = {self.source.owner_of(p, tops) for p in changed} | self.retry
        self.retry = set()
        now = time.monotonic()
        for path in sorted(p for p in owners if p is not None):
            await self.process(path, settled_only=True)
            self.unsettled[path] = now
        for path, since in list(self.unsettled.items()):
            if now - since >= self.settle_s and path not in owners:
                await self.process(path, settled_only=False)
                self.unsettled.pop(path, None)

    async def finish(self) -> None:
        """Bill what is still waiting to settle: the watch is ending."""
        for path in list(self.unsettled):
            await self.process(path, settled_only=False)
        self.unsettled.clear()

    async def run_until(self, stop: asyncio.Event) -> ImportRun:
        await self.start()
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.interval_s)
            if stop.is_set():
                break
            await self.poll()
        await self.finish()
        return self.run

    async def process(self, path: Path, *, settled_only: bool) -> None:
        from commonos.runtime.publisher import PublishError

        for tree in read_trees(self.source, path, self.warn, self.profile):
            if tree.imported is None:
                self.run.errors.append(tree.error or f"{path}: unreadable")
                self.say(f"error: {tree.error}")
                continue
            root = tree.imported.graph.root()
            state = self.states.setdefault(root.id if root is not None else str(path), TreeState())
            try:
                counts = await _import_tree(
                    self.run,
                    tree.imported,
                    self.pricer,
                    self.publish,
                    self.max_payload,
                    state=state,
                    settled_only=settled_only,
                )
            except PublishError as exc:
                self.retry.add(path)
                self.say(f"not published, will retry: {exc}")
                continue
            summary = self.run.trees.get(root.id) if root is not None else None
            if counts is None and summary is not None and summary.imported is False:
                self.say(f"error: {summary.source_path}: {summary.not_imported}")
            if counts is not None and counts.events:
                title = (root.title if root is not None else None) or path.name
                self.say(
                    f"{time.strftime('%H:%M:%S')} {title[:60]}: {counts.graph_parts} graph part(s), "
                    f"{counts.model_calls} model call(s), {counts.stored} new in the stream"
                )


# --- output --------------------------------------------------------------------------------------


def _n(value: int) -> str:
    return f"{value:,}"


def _usd(value: Decimal, unpriced: int) -> str:
    text = f"${value:,.2f}"
    return f"{text} (+{unpriced} unpriced)" if unpriced else text


def print_table(summary: ImportSummary, console: Console) -> None:
    sessions = Table(title=f"{summary.vendor} sessions under {summary.root}", show_lines=False)
    for column in ("started", "session", "project", "calls", "input", "output", "cache read", "cache write"):
        left = column in ("session", "project", "started")
        sessions.add_column(column, justify="left" if left else "right", no_wrap=True, overflow="ellipsis")
    for column in ("cost", "tools", "files"):
        sessions.add_column(column, justify="right")
    for s in summary.sessions:
        title = (s.title or s.vendor_session_id or s.session_id)[:40]
        if s.nested_sessions:
            title += f" (+{s.nested_sessions} sub)"
        if s.imported is False:
            title = "NOT IMPORTED " + title
        sessions.add_row(
            s.started_at.strftime("%Y-%m-%d %H:%M") if s.started_at else "",
            title,
            (s.project or "")[:32],
            _n(s.invocations),
            _n(s.input_tokens),
            _n(s.output_tokens),
            _n(s.cache_read_tokens),
            _n(s.cache_write_tokens),
            _usd(s.cost_usd, s.unpriced_invocations),
            _n(sum(s.tool_calls.values())),
            _n(s.files_touched),
        )
    console.print(sessions)
    models = Table(title="per model")
    for column in ("model", "calls", "input", "output", "cache read", "cache write", "of it 1h", "total", "cost"):
        models.add_column(column, justify="left" if column == "model" else "right")
    for m in [*summary.models, None]:
        line = m if m is not None else summary.totals
        models.add_row(
            m.model if m is not None else "total",
            _n(line.invocations),
            _n(line.input_tokens),
            _n(line.output_tokens),
            _n(line.cache_read_tokens),
            _n(line.cache_write_tokens),
            _n(line.cache_write_1h_tokens),
            _n(line.total_tokens),
            _usd(line.cost_usd, line.unpriced_invocations),
            end_section=m is not None and m is summary.models[-1],
        )
    console.print(models)
    if summary.published is not None:
        p = summary.published
        console.print(
            f"published {p.events} events ({p.graph_parts} graph parts, {p.model_calls} model calls): "
            f"{p.stored} new, {p.duplicates} already in the stream"
        )
    elif summary.dry_run:
        console.print("dry run: nothing was published")
    if summary.sessions_not_imported:
        console.print(
            f"{summary.sessions_not_imported} session(s) not imported, not counted in the totals above:",
            highlight=False,
        )
        for s in summary.sessions:
            if s.imported is False:
                name = s.title or s.vendor_session_id or s.session_id
                console.print(f"  {name} ({s.source_path}): {s.not_imported}", markup=False, highlight=False)
    if summary.rows_cut:
        console.print(f"{summary.rows_cut} row(s) cut to fit a message (marked cos_import_cut, with their size)")
    for warning in summary.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}", markup=True, highlight=False)
    for error in summary.errors:
        console.print(f"[red]error:[/red] {escape(error)}", markup=True, highlight=False)


def emit(summary: ImportSummary, output_format: str) -> None:
    if output_format == "json":
        sys.stdout.write(summary_json(summary).decode() + "\n")
        sys.stdout.flush()
    else:
        # Piped output is not cut to 80 columns: a table of numbers is no use wrapped.
        print_table(summary, Console(highlight=False, width=None if sys.stdout.isatty() else 200))


# --- command -------------------------------------------------------------------------------------


def _nats_settings() -> Settings:
    from commonos.runtime.system import endpoints

    settings = Settings.from_env()
    if settings.nats_url:
        return settings
    return dataclasses.replace(settings, nats_url=endpoints(settings).nats_url)


def _profile_id(raw: str) -> str:
    from commonos.proto.tags import InvalidProfileId, check_profile_id

    try:
        return check_profile_id(raw)
    except InvalidProfileId as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def run_import(args: argparse.Namespace) -> int:
    """The handler of ``cos import claude|codex``."""
    source = SOURCES[args.source]
    root = Path(args.path).expanduser()
    if not root.exists():
        raise CliError(f"{root} does not exist")
    if args.watch and args.dry_run:
        raise CliError("--watch publishes as transcripts grow; it cannot be combined with --dry-run")
    if args.interval_s <= 0 or args.settle_s < 0:
        raise CliError("--interval must be above 0 and --settle at least 0")
    pricer = Pricer()
    progress = not args.no_progress
    if args.dry_run:
        run = asyncio.run(
            import_files(
                source,
                root,
                pricer,
                publish=None,
                settle_s=args.settle_s,
                progress=progress,
                jobs=args.jobs,
                profile=args.profile,
            )
        )
        published: PublishCounts | None = None
    else:
        settings = _nats_settings()
        run = asyncio.run(_publish_run(source, root, pricer, settings, args, progress))
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
    async with nats_publisher(settings, claim=(profile, source.vendor)) as (publish, max_payload):
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
            say=lambda line: err.print(line, markup=False),
            profile=args.profile,
        )
        err.print(f"watching {root} every {args.interval_s:g}s; Ctrl-C stops", markup=False)
        return await watcher.run_until(stop)


def register(sub: Any) -> None:
    imp = sub.add_parser(
        "import",
        help="import Claude Code or Codex transcripts as session graphs and billed model calls",
        description="Read agent transcripts, publish each session tree as events and summarise them.",
    )
    vendors = imp.add_subparsers(dest="import_source", metavar="SOURCE", required=True)
    for name, what in (("claude", "Claude Code"), ("codex", "Codex")):
        source = SOURCES[name]
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
