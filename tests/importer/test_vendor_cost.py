"""The vendor's own cost figure beside ours: Claude Code's ``cost-state`` lines (2.1.x) state the session's
cost so far; the import summary shows the last one per session, our cost, and the difference."""

from __future__ import annotations

import json
import os
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.importer.test_cli import dry_json, run
from tests.importer.transcripts import ClaudeWriter, append_lines


def _cost_state(session_id: str, total: float) -> dict[str, Any]:
    return {"type": "cost-state", "sessionId": session_id, "totalCostUSD": total, "modelUsage": {}}


def _home(tmp_path: Path, costs: list[float]) -> Path:
    home = tmp_path / "claude"
    project = home / "projects" / "-work-demo"
    project.mkdir(parents=True)
    sid = str(uuid.uuid5(uuid.NAMESPACE_URL, "vendor-cost"))
    path = project / f"{sid}.jsonl"
    writer = ClaudeWriter(path, session_id=sid, seed="vendor-cost")
    lines: list[dict[str, Any]] = []
    for number, cost in enumerate(costs):
        lines += [*writer.exchange(f"Step {number}"), _cost_state(sid, cost)]
    append_lines(path, lines)
    quiet = path.with_name("other.jsonl")  # a session without the vendor's figure
    append_lines(quiet, ClaudeWriter(quiet, session_id="other", seed="other").exchange("Hello"))
    old = datetime(2025, 1, 1, tzinfo=UTC).timestamp()
    for file in project.glob("*.jsonl"):
        os.utime(file, (old, old))
    return home


def test_the_summary_shows_the_vendors_cost_beside_ours(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    summary = dry_json(capsys, "claude", _home(tmp_path, [0.0125, 0.05]))
    stated = next(s for s in summary["sessions"] if s["vendor_session_id"] != "other")
    quiet = next(s for s in summary["sessions"] if s["vendor_session_id"] == "other")
    # The last cost-state line is the session's total (each holds the total so far).
    assert Decimal(str(stated["vendor_cost_usd"])) == Decimal("0.05")
    ours = Decimal(str(stated["cost_usd"]))
    assert ours > 0
    assert Decimal(str(stated["cost_difference_usd"])) == ours - Decimal("0.05")
    assert quiet["vendor_cost_usd"] is None and quiet["cost_difference_usd"] is None
    over = summary["vendor_cost"]
    assert over["sessions"] == 1 and Decimal(str(over["vendor_cost_usd"])) == Decimal("0.05")
    assert Decimal(str(over["difference_usd"])) == ours - Decimal("0.05")


def test_the_table_shows_it_too(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out = run(capsys, "claude", str(_home(tmp_path, [0.05])), "--dry-run", "--no-progress")
    assert code == 0
    assert "vendor's cost" in out and "the vendor's own cost figure, for the 1 session(s)" in out


def test_without_cost_lines_there_is_no_vendor_figure(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    home = _home(tmp_path, [0.05])
    for path in home.rglob("*.jsonl"):
        kept = [x for x in path.read_text().splitlines() if json.loads(x).get("type") != "cost-state"]
        path.write_text("\n".join(kept) + "\n")
    summary = dry_json(capsys, "claude", home)
    assert summary["vendor_cost"] is None


def _usage_state(session_id: str, input_tokens: int, output: int, read: int, write: int) -> dict[str, Any]:
    counters = {
        "inputTokens": input_tokens,
        "outputTokens": output,
        "cacheReadInputTokens": read,
        "cacheCreationInputTokens": write,
    }
    return {"type": "cost-state", "sessionId": session_id, "totalCostUSD": 0.01, "modelUsage": {"m": counters}}


def test_usage_the_vendor_counts_beyond_the_transcript_is_shown_apart(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A call Claude Code writes no line for (the /compact summary) is only in its cost-state totals."""
    home = tmp_path / "claude"
    project = home / "projects" / "-work-demo"
    project.mkdir(parents=True)
    sid = str(uuid.uuid5(uuid.NAMESPACE_URL, "beyond"))
    path = project / f"{sid}.jsonl"
    writer = ClaudeWriter(path, session_id=sid, seed="beyond")
    # One exchange: two calls of 4 input, 57 and 9 output, 12,000 cache read and 300 cache write each.
    lines = [*writer.exchange("Step"), _usage_state(sid, 8, 66, 24000, 600)]
    # A second run whose totals started again from zero (a decrease): its count adds to the first.
    lines += [_usage_state(sid, 5, 7, 100, 0)]
    lines += [_usage_state(sid, 15, 27, 1100, 50)]
    append_lines(path, lines)
    summary = dry_json(capsys, "claude", home)
    assert summary["totals"]["invocations"] == 2
    beyond = summary["sessions"][0]["usage_without_transcript_line"]
    assert (beyond["input_tokens"], beyond["output_tokens"], beyond["cache_read_tokens"]) == (15, 27, 1100)
    assert beyond["cache_write_tokens"] == 50
    assert summary["usage_without_transcript_line"]["output_tokens"] == 27
