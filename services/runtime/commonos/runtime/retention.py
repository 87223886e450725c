"""Retention by dropping whole months: what `cos retention` and the services' retention setting run.

Keeping `N` months means: a month is dropped once it ended at least `N` whole months ago, so at least `N`
months of history are always there (between `N` and `N + 1`: on 5 December, `N = 3` keeps September to
December). A month is a partition (`commonos.runtime.partitions`): it is detached and dropped, no `DELETE`
and no `VACUUM`, so dropping a month costs the same at a thousand rows as at a hundred million and gives the
disk back at once. A rollup of a table's rows (billing's `session_costs` of `model_calls`, `Table.drops`)
subtracts the month's rows in the transaction that drops it, reading the month once.

Before a month is dropped it can be exported (`export_dir`): one Parquet file per partition (pyarrow; every
column but the ones PostgreSQL generates, such as `messages.search`), written under one `REPEATABLE READ`
snapshot, its rows counted against the partition's in the same snapshot, and listed in `manifest.json`
(table, month, file, rows, bytes, SHA-256, columns) before the partition is dropped: DuckDB reads them as
they are (`SELECT * FROM 'export/messages/*.parquet'`). A month whose export fails is not dropped.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, Final

from prometheus_client import Counter, Gauge

from commonos.proto.errors import ConfigError
from commonos.runtime import partitions
from commonos.runtime.partitions import Partition
from commonos.runtime.postgres import Conn
from commonos.runtime.settings import env_int, env_path

__all__ = [
    "Dropped",
    "Expiring",
    "RetentionSettings",
    "cutoff",
    "due",
    "expire",
    "expiring_due",
    "export_partition",
    "run",
]

MANIFEST: Final = "manifest.json"

MONTHS_DROPPED: Final = Counter(
    "cos_retention_months_dropped_total", "Monthly partitions dropped by the service's retention", ["table"]
)
LAST_RUN: Final = Gauge(
    "cos_retention_last_run_timestamp_seconds", "When the service's retention last ran to its end (Unix time)"
)
#: Rows read from PostgreSQL and written to Parquet at a time (one row group each).
CHUNK_ROWS: Final = 50_000


@dataclass(frozen=True, kw_only=True)
class RetentionSettings:
    """COS_RETENTION_MONTHS (the core tables; unset: every month kept), COS_MODEL_CALLS_RETENTION_MONTHS
    (`model_calls`, an accounting record: unset, every month kept), COS_RETENTION_EXPORT_DIR (export each
    month to Parquet before dropping it)."""

    keep_months: int | None = None
    model_calls_keep_months: int | None = None
    export_dir: Path | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RetentionSettings:
        env = os.environ if env is None else env

        def months(name: str) -> int | None:
            return env_int(env, name, 0, 1, 100_000) if env.get(name, "").strip() else None

        return cls(
            keep_months=months("COS_RETENTION_MONTHS"),
            model_calls_keep_months=months("COS_MODEL_CALLS_RETENTION_MONTHS"),
            export_dir=env_path(env, "COS_RETENTION_EXPORT_DIR"),
        )


def tables_kept_by(accounting: bool) -> list[str]:
    """The registered partitioned tables a retention of the core (`accounting` False) or of the accounting
    records (True) drops months of."""
    from commonos.runtime import registry

    return [t.name for t in registry.tables() if t.partition_by is not None and t.accounting == accounting]


def rollups_of(table: str) -> list[str]:
    """The statements that take a dropped month of `table` out of the registered rollups of its rows
    (`Table.drops`), in the tables' order."""
    from commonos.runtime import registry

    return [s for t in registry.tables() for s in t.drops.get(table, ())]


