"""Splitting a session graph into parts that each fit one message (pure: nothing here does I/O).

The rows go in the graph's insertion order: sessions, attributes, user inputs, model invocations,
assistant messages, then tool uses each with its result and file touches, token usage and vendor ids,
every row with its vendor ids, so that a part refers only to rows of the same part or of earlier ones.
A row too large for a part on its own (a 5 MB tool result) has its large text and JSON fields cut to
fit, with a marker giving the original size (see :mod:`commonos.importer.cut`); token counts are never
cut, and the summary counts such rows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from commonos.importer.cut import RowTooLarge, cut_row, row_size
from commonos.proto.errors import DataError
from commonos.proto.graph import GRAPH_LISTS, Graph

#: The most a part of a graph published in several takes, headers included (see `part_budget`).
PART_BYTES: Final = 256 * 1024
#: Below this much room for rows beside an event's own fields, a part is not worth sending.
_MIN_PART_ROOM: Final = 1024
_LISTS: Final = GRAPH_LISTS

_row_encoder: Final = msgspec.json.Encoder()


class GraphTooLarge(DataError):
    """A graph that cannot be published in parts that each fit one message; the message says why."""


RowKey = tuple[str, str]
#: A row of a GraphRows: its list's name and its index in that list.
RowRef = tuple[str, int]


def part_budget(max_payload: int) -> int:
    """The most one part of a graph published in several may take, headers included."""
    return min(PART_BYTES, max_payload // 2)


def _row_key(list_name: str, row: Any) -> RowKey:
    if list_name == "vendor_ids":
        natural = [str(row.our_type), row.vendor, row.vendor_id_kind, row.vendor_id]
        return list_name, msgspec.json.encode(natural).decode()
    return list_name, str(row.id)


def _canonical_size(encoded: bytes) -> int:
    """Bytes a row takes in an event: the event carries the graph decoded and encoded again."""
    return len(_row_encoder.encode(msgspec.json.decode(encoded)))


class GraphRows:
    """A graph's rows with their encodings and digests (what a watcher compares)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.lists: dict[str, list[Any]] = {name: list(getattr(graph, name)) for name in _LISTS}
        self.encoded: dict[str, list[bytes]] = {
            name: [_row_encoder.encode(row) for row in rows] for name, rows in self.lists.items()
        }
        self._sizes: dict[str, list[int]] | None = None

    def refs(self) -> list[RowRef]:
        """Every row, list by list in the graph's order."""
        return [(name, index) for name in _LISTS for index in range(len(self.lists[name]))]

    def size(self, list_name: str, index: int) -> int:
        """Bytes the row takes in an event's graph, with the comma that separates it from the next."""
        if self._sizes is None:
            self._sizes = {name: [_canonical_size(e) + 1 for e in rows] for name, rows in self.encoded.items()}
        return self._sizes[list_name][index]

    def digest(self, list_name: str, index: int) -> bytes:
        return hashlib.blake2b(self.encoded[list_name][index], digest_size=16).digest()

    def key(self, list_name: str, index: int) -> RowKey:
        return _row_key(list_name, self.lists[list_name][index])


