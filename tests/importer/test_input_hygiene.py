"""Only regular files are read, one bounded line at a time (issue #13, item 6).

A FIFO, a device, a socket or a symlink to one named like a transcript is skipped with a warning that
names it, in a dry run, a full import and a watch; a line longer than the cap is skipped with its file
and line number, without ever being held in memory whole.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import socket
import tracemalloc
import uuid
from pathlib import Path

import pytest

from commonos.accounting.pricing import Pricer
from commonos.importer.cli import SOURCES, Watcher, nats_publisher
from commonos.importer.lines import MAX_LINE_BYTES, iter_lines
from commonos.runtime.settings import Settings
from tests.importer.pipeline import acos
from tests.importer.transcripts import ClaudeWriter, CodexWriter, append_lines, small_claude_home

#: `cos import` must finish well within this, whatever the folder holds.
TIMEOUT_S = 60


def _specials(folder: Path) -> dict[str, Path]:
    """A FIFO, a symlink to /dev/zero, a socket and a symlink to a FIFO in `folder`, named like transcripts."""
    folder.mkdir(parents=True, exist_ok=True)
    made = {
        "fifo": folder / f"{uuid.uuid4()}.jsonl",
        "zero": folder / f"{uuid.uuid4()}.jsonl",
        "socket": folder / f"{uuid.uuid4()}.jsonl",
        "linked fifo": folder / f"{uuid.uuid4()}.jsonl",
    }
    os.mkfifo(made["fifo"])
    made["zero"].symlink_to("/dev/zero")
    # A socket's path must be short: bind through the folder's descriptor.
    folder_fd = os.open(folder, os.O_RDONLY)
    try:
        with socket.socket(socket.AF_UNIX) as server:
            server.bind(f"/proc/self/fd/{folder_fd}/{made['socket'].name}")
    finally:
        os.close(folder_fd)
    made["linked fifo"].symlink_to(made["fifo"])
    return made


def _claude_home_with_specials(tmp_path: Path) -> tuple[Path, dict[str, Path]]:
    home = small_claude_home(tmp_path, sessions=2)
    project = home / "projects" / "-work-demo"
    made = _specials(project)
    # Directly under projects/, and as subagent files, too.
    os.mkfifo(home / "projects" / f"{uuid.uuid4()}.jsonl")
    session = sorted(project.glob("*.jsonl"))[0]
    agents = project / session.stem / "subagents"
    agents.mkdir(parents=True)
    os.mkfifo(agents / "agent-abc.jsonl")
    os.mkfifo(project / "agent-def.jsonl")
    return home, made


@pytest.mark.timeout(TIMEOUT_S)
async def test_fifos_devices_and_sockets_are_skipped_with_a_warning(tmp_path: Path) -> None:
    home, made = _claude_home_with_specials(tmp_path)
    result = await asyncio.wait_for(
        acos("import", "claude", str(home), "--dry-run", "--format", "json", "--no-progress", timeout=TIMEOUT_S),
        TIMEOUT_S,
    )
    assert result.code == 0, result.err
    summary = result.json()
    assert len(summary["sessions"]) == 2 and summary["errors"] == []
    warnings = summary["warnings"]
    assert len(warnings) == len(made) + 3
    for kind, path in made.items():
        assert any(w.startswith(f"{path}: skipped: not a regular file") for w in warnings), kind
    assert any("(a FIFO)" in w for w in warnings) and any("(a symlink to character device)" in w for w in warnings)
    assert any("(a socket)" in w for w in warnings) and any("(a symlink to FIFO)" in w for w in warnings)
    assert any("subagents/agent-abc.jsonl" in w for w in warnings)

    table = await acos("import", "claude", str(home), "--dry-run", "--no-progress", timeout=TIMEOUT_S)
    assert table.code == 0 and table.out.count("warning:") == len(warnings)


@pytest.mark.timeout(TIMEOUT_S)
async def test_a_fifo_named_like_a_session_does_not_hang_a_full_import(tmp_path: Path, nats_url: str) -> None:
    home = small_claude_home(tmp_path, sessions=1)
    fifo = home / "projects" / "-work-demo" / f"{uuid.uuid4()}.jsonl"
    os.mkfifo(fifo)
    codex = tmp_path / "codex" / "sessions" / "2025" / "01" / "01"
    codex.mkdir(parents=True)
    rollout = codex / f"rollout-2025-01-01T00-00-00-{uuid.uuid4()}.jsonl"
    os.mkfifo(rollout)
    for vendor, root, skipped in (("claude", home, fifo), ("codex", tmp_path / "codex", rollout)):
        result = await asyncio.wait_for(
            acos("import", vendor, str(root), "--format", "json", "--no-progress", nats_url=nats_url), TIMEOUT_S
        )
        assert result.code == 0, result.err
        summary = result.json()
        assert summary["warnings"] == [f"{skipped}: skipped: not a regular file (a FIFO)"]
        assert summary["errors"] == []


@pytest.mark.timeout(TIMEOUT_S)
async def test_a_watch_warns_once_per_fifo(tmp_path: Path, nats_url: str) -> None:
    home = small_claude_home(tmp_path, sessions=1)
    said: list[str] = []
    async with nats_publisher(Settings(nats_url=nats_url)) as (publish, max_payload):
        watcher = Watcher(
            SOURCES["claude"], home, Pricer(), publish, max_payload=max_payload, settle_s=0, say=said.append
        )
        await watcher.start()
        fifo = home / "projects" / "-work-demo" / f"{uuid.uuid4()}.jsonl"
        os.mkfifo(fifo)
        await watcher.poll()
        session = next(p for p in (home / "projects" / "-work-demo").glob("*.jsonl") if p != fifo)
        append_lines(session, ClaudeWriter(session, seed="more").exchange("Still watching?"))
        await watcher.poll()
        await watcher.finish()
    warning = f"{fifo}: skipped: not a regular file (a FIFO)"
    assert [line for line in said if line.startswith("warning:")] == [f"warning: {warning}"]
    assert watcher.run.warnings == [warning] and watcher.run.errors == []
    assert watcher.run.published.graph_parts == 2 and watcher.run.published.stored > 0


def test_lines_are_read_one_at_a_time_and_a_long_one_is_skipped() -> None:
    cap = 1024
    data = b'{"a": 1}\n' + b"x" * (100 * cap) + b"\n\r\n" + b"y" * cap + b"\n" + b"z" * (cap + 1)
    warned: list[str] = []
    lines = list(iter_lines(io.BytesIO(data), Path("t.jsonl"), warned.append, max_line_bytes=cap))
    # Numbered as `bytes.splitlines` numbers them: the long line is 2, the empty one 3.
    assert lines == [(1, b'{"a": 1}'), (3, b""), (4, b"y" * cap)]
    limit = f"longer than the {cap}-byte limit for one transcript line"
    assert warned == [
        f"t.jsonl:2: line skipped: it is {100 * cap + 1} bytes, {limit}",
        f"t.jsonl:5: line skipped: it is {cap + 1} bytes, {limit}",
    ]
    assert [n for n, _ in iter_lines(io.BytesIO(b"a\rb\r\nc\n\nd"), Path("t"), warned.append)] == [1, 2, 3, 4, 5]
    assert [x for _, x in iter_lines(io.BytesIO(b"a\rb\r\nc\n\nd"), Path("t"), warned.append)] == (
        b"a\rb\r\nc\n\nd".splitlines()
    )


def test_a_line_far_over_the_cap_never_takes_more_memory_than_the_cap() -> None:
    cap = 1024 * 1024
    big = io.BytesIO(b"{}\n" + b"q" * (50 * cap) + b"\n{}\n")
    warned: list[str] = []
    tracemalloc.start()
    try:
        lines = list(iter_lines(big, Path("big.jsonl"), warned.append, max_line_bytes=cap))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert lines == [(1, b"{}"), (3, b"{}")] and len(warned) == 1 and "big.jsonl:2:" in warned[0]
    # A few chunks of a megabyte at a time, never the 50 MiB line.
    assert peak < 5 * cap, peak


@pytest.mark.timeout(TIMEOUT_S)
async def test_a_line_over_the_cap_is_reported_by_file_and_line(tmp_path: Path) -> None:
    """The real cap (MAX_LINE_BYTES, 64 MiB) through `cos import --dry-run`, for both vendors."""
    home = small_claude_home(tmp_path, sessions=1)
    session = next((home / "projects" / "-work-demo").glob("*.jsonl"))
    claude_line = len(session.read_bytes().splitlines()) + 1
    writer = ClaudeWriter(session, seed="after")
    huge = writer.prompt("x" * (MAX_LINE_BYTES + 10))
    after = writer.exchange("And after the long line?")
    with session.open("a") as handle:
        handle.write(json.dumps(huge) + "\n")
    append_lines(session, after)
    codex = tmp_path / "codex" / "sessions"
    codex.mkdir(parents=True)
    rollout = codex / f"rollout-2025-01-01T00-00-00-{uuid.uuid4()}.jsonl"
    rollout_writer = CodexWriter(rollout)
    first, second = rollout_writer.exchange("first"), rollout_writer.exchange("second")
    append_lines(rollout, first)
    with rollout.open("a") as handle:
        handle.write(json.dumps({"type": "event_msg", "payload": {"message": "y" * (MAX_LINE_BYTES + 1)}}) + "\n")
    append_lines(rollout, second)

    cases = (("claude", home, session, claude_line, 4), ("codex", tmp_path / "codex", rollout, len(first) + 1, 2))
    for vendor, root, path, line, invocations in cases:
        result = await acos("import", vendor, str(root), "--dry-run", "--format", "json", "--no-progress")
        assert result.code == 0, result.err
        summary = result.json()
        (warning,) = summary["warnings"]
        assert warning.startswith(f"{path}:{line}: line skipped: it is ") and "-byte limit" in warning
        assert summary["totals"]["invocations"] == invocations, "the lines after the long one are read"
