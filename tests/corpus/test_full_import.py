"""The shared corpus imported for real stores what its dry run counts, with 1 MiB and 64 KiB messages.

`cos import claude|codex` against the real pipeline (nats-server, the graph-writer, billing,
PostgreSQL): every graph row the adapters produce is stored, and `cos report cost --group-by model`
equals `cos import --dry-run` model by model, tokens and cost. With 64 KiB messages the corpus's
largest graphs go in many parts and its few rows over a part's size are cut, which changes no count.
"""

from __future__ import annotations

from commonos.importer.claude import read_claude
from commonos.importer.codex import read_codex
from commonos.runtime.embedded import NatsServer
from tests.importer.pipeline import graph_counts, import_and_compare, table_counts
from tests.importer.transcripts import CORPUS, needs_corpus


@needs_corpus
async def test_the_corpus_imported_equals_its_dry_run(sized_nats_server: NatsServer, database_url: str) -> None:
    sources = [(CORPUS / "claude", "claude"), (CORPUS / "codex", "codex")]
    claude, codex = await import_and_compare(sources, sized_nats_server.url, database_url)
    graphs = [t.graph for t in (*read_claude(CORPUS / "claude"), *read_codex(CORPUS / "codex"))]
    assert await table_counts(database_url) == graph_counts(graphs)
    assert len(claude["sessions"]) + len(codex["sessions"]) == len(graphs) == 15
    assert claude["published"]["graph_parts"] > len(claude["sessions"]), "the largest graphs go in several parts"
    assert claude["warnings"] == codex["warnings"] == []
