"""`Projection`: what a consumer (`commonos.runtime.consumer.BatchConsumer`) applies, declared once.

Every member a consumer, a service, `cos replay` or a test reads is declared here with its type and a
default where one makes sense, so that mypy checks each use and a subclass can only override, never
invent, a member: a class attribute whose name is close to a declared member but not one of them
(`filter_subject`, `partitoned`) is a `TypeError` when the class is defined, instead of a setting
silently ignored.
"""

from __future__ import annotations

import difflib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Final

from commonos.proto.events import Event
from commonos.proto.subjects import EVENTS_ALL
from commonos.runtime.postgres import Conn

__all__ = ["MEMBERS", "Projection", "misspelt_members", "refuse_misspelt_members"]

#: The members a projection declares (attributes, then methods).
MEMBERS: Final = (
    "name",
    "position_table",
    "filter_subjects",
    "partitioned",
    "tables",
    "check",
    "prepare",
    "apply",
    "rolled_back",
    "committed",
    "after_commit",
)


def misspelt_members(names: Iterable[str]) -> list[tuple[str, str]]:
    """The `(name, member)` pairs where `name` looks like a misspelling of a declared member."""
    out: list[tuple[str, str]] = []
    for name in names:
        if name.startswith("_") or name in MEMBERS:
            continue
        close = difflib.get_close_matches(name, MEMBERS, n=1, cutoff=0.8)
        if close:
            out.append((name, close[0]))
    return out


def refuse_misspelt_members(owner: str, names: Iterable[str]) -> None:
    """Raise TypeError naming each of `names` that looks like a misspelt member of Projection."""
    wrong = misspelt_members(names)
    if wrong:
        raise TypeError(
            f"{owner}: " + "; ".join(f"{n!r} is not a member of Projection (did you mean {m!r}?)" for n, m in wrong)
        )


class Projection(ABC):
    """A projection of events into tables, applied by a consumer in batches, exactly once.

    A subclass sets `position_table` and `tables` (class attributes), `name` (usually in `__init__`, so
    that partitioned instances differ), implements `apply` and overrides what else it needs.
    """

    #: Names the durable consumer and its row in the position table (`journal-writer`, `billing-p1-of-2`).
    name: str
    #: Table holding `(consumer text primary key, stream_seq bigint, updated_at)`.
    position_table: str
    #: The subjects the projection reads (the consumer's filter); every event unless narrowed.
    filter_subjects: tuple[str, ...] = (EVENTS_ALL,)
    #: Whether instances may split the stream by session (`partition_of`). False when the projection needs
    #: the events of several sessions in stream order (a profile's memory): then only one instance runs.
    partitioned: bool = True
    #: The tables the projection writes (its position table aside): what `cos replay` empties and rebuilds
    #: and what a comparison of two databases compares.
    tables: tuple[str, ...]

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        refuse_misspelt_members(cls.__name__, vars(cls))
        filters = getattr(cls, "filter_subjects", None)
        if not isinstance(filters, tuple) or not filters or not all(isinstance(s, str) and s for s in filters):
            raise TypeError(f"{cls.__name__}.filter_subjects must be a non-empty tuple of subjects, not {filters!r}")
        # (ABCMeta computes __abstractmethods__ only after this hook: a concrete class is one with its apply.)
        concrete = not getattr(cls.apply, "__isabstractmethod__", False)
        for member, kind in (("position_table", str), ("tables", tuple), ("partitioned", bool)):
            value = getattr(cls, member, None)
            if value is None and concrete:
                raise TypeError(f"{cls.__name__} must set {member}")
            if value is not None and not isinstance(value, kind):
                raise TypeError(f"{cls.__name__}.{member} must be a {kind.__name__}, not {value!r}")

    def check(self, event: Event) -> None:  # noqa: B027 - a no-op unless overridden, on purpose
        """Check an event on its own, before its batch is applied (no I/O).

        Raise a `commonos.runtime.errors.DataError` when the event breaks an invariant: the consumer then
        dead-letters it (reason `invariant: <message>`) and applies the rest of the batch. Any other
        exception, a plain `ValueError` included, is a bug: it stops the consumer, and no event is lost.
        """

    async def prepare(self, conn: Conn, events: Sequence[Event]) -> None:  # noqa: B027
        """Run on the batch's connection before its transaction begins, with the events about to be applied:
        for what must be committed before the rows can be written and must not hold locks for the whole
        batch (the monthly partitions the rows fall in, `commonos.runtime.partitions`). Idempotent; an
        error is the batch's (retried, or the event isolated as for `apply`)."""

    @abstractmethod
    async def apply(self, conn: Conn, events: Sequence[Event]) -> None:
        """Write the rows of `events`, in order, inside the caller's transaction.

        Must be idempotent: applying events already applied changes nothing. Raises `EventRejected` when
        an event cannot be applied to what is stored (say an update that matches no row): the consumer
        then applies the batch one event at a time, each under a savepoint, to find which.
        """

    def rolled_back(self) -> None:  # noqa: B027
        """Forget whatever an `apply` staged outside the database: its transaction will not commit.

        Called before each attempt at a batch, and between a failed batch and its one-at-a-time retry.
        """

    def committed(self) -> None:  # noqa: B027
        """The batch applied last has committed: make what it staged outside the database (metrics, caches)
        true."""

    async def after_commit(self, conn: Conn, events: Sequence[Event]) -> None:  # noqa: B027
        """Run on a connection of its own after a batch committed, with the events that were applied: for
        idempotent fix-ups that must not hold locks for the whole batch. Best effort: the consumer logs a
        database failure and goes on."""
