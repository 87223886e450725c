"""What the producers write, checked against the exported schema with Python `jsonschema`: every event the
loop records for turns that take every path (tools, approvals, a delegation, memory, a profile published and
deleted), every event the importer makes of the real Claude Code and Codex transcripts recorded under
tests/fixtures/clients, and billing's budget alert; each body by the schema its producer's `ce-dataschema`
names, and each event by the union too.

The decoder keeps a transcript's graph and a turn's context snapshot as plain dicts (the code reading them
wants dicts), so this is what checks that what the loop and the importer put there is what the schema says.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

from commonos.billing.budgets import SpendDelta, SpendKey, alert_for
from commonos.billing.config import Budget, Period
from commonos.billing.service import alert_message
from commonos.importer.claude import read_claude
from commonos.importer.codex import read_codex
from commonos.importer.events import EVENT_SOURCE, events_for
from commonos.loop.approvals import TIMED_OUT
from commonos.loop.event_journal import LOOP_SOURCE
from commonos.loop.locks import MemorySessionLocks
from commonos.loop.loop import Loop, TurnRequest
from commonos.loop.memory import MemoryJournal
from commonos.loop.profiles import Profile
from commonos.loop.providers import build_provider
from commonos.loop.search import MemoryMessageSearch
from commonos.proto import events as ev
from commonos.proto.cloudevents import event_headers
from commonos.proto.requests import ApprovalAnswer, ApprovalRequest
from tests.contract.test_schema_validators import UNION_ID, python_errors
from tests.loop.helpers import write_profile

REPO = Path(__file__).resolve().parents[2]
CLIENTS = REPO / "tests" / "fixtures" / "clients"

MEMORY_SCRIPT = """
[[conversations]]
[[conversations.steps]]
tool_calls = [
  { name = "memory", args = { action = "add", content = "Prefers metric units." } },
  { name = "memory", args = { action = "add", target = "user", content = "Lives in Charleston." } },
]
[[conversations.steps]]
text = "noted"
"""


class ApproveEchoes:
    async def ask(self, request: ApprovalRequest, timeout_s: float) -> ApprovalAnswer:
        if request.args.get("command") == "echo approved":
            return ApprovalAnswer(status=ev.ApprovalStatus.APPROVED, decided_by="cli:ann")
        return TIMED_OUT


def _loop(journal: MemoryJournal, *profiles: Profile) -> Loop:
    return Loop(
        journal,
        {p.id: p for p in profiles},
        {p.id: build_provider(p) for p in profiles},
        locks=MemorySessionLocks(),
        approver=ApproveEchoes(),
        search=MemoryMessageSearch(journal),
    )


def _refused(events: list[ev.Event], source: str) -> dict[str, dict[str, list[str]]]:
    """Per event that a schema refuses: the errors, by schema."""
    refused = {}
    for event in events:
        headers = event_headers(event, source)
        case = {"headers": headers, "body": json.loads(ev.encode_event(event))}
        errors = python_errors(case)
        assert set(errors) == {headers["ce-dataschema"], UNION_ID}
        if any(errors.values()):
            refused[f"{ev.event_type(event)} {event.event_id}"] = errors
    return refused


async def test_the_loops_events_follow_the_schema(tmp_path: Path) -> None:
    plan = write_profile(tmp_path / "profiles", "demo", timeout_s=0.2)
    memory = write_profile(tmp_path / "profiles", "mem", script=MEMORY_SCRIPT)
    journal = MemoryJournal()
    loop = _loop(journal, plan, memory)
    await journal.publish_profile("demo", ("team:core",))
    await loop.run_turn(TurnRequest(profile_id="demo", text="make a plan", tags=("client:acme",)))
    first = await loop.run_turn(TurnRequest(profile_id="mem", text="remember this"))
    await loop.run_turn(TurnRequest(profile_id="mem", text="and again", session_id=first.session_id))
    await loop.run_turn(TurnRequest(profile_id="mem", text="a new session sees the memory"))
    await journal.delete_profile("mem", "cli:ann")

    seen = {ev.event_type(e) for e in journal.events}
    # model_call_refused needs billing's COS_BUDGETS bucket on a real NATS: tests/billing/test_enforcement.py.
    produced_by_the_loop = ev.EVENT_TYPE_NAMES - {"transcript_imported", "message_deactivated", "model_call_refused"}
    assert seen >= produced_by_the_loop, produced_by_the_loop - seen
    snapshots = [e.context_snapshot for e in journal.events if isinstance(e, ev.TurnStarted) and e.context_snapshot]
    assert {"system_prompt": "", "memory": ["Prefers metric units."], "user": ["Lives in Charleston."]} in [
        {**s, "system_prompt": ""} for s in snapshots
    ]
    assert _refused(journal.events, LOOP_SOURCE) == {}


def test_the_importers_events_of_real_transcripts_follow_the_schema() -> None:
    claude = [imported for home in sorted(CLIENTS.glob("claude-code-*/*/claude")) for imported in read_claude(home)]
    codex = [imported for home in sorted(CLIENTS.glob("codex-*/*/codex")) for imported in read_codex(home)]
    assert claude and codex, "no recorded transcripts under tests/fixtures/clients"
    events = [event for imported in [*claude, *codex] for event in events_for(imported)]
    graphs = [e for e in events if isinstance(e, ev.TranscriptImported)]
    assert len(graphs) >= len(claude) + len(codex)
    assert any(e.graph.tool_uses for e in graphs) and any(e.graph.model_invocations for e in graphs)
    assert _refused(events, EVENT_SOURCE) == {}


def test_billings_budget_alert_follows_the_schema() -> None:
    budget = Budget("acme monthly €", "client:acme", Period.MONTH, Decimal("1"))
    start = datetime(2026, 11, 1, tzinfo=UTC)
    key = SpendKey("client:acme", Period.MONTH, start)
    delta = SpendDelta(datetime(2026, 12, 1, tzinfo=UTC), Decimal("0.0000001"), 1)
    # Decimals as msgspec writes them: plain, or with an exponent (what str(Decimal) gives).
    alert = alert_for(budget, key, delta.period_end, Decimal("1E+1"), delta, datetime.now(UTC))
    body, headers = alert_message(alert)
    case = {"headers": headers, "body": json.loads(body)}
    assert (case["body"]["spent_usd"], case["body"]["limit_usd"]) == ("1E+1", "1")
    assert python_errors(case) == {headers["ce-dataschema"]: []}
    assert headers["ce-id"] == headers["Nats-Msg-Id"] == case["body"]["event_id"] == case["body"]["alert_id"]
    assert headers["ce-subject"] == "acme%20monthly%20%E2%82%AC"
