"""The OTLP logs the real CLIs sent (`make clients`), mapped: exactly the fake model's usage, once; the importer's ids.

For every recorded scenario of Claude Code and Codex, the scenario's OTLP logs payloads are mapped in
file order with one `MemoryOrdinals` (what the gateway would do receiving them), and:

* the model calls are the calls the fake model server answered (its ``usage.jsonl``), call by call,
  each exactly once, with exactly its ``expected`` tokens in our buckets; a reply cut off mid-stream
  (``stalled``: the CLI never received its usage, and logs no call) is the only call missing;
* mapping the payloads again (an exporter's retry) gives the same events: nothing new;
* the ``model_call_completed`` ids are those the importer mints from the same scenario's transcripts
  imported into the token's profile (the vendor's default one, and another), and the session is the
  importer's root session: a session received over OTLP and imported too is billed once. Where a call is
  in one source only, `ONLY_OTLP` says which and why;
* on real servers, the journal-writer and billing accept all of it (nothing dead-lettered), and billing
  holds each answered call once though both sources and a retry published it.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import asyncpg
import nats
import pytest

from commonos.importer.events import events_for, profile_id_for
from commonos.importer.reading import read_trees
from commonos.importer.vendors import VENDORS
from commonos.otlp_gateway.common import MemoryOrdinals, Source
from commonos.otlp_gateway.mapping import map_logs
from commonos.proto.events import ModelCallCompleted
from commonos.proto.graph.ids import request_call_event_id, vendor_scope
from commonos.runtime.dlq import list_dead_letters
from tests.billing.support import billing
from tests.clients.support import Recorded, recorded
from tests.otlp_gateway.logs import SOURCE, mapped, recorded_logs
from tests.support import journal_writer, publish_all, wait_caught_up

BUCKETS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "cache_write_1h_tokens")

#: Calls the gateway bills that no transcript holds, per scenario: (cli, scenario) -> {request id: why}.
#: Nothing else may differ: every call the importer bills has the id the gateway gives it.
ONLY_OTLP: dict[tuple[str, str], dict[str, str]] = {
    ("claude-code", "compaction"): {
        "req_fake06001compaction": "the /compact summary call: Claude Code logs its api_request but writes no "
        "transcript line for it, so only the gateway can bill it (the importer reports it as usage without a "
        "transcript line, never as a call)",
    },
}


def ids(items: list[Recorded]) -> list[str]:
    return [item.id for item in items]


SCENARIOS = recorded()


def buckets(call: ModelCallCompleted) -> dict[str, int]:
    return {
        "input_tokens": call.input_tokens,
        "output_tokens": call.output_tokens,
        "cache_read_tokens": call.cache_read_tokens,
        "cache_write_tokens": call.cache_write_5m_tokens + call.cache_write_1h_tokens,
        "cache_write_1h_tokens": call.cache_write_1h_tokens,
    }


def expected(call: dict[str, Any]) -> dict[str, int]:
    return {k: int(call["expected"].get(k) or 0) for k in BUCKETS}


async def replay(item: Recorded, source: Source = SOURCE) -> tuple[list[ModelCallCompleted], list[Any], MemoryOrdinals]:
    """The model calls of a scenario's payloads mapped in file order (from a token of `source`'s profile),
    and every event."""
    ordinals = MemoryOrdinals()
    events: list[Any] = []
    for name, request in recorded_logs(item.folder):
        result = await mapped(request, ordinals, source)
        assert (result.rejected, result.errors) == (0, []), f"{item.id} {name}"
        events += result.events
    return [e for e in events if isinstance(e, ModelCallCompleted)], events, ordinals


def test_every_scenario_has_logs() -> None:
    assert {item.cli for item in SCENARIOS} == {"claude-code", "codex"}
    for item in SCENARIOS:
        assert recorded_logs(item.folder), f"{item.id}: no OTLP logs payload recorded"


@pytest.mark.parametrize("item", SCENARIOS, ids=ids(SCENARIOS))
async def test_the_model_calls_are_the_servers_once_with_its_tokens(item: Recorded) -> None:
    calls, _, ordinals = await replay(item)
    answered = [c for c in item.calls() if not c.get("stalled")]
    assert len({c.event_id for c in calls}) == len(calls), f"{item.id}: a call mapped twice"
    if item.cli == "claude-code":
        # Matched by the API request id the server returned.
        by_request = {str(c.request_id): c for c in calls}
        assert sorted(by_request) == sorted(c["request_id"] for c in answered), item.id
        for call in answered:
            mapped_call = by_request[call["request_id"]]
            assert buckets(mapped_call) == expected(call), f"{item.id} call {call['call']}"
            assert mapped_call.model == call["model"] and mapped_call.reasoning_tokens == 0
    else:
        # Codex names no call: the n-th call logged is the n-th the server answered (and the tokens say so).
        assert [buckets(c) for c in calls] == [expected(c) for c in answered], item.id
        for mapped_call, call in zip(calls, answered, strict=True):
            assert mapped_call.reasoning_tokens == int(call["expected"]["reasoning_tokens"] or 0)
            assert mapped_call.model == call["model"]
    totals = {k: sum(buckets(c)[k] for c in calls) for k in BUCKETS}
    assert totals == {k: sum(expected(c)[k] for c in answered) for k in BUCKETS}, item.id
    # A retry of every payload (same ordinals: the gateway's store) adds nothing.
    again: list[Any] = []
    for _, request in recorded_logs(item.folder):
        again += (await mapped(request, ordinals)).events
    first_ids = {e.event_id for e in (await replay(item))[1]}
    assert {e.event_id for e in again} == first_ids, item.id
    assert [c for c in again if isinstance(c, ModelCallCompleted)] == calls


def test_a_stalled_call_is_the_only_one_missing() -> None:
    stalled = [(item.id, c["call"]) for item in SCENARIOS for c in item.calls() if c.get("stalled")]
    assert stalled == [("claude-code-2.1.332/interrupted", 0), ("codex-0.171.0/interrupted", 0)]


def imported_calls(item: Recorded, profile: str | None = None) -> tuple[list[ModelCallCompleted], set[uuid.UUID]]:
    """The importer's model calls of the scenario's transcripts imported into `profile` (None: the vendor's),
    and its trees' root sessions."""
    (source,) = (s for s in VENDORS if s.vendor == item.cli)
    read = [t for path in source.top_files(item.tree) for t in read_trees(source, path, print, profile)]
    assert all(t.imported is not None for t in read), [t.error for t in read]
    trees = [t.imported for t in read if t.imported is not None]
    calls = [e for tree in trees for e in events_for(tree) if isinstance(e, ModelCallCompleted)]
    roots = {uuid.UUID(root.id) for tree in trees if (root := tree.graph.root()) is not None}
    return calls, roots


@pytest.mark.parametrize("profile", [None, "otlp-test"], ids=["default-profile", "other-profile"])
@pytest.mark.parametrize("item", SCENARIOS, ids=ids(SCENARIOS))
async def test_the_gateway_and_the_importer_mint_the_same_ids(item: Recorded, profile: str | None) -> None:
    """A token of the profile an import uses: the vendor's default one (ids as they always were) or another
    (`cos import --profile`; the profile is part of the ids, `vendor_scope`)."""
    source = Source(profile_id=profile or profile_id_for(item.cli))
    otlp, events, _ = await replay(item, source)
    imported, roots = imported_calls(item, profile)
    otlp_by_id = {c.event_id: c for c in otlp}
    imported_by_id = {c.event_id: c for c in imported}
    only_otlp = ONLY_OTLP.get((item.cli, item.name), {})
    assert set(imported_by_id) <= set(otlp_by_id), f"{item.id}: calls the importer names otherwise"
    extra = {otlp_by_id[i].request_id for i in set(otlp_by_id) - set(imported_by_id)}
    assert extra == set(only_otlp), f"{item.id}: calls only the gateway has"
    for event_id, imported_call in imported_by_id.items():
        assert buckets(otlp_by_id[event_id]) == buckets(imported_call), f"{item.id}: one id, other tokens"
        assert otlp_by_id[event_id].session_id == imported_call.session_id
    # The OTLP session is the imported transcript's root session (one per scenario; resumed ones continue it).
    sessions = {e.session_id for e in events}
    assert sessions == roots == {c.session_id for c in otlp}, item.id
    if item.cli == "claude-code":
        scope = vendor_scope("claude-code", source.profile_id)
        assert scope == ("claude-code" if profile is None else "claude-code@otlp-test")
        assert all(c.event_id == request_call_event_id(scope, str(c.request_id)) for c in otlp)


@pytest.mark.parametrize("item", SCENARIOS, ids=ids(SCENARIOS))
async def test_two_profiles_of_one_recorded_session_share_no_id(item: Recorded) -> None:
    """The same telemetry sent with the tokens of two profiles: no event, session or call id in common."""
    _, first, _ = await replay(item, Source(profile_id=profile_id_for(item.cli)))
    _, second, _ = await replay(item, Source(profile_id="otlp-test"))
    assert not {e.event_id for e in first} & {e.event_id for e in second}
    assert not {e.session_id for e in first} & {e.session_id for e in second}


def test_the_only_otlp_calls_are_in_the_servers_log() -> None:
    # Each exception names a call the fake server answered, so the id test's exception list cannot drift.
    logged = Counter(c.get("request_id") for item in SCENARIOS for c in item.calls())
    for calls in ONLY_OTLP.values():
        assert all(logged[request_id] == 1 for request_id in calls)
    assert SOURCE.profile_id == "otlp-test"


# --- what the journal-writer and billing make of it -----------------------------------------------


async def test_the_journal_writer_and_billing_accept_it_and_bill_each_call_once(
    nats_url: str, database_url: str
) -> None:
    """Every scenario's gateway events published, then the importer's calls of the same transcripts, then
    the gateway's again (a retry): nothing dead-lettered, the sessions, turns, tool calls and approvals
    stored, and billing holds exactly the fake server's answered calls, once each.

    Each vendor's events come from the profile the importer uses by default (``claude-code``, ``codex``):
    billing refuses a session's calls from another profile than the one that created it, so a session
    is counted once across both paths only when the gateway's token and the import share a profile.
    """
    gateway: list[Any] = []
    importer: list[Any] = []
    for item in SCENARIOS:
        source = Source(profile_id=profile_id_for(item.cli))
        ordinals = MemoryOrdinals()
        for _, request in recorded_logs(item.folder):
            result = await map_logs(request, source, ordinals)
            assert result.rejected == 0
            gateway += result.events
        importer += imported_calls(item)[0]
    await publish_all(nats_url, [*gateway, *importer, *gateway])
    async with journal_writer(nats_url, database_url), billing(nats_url, database_url):
        nc = await nats.connect(nats_url)
        try:
            js = nc.jetstream()
            await wait_caught_up(js, database_url, "journal-writer")
            await wait_caught_up(js, database_url, "billing", table="billing_positions")
            assert await list_dead_letters(js) == []
        finally:
            await nc.close()
    conn = await asyncpg.connect(database_url)
    try:
        counts = {t: await conn.fetchval(f"SELECT count(*) FROM {t}") for t in ("sessions", "tool_calls", "approvals")}
        turns = await conn.fetch("SELECT status FROM turns")
        rows = await conn.fetch(
            "SELECT request_id, input_tokens, output_tokens, cache_read_tokens, cache_write_5m_tokens,"
            " cache_write_1h_tokens, profile_id FROM model_calls"
        )
    finally:
        await conn.close()
    assert counts == {"sessions": len(SCENARIOS), "tool_calls": 6, "approvals": 6}
    # No CLI logs the end of a turn, and the mapping ends none: the gateway's sweeper does (test_turns.py).
    assert turns and {r["status"] for r in turns} == {"running"}
    stored = Counter(
        (
            r["input_tokens"],
            r["output_tokens"],
            r["cache_read_tokens"],
            r["cache_write_5m_tokens"] + r["cache_write_1h_tokens"],
            r["cache_write_1h_tokens"],
        )
        for r in rows
    )
    answered = Counter(tuple(expected(c).values()) for item in SCENARIOS for c in item.calls() if not c.get("stalled"))
    assert sum(answered.values()) == len(answered), "the server's usage repeats: the match would be ambiguous"
    assert stored == answered
