"""Alerts: what billing publishes on `cos.alerts.<kind>` (stream `COS_ALERTS`), one Struct per type.

An alert has the envelope of an event (CloudEvents headers, `ce-id` = `Nats-Msg-Id` = the body's `event_id`,
`ce-time` = `occurred_at`, a JSON Schema named by `ce-dataschema`) but belongs to no profile or session:
its `ce-subject` is what it is about (for a budget alert, the budget's name). The same evolution rules as
events apply (a new field gets a default; a breaking change is a new tag).
"""

from __future__ import annotations

import uuid
from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Final

import msgspec

from commonos.proto.errors import DataError
from commonos.proto.events import AwareDatetime, Tag

#: Alerts published before they carried `event_id` decode with this placeholder, replaced by their `alert_id`.
_NO_EVENT_ID: Final = uuid.UUID(int=0)


class Period(StrEnum):
    """A budget's period: a calendar day or month in UTC."""

    DAY = "day"
    MONTH = "month"


class BudgetExceeded(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="budget_exceeded"):
    """A budget's spend reached its limit in a period: one alert per budget and period.

    `event_id` (= `ce-id` = `Nats-Msg-Id`) is derived from the budget's name, its period and the period's
    start, so a republish is dropped by JetStream; `alert_id` is the same id, under the name the first alerts
    used. Amounts are exact decimal strings.
    """

    #: Absent from alerts published before it was added: decoding takes `alert_id`.
    event_id: uuid.UUID = _NO_EVENT_ID
    #: When the crossing was found.
    occurred_at: AwareDatetime
    #: The same as `event_id`.
    alert_id: uuid.UUID
    #: The budget's name in the billing configuration (also `ce-subject`).
    budget: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
    #: The tag the budget counts the spend of.
    tag: Tag
    period: Period
    #: The period, `[period_start, period_end)`.
    period_start: AwareDatetime
    period_end: AwareDatetime
    limit_usd: Decimal
    #: The period's spend when the crossing was found (>= `limit_usd`).
    spent_usd: Decimal
    #: The model call (its `event_id`) that took the spend to the limit, when billing saw it happen.
    crossed_by_event_id: uuid.UUID | None

    def __post_init__(self) -> None:
        if self.event_id == _NO_EVENT_ID:
            msgspec.structs.force_setattr(self, "event_id", self.alert_id)
        elif self.event_id != self.alert_id:
            raise ValueError("event_id and alert_id must be the same id")


class BudgetWarning(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="budget_warning"):
    """A budget's spend reached one of its warning thresholds (`warn_at`, a percent of the limit below 100) in a
    period: one alert per budget, period and percent, published before the limit's `budget_exceeded`.

    `event_id` (= `ce-id` = `Nats-Msg-Id`) is derived from the budget's name, its period, the period's start
    and the percent, so a republish is dropped by JetStream. Amounts are exact decimal strings.
    """

    event_id: uuid.UUID
    #: When the crossing was found.
    occurred_at: AwareDatetime
    #: The budget's name in the billing configuration (also `ce-subject`).
    budget: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
    #: The tag the budget counts the spend of.
    tag: Tag
    period: Period
    #: The period, `[period_start, period_end)`.
    period_start: AwareDatetime
    period_end: AwareDatetime
    limit_usd: Decimal
    #: The threshold reached, a whole percent of `limit_usd` (1..99).
    percent: Annotated[int, msgspec.Meta(ge=1, le=99)]
    #: The period's spend when the crossing was found (>= `percent` % of `limit_usd`; may be past the limit
    #: when one batch crossed several thresholds).
    spent_usd: Decimal
    #: When the spend reaches `limit_usd` at the period's rate so far (`spent_usd` over the time from
    #: `period_start` to `occurred_at`); null when that rate is 0 or the limit is already reached. It may fall
    #: after `period_end` (the limit is then not expected to be reached in this period) and is kept as computed.
    projected_exhausted_at: AwareDatetime | None
    #: The model call (its `event_id`) that took the spend to the threshold, when billing saw it happen.
    crossed_by_event_id: uuid.UUID | None


Alert = BudgetExceeded | BudgetWarning

#: Every alert type; a new one joins the `Alert` union and this tuple.
ALERT_TYPES: Final[tuple[type[BudgetExceeded] | type[BudgetWarning], ...]] = (BudgetExceeded, BudgetWarning)

_decoder: Final = msgspec.json.Decoder(Alert)
_encoder: Final = msgspec.json.Encoder(decimal_format="string")


class AlertDecodeError(DataError):
    """A payload that is not a valid alert; the message says why."""


def alert_type(alert: Alert) -> str:
    return str(alert.__struct_config__.tag)


def encode_alert(alert: Alert) -> bytes:
    return _encoder.encode(alert)


def decode_alert(payload: bytes | memoryview) -> Alert:
    """An alert from its JSON, those published before `event_id` was added included."""
    try:
        return _decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise AlertDecodeError(str(exc)) from exc
    except RecursionError:
        raise AlertDecodeError("JSON nested too deeply") from None
