"""Session trees -> events, without servers: parts, ids, tags, billing fields, and what a watcher re-sends."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest

from commonos.importer.claude import read_claude, read_claude_file
from commonos.importer.codex import read_codex
from commonos.importer.events import (
    TreeState,
    call_event_ids,
    events_for,
    has_usage,
    import_tags,
    profile_id_for,
    settled_invocations,
    tag_value,
    tree_events,
)
from commonos.importer.model import ImportedSession
from commonos.importer.parts import part_budget
from commonos.journal_writer.graph_projection import GraphEventInvalid, GraphProjection, graph_rows
from commonos.journal_writer.graph_schema import TOOL_RESULTS
from commonos.proto.events import ModelCallCompleted, TranscriptImported, decode_event, encode_event
from commonos.proto.graph import GRAPH_LISTS, Graph, GraphInvalid, ModelInvocation, decode_graph, encode_graph, validate
from commonos.proto.graph.ids import model_call_event_id, request_call_event_id, usage_call_event_id
from commonos.proto.subjects import parse_subject, subject_for
from commonos.proto.tags import parse_tags
from commonos.proto.text import unescape_nul, unescape_nul_json
from commonos.runtime.limits import DEFAULT_MAX_PAYLOAD
from tests.importer.parts import check_parts
from tests.importer.transcripts import (
    CORPUS,
    ClaudeWriter,
    CodexWriter,
    append_lines,
    needs_corpus,
    read_lines,
    small_claude_home,
)

_LISTS = GRAPH_LISTS


def _row_ids(graphs: Iterable[Graph]) -> dict[str, set[bytes]]:
    out: dict[str, set[bytes]] = {name: set() for name in _LISTS}
    for graph in graphs:
        for name in _LISTS:
            out[name] |= {msgspec.json.encode(row) for row in getattr(graph, name)}
    return out


@pytest.fixture(scope="module")
def corpus_trees() -> list[ImportedSession]:
    return [*read_claude(CORPUS / "claude"), *read_codex(CORPUS / "codex")]


@needs_corpus
@pytest.mark.parametrize("max_payload", [DEFAULT_MAX_PAYLOAD, 64 * 1024])
def test_corpus_events_fit_a_message_and_carry_every_row(corpus_trees: list[ImportedSession], max_payload: int) -> None:
    split_somewhere = False
    cut = 0
    for tree in corpus_trees:
        events = events_for(tree, max_payload=max_payload)
        parts = [e for e in events if isinstance(e, TranscriptImported)]
        calls = [e for e in events if isinstance(e, ModelCallCompleted)]
        split_somewhere |= len(parts) > 1
        decoded = []
        for event in parts:
            again = decode_event(encode_event(event))
            assert isinstance(again, TranscriptImported) and again == event
            decoded.append(again)
        # Each part fits, is valid, and the parts hold every row of the tree as the adapter produced it (or
        # cut to fit, which no row of the corpus needs with 1 MiB: its largest row is under 256 KiB).
        cut += check_parts(tree.graph, decoded, max_payload)
        # One billed call per invocation with usage, and every subject routes to the tree's root session.
        assert len(calls) == sum(1 for m in tree.graph.model_invocations if has_usage(m))
        root = tree.graph.root()
        assert root is not None
        for any_event in events:
            parsed = parse_subject(subject_for(any_event))
            assert parsed.profile_id == tree.vendor and parsed.session_id == uuid.UUID(root.id)
            parse_tags(any_event.tags)
    assert split_somewhere, "the corpus has a graph over 1 MiB; it must have been split"
    assert cut == 0 if max_payload == DEFAULT_MAX_PAYLOAD else cut > 0


@needs_corpus
def test_event_ids_are_deterministic(corpus_trees: list[ImportedSession]) -> None:
    again = [*read_claude(CORPUS / "claude"), *read_codex(CORPUS / "codex")]
    first = [e.event_id for tree in corpus_trees for e in events_for(tree)]
    second = [e.event_id for tree in again for e in events_for(tree)]
    assert first == second and len(set(first)) == len(first)


@needs_corpus
def test_a_graph_that_fits_one_message_is_one_self_contained_part(corpus_trees: list[ImportedSession]) -> None:
    small = [t for t in corpus_trees if len(encode_graph(t.graph)) < 100_000]
    assert small
    for tree in small:
        (part,) = [e for e in events_for(tree) if isinstance(e, TranscriptImported)]
        assert part.self_contained and (part.part, part.parts) == (1, 1)
        validate(part.graph)


@needs_corpus
def test_the_largest_tree_in_small_parts(corpus_trees: list[ImportedSession]) -> None:
    biggest = max(corpus_trees, key=lambda t: len(encode_graph(t.graph)))
    cuts = []
    for max_payload in (256 * 1024, 64 * 1024, 16 * 1024):
        parts = [e for e in events_for(biggest, max_payload=max_payload) if isinstance(e, TranscriptImported)]
        assert len(parts) >= len(encode_graph(biggest.graph)) // part_budget(max_payload)
        cuts.append(check_parts(biggest.graph, parts, max_payload))
    # The smaller the parts, the more rows are too large for one.
    assert cuts[0] == 0 and 0 < cuts[1] < cuts[2]


@needs_corpus
def test_model_calls_follow_the_token_convention(corpus_trees: list[ImportedSession]) -> None:
    claude = next(t for t in corpus_trees if t.vendor == "claude-code")
    calls = [e for e in events_for(claude) if isinstance(e, ModelCallCompleted)]
    by_id = {event_id: m for m in claude.graph.model_invocations if (event_id := call_event_ids(claude).get(m.id))}
    for call in calls:
        invocation = by_id[call.event_id]
        # The id the OTLP gateway gives the api_request of the same API request.
        assert call.request_id and call.event_id == request_call_event_id("claude-code", call.request_id)
        assert call.provider == "anthropic" and call.model == invocation.model
        assert call.input_tokens == invocation.input_tokens and call.output_tokens == invocation.output_tokens
        assert call.cache_read_tokens == invocation.cache_read_tokens
        assert call.cache_write_5m_tokens + call.cache_write_1h_tokens == invocation.cache_write_tokens
        assert call.occurred_at == invocation.started_at and call.request_id and call.request_id.startswith("req_")
        assert "vendor:claude-code" in call.tags and any(t.startswith("project:") for t in call.tags)
    codex = next(t for t in corpus_trees if t.vendor == "codex" and t.graph.model_invocations)
    codex_calls = [e for e in events_for(codex) if isinstance(e, ModelCallCompleted)]
    assert codex_calls and all(c.provider == "openai" and c.cache_write_5m_tokens == 0 for c in codex_calls)


def test_tag_values_and_profile_ids_are_sanitised() -> None:
    assert tag_value("feature/login page") == "feature-login-page"
    assert tag_value("-Users-me-dev-app") == "-Users-me-dev-app"
    assert tag_value("v1.2_rc") == "v1.2_rc"
    assert tag_value("///") is None and tag_value(None) is None and tag_value("") is None
    assert len(tag_value("x" * 500) or "") == 200
    assert profile_id_for("claude-code") == "claude-code" and profile_id_for("Codex CLI") == "codex-cli"
    imported = ImportedSession(
        graph=Graph(), vendor="codex", project="my app", branch="feat/ü", source_path=Path("x"), source_bytes=0
    )
    assert import_tags(imported) == ("vendor:codex", "project:my-app", "branch:feat-")
    parse_tags(import_tags(imported))


def _invocation(number: int, session: str = "s", stop: str | None = None) -> ModelInvocation:
    return ModelInvocation(
        id=f"m{number}",
        session_id=session,
        user_input_id="u",
        parent_model_invocation_id=None,
        model="claude-sonnet-4-5",
        input_tokens=1,
        output_tokens=1,
        cache_read_tokens=0,
        cache_write_tokens=0,
        total_tokens=2,
        stop_reason=stop,
    )


def test_only_the_open_last_response_of_a_session_is_unsettled() -> None:
    graph = Graph(
        model_invocations=[
            _invocation(1),
            _invocation(2),  # last of session s, no stop reason: may still grow
            _invocation(3, session="t", stop="end_turn"),
        ]
    )
    assert settled_invocations(graph) == {"m1", "m3"}


def test_a_one_hour_cache_write_is_billed_apart(tmp_path: Path) -> None:
    home = small_claude_home(tmp_path, sessions=1)
    tree = next(iter(read_claude(home)))
    first = tree.graph.model_invocations[0]
    graph = msgspec.structs.replace(
        tree.graph,
        model_invocations=[
            msgspec.structs.replace(first, cache_write_tokens=300, cache_write_1h_tokens=200),
            *tree.graph.model_invocations[1:],
        ],
    )
    calls = [
        e
        for e in events_for(msgspec.structs.replace(tree, graph=graph, branch="feature/x"))
        if isinstance(e, ModelCallCompleted)
    ]
    assert (calls[0].cache_write_5m_tokens, calls[0].cache_write_1h_tokens) == (100, 200)
    assert "branch:feature-x" in calls[0].tags


def test_a_watcher_resends_only_what_changed(tmp_path: Path) -> None:
    home = small_claude_home(tmp_path, sessions=1)
    path = next((home / "projects").glob("*/*.jsonl"))
    state = TreeState()
    first = tree_events(read_claude_file(path)[0], state=state)
    assert len(first.parts) == 1 and first.parts[0].self_contained and len(first.calls) == 2
    state.remember(first)
    assert tree_events(read_claude_file(path)[0], state=state).events == []

    writer = ClaudeWriter(path, seed="more")
    append_lines(path, writer.exchange("And the tests?", file_path="/work/demo/tests.py"))
    grown = read_claude_file(path)[0]
    second = tree_events(grown, state=state)
    assert len(second.calls) == 2 and {c.event_id for c in second.calls}.isdisjoint(c.event_id for c in first.calls)
    (event,) = second.parts
    # Only the new rows (and the session, whose end moved), referring to the rows published before.
    assert not event.self_contained and (event.part, event.parts) == (1, 1)
    part = event.graph
    validate(part, partial=True)
    GraphProjection().check(event)
    assert [s.id for s in part.sessions] == [s.id for s in grown.graph.sessions]
    assert [u.text for u in part.user_inputs] == ["And the tests?"]
    assert len(part.model_invocations) == 2
    assert [t.input for t in part.tool_uses] == [t.input for t in grown.graph.tool_uses[1:]]
    assert [f.path for f in part.file_touches] == ["/work/demo/tests.py"]
    with pytest.raises(GraphInvalid):
        validate(part)  # not on its own: its invocations belong to an input published before


def test_an_unfinished_response_is_billed_once_it_is_complete(tmp_path: Path) -> None:
    home = small_claude_home(tmp_path, sessions=1)
    path = next((home / "projects").glob("*/*.jsonl"))
    writer = ClaudeWriter(path, seed="stream")
    prompt = writer.prompt("One more thing")
    streaming = writer.response("msg_open", [{"type": "text", "text": "Thinking"}], output_tokens=1, stop_reason=None)
    append_lines(path, [prompt, streaming])
    state = TreeState()
    partial = tree_events(read_claude_file(path)[0], settled_only=True, state=state)
    assert len(partial.calls) == 2  # the earlier, finished responses; not the open one
    state.remember(partial)
    done = writer.response("msg_open", [{"type": "text", "text": " done"}], output_tokens=80, stop_reason="end_turn")
    append_lines(path, [done])
    complete = tree_events(read_claude_file(path)[0], settled_only=True, state=state)
    assert [c.output_tokens for c in complete.calls] == [80]


def _bad_event(graph: Graph, session: uuid.UUID) -> TranscriptImported:
    return TranscriptImported(
        profile_id="claude-code",
        session_id=session,
        vendor="claude-code",
        graph=graph,
    )


def test_the_writer_refuses_graphs_that_break_the_model(tmp_path: Path) -> None:
    home = small_claude_home(tmp_path, sessions=1)
    graph = next(iter(read_claude(home))).graph
    root = graph.root()
    assert root is not None
    projection = GraphProjection()
    projection.check(_bad_event(graph, uuid.UUID(root.id)))
    # A tool result without its tool use (a part cut in the wrong place) is dead-lettered.
    broken = msgspec.structs.replace(graph, tool_uses=[])
    with pytest.raises(GraphEventInvalid, match="does not exist"):
        projection.check(_bad_event(broken, uuid.UUID(root.id)))
    # A graph published under another session's subject is a consequence attributed to the wrong session.
    with pytest.raises(GraphEventInvalid, match="not the event's session"):
        projection.check(_bad_event(graph, uuid.uuid4()))
    assert issubclass(GraphEventInvalid, ValueError)


def test_nul_characters_of_imported_text_are_stored_escaped_and_losslessly(tmp_path: Path) -> None:
    """PostgreSQL text and jsonb cannot hold U+0000: imported text is stored as the core's (`proto.text`):
    U+0000 as ␀, a ␀ already there as ␛␀, so the original reads back exactly."""
    home = small_claude_home(tmp_path, sessions=1)
    graph = next(iter(read_claude(home))).graph
    result = graph.tool_results[0]
    nul = msgspec.structs.replace(
        result, output_text="a\x00b\u2400", output=msgspec.Raw(msgspec.json.encode({"std\x00out": "x\x00y"}))
    )
    graph = decode_graph(encode_graph(msgspec.structs.replace(graph, tool_results=[nul])))
    stored = TOOL_RESULTS.row_args(graph_rows(graph, "p")[TOOL_RESULTS][0])
    row = dict(zip((c.name for c in TOOL_RESULTS.columns), stored, strict=True))
    assert "\x00" not in row["output_text"] and "\\u0000" not in row["output"]
    assert unescape_nul(row["output_text"]) == "a\x00b\u2400"
    assert unescape_nul_json(msgspec.json.decode(row["output"])) == {"std\x00out": "x\x00y"}


def test_call_time_falls_back_to_the_session_start(tmp_path: Path) -> None:
    home = small_claude_home(tmp_path, sessions=1)
    tree = next(iter(read_claude(home)))
    invocations = [msgspec.structs.replace(m, started_at=None) for m in tree.graph.model_invocations]
    graph = msgspec.structs.replace(tree.graph, model_invocations=invocations)
    calls = [e for e in events_for(msgspec.structs.replace(tree, graph=graph)) if isinstance(e, ModelCallCompleted)]
    root = graph.root()
    assert root is not None and root.started_at is not None
    assert {c.occurred_at for c in calls} == {root.started_at.astimezone(UTC)}
    assert all(c.occurred_at > datetime(2024, 1, 1, tzinfo=UTC) for c in calls)


def test_model_call_ids_are_the_ones_the_otlp_gateway_mints(tmp_path: Path) -> None:
    # The old function keeps its value: the ids of calls imported before the gateway existed do not move.
    assert model_call_event_id("inv-1") == uuid.uuid5(
        uuid.UUID("2b7c4e0a-5d3f-5c61-9f2e-8a1d7b6c9e40"), '["model_call_completed","inv-1"]'
    )
    # Claude Code: the API request id (what the gateway reads from api_request's request_id) ...
    path = tmp_path / "claude" / "s.jsonl"
    path.parent.mkdir()
    append_lines(path, ClaudeWriter(path, session_id="s-1").exchange("Hello"))
    tree = read_claude_file(path)[0]
    calls = [e for e in events_for(tree) if isinstance(e, ModelCallCompleted)]
    assert len(calls) == 2
    assert all(c.request_id and c.event_id == request_call_event_id("claude-code", c.request_id) for c in calls)
    # ... and a line without requestId keeps the invocation's id (the gateway, given one, could not match it).
    lines = [{k: v for k, v in line.items() if k != "requestId"} for line in read_lines(path)]
    bare = tmp_path / "bare" / "s.jsonl"
    bare.parent.mkdir()
    append_lines(bare, lines)
    old = read_claude_file(bare)[0]
    ids = {m.id: model_call_event_id(m.id) for m in old.graph.model_invocations if has_usage(m)}
    assert call_event_ids(old) == ids and {c.event_id for c in events_for(old) if isinstance(c, ModelCallCompleted)}
    # Codex: the conversation and the call's usage; two calls of the very same usage are its occurrences 0 and 1.
    rollout = tmp_path / "codex" / "rollout-2025-01-01T00-00-00-0190aaaa-0000-7000-8000-000000000001.jsonl"
    rollout.parent.mkdir()
    writer = CodexWriter(rollout)
    append_lines(rollout, writer.exchange("one") + writer.exchange("two"))
    (codex,) = read_codex(tmp_path / "codex")
    codex_calls = [e for e in events_for(codex) if isinstance(e, ModelCallCompleted)]
    conversation = "0190aaaa-0000-7000-8000-000000000001"
    usage = (1000, 120, 8000, 0)  # input less the cached, output with its reasoning, cache read, cache write
    assert [(c.input_tokens, c.output_tokens, c.cache_read_tokens, c.cache_write_5m_tokens) for c in codex_calls] == [
        usage,
        usage,
    ]
    assert [c.event_id for c in codex_calls] == [usage_call_event_id("codex", conversation, usage, n) for n in (0, 1)]
