"""deploy/nats/auth.conf on a real nats-server: the loop publishes a turn's reply deltas (`cos.deltas.>`, core
NATS), the console reads them, and no other service may publish them."""

from __future__ import annotations

import asyncio
import uuid

from nats.aio.msg import Msg

from commonos.loop.deltas import DeltaPublisher
from commonos.loop.providers import ModelDelta
from commonos.proto.deltas import DELTAS_ALL, DeltaKind, decode_delta, deltas_subject
from commonos.proto.identity import TurnInfo
from tests.deploy.conftest import SecuredNats


async def test_the_loop_publishes_deltas_the_console_reads_them(secured_nats: SecuredNats) -> None:
    watcher = await secured_nats.connect("console")
    got: asyncio.Queue[Msg] = asyncio.Queue()

    async def on_msg(msg: Msg) -> None:
        await got.put(msg)

    await watcher.subscribe(DELTAS_ALL, cb=on_msg)
    await watcher.flush()
    loop = await secured_nats.connect("loop")
    turn = TurnInfo(profile_id="assistant", session_id=uuid.uuid4(), turn_id=uuid.uuid4())
    sink = DeltaPublisher(loop).for_turn(turn)
    await sink(ModelDelta(DeltaKind.TEXT, "Hello"))
    await loop.flush()
    msg = await asyncio.wait_for(got.get(), 5)
    assert msg.subject == deltas_subject("assistant", turn.session_id)
    assert (decode_delta(msg.data).text, secured_nats.violations("loop")) == ("Hello", [])
    assert secured_nats.violations("console") == []
    for user in ("journal-writer", "billing", "otlp-gateway", "subscriber", "console"):
        other = await secured_nats.connect(user)
        await other.publish(deltas_subject("assistant", turn.session_id), b"{}")
        await other.flush()
        await secured_nats.refused(user, "cos.deltas.assistant")
    assert got.empty()
