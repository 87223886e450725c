"""Codex accounting: reasoning tokens are carried, and each API call is one invocation in every layout.

Fixtures are hand-written rollouts. `old` is the layout of Codex up to 0.5x (a reply's token_count
before its items, repeated); `new` reproduces the layout of Codex 0.171: a reply's items first, then
a ``token_usage_record`` line, then a ``token_count`` repeating the same usage with
``cache_write_input_tokens`` and ``last_usage_includes_reasoning``, beside ``world_state``,
``thread_settings_applied`` and ``item_completed`` lines that carry nothing the graph stores.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from commonos.importer.codex import read_codex_file
from commonos.importer.events import model_call_events
from commonos.importer.model import ImportedSession
from commonos.journal_writer.graph_schema import SCHEMA
from commonos.proto.graph import TokenBasis, validate
from commonos.runtime.postgres import apply_schemas
from tests.importer.pipeline import acos, wait_stored, writers
from tests.importer.test_cli import dry_json

SESSION = "0badc0de-0000-7000-8000-000000000171"
T = "2026-01-02T03:04:{:02d}.000Z"


def usage(
    i: int, cached: int, o: int, r: int, *, written: int | None = None, total: int | None = None
) -> dict[str, Any]:
    u: dict[str, Any] = {"input_tokens": i, "cached_input_tokens": cached, "output_tokens": o}
    if written is not None:
        u["cache_write_input_tokens"] = written
    u["reasoning_output_tokens"] = r
    u["total_tokens"] = i + o if total is None else total
    return u


def line(n: int, kind: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {"timestamp": T.format(n), "type": kind, "payload": payload}


def meta(version: str) -> dict[str, Any]:
    return line(0, "session_meta", {"id": SESSION, "timestamp": T.format(0), "cwd": "/w/p", "cli_version": version})


def user(n: int, text: str) -> list[dict[str, Any]]:
    content = [{"type": "input_text", "text": text}]
    return [
        line(n, "response_item", {"type": "message", "role": "user", "content": content}),
        line(n, "event_msg", {"type": "item_completed", "turn_id": f"turn-{n}", "item": {"type": "UserMessage"}}),
    ]


def reply(n: int, text: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text}]
    return line(n, "response_item", {"type": "message", "role": "assistant", "id": f"msg_{n}", "content": content})


def record(n: int, last: dict[str, Any], total: dict[str, Any]) -> dict[str, Any]:
    payload = {"thread_id": SESSION, "turn_id": f"turn-{n}", "response_id": f"resp_{n}", "usage": last}
    return line(n, "token_usage_record", {**payload, "turn_token_usage": last, "thread_token_usage": total})


def token_count(n: int, last: dict[str, Any], total: dict[str, Any], *, new: bool = True) -> dict[str, Any]:
    info: dict[str, Any] = {"total_token_usage": total, "last_token_usage": last, "model_context_window": 1000}
    if new:
        info["last_usage_includes_reasoning"] = False
    return line(n, "event_msg", {"type": "token_count", "info": info, "rate_limits": {"primary": None}})


def new_noise(n: int) -> list[dict[str, Any]]:
    """The 0.171 lines that carry nothing the graph stores."""
    return [
        line(n, "world_state", {"full": True, "state": {"model": "gpt-5", "environments": {}}}),
        line(n, "turn_context", {"cwd": "/w/p", "model": "gpt-5", "approval_policy": "never"}),
        line(n, "event_msg", {"type": "thread_settings_applied", "thread_settings": {"model": "gpt-5"}}),
    ]


def write(tmp_path: Path, lines: list[dict[str, Any]]) -> Path:
    path = tmp_path / "sessions" / "2026" / "01" / "02" / f"rollout-2026-01-02T03-04-00-{SESSION}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def read(path: Path) -> tuple[ImportedSession, list[str]]:
    warnings: list[str] = []
    imported = read_codex_file(path, lambda *args: warnings.append(repr(args)))
    assert imported is not None
    validate(imported.graph)
    return imported, warnings


def tokens(imported: ImportedSession) -> list[tuple[int, int, int, int, int | None, int]]:
    return [
        (m.input_tokens, m.output_tokens, m.cache_read_tokens, m.cache_write_tokens, m.reasoning_tokens, m.total_tokens)
        for m in imported.graph.model_invocations
    ]


# A 0.171-style rollout: two calls, each written items-first, then its record, then its token_count.
CALL_1 = usage(1201, 400, 90, 60, written=25)
CALL_2 = usage(1502, 1100, 40, 0, written=0)
TOTAL_2 = usage(2703, 1500, 130, 60, written=25)


def new_rollout() -> list[dict[str, Any]]:
    return [
        meta("0.171.0"),
        line(1, "event_msg", {"type": "task_started", "turn_id": "turn-1"}),
        *new_noise(1),
        *user(2, "hello"),
        reply(3, "first answer"),
        record(4, CALL_1, CALL_1),
        token_count(5, CALL_1, CALL_1),
        line(6, "event_msg", {"type": "task_complete", "turn_id": "turn-1"}),
        *new_noise(7),
        *user(8, "again"),
        reply(9, "second answer"),
        record(10, CALL_2, TOTAL_2),
        token_count(11, CALL_2, TOTAL_2),
    ]


# --- finding 5: reasoning tokens -------------------------------------------------------------------


def test_reasoning_tokens_reach_the_invocation_and_the_model_call_event(tmp_path: Path) -> None:
    """Old layout: the token_count's reasoning_output_tokens is the invocation's and its event's reasoning."""
    last = usage(1000, 300, 80, 50)
    rollout = [
        meta("0.58.0"),
        line(1, "event_msg", {"type": "user_message", "message": "think"}),
        line(1, "turn_context", {"cwd": "/w/p", "model": "gpt-5"}),
        token_count(2, last, last, new=False),
        token_count(2, last, last, new=False),  # Codex repeats it
        reply(3, "thought"),
    ]
    imported, warnings = read(write(tmp_path, rollout))
    assert warnings == []
    assert tokens(imported) == [(700, 80, 300, 0, 50, 1080)]
    (event,) = model_call_events(imported)
    assert (event.output_tokens, event.reasoning_tokens) == (80, 50)


