"""What a failure while applying events means, so the consumer can decide without guessing
(the kinds are `commonos.proto.errors`'s).

* `EventRejected` (a `DataError`): this event's data cannot be applied (it refers to a row that does not
  exist, it contradicts what is stored). The consumer dead-letters the event with the message as its
  reason and applies the rest of the batch. So does any other `DataError` a projection's `check` raises.
* PostgreSQL's own data errors (SQLSTATE classes 22, 23, 54) mean the same and are treated the same.
* `OperationalError`, and PostgreSQL or NATS unreachable: retried with backoff.
* Anything else, a plain `ValueError` from a projection included, is a bug and fails loudly instead of
  throwing good events away.
"""

from __future__ import annotations

from commonos.proto.errors import BugError, ConfigError, CosError, DataError, OperationalError

__all__ = ["BugError", "ConfigError", "CosError", "DataError", "EventRejected", "OperationalError"]


class EventRejected(DataError):
    """One event of a batch cannot be applied; `reason` and the message make the dead letter's reason.

    `reason` is a short code (`rejected`, `profile_mismatch`, ...) that also labels the dead-letter metric.
    """

    def __init__(self, detail: str, reason: str = "rejected") -> None:
        super().__init__(detail)
        self.reason = reason
