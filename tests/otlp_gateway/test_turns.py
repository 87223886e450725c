"""Turns received over telemetry end (`commonos.otlp_gateway.turns`, `commonos.otlp_gateway.sweeper`).

The rules on small records (pure), then on real servers: the recorded Claude Code sessions sent to a gateway
have every turn ended (the next prompt, or the idle time) and importing their transcripts afterwards leaves
one turn per prompt and each call once, in the prompt's turn; a stopped gateway's turns are ended once by
two others; Codex's recorded records sent in reverse order through two replicas give the ids of the order
they were made in.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from typing import Any

import asyncpg
import nats
import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from commonos.importer.events import call_turn_ids, events_for
from commonos.importer.reading import read_trees
from commonos.importer.vendors import VENDORS
from commonos.otlp_gateway.common import MemoryOrdinals, Record, Source, turns_key
from commonos.otlp_gateway.mapping import map_logs
from commonos.otlp_gateway.ordinals import KvOrdinals, state_bucket
from commonos.otlp_gateway.settings import GatewaySettings
from commonos.otlp_gateway.sweeper import interval_for
from commonos.otlp_gateway.turns import ENDED, SessionTurns, TurnState, decide, end_events, merge
from commonos.proto.errors import ConfigError
from commonos.proto.events import ModelCallCompleted, TurnFinished, TurnStatus
from commonos.proto.graph.ids import vendor_scope, vendor_turn_id
from commonos.runtime.dlq import list_dead_letters
from commonos.runtime.nats import ensure_streams
from tests.billing.support import billing
from tests.clients.support import Recorded, recorded
from tests.importer.test_store import caught_up, graph_writer
from tests.otlp_gateway.conftest import Gateway, make_token, post, run_gateway, stored_events
from tests.otlp_gateway.logs import at, claude, mapped, record, recorded_logs
from tests.otlp_gateway.test_replay_recorded import ONLY_OTLP
from tests.support import journal_writer, publish_all, wait_caught_up

PB = "application/x-protobuf"
SESSION = "a1797583-09eb-4d28-bc67-0b054c1eb402"
SCOPE = "claude-code@otlp-test"
CLAUDE = [item for item in recorded() if item.cli == "claude-code"]
CODEX = [item for item in recorded() if item.cli == "codex"]


def prompt(seconds: float, prompt_id: str) -> Any:
    return record("user_prompt", {"session.id": SESSION, "prompt.id": prompt_id}, seconds)


def api_request(seconds: float, prompt_id: str, request_id: str) -> Any:
    attrs = {"session.id": SESSION, "prompt.id": prompt_id, "request_id": request_id, "input_tokens": 5}
    return record("api_request", {**attrs, "model": "claude-sonnet-4-5", "output_tokens": 7}, seconds)


def response(seconds: float, prompt_id: str) -> Any:
    return record("assistant_response", {"session.id": SESSION, "prompt.id": prompt_id}, seconds)


async def turns_of(ordinals: MemoryOrdinals) -> SessionTurns:
    state = await ordinals.turns_of("claude-code", "otlp-test", SESSION)
    assert state is not None
    return state


def ends(state: SessionTurns) -> dict[str, tuple[datetime, str] | None]:
    """Each turn's decided end: (its time, the first words of why), None while it is open."""
    return {t.key: (t.end.at, t.end.reason.split(" (")[0]) if t.end is not None else None for t in state.turns}


# --- the rules ------------------------------------------------------------------------------------


async def test_the_next_prompt_ends_the_turns_before_it_at_their_last_record_in_any_order() -> None:
    requests = [
        claude(prompt(0, "p1"), api_request(1, "p1", "req_1"), response(1.5, "p1")),
        claude(prompt(5, "p2"), api_request(6, "p2", "req_2")),
        claude(prompt(9, "p3")),
    ]
    decided = []
    for order in (requests, list(reversed(requests))):
        ordinals = MemoryOrdinals()
        for req in order:
            await mapped(req, ordinals)
        state = decide(await turns_of(ordinals), now=time.time(), idle_s=3600)
        decided.append(ends(state))
    in_order, reverse = decided
    # The last record of p1 is its assistant_response: a record of no event, but of the turn.
    assert in_order == {
        "p1": (at(1.5), "ended by the session's next prompt"),
        "p2": (at(6), "ended by the session's next prompt"),
        "p3": None,
    }
    assert reverse == in_order


