"""Event and alert contracts: round trips, golden messages (headers and body) of every published version,
schema drift. The goldens are checked against the exported schema by stock validators in
tests/contract/test_schema_validators.py."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import pytest

from commonos.proto import alerts as al
from commonos.proto import events as ev
from commonos.proto import graph as g
from commonos.proto.cloudevents import alert_headers, check_event_headers, decode_headers, event_headers
from commonos.proto.messages import AssistantMessage, ToolCall, ToolResultMessage, UserMessage
from commonos.proto.schemas import SCHEMA_BASE, schema_files
from commonos.proto.subjects import ALERTS_STREAM, EVENTS_STREAM
from commonos.runtime.limits import with_stream_header

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden"
SCHEMA_DIR = REPO / "proto" / "schema"
#: Who publishes each type in the goldens' headers (`ce-source`).
LOOP, IMPORTER, CLI, BILLING = "urn:commonos:loop", "urn:commonos:importer", "urn:commonos:cli", "urn:commonos:billing"

T0 = datetime(2026, 11, 30, 9, 0, 0, tzinfo=UTC)
SID = uuid.UUID("0193a000-0000-7000-8000-0000000000c1")
TID = uuid.UUID("0193a000-0000-7000-8000-0000000000d1")


def _id(n: int) -> uuid.UUID:
    return uuid.UUID(f"0193a000-0000-7000-8000-{n:012x}")


def sample_graph() -> g.Graph:
    """A small session graph with a row in every list, as the importer puts it in `transcript_imported`."""
    sid, ui, mi, tu = str(SID), _id(200), _id(201), _id(202)
    graph = g.Graph(
        sessions=[
            g.Session(
                id=sid,
                parent_session_id=None,
                spawned_by_tool_use_id=None,
                started_at=T0,
                ended_at=T0,
                title="Fix the build",
                working_dir="/home/alice/site",
                git_branch="main",
                outcome=g.Outcome.COMMITTED,
            )
        ],
        attributes=[
            g.SessionAttribute(
                id=str(_id(203)), session_id=sid, key="permissionMode", value=msgspec.Raw(b'"default"'), valid_from=T0
            )
        ],
        user_inputs=[
            g.UserInput(
                id=str(ui),
                session_id=sid,
                ordinal=0,
                text="Fix the build",
                triggered_at=T0,
                interrupted=False,
                kind=g.InputKind.PROMPT,
                origin=g.InputOrigin.HUMAN,
                metadata=msgspec.Raw(b"{}"),
            )
        ],
        model_invocations=[
            g.ModelInvocation(
                id=str(mi),
                session_id=sid,
                user_input_id=str(ui),
                parent_model_invocation_id=None,
                model="claude-sonnet-4-5",
                input_tokens=10,
                output_tokens=20,
                reasoning_tokens=5,
                cache_read_tokens=30,
                cache_write_tokens=40,
                total_tokens=100,
                token_basis=g.TokenBasis.REPORTED,
                speed="standard",
                stop_reason="tool_use",
                started_at=T0,
            )
        ],
        assistant_messages=[
            g.AssistantMessage(
                id=str(_id(204)),
                session_id=sid,
                user_input_id=str(ui),
                model_invocation_id=str(mi),
                text="Running the tests.",
                content=msgspec.Raw(b'[{"type":"text","text":"Running the tests."}]'),
                timestamp=T0,
            )
        ],
        tool_uses=[
            g.ToolUse(
                id=str(tu),
                session_id=sid,
                user_input_id=str(ui),
                model_invocation_id=str(mi),
                name="Edit",
                verb=g.ToolVerb.EDIT,
                input=msgspec.Raw(b'{"file_path":"/home/alice/site/build.py"}'),
                status=g.ToolStatus.OK,
                metadata=msgspec.Raw(b"{}"),
                timestamp=T0,
            )
        ],
        tool_results=[
            g.ToolResult(
                id=str(_id(205)),
                tool_use_id=str(tu),
                session_id=sid,
                user_input_id=str(ui),
                status=g.ToolStatus.OK,
                output_text="edited",
                timestamp=T0,
            )
        ],
        file_touches=[
            g.FileTouch(
                id=str(_id(206)),
                tool_use_id=str(tu),
                user_input_id=str(ui),
                session_id=sid,
                path="/home/alice/site/build.py",
                kind=g.TouchKind.EDIT,
                hunks=[g.Hunk(old_start=1, old_lines=1, new_start=1, new_lines=2, lines=["-a", "+a", "+b"])],
            )
        ],
        token_usage=[
            g.TokenUsage(
                id=str(_id(207)),
                session_id=sid,
                user_input_id=None,
                scope=g.UsageScope.SESSION,
                model="claude-sonnet-4-5",
                output_tokens=7,
                token_basis=g.TokenBasis.AGGREGATE_REPORTED,
            )
        ],
        vendor_ids=[
            g.VendorID(
                our_id=sid,
                our_type=g.EntityType.SESSION,
                session_id=sid,
                vendor="claude-code",
                vendor_id_kind="session_id",
                vendor_id="3f2a-vendor-session",
                source_ref="projects/x/y.jsonl",
            )
        ],
    )
    g.validate(graph)
    return graph


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
            context_snapshot={"system_prompt": "Be brief.", "memory": [], "user": ["Prefers metric units."]},
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
        "model_call_refused": ev.ModelCallRefused(
            event_id=_id(15),
            **common,
            turn_id=TID,
            budget="acme-daily",
            tag="client:acme",
            limit_usd=Decimal("5"),
            spent_usd=Decimal("5.0125"),
            period_start=datetime(2026, 11, 30, tzinfo=UTC),
            period_end=datetime(2026, 12, 1, tzinfo=UTC),
            reason="model call refused: budget 'acme-daily' (tag client:acme) is exhausted: spent 5.0125 USD of "
            "its 5 USD limit for the day from 2026-11-30T00:00Z to 2026-12-01T00:00Z",
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
            graph=sample_graph(),
        ),
    }


def alert_samples() -> dict[str, al.Alert]:
    """One alert of each type, with fixed ids and times."""
    # As billing derives it from the budget and the period (commonos.billing.budgets.alert_id).
    alert_id = uuid.uuid5(
        uuid.UUID("5b0f3c1e-8f0e-4d3a-9b7a-63e0c0b1d9a2"), "cos-budget-alert:acme-monthly:month:2026-11-01T00:00Z"
    )
    return {
        "budget_exceeded": al.BudgetExceeded(
            event_id=alert_id,
            alert_id=alert_id,
            occurred_at=T0,
            budget="acme-monthly",
            tag="client:acme",
            period=al.Period.MONTH,
            period_start=datetime(2026, 11, 1, tzinfo=UTC),
            period_end=datetime(2026, 12, 1, tzinfo=UTC),
            limit_usd=Decimal("100"),
            spent_usd=Decimal("100.0123"),
            crossed_by_event_id=_id(11),
        ),
        "budget_warning": al.BudgetWarning(
            event_id=uuid.uuid5(
                uuid.UUID("5b0f3c1e-8f0e-4d3a-9b7a-63e0c0b1d9a2"),
                "cos-budget-alert:acme-monthly:month:2026-11-01T00:00Z:80",
            ),
            occurred_at=T0,
            budget="acme-monthly",
            tag="client:acme",
            period=al.Period.MONTH,
            period_start=datetime(2026, 11, 1, tzinfo=UTC),
            period_end=datetime(2026, 12, 1, tzinfo=UTC),
            limit_usd=Decimal("100"),
            percent=80,
            spent_usd=Decimal("80.5"),
            projected_exhausted_at=datetime(2026, 11, 20, 3, 30, tzinfo=UTC),
            crossed_by_event_id=_id(11),
        ),
    }


#: The producer of each golden, as its `ce-source` says.
SOURCES: dict[str, str] = {
    "profile_upserted": CLI,
    "profile_deleted": CLI,
    "transcript_imported": IMPORTER,
    "budget_exceeded": BILLING,
    "budget_warning": BILLING,
}


def golden_message(name: str) -> dict[str, Any]:
    """What a golden file of the current version holds: the headers as a consumer receives them (the
    producer's, and the `Nats-Expected-Stream` JetStream publishing adds) and the body."""
    source = SOURCES.get(name, LOOP)
    if name in alert_samples():
        alert = alert_samples()[name]
        headers = with_stream_header(alert_headers(alert, source), ALERTS_STREAM)
        body = al.encode_alert(alert)
    else:
        event = samples()[name]
        headers = with_stream_header(event_headers(event, source), EVENTS_STREAM)
        body = ev.encode_event(event)
    return {"headers": dict(headers), "body": json.loads(body)}


def test_every_type_has_a_sample() -> None:
    assert {ev.event_type(e) for e in samples().values()} == set(ev.EVENT_TYPE_NAMES)


@pytest.mark.parametrize("name", sorted(samples()))
def test_round_trip(name: str) -> None:
    event = samples()[name]
    assert ev.decode_event(ev.encode_event(event)) == event


def _goldens(name: str) -> list[Path]:
    """The golden files of `name` in every version folder (tests/golden/v<N>/, alerts under alerts/)."""
    sub = "alerts/" if name in alert_samples() else ""
    return [path for d in sorted(GOLDEN.glob("v*")) if (path := d / f"{sub}{name}.json").exists()]


@pytest.mark.parametrize("name", sorted(samples()))
def test_golden_events_keep_decoding_and_their_headers_agree(name: str) -> None:
    """Messages as published by each version (headers and body); they must decode to the same values forever."""
    paths = _goldens(name)
    assert GOLDEN / "v1" / f"{name}.json" in paths, f"no golden message tests/golden/v1/{name}.json"
    for path in paths:
        golden = json.loads(path.read_text())
        # As producers write it (compact): a graph's JSON-valued fields keep the bytes they arrive as.
        event = ev.decode_event(json.dumps(golden["body"], separators=(",", ":"), ensure_ascii=False).encode())
        assert event == samples()[name]
        check_event_headers(golden["headers"], event)
        assert golden["headers"]["Nats-Msg-Id"] == golden["headers"]["ce-id"] == golden["body"]["event_id"]


@pytest.mark.parametrize("name", sorted(alert_samples()))
def test_golden_alerts_keep_decoding_and_their_headers_agree(name: str) -> None:
    paths = _goldens(name)
    assert GOLDEN / "v1" / "alerts" / f"{name}.json" in paths, f"no golden message tests/golden/v1/alerts/{name}.json"
    for path in paths:
        golden = json.loads(path.read_text())
        alert = al.decode_alert(json.dumps(golden["body"]).encode())
        assert alert == alert_samples()[name]
        attrs = decode_headers(golden["headers"])
        the_alert_id = alert.alert_id if isinstance(alert, al.BudgetExceeded) else alert.event_id
        assert attrs["id"] == golden["headers"]["Nats-Msg-Id"] == str(alert.event_id) == str(the_alert_id)
        assert (attrs["type"], attrs["subject"]) == (f"cos.{name}.v1", alert.budget)


@pytest.mark.parametrize("name", sorted([*samples(), *alert_samples()]))
def test_the_newest_goldens_are_what_producers_write_now(name: str) -> None:
    """A change to what producers send (a header, a field) shows up here: write a golden of a new version,
    or regenerate the current one if the change is compatible, and review the diff."""
    newest = _goldens(name)[-1]
    assert json.loads(newest.read_text()) == golden_message(name), f"{newest} differs from what producers write"


HISTORIC = sorted((GOLDEN / "historic").glob("*.json"))


@pytest.mark.parametrize("path", HISTORIC, ids=lambda path: path.stem)
def test_messages_published_before_a_field_was_added_still_decode(path: Path) -> None:
    """Earlier v1 messages, from before a field existed (`result_bytes`, the parts of a transcript, an alert's
    `event_id`, ...), with the headers of their time: they decode, every value they carried is kept, and
    their headers still agree with the body. (The schema describes what producers send now, so it requires
    the fields these lack.)"""
    old = json.loads(path.read_text())
    message: ev.Event | al.Alert
    if old["body"]["type"] in ev.EVENT_TYPE_NAMES:
        message = ev.decode_event(json.dumps(old["body"]).encode())
        check_event_headers(old["headers"], message)
        again = json.loads(ev.encode_event(message))
    else:
        message = al.decode_alert(json.dumps(old["body"]).encode())
        assert decode_headers(old["headers"])["id"] == old["body"]["alert_id"] == str(message.event_id)
        again = json.loads(al.encode_alert(message))
    assert _kept(old["body"], again)


def _kept(old: Any, new: Any) -> bool:
    """Whether `new` holds every value of `old`: the same, or for an object a superset of its keys (a field
    added since, such as the lists of a graph that lacked them, decodes as its default)."""
    if isinstance(old, dict):
        return isinstance(new, dict) and all(key in new and _kept(value, new[key]) for key, value in old.items())
    return bool(old == new)


def test_an_alert_published_before_event_id_takes_its_alert_id() -> None:
    old = json.loads((GOLDEN / "historic" / "v1_budget_exceeded_before_event_id.json").read_text())
    assert "event_id" not in old["body"]
    alert = al.decode_alert(json.dumps(old["body"]).encode())
    assert alert == alert_samples()["budget_exceeded"]


def test_an_alert_whose_ids_differ_is_refused() -> None:
    body = json.loads(al.encode_alert(alert_samples()["budget_exceeded"]))
    body["event_id"] = str(_id(999))
    with pytest.raises(al.AlertDecodeError, match="event_id and alert_id"):
        al.decode_alert(json.dumps(body).encode())


def _committed_schema_files() -> dict[str, Any]:
    return {
        path.relative_to(SCHEMA_DIR).as_posix(): json.loads(path.read_text()) for path in SCHEMA_DIR.rglob("*.json")
    }


def test_committed_schema_matches_the_code() -> None:
    exported = json.loads(json.dumps(schema_files()))
    committed = _committed_schema_files()
    assert sorted(committed) == sorted(exported), "proto/schema/ holds other files than `cos schema export` writes"
    for path, document in exported.items():
        assert committed[path] == document, (
            f"proto/schema/{path} differs from the Structs: run `make schema` and review the diff"
        )


def test_every_type_has_a_schema_file_with_its_id() -> None:
    files = schema_files()
    for name in ev.EVENT_TYPE_NAMES:
        document = files[f"events/{name}/v1.json"]
        assert document["$id"] == f"{SCHEMA_BASE}/events/{name}/v1.json"
        assert document["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert document["properties"]["type"] == {"const": name}
    assert files["alerts/budget_exceeded/v1.json"]["properties"]["type"] == {"const": "budget_exceeded"}
    union = files["events.schema.json"]
    consts = {
        union["$defs"][ref["$ref"].removeprefix("#/$defs/")]["properties"]["type"]["const"] for ref in union["oneOf"]
    }
    assert consts == set(ev.EVENT_TYPE_NAMES)


def test_the_schema_requires_what_producers_always_send() -> None:
    files = schema_files()
    for name in ev.EVENT_TYPE_NAMES:
        required = files[f"events/{name}/v1.json"]["required"]
        assert {"type", "event_id", "occurred_at", "profile_id", "session_id"} <= set(required), name
    message = files["events/message_appended/v1.json"]
    assert "message_id" in message["required"]
    assert "tool_call_id" in files["events/tool_call_recorded/v1.json"]["required"]
    finished = files["events/turn_finished/v1.json"]["properties"]["status"]
    assert "running" not in finished["enum"] and "completed" in finished["enum"]
    assert files["events/transcript_imported/v1.json"]["properties"]["graph"] == {"$ref": "#/$defs/Graph"}
    alert = files["alerts/budget_exceeded/v1.json"]
    assert {"event_id", "occurred_at", "alert_id", "spent_usd"} <= set(alert["required"])
    assert alert["properties"]["spent_usd"] == {"$ref": "#/$defs/Decimal"}


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
