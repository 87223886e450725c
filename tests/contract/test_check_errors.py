"""What a projection's `check` raises decides an event's fate: a `DataError` dead-letters the event and the
consumer goes on; anything else, a plain ValueError included, is a bug that stops the consumer with nothing
thrown away. And a projection cannot misspell one of its members."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, cast

import nats
import pytest

from commonos.journal_writer.graph_projection import GraphProjection
from commonos.journal_writer.service import writer_schemas
from commonos.journal_writer.store import JournalProjection
from commonos.proto.events import Event, ModelCallCompleted
from commonos.runtime.consumer import BatchConsumer, ConsumerOptions, Projection
from commonos.runtime.dlq import list_dead_letters
from commonos.runtime.errors import DataError
from commonos.runtime.http import Health
from commonos.runtime.postgres import Conn, apply_schemas, connect, create_pool
from tests.factories import event_stream
from tests.support import position, publish_all, wait_for_position


class Refusing(JournalProjection):
    """The core projection whose check raises `error` on one event."""

    def __init__(self, name: str, bad: Event, error: Exception) -> None:
        super().__init__(name)
        self.bad = bad
        self.error = error

    def check(self, event: Event) -> None:
        if event.event_id == self.bad.event_id:
            raise self.error
        super().check(event)


async def _setup(nats_url: str, database_url: str) -> tuple[Event, int, int]:
    """Publish 60 events; returns the one to refuse (a model call from the middle: no other event of the core
    depends on it), its stream sequence and the last one's."""
    events = list(event_stream(60, seed=3))
    acks = await publish_all(nats_url, events)
    conn = await connect(database_url)
    try:
        await apply_schemas(conn, writer_schemas())
    finally:
        await conn.close()
    bad = next(i for i, e in enumerate(events) if i >= 25 and isinstance(e, ModelCallCompleted))
    return events[bad], acks[bad].seq, acks[-1].seq


@pytest.mark.parametrize("error", [ValueError("a bug in check"), KeyError("a bug in check")], ids=repr)
async def test_a_check_raising_anything_but_a_data_error_stops_the_consumer(
    nats_url: str, database_url: str, error: Exception
) -> None:
    bad, bad_seq, _ = await _setup(nats_url, database_url)
    nc = await nats.connect(nats_url)
    pool = await create_pool(database_url)
    try:
        projection = Refusing("refusing", bad, error)
        consumer = BatchConsumer(nc.jetstream(), pool, projection, Health(), ConsumerOptions(batch_size=10), nc=nc)
        with pytest.raises(type(error)):
            await asyncio.wait_for(consumer.run(asyncio.Event()), 30)
        # Nothing from the bad event's batch on was applied or acknowledged, and nothing was dead-lettered.
        assert await position(database_url, "refusing") < bad_seq
        assert await list_dead_letters(nc.jetstream()) == []
    finally:
        await pool.close()
        await nc.close()


async def test_a_check_raising_a_data_error_dead_letters_the_event(nats_url: str, database_url: str) -> None:
    bad, bad_seq, last = await _setup(nats_url, database_url)
    nc = await nats.connect(nats_url)
    pool = await create_pool(database_url)
    stop = asyncio.Event()
    try:
        projection = Refusing("refusing", bad, DataError("not true"))
        consumer = BatchConsumer(nc.jetstream(), pool, projection, Health(), ConsumerOptions(batch_size=10), nc=nc)
        task = asyncio.create_task(consumer.run(stop))
        await wait_for_position(database_url, "refusing", last, timeout_s=30)
        stop.set()
        await task
        (letter,) = await list_dead_letters(nc.jetstream())
        assert letter.stream_seq == bad_seq and letter.reason == "invariant: not true"
    finally:
        await pool.close()
        await nc.close()


def test_a_misspelt_member_is_refused() -> None:
    with pytest.raises(TypeError, match=r"'filter_subject' is not a member of Projection.*'filter_subjects'"):

        class Misspelt(JournalProjection):
            filter_subject = ("cos.events.*.*.session_created",)

    with pytest.raises(TypeError, match="filter_subjects must be a non-empty tuple"):

        class NotATuple(JournalProjection):
            filter_subjects = "cos.events.>"  # type: ignore[assignment]

    with pytest.raises(TypeError, match="must set tables"):

        class NoTables(Projection):
            position_table = "positions"

            async def apply(self, conn: Conn, events: Sequence[Event]) -> None:
                pass

    projection = JournalProjection("late")
    projection.partitoned = False  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match=r"'partitoned' is not a member of Projection.*'partitioned'"):
        BatchConsumer(cast(Any, None), cast(Any, None), projection, Health())


def test_a_consumer_reads_its_projections_subjects_unless_told_otherwise() -> None:
    graph = GraphProjection()
    consumer = BatchConsumer(cast(Any, None), cast(Any, None), graph, Health())
    assert consumer.options.filter_subjects == graph.filter_subjects != Projection.filter_subjects
    # One durable consumer per subject (a lane): nats-server serves a consumer with several filters slowly.
    configs = [consumer.consumer_config(lane) for lane in consumer.lanes]
    assert [c.filter_subject for c in configs] == list(graph.filter_subjects)
    assert [c.durable_name for c in configs] == ["graph-writer", "graph-writer-profiles"]
    assert all(c.filter_subjects is None for c in configs)
    narrowed = BatchConsumer(
        cast(Any, None), cast(Any, None), graph, Health(), ConsumerOptions(filter_subjects=graph.filter_subjects[:1])
    )
    assert narrowed.consumer_config().filter_subject == graph.filter_subjects[0]