async def test_an_idle_turn_ends_at_its_last_record_and_one_heard_from_lately_does_not() -> None:
    ordinals = MemoryOrdinals()
    await mapped(claude(prompt(0, "p1"), api_request(2, "p1", "req_1")), ordinals)
    state = await turns_of(ordinals)
    (turn,) = state.turns
    assert decide(state, now=turn.seen + 59, idle_s=60) is state  # nothing to decide: the same state
    ended = decide(state, now=turn.seen + 60, idle_s=60)
    assert ends(ended) == {"p1": (at(2), "no record for 60 s")}
    (finished,) = [e for e in end_events(ended, ended.turns[0]) if isinstance(e, TurnFinished)]
    assert finished.status == ENDED == TurnStatus.INTERRUPTED and finished.occurred_at == at(2)
    assert finished.turn_id == vendor_turn_id(SCOPE, SESSION, "p1")
    assert finished.error is not None and "logs no end of a turn" in finished.error
    # A record that arrives later changes nothing decided (the end does not move).
    later = merge(
        ended,
        SessionTurns(
            vendor="claude-code",
            profile_id="otlp-test",
            session_key=SESSION,
            turns=(TurnState(key="p1", started=at(30), last=at(30), seen=turn.seen + 100),),
        ),
    )
    assert ends(later) == ends(ended)


def test_merging_is_commutative_and_idempotent() -> None:
    def one(key: str, started: float, last: float, seen: float, prompted: bool) -> SessionTurns:
        turn = TurnState(key=key, started=at(started), last=at(last), seen=seen, prompted=prompted)
        return SessionTurns(vendor="codex", profile_id="codex", session_key="c", turns=(turn,))

    parts = [one("a", 3, 4, 10, False), one("a", 1, 2, 20, True), one("b", 5, 9, 5, True), one("a", 0, 1, 1, False)]
    results = set()
    for order in (parts, list(reversed(parts)), parts[1:] + parts[:1], parts + parts):
        state: SessionTurns | None = None
        for part in order:
            state = merge(state, part)
        assert state is not None
        results.add(tuple(sorted((t.key, t.started, t.last, t.seen, t.prompted) for t in state.turns)))
    # The prompt's time is the start once known, though a record of the turn came before it.
    assert results == {(("a", at(1), at(4), 20.0, True), ("b", at(5), at(9), 5.0, True))}


def test_the_idle_time_is_a_setting_and_sets_the_sweeps_pace() -> None:
    assert GatewaySettings.from_env({}).turn_idle_s == 1800.0
    assert GatewaySettings.from_env({"COS_OTLP_TURN_IDLE_S": "2.5"}).turn_idle_s == 2.5
    with pytest.raises(ConfigError, match="COS_OTLP_TURN_IDLE_S"):
        GatewaySettings.from_env({"COS_OTLP_TURN_IDLE_S": "0"})
    assert (interval_for(1800), interval_for(2), interval_for(0.1)) == (5.0, 0.5, 0.1)


def test_the_importer_gives_a_claude_code_call_the_turn_the_gateway_gives_it() -> None:
    """Each recorded Claude Code session: an imported call whose prompt the transcript names is in the
    gateway's turn of that prompt (`vendor_turn_id` of the api_request's prompt.id)."""
    matched = 0
    for item in CLAUDE:
        prompt_of = {}  # request id -> prompt id, as the telemetry says
        session_of = {}
        for _, request in recorded_logs(item.folder):
            for record_ in _records(request):
                request_id = record_.attributes.get("request_id")
                if record_.name == "api_request" and request_id:
                    prompt_of[request_id] = record_.attributes["prompt.id"]
                    session_of[request_id] = record_.attributes["session.id"]
        for tree in _trees(item):
            turns = call_turn_ids(tree)
            for call in (e for e in events_for(tree) if isinstance(e, ModelCallCompleted)):
                assert call.request_id is not None
                want = vendor_turn_id("claude-code", session_of[call.request_id], prompt_of[call.request_id])
                assert call.turn_id == want, (item.id, call.request_id)
                matched += 1
            assert set(turns.values()) <= {vendor_turn_id("claude-code", s, p) for s, p in tree.input_prompts.values()}
    answered = sum(1 for item in CLAUDE for c in item.calls() if not c.get("stalled"))
    only_otlp = sum(len(calls) for (cli, _), calls in ONLY_OTLP.items() if cli == "claude-code")
    assert matched == answered - only_otlp


def _records(request: ExportLogsServiceRequest) -> list[Record]:
    return [Record.of(r) for rl in request.resource_logs for sl in rl.scope_logs for r in sl.log_records]


def _trees(item: Recorded, profile: str | None = None) -> list[Any]:
    (source,) = (s for s in VENDORS if s.vendor == item.cli)
    read = [t for path in source.top_files(item.tree) for t in read_trees(source, path, print, profile)]
    assert all(t.imported is not None for t in read), [t.error for t in read]
    return [t.imported for t in read]


