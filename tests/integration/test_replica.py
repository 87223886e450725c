"""The read replica's lag (`commonos.runtime.postgres.replica_lag`) on a real streaming replica (tests/conftest.py
`replicated_pg`: pg_basebackup -R of a primary of the test's own): 0 once it has replayed everything, however
long ago the last transaction was; seconds and bytes behind while its replay is paused and the primary writes;
0 again once it has caught up. Asked of the primary, it says it is no standby."""

from __future__ import annotations

import asyncio

from commonos.runtime.postgres import connect, replica_lag
from tests.harness import Replicated


async def test_the_lag_of_a_real_replica(replicated_pg: Replicated, replica_database: tuple[str, str]) -> None:
    primary_dsn, replica_dsn = replica_database
    primary = await connect(primary_dsn)
    replica = await connect(replica_dsn)
    try:
        assert await replica.fetchval("SELECT pg_is_in_recovery()") is True
        await primary.execute("CREATE TABLE marks (n int)")
        await replicated_pg.caught_up()
        await asyncio.sleep(0.3)  # an idle primary: the last transaction grows old, the replica is not behind
        idle = await replica_lag(replica)
        assert idle.standby and idle.seconds == 0.0 and idle.bytes == 0 and not idle.paused, idle
        assert str(idle) == "0.0 s behind (0 bytes received, not yet replayed)"

        await replicated_pg.pause()
        await primary.execute("INSERT INTO marks SELECT generate_series(1, 1000)")
        await asyncio.sleep(0.3)
        behind = await replica_lag(replica)
        assert behind.paused and behind.bytes is not None and behind.bytes > 0, behind
        assert behind.seconds is not None and behind.seconds >= 0.3, behind
        assert str(behind).endswith("received, not yet replayed), replay paused"), str(behind)
        assert await replica.fetchval("SELECT count(*) FROM marks") == 0

        await replicated_pg.resume()
        await replicated_pg.caught_up()
        after = await replica_lag(replica)
        assert after.seconds == 0.0 and after.bytes == 0 and not after.paused, after
        assert await replica.fetchval("SELECT count(*) FROM marks") == 1000

        on_primary = await replica_lag(primary)
        assert not on_primary.standby and on_primary.seconds is None and on_primary.bytes is None
        assert str(on_primary) == "not a standby (pg_is_in_recovery() is false)"
    finally:
        await primary.close()
        await replica.close()
