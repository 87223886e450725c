"""Monthly partitions of the tables that grow without end.

A table declared with `partition_by` (`commonos.runtime.tables.Table`) is partitioned by range of that time
column, one partition a calendar month in UTC, named `<table>_pYYYY_MM` (`messages_p2026_12`) in the table's
schema. There is no default partition: every row lands in its month's partition, which exists before the row
is written, made by one of

* the schema (`ahead_sql`, part of the table's DDL): the month before this one, this one and `MONTHS_AHEAD`
  months to come, each time a service applies its schema;
* the writer (`ensure`, from a projection's `prepare`, before the batch's transaction): the months of the
  batch's rows that do not exist: an imported transcript from 2025, a month the service has run into since it
  started, a month `cos retention` dropped that a late row belongs to. It takes the schema's advisory lock in a
  short transaction of its own, so two writers (or a writer and a starting service) never race to create the
  same partition.

A month is dropped whole (`drop`: detached, then dropped), never deleted row by row: what costs the same for
a thousand rows as for a hundred million, and returns the disk at once (`cos retention`).

This module is below `tables` (which writes `ahead_sql` and `refuse_old_layout_sql` into the DDL): it takes
table names and columns, not `Table`s.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Final

from commonos.runtime.postgres import OLD_LAYOUT_SQLSTATE, SCHEMA_LOCK_KEY, Conn

__all__ = [
    "MONTHS_AHEAD",
    "Partition",
    "ahead_sql",
    "bounds",
    "create_sql",
    "drop",
    "ensure",
    "ensure_range",
    "list_partitions",
    "month_of",
    "months_between",
    "partition_name",
    "partitioned_tables",
    "refuse_old_layout_sql",
    "relayout",
]

#: Months made ahead by every schema application, after the current one.
MONTHS_AHEAD: Final = 3

_PARTITION_RE: Final = re.compile(r"_p(\d{4})_(\d{2})$")


def month_of(when: datetime | date) -> date:
    """The first day of `when`'s month in UTC."""
    if isinstance(when, datetime):
        when = when.astimezone(UTC) if when.tzinfo is not None else when
        return date(when.year, when.month, 1)
    return date(when.year, when.month, 1)


