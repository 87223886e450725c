"""`make bench`: every figure of the performance issue, side by side, from one run on this machine.

    python -m bench.run [--events 1000000] [--quick] [--no-fsync] [--skip PHASE ...]

It starts its own nats-server and PostgreSQL cluster on free ports in a temporary folder (PostgreSQL
with fsync on unless --no-fsync), publishes the event stream once, then measures on that same
stream, each system in a fresh database: the journal-writer as its own process, the naive consumer
and the raw ceiling, `cos replay`, billing, the loop at rest, publish -> visible latency at a fixed
rate, GenAI spans from the OpenTelemetry SDK through the OTLP gateway against publishing the same
events directly (bench/otlp.py), and `cos import claude` against ccusage. It prints a table and writes
bench/out/summary.json.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import itertools
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import asyncpg
import nats.errors
from rich.console import Console

from bench.baselines import naive_consumer, raw_ceiling
from bench.console import ConsolePhase
from bench.imports import Unavailable, copy_corpus, corpus_claude_dir, ensure_ccusage
from bench.latency import measure_latency
from bench.load import StreamStats, publish_stream, realistic_events
from bench.otlp import OtlpPhase
from bench.report import Results, machine_info
from bench.services import (
    BenchError,
    CpuUse,
    Finished,
    ServiceRun,
    batch_totals,
    run_command,
    watch_position,
)
from commonos.journal_writer.schema import CORE_TABLES
from commonos.journal_writer.schema import SCHEMA as CORE_SCHEMA
from commonos.runtime.embedded import NatsServer, PostgresCluster, nats_server_binary
from commonos.runtime.nats import connect as nats_connect
from commonos.runtime.nats import ensure_streams
from commonos.runtime.postgres import apply_schemas
from commonos.runtime.settings import Settings
from tests.harness import cleanup, make_temp_root

REPO: Final = Path(__file__).resolve().parent.parent
MB: Final = 1024 * 1024
#: `make bench` must finish within 15 minutes: repeated runs are dropped when they would not fit.
BUDGET_S: Final = 14 * 60.0
PHASES: Final = (
    "publish",
    "journal-writer",
    "naive",
    "ceiling",
    "replay",
    "billing",
    "loop",
    "latency",
    "otlp",
    "import",
    "console",
)

#: What each phase measures, so a phase that fails marks its figures as skipped with the reason.
PHASE_FIGURES: Final[dict[str, tuple[str, ...]]] = {
    "publish": ("publish_pipelined_events_per_s", "publish_sequential_events_per_s"),
    "journal-writer": ("journal_writer_events_per_s", "journal_writer_peak_rss_mb"),
    "naive": ("naive_consumer_events_per_s",),
    "ceiling": ("raw_ceiling_events_per_s",),
    "replay": ("replay_events_per_s",),
    "billing": (
        "billing_calls_per_s",
        "billing_no_events_calls_per_s",
        "billing_events_vs_none",
        "billing_peak_rss_mb",
    ),
    "loop": ("loop_idle_rss_mb",),
    "latency": ("latency_p50_ms", "latency_p99_ms", "latency_max_ms"),
    "otlp": (
        "otlp_gateway_spans_per_s",
        "otlp_grpc_gateway_spans_per_s",
        "otlp_direct_spans_per_s",
        "otlp_gateway_peak_rss_mb",
        "otlp_grpc_gateway_peak_rss_mb",
    ),
    "import": ("import_dry_run_s", "ccusage_s", "import_full_mb_per_s"),
    "console": (
        "console_list_p95_ms",
        "console_search_p95_ms",
        "console_session_page_p95_ms",
        "console_live_p99_ms",
    ),
}


@dataclass(frozen=True)
class Sizes:
    events: int
    sequential_runs: int
    sequential_events: int
    naive_runs: int
    naive_events: int
    naive_seconds: float
    ceiling_runs: int
    ceiling_events: int
    latency_rate: float
    latency_seconds: float
    latency_warmup_s: float
    import_mb: int
    import_runs: int
    otlp_turns: int
    otlp_calls: int
    otlp_runs: int

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Sizes:
        quick = args.quick
        events = args.events or (50_000 if quick else 1_000_000)
        return cls(
            events=events,
            sequential_runs=3,
            sequential_events=2_000 if quick else 5_000,
            naive_runs=3,
            naive_events=20_000,
            naive_seconds=3.0 if quick else 8.0,
            ceiling_runs=3,
            ceiling_events=min(20_000 if quick else 200_000, events),
            latency_rate=args.latency_rate,
            latency_seconds=5.0 if quick else args.latency_seconds,
            latency_warmup_s=1.0 if quick else 2.0,
            import_mb=20 if quick else 200,
            import_runs=3,
            otlp_turns=500 if quick else 2_000,
            otlp_calls=10,
            otlp_runs=3 if quick else 5,
        )


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.sizes = Sizes.from_args(args)
        self.out = Path(args.out).resolve()
        self.logs = self.out / "logs"
        self.console = Console(stderr=True, highlight=False)
        self.results = Results()
        self.started = time.monotonic()
        self.root = make_temp_root("cos-bench-")
        self.nats = NatsServer(self.root / "nats")
        self.pg = PostgresCluster(self.root / "pg", durable=not args.no_fsync)
        self.stream = StreamStats()
        self.writer_dsn: str | None = None
        self.writer_s = 0.0
        self.failed: dict[str, str] = {}

    def say(self, line: str) -> None:
        elapsed = time.monotonic() - self.started
        self.console.print(f"[{int(elapsed // 60):02d}:{int(elapsed % 60):02d}] {line}", markup=False, soft_wrap=True)

    # --- the run ---------------------------------------------------------------------------------

    async def run(self) -> int:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.results.machine = machine_info()
        self.say(f"servers in {self.root}; logs in {self.logs}")
        try:
            self.nats.start()
            self.pg.start()
            await self.describe_servers()
            steps: dict[str, Callable[[], Awaitable[None]]] = {
                "publish": self.publish,
                "journal-writer": self.journal_writer,
                "naive": self.naive,
                "ceiling": self.ceiling,
                "replay": self.replay,
                "billing": self.billing,
                "loop": self.loop_idle,
                "latency": self.latency,
                "otlp": self.otlp,
                "import": self.imports,
                "console": self.console_phase,
            }
            for name, step in steps.items():
                if name in self.args.skip:
                    self.results.skip(PHASE_FIGURES[name], "skipped with --skip")
                    continue
                if name != "publish" and "publish" in self.failed:
                    self.results.skip(PHASE_FIGURES[name], "the stream could not be published")
                    continue
                await self.phase(name, step)
        finally:
            self.pg.stop()
            self.nats.stop()
            if not self.args.keep:
                cleanup(self.root)
        self.finish()
        return 1 if self.failed else 0

    async def phase(self, name: str, step: Callable[[], Awaitable[None]]) -> None:
        await self.settle()
        self.say(f"--- {name}")
        started = time.monotonic()
        try:
            await step()
        except (
            BenchError,
            OSError,
            asyncpg.PostgresError,
            nats.errors.Error,
            RuntimeError,
            ValueError,
            TimeoutError,
        ) as exc:
            self.failed[name] = f"{type(exc).__name__}: {exc}"
            self.results.skip(PHASE_FIGURES[name], f"the {name} phase failed: {type(exc).__name__}: {exc}"[:300])
            self.say(f"{name} FAILED: {self.failed[name]}")
        self.say(f"{name}: {time.monotonic() - started:.1f} s")

    def finish(self) -> None:
        r = self.results
        r.figures["bench_wall_s"] = round(time.monotonic() - self.started, 1)
        r.machine["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
        r.ratio("journal_writer_vs_raw_ceiling", "journal_writer_events_per_s", "raw_ceiling_events_per_s")
        r.ratio(
            "journal_writer_first_200k_vs_raw_ceiling",
            "journal_writer_first_200k_events_per_s",
            "raw_ceiling_events_per_s",
        )
        r.ratio("journal_writer_vs_naive", "journal_writer_events_per_s", "naive_consumer_events_per_s")
        r.ratio("replay_vs_journal_writer", "replay_events_per_s", "journal_writer_events_per_s")
        r.ratio("publish_pipelined_vs_sequential", "publish_pipelined_events_per_s", "publish_sequential_events_per_s")
        r.ratio("import_dry_run_vs_ccusage", "import_dry_run_s", "ccusage_s")
        r.ratio("otlp_gateway_vs_direct", "otlp_gateway_spans_per_s", "otlp_direct_spans_per_s")
        r.ratio("otlp_grpc_gateway_vs_direct", "otlp_grpc_gateway_spans_per_s", "otlp_direct_spans_per_s")
        summary = self.out / "summary.json"
        r.write(summary)
        Console(width=max(Console().width, 110)).print(r.table())
        met = [t for t in r.targets().values() if t["met"]]
        self.say(f"{len(met)} of {len(r.targets())} targets met; summary in {summary}")
        for name, reason in self.failed.items():
            self.say(f"phase {name} failed: {reason}")

    # --- servers and databases -------------------------------------------------------------------

    async def describe_servers(self) -> None:
        conn = await asyncpg.connect(self.pg.url)
        try:
            m = self.results.machine
            m["postgres"] = await conn.fetchval("SHOW server_version")
            m["fsync"] = await conn.fetchval("SHOW fsync")
            m["synchronous_commit"] = await conn.fetchval("SHOW synchronous_commit")
            m["shared_buffers"] = await conn.fetchval("SHOW shared_buffers")
        finally:
            await conn.close()
        self.results.machine["nats_server"] = _nats_server_version()
        self.say(
            f"PostgreSQL {self.results.machine['postgres']} (fsync {self.results.machine['fsync']}), "
            f"nats-server {self.results.machine['nats_server']}, {self.results.machine['cores']} cores"
        )

    async def fresh_db(self, name: str, schema: bool = False) -> str:
        """An empty database for one measured system (dropped first if an earlier run left it)."""
        admin = await asyncpg.connect(self.pg.url)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
            await admin.execute(f'CREATE DATABASE "{name}"')
        finally:
            await admin.close()
        dsn = self.pg.dsn(name)
        if schema:
            conn = await asyncpg.connect(dsn)
            try:
                await apply_schemas(conn, [CORE_SCHEMA])
            finally:
                await conn.close()
        return dsn

    async def drop_db(self, name: str) -> None:
        admin = await asyncpg.connect(self.pg.url)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()

    async def settle(self) -> None:
        """A checkpoint before each measurement, so none pays for the previous one's dirty pages."""
        if self.pg.running:
            conn = await asyncpg.connect(self.pg.url)
            try:
                await conn.execute("CHECKPOINT")
            finally:
                await conn.close()

    def another_run_fits(self, phase: str, run_s: float) -> bool:
        """Whether one more run of `phase` leaves time for the phases after it (estimated from the writer's)."""
        later = PHASES[PHASES.index(phase) + 1 :]
        estimates = {
            # The ceiling has run at about the writer's pace.
            "ceiling": 3 * self.sizes.ceiling_events * self.writer_s / max(self.stream.events, 1),
            "replay": 1.2 * self.writer_s,
            "billing": 2.4 * self.writer_s,  # six runs, with and without priced-call events
            "loop": 10.0,
            "latency": self.sizes.latency_seconds + self.sizes.latency_warmup_s + 15.0,
            "otlp": 90.0,
            "import": 60.0,
            "console": 60.0 if self.args.quick else 180.0,
        }
        rest = sum(estimates.get(p, 0.0) for p in later if p not in self.args.skip)
        fits = time.monotonic() - self.started + run_s + rest < BUDGET_S
        if not fits:
            self.say(f"{phase}: no further run, to finish within {BUDGET_S / 60:.0f} minutes")
        return fits

    def record_cpu(self, prefix: str, use: CpuUse) -> None:
        """CPU of each process during a measurement, in % of one core: who was the limit."""
        shares = use.percent()
        for who in ("service", "bench", "postgres", "nats-server"):
            if who in shares:
                self.results.figures[f"{prefix}_cpu_{who.replace('-', '_')}_pct"] = shares[who]
        self.say(f"{prefix} CPU, % of one core: " + ", ".join(f"{k} {v}" for k, v in sorted(shares.items())))

    def env(self, dsn: str | None = None) -> dict[str, str]:
        env = {"COS_NATS_URL": self.nats.url, "COS_LOG_LEVEL": "INFO"}
        if dsn is not None:
            env["COS_DATABASE_URL"] = dsn
        return env

    # --- phases ----------------------------------------------------------------------------------

    async def publish(self) -> None:
        s = self.sizes
        nc = await nats_connect(Settings(nats_url=self.nats.url), "cos-bench")
        cpu = CpuUse()
        try:
            js = nc.jetstream()
            await ensure_streams(js)
            self.stream = await publish_stream(
                js,
                realistic_events(s.events, seed=7),
                sequential_runs=s.sequential_runs,
                sequential_events=s.sequential_events,
                say=self.say,
            )
        finally:
            await nc.close()
        self.record_cpu("publish", cpu.stop())
        st, f = self.stream, self.results.figures
        f["stream_events"] = st.events
        f["stream_model_calls"] = len(st.model_call_seqs)
        f["stream_mb"] = round(st.payload_bytes / MB, 1)
        f["publish_pipelined_events_per_s"] = round(st.pipelined_rate)
        f["publish_sequential_runs"] = len(st.sequential_rates)
        self.results.baselines["publish_sequential_events_per_s"] = round(statistics.median(st.sequential_rates))
        if st.duplicates:
            raise BenchError(f"{st.duplicates} events were duplicates: the stream was not empty")
        self.say(
            f"published {st.events:,} events ({st.payload_bytes / MB:,.0f} MB) up to seq {st.last_seq:,}: "
            f"{st.pipelined_rate:,.0f}/s pipelined, {self.results.baselines['publish_sequential_events_per_s']:,}/s "
            f"sequential (median of {len(st.sequential_rates)}); generating them took {st.generate_s:.1f} s"
        )

    async def journal_writer(self) -> None:
        dsn = await self.fresh_db("journal_writer")
        svc = ServiceRun("journal-writer", "commonos.journal_writer", self.env(dsn), self.logs / "journal-writer.log")
        mark = self.sizes.ceiling_events
        cpu = CpuUse()
        svc.start()
        try:
            progress = await watch_position(
                dsn, "journal-writer", self.stream.last_seq, service=svc, marks=(mark,), say=self.say
            )
            cpu.stop({"service": svc.pid})
            peak_kb, last_kb = svc.peak_rss_kb(), svc.rss_kb()
        finally:
            await svc.stop()
        assert progress.first_at is not None and progress.done_at is not None
        f = self.results.figures
        rate = (self.stream.last_seq - progress.first_position) / (progress.done_at - progress.first_at)
        self.writer_s = progress.done_at - svc.started_at
        f["journal_writer_events_per_s"] = round(rate)
        if mark in progress.marks and progress.marks[mark] > progress.first_at:
            f["journal_writer_first_200k_events_per_s"] = round(
                (mark - progress.first_position) / (progress.marks[mark] - progress.first_at)
            )
        f["journal_writer_start_s"] = round(progress.first_at - svc.started_at, 2)
        f["journal_writer_peak_rss_mb"] = round((peak_kb or 0) / 1024, 1)
        f["journal_writer_rss_last_mb"] = round((last_kb or 0) / 1024, 1)
        self.say(
            f"journal-writer: {rate:,.0f} events/s sustained, peak RSS {f['journal_writer_peak_rss_mb']} MB "
            f"(RSS samples {_spread(svc.rss_samples_kb)})"
        )
        self.record_cpu("journal_writer", cpu)
        self.writer_dsn = dsn
        started = time.monotonic()
        conn = await asyncpg.connect(dsn)
        try:
            # Done now, untimed, so that autovacuum does not do it in the middle of a later measurement.
            await conn.execute("VACUUM (ANALYZE)")
        finally:
            await conn.close()
        self.say(f"vacuumed the writer's database in {time.monotonic() - started:.1f} s")

    async def naive(self) -> None:
        s = self.sizes
        rates = []
        for run in range(s.naive_runs):
            if run and not self.another_run_fits("naive", s.naive_seconds + 2):
                break
            name = f"naive_{run}"
            dsn = await self.fresh_db(name, schema=True)
            cpu = CpuUse()
            rate = await naive_consumer(
                self.nats.url, dsn, name=f"bench-naive-{run}", max_events=s.naive_events, max_seconds=s.naive_seconds
            )
            if run == 0:
                self.record_cpu("naive_consumer", cpu.stop())
            await self.drop_db(name)
            rates.append(rate.per_s)
            self.say(
                f"naive consumer run {run + 1}: {rate.events:,} events in {rate.seconds:.1f} s = {rate.per_s:,.0f}/s"
            )
        self.results.baselines["naive_consumer_events_per_s"] = round(statistics.median(rates))
        self.results.figures["naive_consumer_runs"] = len(rates)

    async def ceiling(self) -> None:
        s = self.sizes
        rates = []
        run_s = 0.0
        for run in range(s.ceiling_runs):
            if run and not self.another_run_fits("ceiling", run_s):
                break
            name = f"ceiling_{run}"
            dsn = await self.fresh_db(name, schema=True)
            cpu = CpuUse()
            rate = await raw_ceiling(self.nats.url, dsn, name=f"bench-ceiling-{run}", events=s.ceiling_events)
            run_s = rate.seconds + 2
            if run == 0:
                self.record_cpu("raw_ceiling", cpu.stop())
                for step, took in rate.steps.items():
                    self.results.figures[f"raw_ceiling_{step}_pct"] = round(100 * took / rate.seconds)
            await self.drop_db(name)
            rates.append(rate.per_s)
            split = ", ".join(f"{k} {100 * v / rate.seconds:.0f}%" for k, v in rate.steps.items())
            self.say(
                f"raw ceiling run {run + 1}: {rate.events:,} events in {rate.seconds:.1f} s = {rate.per_s:,.0f}/s "
                f"({split})"
            )
            await self.settle()
        self.results.baselines["raw_ceiling_events_per_s"] = round(statistics.median(rates))
        self.results.figures["raw_ceiling_runs"] = len(rates)
        self.results.figures["raw_ceiling_events"] = s.ceiling_events

    async def replay(self) -> None:
        dsn = await self.fresh_db("replay")
        cpu = CpuUse()
        done = await run_command(
            [sys.executable, "-m", "commonos.cli.main", "replay", "--quiet"],
            self.env(dsn),
            self.logs / "replay.out",
        )
        output = (self.logs / "replay.out").read_text()
        found = re.search(r"replayed (\d+) (?:events|deliveries) .* in ([\d.]+) s", output)
        if done.returncode != 0 or found is None:
            errors = (self.logs / "replay.stderr").read_text(errors="replace")[-2000:]
            raise BenchError(f"cos replay exited {done.returncode}: {output[-500:]}{errors}")
        seconds = float(found.group(2))
        cpu.stop()
        cpu.after["service"] = done.cpu_s
        self.record_cpu("replay", cpu)
        f = self.results.figures
        f["replay_events_per_s"] = round(self.stream.events / seconds)
        f["replay_s"] = round(done.seconds, 1)
        f["replay_peak_rss_mb"] = round(done.peak_rss_kb / 1024, 1)
        self.say(f"cos replay: {output.strip()}; {done.seconds:.1f} s wall, peak RSS {f['replay_peak_rss_mb']} MB")
        if self.writer_dsn is not None:
            ours, theirs = await _row_counts(dsn), await _row_counts(self.writer_dsn)
            if ours != theirs:
                self.say(f"WARNING: replay rows {ours} differ from the live writer's {theirs}")
        await self.drop_db("replay")

    async def billing(self) -> None:
        """Billing over the stream's model calls, with priced-call events (the default: the clock stops when the
        last call's event is published) and without (COS_BILLING_PRICED_EVENTS=off), alternating in the order
        off-on, on-off, off-on, three runs each: medians, and their ratio."""
        seqs = self.stream.model_call_seqs
        if not seqs:
            raise BenchError("the stream holds no model calls")
        rates: dict[bool, list[float]] = {True: [], False: []}
        peaks: list[float] = []
        for run in range(1, 4):
            # Off first, then on first, then off first: a machine warming up (or cooling down) over the phase
            # favours neither mode.
            for priced in (False, True) if run % 2 else (True, False):
                rate, peak_kb, cpu = await self._bill_once(seqs, priced)
                rates[priced].append(rate)
                if priced:
                    peaks.append(peak_kb)
                    self.record_cpu("billing", cpu)
                self.say(
                    f"billing run {run}, priced-call events {'on' if priced else 'off'}: {len(seqs):,} calls, "
                    f"{rate:,.0f}/s, peak RSS {peak_kb / 1024:.1f} MB"
                )
        f = self.results.figures
        on, off = statistics.median(rates[True]), statistics.median(rates[False])
        f["billing_calls_per_s"] = round(on)
        f["billing_no_events_calls_per_s"] = round(off)
        f["billing_events_vs_none"] = round(on / off, 2)
        f["billing_peak_rss_mb"] = round(max(peaks) / 1024, 1)
        self.say(
            f"billing: {on:,.0f} calls/s with priced-call events published, {off:,.0f} without "
            f"(medians of 3): {on / off:.2f}x"
        )

    async def _bill_once(self, seqs: Sequence[int], priced: bool) -> tuple[float, float, CpuUse]:
        """One billing run into a fresh database; calls/s from its first commit until every call is a row (and,
        with `priced`, every call's event is published: the outbox is empty)."""
        dsn = await self.fresh_db("billing")
        env = {**self.env(dsn), "COS_BILLING_PRICED_EVENTS": "on" if priced else "off"}
        svc = ServiceRun("billing", "commonos.billing", env, self.logs / "billing.log")
        cpu = CpuUse()
        svc.start()
        conn = await asyncpg.connect(dsn)
        try:
            progress = await watch_position(
                dsn, "billing", seqs[-1], table="billing_positions", service=svc, say=self.say
            )
            done_at = progress.done_at
            if priced:
                deadline = time.monotonic() + 300
                while await conn.fetchval("SELECT count(*) FROM billing_outbox"):
                    if time.monotonic() > deadline:
                        raise BenchError("billing's priced calls were not all published within 300 s")
                    svc.check_alive()
                    await asyncio.sleep(0.01)
                done_at = time.monotonic()
            cpu.stop({"service": svc.pid})
            peak_kb = svc.peak_rss_kb() or 0
            rows = int(await conn.fetchval("SELECT count(*) FROM model_calls"))
        finally:
            await conn.close()
            await svc.stop()
        assert progress.first_at is not None and done_at is not None
        if rows != len(seqs):
            raise BenchError(f"billing wrote {rows} model_calls rows for {len(seqs)} model calls")
        before_first = bisect.bisect_right(seqs, progress.first_position)
        await self.drop_db("billing")
        return (len(seqs) - before_first) / (done_at - progress.first_at), float(peak_kb), cpu

    async def loop_idle(self) -> None:
        env = {**self.env(self.writer_dsn), "COS_PROFILES_DIR": str(REPO / "profiles")}
        svc = ServiceRun("loop", "commonos.loop", env, self.logs / "loop.log", args=("serve",))
        svc.start()
        try:
            await svc.wait_ready()
            await asyncio.sleep(3.0)
            rss_kb, peak_kb = svc.rss_kb(), svc.peak_rss_kb()
        finally:
            await svc.stop()
        self.results.figures["loop_idle_rss_mb"] = round((rss_kb or 0) / 1024, 1)
        self.say(f"loop at rest: RSS {(rss_kb or 0) / 1024:.0f} MB (peak {(peak_kb or 0) / 1024:.0f} MB)")

    async def latency(self) -> None:
        if self.writer_dsn is None:
            raise BenchError("the journal-writer phase did not leave a caught-up database")
        s = self.sizes
        svc = ServiceRun(
            "journal-writer", "commonos.journal_writer", self.env(self.writer_dsn), self.logs / "latency.log"
        )
        svc.start()
        try:
            await svc.wait_ready()
            await watch_position(self.writer_dsn, "journal-writer", self.stream.last_seq, service=svc, timeout_s=60)
            count = int(s.latency_rate * (s.latency_seconds + s.latency_warmup_s))
            events = list(itertools.islice(realistic_events(count, seed=11), count))
            before = await batch_totals(svc.http_port, "journal-writer")
            result = await measure_latency(
                self.nats.url, self.writer_dsn, events, s.latency_rate, warmup_s=s.latency_warmup_s
            )
            after = await batch_totals(svc.http_port, "journal-writer")
            svc.check_alive()
        finally:
            await svc.stop()
        f = self.results.figures
        f["latency_rate_events_per_s"] = round(result.achieved_rate)
        f["latency_events"] = result.events
        f["latency_p50_ms"] = round(result.p(0.50), 1)
        f["latency_p99_ms"] = round(result.p(0.99), 1)
        f["latency_max_ms"] = round(result.p(1.0), 1)
        f["latency_from_send_p99_ms"] = round(result.p(0.99, from_send=True), 1)
        batches = after.get("batches", 0) - before.get("batches", 0)
        if batches > 0:
            f["latency_writer_batch_events"] = round((after["events"] - before.get("events", 0)) / batches, 1)
            f["latency_writer_batch_ms"] = round(1000 * (after["seconds"] - before.get("seconds", 0)) / batches, 1)
        if result.not_visible:
            raise BenchError(f"{result.not_visible} events were not visible within the wait")
        self.say(
            f"latency at {result.achieved_rate:,.0f} events/s over {result.events:,} events: "
            f"p50 {f['latency_p50_ms']} ms, p99 {f['latency_p99_ms']} ms, max {f['latency_max_ms']} ms "
            f"({result.polls:,} polls); the writer's batches: {f.get('latency_writer_batch_events')} events, "
            f"{f.get('latency_writer_batch_ms')} ms each"
        )

    async def otlp(self) -> None:
        s, f = self.sizes, self.results.figures
        phase = OtlpPhase(self.root, self.logs, self.pg, self.say, s.otlp_turns, s.otlp_calls, self.args.otlp_exporters)
        result = await phase.run(s.otlp_runs, lambda run_s: self.another_run_fits("otlp", run_s))
        f["otlp_spans"] = result.spans
        f["otlp_runs"] = len(result.gateway_s)
        f["otlp_exporters"] = self.args.otlp_exporters
        f["otlp_gateway_spans_per_s"] = round(result.gateway_spans_per_s)
        self.results.baselines["otlp_direct_spans_per_s"] = round(result.direct_spans_per_s)
        f["otlp_gateway_peak_rss_mb"] = round(max(result.gateway_peak_rss_kb) / 1024, 1)
        f["otlp_grpc_gateway_spans_per_s"] = round(result.grpc_spans_per_s)
        f["otlp_grpc_gateway_peak_rss_mb"] = round(max(result.grpc_peak_rss_kb) / 1024, 1)
        self.say(
            f"otlp: gateway {f['otlp_gateway_spans_per_s']:,} spans/s over HTTP, "
            f"{f['otlp_grpc_gateway_spans_per_s']:,} over gRPC, direct "
            f"{self.results.baselines['otlp_direct_spans_per_s']:,} spans/s (medians of {len(result.gateway_s)}); "
            f"gateway peak RSS {f['otlp_gateway_peak_rss_mb']} MB (gRPC {f['otlp_grpc_gateway_peak_rss_mb']} MB)"
        )

    async def imports(self) -> None:
        s, r = self.sizes, self.results
        try:
            projects = corpus_claude_dir(REPO)
        except Unavailable as exc:
            r.skip(PHASE_FIGURES["import"] + ("import_dry_run_vs_ccusage",), str(exc))
            self.say(f"import skipped: {exc}")
            return
        corpus = copy_corpus(projects, self.root / "claude", s.import_mb * MB)
        r.figures["import_corpus_mb"] = round(corpus.bytes / MB, 1)
        self.say(f"corpus: {projects} copied {corpus.copies} times, {corpus.bytes / MB:.0f} MB")
        try:
            ccusage: list[str] | None = ensure_ccusage(self.out / "ccusage")
        except Unavailable as exc:
            ccusage = None
            r.skip(("ccusage_s", "import_dry_run_vs_ccusage"), str(exc))
            self.say(f"ccusage skipped: {exc}")
        cos_import = [
            sys.executable,
            "-m",
            "commonos.cli.main",
            "import",
            "claude",
            str(corpus.root),
            "--format",
            "json",
        ]
        dry_runs: list[float] = []
        ccusage_runs: list[float] = []
        for run in range(s.import_runs):
            if run and not self.another_run_fits("import", 60.0 - 20.0 * run):
                break
            if ccusage is not None:
                done = await run_command(
                    [*ccusage, "claude", "daily", "--json", "--offline"],
                    {"CLAUDE_CONFIG_DIR": str(corpus.root)},
                    self.logs / "ccusage.json",
                )
                _check(done, "ccusage", self.logs / "ccusage.stderr")
                ccusage_runs.append(done.seconds)
            done = await run_command([*cos_import, "--dry-run", "--no-progress"], {}, self.logs / "import-dry-run.json")
            _check(done, "cos import --dry-run", self.logs / "import-dry-run.stderr", ok=(0, 1))
            dry_runs.append(done.seconds)
            self.say(
                f"run {run + 1}: cos import --dry-run {done.seconds:.2f} s"
                + (f", ccusage {ccusage_runs[-1]:.2f} s" if ccusage_runs else "")
            )
        r.figures["import_dry_run_s"] = round(statistics.median(dry_runs), 2)
        r.figures["import_dry_run_mb_per_s"] = round(corpus.bytes / MB / statistics.median(dry_runs), 1)
        r.figures["import_dry_run_runs"] = len(dry_runs)
        if ccusage_runs:
            r.baselines["ccusage_s"] = round(statistics.median(ccusage_runs), 2)
            r.figures["ccusage_runs"] = len(ccusage_runs)
        done = await run_command([*cos_import, "--no-progress"], self.env(), self.logs / "import-full.json")
        _check(done, "cos import", self.logs / "import-full.stderr", ok=(0, 1))
        r.figures["import_full_s"] = round(done.seconds, 2)
        r.figures["import_full_mb_per_s"] = round(corpus.bytes / MB / done.seconds, 1)
        r.figures["import_full_peak_rss_mb"] = round(done.peak_rss_kb / 1024, 1)
        self.say(f"cos import (full): {done.seconds:.1f} s, {r.figures['import_full_mb_per_s']} MB/s")

    async def console_phase(self) -> None:
        phase = ConsolePhase(self.root, self.logs, self.pg, self.say, sessions=10_000 if self.args.quick else 100_000)
        result = await phase.run()
        self.results.figures.update(result.figures)
        self.results.baselines.update(result.baselines)
        for line in result.lines:
            self.say(line)
        f = result.figures
        self.say(
            f"console: list p95 {f['console_list_p95_ms']} ms, search p95 {f['console_search_p95_ms']} ms, "
            f"session page p95 {f['console_session_page_p95_ms']} ms, event-to-browser p99 "
            f"{f['console_live_p99_ms']} ms"
        )


def _nats_server_version() -> str:
    out = subprocess.run([nats_server_binary(), "--version"], capture_output=True, text=True, check=False)
    return out.stdout.strip().removeprefix("nats-server: ")


def _check(done: Finished, what: str, stderr: Path, ok: Sequence[int] = (0,)) -> None:
    if done.returncode not in ok:
        raise BenchError(f"{what} exited {done.returncode}: {stderr.read_text(errors='replace')[-1500:]}")


def _spread(samples_kb: Sequence[int]) -> str:
    if not samples_kb:
        return "none"
    mb = sorted(k / 1024 for k in samples_kb)
    return f"min {mb[0]:.0f}, median {statistics.median(mb):.0f}, max {mb[-1]:.0f} MB over {len(mb)}"


async def _row_counts(dsn: str) -> dict[str, int]:
    conn = await asyncpg.connect(dsn)
    try:
        return {t: int(await conn.fetchval(f"SELECT count(*) FROM {t}")) for t in CORE_TABLES}
    finally:
        await conn.close()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=0, help="events in the stream (1,000,000; --quick 50,000)")
    parser.add_argument("--quick", action="store_true", help="a small smoke run: 50k events, shorter phases")
    parser.add_argument("--no-fsync", action="store_true", help="PostgreSQL with fsync off (not durable)")
    parser.add_argument("--latency-rate", type=float, default=2_000.0, help="events/s of the latency run (2000)")
    parser.add_argument("--latency-seconds", type=float, default=15.0, help="measured seconds of the latency run")
    parser.add_argument("--skip", nargs="*", default=[], choices=PHASES, metavar="PHASE", help=", ".join(PHASES))
    parser.add_argument("--out", default=str(REPO / "bench" / "out"), help="where summary.json and logs go")
    parser.add_argument("--keep", action="store_true", help="keep the servers' temporary folder")
    parser.add_argument(
        "--otlp-exporters", type=int, default=2, help="agents sending spans to the OTLP gateway at once (2)"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    loop_factory = None
    with contextlib.suppress(ImportError):
        import uvloop

        loop_factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(Bench(args).run())


if __name__ == "__main__":
    raise SystemExit(main())
