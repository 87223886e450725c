"""Reading one top-level transcript: its trees, each validated and summarised, and with their events
when the import publishes. Pure but for reading the file; the same in a reader process as here."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from commonos.importer.events import tree_events
from commonos.importer.ledger import Ledger, TreeCalls, tree_calls
from commonos.importer.lines import Warn
from commonos.importer.model import ImportedSession, TranscriptError
from commonos.importer.parts import GraphTooLarge
from commonos.importer.report import SessionSummary, describe_tree
from commonos.importer.source import Source
from commonos.proto.events import Event, EventInvalid
from commonos.proto.graph import GraphInvalid, validate


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
        read = source.read(path, warn, profile)
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


def bytes_of(path: Path, trees: Sequence[TreeRead]) -> int:
    read = [t.imported.source_bytes for t in trees if t.imported is not None]
    with contextlib.suppress(OSError):
        read.append(path.stat().st_size)
    return max(read, default=0)


@dataclass
class TreeOut:
    """One tree of a file: its summary (not yet accounted, see `report.account`), its calls for the
    import's `Ledger`, and its events, or why it cannot be published."""

    summary: SessionSummary
    calls: TreeCalls
    events: list[Event] = field(default_factory=list)
    error: str | None = None


@dataclass
class FileRead:
    """What one top-level transcript gave: a summary and events per tree, errors and warnings."""

    trees: list[TreeOut] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    bytes_read: int = 0
    #: Every file read (the top-level one, its subagents'...), so that an import can name the files it did not.
    files: set[Path] = field(default_factory=set)


def read_file(
    source: Source,
    path: Path,
    *,
    ledger: Ledger | None,
    max_payload: int,
    settle_s: float,
    profile: str | None = None,
) -> FileRead:
    """Read and validate one top-level file: each tree's description and calls; with a `ledger` (the
    second pass of a publishing import), each tree's events too, its calls settled by the ledger.

    A file written to within ``settle_s`` seconds may end in a response still being written: the calls
    whose usage may still grow are left for a later import (see ``settled_invocations``).
    """
    out = FileRead(files={path})
    settled_only = time.time() - mtime(path) < settle_s
    trees = read_trees(source, path, out.warnings.append, profile)
    for tree in trees:
        if tree.imported is None:
            out.errors.append(tree.error or f"{path}: unreadable")
            continue
        out.files.update(tree.imported.source_files)
        item = TreeOut(describe_tree(tree.imported), tree_calls(tree.imported))
        out.trees.append(item)
        if ledger is None:
            continue
        imported, billed_elsewhere = ledger.settle(tree.imported)
        try:
            events = tree_events(imported, max_payload=max_payload, settled_only=settled_only)
        except (GraphTooLarge, GraphInvalid, EventInvalid) as exc:
            item.error = f"not published: {exc}"
            continue
        billed_here = [c for c in events.calls if events.invocation_of[c.event_id] not in billed_elsewhere]
        item.events = [*events.parts, *billed_here]
        item.summary.rows_cut = events.cut_rows
    out.bytes_read = bytes_of(path, trees)
    return out


def mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
