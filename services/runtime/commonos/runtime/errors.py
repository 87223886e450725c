"""What a failure while applying events means, so the consumer can decide without guessing.

* `EventRejected`: this event's data cannot be applied (it refers to a row that does not exist, it
  contradicts what is stored). The consumer dead-letters the event with the message as its reason
  and applies the rest of the batch.
* PostgreSQL's own data errors (SQLSTATE classes 22, 23, 54) mean the same and are treated the same.
* Anything else is either operational (PostgreSQL or NATS unreachable: retried with backoff) or a
  bug, which fails loudly instead of throwing good events away.
"""

from __future__ import annotations


class EventRejected(ValueError):
    """One event of a batch cannot be applied; the message is the dead letter's reason."""
