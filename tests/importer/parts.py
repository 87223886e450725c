"""Checking the parts an imported graph is published in: sizes, order, validity, and that they add up.

Shared by the importer's tests and its fuzz target.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from commonos.importer.cut import CUTTABLE, is_cut
from commonos.importer.events import message_size
from commonos.importer.parts import part_budget
from commonos.journal_writer.graph_projection import GraphProjection
from commonos.proto.events import TranscriptImported, decode_event, encode_event
from commonos.proto.graph import GRAPH_LISTS, Graph, validate

LISTS = GRAPH_LISTS


def row_key(name: str, row: Any) -> str:
    if name == "vendor_ids":
        return "/".join((str(row.our_type), row.vendor, row.vendor_id_kind, row.vendor_id))
    return str(row.id)


def _references(name: str, row: Any) -> list[str | None]:
    """The ids a row's foreign keys name (graph_schema): each must be stored before the row."""
    if name == "sessions":
        return [row.parent_session_id]
    if name in ("attributes", "vendor_ids"):
        return [row.session_id]
    if name == "user_inputs":
        return [row.session_id]
    if name == "model_invocations":
        return [row.session_id, row.user_input_id, row.parent_model_invocation_id]
    if name in ("assistant_messages", "tool_uses"):
        return [row.session_id, row.user_input_id, row.model_invocation_id]
    if name in ("tool_results", "file_touches"):
        return [row.session_id, row.user_input_id, row.tool_use_id]
    if name == "token_usage":
        return [row.session_id, row.user_input_id]
    raise AssertionError(name)


def check_parts(graph: Graph, events: Sequence[TranscriptImported], max_payload: int) -> int:
    """Assert that `events` publish `graph` as the importer's contract says; returns how many rows were cut.

    * one self-contained event fits max_payload (headers included); several parts, numbered 1..n and not
      self-contained, each fit the part budget;
    * every part passes `validate` (partial for a part of several) and the graph-writer's check;
    * stored in stream order, every row's foreign keys name rows stored before it;
    * the parts hold every row of the graph exactly once, each as it is, or cut (same key, every field
      that may not be cut unchanged, every field that changed carrying the marker).
    """
    assert events, "a graph with rows has at least one part"
    several = len(events) > 1 or not events[0].self_contained
    stored: set[str] = set()
    seen: dict[str, dict[str, Any]] = {name: {} for name in LISTS}
    projection = GraphProjection()
    for number, event in enumerate(events, start=1):
        assert (event.part, event.parts) == (number, len(events))
        assert event.self_contained is not several
        size = message_size(event)
        assert size <= (part_budget(max_payload) if several else max_payload), (number, size)
        received = _received(event)
        part = received.graph
        validate(part, partial=several)
        projection.check(received)
        for name in LISTS:
            for row in getattr(part, name):
                for ref in _references(name, row):
                    assert ref is None or ref in stored, f"part {number}: {name} {row_key(name, row)} names {ref}"
                key = row_key(name, row)
                assert key not in seen[name], f"{name} {key} is in two parts"
                seen[name][key] = row
                if name != "vendor_ids":
                    stored.add(row.id)
    cut = 0
    for name in LISTS:
        original = {row_key(name, row): row for row in getattr(graph, name)}
        assert set(seen[name]) == set(original), name
        for key, row in original.items():
            published = seen[name][key]
            if published == row:
                continue
            cut += 1
            cuttable = {field for field, _ in CUTTABLE.get(name, ())}
            for field in row.__struct_fields__:
                before, after = getattr(row, field), getattr(published, field)
                if before != after:
                    assert field in cuttable and is_cut(after), (name, key, field)
    return cut


def _received(event: TranscriptImported) -> TranscriptImported:
    """The event as the graph-writer receives it (decoded from its payload)."""
    received = decode_event(encode_event(event))
    assert isinstance(received, TranscriptImported)
    return received


def reassembled(events: Sequence[TranscriptImported]) -> Graph:
    """The rows of every part, list by list, in the order they were published."""
    lists: dict[str, list[Any]] = {name: [] for name in LISTS}
    for event in events:
        part = _received(event).graph
        for name in LISTS:
            lists[name] += getattr(part, name)
    return Graph(**lists)


def encoded_rows(graph: Graph) -> dict[str, set[bytes]]:
    return {name: {msgspec.json.encode(row) for row in getattr(graph, name)} for name in LISTS}
