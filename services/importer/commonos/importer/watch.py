"""``cos import --watch``: following growing transcripts, publishing what each change adds."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from commonos.importer.events import TreeState
from commonos.importer.ledger import Ledger
from commonos.importer.reading import mtime, read_trees
from commonos.importer.run import ImportRun, PublishFn, import_tree
from commonos.importer.source import Fingerprint, Source
from commonos.runtime.limits import DEFAULT_MAX_PAYLOAD

if TYPE_CHECKING:  # `cos import` loads genai-prices only when it prices (see `import_files`)
    from commonos.accounting.pricing import Pricer


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
    #: Every call seen so far, so that a response repeated in another file is billed once.
    ledger: Ledger = field(default_factory=Ledger)
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
            recent = now_wall - mtime(path) < self.settle_s
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
                counts = await import_tree(
                    self.run,
                    tree.imported,
                    self.pricer,
                    self.publish,
                    self.max_payload,
                    state=state,
                    settled_only=settled_only,
                    ledger=self.ledger,
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
