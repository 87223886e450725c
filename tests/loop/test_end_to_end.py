"""The loop on real servers, through the journal-writer into PostgreSQL: the specification's rows."""

from __future__ import annotations

from pathlib import Path

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from commonos.loop.loop import TurnRequest
from commonos.proto.events import ApprovalStatus, TurnStatus
from commonos.proto.requests import ApprovalRequest, approval_request_subject
from commonos.runtime.loop_requests import send_decision
from commonos.runtime.nats import ensure_streams
from commonos.runtime.postgres import connect
from tests.loop.helpers import write_profile
from tests.loop.test_loop_nats import nats_loop
from tests.support import journal_writer, wait_caught_up


async def test_two_turns_with_tools_approvals_and_delegation_yield_the_rows(
    nc: Client, nats_url: str, database_url: str, tmp_path: Path
) -> None:
    js = nc.jetstream()
    await ensure_streams(js)
    profile = write_profile(tmp_path / "profiles", timeout_s=10)

    async def human(msg: Msg) -> None:
        request = msgspec.json.decode(msg.data, type=ApprovalRequest)
        approve = request.args.get("command") == "echo approved"
        status = ApprovalStatus.APPROVED if approve else ApprovalStatus.DENIED
        assert (await send_decision(nc, request.profile_id, request.approval_id, status, "cli:ann")).ok

    sub = await nc.subscribe(approval_request_subject("demo"), cb=human)
    loop = nats_loop(nc, profile)
    try:
        first = await loop.run_turn(TurnRequest(profile_id="demo", text="plan it", tags=("client:acme",)))
        second = await loop.run_turn(TurnRequest(profile_id="demo", text="and then?", session_id=first.session_id))
    finally:
        await sub.unsubscribe()
    assert first.status == second.status == TurnStatus.COMPLETED

    async with journal_writer(nats_url, database_url):
        await wait_caught_up(js, database_url, "journal-writer")
    conn = await connect(database_url)
    try:
        sessions = await conn.fetch("SELECT * FROM sessions ORDER BY created_at")
        assert [(s["source"], s["title"]) for s in sessions] == [("cli", "plan it"), ("subagent", "Find the answer")]
        parent, child = sessions
        assert child["parent_session_id"] == parent["id"] == first.session_id
        assert parent["context_snapshot"]["system_prompt"] == "Be brief."
        tags = ["area:work", "client:acme", "team:core"]
        # The session keeps its own tags; the child session is given the delegating turn's resolved tags.
        assert parent["tags"] == ["client:acme"] and child["tags"] == tags

        turns = await conn.fetch("SELECT * FROM turns ORDER BY started_at")
        assert [(t["depth"], t["status"]) for t in turns] == [(0, "completed"), (1, "completed"), (0, "completed")]
        first_turn, child_turn, second_turn = turns
        assert first_turn["id"] == first.turn_id and second_turn["id"] == second.turn_id
        assert child_turn["parent_turn_id"] == first.turn_id and child_turn["session_id"] == child["id"]
        assert first_turn["tags"] == child_turn["tags"] == second_turn["tags"] == tags

        seqs = await conn.fetch("SELECT session_id, array_agg(seq ORDER BY seq) AS s FROM messages GROUP BY 1")
        for row in seqs:
            assert row["s"] == list(range(1, len(row["s"]) + 1))
        roles = [
            r["role"]
            for r in await conn.fetch("SELECT role FROM messages WHERE turn_id = $1 ORDER BY seq", second.turn_id)
        ]
        assert roles == ["user", "assistant"]

        calls = await conn.fetch("SELECT name, approval, is_error, risk, turn_id FROM tool_calls ORDER BY started_at")
        assert [(c["name"], c["approval"], c["is_error"]) for c in calls] == [
            ("list_dir", None, False),
            ("shell", "approved", False),
            ("write_file", "denied", True),
            ("shell", "denied", True),
            ("delegate", None, False),
        ]
        assert {c["turn_id"] for c in calls} == {first.turn_id}
        approvals = await conn.fetch(
            "SELECT tc.name, tc.args, a.status, a.decided_by"
            " FROM approvals a JOIN tool_calls tc ON tc.id = a.tool_call_id ORDER BY a.decided_at"
        )
        assert [(a["name"], a["args"], a["status"], a["decided_by"]) for a in approvals] == [
            ("shell", {"command": "echo approved"}, "approved", "cli:ann"),
            ("write_file", {"path": "x.txt", "content": "x"}, "denied", "policy"),
            ("shell", {"command": "echo unanswered"}, "denied", "cli:ann"),
        ]
    finally:
        await conn.close()