def cutoff(now: datetime, keep_months: int) -> date:
    """The first month kept: months before it are dropped."""
    if keep_months < 1:
        raise ConfigError(f"months to keep must be 1 or more, not {keep_months}")
    month = partitions.month_of(now)
    index = month.year * 12 + month.month - 1 - keep_months
    return date(index // 12, index % 12 + 1, 1)


async def due(conn: Conn, tables: Sequence[str], keep_months: int, now: datetime | None = None) -> list[Partition]:
    """The partitions of `tables` to drop to keep `keep_months` months, oldest first."""
    first_kept = cutoff(now or datetime.now(UTC), keep_months)
    out: list[Partition] = []
    for table in tables:
        # With the months a drop interrupted after their detach left behind: dropped (their rollups' share
        # taken out) like the others.
        found = [*await partitions.list_partitions(conn, table), *await partitions.detached(conn, table)]
        out += [p for p in found if p.month < first_kept]
    return sorted(out, key=lambda p: (p.month, p.table))


@dataclass(frozen=True)
class Dropped:
    table: str
    partition: str
    month: str
    rows: int | None
    bytes: int
    seconds: float
    #: The Parquet file it was exported to, if any.
    export: str | None = None
    dry_run: bool = False
    #: Rows deleted by their month (a table that expires by a time column: `expire`), not a partition dropped;
    #: `rows` counts the table's own rows (those that went with them, such as nested sessions, included), the
    #: export's manifest each table's.
    deleted: bool = False


# --- export ------------------------------------------------------------------------------------------------


def _arrow_type(pg: str, scale: int | None) -> Any:
    import pyarrow as pa

    simple = {
        "uuid": pa.string(),
        "text": pa.string(),
        "jsonb": pa.string(),
        "json": pa.string(),
        "integer": pa.int32(),
        "bigint": pa.int64(),
        "smallint": pa.int16(),
        "boolean": pa.bool_(),
        "double precision": pa.float64(),
        "real": pa.float32(),
        "timestamp with time zone": pa.timestamp("us", tz="UTC"),
        "date": pa.date32(),
        "text[]": pa.list_(pa.string()),
    }
    if pg in simple:
        return simple[pg]
    if pg.startswith("numeric"):
        return pa.decimal128(38, scale if scale is not None else 10)
    return pa.string()


async def _columns(conn: Conn, table: str) -> list[tuple[str, str, int | None]]:
    """(name, type, numeric scale) of the table's stored columns, generated ones left out."""
    rows = await conn.fetch(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod) AS type, "
        "CASE WHEN a.atttypid = 'numeric'::regtype AND a.atttypmod > 0 THEN (a.atttypmod - 4) & 65535 END AS scale "
        "FROM pg_attribute a WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped "
        "AND a.attgenerated = '' ORDER BY a.attnum",
        table,
    )
    return [(r["attname"], r["type"], r["scale"]) for r in rows]


def _select(columns: list[tuple[str, str, int | None]], source: str) -> str:
    def expr(name: str, pg: str) -> str:
        quoted = f'"{name}"'
        if pg in ("uuid", "jsonb", "json") or (not pg.startswith("numeric") and pg not in _NATIVE):
            return f"{quoted}::text"
        return quoted

    return f"SELECT {', '.join(expr(n, t) for n, t, _ in columns)} FROM {source}"


_NATIVE: Final = frozenset(
    {"text", "integer", "bigint", "smallint", "boolean", "double precision", "real", "timestamp with time zone", "date"}
    | {"text[]"}
)


async def export_partition(conn: Conn, partition: Partition, export_dir: Path) -> tuple[Path, int, str]:
    """Write `partition` to `<export_dir>/<table>/<partition>.parquet`; (file, rows, sha256). The rows are read
    under one snapshot and counted against the partition's count in it: a mismatch is an error."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        return await _export(conn, partition.name, partition.name, "", (), export_dir / partition.table)


async def _export(
    conn: Conn, table: str, file_stem: str, where: str, args: Sequence[Any], folder: Path
) -> tuple[Path, int, str]:
    """Write the rows of `table` `where` holds to `<folder>/<file_stem>.parquet`, counted against a count(*)
    of the same rows; (file, rows, sha256). Run it in a REPEATABLE READ transaction: one snapshot."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = await _columns(conn, table)
    schema = pa.schema([(n, _arrow_type(t, s)) for n, t, s in columns])
    target = _target(folder, file_stem)
    partial = target.with_suffix(".parquet.partial")
    written = 0
    expected = await conn.fetchval(f"SELECT count(*) FROM {table} {where}", *args)
    with pq.ParquetWriter(partial, schema, compression="zstd") as writer:
        cursor = conn.cursor(_select(columns, table) + f" {where}", *args)
        chunk: list[Any] = []
        async for record in cursor:
            chunk.append(tuple(record))
            if len(chunk) >= CHUNK_ROWS:
                writer.write_table(_table(schema, chunk))
                written += len(chunk)
                chunk = []
        if chunk:
            writer.write_table(_table(schema, chunk))
            written += len(chunk)
    if written != expected:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"{table}: exported {written} rows of {expected}; not dropped")
    os.replace(partial, target)
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    return target, written, digest


def _target(folder: Path, file_stem: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{file_stem.rpartition('.')[2]}.parquet"


def _table(schema: Any, rows: list[Any]) -> Any:
    import pyarrow as pa

    columns: list[Sequence[Any]] = list(zip(*rows, strict=True)) if rows else [[] for _ in schema]
    return pa.Table.from_arrays(
        [pa.array(col, type=f.type) for col, f in zip(columns, schema, strict=True)], schema=schema
    )


def _record(export_dir: Path, entry: dict[str, Any]) -> None:
    """Add `entry` to the export's manifest (written whole to a temporary file, then renamed)."""
    path = export_dir / MANIFEST
    manifest: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"format": "parquet", "exports": []}
    manifest["exports"].append(entry)
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(partial, path)