# --- on real servers ------------------------------------------------------------------------------


async def known(gateway: Gateway, token: str) -> None:
    for _ in range(500):
        if gateway.running.tokens.lookup(token) is not None:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the gateway did not learn of the new token")


async def send(gateway: Gateway, token: str, request: ExportLogsServiceRequest) -> None:
    answer = await post(gateway.url, "logs", request.SerializeToString(), token=token, content_type=PB)
    assert answer.status == 200, answer.body


async def wait_events(nats_url: str, done: Callable[[list[Any]], bool], what: str, timeout_s: float = 60) -> list[Any]:
    """The stream's events once `done` holds of them (read again every 0.1 s, within `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        events = await stored_events(nats_url)
        if done(events):
            return events
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        await asyncio.sleep(0.1)


def finished(events: list[Any]) -> list[TurnFinished]:
    return [e for e in events if isinstance(e, TurnFinished)]


class ClaudeTurns:
    """What the recorded Claude Code payloads say of each turn: (session, prompt) -> its prompt's time (None
    when no user_prompt names it), its last record's time."""

    def __init__(self, items: list[Recorded]) -> None:
        self.prompted: dict[tuple[str, str], datetime] = {}
        self.first: dict[tuple[str, str], datetime] = {}
        self.last: dict[tuple[str, str], datetime] = {}
        for item in items:
            for _, request in recorded_logs(item.folder):
                records = [r for r in _records(request) if r.time is not None and r.attributes.get("prompt.id")]
                mapped_here = {
                    (r.attributes["session.id"], r.attributes["prompt.id"])
                    for r in records
                    if r.name in ("user_prompt", "api_request", "tool_result", "tool_decision")
                }
                for r in records:
                    turn = (r.attributes["session.id"], r.attributes["prompt.id"])
                    if turn not in mapped_here or r.time is None:
                        continue
                    self.last[turn] = max(self.last.get(turn, r.time), r.time)
                    self.first[turn] = min(self.first.get(turn, r.time), r.time)
                    if r.name == "user_prompt":
                        self.prompted[turn] = r.time

    def turn_id(self, turn: tuple[str, str], profile: str) -> uuid.UUID:
        return vendor_turn_id(vendor_scope("claude-code", profile), *turn)

    def next_prompt(self, turn: tuple[str, str]) -> bool:
        """A later prompt of its session is known: the rule that ends it (else its idle time)."""
        start = self.prompted.get(turn, self.first[turn])
        return any(s == turn[0] and t > start for (s, _), t in self.prompted.items())


async def test_claude_code_sessions_over_otlp_end_every_turn_and_their_import_agrees(
    nats_url: str, database_url: str
) -> None:
    """Every recorded Claude Code scenario sent to a gateway (idle time 2 s): each turn is ended once, by its
    session's next prompt or its idle time, at its last record's time, `interrupted`. Then the transcripts
    imported into the same profile: one turn per prompt, each answered call billed once, in its prompt's turn."""
    profile = "claude-code"
    expected = ClaudeTurns(CLAUDE)
    turn_ids = {expected.turn_id(turn, profile): turn for turn in expected.last}
    assert len(turn_ids) > len(CLAUDE)  # several sessions have several turns
    async with run_gateway(nats_url, map_logs=None, map_traces=None, turn_idle_s=2.0) as gateway:
        token = await make_token(nats_url, profile)
        await known(gateway, token)
        for item in CLAUDE:
            for _, request in recorded_logs(item.folder):
                await send(gateway, token, request)
        events = await wait_events(
            nats_url, lambda evs: {e.turn_id for e in finished(evs)} >= set(turn_ids), "every turn ended"
        )
    ended = finished(events)
    assert Counter(e.turn_id for e in ended) == Counter(set(turn_ids)), "a turn ended twice, or one not received"
    for event in ended:
        turn = turn_ids[event.turn_id]
        assert event.status == TurnStatus.INTERRUPTED and event.occurred_at == expected.last[turn], turn
        rule = "ended by the session's next prompt" if expected.next_prompt(turn) else "no record for 2 s"
        assert event.error is not None and event.error.startswith(rule), (turn, event.error)

    # The transcripts imported afterwards, into the same profile.
    trees = [tree for item in CLAUDE for tree in _trees(item)]
    await publish_all(nats_url, [e for tree in trees for e in events_for(tree)])
    async with (
        journal_writer(nats_url, database_url),
        graph_writer(nats_url, database_url),
        billing(nats_url, database_url),
    ):
        nc = await nats.connect(nats_url)
        try:
            js = nc.jetstream()
            await wait_caught_up(js, database_url, "journal-writer")
            await caught_up(js, database_url)
            await wait_caught_up(js, database_url, "billing", table="billing_positions")
            assert await list_dead_letters(js) == []
        finally:
            await nc.close()
    conn = await asyncpg.connect(database_url)
    try:
        turns = await conn.fetch("SELECT id, status, started_at, finished_at FROM turns")
        calls = await conn.fetch("SELECT request_id, turn_id FROM model_calls")
        prompts = await conn.fetch("SELECT id FROM graph.user_inputs")
    finally:
        await conn.close()
    assert {r["id"] for r in turns} == set(turn_ids) and len(turns) == len(turn_ids)  # one turn per prompt
    for row in turns:
        assert row["status"] == "interrupted" and row["finished_at"] == expected.last[turn_ids[row["id"]]]
        assert row["started_at"] <= row["finished_at"]
    # Each prompt the transcripts name is one of those turns.
    named = {vendor_turn_id(profile, s, p) for tree in trees for s, p in tree.input_prompts.values()}
    assert named <= set(turn_ids) and len(prompts) >= len(named)
    answered = [c for item in CLAUDE for c in item.calls() if not c.get("stalled")]
    assert Counter(r["request_id"] for r in calls) == Counter(c["request_id"] for c in answered)  # each once
    assert all(r["turn_id"] in turn_ids for r in calls)


