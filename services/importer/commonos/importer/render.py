"""What ``cos import`` shows: a progress bar while it reads, and the summary (a table, or JSON).

What the transcripts and the servers wrote (titles, paths, projects, model names, reasons, warnings) is printed
as text (`commonos.runtime.cli_support.as_text`): never read as markup, its control characters shown as escapes.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from decimal import Decimal

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table
from rich.text import Text

from commonos.importer.report import ImportSummary, summary_json
from commonos.runtime.cli_support import as_text


@contextlib.contextmanager
def progress_bar(total_bytes: int, enabled: bool) -> Iterator[Callable[[int], None]]:
    console = Console(stderr=True)
    with Progress(
        TextColumn("importing"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not enabled or not console.is_terminal,
        transient=True,
    ) as progress:
        task = progress.add_task("import", total=total_bytes)
        yield lambda done: progress.advance(task, done)
        progress.update(task, completed=total_bytes)


def _n(value: int) -> str:
    return f"{value:,}"


def _usd(value: Decimal, unpriced: int) -> str:
    text = f"${value:,.2f}"
    return f"{text} (+{unpriced} unpriced)" if unpriced else text


def _signed(value: Decimal | None, sign: bool = False) -> str:
    if value is None:
        return ""
    return f"{'+' if sign and value > 0 else ''}{'-' if value < 0 else ''}${abs(value):,.4f}"


def print_table(summary: ImportSummary, console: Console) -> None:
    sessions = Table(title=as_text(f"{summary.vendor} sessions under {summary.root}"), show_lines=False)
    for column in ("started", "session", "project", "calls", "input", "output", "cache read", "cache write"):
        left = column in ("session", "project", "started")
        sessions.add_column(column, justify="left" if left else "right", no_wrap=True, overflow="ellipsis")
    vendor_costs = summary.vendor_cost is not None
    for column in ("cost", *(("vendor's cost", "ours - vendor's") if vendor_costs else ()), "tools", "files"):
        sessions.add_column(column, justify="right")
    for s in summary.sessions:
        title = (s.title or s.vendor_session_id or s.session_id)[:40]
        if s.nested_sessions:
            title += f" (+{s.nested_sessions} sub)"
        if s.imported is False:
            title = "NOT IMPORTED " + title
        sessions.add_row(
            s.started_at.strftime("%Y-%m-%d %H:%M") if s.started_at else "",
            as_text(title),
            as_text((s.project or "")[:32]),
            _n(s.invocations),
            _n(s.input_tokens),
            _n(s.output_tokens),
            _n(s.cache_read_tokens),
            _n(s.cache_write_tokens),
            _usd(s.cost_usd, s.unpriced_invocations),
            *((_signed(s.vendor_cost_usd), _signed(s.cost_difference_usd, sign=True)) if vendor_costs else ()),
            _n(sum(s.tool_calls.values())),
            _n(s.files_touched),
        )
    console.print(sessions)
    models = Table(title="per model")
    columns = ("model", "calls", "input", "output", "of it reasoning", "cache read", "cache write", "of it 1h", "total")
    for column in (*columns, "cost"):
        models.add_column(column, justify="left" if column == "model" else "right")
    for m in [*summary.models, None]:
        line = m if m is not None else summary.totals
        models.add_row(
            as_text(m.model) if m is not None else "total",
            _n(line.invocations),
            _n(line.input_tokens),
            _n(line.output_tokens),
            _n(line.reasoning_tokens),
            _n(line.cache_read_tokens),
            _n(line.cache_write_tokens),
            _n(line.cache_write_1h_tokens),
            _n(line.total_tokens),
            _usd(line.cost_usd, line.unpriced_invocations),
            end_section=m is not None and m is summary.models[-1],
        )
    console.print(models)
    if summary.vendor_cost is not None:
        v = summary.vendor_cost
        console.print(
            f"the vendor's own cost figure, for the {v.sessions} session(s) whose transcript states one: "
            f"{_signed(v.vendor_cost_usd)}; ours for them {_signed(v.cost_usd)} "
            f"(ours - vendor's: {_signed(v.difference_usd, sign=True)})",
            highlight=False,
        )
    unlogged = summary.usage_without_transcript_line
    if unlogged.reports:
        console.print(
            f"usage the vendor's own totals count beyond the calls its transcripts write ({unlogged.reports} "
            f"session(s); calls it writes no line for, not in the totals): {unlogged.input_tokens:,} input, "
            f"{unlogged.output_tokens:,} output, {unlogged.cache_read_tokens:,} cache read, "
            f"{unlogged.cache_write_tokens:,} cache write",
            highlight=False,
        )
    apart = summary.subagent_usage_without_transcript
    if apart.reports:
        console.print(
            f"subagent usage without a transcript (stated by {apart.reports} Task result(s), not model calls, "
            f"not in the totals): {apart.input_tokens:,} input, {apart.output_tokens:,} output, "
            f"{apart.cache_read_tokens:,} cache read, {apart.cache_write_tokens:,} cache write",
            highlight=False,
        )
    if summary.published is not None:
        p = summary.published
        console.print(
            f"published {p.events} events ({p.graph_parts} graph parts, {p.model_calls} model calls): "
            f"{p.stored} new, {p.duplicates} already in the stream"
        )
    elif summary.dry_run:
        console.print("dry run: nothing was published")
    if summary.sessions_not_imported:
        console.print(
            f"{summary.sessions_not_imported} session(s) not imported, not counted in the totals above:",
            highlight=False,
        )
        for s in summary.sessions:
            if s.imported is False:
                name = s.title or s.vendor_session_id or s.session_id
                console.print(as_text(f"  {name} ({s.source_path}): {s.not_imported}"))
    if summary.rows_cut:
        console.print(f"{summary.rows_cut} row(s) cut to fit a message (marked cos_import_cut, with their size)")
    for warning in summary.warnings:
        console.print(Text.assemble(("warning:", "yellow"), " ", as_text(warning)))
    for error in summary.errors:
        console.print(Text.assemble(("error:", "red"), " ", as_text(error)))


def emit(summary: ImportSummary, output_format: str) -> None:
    if output_format == "json":
        sys.stdout.write(summary_json(summary).decode() + "\n")
        sys.stdout.flush()
    else:
        # Piped output is not cut to 80 columns: a table of numbers is no use wrapped.
        print_table(summary, Console(highlight=False, width=None if sys.stdout.isatty() else 200))
