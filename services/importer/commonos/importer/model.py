"""What an adapter hands to the rest of the importer: one session tree and where it came from."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import msgspec

from commonos.proto.errors import DataError
from commonos.proto.graph import Graph


class ImportedSession(msgspec.Struct, frozen=True, kw_only=True):
    """One top-level session tree read from a transcript, with its provenance.

    ``project`` is the Claude Code project folder name or the basename of Codex's cwd;
    ``source_bytes`` is the size of every file read to build the tree, so a watcher can tell a
    transcript has grown.
    """

    graph: Graph
    vendor: str
    project: str | None
    branch: str | None
    source_path: Path
    source_bytes: int
    #: What the vendor's own records say the tree's calls cost in USD (Claude Code's ``cost-state`` lines);
    #: None when the transcript has no such figure.
    vendor_cost_usd: Decimal | None = None
    #: The tokens the vendor's own records count for the tree, by kind (``input_tokens``, ``output_tokens``,
    #: ``cache_read_tokens``, ``cache_write_tokens``), where they state them; None when they do not.
    vendor_tokens: dict[str, int] | None = None
    #: Every file read to build the tree (the one named by ``source_path`` and, say, its subagents').
    source_files: tuple[Path, ...] = ()
    #: The profile the import belongs to (``cos import --profile``); None: the vendor's (``profile_id_for``).
    profile_id: str | None = None
    #: Of each user input whose transcript line names its prompt (Claude Code's ``promptId``): the vendor's
    #: session id on that line and the prompt id, from which its calls' turn is minted (`vendor_turn_id`).
    input_prompts: dict[str, tuple[str, str]] = {}


class TranscriptError(DataError):
    """A transcript whose content cannot be mapped (a field of an unexpected shape); names the file."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: cannot read this transcript: {reason}")
        self.path = path


#: What mapping content of an unexpected shape raises (a str where a dict was expected, ...).
_SHAPE_ERRORS = (TypeError, ValueError, KeyError, AttributeError, IndexError, RecursionError, msgspec.ValidationError)


@contextlib.contextmanager
def shape_errors_as_transcript_errors(path: Path) -> Iterator[None]:
    """Turn an error from content of an unexpected shape into a `TranscriptError` naming `path`."""
    try:
        yield
    except TranscriptError:
        raise
    except _SHAPE_ERRORS as exc:
        raise TranscriptError(path, f"{type(exc).__name__}: {exc}") from exc
