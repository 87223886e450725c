"""The coding agents whose work we bring in (transcripts by `cos import`, telemetry by the OTLP gateway).

A vendor's name is its import profile's id (`cos import` without `--profile`), the `vendor:` tag of its
sessions, the `provider` of its model calls (priced as its model maker's: `MODEL_MAKERS`) and part of the ids
minted from its identifiers (`commonos.proto.graph.ids.vendor_scope`): defined here once for the importer, the
gateway, billing and the console.
"""

from __future__ import annotations

from typing import Final

CLAUDE_CODE: Final = "claude-code"
CODEX: Final = "codex"
#: Every vendor, in the order the console lists them.
VENDORS: Final = (CLAUDE_CODE, CODEX)
#: The company whose public prices a vendor's calls are billed at.
MODEL_MAKERS: Final = {CLAUDE_CODE: "anthropic", CODEX: "openai"}
