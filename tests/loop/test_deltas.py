"""A turn's reply streamed on core NATS (`cos.deltas.<profile>.<session>`) while the model produces it, from an SDK
provider talking to the fake model server; the stored events stay as they are and no delta is stored."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from clients.fakemodel import FakeModel, Script, Step
from commonos.loop.approvals import FixedApprover
from commonos.loop.deltas import MAX_DELTA_CHARS, DeltaPublisher, TurnDeltas
from commonos.loop.locks import NatsSessionLocks
from commonos.loop.loop import Loop, TurnRequest
from commonos.loop.nats_journal import NatsJournal
from commonos.loop.providers import AnthropicProvider, ModelDelta, OpenAIProvider
from commonos.proto.deltas import DELTAS_ALL, Delta, DeltaKind, decode_delta, deltas_subject
from commonos.proto.events import MessageAppended, ModelCallCompleted, TurnStatus
from commonos.proto.identity import TurnInfo
from commonos.proto.messages import AssistantMessage
from commonos.proto.subjects import EVENTS_ALL
from commonos.runtime.nats import alerts_stream_config, ensure_stream
from tests.loop.helpers import of_type, write_profile

ANSWER = "Rain is likely in the afternoon, so take the umbrella and the blue coat."


@pytest.fixture
async def fake() -> AsyncIterator[FakeModel]:
    server = FakeModel()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


class Listener:
    """A subscriber on a deltas subject, as the console is: what it receives, in order."""

    def __init__(self) -> None:
        self.got: list[tuple[str, Delta]] = []
        self._arrived = asyncio.Event()

    async def on_msg(self, msg: Msg) -> None:
        self.got.append((msg.subject, decode_delta(msg.data)))
        self._arrived.set()

    def deltas(self) -> list[Delta]:
        return [d for _, d in self.got]

    async def until(self, condition: Callable[[list[Delta]], bool], timeout_s: float = 5.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not condition(self.deltas()):
                self._arrived.clear()
                await self._arrived.wait()


async def listen(nc: Client, subject: str) -> Listener:
    listener = Listener()
    await nc.subscribe(subject, cb=listener.on_msg)
    await nc.flush()
    return listener


async def stored_count(js: JetStreamContext) -> dict[str, int]:
    return {info.config.name or "": info.state.messages for info in await js.streams_info()}


@pytest.mark.parametrize("vendor", ["anthropic", "openai"])
async def test_a_turn_streams_its_reply_on_core_nats_and_stores_no_delta(
    vendor: str, fake: FakeModel, nc: Client, streams: JetStreamContext, tmp_path: Path
) -> None:
    fake.use(
        Script(
            "loop",
            "deltas",
            3,
            [Step([("text", "Let me check."), ("tool", "list_dir", {"path": "."})]), Step([("text", ANSWER)])],
        )
    )
    profile = write_profile(tmp_path, config=f'provider = "{vendor}"\nmodel = "m-1"\ntools = ["list_dir"]\n')
    provider: AnthropicProvider | OpenAIProvider = (
        AnthropicProvider(api_key="k", base_url=f"http://127.0.0.1:{fake.port}")
        if vendor == "anthropic"
        else OpenAIProvider(api_key="k", base_url=f"http://127.0.0.1:{fake.port}/v1")
    )
    js = nc.jetstream()
    await ensure_stream(js, alerts_stream_config())  # every stream of CommonOS, to see that none takes a delta
    loop = Loop(
        NatsJournal(js),
        {profile.id: profile},
        {profile.id: provider},
        locks=NatsSessionLocks(js),
        approver=FixedApprover(None),
        deltas=DeltaPublisher(nc).for_turn,
    )
    everything = await listen(nc, DELTAS_ALL)
    try:
        result = await loop.run_turn(TurnRequest(profile_id=profile.id, text="Do I need an umbrella?"))
    finally:
        await provider.close()
    assert (result.status, result.text) == (TurnStatus.COMPLETED, ANSWER)
    await everything.until(lambda got: sum(d.kind is DeltaKind.DONE for d in got) == 2)
    await nc.flush()
    # one session's subject, numbered 0..n-1 in the order sent, all of the turn
    assert {s for s, _ in everything.got} == {deltas_subject(profile.id, result.session_id)}
    deltas = everything.deltas()
    assert [d.seq for d in deltas] == list(range(len(deltas)))
    assert {(d.session_id, d.turn_id) for d in deltas} == {(result.session_id, result.turn_id)}
    # model call 1: text, the tool call, done; model call 2: text, done
    first_done = next(i for i, d in enumerate(deltas) if d.kind is DeltaKind.DONE)
    first, second = deltas[: first_done + 1], deltas[first_done + 1 :]
    assert [d.kind for d in first][-2:] == [DeltaKind.TOOL_CALL, DeltaKind.DONE] and first[-2].text == "list_dir"
    assert [d.kind for d in second][-1] is DeltaKind.DONE and len(second) > 2
    assert {d.kind for d in first[:-2]} == {d.kind for d in second[:-1]} == {DeltaKind.TEXT}
    # the text deltas of each model call make the stored assistant message
    events = await NatsJournal(js).events([EVENTS_ALL])
    stored = [m.content.text for m in of_type(events, MessageAppended) if isinstance(m.content, AssistantMessage)]
    assert stored == ["Let me check.", ANSWER]
    assert "".join(d.text for d in first[:-2]) == "Let me check." and "".join(d.text for d in second[:-1]) == ANSWER
    assert [d.text for d in (first[-1], second[-1])] == [c.stop_reason for c in of_type(events, ModelCallCompleted)]
    # nothing of it stored: no stream takes the subject, and the streams hold the events alone
    with pytest.raises(nats.js.errors.NotFoundError):
        await js.find_stream_name_by_subject(deltas_subject(profile.id, result.session_id))
    counts = await stored_count(js)
    assert counts.pop("COS_EVENTS") == len(events)
    assert {name: n for name, n in counts.items() if not name.startswith("KV_")} == {"COS_DLQ": 0, "COS_ALERTS": 0}


async def test_a_session_subscriber_gets_its_session_only_and_long_texts_in_pieces(nc: Client) -> None:
    turns = [TurnInfo(profile_id="assistant", session_id=uuid.uuid4(), turn_id=uuid.uuid4()) for _ in range(2)]
    mine = await listen(nc, deltas_subject("assistant", turns[0].session_id))
    profile_wide = await listen(nc, deltas_subject("assistant"))
    publisher = DeltaPublisher(nc)
    sinks: list[TurnDeltas] = [publisher.for_turn(t) for t in turns]
    long_text = "x" * (MAX_DELTA_CHARS * 2 + 5)
    await sinks[0](ModelDelta(DeltaKind.TEXT, long_text))
    await sinks[1](ModelDelta(DeltaKind.TEXT, "other session"))
    await sinks[0](ModelDelta(DeltaKind.DONE, "end_turn"))
    await nc.flush()
    await mine.until(lambda got: len(got) == 4)
    await profile_wide.until(lambda got: len(got) == 5)
    assert [d.seq for d in mine.deltas()] == [0, 1, 2, 3]
    assert "".join(d.text for d in mine.deltas()[:3]) == long_text
    assert mine.deltas()[-1] == Delta(
        session_id=turns[0].session_id, turn_id=turns[0].turn_id, seq=3, kind=DeltaKind.DONE, text="end_turn"
    )
    assert {d.session_id for d in profile_wide.deltas()} == {t.session_id for t in turns}


async def test_a_delta_that_cannot_be_sent_does_not_fail_the_turn(nc: Client) -> None:
    turn = TurnInfo(profile_id="assistant", session_id=uuid.uuid4(), turn_id=uuid.uuid4())
    sink = DeltaPublisher(nc).for_turn(turn)
    await nc.close()
    await sink(ModelDelta(DeltaKind.TEXT, "lost"))  # the connection is closed: dropped, no error
    assert sink.seq == 1
