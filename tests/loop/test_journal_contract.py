"""One contract for the Journal port, run against every adapter (memory, NATS JetStream)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from nats.js import JetStreamContext

from commonos.accounting.usage import TokenUsage
from commonos.loop.event_journal import EventJournal
from commonos.loop.journal import (
    ApprovalDecision,
    JournalError,
    MemoryChange,
    MemoryEntries,
    MessageTooLarge,
    ModelCall,
    SessionNotFound,
    ToolCallRecord,
    UnknownMessage,
)
from commonos.loop.memory import MemoryJournal
from commonos.loop.nats_journal import NatsJournal
from commonos.proto.events import (
    NO_SESSION,
    ApprovalDecided,
    ApprovalStatus,
    Event,
    MemoryChanged,
    MemoryOp,
    MemoryTarget,
    MessageAppended,
    MessageDeactivated,
    ModelCallCompleted,
    ProfileUpserted,
    Risk,
    SessionCreated,
    ToolCallRecorded,
    TurnFinished,
    TurnStarted,
    TurnStatus,
    event_type,
    utcnow,
)
from commonos.proto.identity import NewSession, TurnInfo
from commonos.proto.ids import new_id
from commonos.proto.messages import AssistantMessage, Message, ToolCall, ToolResultMessage, UserMessage
from commonos.runtime.embedded import NatsServer
from commonos.runtime.nats import ensure_streams
from commonos.runtime.publisher import EventPublisher
from tests.harness import ExternalServer

CONVERSATION: list[Message] = [
    UserMessage(text="Do I need an umbrella?"),
    AssistantMessage(tool_calls=(ToolCall(id="c1", name="weather", args={"city": "Charleston"}),)),
    ToolResultMessage(call_id="c1", content="Charleston: 18°C, light rain", is_error=False),
    AssistantMessage(text="Bring an umbrella: 18°C and light rain."),
]


async def _session(journal: EventJournal, profile: str = "default", **kw: object) -> tuple[uuid.UUID, TurnInfo]:
    session_id = await journal.create_session(
        NewSession(profile_id=profile, source="cli", title="t", tags=("project:site",), **kw)  # type: ignore[arg-type]
    )
    turn = TurnInfo(profile_id=profile, session_id=session_id, turn_id=new_id(), tags=("area:work", "project:site"))
    return session_id, turn


class JournalContract:
    """What every Journal adapter does. Subclasses provide `journal`, `stored_events` and `reopen`."""

    @pytest.fixture
    def journal(self) -> EventJournal:
        raise NotImplementedError

    async def stored_events(self, journal: EventJournal) -> list[Event]:
        """Every event the store holds, in the order stored."""
        raise NotImplementedError

    def reopen(self, journal: EventJournal) -> EventJournal:
        """A new adapter instance on the same store: what a process restart sees."""
        raise NotImplementedError

    async def test_create_session_records_the_new_session(self, journal: EventJournal) -> None:
        parent = new_id()
        session_id = await journal.create_session(
            NewSession(
                profile_id="default",
                source="subagent",
                title="Find the forecast",
                tags=("client:acme",),
                parent_session_id=parent,
            )
        )
        assert session_id.version == 7
        record = await journal.load_session(session_id)
        assert (record.profile_id, record.source, record.title, record.tags, record.parent_session_id) == (
            "default",
            "subagent",
            "Find the forecast",
            ("client:acme",),
            parent,
        )
        assert record.turn_count == 0 and record.context_snapshot is None
        [event] = await self.stored_events(journal)
        assert isinstance(event, SessionCreated)
        assert event.session_id == session_id and event.parent_session_id == parent

    async def test_unknown_session_is_a_typed_error(self, journal: EventJournal) -> None:
        with pytest.raises(SessionNotFound):
            await journal.load_session(new_id())
        with pytest.raises(SessionNotFound):
            await journal.load_history(new_id())

    async def test_messages_come_back_oldest_first_with_gap_free_seqs(self, journal: EventJournal) -> None:
        session_id, turn = await _session(journal)
        await journal.start_turn(turn)
        seqs = [await journal.append_message(turn, m) for m in CONVERSATION]
        assert seqs == [1, 2, 3, 4]
        assert await journal.load_history(session_id) == CONVERSATION
        appended = [e for e in await self.stored_events(journal) if isinstance(e, MessageAppended)]
        assert [e.seq for e in appended] == [1, 2, 3, 4]
        assert [e.role for e in appended] == ["user", "assistant", "tool_result", "assistant"]
        assert {e.turn_id for e in appended} == {turn.turn_id}

    async def test_seqs_are_per_session(self, journal: EventJournal) -> None:
        a, turn_a = await _session(journal)
        b, turn_b = await _session(journal)
        assert await journal.append_message(turn_a, CONVERSATION[0]) == 1
        assert await journal.append_message(turn_b, CONVERSATION[0]) == 1
        assert await journal.append_message(turn_a, CONVERSATION[3]) == 2
        assert await journal.load_history(a) == [CONVERSATION[0], CONVERSATION[3]]
        assert await journal.load_history(b) == [CONVERSATION[0]]

    async def test_deactivated_messages_leave_the_history_but_stay_stored(self, journal: EventJournal) -> None:
        session_id, turn = await _session(journal)
        for m in CONVERSATION:
            await journal.append_message(turn, m)
        await journal.deactivate_messages(turn, [2, 3])
        assert await journal.load_history(session_id) == [CONVERSATION[0], CONVERSATION[3]]
        entries = await journal.load_entries(session_id)
        assert [(e.seq, e.active) for e in entries] == [(1, True), (2, False), (3, False), (4, True)]
        [event] = [e for e in await self.stored_events(journal) if isinstance(e, MessageDeactivated)]
        assert event.message_ids == (entries[1].message_id, entries[2].message_id)
        # the next message still continues the numbering
        assert await journal.append_message(turn, UserMessage(text="thanks")) == 5
        with pytest.raises(UnknownMessage):
            await journal.deactivate_messages(turn, [99])

    async def test_turns_carry_the_whole_turn_info_and_the_first_snapshot(self, journal: EventJournal) -> None:
        session_id, turn = await _session(journal)
        snapshot = {"system_prompt": "Be brief.", "memory": ["likes tea"], "user": []}
        await journal.start_turn(turn, context_snapshot=snapshot)
        await journal.finish_turn(turn, TurnStatus.COMPLETED)
        second = TurnInfo(profile_id="default", session_id=session_id, turn_id=new_id(), tags=turn.tags)
        await journal.start_turn(second)
        record = await journal.load_session(session_id)
        assert record.context_snapshot == snapshot
        assert record.turn_count == 2 and record.open_turns == (second.turn_id,)
        await journal.finish_turn(second, TurnStatus.FAILED, error="model unreachable")

        child_session = await journal.create_session(NewSession(profile_id="default", source="subagent"))
        child = turn.child(child_session)
        await journal.start_turn(child)
        events = await self.stored_events(journal)
        started = [e for e in events if isinstance(e, TurnStarted)]
        assert [(s.turn_id, s.parent_turn_id, s.depth, s.tags) for s in started] == [
            (turn.turn_id, None, 0, turn.tags),
            (second.turn_id, None, 0, turn.tags),
            (child.turn_id, turn.turn_id, 1, turn.tags),
        ]
        assert started[0].context_snapshot == snapshot and started[1].context_snapshot is None
        finished = [e for e in events if isinstance(e, TurnFinished)]
        assert [(f.status, f.error) for f in finished] == [
            (TurnStatus.COMPLETED, None),
            (TurnStatus.FAILED, "model unreachable"),
        ]

    async def test_tool_calls_approvals_and_model_calls_are_recorded(self, journal: EventJournal) -> None:
        _, turn = await _session(journal)
        started = utcnow()
        record = ToolCallRecord(
            call_id="c1",
            name="shell",
            args={"command": "date"},
            result="Mon",
            risk=Risk.HIGH,
            started_at=started,
            finished_at=started + timedelta(seconds=1.5),
            approval=ApprovalStatus.APPROVED,
        )
        decision = ApprovalDecision(
            tool_call_id=record.tool_call_id, call_id="c1", status=ApprovalStatus.APPROVED, decided_by="cli:ann"
        )
        await journal.record_approval(turn, decision)
        await journal.record_tool_call(turn, record)
        usage = TokenUsage(input_tokens=10, output_tokens=20, cache_read_tokens=3, reasoning_tokens=5)
        await journal.record_model_call(
            turn,
            ModelCall(
                provider="anthropic",
                model="claude-x",
                usage=usage,
                request_id="req_1",
                latency_s=0.5,
                stop_reason="end_turn",
            ),
        )
        events = await self.stored_events(journal)
        approval = next(e for e in events if isinstance(e, ApprovalDecided))
        tool = next(e for e in events if isinstance(e, ToolCallRecorded))
        model = next(e for e in events if isinstance(e, ModelCallCompleted))
        assert approval.tool_call_id == tool.tool_call_id == record.tool_call_id
        assert (approval.status, approval.decided_by, approval.turn_id) == ("approved", "cli:ann", turn.turn_id)
        assert (tool.name, tool.args, tool.result, tool.risk, tool.approval) == (
            "shell",
            {"command": "date"},
            "Mon",
            Risk.HIGH,
            ApprovalStatus.APPROVED,
        )
        assert tool.finished_at - tool.started_at == timedelta(seconds=1.5)
        assert (model.input_tokens, model.output_tokens, model.cache_read_tokens, model.reasoning_tokens) == (
            10,
            20,
            3,
            5,
        )
        assert model.tags == turn.tags and model.turn_id == turn.turn_id and model.request_id == "req_1"

    async def test_memory_is_the_profiles_changes_in_order(self, journal: EventJournal) -> None:
        _, turn = await _session(journal)
        _, other_session_turn = await _session(journal)
        _, other_profile_turn = await _session(journal, profile="other")
        changes = [
            (turn, MemoryChange(target=MemoryTarget.MEMORY, op=MemoryOp.ADD, position=0, content="b")),
            (turn, MemoryChange(target=MemoryTarget.MEMORY, op=MemoryOp.ADD, position=0, content="a")),
            (other_session_turn, MemoryChange(target=MemoryTarget.USER, op=MemoryOp.ADD, position=0, content="u")),
            (turn, MemoryChange(target=MemoryTarget.MEMORY, op=MemoryOp.ADD, position=2, content="c")),
            (turn, MemoryChange(target=MemoryTarget.MEMORY, op=MemoryOp.REPLACE, position=1, content="B")),
            (turn, MemoryChange(target=MemoryTarget.MEMORY, op=MemoryOp.REMOVE, position=0)),
            (other_profile_turn, MemoryChange(target=MemoryTarget.MEMORY, op=MemoryOp.ADD, position=0, content="x")),
        ]
        for t, change in changes:
            await journal.record_memory_change(t, change)
        assert await journal.load_memory("default") == MemoryEntries(memory=("B", "c"), user=("u",))
        assert await journal.load_memory("other") == MemoryEntries(memory=("x",))
        assert await journal.load_memory("nobody") == MemoryEntries()
        stored = [e for e in await self.stored_events(journal) if isinstance(e, MemoryChanged)]
        assert [(e.op, e.position, e.turn_id) for e in stored][:2] == [
            (MemoryOp.ADD, 0, turn.turn_id),
            (MemoryOp.ADD, 0, turn.turn_id),
        ]

    async def test_profile_upserted_belongs_to_no_session(self, journal: EventJournal) -> None:
        await journal.publish_profile("default", ["team:core", "area:work"])
        [event] = await self.stored_events(journal)
        assert isinstance(event, ProfileUpserted)
        assert event.session_id == NO_SESSION and event.tags == ("team:core", "area:work")

    async def test_a_restarted_process_reads_the_history_back_and_continues_the_numbering(
        self, journal: EventJournal
    ) -> None:
        session_id, turn = await _session(journal)
        await journal.start_turn(turn, context_snapshot={"system_prompt": "s"})
        for m in CONVERSATION[:3]:
            await journal.append_message(turn, m)
        await journal.deactivate_messages(turn, [1])

        restarted = self.reopen(journal)
        # no load first: the new instance must find seq 3 in the store by itself
        assert await restarted.append_message(turn, CONVERSATION[3]) == 4
        assert await restarted.load_history(session_id) == CONVERSATION[1:]
        assert (await restarted.load_session(session_id)).context_snapshot == {"system_prompt": "s"}
        appended = [e for e in await self.stored_events(journal) if isinstance(e, MessageAppended)]
        assert [e.seq for e in appended] == [1, 2, 3, 4]

    async def test_every_operation_is_exactly_one_event(self, journal: EventJournal) -> None:
        session_id, turn = await _session(journal)
        await journal.start_turn(turn)
        await journal.append_message(turn, CONVERSATION[0])
        await journal.finish_turn(turn, TurnStatus.COMPLETED)
        events = await self.stored_events(journal)
        assert [event_type(e) for e in events] == [
            "session_created",
            "turn_started",
            "message_appended",
            "turn_finished",
        ]
        assert len({e.event_id for e in events}) == 4
        assert {e.session_id for e in events} == {session_id}

    async def test_a_message_over_the_limit_is_refused_and_nothing_is_stored(self, journal: EventJournal) -> None:
        journal.max_message_bytes = 4096
        assert journal.message_limit == 4096
        session_id, turn = await _session(journal)
        await journal.append_message(turn, CONVERSATION[0])
        fits = UserMessage(text="x" * (4096 - journal.message_bytes(turn, UserMessage(text=""))))
        too_large = UserMessage(text=fits.text + "\n")  # JSON writes it as two bytes
        assert journal.check_message(turn, fits) == journal.message_bytes(turn, fits) == 4096
        size = journal.message_bytes(turn, too_large)
        assert size == 4098
        with pytest.raises(MessageTooLarge, match=r"^the chat text is 4098 bytes as an event") as checked:
            journal.check_message(turn, too_large, "the chat text")
        assert (checked.value.size, checked.value.limit) == (4098, 4096)
        with pytest.raises(MessageTooLarge, match=r"^the user message is 4098 bytes .* limit of 4096 bytes"):
            await journal.append_message(turn, too_large)
        # nothing was stored, and the numbering goes on
        assert await journal.append_message(turn, fits) == 2
        appended = [e for e in await self.stored_events(journal) if isinstance(e, MessageAppended)]
        assert [e.content for e in appended] == [CONVERSATION[0], fits]
        assert await self.reopen(journal).load_history(session_id) == [CONVERSATION[0], fits]

    async def test_a_cut_tool_result_keeps_the_whole_size(self, journal: EventJournal) -> None:
        _, turn = await _session(journal)
        now = utcnow()
        record = ToolCallRecord(
            call_id="c1", name="read_file", result="ab", started_at=now, finished_at=now, result_bytes=300_000
        )
        assert journal.tool_call_bytes(turn, record) > len(b'"result":"ab"')
        await journal.record_tool_call(turn, record)
        [tool] = [e for e in await self.stored_events(journal) if isinstance(e, ToolCallRecorded)]
        assert (tool.result, tool.result_bytes) == ("ab", 300_000)


class TestMemoryJournal(JournalContract):
    @pytest.fixture
    def journal(self) -> EventJournal:
        return MemoryJournal()

    async def stored_events(self, journal: EventJournal) -> list[Event]:
        assert isinstance(journal, MemoryJournal)
        return list(journal.events)

    def reopen(self, journal: EventJournal) -> EventJournal:
        assert isinstance(journal, MemoryJournal)
        fresh = MemoryJournal()
        fresh.events = journal.events
        return fresh


class TestNatsJournal(JournalContract):
    @pytest.fixture
    async def journal(self, js: JetStreamContext) -> EventJournal:
        await ensure_streams(js)
        return NatsJournal(js)

    async def stored_events(self, journal: EventJournal) -> list[Event]:
        assert isinstance(journal, NatsJournal)
        return await journal.events()

    def reopen(self, journal: EventJournal) -> EventJournal:
        assert isinstance(journal, NatsJournal)
        return NatsJournal(journal.js)

    async def test_an_unreachable_server_is_a_journal_error_and_nothing_half_done(
        self, js: JetStreamContext, nats_server: NatsServer | ExternalServer
    ) -> None:
        await ensure_streams(js)
        impatient = NatsJournal(js, EventPublisher(js, "urn:test", ack_timeout_s=0.2, deadline_s=1), read_deadline_s=1)
        session_id, turn = await _session(impatient)
        nats_server.kill()
        with pytest.raises(JournalError, match="not acknowledged within 1s"):
            await impatient.append_message(turn, CONVERSATION[0])
        with pytest.raises(JournalError, match="could not read"):
            await impatient.load_history(session_id)
        nats_server.start()
        # The client may still deliver the unacknowledged publish once it reconnects: either way it is
        # stored at most once, and numbering goes on from what the stream holds.
        seq = await NatsJournal(js).append_message(turn, CONVERSATION[3])
        entries = await NatsJournal(js).load_entries(session_id)
        assert [e.message for e in entries] in ([CONVERSATION[3]], [CONVERSATION[0], CONVERSATION[3]])
        assert [e.seq for e in entries] == list(range(1, len(entries) + 1)) and seq == len(entries)
