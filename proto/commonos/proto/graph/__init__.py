"""The vendor-neutral session graph: the shape an adapter emits and a store writes.

This mirrors the Go package ``session`` (v0.1.0-rc.2) field for field and JSON name for JSON name.
Every id in a Graph is one of ours (see :func:`mint_id`); vendor identifiers live only in
:class:`VendorID` rows. The package does no I/O and knows no vendor. Its modules:

* :mod:`~commonos.proto.graph.model`: the enums, the row Structs and `Graph`;
* :mod:`~commonos.proto.graph.codec`: `encode_graph` and `decode_graph` (JSON, Go's field names);
* :mod:`~commonos.proto.graph.ids`: `mint_id`, our stable ids;
* :mod:`~commonos.proto.graph.validation`: `validate` and `GraphInvalid`.

Everything is importable from here, as before the split.
"""

from __future__ import annotations

from commonos.proto.graph.codec import decode_graph, encode_graph
from commonos.proto.graph.ids import mint_id
from commonos.proto.graph.model import (
    GRAPH_LISTS,
    JSON_NULL,
    SPEED_FAST,
    SPEED_STANDARD,
    SPEED_ULTRAFAST,
    SUBAGENT_DETAIL_KEY,
    AssistantMessage,
    EntityType,
    FileTouch,
    Graph,
    Hunk,
    InputKind,
    InputOrigin,
    ModelInvocation,
    Outcome,
    Session,
    SessionAttribute,
    SpawnLink,
    SubagentDetail,
    TokenBasis,
    TokenUsage,
    ToolResult,
    ToolStatus,
    ToolUse,
    ToolVerb,
    TouchKind,
    UsageScope,
    UserInput,
    VendorID,
    speed_valid,
    with_subagent_detail,
)
from commonos.proto.graph.validation import GraphInvalid, validate

__all__ = [
    "GRAPH_LISTS",
    "JSON_NULL",
    "SPEED_FAST",
    "SPEED_STANDARD",
    "SPEED_ULTRAFAST",
    "SUBAGENT_DETAIL_KEY",
    "AssistantMessage",
    "EntityType",
    "FileTouch",
    "Graph",
    "GraphInvalid",
    "Hunk",
    "InputKind",
    "InputOrigin",
    "ModelInvocation",
    "Outcome",
    "Session",
    "SessionAttribute",
    "SpawnLink",
    "SubagentDetail",
    "TokenBasis",
    "TokenUsage",
    "ToolResult",
    "ToolStatus",
    "ToolUse",
    "ToolVerb",
    "TouchKind",
    "UsageScope",
    "UserInput",
    "VendorID",
    "decode_graph",
    "encode_graph",
    "mint_id",
    "speed_valid",
    "validate",
    "with_subagent_detail",
]