def test_no_reasoning_reported_is_none(tmp_path: Path) -> None:
    last = {"input_tokens": 10, "cached_input_tokens": 0, "output_tokens": 5, "total_tokens": 15}
    rollout = [meta("0.40.0"), line(1, "event_msg", {"type": "user_message", "message": "hi"})]
    rollout += [token_count(2, last, last, new=False), reply(3, "hi")]
    imported, _ = read(write(tmp_path, rollout))
    assert tokens(imported) == [(10, 5, 0, 0, None, 15)]
    (event,) = model_call_events(imported)
    assert event.reasoning_tokens == 0


# --- finding 6: the 0.171 layout --------------------------------------------------------------------


def test_new_layout_is_one_invocation_per_call_with_the_reported_usage(tmp_path: Path) -> None:
    imported, warnings = read(write(tmp_path, new_rollout()))
    assert warnings == []
    graph = imported.graph
    # Input excludes cache reads and cache writes; output includes reasoning.
    assert tokens(imported) == [(776, 90, 400, 25, 60, 1291), (402, 40, 1100, 0, 0, 1542)]
    assert all(m.token_basis == TokenBasis.REPORTED for m in graph.model_invocations)
    assert [u.text for u in graph.user_inputs] == ["hello", "again"]
    # Each reply's message belongs to the invocation that carries its usage.
    owners = {m.text: m.model_invocation_id for m in graph.assistant_messages}
    first, second = graph.model_invocations
    assert owners == {"first answer": first.id, "second answer": second.id}
    assert first.user_input_id == graph.user_inputs[0].id and second.user_input_id == graph.user_inputs[1].id
    assert second.parent_model_invocation_id == first.id
    events = model_call_events(imported)
    assert [(e.input_tokens, e.cache_write_5m_tokens, e.reasoning_tokens) for e in events] == [
        (776, 25, 60),
        (402, 0, 0),
    ]
    # The Responses API's id of each call is its request id, as the loop's OpenAI provider records it: billing
    # counts a call once per (provider, request id), whatever event id a source or an older version gave it.
    assert [e.request_id for e in events] == ["resp_4", "resp_10"]


