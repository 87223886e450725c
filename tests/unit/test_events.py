"""Event contracts: round trips, golden payloads of every published version, schema drift."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from commonos.proto import events as ev
from commonos.proto.messages import AssistantMessage, ToolCall, ToolResultMessage, UserMessage

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden"
SCHEMA = REPO / "proto" / "schema" / "events.schema.json"

T0 = datetime(2026, 11, 30, 9, 0, 0, tzinfo=UTC)
SID = uuid.UUID("0193a000-0000-7000-8000-0000000000c1")
TID = uuid.UUID("0193a000-0000-7000-8000-0000000000d1")


def _id(n: int) -> uuid.UUID:
    return uuid.UUID(f"0193a000-0000-7000-8000-{n:012x}")


def samples() -> dict[str, ev.Event]:
    """One fully populated event of each type, with fixed ids and times."""
    common: dict[str, Any] = {"profile_id": "default", "session_id": SID, "occurred_at": T0}
    return {
        "profile_upserted": ev.ProfileUpserted(
            event_id=_id(1), profile_id="default", occurred_at=T0, tags=("area:work", "team:core")
        ),
        "profile_deleted": ev.ProfileDeleted(
            event_id=_id(14), profile_id="default", occurred_at=T0, deleted_by="cli:alice"
        ),
        "session_created": ev.SessionCreated(
            event_id=_id(2), **common, source="cli", title="Do I need an umbrella?", tags=("project:site",)
        ),
        "turn_started": ev.TurnStarted(
            event_id=_id(3),
            **common,
            turn_id=TID,
            tags=("area:work",),
            context_snapshot={"system_prompt": "Be brief.", "memory": []},
        ),
        "message_appended": ev.MessageAppended(
            event_id=_id(4),
            **common,
            turn_id=TID,
            message_id=_id(40),
            seq=1,
            content=UserMessage(text="Do I need an umbrella?"),
        ),
        "message_appended_tool_calls": ev.MessageAppended(
            event_id=_id(5),
            **common,
            turn_id=TID,
            message_id=_id(50),
            seq=2,
            content=AssistantMessage(tool_calls=(ToolCall(id="c1", name="weather", args={"city": "Charleston"}),)),
        ),
        "message_appended_tool_result": ev.MessageAppended(
            event_id=_id(6),
            **common,
            turn_id=TID,
            message_id=_id(60),
            seq=3,
            content=ToolResultMessage(call_id="c1", content="Charleston: 18°C, light rain"),
        ),
        "message_deactivated": ev.MessageDeactivated(event_id=_id(7), **common, message_ids=(_id(40),)),
        "tool_call_recorded": ev.ToolCallRecorded(
            event_id=_id(8),
            **common,
            turn_id=TID,
            tool_call_id=_id(80),
            call_id="c1",
            name="shell",
            args={"cmd": "ls"},
            result="a\nb",
            risk=ev.Risk.HIGH,
            started_at=T0,
            finished_at=T0,
            approval=ev.ApprovalStatus.APPROVED,
        ),
        "approval_decided": ev.ApprovalDecided(
            event_id=_id(9),
            **common,
            turn_id=TID,
            tool_call_id=_id(80),
            call_id="c1",
            status=ev.ApprovalStatus.APPROVED,
            decided_at=T0,
            decided_by="cli:alice",
        ),
        "memory_changed": ev.MemoryChanged(
            event_id=_id(10),
            **common,
            turn_id=TID,
            target=ev.MemoryTarget.USER,
            op=ev.MemoryOp.ADD,
            position=0,
            content="Prefers metric units.",
        ),
        "model_call_completed": ev.ModelCallCompleted(
            event_id=_id(11),
            **common,
            turn_id=TID,
            provider="anthropic",
            model="claude-sonnet-4-5",
            request_id="req_1",
            input_tokens=10,
            output_tokens=20,
            cache_read_tokens=30,
            cache_write_5m_tokens=40,
            cache_write_1h_tokens=50,
            reasoning_tokens=5,
            speed="standard",
            latency_s=1.25,
            stop_reason="end_turn",
            tags=("client:acme",),
            reported_cost_usd=Decimal("0.0123"),
        ),
        "turn_finished": ev.TurnFinished(
            event_id=_id(12), **common, turn_id=TID, status=ev.TurnStatus.FAILED, error="model timed out"
        ),
        "transcript_imported": ev.TranscriptImported(
            event_id=_id(13),
            **common,
            vendor="claude-code",
            source_ref="projects/x/y.jsonl",
            tags=("vendor:claude-code",),
            graph={"sessions": []},
        ),
    }


def test_every_type_has_a_sample() -> None:
    assert {ev.event_type(e) for e in samples().values()} == set(ev.EVENT_TYPE_NAMES)


@pytest.mark.parametrize("name", sorted(samples()))
def test_round_trip(name: str) -> None:
    event = samples()[name]
    assert ev.decode_event(ev.encode_event(event)) == event


@pytest.mark.parametrize("name", sorted(samples()))
def test_golden_payloads_keep_decoding(name: str) -> None:
    """Payloads as published by version 1; they must decode to the same values forever."""
    for version_dir in sorted(GOLDEN.glob("v*")):
        path = version_dir / f"{name}.json"
        if version_dir.name == "v1":
            assert path.exists(), f"no golden payload {path}"
        if path.exists():
            assert ev.decode_event(path.read_bytes()) == samples()[name]


def test_committed_schema_matches_the_code() -> None:
    committed = json.loads(SCHEMA.read_text())
    assert committed == json.loads(json.dumps(ev.event_json_schema())), (
        "proto/schema/events.schema.json differs from the Structs: run `make schema` and review the diff"
    )


def test_schema_names_every_type() -> None:
    mapping = ev.event_json_schema()["discriminator"]["mapping"]
    assert set(mapping) == set(ev.EVENT_TYPE_NAMES)


BASE = {
    "event_id": str(_id(1)),
    "occurred_at": "2026-11-30T09:00:00Z",
    "profile_id": "p",
    "session_id": str(SID),
}


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        (b"not json", "malformed"),
        (json.dumps({**BASE, "type": "nope"}).encode(), "Invalid value 'nope'"),
        (json.dumps({**BASE}).encode(), "missing required field `type`"),
        (
            json.dumps(
                {
                    **BASE,
                    "type": "message_appended",
                    "turn_id": str(TID),
                    "seq": 0,
                    "content": {"role": "user", "text": "x"},
                }
            ).encode(),
            "seq",
        ),
        (
            json.dumps(
                {**BASE, "type": "model_call_completed", "provider": "a", "model": "m", "input_tokens": -1}
            ).encode(),
            "input_tokens",
        ),
        (
            json.dumps({**BASE, "type": "session_created", "source": "cli", "tags": ["Area:x"]}).encode(),
            "tags",
        ),
        (json.dumps({**BASE, "type": "session_created", "source": 5}).encode(), "source"),
        (
            json.dumps(
                {**BASE, "occurred_at": "2026-11-30T09:00:00", "type": "session_created", "source": "cli"}
            ).encode(),
            "timezone",
        ),
        (
            json.dumps({**BASE, "profile_id": "Bad.Profile", "type": "session_created", "source": "cli"}).encode(),
            "profile_id",
        ),
        (b'{"type":"session_created","source":"\xff"}', "invalid"),
    ],
)
def test_invalid_payloads_are_typed_errors(payload: bytes, fragment: str) -> None:
    with pytest.raises(ev.EventDecodeError) as err:
        ev.decode_event(payload)
    assert fragment.lower() in str(err.value).lower()


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    payload = json.dumps({**BASE, "type": "session_created", "source": "cli", "added_later": 1}).encode()
    assert isinstance(ev.decode_event(payload), ev.SessionCreated)
