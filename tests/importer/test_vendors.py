"""The vendor registry is the one list of transcript vendors: `cos import`'s subcommands, the pricing
provider of imported calls and the help texts come from it, so a vendor added there is picked up."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from commonos.importer import claude, cli, codex
from commonos.importer.model import ImportedSession
from commonos.importer.source import Source
from commonos.importer.vendors import SOURCES, VENDORS, labels, provider_of
from commonos.runtime.args import Parser


def _parse(*argv: str) -> argparse.Namespace:
    parser = Parser(prog="cos")
    cli.register(parser.add_subparsers(dest="command", required=True, parser_class=Parser))
    return parser.parse_args(["import", *argv])


def test_the_registry_lists_each_vendor_once() -> None:
    assert VENDORS == (claude.SOURCE, codex.SOURCE)
    assert cli.SOURCES is SOURCES and list(SOURCES) == ["claude", "codex"]
    assert [s.vendor for s in VENDORS] == ["claude-code", "codex"]
    assert provider_of("claude-code") == "anthropic" and provider_of("codex") == "openai"
    assert provider_of("not-registered") == "not-registered"
    assert labels() == "Claude Code or Codex"
    for source in VENDORS:
        args = _parse(source.command)
        assert (args.source, args.path) == (source.command, source.default_root)


def test_a_vendor_added_to_the_registry_gets_its_subcommand(monkeypatch: pytest.MonkeyPatch) -> None:
    def read(path: Path, warn: object = None, profile: str | None = None) -> list[ImportedSession]:
        return []

    extra = Source(
        command="other",
        vendor="other-agent",
        label="Other Agent",
        default_root="~/.other",
        top_files=lambda root: [],
        candidates=lambda root: [],
        read=read,
    )
    monkeypatch.setattr(cli, "VENDORS", (*VENDORS, extra))
    monkeypatch.setattr("commonos.importer.vendors.VENDORS", (*VENDORS, extra))
    args = _parse("other", "--dry-run")
    assert (args.source, args.path, args.dry_run) == ("other", "~/.other", True)
    assert labels() == "Claude Code, Codex or Other Agent"
