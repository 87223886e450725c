"""Integration fuzz target: chat texts, tool outputs, tool arguments and answers with sizes around the
limit of one message, through a loop service on a real nats-server whose max_payload is 64 KiB.

Texts are drawn as a few characters repeated to a drawn size: ASCII, 2- to 4-byte UTF-8, characters
JSON writes as six bytes (control characters) or two (quotes, backslashes, line breaks). As the
writer target does, the examples are drawn first (200, or 10,000 under `COS_FUZZ_PROFILE=long`) and
then sent one after another to one service, checking that:

* the server never closes the loop's connection;
* every request is answered `completed`, `rejected` (its text cannot fit: nothing of its turn is
  published) or `failed` (the model's message cannot fit: its `turn_finished` is recorded), as the
  sizes say;
* a tool output is recorded whole when it fits, else cut with the marker and its whole size;
* every event the loop published (acknowledged by JetStream) is in the stream, once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import msgspec
import nats
import nats.errors
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from nats.aio.client import Client

from commonos.accounting.usage import TokenUsage
from commonos.loop.approvals import NatsApprover
from commonos.loop.locks import NatsSessionLocks
from commonos.loop.loop import Loop
from commonos.loop.nats_journal import NatsJournal
from commonos.loop.providers import ModelRequest, ModelResponse
from commonos.loop.service import LoopService
from commonos.loop.tools import MAX_RESULT_CHARS, ToolContext, ToolOutput, builtin_tools
from commonos.proto import events as ev
from commonos.proto.identity import TurnInfo
from commonos.proto.ids import new_id
from commonos.proto.messages import AssistantMessage, Message, ToolCall, ToolResultMessage, UserMessage
from commonos.proto.requests import ChatReply, ChatRequest, chat_subject
from commonos.proto.subjects import EVENTS_ALL
from commonos.runtime.embedded import NatsServer
from commonos.runtime.nats import ensure_streams
from commonos.runtime.publisher import Prepared
from tests.fuzz.conftest import PROFILE_ENV
from tests.loop.helpers import write_profile

pytestmark = pytest.mark.slow

LONG: Final = os.environ.get(PROFILE_ENV) == "long"
EXAMPLES: Final = 10_000 if LONG else 200
#: How far from the limit a drawn size may be, in bytes (the timestamps' digits make ±14 of difference).
NEAR: Final = 2048
SLACK: Final = 16

#: One character of each kind JSON and UTF-8 size differently.
UNITS: Final = ["a", " ", "é", "€", "\u2028", "😀", "\x00", "\x01", "\x1f", "\x7f", '"', "\\", "\n", "\t", "/"]


@dataclass(frozen=True)
class Recipe:
    """A few pieces of text, repeated in turn to a size in JSON bytes."""

    pieces: tuple[str, ...]
    json_bytes: int

    def build(self) -> str:
        pattern = "".join(self.pieces) or "a"
        unit = json_len(pattern)
        text = pattern * (self.json_bytes // max(unit, 1) + 1)
        lo, hi = 0, len(text)
        while lo < hi:  # the longest prefix within json_bytes
            mid = (lo + hi + 1) // 2
            if json_len(text[:mid]) <= self.json_bytes:
                lo = mid
            else:
                hi = mid - 1
        return text[:lo]


def json_len(text: str) -> int:
    return len(msgspec.json.encode(text)) - 2


@dataclass(frozen=True)
class Example:
    chat: Recipe
    #: None: the model answers at once; else it calls `emit`, which returns this.
    tool_output: Recipe | None
    #: Padding of the tool call's arguments (its assistant message and `tool_call_recorded` carry them).
    args_pad: Recipe
    answer: Recipe


def pieces() -> st.SearchStrategy[tuple[str, ...]]:
    piece = st.one_of(
        st.sampled_from(UNITS).flatmap(lambda u: st.integers(1, 40).map(lambda n: u * n)),
        st.text(min_size=1, max_size=12),
    )
    return st.lists(piece, min_size=1, max_size=4).map(tuple)


def recipes(sizes: st.SearchStrategy[int]) -> st.SearchStrategy[Recipe]:
    return st.builds(Recipe, pieces(), sizes.map(lambda n: max(n, 0)))


def examples(limit: int, overhead: int) -> st.SearchStrategy[Example]:
    """`overhead`: the bytes of a message's event besides its text."""
    room = limit - overhead
    near = st.integers(room - NEAR, room + NEAR)
    return st.builds(
        Example,
        chat=recipes(st.one_of(near, st.integers(0, 200))),
        tool_output=st.none()
        | recipes(st.one_of(st.integers(0, 3000), near, st.integers(room, 4 * limit), st.just(MAX_RESULT_CHARS))),
        args_pad=recipes(st.one_of(st.just(0), st.integers(0, room // 2), near)),
        answer=recipes(st.one_of(st.integers(0, 100), near)),
    )


def generate(limit: int, overhead: int, n: int) -> list[Example]:
    out: list[Example] = []

    @settings(
        max_examples=n,
        phases=[Phase.generate],
        deadline=None,
        derandomize=not LONG,
        suppress_health_check=list(HealthCheck),
    )
    @given(examples(limit, overhead))
    def collect(example: Example) -> None:
        out.append(example)

    collect()
    return out


@dataclass
class Plan:
    """What the model says and the tool returns in the turn being run."""

    output: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    answer: str = ""


class PlannedModel:
    name = "scripted"

    def __init__(self) -> None:
        self.plan = Plan()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        called = any(isinstance(m, ToolResultMessage) for m in request.messages)
        if self.plan.output is not None and not called:
            message = AssistantMessage(tool_calls=(ToolCall(id="c1", name="emit", args=self.plan.args),))
        else:
            message = AssistantMessage(text=self.plan.answer)
        return ModelResponse(message=message, usage=TokenUsage(input_tokens=1), provider="scripted", model="fuzz")

    async def close(self) -> None:
        return None


class Emit:
    name = "emit"
    description = "return the planned output"
    parameters: dict[str, Any] = {"type": "object"}  # noqa: RUF012
    risk = ev.Risk.LOW

    def __init__(self, model: PlannedModel) -> None:
        self.model = model

    async def run(self, ctx: ToolContext, args: Mapping[str, Any]) -> ToolOutput:
        return ToolOutput(self.model.plan.output or "")


class CountingJournal(NatsJournal):
    """Keeps the id of every event JetStream acknowledged."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.acked: list[uuid.UUID] = []

    async def _store(self, event: ev.Event, prepared: Prepared | None = None) -> None:
        await super()._store(event, prepared)
        self.acked.append(event.event_id)


@dataclass
class Rig:
    service: LoopService
    journal: CountingJournal
    model: PlannedModel
    loop_nc: Client
    client: Client
    closed: list[str]


@pytest.fixture
async def rig(small_nats_server: NatsServer, tmp_path: Path) -> AsyncIterator[Rig]:
    closed: list[str] = []
    model = PlannedModel()

    async def on_closed() -> None:
        closed.append(str(loop_nc.last_error))

    loop_nc = await nats.connect(small_nats_server.url, closed_cb=on_closed, max_reconnect_attempts=-1)
    client = await nats.connect(small_nats_server.url)
    js = loop_nc.jetstream()
    await ensure_streams(js)
    profile = write_profile(tmp_path / "profiles")
    profile = dataclasses.replace(profile, tools=("emit",))
    journal = CountingJournal(js)
    loop = Loop(
        journal,
        {profile.id: profile},
        {profile.id: model},
        locks=NatsSessionLocks(js),
        approver=NatsApprover(loop_nc),
        tools={**builtin_tools(), "emit": Emit(model)},
    )
    service = LoopService(loop_nc, loop, handle_signals=False, grace_s=0.1)
    await service.start()
    serving = asyncio.create_task(service.serve())
    try:
        yield Rig(service, journal, model, loop_nc, client, closed)
    finally:
        service.stop_event.set()
        await serving
        await service.shutdown()
        await client.close()
        await loop_nc.close()


@dataclass
class Sent:
    example: Example
    text: str
    plan: Plan
    reply: ChatReply


def expected_status(journal: NatsJournal, text: str, plan: Plan) -> set[str]:
    """What the sizes allow: one status, or two when a size is within SLACK of the limit."""
    limit = journal.message_limit
    turn = TurnInfo(profile_id="demo", session_id=new_id(), turn_id=new_id())

    def fate(message: Message, over: str, under: str) -> set[str]:
        size = journal.message_bytes(turn, message)
        return {over} if size > limit + SLACK else {under} if size <= limit - SLACK else {over, under}

    if "\x00" in text:  # refused before its size counts: PostgreSQL cannot store U+0000
        return {"rejected"}
    user = fate(UserMessage(text=text), "rejected", "taken")
    if "taken" not in user:
        return user
    # The model's messages, in order (a tool result is cut to fit, so it cannot fail the turn).
    steps: list[Message] = []
    if plan.output is not None:
        steps.append(AssistantMessage(tool_calls=(ToolCall(id="c1", name="emit", args=plan.args),)))
    steps.append(AssistantMessage(text=plan.answer))
    outcomes = {"completed"}
    for message in steps:
        if "completed" in outcomes:
            outcomes = (outcomes - {"completed"}) | fate(message, "failed", "completed")
    return (user - {"taken"}) | outcomes


async def test_sizes_around_the_limit_never_close_the_connection_nor_lose_an_event(
    rig: Rig, fuzz_report: Callable[[str], None]
) -> None:
    journal = rig.journal
    limit = journal.message_limit
    probe = TurnInfo(profile_id="demo", session_id=new_id(), turn_id=new_id())
    overhead = journal.message_bytes(probe, UserMessage(text=""))
    cases = generate(limit, overhead, EXAMPLES)
    sent: list[Sent] = []
    unsendable = 0
    started = time.monotonic()
    for example in cases:
        text = example.chat.build()
        plan = Plan(
            output=example.tool_output.build() if example.tool_output is not None else None,
            args={"pad": example.args_pad.build()},
            answer=example.answer.build(),
        )
        rig.model.plan = plan
        data = msgspec.json.encode(ChatRequest(text=text))
        if len(data) > rig.client.max_payload:
            # The request itself cannot be sent: nats-py refuses it (no headers, so its check is exact).
            with pytest.raises(nats.errors.MaxPayloadError):
                await rig.client.request(chat_subject("demo"), data, timeout=30)
            unsendable += 1
            continue
        msg = await rig.client.request(chat_subject("demo"), data, timeout=30)
        reply = msgspec.json.decode(msg.data, type=ChatReply)
        assert not rig.closed and rig.loop_nc.is_connected, f"the server closed the loop's connection: {rig.closed}"
        assert rig.client.is_connected
        allowed = expected_status(journal, text, plan)
        assert reply.status in allowed, (reply.status, reply.error, allowed)
        if reply.status == "rejected":
            assert reply.error is not None and "\n" not in reply.error
            assert f"limit of {limit} bytes" in reply.error or reply.error.startswith("the chat text contains U+0000")
            assert reply.session_id is None
        elif reply.status == "failed":
            assert reply.error is not None and reply.error.startswith("the assistant message is ")
        else:
            assert reply.text == plan.answer
        sent.append(Sent(example, text, plan, reply))
    took = time.monotonic() - started

    events = await NatsJournal(rig.client.jetstream()).events([EVENTS_ALL])
    ids = [e.event_id for e in events]
    assert len(set(ids)) == len(ids), "an event is in the stream twice"
    assert set(journal.acked) == set(ids), "an acknowledged event is not in the stream (or one was never acked)"
    check_sessions(sent, events, journal)
    statuses = Counter(s.reply.status for s in sent)
    cut = sum(1 for e in events if isinstance(e, ev.ToolCallRecorded) and e.result_bytes is not None)
    fuzz_report(
        f"{len(cases)} requests at max_payload {rig.loop_nc.max_payload} (limit {limit}) in {took:.1f}s: "
        f"{dict(statuses)}, {unsendable} too large to send, {cut} tool results cut, {len(events)} events stored"
    )


def check_sessions(sent: list[Sent], events: list[ev.Event], journal: NatsJournal) -> None:
    by_session: dict[uuid.UUID, list[ev.Event]] = defaultdict(list)
    for e in events:
        if not isinstance(e, ev.ProfileUpserted):
            by_session[e.session_id].append(e)
    answered = [s for s in sent if s.reply.status != "rejected"]
    assert len(by_session) == len(answered), "a rejected request left a session behind"
    limit = journal.message_limit
    for s in answered:
        assert s.reply.session_id is not None
        session = by_session[s.reply.session_id]
        [finished] = [e for e in session if isinstance(e, ev.TurnFinished)]
        assert finished.status.value == s.reply.status and finished.error == s.reply.error
        appended = [e for e in session if isinstance(e, ev.MessageAppended)]
        assert [e.seq for e in appended] == list(range(1, len(appended) + 1))
        assert appended[0].content == UserMessage(text=s.text)
        assert all(journal._event_bytes(e) <= limit for e in appended)
        calls = [e for e in session if isinstance(e, ev.ToolCallRecorded)]
        if s.plan.output is None or not calls:
            continue
        [call] = calls
        output = s.plan.output
        [result] = [e.content for e in appended if isinstance(e.content, ToolResultMessage)]
        assert result.content == call.result, "the model saw other than what was recorded"
        if call.result_bytes is None:
            assert call.result == output
        else:
            assert call.result_bytes == len(output.encode())
            assert call.result is not None
            shown, marker = call.result.rsplit("\n", 1)
            assert output.startswith(shown) and len(shown) <= MAX_RESULT_CHARS
            assert marker == f"[truncated: showing {len(shown.encode())} of {call.result_bytes} bytes]"