async def test_a_stopped_gateways_open_turns_are_ended_once_by_two_others(nats_url: str) -> None:
    """A gateway that received a session stops before its last turn's idle time; two replicas started
    afterwards both sweep: the turn is ended, and once (the same event id, in the stream once)."""
    (item,) = (i for i in CLAUDE if i.name == "turns")
    expected = ClaudeTurns([item])
    turn_ids = {expected.turn_id(turn, "otlp-test") for turn in expected.last}
    assert len(turn_ids) == 3
    async with run_gateway(nats_url, map_logs=None, map_traces=None, turn_idle_s=3600) as first:
        token = await make_token(nats_url)
        await known(first, token)
        for _, request in recorded_logs(item.folder):
            await send(first, token, request)
        await wait_events(nats_url, lambda evs: len(finished(evs)) == 2, "the two turns a next prompt ends")
    async with (
        run_gateway(nats_url, map_logs=None, map_traces=None, turn_idle_s=0.5) as a,
        run_gateway(nats_url, map_logs=None, map_traces=None, turn_idle_s=0.5) as b,
    ):
        events = await wait_events(nats_url, lambda evs: len(finished(evs)) == 3, "the last turn ended")
        # Both may publish it; JetStream stores it once, and only the replica it stored counts it.
        labels = {"type": "turn_finished"}
        counted = [g.metric("cos_otlp_events_published_total", labels) for g in (a, b)]
        assert sum(counted) == 1, counted
        # Once every turn is over and published, the session's state is forgotten.
        nc = await nats.connect(nats_url)
        try:
            ordinals = KvOrdinals(await state_bucket(nc.jetstream()))
            deadline = time.monotonic() + 30
            while await ordinals.sessions():
                assert time.monotonic() < deadline, "the session's turns not forgotten"
                await asyncio.sleep(0.1)
        finally:
            await nc.close()
    ended = finished(await stored_events(nats_url))
    assert {e.turn_id for e in ended} == turn_ids and len(ended) == 3
    assert [e.error.split(" (")[0] for e in sorted(ended, key=lambda e: e.occurred_at) if e.error] == [
        "ended by the session's next prompt",
        "ended by the session's next prompt",
        "no record for 0.5 s",
    ]
    assert len({e.event_id for e in events}) == len(events)


