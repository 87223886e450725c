"""``cos import`` without servers: ``--dry-run`` summaries, their JSON shape, and argument errors."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import pytest

from commonos.importer.claude import read_claude
from commonos.importer.cli import register
from commonos.importer.codex import read_codex
from commonos.runtime.args import CliError, Parser
from tests.importer.transcripts import CORPUS, needs_corpus, small_claude_home

TOKEN_KINDS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "cache_write_1h_tokens")


def parse(*argv: str) -> argparse.Namespace:
    parser = Parser(prog="cos")
    register(parser.add_subparsers(dest="command", required=True, parser_class=Parser))
    return parser.parse_args(["import", *argv])


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    args = parse(*argv)
    code = args.handler(args)
    return code, capsys.readouterr().out


def dry_json(capsys: pytest.CaptureFixture[str], vendor: str, path: Path) -> dict[str, Any]:
    code, out = run(capsys, vendor, str(path), "--dry-run", "--format", "json", "--no-progress")
    assert code == 0
    decoded: dict[str, Any] = json.loads(out)
    return decoded


def test_dry_run_json_shape(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    home = small_claude_home(tmp_path, sessions=2)
    summary = dry_json(capsys, "claude", home)
    assert summary["vendor"] == "claude-code" and summary["dry_run"] is True and summary["published"] is None
    assert summary["errors"] == []
    assert len(summary["sessions"]) == 2
    for session in summary["sessions"]:
        assert {"session_id", "vendor_session_id", "project", "branch", "title", "tool_calls", "files_touched"} <= set(
            session
        )
        assert session["project"] == "-work-demo" and session["branch"] == "main"
        assert session["tool_calls"] == {"read": 1} and session["files_touched"] == 1
        (model,) = session["models"]
        assert model["model"] == "claude-sonnet-4-20250514" and model["invocations"] == 2
        assert (model["input_tokens"], model["output_tokens"], model["cache_read_tokens"]) == (8, 66, 24000)
        assert model["cache_write_tokens"] == 600 and model["cache_write_1h_tokens"] == 0
        assert model["total_tokens"] == 8 + 66 + 24000 + 600
        assert isinstance(model["cost_usd"], float | int) and model["cost_usd"] > 0
    (model,) = summary["models"]
    assert model["model"] == "claude-sonnet-4-20250514" and model["invocations"] == 4
    for kind in TOKEN_KINDS:
        assert model[kind] == summary["totals"][kind] == sum(s[kind] for s in summary["sessions"])
    # sonnet-4: $3 input, $15 output, $0.30 cache read, $3.75 cache write per million tokens
    expected = (
        Decimal(16) * 3 + Decimal(132) * 15 + Decimal(48000) * Decimal("0.3") + Decimal(1200) * Decimal("3.75")
    ) / 10**6
    assert Decimal(str(model["cost_usd"])) == expected


def test_dry_run_table_has_sessions_and_models(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    home = small_claude_home(tmp_path, sessions=2)
    code, out = run(capsys, "claude", str(home), "--dry-run", "--no-progress")
    assert code == 0
    assert "Describe the project (0)" in out and "Describe the project (1)" in out
    assert "per model" in out and "claude-sonnet-4-20250514" in out and "total" in out
    assert "dry run: nothing was published" in out


@needs_corpus
def test_dry_run_on_the_corpus_matches_the_adapters(capsys: pytest.CaptureFixture[str]) -> None:
    for vendor, trees in (
        ("claude", list(read_claude(CORPUS / "claude"))),
        ("codex", list(read_codex(CORPUS / "codex"))),
    ):
        summary = dry_json(capsys, vendor, CORPUS / vendor)
        assert len(summary["sessions"]) == len(trees)
        invocations = [m for t in trees for m in t.graph.model_invocations]
        assert summary["totals"]["invocations"] == len(invocations)
        assert summary["totals"]["output_tokens"] == sum(m.output_tokens for m in invocations)
        assert summary["totals"]["cache_read_tokens"] == sum(m.cache_read_tokens for m in invocations)
        assert summary["totals"]["unpriced_invocations"] == 0, "every corpus model has a public price"
        assert {m["model"] for m in summary["models"]} == {m.model for m in invocations}
        assert summary["totals"]["cost_usd"] > 0


def test_argument_errors_are_one_line(tmp_path: Path) -> None:
    args = parse("claude", str(tmp_path / "missing"), "--dry-run")
    with pytest.raises(CliError, match="missing not found: no Claude Code transcripts to import there"):
        args.handler(args)
    args = parse("codex", str(tmp_path), "--dry-run")
    with pytest.raises(CliError, match=f"no Codex transcripts under {tmp_path}: looked for ~/.codex/sessions/"):
        args.handler(args)
    args = parse("codex", str(tmp_path), "--dry-run", "--watch")
    with pytest.raises(CliError, match="--watch"):
        args.handler(args)
    assert parse("claude").path == "~/.claude" and parse("codex").path == "~/.codex"


def test_lines_that_are_not_json_are_skipped(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    home = small_claude_home(tmp_path, sessions=1)
    (home / "projects" / "-work-demo" / "garbage.jsonl").write_text('not json\n{"type": "summary"}\n')
    summary = dry_json(capsys, "claude", home)
    assert len(summary["sessions"]) == 2 and summary["errors"] == []


# ccusage 20.0.24 (`daily --json --offline`) on the same corpus, measured for the README. Codex agrees exactly.
# Claude Code agrees once the 112 lines in which two resumed sessions re-wrote 75 earlier responses (same
# message.id, no requestId) are taken out: ccusage keys responses on message.id + requestId and counts them again.
CCUSAGE_CODEX = (650_436, 123_274, 7_290_368, 0)
CCUSAGE_CLAUDE_WITHOUT_REWRITES = (32_408, 105_160, 28_279_500, 2_595_039)


@needs_corpus
def test_corpus_totals_agree_with_ccusage(capsys: pytest.CaptureFixture[str]) -> None:
    for vendor, expected in (("claude", CCUSAGE_CLAUDE_WITHOUT_REWRITES), ("codex", CCUSAGE_CODEX)):
        totals = dry_json(capsys, vendor, CORPUS / vendor)["totals"]
        kinds = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
        assert tuple(totals[k] for k in kinds) == expected


async def test_reading_in_processes_gives_what_reading_in_one_does(tmp_path: Path) -> None:
    """`--jobs`: the summary, the errors and the events published, in order, do not depend on it."""
    from commonos.accounting.pricing import Pricer
    from commonos.importer.cli import SOURCES, import_files
    from commonos.importer.publish import PublishCounts
    from commonos.proto.events import Event

    home = small_claude_home(tmp_path, sessions=5)
    (home / "projects" / "-work-demo" / "0-not-a-file.jsonl").mkdir()  # read first, and fails

    async def collect(jobs: int) -> tuple[Any, ...]:
        published: list[list[Event]] = []

        async def publish(events: Sequence[Event]) -> PublishCounts:
            published.append(list(events))
            return PublishCounts(events=len(events), stored=len(events))

        dry = await import_files(SOURCES["claude"], home, Pricer(), publish=None, settle_s=0, jobs=jobs)
        run = await import_files(SOURCES["claude"], home, Pricer(), publish=publish, settle_s=0, jobs=jobs)
        assert all(t.imported is True for t in run.trees.values())
        assert all(t.imported is None for t in dry.trees.values()), "a dry run imports nothing"
        imported = {k: msgspec.structs.replace(t, imported=None) for k, t in run.trees.items()}
        assert dry.trees == imported and dry.errors == run.errors
        return list(run.trees.items()), run.errors, run.published, [[e.event_id for e in p] for p in published]

    one = await collect(1)
    assert len(one[0]) == 5 and len(one[1]) == 1 and "0-not-a-file.jsonl" in one[1][0]
    assert len(one[3]) == 5 and all(one[3])
    assert await collect(3) == one
