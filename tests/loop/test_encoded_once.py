"""A message the loop appends is encoded once: sized and published from the same bytes.

The journal must size a `message_appended` before publishing it (a message over the limit is refused with the
reason, never sent); it publishes the body and headers it sized, not a second encoding of the event.
"""

from __future__ import annotations

from typing import Any

import msgspec
from nats.js import JetStreamContext

from commonos.loop.nats_journal import NatsJournal
from commonos.proto import events as ev
from commonos.proto.identity import NewSession, TurnInfo
from commonos.proto.ids import new_id
from commonos.proto.messages import UserMessage
from commonos.proto.subjects import event_subject
from commonos.runtime.nats import ensure_streams


async def test_an_appended_message_is_encoded_once_and_stored_as_sized(js: JetStreamContext, monkeypatch: Any) -> None:
    await ensure_streams(js)
    journal = NatsJournal(js)
    session_id = await journal.create_session(NewSession(profile_id="acme", source="cli"))
    turn = TurnInfo(profile_id="acme", session_id=session_id, turn_id=new_id())
    await journal.start_turn(turn)

    encoded: list[str] = []
    real = ev.encode_event

    def counting(event: ev.EventBase) -> bytes:
        encoded.append(ev.event_type(event))
        return real(event)

    monkeypatch.setattr("commonos.runtime.publisher.encode_event", counting)
    seq = await journal.append_message(turn, UserMessage(text="hello " * 100))

    assert encoded == ["message_appended"], encoded
    stored = await js.get_last_msg("COS_EVENTS", event_subject("acme", session_id, "message_appended"))
    assert stored.data is not None
    event = ev.decode_event(stored.data)
    assert isinstance(event, ev.MessageAppended) and event.seq == seq
    assert msgspec.json.decode(stored.data)["content"]["text"] == "hello " * 100
