"""The results of one run: a table on the terminal and `bench/out/summary.json`.

    {"figures": {name: value}, "baselines": {name: value}, "ratios": {name: value},
     "machine": {...}, "targets": {name: {"target": ..., "value": ..., "met": bool}}}

A figure that could not be measured is null, and its target says why under "skipped".
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from rich.console import Console
from rich.table import Table

Value = float | int | None


@dataclass(frozen=True)
class Target:
    """`key` (a figure, baseline or ratio) must be `op` `bound`."""

    key: str
    op: Literal[">=", "<=", "<"]
    bound: float
    label: str

    def met(self, value: Value) -> bool:
        if value is None:
            return False
        if self.op == ">=":
            return value >= self.bound
        if self.op == "<=":
            return value <= self.bound
        return value < self.bound

    @property
    def text(self) -> str:
        return f"{self.op} {self.bound:,g}"


TARGETS: Final = (
    Target("journal_writer_vs_raw_ceiling", ">=", 1.0, "journal-writer / raw ceiling"),
    Target("journal_writer_vs_naive", ">=", 8.0, "journal-writer / naive consumer"),
    Target("billing_calls_per_s", ">=", 10_000, "billing, model calls/s (priced-call events published)"),
    Target("billing_events_vs_none", ">=", 0.9, "billing with priced-call events / without"),
    Target("latency_p99_ms", "<=", 100, "publish -> visible p99 at 2,000/s, ms"),
    Target("replay_vs_journal_writer", ">=", 1.0, "replay / journal-writer live"),
    Target("journal_writer_peak_rss_mb", "<", 300, "journal-writer peak RSS, 1M backlog, MB"),
    Target("billing_peak_rss_mb", "<", 300, "billing peak RSS, 1M backlog, MB"),
    Target("loop_idle_rss_mb", "<", 300, "loop RSS (idle, holds no backlog), MB"),
    Target("import_dry_run_vs_ccusage", "<=", 3.0, "import --dry-run time / ccusage time"),
    Target("import_full_mb_per_s", ">=", 20, "full import, MB/s"),
    Target("otlp_gateway_vs_direct", ">=", 0.8, "OTLP gateway / direct publish, spans to rows"),
    Target("otlp_grpc_gateway_vs_direct", ">=", 0.8, "OTLP gateway over gRPC / direct publish, spans to rows"),
    Target("otlp_gateway_peak_rss_mb", "<", 300, "OTLP gateway peak RSS under load, MB"),
    Target("otlp_grpc_gateway_peak_rss_mb", "<", 300, "OTLP gateway peak RSS under load over gRPC, MB"),
    Target("console_list_p95_ms", "<=", 100, "console: session list p95, 100k sessions, ms"),
    Target("console_search_p95_ms", "<=", 300, "console: search p95, 1M messages and imported work, ms"),
    Target(
        "console_session_page_p95_ms", "<=", 150, "console: a session page with its timeline p95 (whole request), ms"
    ),
    Target("console_live_p99_ms", "<=", 500, "console: event-to-browser p99, ms"),
    Target("console_browser_live_p99_ms", "<=", 500, "console: event-to-browser in Chromium (timeline drawn) p99, ms"),
    Target("bench_wall_s", "<", 900, "whole benchmark, s"),
)

#: Label and unit of each figure, baseline and ratio, in the table's order.
LABELS: Final[dict[str, str]] = {
    "stream_events": "events in the stream",
    "stream_model_calls": "of them model_call_completed",
    "stream_mb": "stream payload, MB",
    "publish_pipelined_events_per_s": "publish pipelined, events/s",
    "publish_sequential_events_per_s": "publish sequential (baseline, median), events/s",
    "publish_pipelined_vs_sequential": "pipelined / sequential",
    "journal_writer_events_per_s": "journal-writer sustained, events/s",
    "journal_writer_first_200k_events_per_s": "journal-writer over the first 200k, events/s",
    "journal_writer_start_s": "journal-writer start to first commit, s",
    "raw_ceiling_events_per_s": "raw ceiling (baseline, median, first 200k), events/s",
    "naive_consumer_events_per_s": "naive consumer (baseline, median), events/s",
    "journal_writer_vs_raw_ceiling": "journal-writer / raw ceiling",
    "journal_writer_first_200k_vs_raw_ceiling": "journal-writer first 200k / raw ceiling",
    "journal_writer_vs_naive": "journal-writer / naive consumer",
    "journal_writer_peak_rss_mb": "journal-writer peak RSS, MB",
    "journal_writer_rss_last_mb": "journal-writer RSS at the end of the backlog, MB",
    "replay_events_per_s": "cos replay into empty tables, events/s",
    "replay_s": "cos replay, s (wall, process start included)",
    "replay_peak_rss_mb": "cos replay peak RSS, MB",
    "replay_vs_journal_writer": "replay / journal-writer live",
    "billing_calls_per_s": "billing, model calls/s",
    "billing_peak_rss_mb": "billing peak RSS, MB",
    "loop_idle_rss_mb": "loop RSS, idle, MB",
    "latency_rate_events_per_s": "latency run: achieved rate, events/s",
    "latency_events": "latency run: events counted",
    "latency_p50_ms": "publish -> visible p50, ms",
    "latency_p99_ms": "publish -> visible p99, ms",
    "latency_max_ms": "publish -> visible max, ms",
    "latency_from_send_p99_ms": "send -> visible p99, ms",
    "latency_writer_batch_events": "latency run: writer's events per batch",
    "latency_writer_batch_ms": "latency run: writer's ms per batch",
    "import_corpus_mb": "import corpus, MB",
    "import_dry_run_s": "cos import --dry-run, s (median)",
    "import_dry_run_mb_per_s": "cos import --dry-run, MB/s",
    "ccusage_s": "ccusage claude daily --json --offline (baseline, median), s",
    "import_dry_run_vs_ccusage": "import --dry-run time / ccusage time",
    "import_full_s": "cos import (full, to NATS), s",
    "import_full_mb_per_s": "cos import (full), MB/s",
    "import_full_peak_rss_mb": "cos import (full) peak RSS, MB",
    "otlp_spans": "OTLP: spans per run (invoke_agent + chat)",
    "otlp_gateway_spans_per_s": "OTLP: SDK exporter -> gateway -> rows, spans/s (median)",
    "otlp_direct_spans_per_s": "OTLP: the same events published directly (baseline, median), spans/s",
    "otlp_gateway_vs_direct": "OTLP gateway / direct publish",
    "otlp_grpc_gateway_spans_per_s": "OTLP: SDK gRPC exporter -> gateway -> rows, spans/s (median)",
    "otlp_grpc_gateway_vs_direct": "OTLP gateway over gRPC / direct publish",
    "otlp_grpc_gateway_peak_rss_mb": "OTLP gateway peak RSS over gRPC, MB",
    "otlp_gateway_peak_rss_mb": "OTLP gateway peak RSS, MB",
    "otlp_runs": "runs: OTLP gateway and direct (n each)",
    "otlp_exporters": "OTLP: exporter processes sending at once",
    "console_sessions": "console: sessions loaded",
    "console_messages": "console: messages loaded",
    "console_imported_sessions": "console: imported sessions loaded (session graph)",
    "console_imported_texts": "console: imported prompts and replies loaded",
    "console_load_s": "console: load (COPY, indexes, VACUUM ANALYZE), s",
    "console_list_p50_ms": "console: session list p50, ms",
    "console_list_p95_ms": "console: session list p95, ms",
    "console_list_max_ms": "console: session list max, ms",
    "console_list_direct_p95_ms": "console: the list's queries directly (baseline) p95, ms",
    "console_list_requests": "console: list requests timed (n)",
    "console_list_by_cost_p95_ms": "console: session list sorted by cost p95 (in the list's), ms",
    "console_search_p50_ms": "console: search p50, ms",
    "console_search_p95_ms": "console: search p95, ms",
    "console_search_max_ms": "console: search max, ms",
    "console_search_direct_p95_ms": "console: the search queries directly (baseline) p95, ms",
    "console_search_requests": "console: search requests timed (n)",
    "console_session_page_p50_ms": "console: session page p50, ms",
    "console_session_page_p95_ms": "console: session page p95, ms",
    "console_session_page_max_ms": "console: session page max, ms",
    "console_session_direct_p95_ms": "console: load_session directly (baseline) p95, ms",
    "console_session_page_server_mean_ms": "console: session page, server's own time, mean, ms",
    "console_session_page_server_within_200ms_pct": "console: session pages served within 200 ms, %",
    "console_session_pages": "console: session pages timed (n)",
    "console_live_p50_ms": "console: event-to-browser p50, ms",
    "console_live_p99_ms": "console: event-to-browser p99, ms",
    "console_live_max_ms": "console: event-to-browser max, ms",
    "console_live_events": "console: live events timed (n)",
    "console_timeline_page_p50_ms": "console: session page until its timeline is drawn, in Chromium, p50, ms",
    "console_timeline_page_p95_ms": "console: session page until its timeline is drawn, in Chromium, p95, ms",
    "console_browser_live_p50_ms": "console: event-to-browser in Chromium p50, ms",
    "console_browser_live_p99_ms": "console: event-to-browser in Chromium p99, ms",
    "console_browser_live_max_ms": "console: event-to-browser in Chromium max, ms",
    "console_browser_live_events": "console: events timed in Chromium (n)",
    "console_peak_rss_mb": "console: peak RSS, MB",
    "bench_wall_s": "whole benchmark, s",
    "publish_sequential_runs": "runs: sequential publish (n)",
    "naive_consumer_runs": "runs: naive consumer (n)",
    "raw_ceiling_runs": "runs: raw ceiling (n)",
    "raw_ceiling_events": "raw ceiling: events per run",
    "import_dry_run_runs": "runs: cos import --dry-run (n)",
    "ccusage_runs": "runs: ccusage (n)",
}


@dataclass
class Results:
    figures: dict[str, Value] = field(default_factory=dict)
    baselines: dict[str, Value] = field(default_factory=dict)
    ratios: dict[str, Value] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    #: Figure name -> why it is missing.
    skipped: dict[str, str] = field(default_factory=dict)

    def value(self, key: str) -> Value:
        for group in (self.figures, self.baselines, self.ratios):
            if key in group:
                return group[key]
        return None

    def ratio(self, name: str, numerator: str, denominator: str) -> None:
        top, bottom = self.value(numerator), self.value(denominator)
        self.ratios[name] = round(top / bottom, 3) if top is not None and bottom else None
        if self.ratios[name] is None:
            reasons = [self.skipped[k] for k in (numerator, denominator) if k in self.skipped]
            if reasons:
                self.skipped[name] = "; ".join(reasons)

    def skip(self, names: tuple[str, ...], reason: str) -> None:
        for name in names:
            self.skipped.setdefault(name, reason)

    def targets(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for t in TARGETS:
            value = self.value(t.key)
            entry: dict[str, Any] = {"target": t.text, "value": value, "met": t.met(value)}
            if value is None:
                entry["skipped"] = self.skipped.get(t.key, "not measured")
            out[t.key] = entry
        return out

    def summary(self) -> dict[str, Any]:
        return {
            "figures": self.figures,
            "baselines": self.baselines,
            "ratios": self.ratios,
            "machine": self.machine,
            "targets": self.targets(),
        }

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.summary(), indent=2) + "\n")

    def table(self) -> Table:
        targets = {t.key: t for t in TARGETS}
        table = Table(title="CommonOS events benchmark")
        table.add_column("figure")
        table.add_column("value", justify="right")
        table.add_column("target", justify="right")
        table.add_column("met")
        keys = [k for k in LABELS if self.value(k) is not None or k in targets or k in self.skipped]
        keys += [k for g in (self.figures, self.baselines, self.ratios) for k in g if k not in LABELS]
        for key in keys:
            value = self.value(key)
            target = targets.get(key)
            if value is None:
                shown = f"skipped: {self.skipped[key]}" if key in self.skipped else "not measured"
            else:
                shown = _fmt(value)
            met = "" if target is None else ("met" if target.met(value) else "NOT MET")
            style = "red" if met == "NOT MET" else ("green" if met == "met" else None)
            table.add_row(_label(key), shown, target.text if target else "", met, style=style)
        return table

    def print(self, console: Console) -> None:
        console.print(self.table())


def _label(key: str) -> str:
    if key in LABELS:
        return LABELS[key]
    found = re.fullmatch(r"(.+)_cpu_(.+)_pct", key)
    if found:
        who = {"service": "the service", "bench": "the bench process"}.get(found.group(2), found.group(2))
        return f"{found.group(1).replace('_', ' ')}: CPU of {who.replace('_', '-')}, % of a core"
    found = re.fullmatch(r"raw_ceiling_(fetch|plan|write|ack)_pct", key)
    if found:
        return f"raw ceiling: time in {found.group(1)}, %"
    return key


def _fmt(value: float | int) -> str:
    if isinstance(value, int):
        return f"{value:,}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:,.2f}"


def _first_line(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = (out.stdout or out.stderr).strip().splitlines()
    return lines[0] if lines else None


def machine_info() -> dict[str, Any]:
    """The machine: cores, memory, CPU model, OS and Python; servers' versions are added by the run."""
    cpu = None
    try:
        found = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.MULTILINE)
        cpu = found.group(1).strip() if found else None
    except OSError:
        pass
    memory_mb = None
    try:
        found = re.search(r"^MemTotal:\s*(\d+) kB", Path("/proc/meminfo").read_text(), re.MULTILINE)
        memory_mb = int(found.group(1)) // 1024 if found else None
    except OSError:
        pass
    return {
        "cores": os.cpu_count(),
        "memory_mb": memory_mb,
        "cpu_model": cpu or platform.processor() or None,
        "os": platform.platform(),
        "python": platform.python_version(),
        "node": _first_line(["node", "--version"]),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }
