"""`make bench-scale`: the growth curve. A database grown through 1M, 5M and 10M messages (or --sizes), measured at
each size; bench/out/scale.json and bench/out/scale.png (each figure against size).

    python -m bench.scale [--sizes 1M,5M,10M] [--writer-events 100000] [--runs 20] [--out bench/out]

It starts its own nats-server and PostgreSQL (fsync on, as `cos up` runs it) in a temporary folder, creates the
database with the schemas `cos up` applies (every registered projection's, `commonos.runtime.registry`) and, when
the tables are partitioned, the monthly partitions of the 18 months (`commonos.runtime.partitions.ensure_range`).
Then, for each size, one step:

1. **Grow**: synthetic rows made by PostgreSQL up to the size's messages (`bench.scale_data` says how and what
   is synthetic), after checking that the disk keeps 20 GB free once they are written (otherwise the run stops
   growing and says so).
2. **The newest part, by the real journal-writer**: `--writer-events` events of new sessions (`tests.factories`
   conversations of 4 turns over the same profiles and tags) published to JetStream, then the journal-writer
   (its own process, `python -m commonos.journal_writer`) started and timed from its first commit to the last
   event: events/s on new events, against a database of that size.
3. VACUUM (ANALYZE), as autovacuum would have done after such a load; sizes of each table and its indexes.
4. **Latencies**, each case run once untimed and `--runs` times timed (median, p95): the specification's three
   "Useful queries" verbatim through asyncpg, and the console's JSON API over HTTP (`python -m commonos.console`,
   signed in as an operator): the session list's first page and the page fifty pages deep, search for a common
   and a rare word, a 40-message session (`/api/sessions/{id}`, a different session each run), the Costs page
   for this month and for the last 90 days.
5. **Dropping the oldest month**: with partitioned tables, the month's partition of each detached and dropped
   as `cos retention` does (`commonos.runtime.retention.run`; `sessions` is not partitioned and keeps its rows);
   on an unpartitioned schema, the month's sessions and every row of theirs deleted and the tables vacuumed.
   Timed; the method is recorded. The next step puts the month's rows back first (the same rows: they derive
   from the session indexes).

Targets, at the largest size against the same run's first step (1M): journal-writer events/s >= 0.9x; session
list p95 <= 100 ms; session page p95 <= 150 ms; search p95 <= 300 ms; Costs p95 <= 200 ms; the seed's "last ten
turns" and "cost per client this month" p95 <= 100 ms; its approvals query (every approval ever) grows no faster
than its result (median time ratio <= rows ratio); dropping a month <= 1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlencode

import aiohttp
import asyncpg
from rich.console import Console
from rich.table import Table

from bench import scale_data as data
from bench.console import pct, signed_in_console, timed_get
from bench.load import publish_stream
from bench.report import machine_info
from bench.services import BenchError, ServiceRun, watch_position
from commonos.billing.days import rebuild_days
from commonos.console.pages.sessions import PAGE_SIZE, encode_cursor
from commonos.proto import events as ev
from commonos.runtime import partitions, registry, retention
from commonos.runtime.embedded import NatsServer, PostgresCluster
from commonos.runtime.nats import connect as nats_connect
from commonos.runtime.nats import ensure_streams
from commonos.runtime.postgres import apply_schemas
from commonos.runtime.settings import Settings
from tests.factories import Clock, conversation
from tests.harness import cleanup, make_temp_root

REPO: Final = Path(__file__).resolve().parent.parent
DB: Final = "scale"
GB: Final = 1_000_000_000
MB: Final = 1024 * 1024
DEFAULT_SIZES: Final = (1_000_000, 5_000_000, 10_000_000)
#: The disk must keep this much free once a step's rows are written.
KEEP_FREE_BYTES: Final = 20 * GB
#: Bytes a message takes with its share of every table and index, until a step has measured it.
FIRST_GUESS_BYTES_PER_MESSAGE: Final = 1_700
#: The session list page measured deep in the list.
DEEP_PAGE: Final = 50

#: The specification's "Useful queries" (seed 003), verbatim.
SEED_QUERIES: Final = {
    "seed_last_ten_turns": """SELECT t.started_at, t.profile_id, t.status, t.depth, s.title
FROM turns t JOIN sessions s ON s.id = t.session_id
ORDER BY t.started_at DESC
LIMIT 10;""",
    "seed_approvals": """SELECT tc.name, tc.args, a.status, a.decided_at
FROM approvals a JOIN tool_calls tc ON tc.id = a.tool_call_id
ORDER BY a.decided_at DESC;""",
    "seed_cost_per_client_this_month": """SELECT tag, sum(cost_usd) AS usd, count(*) AS calls
