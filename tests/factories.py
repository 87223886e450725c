"""Realistic event sequences for tests and benchmarks (pure: builds events, publishes nothing)."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from commonos.proto import events as ev
from commonos.proto.ids import new_id
from commonos.proto.messages import AssistantMessage, ToolCall, ToolResultMessage, UserMessage

WORDS = [
    "umbrella",
    "rain",
    "forecast",
    "deploy",
    "invoice",
    "client",
    "budget",
    "report",
    "search",
    "index",
    "table",
    "message",
    "charleston",
    "weather",
    "meeting",
    "notes",
    "project",
    "site",
    "backup",
    "database",
    "latency",
    "tokens",
]


@dataclass
class Clock:
    now: datetime = field(default_factory=lambda: datetime(2026, 11, 1, 9, 0, tzinfo=UTC))

    def tick(self, ms: int = 10) -> datetime:
        self.now += timedelta(milliseconds=ms)
        return self.now


@dataclass
class SessionBuilder:
    """Builds one session's events in order, keeping seq gap-free."""

    profile_id: str
    clock: Clock
    tags: tuple[str, ...] = ()
    session_id: uuid.UUID = field(default_factory=new_id)
    seq: int = 0
    events: list[ev.Event] = field(default_factory=list)

    def create(
        self, source: str = "cli", title: str | None = None, parent_session_id: uuid.UUID | None = None
    ) -> SessionBuilder:
        self.events.append(
            ev.SessionCreated(
                profile_id=self.profile_id,
                session_id=self.session_id,
                source=source,
                title=title,
                tags=self.tags,
                parent_session_id=parent_session_id,
                occurred_at=self.clock.tick(),
            )
        )
        return self

    def start_turn(
        self,
        parent_turn_id: uuid.UUID | None = None,
        depth: int = 0,
        snapshot: dict[str, object] | None = None,
    ) -> uuid.UUID:
        turn_id = new_id()
        self.events.append(
            ev.TurnStarted(
                profile_id=self.profile_id,
                session_id=self.session_id,
                turn_id=turn_id,
                parent_turn_id=parent_turn_id,
                depth=depth,
                tags=self.tags,
                context_snapshot=snapshot,
                occurred_at=self.clock.tick(),
            )
        )
        return turn_id

    def message(self, turn_id: uuid.UUID, content: UserMessage | AssistantMessage | ToolResultMessage) -> uuid.UUID:
        self.seq += 1
        e = ev.MessageAppended(
            profile_id=self.profile_id,
            session_id=self.session_id,
            turn_id=turn_id,
            seq=self.seq,
            content=content,
            occurred_at=self.clock.tick(),
        )
        self.events.append(e)
        return e.message_id

    def tool_call(
        self,
        turn_id: uuid.UUID,
        call_id: str,
        name: str,
        args: dict[str, object],
        result: str,
        risk: ev.Risk = ev.Risk.LOW,
        approval: ev.ApprovalStatus | None = None,
        is_error: bool = False,
    ) -> uuid.UUID:
        tool_call_id = new_id()
        started = self.clock.tick()
        if approval is not None:
            self.events.append(
                ev.ApprovalDecided(
                    profile_id=self.profile_id,
                    session_id=self.session_id,
                    turn_id=turn_id,
                    tool_call_id=tool_call_id,
                    call_id=call_id,
                    status=approval,
                    decided_at=self.clock.tick(),
                    decided_by="cli:tester",
                    occurred_at=self.clock.now,
                )
            )
        self.events.append(
            ev.ToolCallRecorded(
                profile_id=self.profile_id,
                session_id=self.session_id,
                turn_id=turn_id,
                tool_call_id=tool_call_id,
                call_id=call_id,
                name=name,
                args=args,
                result=result,
                is_error=is_error,
                risk=risk,
                started_at=started,
                finished_at=self.clock.tick(),
                approval=approval,
                occurred_at=self.clock.now,
            )
        )
        return tool_call_id

    def model_call(
        self,
        turn_id: uuid.UUID,
        model: str = "claude-sonnet-4-5",
        provider: str = "anthropic",
        input_tokens: int = 1000,
        output_tokens: int = 200,
    ) -> None:
        self.events.append(
            ev.ModelCallCompleted(
                profile_id=self.profile_id,
                session_id=self.session_id,
                turn_id=turn_id,
                provider=provider,
                model=model,
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                tags=self.tags,
                latency_s=0.5,
                occurred_at=self.clock.tick(),
            )
        )

    def finish(
        self, turn_id: uuid.UUID, status: ev.TurnStatus = ev.TurnStatus.COMPLETED, error: str | None = None
    ) -> None:
        self.events.append(
            ev.TurnFinished(
                profile_id=self.profile_id,
                session_id=self.session_id,
                turn_id=turn_id,
                status=status,
                error=error,
                occurred_at=self.clock.tick(),
            )
        )

    def deactivate(self, *message_ids: uuid.UUID) -> None:
        self.events.append(
            ev.MessageDeactivated(
                profile_id=self.profile_id,
                session_id=self.session_id,
                message_ids=message_ids,
                occurred_at=self.clock.tick(),
            )
        )


def sentence(rng: random.Random, words: int = 12) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def conversation(
    rng: random.Random,
    clock: Clock,
    profile_id: str = "default",
    tags: tuple[str, ...] = ("client:acme",),
    turns: int = 3,
) -> list[ev.Event]:
    """One session: per turn a user message, a model call, a tool call and its result, an answer."""
    s = SessionBuilder(profile_id, clock, tags).create()
    for n in range(turns):
        turn = s.start_turn(snapshot={"system_prompt": "Be brief.", "memory": []} if n == 0 else None)
        s.message(turn, UserMessage(text=sentence(rng, rng.randint(4, 30))))
        s.model_call(turn, input_tokens=rng.randint(100, 5000), output_tokens=rng.randint(10, 800))
        call_id = f"c{n}"
        s.message(
            turn,
            AssistantMessage(tool_calls=(ToolCall(id=call_id, name="read_file", args={"path": f"/tmp/{n}.txt"}),)),
        )
        long = rng.random() < 0.05
        result = sentence(rng, 400 if long else 20)
        s.tool_call(turn, call_id, "read_file", {"path": f"/tmp/{n}.txt"}, result)
        s.message(turn, ToolResultMessage(call_id=call_id, content=result))
        s.model_call(turn, input_tokens=rng.randint(100, 5000), output_tokens=rng.randint(10, 800))
        s.message(turn, AssistantMessage(text=sentence(rng, rng.randint(5, 60))))
        s.finish(turn)
    return s.events


def event_stream(total: int, seed: int = 7, sessions_in_flight: int = 20) -> Iterator[ev.Event]:
    """About `total` events from interleaved conversations (events of one session stay in order)."""
    rng = random.Random(seed)
    clock = Clock()
    produced = 0
    active: list[list[ev.Event]] = []
    while produced < total:
        while len(active) < sessions_in_flight:
            active.append(
                list(
                    reversed(
                        conversation(
                            rng,
                            clock,
                            profile_id=rng.choice(["default", "ops"]),
                            tags=(f"client:{rng.choice(['acme', 'globex'])}",),
                            turns=rng.randint(1, 4),
                        )
                    )
                )
            )
        i = rng.randrange(len(active))
        yield active[i].pop()
        produced += 1
        if not active[i]:
            active.pop(i)
    for remaining in active:  # finish open sessions so every turn ends
        while remaining:
            yield remaining.pop()
