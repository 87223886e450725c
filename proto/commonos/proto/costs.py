"""Priced calls: what billing publishes on `cos.costs.<profile_id>.priced` (stream `COS_COSTS`).

For every model call billing prices, and again for every reprice that changes a call's price, one
`model_call_priced` event: the call's identity, its price at that revision, and `cost_delta_usd`, what the
revision changes the call's cost by. Summing `cost_delta_usd` over the events (each `event_id` once) gives
what `cos report cost` gives, in total and by tag, in any order of arrival.

The envelope is an event's (CloudEvents headers, `ce-id` = `Nats-Msg-Id` = the body's `event_id`, `ce-time` =
`occurred_at`, `ce-subject` the call's id, a JSON Schema named by `ce-dataschema`). `event_id` is derived from
the call and the revision (:func:`priced_event_id`), so a republish (billing's relay after a crash, a replay)
carries the same id: JetStream drops it within the stream's duplicate window and a subscriber that keeps the
ids it has counted drops it after. The same evolution rules as events apply.
"""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Annotated, Final, Literal

import msgspec

from commonos.proto.errors import DataError
from commonos.proto.events import AwareDatetime, Name, ProfileId, Tag

#: The namespace of priced-call event ids (uuid5 of the call's id and the revision).
PRICED_NAMESPACE: Final = uuid.UUID("3f0c2a8e-6d0b-5c1e-9a57-2b7f6f1f4c21")

#: How billing arrived at a cost (`model_calls.cost_status`).
CostStatusName = Literal["priced", "override", "reported", "unpriced", "estimated"]


class ModelCallPriced(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="model_call_priced"):
    """A model call's price at one revision: revision 0 when billing first priced it, then one per reprice
    (`cos billing reprice`) that changed its cost, cost status or price source.

    Amounts are exact decimal strings in `currency`. `cost_usd` is null only when `cost_status` is `unpriced`
    (no price is known); such a call adds 0 to the sums.
    """

    #: uuid5(`PRICED_NAMESPACE`, "<call_id>:<revision>"), also `ce-id` and `Nats-Msg-Id`.
    event_id: uuid.UUID
    #: When billing priced the call at this revision (the transaction that stored the price).
    occurred_at: AwareDatetime
    #: The model call: its `model_call_completed` event's id, `model_calls.event_id`.
    call_id: uuid.UUID
    #: 0 for billing's own pricing; a reprice's revision is the id of its run in `billing_reprices`, so
    #: revisions of one call grow with time but are not consecutive.
    revision: Annotated[int, msgspec.Meta(ge=0)]
    profile_id: ProfileId
    session_id: uuid.UUID
    turn_id: uuid.UUID | None
    provider: Name
    model: Name
    #: The call's tags (each once), as `model_calls.tags`: what `cos report cost --by tag` groups by.
    tags: tuple[Tag, ...]
    #: When the call happened (`model_calls.created_at`): the day and budget period it counts in.
    called_at: AwareDatetime
    currency: Literal["USD"] = "USD"
    #: The call's cost at this revision (`model_calls.cost_usd`).
    cost_usd: Decimal | None
    #: Its cost at the revision before (null at revision 0, or when it was unpriced).
    previous_cost_usd: Decimal | None
    #: `cost_usd` - `previous_cost_usd`, a missing cost counted as 0: add it to a running total.
    cost_delta_usd: Decimal
    cost_status: CostStatusName
    #: Where the price came from (`genai-prices`, a price file's name, `vendor`, ...), as `model_calls.price_source`.
    price_source: str | None
    #: The version of the prices used (`model_calls.price_version`).
    price_version: str | None


#: Every type published on `COS_COSTS`; a new one joins this tuple (and gets its own tag).
COST_TYPES: Final = (ModelCallPriced,)

_decoder: Final = msgspec.json.Decoder(ModelCallPriced)
_encoder: Final = msgspec.json.Encoder(decimal_format="string")


class CostDecodeError(DataError):
    """A payload that is not a valid priced-call event; the message says why."""


def priced_event_id(call_id: uuid.UUID, revision: int) -> uuid.UUID:
    """The id of the priced-call event of `call_id` at `revision`: the same on every republish."""
    return uuid.uuid5(PRICED_NAMESPACE, f"{call_id}:{revision}")


def cost_delta(cost: Decimal | None, previous: Decimal | None) -> Decimal:
    """What a revision adds to a sum of costs: a missing cost counts as 0."""
    return (cost if cost is not None else Decimal(0)) - (previous if previous is not None else Decimal(0))


def encode_priced(event: ModelCallPriced) -> bytes:
    return _encoder.encode(event)


def decode_priced(payload: bytes | memoryview) -> ModelCallPriced:
    try:
        return _decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise CostDecodeError(str(exc)) from exc
    except RecursionError:
        raise CostDecodeError("JSON nested too deeply") from None