# --- the run ----------------------------------------------------------------------------------------------------


async def run(
    conn: Conn,
    plan: Sequence[Partition],
    *,
    export_dir: Path | None = None,
    dry_run: bool = False,
    progress: Callable[[Dropped], None] | None = None,
) -> list[Dropped]:
    """Drop (after exporting, with `export_dir`) each partition of `plan`; what was done, in order.

    `conn` must not be in a transaction (a partition is detached CONCURRENTLY)."""
    done: list[Dropped] = []
    for partition in plan:
        started = time.perf_counter()
        exported: str | None = None
        rows: int | None = None
        if dry_run:
            item = Dropped(
                partition.table, partition.name, partition.month.isoformat()[:7], None, partition.bytes, 0.0, None, True
            )
        else:
            if export_dir is not None:
                path, rows, digest = await export_partition(conn, partition, export_dir)
                exported = str(path)
                _record(
                    export_dir,
                    {
                        "table": partition.table,
                        "partition": partition.name,
                        "month": partition.month.isoformat()[:7],
                        "file": str(path.relative_to(export_dir)),
                        "rows": rows,
                        "bytes": path.stat().st_size,
                        "sha256": digest,
                        "columns": [{"name": n, "type": t} for n, t, _ in await _columns(conn, partition.name)],
                        "exported_at": datetime.now(UTC).isoformat(),
                    },
                )
            await partitions.drop(conn, partition, rollups_of(partition.table))
            item = Dropped(
                partition.table,
                partition.name,
                partition.month.isoformat()[:7],
                rows,
                partition.bytes,
                time.perf_counter() - started,
                exported,
            )
        done.append(item)
        if progress is not None:
            progress(item)
    return done


def as_json(done: Sequence[Dropped]) -> list[dict[str, Any]]:
    return [asdict(d) for d in done]


# --- tables that expire row by row -----------------------------------------------------------------------------


def tables_expiring() -> dict[str, tuple[str, str]]:
    """The registered tables that expire by a time column (`Table.expires_by`): name -> (key column, time)."""
    from commonos.runtime import registry

    return {t.name: (t.key[0], t.expires_by) for t in registry.tables() if t.expires_by is not None}


@dataclass(frozen=True)
class Expiring:
    """A month of rows of a table that expires by a time column, with what references them."""

    table: str
    month: date
    #: The rows of the month themselves (not counting the rows that go with them).
    rows: int


async def expiring_due(
    conn: Conn, table: str, time_column: str, keep_months: int, now: datetime | None = None
) -> list[Expiring]:
    """The months of `table`'s rows (by `time_column`, in UTC) that keeping `keep_months` months expires."""
    first_kept = cutoff(now or datetime.now(UTC), keep_months)
    rows = await conn.fetch(
        f"SELECT date_trunc('month', {time_column} AT TIME ZONE 'UTC')::date AS month, count(*) AS n "
        f"FROM {table} WHERE {time_column} < $1::date::timestamp AT TIME ZONE 'UTC' GROUP BY 1 ORDER BY 1",
        first_kept,
    )
    return [Expiring(table, r["month"], r["n"]) for r in rows]


async def _cascades(conn: Conn, table: str) -> list[tuple[str, str]]:
    """(table, column) of each single-column foreign key that references `table` ON DELETE CASCADE."""
    rows = await conn.fetch(
        "SELECT c.conrelid::regclass::text AS child, a.attname FROM pg_constraint c "
        "JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1] "
        "WHERE c.contype = 'f' AND c.confrelid = to_regclass($1) AND c.confdeltype = 'c' "
        "AND array_length(c.conkey, 1) = 1 ORDER BY 1, 2",
        table,
    )
    return [(r["child"], r["attname"]) for r in rows]


