"""Reading transcripts in forked processes while this one publishes, taking the results in file order."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import multiprocessing
import os
import signal
from collections.abc import AsyncGenerator, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from commonos.importer.ledger import Ledger
from commonos.importer.reading import FileRead, read_file
from commonos.importer.source import Source
from commonos.runtime.args import CliError


def default_jobs() -> int:
    """Reader processes for an import: one per usable core where processes can be forked, else none."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# Set in each reader process by `_start_reader`: the process is forked, so nothing here is pickled (the
# ledger of a publishing import's second pass included).
_reader: tuple[Source, Ledger | None, int, float, str | None] | None = None


#: The cyclic garbage collector's first threshold while transcripts are read (the default is 700): reading
#: allocates many dicts and makes few cycles, and collecting that often cost 7 % of the reading time.
READING_GC_THRESHOLD = 50_000


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """Run the cyclic garbage collector less often for the block."""
    before = gc.get_threshold()
    gc.set_threshold(READING_GC_THRESHOLD, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


def _start_reader(
    source: Source, ledger: Ledger | None, max_payload: int, settle_s: float, profile: str | None
) -> None:
    global _reader
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    gc.set_threshold(READING_GC_THRESHOLD, *gc.get_threshold()[1:])
    _reader = (source, ledger, max_payload, settle_s, profile)


def _read_in_reader(path: Path) -> FileRead:
    assert _reader is not None, "not a reader process"
    source, ledger, max_payload, settle_s, profile = _reader
    return read_file(source, path, ledger=ledger, max_payload=max_payload, settle_s=settle_s, profile=profile)


async def read_files(
    source: Source,
    paths: Sequence[Path],
    *,
    ledger: Ledger | None,
    max_payload: int,
    settle_s: float,
    profile: str | None,
    jobs: int,
) -> AsyncGenerator[FileRead, None]:
    """What `read_file` gives for each of `paths`, in their order, read by `jobs` forked processes (or
    here, with one). Close it (``contextlib.aclosing``) to stop the readers when the caller stops early."""
    if jobs == 1:
        for path in paths:
            with fewer_collections():
                read = read_file(
                    source, path, ledger=ledger, max_payload=max_payload, settle_s=settle_s, profile=profile
                )
            yield read
        return
    pool = ProcessPoolExecutor(
        jobs,
        mp_context=multiprocessing.get_context("fork"),
        initializer=_start_reader,
        initargs=(source, ledger, max_payload, settle_s, profile),
    )
    try:
        waiting = iter(paths)
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
            yield read
    except BrokenProcessPool as exc:
        raise CliError(f"a reader process died ({exc}); try again with --jobs 1") from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
