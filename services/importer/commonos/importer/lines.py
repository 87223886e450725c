"""Reading transcript files with bounded effort: regular files only, one line at a time, each line capped.

A transcript folder is someone else's: a name ending in ``.jsonl`` may be a FIFO (opening it for
reading waits for a writer forever), a device (``/dev/zero`` never ends), a socket, or a symlink to
one of these. The importer reads regular files only; the others are skipped with a warning naming
them. A file is opened without blocking and checked on the open descriptor, so a file swapped for a
FIFO after it was listed cannot hang the import either.

Lines are read one at a time, never the whole file at once, and a line longer than
`MAX_LINE_BYTES` is skipped with a warning giving its file and line number: it is read past in
chunks, so it never takes more memory than the cap.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Final

import msgspec

from commonos.importer.model import TranscriptError
from commonos.proto.errors import DataError

#: The longest transcript line the importer reads (64 MiB); a longer one is skipped with a warning.
MAX_LINE_BYTES: Final = 64 * 1024 * 1024
#: How much of a line over the cap is read at a time while skipping it.
_SKIP_CHUNK: Final = 1024 * 1024
#: A transcript up to this size is read in one go (it cannot hold a line over the cap).
_READ_WHOLE_BYTES: Final = 32 * 1024 * 1024
_decoder: Final = msgspec.json.Decoder()

#: Receives one warning (a line naming the file) about input the importer skipped.
Warn = Callable[[str], None]

log = logging.getLogger("commonos.importer")


def log_warning(message: str) -> None:
    """The `Warn` of a reader called without one: the warning is logged."""
    log.warning("%s", message)


class NotRegularFile(DataError):
    """A transcript path that is not a regular file (a FIFO, a device, a socket); it is never read.

    Not an OSError: nothing opens such a file, and every caller of `open_regular` catches this by name.
    """

    def __init__(self, path: Path, kind: str) -> None:
        super().__init__(f"{path}: not a regular file ({kind})")
        self.path = path
        self.kind = kind

    def warning(self) -> str:
        return f"{self.path}: skipped: not a regular file ({self.kind})"


def _kind_of(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a file"


def special_kind(path: Path) -> str | None:
    """What `path` is when it is a FIFO, a device or a socket, or a symlink to one; None otherwise.

    A regular file, a directory (reading it is an error, as before) and a path that is gone are None.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    kind = _kind_of(mode)
    try:
        linked = stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        linked = False
    return f"a symlink to {kind.removeprefix('a ')}" if linked else kind


def skipped_warning(path: Path, kind: str) -> str:
    return NotRegularFile(path, kind).warning()


def open_regular(path: Path) -> BinaryIO:
    """Open a regular file for reading; NotRegularFile for anything else, without ever blocking on it.

    A directory raises IsADirectoryError and a missing file FileNotFoundError, as ``open`` does.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(mode):
            raise NotRegularFile(path, _kind_of(mode))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def iter_lines(
    handle: BinaryIO, path: Path, warn: Warn, max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[tuple[int, bytes]]:
    """(line number, line without its line break) of every line, as ``bytes.splitlines`` numbers them.

    A line longer than `max_line_bytes` is read past in chunks, reported to `warn` with its file and
    line number, and not yielded.
    """
    number = 0
    while True:
        chunk = handle.readline(max_line_bytes + 1)
        if not chunk:
            return
        if len(chunk) > max_line_bytes and not chunk.endswith(b"\n"):
            number += 1
            skipped = len(chunk)
            while True:
                rest = handle.readline(_SKIP_CHUNK)
                skipped += len(rest)
                if not rest or rest.endswith(b"\n"):
                    break
            warn(
                f"{path}:{number}: line skipped: it is {skipped} bytes, longer than the "
                f"{max_line_bytes}-byte limit for one transcript line"
            )
            continue
        if b"\r" not in chunk:  # the common case: one line, ending in \n (or at the end of the file)
            number += 1
            yield number, chunk[:-1] if chunk.endswith(b"\n") else chunk
            continue
        # `bytes.splitlines` of the whole file breaks at \r, \n and \r\n; keep its numbering.
        for piece in chunk.splitlines() or [b""]:
            number += 1
            yield number, piece


def json_object_lines(path: Path, warn: Warn) -> tuple[list[tuple[dict[str, Any], str]], int]:
    """Every JSON object line of a transcript with its `file:line` reference, and the bytes read.

    Blank lines, lines that are not JSON (a torn last line of a file still being written) and JSON that
    is not an object are passed over. A file removed since it was listed has no lines, nor has one that
    is not a regular file (`warn` is told); one that cannot be read is a `TranscriptError`.
    """
    records: list[tuple[dict[str, Any], str]] = []
    size = 0
    try:
        with open_regular(path) as handle:
            if os.fstat(handle.fileno()).st_size <= _READ_WHOLE_BYTES:
                # No line can be over the cap: one read and one split are much faster than a readline each.
                data = handle.read()
                # `bytes.splitlines` breaks at \r too; without one, splitting at \n is the same, and faster.
                pieces = data.splitlines() if b"\r" in data else data.split(b"\n")
                if pieces and not pieces[-1] and b"\r" not in data:
                    pieces.pop()  # the empty piece after the last line break
                numbered: Iterable[tuple[int, bytes]] = enumerate(pieces, start=1)
            else:
                numbered = iter_lines(handle, path, warn)
            name = path.name
            for number, raw in numbered:
                if not raw.strip():
                    continue
                try:
                    decoded = _decoder.decode(raw)
                except msgspec.DecodeError:
                    continue
                if isinstance(decoded, dict):
                    records.append((decoded, f"{name}:{number}"))
            size = handle.tell()
    except FileNotFoundError:
        return [], 0
    except NotRegularFile as exc:
        warn(exc.warning())
        return [], 0
    except OSError as exc:
        raise TranscriptError(path, str(exc.strerror or exc)) from None
    return records, size