def test_the_token_count_after_a_compaction_is_no_call(tmp_path: Path) -> None:
    """After compacting, Codex writes a token_count of the new context's size with nothing spent in it."""
    after = usage(0, 0, 0, 0, written=0, total=6069)
    lines = [
        *new_rollout()[:-2],
        line(10, "compacted", {"message": "summary", "replacement_history": []}),
        token_count(10, after, TOTAL_2),
        *new_rollout()[-2:],
    ]
    imported, warnings = read(write(tmp_path, lines))
    assert warnings == []
    assert tokens(imported) == [(776, 90, 400, 25, 60, 1291), (402, 40, 1100, 0, 0, 1542)]


def test_a_call_with_tool_use_and_no_text_is_one_invocation(tmp_path: Path) -> None:
    """A reply that only calls a tool, then the reply after its output: two calls, two invocations."""
    call = {"type": "function_call", "name": "shell", "call_id": "call_a", "arguments": '{"command": ["ls"]}'}
    output = {"type": "function_call_output", "call_id": "call_a", "output": '{"output": "x", "metadata": {}}'}
    one, two = usage(500, 0, 30, 20, written=0), usage(600, 500, 10, 0, written=0)
    both = usage(1100, 500, 40, 20, written=0)
    rollout = [
        meta("0.171.0"),
        *user(1, "list"),
        line(2, "response_item", call),
        record(3, one, one),
        token_count(3, one, one),
        line(4, "response_item", output),
        reply(5, "done"),
        record(6, two, both),
        token_count(6, two, both),
    ]
    imported, warnings = read(write(tmp_path, rollout))
    assert warnings == []
    assert tokens(imported) == [(500, 30, 0, 0, 20, 530), (100, 10, 500, 0, 0, 610)]
    first, second = imported.graph.model_invocations
    assert imported.graph.tool_uses[0].model_invocation_id == first.id
    assert imported.graph.assistant_messages[0].model_invocation_id == second.id


def test_new_token_count_without_records_is_one_invocation_per_call(tmp_path: Path) -> None:
    """A rollout with the new token_count (items first) but no token_usage_record, the count written twice."""
    rollout = [line for line in new_rollout() if line["type"] != "token_usage_record"]
    first_count = next(i for i, x in enumerate(rollout) if x["payload"].get("type") == "token_count")
    rollout.insert(first_count, rollout[first_count])  # the first call's token_count again
    imported, warnings = read(write(tmp_path, rollout))
    assert warnings == []
    assert tokens(imported) == [(776, 90, 400, 25, 60, 1291), (402, 40, 1100, 0, 0, 1542)]
    assert len(imported.graph.assistant_messages) == 2
    assert {m.model_invocation_id for m in imported.graph.assistant_messages} == {
        m.id for m in imported.graph.model_invocations
    }


def test_output_that_excludes_reasoning_is_counted_with_it(tmp_path: Path) -> None:
    """When the figures show reasoning outside output_tokens (total = input + output + reasoning), it is added."""
    outside = usage(1000, 0, 30, 70, written=0, total=1100)
    rollout = [meta("0.171.0"), *user(1, "hi"), reply(2, "hi"), record(3, outside, outside)]
    rollout.append(token_count(3, outside, outside))
    imported, _ = read(write(tmp_path, rollout))
    assert tokens(imported) == [(1000, 100, 0, 0, 70, 1100)]


