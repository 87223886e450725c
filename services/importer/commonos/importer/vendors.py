"""The registry of transcript vendors: every `Source` the importer knows, listed once.

Discovery, reading, the ``cos import <vendor>`` subcommands (their names, help and default folders),
the default profile and the pricing provider of imported model calls all come from here. Adding a
vendor is a module that reads its transcripts and defines its `Source` (as ``commonos.importer.codex``
does), and one line in `VENDORS`.
"""

from __future__ import annotations

from typing import Final

from commonos.importer import claude, codex
from commonos.importer.source import Source
from commonos.proto.vendors import MODEL_MAKERS

#: Every vendor, in the order ``cos import --help`` lists them.
VENDORS: Final[tuple[Source, ...]] = (
    claude.SOURCE,
    codex.SOURCE,
)

#: The vendors by subcommand (``cos import claude``).
SOURCES: Final[dict[str, Source]] = {source.command: source for source in VENDORS}


def provider_of(vendor: str) -> str:
    """The pricing provider of a vendor's models (`commonos.proto.vendors.MODEL_MAKERS`); another vendor is its
    own provider."""
    return MODEL_MAKERS.get(vendor, vendor)


def labels() -> str:
    """The vendors' names for a help text: "A or B", "A, B or C"."""
    names = [source.label for source in VENDORS]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
