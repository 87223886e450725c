"""What `cos` prints that it did not write (titles, paths, model names, reasons, consumer names, server answers)
is printed as text: rich markup in it is shown as written, never read as markup (a `[/x]` made the commands
fail after their work was done), and terminal control characters in it are shown as escapes, never sent to
the terminal. The commands run as a user runs them (subprocesses), on real servers.
"""

from __future__ import annotations

import csv
import io
import os
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import nats
import pytest
from rich.console import Console

from commonos.proto.events import ModelCallCompleted, encode_event
from commonos.proto.ids import new_id
from commonos.proto.subjects import EVENTS_STREAM, subject_for
from commonos.runtime.cli_support import shown
from commonos.runtime.dlq import dead_letter
from commonos.runtime.nats import ensure_streams
from tests.importer.pipeline import acos, cos, wait_stored, writers
from tests.importer.transcripts import ClaudeWriter, append_lines

#: Session titles (a transcript's summary) that rich would read as markup, and one with terminal escapes.
TITLES = (
    "Fix the [/api/v1] route handler",
    "[bold]not bold[/bold] and [red]not red",
    "[link=http://evil.example]click[/link]",
    "ring \x1b]0;owned\x07 and \x1b[2J clear",
)
#: A model name and a project folder of the same kind.
MODEL = "[red]claude[/x]"
PROJECT = "-work-[red]demo[bold]"  # a folder name: no slash
#: Hostile text as it must appear, escapes made visible.
SHOWN = (*TITLES[:3], "ring \\x1b]0;owned\\x07 and \\x1b[2J clear", MODEL, PROJECT)


@pytest.fixture(autouse=True)
def wide(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Wide enough that no cell of these tables is folded or cut: the text is checked whole."""
    monkeypatch.setenv("COLUMNS", "400")
    yield


def hostile_claude_home(into: Path) -> Path:
    """A ~/.claude whose sessions are titled with `TITLES`, in a project folder named `PROJECT`, one of them
    calling a model named `MODEL`."""
    home = into / "claude-home"
    project = home / "projects" / PROJECT
    project.mkdir(parents=True)
    for number, title in enumerate(TITLES):
        session_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"hostile-{number}"))
        path = project / f"{session_id}.jsonl"
        writer = ClaudeWriter(path, session_id=session_id, seed=f"hostile{number}")
        lines = writer.exchange(f"Prompt {number}")
        if number == 0:
            lines.append(
                writer.response(
                    f"msg_hostile_model_{number}",
                    [{"type": "text", "text": "ok"}],
                    output_tokens=3,
                    stop_reason="end_turn",
                    model=MODEL,
                )
            )
        lines.append({"type": "summary", "summary": title, "leafUuid": lines[-1]["uuid"]})
        append_lines(path, lines)
        old = datetime(2025, 1, 1, tzinfo=UTC).timestamp()
        os.utime(path, (old, old))
    return home


def assert_shown_as_text(out: str, *expected: str) -> None:
    for text in expected:
        assert text in out, (text, out)
    assert "\x1b" not in out and "\x07" not in out, "a control character went to the terminal"


def test_import_dry_run_prints_titles_as_text(tmp_path: Path) -> None:
    home = hostile_claude_home(tmp_path)
    run = cos("import", "claude", str(home), "--dry-run", "--no-progress", "--jobs", "1")
    assert (run.code, run.err) == (0, ""), run.err[-2000:]
    assert_shown_as_text(run.out, *SHOWN, str(home))
    assert "dry run: nothing was published" in run.out


async def test_import_prints_titles_as_text_and_its_calls_are_stored(
    tmp_path: Path, nats_url: str, database_url: str
) -> None:
    home = hostile_claude_home(tmp_path)
    async with writers(nats_url, database_url):
        run = await acos("import", "claude", str(home), "--no-progress", "--jobs", "1", nats_url=nats_url)
        assert (run.code, run.err) == (0, ""), run.err[-2000:]
        assert_shown_as_text(run.out, *SHOWN)
        assert "published" in run.out
        # Two calls per exchange, and the one of MODEL.
        await wait_stored(nats_url, database_url, 2 * len(TITLES) + 1)


async def dead_letter_reason(nats_url: str, reason: str, consumer: str = "billing") -> None:
    """A model call dead-lettered by `consumer` with `reason`."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        event = ModelCallCompleted(
            profile_id="default",
            session_id=new_id(),
            provider="openai",
            model=MODEL,
            occurred_at=datetime.now(UTC),
        )
        ack = await js.publish(subject_for(event), encode_event(event), stream=EVENTS_STREAM)
        sub = await js.pull_subscribe(subject_for(event), durable=None, stream=EVENTS_STREAM)
        (msg,) = await sub.fetch(1, timeout=5)
        await dead_letter(js, msg, reason, consumer, ack.seq, nc=nc)
    finally:
        await nc.close()