def next_month(month: date) -> date:
    """The first day of the month after; `date.max` for December 9999 (no later month can be written)."""
    if month.year == date.max.year and month.month == 12:
        return date.max
    return date(month.year + month.month // 12, month.month % 12 + 1, 1)


def months_between(start: datetime | date, end: datetime | date) -> list[date]:
    """The months holding some instant of [start, end) (first days, in order); `end` is exclusive."""
    last = end - timedelta(microseconds=1) if isinstance(end, datetime) else end - timedelta(days=1)
    month, stop, out = month_of(start), month_of(last), []
    while month <= stop:
        out.append(month)
        month = next_month(month)
    return out


def _split(table: str) -> tuple[str, str]:
    schema, _, bare = table.rpartition(".")
    return schema or "public", bare


def partition_name(table: str, month: date) -> str:
    """`messages_p2026_12`, or `graph.user_inputs_p2026_12` for a table of another schema."""
    schema, bare = _split(table)
    name = f"{bare}_p{month.year:04d}_{month.month:02d}"
    return name if schema == "public" else f"{schema}.{name}"


def bounds(month: date) -> tuple[str, str]:
    """The partition's range as timestamptz literals: [the month's first instant, the next month's)."""
    end = next_month(month)
    return f"{month.isoformat()} 00:00:00+00", "infinity" if end == date.max else f"{end.isoformat()} 00:00:00+00"


def create_sql(table: str, month: date) -> str:
    """`CREATE TABLE IF NOT EXISTS <partition> PARTITION OF <table> FOR VALUES FROM (...) TO (...)`."""
    start, end = bounds(month)
    return (
        f"CREATE TABLE IF NOT EXISTS {partition_name(table, month)} PARTITION OF {table} "
        f"FOR VALUES FROM ('{start}') TO ('{end}')"
    )


def ahead_sql(table: str) -> str:
    """The DDL making the month before this one, this one and `MONTHS_AHEAD` more (the names and bounds of
    `create_sql`, computed by the server at the time the schema is applied)."""
    schema, bare = _split(table)
    prefix = "" if schema == "public" else f"{schema}."
    return (
        "DO $$\nDECLARE m date;\nBEGIN\n"
        f"    FOR i IN -1..{MONTHS_AHEAD} LOOP\n"
        "        m := (date_trunc('month', now() AT TIME ZONE 'UTC') + make_interval(months => i))::date;\n"
        f"        EXECUTE format('CREATE TABLE IF NOT EXISTS {prefix}%I PARTITION OF {table} "
        "FOR VALUES FROM (%L) TO (%L)',\n"
        f"            '{bare}_p' || to_char(m, 'YYYY_MM'), to_char(m, 'YYYY-MM-DD') || ' 00:00:00+00',\n"
        "            to_char(m + interval '1 month', 'YYYY-MM-DD') || ' 00:00:00+00');\n"
        "    END LOOP;\nEND\n$$;\n"
    )


def refuse_old_layout_sql(table: str) -> str:
    """DDL that fails, saying how to move it, when `table` exists as one unpartitioned table."""
    message = (
        f"{table} was made unpartitioned by an older version: stop the services and rebuild it in the "
        "partitioned layout (cos replay --truncate for the core tables, from the stream; cos billing relayout for "
        "model_calls; docs/operations.md, The database as it grows)"
    )
    return (
        "DO $$\nBEGIN\n"
        f"    IF EXISTS (SELECT 1 FROM pg_class WHERE oid = to_regclass('{table}') AND relkind = 'r') THEN\n"
        f"        RAISE EXCEPTION '{message}' USING ERRCODE = '{OLD_LAYOUT_SQLSTATE}';\n"
        "    END IF;\nEND\n$$;\n"
    )


# --- what a database holds ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Partition:
    """One month of a partitioned table."""

    table: str
    name: str
    month: date
    #: PostgreSQL's estimate (pg_class.reltuples; -1 before the first ANALYZE).
    rows_estimate: int
    bytes: int


async def partitioned_tables(conn: Conn) -> list[str]:
    """The partitioned tables of the database (`schema.name`, `public.` left out)."""
    rows = await conn.fetch(
        "SELECT n.nspname, c.relname FROM pg_partitioned_table p JOIN pg_class c ON c.oid = p.partrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace ORDER BY 1, 2"
    )
    return [r["relname"] if r["nspname"] == "public" else f"{r['nspname']}.{r['relname']}" for r in rows]


async def list_partitions(conn: Conn, table: str) -> list[Partition]:
    """The monthly partitions of `table`, oldest first (any other child is left out)."""
    rows = await conn.fetch(
        "SELECT n.nspname, c.relname, c.reltuples::bigint AS estimate, pg_total_relation_size(c.oid) AS bytes "
        "FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE i.inhparent = to_regclass($1)",
        table,
    )
    out = []
    for r in rows:
        found = _PARTITION_RE.search(r["relname"])
        if found is None:
            continue
        name = r["relname"] if r["nspname"] == "public" else f"{r['nspname']}.{r['relname']}"
        month = date(int(found.group(1)), int(found.group(2)), 1)
        out.append(Partition(table, name, month, int(r["estimate"]), int(r["bytes"])))
    return sorted(out, key=lambda p: p.month)


async def detached(conn: Conn, table: str) -> list[Partition]:
    """Months of `table` detached and not dropped: a `drop` interrupted between its detach and its drop (a
    killed `cos retention`) leaves one, which `list_partitions` no longer finds. Oldest first."""
    rows = await conn.fetch(
        "SELECT n.nspname, c.relname, c.reltuples::bigint AS estimate, pg_total_relation_size(c.oid) AS bytes, "
        "p.relname AS parent FROM pg_class p JOIN pg_namespace n ON n.oid = p.relnamespace "
        "JOIN pg_class c ON c.relnamespace = p.relnamespace AND c.relkind = 'r' "
        "AND starts_with(c.relname, p.relname || '_p') "
        "WHERE p.oid = to_regclass($1) AND NOT EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = c.oid)",
        table,
    )
    out = []
    for r in rows:
        found = _PARTITION_RE.search(r["relname"])
        if found is None or r["relname"] != f"{r['parent']}{found.group(0)}":
            continue
        name = r["relname"] if r["nspname"] == "public" else f"{r['nspname']}.{r['relname']}"
        out.append(Partition(table, name, date(int(found.group(1)), int(found.group(2)), 1), r["estimate"], r["bytes"]))
    return sorted(out, key=lambda p: p.month)


async def drop(conn: Conn, partition: Partition, before: Sequence[str] = ()) -> None:
    """Detach the month from its table (CONCURRENTLY: readers and writers of other months go on), then drop it;
    `before`, statements with `{month}` naming the detached month's table (rollups of its rows subtracting
    them, `Table.drops`), run in the transaction that drops it.

    Must run outside a transaction block. A detach interrupted half-way (a crash) leaves the partition
    'detach pending'; it is finished first (`DETACH ... FINALIZE`)."""
    pending = await conn.fetchval(
        "SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = to_regclass($1)", partition.name
    )
    if pending:
        await conn.execute(f"ALTER TABLE {partition.table} DETACH PARTITION {partition.name} FINALIZE")
    elif pending is not None:
        await conn.execute(f"ALTER TABLE {partition.table} DETACH PARTITION {partition.name} CONCURRENTLY")
    async with conn.transaction():
        if before and await conn.fetchval("SELECT to_regclass($1)", partition.name) is not None:
            for statement in before:
                await conn.execute(statement.replace("{month}", partition.name))
        await conn.execute(f"DROP TABLE IF EXISTS {partition.name}")


# --- making them -----------------------------------------------------------------------------------------------


async def ensure(conn: Conn, needs: Mapping[str, Iterable[datetime]]) -> int:
    """Make the partitions the rows of `needs` (table -> the rows' times) fall in that do not exist; the
    number made. Runs its own short transaction when it makes one: call it outside a transaction.

    Which months exist is asked of the database each time (one round trip per batch with rows to file), not
    remembered: a month `cos retention` dropped since is made again for a late row, never a batch failing
    for a partition a cache still believed in."""
    wanted = {
        partition_name(table, month): (table, month)
        for table, times in needs.items()
        for month in {month_of(t) for t in times}
    }
    if not wanted:
        return 0
    found = await conn.fetch("SELECT n FROM unnest($1::text[]) AS n WHERE to_regclass(n) IS NULL", list(wanted))
    missing = sorted(wanted[r["n"]] for r in found)
    if not missing:
        return 0
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK_KEY)
        for table, month in missing:
            await conn.execute(create_sql(table, month))
    return len(missing)


