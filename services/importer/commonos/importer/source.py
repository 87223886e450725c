"""What the importer needs to know of a transcript vendor: a `Source`, defined by the vendor's module.

A `Source` says where the vendor keeps its transcripts (its default folder and which names under it
are transcripts), how to read one into session trees and which file a changed file belongs to. The
registry of every vendor is :mod:`commonos.importer.vendors`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from commonos.importer.discover import readable, skipped_files
from commonos.importer.lines import Warn, skipped_warning
from commonos.importer.model import ImportedSession
from commonos.proto.vendors import MODEL_MAKERS

#: Size and modification time (ns) of each transcript file.
Fingerprint = dict[Path, tuple[int, int]]


class Reader(Protocol):
    """Reads one top-level transcript into its session trees as `profile`'s (None: the vendor's default
    profile; the profile is part of the root session's id); `warn` hears of input it skipped."""

    def __call__(self, path: Path, warn: Warn | None = None, profile: str | None = None) -> list[ImportedSession]: ...


def owned_by_itself(path: Path, tops: set[Path]) -> Path | None:
    """The `owner_of` of a vendor whose every transcript file is read on its own."""
    return path


@dataclass(frozen=True)
class Source:
    """One vendor's transcripts: which files to read, how, and which file a changed file belongs to."""

    #: The subcommand: ``cos import <command>``.
    command: str
    #: The vendor's name in graphs, events and tags (``vendor:<vendor>``), and its default profile.
    vendor: str
    #: What people call it, for help texts ("Claude Code").
    label: str
    default_root: str
    #: The top-level transcripts under a root: each is read with one call of `read`.
    top_files: Callable[[Path], list[Path]]
    #: Every name that looks like a transcript, whatever kind of file it is.
    candidates: Callable[[Path], list[Path]]
    read: Reader
    #: The top-level file to read again when a file changes (None: none), given the top-level files.
    owner_of: Callable[[Path, set[Path]], Path | None] = owned_by_itself
    #: Where the vendor keeps its transcripts, for the warning about a file that is not in such a place.
    layout: str = ""

    @property
    def provider(self) -> str:
        """The pricing provider of its models (``model_call_completed.provider``): its model maker
        (`commonos.proto.vendors.MODEL_MAKERS`), or its own name."""
        return MODEL_MAKERS.get(self.vendor, self.vendor)

    def unread_warning(self, path: Path) -> str:
        """The warning for a transcript-like file under the root that no read took in."""
        where = f" (transcripts are {self.layout})" if self.layout else ""
        return f"{path}: not imported: not where {self.label} keeps its transcripts{where}"

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