async def test_dlq_list_prints_reasons_as_text(nats_url: str, database_url: str) -> None:
    await dead_letter_reason(nats_url, "bad [/x] and [red]not red[/red] \x1b[2J", "[bold]billing")
    run = await acos("dlq", "list", nats_url=nats_url, database_url=database_url)
    assert (run.code, run.err) == (0, ""), run.err[-2000:]
    assert_shown_as_text(run.out, "bad [/x] and [red]not red[/red] \\x1b[2J", "[bold]billing")
    # As CSV, a reason a spreadsheet would run as a formula is quoted as the cost CSV's cells are.
    await dead_letter_reason(nats_url, '=HYPERLINK("http://evil","x")')
    run = await acos("dlq", "list", "--format", "csv", nats_url=nats_url, database_url=database_url)
    assert run.code == 0, run.err[-2000:]
    rows = list(csv.reader(io.StringIO(run.out)))
    assert '\'=HYPERLINK("http://evil","x")' in [row[-1] for row in rows], rows


async def test_status_prints_consumer_names_and_filters_as_text(nats_url: str, database_url: str) -> None:
    from nats.js.api import ConsumerConfig

    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        config = ConsumerConfig(durable_name="[red]sub[bold]", filter_subject="cos.events.[/x].>")
        await js.add_consumer(EVENTS_STREAM, config)
    finally:
        await nc.close()
    run = await acos("status", nats_url=nats_url, database_url=database_url)
    assert "Traceback" not in run.err, run.err[-2000:]
    assert_shown_as_text(run.out, "[red]sub[bold]", "cos.events.[/x].>")


async def test_report_cost_prints_model_names_and_tags_as_text(database_url: str) -> None:
    from commonos.accounting.pricing import Pricer
    from commonos.billing.days import insert_calls
    from commonos.billing.projection import build_row
    from commonos.billing.service import billing_schemas
    from commonos.runtime.postgres import apply_schemas, connect

    call = ModelCallCompleted(
        profile_id="default",
        session_id=new_id(),
        provider="openai",
        model="[red]m\x1b[2J",
        occurred_at=datetime.now(UTC),
        tags=("client:[bold]\x1b]0;owned\x07",),
    )
    conn = await connect(database_url)
    try:
        await apply_schemas(conn, billing_schemas())
        await insert_calls(conn, [build_row(call, Pricer())])
    finally:
        await conn.close()
    for group_by, expected in (("model", "[red]m\\x1b[2J"), ("tag:client", "client:[bold]\\x1b]0;owned\\x07")):
        run = await acos(
            "report",
            "cost",
            "--since",
            "0001-01-01",
            "--group-by",
            group_by,
            database_url=database_url,
            nats_url="nats://127.0.0.1:1",
        )
        assert (run.code, run.err) == (0, ""), run.err[-2000:]
        assert_shown_as_text(run.out, expected)


def test_an_error_line_shows_control_characters_as_escapes(tmp_path: Path) -> None:
    missing = tmp_path / "gone \x1b[2J [/x]"
    run = cos("import", "claude", str(missing), "--dry-run")
    assert run.code == 2
    assert_shown_as_text(run.err, f"{tmp_path}/gone \\x1b[2J [/x]")


def _printed(render: object) -> str:
    console = Console(file=io.StringIO(), width=400, color_system=None)
    render(console)  # type: ignore[operator]
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(out, str)
    return out


def test_up_and_demo_tables_print_what_they_show_as_text(tmp_path: Path) -> None:
    from commonos.cli.demo import print_results
    from commonos.cli.up import Component, System
    from commonos.runtime.settings import Settings

    system = System(Settings.from_env())
    system.components = [Component("[red]nats", "nats://[/x]:1", None, "failed: [bold]\x1b[2J")]
    out = _printed(system.print_state)
    assert_shown_as_text(out, "[red]nats", "nats://[/x]:1", "failed: [bold]\\x1b[2J")
    rows = {"[/x] sessions": [{"title": TITLES[0], "model": MODEL}]}
    out = _printed(lambda console: print_results(console, rows))  # type: ignore[arg-type]
    assert_shown_as_text(out, "[/x] sessions", TITLES[0], MODEL)


def test_shown_makes_control_characters_visible() -> None:
    assert shown("a\x1b[31mb\x07c\x9bd\x7fe\rf") == "a\\x1b[31mb\\x07c\\x9bd\\x7fe\\x0df"
    assert shown("lines\nand\ttabs stay, [red] too, ünïcödé too") == "lines\nand\ttabs stay, [red] too, ünïcödé too"
    assert shown(3) == "3"
