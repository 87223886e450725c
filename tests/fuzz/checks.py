"""Checks more than one fuzz target makes."""

from __future__ import annotations

from hypothesis import event

from commonos.proto import graph as g


def check_graph_round_trip_and_validity(graph: g.Graph) -> None:
    """A decoded graph encodes back to itself, and `validate` accepts it or lists its violations."""
    assert g.decode_graph(g.encode_graph(graph)) == graph
    try:
        g.validate(graph)
    except g.GraphInvalid as exc:
        assert exc.violations
        event("GraphInvalid")
        return
    event("valid graph")
