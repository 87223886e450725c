"""A part of a graph on its own: `validate(partial=True)`, the graph-writer's checks, and the foreign keys.

A part that is not self-contained refers to rows of earlier parts: what it holds is checked, what it
names and does not hold is left to PostgreSQL, which dead-letters a part whose rows are not stored.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest

from commonos.importer.claude import read_claude_file
from commonos.journal_writer.graph_projection import GraphEventInvalid, GraphProjection
from commonos.proto.events import TranscriptImported
from commonos.proto.graph import GRAPH_LISTS, Graph, GraphInvalid, ToolStatus, ToolVerb, validate
from commonos.proto.subjects import DLQ_STREAM
from commonos.runtime.dlq import REASON
from tests.importer.test_store import caught_up, graph_writer, snapshot
from tests.importer.transcripts import long_claude_session
from tests.support import publish_all

LISTS = GRAPH_LISTS


@pytest.fixture
def tree(tmp_path: Path) -> Any:
    """A session of 6 exchanges, two of them run by subagents."""
    path = long_claude_session(tmp_path / "claude" / "projects" / "-work-demo", 6, subagent_every=3)
    (imported,) = read_claude_file(path)
    assert len(imported.graph.sessions) == 3
    return imported


def _fragment(graph: Graph, **keep: slice) -> Graph:
    """`graph` with only the given slice of each named list (the other lists empty)."""
    return Graph(**{name: getattr(graph, name)[keep[name]] if name in keep else [] for name in LISTS})


def _violations(graph: Graph, *, partial: bool) -> list[str]:
    try:
        validate(graph, partial=partial)
    except GraphInvalid as exc:
        return exc.violations
    return []


def test_a_fragment_may_name_rows_it_does_not_hold(tree: Any) -> None:
    graph: Graph = tree.graph
    validate(graph, partial=True)  # a whole graph is a fragment too
    for name in LISTS:
        for start in range(len(getattr(graph, name))):
            fragment = _fragment(graph, **{name: slice(start, None)})
            assert _violations(fragment, partial=True) == [], (name, start)
    # Every row of every list from the middle on: nested sessions without their parent, results and file
    # touches without their tool use, tool uses with a status whose result is in an earlier part.
    half = {name: slice(len(getattr(graph, name)) // 2, None) for name in LISTS}
    fragment = _fragment(graph, **half)
    assert _violations(fragment, partial=True) == []
    whole = _violations(fragment, partial=False)
    assert any("does not exist" in v for v in whole) and any("is nowhere in the graph" in v for v in whole)
    uses = _fragment(graph, tool_uses=slice(None))
    assert _violations(uses, partial=True) == []
    assert any("but it has no result" in v for v in _violations(uses, partial=False))


def test_a_fragment_is_still_checked_on_what_it_holds(tree: Any) -> None:
    graph: Graph = tree.graph
    root, child = graph.sessions[0], graph.sessions[1]
    use = next(t for t in graph.tool_uses if t.verb == ToolVerb.READ)
    result = next(r for r in graph.tool_results if r.tool_use_id == use.id)
    replace = msgspec.structs.replace
    broken = {
        "id already used": replace(graph, tool_uses=[*graph.tool_uses, use]),
        "differs from tool use": replace(
            graph, tool_results=[replace(r, status=ToolStatus.ERROR) if r is result else r for r in graph.tool_results]
        ),
        "is later in the graph": replace(graph, sessions=[graph.sessions[1], graph.sessions[0], *graph.sessions[2:]]),
        "top-level sessions": replace(
            graph,
            sessions=[
                *graph.sessions,
                replace(child, id=str(uuid.uuid4()), parent_session_id=None, spawned_by_tool_use_id=None),
            ],
        ),
        "cannot touch files": replace(
            graph, tool_uses=[replace(t, verb=ToolVerb.EXECUTE) if t is use else t for t in graph.tool_uses]
        ),
        "belongs to another session": replace(
            graph,
            model_invocations=[replace(graph.model_invocations[0], session_id=child.id), *graph.model_invocations[1:]],
        ),
        "is negative": replace(
            graph,
            model_invocations=[replace(graph.model_invocations[0], output_tokens=-1), *graph.model_invocations[1:]],
        ),
        "repeats in its session": replace(
            graph, user_inputs=[*graph.user_inputs, replace(graph.user_inputs[0], id=str(uuid.uuid4()))]
        ),
    }
    assert root.parent_session_id is None
    for what, bad in broken.items():
        violations = _violations(bad, partial=True)
        assert any(what in v for v in violations), (what, violations)


def _event(graph: Graph, tree: Any, *, self_contained: bool, part: int = 1, parts: int = 1) -> TranscriptImported:
    return TranscriptImported(
        profile_id="claude-code",
        session_id=uuid.UUID(tree.graph.sessions[0].id),
        vendor="claude-code",
        graph=graph,
        part=part,
        parts=parts,
        self_contained=self_contained,
    )


def test_the_graph_writer_checks_a_part_on_its_own_rows(tree: Any) -> None:
    graph: Graph = tree.graph
    projection = GraphProjection()
    tail = _fragment(graph, tool_results=slice(1, None), vendor_ids=slice(None))
    projection.check(_event(tail, tree, self_contained=False, part=2, parts=2))
    with pytest.raises(GraphEventInvalid, match="does not exist"):
        projection.check(_event(tail, tree, self_contained=True))
    # Whatever a part holds, a top-level session in it is the event's own.
    other = msgspec.structs.replace(graph.sessions[0], id=str(uuid.uuid4()))
    with pytest.raises(GraphEventInvalid, match="not the event's session"):
        projection.check(_event(Graph(sessions=[other]), tree, self_contained=False))
    with pytest.raises(GraphEventInvalid, match="part 3 of 2"):
        projection.check(_event(tail, tree, self_contained=False, part=3, parts=2))


async def test_a_part_whose_rows_are_not_stored_is_dead_lettered(tree: Any, nats_url: str, database_url: str) -> None:
    graph: Graph = tree.graph
    first = _fragment(graph, **{name: slice(None) for name in LISTS[:3]})
    rest = _fragment(graph, **{name: slice(None) for name in LISTS[3:]})
    events = [
        _event(first, tree, self_contained=False, part=1, parts=2),
        _event(rest, tree, self_contained=False, part=2, parts=2),
    ]
    # Invocations of a session that was never stored: valid as a part, refused by the foreign keys.
    stranger = str(uuid.uuid4())
    orphans = [
        msgspec.structs.replace(m, id=str(uuid.uuid4()), session_id=stranger, parent_model_invocation_id=None)
        for m in graph.model_invocations[:3]
    ]
    bad = _event(Graph(model_invocations=orphans), tree, self_contained=False)
    await publish_all(nats_url, [*events, bad])
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    try:
        async with graph_writer(nats_url, database_url):
            await caught_up(js, database_url)
        stored = await snapshot(database_url)
        assert {t: len(rows) for t, rows in stored.items()} == {
            f"graph.{'session_attributes' if n == 'attributes' else n}": len(getattr(graph, n)) for n in LISTS
        }
        dead = await js.stream_info(DLQ_STREAM)
        assert dead.state.messages == 1
        sub = await js.pull_subscribe("cos.dlq.>", stream=DLQ_STREAM)
        (letter,) = await sub.fetch(1, timeout=2)
        assert letter.headers is not None and "foreign key" in letter.headers[REASON]
    finally:
        await nc.close()