def test_a_growing_new_rollout_keeps_its_ids(tmp_path: Path) -> None:
    """Read mid-reply (items, no usage yet) and again when complete: the same invocation, now metered."""
    full = new_rollout()
    first_record = next(i for i, x in enumerate(full) if x["type"] == "token_usage_record")
    partial, _ = read(write(tmp_path, full[:first_record]))  # the first call's reply, before its record
    complete, _ = read(write(tmp_path, full))
    assert [m.id for m in partial.graph.model_invocations] == [m.id for m in complete.graph.model_invocations][:1]
    assert partial.graph.model_invocations[0].token_basis == TokenBasis.UNKNOWN
    assert complete.graph.model_invocations[0].token_basis == TokenBasis.REPORTED


# --- the real pipeline ------------------------------------------------------------------------------


async def test_reasoning_is_stored_by_billing_and_the_graph_writer(
    tmp_path: Path, nats_url: str, database_url: str
) -> None:
    home = tmp_path / "codex"
    write(home, new_rollout())
    async with writers(nats_url, database_url):
        # --settle 0: the file was just written, and its last call is billed now, not once it is quiet.
        argv = ("import", "codex", str(home), "--settle", "0", "--format", "json", "--no-progress")
        done = await acos(*argv, nats_url=nats_url, timeout=120)
        assert done.code == 0, done.err
        summary = done.json()
        assert summary["totals"]["invocations"] == 2, summary["totals"]
        await wait_stored(nats_url, database_url, 2)
    conn = await asyncpg.connect(database_url)
    try:
        billed = await conn.fetch(
            "SELECT input_tokens, output_tokens, cache_read_tokens, reasoning_tokens FROM model_calls"
            " ORDER BY input_tokens DESC"
        )
        graph = await conn.fetch(
            "SELECT output_tokens, cache_write_tokens, reasoning_tokens FROM graph.model_invocations"
            " ORDER BY output_tokens DESC"
        )
    finally:
        await conn.close()
    assert [tuple(r) for r in billed] == [(776, 90, 400, 60), (402, 40, 1100, 0)]
    assert [tuple(r) for r in graph] == [(90, 25, 60), (40, 0, 0)]


async def test_a_database_made_before_the_column_gains_it(database_url: str) -> None:
    """The schema adds reasoning_tokens to a graph.model_invocations made without it, and keeps its rows."""
    conn = await asyncpg.connect(database_url)
    try:
        await apply_schemas(conn, [SCHEMA])
        await conn.execute("ALTER TABLE graph.model_invocations DROP COLUMN reasoning_tokens")
        await apply_schemas(conn, [SCHEMA])
        column = await conn.fetchrow(
            "SELECT data_type, is_nullable FROM information_schema.columns"
            " WHERE table_schema = 'graph' AND table_name = 'model_invocations' AND column_name = 'reasoning_tokens'"
        )
        assert column is not None and tuple(column) == ("bigint", "YES")
        await apply_schemas(conn, [SCHEMA])  # applying it again changes nothing
    finally:
        await conn.close()


def test_a_call_copied_into_another_rollout_counts_once(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A forked rollout repeats its parent's calls, with their response ids: each is one call of the import."""
    write(tmp_path, new_rollout())
    fork = "0badc0de-0000-7000-8000-000000000172"
    copied = [json.loads(json.dumps(x).replace(SESSION, fork)) for x in new_rollout()]
    path = tmp_path / "sessions" / "2026" / "01" / "02" / f"rollout-2026-01-02T03-05-00-{fork}.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in copied))
    summary = dry_json(capsys, "codex", tmp_path)
    assert len(summary["sessions"]) == 2
    assert summary["totals"]["invocations"] == 2
    assert summary["totals"]["output_tokens"] == 90 + 40