async def ensure_range(conn: Conn, start: datetime, end: datetime, tables: Sequence[str] | None = None) -> None:
    """Make every monthly partition covering [start, end) of `tables` (default: every registered partitioned
    table), in one transaction under the schema's lock. For tools that load rows in bulk."""
    if tables is None:
        from commonos.runtime import registry  # registry -> tables -> this module

        tables = [t.name for t in registry.tables() if t.partition_by is not None]
    months = months_between(start, end)
    await ensure(conn, {t: [datetime(m.year, m.month, 1, tzinfo=UTC) for m in months] for t in tables})


#: Where `relayout` puts a table of the older layout while its rows are copied (dropped at the end).
_ASIDE: Final = "cos_old_layout"


async def relayout(
    conn: Conn, table: str, partition_by: str, columns: Sequence[str], schemas: Sequence[str], after: Sequence[str] = ()
) -> int:
    """Move `table`, one table of an older layout, into the partitioned layout its declaration gives, keeping
    every row as it is (for an accounting record such as `model_calls`, whose repriced rows the stream alone
    cannot give back); the rows moved, or -1 when the table is partitioned already.

    In one transaction: the old table goes aside (another schema, where its index names are free), `schemas`
    (the DDL that declares it) make the partitioned table, the months its rows need are made, the `columns`
    are copied, the statements `after` run (what derives from the rows: billing's daily sums), the old table is
    dropped. Readers and writers of the table wait for it (it holds the table's lock).
    """
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK_KEY)
        kind = await conn.fetchval("SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)", table)
        if kind != "r":
            return -1
        aside = f"{_ASIDE}.{_split(table)[1]}"
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {_ASIDE}")
        await conn.execute(f"ALTER TABLE {table} SET SCHEMA {_ASIDE}")
        for script in schemas:
            await conn.execute(script)
        span = await conn.fetchrow(f"SELECT min({partition_by}) AS first, max({partition_by}) AS last FROM {aside}")
        if span is not None and span["first"] is not None:
            for month in months_between(span["first"], span["last"] + timedelta(microseconds=1)):
                await conn.execute(create_sql(table, month))
        names = ", ".join(columns)
        moved = await conn.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM {aside}")
        for statement in after:
            await conn.execute(statement)
        await conn.execute(f"DROP TABLE {aside}")
        await conn.execute(f"DROP SCHEMA {_ASIDE}")
        return int(moved.rsplit(" ", 1)[-1])


def stored_nowhere(table: str, ref: str, column: str = "id") -> str:
    """The condition that the row named `ref` (an expression of the row being written) is in no month of
    `table` yet: with the partition column in the primary key, an id announced again at another time (the OTLP
    gateway's name-based ids, a call that arrives by telemetry and again by import) would otherwise be a second
    row. A time-based id (UUIDv7: version nibble 7) names one event, which always carries the same time, so it
    is not looked up: the loop's rows cost nothing more."""
    return f"(substr({ref}::text, 15, 1) = '7' OR NOT EXISTS (SELECT 1 FROM {table} x WHERE x.{column} = {ref}))"
