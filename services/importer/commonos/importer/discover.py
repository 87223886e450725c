"""Find transcript files under a vendor's folder.

Incremental-friendly by construction: the adapters mint every id from vendor identity (session
ids, message ids, tool-call ids, line uuids, or the ordinal of an append-only event), never from
a byte or line offset that could shift, so re-reading a transcript that has grown keeps every id
it already produced and only adds rows.

Only regular files are transcripts: a FIFO, device or socket with a transcript's name (or a symlink
to one) is never listed here; `skipped_files` names them, for a warning.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from commonos.importer.lines import special_kind


def readable(paths: Iterable[Path]) -> list[Path]:
    """`paths` without FIFOs, devices and sockets (or symlinks to them)."""
    return [path for path in paths if special_kind(path) is None]


def skipped_files(paths: Iterable[Path]) -> list[tuple[Path, str]]:
    """The FIFOs, devices and sockets (or symlinks to them) among `paths`, with what each is."""
    found = []
    for path in paths:
        kind = special_kind(path)
        if kind is not None:
            found.append((path, kind))
    return found
