"""The memory_entries projection on real PostgreSQL gives what the loop's fold gives, redelivery or not."""

from __future__ import annotations

import random
from collections import defaultdict

import asyncpg

from commonos.journal_writer.memory import SCHEMA, memory_rows
from commonos.loop.session_state import MemoryState
from commonos.proto.events import MemoryChanged, MemoryOp, MemoryTarget, SessionCreated
from commonos.proto.ids import new_id
from commonos.runtime.postgres import apply_schemas, connect


async def apply(conn: asyncpg.Connection, event: MemoryChanged) -> None:
    async with conn.transaction():
        for statement in memory_rows(event):
            await conn.execute(statement.sql, *statement.args)


def random_changes(rng: random.Random, count: int) -> list[MemoryChanged]:
    sizes: dict[tuple[str, MemoryTarget], int] = defaultdict(int)
    events = []
    for i in range(count):
        profile = rng.choice(["alpha", "beta"])
        target = rng.choice(list(MemoryTarget))
        size = sizes[profile, target]
        op = MemoryOp.ADD if size == 0 else rng.choice(list(MemoryOp))
        # now and then a position that does not exist (the fold and the SQL must both ignore it)
        position = rng.randint(0, size + 1)
        events.append(
            MemoryChanged(
                profile_id=profile,
                session_id=new_id(),
                target=target,
                op=op,
                position=position,
                content=None if op is MemoryOp.REMOVE else f"entry {i}",
            )
        )
        if op is MemoryOp.ADD:
            sizes[profile, target] += 1
        elif op is MemoryOp.REMOVE and position < size:
            sizes[profile, target] -= 1
    return events


async def test_projection_matches_the_fold_and_ignores_redelivery(database_url: str) -> None:
    conn = await connect(database_url)
    try:
        await apply_schemas(conn, [SCHEMA])
        await apply_schemas(conn, [SCHEMA])  # IF NOT EXISTS: safe to repeat
        rng = random.Random(7)
        events = random_changes(rng, 300)
        folds = {"alpha": MemoryState(), "beta": MemoryState()}
        for i, event in enumerate(events):
            await apply(conn, event)
            folds[event.profile_id].apply(event)
            if rng.random() < 0.3:  # at-least-once delivery: this one, or an older one, again
                await apply(conn, events[rng.randint(0, i)])
        rows = await conn.fetch("SELECT profile_id, target, position, content FROM memory_entries ORDER BY 1, 2, 3")
        projected: dict[tuple[str, str], list[str]] = defaultdict(list)
        for r in rows:
            key = (r["profile_id"], r["target"])
            assert r["position"] == len(projected[key])  # positions stay 0..n-1
            projected[key].append(r["content"])
        expected = {
            (profile, target.value): entries
            for profile, fold in folds.items()
            for target, entries in fold.lists.items()
            if entries
        }
        assert dict(projected) == expected
        assert sum(len(v) for v in expected.values()) > 20
    finally:
        await conn.close()


def test_other_events_have_no_rows() -> None:
    assert memory_rows(SessionCreated(profile_id="p", session_id=new_id(), source="cli")) == []