FROM model_calls, unnest(tags) AS tag
WHERE tag LIKE 'client:%' AND created_at >= date_trunc('month', now())
GROUP BY tag
ORDER BY usd DESC;""",
}

#: Every latency case: its key in scale.json, its label, and its target (p95 at most, ms) if it has one.
CASES: Final[dict[str, tuple[str, float | None]]] = {
    "seed_last_ten_turns": ("seed: the last ten turns", 100),
    "seed_approvals": ("seed: tool calls that needed approval (all)", None),
    "seed_cost_per_client_this_month": ("seed: cost per client this month", 100),
    "list_first_page": ("console: session list, first page", 100),
    "list_deep_page": (f"console: session list, {DEEP_PAGE} pages deep", 100),
    "search_common": (f"console: search {data.COMMON_WORD!r} (common)", 300),
    "search_rare": (f"console: search {data.RARE_WORD!r} (rare)", 300),
    "session_page": (f"console: a {data.MESSAGES_PER_SESSION}-message session", 150),
    "costs_this_month": ("console: Costs, this month", 200),
    "costs_90_days": ("console: Costs, last 90 days", 200),
}
WRITER_RATIO_TARGET: Final = 0.9
DROP_TARGET_S: Final = 1.0
#: Tables dropped child first (a referenced partition is detached after those that reference it).
DROP_ORDER: Final = ("approvals", "tool_calls", "messages", "model_calls", "turns", "sessions")


def parse_sizes(text: str) -> list[int]:
    """'1M,5M,10M' or '1000000,5000000' -> [1000000, 5000000]: increasing message counts."""
    sizes = []
    for part in text.split(","):
        raw = part.strip().replace("_", "").lower()
        if not raw:
            continue
        scale = {"k": 1_000, "m": 1_000_000}.get(raw[-1], 1)
        number = float(raw[:-1]) if scale > 1 else float(raw)
        sizes.append(int(number * scale))
    if not sizes or any(b <= a for a, b in itertools.pairwise(sizes)) or sizes[0] <= 0:
        raise argparse.ArgumentTypeError(f"sizes must be increasing message counts, like 1M,5M,10M: {text!r}")
    return sizes


@dataclass
class Step:
    """What one size measured (scale.json's `steps`)."""

    target_messages: int
    figures: dict[str, Any] = field(default_factory=dict)

    def latency(self, case: str, samples: Sequence[float], **extra: Any) -> None:
        self.figures.setdefault("latency_ms", {})[case] = {
            "median": round(pct(samples, 0.5), 2),
            "p95": round(pct(samples, 0.95), 2),
            "max": round(pct(samples, 1.0), 2),
            "runs": len(samples),
            **extra,
        }


class ScaleBench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.sizes: list[int] = args.sizes
        self.out = Path(args.out).resolve()
        self.logs = self.out / "logs" / "scale"
        self.console = Console(stderr=True, highlight=False)
        self.started = time.monotonic()
        self.root = make_temp_root("cos-bench-scale-")
        self.nats = NatsServer(self.root / "nats")
        self.pg = PostgresCluster(self.root / "pg", durable=True)
        self.span = data.Span.ending(datetime.now(UTC))
        self.rng = random.Random(5)
        self.steps: list[Step] = []
        self.stopped: str | None = None
        self.sessions_made = 0
        self.writer_position = 0
        self.writer_sessions = 0
        self.dropped: tuple[datetime, datetime] | None = None
        self.partitioned = False
        self.result: dict[str, Any] = {}

    def say(self, line: str) -> None:
        elapsed = time.monotonic() - self.started
        self.console.print(f"[{int(elapsed // 60):02d}:{int(elapsed % 60):02d}] {line}", markup=False, soft_wrap=True)

    @property
    def dsn(self) -> str:
        return self.pg.dsn(DB)

    # --- the run ---------------------------------------------------------------------------------

    async def run(self) -> int:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.say(f"servers in {self.root}; logs in {self.logs}; sizes {', '.join(f'{s:,}' for s in self.sizes)}")
        machine = machine_info()
        try:
            self.nats.start()
            self.pg.start()
            await self.create_database(machine)
            nc = await nats_connect(Settings(nats_url=self.nats.url), "cos-bench-scale")
            try:
                await ensure_streams(nc.jetstream())
            finally:
                await nc.close()
            async with signed_in_console(self.root, self.logs, self.nats.url, self.dsn) as (http, console):
                for size in self.sizes:
                    if not await self.room_for(size):
                        break
                    step = Step(size)
                    await self.grow(step)
                    await self.writer_batch(step)
                    await self.vacuum_and_sizes(step)
                    console.check_alive()
                    await self.measure(step, http)
                    await self.drop_oldest_month(step)
                    self.steps.append(step)
                    self.write(machine)
        finally:
            self.pg.stop()
            self.nats.stop()
            if not self.args.keep:
                cleanup(self.root)
        self.write(machine)
        self.summary()
        return 0 if self.steps else 1

    async def create_database(self, machine: dict[str, Any]) -> None:
        admin = await asyncpg.connect(self.pg.url)
        try:
            await admin.execute(f'CREATE DATABASE "{DB}"')
            machine["postgres"] = await admin.fetchval("SHOW server_version")
            machine["fsync"] = await admin.fetchval("SHOW fsync")
            machine["shared_buffers"] = await admin.fetchval("SHOW shared_buffers")
        finally:
            await admin.close()
        machine["nats_server"] = _nats_server_version()
        conn = await asyncpg.connect(self.dsn)
        try:
            await apply_schemas(conn, registry.schemas())
            # Partitioned tables (pg_partitioned_table) are dropped a month at a time; others have their rows deleted.
            self.partitioned = bool(await partitions.partitioned_tables(conn))
            await self.ensure_partitions(conn)
            await data.prepare(conn)
        finally:
            await conn.close()
        self.say(
            f"PostgreSQL {machine['postgres']} (fsync {machine['fsync']}), nats-server {machine['nats_server']}; "
            f"tables {'partitioned by month' if self.partitioned else 'not partitioned'}; sessions over "
            f"{self.span.start:%Y-%m-%d} to {self.span.end:%Y-%m-%d %H:%M} UTC"
        )

    async def ensure_partitions(self, conn: asyncpg.Connection) -> None:
        """The monthly partitions of the 18 months and the next two (the journal-writer's new events), made before
        the rows go in (a month dropped at the last step is made again); nothing on unpartitioned tables."""
        if self.partitioned:
            await partitions.ensure_range(conn, self.span.start, self.span.end + timedelta(days=62))

    # --- 1. growing --------------------------------------------------------------------------------

    def bytes_per_message(self) -> float:
        if not self.steps:
            return float(FIRST_GUESS_BYTES_PER_MESSAGE)
        last = self.steps[-1].figures
        return float(last["bytes"]["total_bytes"]) / max(1, int(last["counts"]["messages"]))

    def messages_now(self) -> int:
        return int(self.steps[-1].figures["counts"]["messages"]) if self.steps else 0

    async def room_for(self, size: int) -> bool:
        """Whether the disk keeps 20 GB free once the step's rows are written; otherwise the run stops growing."""
        free = shutil.disk_usage(self.root).free
        grows = max(0, size - self.messages_now()) * self.bytes_per_message()
        # The month dropped at the last step comes back too.
        grows += self.messages_now() / data.MONTHS * self.bytes_per_message() if self.dropped else 0
        df = (await asyncio.to_thread(_df, self.root)).strip()
        self.say(f"disk: {df.splitlines()[-1] if df else '?'}")
        if free - grows < KEEP_FREE_BYTES:
            self.stopped = (
                f"stopped before {size:,} messages: the disk has {free / GB:.1f} GB free and the step would write "
                f"about {grows / GB:.1f} GB, leaving less than {KEEP_FREE_BYTES / GB:.0f} GB"
            )
            self.say(self.stopped)
            return False
        return True

    async def grow(self, step: Step) -> None:
        sessions = data.sessions_for(step.target_messages)
        first, last = self.sessions_made, max(self.sessions_made, sessions)
        conns = [await asyncpg.connect(self.dsn) for _ in range(2)]
        try:
            await self.ensure_partitions(conns[0])
            started = time.monotonic()
            planned = await data.plan_step(conns[0], self.span, first, last, self.dropped)
            self.say(
                f"--- {step.target_messages:,} messages: making {planned:,} sessions "
                f"({last - first:,} new, {planned - (last - first):,} of the month dropped before)"
            )
            await data.fill_step(conns)
            # billing keeps the calls' daily sums in the calls' own transactions; rows made here get theirs at once
            await rebuild_days(conns[0], self.span.start.date(), self.span.end.date())
            took = time.monotonic() - started
            days = await conns[0].fetchval("SELECT coalesce(sum(calls), 0) FROM model_call_days")
            calls = await conns[0].fetchval("SELECT count(*) FROM model_calls")
            if days != calls:
                raise BenchError(f"model_call_days counts {days} calls, model_calls holds {calls}")
        finally:
            for c in conns:
                await c.close()
        made = planned * data.MESSAGES_PER_SESSION
        self.sessions_made = last
        self.dropped = None
        step.figures["generate"] = {
            "sessions": planned,
            "messages": made,
            "seconds": round(took, 1),
            "seconds_per_million_messages": round(took / made * 1e6, 1) if made else None,
        }
        self.say(
            f"made {made:,} messages with their rows in {took:.1f} s ({took / max(made, 1) * 1e6:.0f} s a million)"
        )

    # --- 2. the journal-writer on new events -----------------------------------------------------------

    def new_events(self, count: int) -> Iterator[ev.Event]:
        """`count` events (about) of new sessions of 4 turns, over the synthetic profiles and clients."""
        clock = Clock(now=datetime.now(UTC) - timedelta(minutes=20))
        made = 0
        while made < count:
            profile = f"profile-{int(data.PROFILES * self.rng.random() ** 2):04d}"
            tags = (f"client:c{self.rng.randrange(data.CLIENTS):02d}",)
            for event in conversation(self.rng, clock, profile_id=profile, tags=tags, turns=data.TURNS):
                made += 1
                yield event
            self.writer_sessions += 1

    async def writer_batch(self, step: Step) -> None:
        nc = await nats_connect(Settings(nats_url=self.nats.url), "cos-bench-scale")
        try:
            stats = await publish_stream(
                nc.jetstream(), list(self.new_events(self.args.writer_events)), sequential_runs=0
            )
        finally:
            await nc.close()
        env = {
            "COS_NATS_URL": self.nats.url,
            "COS_DATABASE_URL": self.dsn,
            "COS_LOG_LEVEL": "INFO",
            # The months are the benchmark's to drop, not a retention setting of the environment's.
            "COS_RETENTION_MONTHS": "",
        }
        svc = ServiceRun("journal-writer", "commonos.journal_writer", env, self.logs / "journal-writer.log")
        svc.start()
        try:
            progress = await watch_position(
                self.dsn,
                "journal-writer",
                stats.last_seq,
                service=svc,
                after=self.writer_position,
                timeout_s=max(600.0, stats.events / 500),
                say=self.say,
            )
        finally:
            await svc.stop()
        assert progress.first_at is not None and progress.done_at is not None
        applied = stats.last_seq - progress.first_position
        took = progress.done_at - progress.first_at
        from_start = (stats.last_seq - self.writer_position) / (progress.done_at - svc.started_at)
        rate = applied / took if applied > 0 and took > 0 else from_start
        step.figures["journal_writer"] = {
            "events": stats.last_seq - self.writer_position,
            "events_per_s": round(rate),
            "events_per_s_from_start": round(from_start),
            "start_to_first_commit_s": round(progress.first_at - svc.started_at, 2),
        }
        self.writer_position = stats.last_seq
        self.say(
            f"journal-writer: {stats.events:,} new events at {rate:,.0f} events/s from its first commit "
            f"({from_start:,.0f}/s counting its start)"
        )

    # --- 3. vacuum, counts and sizes ----------------------------------------------------------------

    async def vacuum_and_sizes(self, step: Step) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:
            started = time.monotonic()
            await conn.execute("VACUUM (ANALYZE)")
            step.figures["vacuum_analyze_s"] = round(time.monotonic() - started, 1)
            counts = {t: int(await conn.fetchval(f"SELECT count(*) FROM {t}")) for t in (*DROP_ORDER[::-1], "profiles")}
            rows = await conn.fetch(
                """
                SELECT CASE n.nspname WHEN 'public' THEN c.relname ELSE n.nspname || '.' || c.relname END AS name,
                       sum(pg_table_size(t.oid))::bigint AS table_bytes,
                       sum(pg_indexes_size(t.oid))::bigint AS index_bytes
                FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                -- A partitioned table's bytes are its partitions'.
                JOIN LATERAL (SELECT c.oid WHERE c.relkind = 'r'
                              UNION ALL SELECT relid FROM pg_partition_tree(c.oid) WHERE c.relkind = 'p') AS t ON true
                WHERE n.nspname IN ('public', 'graph') AND c.relkind IN ('r', 'p') AND NOT c.relispartition
                GROUP BY 1 ORDER BY 1
                """
            )
        finally:
            await conn.close()
        millions = counts["messages"] / 1e6
        tables = {r["name"]: {"table": int(r["table_bytes"] or 0), "index": int(r["index_bytes"] or 0)} for r in rows}
        table_bytes = sum(t["table"] for t in tables.values())
        index_bytes = sum(t["index"] for t in tables.values())
        step.figures["counts"] = counts
        step.figures["bytes"] = {
            "table_bytes": table_bytes,
            "index_bytes": index_bytes,
            "total_bytes": table_bytes + index_bytes,
            "table_bytes_per_million_messages": round(table_bytes / millions) if millions else None,
            "index_bytes_per_million_messages": round(index_bytes / millions) if millions else None,
            "tables": {k: v for k, v in tables.items() if v["table"] + v["index"] > 0},
        }
        step.figures["disk_free_bytes"] = shutil.disk_usage(self.root).free
        self.say(
            f"{counts['messages']:,} messages, {counts['sessions']:,} sessions, {counts['turns']:,} turns, "
            f"{counts['tool_calls']:,} tool calls, {counts['approvals']:,} approvals, "
            f"{counts['model_calls']:,} model calls; tables {table_bytes / MB:,.0f} MB + indexes "
            f"{index_bytes / MB:,.0f} MB ({(table_bytes + index_bytes) / MB / max(millions, 1e-9):,.0f} MB a million "
            f"messages); VACUUM (ANALYZE) {step.figures['vacuum_analyze_s']} s"
        )

    # --- 4. latencies ----------------------------------------------------------------------------------

    async def measure(self, step: Step, http: aiohttp.ClientSession) -> None:
        runs = self.args.runs
        conn = await asyncpg.connect(self.dsn)
        try:
            for case, sql in SEED_QUERIES.items():
                samples, result_rows = [], 0
                for n in range(runs + 1):
                    started = time.perf_counter()
                    result_rows = len(await conn.fetch(sql))
                    if n:
                        samples.append(time.perf_counter() - started)
                step.latency(case, samples, rows=result_rows)
            # The cursor after page 49 (or the deepest page there is, in a small database).
            total = int(step.figures["counts"]["sessions"])
            before = min((DEEP_PAGE - 1) * PAGE_SIZE, max(1, (total - 1) // PAGE_SIZE * PAGE_SIZE))
            deep_page = before // PAGE_SIZE + 1
            row = await conn.fetchrow(
                "SELECT created_at, id FROM sessions ORDER BY created_at DESC, id DESC OFFSET $1 LIMIT 1", before - 1
            )
            if row is None:
                raise BenchError("no sessions")
            deep = encode_cursor(row["created_at"], row["id"])
            # Synthetic sessions of 40 messages, over the whole table; a different one each run.
            sample = max(0.01, min(100.0, 100.0 * 20 * (runs + 1) / max(1, step.figures["counts"]["sessions"])))
            ids = [
                r["id"]
                for r in await conn.fetch(
                    f"SELECT s.id FROM sessions s TABLESAMPLE BERNOULLI ({sample:.4f}) REPEATABLE (7) "
                    "WHERE EXISTS (SELECT 1 FROM messages m WHERE m.session_id = s.id AND m.seq = $1)",
                    data.MESSAGES_PER_SESSION,
                )
            ]
        finally:
            await conn.close()
        self.rng.shuffle(ids)
        if len(ids) < runs + 1:
            raise BenchError(f"only {len(ids)} sessions of {data.MESSAGES_PER_SESSION} messages found")
        paths: dict[str, Callable[[int], str]] = {
            "list_first_page": lambda n: "/api/sessions",
            "list_deep_page": lambda n: "/api/sessions?" + urlencode({"cursor": deep}),
            "search_common": lambda n: "/api/sessions?" + urlencode({"q": data.COMMON_WORD}),
            "search_rare": lambda n: "/api/sessions?" + urlencode({"q": data.RARE_WORD}),
            "session_page": lambda n: f"/api/sessions/{ids[n]}",
            "costs_this_month": lambda n: "/api/costs",
            "costs_90_days": lambda n: "/api/costs?" + urlencode({"since": "90d"}),
        }
        for case, path in paths.items():
            samples = []
            body = b""
            try:
                for n in range(runs + 1):
                    took, body = await timed_get(http, path(n))
                    if n:
                        samples.append(took)
            except (BenchError, aiohttp.ClientError, TimeoutError) as exc:
                # A request the console refused (its statement timeout) or never answered: a figure of its own,
                # not the end of a run of half an hour.
                step.figures.setdefault("latency_ms", {})[case] = {
                    "median": None,
                    "p95": None,
                    "runs": len(samples),
                    "error": f"{type(exc).__name__}: {exc}"[:300],
                }
                self.say(f"{CASES[case][0]} FAILED: {type(exc).__name__}: {exc}"[:400])
                continue
            extra: dict[str, Any] = {}
            if case.startswith(("list", "search")):
                extra["sessions_on_page"] = len(json.loads(body).get("sessions", []))
            if case == "list_deep_page":
                extra["page"] = deep_page
            step.latency(case, samples, **extra)
        lines = [f"{CASES[c][0]}: {_ms(v)}" for c, v in step.figures["latency_ms"].items()]
        self.say("latencies (" + f"{runs} runs each" + "):\n  " + "\n  ".join(lines))

    # --- 5. dropping the oldest month ---------------------------------------------------------------------

    async def drop_oldest_month(self, step: Step) -> None:
        lo, hi = self.span.start, self.span.first_month_end
        conn = await asyncpg.connect(self.dsn)
        try:
            month_messages = int(
                await conn.fetchval(
                    "SELECT count(*) FROM messages m JOIN sessions s ON s.id = m.session_id "
                    "WHERE s.created_at >= $1 AND s.created_at < $2",
                    lo,
                    hi,
                )
            )
            await conn.execute("CHECKPOINT")
            figures: dict[str, Any] = {"month": f"{lo:%Y-%m}", "messages": month_messages}
            try:
                if self.partitioned:
                    figures |= await _drop_partitions(conn, lo)
                else:
                    figures |= await _delete_month(conn, lo, hi)
                self.dropped = (lo, hi)
            except asyncpg.PostgresError as exc:
                figures |= {"seconds": None, "error": f"{type(exc).__name__}: {exc}"[:300]}
                self.say(f"dropping the oldest month FAILED: {figures['error']}")
        finally:
            await conn.close()
        step.figures["drop_oldest_month"] = figures
        if figures.get("seconds") is not None:
            self.say(
                f"dropped {figures['month']} ({month_messages:,} messages) by {figures['method']} in "
                f"{figures['seconds']:.2f} s"
            )

    # --- results ------------------------------------------------------------------------------------------

    def targets(self) -> dict[str, dict[str, Any]]:
        """Each target at the largest size, against the first step (the run's 1M) where it is a ratio."""
        if not self.steps:
            return {}
        first, last = self.steps[0].figures, self.steps[-1].figures
        out: dict[str, dict[str, Any]] = {}
        base_rate, rate = first["journal_writer"]["events_per_s"], last["journal_writer"]["events_per_s"]
        ratio = round(rate / base_rate, 3) if base_rate else None
        out["journal_writer_vs_first_step"] = {
            "target": f">= {WRITER_RATIO_TARGET}",
            "value": ratio,
            "detail": f"{rate:,} / {base_rate:,} events/s",
            "met": ratio is not None and ratio >= WRITER_RATIO_TARGET,
        }
        for case, (_, bound) in CASES.items():
            value = last["latency_ms"][case]["p95"]
            if bound is not None:
                met = value is not None and value <= bound
                out[f"{case}_p95_ms"] = {"target": f"<= {bound:g}", "value": value, "met": met}
        base, now = first["latency_ms"]["seed_approvals"], last["latency_ms"]["seed_approvals"]
        time_ratio = now["median"] / base["median"] if base["median"] and now["median"] is not None else None
        rows_ratio = now["rows"] / base["rows"] if base["rows"] else None
        out["seed_approvals_growth"] = {
            "target": "median time ratio <= result rows ratio",
            "value": round(time_ratio, 2) if time_ratio is not None else None,
            "detail": f"rows ratio {rows_ratio:.2f}" if rows_ratio is not None else "no rows",
            "met": time_ratio is not None and rows_ratio is not None and time_ratio <= rows_ratio,
        }
        drop = last["drop_oldest_month"].get("seconds")
        out["drop_oldest_month_s"] = {
            "target": f"<= {DROP_TARGET_S:g}",
            "value": drop,
            "detail": last["drop_oldest_month"].get("method") or last["drop_oldest_month"].get("error"),
            "met": drop is not None and drop <= DROP_TARGET_S,
        }
        return out

    def write(self, machine: dict[str, Any]) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        machine["load_average_now"] = [round(x, 2) for x in os.getloadavg()]
        self.result = {
            "method": {
                "about": (__doc__ or "").split("\n\n")[0],
                "rows": (data.__doc__ or "").strip(),
                "sizes_requested": self.sizes,
                "writer_events_per_step": self.args.writer_events,
                "runs_per_case": self.args.runs,
                "partitioned": self.partitioned,
                "drop_method": "detach and drop the oldest month's partitions (cos retention)"
                if self.partitioned
                else "delete the month's rows, then VACUUM",
                "span": [self.span.start.isoformat(), self.span.end.isoformat()],
                "shape": {
                    "profiles": data.PROFILES,
                    "months": data.MONTHS,
                    "turns_per_session": data.TURNS,
                    "messages_per_turn": data.MESSAGES_PER_TURN,
                    "words_per_message": [20, 80],
                    "vocabulary": data.VOCABULARY,
                    "tool_calls_per_turn": data.TOOL_CALLS_PER_TURN,
                    "model_calls_per_turn": data.MODEL_CALLS_PER_TURN,
                    "approvals_per_tool_call": round(1 / data.RISKY_EVERY, 4),
                    "common_word": data.COMMON_WORD,
                    "rare_word": data.RARE_WORD,
                },
            },
            "machine": machine,
            "stopped": self.stopped,
            "wall_s": round(time.monotonic() - self.started, 1),
            "steps": [{"target_messages": s.target_messages, **s.figures} for s in self.steps],
            "targets": self.targets(),
        }
        path = self.out / "scale.json"
        path.write_text(json.dumps(self.result, indent=2, default=str) + "\n")
        if self.steps:
            try:
                chart(self.result, self.out / "scale.png")
            except ImportError:
                self.say(
                    "no chart: matplotlib is not installed (make bench-scale installs it: pip install -e '.[bench]')"
                )

    def summary(self) -> None:
        table = Table(title=f"make bench-scale ({self.result['wall_s']:.0f} s)")
        table.add_column("figure")
        for s in self.steps:
            table.add_column(f"{s.figures['counts']['messages'] / 1e6:.2f}M msgs", justify="right")
        table.add_column("target")
        table.add_column("")
        targets = self.result["targets"]

        def add(label: str, values: list[str], key: str | None = None) -> None:
            t = targets.get(key) if key else None
            table.add_row(
                label,
                *values,
                t["target"] if t else "",
                ("met" if t["met"] else "NOT MET") + (f" ({t['value']})" if key and "p95" not in key else "")
                if t
                else "",
            )

        steps = [s.figures for s in self.steps]
        add("generate, s a million messages", [f"{f['generate']['seconds_per_million_messages']}" for f in steps])
        add(
            "journal-writer, new events/s",
            [f"{f['journal_writer']['events_per_s']:,}" for f in steps],
            "journal_writer_vs_first_step",
        )
        add(
            "tables, MB a million messages",
            [f"{f['bytes']['table_bytes_per_million_messages'] / MB:,.0f}" for f in steps],
        )
        add(
            "indexes, MB a million messages",
            [f"{f['bytes']['index_bytes_per_million_messages'] / MB:,.0f}" for f in steps],
        )
        for case, (label, _) in CASES.items():
            add(
                label + ", median / p95 ms",
                [_ms(f["latency_ms"][case], short=True) for f in steps],
                f"{case}_p95_ms" if f"{case}_p95_ms" in targets else None,
            )
        add(
            "  (approvals query: rows)",
            [f"{f['latency_ms']['seed_approvals']['rows']:,}" for f in steps],
            "seed_approvals_growth",
        )
        add(
            "drop the oldest month, s",
            [_seconds(f["drop_oldest_month"].get("seconds")) for f in steps],
            "drop_oldest_month_s",
        )
        Console(width=max(Console().width, 140)).print(table)
        met = sum(1 for t in targets.values() if t["met"])
        self.say(f"{met} of {len(targets)} targets met; {self.out / 'scale.json'}, {self.out / 'scale.png'}")
        if self.stopped:
            self.say(self.stopped)


def _ms(case: dict[str, Any], short: bool = False) -> str:
    """'median 1.2 ms, p95 3.4 ms' ('1.2 / 3.4'), or that it failed."""
    if case["median"] is None:
        return "failed" if short else f"failed ({case.get('error')})"
    return (
        f"{case['median']:.1f} / {case['p95']:.1f}"
        if short
        else f"median {case['median']:.1f} ms, p95 {case['p95']:.1f} ms"
    )


def _df(path: Path) -> str:
    return subprocess.run(["df", "-h", str(path)], capture_output=True, text=True, check=False).stdout


def _seconds(value: float | None) -> str:
    return "failed" if value is None else f"{value:.2f}"


async def _drop_partitions(conn: asyncpg.Connection, month: datetime) -> dict[str, Any]:
    """`cos retention`'s way: the month's partition of every partitioned table (the core's and billing's
    model_calls) detached and dropped (`commonos.runtime.retention.run`), timed. Unpartitioned tables (sessions)
    keep their rows, as with `cos retention`."""
    first = partitions.month_of(month)
    plan = [
        p
        for table in await partitions.partitioned_tables(conn)
        for p in await partitions.list_partitions(conn, table)
        if p.month == first
    ]
    started = time.perf_counter()
    done = await retention.run(conn, plan)
    took = time.perf_counter() - started
    return {
        "method": "detach and drop partitions",
        "seconds": round(took, 3),
        "partitions": {d.partition: round(d.seconds, 3) for d in done},
        "bytes": sum(p.bytes for p in plan),
    }


async def _delete_month(conn: asyncpg.Connection, lo: datetime, hi: datetime) -> dict[str, Any]:
    """Delete the month's sessions and every row of theirs (children first, so no per-row cascade), then VACUUM."""
    started = time.monotonic()
    async with conn.transaction():
        await conn.execute("SET LOCAL session_replication_role = replica")
        await conn.execute(
            "CREATE TEMP TABLE gone ON COMMIT DROP AS "
            "SELECT id FROM sessions WHERE created_at >= $1 AND created_at < $2",
            lo,
            hi,
        )
        await conn.execute("ANALYZE gone")
        await conn.execute(
            "DELETE FROM approvals a USING turns t WHERE a.turn_id = t.id AND t.session_id IN (SELECT id FROM gone)"
        )
        for table in ("tool_calls", "messages", "turns"):
            await conn.execute(f"DELETE FROM {table} WHERE session_id IN (SELECT id FROM gone)")
        await conn.execute("DELETE FROM sessions WHERE id IN (SELECT id FROM gone)")
        await conn.execute("DELETE FROM model_calls WHERE created_at >= $1 AND created_at < $2", lo, hi)
    deleted = time.monotonic() - started
    await conn.execute("VACUUM " + ", ".join(DROP_ORDER))
    took = time.monotonic() - started
    return {"method": "delete and vacuum", "seconds": round(took, 3), "delete_s": round(deleted, 3)}


# --- the chart ------------------------------------------------------------------------------------------


def chart(result: dict[str, Any], path: Path) -> None:
    """One PNG: a subplot per figure, each against the messages in the database (log x)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = result["steps"]
    x = [s["counts"]["messages"] for s in steps]
    panels: list[tuple[str, list[tuple[str, list[float | None]]], float | None]] = [
        (
            "journal-writer, new events/s",
            [("events/s", [s["journal_writer"]["events_per_s"] for s in steps])],
            None,
        ),
        (
            "bytes a million messages (MB)",
            [
                ("tables", [s["bytes"]["table_bytes_per_million_messages"] / MB for s in steps]),
                ("indexes", [s["bytes"]["index_bytes_per_million_messages"] / MB for s in steps]),
            ],
            None,
        ),
    ]
    groups = [
        ("seed: last ten turns", ["seed_last_ten_turns"]),
        ("seed: approvals (all)", ["seed_approvals"]),
        ("seed: cost per client this month", ["seed_cost_per_client_this_month"]),
        ("console: session list", ["list_first_page", "list_deep_page"]),
        ("console: search", ["search_common", "search_rare"]),
        ("console: 40-message session", ["session_page"]),
        ("console: Costs page", ["costs_this_month", "costs_90_days"]),
    ]
    short = {
        "list_first_page": "first page",
        "list_deep_page": f"{DEEP_PAGE} pages deep",
        "search_common": data.COMMON_WORD,
        "search_rare": data.RARE_WORD,
        "costs_this_month": "this month",
        "costs_90_days": "90 days",
    }
    for title, cases in groups:
        lines: list[tuple[str, list[float | None]]] = []
        for case in cases:
            name = short.get(case, "")
            lines.append((f"{name} p95".strip(), [s["latency_ms"][case]["p95"] for s in steps]))
            lines.append((f"{name} median".strip(), [s["latency_ms"][case]["median"] for s in steps]))
        panels.append((title + ", ms", lines, CASES[cases[0]][1]))
    panels.append(
        (
            "drop the oldest month, s",
            [("seconds", [s["drop_oldest_month"].get("seconds") for s in steps])],
            DROP_TARGET_S,
        )
    )
    panels.append(
        (
            "making rows, s a million messages",
            [("s", [s["generate"]["seconds_per_million_messages"] for s in steps])],
            None,
        )
    )
    cols = 3
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.9 * rows), squeeze=False)
    for ax, (title, lines, target) in zip(axes.flat, panels, strict=False):
        colour = -1
        for label, values in lines:
            median = label.endswith("median")
            colour += 0 if median else 1  # a case's median in its p95's colour, dashed
            points = [(a, b) for a, b in zip(x, values, strict=True) if b is not None]
            if points:
                ax.plot(
                    [p[0] for p in points],
                    [p[1] for p in points],
                    "--" if median else "-",
                    color=f"C{colour}",
                    marker="o",
                    markersize=3,
                    label=label,
                )
        if target is not None:
            ax.axhline(target, color="red", linewidth=0.8, linestyle=":", label="target")
        ax.set_xscale("log")
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.set_ylim(bottom=0)
        if len(lines) > 1 or target is not None:
            ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("messages", fontsize=8)
    machine = result["machine"]
    fig.suptitle(
        f"make bench-scale: {machine.get('cores')} cores, PostgreSQL {str(machine.get('postgres', '')).split()[0]}, "
        f"{'partitioned' if result['method']['partitioned'] else 'unpartitioned'} tables",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _nats_server_version() -> str | None:
    from commonos.runtime.embedded import nats_server_binary

    try:
        out = subprocess.run([str(nats_server_binary()), "--version"], capture_output=True, text=True, check=False)
    except OSError:
        return None
    return out.stdout.strip().split()[-1] if out.stdout.strip() else None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale",
        description=(__doc__ or "").split("\n\n")[0],
        epilog=(
            "Example: python -m bench.scale --sizes 100k,300k --writer-events 20000 (a few minutes). "
            "The default sizes take about 40 minutes on 2 cores and about 18 GB of disk."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        default=parse_sizes(os.environ.get("BENCH_SCALE_SIZES") or ",".join(map(str, DEFAULT_SIZES))),
        help="messages at each step, increasing (1M,5M,10M or 1000000,...); default from $BENCH_SCALE_SIZES",
    )
    parser.add_argument(
        "--writer-events",
        type=int,
        default=int(os.environ.get("BENCH_SCALE_WRITER_EVENTS") or 100_000),
        help="events of new sessions the real journal-writer writes at each step",
    )
    parser.add_argument("--runs", type=int, default=20, help="timed runs of each query and request (after one untimed)")
    parser.add_argument("--out", default=str(REPO / "bench" / "out"), help="where scale.json, scale.png and logs go")
    parser.add_argument("--keep", action="store_true", help="keep the servers' folder (the database) afterwards")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return asyncio.run(ScaleBench(args).run())


if __name__ == "__main__":
    sys.exit(main())
