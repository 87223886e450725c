"""The session graph model: stable ids, invariants reported all at once, JSON names, metadata merge."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import TypeVar

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from commonos.proto.graph import (
    SUBAGENT_DETAIL_KEY,
    AssistantMessage,
    EntityType,
    FileTouch,
    Graph,
    GraphInvalid,
    Hunk,
    InputKind,
    InputOrigin,
    ModelInvocation,
    Outcome,
    Session,
    SessionAttribute,
    SpawnLink,
    SubagentDetail,
    TokenUsage,
    ToolResult,
    ToolStatus,
    ToolUse,
    ToolVerb,
    TouchKind,
    UsageScope,
    UserInput,
    VendorID,
    decode_graph,
    encode_graph,
    mint_id,
    speed_valid,
    validate,
    with_subagent_detail,
)

T0 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
RAW_EMPTY_OBJECT = msgspec.Raw(b"{}")


def test_mint_id_is_a_fixed_function_of_kind_and_parts() -> None:
    # The value is part of the contract: stored rows keep these ids across releases.
    assert mint_id("session", "claude-code", "abc") == "829275ea-141b-5adf-8a45-dab758e2d23b"
    assert mint_id("session", "claude-code", "abc") == mint_id("session", "claude-code", "abc")
    namespace = uuid.UUID("6f1c3b52-2d1e-5a8e-9c57-0c0a7e5e3d10")
    derived = uuid.uuid5(namespace, json.dumps(["tool_use", "x", "y"], separators=(",", ":")))
    assert mint_id("tool_use", "x", "y") == str(derived)


@given(st.text(), st.lists(st.text(), max_size=4))
def test_mint_id_is_uuid5_of_the_json_array(kind: str, parts: list[str]) -> None:
    namespace = uuid.UUID("6f1c3b52-2d1e-5a8e-9c57-0c0a7e5e3d10")
    name = msgspec.json.encode([kind, *parts]).decode()
    assert mint_id(kind, *parts) == str(uuid.uuid5(namespace, name))


def test_mint_id_separates_kinds_and_part_boundaries() -> None:
    assert mint_id("session", "a") != mint_id("user_input", "a")
    assert mint_id("k", "ab", "c") != mint_id("k", "a", "bc")
    assert mint_id("k", "a\x00b") != mint_id("k", "a", "b")


def _tree() -> Graph:
    """A small valid graph: a session with a subagent, one call each way, a touched file."""
    root = mint_id("session", "root")
    child = mint_id("session", "child")
    prompt = mint_id("user_input", "p")
    child_prompt = mint_id("user_input", "cp")
    call = mint_id("model_invocation", "m1")
    child_call = mint_id("model_invocation", "m2")
    read = mint_id("tool_use", "read")
    spawn = mint_id("tool_use", "spawn")
    return Graph(
        sessions=[
            Session(id=root, parent_session_id=None, spawned_by_tool_use_id=None, outcome=Outcome.UNKNOWN),
            Session(id=child, parent_session_id=None, spawned_by_tool_use_id=None, outcome=Outcome.UNKNOWN).link_spawn(
                SpawnLink(parent_session_id=root, tool_use_id=spawn)
            ),
        ],
        attributes=[
            SessionAttribute(
                id=mint_id("attr", "cwd"),
                session_id=root,
                key="cwd",
                value=msgspec.Raw(b'"/x"'),
                valid_from=T0,
            )
        ],
        user_inputs=[
            UserInput(
                id=prompt,
                session_id=root,
                ordinal=0,
                text="hi",
                triggered_at=T0,
                interrupted=False,
                kind=InputKind.PROMPT,
                origin=InputOrigin.HUMAN,
                metadata=RAW_EMPTY_OBJECT,
            ),
            UserInput(
                id=child_prompt,
                session_id=child,
                ordinal=0,
                text="sub",
                interrupted=False,
                kind=InputKind.PROMPT,
                origin=InputOrigin.AGENT,
                metadata=RAW_EMPTY_OBJECT,
            ),
        ],
        model_invocations=[
            ModelInvocation(
                id=call,
                session_id=root,
                user_input_id=prompt,
                parent_model_invocation_id=None,
                model="claude-x",
                input_tokens=3,
                output_tokens=5,
                cache_read_tokens=7,
                cache_write_tokens=11,
                cache_write_1h_tokens=2,
                total_tokens=26,
                speed="standard",
            ),
            ModelInvocation(
                id=child_call,
                session_id=child,
                user_input_id=child_prompt,
                parent_model_invocation_id=None,
                input_tokens=1,
                output_tokens=1,
                cache_read_tokens=0,
                cache_write_tokens=0,
                total_tokens=2,
            ),
        ],
        assistant_messages=[
            AssistantMessage(
                id=mint_id("assistant_message", "a"),
                session_id=root,
                user_input_id=prompt,
                model_invocation_id=call,
                text="ok",
                content=msgspec.Raw(b'{"type":"text","text":"ok"}'),
            )
        ],
        tool_uses=[
            ToolUse(
                id=read,
                session_id=root,
                user_input_id=prompt,
                model_invocation_id=call,
                name="Read",
                verb=ToolVerb.READ,
                input=msgspec.Raw(b'{"file_path":"/x/a.py"}'),
                status=ToolStatus.OK,
                metadata=RAW_EMPTY_OBJECT,
            ),
            ToolUse(
                id=spawn,
                session_id=root,
                user_input_id=prompt,
                model_invocation_id=call,
                name="Task",
                verb=ToolVerb.SPAWN_SUBAGENT,
                input=RAW_EMPTY_OBJECT,
                status=ToolStatus.NO_RESULT,
                metadata=msgspec.Raw(b'{"subagent_detail":"transcript"}'),
            ),
        ],
        tool_results=[
            ToolResult(
                id=mint_id("tool_result", "read"),
                tool_use_id=read,
                session_id=root,
                user_input_id=prompt,
                status=ToolStatus.OK,
                output_text="1 line",
                output=msgspec.Raw(b'{"numLines":1}'),
            )
        ],
        file_touches=[
            FileTouch(
                id=mint_id("file_touch", "a"),
                tool_use_id=read,
                user_input_id=prompt,
                session_id=root,
                path="/x/a.py",
                kind=TouchKind.READ,
                start_line=1,
                end_line=1,
                hunks=[Hunk(old_start=1, old_lines=1, new_start=1, new_lines=2, lines=[" a", "+b"])],
            )
        ],
        token_usage=[
            TokenUsage(
                id=mint_id("token_usage", "u"),
                session_id=root,
                user_input_id=None,
                scope=UsageScope.SESSION,
                input_tokens=5,
            )
        ],
        vendor_ids=[
            VendorID(
                our_id=root,
                our_type=EntityType.SESSION,
                session_id=root,
                vendor="claude-code",
                vendor_id_kind="session_id",
                vendor_id="s-1",
            ),
            VendorID(
                our_id=read,
                our_type=EntityType.TOOL_USE,
                session_id=root,
                vendor="claude-code",
                vendor_id_kind="tool_use_id",
                vendor_id="toolu_1",
                source_ref="s-1.jsonl:4",
            ),
        ],
    )


def test_valid_tree_passes_and_knows_its_root() -> None:
    graph = _tree()
    validate(graph)
    root = graph.root()
    assert root is not None and root.top_level()
    assert not graph.sessions[1].top_level()
    assert Graph().root() is None


def _violations(graph: Graph) -> list[str]:
    with pytest.raises(GraphInvalid) as caught:
        validate(graph)
    return caught.value.violations


S = TypeVar("S", bound=msgspec.Struct)


def _replace_at(items: list[S], index: int, **changes: object) -> None:
    items[index] = msgspec.structs.replace(items[index], **changes)


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda g: _replace_at(g.user_inputs, 1, id=g.user_inputs[0].id), "already used"),
        (lambda g: _replace_at(g.tool_uses, 0, id=g.sessions[0].id), "already used"),
        (lambda g: _replace_at(g.model_invocations, 0, user_input_id="missing"), "does not exist"),
        (lambda g: g.sessions.reverse(), "is later in the graph"),
        (
            lambda g: (
                g.model_invocations.reverse()
                or _replace_at(g.model_invocations, 0, parent_model_invocation_id=g.model_invocations[1].id)
            ),
            "is later in the graph",
        ),
        (
            lambda g: g.tool_results.append(msgspec.structs.replace(g.tool_results[0], id="dup")),
            "more than one result",
        ),
        (lambda g: _replace_at(g.tool_results, 0, status=ToolStatus.ERROR), "differs from tool use"),
        (lambda g: _replace_at(g.file_touches, 0, tool_use_id=g.tool_uses[1].id), "cannot touch files"),
        (lambda g: _replace_at(g.user_inputs, 0, kind="shout"), "unknown kind"),
        (lambda g: _replace_at(g.sessions, 0, outcome="won"), "unknown outcome"),
        (lambda g: _replace_at(g.tool_uses, 0, verb="juggle"), "unknown verb"),
        (lambda g: _replace_at(g.model_invocations, 0, output_tokens=-1), "negative"),
        (lambda g: _replace_at(g.token_usage, 0, input_tokens=-5), "negative"),
        (lambda g: _replace_at(g.model_invocations, 0, speed="warp"), "unknown speed"),
        (lambda g: _replace_at(g.vendor_ids, 1, session_id="nowhere"), "session nowhere does not exist"),
        (lambda g: _replace_at(g.vendor_ids, 1, our_type=EntityType.SESSION), "is a tool_use"),
        (lambda g: _replace_at(g.sessions, 1, spawned_by_tool_use_id=None), "set together"),
    ],
)
def test_validate_catches_each_class_of_violation(mutate: object, expected: str) -> None:
    graph = _tree()
    assert callable(mutate)
    mutate(graph)
    violations = _violations(graph)
    assert any(expected in v for v in violations), violations


def test_validate_reports_every_violation_at_once() -> None:
    graph = _tree()
    _replace_at(graph.model_invocations, 0, input_tokens=-1)
    _replace_at(graph.tool_results, 0, status=ToolStatus.ERROR)
    _replace_at(graph.user_inputs, 0, origin="alien")
    graph.vendor_ids.append(msgspec.structs.replace(graph.vendor_ids[0], our_id="ghost"))
    violations = _violations(graph)
    for expected in ("negative", "differs from tool use", "unknown origin", "ghost does not exist"):
        assert any(expected in v for v in violations), (expected, violations)
    assert len(violations) >= 4


def test_json_names_match_the_go_model_and_round_trip() -> None:
    graph = _tree()
    encoded = encode_graph(graph)
    decoded_json = json.loads(encoded)
    assert set(decoded_json) == {
        "sessions",
        "session_attributes",
        "user_inputs",
        "model_invocations",
        "assistant_messages",
        "tool_uses",
        "tool_results",
        "file_touches",
        "token_usage",
        "vendor_ids",
    }
    top = decoded_json["sessions"][0]
    # Non-omitempty pointers are written as null; omitempty ones are left out.
    assert top["parent_session_id"] is None and top["spawned_by_tool_use_id"] is None
    assert "title" not in top and top["outcome"] == "unknown"
    invocation = decoded_json["model_invocations"][0]
    assert invocation["cache_write_1h_tokens"] == 2 and "token_basis" not in invocation
    assert decoded_json["model_invocations"][1]["parent_model_invocation_id"] is None
    assert decoded_json["file_touches"][0]["hunks"][0] == {
        "old_start": 1,
        "old_lines": 1,
        "new_start": 1,
        "new_lines": 2,
        "lines": [" a", "+b"],
    }
    assert decoded_json["vendor_ids"][1]["our_type"] == "tool_use"
    assert (
        "output"
        not in json.loads(
            encode_graph(Graph(tool_results=[msgspec.structs.replace(graph.tool_results[0], output=None)]))
        )["tool_results"][0]
    )
    assert decode_graph(encoded) == graph
    assert encode_graph(decode_graph(encoded)) == encoded


def test_decode_accepts_go_nil_slices() -> None:
    nil_slices = json.dumps({key: None for key in json.loads(encode_graph(Graph()))}).encode()
    assert decode_graph(nil_slices) == Graph()


def test_enum_valid_and_speed() -> None:
    assert ToolStatus.valid("no_result") and not ToolStatus.valid("done")
    assert ToolVerb.EDIT.file_verb() and not ToolVerb.EXECUTE.file_verb()
    assert speed_valid("fast") and not speed_valid("slow")
    assert EntityType.valid("token_usage") and not EntityType.valid(3)


def test_with_subagent_detail_merges_into_an_object() -> None:
    assert json.loads(with_subagent_detail(None, SubagentDetail.NONE)) == {SUBAGENT_DETAIL_KEY: "none"}
    assert json.loads(with_subagent_detail(b"null", SubagentDetail.REPORT)) == {SUBAGENT_DETAIL_KEY: "report"}
    merged = with_subagent_detail(msgspec.Raw(b'{"a":1,"subagent_detail":"none"}'), SubagentDetail.TRANSCRIPT)
    assert json.loads(merged) == {"a": 1, SUBAGENT_DETAIL_KEY: "transcript"}
    with pytest.raises(ValueError, match="JSON object"):
        with_subagent_detail(b"[1]", SubagentDetail.NONE)
