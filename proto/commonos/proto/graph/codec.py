"""Encoding and decoding graphs as JSON, with the Go package's field names.

msgspec cannot decode ``Raw | None``, so graphs are decoded through wire twins of the two messages with
an ``omitempty`` JSON field (``AssistantMessage.content``, ``ToolResult.output``): a graph decoded and
encoded again is byte-identical in its JSON-valued fields.
"""

from __future__ import annotations

import msgspec

from commonos.proto.graph.model import (
    AssistantMessage,
    FileTouch,
    Graph,
    ModelInvocation,
    Session,
    SessionAttribute,
    TokenUsage,
    ToolResult,
    ToolUse,
    UserInput,
    VendorID,
)


class _WireAssistantMessage(AssistantMessage, frozen=True, kw_only=True):
    content: msgspec.Raw = msgspec.Raw()


class _WireToolResult(ToolResult, frozen=True, kw_only=True):
    output: msgspec.Raw = msgspec.Raw()


def _raw_or_none(raw: msgspec.Raw) -> msgspec.Raw | None:
    return raw if len(raw) and bytes(raw) != b"null" else None


class WireGraph(msgspec.Struct, kw_only=True):
    """Decoding shape: accepts Go's ``null`` for a nil slice and raw JSON in omitempty fields (`from_wire`
    makes the `Graph`); a message holding a graph decodes its field as this (`TranscriptImported`)."""

    sessions: list[Session] | None = None
    session_attributes: list[SessionAttribute] | None = None
    user_inputs: list[UserInput] | None = None
    model_invocations: list[ModelInvocation] | None = None
    assistant_messages: list[_WireAssistantMessage] | None = None
    tool_uses: list[ToolUse] | None = None
    tool_results: list[_WireToolResult] | None = None
    file_touches: list[FileTouch] | None = None
    token_usage: list[TokenUsage] | None = None
    vendor_ids: list[VendorID] | None = None


_graph_encoder = msgspec.json.Encoder()
_graph_decoder = msgspec.json.Decoder(WireGraph)


def encode_graph(graph: Graph) -> bytes:
    """Encode a graph to JSON with the Go package's field names."""
    return _graph_encoder.encode(graph)


def decode_graph(data: bytes) -> Graph:
    """Decode a graph from JSON; a ``null`` list (Go's nil slice) decodes as empty."""
    try:
        wire = _graph_decoder.decode(data)
    except RecursionError:
        raise msgspec.DecodeError("JSON nested too deeply") from None
    return from_wire(wire)


def from_wire(wire: WireGraph) -> Graph:
    """The graph a decoded `WireGraph` holds: a ``null`` list is empty, an empty or ``null`` omitempty field None."""
    return Graph(
        sessions=wire.sessions or [],
        attributes=wire.session_attributes or [],
        user_inputs=wire.user_inputs or [],
        model_invocations=wire.model_invocations or [],
        assistant_messages=[
            AssistantMessage(**{**msgspec.structs.asdict(m), "content": _raw_or_none(m.content)})
            for m in wire.assistant_messages or []
        ],
        tool_uses=wire.tool_uses or [],
        tool_results=[
            ToolResult(**{**msgspec.structs.asdict(r), "output": _raw_or_none(r.output)})
            for r in wire.tool_results or []
        ],
        file_touches=wire.file_touches or [],
        token_usage=wire.token_usage or [],
        vendor_ids=wire.vendor_ids or [],
    )