async def test_an_end_decided_but_not_published_is_published_by_the_next_sweep(nats_url: str) -> None:
    """A replica stopped between storing a decision and publishing it: another publishes that decision."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        ordinals = KvOrdinals(await state_bucket(js))
        turn = TurnState(key="p1", started=at(0), last=at(3), seen=time.time(), prompted=True)
        await ordinals.note_turns(
            SessionTurns(vendor="claude-code", profile_id="otlp-test", session_key=SESSION, turns=(turn,))
        )
        ((key, state, revision),) = await ordinals.sessions()
        assert key == turns_key("claude-code", "otlp-test", SESSION)
        decided = decide(state, now=time.time() + 100, idle_s=60)
        assert await ordinals.replace(key, decided, revision) is not None
    finally:
        await nc.close()
    async with run_gateway(nats_url, map_logs=None, map_traces=None, turn_idle_s=3600):
        events = await wait_events(nats_url, lambda evs: len(finished(evs)) == 1, "the decided end published")
    (end,) = finished(events)
    assert end.occurred_at == at(3) and end.error is not None and end.error.startswith("no record for 60 s")
    # Its session and turn are announced first, so the journal-writer never meets an end of an unknown turn.
    assert [type(e).__name__ for e in events] == ["SessionCreated", "TurnStarted", "TurnFinished"]


async def test_kv_turns_merge_across_replicas_and_change_only_at_the_revision_read(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        first, second = KvOrdinals(await state_bucket(js)), KvOrdinals(await state_bucket(js))
        memory = MemoryOrdinals()
        parts = [
            SessionTurns(
                vendor="codex",
                profile_id="codex",
                session_key="conv",
                tags=("vendor:codex",),
                turns=(TurnState(key=f"t{i % 3}", started=at(i), last=at(i + 1), seen=float(i), prompted=i % 2 == 0),),
            )
            for i in range(12)
        ]
        await asyncio.gather(*(replica.note_turns(p) for p, replica in zip(parts, [first, second] * 6, strict=True)))
        for part in parts:
            await memory.note_turns(part)
        want = await memory.turns_of("codex", "codex", "conv")
        assert want is not None
        for replica in (first, second):
            got = await replica.turns_of("codex", "codex", "conv")
            assert got is not None and sorted(got.turns, key=lambda t: t.key) == sorted(want.turns, key=lambda t: t.key)
        assert await first.turns_of("codex", "other-profile", "conv") is None
        ((key, state, revision),) = await second.sessions()
        replaced = await first.replace(key, decide(state, now=math.inf, idle_s=1), revision)
        assert replaced is not None and await second.replace(key, state, revision) is None
        assert not await second.forget(key, revision) and await second.forget(key, replaced)
        assert await first.turns_of("codex", "codex", "conv") is None and await first.sessions() == []
    finally:
        await nc.close()


async def test_codex_records_in_reverse_order_through_two_replicas_give_the_in_order_ids(nats_url: str) -> None:
    """Every recorded Codex scenario: its requests in the reverse order, each request's records reversed too,
    sent to two gateways in turn; what is stored has exactly the event ids of the same records mapped in
    the order they were made, turn ends included, each once."""
    source = Source(profile_id="codex")
    requests = [request for item in CODEX for _, request in recorded_logs(item.folder)]
    ordinals = MemoryOrdinals()
    expected: set[uuid.UUID] = set()
    calls: dict[uuid.UUID, tuple[int, ...]] = {}  # each call's id -> its tokens
    for request in requests:
        events = (await map_logs(request, source, ordinals)).events
        expected |= {e.event_id for e in events}
        calls |= {e.event_id: tokens(e) for e in events if isinstance(e, ModelCallCompleted)}
    ends = 0
    for _, state, _ in await ordinals.sessions():
        decided = decide(state, now=math.inf, idle_s=1)
        expected |= {e.event_id for turn in decided.unpublished() for e in end_events(decided, turn)}
        ends += len(decided.unpublished())
    assert ends > len(CODEX)  # every turn of each scenario ends; some have several
    async with (
        run_gateway(nats_url, map_logs=None, map_traces=None, turn_idle_s=0.5) as a,
        run_gateway(nats_url, map_logs=None, map_traces=None, turn_idle_s=0.5) as b,
    ):
        token = await make_token(nats_url, "codex")
        await known(a, token)
        await known(b, token)
        for n, request in enumerate(reversed(requests)):
            backwards = ExportLogsServiceRequest()
            backwards.CopyFrom(request)
            for rl in backwards.resource_logs:
                for sl in rl.scope_logs:
                    records = list(reversed(sl.log_records))
                    del sl.log_records[:]
                    sl.log_records.extend(records)
            await send((a, b)[n % 2], token, backwards)
        events = await wait_events(
            nats_url, lambda evs: {e.event_id for e in evs} >= expected, "the in-order event ids"
        )
    ids = [e.event_id for e in events]
    assert len(ids) == len(set(ids)), "an event stored twice"
    assert set(ids) == expected
    # And each id names the same call (its tokens), not merely one of the conversation's calls.
    assert {e.event_id: tokens(e) for e in events if isinstance(e, ModelCallCompleted)} == calls
    assert sum(isinstance(e, TurnFinished) for e in events) == ends


def tokens(call: ModelCallCompleted) -> tuple[int, ...]:
    return (
        call.input_tokens,
        call.output_tokens,
        call.cache_read_tokens,
        call.cache_write_5m_tokens,
        call.reasoning_tokens,
    )