async def expire(
    conn: Conn,
    item: Expiring,
    key: str,
    time_column: str,
    *,
    export_dir: Path | None = None,
    dry_run: bool = False,
) -> Dropped:
    """Delete the rows of `item`'s month, and with them (ON DELETE CASCADE) every row that references them:
    rows of the same table that point at them (a nested session goes with its parent) and the tables whose
    foreign keys cascade from it. With `export_dir`, every one of those rows is first written to
    `<export_dir>/<table>/<name>_pYYYY_MM.parquet` and listed in the manifest, in the same REPEATABLE READ
    transaction as the delete: what is exported is exactly what is deleted, or nothing is."""
    started = time.perf_counter()
    month = item.month.isoformat()[:7]
    name = f"{item.table}_p{item.month:%Y_%m}"
    if dry_run:
        return Dropped(item.table, name, month, item.rows, 0, 0.0, None, True, deleted=True)
    following = "(date_trunc('month', $1::date) + interval '1 month')::date::timestamp AT TIME ZONE 'UTC'"
    exported: str | None = None
    async with conn.transaction(isolation="repeatable_read"):
        cascades = await _cascades(conn, item.table)
        inward = [column for child, column in cascades if child == item.table]
        closure = "SELECT {key} FROM {table} WHERE {time} >= $1::date::timestamp AT TIME ZONE 'UTC' AND {time} < {end}"
        ids_sql = closure.format(key=key, table=item.table, time=time_column, end=following)
        if inward:
            links = " OR ".join(f"t.{c} = r.{key}" for c in inward)
            ids_sql = (
                f"WITH RECURSIVE r AS ({ids_sql} UNION SELECT t.{key} FROM {item.table} t JOIN r ON {links}) "
                f"SELECT {key} FROM r"
            )
        ids = [r[0] for r in await conn.fetch(ids_sql, item.month)]
        if export_dir is not None and ids:
            files = []
            for table, column in [(item.table, key), *[(c, col) for c, col in cascades if c != item.table]]:
                stem = f"{table.rpartition('.')[2]}_p{item.month:%Y_%m}"
                path, rows, digest = await _export(
                    conn, table, stem, f"WHERE {column} = ANY($1::uuid[])", (ids,), export_dir / table
                )
                files.append((table, path, rows, digest, await _columns(conn, table)))
            for table, path, rows, digest, columns in files:
                _record(
                    export_dir,
                    {
                        "table": table,
                        "partition": None,
                        "expired_with": f"{item.table} {month}",
                        "month": month,
                        "file": str(path.relative_to(export_dir)),
                        "rows": rows,
                        "bytes": path.stat().st_size,
                        "sha256": digest,
                        "columns": [{"name": n, "type": t} for n, t, _ in columns],
                        "exported_at": datetime.now(UTC).isoformat(),
                    },
                )
            exported = str(export_dir / item.table)
        await conn.execute(f"DELETE FROM {item.table} WHERE {key} = ANY($1::uuid[])", ids)
    return Dropped(
        item.table,
        name,
        month,
        len(ids),
        0,
        time.perf_counter() - started,
        exported,
        deleted=True,
    )


# --- the services' own retention --------------------------------------------------------------------------------

#: How often a service with a retention setting looks for months to drop.
EVERY_S: Final = 3600.0


def service_plan(settings: RetentionSettings, tables: Sequence[str]) -> dict[str, int]:
    """What a service keeps of its own `tables`, those partitioned or expiring by a time column: table -> months
    kept (none when unset)."""
    from commonos.runtime import registry

    declared = {
        t.name: t
        for t in registry.tables()
        if (t.partition_by is not None or t.expires_by is not None) and t.name in tables
    }
    out: dict[str, int] = {}
    for name, table in declared.items():
        keep = settings.model_calls_keep_months if table.accounting else settings.keep_months
        if keep is not None:
            out[name] = keep
    return out


async def run_periodically(
    dsn: str,
    plan: Mapping[str, int],
    export_dir: Path | None,
    stop: Any,
    log: Any,
    every_s: float = EVERY_S,
) -> None:
    """Drop the months `plan` no longer keeps, now and every `every_s`, until `stop` (an asyncio.Event) is set.
    A failure is logged and tried again next time."""
    import asyncio

    from commonos.runtime.postgres import connect

    while not stop.is_set():
        try:
            conn = await connect(dsn, timeout=10)
            try:
                expiring = tables_expiring()
                due_now: list[Partition] = []
                for table, keep in plan.items():
                    if table not in expiring:
                        due_now += await due(conn, [table], keep)
                for item in await run(conn, due_now, export_dir=export_dir):
                    MONTHS_DROPPED.labels(item.table).inc()
                    log.info("retention: dropped %s (%s) in %.2f s", item.partition, item.month, item.seconds)
                for table, keep in plan.items():
                    if table in expiring:
                        key, column = expiring[table]
                        for month in await expiring_due(conn, table, column, keep):
                            done = await expire(conn, month, key, column, export_dir=export_dir)
                            MONTHS_DROPPED.labels(table).inc()
                            log.info(
                                "retention: deleted %s of %s (%s) in %.2f s", done.rows, table, done.month, done.seconds
                            )
            finally:
                await conn.close()
            LAST_RUN.set_to_current_time()
        except Exception as exc:
            log.warning("retention: %s: %s; trying again in %.0f s", type(exc).__name__, exc, every_s)
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except TimeoutError:
            continue
