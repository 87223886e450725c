"""A turn's reply as the model produces it: deltas on core NATS, never stored.

The loop publishes each piece of a model's answer, while the model call streams, on
`cos.deltas.<profile>.<session>` (core NATS: no stream captures `cos.deltas.>`, so a delta nobody
listens to is gone). They are for showing a reply live (the console's chat); what was said is the
stored events (`message_appended`, `model_call_completed`, ...), which stay as they are.

One message is one JSON `Delta`:

* `seq` counts the turn's deltas from 0, across all of its model calls: a subscriber that sees a gap
  knows it missed one (core NATS delivers in order but drops nothing it is not sent, and a slow
  subscriber may be cut off), and waits for the stored message instead.
* `kind` `text`: `text` is the next piece of the assistant's text; the pieces of one model call
  concatenated are the text of the `message_appended` that follows.
* `kind` `tool_call`: the model starts a tool call; `text` is the tool's name (its arguments and
  result are in the stored `tool_call_*` events).
* `kind` `done`: the model call ended; `text` is its stop reason (`end_turn`, `tool_use`, `stop`,
  `tool_calls`, ..., empty when the vendor gave none), or `error` when the call failed. A turn with
  tool calls has one `done` per model call; the turn's end is its stored `turn_finished`.
"""

from __future__ import annotations

import uuid
from enum import StrEnum
from typing import Final

import msgspec

from commonos.proto.tags import check_profile_id

DELTAS_PREFIX: Final = "cos.deltas"
#: Every delta of every profile (an operator's subscription; the console subscribes per profile or session).
DELTAS_ALL: Final = "cos.deltas.>"


class DeltaKind(StrEnum):
    TEXT = "text"
    TOOL_CALL = "tool_call"
    DONE = "done"


class Delta(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=False):
    """One piece of a turn's reply (unknown fields are ignored, so the message may grow)."""

    session_id: uuid.UUID
    turn_id: uuid.UUID
    seq: int
    kind: DeltaKind
    text: str = ""


def deltas_subject(profile_id: str, session_id: uuid.UUID | str = "*") -> str:
    """`cos.deltas.<profile>.<session>`: one session's deltas, or (the default) every session's of the profile."""
    return f"{DELTAS_PREFIX}.{check_profile_id(profile_id)}.{session_id}"


_ENCODER: Final = msgspec.json.Encoder()
_DECODER: Final = msgspec.json.Decoder(Delta)


def encode_delta(delta: Delta) -> bytes:
    return _ENCODER.encode(delta)


def decode_delta(data: bytes) -> Delta:
    """The `Delta` of a message; `msgspec.DecodeError` (a `ValueError`) for one that is not."""
    return _DECODER.decode(data)
