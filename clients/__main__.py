"""``python -m clients``: record the real CLIs against the fake model, or diff two recordings' formats."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from clients import CLAUDE_CODE_VERSION, CODEX_VERSION, FIXTURES
from clients.formatdiff import diff
from clients.gateway import check
from clients.run import previous_version, record
from clients.scenarios import CLAUDE, CODEX


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m clients",
        description="Ground truth for the importer: run the real Claude Code and Codex CLIs (from npm) "
        "against a local fake model, write redacted transcripts and the server's usage log to "
        f"{FIXTURES.relative_to(FIXTURES.parents[2])}/<cli>-<version>/, and print the format diff "
        "against the previous version's fixtures.",
    )
    sub = parser.add_subparsers(dest="command")
    rec = sub.add_parser("record", help="install the CLIs, run every scenario, write the fixtures (the default)")
    rec.add_argument("--claude-code-version", default=CLAUDE_CODE_VERSION, help="default %(default)s")
    rec.add_argument("--codex-version", default=CODEX_VERSION, help="default %(default)s")
    rec.add_argument("--cli", action="append", choices=[CLAUDE, CODEX], help="only this CLI (repeatable)")
    rec.add_argument("--scenario", action="append", help="only this scenario (repeatable)")
    gate = sub.add_parser(
        "gateway",
        help="run every scenario with the CLIs' telemetry sent to the OTLP gateway of a temporary `cos up`, then "
        "import their transcripts: billing must hold each call the fake server answered once, with its usage",
    )
    gate.add_argument("--claude-code-version", default=CLAUDE_CODE_VERSION, help="default %(default)s")
    gate.add_argument("--codex-version", default=CODEX_VERSION, help="default %(default)s")
    gate.add_argument("--cli", action="append", choices=[CLAUDE, CODEX], help="only this CLI (repeatable)")
    gate.add_argument("--scenario", action="append", help="only this scenario (repeatable)")
    gate.add_argument(
        "--protocol",
        choices=("http/json", "http/protobuf", "grpc"),
        default="http/json",
        help="Claude Code's OTEL_EXPORTER_OTLP_PROTOCOL (grpc: to the gateway's gRPC port); default %(default)s",
    )
    dif = sub.add_parser("diff", help="the transcript format diff between two fixture folders")
    dif.add_argument("old", type=Path)
    dif.add_argument("new", type=Path)
    args = parser.parse_args(argv)
    if args.command == "diff":
        print(diff(args.old, args.new))
        return 0
    if args.command == "gateway":
        versions = {CLAUDE: args.claude_code_version, CODEX: args.codex_version}
        return asyncio.run(check(versions, args.cli, args.scenario, args.protocol))
    if args.command is None:
        args = parser.parse_args(["record", *(argv if argv is not None else sys.argv[1:])])
    started = time.monotonic()
    versions = {CLAUDE: args.claude_code_version or CLAUDE_CODE_VERSION, CODEX: args.codex_version or CODEX_VERSION}
    written = asyncio.run(record(versions, args.cli, args.scenario))
    for folder in written:
        cli = CLAUDE if folder.name.startswith(CLAUDE) else CODEX
        before = previous_version(cli, folder)
        print(diff(before, folder) if before else f"{folder.name}: no earlier version to diff against")
    print(f"recorded in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