def _items(rows: GraphRows, selected: set[RowRef] | None) -> list[list[RowRef]]:
    """The selected rows in insertion order, grouped with the rows that belong with them.

    Sessions, attributes, user inputs, model invocations and assistant messages one by one; then each
    tool use with its result and file touches; then results and touches whose tool use is not
    selected, token usage rows and the vendor ids of rows not selected. Every row comes with its
    vendor ids. Every row a foreign key names comes in the same group or an earlier one, so groups
    stored one after the other never name a row that is not stored yet (a nested session names its
    spawning tool use, which comes later, but that column has no foreign key; see graph_schema).
    """
    lists = rows.lists

    def chosen(name: str, index: int) -> bool:
        return selected is None or (name, index) in selected

    vendor_rows: dict[str, list[int]] = {}
    for index, vendor_row in enumerate(lists["vendor_ids"]):
        if chosen("vendor_ids", index):
            vendor_rows.setdefault(vendor_row.our_id, []).append(index)

    def with_vendor_ids(refs: list[RowRef]) -> list[RowRef]:
        out = list(refs)
        for name, index in refs:
            out += [("vendor_ids", v) for v in vendor_rows.pop(lists[name][index].id, ())]
        return out

    items: list[list[RowRef]] = []
    for name in ("sessions", "attributes", "user_inputs", "model_invocations", "assistant_messages"):
        items += [with_vendor_ids([(name, i)]) for i in range(len(lists[name])) if chosen(name, i)]
    result_of = {r.tool_use_id: i for i, r in enumerate(lists["tool_results"])}
    touches_of: dict[str, list[int]] = {}
    for index, touch in enumerate(lists["file_touches"]):
        if touch.tool_use_id is not None:
            touches_of.setdefault(touch.tool_use_id, []).append(index)
    placed: set[RowRef] = set()
    for index, tool_use in enumerate(lists["tool_uses"]):
        unit: list[RowRef] = [("tool_uses", index)]
        result = result_of.get(tool_use.id)
        if result is not None:
            unit.append(("tool_results", result))
        unit += [("file_touches", t) for t in touches_of.get(tool_use.id, ())]
        placed.update(unit)
        refs = [ref for ref in unit if chosen(*ref)]
        if refs:
            items.append(with_vendor_ids(refs))
    for name in ("tool_results", "file_touches", "token_usage"):
        items += [
            with_vendor_ids([(name, i)]) for i in range(len(lists[name])) if (name, i) not in placed and chosen(name, i)
        ]
    items += [[("vendor_ids", v)] for v in sorted(v for left in vendor_rows.values() for v in left)]
    return items


@dataclass
class Parts:
    """The graphs of a tree's parts, and how many rows were cut to fit one."""

    graphs: list[Graph]
    cut_rows: int = 0


def _part_graph(rows: GraphRows, refs: Iterable[RowRef], fitted: dict[RowRef, Any]) -> Graph:
    lists: dict[str, list[Any]] = {name: [] for name in _LISTS}
    for name, index in refs:
        lists[name].append(fitted.get((name, index), rows.lists[name][index]))
    return Graph(**lists)


def plan_parts(rows: GraphRows, *, capacity: int, selected: set[RowRef] | None = None) -> Parts:
    """Split the (selected) rows into parts of at most `capacity` bytes of rows each, cutting any row
    too large for a part on its own (see `cut`). The parts are consecutive: each row comes in the same
    part as the rows it refers to, or a later one."""
    if capacity < _MIN_PART_ROOM:
        raise GraphTooLarge(
            f"a part has room for only {capacity} bytes of rows beside the event's own fields "
            "(raise the NATS server's max_payload)"
        )
    items = _items(rows, selected)
    fitted: dict[RowRef, Any] = {}
    sizes: dict[RowRef, int] = {}
    for item in items:
        for ref in item:
            size = rows.size(*ref)
            if size > capacity:
                name, index = ref
                try:
                    row, _ = cut_row(name, rows.lists[name][index], capacity - 1)
                except RowTooLarge as exc:
                    raise GraphTooLarge(str(exc)) from None
                fitted[ref] = row
                size = row_size(row) + 1
            sizes[ref] = size
    packed: list[list[RowRef]] = []
    current: list[RowRef] = []
    used = 0
    for item in items:
        whole = sum(sizes[ref] for ref in item)
        for piece in [item] if whole <= capacity else [[ref] for ref in item]:
            size = sum(sizes[ref] for ref in piece)
            if current and used + size > capacity:
                packed.append(current)
                current, used = [], 0
            current += piece
            used += size
    if current:
        packed.append(current)
    return Parts([_part_graph(rows, refs, fitted) for refs in packed], cut_rows=len(fitted))
