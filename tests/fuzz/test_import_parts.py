"""Fuzz target of the importer's parts: graphs whose rows are sized around a part's budget and the limit.

For every drawn graph and server limit: each part fits (one self-contained event within max_payload,
headers included, or parts within the part budget); each part passes `validate` (partial for a part
of several) and the graph-writer's check; stored in stream order every row's foreign keys name rows
stored before it; and the parts hold every row exactly once, unchanged or cut with a marker (see
`commonos.importer.cut`). A watcher's incremental publication (the rows new since a smaller graph)
is drawn too: it holds exactly the new and changed rows, in parts that pass the same checks.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
from hypothesis import event, given, settings
from hypothesis import strategies as st

from commonos.importer.cut import CUT_KEY, is_cut
from commonos.importer.events import TreeState, part_events, tree_events
from commonos.importer.model import ImportedSession
from commonos.importer.parts import GraphRows, part_budget
from commonos.proto import graph as g
from tests.fuzz.conftest import PURE_DEADLINE
from tests.importer.parts import LISTS, check_parts, row_key

T0 = datetime(2025, 6, 1, tzinfo=UTC)


@dataclass
class Drawn:
    graph: g.Graph
    #: How many of the graph's user inputs an earlier import saw (for the watcher's case).
    seen_inputs: int
    max_payload: int


class _Ids:
    def __init__(self, seed: str) -> None:
        self.seed = seed
        self.count = 0

    def __call__(self) -> str:
        self.count += 1
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{self.seed}/{self.count}"))


def _sizes(max_payload: int) -> st.SearchStrategy[int]:
    """Text sizes: small, around a part's room for one row, and around the server's limit."""
    budget = part_budget(max_payload)
    around = {
        "small": st.integers(0, 300),
        "budget": st.integers(max(0, budget - 1_500), budget + 500),
        "limit": st.integers(max_payload - 1_500, max_payload + 1_500),
    }
    # Mostly small, so that many graphs have no row to cut, or only one.
    return st.sampled_from(["small"] * 6 + ["budget", "limit"]).flatmap(around.__getitem__)


def _text(draw: st.DrawFn, size: int) -> str:
    # Characters that take more room in JSON than in the text, so that sizes are not simply lengths.
    alphabet = st.sampled_from(["a", "é", "\n", '"', "\\", "\x01", "😀", "z"])
    head = "".join(draw(st.lists(alphabet, max_size=16)))
    return (head + "x" * size)[:size]


@st.composite
def drawn_graphs(draw: st.DrawFn) -> Drawn:
    max_payload = draw(st.sampled_from([16 * 1024, 24 * 1024, 64 * 1024]) | st.integers(8 * 1024, 64 * 1024))
    sizes = _sizes(max_payload)
    new_id = _Ids(str(draw(st.uuids())))
    root = new_id()
    sessions = [
        g.Session(
            id=root,
            parent_session_id=None,
            spawned_by_tool_use_id=None,
            outcome=g.Outcome.UNKNOWN,
            title=draw(st.none() | st.text(max_size=20)),
            started_at=T0,
        )
    ]
    rows: dict[str, list[Any]] = {name: [] for name in LISTS}
    clock = T0

    def tick() -> datetime:
        nonlocal clock
        clock += timedelta(seconds=1)
        return clock

    def vendor(our_type: g.EntityType, our_id: str, session_id: str) -> None:
        if draw(st.booleans()):
            rows["vendor_ids"].append(
                g.VendorID(
                    our_id=our_id,
                    our_type=our_type,
                    session_id=session_id,
                    vendor="fuzz",
                    vendor_id_kind=str(our_type),
                    vendor_id=our_id,
                    source_ref="f.jsonl:1",
                )
            )

    def fill(session_id: str, spawns: int) -> None:
        if draw(st.booleans()):
            value = msgspec.Raw(msgspec.json.encode({"v": _text(draw, draw(sizes))}))
            attr = g.SessionAttribute(id=new_id(), session_id=session_id, key="k", value=value, valid_from=tick())
            rows["attributes"].append(attr)
            vendor(g.EntityType.SESSION_ATTRIBUTE, attr.id, session_id)
        for ordinal in range(draw(st.integers(1, 3))):
            user = g.UserInput(
                id=new_id(),
                session_id=session_id,
                ordinal=ordinal,
                text=_text(draw, draw(sizes)),
                interrupted=False,
                kind=g.InputKind.PROMPT,
                origin=g.InputOrigin.HUMAN,
                metadata=msgspec.Raw(b"{}"),
                triggered_at=tick(),
            )
            rows["user_inputs"].append(user)
            vendor(g.EntityType.USER_INPUT, user.id, session_id)
            parent: str | None = None
            for _ in range(draw(st.integers(1, 2))):
                tokens = draw(st.integers(0, 10**6))
                call = g.ModelInvocation(
                    id=new_id(),
                    session_id=session_id,
                    user_input_id=user.id,
                    parent_model_invocation_id=parent,
                    model="m",
                    input_tokens=tokens,
                    output_tokens=1,
                    cache_read_tokens=0,
                    cache_write_tokens=0,
                    total_tokens=tokens + 1,
                    started_at=tick(),
                )
                parent = call.id
                rows["model_invocations"].append(call)
                vendor(g.EntityType.MODEL_INVOCATION, call.id, session_id)
                if draw(st.booleans()):
                    content = msgspec.Raw(msgspec.json.encode({"type": "thinking", "t": _text(draw, draw(sizes))}))
                    text = draw(st.booleans())
                    message = g.AssistantMessage(
                        id=new_id(),
                        session_id=session_id,
                        user_input_id=user.id,
                        model_invocation_id=call.id,
                        text=_text(draw, draw(sizes)) if text else None,
                        content=None if text else content,
                        timestamp=tick(),
                    )
                    rows["assistant_messages"].append(message)
                    vendor(g.EntityType.ASSISTANT_MESSAGE, message.id, session_id)
                for _ in range(draw(st.integers(0, 2))):
                    spawning = spawns > 0 and draw(st.booleans())
                    verb = (
                        g.ToolVerb.SPAWN_SUBAGENT
                        if spawning
                        else draw(st.sampled_from([g.ToolVerb.READ, g.ToolVerb.EDIT, g.ToolVerb.EXECUTE]))
                    )
                    status = draw(st.sampled_from([g.ToolStatus.OK, g.ToolStatus.ERROR, g.ToolStatus.NO_RESULT]))
                    use_input = msgspec.Raw(msgspec.json.encode({"file_path": "a.py", "x": _text(draw, draw(sizes))}))
                    use = g.ToolUse(
                        id=new_id(),
                        session_id=session_id,
                        user_input_id=user.id,
                        model_invocation_id=call.id,
                        name=str(verb),
                        verb=verb,
                        input=use_input,
                        status=status,
                        timestamp=tick(),
                        metadata=msgspec.Raw(b'{"subagent_detail":"transcript"}' if spawning else b"{}"),
                    )
                    rows["tool_uses"].append(use)
                    vendor(g.EntityType.TOOL_USE, use.id, session_id)
                    if status != g.ToolStatus.NO_RESULT:
                        output = msgspec.Raw(msgspec.json.encode({"stdout": _text(draw, draw(sizes))}))
                        result = g.ToolResult(
                            id=new_id(),
                            tool_use_id=use.id,
                            session_id=session_id,
                            user_input_id=user.id,
                            status=status,
                            output_text=_text(draw, draw(sizes)),
                            output=output,
                            error_text=_text(draw, draw(sizes)) if draw(st.booleans()) else None,
                        )
                        rows["tool_results"].append(result)
                        vendor(g.EntityType.TOOL_RESULT, result.id, session_id)
                    if verb.file_verb():
                        lines = [_text(draw, draw(sizes))]
                        hunk = g.Hunk(old_start=1, old_lines=1, new_start=1, new_lines=1, lines=lines)
                        touch = g.FileTouch(
                            id=new_id(),
                            tool_use_id=use.id,
                            user_input_id=user.id,
                            session_id=session_id,
                            path="a.py",
                            kind=g.TouchKind.EDIT if verb == g.ToolVerb.EDIT else g.TouchKind.READ,
                            hunks=[hunk] if verb == g.ToolVerb.EDIT else None,
                        )
                        rows["file_touches"].append(touch)
                        vendor(g.EntityType.FILE_TOUCH, touch.id, session_id)
                    if spawning:
                        spawns -= 1
                        child = g.Session(
                            id=new_id(),
                            parent_session_id=session_id,
                            spawned_by_tool_use_id=use.id,
                            outcome=g.Outcome.UNKNOWN,
                            title=_text(draw, draw(sizes)),
                            started_at=tick(),
                        )
                        sessions.append(child)
                        fill(child.id, 0)
            if draw(st.booleans()):
                usage = g.TokenUsage(
                    id=new_id(),
                    session_id=session_id,
                    user_input_id=user.id,
                    scope=g.UsageScope.INPUT,
                    input_tokens=draw(st.integers(0, 10**6)),
                )
                rows["token_usage"].append(usage)

    fill(root, draw(st.integers(0, 2)))
    graph = g.Graph(sessions=sessions, **{name: rows[name] for name in LISTS if name != "sessions"})
    g.validate(graph)
    return Drawn(graph, draw(st.integers(0, len(graph.user_inputs))), max_payload)


def _imported(graph: g.Graph) -> ImportedSession:
    return ImportedSession(
        graph=graph,
        vendor="claude-code",
        project="fuzz",
        branch=None,
        source_path=Path("/fuzz/session.jsonl"),
        source_bytes=0,
    )


def _earlier(graph: g.Graph, inputs: int) -> g.Graph:
    """The graph as a first import saw it: its first `inputs` user inputs and what hangs off them."""
    kept_inputs = {u.id for u in graph.user_inputs[:inputs]}
    kept: dict[str, list[Any]] = {name: list(getattr(graph, name)) for name in LISTS}
    kept["user_inputs"] = [u for u in graph.user_inputs if u.id in kept_inputs]
    for name in LISTS[3:-1]:
        kept[name] = [row for row in kept[name] if row.user_input_id in kept_inputs]
    uses = {t.id for t in kept["tool_uses"]}
    kept["sessions"] = [s for s in graph.sessions if s.spawned_by_tool_use_id in (None, *uses)]
    sessions = {s.id for s in kept["sessions"]}
    for name in LISTS[1:-1]:
        kept[name] = [row for row in kept[name] if row.session_id in sessions]
    ids = {row.id for name in LISTS[:-1] for row in kept[name]}
    kept["vendor_ids"] = [v for v in graph.vendor_ids if v.our_id in ids]
    # A tool use whose result came later had no result then.
    results = {r.tool_use_id for r in kept["tool_results"]}
    kept["tool_uses"] = [
        t if t.id in results else msgspec.structs.replace(t, status=g.ToolStatus.NO_RESULT) for t in kept["tool_uses"]
    ]
    earlier = g.Graph(**kept)
    g.validate(earlier)
    return earlier


@settings(deadline=PURE_DEADLINE * 4)
@given(drawn_graphs())
def test_parts_fit_hold_every_row_and_pass_validate(drawn: Drawn) -> None:
    graph, max_payload = drawn.graph, drawn.max_payload
    events, cut_rows = part_events(_imported(graph), GraphRows(graph), max_payload=max_payload)
    cut = check_parts(graph, events, max_payload)
    assert cut == cut_rows
    event(f"{'one part' if len(events) == 1 else 'several parts'}")
    event(f"{'some rows cut' if cut else 'nothing cut'}")
    for part in events:
        for name in LISTS:
            for row in getattr(part.graph, name):
                if CUT_KEY in str(row):
                    event(f"cut {name}")


@settings(deadline=PURE_DEADLINE * 4)
@given(drawn_graphs())
def test_a_watcher_publishes_exactly_what_is_new(drawn: Drawn) -> None:
    graph, max_payload = drawn.graph, drawn.max_payload
    state = TreeState()
    first = tree_events(_imported(_earlier(graph, drawn.seen_inputs)), max_payload=max_payload, state=state)
    state.remember(first)
    second = tree_events(_imported(graph), max_payload=max_payload, state=state)
    before = GraphRows(first.rows.graph)
    old = {
        (name, row_key(name, row)): before.encoded[name][i]
        for name in LISTS
        for i, row in enumerate(before.lists[name])
    }
    now = GraphRows(graph)
    new = {
        (name, row_key(name, row))
        for name in LISTS
        for i, row in enumerate(now.lists[name])
        if old.get((name, row_key(name, row))) != now.encoded[name][i]
    }
    if not new:
        assert second.parts == []
        event("nothing new")
        return
    sent = {(name, row_key(name, row)) for p in second.parts for name in LISTS for row in getattr(p.graph, name)}
    assert sent == new
    several = len(second.parts) > 1 or not second.parts[0].self_contained
    if not several:
        assert new == {(name, row_key(name, row)) for name in LISTS for row in getattr(graph, name)}
    for number, part in enumerate(second.parts, start=1):
        assert (part.part, part.parts) == (number, len(second.parts))
        fragment = part.graph
        g.validate(fragment, partial=several)
        for name in LISTS:
            for row in getattr(fragment, name):
                for field in row.__struct_fields__:
                    value = getattr(row, field)
                    assert not is_cut(value) or second.cut_rows, (name, field)
    event("incremental in parts" if several else "first publication")
