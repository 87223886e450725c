"""A turn's reply as the model produces it, on core NATS (`cos.deltas.<profile>.<session>`, never stored).

The contract is `commonos.proto.deltas`. The loop hands a turn's `TurnDeltas` to each of its model calls
(`commonos.loop.providers.base.complete_with_deltas`); it numbers the deltas and publishes each at once.
A delta that cannot be published is dropped (logged): the stored events are the record of the turn, and
a listener that sees a gap in `seq` waits for them.
"""

from __future__ import annotations

import logging
from typing import Final

import nats.errors
from nats.aio.client import Client

from commonos.loop.providers.base import ModelDelta
from commonos.proto.deltas import Delta, DeltaKind, deltas_subject, encode_delta
from commonos.proto.identity import TurnInfo

log = logging.getLogger(__name__)

#: A longer text delta (a provider that does not stream gives its whole text at once) goes out in pieces of
#: this many characters, well under any server's max_payload.
MAX_DELTA_CHARS: Final = 8192


class TurnDeltas:
    """The deltas of one turn: numbered from 0 across its model calls, published on its session's subject."""

    def __init__(self, nc: Client, turn: TurnInfo) -> None:
        self.nc = nc
        self.turn = turn
        self.subject = deltas_subject(turn.profile_id, turn.session_id)
        self.seq = 0

    async def __call__(self, delta: ModelDelta) -> None:
        text = delta.text
        if delta.kind is DeltaKind.TEXT and len(text) > MAX_DELTA_CHARS:
            for start in range(0, len(text), MAX_DELTA_CHARS):
                await self._publish(delta.kind, text[start : start + MAX_DELTA_CHARS])
        else:
            await self._publish(delta.kind, text)

    async def _publish(self, kind: DeltaKind, text: str) -> None:
        message = Delta(session_id=self.turn.session_id, turn_id=self.turn.turn_id, seq=self.seq, kind=kind, text=text)
        self.seq += 1
        try:
            await self.nc.publish(self.subject, encode_delta(message))
        except nats.errors.Error as exc:
            log.debug("delta %d of turn %s not published: %s", message.seq, self.turn.turn_id, exc)


class DeltaPublisher:
    """Gives each turn its `TurnDeltas` on one NATS connection (the loop user may publish `cos.deltas.>`)."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc

    def for_turn(self, turn: TurnInfo) -> TurnDeltas:
        return TurnDeltas(self.nc, turn)
